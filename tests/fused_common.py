"""Shared pieces of the fused-attention tests (CPU interpreter): skip marker, inputs, checks;
the ``interpret`` fixture is in tests/conftest.py."""
import contextlib
import importlib.util
import os

import pytest
import torch

from irpe.rpe import build_rpe, get_rpe_config

HAVE_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAVE_TRITON and os.environ.get("CI") != "true",
    reason="triton not installed (pip install triton==3.9.0; the dev extra has it)")

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def modules(method, on, mode="ctx", skip=0, heads=2, head_dim=16, shared=True, dtype=None):
    cfg = get_rpe_config(1.9, method, mode, shared, skip, on)
    mods = build_rpe(cfg, head_dim, heads, initializer=lambda p: torch.nn.init.normal_(p, std=0.5))
    return [m.to(dtype) if m is not None and dtype else m for m in mods]


def inputs(batch, heads, length, head_dim, dtype=torch.float32):
    return [torch.randn(batch, heads, length, head_dim).to(dtype) for _ in range(3)]


def check(out, ref, dtype):
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err <= TOL[dtype], f"max rel err {err:.2e} > {TOL[dtype]:.0e}"


class Launches:
    """Triton kernel launches seen inside :func:`count_launches` (forward, backward)."""

    def __init__(self) -> None:
        self.forward = 0
        self.backward = 0


@contextlib.contextmanager
def count_launches():
    """Count forward/backward Triton kernel launches (each launch fetches its kernel through the
    module's getter once, so wrapping the getters counts them); tells a kernel run from the
    torch fallback without a counter in the product."""
    from irpe.fused import kernel, kernel_bwd
    seen = Launches()
    getters = [(kernel, "get_kernel", "forward"), (kernel_bwd, "get_backward_kernel", "backward")]
    originals = [getattr(module, name) for module, name, _ in getters]

    def counted(getter, field):
        def fetch(*args, **kwargs):
            setattr(seen, field, getattr(seen, field) + 1)
            return getter(*args, **kwargs)
        return fetch

    for (module, name, field), original in zip(getters, originals, strict=True):
        setattr(module, name, counted(original, field))
    try:
        yield seen
    finally:
        for (module, name, _), original in zip(getters, originals, strict=True):
            setattr(module, name, original)
