"""Server settings (YAML/TOML repository + env), backend selection and `irpe serve` errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from irpe.artifact.trained import read_spec
from irpe.cli import main
from irpe.idcache import BUCKET_IDS
from irpe.models import model_info
from irpe.models.registry import bundled_weights
from serve.backends import create_backend
from serve.config import ModelConfig, ServeSettings
from tests.helpers import ROOT

CLS = bundled_weights(model_info("deit_shapes_irpe"))


def test_yaml_repository_relative_paths_and_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("IRPE_SERVE_PORT", raising=False)
    (tmp_path / "labels.txt").write_text("a\nb\n\n")
    repo = tmp_path / "models.yaml"
    repo.write_text("port: 9001\nmodels:\n  - name: m\n    path: sub/m.onnx\n"
                    "    backend: onnxruntime\n    labels: labels.txt\n"
                    "    max_batch_size: 16\n")
    s = ServeSettings(repository=repo)
    m = s.models[0]
    assert s.port == 9001 and s.host == "127.0.0.1"
    assert m.path == tmp_path / "sub" / "m.onnx" and m.max_batch_size == 16
    assert m.max_queue_delay_ms == 5.0 and m.device == "cpu"
    assert m.class_names() == ["a", "b"]


def test_toml_repository_and_env_priority(tmp_path, monkeypatch):
    repo = tmp_path / "models.toml"
    repo.write_text('port = 9001\nthreads = 2\n[[models]]\nname = "m"\npath = "/abs/m.pt"\n'
                    'labels = ["x", "y"]\n')
    monkeypatch.setenv("IRPE_SERVE_REPOSITORY", str(repo))
    monkeypatch.setenv("IRPE_SERVE_PORT", "9100")
    s = ServeSettings()
    assert s.port == 9100 and s.threads == 2  # env over file
    assert str(s.models[0].path) == "/abs/m.pt" and s.models[0].class_names() == ["x", "y"]
    assert ServeSettings(port=7).port == 7  # arguments over env
    monkeypatch.setenv("IRPE_SERVE_MODELS", '[{"name": "e", "path": "e.onnx"}]')
    assert ServeSettings().model_names() == ["e"]


@pytest.mark.parametrize("model,match", [
    ({"name": "bad name", "path": "x"}, "name"),
    ({"name": "m", "path": "x", "backend": "tflite"}, "backend"),
    ({"name": "m", "path": "x", "device": "gpu"}, "device must be cpu"),
    ({"name": "m", "path": "x", "max_batch_size": 0}, "max_batch_size"),
    ({"name": "m", "path": "x", "batch": 4}, "batch"),
])
def test_invalid_model_config(model, match):
    with pytest.raises(ValidationError, match=match):
        ModelConfig(**model)


def test_tensorrt_backend_without_gpu_or_tensorrt_is_a_clear_error(cls_file, tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match="m.engine.json"):
        create_backend(ModelConfig(name="m", path=engine, backend="tensorrt"))
    spec = read_spec(cls_file)[0]
    (tmp_path / "m.engine.json").write_text(json.dumps({"onnx_metadata": spec.metadata()}))
    assert create_backend(ModelConfig(name="m", path=engine, backend="tensorrt")).spec == spec
    cfg = ModelConfig(name="m", path=engine, backend="tensorrt", metadata=cls_file)
    backend = create_backend(cfg)
    assert backend.spec.model_name == "deit_shapes_irpe"
    with pytest.raises(RuntimeError, match="needs device cuda"):
        backend.load()
    on_gpu = create_backend(cfg.model_copy(update={"device": "cuda"}))
    with pytest.raises(RuntimeError, match="not a readable TensorRT engine: no engine magic"):
        on_gpu.load()  # checked before CUDA and TensorRT are needed


def test_configured_labels_replace_the_artifacts(cls_file):
    from serve.metrics import Metrics
    from serve.model import ServedModel
    names = [f"shape{i}" for i in range(8)]
    model = ServedModel(ModelConfig(name="m", path=cls_file, labels=names), Metrics())
    assert model.labels == names and model.task == "classification"
    assert ServedModel(ModelConfig(name="m", path=cls_file), Metrics()).labels[0] == "circle"


def _cli(capsys, *argv) -> tuple:
    code = main(["serve", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _repo(tmp_path, text: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,message", [
    ("models: [{name: m, path: missing.safetensors}]", "model file not found"),
    ("models: [{name: m, path: MODEL, task: detection}]", "configured task detection but"),
    ("models: [{name: m, path: MODEL, labels: [a, b]}]", "2 labels configured for a model "
     "with 8 classes"),
    ("models: [{name: m, path: MODEL}, {name: m, path: MODEL}]", "model names used twice: m"),
    ("models: [{name: m, path: MODEL, backend: tflite}]", "invalid settings: models.0.backend"),
    ("port: 70000\nmodels: []", "invalid settings: port"),
    ("models: {name: m}", "'models' must be a list"),
    ("models: [", "invalid YAML"),
])
def test_cli_config_errors_are_one_line_exit_2(capsys, tmp_path, cls_file, text, message):
    code, out, err = _cli(capsys, _repo(tmp_path, text.replace("MODEL", cls_file)))
    assert code == 2 and out == ""
    assert err.startswith("irpe serve: error: ") and err.count("\n") == 1
    assert message in err, err


def test_cli_missing_repository(capsys, tmp_path):
    code, _, err = _cli(capsys, str(tmp_path / "nope.toml"))
    assert code == 2 and "model repository not found" in err


def test_cli_port_in_use(capsys, tmp_path, cls_file):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = _cli(capsys, _repo(tmp_path, f"models: [{{name: m, path: {cls_file}}}]"),
                            "--port", str(port), "--log-level", "error")
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err


def test_cli_prepare_loads_and_warms_up(capsys, tmp_path, cls_file):
    repo = _repo(tmp_path, f"threads: 1\nmodels: [{{name: shapes, path: {cls_file}}}]")
    code, out, _ = _cli(capsys, repo, "--prepare", "--log-level", "error")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["model", "task", "backend", "state", "path"]
    assert lines[1].split() == ["shapes", "classification", "torch", "ready", cls_file]


def test_onnxruntime_providers_by_device():
    """GPU devices get irpe.runtime.onnxruntime.session.GPU_PROVIDERS (TensorRT EP, then CUDA
    EP: ORT's usual priority), those the build has, then the CPU EP."""
    from irpe.runtime.onnxruntime.file import providers_for
    from irpe.runtime.onnxruntime.session import GPU_PROVIDERS
    assert GPU_PROVIDERS == ("TensorrtExecutionProvider", "CUDAExecutionProvider")
    gpu = ["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"]
    assert providers_for(None, "cpu", gpu) == ["CPUExecutionProvider"]
    assert providers_for(None, "cuda", gpu[:2]) == [("CUDAExecutionProvider", {"device_id": 0}),
                                                    "CPUExecutionProvider"]
    assert providers_for(None, "cuda:1", gpu) == [
        ("TensorrtExecutionProvider", {"device_id": 1}), ("CUDAExecutionProvider",
                                                          {"device_id": 1}),
        "CPUExecutionProvider"]
    assert providers_for(["CUDAExecutionProvider"], "cuda", gpu) == [
        ("CUDAExecutionProvider", {"device_id": 0})]
    with pytest.raises(RuntimeError, match="needs onnxruntime-gpu"):
        providers_for(None, "cuda", ["CPUExecutionProvider"])
    with pytest.raises(RuntimeError, match=r"\['CUDAExecutionProvider'\] are not in this build"):
        providers_for(["CUDAExecutionProvider"], "cpu", ["CPUExecutionProvider"])


def test_demo_onnx_cache_key_covers_model_and_exporter_sources(tmp_path, monkeypatch):
    """The cached demo export is re-made when any irpe/ or export/ source changes (not only
    export/onnx.py: the function bodies, symbolics and the attention shape the file too)."""
    import dataclasses
    import shutil

    from irpe.artifact import exporters
    from serve import demo
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights")
    first = demo.onnx_cache_path(weights, tmp_path)
    assert first == demo.onnx_cache_path(weights, tmp_path)
    assert first.parent == tmp_path / "onnx" and first.name.startswith("w-")
    registered = exporters.get_exporter("onnx")
    assert registered.sources == (Path(__file__).parents[1] / "export",)
    copy = tmp_path / "export_copy"
    shutil.copytree(registered.sources[0], copy)
    monkeypatch.setitem(exporters._EXPORTERS, "onnx",
                        dataclasses.replace(registered, sources=(copy,)))
    assert demo.onnx_cache_path(weights, tmp_path) == first  # same sources, same key
    (copy / "functions.py").write_text((copy / "functions.py").read_text() + "\n# changed\n")
    assert demo.onnx_cache_path(weights, tmp_path) != first
    weights.write_bytes(b"other weights")
    assert demo.onnx_cache_path(weights, tmp_path) not in (first,)


def test_bucket_cache_limit_from_settings():
    from serve.app import create_app
    limit = BUCKET_IDS.max_bytes
    try:
        create_app(ServeSettings(bucket_cache_mib=0.5, models=[{"name": "m", "path": CLS}]))
        assert BUCKET_IDS.max_bytes == 1 << 19
    finally:
        BUCKET_IDS.set_limit(limit)
    with pytest.raises(ValidationError, match="bucket_cache_mib"):
        ServeSettings(bucket_cache_mib=-1)


def _prepare(tmp_path, extra: str):
    repo = tmp_path / "repo.yaml"
    repo.write_text(f"models:\n  - name: shapes\n    path: {CLS}\n{extra}")
    return subprocess.run([sys.executable, "-m", "irpe", "serve", str(repo), "--prepare"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_prepare_refuses_an_unknown_default_model(tmp_path):
    done = _prepare(tmp_path, "default_classifier: nope\n")
    assert done.returncode == 2, done  # main: 0
    assert "default_classifier 'nope' is not a configured model; configured: shapes" \
        in done.stderr
    assert "Traceback" not in done.stderr


def test_default_detector_must_be_a_detector():
    from serve.app import create_app
    with pytest.raises(ValueError, match="'shapes' is a classification model, not detection"):
        create_app(ServeSettings(default_detector="shapes",
                                 models=[{"name": "shapes", "path": CLS}]))
