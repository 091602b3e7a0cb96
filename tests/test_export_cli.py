"""`irpe export` / `irpe validate` / `irpe build-engine` on the command line: output, the
one-line errors with exit status 2, output folders and relative paths, no temporary file left
behind, and a validated pair (file vs source) that does not match."""
from __future__ import annotations

from pathlib import Path

import pytest

from export.onnx import export_onnx
from irpe import RPEConfig
from irpe.artifact.trained import save_trained
from irpe.cli import main
from irpe.models import model_info
from irpe.models.registry import bundled_weights
from tests.helpers import tiny_deit

CFG = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="k")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = RPEConfig(ratio=1.9, method="cross", mode="ctx", shared_head=False, skip=1, on="qk")
    model, spec = tiny_deit(cfg)
    path = tmp_path_factory.mktemp("cli") / "tiny.safetensors"
    save_trained(model, str(path), spec)
    return path


def test_export_prints_progress_and_summary(trained, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["export", str(trained), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"wrote {out} (")
    assert 'rpe nodes {"RPEGather": 8}, weights trained:' in captured.out
    assert "[export] trace + convert (opset 18)" in captured.err
    assert "[export] total" in captured.err and out.is_file()


def test_export_inline_quiet_default_output(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(trained), "--inline", "-q", "--opset", "17"]) == 0
    captured = capsys.readouterr()
    assert "tiny.onnx" in captured.out and "(inlined)" in captured.out
    assert "opset 17" in captured.out
    assert captured.err == "" and (tmp_path / "tiny.onnx").is_file()


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_export_errors(capsys, tmp_path):
    err = _error(capsys, ["export", "deit_nope", "-o", str(tmp_path / "x.onnx")])
    assert err.startswith("irpe export: error: unknown model 'deit_nope'")
    err = _error(capsys, ["export", "deit_tiny_patch16_224", "--opset", "16"])
    assert "opset 16 is not supported; choose 17..20" in err
    err = _error(capsys, ["export", "detr_tiny_irpe", "--checkpoint", str(tmp_path / "no.pth")])
    assert "checkpoint not found" in err
    err = _error(capsys, ["export", str(tmp_path / "missing.safetensors")])
    assert "model file not found" in err


def test_validate_and_build_engine_errors(capsys, tmp_path):
    corrupt = tmp_path / "c.onnx"
    corrupt.write_bytes(b"garbage" * 20)
    err = _error(capsys, ["validate", str(corrupt)])
    assert err.startswith("irpe validate: error:") and "not a readable ONNX file" in err
    err = _error(capsys, ["validate", str(tmp_path / "none.onnx")])
    assert "not found" in err
    err = _error(capsys, ["build-engine", str(tmp_path / "none.onnx")])
    assert err.startswith("irpe build-engine: error: ONNX file not found")
    with pytest.raises(SystemExit):
        main(["build-engine", str(corrupt), "--batch", "1,2"])
    assert "expected MIN,OPT,MAX" in capsys.readouterr().err


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Two tiny DeiT trained-model files (input 40 and 48) in a folder; nothing exported yet."""
    d = tmp_path_factory.mktemp("cli")
    model, spec = tiny_deit(CFG)
    save_trained(model, str(d / "c40.safetensors"), spec)
    model, spec = tiny_deit(CFG, img_size=48)
    spec.preprocess["size"] = 48
    save_trained(model, str(d / "c48.safetensors"), spec)
    (d / "out").mkdir()
    return d


def _leftovers(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp"))


def test_export_into_existing_folder_then_validate_from_elsewhere(work, monkeypatch, capsys):
    monkeypatch.chdir(work)
    assert main(["export", "c40.safetensors", "-o", "out", "-q"]) == 0  # main: Errno 21
    out = capsys.readouterr().out
    assert "wrote out/c40.onnx" in out and f"weights trained:{work / 'c40.safetensors'}" in out
    assert (work / "out" / "c40.onnx").is_file() and _leftovers(work) == []
    monkeypatch.chdir(work / "out")  # the relative weights path no longer resolves from here
    assert main(["validate", "c40.onnx", "-n", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_failed_write_leaves_no_temp_file(work, tmp_path):
    model, spec = tiny_deit(CFG)
    target = tmp_path / "taken"
    target.mkdir()  # a folder where the library was told to write a file
    with pytest.raises(IsADirectoryError):
        export_onnx(model, target, spec=spec, optimize=False)
    assert _leftovers(tmp_path) == [] and list(target.iterdir()) == []


def test_text_file_as_checkpoint_is_one_line_error(work, monkeypatch, capsys):
    monkeypatch.chdir(work)
    (work / "notes.pth").write_text("my notes about the run\n")
    assert main(["export", "deit_shapes_irpe", "--checkpoint", "notes.pth", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("irpe export: error: notes.pth is not a checkpoint") and "\n" not in err
    assert _leftovers(work) == [] and not (work / "deit_shapes_irpe.onnx").exists()


@pytest.fixture(scope="module")
def c40_onnx(work):
    return str(export_onnx(str(work / "c40.safetensors"), work / "c40.onnx"))


@pytest.mark.parametrize("source,says", [
    ("c48.safetensors", "(input size: file 40x40, source 48x48)"),
    ("detector", "(task: file classification, source detection)"),
    ("deit_shapes_irpe", "(classes: file 10, source 8; input size: file 40x40, source 64x64)")])
def test_validate_mismatched_source_is_a_usage_error(work, c40_onnx, capsys, source, says):
    path = {"c48.safetensors": str(work / "c48.safetensors"),
            "detector": bundled_weights(model_info("detr_shapes_irpe"))}.get(source, source)
    assert main(["validate", c40_onnx, "--source", path, "-n", "2"]) == 2  # main: 1 + traceback
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"irpe validate: error: {c40_onnx} and source {path} do not match")
    assert says in err and "\n" not in err


def test_validate_matching_source_still_passes(work, c40_onnx, capsys):
    assert main(["validate", c40_onnx, "--source", str(work / "c40.safetensors"), "-n", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def _detector_stub(path: Path, queries: int) -> dict:
    """A real (tiny) ONNX file with a DETR's tensor names and dims, and its irpe metadata."""
    import onnx
    from onnx import TensorProto, helper

    from irpe.artifact.trained import default_spec
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "h", "w"])
    logits = helper.make_tensor_value_info("pred_logits", TensorProto.FLOAT,
                                           ["batch", queries, 9])
    graph = helper.make_graph([helper.make_node("ReduceMean", ["images"], ["pred_logits"])],
                              "stub", [x], [logits])
    props = default_spec("detr_tiny_irpe", [f"c{i}" for i in range(8)]).metadata()
    onnx.save(helper.make_model(graph), path)
    return props


def test_pair_check_names_a_detector_query_mismatch(tmp_path):
    from export.pair import check_pair
    from export.source import load_source
    with pytest.warns(UserWarning, match="RANDOM"):
        src = load_source("detr_tiny_irpe")  # 20 queries, 8 classes
    props = _detector_stub(tmp_path / "d16.onnx", 16)
    with pytest.raises(ValueError, match=r"\(queries: file 16, source 20\)"):
        check_pair(str(tmp_path / "d16.onnx"), props, src, "detr_tiny_irpe")
    check_pair(str(tmp_path / "d20.onnx"), _detector_stub(tmp_path / "d20.onnx", 20), src, "x")
