"""Operations: readiness, auth, body limit, CORS, request ids, metrics, OpenAPI, JSON logs and
graceful shutdown (a real `irpe serve` process receiving SIGTERM)."""
from __future__ import annotations

import gzip
import json
import os
import signal
import threading

import httpx
import pytest

from serve.config import ServeSettings
from tests.helpers import (
    fault_backend,
    metric,
    running_server,
    shape_png,
    start_cli,
    wait_ready,
    wait_until,
)

TOKEN = "s3cret-token"
PNG = {"content-type": "image/png"}


@pytest.fixture(scope="module")
def url(cls_file):
    settings = ServeSettings(threads=1, auth_token=TOKEN, max_body_bytes=64 << 10,
                             log_level="warning", models=[{"name": "cls", "path": cls_file}])
    with running_server(settings) as base:
        yield base


def _auth(token: str = TOKEN) -> dict:
    return {**PNG, "authorization": f"Bearer {token}"}


def test_readiness_only_after_warmup_and_cors_when_configured(cls_file):
    loading = threading.Event()  # model late loads once the test opens this gate
    settings = ServeSettings(threads=1, cors_origins=["http://example.com"], models=[
        {"name": "late", "path": cls_file, "backend": fault_backend(gate=loading)}])
    with running_server(settings, ready=False) as base, httpx.Client(base_url=base) as c:
        assert c.get("/v2/health/live").status_code == 200
        r = c.get("/v2/health/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json() == {"error": "models not ready: late (loading)"}
        assert c.get("/v2/models/late/ready").json() == {"error": "model late is loading"}
        r = c.post("/v1/models/late/classify", content=shape_png(0), headers=PNG)
        assert r.status_code == 503 and "loading" in r.json()["error"]
        loading.set()
        wait_ready(base)
        r = c.post("/v1/models/late/classify", content=shape_png(0),
                   headers={**PNG, "origin": "http://example.com"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://example.com"


def test_bearer_token_guards_inference_only(client):
    blob = shape_png(1)
    for headers in (PNG, _auth("wrong"), {**PNG, "authorization": "Basic czNjcmV0"}):
        r = client.post("/v1/models/cls/classify", content=blob, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json() == {"error": "missing or invalid bearer token"}
    assert client.post("/v2/models/cls/infer", json={}).status_code == 401
    assert client.post("/v1/models/cls/classify", content=blob, headers=_auth()).status_code \
        == 200
    for path in ("/v2/health/ready", "/v2/models/cls", "/v1/models", "/metrics"):
        assert client.get(path).status_code == 200, path


def test_cors_off_by_default(client):
    r = client.get("/v1/models", headers={"origin": "http://example.com"})
    assert "access-control-allow-origin" not in r.headers
    assert client.options("/v1/models/cls/classify", headers={
        "origin": "http://example.com", "access-control-request-method": "POST"}
    ).status_code == 405


def test_body_limit_413_declared_and_streamed(client):
    big = b"\0" * (100 << 10)
    r = client.post("/v1/models/cls/classify", content=big, headers=_auth())
    assert r.status_code == 413
    assert r.json() == {"error": "request body is over the limit of 65536 bytes"}

    def chunks():
        for _ in range(10):
            yield b"\0" * (10 << 10)
    r = client.post("/v1/models/cls/classify", content=chunks(), headers=_auth())
    assert r.status_code == 413 and "over the limit" in r.json()["error"]
    assert client.post("/v1/models/cls/classify", content=shape_png(2),
                       headers=_auth()).status_code == 200
    inflates = gzip.compress(b"\0" * (100 << 10))  # small on the wire, too big inflated
    r = client.post("/v2/models/cls/infer", content=inflates,
                    headers={"authorization": f"Bearer {TOKEN}", "content-encoding": "gzip"})
    assert r.status_code == 413
    assert r.json() == {"error": "decompressed body is over the limit of 65536 bytes"}


def test_request_ids(client):
    r = client.get("/v1/models", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    made = client.get("/v1/models", headers={"x-request-id": "bad id!"}).headers["x-request-id"]
    assert made != "bad id!" and len(made) == 32


def test_metrics_by_route_and_status(client):
    client.post("/v1/models/cls/classify", content=shape_png(3), headers=_auth())
    text = client.get("/metrics").text
    assert 'irpe_http_requests_total{method="POST",route="/v1/models/{name}/classify",' \
           'status="401"}' in text
    assert 'route="/v1/models/{name}/classify",status="200"' in text
    assert 'status="413"' in text
    for name in ("irpe_http_requests_in_flight", 'irpe_queue_seconds_count{model="cls"}',
                 'irpe_compute_seconds_count{model="cls"}', 'irpe_batch_size_bucket{le="1.0"',
                 'irpe_batches_total{model="cls",outcome="success"}'):
        assert name in text, name


def test_openapi_documents_bodies_errors_and_auth(client):
    spec = client.get("/openapi.json").json()
    classify = spec["paths"]["/v1/models/{name}/classify"]["post"]
    assert {"multipart/form-data", "image/png", "image/jpeg", "image/webp",
            "application/json"} <= set(classify["requestBody"]["content"])
    assert {"400", "401", "404", "413", "415", "422", "503", "504"} <= set(classify["responses"])
    assert classify["responses"]["503"]["content"]["application/json"]["schema"]["$ref"] \
        .endswith("/ErrorBody")
    assert classify["security"] == [{"HTTPBearer": []}]
    infer = spec["paths"]["/v2/models/{name}/infer"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json",
                                                    "application/octet-stream"}
    assert "application/octet-stream" in infer["responses"]["200"]["content"]
    schemas = spec["components"]["schemas"]
    assert {"InferRequest", "TensorIn", "ImagesJSON", "ErrorBody"} <= set(schemas)
    assert "HTTPValidationError" not in schemas  # 422 bodies are ErrorBody like the rest
    assert classify["responses"]["422"]["content"]["application/json"]["schema"]["$ref"] \
        .endswith("/ErrorBody")
    assert "top_k" in [p["name"] for p in classify["parameters"]]
    assert client.get("/docs").status_code == 200


def test_ctrl_c_stops_cleanly_without_a_traceback(tmp_path, cls_file):
    """SIGINT (Ctrl-C under make run): drained, logged, ended by the signal (the shell's 130),
    and no traceback."""
    repo = tmp_path / "repo.yaml"
    repo.write_text(f"models:\n  - {{name: m, path: {cls_file}}}\n")
    proc, url, lines = start_cli(repo, {**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        wait_ready(url)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == -signal.SIGINT
    finally:
        proc.kill()
    rest = proc.stderr.read()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    logs = [json.loads(line) for line in lines + rest.splitlines() if line.startswith("{")]
    assert any(e["message"] == "stopped; queued requests drained" for e in logs)


def test_sigterm_drains_in_flight_requests(tmp_path, cls_file):
    repo = tmp_path / "slow.yaml"
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: slow, path: {cls_file}, backend: slow}}\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc, url, lines = start_cli(repo, env, faults={"slow": {"delay_s": 1.5}})
    try:
        wait_ready(url)
        result = {}

        def request() -> None:
            result["r"] = httpx.post(f"{url}/v1/models/slow/classify", content=shape_png(0),
                                     headers={**PNG, "x-request-id": "drain-me"}, timeout=30)
        worker = threading.Thread(target=request)
        worker.start()
        wait_until(lambda: metric(url, "irpe_queue_seconds_count", model="slow") == 1, 30,
                   "the request's batch is computing")
        proc.send_signal(signal.SIGTERM)
        worker.join(30)
        assert result["r"].status_code == 200 and result["r"].json()["model"] == "slow"
        assert proc.wait(30) == -signal.SIGTERM  # uvicorn re-raises the signal after draining
    finally:
        proc.kill()
    logs = [json.loads(line) for line in lines + proc.stderr.readlines()]
    access = [e for e in logs if e.get("request_id") == "drain-me" and e["message"] == "request"]
    assert access and access[0]["status"] == 200 and access[0]["route"] == \
        "/v1/models/{name}/classify"
    assert any(e["message"] == "stopped; queued requests drained" for e in logs)
