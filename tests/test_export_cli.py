"""`irpe export` / `irpe validate` / `irpe build-engine` on the command line: output and the
one-line errors with exit status 2."""
from __future__ import annotations

import pytest

from irpe import RPEConfig
from irpe.artifact.trained import save_trained
from irpe.cli import main
from tests.helpers import tiny_deit


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
    assert "tiny.onnx" in captured.out and "(inlined)" in captured.out and "opset 17" in captured.out
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
