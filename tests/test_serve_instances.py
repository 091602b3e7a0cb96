"""``instances: N``: N replicas of a model, each with its own inference thread, draining one
queue. Both are used, give identical outputs, share one /metrics view, and SIGTERM still
drains the batches they are computing."""
from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import numpy as np

from serve.config import ModelConfig
from serve.metrics import Metrics
from serve.model import ServedModel
from tests.helpers import metric, serve_batches, shape_png, start_cli, wait_ready, wait_until

PNG = {"content-type": "image/png"}


def test_two_instances_both_used_with_identical_outputs(cls_file):
    blobs = [shape_png(i) for i in range(6)]
    one = ModelConfig(name="m", path=cls_file, max_batch_size=1)
    images = [p[0] for p in ServedModel(one, Metrics()).prepare(blobs)]
    single, (expected,) = serve_batches(one, images)
    double, (got,) = serve_batches(one.model_copy(update={"instances": 2}), images)
    assert single.instance_batches == [6]
    assert len(double.backends) == 2 and double.backends[0] is not double.backends[1]
    assert sum(double.instance_batches) == 6 and min(double.instance_batches) >= 1
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a["logits"], b["logits"])
    assert double.describe()["instances"] == 2


def test_sigterm_drains_batches_running_on_both_instances(tmp_path, cls_file):
    repo = tmp_path / "two.yaml"
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: slow, path: {cls_file}, backend: slow, "
                    "instances: 2, max_batch_size: 1}\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc, url, lines = start_cli(repo, env, faults={"slow": {"delay_s": 2.0}})
    results = {}
    try:
        wait_ready(url)

        def request(i: int) -> None:
            results[i] = httpx.post(f"{url}/v1/models/slow/classify", content=shape_png(i),
                                    headers=PNG, timeout=60)
        workers = [threading.Thread(target=request, args=(i,)) for i in range(2)]
        for w in workers:
            w.start()
        wait_until(lambda: metric(url, "irpe_queue_seconds_count", model="slow") == 2, 30,
                   "both requests' batches computing")
        # one instance would start the second batch only after finishing the first
        assert metric(url, "irpe_batches_total", model="slow", outcome="success") == 0
        proc.send_signal(signal.SIGTERM)
        for w in workers:
            w.join(60)
        assert [results[i].status_code for i in range(2)] == [200, 200]
        assert proc.wait(60) == -signal.SIGTERM
    finally:
        proc.kill()
    logs = [json.loads(line) for line in lines + proc.stderr.readlines()]
    ready = [e for e in logs if e["message"] == "model ready"]
    assert ready and ready[0]["instances"] == 2
    assert any(e["message"] == "stopped; queued requests drained" for e in logs)
