"""`irpe serve` runs its onnxruntime models on ONE shared intra-op pool (ort_thread_pool:
shared, the default) or a pool per model (per_model); real server processes."""
import json
import os
import signal

import httpx
import pytest

from export.onnx import export_onnx
from tests.helpers import shape_png, start_cli, wait_ready

THREADS = 3


@pytest.fixture(scope="module")
def cls_onnx(cls_file, tmp_path_factory):
    return export_onnx(cls_file, tmp_path_factory.mktemp("onnx") / "cls.onnx")


def _serve(tmp_path, onnx, pool: str):
    """Two onnxruntime models from one file; (pool log entry, threads once ready, labels)."""
    repo = tmp_path / f"{pool}.yaml"
    given = "" if pool == "shared" else f"ort_thread_pool: {pool}\n"  # shared: the default
    repo.write_text(f"threads: {THREADS}\n{given}models:\n"
                    f"  - {{name: a, path: {onnx}, backend: onnxruntime}}\n"
                    f"  - {{name: b, path: {onnx}, backend: onnxruntime}}\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc, url, lines = start_cli(repo, env)
    try:
        wait_ready(url)
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        with httpx.Client(base_url=url, timeout=30) as c:
            labels = [c.post(f"/v1/models/{name}/classify", content=shape_png(0),
                             headers={"content-type": "image/png"}).json()["results"]
                      for name in ("a", "b", "a", "b")]
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        proc.kill()
    entries = [json.loads(line) for line in lines]
    pool_logs = [e for e in entries if e["message"] == "onnxruntime thread pool"]
    return pool_logs, threads, labels


def test_models_share_one_pool_unless_per_model(tmp_path, cls_onnx):
    shared_logs, shared_threads, shared_out = _serve(tmp_path, cls_onnx, "shared")
    own_logs, own_threads, own_out = _serve(tmp_path, cls_onnx, "per_model")
    assert [(e["pool"], e["threads"], e["models"]) for e in shared_logs] == \
        [("shared", THREADS, ["a", "b"])]
    assert own_logs == []  # per_model: no shared pool made
    # a pool per model: each session brings THREADS - 1 workers; shared: one pool's only
    assert own_threads - shared_threads >= THREADS - 1
    assert shared_out == own_out and shared_out[0] == shared_out[1]  # same file, same answers


def test_bad_pool_setting_is_one_line_exit_2(tmp_path, cls_onnx, capsys):
    from irpe.cli import main
    repo = tmp_path / "bad.yaml"
    repo.write_text(f"ort_thread_pool: global\nmodels:\n"
                    f"  - {{name: a, path: {cls_onnx}, backend: onnxruntime}}\n")
    assert main(["serve", str(repo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ort_thread_pool" in err and "per_model" in err, err
