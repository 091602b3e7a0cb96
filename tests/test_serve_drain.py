"""SIGTERM drains like nginx / Envoy (a real `irpe serve` process): readiness answers 503 at once
and for the whole ``drain_grace_s``, requests keep being answered meanwhile, every response of
the drain says ``Connection: close``, idle keep-alive connections and the listener are closed
only after the grace, and no keep-alive client sees a reset or a protocol error for a request it
sent before the server told it ``Connection: close`` (issue 42, defect 11)."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from typing import Dict, List, Tuple

import httpx

from tests.drain_load import UNKNOWN, KeepAliveLoad, summary
from tests.helpers import ROOT, shape_png, start_cli, wait_until

GRACE_S = 1.5
CLIENTS = 20
PNG = {"content-type": "image/png"}


def _serve(tmp_path, cls_file, grace_s: float = GRACE_S) -> Tuple:
    """`irpe serve` of one classifier with ``drain_grace_s``; its stderr read by a thread (a
    full pipe would stall the server's logging): (process, URL, log lines)."""
    repo = tmp_path / "repo.yaml"
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: cls, path: {cls_file}}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IRPE_SERVE_DRAIN_GRACE_S": str(grace_s)}
    proc, url, lines = start_cli(repo, env)
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, url, lines


class ReadyPoller:
    """GET /v2/health/ready on a new connection every 20 ms (a load balancer's health check),
    recording (sent, received, status or error class) until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.seen = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                r = httpx.get(f"{self.url}/v2/health/ready", timeout=10)
                result = (r.status_code, r.json().get("error"), r.headers.get("connection"))
            except httpx.HTTPError as exc:
                result = (type(exc).__name__, None, None)
            self.seen.append((sent, time.monotonic(), result))
            self._stop.wait(0.02)

    def stop(self) -> List:
        self._stop.set()
        self._thread.join(15)
        return self.seen


def test_sigterm_under_keepalive_load_loses_no_request(tmp_path, cls_file):
    proc, url, lines = _serve(tmp_path, cls_file)
    load = KeepAliveLoad(f"{url}/v1/classify", shape_png(3), PNG, CLIENTS).start()
    poller = None
    try:
        wait_until(lambda: load.count() >= 2 * CLIENTS, 60, "every client answered")
        poller = ReadyPoller(url)
        wait_until(lambda: any(r[0] == 200 for _, _, r in poller.seen), 30, "ready polled")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        outcomes = load.stop()
        seen = poller.stop() if poller else []
        proc.kill()
    after = summary(outcomes, since=signalled)
    draining = [(s, d, r) for s, d, r in seen if r[0] == 503]
    print(f"\ndrain: after SIGTERM {after}")
    assert draining, f"no readiness 503 seen over HTTP during the drain: {seen[-5:]}"
    assert all(r[1] == "server is shutting down" and r[2] == "close" for _, _, r in draining)
    span = draining[-1][0] - draining[0][0]
    print(f"\ndrain: after SIGTERM {after}; readiness 503 for {span:.2f} s")
    assert span >= GRACE_S / 2, f"readiness 503 visible for only {span:.2f} s"
    assert after["unknown_untold"] == 0, after  # main: 10-12 ReadError, 0-3 RemoteProtocolError
    assert after.get("200", 0) > 0 and after.get("503", 0) == 0, after  # served on in the grace
    told_at = draining[0][1]  # the server was draining by then: every answer says close
    late = [o for o in outcomes if o.sent >= told_at and o.result.isdigit()]
    assert late and all(o.close for o in late), summary(late)
    assert not [o for o in outcomes if o.sent < signalled and o.result in UNKNOWN]
    wait_until(lambda: "stopped; queued" in "".join(lines[-3:]), 10, "the last log line read")
    steps = [json.loads(line) for line in lines if '"message": "d' in line or "listener" in line]
    print("drain log:", [(e["message"], {k: v for k, v in e.items() if k in (
        "grace_s", "from_backlog", "connections", "in_flight", "seconds")}) for e in steps])
    assert [e["message"] for e in steps] == ["draining", "listener closed", "drained"]


def _request(sock: socket.socket, path: str) -> None:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def _response(sock: socket.socket) -> Tuple[int, Dict[str, str]]:
    """Read one response (status, lower-case headers) with its Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in
                   (line.split(":", 1) for line in lines[1:]))
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(4096)
    return int(lines[0].split()[1]), headers


def _eof_within(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_idle_keepalive_connections_close_only_after_the_grace(tmp_path, cls_file):
    proc, url, _ = _serve(tmp_path, cls_file)
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    try:
        idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(2)]
        for sock in idle:
            _request(sock, "/v2/health/live")
            status, headers = _response(sock)
            assert status == 200 and headers.get("connection") != "close"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        poller = ReadyPoller(url)
        wait_until(lambda: any(r[0] == 503 for _, _, r in poller.seen), 10, "readiness 503")
        poller.stop()
        # a request on a connection opened before the signal is answered, and told to close
        _request(idle[0], "/v2/health/ready")
        status, headers = _response(idle[0])
        assert (status, headers.get("connection")) == (503, "close")
        assert _eof_within(idle[0], 10)
        # the other idle connection stays open for the grace (main: closed at once)
        assert _eof_within(idle[1], 30)
        held = time.monotonic() - signalled
        assert held >= GRACE_S, f"idle connection closed {held:.2f} s after SIGTERM"
        try:  # and from then on the listener is closed
            socket.create_connection((host, int(port)), timeout=5).close()
            raise AssertionError("a connection was accepted after the grace")
        except ConnectionRefusedError:
            pass
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        proc.kill()
