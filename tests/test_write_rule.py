"""The write rule in one place (issue 49, items 2 and 5; irpe.outputs.check_outputs): no
command writes onto a file it reads (an IR's .bin and an engine's sidecar included) or onto a
folder; an IR is never read as an .xml of one run with the .bin of another (its .xml records
the .bin's size and SHA-256, irpe.artifact.openvino_ir.write_ir); a missing or foreign .bin,
an unwritable output and options NNCF ignores are one line, exit 2.

Every command runs in-process through ``irpe.cli.main`` on copies of one exported demo
classifier and its int8 IR (one real ``irpe quantize --target openvino`` for the module)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from irpe.artifact.openvino_ir import (
    WEIGHTS_SHA256,
    WEIGHTS_SIZE,
    read_ir_props,
    set_ir_props,
    write_ir,
)
from irpe.cli import main
from irpe.errors import InvalidInput, MissingFile
from irpe.outputs import OutputIsFolder, SameFileError, check_outputs
from tests.helpers import ROOT
from tests.openvino_common import needs_openvino

pytestmark = needs_openvino
DEMO = ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors"
REPO = "models:\n  - name: ir\n    path: q.xml\n  - name: onnx\n    path: m.onnx\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Dict[str, object]:
    """w.safetensors (demo weights), m.onnx, its int8 IR q.xml + q.bin, repo.yaml serving both,
    and the summary line ``irpe quantize`` printed."""
    pytest.importorskip("nncf")
    from export.onnx import export_onnx
    folder = tmp_path_factory.mktemp("write_rule")
    shutil.copyfile(DEMO, folder / "w.safetensors")
    export_onnx(str(folder / "w.safetensors"), folder / "m.onnx")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["quantize", str(folder / "m.onnx"), "-o", str(folder / "q.xml"),
                     "--target", "openvino", "--calibration", "shapes", "--samples", "2"]) == 0
    (folder / "repo.yaml").write_text(REPO)
    return {"folder": folder, "summary": out.getvalue()}


@pytest.fixture
def work(made, tmp_path, monkeypatch) -> Path:
    """A copy of the module's files, the current folder for the test."""
    for name in ("w.safetensors", "m.onnx", "q.xml", "q.bin", "repo.yaml"):
        shutil.copyfile(made["folder"] / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _snapshot(folder: Path) -> Dict[str, str]:
    """Every entry under ``folder``: a file's SHA-256, a folder's "dir"."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))}


def _one_line_error(capsys, argv: List[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"irpe {argv[0]}: error: "), err
    assert ".tmp-" not in err, err  # the user's path, never a temporary
    for needle in needles:
        assert needle in err, err
    return err


# -- every writer: onto an input's file (companions too) or onto a folder --------------------

def _prepare_folders(work: Path) -> None:
    """Folders where a file would go, a Triton repository holding an input, a run folder."""
    for folder in ("taken", "taken.xml", "out/w.onnx", "trepo2/README.md",
                   "run2/model.safetensors"):
        (work / folder).mkdir(parents=True)
    model_dir = work / "trepo" / "deit_shapes_irpe" / "1"
    model_dir.mkdir(parents=True)
    shutil.copyfile(work / "m.onnx", model_dir / "model.onnx")
    (work / "run").mkdir()
    shutil.copyfile(work / "w.safetensors", work / "run" / "model.safetensors")
    shutil.copyfile(work / "m.onnx", work / "model.bin")  # an ONNX file with an IR's name


TRAIN = ["train", "cls", "--model", "deit_shapes_irpe", "--data", "shapes", "--epochs", "1",
         "--shapes-train", "8", "--shapes-val", "8", "--no-progress", "--device", "cpu"]
EVAL = ["--data", "shapes", "--shapes-val", "8", "--threads", "1"]
CASES = [  # (id, argv, what the line says); the defects of issue 49 named where they were
    ("export onto its weights", ["export", "w.safetensors", "-o", "w.safetensors", "-q"],
     "is the input w.safetensors"),
    ("export onto a folder", ["export", "w.safetensors", "-o", "out", "-q"], "is a folder"),
    ("quantize onto its input", ["quantize", "m.onnx", "-o", "m.onnx", "--mode", "dynamic"],
     "is the input m.onnx"),
    ("quantize onto a folder", ["quantize", "m.onnx", "-o", "taken", "--mode", "dynamic"],
     "the output taken is a folder"),
    ("defect 3: openvino .bin onto the input",
     ["quantize", "model.bin", "-o", "model.xml", "--target", "openvino", "--calibration",
      "shapes"], "the output model.bin (written with model.xml) is the input model.bin"),
    ("defect 6: openvino onto a folder, before calibration",
     ["quantize", "m.onnx", "-o", "taken.xml", "--target", "openvino", "--calibration",
      "shapes"], "the output taken.xml is a folder"),
    ("build-engine onto its input", ["build-engine", "m.onnx", "-o", "m.onnx"],
     "is the input m.onnx"),
    ("build-engine timing cache onto its input",
     ["build-engine", "m.onnx", "--timing-cache", "m.onnx"], "is the input m.onnx"),
    ("build-engine onto a folder", ["build-engine", "m.onnx", "-o", "taken"], "is a folder"),
    ("validate --json onto the model", ["validate", "m.onnx", "-n", "1", "--json", "m.onnx"],
     "is the input m.onnx"),
    ("defect 2: validate --json onto the IR's weights",
     ["validate", "q.xml", "-n", "1", "--json", "q.bin"], "is the input q.bin (read with q.xml)"),
    ("defect 6: validate --json onto a folder",
     ["validate", "m.onnx", "-n", "1", "--json", "taken"], "is a folder"),
    ("defect 2: eval --json onto the model", ["eval", "m.onnx", *EVAL, "--json", "m.onnx"],
     "is the input m.onnx"),
    ("defect 2: eval --json onto the IR's weights", ["eval", "q.xml", *EVAL, "--json", "q.bin"],
     "is the input q.bin (read with q.xml)"),
    ("defect 6: eval --json onto a folder", ["eval", "m.onnx", *EVAL, "--json", "taken"],
     "is a folder"),
    ("defect 1: --ray-config onto a served model",
     ["serve", "repo.yaml", "--ray-config", "m.onnx"], "is the input"),
    ("defect 1: --ray-config onto a served IR's weights",
     ["serve", "repo.yaml", "--ray-config", "q.bin"], "q.bin (read with"),
    ("--ray-config onto the repository", ["serve", "repo.yaml", "--ray-config", "repo.yaml"],
     "is the input"),
    ("defect 6: --ray-config onto a folder", ["serve", "repo.yaml", "--ray-config", "taken"],
     "is a folder"),
    ("train --force onto its --init",
     [*TRAIN, "--output", "run", "--init", "run/model.safetensors", "--force"],
     "the output run/model.safetensors is the input run/model.safetensors"),
    ("train onto a folder", [*TRAIN, "--output", "run2", "--force"],
     "the output run2/model.safetensors is a folder"),
    ("triton-repo replacing the folder of its input",
     ["triton-repo", "trepo/deit_shapes_irpe/1/model.onnx", "-o", "trepo", "--force", "--kind",
      "cpu", "--ort-ops", "none"], "would replace the input trepo/deit_shapes_irpe/1/model.onnx"),
    ("triton-repo onto a folder", ["triton-repo", "m.onnx", "-o", "trepo2", "--force", "--kind",
                                   "cpu", "--ort-ops", "none"], "trepo2/README.md is a folder"),
]


@pytest.mark.parametrize("argv, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_no_writer_writes_onto_an_input_or_a_folder(work, capsys, argv, needle):
    _prepare_folders(work)
    before = _snapshot(work)
    _one_line_error(capsys, argv, needle)
    assert _snapshot(work) == before


def test_check_outputs_expands_companions_and_follows_links(tmp_path):
    (tmp_path / "m.xml").write_text("<net/>")
    (tmp_path / "m.bin").write_bytes(b"w")
    (tmp_path / "link.bin").symlink_to(tmp_path / "m.bin")
    (tmp_path / "e.engine").write_bytes(b"plan")
    for output, inputs in ((tmp_path / "link.bin", [tmp_path / "m.xml"]),
                           (tmp_path / "m.xml", [tmp_path / "link.bin"]),
                           (tmp_path / "e.engine.json", [tmp_path / "e.engine"])):
        with pytest.raises(SameFileError, match="is the input"):
            check_outputs([output], [None, inputs[0]])
    with pytest.raises(OutputIsFolder):
        check_outputs([tmp_path], [])
    check_outputs([tmp_path / "n.xml", tmp_path / "r.json"], [tmp_path / "m.xml"])


# -- defect 4: an IR is never an .xml of one run with the .bin of another ---------------------

def _tiny(value: float):
    """A one-layer model (x * value) whose .bin holds ``value``: two of them differ only there."""
    import openvino as ov
    import openvino.opset13 as ops
    x = ops.parameter([1, 4], np.float32, name="x")
    model = ov.Model([ops.multiply(x, ops.constant(np.full([1, 4], value, np.float32)))], [x])
    set_ir_props(model, {"irpe.value": str(value)})
    return model


def _read(xml: Path) -> str:
    """What a reader gets: "old", "new", "refused" (one clear error), or "mixed" (an .xml read
    with weights that are not its own)."""
    import openvino as ov
    try:
        props = read_ir_props(xml)
    except (InvalidInput, MissingFile) as exc:
        assert "do not belong to" in str(exc) or "are missing" in str(exc), exc
        return "refused"
    got = ov.Core().compile_model(str(xml), "CPU")(np.ones([1, 4], np.float32))[0][0, 0]
    if props["irpe.value"] != str(float(got)):
        return "mixed"
    return {"1.0": "old", "2.0": "new"}[props["irpe.value"]]


@pytest.mark.parametrize("stop, outcome", [(1, "old"), (2, "old"), (3, "old"), (4, "refused"),
                                           (5, "new")])
def test_an_ir_write_stopped_at_any_rename_reads_old_new_or_refused(tmp_path, monkeypatch, stop,
                                                                    outcome):
    """write_ir renames: the staged .bin and .xml to their temporaries (1, 2), the .bin into
    place (3), the .xml last (4). A KeyboardInterrupt raised by the Nth rename (as a kill would
    stop the process there: SIGINT itself is held across 3 and 4) leaves the old IR, or the new
    .bin beside the old .xml, which the .xml's record refuses; never a silent mix."""
    xml = tmp_path / "m.xml"
    write_ir(_tiny(1.0), xml)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == stop:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with contextlib.suppress(KeyboardInterrupt):
        write_ir(_tiny(2.0), xml)
    monkeypatch.setattr(os, "replace", real)
    assert len(calls) == min(stop, 4)
    assert _read(xml) == outcome
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin", "m.xml"]  # no temporaries


def test_a_ctrl_c_during_the_ir_renames_waits_for_both(tmp_path, monkeypatch):
    xml = tmp_path / "m.xml"
    write_ir(_tiny(1.0), xml)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # the .bin's move into place: the .xml's is still to come
            signal.raise_signal(signal.SIGINT)
        real(src, dst)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    monkeypatch.setattr(os, "replace", replace)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_ir(_tiny(2.0), xml)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(os, "replace", real)
    assert _read(xml) == "new"


def test_an_ir_without_the_record_still_loads(tmp_path):
    import openvino as ov
    ov.save_model(_tiny(1.0), str(tmp_path / "old.xml"), compress_to_fp16=False)
    assert WEIGHTS_SIZE not in read_ir_props(tmp_path / "old.xml")
    assert _read(tmp_path / "old.xml") == "old"


def test_an_ir_with_another_runs_weights_is_one_line(work, capsys):
    """The quantised IR's .bin replaced by a file of the same size: before, it loaded and
    answered with foreign weights; now every reader refuses it."""
    props = read_ir_props(work / "q.xml")
    assert props[WEIGHTS_SIZE] == str(os.path.getsize(work / "q.bin"))
    assert props[WEIGHTS_SHA256] == hashlib.sha256((work / "q.bin").read_bytes()).hexdigest()
    data = bytearray((work / "q.bin").read_bytes())
    data[-1] ^= 0xFF
    (work / "q.bin").write_bytes(bytes(data))
    _one_line_error(capsys, ["validate", "q.xml", "-n", "1"],
                    "the IR's weights q.bin do not belong to q.xml (written by another run?)")


# -- defect 5: an IR whose .bin is missing ----------------------------------------------------

@pytest.mark.parametrize("argv", [["validate", "q.xml", "-n", "1"], ["eval", "q.xml", *EVAL],
                                  ["serve", "repo.yaml", "--prepare"]],
                         ids=["validate", "eval", "serve --prepare"])
def test_an_ir_without_its_weights_is_one_line(work, capsys, argv):
    (work / "q.bin").unlink()
    _one_line_error(capsys, argv, "q.bin are missing", "q.xml cannot load without them")


# -- defect 6: a write the system refuses names the user's path -------------------------------

@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_unwritable_output_names_the_target_not_a_temporary(work, capsys):
    _one_line_error(capsys, ["serve", "repo.yaml", "--ray-config", "/proc/x.yaml"],
                    "cannot write /proc/x.yaml")


# -- defect 9: irpe quantize's summary, options and order of checks ---------------------------

def test_the_quantize_summary_counts_the_ir_weights(made):
    folder = made["folder"]
    size = (os.path.getsize(folder / "q.xml") + os.path.getsize(folder / "q.bin")) / 1e6
    assert str(made["summary"]).startswith(f"wrote {folder / 'q.xml'} ({size:.1f} MB): ")


def test_quantize_refuses_batch_for_openvino_and_names_a_missing_input_first(work, capsys):
    _one_line_error(capsys, ["quantize", "m.onnx", "--target", "openvino", "--calibration",
                             "shapes", "--batch", "4"], "--batch are for the ONNX Runtime")
    _one_line_error(capsys, ["quantize", "nope.onnx"], "not found: nope.onnx")
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["w.safetensors", "m.onnx", "q.xml", "q.bin", "repo.yaml"])


def test_quantize_help_says_both_targets(capsys):
    with pytest.raises(SystemExit):
        main(["quantize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "OpenVINO IR" in text and "<model>.int8.xml" in text
