"""Faults not covered by test_serve*: clients that disconnect mid-request, a backend that hangs
past the request timeout, model artifacts that are missing or corrupt at start, and SIGTERM
while a real `irpe serve` process is under concurrent load."""
from __future__ import annotations

import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from irpe.artifact.trained import default_spec, save_trained
from irpe.cli import main
from irpe.data.shapes import SHAPE_CLASSES
from irpe.models import create_model
from serve.config import ServeSettings
from tests.helpers import (
    fault_backend,
    metric,
    running_server,
    shape_png,
    start_cli,
    wait_for_log,
    wait_ready,
    wait_until,
)

torch.set_num_threads(1)
PNG = {"content-type": "image/png"}


@pytest.fixture(scope="module")
def url(cls_file):
    fault = {"path": cls_file, "max_batch_size": 1}
    settings = ServeSettings(threads=1, log_level="error", models=[
        {"name": "cls", "path": cls_file},
        {**fault, "name": "slow", "backend": fault_backend(delay_s=0.4)},
        {**fault, "name": "hang", "timeout_s": 0.3, "backend": fault_backend(delay_s=1.0)}])
    with running_server(settings) as base:
        yield base


def settle(url: str, model: str, timeout_s: float = 10.0) -> None:
    """Wait until the in-flight gauge is 1 (this scrape) and ``model``'s queue is empty."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric(url, "irpe_http_requests_in_flight") == 1 and \
                metric(url, "irpe_queue_depth", model=model) == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"in-flight / queue of {model} did not drain within {timeout_s} s")


def raw_request(url: str, path: str, body: bytes, send: int, wait_s: float) -> None:
    """Send the headers and ``send`` bytes of ``body``, wait, then drop the connection."""
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/png\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:send])
        time.sleep(wait_s)


def test_clients_disconnecting_mid_request_leak_nothing(url):
    blob, path = shape_png(0), "/v1/models/slow/classify"
    with ThreadPoolExecutor(6) as pool:  # 3 drop while queued/computing, 3 mid-body
        list(pool.map(lambda i: raw_request(url, path, blob, len(blob) if i % 2 else 10, 0.1),
                      range(6)))
    settle(url, "slow")
    r = httpx.post(f"{url}{path}", content=blob, headers=PNG, timeout=30)
    assert r.status_code == 200 and r.json()["model"] == "slow"
    settle(url, "slow")


def test_hanging_backend_gives_504_and_the_worker_recovers(url):
    blob = shape_png(1)
    before = metric(url, "irpe_batches_total", model="hang", outcome="success")
    with ThreadPoolExecutor(4) as pool:  # one computing, three waiting: all time out
        codes = list(pool.map(lambda _: httpx.post(f"{url}/v1/models/hang/classify",
                                                   content=blob, headers=PNG, timeout=30),
                              range(4)))
    assert [r.status_code for r in codes] == [504] * 4
    assert all("did not answer within 0.3 s" in r.json()["error"] for r in codes)
    settle(url, "hang")  # nothing queued: the timed-out items were dropped
    wait_until(lambda: metric(url, "irpe_batches_total", model="hang", outcome="success")
               > before, 30, "the batch that was computing finishes")
    ran = metric(url, "irpe_batches_total", model="hang", outcome="success") - before
    assert 1 <= ran < 4  # the skipped ones never run
    r = httpx.post(f"{url}/v1/models/hang/classify", content=blob, headers=PNG, timeout=30)
    assert r.status_code == 504 and "did not answer within 0.3 s" in r.json()["error"]
    wait_until(lambda: metric(url, "irpe_batches_total", model="hang", outcome="success")
               == before + ran + 1, 30, "the worker computes the next request (no backlog)")
    assert httpx.post(f"{url}/v1/models/cls/classify", content=blob, headers=PNG,
                      timeout=30).status_code == 200


def test_v2_request_timeout_504_then_same_model_answers(url):
    body = {"inputs": [{"name": "images", "shape": [1, 3, 64, 64], "datatype": "FP32",
                        "data": [0.0] * 12288}]}
    r = httpx.post(f"{url}/v2/models/slow/infer", timeout=30,
                   json={**body, "parameters": {"timeout": 100_000}})
    assert r.status_code == 504 and "0.1 s" in r.json()["error"]
    r = httpx.post(f"{url}/v2/models/slow/infer", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, len(SHAPE_CLASSES)]


def _repo(tmp_path, path) -> str:
    (tmp_path / "r.yaml").write_text(f"models: [{{name: m, path: {path}}}]\n")
    return str(tmp_path / "r.yaml")


@pytest.mark.parametrize("content,message", [
    (None, "model file not found"),
    (b"", "is not a readable safetensors file: empty file"),
    (b"\xff" * 64, "is not a readable safetensors file: header length"),
])
def test_missing_or_corrupt_artifact_is_a_clear_startup_error(tmp_path, capsys, content,
                                                               message):
    path = tmp_path / "m.safetensors"
    if content is not None:
        path.write_bytes(content)
    assert main(["serve", _repo(tmp_path, path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irpe serve: error: ") and message in err and "\n" == err[-1]


def test_truncated_artifact_is_a_clear_startup_error(tmp_path, capsys, cls_file):
    data = open(cls_file, "rb").read()
    path = tmp_path / "m.safetensors"
    path.write_bytes(data[: len(data) // 2])
    assert main(["serve", _repo(tmp_path, path)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_artifact_that_fails_to_load_is_not_ready_while_others_serve(tmp_path, cls_file):
    bad = tmp_path / "bad.safetensors"  # deit metadata over detr weights: fails at load
    save_trained(create_model("detr_shapes_irpe"), str(bad),
                 default_spec("deit_shapes_irpe", list(SHAPE_CLASSES)))
    settings = ServeSettings(threads=1, log_level="error", models=[
        {"name": "good", "path": cls_file}, {"name": "bad", "path": str(bad)}])
    with running_server(settings, ready=False) as base, httpx.Client(base_url=base) as c:
        _poll(lambda: c.get("/v2/models/good/ready").status_code == 200)
        _poll(lambda: "failed" in c.get("/v2/models/bad/ready").text)
        r = c.get("/v2/models/bad/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "30"
        assert r.json()["error"].startswith("model bad failed to load: ")
        assert c.get("/v2/health/ready").json() == {"error": "models not ready: bad (failed)"}
        r = c.post("/v1/models/bad/classify", content=shape_png(0), headers=PNG)
        assert r.status_code == 503 and "failed to load" in r.json()["error"]
        r = c.post("/v1/models/good/classify", content=shape_png(0), headers=PNG)
        assert r.status_code == 200


def _poll(check, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_sigterm_under_load_drains_in_flight_and_refuses_new_connections(tmp_path, cls_file):
    repo = tmp_path / "slow.yaml"  # 8 requests, batches of 4, 0.5 s each: ~1 s of work queued
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: slow, path: {cls_file}, backend: slow, "
                    "max_batch_size: 4}\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "IRPE_SERVE_DRAIN_GRACE_S": "0.3"}
    proc, url, _ = start_cli(repo, env, faults={"slow": {"delay_s": 0.5}})
    try:
        wait_ready(url)
        blob, path = shape_png(0), f"{url}/v1/models/slow/classify"
        with ThreadPoolExecutor(8) as pool:
            busy = [pool.submit(httpx.post, path, content=blob, headers=PNG, timeout=30)
                    for _ in range(8)]
            _poll(lambda: metric(url, "irpe_http_requests_in_flight") == 9)  # 8 + this scrape
            proc.send_signal(signal.SIGTERM)
            wait_for_log(proc, "listener closed")  # after the drain's grace (serve.drain)
            late = _late_attempts(path, blob, proc, busy)
            codes = [f.result().status_code for f in busy]
        assert codes == [200] * 8
        assert late and not all(done for _, done in late)  # probed while requests were running
        assert {outcome for outcome, _ in late} == {"refused"}, late
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        proc.kill()


def _late_attempts(path: str, blob: bytes, proc, busy) -> list:
    """New connections while draining: (outcome, all in-flight done) until the process exits."""
    out, deadline = [], time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        done = all(f.done() for f in busy)
        try:
            out.append((httpx.post(path, content=blob, headers=PNG, timeout=10).status_code,
                        done))
        except httpx.ConnectError:
            out.append(("refused", done))
        time.sleep(0.05)
    return out
