"""`irpe export NAME` looks the model registry up once and does not read the written file back;
`irpe build-engine` reads the ONNX file once (counted through real exports and commands)."""
from __future__ import annotations

import os
from typing import List

import onnx
import pytest
import torch

from irpe.artifact.contract import MIN_OPSET, read_onnx_props
from irpe.artifact.trained import default_spec
from irpe.cli import main
from irpe.models import registry
from irpe.models.registry import model_info


class _CountingRegistry(dict):
    """The registry's dict, recording every name looked up in it."""

    def __init__(self, entries) -> None:
        super().__init__(entries)
        self.lookups: List[str] = []

    def __getitem__(self, name):
        self.lookups.append(name)
        return super().__getitem__(name)


@pytest.fixture
def lookups(monkeypatch) -> List[str]:
    counting = _CountingRegistry(registry._REGISTRY)
    monkeypatch.setattr(registry, "_REGISTRY", counting)
    return counting.lookups


@pytest.fixture
def loads(monkeypatch) -> List[str]:
    """Paths of every ONNX file onnx.load reads (read_onnx_props and friends go through it)."""
    seen: List[str] = []
    real = onnx.load

    def counting(f, *args, **kwargs):
        seen.append(os.fspath(f))
        return real(f, *args, **kwargs)
    monkeypatch.setattr(onnx, "load", counting)
    monkeypatch.setattr(onnx, "load_model", counting)
    return seen


def _summary(path, props, inline: bool = False) -> str:
    """The line `irpe export` printed before it stopped reading the file back."""
    return (f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {props['irpe.model_name']}, "
            f"opset {props['irpe.opset']}, rpe nodes {props['irpe.rpe_nodes']}"
            f"{' (inlined)' if inline else ''}, weights {props['irpe.weights']}\n")


def test_export_bundled_name_one_lookup_no_reread(lookups, loads, tmp_path, capsys):
    out = tmp_path / "shapes.onnx"
    assert main(["export", "deit_shapes_irpe", "-o", str(out), "-q"]) == 0
    assert lookups == ["deit_shapes_irpe"] and loads == []
    assert capsys.readouterr().out == _summary(out, read_onnx_props(out))


def test_export_name_with_checkpoint_one_lookup(lookups, loads, tmp_path, capsys):
    """A plain checkpoint (no spec inside): defaults spec + build from the one registry entry."""
    from safetensors.torch import save_file
    model = default_spec("deit_shapes_irpe").build()
    weights = tmp_path / "plain.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    lookups.clear()
    out = tmp_path / "ckpt.onnx"
    assert main(["export", "deit_shapes_irpe", "--checkpoint", str(weights), "-o", str(out),
                 "--opset", str(MIN_OPSET), "--inline", "-q"]) == 0
    assert lookups == ["deit_shapes_irpe"] and loads == []
    props = read_onnx_props(out)
    assert props["irpe.weights"] == f"checkpoint:{weights}"
    assert props["irpe.opset"] == str(MIN_OPSET)
    assert capsys.readouterr().out == _summary(out, props, inline=True)


def test_random_weights_build_looks_up_once(lookups):
    """The random-weights route of load_source: spec and model from one registry entry."""
    from export.source import load_source
    with pytest.warns(UserWarning, match="RANDOM"):
        src = load_source("detr_tiny_irpe")
    assert lookups == ["detr_tiny_irpe"] and src.weights == "random:seed=0"
    assert isinstance(src.model, torch.nn.Module) and src.spec.task == "detection"


def test_spec_build_refuses_another_models_entry():
    spec = default_spec("deit_shapes_irpe")
    with pytest.raises(ValueError, match="detr_tiny_irpe given for a deit_shapes_irpe spec"):
        spec.build(info=model_info("detr_tiny_irpe"))


def _metadata_only(path, **props) -> str:
    """An ONNX file with an empty graph and these irpe metadata_props (build-engine reads them
    before it needs a TensorRT module)."""
    from onnx import helper
    model = helper.make_model(helper.make_graph([], "g", [], []))
    for key, value in props.items():
        model.metadata_props.add(key=f"irpe.{key}", value=value)
    onnx.save(model, path)
    return str(path)


def test_build_engine_reads_the_file_once_before_building(loads, tmp_path, capsys):
    """Detection: the fixed-size check and the default ranges share one read; the bad width
    range is refused before any TensorRT module is needed."""
    path = _metadata_only(tmp_path / "d.onnx", task="detection", model_name="detr_tiny_irpe",
                          preprocess='{"min_size": 64, "max_size": 96}')
    code = main(["build-engine", path, "--height", "32,64,96", "--width", "96,64,32"])
    assert code == 2 and "width needs min <= opt <= max" in capsys.readouterr().err
    assert loads == [path] and not (tmp_path / "d.engine").exists()


def test_build_engine_classifier_height_refused_after_one_read(loads, tmp_path, capsys):
    path = _metadata_only(tmp_path / "c.onnx", task="classification",
                          model_name="deit_shapes_irpe")
    code = main(["build-engine", path, "--height", "32"])
    assert code == 2 and "deit_shapes_irpe takes a fixed input size" in capsys.readouterr().err
    assert loads == [path]
