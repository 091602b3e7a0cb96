"""Stage ``qlayout`` of the load-time rewrite (irpe/runtime/onnxruntime/rewrite_qlayout.py): the
iRPE-Q table is computed bucket-major, MatMul(W^T, k^T), and its index rewritten to match. Same
outputs as the ONNX functions and PyTorch (shared and per-head tables), a clean graph (no
dangling Mul, no unused initializers, one shared index), and no rewrite where the pattern is
not exactly the Q form."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from export.onnx import export_onnx
from irpe import RPEConfig
from irpe.artifact.contract import DEFAULT_OPSET
from irpe.runtime.graph.rewrites import fuse_model
from tests.helpers import ORT_ATTRS as ATTRS
from tests.helpers import env_session, tiny_deit

pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py


@pytest.mark.parametrize("shared_head", [True, False])
def test_q_tables_bucket_major_match_functions_and_torch(ort_library, tmp_path, shared_head):
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=shared_head, skip=1,
                    on="qkv")
    model, spec = tiny_deit(cfg)
    path = export_onnx(model, tmp_path / "m.onnx", spec=spec)
    fused, counts = fuse_model(str(path))
    assert counts.qlayout == 2  # one Q table per block
    graph = onnx.load_from_string(fused).graph
    producer = {out: n for n in graph.node for out in n.output}
    used = {name for n in graph.node for name in n.input}
    assert all(t.name in used for t in graph.initializer)  # the replaced W and index are gone
    for node in graph.node:
        if node.name.endswith("/irpe_qlayout/Transpose"):  # the scale went into W^T
            assert producer[node.input[0]].op_type != "Mul"
    x = np.random.default_rng(3).standard_normal((3, 3, 40, 40), dtype=np.float32)
    custom, ops = env_session(path, custom_ops="on", threads=2)
    assert ops.q_layout == 2 and "(2 Q tables bucket-major)" in ops.describe()
    functions, _ = env_session(path, custom_ops="off")
    got = custom.run(None, {"images": x})[0]
    np.testing.assert_allclose(got, functions.run(None, {"images": x})[0], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_stage_off_leaves_the_q_table(ort_library, tmp_path, monkeypatch):
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qk")
    model, spec = tiny_deit(cfg)
    path = export_onnx(model, tmp_path / "m.onnx", spec=spec)
    monkeypatch.setenv("IRPE_ORT_FUSE", "gather,scatter,softmax")
    _, ops = env_session(path, custom_ops="on")
    assert ops.q_layout == 0 and ops.fused == 4
    assert fuse_model(str(path), stages=("qlayout",))[1].qlayout == 2


def _q_graph(ids: np.ndarray, k: int, index_is_input: bool = False) -> onnx.ModelProto:
    """RPEGather(Reshape(MatMul(x, W), [0, 0, 1, -1]), ids) with W [1, 1, 4, k]."""
    from export.functions import gather_function
    n = ids.shape[1]
    w = numpy_helper.from_array(np.ones((1, 1, 4, k), np.float32), "W")
    shape = numpy_helper.from_array(np.array([0, 0, 1, -1], np.int64), "shape")
    inits = [w, shape] + ([] if index_is_input else [numpy_helper.from_array(ids, "ids")])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t"]),
             helper.make_node("Reshape", ["t", "shape"], ["row"]),
             helper.make_node("RPEGather", ["row", "ids"], ["out"], domain="irpe",
                              num_buckets=n * k, **ATTRS)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, n, 4])]
    if index_is_input:
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [n, n]))
    graph = helper.make_graph(nodes, "q", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              initializer=inits,
                              value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT,
                                                                        [1, 2, n, k])])
    model = helper.make_model(graph, functions=[gather_function(DEFAULT_OPSET)], opset_imports=[
        helper.make_opsetid("", DEFAULT_OPSET), helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("case", ["q form", "not the q form", "index is an input"])
def test_only_the_exact_q_form_is_rewritten(ort_library, case):
    n, k = 6, 5
    codes = np.random.default_rng(0).integers(0, k, (n, n))
    ids = codes + np.arange(n)[None, :] * k
    if case == "not the q form":
        ids = ids[:, ::-1].copy()  # key j reads another key's row
    model = _q_graph(ids.astype(np.int64), k, index_is_input=case == "index is an input")
    data = model.SerializeToString()
    fused, counts = fuse_model(data, stages=("qlayout",))
    assert counts.qlayout == (1 if case == "q form" else 0)
    if case != "q form":
        assert fused is data  # left as it was
        return
    x = np.random.default_rng(1).standard_normal((1, 2, n, 4), dtype=np.float32)
    want = env_session(data, custom_ops="off")[0].run(None, {"x": x})[0]
    got = env_session(fused, custom_ops="on")[0].run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
