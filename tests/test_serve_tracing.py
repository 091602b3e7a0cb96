"""OpenTelemetry traces of `irpe serve` (serve/tracing.py, docs/tracing.md), end to end: a real
`irpe serve` process exporting over OTLP/HTTP to a real receiver on loopback
(benchmarks/otlp_receiver.py: opentelemetry-proto decodes every span), turned on by its settings
or by the OTEL_* variables alone; and, off, no OpenTelemetry module and no exporter thread.

Timing: each request's spans are checked by order, not by size. The client stamps
``time.time_ns()`` before it sends and after it has the whole answer; the server stamps the
same clock, later than the first and earlier than the second, so the root span lies inside the
client's interval, the children follow one another inside the root, and their sum is at most
the root: causal facts on any machine, however loaded. How close they come to the client's
latency is printed (and measured on a quiet machine: docs/tracing.md), not asserted: on two busy
cores the time between the client's send and the server's first look at the request is the
scheduler's."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import httpx
import pytest

from benchmarks.otlp_receiver import OtlpReceiver
from serve.config import ServeSettings
from serve.tracing import tracing_wanted
from tests.helpers import ROOT, run_python, shape_png, start_cli, wait_ready

CHILDREN = ("read_body", "decode", "queue_wait", "inference", "encode_response")
V1 = "POST /v1/models/{name}/classify"
V2 = "POST /v2/models/{name}/infer"
SIDE = 64  # the demo classifier's input size


@pytest.fixture(scope="module")
def demo_onnx() -> Path:
    """The demo classifier's ONNX file (exported into the irpe cache on first use)."""
    from serve.demo import demo_models
    return Path(demo_models("onnxruntime")[0].path)


def _repository(folder: Path, onnx: Path, **settings) -> Path:
    """A repository serving the demo classifier with batches of up to 8 images, each batch
    waiting up to 1 s to fill (so 32 concurrent requests share batches)."""
    lines = [f"{k}: {json.dumps(v)}" for k, v in settings.items()]
    lines += ["threads: 1", "drain_grace_s: 0", "models:",
              f"  - {{name: demo, path: {onnx}, backend: onnxruntime, max_batch_size: 8, "
              "max_queue_delay_ms: 1000, max_queue_size: 256}"]
    path = folder / "repo.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "IRPE_SERVE_"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _traceparent(sampled: bool = True) -> Tuple[str, str, str]:
    """(header, trace id, parent span id) of a fresh W3C traceparent."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{parent}-{'01' if sampled else '00'}", trace_id, parent


def _v2_body() -> bytes:
    data = [0.25] * (3 * SIDE * SIDE)
    return json.dumps({"inputs": [{"name": "images", "datatype": "FP32",
                                   "shape": [1, 3, SIDE, SIDE], "data": data}]}).encode()


async def _requests(url: str, count: int) -> List[Dict]:
    """``count`` concurrent requests (even: /v1 classify, odd: /v2 infer), each with its own
    traceparent; per request the ids sent and the client's time_ns before send / after the
    whole answer."""
    png, v2 = shape_png(2), _v2_body()
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def one(i: int) -> Dict:
            header, trace_id, parent = _traceparent()
            path, body, kind = (("/v1/models/demo/classify", png, "image/png") if i % 2 == 0
                                else ("/v2/models/demo/infer", v2, "application/json"))
            sent = time.time_ns()
            r = await client.post(path, content=body, headers={"content-type": kind,
                                                                 "traceparent": header})
            done = time.time_ns()
            assert r.status_code == 200, r.text
            return {"trace_id": trace_id, "parent": parent, "sent": sent, "done": done,
                    "route": V1 if i % 2 == 0 else V2, "bytes_in": len(body),
                    "bytes_out": len(r.content)}
        return await asyncio.gather(*(one(i) for i in range(count)))


def _serve(repo: Path, env: Dict[str, str]):
    """`irpe serve REPO` once its model is ready: (process, URL)."""
    proc, url, _ = start_cli(repo, env)
    wait_ready(url, 120)
    return proc, url


def _drain_logs(proc) -> List[Dict]:
    """SIGTERM (drains; the lifespan exports the last spans); the JSON log lines after."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, err
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def _check_trace(sent: Dict, spans: List[Dict], logs: List[Dict]) -> float:
    """One request's trace is complete and consistent; returns the children's share of the
    client's latency."""
    own = [s for s in spans if s["trace_id"] == sent["trace_id"]]
    roots = [s for s in own if s["parent_span_id"] == sent["parent"]]
    assert len(roots) == 1, own
    root = roots[0]
    assert root["name"] == sent["route"] and root["kind"] == 2  # SERVER
    attrs = root["attributes"]
    assert attrs["http.route"] == sent["route"].split(" ")[1]
    assert attrs["http.response.status_code"] == 200 and attrs["irpe.model"] == "demo"
    assert attrs["http.request.body.size"] == sent["bytes_in"]
    assert attrs["http.response.body.size"] == sent["bytes_out"]
    children = sorted((s for s in own if s is not root), key=lambda s: s["start_ns"])
    assert [c["name"] for c in children] == list(CHILDREN)
    assert all(c["parent_span_id"] == root["span_id"] for c in children)
    # causal order: client send <= root start <= each child, one after another <= root end
    # <= the client has the answer
    assert sent["sent"] <= root["start_ns"] <= children[0]["start_ns"]
    for a, b in zip(children, children[1:], strict=False):
        assert a["start_ns"] <= a["end_ns"] <= b["start_ns"], (a, b)
    assert children[-1]["end_ns"] <= root["end_ns"] <= sent["done"]
    by_name = {c["name"]: c for c in children}
    assert by_name["queue_wait"]["end_ns"] == by_name["inference"]["start_ns"]
    total = sum(c["end_ns"] - c["start_ns"] for c in children)
    assert total <= root["end_ns"] - root["start_ns"]
    inference = by_name["inference"]["attributes"]
    assert inference["irpe.backend"] == "onnxruntime" and inference["irpe.precision"] == "fp32"
    assert inference["irpe.instance"] == 0 and 1 <= inference["irpe.batch_size"] <= 8
    ids = {"trace_id": sent["trace_id"], "span_id": root["span_id"]}
    lines = [e for e in logs if e.get("message") == "request" and
             e.get("trace_id") == sent["trace_id"]]
    assert len(lines) == 1 and {k: lines[0][k] for k in ids} == ids, lines
    return total / (sent["done"] - sent["sent"])


def _check_batches(spans: List[Dict], count: int) -> None:
    """Each request's inference span links to its batch's span, which links back to the
    request's root; the batches served every request and at least one served several."""
    batches = {s["span_id"]: s for s in spans if s["name"] == "batch"}
    roots = {s["span_id"]: s for s in spans if s["kind"] == 2}
    served = 0
    for s in spans:
        if s["name"] == "inference":
            (trace_id, batch_id), = s["links"]
            batch = batches[batch_id]
            assert batch["trace_id"] == trace_id and batch["parent_span_id"] == ""
            assert (s["trace_id"], s["parent_span_id"]) in batch["links"]
            assert s["attributes"]["irpe.batch_size"] == batch["attributes"]["irpe.batch_size"]
            served += 1
    assert served == count
    sizes = [b["attributes"]["irpe.batch_size"] for b in batches.values()]
    assert sum(sizes) == count and max(sizes) > 1, sizes
    assert all(len(b["links"]) == b["attributes"]["irpe.batch_size"] for b in batches.values())
    linked = {tuple(link) for b in batches.values() for link in b["links"]}
    assert {(r["trace_id"], r["span_id"]) for r in roots.values()} <= linked


def test_32_concurrent_requests_make_32_complete_traces(tmp_path, demo_onnx):
    """Settings alone (the repository file): 32 concurrent requests through dynamic
    batching, each continuing its client's traceparent, give 32 complete traces."""
    with OtlpReceiver() as receiver:
        repo = _repository(tmp_path, demo_onnx, otlp_endpoint=receiver.url,
                           trace_sample_ratio=1.0)
        proc, url = _serve(repo, _env())
        try:
            sent = asyncio.run(_requests(url, 32))
        finally:
            logs = _drain_logs(proc)
        spans = receiver.spans()
    assert {s["service"] for s in spans} == {"irpe-serve"}
    assert {s["scope"] for s in spans} == {"irpe.serve"}
    shares = [_check_trace(s, spans, logs) for s in sent]
    _check_batches(spans, 32)
    assert len(spans) == 32 * 6 + len([s for s in spans if s["name"] == "batch"])
    print(f"children / client latency: median {statistics.median(shares):.2f}, "
          f"min {min(shares):.2f}")


@pytest.mark.parametrize("endpoint", ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                      "OTEL_EXPORTER_OTLP_ENDPOINT"])
def test_otel_variables_alone_turn_tracing_on(tmp_path, demo_onnx, endpoint):
    """No tracing setting: OTEL_TRACES_EXPORTER=otlp with an endpoint variable exports;
    OTEL_SERVICE_NAME names the service; OTEL_TRACES_SAMPLER(_ARG) samples (ratio 0, parent
    based: only a request whose traceparent is sampled is traced). A refused request's trace
    says so: its status, and the stage that refused it marked as an error."""
    with OtlpReceiver() as receiver:
        url_var = receiver.url if endpoint.endswith("TRACES_ENDPOINT") else \
            receiver.url.removesuffix("/v1/traces")
        env = _env(OTEL_TRACES_EXPORTER="otlp", OTEL_SERVICE_NAME="irpe-under-test",
                   OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0",
                   **{endpoint: url_var})
        proc, url = _serve(_repository(tmp_path, demo_onnx), env)
        try:
            traced, trace_id, parent = _traceparent(sampled=True)
            dropped, dropped_id, _ = _traceparent(sampled=False)
            for header in (traced, dropped, None):
                r = httpx.post(f"{url}/v1/models/demo/classify", content=shape_png(1),
                               headers={"content-type": "image/png",
                                        **({"traceparent": header} if header else {})},
                               timeout=60)
                assert r.status_code == 200
            refused, refused_id, _ = _traceparent(sampled=True)
            r = httpx.post(f"{url}/v1/models/demo/classify", content=b"not an image",
                           headers={"content-type": "image/png", "traceparent": refused})
            assert r.status_code == 400
        finally:
            logs = _drain_logs(proc)
        spans = receiver.spans()
    assert {s["trace_id"] for s in spans if s["name"] != "batch"} == {trace_id, refused_id}
    assert {s["service"] for s in spans} == {"irpe-under-test"}
    bad = {s["name"]: s for s in spans if s["trace_id"] == refused_id}
    assert sorted(bad) == sorted([V1, "read_body", "decode"])
    assert bad[V1]["attributes"]["http.response.status_code"] == 400 and bad[V1]["status"] == 0
    assert bad["decode"]["status"] == 2 and bad["read_body"]["status"] == 0  # 2: ERROR
    spans = [s for s in spans if s["trace_id"] != refused_id]
    root, = [s for s in spans if s["kind"] == 2]
    assert root["parent_span_id"] == parent
    assert sorted(s["name"] for s in spans if s["trace_id"] == trace_id) == sorted(
        [V1, *CHILDREN])
    requests = [e for e in logs if e.get("message") == "request" and "classify" in e["path"]]
    assert [e.get("trace_id") for e in requests] == [trace_id, None, None, refused_id]


_PROBE = """
import json, os, sys, threading, httpx
from serve.config import ServeSettings, ModelConfig
from tests.helpers import running_server, shape_png
settings = ServeSettings(models=[ModelConfig(name="demo", path=sys.argv[1])], threads=1,
                         **json.loads(sys.argv[2]))
with running_server(settings) as url:
    r = httpx.post(url + "/v1/models/demo/classify", content=shape_png(1),
                   headers={"content-type": "image/png", "traceparent":
                            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    assert r.status_code == 200, r.text
    print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith(
                          ("opentelemetry.sdk", "opentelemetry.exporter"))),
                      "threads": sorted(t.name for t in threading.enumerate())}))
"""


@pytest.mark.parametrize("settings, env, on", [
    ({}, {}, False),
    ({"tracing": "off"}, {"OTEL_TRACES_EXPORTER": "otlp"}, False),
    ({}, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ({"otlp_endpoint": "http://127.0.0.1:9/v1/traces"}, {}, True),
])
def test_off_imports_no_sdk_and_starts_no_thread(demo_onnx, settings, env, on):
    """Tracing off (the default; ``tracing: off`` over the variables; OTEL_SDK_DISABLED): a
    served request loads neither the OpenTelemetry SDK nor an exporter, and starts no exporter
    thread; on, all three. (FastAPI >= 0.16x imports the OpenTelemetry API itself wherever it
    is installed, for its own telemetry, which stays off without a global tracer provider.)"""
    out = run_python(["-c", _PROBE, str(demo_onnx), json.dumps(settings)], timeout=300,
                     env=_env(**env))
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    exporter = [t for t in seen["threads"] if t.startswith("OtelBatch")]
    assert bool(seen["modules"]) is on and bool(exporter) is on, seen
    # on: nothing listens on port 9; the stop waits STOP_TIMEOUT_S for the export, not the
    # exporter's 10 s of retries, and says so
    assert ("spans not exported at stop" in out.stderr) is on, out.stderr


@pytest.mark.parametrize("env, settings, message", [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, {}, "OTEL_TRACES_EXPORTER=zipkin: irpe serve exports "
     "traces with otlp (OTLP/HTTP) or console, not zipkin"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, {},
     "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: irpe serve exports OTLP over HTTP"),
    ({"IRPE_SERVE_OTLP_ENDPOINT": "collector:4318"}, {}, "otlp_endpoint"),
    ({}, {"trace_sample_ratio": 2}, "trace_sample_ratio"),
])
def test_bad_tracing_configuration_is_one_line(tmp_path, demo_onnx, env, settings, message):
    repo = _repository(tmp_path, demo_onnx, **settings)
    out = run_python(["-m", "irpe", "serve", str(repo), "--port", "0"], timeout=300,
                     env=_env(**env))
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("settings, env, wanted", [
    ({}, {}, False),
    ({}, {"OTEL_TRACES_EXPORTER": "none"}, False),
    ({}, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({}, {"OTEL_TRACES_EXPORTER": "console"}, True),
    ({}, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"tracing": "off"}, {"OTEL_TRACES_EXPORTER": "otlp"}, False),
    ({"tracing": "off", "otlp_endpoint": "http://c:4318/v1/traces"}, {}, False),
    ({"tracing": "on"}, {"OTEL_SDK_DISABLED": "true"}, True),
    ({"otlp_endpoint": "http://c:4318/v1/traces"}, {"OTEL_SDK_DISABLED": "true"}, True),
])
def test_which_settings_and_variables_turn_tracing_on(monkeypatch, settings, env, wanted):
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing_wanted(ServeSettings(**settings)) is wanted


@pytest.mark.timeout(300)
def test_a_ray_serve_replica_continues_the_callers_trace(tmp_path):
    """`irpe serve --ray` (a local Ray, the demo models) with ``otlp_endpoint`` among its
    IRPE_SERVE_* settings: the replica (another process, started by Ray) builds its own tracer
    from the settings carried to it, and a request through Ray's HTTP proxy continues the
    client's traceparent."""
    pytest.importorskip("ray.serve")
    from benchmarks.ray_serve import free_port
    port = free_port()
    with OtlpReceiver() as receiver:
        env = _env(IRPE_SERVE_OTLP_ENDPOINT=receiver.url, IRPE_SERVE_DRAIN_GRACE_S="0")
        proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", "--ray", "--port",
                                 str(port), "--threads", "1"], cwd=ROOT, env=env,
                                stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stderr:  # Ray's own lines are not JSON
                if line.startswith("{") and json.loads(line)["message"] == "serving":
                    break
            else:
                raise AssertionError(f"irpe serve --ray exited {proc.wait()} before serving")
            header, trace_id, parent = _traceparent()
            r = httpx.post(f"http://127.0.0.1:{port}/v1/classify", content=shape_png(2),
                           headers={"content-type": "image/png", "traceparent": header},
                           timeout=60)
            assert r.status_code == 200 and r.headers["x-irpe-replica"], r.text
            spans = receiver.wait_for(6, timeout_s=60)  # the exporter's 5 s schedule
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    own = [s for s in spans if s["trace_id"] == trace_id]
    root, = [s for s in own if s["kind"] == 2]
    assert root["parent_span_id"] == parent and root["name"] == "POST /v1/classify"
    assert sorted(s["name"] for s in own if s is not root) == sorted(CHILDREN)


@pytest.mark.timeout(600)
def test_replicas_on_both_nodes_of_a_ray_cluster_continue_the_callers_traces():
    """A 2-node Ray cluster (benchmarks.ray_serve.local_cluster), 2 replicas with
    ``otlp_endpoint`` in their settings: requests answered by both nodes are each traced under
    their client's traceparent, whichever replica served them."""
    pytest.importorskip("ray.serve")
    from ray import serve

    from benchmarks.ray_serve import launch_demo, local_cluster
    from serve.ray_app import deploy
    with OtlpReceiver() as receiver, local_cluster(nodes=2, cpus_per_node=1) as (_, _, port):
        launch, settings = launch_demo({"application": "traced", "num_replicas": 2},
                                       otlp_endpoint=receiver.url)
        deploy(launch, settings)
        sent, nodes = [], set()
        try:
            for _ in range(32):  # as tests/test_ray_serve.py: both replicas answer
                header, trace_id, parent = _traceparent()
                r = httpx.post(f"http://127.0.0.1:{port}/v1/classify", content=shape_png(3),
                               headers={"content-type": "image/png", "traceparent": header},
                               timeout=60)
                assert r.status_code == 200, r.text
                sent.append((trace_id, parent))
                nodes.add(r.headers["x-irpe-replica"].split("/")[0])
        finally:
            serve.delete("traced")  # the replicas stop: their lifespans export the rest
        spans = receiver.wait_for(6 * len(sent), timeout_s=60)
    assert len(nodes) == 2
    for trace_id, parent in sent:
        own = [s for s in spans if s["trace_id"] == trace_id]
        root, = [s for s in own if s["kind"] == 2]
        assert root["parent_span_id"] == parent
        assert sorted(s["name"] for s in own if s is not root) == sorted(CHILDREN)


def test_the_benchmarks_receiver_process_counts_what_an_exporter_sent():
    """benchmarks.serve_tracing's receiver (its own process, bodies decoded when it stops)
    reports the spans the real OTLP/HTTP exporter sent it; the summary's ratios are to the
    first server."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from benchmarks.serve_tracing import receiver_process, summary
    with receiver_process() as (url, received):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url)))
        for name in ("a", "b", "a"):
            provider.get_tracer("t").start_span(name).end()
        provider.shutdown()
    assert received == [{"requests": 3, "spans": 3, "by_name": {"a": 2, "b": 1}}]
    rows = [{"server": s, "images_per_s": v, "p50_ms": p} for s, v, p in
            (("base", 10.0, 100.0), ("off", 9.9, 101.0), ("base", 12.0, 90.0),
             ("off", 10.1, 99.0))]
    assert summary(rows, ["base", "off"])[2:] == ["| base | 11.0 | 95.0 | 1.000 | 1.000 |",
                                                  "| off | 10.0 | 100.0 | 0.909 | 1.053 |"]
