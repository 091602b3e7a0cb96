"""The bad-input matrix: every error case with its status code and JSON body, each followed
by a good request to the same server (which keeps serving)."""
from __future__ import annotations

import pytest

from tests.helpers import shape_png


def bomb_png(width: int = 20000, height: int = 20000) -> bytes:
    """A PNG header claiming width x height pixels (no pixel data): refused before decoding."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def _v2(inputs=None, outputs=None, **extra):
    body = {"inputs": inputs if inputs is not None else [
        {"name": "images", "shape": [1, 3, 64, 64], "datatype": "FP32", "data": [0.0] * 12288}]}
    if outputs is not None:
        body["outputs"] = outputs
    return {"json": {**body, **extra}}


def _png(body: bytes):
    return {"content": body, "headers": {"content-type": "image/png"}}


def _binary(header: dict, payload: bytes, length=None):
    import json
    head = json.dumps(header).encode()
    return {"content": head + payload,
            "headers": {"inference-header-content-length": str(length or len(head))}}


_IMG = {"name": "images", "shape": [1, 3, 64, 64], "datatype": "FP32"}
CLS, DET, INFER = "/v1/models/cls/classify", "/v1/models/det/detect", "/v2/models/cls/infer"
BAD = [  # (id, method, path, request kwargs, status, substring of the error)
    ("text-plain", "post", CLS, {"content": b"hi", "headers": {"content-type": "text/plain"}},
     415, "unsupported media type text/plain"),
    ("no-content-type", "post", CLS, {"content": b"hi"}, 415, "unsupported media type (none)"),
    ("garbage-png", "post", CLS, _png(b"not an image"), 400, "cannot decode image"),
    ("empty-body", "post", CLS, _png(b""), 400, "empty image data"),
    ("bomb", "post", CLS, _png(bomb_png()), 400, "over the limit"),
    ("bad-base64", "post", CLS, {"json": {"images": ["@@@"]}}, 400, "images[0] is not valid"),
    ("no-images", "post", CLS, {"json": {"images": []}}, 422, "images"),
    ("wrong-json-key", "post", CLS, {"json": {"pictures": ["x"]}}, 422, "images: Field required"),
    ("invalid-json", "post", CLS, {"content": b"{", "headers": {"content-type":
                                                               "application/json"}}, 400, "JSON"),
    ("multipart-no-file", "post", CLS, {"content": b'--b\r\nContent-Disposition: form-data; '
                                        b'name="a"\r\n\r\nb\r\n--b--\r\n', "headers": {
                                            "content-type": "multipart/form-data; boundary=b"}},
     400, "no file part"),
    ("too-many-files", "post", CLS, {"files": [("f", ("x.png", b"x"))] * 5}, 400,
     "Too many files"),
    ("over-queue", "post", "/v1/models/tiny/classify",
     {"files": [("f", (f"{i}.png", shape_png(i))) for i in range(3)]}, 400, "queues at most 2"),
    ("wrong-task", "post", "/v1/models/det/classify", _png(b"x"), 400, "is a detection model"),
    ("top-k-0", "post", CLS + "?top_k=0", _png(b"x"), 422, "top_k"),
    ("threshold", "post", DET + "?threshold=1.5", _png(b"x"), 422, "threshold"),
    ("box-format", "post", DET + "?box_format=xywh", _png(b"x"), 422, "box_format"),
    ("unknown-model", "post", "/v1/models/nope/classify", _png(b"x"), 404,
     "unknown model 'nope'; available: cls, det"),
    ("get-classify", "get", CLS, {}, 405, "Method Not Allowed"),
    ("unknown-route", "get", "/v3/models", {}, 404, "Not Found"),
    ("v2-invalid-json", "post", INFER, {"content": b"{"}, 400, "JSON"),
    ("v2-no-inputs", "post", INFER, {"json": {"inputs": []}}, 422, "inputs"),
    ("v2-fp64", "post", INFER, _v2([{**_IMG, "datatype": "FP64", "data": [0.0] * 12288}]), 400,
     "images must be FP32"),
    ("v2-shape", "post", INFER, _v2([{**_IMG, "shape": [1, 3, 32, 32], "data": [0] * 3072}]),
     400, "images must be [batch, 3, 64, 64]"),
    ("v2-unknown-input", "post", INFER, _v2([{**_IMG, "name": "pixels", "data": [0.0] * 12288}]),
     400, "takes inputs ['images']"),
    ("v2-count", "post", INFER, _v2([{**_IMG, "data": [0.0] * 10}]), 400, "10 values"),
    ("v2-strings", "post", INFER, _v2([{**_IMG, "data": ["a"] * 12288}]), 400,
     "must hold FP32 numbers"),
    ("v2-datatype", "post", INFER, _v2([{**_IMG, "datatype": "FP8", "data": [0] * 12288}]), 400,
     "unsupported datatype"),
    ("v2-no-data", "post", INFER, _v2([_IMG]), 400, "neither data nor binary_data_size"),
    ("v2-binary-size", "post", INFER, _binary(
        {"inputs": [{**_IMG, "parameters": {"binary_data_size": 100}}]}, b"\0" * 100), 400,
     "binary_data_size 100 does not match"),
    ("v2-header-length", "post", INFER, _binary({"inputs": [_IMG]}, b"", length=10 ** 6), 400,
     "does not fit"),
    ("v2-trailing", "post", INFER, _binary(
        {"inputs": [{**_IMG, "data": [0.0] * 12288}]}, b"\0" * 8), 400, "belong to no input"),
    ("v2-unknown-output", "post", INFER, _v2(outputs=[{"name": "probs"}]), 400,
     "unknown output 'probs'"),
    ("v2-classification-0", "post", INFER, _v2(outputs=[{"name": "logits", "parameters":
                                                          {"classification": 0}}]), 400,
     "classification must be a positive integer"),
    ("v2-media-type", "post", INFER, {"content": b"{}", "headers": {"content-type":
                                                                    "image/png"}}, 415,
     "unsupported media type image/png"),
    ("v2-encoding", "post", INFER, {"content": b"{}", "headers": {"content-encoding": "br"}},
     415, "Content-Encoding"),
    ("v2-gzip-garbage", "post", INFER, {"content": b"{}", "headers": {"content-encoding":
                                                                      "gzip"}}, 400,
     "cannot decompress"),
    ("v2-timeout-negative", "post", INFER, _v2(parameters={"timeout": -5}), 400,
     "parameters.timeout must be a positive number of microseconds (0: the model's timeout), "
     "got -5"),
    ("v2-timeout-text", "post", INFER, _v2(parameters={"timeout": "5"}), 400,
     "parameters.timeout must be a positive number"),
    ("v1-encoding", "post", CLS, {"content": shape_png(0), "headers": {
        "content-type": "image/png", "content-encoding": "foo"}}, 415,
     "unsupported Content-Encoding 'foo': send identity, gzip or deflate"),
    ("v2-version", "post", "/v2/models/cls/versions/2/infer", _v2(), 404, "no version '2'"),
    ("v2-batch-limit", "post", INFER, _v2([{**_IMG, "shape": [5, 3, 64, 64],
                                            "data": [0.0] * 12288 * 5}]), 400, "limit is 4"),
    ("v2-sizes", "post", "/v2/models/det/infer", _v2([
        {"name": "images", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192},
        {"name": "sizes", "shape": [1, 2], "datatype": "INT64", "data": [9, 8]}]), 400,
     "sizes must be valid"),
    ("v2-unknown-model", "get", "/v2/models/nope", {}, 404, "unknown model 'nope'"),
]


@pytest.mark.parametrize("method,path,kwargs,status,message", [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_input_is_a_json_error_and_server_keeps_serving(client, method, path, kwargs,
                                                             status, message):
    r = client.request(method.upper(), path, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["error"] and message in body["error"], body
    good = client.post(CLS, **_png(shape_png(0)))
    assert good.status_code == 200
