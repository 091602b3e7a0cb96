"""`irpe serve` announces its URL only when it accepts connections: a client that connects the
instant the "serving" log line appears is never refused (12 process starts: the old
bind-then-log order was refused at every start, so a dozen show it; 50 took 51 s of CI)."""
from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor

from tests.helpers import ROOT, start_cli

STARTS = 12


def _start_and_probe(repo) -> str:
    """Start `irpe serve`, GET /v2/health/live the moment "serving" is logged; the outcome."""
    proc, url, _ = start_cli(repo, {**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        return _probe(url)
    finally:
        proc.kill()
        proc.wait()


def _probe(url: str) -> str:
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.makefile("rb").readline().decode().strip()
    except ConnectionRefusedError:
        return "refused"


def test_serving_line_means_accepting_connections(tmp_path, cls_file):
    repo = tmp_path / "repo.yaml"
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: cls, path: {cls_file}}}\n")
    with ThreadPoolExecutor(2) as pool:  # two starts at a time: one per core
        outcomes = list(pool.map(_start_and_probe, [repo] * STARTS))
    assert outcomes == ["HTTP/1.1 200 OK"] * STARTS, sorted(set(outcomes))


def test_load_before_serving_completes_startup_only_with_models_ready(cls_file):
    """create_app(load_before_serving=True), a Ray replica's app: when the lifespan's startup
    returns, every model is loaded and warmed up (Ray counts the replica started then and
    routes to it)."""
    from fastapi.testclient import TestClient

    from serve.app import create_app
    from serve.config import ModelConfig, ServeSettings
    settings = ServeSettings(models=[ModelConfig(name="m", path=cls_file)])
    app = create_app(settings, load_before_serving=True)
    with TestClient(app) as client:
        assert app.state.irpe.not_ready() is None
        assert client.get("/v2/health/ready").status_code == 200
