"""Request bodies (issue 42): a Content-Encoding is undone off the event loop, so inflating
bodies never stalls other requests (defect 12, a real `irpe serve` process); gzip bodies follow
gzip's own rules: several members are one body, trailing garbage is a 400 that says so (defect
13); a 413 is counted and logged under the route the request was sent to, whether refused on
its declared Content-Length or while streaming (defect 14)."""
from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import socket
import threading
import time
import zlib

import httpx
import pytest

from serve.config import ServeSettings
from tests.drain_load import percentile_ms
from tests.helpers import ROOT, metric, running_server, shape_png, start_cli, wait_ready, wait_until

LIMIT = 128 << 10
PNG = shape_png(2)
ROUTE = "/v1/models/{name}/classify"


@pytest.fixture(scope="module")
def url(cls_file):
    settings = ServeSettings(threads=1, max_body_bytes=LIMIT, log_level="warning",
                             models=[{"name": "cls", "path": cls_file}])
    with running_server(settings) as base:
        yield base


def _v2_body() -> bytes:
    return json.dumps({"inputs": [{"name": "images", "shape": [1, 3, 64, 64],
                                   "datatype": "FP32", "data": [0.25] * (3 * 64 * 64)}]}).encode()


KINDS = {  # kind -> (path, body, content type)
    "raw": ("/v1/classify", PNG, "image/png"),
    "json": ("/v1/classify", json.dumps({"images": [base64.b64encode(PNG).decode()]}).encode(),
             "application/json"),
    "v2": ("/v2/models/cls/infer", _v2_body(), "application/json"),
}


def _members(body: bytes, parts: int = 3) -> bytes:
    """``body`` as ``parts`` gzip members, concatenated (what `cat a.gz b.gz` makes)."""
    step = -(-len(body) // parts)
    return b"".join(gzip.compress(body[i:i + step]) for i in range(0, len(body), step))


@pytest.mark.parametrize("kind", list(KINDS))
def test_gzip_members_are_one_body_and_trailing_garbage_is_refused(url, kind):
    path, body, ctype = KINDS[kind]
    with httpx.Client(base_url=url, timeout=30) as c:
        def post(data: bytes, coding: str = "gzip") -> httpx.Response:
            return c.post(path, content=data, headers={"content-type": ctype,
                                                       "content-encoding": coding})
        plain = c.post(path, content=body, headers={"content-type": ctype})
        assert plain.status_code == 200, plain.text
        assert gzip.decompress(_members(body)) == body  # valid gzip, per gzip itself
        for data, coding in ((_members(body), "gzip"),
                             (_members(body) + b"\0" * 64, "gzip"),  # zero padding: gzip's too
                             (_members(_members(body)), "gzip, gzip")):
            r = post(data, coding)
            assert (r.status_code, r.json()) == (200, plain.json())  # main: 400 blaming the body
        r = post(_members(body, 2), "gzip, identity")
        assert r.status_code == 200
        for data, coding in ((gzip.compress(body) + b"garbage!", "gzip"),
                             (gzip.compress(body) + b"\0\0\x1f", "gzip"),
                             (zlib.compress(body) + b"garbage!", "deflate")):
            r = post(data, coding)
            assert r.status_code == 400, (coding, r.text)  # main: 200, the garbage ignored
            assert r.json()["error"] == (f"cannot decompress the {coding} body: trailing data "
                                         f"after the end of the {coding} stream")
        r = post(_members(body)[:-5])
        assert r.status_code == 400 and r.json()["error"] == \
            "cannot decompress the gzip body: the stream is truncated"
        r = post(_members(body + b" " * (2 * LIMIT)))  # each member small, together too big
        assert r.status_code == 413
        assert r.json() == {"error": f"decompressed body is over the limit of {LIMIT} bytes"}


def _raw_post(url: str, path: str, head: str, body: bytes) -> int:
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n{head}"
                     "\r\n".encode() + body)
        return int(sock.makefile("rb").readline().split()[1])


def test_413_is_counted_and_logged_under_its_route(url, caplog):
    caplog.set_level(logging.INFO, logger="irpe.serve.access")
    labels = dict(method="POST", route=ROUTE, status="413")  # /metrics order
    before = metric(url, "irpe_http_requests_total", **labels)
    unmatched = metric(url, "irpe_http_requests_total", method="POST", route="unmatched",
                       status="413")
    big = b"\0" * (LIMIT + 1)
    declared = _raw_post(url, "/v1/models/cls/classify", f"Content-Length: {len(big)}\r\n", big)
    chunked = f"{len(big):x}\r\n".encode() + big + b"\r\n0\r\n\r\n"
    streamed = _raw_post(url, "/v1/models/cls/classify", "Transfer-Encoding: chunked\r\n",
                         chunked)
    assert (declared, streamed) == (413, 413)
    assert metric(url, "irpe_http_requests_total", **labels) == before + 2  # main: + 1
    assert metric(url, "irpe_http_requests_total", method="POST", route="unmatched",
                  status="413") == unmatched  # main: + 1, the declared one
    logged = [r for r in caplog.records if getattr(r, "status", None) == 413]
    assert [r.route for r in logged] == [ROUTE, ROUTE]
    assert _raw_post(url, "/nowhere", f"Content-Length: {len(big)}\r\n", big) == 413
    assert metric(url, "irpe_http_requests_total", method="POST", route="unmatched",
                  status="413") == unmatched + 1  # no route: unmatched, as a 404 is


BOMB = gzip.compress(b"\0" * ((32 << 20) - 1024), 9)  # ~32 KB inflating to just under 32 MiB
LOADERS = 4


def test_inflating_bodies_leaves_the_event_loop_free(tmp_path, cls_file):
    """4 clients send gzip bombs under the (default 32 MiB) limit while another times
    /v2/health/live: main 5cf76dc inflated on the event loop (p50 292-295 ms)."""
    repo = tmp_path / "repo.yaml"
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: cls, path: {cls_file}}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc, url, lines = start_cli(repo, env)
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # no stall
    wait_ready(url)
    stop, answers = threading.Event(), []

    def bombard() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/v1/classify", content=BOMB, headers={
                    "content-type": "image/png", "content-encoding": "gzip"})
                answers.append(r.status_code)
    threads = [threading.Thread(target=bombard, daemon=True) for _ in range(LOADERS)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(answers) >= LOADERS, 60, "every bomb answered once")
        samples, until = [], len(answers) + 3 * LOADERS  # while 12 more bombs inflate
        with httpx.Client(base_url=url, timeout=30) as c:
            while len(samples) < 60 or len(answers) < until:
                start = time.perf_counter()
                assert c.get("/v2/health/live").status_code == 200
                samples.append(time.perf_counter() - start)
                time.sleep(0.005)
        p50, done = percentile_ms(samples), len(answers)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        proc.kill()
        proc.wait()
    print(f"\n/v2/health/live under {LOADERS} gzip bombs: {len(samples)} samples, "
          f"p50 {p50:.1f} ms, p90 {percentile_ms(samples, 0.9):.1f} ms; {done} bombs answered "
          f"{sorted(set(answers))}")
    assert set(answers) == {400}  # inflated in full (no 413), then not an image
    assert p50 <= 25, f"/v2/health/live p50 {p50:.1f} ms while bodies inflate"
