"""Compile the fused-attention kernel for a GPU architecture without a GPU (ptxas of Triton).

Used by CI to prove the kernel lowers to a cubin for real targets (the interpreter does not
check that) and as the first step of the ahead-of-time path to a TensorRT / ORT plugin.
"""
from __future__ import annotations

import inspect
from typing import Dict

import torch

from .op import _pow2, block_sizes

__all__ = ["compile_variant", "compile_backward_variant"]

_TRITON_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _signature(params, dtype: str, constexprs: Dict) -> Dict[str, str]:
    pointer = {"Q": dtype, "K": dtype, "V": dtype, "OUT": dtype, "TK": dtype, "TQ": dtype,
               "IDK": "i32", "IDQ": "i32", "IDV": "i32", "MASK": "i8", "S": "fp32",
               "LSE": "fp32", "DO": dtype, "DS": "fp32", "DELTA": "fp32", "DQ": "fp32",
               "DK": "fp32", "DV": "fp32", "DTK": "fp32", "DTQ": "fp32"}
    return {p: "constexpr" if p in constexprs else ("*" + pointer[p] if p in pointer else "i32")
            for p in params}


def compile_variant(dtype: torch.dtype = torch.float16, head_dim: int = 64, k_term: bool = True,
                    q_term: bool = False, v_buckets: int = 0, mask: bool = False, planes: int = 1,
                    id_table: bool = True, arch: int = 90, num_warps: int = 4):
    """triton.compile one kernel variant for sm_``arch``; returns the CompiledKernel (cubin in
    ``.asm["cubin"]``). Raises whatever Triton raises when the kernel does not lower."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .kernel import get_kernel
    kernel = get_kernel()
    if getattr(kernel, "fn", None) is None or triton.knobs.runtime.interpret:
        raise RuntimeError("compile_variant needs TRITON_INTERPRET unset")
    block_m, block_n = block_sizes(dtype, head_dim, v_buckets > 0, "cuda")
    cx = dict(ID_TABLE=id_table, HAS_TK=k_term, HAS_TQ=q_term, HAS_V=v_buckets > 0,
              HAS_MASK=mask, NIDK=planes, NIDQ=planes, NIDV=planes, BLOCK_M=block_m,
              BLOCK_N=block_n, BLOCK_D=_pow2(head_dim),
              BLOCK_T=_pow2(v_buckets) if v_buckets else 16,
              IEEE=dtype == torch.float32, DOT_F32=False, STORE_LSE=False)
    params = list(inspect.signature(kernel.fn).parameters)
    src = ASTSource(fn=kernel, signature=_signature(params, _TRITON_DTYPES[dtype], cx),
                    constexprs=cx)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps})


def compile_backward_variant(dtype: torch.dtype = torch.float16, head_dim: int = 64,
                             k_term: bool = True, q_term: bool = False, v_term: bool = False,
                             mask: bool = False, planes: int = 1, id_table: bool = True,
                             arch: int = 90, num_warps: int = 4):
    """triton.compile one backward-kernel variant for sm_``arch`` (see :func:`compile_variant`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .kernel_bwd import get_backward_kernel
    kernel = get_backward_kernel()
    if getattr(kernel, "fn", None) is None or triton.knobs.runtime.interpret:
        raise RuntimeError("compile_backward_variant needs TRITON_INTERPRET unset")
    block = 32 if dtype == torch.float32 or head_dim > 64 else 64
    cx = dict(ID_TABLE=id_table, HAS_TK=k_term, HAS_TQ=q_term, HAS_V=v_term, HAS_MASK=mask,
              NIDK=planes, NIDQ=planes, NIDV=planes, BLOCK_M=block, BLOCK_N=block,
              BLOCK_D=_pow2(head_dim), IEEE=dtype == torch.float32, DOT_F32=False)
    params = list(inspect.signature(kernel.fn).parameters)
    src = ASTSource(fn=kernel, signature=_signature(params, _TRITON_DTYPES[dtype], cx),
                    constexprs=cx)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps})
