"""``irpe quantize``: int8 files from ONNX Runtime's quantisation tools keep their iRPE nodes and
functions, run without the custom-op library, fuse every attention block to RPEAttention with
it as the fp32 file does, stay accurate on the trained demo classifier, record the quantisation
in their metadata; bad input is a one-line error. Real ONNX Runtime sessions throughout."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from export.onnx import export_onnx
from export.quantize import QuantizeSettings, QuantMode, Target, calibration_feeds, quantize
from irpe.artifact.contract import onnx_precision, onnx_quantization, read_onnx_props
from irpe.runtime.onnxruntime.session import create_session

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors"
BLOCKS = 4  # the demo classifier's attention blocks (iRPE-QKV)


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "irpe", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory) -> Path:
    """The trained demo classifier (iRPE-QKV, 4 blocks) exported to ONNX."""
    return export_onnx(str(DEMO), tmp_path_factory.mktemp("q") / "deit.onnx")


@pytest.fixture(scope="module")
def static(fp32) -> Path:
    """fp32 quantised by the CLI: static QDQ calibrated on 16 shapes images."""
    out = fp32.with_name("deit.int8.onnx")
    done = _cli("quantize", str(fp32), "-o", str(out), "--calibration", "shapes",
                "--samples", "16")
    assert done.returncode == 0, done.stderr
    assert "int8 static QDQ" in done.stdout
    return out


@pytest.fixture(scope="module")
def static_uint8(fp32) -> Path:
    """fp32 quantised by the CLI with uint8 (asymmetric) activations."""
    out = fp32.with_name("deit.u8.onnx")
    done = _cli("quantize", str(fp32), "-o", str(out), "--calibration", "shapes",
                "--samples", "16", "--activations", "uint8")
    assert done.returncode == 0, done.stderr
    assert "int8 static QDQ" in done.stdout and "activations uint8" in done.stdout
    return out


@pytest.fixture(scope="module")
def dynamic(fp32) -> Path:
    out = fp32.with_name("deit.dyn.onnx")
    quantize(fp32, out, QuantizeSettings(mode=QuantMode.DYNAMIC))
    return out


def _images(spec, count: int = 16) -> np.ndarray:
    return np.concatenate([b["images"] for b in calibration_feeds(spec, "shapes", count,
                                                                   seed=7)])


def _run(path: Path, x: np.ndarray, **kw) -> np.ndarray:
    session, _ = create_session(path, custom_ops="off", quiet=True, **kw)
    return session.run(None, {"images": x})[0]


def test_static_file_keeps_rpe_nodes_functions_and_records_the_quantisation(fp32, static):
    model = onnx.load(static)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    assert ops["RPEGather"] == 8 and ops["RPEScatter"] == 4  # the iRPE nodes, untouched
    assert {f.name for f in model.functions} == {f.name for f in onnx.load(fp32).functions}
    props = read_onnx_props(static)
    assert onnx_precision(props) == "int8" and onnx_precision(read_onnx_props(fp32)) == "fp32"
    record = onnx_quantization(props)
    assert record["mode"] == "static" and record["format"] == "QDQ"
    assert record["calibration"] == "shapes" and record["samples"] == 16
    assert record["weights"] == "int8 per-channel"
    assert record["activations"] == "int8 asymmetric calibrated"
    assert props["irpe.model_name"] == "deit_shapes_irpe"  # the export's own metadata stays


@pytest.mark.parametrize("which, dtype", [("static", np.int8), ("static_uint8", np.uint8)])
def test_activation_type_is_the_files_and_recorded(which, dtype, request):
    from onnx import numpy_helper
    path = request.getfixturevalue(which)
    model = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zero_points = [n.input[2] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(inits[z].dtype == dtype for z in zero_points)
    record = onnx_quantization(read_onnx_props(path))
    assert record["activations"] == f"{np.dtype(dtype).name} asymmetric calibrated"


def test_attention_internals_and_the_input_layer_stay_float(static):
    model = onnx.load(static)
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        dequantized = [made_by.get(i) == "DequantizeLinear" for i in node.input]
        if "/attn/" in node.name and not any(p in node.name for p in ("qkv", "proj")):
            assert not any(dequantized), node.name  # q k^T, P v, iRPE table products
        else:
            assert all(dequantized), node.name  # linear layers: int8 input and weight
    first = next(n for n in model.graph.node if n.op_type == "Conv")
    assert first.input[0] == "images"  # the image is not quantised


@pytest.mark.parametrize("which", ["static", "static_uint8", "dynamic"])
def test_quantised_file_runs_without_the_library_close_to_fp32(fp32, which, request):
    path = request.getfixturevalue(which)
    x = _images(read_onnx_spec_of(fp32))
    ref, got = _run(fp32, x), _run(path, x)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 15 / 16
    assert 0 < np.abs(got - ref).max() < 0.5 * np.abs(ref).max()  # changed, but not much


def read_onnx_spec_of(path: Path):
    from irpe.artifact.contract import read_onnx_spec
    return read_onnx_spec(path)


@pytest.mark.parametrize("which", ["static", "static_uint8", "dynamic"])
def test_library_fuses_every_attention_block_of_a_quantised_file(ort_library, fp32, which,
                                                                 request):
    path = request.getfixturevalue(which)
    session, how = create_session(path, custom_ops="on", library=ort_library, quiet=True)
    _, how32 = create_session(fp32, custom_ops="on", library=ort_library, quiet=True)
    assert how.attention == how32.attention == BLOCKS
    assert how.q_layout == how32.q_layout
    x = _images(read_onnx_spec_of(fp32), 8)
    functions = _run(path, x)
    fused = session.run(None, {"images": x})[0]
    assert (fused.argmax(-1) == functions.argmax(-1)).all()
    assert np.abs(fused - functions).max() < 0.05 * np.abs(functions).max()


def test_calibration_from_a_folder_of_images(fp32, tmp_path):
    from irpe.data.shapes import render_classification
    folder = tmp_path / "calib" / "sub"
    folder.mkdir(parents=True)
    for k in range(5):
        render_classification(3, k, 64, "train")[0].save(folder / f"{k}.png")
    out = tmp_path / "folder.onnx"
    record = quantize(fp32, out, QuantizeSettings(calibration=str(tmp_path / "calib"),
                                                  samples=4, batch=3))
    assert record["calibration"] == str(tmp_path / "calib") and record["samples"] == 4
    x = _images(read_onnx_spec_of(fp32), 4)
    assert np.isfinite(_run(out, x)).all()


def test_calibration_feeds_use_the_models_preprocessing(fp32):
    spec = read_onnx_spec_of(fp32)
    feeds = calibration_feeds(spec, "shapes", samples=10, batch=4)
    assert [f["images"].shape for f in feeds] == [(4, 3, 64, 64)] * 2 + [(2, 3, 64, 64)]
    image = feeds[0]["images"][0]
    assert -3 < image.min() < 0 < image.max() < 3  # normalised, not 0..255


@pytest.mark.parametrize("argv, message", [
    (["--calibration", "{tmp}/missing"], "calibration set not found"),
    ([], "static quantisation needs --calibration"),
    (["--calibration", "{tmp}/empty"], "no images"),
    (["--calibration", "shapes", "--samples", "0"], "must be >= 1"),
    (["--calibration", "shapes", "--activations", "uint8", "--target", "tensorrt"],
     "uint8 activations are for static quantisation for ONNX Runtime"),
    (["--mode", "dynamic", "--activations", "uint8"], "uint8 activations are for static"),
    (["--calibration", "shapes", "--activations", "int4"], "invalid choice"),
])
def test_bad_input_is_one_line_and_writes_nothing(fp32, tmp_path, argv, message):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out.onnx"
    done = _cli("quantize", str(fp32), "-o", str(out),
                *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 or "usage:" in done.stderr
    assert not out.exists()


def test_quantising_twice_or_a_non_onnx_file_is_refused(static, tmp_path):
    done = _cli("quantize", str(static), "-o", str(tmp_path / "x.onnx"), "--mode", "dynamic")
    assert done.returncode == 2 and "already quantised (int8)" in done.stderr
    bogus = tmp_path / "bogus.onnx"
    bogus.write_bytes(b"not a model")
    done = _cli("quantize", str(bogus), "--mode", "dynamic")
    assert done.returncode == 2 and done.stderr.startswith("irpe quantize: error:")


def test_validate_reports_the_quantised_file_against_pytorch_fp32(static, tmp_path):
    report = tmp_path / "r.json"
    done = _cli("validate", str(static), "-n", "8", "--runtime", "onnxruntime", "--custom-ops",
                "off", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["precision"] == "int8" and data["atol"] == 0.5
    assert data["metrics"]["top1_agreement"] >= 7 / 8
    assert 0 < data["outputs"]["logits"]["max_abs"] < 0.5
    from export.validate import validate
    strict = validate(static, num_inputs=4, custom_ops="off", precision="fp32",
                      runtime="onnxruntime")
    assert not strict["passed"] and strict["failed_outputs"] == ["logits"]  # not fp32-exact


def test_eval_runs_a_quantised_file_within_half_a_point_of_fp32(fp32, static, tmp_path):
    top1 = {}
    for name, path in (("fp32", fp32), ("int8", static)):
        out = tmp_path / f"{name}.json"
        done = _cli("eval", str(path), "--data", "shapes", "--shapes-val", "200", "--json",
                    str(out))
        assert done.returncode == 0, done.stderr
        top1[name] = json.loads(out.read_text())["metrics"]["top1"]
    assert top1["fp32"] > 95  # the trained demo model
    assert abs(top1["int8"] - top1["fp32"]) <= 0.5, top1


def test_eval_of_an_onnx_file_matches_pytorch_on_the_same_images(fp32):
    from torch.utils.data import DataLoader

    from irpe.data.datasets import ShapesClassification
    from irpe.training.cli import load_for_eval
    from irpe.training.evaluate import evaluate_classification
    net, spec = load_for_eval(str(fp32))
    model, _ = load_for_eval(str(DEMO))
    data = ShapesClassification(40, 0, 64, spec.transform(), split="val")
    got = evaluate_classification(net, DataLoader(data, batch_size=16))
    want = evaluate_classification(model, DataLoader(data, batch_size=16))
    assert got["top1"] == want["top1"] and got["loss"] == pytest.approx(want["loss"], abs=1e-4)


def test_tensorrt_target_has_symmetric_activations_and_float_biases(fp32, tmp_path):
    from onnx import numpy_helper
    out = tmp_path / "trt.onnx"
    record = quantize(fp32, out, QuantizeSettings(samples=8, target=Target.TENSORRT))
    assert record["target"] == "tensorrt"
    model = onnx.load(out)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dq_inputs = [n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert all(inits[name].dtype != np.int32 for name in dq_inputs if name in inits)
    zero_points = [n.input[2] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(not inits[z].any() for z in zero_points)


def test_detr_quantised_file_agrees_on_labels_and_boxes(tmp_path):
    from export.validate import validate
    detr = export_onnx(str(DEMO.with_name("detr_shapes_irpe.safetensors")), tmp_path / "d.onnx")
    out = tmp_path / "d.int8.onnx"
    quantize(detr, out, QuantizeSettings(samples=8, batch=4))
    report = validate(out, num_inputs=4, custom_ops="off", runtime="onnxruntime")
    assert report["precision"] == "int8" and report["passed"], report["failed_metrics"]
    assert report["metrics"]["label_agreement"] >= 0.9
    assert 0 < report["metrics"]["box_l1_max"] <= 0.05


def test_eval_of_a_missing_or_corrupt_onnx_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    for path, message in ((tmp_path / "nope.onnx", "file not found"),
                          (bad, "not a readable ONNX file")):
        done = _cli("eval", str(path), "--data", "shapes", "--shapes-val", "4")
        assert done.returncode == 2 and message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
