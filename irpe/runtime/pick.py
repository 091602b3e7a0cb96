"""Which runtime runs a file, and opening it there: the one picker every command uses.

``irpe serve`` (``backend: auto``), ``irpe validate``, ``irpe eval`` and the benchmarks ask
:func:`pick_runtime`, so a file runs on the same runtime in each of them and ``irpe validate``
checks the runtime that will serve it. The rule (docs/DECISIONS.md, "One runtime layer"):

========================  =====================================================
file                      runtime
========================  =====================================================
``.onnx``                 ``openvino`` on the CPU where OpenVINO (and onnx) are installed,
                          else ``onnxruntime`` (CUDA, or no OpenVINO)
``.xml`` (OpenVINO IR)    ``openvino``
``.engine`` / ``.plan``   ``tensorrt``
anything else             ``torch`` (a trained ``.safetensors`` or a registered name)
========================  =====================================================

A runtime named explicitly is checked against the file's kind: one line saying which runtimes
can run it. :func:`open_file` opens the file on a runtime (irpe.runtime.base.RuntimeFile).
"""
from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple

from irpe.artifact.files import KINDS, FileInfo, file_kind, read_file_info
from irpe.errors import InvalidInput

if TYPE_CHECKING:
    from .base import RuntimeFile
    from .onnxruntime.session import OrtOptions
    from .openvino.session import OvOptions

__all__ = ["RUNTIMES", "FILE_RUNTIMES", "onnx_runtime", "pick_runtime", "open_file"]

RUNTIMES = ("onnxruntime", "openvino", "tensorrt", "torch")
FILE_RUNTIMES = ("onnxruntime", "openvino", "tensorrt")  # those open_file opens
# file kind -> the runtimes that run it, the default first where the device allows
_RUNS: Dict[str, Tuple[str, ...]] = {"onnx": ("openvino", "onnxruntime"), "ir": ("openvino",),
                                     "engine": ("tensorrt",), "trained": ("torch",)}
_HINTS = {("onnx", "tensorrt"): "build an engine from it with irpe build-engine",
          ("onnx", "torch"): "serve the trained .safetensors for torch",
          ("ir", "onnxruntime"): "ONNX Runtime reads the exported .onnx",
          ("trained", "onnxruntime"): "export it first: irpe export FILE -o model.onnx",
          ("trained", "openvino"): "export it first: irpe export FILE -o model.onnx",
          ("trained", "tensorrt"): "export it, then irpe build-engine"}


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that fails, or a test's blocked import
        return False


def onnx_runtime(device: str = "cpu") -> str:
    """The runtime of an exported ``.onnx`` on ``device``: OpenVINO on the CPU where it is
    installed (with onnx, which inlines the file's iRPE functions for it), the fastest there
    (docs/DECISIONS.md, "The CPU default: OpenVINO"); ONNX Runtime otherwise."""
    if device == "cpu" and all(_importable(m) for m in ("openvino", "onnx")):
        return "openvino"
    return "onnxruntime"


def pick_runtime(path: "os.PathLike[str] | str", device: str = "cpu",
                 runtime: Optional[str] = None) -> str:
    """The runtime that runs ``path`` on ``device``: ``runtime`` when given (``auto``/None:
    the rule of this module's table), checked against the file's kind; InvalidInput of one
    line for a runtime that cannot run it."""
    kind = file_kind(path)
    if runtime is None or runtime == "auto":
        return onnx_runtime(device) if kind == "onnx" else _RUNS[kind][0]
    if runtime not in RUNTIMES:
        raise InvalidInput(f"runtime must be one of {', '.join(RUNTIMES)} or auto, got "
                           f"{runtime!r}")
    if runtime not in _RUNS[kind]:
        hint = _HINTS.get((kind, runtime))
        raise InvalidInput(f"{os.fspath(path)} is {KINDS[kind]}: it runs on "
                           f"{' or '.join(_RUNS[kind])}, not on {runtime}"
                           + (f" ({hint})" if hint else ""))
    return runtime


def open_file(path: "os.PathLike[str] | str", runtime: Optional[str] = None, *,
              device: str = "cpu", ort: Optional["OrtOptions"] = None,
              ov: Optional["OvOptions"] = None, threads: Optional[int] = None,
              plugins: Sequence[str] = (), info: Optional[FileInfo] = None,
              shapes: Optional[Dict[str, Sequence[int]]] = None, quiet: bool = False
              ) -> "RuntimeFile":
    """``path`` opened on ``runtime`` (:func:`pick_runtime` when None): ONNX Runtime as ``ort``
    says (threads: intra-op), OpenVINO as ``ov`` says, TensorRT with ``plugins`` on
    ``device``. ``info``: the file's metadata when the caller has read it; ``shapes``: fixed
    input shapes for OpenVINO to plan for (a benchmark's batch)."""
    chosen = pick_runtime(path, device, runtime)
    if chosen not in FILE_RUNTIMES:
        raise InvalidInput(f"{os.fspath(path)} runs on {chosen}, which loads trained models, "
                           "not exported files")
    info = info or read_file_info(path)
    if chosen == "openvino":
        from .openvino.file import OvFile
        return OvFile(info, ov, shapes)
    if chosen == "tensorrt":
        import torch

        from .tensorrt.file import EngineFile
        return EngineFile(info, plugins, torch.device(device if device != "cpu" else "cuda"))
    from .onnxruntime.file import OrtFile, providers_for
    providers = None
    if device != "cpu":
        import onnxruntime

        providers = providers_for(None, device, onnxruntime.get_available_providers())
    return OrtFile(info, ort, providers, threads, quiet)
