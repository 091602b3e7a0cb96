"""Device-independent parts of the GPU benchmarks: which (backend, precision) runs where, how a
precision is applied, CUDA-graph buckets, and the multi-image request body of bench serve
(accepted by a real server)."""
from __future__ import annotations

import httpx
import pytest
import torch

from benchmarks import models_bench as mb
from benchmarks.serve_bench import jpeg, request_body
from serve.backends.cuda_graphs import buckets
from serve.config import ServeSettings
from tests.helpers import running_server


def test_backend_precision_support_by_device():
    assert mb.supported("eager", "fp16", "cuda") and not mb.supported("eager", "fp16", "cpu")
    assert mb.supported("cudagraph", "fp32", "cuda:1")
    assert not mb.supported("cudagraph", "fp32", "cpu")
    assert mb.supported("onnxruntime", "fp32", "cpu")
    assert not mb.supported("onnxruntime", "fp32", "cuda")
    assert not mb.supported("onnxruntime", "bf16", "cpu")
    jobs = mb.plan(["deit_tiny"], [1], ["eager", "cudagraph"], ["fp32", "fp16", "bf16"], True,
                   device="cpu")
    assert [(j[3], j[4]) for j in jobs] == [("eager", "fp32"), ("eager", "bf16")]
    jobs = mb.plan(["deit_tiny"], [1], ["eager", "cudagraph"], ["fp16"], True, device="cuda")
    assert [(j[3], j[4]) for j in jobs] == [("eager", "fp16"), ("cudagraph", "fp16")]
    notes = mb.skipped(["cudagraph", "onnxruntime"], ["fp16"], "cpu")
    assert notes == ["cudagraph fp16: not run (CUDA graphs need a CUDA device)",
                     "onnxruntime fp16: not run (the ONNX export is fp32; onnxruntime runs it "
                     "as exported)"]


def test_precision_is_a_cast_on_cuda_and_autocast_on_cpu():
    assert mb.cast_mode("fp32", "cuda") == "none"
    assert mb.cast_mode("fp16", "cuda") == "cast" and mb.cast_mode("bf16", "cpu") == "autocast"
    x, sizes = torch.zeros(1, 3, 4, 4), torch.tensor([[4, 4]])
    half = mb.cast_inputs((x, sizes), "fp16", "cuda")
    assert half[0].dtype == torch.float16 and half[1].dtype == sizes.dtype
    assert mb.cast_inputs((x,), "bf16", "cpu")[0].dtype == torch.float32  # autocast casts


def test_cpu_bf16_runner_keeps_the_autocast_path():
    inputs = mb._inputs("deit_tiny", 1, (224, 224), "cpu")
    out = mb.torch_runner(mb.FAMILIES["deit_tiny"]["plain"], inputs, "eager", "bf16", "cpu")()
    logits = out["logits"] if isinstance(out, dict) else out
    assert logits.shape[0] == 1 and logits.dtype == torch.bfloat16


def test_cuda_graph_buckets():
    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(12) == [1, 2, 4, 8, 12]
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        buckets(0)


def test_bench_serve_request_bodies_are_accepted(cls_file):
    image = jpeg()
    settings = ServeSettings(threads=1, max_images=8, log_level="warning",
                             models=[{"name": "c", "path": cls_file}])
    with running_server(settings) as base:
        for count in (1, 8):
            body, ctype = request_body(image, count, "image/jpeg")
            r = httpx.post(f"{base}/v1/models/c/classify?top_k=1", content=body,
                           headers={"content-type": ctype}, timeout=60)
            assert r.status_code == 200, r.text
            assert len(r.json()["results"]) == count
