"""Defects a first GPU run would hit, shown on CPU where a CPU can show them (issue 27):
captured CUDA graphs own the bucket ids they read and capture one at a time; the fused kernels'
variant families launch (CPU interpreter). tests/gpu collecting without the serving stack:
tests/test_gpu_check.py. GPU halves: tests/gpu/test_gpu_defects.py, test_fused_variants_gpu.py."""
from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import torch

from irpe import RPEConfig
from irpe.idcache import BUCKET_IDS, TensorLRU
from serve.backends.cuda_graphs import GraphedClassifier
from tests.fused_common import needs_triton
from tests.helpers import tiny_deit
from tools.fused_variants import FAMILIES, variants


def test_lru_holding_keeps_what_was_read_past_eviction():
    cache = TensorLRU(1 << 20)
    with cache.holding() as held:
        a = cache.get_or_build("a", lambda: torch.arange(10))
        again = cache.get_or_build("a", lambda: torch.zeros(1))  # a hit is held once
        b = cache.get_or_build("b", lambda: torch.arange(5))
    cache.get_or_build("c", lambda: torch.arange(3))  # outside the block: not held
    assert again is a and len(held) == 2 and held[0] is a and held[1] is b
    refs = [weakref.ref(t) for t in held]
    del a, again, b
    cache.clear()
    gc.collect()
    assert all(r() is not None for r in refs)  # only ``held`` keeps them now
    del held
    gc.collect()
    assert all(r() is None for r in refs)


def test_lru_holding_is_per_thread_and_nests():
    cache = TensorLRU(1 << 20)
    other = []
    with cache.holding() as outer:
        worker = threading.Thread(target=lambda: other.append(
            cache.get_or_build("x", lambda: torch.ones(2))))
        worker.start()
        worker.join()
        with cache.holding() as inner:
            y = cache.get_or_build("y", lambda: torch.ones(3))
    assert outer == [y] and inner == [y] and other  # the thread's read went to neither


class _EagerGraphs(GraphedClassifier):
    """GraphedClassifier with its CUDA steps replaced by eager calls, so the owner logic
    (holding, buckets, the capture lock) runs on CPU; ``in_capture`` counts overlaps."""

    active = 0
    overlaps = 0

    def _prepare(self):
        pass

    def _warm(self, static):
        self.forward(static)

    def _capture(self, static):
        type(self).active += 1
        type(self).overlaps += type(self).active > 1
        time.sleep(0.02)  # a capture takes time: a second one must wait, not overlap
        out = self.forward(static)
        type(self).active -= 1
        return None, out

    def _finish(self):
        pass


@pytest.fixture
def model():
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    return tiny_deit(cfg)[0]


def test_graph_owner_holds_the_bucket_ids_its_capture_read(model):
    BUCKET_IDS.clear()
    with torch.inference_mode():
        owner = _EagerGraphs(model, (3, 40, 40), torch.float32, torch.device("cpu"), 2)
    cached = list(BUCKET_IDS._items.values())
    assert cached and set(owner.graphs) == {1, 2}
    for captured in owner.graphs.values():
        assert captured.held and all(any(t is c for c in cached) for t in captured.held)
    refs = [weakref.ref(t) for c in owner.graphs.values() for t in c.held]
    del cached, captured
    BUCKET_IDS.clear()  # what an eviction does
    gc.collect()
    assert all(r() is not None for r in refs)
    del owner
    gc.collect()
    assert all(r() is None for r in refs)


def test_captures_are_serialised_across_threads(model):
    _EagerGraphs.active = _EagerGraphs.overlaps = 0
    errors = []

    def load():
        try:
            with torch.inference_mode():
                _EagerGraphs(model, (3, 40, 40), torch.float32, torch.device("cpu"), 4)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _EagerGraphs.overlaps == 0


def test_variant_families_cover_every_switch():
    names = [v.name for v in variants()]
    assert len(names) == len(set(names)) == 3 * len(FAMILIES)
    switches = [f.switches() for f in FAMILIES]
    for key in ("HAS_TK", "HAS_TQ", "HAS_V", "HAS_MASK", "ID_TABLE"):
        assert {s[key] for s in switches} == {True, False}, key
    assert {s["NID"] for s in switches} == {1, 2}
    assert {f.backward for f in FAMILIES} == {True, False}


@needs_triton
@pytest.mark.parametrize("name", ["qkv_mask-fp16", "cross_qkv-bf16", "bwd_qkv_mask-fp32"])
def test_variant_smoke_on_the_interpreter(interpret, name):
    from tests.gpu.variant_smoke import smoke
    variant = next(v for v in variants() if v.name == name)
    assert smoke(variant, "cpu", head_dim=16) >= 0.0

