"""`irpe tune` for real: bad arguments (one line, exit 2, nothing written), the accuracy gate on
a quantised file damaged to fail it (real `irpe eval` runs), and one tune of the demo
classifier within a tiny budget (real `irpe serve` processes, real HTTP) whose tuned file the
project's repository reader loads and `irpe serve` serves."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from irpe.cli import main
from serve.tune.goal import Goal
from serve.tune.search import Budget, search
from serve.tune.space import axes, default_candidate
from serve.tune.store import ResultStore
from tests.helpers import ROOT

BAD = [
    (["--clients", "0"], "--clients: client counts from 1 to 4096, got '0'"),
    (["--clients", "4,x"], "--clients: expected a comma list of integers, got '4,x'"),
    (["--p99-ms", "0"], "--p99-ms: must be > 0, got 0"),
    (["--rate", "nan"], "--rate: must be > 0, got nan"),
    (["--budget-min", "soon"], "--budget-min: not a number: 'soon'"),
    (["--margin", "-1"], "--margin: must be >= 0, got -1"),
    (["--keep", "1.5"], "--keep: not an integer: '1.5'"),
    (["--val-images", "0"], "--val-images: must be >= 1, got 0"),
    (["--precisions", "fp32,fp64"], "--precisions: expected a comma list of fp32, bf16, int8, "
                                    "got 'fp32,fp64'"),
    (["--backends", "tensorrt"], "--backends: expected a comma list of openvino, onnxruntime, "
                                 "torch, got 'tensorrt'"),
    (["--axes", "batching,colour"], "--axes: expected a comma list of runtime, batching, "
                                    "parallelism, got 'batching,colour'"),
    (["-o", "tuned.txt"], "-o tuned.txt: the tuned repository file is YAML (.yaml/.yml)"),
    (["--val-data", "no-such-folder"], "--val-data no-such-folder: not a folder (or 'shapes')"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[b[0][0] for b in BAD])
def test_bad_arguments_are_one_line_and_exit_2(extra, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "deit_shapes_irpe", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"irpe tune: error: {message}"]
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_bad_models_and_an_output_over_the_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cases = {("no_such_model_xyz",): "'no_such_model_xyz' is neither a model file",
             ("missing.onnx",): "model file not found: missing.onnx",
             ("deit_shapes_irpe", "--model", "x"): "--model picks a model of a repository file"}
    repo = tmp_path / "repo.yaml"
    repo.write_text("models: []\n")
    cases[("repo.yaml",)] = "repo.yaml: no models to tune"
    (tmp_path / "images").mkdir()
    cases[("deit_shapes_irpe", "--val-data", "images")] = "--val-data images: no val/ split"
    cases[("repo.yaml", "-o", "repo.yaml")] = "repo.yaml"
    for argv, message in cases.items():
        assert main(["tune", *argv]) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("irpe tune: error: ") and message in err[0]
    assert repo.read_text() == "models: []\n" and sorted(p.name for p in tmp_path.iterdir()) \
        == ["images", "repo.yaml"]


def test_without_the_checkout_tune_says_what_it_needs(tmp_path):
    """A wheel's layout (irpe, export, serve; no benchmarks/): `irpe tune` is one line naming
    the load generator it measures with, exit 2, nothing written."""
    import os
    import shutil
    site = tmp_path / "site"
    for package in ("irpe", "export", "serve"):
        shutil.copytree(ROOT / package, site / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([sys.executable, "-m", "irpe", "tune", "deit_shapes_irpe"], cwd=work,
                          env=dict(os.environ, PYTHONPATH=str(site)), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("irpe tune: error: irpe tune measures with the load generator of "
                           "`irpe bench serve` (benchmarks/")
    assert list(work.iterdir()) == []


def _damaged_int8(onnx_path, out):
    """The demo classifier with every weight matrix zeroed, saved as the OpenVINO IR where the
    tune keeps its int8 file: a real IR that loads and serves, with chance accuracy."""
    import onnx
    from onnx import numpy_helper

    from irpe.artifact.files import read_props
    from irpe.artifact.openvino_ir import set_ir_props, write_ir
    from irpe.runtime.openvino.session import OvOptions, open_model
    model = onnx.load(str(onnx_path))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.ndim == 2 and array.dtype.kind == "f":
            init.CopyFrom(numpy_helper.from_array(array * 0, init.name))
    damaged = out.with_name("damaged.onnx")
    onnx.save(model, str(damaged))
    ov_model = open_model(damaged, OvOptions(ops="off"))[0]
    set_ir_props(ov_model, read_props(damaged))
    write_ir(ov_model, out)
    return out


def test_a_quantised_file_failing_the_gate_is_never_recommended(tmp_path):
    from irpe.weights import cache_dir
    from serve.tune.accuracy import AccuracyGate, ModelFiles
    from serve.tune.target import resolve
    target = resolve("deit_shapes_irpe", None, cache_dir() / "tune")
    files = ModelFiles(target, tmp_path)
    _damaged_int8(target.files["onnx"], tmp_path / f"{target.name}.int8.xml")
    assert files.int8() == tmp_path / f"{target.name}.int8.xml"  # newer: not quantised again
    gate = AccuracyGate(files, "shapes", margin=1.0, shapes_val=200)
    int8 = default_candidate("openvino").with_(precision="int8")
    ok, detail = gate(int8)
    assert not ok and detail.startswith("top1 ") and "vs fp32" in detail
    assert gate.reference(int8) >= 90.0  # the trained demo classifier, in fp32

    def int8_is_fastest(cand, seconds):
        rate = 100.0 if cand.precision == "int8" else 40.0
        return {"c1": {"images_per_s": rate, "p50_ms": 5.0, "p99_ms": 9.0, "errors": {},
                       "requests": 50}}
    out = search(default_candidate("openvino"), axes(["openvino"], ["fp32", "int8"], cores=2),
                 int8_is_fastest, Goal(), ResultStore(None, "gate"), Budget(1e9), gate,
                 short_s=1, full_s=2, log=lambda line: None)
    assert out.best is not None and out.best["candidate"].precision == "fp32"
    assert all(c.precision == "fp32" for c, e in out.entries.items() if "short" in e)


def test_a_real_tune_of_the_demo_classifier_serves_its_file(tmp_path):
    """Within a 36 s budget (the test takes about a minute on 2 shared cores): real `irpe
    serve` processes, real HTTP; the tuned file loads with the project's reader and `irpe
    serve` answers from it."""
    done = subprocess.run(
        [sys.executable, "-m", "irpe", "tune", "deit_shapes_irpe", "--clients", "2",
         "--budget-min", "0.6", "--short-s", "1", "--full-s", "1.5", "--warmup-s", "0.3",
         "--final", "1", "--precisions", "fp32", "--axes", "batching,parallelism",
         "-o", str(tmp_path / "tuned.yaml")],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "short" in out and "final rung" in out and out.count("img/s") >= 3
    assert f"wrote {tmp_path / 'tuned.md'}" in out
    for name in ("tuned.md", "tuned.png", "tuned.config.pbtxt"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "tuned.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "tuned.md").read_text()
    assert "| best" in md and "(default)" in md
    from irpe.runtime.pick import onnx_runtime
    backend = onnx_runtime("cpu")  # the default candidate's: irpe serve's backend auto
    platform = {"openvino": "openvino", "onnxruntime": "onnxruntime_onnx"}[backend]
    assert f'platform: "{platform}"' in (tmp_path / "tuned.config.pbtxt").read_text()
    records = [json.loads(line) for line in
               (tmp_path / "tuned.tune" / "results.jsonl").read_text().splitlines()]
    assert records and all(r["kind"] == "measure" for r in records)
    assert {r["stage"] for r in records} == {"short", "full"}

    from serve.config import ServeSettings
    settings = ServeSettings(repository=tmp_path / "tuned.yaml")
    (model,) = settings.models
    assert model.name == "deit_shapes_irpe" and model.backend in ("openvino", "onnxruntime")
    tuned = yaml.safe_load((tmp_path / "tuned.yaml").read_text())["models"][0]
    assert model.max_batch_size == tuned["max_batch_size"]

    import httpx

    from benchmarks.serve_load import png, server_process
    with server_process(tmp_path / "tuned.yaml", settings.threads) as base:
        r = httpx.post(f"{base}/v1/models/deit_shapes_irpe/classify?top_k=1", content=png(64),
                       headers={"content-type": "image/png"}, timeout=60)
    assert r.status_code == 200, r.text
    from irpe.data.shapes import SHAPE_CLASSES
    assert r.json()["model"] == "deit_shapes_irpe"
    assert r.json()["results"][0]["labels"][0] in SHAPE_CLASSES


def test_a_repository_model_keeps_its_other_settings_in_the_tuned_file(tmp_path):
    """MODEL_OR_REPO as a repository: --model picks one of its models; the tuned file keeps that
    model's and the server's other settings and validates as irpe serve's settings."""
    from irpe.errors import CLIError
    from irpe.weights import cache_dir
    from serve.config import ServeSettings
    from serve.tune.measure import repository
    from serve.tune.target import resolve
    onnx = resolve("deit_shapes_irpe", None, cache_dir() / "tune").files["onnx"]
    repo = tmp_path / "repo.yaml"
    repo.write_text(yaml.safe_dump({"log_level": "warning", "threads": 1, "models": [
        {"name": "cls", "path": str(onnx), "timeout_s": 12.0, "max_queue_size": 99,
         "max_batch_size": 2},
        {"name": "other", "path": str(onnx)}]}))
    with pytest.raises(CLIError, match=r"pick one with --model \(its models: cls, other\)"):
        resolve(str(repo), None, tmp_path)
    target = resolve(str(repo), "cls", tmp_path)
    assert target.name == "cls" and target.task == "classification" and target.size == 64
    assert target.model_keys == {"timeout_s": 12.0, "max_queue_size": 99}
    assert target.server == {"log_level": "warning"} and target.inputs == [repo, onnx]
    cand = default_candidate("openvino").with_(max_batch_size=16, max_queue_delay_ms=10.0,
                                               threads=2, ov_streams=2)
    settings = ServeSettings(**repository(target, cand, onnx))
    (model,) = settings.models
    assert (model.max_batch_size, model.max_queue_delay_ms, model.ov_streams) == (16, 10.0, 2)
    assert (model.timeout_s, model.max_queue_size, settings.threads) == (12.0, 99, 2)
    assert settings.log_level == "warning"
