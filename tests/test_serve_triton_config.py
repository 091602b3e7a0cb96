"""GET /v2/models/{m}/config (Triton HTTP API's model configuration) read by an unmodified
tritonclient.http: for an ONNX model it equals the config.pbtxt `irpe triton-repo` writes for the
same file and settings (both parsed with Triton's own ModelConfig schema); every answer is a
valid ModelConfig describing the model as served."""
from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as tc
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2  # Triton's schema (tritonclient[grpc], dev extra)
from tritonclient.utils import InferenceServerException

from irpe.cli import main
from serve.config import ServeSettings
from tests.helpers import running_server


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory, cls_file) -> Path:
    from export.onnx import export_onnx
    return Path(export_onnx(cls_file, tmp_path_factory.mktemp("tcfg") / "cls.onnx"))


@pytest.fixture(scope="module")
def triton(onnx_file, files):
    settings = ServeSettings(threads=1, log_level="warning", models=[
        {"name": "cls", "path": str(onnx_file), "backend": "onnxruntime", "max_batch_size": 4,
         "max_queue_delay_ms": 2.5, "instances": 2},
        {"name": "det", "path": files["det"]}])
    with running_server(settings) as base:
        yield tc.InferenceServerClient(base.split("//")[1])


def _schema(config: dict) -> model_config_pb2.ModelConfig:
    return json_format.ParseDict(config, model_config_pb2.ModelConfig())  # unknown keys raise


def test_config_equals_what_triton_repo_writes(triton, onnx_file, tmp_path):
    got = triton.get_model_config("cls")  # main: 404
    assert main(["triton-repo", str(onnx_file), "-o", str(tmp_path), "--name", "cls",
                 "--max-batch-size", "4", "--max-queue-delay-us", "2500", "--instances", "2",
                 "--kind", "cpu", "--ort-ops", "none"]) == 0
    written = text_format.Parse((tmp_path / "cls" / "config.pbtxt").read_text(),
                                model_config_pb2.ModelConfig())
    assert _schema(got) == written
    assert got["input"] == [{"name": "images", "data_type": "TYPE_FP32", "dims": [3, 64, 64]}]
    assert got["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [8],
                              "label_filename": "labels.txt"}]
    assert got["dynamic_batching"] == {"max_queue_delay_microseconds": 2500}
    assert got["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert triton.get_model_config("cls", model_version="1") == got


def test_config_of_a_torch_detector_as_served(triton):
    got = triton.get_model_config("det")
    assert _schema(got).platform == "pytorch_libtorch"
    assert (got["name"], got["max_batch_size"]) == ("det", 8)
    assert [(t["name"], t["data_type"], t["dims"]) for t in got["input"]] == [
        ("images", "TYPE_FP32", [3, -1, -1]), ("sizes", "TYPE_INT64", [2])]
    assert [(t["name"], t["dims"]) for t in got["output"]] == [("pred_logits", [16, 9]),
                                                               ("pred_boxes", [16, 4])]
    assert "label_filename" not in got["output"][0]


def test_config_of_an_unknown_model_or_version_is_404(triton):
    for name, version, message in (("nope", "", "unknown model 'nope'"),
                                   ("cls", "2", "model cls has no version '2'")):
        with pytest.raises(InferenceServerException) as info:
            triton.get_model_config(name, model_version=version)
        assert info.value.status() == "404" and message in info.value.message()
