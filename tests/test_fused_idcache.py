"""The fused path's bucket ids live in the process's one id cache (irpe.idcache.BUCKET_IDS):
shared by layers, bounded by its byte limit, readable by torch.compile when warm."""
import pytest
import torch

from irpe.attention import RPEAttention, rpe_attention, unfused_attention
from irpe.fused import set_fused_attention, set_fused_ids
from irpe.idcache import BUCKET_IDS
from irpe.rpe import get_rpe_config
from tests.fused_common import check, inputs, modules, needs_triton

pytestmark = needs_triton


def _fused_keys():
    return [key for key in BUCKET_IDS._items if key[0] == "fused"]


@pytest.mark.parametrize("id_mode", ["table", "matrix"])
def test_fused_ids_are_entries_of_the_shared_cache(interpret, id_mode):
    """One entry per (id mode, methods, grid, device), counted in the cache's bytes, reused by
    the next call; evicted (limit 0 keeps nothing) the ids are rebuilt and the result is equal."""
    set_fused_ids(id_mode)
    mods = modules("product", "qkv", skip=1)
    q, k, v = inputs(1, 2, 1 + 12, 16)
    limit = BUCKET_IDS.max_bytes
    BUCKET_IDS.clear()
    try:
        first = rpe_attention(q, k, v, 0.25, *mods, 3, 4)
        keys = _fused_keys()
        assert len(keys) == 1 and keys[0][1] == id_mode and keys[0][3] == (3, 4, 1)
        ids = BUCKET_IDS.peek(keys[0])
        side = (2 * 3 - 1) * (2 * 4 - 1) + 1 if id_mode == "table" else 13
        assert ids.dtype == torch.int32 and ids.shape[-1] == side
        assert BUCKET_IDS.nbytes >= ids.numel() * 4
        hits = BUCKET_IDS.hits
        again = rpe_attention(q, k, v, 0.25, *mods, 3, 4)
        assert BUCKET_IDS.hits > hits and BUCKET_IDS.peek(keys[0]) is ids
        BUCKET_IDS.set_limit(0)
        assert not _fused_keys() and BUCKET_IDS.nbytes == 0
        uncached = rpe_attention(q, k, v, 0.25, *mods, 3, 4)
        assert not _fused_keys()
        assert torch.equal(first, again) and torch.equal(first, uncached)
        check(first, unfused_attention(q, k, v, 0.25, *mods, 3, 4), torch.float32)
    finally:
        BUCKET_IDS.set_limit(limit)


def test_ids_cached_under_inference_mode_serve_a_training_step(interpret):
    """Ids first built inside torch.inference_mode (serving, evaluation) are normal tensors:
    a later forward + backward with autograd saves them without error."""
    BUCKET_IDS.clear()
    mods = modules("product", "qkv", skip=1)
    q, k, v = (t.requires_grad_() for t in inputs(1, 2, 1 + 16, 16))
    with torch.inference_mode():
        rpe_attention(q.detach(), k.detach(), v.detach(), 0.25, *mods, 4, 4)
    assert _fused_keys() and not any(BUCKET_IDS.peek(key).is_inference()
                                     for key in _fused_keys())
    rpe_attention(q, k, v, 0.25, *mods, 4, 4).square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_compile_reads_warm_ids_without_graph_break(interpret):
    """Warm cache (an eager call first): torch.compile(fullgraph) reads the cached ids, no
    graph break, and the compiled output equals eager."""
    torch._dynamo.reset()
    try:
        attn = RPEAttention(32, 2, rpe_config=get_rpe_config(1.9, "product", "ctx", True, 1,
                                                             "qkv")).eval()
        x = torch.randn(1, 10, 32)
        eager = attn(x)
        assert _fused_keys()
        explain = torch._dynamo.explain(attn)(x)
        assert explain.graph_break_count == 0, explain.break_reasons
        check(torch.compile(attn, backend="eager", fullgraph=True)(x), eager, torch.float32)
    finally:
        torch._dynamo.reset()


def test_bad_fused_id_mode_is_refused():
    with pytest.raises(ValueError, match="unknown fused id mode 'rows'"):
        set_fused_ids("rows")
    set_fused_attention(None)
