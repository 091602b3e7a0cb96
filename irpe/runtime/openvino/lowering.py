"""The iRPE ops of an exported file made readable by OpenVINO: ONE seam, :func:`lower_irpe`.

OpenVINO's ONNX frontend has no conversion for ``irpe.RPEGather`` / ``irpe.RPEScatter`` and does
not expand the file's model-local functions ("No conversion rule found for operations:
irpe.RPEGather, irpe.RPEScatter"). Today the seam inlines those functions (standard ONNX ops
only, the same graph ONNX Runtime runs without its custom-op library) and drops the ``irpe``
opset import. A faster lowering replaces the BODY of :func:`lower_irpe` and :data:`LOWERING`,
nothing else: :mod:`irpe.runtime.openvino.session` calls only this function, and the tests
check it by numerics (OpenVINO against ONNX Runtime and PyTorch for every iRPE method and
term), not by the graph it makes. Why inlining at load and not at export: docs/DECISIONS.md,
"OpenVINO runtime and backend".
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from irpe.runtime.openvino.frontend import DOMAIN

if TYPE_CHECKING:
    from onnx import ModelProto

__all__ = ["LOWERING", "lower_irpe"]

# how the iRPE nodes run, for the one-line description of a compiled model (keep in step with
# the body of lower_irpe)
LOWERING = "ONNX functions inlined at load"


def lower_irpe(model: "ModelProto") -> "ModelProto":
    """``model`` (an exported file's ModelProto) with no ``irpe``-domain node or opset import
    left, computing the same outputs; the argument is not changed. A file whose iRPE nodes
    lack their functions (not written by ``irpe export``) is a ValueError."""
    import onnx.inliner
    local = {(f.domain, f.name) for f in model.functions}
    missing = sorted({n.op_type for n in model.graph.node
                      if n.domain == DOMAIN and (n.domain, n.op_type) not in local})
    if missing:
        raise ValueError(f"its {', '.join(missing)} nodes have no ONNX function in the file "
                         "(not written by `irpe export`): OpenVINO cannot run them")
    lowered = onnx.inliner.inline_local_functions(model)
    keep = [o for o in lowered.opset_import if o.domain != DOMAIN]
    del lowered.opset_import[:]
    lowered.opset_import.extend(keep)
    return lowered
