"""Clients that hang up mid-upload, and `Expect: 100-continue`, on a real `irpe serve` process
driven through raw sockets: a hang-up is the client's doing (499 in the access log, the
irpe_http_client_disconnected_total counter), never a 500, an error log or a traceback; an
over-limit declaration with Expect is refused with 413 before any body is asked for."""
from __future__ import annotations

import base64
import json
import os
import socket
import threading
from typing import Dict, List
from urllib.parse import urlsplit

import httpx
import pytest

from tests.helpers import metric, shape_png, start_cli, wait_ready, wait_until

LIMIT = 64 << 10
PNG = shape_png(0)


@pytest.fixture(scope="module")
def server(tmp_path_factory, cls_file):
    """`irpe serve` on the test classifier; its JSON log lines collected as they come."""
    repo = tmp_path_factory.mktemp("hangup") / "repo.yaml"
    repo.write_text(f"threads: 1\nmax_body_bytes: {LIMIT}\nmodels:\n"
                    f"  - {{name: cls, path: {cls_file}}}\n")
    proc, url, lines = start_cli(repo, {**os.environ, "PYTHONPATH": os.getcwd()})
    logs: List[str] = list(lines)
    reader = threading.Thread(target=lambda: logs.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        wait_ready(url)
        yield url, logs
    finally:
        proc.kill()
        proc.wait()
        reader.join(10)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.settimeout(5)  # a server that waits for a body never sent fails the test, no hang
    return sock


def _head(path: str, rid: str, length: int, content_type: str, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\nX-Request-ID: {rid}\r\n{extra}\r\n").encode()


def _entries(logs: List[str]) -> List[Dict]:
    return [json.loads(line) for line in list(logs) if line.startswith("{")]


def _access(logs: List[str], rid: str) -> List[Dict]:
    return [e for e in _entries(logs) if e.get("request_id") == rid and e["message"] == "request"]


MULTIPART = (b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\""
             b"\r\nContent-Type: image/png\r\n\r\n" + PNG)
BODIES = {  # route, content type, first 100 bytes of a body that would be 7000 long
    "raw": ("/v1/classify", "/v1/classify", "image/png", PNG[:100]),
    "multipart": ("/v1/models/cls/classify", "/v1/models/{name}/classify",
                  "multipart/form-data; boundary=b0undary", MULTIPART[:100]),
    "json": ("/v1/classify", "/v1/classify", "application/json",
             json.dumps({"images": [base64.b64encode(PNG).decode()]}).encode()[:100]),
    "v2": ("/v2/models/cls/infer", "/v2/models/{name}/infer", "application/json",
           b'{"inputs": [{"name": "images", "shape": [1, 3, 64, 64], "datatype": "FP32", '
           b'"data": [0.0, 0.0, 0.0, 0.0, 0.0'),
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_hang_up_mid_upload_is_a_499_not_a_server_error(server, kind):
    url, logs = server
    path, route, content_type, part = BODIES[kind]
    rid = f"hangup-{kind}"
    before = metric(url, "irpe_http_client_disconnected_total", method="POST", route=route)
    with _connect(url) as sock:
        sock.sendall(_head(path, rid, 7000, content_type) + part)
    wait_until(lambda: _access(logs, rid), 30, f"access log line of {rid}")
    assert _access(logs, rid)[0]["status"] == 499  # main: 500
    assert metric(url, "irpe_http_client_disconnected_total", method="POST",
                  route=route) == before + 1
    assert metric(url, "irpe_http_requests_total", method="POST", route=route,
                  status="499") >= 1
    text = "".join(logs)
    assert 'status="500"' not in httpx.get(f"{url}/metrics", timeout=30).text
    assert "Traceback" not in text and "ClientDisconnect" not in text, text[-3000:]
    assert not [e for e in _entries(logs) if e["level"] in ("error", "critical")]
    r = httpx.post(f"{url}/v1/classify", content=PNG, headers={"content-type": "image/png"},
                   timeout=30)
    assert r.status_code == 200


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:")][0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_expect_continue_over_the_limit_is_refused_before_the_body(server):
    url, logs = server
    with _connect(url) as sock:
        sock.sendall(_head("/v1/classify", "expect-big", 10 * LIMIT, "image/png",
                           "Expect: 100-continue\r\n"))
        answer = _read_response(sock)  # main: "100 Continue", then waits for the body
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 "), answer
        assert b"connection: close" in head.lower()  # no body follows: this connection ends
        assert json.loads(body) == {"error": f"request body is over the limit of {LIMIT} bytes"}
        assert sock.recv(100) == b""
    assert _access(logs, "expect-big")[0]["status"] == 413


def test_expect_continue_within_the_limit_continues(server):
    url, _ = server
    with _connect(url) as sock:
        sock.sendall(_head("/v1/classify", "expect-ok", len(PNG), "image/png",
                           "Expect: 100-continue\r\n"))
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(PNG)
        head, _, body = _read_response(sock).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert json.loads(body)["model"] == "cls"
