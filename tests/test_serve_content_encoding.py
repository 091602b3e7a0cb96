"""One Content-Encoding rule for /v1 and /v2 (a real server on 127.0.0.1): identity, gzip and
deflate bodies give the same answer, any other coding is a 415 naming the accepted ones, a
corrupt stream a 400 and a body that inflates past the limit a 413, on every body kind."""
from __future__ import annotations

import base64
import gzip
import json
import zlib

import pytest

from serve.config import ServeSettings
from tests.helpers import running_server, shape_png

LIMIT = 128 << 10
PNG = shape_png(2)
CODERS = {"identity": lambda b: b, "gzip": gzip.compress, "deflate": zlib.compress,
          "gzip, gzip": lambda b: gzip.compress(gzip.compress(b))}


@pytest.fixture(scope="module")
def url(cls_file):
    settings = ServeSettings(threads=1, max_body_bytes=LIMIT, log_level="warning",
                             models=[{"name": "cls", "path": cls_file}])
    with running_server(settings) as base:
        yield base


def _multipart(png: bytes):
    body = (b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n"
            b"Content-Type: image/png\r\n\r\n" + png + b"\r\n--xyz--\r\n")
    return body, "multipart/form-data; boundary=xyz"


def _v2_body() -> bytes:
    return json.dumps({"inputs": [{"name": "images", "shape": [1, 3, 64, 64],
                                   "datatype": "FP32", "data": [0.25] * (3 * 64 * 64)}]}).encode()


KINDS = {  # kind -> (path, body, content type)
    "raw": ("/v1/classify", PNG, "image/png"),
    "multipart": ("/v1/classify", *_multipart(PNG)),
    "json": ("/v1/classify", json.dumps({"images": [base64.b64encode(PNG).decode()]}).encode(),
             "application/json"),
    "v2": ("/v2/models/cls/infer", _v2_body(), "application/json"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_content_encoding_rule_on_v1_and_v2(client, kind):
    path, body, ctype = KINDS[kind]
    answers = {}
    for coding, encode in CODERS.items():
        r = client.post(path, content=encode(body), headers={"content-type": ctype,
                                                             "content-encoding": coding})
        assert r.status_code == 200, (coding, r.text)  # main /v1 gzip: 400 cannot identify
        answers[coding] = r.json()
    assert all(a == answers["identity"] for a in answers.values())
    for coding in ("br", "foo", "gzip, br"):  # main /v1: 200, decoded as if identity
        r = client.post(path, content=body, headers={"content-type": ctype,
                                                     "content-encoding": coding})
        assert r.status_code == 415, (coding, r.text)
        assert r.json()["error"].startswith("unsupported Content-Encoding 'br'" if "br" in
                                            coding else "unsupported Content-Encoding 'foo'")
        assert r.headers["accept-encoding"] == "gzip, deflate"
    r = client.post(path, content=gzip.compress(body)[:-12], headers={
        "content-type": ctype, "content-encoding": "gzip"})
    assert r.status_code == 400 and "cannot decompress the gzip body" in r.json()["error"]
    bomb = gzip.compress(body + b" " * (2 * LIMIT))  # small on the wire, too big inflated
    r = client.post(path, content=bomb, headers={"content-type": ctype,
                                                 "content-encoding": "gzip"})
    assert r.status_code == 413
    assert r.json() == {"error": f"decompressed body is over the limit of {LIMIT} bytes"}
