"""ONNX model-local functions for the iRPE nodes ``irpe::RPEGather`` and ``irpe::RPEScatter``.

A node of domain ``irpe`` runs as a TensorRT plugin where one is loaded; everywhere else the
runtime expands the FunctionProto of the same name, whose body uses standard ONNX ops only.

Gather: the table is flattened to (R*K, B*H) rows (R = Lq, or 1 for a table broadcast over the
queries) and ONE ``Gather`` on axis 0 picks a row of B*H values per (query, key), so every copy
is a contiguous run (no index expanded to (B, H, Lq, Lk), no per-element gather; both measured
several times slower in ONNX Runtime).
Scatter: a batched ``MatMul`` of the attention with the one-hot bucket map (Lq, Lk, K),
because TensorRT's parser rejects ScatterND/ScatterElements with a reduction; the map is the
same in every layer, so ONNX Runtime builds it once. See docs/export.md for the measurements.
"""
from __future__ import annotations

from typing import Dict, List

import onnx
import onnx.inliner
from onnx import AttributeProto, FunctionProto, ModelProto, NodeProto, TensorProto, helper

# the domain, op names and plugin fields: the one op table (irpe.artifact.ops), re-exported
from irpe.artifact.ops import (
    DOMAIN,
    DOMAIN_VERSION,
    GATHER,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    SCATTER,
)

__all__ = ["DOMAIN", "GATHER", "SCATTER", "PLUGIN_NAMESPACE", "PLUGIN_VERSION", "OP_ATTRIBUTES",
           "gather_function", "scatter_function", "attach_functions", "inline_functions",
           "rpe_nodes"]

# attributes every RPE node carries (the plugin creator's field names)
OP_ATTRIBUTES = ["plugin_namespace", "plugin_version", "num_buckets"]


def _const(name: str, values: List[int]) -> NodeProto:
    return helper.make_node("Constant", [], [name], value_ints=values)


def _flat_index(index: str, rows: str, table: str) -> List[NodeProto]:
    """Nodes for rows = index + i * K * (R > 1) (int64, (Lq, Lk)) into the (R*K) table rows.

    R, the table's query rows, is Lq or 1 (one row broadcast over every query: no offset).
    """
    return [
        helper.make_node("Cast", [index], ["idx"], to=TensorProto.INT64),
        _const("zero", [0]), _const("one", [1]),
        helper.make_node("Shape", [table], ["r"], start=2, end=3),
        helper.make_node("Shape", [table], ["k"], start=3, end=4),
        helper.make_node("Sub", ["r", "one"], ["r_1"]),
        helper.make_node("Min", ["r_1", "one"], ["multi_row"]),  # 0 when R == 1, else 1
        helper.make_node("Mul", ["k", "multi_row"], ["width"]),
        helper.make_node("Shape", ["idx"], ["lq"], start=0, end=1),
        helper.make_node("Squeeze", ["lq"], ["lq_s"]),
        helper.make_node("Squeeze", ["zero"], ["zero_s"]),
        helper.make_node("Squeeze", ["one"], ["one_s"]),
        helper.make_node("Range", ["zero_s", "lq_s", "one_s"], ["row"]),
        helper.make_node("Mul", ["row", "width"], ["row_off"]),
        helper.make_node("Unsqueeze", ["row_off", "one"], ["row_col"]),
        helper.make_node("Add", ["idx", "row_col"], [rows]),
    ]


def gather_function(opset: int) -> FunctionProto:
    """RPEGather(table[B,H,Lq|1,K], index[Lq,Lk]) -> out[b,h,i,j] = table[b,h,i|0,index[i,j]]."""
    nodes = [
        helper.make_node("Shape", ["table"], ["bh"], start=0, end=2),
        *_flat_index("index", "flat_idx", "table"),
        helper.make_node("Flatten", ["table"], ["table_2d"], axis=2),  # (B*H, R*K)
        helper.make_node("Transpose", ["table_2d"], ["rows"], perm=[1, 0]),
        helper.make_node("Gather", ["rows", "flat_idx"], ["picked"], axis=0),  # (Lq, Lk, B*H)
        # a 3-D single-axis move: ONNX Runtime's fast transpose path (a 4-D (Lq,Lk,B,H) ->
        # (B,H,Lq,Lk) one measured 7x slower)
        helper.make_node("Transpose", ["picked"], ["picked_t"], perm=[2, 0, 1]),
        helper.make_node("Shape", ["flat_idx"], ["lq_lk"]),
        helper.make_node("Concat", ["bh", "lq_lk"], ["out_shape"], axis=0),
        helper.make_node("Reshape", ["picked_t", "out_shape"], ["output"]),
    ]
    return helper.make_function(DOMAIN, GATHER, ["table", "index"], ["output"], nodes,
                                [helper.make_opsetid("", opset)], OP_ATTRIBUTES,
                                doc_string=gather_function.__doc__)


def scatter_function(opset: int) -> FunctionProto:
    """RPEScatter(attn[B,H,Lq,Lk], index[Lq,Lk]; num_buckets=K) -> sum of attn per bucket.

    As a batched MatMul with the one-hot bucket map (Lq, Lk, K): scatter reductions are not
    parsed by TensorRT, and the map is identical in every layer (ONNX Runtime computes it once).
    """
    k_node = helper.make_node("Constant", [], ["k_scalar"])  # value_int = the node's num_buckets
    k_node.attribute.append(helper.make_attribute_ref("value_int", AttributeProto.INT,
                                                      ref_attr_name="num_buckets"))
    nodes = [
        k_node,
        _const("zero", [0]), _const("one", [1]), _const("last", [-1]),
        helper.make_node("Squeeze", ["zero"], ["zero_s"]),
        helper.make_node("Squeeze", ["one"], ["one_s"]),
        helper.make_node("Range", ["zero_s", "k_scalar", "one_s"], ["buckets"]),
        helper.make_node("Cast", ["index"], ["idx"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["idx", "last"], ["idx_3d"]),
        helper.make_node("Equal", ["idx_3d", "buckets"], ["hit"]),  # (Lq, Lk, K)
        helper.make_node("CastLike", ["hit", "attn"], ["one_hot"]),
        helper.make_node("Shape", ["attn"], ["bh"], start=0, end=2),
        helper.make_node("Shape", ["attn"], ["lq_lk"], start=2, end=4),
        helper.make_node("Concat", ["last", "lq_lk"], ["nql_shape"], axis=0),
        helper.make_node("Reshape", ["attn", "nql_shape"], ["attn_3d"]),  # (B*H, Lq, Lk)
        helper.make_node("Transpose", ["attn_3d"], ["attn_q"], perm=[1, 0, 2]),
        helper.make_node("MatMul", ["attn_q", "one_hot"], ["sums"]),  # (Lq, B*H, K)
        helper.make_node("Shape", ["attn"], ["lq"], start=2, end=3),
        helper.make_node("Unsqueeze", ["k_scalar", "zero"], ["k"]),
        helper.make_node("Concat", ["lq", "bh", "k"], ["split_shape"], axis=0),
        helper.make_node("Reshape", ["sums", "split_shape"], ["sums_4d"]),  # (Lq, B, H, K)
        # last: a batch-axis move that ONNX Runtime folds into the MatMul with the V table
        helper.make_node("Transpose", ["sums_4d"], ["output"], perm=[1, 2, 0, 3]),
    ]
    return helper.make_function(DOMAIN, SCATTER, ["attn", "index"], ["output"], nodes,
                                [helper.make_opsetid("", opset)], OP_ATTRIBUTES,
                                doc_string=scatter_function.__doc__)


_BUILDERS = {GATHER: gather_function, SCATTER: scatter_function}


def rpe_nodes(model: ModelProto) -> List[NodeProto]:
    """Nodes of the irpe domain in the main graph (the plugin candidates)."""
    return [n for n in model.graph.node if n.domain == DOMAIN]


def default_opset(model: ModelProto) -> int:
    """Version of the default ("") ONNX domain the model imports."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise ValueError("model imports no default ONNX opset")


def attach_functions(model: ModelProto) -> ModelProto:
    """Add the local function of each RPE op the graph uses, and the irpe opset import."""
    used = sorted({n.op_type for n in rpe_nodes(model)})
    unknown = set(used) - set(_BUILDERS)
    if unknown:
        raise ValueError(f"unknown irpe ops in graph: {sorted(unknown)}")
    opset = default_opset(model)
    present = {(f.domain, f.name) for f in model.functions}
    for name in used:
        if (DOMAIN, name) not in present:
            model.functions.append(_BUILDERS[name](opset))
    if used and all(o.domain != DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return model


def inline_functions(model: ModelProto) -> ModelProto:
    """The same graph with every local function expanded: no irpe-domain nodes or import."""
    inlined = onnx.inliner.inline_local_functions(model)
    keep = [o for o in inlined.opset_import if o.domain != DOMAIN]
    del inlined.opset_import[:]
    inlined.opset_import.extend(keep)
    return inlined


def count_rpe_nodes(model: ModelProto) -> Dict[str, int]:
    """{op_type: count} of the irpe nodes in the main graph."""
    counts: Dict[str, int] = {}
    for node in rpe_nodes(model):
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
