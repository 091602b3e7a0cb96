"""openvino backend: exported files and an IR served next to the torch backend with the same
answers (classification; DETR at several sizes in one padded batch; v2), the listing and v2
metadata naming backend, platform and precision, bf16 where the CPU has it, the shared
batching / errors / metrics, typed settings (one-line errors), the demo with
``--backend openvino``, and one line naming the extra without the package."""
from __future__ import annotations

import os

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from irpe.cli import main
from irpe.data.shapes import render_detection
from serve.config import ModelConfig, ServeSettings
from tests.helpers import (
    BLOCKER,
    ROOT,
    encode,
    metric,
    run_python,
    running_server,
    save_untrained,
    shape_png,
)
from tests.openvino_common import cpu_has_bf16, needs_openvino

export_onnx = pytest.importorskip("export.onnx").export_onnx


# ------------------------------------------------------------------ settings (no model loaded)

def test_openvino_settings_default_to_the_servers_and_a_models_own_win(monkeypatch):
    monkeypatch.setenv("IRPE_SERVE_OV_STREAMS", "2")
    settings = ServeSettings(threads=3, models=[
        {"name": "a", "path": "a.onnx", "backend": "openvino"},
        {"name": "b", "path": "b.onnx", "backend": "openvino", "ov_threads": 1, "ov_streams": 0,
         "precision": "bf16"}])
    a, b = settings.models
    assert (a.ov_threads, a.ov_streams, a.run_precision()) == (3, 2, "fp32")
    assert (b.ov_threads, b.ov_streams, b.run_precision()) == (1, 0, "bf16")
    assert ServeSettings.model_fields["ov_streams"].default == 1


@pytest.mark.parametrize("options,message", [
    ({"precision": "fp16"}, "precision fp16: the openvino backend runs fp32 or bf16"),
    ({"device": "cuda"}, "the openvino backend runs on cpu (OpenVINO's CPU plugin), got device "
     "cuda"),
    ({"ov_threads": -1}, "ov_threads"),
    ({"ov_streams": "many"}, "ov_streams"),
])
def test_config_refuses_what_openvino_cannot_run(options, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(name="m", path="m.onnx", backend="openvino", **options)


def test_bad_openvino_settings_stop_irpe_serve_with_one_line(tmp_path, capsys):
    repo = tmp_path / "r.yaml"
    repo.write_text("models: [{name: m, path: m.onnx, backend: openvino, ov_threads: -2}]\n")
    assert main(["serve", str(repo)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("irpe serve: error: invalid settings: models.0.ov_threads: Input should be "
                   "greater than or equal to 0")


# ------------------------------------------------------------------ a real server

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ov_serve")
    out = {}
    for key, name in (("cls", "deit_shapes_irpe"), ("det", "detr_shapes_irpe")):
        out[key] = save_untrained(name, d / f"{key}.safetensors")
        out[key + "_onnx"] = str(export_onnx(out[key], d / f"{key}.onnx"))
    return out


@pytest.fixture(scope="module")
def ir_file(files, tmp_path_factory):
    """The classifier as an OpenVINO IR carrying the export contract's metadata."""
    from irpe.artifact.contract import read_onnx_props
    from irpe.artifact.openvino_ir import set_ir_props
    from irpe.runtime.openvino.core import import_openvino
    from irpe.runtime.openvino.session import OvOptions, read_model
    model = read_model(files["cls_onnx"], OvOptions(ops="off"))  # reads without the library
    set_ir_props(model, read_onnx_props(files["cls_onnx"]))
    xml = tmp_path_factory.mktemp("ov_ir") / "cls.xml"
    import_openvino().save_model(model, str(xml), compress_to_fp16=False)
    return str(xml)


@pytest.fixture(scope="module")
def client(files, ir_file):
    ov = {"backend": "openvino"}
    models = [{"name": "cls_torch", "path": files["cls"]},
              {"name": "cls_ov", "path": files["cls_onnx"], "max_queue_delay_ms": 30, **ov},
              {"name": "cls_ir", "path": ir_file, **ov},
              {"name": "det_torch", "path": files["det"]},
              {"name": "det_ov", "path": files["det_onnx"], **ov}]
    if cpu_has_bf16():
        models.append({"name": "cls_ovbf16", "path": files["cls_onnx"], "precision": "bf16",
                       **ov})
    settings = ServeSettings(threads=1, log_level="warning", models=models)
    with running_server(settings) as base, httpx.Client(base_url=base, timeout=30) as c:
        yield c


def _both(client, route: str, other: str = "ov", **kwargs):
    a = client.post(route.format("torch"), **kwargs)
    b = client.post(route.format(other), **kwargs)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    return a.json(), b.json()


@needs_openvino
@pytest.mark.parametrize("model", ["ov", "ir"])
def test_classify_torch_equals_openvino(client, model):
    files = [("file", (f"{i}.png", shape_png(i, 72))) for i in range(3)]
    a, b = _both(client, "/v1/models/cls_{}/classify?top_k=8", model, files=files)
    for x, y in zip(a["results"], b["results"], strict=True):
        assert x["indices"] == y["indices"]
        assert np.allclose(x["scores"], y["scores"], atol=1e-5)


@needs_openvino
def test_bf16_classifies_close_to_fp32_where_the_cpu_has_it(client):
    if not cpu_has_bf16():
        pytest.skip("this CPU has no BF16 (OpenVINO's OPTIMIZATION_CAPABILITIES)")
    files = [("file", (f"{i}.png", shape_png(i, 64))) for i in range(2)]
    a, b = _both(client, "/v1/models/cls_{}/classify?top_k=8", "ovbf16", files=files)
    for x, y in zip(a["results"], b["results"], strict=True):
        assert np.allclose(sorted(x["scores"]), sorted(y["scores"]), atol=0.02)


@needs_openvino
def test_detect_torch_equals_openvino_at_several_sizes(client):
    images = [render_detection(5, i, 128)[0].resize(s) for i, s in
              enumerate([(128, 128), (160, 96), (96, 144)])]
    files = [("file", (f"{i}.png", encode(im))) for i, im in enumerate(images)]
    a, b = _both(client, "/v1/models/det_{}/detect?threshold=0&max_detections=16", files=files)
    for x, y in zip(a["results"], b["results"], strict=True):
        key = lambda d: (round(d["score"], 4), d["index"])  # noqa: E731 (stable order)
        xs, ys = sorted(x["detections"], key=key), sorted(y["detections"], key=key)
        assert len(xs) == len(ys) == 16
        assert np.allclose([d["score"] for d in xs], [d["score"] for d in ys], atol=1e-5)
        assert np.allclose([d["box"] for d in xs], [d["box"] for d in ys], atol=1e-2)


@needs_openvino
def test_v2_padded_batch_torch_equals_openvino(client):
    images = np.zeros((2, 3, 96, 128), np.float32)
    images[0, :, :64, :96] = np.random.default_rng(0).standard_normal((3, 64, 96))
    images[1] = np.random.default_rng(1).standard_normal((3, 96, 128))
    body = {"inputs": [
        {"name": "images", "shape": [2, 3, 96, 128], "datatype": "FP32",
         "data": images.ravel().tolist()},
        {"name": "sizes", "shape": [2, 2], "datatype": "INT64", "data": [64, 96, 96, 128]}]}
    a, b = _both(client, "/v2/models/det_{}/infer", json=body)
    for x, y in zip(a["outputs"], b["outputs"], strict=True):
        assert x["name"] == y["name"] and x["shape"] == y["shape"]
        assert np.allclose(x["data"], y["data"], atol=1e-4)


@needs_openvino
def test_listing_and_v2_metadata_name_backend_platform_and_precision(client):
    listed = {m["name"]: m for m in client.get("/v1/models").json()}
    for name in ("cls_ov", "cls_ir", "det_ov"):
        row = listed[name]
        assert (row["backend"], row["platform"], row["precision"], row["state"]) == \
            ("openvino", "openvino", "fp32", "ready"), row
    if cpu_has_bf16():
        assert listed["cls_ovbf16"]["precision"] == "bf16"
    meta = client.get("/v2/models/det_ov").json()
    assert meta["platform"] == "openvino"
    assert meta["parameters"]["backend"] == "openvino" and meta["parameters"]["precision"] == \
        "fp32"
    assert client.get("/v2/models/det_torch").json()["parameters"]["backend"] == "torch"


@needs_openvino
def test_errors_and_metrics_are_the_shared_ones(client):
    url = str(client.base_url).rstrip("/")
    before = metric(url, "irpe_batches_total", model="cls_ov", outcome="success")
    body = {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32",
                        "data": [0.0] * 3 * 32 * 32}]}
    bad = client.post("/v2/models/cls_ov/infer", json=body)
    assert bad.status_code == 400 and "images must be [batch, 3, 64, 64]" in bad.json()["error"]
    files = [("file", (f"{i}.png", shape_png(i, 64))) for i in range(4)]
    assert client.post("/v1/models/cls_ov/classify", files=files).status_code == 200
    assert metric(url, "irpe_batches_total", model="cls_ov", outcome="success") > before


# ------------------------------------------------------------------ irpe serve

def _bundled() -> bool:
    from irpe.models.registry import bundled_weights, model_info
    try:
        for name in ("deit_shapes_irpe", "detr_shapes_irpe"):
            bundled_weights(model_info(name))
    except FileNotFoundError:
        return False
    return True


@needs_openvino
def test_irpe_serve_backend_openvino_serves_the_demo(tmp_path, capsys, monkeypatch):
    if not _bundled():
        pytest.skip("demo weights not bundled in this checkout")
    monkeypatch.setenv("IRPE_CACHE", str(tmp_path))
    monkeypatch.delenv("IRPE_SERVE_REPOSITORY", raising=False)
    monkeypatch.delenv("IRPE_SERVE_MODELS", raising=False)
    assert main(["serve", "--prepare", "--backend", "openvino", "--threads", "1",
                 "--log-level", "error"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.split()[:4] for r in rows] == [
        ["deit_shapes_irpe", "classification", "openvino", "ready"],
        ["detr_shapes_irpe", "detection", "openvino", "ready"]]
    assert main(["serve", "--prepare", "--backend", "openvino", "--precision", "fp16"]) == 2
    assert "the openvino backend runs fp32 or bf16" in capsys.readouterr().err


def test_without_openvino_irpe_serve_names_the_extra(files, tmp_path):
    repo = tmp_path / "r.yaml"
    repo.write_text(f"models: [{{name: m, path: {files['cls_onnx']}, backend: openvino}}]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
               IRPE_TEST_BLOCKED="openvino")
    done = run_python(["-m", "irpe", "serve", str(repo), "--prepare"], env=env, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err, done.stdout + done.stderr
    assert err.startswith("irpe serve: error: OpenVINO is not installed (") and \
        err.endswith("pip install 'irpe-deploy[openvino]'")
