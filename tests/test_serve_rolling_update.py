"""A rolling update behind a real load balancer loses no request: two `irpe serve` processes (the
demo classifier + detector) behind HAProxy, whose health checks poll ``/v2/health/ready``;
32 keep-alive clients classify through the proxy while each replica in turn is sent SIGTERM,
exits, and is started again (3 restarts). Every client request must be answered 200: the drain's
readiness 503 takes the draining replica out of the proxy's rotation while it still serves, and
its ``Connection: close`` answers retire the proxy's connections to it (docs/serve.md).

Needs the ``haproxy`` binary (Debian: ``apt-get install haproxy``; .ci/run installs it): the test
skips without it, except under CI=true, where it fails."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List

import httpx
import pytest

from tests.drain_load import KeepAliveLoad, summary
from tests.helpers import ROOT, shape_png, wait_until

CLIENTS = 32
RESTARTS = ("a", "b", "a")
GRACE_S = 2.0   # > the proxy's detection: fall 2 x inter 200 ms, plus a slow check under load
HAPROXY_CFG = """
global
    nbthread 1
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout check 2s
    retries 3
    option redispatch
frontend front
    bind 127.0.0.1:{front}
    default_backend replicas
frontend stats
    bind 127.0.0.1:{stats}
    stats enable
    stats uri /stats
backend replicas
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
    default-server inter 200ms fall 2 rise 2
    server a 127.0.0.1:{a} check
    server b 127.0.0.1:{b} check
"""


def _haproxy() -> str:
    path = shutil.which("haproxy")
    if path is None:
        why = "haproxy not installed (Debian: apt-get install haproxy)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the load-balancer test: {why}; .ci/run installs it")
        pytest.skip(why)
    return path


def _free_ports(count: int) -> List[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Replica:
    """One `irpe serve` (demo models) on a fixed port; its JSON log read by a thread."""

    def __init__(self, port: int) -> None:
        self.port, self.proc, self.lines = port, None, []
        self.drained: List[str] = []  # the log messages of the last stopped process

    def start(self) -> float:
        """Start and wait until it is serving and ready; the seconds that took."""
        began = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "IRPE_SERVE_THREADS": "1",
               "IRPE_SERVE_DRAIN_GRACE_S": str(GRACE_S)}
        self.proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", "--port",
                                      str(self.port)], stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=ROOT)
        lines: List[str] = []
        self.lines, proc = lines, self.proc
        threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
        wait_until(lambda: self._ready() or proc.poll() is not None, 120, "replica ready")
        assert proc.poll() is None, "".join(lines)
        return time.monotonic() - began

    def _ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/v2/health/ready",
                             timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> float:
        """SIGTERM and wait for the exit; the seconds the drain took."""
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == -signal.SIGTERM
        seconds = time.monotonic() - began
        wait_until(lambda: "stopped; queued requests drained" in self.messages(), 10,
                   "its last log line read")
        return seconds

    def messages(self) -> List[str]:
        return [json.loads(line)["message"] for line in list(self.lines) if line.startswith("{")]


def _states(stats_port: int) -> Dict[str, str]:
    """HAProxy's view of the two servers (stats CSV): name -> UP / DOWN / ..."""
    try:
        text = httpx.get(f"http://127.0.0.1:{stats_port}/stats;csv", timeout=5).text
    except httpx.TransportError:
        return {}
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {r["svname"]: r["status"].split()[0] for r in rows
            if r["pxname"] == "replicas" and r["svname"] in ("a", "b")}


def test_rolling_update_behind_haproxy_loses_no_request(tmp_path):
    binary = _haproxy()
    front, stats, pa, pb = _free_ports(4)
    replicas = {"a": Replica(pa), "b": Replica(pb)}
    load, proxy, figures = None, None, []
    try:
        for r in replicas.values():  # one after the other: a first start exports the ONNX
            r.start()
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(front=front, stats=stats, a=pa, b=pb))
        proxy = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: _states(stats) == {"a": "UP", "b": "UP"}, 30, "both replicas UP")
        load = KeepAliveLoad(f"http://127.0.0.1:{front}/v1/classify", shape_png(3),
                             {"content-type": "image/png"}, CLIENTS).start()
        wait_until(lambda: load.count() >= 2 * CLIENTS, 60, "load through the proxy")
        for name in RESTARTS:
            served = load.count()
            drain_s = replicas[name].stop()
            seen_down = _states(stats).get(name)
            replicas[name].drained = replicas[name].messages()
            start_s = replicas[name].start()
            wait_until(lambda n=name: _states(stats).get(n) == "UP", 30, f"{name} UP again")
            wait_until(lambda n=served: load.count() >= n + 2 * CLIENTS, 60, "load served on")
            figures.append(f"{name}: drain {drain_s:.1f} s (proxy: {seen_down}), "
                           f"back in {start_s:.1f} s, {load.count() - served} answers")
            assert "listener closed" in replicas[name].drained  # the drain ran, in full
    finally:
        outcomes = load.stop() if load else []
        for r in replicas.values():
            if r.proc is not None:
                r.proc.kill()
                r.proc.wait()
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
    counts = summary(outcomes)
    print(f"\nrolling update behind HAProxy, {CLIENTS} clients, {len(RESTARTS)} restarts: "
          f"{counts}; " + "; ".join(figures))
    failed = [o for o in outcomes if o.result != "200"]
    assert not failed and outcomes, (counts, failed[:5])
