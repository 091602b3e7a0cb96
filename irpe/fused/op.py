"""``irpe::fused_rpe_attention``: the custom op around the Triton kernel (torch.library).

Registered with a fake impl so torch.compile(fullgraph=True) traces through it, and an autograd
formula whose backward is the op ``irpe::fused_rpe_attention_backward`` (irpe/fused/backward.py:
the Triton backward kernel, or the chunked torch adjoints where it cannot run). The kernel runs
on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1; anything else takes the torch
reference, so the op never fails for lack of a kernel.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from .backward import fused_rpe_attention_backward
from .launch import MAX_BUCKETS_V, MAX_HEAD_DIM, kernel_available, launch_forward
from .reference import FusedInputs, reference_forward

__all__ = ["fused_rpe_attention", "check_inputs"]

Tensor = torch.Tensor


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
    want: Tuple[int, ...] = (length, length)
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
    args: FusedInputs = (q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v,
                         key_padding_mask, grid)
    check_inputs(*args)
    if kernel_available(q.device) and q.shape[-1] <= MAX_HEAD_DIM:
        return launch_forward(*args)
    return reference_forward(*args)


@fused_rpe_attention.register_fake
def _fake(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor], ids_k: Optional[Tensor],
          table_q: Optional[Tensor], ids_q: Optional[Tensor], ids_v: Optional[Tensor],
          num_buckets_v: int, key_padding_mask: Optional[Tensor],
          grid: Optional[List[int]] = None) -> Tuple[Tensor, Tensor]:
    b, h, length, _ = q.shape
    nb = num_buckets_v if ids_v is not None else 0
    return q.new_empty(q.shape), q.new_empty((b, h, length, nb), dtype=torch.float32)


# ctx: the autograd context, an attribute bag (torch types it Any)
def _setup(ctx: Any, inputs: FusedInputs, output: Tuple[Tensor, Tensor]) -> None:
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, mask, grid = inputs
    ctx.save_for_backward(q, k, v, table_k, ids_k, table_q, ids_q, ids_v, mask)
    ctx.num_buckets_v, ctx.grid = num_buckets_v, grid


def _backward(ctx: Any, grad_out: Optional[Tensor], grad_s: Optional[Tensor]
              ) -> Tuple[Optional[Tensor], ...]:
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, mask = ctx.saved_tensors
    inputs = (q, k, v, table_k, ids_k, table_q, ids_q, ids_v, ctx.num_buckets_v, mask, ctx.grid)
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    dq, dk, dv, dtk, dtq = fused_rpe_attention_backward(*inputs, grad_out, grad_s)
    return (dq, dk, dv, dtk if table_k is not None else None, None,
            dtq if table_q is not None else None, None, None, None, None, None)


fused_rpe_attention.register_autograd(_backward, setup_context=_setup)
