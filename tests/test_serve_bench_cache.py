"""`irpe bench serve` caches ONNX exports under serve's demo cache key: a weights file whose
spec (or weights, or the model / exporter code) changed is exported again, never reused stale."""
import onnx
import pytest
import torch

from benchmarks.serve_bench import model_config, onnx_file
from irpe.artifact.trained import default_spec, read_spec, save_trained
from irpe.models import create_model
from serve.demo import onnx_cache_path

NAME = "deit_shapes_irpe"


def _save(path, labels):
    torch.manual_seed(0)
    save_trained(create_model(NAME, num_classes=len(labels)).eval(), str(path),
                 default_spec(NAME, labels, num_classes=len(labels)))


def _labels(path):
    return read_spec(str(path))[0].class_names


def test_changed_spec_gives_a_new_onnx_file(tmp_path):
    weights = tmp_path / "model.safetensors"
    _save(weights, [f"a{i}" for i in range(10)])
    first = onnx_file(weights, tmp_path)
    assert first == onnx_cache_path(weights, tmp_path) and first.parent == tmp_path / "onnx"
    stamp = first.stat().st_mtime_ns
    assert onnx_file(weights, tmp_path) == first and first.stat().st_mtime_ns == stamp  # reused
    _save(weights, [f"b{i}" for i in range(10)])  # same file name and tensors, new spec
    second = onnx_file(weights, tmp_path)
    assert second != first and first.is_file() and second.is_file()
    onnx.checker.check_model(str(second))
    meta = {p.key: p.value for p in onnx.load(str(second)).metadata_props}
    assert "b0" in str(meta) and "a0" not in str(meta), meta.keys()
    assert _labels(weights)[0] == "b0"


def test_model_config_points_at_the_keyed_export(tmp_path):
    """torch backend: the weights file itself; onnxruntime: the keyed export of it."""
    torch_cfg = model_config(NAME, "torch", tmp_path, 4)
    assert torch_cfg.path.suffix == ".safetensors" and not (tmp_path / "onnx").exists()
    ort_cfg = model_config(NAME, "onnxruntime", tmp_path, 4)
    assert ort_cfg.path == onnx_cache_path(torch_cfg.path, tmp_path) and ort_cfg.path.is_file()


def test_missing_weights_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        onnx_file(tmp_path / "nothing.safetensors", tmp_path)
    assert not (tmp_path / "onnx").exists()


def test_int8_serves_the_export_quantised_for_openvino_once(tmp_path):
    """--precision int8: the keyed export quantised by NNCF into an IR beside it, made once and
    served as it is (precision left to the file)."""
    pytest.importorskip("nncf")
    cfg = model_config(NAME, "openvino", tmp_path, 4, precision="int8")
    assert cfg.path.name.endswith(".int8.xml") and cfg.path.is_file() and cfg.precision is None
    stamp = cfg.path.stat().st_mtime_ns
    assert model_config(NAME, "openvino", tmp_path, 4, precision="int8").path.stat() \
        .st_mtime_ns == stamp  # reused


def test_int8_on_another_backend_is_one_line(capsys):
    from irpe.cli import main
    assert main(["bench", "serve", "--backend", "onnxruntime", "--precision", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--precision int8 runs on --backend openvino" in err, err
