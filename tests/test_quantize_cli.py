"""``irpe quantize`` as a command (issue 42): real ``irpe`` subprocesses on the demo classifier.

An interrupted run (SIGINT sent when the output's temporary appears, or after a delay) leaves
nothing or a complete, labelled int8 file, and the input byte for byte; an output that is the
input is refused before any work; option combinations the target cannot read, unknown
``--exclude`` names, files without irpe metadata and folders are one-line errors; the summary
and the metadata say what was used (images, activations); stdout holds the summary only."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from export.onnx import export_onnx
from irpe.artifact.contract import onnx_quantization, read_onnx_props

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors"
ARGV = [sys.executable, "-m", "irpe", "quantize"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(ARGV + list(argv), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    err = done.stderr.strip()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(err.splitlines()) == 1 and err.startswith("irpe quantize: error:"), err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def fp32(tmp_path_factory) -> Path:
    """The trained demo classifier (iRPE-QKV, 4 blocks) exported to ONNX."""
    return export_onnx(str(DEMO), tmp_path_factory.mktemp("qcli") / "deit.onnx")


def _images(folder: Path, count: int) -> Path:
    from irpe.data.shapes import render_classification
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        render_classification(3, k, 64, "train")[0].save(folder / f"{k}.png")
    return folder


# -- 1: the output is the input -------------------------------------------------------------

def test_an_output_that_is_the_input_is_refused_before_any_work(fp32, tmp_path):
    source = tmp_path / "same.onnx"
    source.write_bytes(fp32.read_bytes())
    link = tmp_path / "link.onnx"
    link.symlink_to(source)
    hard = tmp_path / "hard.onnx"
    os.link(source, hard)
    before = _digest(source)
    for output in (str(source), f"{tmp_path}/./same.onnx", str(link), str(hard)):
        done = _cli(str(source), "-o", output, "--mode", "dynamic")
        _one_line_error(done, "is the input", "choose another output")
        assert _digest(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.onnx", "link.onnx", "same.onnx"]


# -- 2: an interrupted run ------------------------------------------------------------------

def _start(source: Path, output: Path) -> subprocess.Popen:
    """``irpe quantize`` with SIGINT at its default (a shell's background job inherits it
    ignored: Python then installs no KeyboardInterrupt handler)."""
    return subprocess.Popen(ARGV + [str(source), "-o", str(output), "--calibration", "shapes",
                                    "--samples", "16"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _outcome(output: Path) -> str:
    """absent, complete (int8 with its quantisation record), or what is wrong with it."""
    if not output.exists():
        return "absent"
    try:
        props = read_onnx_props(output)
    except (ValueError, OSError) as exc:
        return f"unreadable: {exc}"
    if props.get("irpe.precision") != "int8" or not onnx_quantization(props):
        return "unlabelled"
    onnx.checker.check_model(onnx.load(output))
    return "complete"


def test_an_interrupted_run_leaves_nothing_or_a_complete_labelled_file(fp32, tmp_path):
    """SIGINT when the output's temporary (or, without one, the output) first appears, a few
    milliseconds later, and at fractions of a whole run's time: the output path is absent or a
    complete int8 file with irpe.precision, nothing else is left beside it, the input is
    unchanged."""
    source = tmp_path / "in" / "deit.onnx"
    source.parent.mkdir()
    source.write_bytes(fp32.read_bytes())
    before = _digest(source)
    output = tmp_path / "out" / "deit.int8.onnx"
    output.parent.mkdir()
    start = time.monotonic()
    assert _start(source, output).wait(timeout=300) == 0
    whole = time.monotonic() - start
    assert _outcome(output) == "complete"
    tries = [("appears", 0.0), ("appears", 0.01), ("appears", 0.03),
             ("delay", 0.5 * whole), ("delay", 0.9 * whole)]
    outcomes = []
    for how, wait in tries:
        output.unlink(missing_ok=True)
        proc = _start(source, output)
        begin = time.monotonic()
        if how == "appears":
            while proc.poll() is None and not (output.exists() or any(
                    p.name.startswith(f".{output.name}.tmp") for p in output.parent.iterdir())):
                if time.monotonic() - begin > 120:
                    break
                time.sleep(0.002)
        time.sleep(wait)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        outcomes.append((how, round(wait, 3), _outcome(output)))
        assert [p.name for p in output.parent.iterdir() if p.name != output.name] == []
        assert _digest(source) == before
    assert all(state in ("absent", "complete") for _, _, state in outcomes), outcomes


# -- 3: dynamic files for TensorRT ----------------------------------------------------------

def test_dynamic_mode_for_tensorrt_is_refused_before_work(fp32, tmp_path):
    out = tmp_path / "dyn.onnx"
    done = _cli(str(fp32), "-o", str(out), "--mode", "dynamic", "--target", "tensorrt")
    _one_line_error(done, "--target tensorrt is for static quantisation", "ConvInteger")
    assert not out.exists()


def test_build_engine_names_why_a_dynamic_file_cannot_be_parsed(fp32, tmp_path):
    """A dynamic int8 file (from before the refusal, or made for ONNX Runtime) is refused by
    `irpe build-engine` with the cause, before TensorRT is looked for."""
    dyn = tmp_path / "dyn.onnx"
    assert _cli(str(fp32), "-o", str(dyn), "--mode", "dynamic").returncode == 0
    done = subprocess.run([sys.executable, "-m", "irpe", "build-engine", str(dyn), "-o",
                           str(tmp_path / "x.engine")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "quantised dynamically" in done.stderr and "--target tensorrt" in done.stderr
    assert not (tmp_path / "x.engine").exists()


# -- 4: the images really used --------------------------------------------------------------

def test_summary_and_metadata_give_the_images_really_used(fp32, tmp_path):
    folder = _images(tmp_path / "seven", 7)
    out = tmp_path / "seven.onnx"
    done = _cli(str(fp32), "-o", str(out), "--calibration", str(folder), "--batch", "4")
    assert done.returncode == 0, done.stderr
    assert f"calibrated on {folder} (7 images, minmax; the folder has 7 of the 64 requested)" \
        in done.stdout
    assert onnx_quantization(read_onnx_props(out))["samples"] == 7


# -- 5: --exclude names ---------------------------------------------------------------------

def test_unknown_or_empty_exclude_is_refused_with_the_valid_names(fp32, tmp_path):
    out = tmp_path / "x.onnx"
    err = _one_line_error(_cli(str(fp32), "-o", str(out), "--mode", "dynamic",
                               "--exclude", "nope"), "'nope' is no node")
    assert "/model/head/Gemm" in err and "/model/blocks.0/mlp/fc1/MatMul" in err
    attention = "/model/blocks.0/attn/MatMul"  # q k^T: a node, float anyway
    _one_line_error(_cli(str(fp32), "-o", str(out), "--mode", "dynamic", "--exclude",
                         attention), f"'{attention}' is kept float anyway")
    _one_line_error(_cli(str(fp32), "-o", str(out), "--mode", "dynamic", "--exclude", ""),
                    "--exclude needs a node name")
    assert not out.exists()
    kept = "/model/head/Gemm"
    done = _cli(str(fp32), "-o", str(out), "--mode", "dynamic", "--exclude", kept,
                "--exclude", kept)
    assert done.returncode == 0, done.stderr
    record = onnx_quantization(read_onnx_props(out))
    assert record["excluded"] == [kept] and record["quantized_nodes"] == 19


# -- 6: what the activations are ------------------------------------------------------------

def _quantize_nodes(path: Path):
    from onnx import numpy_helper
    model = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return [(n.input[0], float(inits[n.input[1]]), inits[n.input[2]])
            for n in model.graph.node if n.op_type == "QuantizeLinear"]


def test_activations_recorded_as_they_are_and_what_uint8_changes(fp32, tmp_path):
    """Default and uint8 activations are both asymmetric with the same scales (uint8's zero
    point is int8's + 128): the metadata says so; TensorRT's are symmetric (zero point 0)."""
    files = {}
    for name, extra in (("int8", []), ("uint8", ["--activations", "uint8"]),
                        ("trt", ["--target", "tensorrt"])):
        files[name] = tmp_path / f"{name}.onnx"
        done = _cli(str(fp32), "-o", str(files[name]), "--calibration", "shapes",
                    "--samples", "8", *extra)
        assert done.returncode == 0, done.stderr
    forms = {k: onnx_quantization(read_onnx_props(p))["activations"] for k, p in files.items()}
    assert forms == {"int8": "int8 asymmetric calibrated", "uint8": "uint8 asymmetric calibrated",
                     "trt": "int8 symmetric calibrated"}
    signed, unsigned, trt = (_quantize_nodes(files[k]) for k in ("int8", "uint8", "trt"))
    assert [(t, s) for t, s, _ in signed] == [(t, s) for t, s, _ in unsigned]  # same scales
    assert all(z.dtype == np.int8 for *_, z in signed)
    assert all(u.astype(int) == z.astype(int) + 128 for (*_, z), (*_, u)
               in zip(signed, unsigned, strict=True))
    assert sum(int(z) != 0 for *_, z in signed) > len(signed) // 2  # asymmetric: not all 0
    assert all(int(z) == 0 for *_, z in trt)


# -- 7: stdout ------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_stdout_is_the_summary_line_only(fp32, tmp_path, method):
    done = _cli(str(fp32), "-o", str(tmp_path / "m.onnx"), "--calibration", "shapes",
                "--samples", "4", "--method", method)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wrote "), done.stdout
    assert f"{method})" in lines[0]


# -- 8: a bad calibration image -------------------------------------------------------------

def test_a_truncated_calibration_image_is_named(fp32, tmp_path):
    folder = _images(tmp_path / "calib", 3)
    cut = folder / "1.png"
    cut.write_bytes(cut.read_bytes()[:len(cut.read_bytes()) // 2])
    (folder / "2.png").write_text("not an image")
    out = tmp_path / "x.onnx"
    _one_line_error(_cli(str(fp32), "-o", str(out), "--calibration", str(folder)),
                    f"calibration image {cut}: cannot decode image", "truncated")
    cut.unlink()
    err = _one_line_error(_cli(str(fp32), "-o", str(out), "--calibration", str(folder)),
                          f"calibration image {folder / '2.png'}: cannot decode image")
    assert err.count(str(folder / "2.png")) == 1
    assert not out.exists()


# -- 9: folders of a failed run -------------------------------------------------------------

def test_a_failed_run_creates_no_output_folder(fp32, tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "missing" / "dir" / "out.onnx"
    _one_line_error(_cli(str(fp32), "-o", str(out), "--calibration", str(tmp_path / "empty")),
                    "no images")
    assert not (tmp_path / "missing").exists()
    done = _cli(str(fp32), "-o", str(out), "--mode", "dynamic")
    assert done.returncode == 0 and out.is_file()  # on success they are made


# -- 10: inputs that are not an exported model ----------------------------------------------

def test_foreign_onnx_files_and_folders_get_their_own_message(tmp_path):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    plain = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph), plain)
    err = _one_line_error(_cli(str(plain), "--mode", "dynamic"),
                          "is an ONNX file without irpe metadata", "irpe export")
    assert "checkpoint" not in err and "create_model" not in err
    _one_line_error(_cli(str(tmp_path), "--mode", "dynamic"),
                    f"{tmp_path} is a folder, not an ONNX file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.onnx"]


def test_summary_names_the_activations(fp32, tmp_path):
    done = _cli(str(fp32), "-o", str(tmp_path / "d.onnx"), "--mode", "dynamic")
    assert done.returncode == 0, done.stderr
    assert "activations uint8 dynamic;" in done.stdout
    record = json.loads(read_onnx_props(tmp_path / "d.onnx")["irpe.quantization"])
    assert "samples" not in record and record["activations"] == "uint8 dynamic"
