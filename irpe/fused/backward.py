"""``irpe::fused_rpe_attention_backward``: gradients of the fused op (a custom op of its own, so
AOTAutograd traces the backward as one node instead of running the Triton launch on fake tensors).

Triton backward kernel (irpe/fused/kernel_bwd.py) where the forward kernel runs, else the
chunked torch adjoints of :func:`irpe.fused.reference.reference_backward`.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from .launch import (
    MAX_HEAD_DIM,
    broadcast_strides,
    cdiv,
    dot_in_f32,
    kernel_available,
    launch_forward,
    next_pow2,
)
from .reference import FusedGrads, FusedInputs, reduce_grad_to, reference_backward

__all__ = ["fused_rpe_attention_backward", "backward_shape"]

Tensor = torch.Tensor


def backward_shape(dtype: torch.dtype, head_dim: int, capability: Tuple[int, int] = (9, 0)
                   ) -> Tuple[int, int]:
    """(square tile, num_warps) of the backward kernel on a GPU of ``capability``: 64 for
    fp16/bf16 heads <= 64 on sm_80+ (wgmma on sm_90; sm_75 has 64 KB of shared memory), 16 for
    fp32 (IEEE FMA dots: 32-wide tiles spilled 12 KB per thread on sm_90), else 32; 8 warps.
    Spills per family: tests/test_fused_lowering.py."""
    if dtype == torch.float32:
        return 16, 8
    small = head_dim > 64 or tuple(capability) < (8, 0)
    return (32 if small else 64), 8


def _block(q: Tensor) -> Tuple[int, int]:
    """backward_shape for q's device; 16 x 16 tiles on the CPU interpreter."""
    if q.device.type == "cpu":
        return 16, 4
    return backward_shape(q.dtype, q.shape[-1], torch.cuda.get_device_capability(q.device))


def _launch_backward(inputs: FusedInputs, grad_out: Tensor, grad_s: Optional[Tensor]
                     ) -> FusedGrads:
    """Gradients of (q, k, v, table_k, table_q) by the Triton backward kernel; the forward runs
    once more to get the rows' log-sum-exp (not kept by the op, so its outputs stay two)."""
    from .kernel_bwd import get_backward_kernel
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, mask, grid = inputs
    b, h, length, d = q.shape
    f32: Dict[str, Any] = dict(dtype=torch.float32, device=q.device)
    lse = torch.empty((b * h, length), **f32)
    out, s = launch_forward(*inputs, lse=lse)
    has_v = ids_v is not None and grad_s is not None
    delta = (grad_out.float() * out.float()).sum(-1)
    if has_v and grad_s is not None:  # (has_v says it is not None; this tells the type checker)
        grad_s = grad_s.float().contiguous()
        delta = delta + (grad_s * s).sum(-1)
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    tables = [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in (table_k, table_q)]
    ids = [None if i is None else i.to(torch.int32).contiguous() for i in (ids_k, ids_q, ids_v)]
    dq = torch.zeros((b, h, length, d), **f32)
    dk, dv = torch.empty((b, h, length, d), **f32), torch.empty((b, h, length, d), **f32)
    nbk = 1 if table_k is None else table_k.shape[-1]
    nbq = 1 if table_q is None else table_q.shape[-1]
    dtk = torch.zeros((b, h, length, nbk) if table_k is not None else (1,), **f32)
    dtq = torch.zeros((b, h, length, nbq) if table_q is not None else (1,), **f32)
    dummy = q.new_zeros(1, dtype=torch.int32)
    mask_i8 = None if mask is None else mask.to(torch.int8).contiguous()
    gh, gw, skip = grid if grid is not None else (1, 1, 0)
    plane = next(i for i in ids if i is not None)[0].numel() if grid is not None \
        else length * length
    block, warps = _block(q)
    get_backward_kernel()[(cdiv(length, block), b * h)](
        q, k, v, *(t if t is not None else dummy for t in tables),
        *(i if i is not None else dummy for i in ids),
        mask_i8 if mask_i8 is not None else dummy, grad_out, grad_s if has_v else dummy,
        lse, delta.reshape(b * h, length).contiguous(), dq, dk, dv, dtk, dtq,
        *broadcast_strides(q), *broadcast_strides(k), *broadcast_strides(v),
        *broadcast_strides(tables[0]), *broadcast_strides(tables[1]),
        0 if mask_i8 is None else mask_i8.stride(0), *broadcast_strides(grad_out),
        *broadcast_strides(grad_s if has_v else None),
        h, length, d, nbk, nbq, gh, gw, skip, plane, ID_TABLE=grid is not None,
        HAS_TK=table_k is not None, HAS_TQ=table_q is not None, HAS_V=has_v,
        HAS_MASK=mask is not None,
        NIDK=1 if ids[0] is None else ids[0].shape[0],
        NIDQ=1 if ids[1] is None else ids[1].shape[0],
        NIDV=1 if ids[2] is None else ids[2].shape[0],
        BLOCK_M=block, BLOCK_N=block, BLOCK_D=next_pow2(d), IEEE=q.dtype == torch.float32,
        DOT_F32=dot_in_f32(q), num_warps=warps)
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            None if table_k is None else reduce_grad_to(dtk, table_k),
            None if table_q is None else reduce_grad_to(dtq, table_q))


@torch.library.custom_op("irpe::fused_rpe_attention_backward", mutates_args=())
def fused_rpe_attention_backward(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor],
                                 ids_k: Optional[Tensor], table_q: Optional[Tensor],
                                 ids_q: Optional[Tensor], ids_v: Optional[Tensor],
                                 num_buckets_v: int, key_padding_mask: Optional[Tensor],
                                 grid: Optional[List[int]], grad_out: Tensor,
                                 grad_s: Optional[Tensor]
                                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d table_k, d table_q); an absent table's gradient is an empty tensor."""
    inputs: FusedInputs = (q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v,
                           key_padding_mask, grid)
    if kernel_available(q.device) and q.shape[-1] <= MAX_HEAD_DIM:
        grads = _launch_backward(inputs, grad_out, grad_s)
    else:
        grads = reference_backward(inputs, grad_out, grad_s)
    dq, dk, dv, dtk, dtq = grads
    return (dq, dk, dv, dtk if dtk is not None else q.new_empty(0),
            dtq if dtq is not None else q.new_empty(0))


@fused_rpe_attention_backward.register_fake
def _fake(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor], ids_k: Optional[Tensor],
          table_q: Optional[Tensor], ids_q: Optional[Tensor], ids_v: Optional[Tensor],
          num_buckets_v: int, key_padding_mask: Optional[Tensor], grid: Optional[List[int]],
          grad_out: Tensor, grad_s: Optional[Tensor]
          ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    def like(t: Optional[Tensor]) -> Tensor:
        if t is None:
            return q.new_empty(0)
        return torch.empty_like(t, memory_format=torch.contiguous_format)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), like(table_k), \
        like(table_q)
