"""Launch helpers shared by the forward op (op.py) and its backward (backward.py): whether the
Triton kernel can run here, tile shapes, stride arguments, and the forward kernel launch.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch

__all__ = ["MAX_HEAD_DIM", "MAX_BUCKETS_V", "interpreter_enabled", "kernel_available",
           "next_pow2", "broadcast_strides", "cdiv", "dot_in_f32", "launch_shape", "block_sizes",
           "launch_forward"]

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


def next_pow2(n: int, floor: int = 16) -> int:
    """The smallest power of two >= n, at least ``floor`` (Triton block sizes)."""
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def broadcast_strides(t: Optional[Tensor], dims: int = 3) -> list:
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
        return (32, 16, 8) if next_pow2(v_buckets) * v_planes > 128 else (64, 16, 8)
    return 64, 32, 8


def block_sizes(dtype: torch.dtype, head_dim: int, has_v: bool, device_type: str
                ) -> Tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of :func:`launch_shape` for V tables of up to 128 buckets."""
    return launch_shape(dtype, head_dim, 128 if has_v else 0, device_type)[:2]


def dot_in_f32(q: Tensor) -> bool:
    """The DOT_F32 switch of both kernels: True for bf16 on the CPU interpreter, whose tl.dot
    mishandles bf16 (the op runs there under TRITON_INTERPRET=1), so the tiles are upcast to fp32
    before each dot; compiled GPU kernels always get False."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu"


def launch_forward(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor],
                   ids_k: Optional[Tensor], table_q: Optional[Tensor], ids_q: Optional[Tensor],
                   ids_v: Optional[Tensor], num_buckets_v: int, mask: Optional[Tensor],
                   grid: Optional[List[int]], lse: Optional[Tensor] = None
                   ) -> Tuple[Tensor, Tensor]:
    """Run the forward Triton kernel -> (out, V-term bucket sums s); with ``lse`` also store the
    rows' log-sum-exp there (the backward needs it)."""
    from .kernel import get_kernel
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
    launch = (cdiv(length, block_m), b * h)
    get_kernel()[launch](
        q, k, v, tables[0] if tables[0] is not None else dummy,
        tables[1] if tables[1] is not None else dummy,
        *(i if i is not None else dummy for i in ids),
        mask_i8 if mask_i8 is not None else dummy, out, s if has_v else dummy,
        lse if lse is not None else dummy,
        *broadcast_strides(q), *broadcast_strides(k), *broadcast_strides(v),
        *broadcast_strides(tables[0]), *broadcast_strides(tables[1]),
        0 if mask_i8 is None else mask_i8.stride(0),
        *broadcast_strides(out), *broadcast_strides(s if has_v else None),
        h, length, d, num_buckets_v, gh, gw, skip, plane, ID_TABLE=grid is not None,
        HAS_TK=table_k is not None, HAS_TQ=table_q is not None, HAS_V=has_v,
        HAS_MASK=mask is not None,
        NIDK=1 if ids[0] is None else ids[0].shape[0],
        NIDQ=1 if ids[1] is None else ids[1].shape[0],
        NIDV=1 if ids[2] is None else ids[2].shape[0],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=next_pow2(d),
        BLOCK_T=next_pow2(num_buckets_v) if has_v else 16,
        IEEE=q.dtype == torch.float32,
        DOT_F32=dot_in_f32(q), STORE_LSE=lse is not None,
        num_warps=warps)
    return out, s


def cdiv(a: int, b: int) -> int:
    """Ceiling division (launch grid sizes)."""
    return -(-a // b)
