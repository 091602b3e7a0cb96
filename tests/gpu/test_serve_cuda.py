"""Serving on CUDA: fp16 checked vs fp32, CUDA graphs vs eager, uint8 normalised on the device,
nvJPEG decode vs the CPU path (bounded difference, same geometry), and the CUDA benchmarks.

Needs a CUDA device and the serving stack (fastapi, pydantic: ../shared/gpu/fetch-wheels.sh on
the lent machine); torchvision for the nvJPEG test."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
pytest.importorskip("fastapi", reason="serving stack not installed (fetch-wheels.sh)")

from serve.config import ModelConfig  # noqa: E402
from serve.metrics import Metrics  # noqa: E402
from serve.model import ServedModel  # noqa: E402
from tests.helpers import jpeg_photo, serve_batches, shape_png  # noqa: E402


def _floats(cfg: ModelConfig, blobs):
    from irpe.data.transforms import load_image
    pre = ServedModel(cfg.model_copy(update={"device": "cpu", "precision": "fp32"}),
                      Metrics()).preprocess
    return [pre(load_image(b)).numpy() for b in blobs]


def test_fp16_default_on_cuda_checked_and_close_to_fp32(cls_file, caplog):
    caplog.set_level(logging.INFO, logger="irpe.serve")
    cfg = ModelConfig(name="c", path=cls_file, device="cuda")
    assert cfg.run_precision() == "fp16"
    images = _floats(cfg, [shape_png(i) for i in range(4)])
    half, (out16,) = serve_batches(cfg, images)
    _, (out32,) = serve_batches(cfg.model_copy(update={"device": "cpu"}), images)
    check = [r for r in caplog.records if r.getMessage() == "precision check"]
    assert half.ready and check and check[0].rel_error <= check[0].tolerance
    a, b = (np.stack([r["logits"] for r in o]) for o in (out32, out16))
    assert b.dtype == np.float32 and np.abs(a - b).max() <= 2e-2 * max(1.0, np.abs(a).max())


def test_cuda_graphs_match_eager(cls_file, caplog):
    caplog.set_level(logging.INFO, logger="irpe.serve")
    cfg = ModelConfig(name="g", path=cls_file, device="cuda", max_batch_size=8)
    images = _floats(cfg, [shape_png(i) for i in range(3)])  # batch 3 -> bucket 4
    _, (eager,) = serve_batches(cfg, images)
    _, (replayed,) = serve_batches(cfg.model_copy(update={"cuda_graphs": True}), images)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cuda graphs")]
    assert said in (["cuda graphs captured"], ["cuda graphs not captured; running eager"])
    for a, b in zip(eager, replayed, strict=True):
        np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-2, atol=1e-2)


def test_uint8_normalised_on_device_equals_host(files):
    for key in ("cls", "det"):
        cfg = ModelConfig(name="m", path=files[key], device="cuda", precision="fp32")
        blobs = [shape_png(i, 64 + 16 * i) for i in range(3)]
        model = ServedModel(cfg.model_copy(update={"gpu_decode": False}), Metrics())
        uint8 = [p[0] for p in model.prepare(blobs)]
        _, (dev, host) = serve_batches(cfg, uint8, _floats(cfg, blobs))
        for a, b in zip(dev, host, strict=True):
            for name in a:
                np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task", ["classification", "detection"])
def test_nvjpeg_decode_matches_cpu_path_within_bound(task):
    pytest.importorskip("torchvision")
    from irpe.data.transforms import Preprocess
    from serve.nvjpeg import available, decode_on_device
    from serve.preprocess_pool import decode_u8
    assert available("cuda")
    pre = Preprocess() if task == "classification" else Preprocess(task="detection",
                                                                   min_size=200, max_size=333)
    blobs = [jpeg_photo(451, 300), jpeg_photo(300, 451), jpeg_photo(1024, 768)]
    gpu = decode_on_device(blobs, pre, "cuda")
    assert gpu is not None
    for blob, (pixels, size) in zip(blobs, gpu, strict=True):
        cpu, cpu_size = decode_u8(blob, pre)
        assert size == cpu_size and tuple(pixels.shape) == cpu.shape
        assert pixels.device.type == "cuda" and pixels.dtype == torch.uint8
        diff = (pixels.cpu().int() - torch.from_numpy(cpu).int()).abs().float()
        assert diff.mean() <= 2.0 and diff.max() <= 32, (diff.mean(), diff.max())
    png = shape_png(0)
    assert decode_on_device([blobs[0], png], pre, "cuda") is None  # any non-JPEG: CPU path


def test_bench_models_cuda_rows(tmp_path):
    from irpe.cli import main
    assert main(["bench", "models", "--device", "cuda", "--quick", "--models", "deit_tiny",
                 "--backends", "eager,cudagraph", "--precisions", "fp32,fp16,bf16",
                 "--batches", "2", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("bench_models*.json")).read_text())
    eager = [r for r in doc["results"] if r["backend"] == "eager"]
    assert {r["precision"] for r in eager} == {"fp32", "fp16", "bf16"}
    assert all("error" not in r and r["peak_mb"] > 0 for r in eager)
    assert any(r["backend"] == "cudagraph" for r in doc["results"])


def test_bench_serve_cuda_quick(tmp_path):
    from irpe.cli import main
    assert main(["bench", "serve", "--quick", "--backend", "torch", "--device", "cuda",
                 "--concurrency", "1,4", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("bench_serve*.json")).read_text())
    modes = [r["mode"] for r in doc["results"]]
    assert "closed x8" in modes and doc["settings"]["image"] == "jpeg"
    assert all(r.get("errors", {}) == {} for r in doc["results"])
