"""irpe.idcache: the bucket-id cache is one process-wide LRU bounded by bytes, shared by every
iRPE module and device, limited from the environment, exact under threads and many grid sizes."""
import threading

import pytest
import torch

from irpe.bucket import bucket_ids
from irpe.idcache import BUCKET_IDS, DEFAULT_MIB, TensorLRU, limit_from_env
from irpe.models import create_model


def _t(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64)  # n * 8 bytes


def test_lru_evicts_least_recently_used_by_bytes():
    cache = TensorLRU(100)
    for key in "abc":
        cache.get_or_build(key, lambda: _t(4))  # 32 bytes each: 96
    assert cache.nbytes == 96 and len(cache) == 3
    cache.get_or_build("a", lambda: pytest.fail("cached"))  # touch a: b is now the oldest
    cache.get_or_build("d", lambda: _t(4))
    assert set(cache._items) == {"a", "c", "d"} and cache.nbytes == 96 and cache.evictions == 1
    big = cache.get_or_build("e", lambda: _t(20))  # 160 bytes > limit: returned, not kept
    assert big.numel() == 20 and "e" not in cache._items and cache.nbytes == 96
    cache.set_limit(40)
    assert list(cache._items) == ["d"] and cache.nbytes == 32
    cache.set_limit(0)
    assert len(cache) == 0 and cache.nbytes == 0
    assert cache.get_or_build("f", lambda: _t(1)).numel() == 1 and len(cache) == 0
    with pytest.raises(ValueError):
        cache.set_limit(-1)


def test_lru_is_consistent_under_threads():
    cache, start = TensorLRU(10_000), threading.Barrier(4)

    def work(offset: int) -> None:
        start.wait()
        for i in range(300):
            cache.get_or_build((i + offset) % 50, lambda: _t(10))

    threads = [threading.Thread(target=work, args=(k * 7,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.nbytes == 80 * len(cache) <= 10_000 and len(cache) == 50


@pytest.mark.parametrize("text,mib", [("", DEFAULT_MIB), ("1.5", 1.5), ("0", 0)])
def test_limit_from_env(monkeypatch, text, mib):
    monkeypatch.setenv("IRPE_BUCKET_CACHE_MIB", text)
    assert limit_from_env() == int(mib * 2 ** 20)


@pytest.mark.parametrize("text", ["lots", "-3", "nan"])
def test_limit_from_env_bad_values_warn(monkeypatch, text):
    monkeypatch.setenv("IRPE_BUCKET_CACHE_MIB", text)
    with pytest.warns(UserWarning, match="IRPE_BUCKET_CACHE_MIB"):
        assert limit_from_env() == DEFAULT_MIB << 20


def test_detector_over_many_sizes_stays_under_the_limit_and_exact():
    torch.set_num_threads(1)
    model = create_model("detr_shapes_irpe").eval()
    sizes = [(64 + 32 * i, 96 + 32 * (i % 3)) for i in range(8)]  # 8 distinct feature grids
    images = {s: torch.randn(1, 3, *s) for s in sizes}
    limit = BUCKET_IDS.max_bytes
    BUCKET_IDS.clear()
    try:
        with torch.inference_mode():
            full = {s: model(x)["pred_boxes"] for s, x in images.items()}
            assert BUCKET_IDS.nbytes > 20_000  # every grid kept under the default limit
            BUCKET_IDS.set_limit(20_000)
            for s, x in images.items():
                assert torch.equal(model(x)["pred_boxes"], full[s])  # evicted ids rebuilt
                assert BUCKET_IDS.nbytes <= 20_000
        assert BUCKET_IDS.evictions > 0
        assert bucket_ids("product", 2.0, 3, 3) is bucket_ids("product", 2.0, 3, 3)
    finally:
        BUCKET_IDS.set_limit(limit)


def test_device_copies_share_the_bounded_cache():
    """Ids for another device (CUDA in serving; the meta device here) are cached in the same
    LRU, keyed by device, and counted in its bytes."""
    from irpe.rpe import iRPE
    rpe = iRPE(8, 2, "contextual", "product", 1.9, skip=1)
    cpu = rpe.bucket_ids(1 + 12, 3, 4)
    meta = rpe.bucket_ids(1 + 12, 3, 4, device=torch.device("meta"))
    assert meta.device.type == "meta" and meta.shape == cpu.shape == (13, 13)
    assert rpe.bucket_ids(1 + 12, 3, 4, device=torch.device("meta")) is meta
    assert rpe.bucket_ids(1 + 12, 3, 4, device=torch.device("cpu")) is cpu
    keys = [k for k in BUCKET_IDS._items if k[-1] == torch.device("meta")]
    assert len(keys) == 1 and BUCKET_IDS.nbytes >= 2 * 13 * 13 * 8
