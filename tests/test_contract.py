"""irpe.artifact.contract and exporters: the one artifact contract export/ writes and serve/ reads.

Every way to name a model to ``irpe export`` round-trips labels, preprocessing and task; serve
imports nothing from export/.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from export.source import load_source
from irpe.artifact import contract, exporters
from irpe.artifact.trained import ModelSpec, default_spec, read_spec, save_trained
from irpe.checkpoint import save_checkpoint
from irpe.cli import main
from irpe.models import create_model, model_info
from irpe.models.deit import IRPE_VARIANTS
from irpe.models.registry import bundled_weights
from irpe.rpe import RPEConfig

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = Path(bundled_weights(model_info("deit_shapes_irpe")))


def _export(capsys, *argv: str) -> ModelSpec:
    """Run ``irpe export`` (the real CLI, graph optimisation off) and read the file's spec."""
    out = Path(argv[argv.index("-o") + 1])
    assert main(["export", *argv, "--quiet", "--no-optimize"]) == 0, capsys.readouterr().err
    return contract.read_onnx_spec(out)


def _same_description(got: ModelSpec, want: ModelSpec) -> None:
    assert (got.model_name, got.task, got.class_names, got.preprocess) == \
        (want.model_name, want.task, want.class_names, want.preprocess)


@pytest.mark.parametrize("how", ["name", "file", "name+checkpoint"])
def test_every_way_to_name_the_demo_classifier_keeps_its_labels(how, tmp_path, capsys):
    """`irpe export deit_shapes_irpe` once wrote class_0..7 instead of the bundled names."""
    source = {"name": ["deit_shapes_irpe"], "file": [str(BUNDLED)],
              "name+checkpoint": ["deit_shapes_irpe", "--checkpoint", str(BUNDLED)]}[how]
    spec = _export(capsys, *source, "-o", str(tmp_path / "m.onnx"))
    want = read_spec(str(BUNDLED))[0]
    _same_description(spec, want)
    assert spec.class_names[6] == "star"


def test_detector_by_name_keeps_labels_and_detection_preprocessing():
    """The spec export writes is the resolved source's (a DETR export costs ~10 s: not re-run)."""
    src = load_source("detr_shapes_irpe")
    _same_description(src.spec, read_spec(bundled_weights(model_info("detr_shapes_irpe")))[0])
    assert src.weights == "bundled:detr_shapes_irpe.safetensors"
    assert src.spec.task == "detection" and src.spec.preprocess["max_size"] == 256


def test_name_with_a_plain_checkpoint_gets_the_family_defaults(tmp_path):
    """A checkpoint without irpe metadata (e.g. an official .pth): default labels/transform."""
    ckpt = tmp_path / "plain.safetensors"
    save_checkpoint(create_model("deit_shapes_irpe").eval(), str(ckpt))
    src = load_source("deit_shapes_irpe", checkpoint=str(ckpt))
    _same_description(src.spec, default_spec("deit_shapes_irpe"))


def test_name_with_another_models_trained_file_is_a_clear_error(tmp_path, capsys):
    other = tmp_path / "detr.safetensors"
    save_trained(create_model("detr_shapes_irpe"), str(other), default_spec("detr_shapes_irpe"))
    assert main(["export", "deit_shapes_irpe", "--checkpoint", str(other),
                 "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert "is a trained detr_shapes_irpe model, not deit_shapes_irpe" in err
    assert not (tmp_path / "x.onnx").exists()


def test_tensor_names_and_dynamic_axes():
    assert contract.io_spec("classification") == (
        ["images"], ["logits"], {"images": {0: "batch"}, "logits": {0: "batch"}})
    names_in, names_out, axes = contract.io_spec("detection")
    assert names_in == ["images", "sizes"] and names_out == ["pred_logits", "pred_boxes"]
    assert axes["images"] == {0: "batch", 2: "height", 3: "width"} and set(axes) == \
        set(names_in + names_out)
    axes["images"][5] = "mutated"  # callers get copies
    assert 5 not in contract.dynamic_axes("detection")["images"]
    with pytest.raises(ValueError, match="unknown task 'segmentation'"):
        contract.input_names("segmentation")


@pytest.mark.parametrize("ratio, method, on", list(IRPE_VARIANTS.values()) + [(2.0, "euc", "q")])
def test_rpe_config_dict_round_trip(ratio, method, on):
    cfg = RPEConfig(ratio=ratio, method=method, mode="contextual", skip=1, on=on)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert RPEConfig.from_dict(data) == cfg
    assert data["num_buckets"] == cfg.num_buckets and data["config"] == cfg.to_string()


def test_rpe_config_dict_reads_the_older_form_and_rejects_others():
    cfg = RPEConfig.from_string("rpe-2.0-product-ctx-1-k", skip=0)
    assert RPEConfig.from_dict({"rpe": "rpe-2.0-product-ctx-1-k", "skip": 0}) == cfg
    with pytest.raises(ValueError, match="not an iRPE config dict"):
        RPEConfig.from_dict({"ratio": 2.0})
    with pytest.raises(ValueError, match="bad iRPE config string"):
        RPEConfig.from_dict({"config": "product-2.0"})


def test_trained_file_overrides_use_the_contract_form(tmp_path):
    cfg = RPEConfig.from_string("rpe-1.9-product-ctx-1-k", skip=1)
    spec = default_spec("deit_shapes_irpe", rpe_config=cfg)
    path = tmp_path / "t.safetensors"
    torch.manual_seed(0)
    save_trained(spec.build(), str(path), spec)
    back, meta = read_spec(str(path))
    assert json.loads(meta["irpe.overrides"])["rpe_config"] == cfg.to_dict()
    assert back.build_overrides()["rpe_config"] == cfg


def test_engine_sidecar_round_trip_and_errors(tmp_path):
    engine = tmp_path / "m.engine"
    spec = default_spec("deit_shapes_irpe")
    assert contract.sidecar_path(engine) == tmp_path / "m.engine.json"
    with pytest.raises(FileNotFoundError, match=r"m\.engine\.json \(the engine's sidecar\)"):
        contract.engine_spec(engine)
    contract.write_sidecar(engine, {"onnx_metadata": spec.metadata()})
    assert contract.engine_spec(engine) == spec
    contract.sidecar_path(engine).write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON sidecar"):
        contract.engine_spec(engine)
    contract.write_sidecar(engine, {"onnx_metadata": {}})
    with pytest.raises(ValueError, match="not an irpe trained-model file"):
        contract.engine_spec(engine)


def test_onnx_exporter_is_found_through_irpe():
    exporter = exporters.get_exporter("onnx")
    assert exporter.sources == (ROOT / "export",) and len(exporter.fingerprint()) == 64
    with pytest.raises(RuntimeError, match="no tflite exporter is registered"):
        exporters.get_exporter("tflite")


def test_serve_never_imports_export():
    pattern = re.compile(r"^\s*(import export|from export)\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "serve").rglob("*.py")
                 if pattern.search(p.read_text())]
    assert offenders == []
