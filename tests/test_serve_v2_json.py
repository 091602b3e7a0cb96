"""The fast JSON path of /v2 (serve.v2codec.fast_json): it takes the usual JSON tensor bodies
(flat or nested float data, detection sizes) and gives exactly what the checked path gives;
every other body (errors included) is left to the checked path, so answers and messages stay
the same. Compared body by body against the checked path alone, then over HTTP."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from serve import v2codec
from serve.errors import ServeError

RNG = np.random.default_rng(0)
IMAGES = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)


def _body(data, shape=(2, 3, 4, 4), datatype="FP32", **extra) -> bytes:
    entry = {"name": "images", "shape": list(shape), "datatype": datatype, "data": data}
    return json.dumps({"inputs": [entry], **extra}).encode()


FAST = {  # bodies the fast path takes
    "flat": _body(IMAGES.reshape(-1).tolist()),
    "nested": _body(IMAGES.tolist()),
    "rows": _body(IMAGES.reshape(2, -1).tolist()),
    "fp16": _body(IMAGES.reshape(-1).tolist(), datatype="FP16"),
    "fp64": _body(IMAGES.reshape(-1).tolist(), datatype="FP64"),
    "ints": _body([1] * 96),
    "empty": _body([], shape=(0, 3, 4, 4)),
    "header": _body(IMAGES.tolist(), id="req-1", parameters={"binary_data_output": True,
                                                             "timeout": 5},
                    outputs=[{"name": "logits", "parameters": {"classification": 2}}]),
    "detection": json.dumps({"inputs": [
        {"name": "images", "shape": [1, 3, 2, 2], "datatype": "FP32", "data": [0.5] * 12},
        {"name": "sizes", "shape": [1, 2], "datatype": "INT64", "data": [[2, 1]]}]}).encode(),
}
CHECKED = {  # bodies left to the checked path (same answer either way)
    "nan-token": _body([float("nan")] + [0.0] * 95),
    "infinity-token": _body([float("inf")] * 96),
    "ragged": _body([[0.0] * 47, [0.0] * 49], shape=(2, 48)),
    "mixed-depth": _body([[0.0, 1.0], 2.0, 3.0], shape=(2, 2)),
    "hidden-array": _body([0.0, [1.0, 2.0], []], shape=(3,)),
    "deep-leaf": _body([[0.0, [1.0]], [2.0, 3.0]], shape=(2, 2)),
    "odd-nesting": _body([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], shape=(2, 3)),
    "count": _body([0.0] * 10),
    "strings": _body(["a"] * 96),
    "bools": _body([True] * 96),
    "huge": _body([1e400] * 96).replace(b"Infinity", b"1e400"),
    "bracket-in-id": _body(IMAGES.tolist(), id="[x]"),
    "twice": json.dumps({"inputs": [{"name": "images", "shape": [1], "datatype": "FP32",
                                     "data": [1.0]}] * 2}).encode(),
    "binary-size": _body([0.0], shape=(1,)).replace(b'"data"', b'"parameters": '
                                                    b'{"binary_data_size": 4}, "x"'),
    "no-data": json.dumps({"inputs": [{"name": "images", "shape": [1],
                                       "datatype": "FP32"}]}).encode(),
    "datatype": _body([0.0] * 96, datatype="FP8"),
    "negative-dim": _body([], shape=(-1, 3)),
    "sizes-range": json.dumps({"inputs": [{"name": "sizes", "shape": [1, 2],
                                           "datatype": "INT32", "data": [2 ** 40, 1]}]}).encode(),
    "not-json": b"{",
    "inputs-not-list": b'{"inputs": {"name": "images"}}',
    "no-inputs": b'{"inputs": []}',
    "input-not-object": b'{"inputs": [1]}',
    "top-level-list": b"[1]",
}


def _checked(body: bytes, monkeypatch):
    monkeypatch.setattr(v2codec, "FAST_JSON", False)
    try:
        return v2codec.decode_request(body, None)
    finally:
        monkeypatch.setattr(v2codec, "FAST_JSON", True)


def _outcome(call):
    try:
        request, tensors = call()
    except ServeError as exc:
        return ("error", exc.status, exc.message)
    return ("ok", request.model_dump(exclude={"inputs": {"__all__": {"data"}}}),
            {k: (v.dtype, v.shape, v.tobytes()) for k, v in tensors.items()})


def test_simdjson_is_installed_with_the_serve_extra():
    assert v2codec.FAST_JSON


@pytest.mark.parametrize("name", list(FAST))
def test_fast_path_takes_usual_bodies_and_equals_the_checked_path(name, monkeypatch):
    body = FAST[name]
    assert v2codec.fast_json(body) is not None
    assert _outcome(lambda: v2codec.decode_request(body, None)) == \
        _outcome(lambda: _checked(body, monkeypatch))


@pytest.mark.parametrize("name", list(CHECKED))
def test_other_bodies_get_the_checked_paths_answer(name, monkeypatch):
    body = CHECKED[name]
    assert v2codec.fast_json(body) is None
    fast, checked = (_outcome(lambda: v2codec.decode_request(body, None)),
                     _outcome(lambda: _checked(body, monkeypatch)))
    assert fast == checked


def test_json_tensors_over_http_equal_binary_ones(url):
    """A real server: nested JSON, flat JSON and binary tensors give the same logits."""
    import tritonclient.http as tc
    client = tc.InferenceServerClient(url.removeprefix("http://"))
    images = RNG.standard_normal((3, 3, 64, 64)).astype(np.float32)
    results = []
    for binary in (True, False):
        inp = tc.InferInput("images", list(images.shape), "FP32")
        inp.set_data_from_numpy(images, binary_data=binary)
        results.append(client.infer("cls", [inp]).as_numpy("logits"))
    import httpx
    nested = httpx.post(f"{url}/v2/models/cls/infer", timeout=30, json={"inputs": [
        {"name": "images", "shape": list(images.shape), "datatype": "FP32",
         "data": images.tolist()}]}).json()["outputs"][0]
    results.append(np.asarray(nested["data"], np.float32).reshape(nested["shape"]))
    assert results[0].shape == (3, 8)
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
    client.close()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)
_ENTRY = st.fixed_dictionaries(
    {"name": st.sampled_from(["images", "sizes", "é\"\\\u0000"]),
     "shape": st.lists(st.integers(-1, 3), max_size=4),
     "datatype": st.sampled_from(["FP32", "FP16", "INT64", "BYTES", "fp32"]), "data": _JSON},
    optional={"parameters": st.dictionaries(st.text(max_size=20), _JSON, max_size=2)})


@settings(max_examples=300, deadline=None)
@example({"\u0000": None, "inputs": []})  # simdjson's KeyError (NO_SUCH_FIELD) on this key
@given(st.one_of(_JSON, st.fixed_dictionaries({"inputs": st.lists(_ENTRY, max_size=3)},
                                              optional={"id": _JSON, "outputs": _JSON,
                                                        "parameters": _JSON})))
def test_any_json_body_takes_the_fast_path_or_is_left_to_the_checked_one(doc):
    """Whatever the body (fuzzed keys, escapes, odd types), the fast path answers exactly as the
    checked path would or declines (None): it never raises (a KeyError of simdjson on a fuzzed
    body once reached the client as a 500)."""
    body = json.dumps(doc).encode()
    fast = v2codec.fast_json(body)
    if fast is None:
        return
    request, tensors = fast
    checked = v2codec.InferRequest.model_validate_json(body)
    assert [t.name for t in checked.inputs] == list(tensors)
