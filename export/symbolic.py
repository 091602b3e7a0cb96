"""TorchScript-exporter symbolics: ``irpe::rpe_gather`` / ``irpe::rpe_scatter`` -> irpe nodes.

Each call of the custom op becomes ONE node ``irpe::RPEGather`` / ``irpe::RPEScatter`` with the
plugin attributes; the local functions are attached afterwards (:mod:`export.functions`).
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from irpe.artifact.contract import MIN_OPSET
from irpe.artifact.ops import DOMAIN, GATHER, PLUGIN_NAMESPACE, PLUGIN_VERSION, SCATTER

__all__ = ["register"]

_registered = False
Value = torch._C.Value  # a node output of the TorchScript graph being exported


def _with_shape(out: Value, like: Value, sizes: List[Optional[int]]) -> Value:
    """Give the custom node's output a type so the exporter's shape inference continues."""
    if like.type().scalarType() is not None:
        out.setType(like.type().with_sizes(sizes))
    return out


def _sizes(value: Value) -> List[Optional[int]]:
    from torch.onnx import symbolic_helper
    return symbolic_helper._get_tensor_sizes(value) or [None] * 4


def _gather(g: Any, table: Value, index: Value) -> Value:  # g: torch.onnx's GraphContext
    """num_buckets = the table's last dim; where the exporter has not inferred it yet (the
    1-row Q table of a Reshape), export.onnx fills it in once the graph is folded."""
    sizes, idx = _sizes(table), _sizes(index)
    known = {} if sizes[3] is None else {"num_buckets_i": sizes[3]}
    out = g.op(f"{DOMAIN}::{GATHER}", table, index, plugin_namespace_s=PLUGIN_NAMESPACE,
               plugin_version_s=PLUGIN_VERSION, **known)
    # the index's (Lq, Lk); a 1-row table is broadcast over Lq
    rows: List[Optional[int]] = list(idx) if len(idx) == 2 else [None, None]
    return _with_shape(out, table, sizes[:2] + rows)


def _scatter(g: Any, attn: Value, index: Value, num_buckets: Value) -> Value:
    from torch.onnx import symbolic_helper
    k = symbolic_helper._get_const(num_buckets, "i", "num_buckets")
    out = g.op(f"{DOMAIN}::{SCATTER}", attn, index, plugin_namespace_s=PLUGIN_NAMESPACE,
               plugin_version_s=PLUGIN_VERSION, num_buckets_i=k)
    return _with_shape(out, attn, _sizes(attn)[:3] + [k])


def register() -> None:
    """Register both symbolics once per process (valid from MIN_OPSET, for every opset
    irpe.artifact.contract allows)."""
    global _registered
    if _registered:
        return
    import irpe.ops  # noqa: F401  (defines the torch.ops.irpe namespace)
    for name, fn in (("irpe::rpe_gather", _gather), ("irpe::rpe_scatter", _scatter)):
        torch.onnx.register_custom_op_symbolic(name, fn, MIN_OPSET)
    _registered = True
