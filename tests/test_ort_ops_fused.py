"""Load-time fusions of the ORT custom-op library (irpe/runtime/onnxruntime/rewrites.py): the iRPE-V
chain RPEScatter -> MatMul(W) -> Add(base) as one RPEScatterMatMulAdd against the unfused custom
ops, the files' functions and PyTorch; the AVX2 gather+Add rows with ids outside [0, K); the switch.
Gather+Add basics: tests/test_ort_ops.py."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from irpe import bucket_ids, rpe_scatter
from tests.helpers import ORT_ATTRS as ATTRS
from tests.helpers import env_session
from tests.ort_cases import add_model, layer

pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py

K = 50


def v_model(weight: np.ndarray, base_rank: int = 4, weight_input: bool = False,
            second_use: bool = False, index: Optional[np.ndarray] = None) -> bytes:
    """Add(base, MatMul(RPEScatter(attn, index), W)) with W an initializer (or a graph input),
    optionally the scatter output as a 2nd graph output (then not fusable)."""
    from export.functions import scatter_function
    nodes = [helper.make_node("RPEScatter", ["attn", "index"], ["s"], domain="irpe",
                              num_buckets=K, **ATTRS),
             helper.make_node("MatMul", ["s", "W"], ["m"]),
             helper.make_node("Add", ["base", "m"], ["out"])]
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("attn", f32, None),
              helper.make_tensor_value_info("base", f32, [None] * base_rank)]
    inits = [numpy_helper.from_array(index, "index")] if index is not None else []
    if index is None:
        inputs.append(helper.make_tensor_value_info("index", TensorProto.INT64, None))
    if weight_input:
        inputs.append(helper.make_tensor_value_info("W", f32, None))
    else:
        inits.append(numpy_helper.from_array(weight, "W"))
    outputs = [helper.make_tensor_value_info("out", f32, None)]
    if second_use:
        outputs.append(helper.make_tensor_value_info("s", f32, None))
    graph = helper.make_graph(nodes, "v", inputs, outputs, initializer=inits, value_info=[
        helper.make_tensor_value_info(n, f32, None) for n in ("s", "m")])
    model = helper.make_model(graph, functions=[scatter_function(18)], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def v_layer(d: int, base_shape=None, b=2, h=3, seed=0):
    """Product ids on a 5x5 grid + cls (Lq = 26), softmax-like attention, W ~ N(0, 0.02)."""
    rng = np.random.default_rng(seed)
    ids = bucket_ids("product", 1.9, 5, 5, skip=1).numpy()
    attn = rng.random((b, h, 26, 26), dtype=np.float32)
    attn /= attn.sum(-1, keepdims=True)
    weight = (0.02 * rng.standard_normal((1, 1, K, d))).astype(np.float32)
    base = rng.standard_normal(base_shape or (b, h, 26, d), dtype=np.float32)
    return ids, attn, weight, base


def _torch_v(ids, attn, weight, base) -> np.ndarray:
    s = rpe_scatter(torch.from_numpy(attn), torch.from_numpy(ids), K)
    return (torch.from_numpy(base) + s @ torch.from_numpy(weight)).numpy()


@pytest.mark.parametrize("d,threads,index_dtype", [(64, 2, np.int64), (40, 1, np.int32),
                                                   (7, 2, np.int64)])
def test_v_chain_fused_matches_unfused_functions_and_torch(ort_library, monkeypatch, d,
                                                           threads, index_dtype):
    """B*H = 6: groups of 4 rows and single rows; D = 40, 7: the column tails."""
    ids, attn, weight, base = v_layer(d)
    feeds = {"attn": attn, "base": base}
    data = v_model(weight, index=ids.astype(index_dtype))  # a constant, as exported
    session, path = env_session(data, threads=threads, custom_ops="on")
    assert path.fused_v == 1 and "1 scatter+MatMul+Add fused" in path.describe()
    fused = session.run(None, feeds)[0]
    monkeypatch.setenv("IRPE_ORT_FUSE", "gather")
    unfused_session, unfused_path = env_session(data, threads=threads, custom_ops="on")
    assert unfused_path.custom_ops and unfused_path.fused_v == 0
    unfused = unfused_session.run(None, feeds)[0]
    functions = env_session(data, custom_ops="off")[0].run(None, feeds)[0]
    assert np.abs(fused - unfused).max() <= 1e-6
    assert np.abs(fused - functions).max() <= 1e-6
    assert np.abs(fused - _torch_v(ids, attn, weight, base)).max() <= 1e-6


@pytest.mark.parametrize("base_shape", [(1, 3, 26, 64), (26, 64), (64,)])
def test_v_chain_fused_with_a_broadcast_base(ort_library, base_shape):
    ids, attn, weight, base = v_layer(64, base_shape, seed=1)
    feeds = {"attn": attn, "base": base, "index": ids}
    session, path = env_session(v_model(weight, len(base_shape)), custom_ops="on")
    assert path.fused_v == 1
    assert np.abs(session.run(None, feeds)[0] - _torch_v(ids, attn, weight, base)).max() <= 1e-6


def test_v_chain_ids_outside_the_buckets_are_dropped(ort_library):
    ids, attn, weight, base = v_layer(16, seed=2)
    ids = ids.copy()
    ids[0, :3] = [-1, K, 10**9]
    session, path = env_session(v_model(weight, index=ids), custom_ops="on")
    assert path.fused_v == 1
    keep = (ids >= 0) & (ids < K)
    s = np.zeros(attn.shape[:3] + (K,), np.float64)
    for i, j in zip(*np.nonzero(keep), strict=True):
        s[:, :, i, ids[i, j]] += attn[:, :, i, j]
    expect = base + (s @ weight.astype(np.float64))
    assert np.abs(session.run(None, {"attn": attn, "base": base})[0] - expect).max() <= 1e-6


@pytest.mark.parametrize("case", ["weight input", "per-head weight", "scatter used twice"])
def test_v_chain_left_unfused(ort_library, case):
    """W not an initializer, W per head, or the scatter output used elsewhere: no fusion."""
    ids, attn, weight, base = v_layer(16, seed=3)
    if case == "per-head weight":
        weight = np.repeat(weight, 3, axis=1)
    data = v_model(weight, weight_input=case == "weight input",
                   second_use=case == "scatter used twice")
    session, path = env_session(data, custom_ops="on")
    assert path.custom_ops and path.fused_v == 0
    feeds = {"attn": attn, "base": base, "index": ids}
    if case == "weight input":
        feeds["W"] = weight
    assert np.abs(session.run(None, feeds)[0] - _torch_v(ids, attn, weight, base)).max() <= 1e-6


def test_v_chain_bad_base_is_a_run_error(ort_library):
    ids, attn, weight, _ = v_layer(16, seed=4)
    session, _ = env_session(v_model(weight), custom_ops="on")
    with pytest.raises(Exception, match=r"RPEScatterMatMulAdd: input 3 \(base\) dim 1 is 4"):
        session.run(None, {"attn": attn, "index": ids,
                           "base": np.ones((2, 4, 26, 16), np.float32)})
    with pytest.raises(Exception, match=r"RPEScatterMatMulAdd: input 3 \(base\) must broadcast"):
        session.run(None, {"attn": attn, "index": ids,
                           "base": np.ones((2, 3, 26, 15), np.float32)})


def test_fusion_switch_off(ort_library, monkeypatch):
    ids, _, weight, _ = v_layer(16)
    monkeypatch.setenv("IRPE_ORT_FUSE", "0")
    path = env_session(v_model(weight), custom_ops="on")[1]
    assert path.custom_ops and path.fused == 0 and path.fused_v == 0


def test_gather_add_ids_outside_the_buckets_bit_identical(ort_library, monkeypatch):
    """The AVX2 rows' masked gathers: ids < 0 or >= K add 0, like the unfused RPEGather."""
    ids, table, _ = layer()
    ids = ids.copy()
    ids[0, :9] = [-1, -7, K, K + 1, 10**12, -(10**12), 2**31, 3, 0]
    base = np.random.default_rng(6).standard_normal((2, 3, 26, 26), dtype=np.float32)
    feeds = {"table": table, "index": ids, "base": base}
    session, path = env_session(add_model(None), threads=2, custom_ops="on")
    assert path.fused == 1
    monkeypatch.setenv("IRPE_ORT_FUSE", "0")
    unfused = env_session(add_model(None), custom_ops="on")[0]
    assert np.array_equal(session.run(None, feeds)[0], unfused.run(None, feeds)[0])
