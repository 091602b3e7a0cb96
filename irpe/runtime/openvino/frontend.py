"""The iRPE ops in OpenVINO's ONNX frontend: ``irpe.RPEGather`` and ``irpe.RPEScatter`` converted
to OpenVINO ops that its CPU plugin runs with JIT kernels, so an exported file loads as it is.

Why not the file's model-local functions (OpenVINO's frontend does not expand them; inlined
with onnx they load): their bodies are laid out for ONNX Runtime (a row gather into
(Lq, Lk, B*H), then a 3-D transpose) and OpenVINO's reference Transpose makes them 9% (K) /
24% (QKV) slower than the plain model. Measured alternatives (docs/DECISIONS.md, "OpenVINO"):
ONNX GatherElements (reference kernel, slower still), one-hot MatMul scatter (as fast as the
scatter-add below on one core, slower on two).

- Gather: ``out[b,h,i,j] = table[b,h,i,index[i,j]]`` is OpenVINO's ``Gather`` with
  ``batch_dims=3`` on the table (B, H, Lq, K) and the ids broadcast to (B, H, Lq, Lk): one JIT
  gather straight into the layout the attention adds, no transpose. With static shapes the
  broadcast ids are a constant folded at compile time. A table broadcast over the queries
  (Lq = 1 rows) gathers (B, H, K) by the (Lq, Lk) ids with ``batch_dims=0``, no broadcast.
- Scatter: ``sums[b,h,i,k] = sum over j with index[i,j] == k of attn[b,h,i,j]`` is
  ``ScatterElementsUpdate`` with reduction ``sum`` into zeros (B, H, Lq, K), keys in order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List

import numpy as np

from irpe.artifact.ops import DOMAIN, GATHER, SCATTER  # the exporter's node domain and ops

if TYPE_CHECKING:
    import openvino

__all__ = ["DOMAIN", "LOWERING", "conversion_extensions", "add_irpe_ops"]

# how the iRPE nodes run, for the one-line description of a compiled model
LOWERING = "converted at load (Gather, ScatterElementsUpdate)"


def _ints(values: List[int]) -> Any:
    import openvino.opset13 as ops
    return ops.constant(np.array(values, dtype=np.int64))


def _gather(ctx: Any) -> List[Any]:
    """RPEGather(table[B,H,Lq|1,K], index[Lq,Lk]) -> (B,H,Lq,Lk)."""
    import openvino.opset13 as ops
    table, index = ctx.get_input(0), ctx.get_input(1)
    ids = ops.convert(index, "i32")
    rows = table.get_partial_shape()[2]
    if rows.is_static and rows.get_length() == 1:  # one row for every query
        flat = ops.squeeze(table, _ints([2]))
        return [ops.gather(flat, ids, ops.constant(np.int64(2)), 0).output(0)]
    lead = ops.gather(ops.shape_of(table, "i64"), _ints([0, 1]), ops.constant(np.int64(0)))
    target = ops.concat([lead, ops.shape_of(ids, "i64")], 0)
    return [ops.gather(table, ops.broadcast(ids, target), ops.constant(np.int64(3)),
                       3).output(0)]


def _scatter(ctx: Any) -> List[Any]:
    """RPEScatter(attn[B,H,Lq,Lk], index[Lq,Lk]; num_buckets=K) -> (B,H,Lq,K) bucket sums."""
    import openvino.opset13 as ops
    attn, index = ctx.get_input(0), ctx.get_input(1)
    buckets = int(ctx.get_attribute("num_buckets"))
    ids = ops.convert(index, "i32")
    shape = ops.shape_of(attn, "i64")
    lead = ops.gather(shape, _ints([0, 1, 2]), ops.constant(np.int64(0)))
    zero = ops.convert_like(ops.constant(np.float32(0)), attn)
    zeros = ops.broadcast(zero, ops.concat([lead, _ints([buckets])], 0))
    return [ops.scatter_elements_update(zeros, ops.broadcast(ids, shape), attn,
                                        ops.constant(np.int64(3)), "sum").output(0)]


def conversion_extensions() -> List[Any]:
    """OpenVINO ONNX-frontend extensions for the iRPE ops (add them to a Core before reading)."""
    from openvino.frontend.onnx import ConversionExtension
    return [ConversionExtension(GATHER, DOMAIN, _gather),
            ConversionExtension(SCATTER, DOMAIN, _scatter)]


def add_irpe_ops(core: "openvino.Core") -> "openvino.Core":
    """``core`` with the iRPE conversions registered; returns it."""
    for extension in conversion_extensions():
        core.add_extension(extension)
    return core
