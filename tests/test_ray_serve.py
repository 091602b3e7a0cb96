"""The server on Ray Serve, on a real Ray: `irpe serve --ray` in the foreground (a local Ray,
SIGTERM drains), then a 2-node local cluster (two raylets, 1 CPU each) with this process as
its driver: replicas answer from both nodes with irpe serve's outputs (REST and tritonclient
v2), a replica whose model cannot load never serves and its deploy fails in one line,
autoscaling goes 1 -> 2 -> 1 replicas under load with every request answered, and the worker
node killed under 32 clients costs only the requests Ray had sent to it, each a 5xx, none
hanging. Harness and load: benchmarks/ray_serve.py (also the benchmark's)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, Tuple

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve")

from benchmarks.ray_drain import descendants  # noqa: E402 (after the importorskip)
from benchmarks.ray_serve import (  # noqa: E402 (after the importorskip)
    LoadRun,
    closed_loop,
    free_port,
    kill_node_at,
    launch_demo,
    local_cluster,
    node_loss_row,
)
from tests.helpers import ROOT, running_server, shape_png  # noqa: E402

pytestmark = pytest.mark.timeout(300)
PNG = {"Content-Type": "image/png"}


def test_irpe_serve_ray_runs_in_the_foreground_and_drains_on_sigterm():
    """`irpe serve --ray`: a local Ray, the demo models behind Ray's proxy, SIGTERM deletes
    the application (replicas drain) and stops that Ray; exit 0."""
    port = free_port()
    env = dict(os.environ, IRPE_SERVE_RAY='{"proxy_ready_timeout_s": 45}')
    proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", "--ray", "--port", str(port),
                             "--threads", "1"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env=env)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("{") and json.loads(line)["message"] == "serving":
                break
        else:
            raise AssertionError(f"exited {proc.wait()} before serving: {''.join(seen)}")
        url = f"http://127.0.0.1:{port}"
        models = httpx.get(f"{url}/v1/models", timeout=30)
        assert models.status_code == 200 and models.headers["x-irpe-replica"]
        assert [m["name"] for m in models.json()] == ["deit_shapes_irpe", "detr_shapes_irpe"]
        answer = httpx.post(f"{url}/v1/classify", content=shape_png(2), headers=PNG, timeout=30)
        assert answer.status_code == 200 and answer.json()["results"][0]
        # the Ray it started got the setting: Serve's controller waits 45 s for a proxy
        assert controller_env(proc.pid)["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "45"
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest
    messages = [json.loads(x)["message"] for x in rest.splitlines() if x.startswith("{")]
    assert "draining" in messages and "stopped; replicas drained" in messages


def controller_env(pid: int) -> Dict[str, str]:
    """The environment of Ray Serve's controller among the processes ``pid`` started."""
    for child in descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"ServeController" in cmdline:
                raw = Path(f"/proc/{child}/environ").read_bytes()
                return dict(item.partition("=")[::2] for item in raw.decode().split("\0") if item)
        except OSError:
            continue  # gone meanwhile
    raise AssertionError(f"no ServeController under {pid}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Tuple[object, list, str]]:
    with local_cluster(nodes=2, cpus_per_node=1) as (ray_cluster, workers, port):
        yield ray_cluster, workers, f"http://127.0.0.1:{port}"


@pytest.fixture
def deployed(cluster):
    """Deploys (launch, settings) on the cluster; deletes the application after the test."""
    from ray import serve

    from serve.ray_app import deploy
    names = []

    def _deploy(launch, settings):
        names.append(settings.ray.application)
        deploy(launch, settings)
        return settings.ray.application

    yield _deploy
    for name in names:
        serve.delete(name)


def _nodes() -> set:
    import ray
    return {n["NodeID"][:12] for n in ray.nodes() if n["Alive"]}


def _running(name: str) -> int:
    from ray import serve
    app = serve.status().applications.get(name)
    return app.deployments[name].replica_states.get("RUNNING", 0) if app else 0


def test_replicas_on_both_nodes_answer_like_irpe_serve(cluster, deployed):
    import tritonclient.http as tc
    _, _, url = cluster
    launch, settings = launch_demo({"num_replicas": 2})
    deployed(launch, settings)
    answers = [httpx.post(f"{url}/v1/classify", content=shape_png(i % 8), headers=PNG,
                          timeout=30) for i in range(32)]
    assert all(a.status_code == 200 for a in answers)
    assert {a.headers["x-irpe-replica"].split("/")[0] for a in answers} == _nodes()
    images = np.stack([np.full((3, 64, 64), v, np.float32) for v in (-0.5, 0.0, 0.7)])
    with running_server(settings) as reference:
        for path, body in (("/v1/classify", shape_png(5)), ("/v1/detect", shape_png(3, 96))):
            got, want = (httpx.post(f"{base}{path}", content=body, headers=PNG, timeout=30)
                         for base in (url, reference))
            assert got.status_code == want.status_code == 200
            _close(got.json(), want.json())
        results = []
        for base in (url, reference):
            client = tc.InferenceServerClient(base.removeprefix("http://"))
            assert client.is_model_ready("deit_shapes_irpe")
            inp = tc.InferInput("images", list(images.shape), "FP32")
            inp.set_data_from_numpy(images, binary_data=True)
            out = tc.InferRequestedOutput("logits", binary_data=True)
            results.append(client.infer("deit_shapes_irpe", [inp], outputs=[out])
                           .as_numpy("logits"))
            client.close()
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=1e-5)


def _close(got, want) -> None:
    """Equal JSON, numbers within 1e-5 (the same ONNX file and runtime on both sides)."""
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _close(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _close(a, b)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-5)
    else:
        assert got == want


def test_a_replica_whose_model_cannot_load_never_serves(cluster, deployed, tmp_path):
    """The ONNX Runtime library required (ort_custom_ops: on) but not a library: the model
    fails on the replica, its health check says so, Ray never routes to it, and the deploy
    fails with that reason in one line."""
    from irpe.errors import ResourceError
    not_a_library = tmp_path / "libnot.so"
    not_a_library.write_text("not a shared library")
    launch, settings = launch_demo({"application": "broken", "route_prefix": "/broken"},
                                   ort_custom_ops="on", ort_ops_library=str(not_a_library))
    with pytest.raises(ResourceError) as failed:
        deployed(launch, settings)
    (line,) = str(failed.value).splitlines()
    assert "models not ready" in line and "failed" in line
    assert httpx.get(f"{cluster[2]}/broken/v2/health/ready", timeout=30).status_code != 200


def test_autoscaling_up_under_load_and_back_down_while_serving(cluster, deployed):
    """1 replica -> 2 under 16 clients -> 1 again under 1 client; the replica removed
    drains: every request of the run is answered 200."""
    _, _, url = cluster
    launch, settings = launch_demo({"application": "scaling", "autoscaling": {
        "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
        "upscale_delay_s": 0.5, "downscale_delay_s": 2, "look_back_period_s": 10.5}})
    name = deployed(launch, settings)
    assert _running(name) == 1

    def until(replicas: int):
        async def watch(run: LoadRun, start: float) -> None:
            while not run.stopped:
                await asyncio.sleep(0.25)
                if await asyncio.to_thread(_running, name) == replicas:
                    run.events[f"{replicas} replicas"] = time.perf_counter() - start
                    run.stopped = True
        return watch

    up = asyncio.run(closed_loop(url, "/v1/classify", shape_png(1), PNG, 16, 90,
                                 during=until(2)))
    down = asyncio.run(closed_loop(url, "/v1/classify", shape_png(1), PNG, 1, 90,
                                   during=until(1)))
    assert "2 replicas" in up.events and "1 replicas" in down.events
    assert up.counts() == Counter({"200": len(up.outcomes)})
    assert down.counts() == Counter({"200": len(down.outcomes)})
    assert len(down.outcomes) > 0


def test_worker_node_loss_under_load(cluster, deployed):
    """2 replicas on 2 nodes, 32 clients, the worker node SIGKILLed: every request gets an
    answer (no hang); the only failures are 5xx of requests sent before Ray had seen the
    replica die (its first failed answer); throughput is back within 10 s."""
    ray_cluster, (worker,), url = cluster
    launch, settings = launch_demo({"application": "loss", "num_replicas": 2})
    deployed(launch, settings)
    run = asyncio.run(closed_loop(url, "/v1/classify", shape_png(4), PNG, 32, 14.0,
                                  timeout_s=30.0,
                                  during=lambda r, s: kill_node_at(ray_cluster, worker, 4.0,
                                                                   r, s)))
    row = node_loss_row(run)
    statuses: Dict[str, int] = row["statuses"]
    assert set(statuses) <= {"200", "500", "502", "503"}, statuses  # answered, never lost
    assert row["timeouts"] == 0 and row["max_latency_s"] < 30
    failed = [o for o in run.outcomes if o.status != 200]
    if failed:
        noticed = min(o.done for o in failed)  # Ray has seen the replica die
        assert all(o.sent <= noticed for o in failed), row
        assert all(o.done >= run.events["kill"] for o in failed), row
        assert len(failed) <= settings.ray.max_ongoing_requests, row
    assert row["recovery_s"] is not None and row["recovery_s"] <= 10, row
    assert statuses["200"] > 0
