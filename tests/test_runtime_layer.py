"""The runtime layer: one picker (irpe.runtime.pick) and one way to open a file on a runtime
(irpe.runtime.base.RuntimeFile), used by serve, validate and eval alike."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from irpe.artifact.files import file_kind, read_file_info
from irpe.cli import main
from irpe.errors import InvalidInput
from irpe.runtime.pick import onnx_runtime, open_file, pick_runtime
from tests.helpers import export_tiny_qkv
from tests.openvino_common import needs_openvino

RUNTIMES = ["onnxruntime", pytest.param("openvino", marks=needs_openvino)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, spec, path, _ = export_tiny_qkv(tmp_path_factory.mktemp("layer"))
    return model, spec, path


@pytest.mark.parametrize("name,device,runtime", [
    ("m.onnx", "cuda", "onnxruntime"), ("m.xml", "cpu", "openvino"), ("M.XML", "cpu", "openvino"),
    ("m.engine", "cuda", "tensorrt"), ("m.plan", "cpu", "tensorrt"), ("m.trt", "cpu", "tensorrt"),
    ("m.safetensors", "cpu", "torch"), ("deit_shapes_irpe", "cpu", "torch"),
])
def test_the_picker_by_kind(name, device, runtime):
    assert pick_runtime(name, device) == pick_runtime(name, device, "auto") == runtime
    assert pick_runtime(name, device, runtime) == runtime  # named: checked, kept


def test_an_onnx_file_on_the_cpu_runs_on_openvino_where_installed():
    assert pick_runtime("m.onnx") == onnx_runtime("cpu")
    assert pick_runtime("m.onnx", runtime="onnxruntime") == "onnxruntime"


@pytest.mark.parametrize("name,runtime,message", [
    ("m.xml", "onnxruntime", "m.xml is an OpenVINO IR: it runs on openvino, not on onnxruntime "
     "(ONNX Runtime reads the exported .onnx)"),
    ("m.onnx", "tensorrt", "m.onnx is an exported ONNX file: it runs on openvino or onnxruntime, "
     "not on tensorrt (build an engine from it with irpe build-engine)"),
    ("m.engine", "openvino", "m.engine is a TensorRT engine: it runs on tensorrt, not on openvino"),
    ("m.safetensors", "onnxruntime", "it runs on torch, not on onnxruntime (export it first"),
    ("m.onnx", "tvm", "runtime must be one of onnxruntime, openvino, tensorrt, torch or auto"),
])
def test_a_runtime_that_cannot_run_the_file_is_one_line(name, runtime, message):
    with pytest.raises(InvalidInput) as err:
        pick_runtime(name, "cpu", runtime)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_runtime_opens_the_file_the_same_way(tiny, runtime):
    model, spec, path = tiny
    x = torch.randn(2, 3, 40, 40)
    file = open_file(path, runtime)
    assert file.runtime == runtime and file.description.startswith(runtime)
    assert file.inputs == ("images",) and "logits" in file.outputs
    assert file.precision == "fp32" and file.spec.model_name == spec.model_name
    got = file.run(file.feeds(x.numpy()))["logits"]
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert read_file_info(path).kind == file_kind(path) == "onnx"


def _with_classes(path, target, names):
    """The file at ``path`` saved to ``target`` with ``names`` as its class list."""
    proto = onnx.load(path)
    for prop in proto.metadata_props:
        if prop.key == "irpe.class_names":
            prop.value = json.dumps(names)
    onnx.save(proto, target)
    return target


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_class_list_that_does_not_fit_the_logits_is_refused(tiny, tmp_path, runtime, capsys):
    """Defect: 2 class names for 10 logits were served as ready, every request then answered
    500 (IndexError). Now the file is refused when it is opened, by every command."""
    wrong = _with_classes(tiny[2], tmp_path / "wrong.onnx", ["a", "b"])
    with pytest.raises(InvalidInput, match="names 2 classes but its logits have 10 scores"):
        open_file(wrong, runtime)
    assert main(["validate", str(wrong), "--runtime", runtime, "-n", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "names 2 classes but its logits have 10 scores" in err
    from serve.backends import create_backend
    from serve.config import ModelConfig
    backend = create_backend(ModelConfig(name="m", path=wrong, backend=runtime))
    with pytest.raises(InvalidInput, match="the class list does not belong to this model"):
        backend.load()


@needs_openvino
def test_an_ir_with_a_wrong_class_list_is_refused(tiny, tmp_path):
    import openvino as ov

    from irpe.artifact.contract import read_onnx_props
    from irpe.artifact.openvino_ir import set_ir_props
    from irpe.runtime.openvino.session import OvOptions, read_model
    model = read_model(tiny[2], OvOptions(ops="off"))
    props = dict(read_onnx_props(tiny[2]), **{"irpe.class_names": json.dumps(["a", "b"])})
    set_ir_props(model, props)
    xml = tmp_path / "wrong.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    with pytest.raises(InvalidInput, match="names 2 classes but its logits have 10 scores"):
        open_file(xml)
