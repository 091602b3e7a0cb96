"""RPEAttention (plugins/onnxruntime/rpe_attention.cpp): a whole attention block with its iRPE
terms in one custom op, on hand-made graphs against a float64 PyTorch reference, on every SIMD
level, thread counts, odd sizes, ids outside the tables, and bad input (a clear error, the
session keeps serving)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from irpe import bucket_ids
from irpe.artifact.contract import DEFAULT_OPSET
from irpe.runtime.onnxruntime.session import CustomOpsError
from tests.helpers import env_session

pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py

F32 = TensorProto.FLOAT
SIMD = ["portable", "avx2", "avx512"]  # capped to what the CPU has
ORDER = ("q", "k", "v", "wk", "idk", "wq", "idq", "idv", "wv")


def _case(terms: str, b=2, h=3, size=5, d=24, k=50, seed=0, index_type=np.int64):
    """Inputs of one block: q, k, v [b, h, L, d] and the weights / ids of ``terms`` (k, q, v)."""
    rng = np.random.default_rng(seed)
    ids = bucket_ids("product", 1.9, size, size, skip=1).numpy() % k
    n = ids.shape[0]
    x = {name: rng.standard_normal((b, h, n, d), dtype=np.float32) for name in ("q", "k", "v")}
    x["q"] *= np.float32(d ** -0.5)  # q arrives scaled, as in the models
    if "k" in terms:
        x.update(wk=(0.3 * rng.standard_normal((1, 1, d, k))).astype(np.float32),
                 idk=ids.astype(index_type))
    if "q" in terms:
        x.update(wq=(0.3 * rng.standard_normal((1, 1, k, d))).astype(np.float32),
                 idq=(ids.T * n + np.arange(n)[None, :]).astype(index_type))
    if "v" in terms:
        x.update(idv=ids.T.copy().astype(index_type),
                 wv=(0.3 * rng.standard_normal((1, 1, k, d))).astype(np.float32))
    return x


def _reference(x) -> np.ndarray:
    """softmax(q k^T + K term + Q term) v + V term, in float64."""
    t = {name: torch.from_numpy(np.asarray(v)) for name, v in x.items()}
    q, k, v = (t[name].double() for name in ("q", "k", "v"))
    n = q.shape[2]
    logits = q @ k.transpose(-1, -2)
    if "wk" in t:
        table = q @ t["wk"].double()[0, 0]
        ids = t["idk"].long()
        ok = (ids >= 0) & (ids < table.shape[-1])
        picked = table[:, :, torch.arange(n)[:, None], ids.clamp(0, table.shape[-1] - 1)]
        logits = logits + torch.where(ok, picked, 0.0)
    if "wq" in t:
        table = (t["wq"].double()[0, 0] @ k.transpose(-1, -2)).flatten(2)  # [b, h, K * L]
        ids = t["idq"].long()
        ok = (ids >= 0) & (ids < table.shape[-1])
        logits = logits + torch.where(ok, table[:, :, ids.clamp(0, table.shape[-1] - 1)], 0.0)
    probs = logits.softmax(-1)
    out = probs @ v
    if "wv" in t:
        kv = t["wv"].shape[-2]
        ids = t["idv"].long()
        ok = ((ids >= 0) & (ids < kv)).double()
        onehot = torch.nn.functional.one_hot(ids.clamp(0, kv - 1), kv).double() * ok[..., None]
        sums = torch.einsum("bhij,ijc->bhic", probs, onehot)
        out = out + sums @ t["wv"].double()[0, 0]
    return out.numpy()


def _model(x, constant=True, **attrs) -> bytes:
    """One RPEAttention node; weights and ids as initializers (constant) or graph inputs."""
    feeds = [n for n in ORDER if n in x and (n in ("q", "k", "v") or not constant)]
    inits = [numpy_helper.from_array(np.asarray(x[n]), n) for n in ORDER
             if n in x and n not in feeds]
    node = helper.make_node("RPEAttention", [n if n in x else "" for n in ORDER], ["out"],
                            domain="irpe", **attrs)
    types = {n: helper.np_dtype_to_tensor_dtype(np.asarray(x[n]).dtype) for n in feeds}
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, types[n], None)
                                            for n in feeds],
                              [helper.make_tensor_value_info("out", F32, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET),
                                                    helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _run(x, threads=1, constant=True, session=None, **attrs):
    if session is None:
        session, _ = env_session(_model(x, constant, **attrs), threads=threads,
                                    custom_ops="on", quiet=True)
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {n: np.asarray(v) for n, v in x.items() if n in names})[0]


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("terms", ["", "k", "q", "v", "kq", "kqv"])
def test_matches_reference_on_every_simd_level(ort_library, monkeypatch, simd, terms):
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    x = _case(terms)
    np.testing.assert_allclose(_run(x), _reference(x), rtol=0, atol=3e-6)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("b,h,size,d,k", [(1, 1, 1, 7, 3), (1, 5, 6, 40, 50), (2, 2, 4, 64, 81),
                                          (1, 3, 7, 33, 13), (1, 1, 7, 16, 30), (0, 2, 3, 8, 5)])
def test_odd_sizes_and_int32_ids(ort_library, monkeypatch, simd, b, h, size, d, k):
    """(1, 1, 7, ..): one pair of 50 queries, split into parts on the pool (fewer pairs than
    threads); (0, ..): an empty batch gives an empty output."""
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    x = _case("kqv", b=b, h=h, size=size, d=d, k=k, seed=size, index_type=np.int32)
    np.testing.assert_allclose(_run(x), _reference(x), rtol=0, atol=3e-6)


@pytest.mark.parametrize("simd", SIMD)
def test_ids_outside_the_tables_add_nothing(ort_library, monkeypatch, simd):
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    x = _case("kqv")
    for name, bad in (("idk", (-1, 50, 2**40)), ("idq", (-7, 50 * 26)), ("idv", (-1, 51))):
        flat = x[name].reshape(-1)
        flat[3::11] = bad[0]
        flat[5::13] = bad[-1]
    np.testing.assert_allclose(_run(x), _reference(x), rtol=0, atol=3e-6)


def test_thread_count_and_constant_inputs_do_not_change_bits(ort_library):
    x = _case("kqv", b=3, h=4)
    one = _run(x, threads=1)
    assert np.array_equal(one, _run(x, threads=2))
    assert np.array_equal(one, _run(x, threads=2, constant=False))
    x32 = {n: (v.astype(np.int32) if v.dtype == np.int64 else v) for n, v in x.items()}
    assert np.array_equal(one, _run(x32, threads=2))


def test_bad_input_is_an_error_and_the_session_keeps_serving(ort_library):
    x = _case("kqv")
    session, _ = env_session(_model(x, constant=False), threads=2, custom_ops="on", quiet=True)
    good = _run(x, session=session)
    cases = [
        (dict(k=x["k"][:, :, :-1]), "q, k and v must be [B, H, L, d] of one shape"),
        (dict(wk=x["wk"][:, :, :-1]), "wk must be [d, K] with d = 24"),
        (dict(wq=np.zeros((2, 1, 50, 24), np.float32)),
         "wq must be [.., rows, cols] with leading dims 1"),
        (dict(idq=np.zeros_like(x["idq"]) + 1), "the Q index must be bucket-major"),
        (dict(idv=x["idv"][:-1]), "an index must be [L, L] = [26, 26]"),
    ]
    for change, message in cases:
        with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument) as err:
            _run({**x, **change}, session=session)
        assert "RPEAttention: " + message in str(err.value)
    assert np.array_equal(_run(x, session=session), good)


def test_a_weight_without_its_index_is_refused(ort_library):
    x = _case("k")
    del x["idk"]
    session, _ = env_session(_model(x), threads=1, custom_ops="on", quiet=True)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument,
                       match="each term needs both its weight and its index"):
        _run(x, session=session)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("terms,d", [("", 24), ("kqv", 24), ("kv", 7)])
def test_packed_qkv_input_scale_and_output_layout(ort_library, monkeypatch, simd, terms, d):
    """Input 0 the qkv projection [B, L, 3, H, d] (k, v empty), logits scaled by the attribute,
    output [B, L, H, d]: the form the fusion writes for timm's attention."""
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    x = _case(terms, d=d, seed=4)
    scale = 0.37
    x["q"] = x["q"] / np.float32(d ** -0.5)  # unscaled: the op scales
    packed = {n: v for n, v in x.items() if n not in ("q", "k", "v")}
    qkv = np.stack([x["q"], x["k"], x["v"]], 2)  # [b, h, 3, L, d] -> [b, L, 3, h, d]
    packed["q"] = np.ascontiguousarray(qkv.transpose(0, 3, 2, 1, 4))
    want = _reference(dict(x, q=x["q"] * np.float32(scale)))  # scale q, not the logits
    got = _run(packed, scale=scale, out_layout=1)
    assert got.shape == (2, 26, 3, d)
    np.testing.assert_allclose(got.transpose(0, 2, 1, 3), want, rtol=0, atol=3e-6)
    got = _run(packed, scale=scale)  # out_layout 0: [B, H, L, d]
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6)


@pytest.mark.parametrize("attrs", [dict(out_layout=2), dict(scale=float("nan"))])
def test_bad_attributes_are_refused_when_the_session_is_made(ort_library, attrs):
    message = r"RPEAttention: scale must be finite and out_layout 0 \(\[B, H, L, d\]\) or 1"
    with pytest.raises(CustomOpsError, match=message):
        _run(_case(""), **attrs)
