"""Backend names -> factories: the built-in runtimes and the names registered by plug-ins.

Its own module, below both ``serve.config`` (which checks a model's ``backend`` against these
names) and ``serve.backends`` (which builds the backend a name stands for), so neither of those
imports the other's side of the registry.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from irpe.runtime.pick import pick_runtime

__all__ = ["AUTO", "BUILTIN", "Factory", "auto_backend", "backend_factory", "backend_names",
           "check_backend", "register_backend"]

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


def auto_backend(path: Path, device: str) -> str:
    """``backend: auto``: the runtime :func:`irpe.runtime.pick.pick_runtime` picks for the file
    on ``device``, the same one ``irpe validate`` and ``irpe eval`` run it on."""
    return pick_runtime(path, device)


def check_backend(path: Path, device: str, backend: str) -> None:
    """A built-in ``backend`` named for ``path``: InvalidInput of one line when it cannot run
    that kind of file (a registered backend's files are its own business)."""
    if backend in BUILTIN:
        pick_runtime(path, device, backend)


def backend_factory(name: str) -> Factory:
    """The factory of backend ``name`` (a registered one, or the built-in class, imported now)."""
    if name in _registered:
        return _registered[name]
    module, _, cls = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)
