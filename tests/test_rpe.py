"""iRPE modules: config parsing, official parameter layout, efficient == naive O(L^2 d)."""
import itertools

import pytest
import torch
from reference import naive_rpe

from irpe import RPEConfig, build_rpe, get_rpe_config, iRPECross, set_traceable
from irpe.attention import RPEAttention
from irpe.fused import set_fused_attention

METHODS = {"euc": 2.5, "quant": 2.0, "cross": 1.9, "product": 1.9}


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    return module


def _naive(module, x, height, width):
    if isinstance(module, iRPECross):
        return _naive(module.rp_rows, x, height, width) + _naive(module.rp_cols, x, height, width)
    ids = module.bucket_ids(x.shape[2], height, width)
    heads = x.shape[1]
    expanded = module if module.num_heads == heads else _Heads(module, heads)
    return naive_rpe(expanded, x, ids)


class _Heads:  # a read-only view of a shared-head module with its table repeated per head
    def __init__(self, module, heads):
        self.mode, self.transposed = module.mode, module.transposed
        for name in ("lookup_table_bias", "lookup_table_weight"):
            if hasattr(module, name):
                t = getattr(module, name)
                setattr(self, name, t.expand(heads, *t.shape[1:]))


CASES = [(m, mode, shared, on) for m, mode, shared, on in itertools.product(
    METHODS, ["bias", "contextual"], [True, False], "qkv") if not (mode == "bias" and on == "v")]


@pytest.mark.parametrize("method,mode,shared,on", CASES)
@pytest.mark.parametrize("grid", [(3, 4, 1), (4, 3, 0), (2, 5, 2)])
def test_efficient_equals_naive(method, mode, shared, on, grid):
    height, width, skip = grid
    cfg = get_rpe_config(ratio=METHODS[method], method=method, mode=mode, shared_head=shared,
                         skip=min(skip, 1), rpe_on=on)
    heads, head_dim, batch = 3, 8, 2
    module = _randomize(dict(zip("qkv", build_rpe(cfg, head_dim, heads), strict=True))[on]).double()
    length = skip + height * width
    if on == "v":
        x = torch.rand(batch, heads, length, length, dtype=torch.float64).softmax(-1)
    else:
        x = torch.randn(batch, heads, length, head_dim, dtype=torch.float64)
    out = module(x, height, width)
    torch.testing.assert_close(out.expand_as(_naive(module, x, height, width)),
                               _naive(module, x, height, width))
    # shared-head bias broadcasts over batch and heads, like the official (1, 1, L, L)
    out_heads = 1 if (mode == "bias" and shared) else heads
    out_batch = 1 if mode == "bias" else batch
    assert out.shape == (out_batch, out_heads, length, head_dim if on == "v" else length)


def test_parameter_names_and_shapes_match_official():
    cfg = get_rpe_config(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1,
                         rpe_on="qkv")
    q, k, v = build_rpe(cfg, head_dim=64, num_heads=6)
    assert dict((n, tuple(p.shape)) for n, p in q.named_parameters()) == {
        "lookup_table_weight": (1, 64, 50)}
    assert tuple(v.lookup_table_weight.shape) == (1, 50, 64)
    cfg = get_rpe_config(ratio=20, method="cross", mode="bias", shared_head=False, skip=1)
    q, k, v = build_rpe(cfg, head_dim=64, num_heads=6)
    assert q is None and v is None
    assert {n: tuple(p.shape) for n, p in k.named_parameters()} == {
        "rp_rows.lookup_table_bias": (6, 82), "rp_cols.lookup_table_bias": (6, 82)}
    assert all(float(p.detach().abs().sum()) == 0 for p in k.parameters())  # official zero init


def test_config_aliases_strings_and_errors():
    cfg = get_rpe_config(method="euc", mode="ctx", rpe_on="kq")
    assert cfg.mode == "contextual" and cfg.on == "qk" and cfg.method.value == "euc"
    assert cfg.rpe_q is cfg and cfg.rpe_v is None
    detr = RPEConfig.from_string("rpe-2.0-product-ctx-1-k")
    assert (detr.ratio, detr.method.value, detr.mode, detr.shared_head, detr.skip, detr.on) == (
        2.0, "product", "contextual", True, 0, "k")
    assert detr.num_buckets == 81 and detr.to_string() == "rpe-2.0-product-ctx-1-k"
    assert get_rpe_config(method=3, skip=1).num_buckets == 50
    for bad in [dict(mode="soft"), dict(rpe_on="x"), dict(rpe_on=""), dict(rpe_on="kk"),
                dict(mode="bias", rpe_on="v"), dict(method="polar"), dict(ratio=0),
                dict(skip=-1)]:
        with pytest.raises(ValueError):
            get_rpe_config(**bad)
    for bad in ["rpe-2.0-product-ctx-1", "rpe-x-product-ctx-1-k", "rpe-2-product-ctx-2-k"]:
        with pytest.raises(ValueError):
            RPEConfig.from_string(bad)


def test_default_grid_is_sqrt_and_skip_mismatch_is_an_error():
    cfg = get_rpe_config(ratio=1.9, skip=1)
    _, k, _ = build_rpe(cfg, head_dim=4, num_heads=2)
    assert k.grid(197) == (14, 14, 1)
    with pytest.raises(ValueError, match="skip"):
        k(torch.randn(1, 2, 16, 4))  # 4x4 grid, no cls token, but built for skip=1
    _, k0, _ = build_rpe(get_rpe_config(ratio=1.9, skip=0), head_dim=4, num_heads=2)
    with pytest.raises(ValueError, match="skip"):
        k0(torch.randn(1, 2, 17, 4))  # a cls token would index past the table
    with pytest.raises(ValueError, match="shorter"):
        k0(torch.randn(1, 2, 10, 4), 4, 4)


def test_traceable_mode_gives_same_outputs():
    cfg = get_rpe_config(ratio=2.0, method="product", skip=0, rpe_on="qkv")
    attn = RPEAttention(32, 4, qkv_bias=True, rpe_config=cfg)
    _randomize(attn)
    x = torch.randn(2, 15, 32)
    set_fused_attention("unfused")  # traceable modules run the unfused path: the same order
    try:
        ref = attn(x, 3, 5)
    finally:
        set_fused_attention(None)
    set_traceable(attn)
    torch.testing.assert_close(attn(x, 3, 5), ref)
    torch.testing.assert_close(attn(x, torch.tensor(3), torch.tensor(5)), ref)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("grid", [(3, 4, 1), (4, 3, 0)])
def test_fixed_grid_transposed_term_equals_transpose(method, shared, grid):
    """forward_transposed in fixed-grid export mode (1-row table, transposed index) equals the
    plain term transposed, for Q with every method; with gradients through the table."""
    height, width, skip = grid
    cfg = get_rpe_config(ratio=METHODS[method], method=method, skip=skip, rpe_on="q",
                         shared_head=shared)
    rpe_q = _randomize(build_rpe(cfg, head_dim=8, num_heads=3)[0]).double()
    x = torch.randn(2, 3, skip + height * width, 8, dtype=torch.float64)
    ref = rpe_q(x, height, width).transpose(2, 3)
    set_traceable(rpe_q, fixed_grid=True)
    assert all(m.fixed_grid for m in rpe_q.modules() if hasattr(m, "fixed_grid"))
    got = rpe_q.forward_transposed(x, height, width)
    assert got.shape == ref.shape and got.is_contiguous()
    torch.testing.assert_close(got, ref)
    table = next(rpe_q.parameters())
    (g_got,) = torch.autograd.grad(got.sum(), table)
    set_traceable(rpe_q, False)
    (g_ref,) = torch.autograd.grad(rpe_q(x, height, width).sum(), table)
    torch.testing.assert_close(g_got, g_ref)


def _official_attention(attn_mod, x, height, width):
    """The official DeiT RPEAttention forward, with naive iRPE terms."""
    b, n, c = x.shape
    h = attn_mod.num_heads
    qkv = attn_mod.qkv(x).reshape(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0] * attn_mod.scale, qkv[1], qkv[2]
    attn = q @ k.transpose(-2, -1)
    attn = attn + _naive(attn_mod.rpe_k, q, height, width)
    attn = attn + _naive(attn_mod.rpe_q, k * attn_mod.scale, height, width).transpose(2, 3)
    attn = attn.softmax(-1)
    out = attn @ v + _naive(attn_mod.rpe_v, attn, height, width)
    return attn_mod.proj(out.transpose(1, 2).reshape(b, n, c))


@pytest.mark.parametrize("method", list(METHODS))
def test_attention_matches_official_order(method):
    cfg = get_rpe_config(ratio=METHODS[method], method=method, skip=1, rpe_on="qkv",
                         shared_head=False)
    attn = _randomize(RPEAttention(24, 3, qkv_bias=True, rpe_config=cfg)).double()
    x = torch.randn(2, 1 + 4 * 3, 24, dtype=torch.float64)
    torch.testing.assert_close(attn(x, 4, 3), _official_attention(attn, x, 4, 3))


def test_ids_first_built_under_inference_mode_still_train():
    cfg = get_rpe_config(ratio=1.7, method="product", skip=0, rpe_on="k")
    _, k, _ = build_rpe(cfg, head_dim=4, num_heads=2)
    x = torch.randn(1, 2, 21, 4)
    with torch.inference_mode():
        k(x, 3, 7)  # first use of this grid happens in inference mode
    _, k2, _ = build_rpe(cfg, head_dim=4, num_heads=2)
    k(x, 3, 7).sum().backward()
    k2(x.requires_grad_(), 3, 7).sum().backward()
    assert k.lookup_table_weight.grad is not None and x.grad is not None
