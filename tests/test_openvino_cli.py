"""`irpe validate` and `irpe eval` on OpenVINO: --runtime openvino against PyTorch fp32 (bf16
with its own tolerance where the CPU has BF16), an IR validated by its own metadata, the same
metrics as ONNX Runtime, one-line errors for options that cannot run, and without the package
one line naming the extra."""
from __future__ import annotations

import json
import os

import pytest

from irpe.artifact.contract import read_onnx_props
from irpe.artifact.openvino_ir import set_ir_props
from irpe.cli import main
from tests.helpers import BLOCKER, ROOT, export_tiny_qkv, run_python, save_untrained
from tests.openvino_common import cpu_has_bf16, needs_openvino


@pytest.fixture(scope="module")
def qkv(tmp_path_factory):
    return export_tiny_qkv(tmp_path_factory.mktemp("ov_cli"))[2]


def _one_line_error(capsys, argv, *parts):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"irpe {argv[0]}: error: "), err
    for part in parts:
        assert part in err, err
    return err


@needs_openvino
def test_validate_on_openvino_passes_at_fp32(qkv, tmp_path, capsys):
    report = tmp_path / "r.json"
    assert main(["validate", str(qkv), "--runtime", "openvino", "-n", "4", "--json",
                 str(report)]) == 0
    out = capsys.readouterr().out
    assert "on openvino " in out and "CPU: fp32, " in out and out.rstrip().endswith("PASS")
    data = json.loads(report.read_text())
    assert data["precision"] == "fp32" and data["outputs"]["logits"]["max_abs"] < 1e-4


@needs_openvino
def test_validate_bf16_has_its_own_tolerance(qkv, capsys):
    argv = ["validate", str(qkv), "--runtime", "openvino", "--precision", "bf16", "-n", "4"]
    if not cpu_has_bf16():
        _one_line_error(capsys, argv, "needs a CPU with BF16")
        return
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "CPU: bf16, " in out and "bf16 (atol 0.1, rtol 0.05)" in out and "PASS" in out


@needs_openvino
def test_an_ir_validates_on_openvino_by_its_metadata(qkv, tmp_path, capsys):
    from irpe.runtime.openvino.core import import_openvino
    from irpe.runtime.openvino.session import OvOptions, read_model
    ov = import_openvino()
    model = read_model(qkv, OvOptions(ops="off"))  # OpenVINO's own ops (the library's: its tests)
    set_ir_props(model, read_onnx_props(qkv))
    xml = tmp_path / "m.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    assert main(["validate", str(xml), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "iRPE ops: as stored in the IR" in out and "PASS" in out
    _one_line_error(capsys, ["validate", str(xml), "--runtime", "onnxruntime"],
                    "runs on openvino, not on onnxruntime")


@pytest.mark.parametrize("extra,message", [
    (["--runtime", "openvino", "--precision", "fp16"], "precision fp16: openvino runs fp32 or "
     "bf16"),
    (["--runtime", "onnxruntime", "--precision", "bf16"],
     "precision bf16 needs --runtime openvino"),
    (["--custom-ops", "on"], "--custom-ops: ONNX Runtime's options, but"),
    (["--runtime", "tensorrt"], "is an exported ONNX file: it runs on openvino or onnxruntime, "
     "not on tensorrt (build an engine from it with irpe build-engine)"),
])
def test_validate_refuses_what_cannot_run(qkv, capsys, extra, message):
    _one_line_error(capsys, ["validate", str(qkv), *extra], message)


def test_validate_runs_the_runtime_that_serves(qkv, capsys):
    """One picker: an .onnx validates on the runtime `backend: auto` serves it on (OpenVINO on
    the CPU where installed), not on another."""
    from irpe.runtime.pick import pick_runtime
    from serve.config import ModelConfig
    served = ModelConfig(name="m", path=qkv).backend
    assert served == pick_runtime(qkv) == "openvino"
    assert main(["validate", str(qkv), "-n", "2"]) == 0
    assert f"on {served} " in capsys.readouterr().out


@pytest.fixture(scope="module")
def shapes_onnx(tmp_path_factory):
    from export.onnx import export_onnx
    d = tmp_path_factory.mktemp("ov_eval")
    return str(export_onnx(save_untrained("deit_shapes_irpe", d / "c.safetensors"),
                           d / "c.onnx"))


@needs_openvino
def test_eval_on_openvino_equals_onnxruntime(shapes_onnx, tmp_path, capsys):
    argv = ["eval", shapes_onnx, "--shapes-val", "16", "--batch-size", "8", "--threads", "1"]
    metrics = []
    for extra in (["--runtime", "onnxruntime"], ["--runtime", "openvino"]):
        out = tmp_path / f"m{len(extra)}.json"
        assert main([*argv, *extra, "--json", str(out)]) == 0
        metrics.append(json.loads(out.read_text()))
    printed = capsys.readouterr().out
    assert "16 images), openvino " in printed and "CPU: fp32, threads 1" in printed
    ort_m, ov_m = (m["metrics"] for m in metrics)
    assert ov_m["top1"] == ort_m["top1"] and abs(ov_m["loss"] - ort_m["loss"]) < 1e-5
    assert metrics[1]["runtime"].startswith("openvino ")
    assert metrics[0]["runtime"].startswith("onnxruntime ")


def test_eval_refuses_openvino_options_it_cannot_use(shapes_onnx, capsys):
    _one_line_error(capsys, ["eval", "deit_shapes_irpe", "--runtime", "openvino"],
                    "--runtime / --precision run an exported .onnx, an OpenVINO IR .xml or an "
                    "engine, not deit_shapes_irpe")
    _one_line_error(capsys, ["eval", shapes_onnx.replace(".onnx", ".xml")], "file not found")
    _one_line_error(capsys, ["eval", shapes_onnx, "--runtime", "onnxruntime", "--precision",
                             "bf16"], "--precision is OpenVINO's")


def test_without_openvino_one_line_names_the_extra(qkv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
               IRPE_TEST_BLOCKED="openvino")
    done = run_python(["-m", "irpe", "validate", str(qkv), "--runtime", "openvino", "-n", "1"],
                      env=env, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err, done.stdout + done.stderr
    assert err.startswith("irpe validate: error: OpenVINO is not installed (") and \
        err.endswith("install it with pip install 'irpe-deploy[openvino]'")


def test_quantize_without_nncf_names_its_extra(qkv, tmp_path):
    """The runtime extra (the CPU image's) has no NNCF: --target openvino says which extra
    has it, in one line, and writes nothing."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
               IRPE_TEST_BLOCKED="nncf")
    out = tmp_path / "q.xml"
    done = run_python(["-m", "irpe", "quantize", str(qkv), "-o", str(out), "--target",
                       "openvino", "--calibration", "shapes"], env=env, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err, done.stdout + done.stderr
    assert err.endswith("pip install 'irpe-deploy[nncf]'") and not list(tmp_path.iterdir())
