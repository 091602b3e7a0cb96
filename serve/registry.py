"""Backend names -> factories: the built-in runtimes and the names registered by plug-ins.

Its own module, below both ``serve.config`` (which checks a model's ``backend`` against these
names) and ``serve.backends`` (which builds the backend a name stands for), so neither of those
imports the other's side of the registry.
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

__all__ = ["AUTO", "BUILTIN", "Factory", "auto_backend", "backend_factory", "backend_names",
           "onnx_backend", "register_backend"]

AUTO = "auto"  # a model's backend chosen from its file and device (auto_backend)

# built-in names -> "module:Class", imported on first use (onnxruntime / tensorrt / openvino
# are optional)
BUILTIN: Dict[str, str] = {"torch": "serve.backends.torch_backend:TorchBackend",
                           "onnxruntime": "serve.backends.onnxruntime_backend:OnnxRuntimeBackend",
                           "tensorrt": "serve.backends.tensorrt_backend:TensorRTBackend",
                           "openvino": "serve.backends.openvino_backend:OpenVINOBackend"}
Factory = Callable[[Any, int], Any]  # (ModelConfig, threads) -> serve.backends.Backend
_registered: Dict[str, Factory] = {}


def register_backend(name: str, factory: Factory) -> None:
    """Make ``backend: NAME`` usable in model configs (plug-ins, test doubles); the built-in
    names cannot be replaced. ``factory(cfg, threads)`` returns a Backend."""
    if name in BUILTIN:
        raise ValueError(f"backend {name!r} is built in and cannot be replaced")
    _registered[name] = factory


def backend_names() -> Tuple[str, ...]:
    """Built-in and registered backend names."""
    return tuple(BUILTIN) + tuple(sorted(_registered))


def onnx_backend(device: str) -> str:
    """The runtime for an exported ONNX file on ``device``: OpenVINO on the CPU where it is
    installed (with onnx, which inlines the file's iRPE functions for it), the fastest there
    (docs/DECISIONS.md, "The CPU default: OpenVINO"); ONNX Runtime otherwise (CUDA, or no
    OpenVINO)."""
    if device == "cpu" and all(_importable(m) for m in ("openvino", "onnx")):
        return "openvino"
    return "onnxruntime"


def auto_backend(path: Path, device: str) -> str:
    """``backend: auto``: by the artifact's suffix: ``.onnx`` -> :func:`onnx_backend`, ``.xml``
    (OpenVINO IR) -> openvino, ``.engine`` / ``.plan`` -> tensorrt, anything else (a trained
    model's ``.safetensors``) -> torch."""
    suffix = Path(path).suffix.lower()
    if suffix == ".onnx":
        return onnx_backend(device)
    return {".xml": "openvino", ".engine": "tensorrt", ".plan": "tensorrt"}.get(suffix, "torch")


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that fails, or a test's blocked import
        return False


def backend_factory(name: str) -> Factory:
    """The factory of backend ``name`` (a registered one, or the built-in class, imported now)."""
    if name in _registered:
        return _registered[name]
    module, _, cls = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)
