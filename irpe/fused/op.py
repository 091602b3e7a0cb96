"""``irpe::fused_rpe_attention``: the custom op around the Triton kernel (torch.library).

Registered with a fake impl so torch.compile(fullgraph=True) traces through it, and an autograd
formula whose backward is the op ``irpe::fused_rpe_attention_backward`` (irpe/fused/backward.py:
the Triton backward kernel, or the chunked torch adjoints where it cannot run). The kernel runs
on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1; anything else takes the torch
reference, so the op never fails for lack of a kernel.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch

from .reference import reference_forward

__all__ = ["fused_rpe_attention", "kernel_available", "interpreter_enabled", "launch_shape"]

Tensor = torch.Tensor
MAX_HEAD_DIM = 256
MAX_BUCKETS_V = 256


def interpreter_enabled() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_available(device: torch.device) -> bool:
    """Whether the Triton kernel can run for tensors on ``device``: CUDA with the compiler, CPU
    with the interpreter, and triton.language imported in that same mode (Triton fixes the mode
    of its library functions at import, so one process cannot switch)."""
    interpret = device.type == "cpu"
    if device.type not in ("cpu", "cuda") or interpreter_enabled() != interpret:
        return False
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(tl.zeros, InterpretedFunction) == interpret


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def _strides(t: Optional[Tensor], dims: int = 3) -> list:
    """Element strides of the leading ``dims`` dims; size-1 dims get stride 0 (broadcast)."""
    if t is None:
        return [0] * dims
    return [0 if t.shape[d] == 1 else t.stride(d) for d in range(dims)]


def launch_shape(dtype: torch.dtype, head_dim: int, v_buckets: int, device_type: str,
                 v_planes: int = 1) -> Tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the forward kernel, chosen so that sm_90 lowers every
    variant family without register spills (tests/test_fused_lowering.py) and fp16/bf16 tiles
    reach wgmma: BLOCK_M 64 with 8 warps. The V term walks 16 keys per tile, each with a
    (BLOCK_M, next_pow2(nb_v)) one-hot per id plane; above 128 such columns it drops to 32-row
    mma.sync tiles. fp32 uses IEEE FMA dots (no TF32). The CPU interpreter takes small tiles."""
    if device_type == "cpu":
        return 32, 16, 4
    if dtype == torch.float32 or head_dim > 64:
        return (32, 16, 8) if v_buckets else (32, 32, 4)
    if v_buckets:
        return (32, 16, 8) if _pow2(v_buckets) * v_planes > 128 else (64, 16, 8)
    return 64, 32, 8


def block_sizes(dtype: torch.dtype, head_dim: int, has_v: bool, device_type: str
                ) -> Tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of :func:`launch_shape` for V tables of up to 128 buckets."""
    return launch_shape(dtype, head_dim, 128 if has_v else 0, device_type)[:2]


LAUNCHES = [0, 0]  # forward, backward kernel launches (tests check that the kernels ran)


def _launch(q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, mask, grid,
            lse: Optional[Tensor] = None):
    from .kernel import get_kernel
    LAUNCHES[0] += 1
    b, h, length, d = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    id_any = next(i for i in (ids_k, ids_q, ids_v, q.new_zeros((1, 1))) if i is not None)
    gh, gw, skip = grid if grid is not None else (1, 1, 0)
    plane = id_any[0].numel() if grid is not None else length * length
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    has_v = ids_v is not None
    s = q.new_empty((b, h, length, num_buckets_v if has_v else 0), dtype=torch.float32)
    tables = [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in (table_k, table_q)]
    ids = [None if i is None else i.to(torch.int32).contiguous() for i in (ids_k, ids_q, ids_v)]
    dummy = q.new_zeros(1, dtype=torch.int32)
    mask_i8 = None if mask is None else mask.to(torch.int8).contiguous()
    v_planes = 1 if ids[2] is None else ids[2].shape[0]
    block_m, block_n, warps = launch_shape(q.dtype, d, num_buckets_v if has_v else 0,
                                           q.device.type, v_planes)
    launch = (triton_cdiv(length, block_m), b * h)
    get_kernel()[launch](
        q, k, v, tables[0] if tables[0] is not None else dummy,
        tables[1] if tables[1] is not None else dummy,
        *(i if i is not None else dummy for i in ids),
        mask_i8 if mask_i8 is not None else dummy, out, s if has_v else dummy,
        lse if lse is not None else dummy,
        *_strides(q), *_strides(k), *_strides(v), *_strides(tables[0]), *_strides(tables[1]),
        0 if mask_i8 is None else mask_i8.stride(0),
        *_strides(out), *_strides(s if has_v else None),
        h, length, d, num_buckets_v, gh, gw, skip, plane, ID_TABLE=grid is not None,
        HAS_TK=table_k is not None, HAS_TQ=table_q is not None, HAS_V=has_v,
        HAS_MASK=mask is not None,
        NIDK=1 if ids[0] is None else ids[0].shape[0],
        NIDQ=1 if ids[1] is None else ids[1].shape[0],
        NIDV=1 if ids[2] is None else ids[2].shape[0],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_pow2(d),
        BLOCK_T=_pow2(num_buckets_v) if has_v else 16,
        IEEE=q.dtype == torch.float32,
        DOT_F32=q.dtype == torch.bfloat16 and q.device.type == "cpu", STORE_LSE=lse is not None,
        num_warps=warps)
    return out, s


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_inputs(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor],
                 ids_k: Optional[Tensor], table_q: Optional[Tensor], ids_q: Optional[Tensor],
                 ids_v: Optional[Tensor], num_buckets_v: int, mask: Optional[Tensor],
                 grid: Optional[List[int]] = None) -> None:
    """Raise ValueError with the offending shape for inputs the op does not define."""
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"fused_rpe_attention: q, k, v must share one (B,H,L,D) shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, length, _ = q.shape
    for name, table, ids in (("table_k", table_k, ids_k), ("table_q", table_q, ids_q)):
        if (table is None) != (ids is None):
            raise ValueError(f"fused_rpe_attention: {name} and its ids go together")
        if table is not None and (table.dim() != 4 or table.shape[2] != length
                                  or table.shape[0] not in (1, b) or table.shape[1] not in (1, h)):
            raise ValueError(f"fused_rpe_attention: {name} must be (B|1,H|1,{length},K), got "
                             f"{tuple(table.shape)}")
    want = (length, length)
    if grid is not None:
        if len(grid) != 3 or min(grid) < 0 or min(grid[:2]) < 1 or grid[2] + grid[0] * grid[1] \
                != length:
            raise ValueError(f"fused_rpe_attention: grid must be [h, w, skip] with skip + h*w = "
                             f"{length}, got {list(grid)}")
        want = ((2 * grid[0] - 1) * (2 * grid[1] - 1) + 1,)
    for name, ids in (("ids_k", ids_k), ("ids_q", ids_q), ("ids_v", ids_v)):
        if ids is not None and (tuple(ids.shape[1:]) != want or ids.shape[0] not in (1, 2)):
            shape = ", ".join(map(str, want))
            raise ValueError(f"fused_rpe_attention: {name} must be (1|2, {shape}), got "
                             f"{tuple(ids.shape)}")
    if mask is not None and tuple(mask.shape) != (b, length):
        raise ValueError(f"fused_rpe_attention: key_padding_mask must be ({b},{length}), got "
                         f"{tuple(mask.shape)}")
    if ids_v is not None and not 0 < num_buckets_v <= MAX_BUCKETS_V:
        raise ValueError(f"fused_rpe_attention: num_buckets_v must be in 1..{MAX_BUCKETS_V}")


@torch.library.custom_op("irpe::fused_rpe_attention", mutates_args=())
def fused_rpe_attention(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor],
                        ids_k: Optional[Tensor], table_q: Optional[Tensor],
                        ids_q: Optional[Tensor], ids_v: Optional[Tensor], num_buckets_v: int,
                        key_padding_mask: Optional[Tensor], grid: Optional[List[int]] = None
                        ) -> Tuple[Tensor, Tensor]:
    """Attention of scaled q with iRPE K/Q logits terms -> (out, V-term bucket sums s fp32).

    ids: (NID, L, L) matrices, or with ``grid`` = [h, w, skip] relative-offset tables
    (NID, (2h-1)(2w-1)+1) whose last entry is the skip bucket.
    """
    args = (q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, key_padding_mask,
            grid)
    check_inputs(*args)
    if kernel_available(q.device) and q.shape[-1] <= MAX_HEAD_DIM:
        return _launch(*args)
    return reference_forward(*args)


@fused_rpe_attention.register_fake
def _fake(q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, key_padding_mask,
          grid=None):
    b, h, length, _ = q.shape
    nb = num_buckets_v if ids_v is not None else 0
    return q.new_empty(q.shape), q.new_empty((b, h, length, nb), dtype=torch.float32)


def _setup(ctx, inputs, output) -> None:
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, mask, grid = inputs
    ctx.save_for_backward(q, k, v, table_k, ids_k, table_q, ids_q, ids_v, mask)
    ctx.num_buckets_v, ctx.grid = num_buckets_v, grid


def _backward(ctx, grad_out, grad_s):
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, mask = ctx.saved_tensors
    inputs = (q, k, v, table_k, ids_k, table_q, ids_q, ids_v, ctx.num_buckets_v, mask, ctx.grid)
    from .backward import fused_rpe_attention_backward
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    dq, dk, dv, dtk, dtq = fused_rpe_attention_backward(*inputs, grad_out, grad_s)
    return (dq, dk, dv, dtk if table_k is not None else None, None,
            dtq if table_q is not None else None, None, None, None, None, None)


fused_rpe_attention.register_autograd(_backward, setup_context=_setup)
