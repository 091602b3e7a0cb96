"""One small launch of a fused-kernel variant (tools.fused_variants) against the unfused fp32
path: the Triton kernel must run (launch counter) and agree within the dtype's tolerance.

Shared by tests/gpu/test_fused_variants_gpu.py (compiled, CUDA) and tests/test_gpu_check.py
(a few variants on the CPU interpreter, so the family list itself is exercised in CI)."""
from __future__ import annotations

from typing import List

import torch

from irpe.attention import rpe_attention
from irpe.fused import set_fused_attention, set_fused_ids
from irpe.rpe import build_rpe, get_rpe_config
from tests.fused_common import count_launches
from tools.fused_variants import Variant

# largest |fused - fp32 unfused| / max |fp32 unfused| per dtype (tests/gpu/test_fused_attention_gpu)
FORWARD_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
BACKWARD_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
GRID, SKIP = (5, 6), 1  # 31 tokens: not a multiple of any tile


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _case(variant: Variant, device: str, head_dim: int):
    fam = variant.family
    cfg = get_rpe_config(1.9, fam.method, fam.mode, True, SKIP, fam.on)
    gen = torch.Generator().manual_seed(0)
    mods = build_rpe(cfg, head_dim, 2, initializer=lambda p: p.data.copy_(
        torch.randn(p.shape, generator=gen) * 0.3))
    length = SKIP + GRID[0] * GRID[1]
    qkv = [torch.randn(2, 2, length, head_dim, generator=gen) for _ in range(3)]
    mask = None
    if fam.mask:
        mask = torch.zeros(2, length, dtype=torch.bool)
        mask[0, -4:] = True
        mask = mask.to(device)
    return mods, qkv, mask


def _run(mods, qkv, mask, dtype, device, fused: bool, grad: bool) -> List[torch.Tensor]:
    set_fused_attention("on" if fused else "off")
    ms = [m.to(device, dtype) if m is not None else None for m in mods]
    ts = [t.to(device, dtype).requires_grad_(grad) for t in qkv]
    out = rpe_attention(*ts, 0.2, *ms, *GRID, mask)
    if not grad:
        return [out.detach()]
    params = [p for m in ms if m is not None for p in m.parameters()]
    return list(torch.autograd.grad(out.float().square().sum(), ts + params))


def smoke(variant: Variant, device: str = "cuda", head_dim: int = 32) -> float:
    """Launch ``variant`` once on ``device``; its worst relative error vs fp32 unfused (asserts
    that the kernel ran and the error is within tolerance)."""
    fam, dtype = variant.family, variant.torch_dtype
    mods, qkv, mask = _case(variant, device, head_dim)
    set_fused_ids(fam.ids)
    try:
        with torch.set_grad_enabled(fam.backward):
            with count_launches() as launches:
                got = _run(mods, qkv, mask, dtype, device, True, fam.backward)
            ran = launches.backward if fam.backward else launches.forward
            assert ran > 0, f"{variant.name}: the Triton kernel did not run"
            ref = _run(mods, qkv, mask, torch.float32, device, False, fam.backward)
    finally:
        set_fused_attention(None)
        set_fused_ids("table")
    tol = (BACKWARD_TOL if fam.backward else FORWARD_TOL)[dtype]
    worst = max(_rel(g, r) for g, r in zip(got, ref, strict=True))
    assert worst <= tol, f"{variant.name}: max relative error {worst:.2e} > {tol:.0e}"
    return worst
