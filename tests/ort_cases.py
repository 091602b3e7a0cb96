"""Small ORT graphs and inputs shared by the iRPE custom-op tests (test_ort_ops*.py): a product-id
layer and the Add(base, RPEGather) graph that the load-time rewrite fuses."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from irpe import bucket_ids
from irpe.artifact.contract import DEFAULT_OPSET
from tests.helpers import ORT_ATTRS

__all__ = ["layer", "gather_graph_model", "add_model"]


def layer(b=2, h=3, lq=26, k=50, skip=1, seed=0):
    """Product ids on a 5x5 grid + cls, a table and an attention of those sizes."""
    rng = np.random.default_rng(seed)
    ids = bucket_ids("product", 1.9, 5, 5, skip=skip).numpy()
    return (ids, rng.standard_normal((b, h, lq, k), dtype=np.float32),
            rng.random((b, h, lq, lq), dtype=np.float32))


def gather_graph_model(graph) -> bytes:
    """``graph`` (RPEGather nodes + Adds) with the gather's local function, serialized."""
    from export.functions import gather_function
    model = helper.make_model(graph, functions=[gather_function(DEFAULT_OPSET)], opset_imports=[
        helper.make_opsetid("", DEFAULT_OPSET), helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def add_model(base_shape, second_use: bool = False) -> bytes:
    """Add(base, RPEGather(table, index)) (+ the gather as a 2nd output: not fusable)."""
    nodes = [helper.make_node("RPEGather", ["table", "index"], ["g"], domain="irpe",
                              num_buckets=50, **ORT_ATTRS),
             helper.make_node("Add", ["base", "g"], ["out"])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    if second_use:
        outputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in
              (("table", TensorProto.FLOAT), ("index", TensorProto.INT64),
               ("base", TensorProto.FLOAT))]
    return gather_graph_model(helper.make_graph(nodes, "add", inputs, outputs, value_info=[
        helper.make_tensor_value_info("g", TensorProto.FLOAT, None)]))
