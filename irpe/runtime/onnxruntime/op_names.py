"""The op types of domain ``irpe`` that libirpe_ort_ops registers (plugins/onnxruntime), named
once for the graph rewrites; tests/test_ort_op_names.py ties this table to the C++ sources."""
from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

__all__ = ["DOMAIN", "GATHER", "SCATTER", "GATHER_GRID", "SCATTER_GRID", "GATHER_ADD",
           "GATHER_ADD2", "SCATTER_MATMUL_ADD", "BUCKET_MATMUL_ADD", "SOFTMAX_OPS", "ATTENTION",
           "LIBRARY_OPS"]

DOMAIN = "irpe"
# the exported ops (export.functions), which the rewrites read
GATHER = "RPEGather"
SCATTER = "RPEScatter"
# their on-the-fly id forms: in hand-written graphs only (docs/export.md), no rewrite makes them
GATHER_GRID = "RPEGatherGrid"
SCATTER_GRID = "RPEScatterGrid"
# made by irpe.runtime.onnxruntime.rewrites at session load
GATHER_ADD = "RPEGatherAdd"
GATHER_ADD2 = "RPEGatherAdd2"
SCATTER_MATMUL_ADD = "RPEScatterMatMulAdd"
BUCKET_MATMUL_ADD = "RPEBucketMatMulAdd"
# Softmax(gather-add) -> one op: (gather-add op, with the V bucket sums) -> fused op
SOFTMAX_OPS: Dict[Tuple[str, bool], str] = {
    (GATHER_ADD, False): "RPEGatherAddSoftmax", (GATHER_ADD2, False): "RPEGatherAdd2Softmax",
    (GATHER_ADD, True): "RPEGatherAddSoftmaxScatter",
    (GATHER_ADD2, True): "RPEGatherAdd2SoftmaxScatter"}
# made by irpe.runtime.onnxruntime.rewrite_attention
ATTENTION = "RPEAttention"

LIBRARY_OPS: FrozenSet[str] = frozenset(
    {GATHER, SCATTER, GATHER_GRID, SCATTER_GRID, GATHER_ADD, GATHER_ADD2, SCATTER_MATMUL_ADD,
     BUCKET_MATMUL_ADD, ATTENTION, *SOFTMAX_OPS.values()})
