"""Validation against PyTorch: passing report with real images, a tampered file that fails with
its worst output named (library and `irpe validate` exit 1), and bad input."""
from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from export.onnx import export_onnx
from export.validate import compare, validate
from irpe.cli import main
from tests.helpers import export_tiny_qkv


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A trained-model file, its export, a tampered copy and a folder of three images."""
    d = tmp_path_factory.mktemp("val")
    model, spec, good, _ = export_tiny_qkv(d)
    with torch.no_grad():
        model.head.bias[3] += 0.05  # one class logit off by 0.05 for every input
    proto = onnx.load(export_onnx(model, d / "bad.onnx", spec=spec))
    weights = next(p for p in proto.metadata_props if p.key == "irpe.weights")
    weights.value = f"trained:{d / 'm.safetensors'}"  # claims the good weights
    onnx.save(proto, d / "bad.onnx")
    (d / "imgs").mkdir()
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(50, 60), (64, 48), (40, 40)]):
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(d / "imgs" / f"img{i}.png")
    return {"dir": d, "good": good, "bad": d / "bad.onnx", "images": d / "imgs"}


def test_passes_with_real_and_random_inputs(files):
    report = validate(files["good"], num_inputs=6, image_dir=files["images"])
    assert report["passed"] and report["failed_outputs"] == []
    assert report["batches"] == ["img0.png,img1.png,img2.png,random0", "random1,random2"]
    row = report["outputs"]["logits"]
    assert row["violations"] == 0 and row["elements"] == 60 and row["max_abs"] < 1e-4
    assert row["cosine"] > 0.999999
    assert report["metrics"] == {"top1_agreement": 1.0, "top5_agreement": 1.0}
    assert report["weights"].startswith("trained:") and report["atol"] == 1e-4


def test_tampered_file_fails_and_names_the_worst_output(files):
    report = validate(files["bad"], num_inputs=3)
    assert not report["passed"] and report["failed_outputs"] == ["logits"]
    worst = report["outputs"]["logits"]["worst"]
    assert worst["index"][1] == 3 and worst["input"].startswith("random")
    assert abs(worst["got"] - worst["expected"] - 0.05) < 1e-4
    assert report["outputs"]["logits"]["violations"] == 3  # column 3 of 3 inputs
    # a tolerance wider than the error passes the same file
    assert validate(files["bad"], num_inputs=3, atol=0.06)["passed"]


def test_cli_exit_codes_and_json(files, capsys, tmp_path):
    report = tmp_path / "r.json"
    assert main(["validate", str(files["good"]), "-n", "2", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["passed"] is True
    assert "PASS" in capsys.readouterr().out
    assert main(["validate", str(files["bad"]), "-n", "2"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"FAIL: worst outputs: logits \(input random[01], index \[[01], 3\]", out)


def test_compare_statistics():
    expected = np.array([[1.0, -2.0], [0.5, 0.0]], np.float32)
    got = expected + np.array([[0.0, 0.1], [0.0, 0.0]], np.float32)
    row = compare(got, expected, atol=1e-3, rtol=0.0, rows=["a", "b"])
    assert row["violations"] == 1 and row["worst"]["input"] == "a"
    assert row["worst"]["index"] == [0, 1] and row["max_abs"] == pytest.approx(0.1, rel=1e-5)
    assert compare(got[:1], expected, 1e-3, 0.0)["shape_mismatch"] == [[1, 2], [2, 2]]
    nan = expected.copy()
    nan[1, 1] = np.nan
    assert compare(nan, expected, 1e-3, 0.0)["violations"] == 1


def test_bad_input(files, tmp_path):
    with pytest.raises(ValueError, match="precision must be one of"):
        validate(files["good"], precision="int4")
    with pytest.raises(FileNotFoundError):
        validate(tmp_path / "missing.onnx")
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        validate(files["good"], image_dir=tmp_path / "nope")
    with pytest.raises(ValueError, match="sizes apply to detection models only"):
        validate(files["good"], sizes=[(32, 32)])
    plain = onnx.load(files["good"])
    del plain.metadata_props[:]
    onnx.save(plain, tmp_path / "anon.onnx")
    with pytest.raises(ValueError, match="does not say which weights"):
        validate(tmp_path / "anon.onnx")


def test_validation_images_are_found_in_class_subfolders(tmp_path):
    from export.inputs import make_batches
    from irpe.artifact.trained import default_spec
    from irpe.data.shapes import render_classification
    for index, cls in ((0, "circle"), (6, "star")):
        (tmp_path / cls).mkdir()
        render_classification(5, index, split="val")[0].save(tmp_path / cls / f"{index}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    spec = default_spec("deit_shapes_irpe")
    batches = make_batches(spec, 3, tmp_path)
    names = [n for b in batches for n in b.names]
    assert names == ["0.png", "6.png", "random0"]  # sorted by path, then random fill
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images .* in .*empty or its subfolders"):
        make_batches(spec, 1, tmp_path / "empty")
