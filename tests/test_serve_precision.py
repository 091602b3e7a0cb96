"""Per-model precision of the torch backend: config errors for combinations that cannot run,
bf16 checked against fp32 at warmup (figure logged; past the tolerance the model fails to
load), outputs back in fp32; uint8 batches normalised in the backend give the float path's
outputs exactly."""
from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from irpe.data.transforms import load_image
from serve.backends import torch_backend
from serve.config import ModelConfig
from serve.metrics import Metrics
from serve.model import ServedModel
from tests.helpers import ROOT, decoded, serve_batches, shape_png


@pytest.mark.parametrize("options,message", [
    ({"precision": "fp16"}, "precision fp16 is not supported on cpu"),
    ({"precision": "bf16", "backend": "onnxruntime", "path": "m.onnx"},
     "onnxruntime runs the ONNX file in the precision it was exported in"),
    ({"precision": "fp16", "backend": "tensorrt", "device": "cuda", "path": "m.engine"},
     "irpe build-engine --precision"),
    ({"cuda_graphs": True}, "cuda_graphs needs backend torch and device cuda"),
    ({"cuda_graphs": True, "backend": "onnxruntime", "device": "cuda", "path": "m.onnx"},
     "cuda_graphs needs"),
    ({"precision": "fp64"}, "precision"),
    ({"instances": 0}, "instances"),
    # a backend that cannot run the file's kind, and options of another backend
    ({"backend": "onnxruntime", "path": "m.xml"}, "m.xml is an OpenVINO IR: it runs on openvino, "
     "not on onnxruntime \\(ONNX Runtime reads the exported .onnx\\)"),
    ({"backend": "onnxruntime"}, "m.safetensors is a trained model: it runs on torch, not on "
     "onnxruntime \\(export it first"),
    ({"backend": "onnxruntime", "path": "m.onnx", "ov_threads": 2, "ov_streams": 1},
     "ov_threads, ov_streams: these are settings of the openvino backend; this model runs on "
     "onnxruntime"),
    ({"backend": "openvino", "path": "m.onnx", "providers": ["CPUExecutionProvider"]},
     "providers: it is a setting of the onnxruntime backend; this model runs on openvino"),
])
def test_config_refuses_what_cannot_run(options, message):
    with pytest.raises(ValidationError, match=message):
        ModelConfig(**{"name": "m", "path": "m.safetensors", **options})


def test_default_precision_by_device():
    assert ModelConfig(name="m", path="x").run_precision() == "fp32"
    assert ModelConfig(name="m", path="x", device="cuda").run_precision() == "fp16"
    assert ModelConfig(name="m", path="x", device="cuda:1", precision="fp32").run_precision() \
        == "fp32"
    assert ModelConfig(name="m", path="x.onnx", backend="onnxruntime", device="cuda") \
        .run_precision() == "fp32"


def _inputs(cfg: ModelConfig, blobs):
    return [p[0] for p in decoded(ServedModel(cfg, Metrics()), blobs)]


def test_bf16_checked_against_fp32_at_warmup_and_close_to_fp32(cls_file, caplog):
    caplog.set_level(logging.INFO, logger="irpe.serve")
    cfg = ModelConfig(name="f", path=cls_file)
    images = _inputs(cfg, [shape_png(i) for i in range(4)])
    fp32, (out32,) = serve_batches(cfg, images)
    bf16, (out16,) = serve_batches(ModelConfig(name="b", path=cls_file, precision="bf16"), images)
    assert out16, bf16.error
    checks = [r for r in caplog.records if r.getMessage() == "precision check"]
    assert len(checks) == 1 and checks[0].precision == "bf16"
    assert 0 < checks[0].rel_error <= checks[0].tolerance == 5e-2
    a, b = (np.stack([r["logits"] for r in out]) for out in (out32, out16))
    assert b.dtype == np.float32 and a.shape == b.shape
    assert np.abs(a - b).max() <= 5e-2 * max(1.0, np.abs(a).max())
    assert bf16.backend.dtype == torch.bfloat16
    assert bf16.describe()["precision"] == "bf16"


def test_precision_past_tolerance_fails_the_model(cls_file, monkeypatch):
    monkeypatch.setitem(torch_backend.PRECISION_TOLERANCE, "bf16", 0.0)
    model, _ = serve_batches(ModelConfig(name="b", path=cls_file, precision="bf16"))
    assert model.state == "failed"
    assert "bf16 outputs differ from fp32 by" in model.error and "tolerance 0" in model.error


@pytest.mark.parametrize("task", ["cls", "det"])
def test_uint8_batches_give_the_float_path_outputs(files, task):
    cfg = ModelConfig(name="m", path=files[task], max_batch_size=4)
    sizes = (64, 96, 80) if task == "det" else (64, 64, 64)
    blobs = [shape_png(i, size) for i, size in enumerate(sizes)]
    uint8 = _inputs(cfg, blobs)
    assert all(a.dtype == np.uint8 for a in uint8)
    model = ServedModel(cfg, Metrics())
    floats = [model.preprocess(load_image(b)).numpy() for b in blobs]
    _, (u8, f32) = serve_batches(cfg, uint8, floats)
    for a, b in zip(u8, f32, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_cli_precision_error_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "irpe", "serve", "--demo", "--backend",
                           "torch", "--precision", "fp16", "--prepare"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "precision fp16 is not supported on cpu" in lines[0], proc.stderr
