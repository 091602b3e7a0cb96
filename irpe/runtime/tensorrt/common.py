"""What the TensorRT builder and runner share: module import, logger, plugin libraries, the
folders of the TensorRT wheels' shared libraries.

Works with the standard ``tensorrt`` module and with TensorRT-RTX (``tensorrt_rtx_bindings``
from PyPI tensorrt-rtx-cu13-bindings, or ``tensorrt_rtx``), whose Python API is the same.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, List, Optional, Protocol, Sequence

from irpe.errors import IrpeError, MissingFile, ResourceError

__all__ = ["TensorRTUnavailable", "EngineBuildError", "import_tensorrt", "is_rtx", "make_logger",
           "load_plugins", "abi_mismatch", "MODULES", "WHEEL_LIBS", "wheel_library_dirs",
           "library_dir"]

MODULES = ("tensorrt", "tensorrt_rtx_bindings", "tensorrt_rtx")
# packages of the wheels that ship the shared libraries (tensorrt-rtx-cu13-libs, tensorrt-cu*-libs)
WHEEL_LIBS = ("tensorrt_rtx_libs", "tensorrt_libs")
INSTALL_HINT = ("install TensorRT (`pip install tensorrt`, GPU machines) or TensorRT-RTX "
                "(`pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings`, builds "
                "engines ahead of time on CPU-only machines too)")


class EngineBuildError(RuntimeError):
    """TensorRT did not produce an engine (or the build process died)."""


class TensorRTUnavailable(IrpeError, ImportError):
    """No TensorRT Python module can be imported here."""


def import_tensorrt(preferred: Optional[str] = None) -> ModuleType:
    """The first importable TensorRT module (``preferred`` first when given)."""
    names = ([preferred] if preferred else []) + [m for m in MODULES if m != preferred]
    errors: List[str] = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:  # also OSError-like failures to load the .so
            errors.append(f"{name}: {exc}")
    raise TensorRTUnavailable(f"no TensorRT module importable ({'; '.join(errors)}); "
                              f"{INSTALL_HINT}")


def is_rtx(trt: ModuleType) -> bool:
    """True for TensorRT-RTX (strongly typed, ahead-of-time compute capabilities)."""
    return "rtx" in trt.__name__ or hasattr(trt, "ComputeCapability")


# TensorRT warns once per function call site because function bodies reuse node names;
# harmless (the inlined tensors are simply not queryable by name), so it is counted, not shown
_QUIET = ("already exists, the output tensors of this new instance will not be queryable",)


# TensorRT's objects come from the module import_tensorrt loads at run time (tensorrt or
# tensorrt_rtx, whichever is installed; neither is typed here): these names say what a value is
TRTObject = Any  # an object of that module: builder, network, config, engine, data type, ...


class EngineLogger(Protocol):
    """The ILogger of :func:`make_logger`: what it kept for reports."""

    messages: List[str]  # warnings and errors, "SEVERITY: message"
    suppressed: int  # known-harmless warnings counted, not shown


def make_logger(trt: ModuleType, verbose: bool = False) -> EngineLogger:
    """An ILogger that prints warnings and errors to stderr and keeps them for reports."""
    logger_base: TRTObject = trt.ILogger

    class _Logger(logger_base):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: List[str] = []
            self.suppressed = 0

        def log(self, severity: TRTObject, msg: str) -> None:  # severity: ILogger.Severity
            if any(q in msg for q in _QUIET):
                self.suppressed += 1
                return
            keep = severity <= trt.ILogger.Severity.WARNING
            if keep:
                self.messages.append(f"{severity.name}: {msg}")
            if keep or verbose:
                print(f"[tensorrt] {severity.name}: {msg}", file=sys.stderr)

    return _Logger()


def load_plugins(trt: ModuleType, paths: Sequence[str]) -> List[str]:
    """Load plugin libraries into the registry; returns the creators they add (name/ns)."""
    registry = trt.get_plugin_registry()
    before = {(c.name, c.plugin_namespace) for c in registry.all_creators}
    for path in paths:
        if not os.path.isfile(path):
            raise MissingFile(f"plugin library not found: {path}")
        loaded = registry.load_library(os.path.abspath(path)) is not None
        known = {(c.name, c.plugin_namespace) for c in registry.all_creators}
        # nothing new is fine when the library was already loaded in this process
        refused = abi_mismatch(trt, path) if not loaded or known <= before else None
        if refused or not loaded:
            raise ResourceError(refused or f"TensorRT could not load plugin library {path}")
    after = {(c.name, c.plugin_namespace) for c in registry.all_creators}
    return sorted(f"{ns}::{name}" if ns else name for name, ns in after - before)


def abi_mismatch(trt: ModuleType, path: str) -> Optional[str]:
    """Why our plugin library refused this runtime (major version), or None."""
    try:
        info = ctypes.CDLL(os.path.abspath(path)).irpe_trt_plugin_abi
    except (OSError, AttributeError):
        return None  # not loadable here, or not our library
    info.restype, major = ctypes.c_int32, ctypes.c_int32(0)
    headers = info(ctypes.byref(major))
    runtime = int(trt.__version__.split(".")[0])
    if runtime == major.value:
        return None
    return (f"plugin library {path} was compiled with TensorRT {headers // 10000}."
            f"{headers // 100 % 100} headers for runtime major {major.value}, but "
            f"{trt.__name__} {trt.__version__} runs here: rebuild it for this TensorRT "
            "(plugins/build.sh; one build per TensorRT major version)")


def wheel_library_dirs(packages: Sequence[str] = WHEEL_LIBS) -> List[Path]:
    """Folders of the installed TensorRT wheels' shared libraries, found without importing
    them (their ``__init__`` may load libraries)."""
    dirs: List[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        dirs += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return dirs


def library_dir(pattern: str, packages: Sequence[str] = WHEEL_LIBS,
                extra: Sequence[Path] = ()) -> Optional[Path]:
    """The first folder holding a file named like ``pattern`` (glob): the wheels' folders of
    ``packages``, then ``extra``; None when none does."""
    for folder in wheel_library_dirs(packages) + [Path(p) for p in extra]:
        if any(folder.glob(pattern)):
            return folder
    return None
