"""Unfused torch reference of the fused iRPE attention op (and its explicit backward).

Same inputs as ``irpe::fused_rpe_attention``: q already scaled, tables (Bt|1, Ht|1, L, K) that
broadcast over batch/heads, id stacks (NID, L, L) whose planes are summed (or relative-offset
tables with ``grid``, expanded here). It materialises
L x L tensors; used where the kernel cannot run, for the backward and in tests.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

__all__ = ["expand_ids", "reference_logits", "reference_forward", "reference_backward"]

Tensor = torch.Tensor


def _gather_rows(table: Tensor, ids: Tensor, shape) -> Tensor:
    """sum over planes p of table[b, h, i, ids[p, i, j]] -> (B, H, L, L) in fp32."""
    b, h, length, _ = shape
    t = table.to(torch.float32).expand(b, h, length, table.shape[-1])
    out = torch.zeros(shape, dtype=torch.float32, device=table.device)
    for plane in ids:
        idx = plane.to(torch.long).expand(b, h, length, length)
        out = out + torch.gather(t, 3, idx)
    return out


def _scatter_rows(x: Tensor, ids: Tensor, num_buckets: int) -> Tensor:
    """s[b, h, i, t] = sum over planes and j with ids[p, i, j] = t of x[b, h, i, j] (fp32)."""
    b, h, length, _ = x.shape
    out = torch.zeros((b, h, length, num_buckets), dtype=torch.float32, device=x.device)
    for plane in ids:
        out.scatter_add_(3, plane.to(torch.long).expand(b, h, length, length), x.to(torch.float32))
    return out


def expand_ids(ids: Tensor, grid: List[int], length: int) -> Tensor:
    """Relative-offset id tables (NID, (2h-1)(2w-1)+1) -> the (NID, L, L) id matrices."""
    gh, gw, skip = grid
    tokens = torch.arange(length, device=ids.device)
    pos = (tokens - skip).clamp(min=0)
    rows, cols = pos // gw, pos % gw
    idx = (rows[:, None] - rows[None, :] + gh - 1) * (2 * gw - 1) + cols[:, None] - cols[None, :]
    inside = (tokens >= skip)[:, None] & (tokens >= skip)[None, :]
    idx = torch.where(inside, idx + gw - 1, ids.shape[1] - 1)
    return ids[:, idx]


def _matrices(length: int, grid: Optional[List[int]], *ids: Optional[Tensor]) -> list:
    return [i if i is None or grid is None else expand_ids(i, grid, length) for i in ids]


def reference_logits(q: Tensor, k: Tensor, table_k: Optional[Tensor], ids_k: Optional[Tensor],
                     table_q: Optional[Tensor], ids_q: Optional[Tensor],
                     key_padding_mask: Optional[Tensor]) -> Tensor:
    """fp32 logits q @ k^T + K term + Q term, padding keys set to -inf after the terms."""
    logits = q.to(torch.float32) @ k.to(torch.float32).transpose(-2, -1)
    if table_k is not None:
        logits = logits + _gather_rows(table_k, ids_k, logits.shape)
    if table_q is not None:  # term[i, j] = table_q[j, ids_q[j, i]]
        logits = logits + _gather_rows(table_q, ids_q, logits.shape).transpose(-2, -1)
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :].bool(), float("-inf"))
    return logits


def reference_forward(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor],
                      ids_k: Optional[Tensor], table_q: Optional[Tensor], ids_q: Optional[Tensor],
                      ids_v: Optional[Tensor], num_buckets_v: int,
                      key_padding_mask: Optional[Tensor], grid: Optional[List[int]] = None
                      ) -> Tuple[Tensor, Tensor]:
    """(out (B,H,L,D) in q's dtype, bucket sums s (B,H,L,num_buckets_v) fp32)."""
    ids_k, ids_q, ids_v = _matrices(q.shape[2], grid, ids_k, ids_q, ids_v)
    p = reference_logits(q, k, table_k, ids_k, table_q, ids_q, key_padding_mask).softmax(-1)
    out = (p @ v.to(torch.float32)).to(q.dtype)
    if ids_v is None:
        return out, p.new_zeros((*p.shape[:3], 0))
    return out, _scatter_rows(p, ids_v, num_buckets_v)


def _reduce_to(grad: Tensor, like: Tensor) -> Tensor:
    """Sum a (B, H, L, K) gradient over the batch/head dims that ``like`` broadcasts."""
    dims = [d for d in (0, 1) if like.shape[d] == 1 and grad.shape[d] != 1]
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.to(like.dtype)


def reference_backward(inputs: tuple, grad_out: Tensor, grad_s: Optional[Tensor]) -> tuple:
    """Gradients of (q, k, v, table_k, table_q) by the explicit softmax/gather/scatter adjoints."""
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v, mask, grid = inputs
    ids_k, ids_q, ids_v = _matrices(q.shape[2], grid, ids_k, ids_q, ids_v)
    p = reference_logits(q, k, table_k, ids_k, table_q, ids_q, mask).softmax(-1)
    g = grad_out.to(torch.float32)
    dv = (p.transpose(-2, -1) @ g).to(v.dtype)
    dp = g @ v.to(torch.float32).transpose(-2, -1)
    if ids_v is not None and grad_s is not None and grad_s.numel():
        dp = dp + _gather_rows(grad_s, ids_v, dp.shape)
    dz = p * (dp - (p * dp).sum(-1, keepdim=True))
    dq = (dz @ k.to(torch.float32)).to(q.dtype)
    dk = (dz.transpose(-2, -1) @ q.to(torch.float32)).to(k.dtype)
    dtk = dtq = None
    if table_k is not None:
        dtk = _reduce_to(_scatter_rows(dz, ids_k, table_k.shape[-1]), table_k)
    if table_q is not None:
        dtq = _reduce_to(_scatter_rows(dz.transpose(-2, -1), ids_q, table_q.shape[-1]), table_q)
    return dq, dk, dv, dtk, dtq
