"""The ``irpe`` commands run in process through the real entry point: bad input is a one-line
error with exit status 2 that names the problem, and the documented behaviour otherwise."""
from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from irpe.cli import main


def _run(capsys, *argv) -> tuple:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line(err: str, command: str) -> None:
    assert err.startswith(f"irpe {command}: error: ") and err.count("\n") == 1, err


# ---- a TensorRT engine on a machine without CUDA ----

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_engine_without_gpu_is_a_one_line_usage_error(tmp_path, capsys):
    from irpe.errors import CLIError, GPURequired
    from irpe.runtime.tensorrt.runner import TRTRunner
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"ftrt" + bytes(60))  # passes the magic check, then needs CUDA
    code, out, err = _run(capsys, "validate", str(engine), "-n", "2")
    assert code == 2 and out == ""
    _one_line(err, "validate")
    assert "need a CUDA GPU" in err
    with pytest.raises(GPURequired) as info:
        TRTRunner(engine)
    assert isinstance(info.value, CLIError) and isinstance(info.value, RuntimeError)


# ---- repository files without models, or not YAML/TOML at all ----

def test_serve_refuses_a_repository_without_models(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("models: []\n")
    code, out, err = _run(capsys, "serve", str(empty), "--prepare", "--log-level", "error")
    assert code == 2 and out == ""  # the demo models are not served instead
    _one_line(err, "serve")
    assert f"no models in {empty}" in err and "--demo" in err


@pytest.mark.parametrize("name,reason", [("star.png", "expected .yaml, .yml or .toml"),
                                         ("star.yaml", "not UTF-8 text")])
def test_serve_names_a_binary_file_as_not_a_repository(tmp_path, capsys, name, reason):
    path = tmp_path / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    code, _, err = _run(capsys, "serve", str(path))
    assert code == 2
    _one_line(err, "serve")
    assert f"{path} is not a YAML/TOML repository file ({reason})" in err


# ---- train run folders, eval arguments ----

TRAIN = ("train", "cls", "--model", "deit_shapes_irpe", "--data", "shapes", "--epochs", "1",
         "--batch-size", "4", "--shapes-train", "4", "--shapes-val", "4", "--threads", "1",
         "--device", "cpu", "--no-progress")


def test_train_refuses_a_non_empty_output_unless_forced(tmp_path, capsys):
    run = tmp_path / "c1"
    run.mkdir()
    (run / "log.jsonl").write_text('{"epoch": 99}\n')
    (run / "notes.txt").write_text("mine")
    code, out, err = _run(capsys, *TRAIN, "--output", str(run))
    assert code == 2 and out == ""
    _one_line(err, "train")
    assert "is not empty; pass --resume" in err and "--force" in err
    assert (run / "log.jsonl").read_text() == '{"epoch": 99}\n'  # untouched
    code, out, _ = _run(capsys, *TRAIN, "--output", str(run), "--force")
    assert code == 0 and "done: best" in out
    lines = (run / "log.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["epoch"] == 1  # a fresh log, not appended
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own files are removed
    mode = stat.S_IMODE(os.stat(run / "model.safetensors").st_mode)
    assert mode == stat.S_IMODE(os.stat(run / "last.pt").st_mode)  # not mkstemp's 0600


def test_train_output_that_is_a_file_and_resume_into_a_full_folder(tmp_path, capsys):
    from irpe.training.cli import _check_output
    (tmp_path / "f").write_text("x")
    code, _, err = _run(capsys, *TRAIN, "--output", str(tmp_path / "f"))
    assert code == 2 and "exists and is not a directory" in err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.pt").write_bytes(b"state")
    _check_output(str(tmp_path / "run"), str(tmp_path / "run" / "last.pt"), False)  # allowed
    assert (tmp_path / "run" / "last.pt").read_bytes() == b"state"


def test_eval_path_like_names_and_json_folder_fail_first(tmp_path, capsys):
    code, _, err = _run(capsys, "eval", str(tmp_path / "nope.safetensors"))
    assert code == 2 and f"file not found: {tmp_path / 'nope.safetensors'}" in err
    code, _, err = _run(capsys, "eval", "nope.safetensors")
    assert code == 2 and "file not found: nope.safetensors" in err
    code, _, err = _run(capsys, "eval", "deit_nope")
    assert code == 2 and "unknown model 'deit_nope'" in err
    missing = tmp_path / "no" / "x.json"
    code, out, err = _run(capsys, "eval", "deit_shapes_irpe", "--json", str(missing))
    assert code == 2 and out == ""  # refused before any image is evaluated
    _one_line(err, "eval")
    assert "folder" in err and "not found" in err


# ---- unknown model names: suggestions within the family ----

@pytest.mark.parametrize("name,family", [("deit_nope", "deit_"), ("detr_shape", "detr_"),
                                         ("deit_smal", "deit_")])
def test_unknown_model_suggests_the_same_family_first(capsys, name, family):
    code, _, err = _run(capsys, "info", name)
    assert code == 2
    _one_line(err, "info")
    hint = err.split("did you mean ", 1)[1].rstrip("?\n").split(", ")
    assert hint and all(h.startswith(family) for h in hint), hint
    code, _, err = _run(capsys, "info", "zzz")
    assert code == 2 and "see `irpe models`" in err


# ---- self-check image sizes ----

@pytest.mark.parametrize("size,fit", [("7", "16"), ("40", "32")])
def test_check_refuses_sizes_off_the_patch_grid(capsys, size, fit):
    code, out, err = _run(capsys, "check", "--img-size", size)
    assert code == 2 and out == ""
    _one_line(err, "check")
    assert f"--img-size {size} is not a multiple of" in err and f"(try {fit})" in err
    with pytest.raises(SystemExit) as info:  # argparse: usage line + error, status 2
        main(["check", "--img-size", "0"])
    assert info.value.code == 2 and "must be >= 1" in capsys.readouterr().err


# ---- build-engine height/width ranges on a fixed-size classifier ----

def test_build_engine_refuses_height_for_a_classifier(tmp_path, capsys):
    import onnx
    from onnx import helper
    graph = helper.make_graph([], "g", [], [])
    model = helper.make_model(graph)
    for key, value in (("irpe.task", "classification"), ("irpe.model_name", "deit_shapes_irpe")):
        model.metadata_props.add(key=key, value=value)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    code, _, err = _run(capsys, "build-engine", str(path), "--height", "32")
    assert code == 2
    _one_line(err, "build-engine")
    assert "--height: deit_shapes_irpe takes a fixed input size" in err
    assert not (tmp_path / "m.engine").exists()


# ---- self-check of a detector ----

@pytest.mark.parametrize("name", ["detr_tiny_irpe", "detr_shapes_irpe"])
def test_check_on_a_detector_passes_every_step(name, capsys):
    torch.set_num_threads(1)
    code = main(["check", "--model", name, "--batch", "1", "--img-size", "64", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "6 passed, 0 failed" in out, out  # main: 3 of 6 FAIL
    assert "pred_logits (1, " in out and "padded pair" in out
