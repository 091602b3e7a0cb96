"""The Softmax fusion of the ORT custom-op library: RPEGatherAdd*Softmax(Scatter) and
RPEBucketMatMulAdd on hand-made graphs against PyTorch, on every SIMD level
($IRPE_ORT_SIMD), thread counts, masked rows, bad attributes / shapes, and the load-time
rewrite (irpe/runtime/onnxruntime/rewrites.py) of Softmax(Add(x, RPEGather)) with and without
the V chain."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from irpe import bucket_ids, rpe_scatter
from irpe.artifact.contract import DEFAULT_OPSET
from irpe.runtime.graph.rewrites import parse_stages
from tests.helpers import ORT_ATTRS as ATTRS
from tests.helpers import env_session

pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py

K, D = 50, 24
F32 = TensorProto.FLOAT
SIMD = ["portable", "avx2", "avx512"]  # capped to what the CPU has


def _model(nodes, inputs, outputs, inits=()) -> bytes:
    from export.functions import gather_function, scatter_function
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F32, None)
                                           for n in inputs],
                              [helper.make_tensor_value_info(n, F32, None) for n in outputs],
                              initializer=list(inits))
    model = helper.make_model(graph, functions=[gather_function(DEFAULT_OPSET),
                                                scatter_function(DEFAULT_OPSET)],
                              opset_imports=[helper.make_opsetid("", DEFAULT_OPSET),
                                             helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _layer(b=2, h=3, seed=0, size=5):
    """Product ids on a size x size grid + cls; logits, K table, 1-row Q table, V base."""
    rng = np.random.default_rng(seed)
    ids = bucket_ids("product", 1.9, size, size, skip=1).numpy()
    n = ids.shape[0]
    return dict(ids=ids, idt=(ids + np.arange(n)[:, None] * K).T.copy(),
                base=rng.standard_normal((b, h, n, n), dtype=np.float32),
                t1=rng.standard_normal((b, h, n, K), dtype=np.float32),
                t2=rng.standard_normal((b, h, 1, n * K), dtype=np.float32),
                vbase=rng.standard_normal((b, h, n, D), dtype=np.float32),
                W=(0.1 * rng.standard_normal((K, D))).astype(np.float32))


def _torch_probs(x, terms: int) -> torch.Tensor:
    ids, logits = torch.from_numpy(x["ids"]), torch.from_numpy(x["base"])
    n = ids.shape[0]
    logits = logits + torch.from_numpy(x["t1"])[:, :, torch.arange(n)[:, None], ids]
    if terms == 2:
        flat = torch.from_numpy(x["t2"])[:, :, 0]
        logits = logits + flat[:, :, torch.from_numpy(x["idt"])]
    return logits.softmax(-1)


def _fused_graph(terms: int, scatter: bool, index_type=np.int64, **attrs):
    op = "RPEGatherAdd" + ("2" if terms == 2 else "") + "Softmax" + ("Scatter" if scatter else "")
    inputs = ["t1", "ids", "base"] + (["t2", "idt"] if terms == 2 else []) + \
        (["ids"] if scatter else [])
    outputs = ["p", "s"] if scatter else ["p"]
    attrs = dict(dict(num_buckets=K, scatter_buckets=K) if scatter else dict(num_buckets=K),
                 **attrs)
    return op, inputs, outputs, attrs


def _run(x, terms, scatter, threads=2, index_type=np.int64, **attrs):
    op, inputs, outputs, attrs = _fused_graph(terms, scatter, **attrs)
    inits = [numpy_helper.from_array(x["ids"].astype(index_type), "ids"),
             numpy_helper.from_array(x["idt"].astype(index_type), "idt")]
    data = _model([helper.make_node(op, inputs, outputs, domain="irpe", **ATTRS, **attrs)],
                  [n for n in ("t1", "base", "t2") if n in inputs], outputs, inits)
    session, _ = env_session(data, threads=threads, custom_ops="on", quiet=True)
    return session.run(None, {n: x[n] for n in ("t1", "base", "t2") if n in inputs})


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("terms,b,h,size", [(1, 2, 3, 5), (2, 1, 4, 4), (2, 3, 3, 7)])
def test_softmax_ops_match_torch_on_every_simd_level(ort_library, monkeypatch, simd, terms,
                                                     b, h, size):
    """B*H = 6, 4, 9: groups of 4 rows and single rows; L = 26, 17, 50: partial vectors."""
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    x = _layer(b, h, size=size)
    probs, sums = _run(x, terms, scatter=True)
    want = _torch_probs(x, terms)
    np.testing.assert_allclose(probs, want.numpy(), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(sums, rpe_scatter(want, torch.from_numpy(x["ids"]), K).numpy(),
                               rtol=1e-5, atol=1e-7)
    (alone,) = _run(x, terms, scatter=False)
    assert np.array_equal(alone, probs)  # the Scatter form's 1st output is the plain form's


def test_sums_are_rpe_scatter_of_the_probabilities_bit_for_bit(ort_library):
    """The 2nd output is the library's own RPEScatter of the 1st (same order of additions)."""
    x = _layer(3, 3, size=6)
    probs, sums = _run(x, 2, scatter=True)
    data = _model([helper.make_node("RPEScatter", ["p", "ids"], ["s"], domain="irpe",
                                    num_buckets=K, **ATTRS)], ["p"], ["s"],
                  [numpy_helper.from_array(x["ids"], "ids")])
    scatter, _ = env_session(data, custom_ops="on", quiet=True)
    assert np.array_equal(scatter.run(None, {"p": probs})[0], sums)


def test_thread_count_and_index_type_do_not_change_bits(ort_library):
    x = _layer(3, 3, size=6)
    one = _run(x, 2, scatter=True, threads=1)
    assert all(np.array_equal(a, b) for a, b in zip(one, _run(x, 2, True, threads=2), strict=True))
    assert all(np.array_equal(a, b) for a, b in
               zip(one, _run(x, 2, True, threads=2, index_type=np.int32), strict=True))


@pytest.mark.parametrize("simd", SIMD)
def test_masked_keys_and_fully_masked_rows(ort_library, monkeypatch, simd):
    """-inf logits give exactly 0; a row that is all -inf gives NaN, as torch.softmax."""
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    x = _layer(1, 4, size=5)
    x["base"][0, 0, :, 3:9] = -np.inf
    x["base"][0, 1, 2, :] = -np.inf
    (probs,) = _run(x, 1, scatter=False)
    want = _torch_probs(x, 1).numpy()
    assert np.all(probs[0, 0, :, 3:9] == 0.0)
    assert np.isnan(probs[0, 1, 2]).all() and np.isnan(want[0, 1, 2]).all()
    finite = ~np.isnan(want)
    np.testing.assert_allclose(probs[finite], want[finite], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("d", [D, 64, 7])
def test_bucket_matmul_add_matches_numpy(ort_library, monkeypatch, simd, d):
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    rng = np.random.default_rng(1)
    sums = rng.random((2, 3, 26, K), dtype=np.float32)
    base = rng.standard_normal((2, 3, 26, d), dtype=np.float32)
    weight = rng.standard_normal((K, d)).astype(np.float32)
    data = _model([helper.make_node("RPEBucketMatMulAdd", ["s", "W", "base"], ["o"],
                                    domain="irpe", num_buckets=K, **ATTRS)],
                  ["s", "base"], ["o"], [numpy_helper.from_array(weight, "W")])
    session, _ = env_session(data, custom_ops="on", quiet=True)
    got = session.run(None, {"s": sums, "base": base})[0]
    np.testing.assert_allclose(got, base + sums @ weight, rtol=1e-5, atol=1e-5)


def test_bad_attribute_and_shapes_are_clear_errors(ort_library):
    x = _layer()
    with pytest.raises(Exception, match="scatter_buckets"):
        _run(x, 1, scatter=True, scatter_buckets=0)
    op, inputs, outputs, attrs = _fused_graph(1, True)
    short = x["ids"][:5].copy()  # the V index must be [Lq, Lk]
    data = _model([helper.make_node(op, inputs[:3] + ["v"], outputs, domain="irpe", **ATTRS,
                                    **attrs)], ["t1", "base"], outputs,
                  [numpy_helper.from_array(x["ids"], "ids"), numpy_helper.from_array(short, "v")])
    session, _ = env_session(data, custom_ops="on", quiet=True)
    with pytest.raises(Exception, match=r"RPEGatherAddSoftmaxScatter: the scatter index must "
                                        r"be \[Lq, Lk\] = \[26, 26\]"):
        session.run(None, {"t1": x["t1"], "base": x["base"]})
    (probs,) = _run(x, 1, scatter=False)  # the library keeps serving after the error
    assert np.isfinite(probs).all()


def _attention_graph(with_v: bool, axis: int = -1, second_use: bool = False) -> bytes:
    """Softmax(Add(logits, RPEGather(t1, ids))) [-> MatMul(P, v) + MatMul(RPEScatter(P), W)]."""
    g = dict(domain="irpe", num_buckets=K, **ATTRS)
    n = helper.make_node
    nodes = [n("RPEGather", ["t1", "ids"], ["g"], **g), n("Add", ["base", "g"], ["l"]),
             n("Softmax", ["l"], ["p"], axis=axis)]
    outputs = ["p"]
    if with_v:
        nodes += [n("MatMul", ["p", "vbase"], ["pv"]), n("RPEScatter", ["p", "ids"], ["s"], **g),
                  n("MatMul", ["s", "W"], ["sw"]), n("Add", ["pv", "sw"], ["o"])]
        outputs = ["o"]
    if second_use:
        outputs.append("l")
    x = _layer()
    inits = [numpy_helper.from_array(x["ids"], "ids"), numpy_helper.from_array(x["W"], "W")]
    data = _model(nodes, ["t1", "base"] + (["vbase"] if with_v else []), outputs, inits)
    import onnx  # the fusion needs the types: infer them as the exporter's files carry them
    return onnx.shape_inference.infer_shapes(onnx.load_from_string(data)).SerializeToString()


def _torch_attention(x) -> np.ndarray:
    p = _torch_probs(x, 1)
    s = rpe_scatter(p, torch.from_numpy(x["ids"]), K)
    return (p @ torch.from_numpy(x["vbase"]) + s @ torch.from_numpy(x["W"])).numpy()


@pytest.mark.parametrize("with_v", [False, True])
def test_load_time_rewrite(ort_library, monkeypatch, with_v):
    x = _layer()
    data = _attention_graph(with_v)
    feeds = {k: x[k] for k in ("t1", "base", "vbase")[:3 if with_v else 2]}
    session, path = env_session(data, custom_ops="on", quiet=True)
    assert (path.fused, path.fused_softmax) == (1, 1) and "1 Softmax fused" in path.describe()
    got = session.run(None, feeds)[0]
    want = _torch_attention(x) if with_v else _torch_probs(x, 1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("IRPE_ORT_FUSE", "gather,scatter")  # the stage switch
    unfused, path = env_session(data, custom_ops="on", quiet=True)
    assert path.fused_softmax == 0
    np.testing.assert_allclose(unfused.run(None, feeds)[0], got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["softmax over another axis", "logits used twice"])
def test_left_unfused(ort_library, case):
    x = _layer()
    data = _attention_graph(False, axis=1 if "axis" in case else -1, second_use="twice" in case)
    session, path = env_session(data, custom_ops="on", quiet=True)
    assert path.fused_softmax == 0
    ref, _ = env_session(data, custom_ops="off", quiet=True)
    feeds = {"t1": x["t1"], "base": x["base"]}
    for got, want in zip(session.run(None, feeds), ref.run(None, feeds), strict=True):
        assert np.array_equal(got, want)


def test_fuse_stage_setting():
    assert parse_stages("1") == parse_stages("") == {"qlayout", "gather", "scatter", "softmax",
                                                     "attention"}
    assert parse_stages("0") == frozenset() and parse_stages("gather") == {"gather"}
    assert parse_stages(" Gather , softmax ") == {"gather", "softmax"}
    with pytest.raises(ValueError, match="unknown rewrite stage sofmax"):
        parse_stages("gather,sofmax")
