"""The iRPE op table: the ONNX domain of the iRPE nodes, every op name of it, and the op sets of
the two native libraries, written once. The exporter (:mod:`export.functions`,
:mod:`export.symbolic`), the ONNX Runtime side (the graph rewrites of :mod:`irpe.runtime.graph`,
the sessions) and the OpenVINO side (:mod:`irpe.runtime.openvino`, the IR reader of
:mod:`irpe.artifact.openvino_ir`) read it; ``tests/test_ort_op_names.py`` ties it to the C++
sources (``op_name()`` / ``k*Name`` of plugins/onnxruntime, the ``OPENVINO_OP`` classes of
plugins/openvino) and to the built libraries.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

__all__ = ["DOMAIN", "DOMAIN_VERSION", "PLUGIN_NAMESPACE", "PLUGIN_VERSION", "OPENVINO_OPSET",
           "GATHER", "SCATTER", "GATHER_GRID", "SCATTER_GRID", "GATHER_ADD", "GATHER_ADD2",
           "SCATTER_MATMUL_ADD", "BUCKET_MATMUL_ADD", "SOFTMAX_OPS", "ATTENTION",
           "ORT_LIBRARY_OPS", "OPENVINO_LIBRARY_OPS"]

# The one name of the iRPE op domain; the others are it under the name each consumer knows.
DOMAIN = "irpe"  # ONNX domain of every iRPE node, exported or fused at load
DOMAIN_VERSION = 1  # its opset version in an exported file's opset_import
PLUGIN_NAMESPACE = DOMAIN  # the nodes' plugin_namespace attribute (TensorRT plugin namespace)
PLUGIN_VERSION = "1"  # the nodes' plugin_version attribute (TensorRT plugin version)
OPENVINO_OPSET = DOMAIN  # opset of the OpenVINO library's operations (IR layer "version")

# the exported ops (export.functions), which the rewrites read
GATHER = "RPEGather"
SCATTER = "RPEScatter"
# their on-the-fly id forms: in hand-written graphs only (docs/export.md), no rewrite makes them
GATHER_GRID = "RPEGatherGrid"
SCATTER_GRID = "RPEScatterGrid"
# made by irpe.runtime.graph.rewrites at session load
GATHER_ADD = "RPEGatherAdd"
GATHER_ADD2 = "RPEGatherAdd2"
SCATTER_MATMUL_ADD = "RPEScatterMatMulAdd"
BUCKET_MATMUL_ADD = "RPEBucketMatMulAdd"
# Softmax(gather-add) -> one op: (gather-add op, with the V bucket sums) -> fused op
SOFTMAX_OPS: Dict[Tuple[str, bool], str] = {
    (GATHER_ADD, False): "RPEGatherAddSoftmax", (GATHER_ADD2, False): "RPEGatherAdd2Softmax",
    (GATHER_ADD, True): "RPEGatherAddSoftmaxScatter",
    (GATHER_ADD2, True): "RPEGatherAdd2SoftmaxScatter"}
# made by irpe.runtime.graph.rewrite_attention (a whole attention block)
ATTENTION = "RPEAttention"

# the ops libirpe_ort_ops registers (plugins/onnxruntime)
ORT_LIBRARY_OPS: FrozenSet[str] = frozenset(
    {GATHER, SCATTER, GATHER_GRID, SCATTER_GRID, GATHER_ADD, GATHER_ADD2, SCATTER_MATMUL_ADD,
     BUCKET_MATMUL_ADD, ATTENTION, *SOFTMAX_OPS.values()})
# the ops libirpe_openvino registers, in opset OPENVINO_OPSET (plugins/openvino/rpe_ov_ops.hpp)
OPENVINO_LIBRARY_OPS: FrozenSet[str] = frozenset({GATHER, SCATTER, ATTENTION})
