"""Artifact checks before use (irpe/artifact/filecheck.py): safetensors, ONNX and TensorRT engine
files that are missing, empty, truncated or of another kind give one clear error, through every
loader that reads them (serving, `irpe validate` / build-engine, the TensorRT runner)."""
from __future__ import annotations

import struct
from pathlib import Path

import onnx
import pytest

from irpe.artifact.contract import read_onnx_spec
from irpe.artifact.filecheck import ArtifactError, ArtifactMissing, check_file
from irpe.artifact.trained import read_spec
from irpe.cli import main
from irpe.runtime.tensorrt.runner import TRTRunner

VTRT = b"vtrt" + bytes(12)  # TensorRT-RTX header: tag, 12 bytes, u64 total size at offset 16


def _engine_bytes(size: int, declared: int) -> bytes:
    return VTRT + struct.pack("<Q", declared) + bytes(size - 24)


@pytest.fixture(scope="module")
def samples(tmp_path_factory, cls_file):
    """Valid files of each kind (a real engine when TensorRT-RTX is importable)."""
    folder = tmp_path_factory.mktemp("artifacts")
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    onnx.save(model, folder / "m.onnx")
    (folder / "m.engine").write_bytes(_real_engine() or _engine_bytes(64, 64))
    return {"safetensors": cls_file, "onnx": folder / "m.onnx", "engine": folder / "m.engine"}


def _real_engine() -> bytes:
    """A one-layer engine built ahead of time with TensorRT-RTX, or b'' without it."""
    try:
        import tensorrt_rtx_bindings as trt
    except ImportError:
        return b""
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    net = builder.create_network(0)
    x = net.add_input("x", trt.float32, (1, 4))
    net.mark_output(net.add_activation(x, trt.ActivationType.RELU).get_output(0))
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    return bytes(builder.build_serialized_network(net, config))


def test_valid_files_pass(samples):
    for kind, path in samples.items():
        check_file(path, kind)


@pytest.mark.parametrize("kind", ["safetensors", "onnx", "engine"])
def test_missing_and_empty_files(tmp_path, kind):
    with pytest.raises(ArtifactMissing, match="not found"):
        check_file(tmp_path / "none", kind)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ArtifactError, match="is not a readable .*: empty file"):
        check_file(tmp_path / "empty", kind)


@pytest.mark.parametrize("kind,source,match", [
    ("onnx", "engine", "no ModelProto .* looks like a TensorRT engine"),
    ("onnx", "safetensors", "no ModelProto .* looks like a safetensors file"),
    ("engine", "onnx", "no engine magic tag .* looks like an ONNX file"),
    ("engine", "safetensors", "no engine magic tag .* looks like a safetensors file"),
    ("safetensors", "onnx", "header length .* does not fit"),
])
def test_a_file_of_another_kind_is_named(samples, tmp_path, kind, source, match):
    path = tmp_path / f"swapped.{kind}"
    path.write_bytes(Path(samples[source]).read_bytes())
    with pytest.raises(ArtifactError, match=match):
        check_file(path, kind)


def test_truncated_engine_and_safetensors_header(samples, tmp_path):
    data = samples["engine"].read_bytes()
    (tmp_path / "cut.engine").write_bytes(data[: len(data) - 7])
    with pytest.raises(ArtifactError, match=f"header says {len(data)} bytes, the file has "
                       f"{len(data) - 7}"):
        check_file(tmp_path / "cut.engine", "engine")
    (tmp_path / "cut.safetensors").write_bytes(Path(samples["safetensors"]).read_bytes()[:100])
    with pytest.raises(ArtifactError, match="header length"):
        check_file(tmp_path / "cut.safetensors", "safetensors")


def test_loaders_use_the_check(samples, tmp_path):
    (tmp_path / "e.onnx").write_bytes(samples["engine"].read_bytes())
    with pytest.raises(ValueError, match="looks like a TensorRT engine"):
        read_onnx_spec(tmp_path / "e.onnx")
    with pytest.raises(ArtifactError, match="looks like an ONNX file"):
        TRTRunner(samples["onnx"])  # checked before the CUDA requirement
    with pytest.raises(ArtifactError, match="looks like an ONNX file"):
        read_spec(str(samples["onnx"]))


def test_serving_and_validate_refuse_a_wrong_kind_with_one_line(samples, tmp_path, capsys):
    bad = tmp_path / "m.onnx"
    bad.write_bytes(Path(samples["safetensors"]).read_bytes())
    (tmp_path / "r.yaml").write_text(f"models: [{{name: m, path: {bad}, "
                                     "backend: onnxruntime}]\n")
    assert main(["serve", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irpe serve: error: ") and err.count("\n") == 1
    assert "not a readable ONNX file: no ModelProto" in err
    assert main(["validate", str(bad)]) == 2
    assert "looks like a safetensors file" in capsys.readouterr().err
