"""The OpenVINO package and its CPU plugin for the iRPE files: importing it (one line naming the
extra when it is missing), the ``Core`` with the iRPE ops (the extension library or the frontend
conversions) and the CPU's capabilities.

The bottom of :mod:`irpe.runtime.openvino`: ``library`` (the extension library) and ``session``
(reading and compiling) both build on it, and it imports neither.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from irpe.errors import CLIError, InvalidInput

if TYPE_CHECKING:
    import openvino

__all__ = ["DEVICE", "INSTALL", "OpenVINOUnavailable", "import_openvino", "core",
           "cpu_capabilities", "check_precision", "ov_message", "read_checked"]

DEVICE = "CPU"  # the plugin every function of this package uses
INSTALL = "pip install 'irpe-deploy[openvino]'"


class OpenVINOUnavailable(CLIError, ImportError):
    """The ``openvino`` package is not installed: one line naming the extra (a CLIError, so
    ``irpe`` prints it and exits 2; an ImportError for library callers)."""


def import_openvino() -> Any:
    """The ``openvino`` module, or :class:`OpenVINOUnavailable` naming the pip command."""
    try:
        import openvino
    except ImportError as exc:
        raise OpenVINOUnavailable(f"OpenVINO is not installed ({exc}); install it with "
                                  f"{INSTALL}") from None
    return openvino


@functools.lru_cache(maxsize=4)
def core(library: Optional[str] = None) -> "openvino.Core":
    """An ``openvino.Core`` for the iRPE files, one per ``library``: with that extension
    library loaded (its ops and ONNX mappings; RuntimeError when OpenVINO cannot load it), or
    with the frontend conversions (:func:`irpe.runtime.openvino.frontend.add_irpe_ops`)."""
    from irpe.runtime.openvino.frontend import add_irpe_ops
    ov_core = import_openvino().Core()
    if library is None:
        return add_irpe_ops(ov_core)
    ov_core.add_extension(library)
    return ov_core


def cpu_capabilities(ov_core: Optional["openvino.Core"] = None) -> Tuple[str, ...]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES (FP32, BF16, INT8, ...) on this machine."""
    return tuple(str(c) for c in (ov_core or core()).get_property(DEVICE,
                                                                  "OPTIMIZATION_CAPABILITIES"))


def check_precision(precision: str, capabilities: Sequence[str]) -> None:
    """Refuse bf16 on a CPU whose OpenVINO capabilities lack BF16 (there OpenVINO would run f32
    without saying so): a ValueError naming the capability, the CPU's list and the way out."""
    if precision == "bf16" and "BF16" not in capabilities:
        raise InvalidInput(f"precision bf16 needs a CPU with BF16 (AVX-512 BF16 or AMX): OpenVINO "
                         f"lists this CPU's capabilities as {', '.join(capabilities) or 'none'}, "
                         "without BF16; use precision fp32")


def ov_message(exc: BaseException) -> str:
    """OpenVINO's multi-line error without its source-location lines, as one line."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith(("Exception from ",
                                                                     "Check '"))]
    return " ".join(kept) or type(exc).__name__


def read_checked(library: Optional[str], source: Sequence[Any], path: str, precision: str
                 ) -> Tuple["openvino.Model", "openvino.Core", Tuple[str, ...]]:
    """The model read from ``source`` (read_model's arguments) by the Core of ``library``, that
    Core and the CPU's capabilities; first ``precision`` checked against them
    (:func:`check_precision`). An unreadable file is one line naming ``path``: the ONNX
    parser's own reason for a corrupt ``.onnx``, else OpenVINO's."""
    ov_core = core(library)
    capabilities = cpu_capabilities(ov_core)
    check_precision(precision, capabilities)
    try:
        return ov_core.read_model(*source), ov_core, capabilities
    except RuntimeError as exc:
        if path.lower().endswith(".onnx"):
            _check_onnx(path)
        raise InvalidInput(f"{path}: OpenVINO cannot read it: {ov_message(exc)}") from None


def _check_onnx(path: str) -> None:
    """InvalidInput naming why ``path`` is no ONNX model, when it is none (OpenVINO's frontends
    only say that none of them could read it)."""
    import onnx
    try:
        onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise InvalidInput(f"{path} is not a readable ONNX file: {exc}") from None

