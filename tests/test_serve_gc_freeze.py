"""``gc_freeze``: once a model has loaded, the server's objects leave the cyclic garbage
collector's scans (full collections under load stalled every request in flight: docs/serve.md,
"Tail latency at saturation"), and are given back when the model stops."""
from __future__ import annotations

import gc
import os
import signal

import httpx
import pytest

from serve.config import ModelConfig, ServeSettings
from tests.helpers import running_server, shape_png, start_cli, wait_for_log


@pytest.fixture
def unfrozen():
    """Start and end with nothing frozen in this process (other tests' servers thaw on stop)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _settings(cls_file, **kw) -> ServeSettings:
    return ServeSettings(models=[ModelConfig(name="m", path=cls_file)], threads=1, **kw)


def _in_scanned_generations(obj) -> bool:
    return any(o is obj for g in range(3) for o in gc.get_objects(generation=g))


def test_loaded_model_is_frozen_while_serving_and_thawed_after(cls_file, unfrozen):
    with running_server(_settings(cls_file)) as url:
        assert gc.get_freeze_count() > 10_000  # torch, the app and the model at least
        config = httpx.get(f"{url}/v1/models/m").json()
        assert config["state"] == "ready"
        r = httpx.post(f"{url}/v1/classify", content=shape_png(2),
                       headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        # a container made before the freeze is out of the scans, one made after it is in
        assert not _in_scanned_generations(ServeSettings.model_fields)
        assert _in_scanned_generations([ModelConfig])
    assert gc.get_freeze_count() == 0


def test_gc_freeze_false_freezes_nothing(cls_file, unfrozen):
    with running_server(_settings(cls_file, gc_freeze=False)) as url:
        assert httpx.get(f"{url}/v1/models/m").json()["state"] == "ready"
        assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("value, frozen", [(None, True), ("false", False)])
def test_cli_logs_the_frozen_objects(tmp_path, cls_file, value, frozen):
    repo = tmp_path / "m.yaml"
    repo.write_text(f"threads: 1\nmodels:\n  - {{name: m, path: {cls_file}}}\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("IRPE_SERVE_GC_FREEZE", None)
    if value is not None:
        env["IRPE_SERVE_GC_FREEZE"] = value
    proc, _, _ = start_cli(repo, env)
    try:
        ready = wait_for_log(proc, "model ready")[-1]
        assert (ready["frozen_objects"] > 10_000) if frozen else ready["frozen_objects"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def test_bad_gc_freeze_value_stops_the_server(tmp_path, cls_file):
    repo = tmp_path / "m.yaml"
    repo.write_text(f"gc_freeze: sometimes\nmodels:\n  - {{name: m, path: {cls_file}}}\n")
    from tests.helpers import run_python
    out = run_python(["-m", "irpe", "serve", str(repo)], timeout=120)
    assert out.returncode == 2
    assert "gc_freeze" in out.stderr and "Traceback" not in out.stderr
