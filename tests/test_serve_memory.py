"""Per-model memory (serve.memory): a real `irpe serve` process with a DeiT-B iRPE-K (344 MB of
fp32 weights) and the demo classifier loading side by side reports, in /v1/models and
/metrics, the big model's figure within 10% of the RSS growth of loading that model alone in a
fresh process; the lock and overlap rules that keep a figure right or unknown, with threads."""
from __future__ import annotations

import json
import mmap
import os
import re
import threading

import httpx
import pytest

from serve import memory
from serve.memory import Footprint, measure
from tests.helpers import run_python, start_cli, wait_ready

BIG = "deit_base_patch16_224_ctx_product_50_shared_k"
ALONE = """
import json, sys
import numpy as np
from serve.backends import create_backend
from serve.config import ServeSettings

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * {page}

cfg = ServeSettings(threads=1, models=[{{"name": "big", "path": sys.argv[1]}}]).models[0]
backend = create_backend(cfg, 1)  # as ServedModel makes it, before the load
before = rss()
backend.load()
side = backend.spec.transform().size
backend.warmup(np.random.default_rng(0).standard_normal((1, 3, side, side), dtype=np.float32),
               None)
print(json.dumps({{"growth": rss() - before}}))
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """An untrained DeiT-B iRPE-K with 8 classes, as a trained-model file."""
    import torch

    from irpe.artifact.trained import default_spec, save_trained
    from irpe.data.shapes import SHAPE_CLASSES
    from irpe.models import create_model
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    torch.manual_seed(0)
    save_trained(create_model(BIG, num_classes=8).eval(), str(path),
                 default_spec(BIG, list(SHAPE_CLASSES), num_classes=8))
    return str(path)


def test_a_models_figure_is_its_rss_growth_alone(big, cls_file, tmp_path):
    repo = tmp_path / "models.yaml"
    repo.write_text(json.dumps({"threads": 1, "log_level": "info", "models": [
        {"name": "small", "path": str(cls_file)}, {"name": "big", "path": str(big)}]}))
    proc, url, _ = start_cli(repo, {**os.environ, "IRPE_SERVE_DRAIN_GRACE_S": "0"})
    try:
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        wait_ready(url, 300)
        listed = {m["name"]: m["memory"] for m in httpx.get(f"{url}/v1/models").json()}
        text = httpx.get(f"{url}/metrics").text
    finally:
        proc.terminate()
        proc.wait(60)
    alone = json.loads(run_python(["-c", ALONE.format(page=os.sysconf("SC_PAGE_SIZE")),
                                   str(big)]).stdout.strip().splitlines()[-1])["growth"]
    host = listed["big"]["host_bytes"]
    assert alone > 300e6  # the weights at least: a figure big enough that noise is small
    assert abs(host - alone) <= 0.1 * alone, (host, alone)
    assert listed["big"]["device_bytes"] is None and listed["small"]["host_bytes"] < host
    for name, figure in listed.items():
        gauge = re.search(rf'^irpe_model_host_memory_bytes{{model="{name}"}} (\S+)$', text, re.M)
        assert gauge and float(gauge.group(1)) == figure["host_bytes"]
    peak = re.search(r"^irpe_process_peak_resident_memory_bytes (\S+)$", text, re.M)
    now = re.search(r"^process_resident_memory_bytes (\S+)$", text, re.M)
    assert peak and now and float(peak.group(1)) >= float(now.group(1)) > host


def _run_measured(results: list, started: threading.Event, release: threading.Event) -> None:
    with measure("torch", "cpu", results.append):
        started.set()
        release.wait(10)


def test_a_load_that_waits_too_long_goes_on_unmeasured_and_voids_overlaps(monkeypatch):
    monkeypatch.setattr(memory, "WAIT_S", 0.05)
    first: list = []
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_run_measured, args=(first, started, release))
    holder.start()
    started.wait(10)
    second: list = []
    with measure("torch", "cpu", second.append):  # the lock is held: goes on, unmeasured
        pass
    release.set()
    holder.join(10)
    assert second == [Footprint()] and first == [Footprint()]  # the overlapped one is void
    third: list = []
    with measure("torch", "cpu", third.append):  # alone again: measured
        pages = mmap.mmap(-1, 64 << 20)  # fresh pages (malloc could reuse resident ones)
        pages.write(b"x" * (64 << 20))
    pages.close()
    assert third[0].host_bytes is not None and third[0].host_bytes >= 60 << 20
    assert third[0].device_bytes is None


def test_footprints_add_and_stay_unknown_when_one_is():
    assert Footprint(1, None).add(Footprint(2, None)) == Footprint(3, None)
    assert Footprint(1, 5).add(Footprint(2, 7)) == Footprint(3, 12)
    assert Footprint(1, 1).add(Footprint()) == Footprint()
