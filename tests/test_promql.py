"""The PromQL set of docs/observability.md against real /metrics output: every metric, label and
histogram bucket it names exists with the right type (prometheus_client's parser), and a real
Prometheus scraping a real server under load answers every query (non-empty, finite)."""
from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from typing import Dict, List, Set, Tuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve.config import ServeSettings
from tests.helpers import ROOT, running_server, shape_png, wait_until

DOC = ROOT / "docs" / "observability.md"
CPU_EMPTY = {"device memory by model, bytes (CUDA models)"}  # no CUDA model: no sample
SUFFIXES = {"_bucket": "histogram", "_sum": "histogram", "_count": "histogram"}
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "or", "vector", "max", "le",
                "ignoring", "group_left"}


def queries() -> List[Tuple[str, str]]:
    """(title, query) of the doc's promql block: each query follows its '# title' line."""
    block = re.search(r"```promql\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/observability.md has no promql block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    pairs = list(zip(lines[::2], lines[1::2], strict=True))
    assert all(t.startswith("# ") and not q.startswith("#") for t, q in pairs)
    return [(t[2:], q) for t, q in pairs]


@pytest.fixture(scope="module")
def server(cls_file):
    settings = ServeSettings(threads=1, log_level="warning", models=[
        {"name": "cls", "path": cls_file, "max_queue_delay_ms": 20}])
    with running_server(settings) as url:
        yield url


def _load(url: str, seconds: float) -> int:
    """Concurrent /v1 and /v2 requests for ``seconds`` (batches of several images form)."""
    body, done = shape_png(1), [0]
    v2 = {"inputs": [{"name": "images", "shape": [2, 3, 64, 64], "datatype": "FP32",
                      "data": [0.1] * (2 * 3 * 64 * 64)}]}
    end = time.monotonic() + seconds

    def worker(i: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while time.monotonic() < end:
                r = (c.post("/v1/models/cls/classify", content=body,
                            headers={"content-type": "image/png"}) if i % 2 else
                     c.post("/v2/models/cls/infer", json=v2))
                assert r.status_code == 200, r.text
                done[0] += 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


def _families(text: str) -> Dict[str, Tuple[str, Set[str]]]:
    """metric name -> (type, label names of its samples)."""
    out: Dict[str, Tuple[str, Set[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = {k for s in family.samples for k in s.labels}
        names = {family.name, *(s.name for s in family.samples)}
        for name in names:
            out[name] = (family.type, labels)
    return out


def test_every_metric_label_and_bucket_the_queries_name_exists(server):
    _load(server, 1.0)
    families = _families(httpx.get(f"{server}/metrics").text)
    for title, query in queries():
        names = set(re.findall(r"\b((?:irpe|process)_[a-z_]+)\b", query))
        assert names, title
        for name in names:
            if name == "irpe_model_device_memory_bytes":  # a CUDA model's: declared, no sample
                assert name in families, title
                continue
            assert name in families, f"{title}: {name} not in /metrics"
            kind, labels = families[name]
            suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
            if suffix or "histogram_quantile" in query and name.endswith("_bucket"):
                assert kind == "histogram", (title, name, kind)
            if name.endswith("_total"):
                assert kind == "counter", (title, name, kind)
            used = set(re.findall(r"by \(([^)]*)\)", query))
            for group in used:
                for label in (x.strip() for x in group.split(",")):
                    assert label in labels | {"le"}, f"{title}: {name} has no label {label}"
            if name.endswith("_bucket"):
                assert "le" in labels, (title, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(prom: str, query: str) -> list:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": query}, timeout=10).json()
    assert r["status"] == "success", (query, r)
    return r["data"]["result"]


@pytest.mark.skipif(shutil.which("prometheus") is None and os.environ.get("CI") != "true",
                    reason="prometheus not installed (apt-get install prometheus)")
def test_a_real_prometheus_answers_every_query(server, tmp_path):
    port = _free_port()
    target = server.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: irpe, static_configs: [{{targets: ['{target}']}}]}}]\n")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    prom = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return any(s["value"][1] == "1" for s in _query(prom, 'up{job="irpe"}'))
            except (httpx.HTTPError, ValueError):
                return proc.poll() is not None  # exited: fail below with its stderr
        wait_until(up, 60, "Prometheus scraping the server")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert _load(server, 5.0) > 0
        time.sleep(2.5)  # two more scrapes after the load
        for title, query in queries():
            result = _query(prom, query)
            if title in CPU_EMPTY:
                assert result == [], title
                continue
            assert result, f"{title}: no answer to {query}"
            values = {tuple(sorted((k, v) for k, v in s["metric"].items() if k not in
                                   ("__name__", "job", "instance"))): float(s["value"][1])
                      for s in result}
            assert all(v >= 0 or math.isnan(v) for v in values.values()), (title, values)
            busy = [v for k, v in values.items() if ("model", "cls") in k or
                    dict(k).get("route", "").endswith("/infer") or
                    dict(k).get("route", "").endswith("/classify") or not k]
            assert busy and all(math.isfinite(v) for v in busy), (title, values)
        assert float(_query(prom, "sum(rate(irpe_http_requests_total[1m]))")[0]["value"][1]) > 0
    finally:
        proc.terminate()
        proc.wait(30)
