"""The GPU halves of issue 27's defects, compared on outputs (`make gpu-check` runs them as its
probes): a replay after the bucket-id cache dropped the graph's ids == eager; two owners
capturing at once while a third thread allocates and copies == eager; two served instances
with CUDA graphs both capture; the nvJPEG batch under a deliberately busy default stream ==
the same batch on a quiet stream (to 1e-5) and == the PIL path within NVJPEG_TOLERANCE.
CPU halves: tests/test_gpu_readiness.py."""
from __future__ import annotations

import importlib
import logging
import threading

import numpy as np
import pytest
import torch

from irpe import RPEConfig
from irpe.fused import set_fused_attention
from irpe.idcache import BUCKET_IDS
from serve.backends.cuda_graphs import GraphedClassifier
from tests.helpers import jpeg_photo, tiny_deit

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
DEV = torch.device("cuda")
ITEM = (3, 40, 40)  # tiny_deit's input
# nvJPEG vs PIL decode differ by rounding (tests/gpu/test_serve_cuda.py bounds the pixels: mean
# <= 2, max <= 32 levels): logits may differ by this much relative to max(1, max |PIL logits|)
NVJPEG_TOLERANCE = 5e-2


def _importable(*names: str) -> bool:
    try:
        for name in names:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - missing, or a build that cannot load here
        return False
    return True


SERVING = _importable("fastapi", "pydantic")
needs_serving = pytest.mark.skipif(not SERVING, reason="serving stack not installed "
                                   "(carry the wheels of ../shared/gpu/fetch-wheels.sh)")


@pytest.fixture(autouse=True)
def _restore():
    yield
    set_fused_attention(None)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    return tiny_deit(cfg)[0].to(DEV)


@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_replay_after_bucket_id_eviction_equals_eager(mode):
    """The ids the capture read are evicted and their memory handed to zero-filled tensors
    (valid ids, wrong ones) before the replay: only held ids keep the replay right."""
    set_fused_attention(mode)
    model, x = _model(), torch.randn(3, *ITEM, device=DEV)
    BUCKET_IDS.clear()
    with torch.inference_mode():
        eager = model(x)
        graphs = GraphedClassifier(model, ITEM, torch.float32, DEV, 4)
        before = graphs(x)
        shapes = [(t.shape, t.dtype) for t in BUCKET_IDS._items.values() if t.is_cuda]
        assert shapes, "the forward read no CUDA bucket ids from the cache"
        BUCKET_IDS.clear()
        fillers = [torch.zeros(s, dtype=d, device=DEV) for s, d in shapes for _ in range(4)]
        torch.cuda.synchronize()
        after = graphs(x)
        torch.cuda.synchronize()
    assert fillers
    torch.testing.assert_close(before, eager, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(after, eager, rtol=1e-4, atol=1e-5)  # zero ids: far off


def _busy_allocator(stop: threading.Event, errors: list) -> None:
    """What another instance's load does meanwhile: new device memory, synchronous copies."""
    try:
        keep = []
        while not stop.is_set():
            keep.append(torch.randn(1 << 18).to(DEV))
            keep[-1].cpu()
            keep = keep[-64:]
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def test_two_owners_capture_concurrently_and_replay_equal_eager():
    models, x = [_model(0), _model(1)], torch.randn(2, *ITEM, device=DEV)
    owners, errors, stop = [None, None], [], threading.Event()

    def capture(i: int) -> None:
        try:
            with torch.inference_mode():
                owners[i] = GraphedClassifier(models[i], ITEM, torch.float32, DEV, 8)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    noise = threading.Thread(target=_busy_allocator, args=(stop, errors))
    noise.start()
    loads = [threading.Thread(target=capture, args=(i,)) for i in range(2)]
    for t in loads:
        t.start()
    for t in loads:
        t.join()
    stop.set()
    noise.join()
    assert not errors, errors
    with torch.inference_mode():
        for model, owner in zip(models, owners, strict=True):
            torch.testing.assert_close(owner(x), model(x), rtol=1e-4, atol=1e-5)


@needs_serving
def test_two_served_instances_both_capture_and_match_eager(cls_file, caplog):
    from serve.config import ModelConfig
    from tests.helpers import serve_batches
    caplog.set_level(logging.INFO, logger="irpe.serve")
    cfg = ModelConfig(name="g2", path=cls_file, device="cuda", precision="fp32",
                      max_batch_size=4, instances=2)
    images = [np.random.default_rng(i).standard_normal((3, 64, 64), dtype=np.float32)
              for i in range(3)]
    _, (eager,) = serve_batches(cfg, images)
    caplog.clear()
    model, (replayed,) = serve_batches(cfg.model_copy(update={"cuda_graphs": True}), images)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cuda graphs")]
    assert model.state != "failed" and said == ["cuda graphs captured"] * 2, said
    for a, b in zip(eager, replayed, strict=True):
        np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-4, atol=1e-4)


@needs_serving
@pytest.mark.skipif(not _importable("torchvision"), reason="no torchvision")
def test_nvjpeg_batch_under_a_busy_stream_equals_pil_path(cls_file):
    """serve.model stacks the decoded images on the worker's current stream; the backend
    normalises on its own: with the default stream held busy, only an ordered read is right."""
    from serve.config import ModelConfig
    from serve.metrics import Metrics
    from serve.model import ServedModel
    cfg = ModelConfig(name="j", path=cls_file, device="cuda", precision="fp32",
                      max_batch_size=4)
    model = ServedModel(cfg, Metrics(), threads=1)
    assert model.gpu_decode, "nvJPEG path not enabled (torchvision.io.decode_jpeg on CUDA)"
    model.backends[0].load()
    blobs = [jpeg_photo(451, 300), jpeg_photo(300, 451), jpeg_photo(640, 480)]
    on_gpu = model.prepare(blobs)
    assert all(isinstance(p.image, torch.Tensor) and p.image.is_cuda for p in on_gpu)
    quiet = model._run_batch(0, on_gpu)
    flipped = on_gpu[::-1]  # stale memory would hold the old order
    torch.cuda._sleep(int(1e9))  # ~0.5 s of GPU time queued ahead of the stack
    busy = model._run_batch(0, flipped)[::-1]
    cpu = _cpu_only(model).prepare(blobs)
    pil = model._run_batch(0, cpu)
    model.backends[0].close()
    # (not bitwise: a V-term scatter may use atomics)
    for q, b, p in zip(quiet, busy, pil, strict=True):
        np.testing.assert_allclose(b["logits"], q["logits"], rtol=1e-5, atol=1e-5)
        limit = NVJPEG_TOLERANCE * max(1.0, float(np.abs(p["logits"]).max()))
        assert np.abs(b["logits"] - p["logits"]).max() <= limit


def _cpu_only(model):
    """The same served model with the GPU decode off (the PIL path of ``prepare``)."""
    import copy
    other = copy.copy(model)
    other.gpu_decode = False
    return other
