"""The SDPA-based CPU path of iRPE attention (irpe/fused/cpu.py) against the unfused path.

Forward and gradients for every method x K/Q/V (contextual and bias), skip, per-head and shared
tables, DETR's key padding mask (masked after the terms are added); the dispatch (auto on CPU,
the IRPE_FUSED_ATTENTION switch, fallbacks) seen through the ops the profiler records.
"""
import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from irpe import create_model, randomize_tables
from irpe.attention import RPEAttention, rpe_attention, unfused_attention
from irpe.fused import cpu_supported, set_fused_attention
from irpe.fused.cpu_library import set_cpu_library
from irpe.rpe import build_rpe, get_rpe_config, set_traceable

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
CASES = [  # (method, on, mode, skip, grid h, grid w, shared head)
    ("product", "k", "ctx", 1, 3, 3, True),
    ("product", "q", "ctx", 0, 3, 5, False),
    ("product", "v", "ctx", 1, 4, 3, True),
    ("product", "qkv", "ctx", 0, 5, 2, False),
    ("euc", "qkv", "ctx", 1, 5, 3, True),
    ("euc", "qk", "bias", 0, 2, 5, False),
    ("quant", "kv", "ctx", 1, 3, 4, False),
    ("quant", "q", "bias", 1, 4, 4, True),
    ("cross", "qkv", "ctx", 1, 4, 5, True),
    ("cross", "k", "bias", 0, 3, 4, False),
    ("cross", "qv", "ctx", 0, 1, 7, False),
]


@pytest.fixture(autouse=True)
def auto_mode(monkeypatch):
    """Every test starts in auto mode with the env var unset and leaves it so; the native
    kernel is set aside (this module tests the SDPA formulation: test_cpu_library the kernel)."""
    monkeypatch.delenv("IRPE_FUSED_ATTENTION", raising=False)
    set_fused_attention(None)
    set_cpu_library(None)
    yield
    set_fused_attention(None)
    set_cpu_library(True)


def _modules(method, on, mode, skip, shared, heads=2, head_dim=16):
    cfg = get_rpe_config(1.9, method, mode, shared, skip, on)
    return build_rpe(cfg, head_dim, heads, initializer=lambda p: torch.nn.init.normal_(p, std=0.5))


def _inputs(batch, heads, length, head_dim, grad=False):
    gen = torch.Generator().manual_seed(length)
    return [torch.randn(batch, heads, length, head_dim, generator=gen).requires_grad_(grad)
            for _ in range(3)]


def _padding(batch, length):
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[-1, -(length // 3):] = True
    return mask


def _close(out, ref, tol=2e-5):
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    assert err <= tol, f"max rel err {err:.2e} > {tol:.0e}"


def _ops(fn):
    """Names of the ops ``fn`` ran (without autograd: a mask that needs a gradient makes SDPA
    take its math backend)."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("method,on,mode,skip,h,w,shared", CASES)
@pytest.mark.parametrize("padded", [False, True])
def test_cpu_path_matches_unfused(method, on, mode, skip, h, w, shared, padded):
    """Inference (inference_mode: the in-place shortcuts) and with autograd recording."""
    mods = _modules(method, on, mode, skip, shared)
    q, k, v = _inputs(2, 2, skip + h * w, 16)
    mask = _padding(2, skip + h * w) if padded else None
    assert cpu_supported(q, k, *mods, h, None)
    ref = unfused_attention(q, k, v, 0.25, *mods, h, w, mask)
    _close(rpe_attention(q, k, v, 0.25, *mods, h, w, mask), ref)
    with torch.inference_mode():
        _close(rpe_attention(q, k, v, 0.25, *mods, h, w, mask), ref)


@pytest.mark.parametrize("case", [CASES[3], CASES[5], CASES[6], CASES[8]])
def test_cpu_path_gradients_match_unfused(case):
    """Training: gradients of q, k, v and every iRPE table equal the unfused path's."""
    method, on, mode, skip, h, w, shared = case
    mods = _modules(method, on, mode, skip, shared)
    params = [p for m in mods if m is not None for p in m.parameters()]
    q, k, v = _inputs(2, 2, skip + h * w, 16, grad=True)
    mask = _padding(2, skip + h * w)
    grads = []
    for fn in (rpe_attention, unfused_attention):
        out = fn(q, k, v, 0.25, *mods, h, w, mask)
        grads.append(torch.autograd.grad((out * out).sum(), [q, k, v] + params))
    for got, ref in zip(*grads, strict=True):
        _close(got, ref, 5e-5)


def test_k_only_runs_inside_sdpa_and_switch_restores_unfused(monkeypatch):
    """iRPE-K on CPU goes through SDPA's CPU flash kernel (float mask); the switch gives back
    the unfused path bit for bit (the env var: test_fused_attention.test_env_switch_*)."""
    mods = _modules("product", "k", "ctx", 1, True)
    q, k, v = _inputs(2, 2, 10, 16)
    ref = unfused_attention(q, k, v, 0.25, *mods, 3, 3)
    assert FLASH in _ops(lambda: rpe_attention(q, k, v, 0.25, *mods, 3, 3))
    set_fused_attention("unfused")
    assert not cpu_supported(q, k, *mods, 3, None)
    assert FLASH not in _ops(lambda: rpe_attention(q, k, v, 0.25, *mods, 3, 3))
    assert torch.equal(rpe_attention(q, k, v, 0.25, *mods, 3, 3), ref)
    set_fused_attention(None)


def test_mode_setting_is_typed():
    with pytest.raises(ValueError, match="unknown fused attention mode"):
        set_fused_attention("1")  # env-var aliases are not modes of the setting


def test_unsupported_cases_take_unfused_path():
    """Dropout while training, export (traceable ids), cross-attention shapes, no iRPE."""
    mods = _modules("product", "qk", "ctx", 0, True)
    q, k, v = _inputs(1, 2, 9, 16)
    assert not cpu_supported(q, k, *mods, 3, torch.nn.Dropout(0.5).train())
    assert cpu_supported(q, k, *mods, 3, torch.nn.Dropout(0.5).eval())
    assert not cpu_supported(q, k[:, :, :4], *mods, 3, None)
    assert not cpu_supported(q, k, None, None, None, 3, None)
    set_traceable(mods[1], True)
    assert not cpu_supported(q, k, *mods, 3, None)
    assert torch.equal(rpe_attention(q, k, v, 0.25, *mods, 3, 3),
                       unfused_attention(q, k, v, 0.25, *mods, 3, 3))


def test_bad_grid_raises_like_unfused():
    mods = _modules("product", "k", "ctx", 0, True)
    q, k, v = _inputs(1, 2, 10, 16)
    for mode in ("auto", "unfused"):
        set_fused_attention(mode)
        with pytest.raises(ValueError, match="skip tokens"):
            rpe_attention(q, k, v, 0.25, *mods, 3, 3)


def test_deit_block_and_bf16():
    """RPEAttention (grid inferred, cls token) in fp32, and bf16 within bf16 tolerance."""
    attn = RPEAttention(32, 2, rpe_config=get_rpe_config(1.9, "product", "ctx", True, 1, "qkv"))
    randomize_tables(attn.eval(), std=0.5)
    half = copy.deepcopy(attn).to(torch.bfloat16)
    x = torch.randn(2, 17, 32)
    with torch.no_grad():
        fast, fast_bf16 = attn(x), half(x.bfloat16()).float()
        set_fused_attention("unfused")
        ref, ref_bf16 = attn(x), half(x.bfloat16()).float()
    _close(fast, ref)
    _close(fast_bf16, ref, 3e-2)
    _close(ref_bf16, ref, 3e-2)


def test_detr_padded_batch_matches_unfused():
    """detr_tiny_irpe, two images padded differently: encoder iRPE-K with the padding mask on
    the CPU path, logits and boxes as on the unfused path."""
    net = randomize_tables(create_model("detr_tiny_irpe").eval(), std=0.5)
    x, sizes = torch.randn(2, 3, 96, 128), torch.tensor([[96, 128], [64, 96]])
    with torch.inference_mode():
        ops = _ops(lambda: net(x, sizes))
        fast = net(x, sizes)
        set_fused_attention("unfused")
        ref = net(x, sizes)
    assert FLASH in ops
    _close(fast["pred_logits"], ref["pred_logits"])
    _close(fast["pred_boxes"], ref["pred_boxes"])
