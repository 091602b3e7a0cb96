"""Torch reference of the fused iRPE attention op and its explicit backward, in row chunks.

Same inputs as ``irpe::fused_rpe_attention``: q already scaled, tables (Bt|1, Ht|1, L, K) that
broadcast over batch/heads, id stacks whose planes are summed: (NID, L, L) matrices, or with
``grid`` relative-offset tables (NID, (2h-1)(2w-1)+1). Work goes in chunks of query rows so
memory stays O(rows x L) (about CHUNK_ELEMS fp32 values per temporary), not O(L^2). Used where
the kernel cannot run, for the backward and in tests.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import torch

__all__ = ["ids_block", "expand_ids", "reference_forward", "reference_backward", "reduce_grad_to",
           "CHUNK_ELEMS"]

Tensor = torch.Tensor
# the op's inputs, in order: q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v,
# key_padding_mask, grid
FusedInputs = Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor],
                    Optional[Tensor], Optional[Tensor], int, Optional[Tensor], Optional[List[int]]]
# gradients of q, k, v, table_k, table_q (None for an absent table)
FusedGrads = Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]
CHUNK_ELEMS = 1 << 24  # fp32 values per (B, H, rows, L) temporary: 64 MB


def ids_block(ids: Tensor, grid: Optional[List[int]], length: int, rows: Tensor,
              cols: Tensor) -> Tensor:
    """Ids (NID, len(rows), len(cols)) of the pairs (rows x cols), from either id layout."""
    if grid is None:
        return ids[:, rows[:, None], cols[None, :]]
    gh, gw, skip = grid
    pr, pc = (rows - skip).clamp(min=0), (cols - skip).clamp(min=0)
    idx = ((pr // gw)[:, None] - (pc // gw)[None, :] + gh - 1) * (2 * gw - 1) \
        + (pr % gw)[:, None] - (pc % gw)[None, :] + gw - 1
    inside = (rows >= skip)[:, None] & (cols >= skip)[None, :]
    return ids[:, torch.where(inside, idx, ids.shape[1] - 1)]


def expand_ids(ids: Tensor, grid: Optional[List[int]], length: int) -> Tensor:
    """The full (NID, L, L) id matrices (tests; O(L^2))."""
    tokens = torch.arange(length, device=ids.device)
    return ids_block(ids, grid, length, tokens, tokens)


def _gather(table: Tensor, ids: Tensor, shape: Sequence[int]) -> Tensor:
    """out[b,h,r,c] = sum over planes p of table[b,h,r,ids[p,r,c]] in fp32; shape (B,H,R,C)."""
    b, h, r, c = shape
    t = table.to(torch.float32).expand(b, h, r, table.shape[-1])
    out = torch.zeros(shape, dtype=torch.float32, device=table.device)
    for plane in ids:
        out = out + torch.gather(t, 3, plane.to(torch.long).expand(b, h, r, c))
    return out


def _scatter(x: Tensor, ids: Tensor, num_buckets: int) -> Tensor:
    """s[b,h,r,t] = sum over planes and c with ids[p,r,c] = t of x[b,h,r,c] (fp32)."""
    b, h, r, c = x.shape
    out = torch.zeros((b, h, r, num_buckets), dtype=torch.float32, device=x.device)
    for plane in ids:
        out.scatter_add_(3, plane.to(torch.long).expand(b, h, r, c), x.to(torch.float32))
    return out


def _chunks(q: Tensor) -> Iterator[Tensor]:
    b, h, length, _ = q.shape
    size = max(1, min(length, CHUNK_ELEMS // max(1, b * h * length)))
    for start in range(0, length, size):
        yield torch.arange(start, min(start + size, length), device=q.device)


def _probs(inputs: FusedInputs, rows: Tensor, cols: Tensor) -> Tensor:
    """Softmax rows (B, H, R, L) fp32: q k^T + K term + Q term, padding -inf after the terms."""
    q, k, _, table_k, ids_k, table_q, ids_q, _, _, mask, grid = inputs
    length = k.shape[2]
    logits = q[:, :, rows].to(torch.float32) @ k.to(torch.float32).transpose(-2, -1)
    # a table comes with its ids (check_inputs)
    if table_k is not None:
        logits = logits + _gather(table_k[:, :, rows],
                                  ids_block(cast(Tensor, ids_k), grid, length, rows, cols),
                                  logits.shape)
    if table_q is not None:  # term[i, j] = table_q[j, ids_q[j, i]]
        shape = (*logits.shape[:2], length, len(rows))
        logits = logits + _gather(table_q, ids_block(cast(Tensor, ids_q), grid, length, cols, rows),
                                  shape).transpose(-2, -1)
    if mask is not None:
        logits = logits.masked_fill(mask[:, None, None, :].bool(), float("-inf"))
    return logits.softmax(-1)


def reference_forward(q: Tensor, k: Tensor, v: Tensor, table_k: Optional[Tensor],
                      ids_k: Optional[Tensor], table_q: Optional[Tensor], ids_q: Optional[Tensor],
                      ids_v: Optional[Tensor], num_buckets_v: int,
                      key_padding_mask: Optional[Tensor], grid: Optional[List[int]] = None
                      ) -> Tuple[Tensor, Tensor]:
    """(out (B,H,L,D) in q's dtype, bucket sums s (B,H,L,num_buckets_v) fp32)."""
    inputs: FusedInputs = (q, k, v, table_k, ids_k, table_q, ids_q, ids_v, num_buckets_v,
                           key_padding_mask, grid)
    b, h, length, _ = q.shape
    cols = torch.arange(length, device=q.device)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    s = q.new_zeros((b, h, length, num_buckets_v if ids_v is not None else 0),
                    dtype=torch.float32)
    for rows in _chunks(q):
        p = _probs(inputs, rows, cols)
        out[:, :, rows] = p @ v.to(torch.float32)
        if ids_v is not None:
            s[:, :, rows] = _scatter(p, ids_block(ids_v, grid, length, rows, cols), num_buckets_v)
    return out.to(q.dtype), s


def reduce_grad_to(grad: Tensor, like: Tensor) -> Tensor:
    """Sum a (B, H, L, K) gradient over the batch/head dims that ``like`` broadcasts."""
    dims = [d for d in (0, 1) if like.shape[d] == 1 and grad.shape[d] != 1]
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.to(like.dtype)


def reference_backward(inputs: FusedInputs, grad_out: Optional[Tensor], grad_s: Optional[Tensor]
                       ) -> FusedGrads:
    """Gradients of (q, k, v, table_k, table_q) by the explicit softmax/gather/scatter adjoints,
    recomputing the probabilities chunk by chunk."""
    q, k, v, table_k, ids_k, table_q, ids_q, ids_v, _, _, grid = inputs
    b, h, length, _ = q.shape
    cols = torch.arange(length, device=q.device)
    f32: Dict[str, Any] = dict(dtype=torch.float32, device=q.device)
    dq, dk, dv = (torch.zeros(x.shape, **f32) for x in (q, k, v))
    if grad_out is None:
        grad_out = torch.zeros(q.shape, **f32)
    dtk = None if table_k is None else torch.zeros((b, h, length, table_k.shape[-1]), **f32)
    dtq = None if table_q is None else torch.zeros((b, h, length, table_q.shape[-1]), **f32)
    k32, v32 = k.to(torch.float32), v.to(torch.float32)
    for rows in _chunks(q):
        p = _probs(inputs, rows, cols)
        g = grad_out[:, :, rows].to(torch.float32)
        dv += p.transpose(-2, -1) @ g
        dp = g @ v32.transpose(-2, -1)
        if ids_v is not None and grad_s is not None and grad_s.numel():
            dp = dp + _gather(grad_s[:, :, rows], ids_block(ids_v, grid, length, rows, cols),
                              dp.shape)
        dz = p * (dp - (p * dp).sum(-1, keepdim=True))
        dq[:, :, rows] = dz @ k32
        dk += dz.transpose(-2, -1) @ q[:, :, rows].to(torch.float32)
        if dtk is not None:  # (with table_k, so with ids_k)
            dtk[:, :, rows] = _scatter(dz, ids_block(cast(Tensor, ids_k), grid, length, rows, cols),
                                       dtk.shape[-1])
        if dtq is not None:
            dtq += _scatter(dz.transpose(-2, -1).contiguous(),
                            ids_block(cast(Tensor, ids_q), grid, length, cols, rows),
                            dtq.shape[-1])
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            None if dtk is None or table_k is None else reduce_grad_to(dtk, table_k),
            None if dtq is None or table_q is None else reduce_grad_to(dtq, table_q))
