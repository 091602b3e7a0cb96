"""Lazy triton.jit for the fused kernels: triton.jit reads TRITON_INTERPRET when it is applied,
so each kernel is jitted on first use, once per interpreter setting."""
from __future__ import annotations

from typing import Any, Callable

import triton

__all__ = ["lazy_jit"]


def lazy_jit(fn: Callable) -> Callable[[], Any]:
    """A getter for ``triton.jit(fn)``, built on first call for the current interpreter knob."""
    cache: dict = {}

    def get() -> Any:
        interpret = bool(triton.knobs.runtime.interpret)
        if interpret not in cache:
            cache[interpret] = triton.jit(fn)
        return cache[interpret]
    return get
