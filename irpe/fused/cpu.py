"""iRPE attention on CPU: the native kernel (irpe.fused.cpu_library) where it is built and the
call is inference on shared contextual tables; else the K/Q terms as SDPA's additive float
mask, V from one softmax.

Without a V term the L x L logits never leave PyTorch's fused CPU attention (flash kernel):
the terms are gathered once into a float mask (padding set to -inf in it, i.e. masked after
the terms are added) and SDPA adds it inside its tiles. With a V term the probabilities are
needed, so one manual pass makes them: logits = mask + (q*scale) k^T in one baddbmm, softmax
in place, then P v and the bucket sums of the same P. The gathers index a flattened table
(B*H, L*K) with precomputed flat ids (index_select), faster on CPU than torch.gather.
"""
from __future__ import annotations

from typing import Optional, Tuple, cast

import torch
import torch.nn.functional as F

from ..idcache import BUCKET_IDS
from ..ops import rpe_scatter
from ..rpe import Encoding, attention_grid, iRPE, rpe_parts
from .cpu_library import library_attention, library_supported, records_grad

__all__ = ["cpu_attention", "attention_logits", "term_mask"]

Tensor = torch.Tensor


def _flat_ids(m: iRPE, length: int, height: Optional[int], width: Optional[int],
              transposed: bool) -> Tensor:
    """int64 (L*L,) positions in the flattened (L*K) table: row*K + id(row, col), where the
    row is the query (K term) or the key (Q term, ``transposed``: the term comes out as Q^T)."""
    def build() -> Tensor:
        ids = m.bucket_ids(length, height, width)
        if transposed:
            ids = ids.t()
            rows = torch.arange(length).view(1, -1) * m.num_buckets
        else:
            rows = torch.arange(length).view(-1, 1) * m.num_buckets
        return (ids.to(torch.long) + rows).reshape(-1)

    if torch.compiler.is_compiling():
        return build()
    grid = m.grid(length, height, width)
    key = ("cpu_flat", m.method, float(m.ratio), grid, transposed)
    return BUCKET_IDS.get_or_build(key, torch.inference_mode(False)(build))


def _gather(m: iRPE, x: Tensor, height: Optional[int], width: Optional[int], transposed: bool,
            scale: float = 1.0) -> Tensor:
    """One part's term (B|1, H|1, L, L) (transposed for the Q term): the contextual table is
    x @ (W * scale), i.e. (x * scale) @ W up to rounding."""
    length = x.shape[2]
    if m.mode == "bias":  # (H|1, K) table: same term for every query, batch broadcast
        table = m.lookup_table_bias.to(x.dtype)
        rows = table.shape[0]
        if transposed:
            ids = m.bucket_ids(length, height, width).t().reshape(-1)
        else:
            ids = m.bucket_ids(length, height, width).reshape(-1)
        return table.index_select(1, ids.to(table.device)).view(1, rows, length, length)
    weight = m.lookup_table_weight.to(x.dtype)  # (H|1, D, K); shared: one GEMM over B*H*L
    weight = weight if scale == 1.0 else weight * scale
    table = torch.matmul(x, weight[0] if weight.shape[0] == 1 else weight.unsqueeze(0))
    b, h = table.shape[:2]
    flat = _flat_ids(m, length, height, width, transposed)
    return table.reshape(b * h, -1).index_select(1, flat).view(b, h, length, length)


def term_mask(qs: Tensor, k: Tensor, scale: float, rpe_q: Optional[Encoding],
              rpe_k: Optional[Encoding], height: Optional[int], width: Optional[int],
              key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """rpe_k(qs) + rpe_q(k*scale)^T with padded keys at -inf: SDPA's float mask (B|1,H|1,L,L)."""
    mask = None
    for module, x, transposed, factor in ((rpe_k, qs, False, 1.0), (rpe_q, k, True, scale)):
        for m in rpe_parts(module):
            term = _gather(m, x, height, width, transposed, factor)
            if mask is None:
                mask = term
            elif records_grad(mask, term):
                mask = mask + term
            elif mask.shape == torch.broadcast_shapes(mask.shape, term.shape):
                mask.add_(term)
            else:
                mask = mask + term
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :].to(torch.bool)
        if mask is None:  # V term only: a (B, 1, 1, L) mask of the padding alone
            mask = qs.new_zeros(pad.shape)
        mask = mask.masked_fill(pad, float("-inf"))
    return mask


def _add_v_term(out: Tensor, attn: Tensor, rpe_v: Optional[Encoding], height: Optional[int],
                width: Optional[int]) -> Tensor:
    """out + rpe_v(attn): bucket sums of the probabilities (fp32), then @ the V tables (one
    in-place addmm per part for shared tables when autograd is off)."""
    for m in rpe_parts(rpe_v):
        ids = m.bucket_ids(attn.shape[2], height, width)
        sums = rpe_scatter(attn, ids, m.num_buckets)
        weight = m.lookup_table_weight.to(attn.dtype)
        if (weight.shape[0] == 1 and not records_grad(out, sums, weight)
                and out.is_contiguous()):
            out.view(-1, out.shape[-1]).addmm_(sums.reshape(-1, m.num_buckets), weight[0])
        else:
            out = out + torch.matmul(sums, weight.unsqueeze(0))
    return out


def _scaled(x: Tensor, scale: float) -> Tensor:
    """x * scale as a contiguous (B, H, L, D) tensor, in one pass when autograd is off (the
    views of the qkv projection are strided; bmm and the table GEMM want them contiguous)."""
    if records_grad(x):
        return (x * scale).contiguous()
    return torch.mul(x, scale, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))


def cpu_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, rpe_q: Optional[Encoding],
                  rpe_k: Optional[Encoding], rpe_v: Optional[Encoding], height: Optional[int],
                  width: Optional[int], key_padding_mask: Optional[Tensor]) -> Tensor:
    """rpe_attention's result (q, k, v (B, H, L, D), self-attention, no active dropout)."""
    attention_grid(rpe_q, rpe_k, rpe_v, q.shape[2], height, width)  # its errors before any work
    if library_supported(q, k, v, rpe_q, rpe_k, rpe_v, key_padding_mask):
        # library_supported admits plain iRPE modules only
        return library_attention(q, k, v, scale, cast("Optional[iRPE]", rpe_q),
                                 cast("Optional[iRPE]", rpe_k), cast("Optional[iRPE]", rpe_v),
                                 height, width)
    qs = _scaled(q, scale)
    kc = k.contiguous() if rpe_q is not None or rpe_v is not None else k
    mask = term_mask(qs, kc, scale, rpe_q, rpe_k, height, width, key_padding_mask)
    if rpe_v is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    attn, shape = attention_logits(qs, kc, mask)
    if records_grad(attn):
        attn = attn.softmax(-1)
    else:  # in place: the row kernel reads each row whole before writing it
        attn = torch.ops.aten._softmax.out(attn, -1, False, out=attn)
    attn = attn.view(shape)
    return _add_v_term(torch.matmul(attn, v), attn, rpe_v, height, width)


def attention_logits(qs: Tensor, k: Tensor, mask: Optional[Tensor]
                     ) -> Tuple[Tensor, torch.Size]:
    """(q*scale) k^T + mask as (B*H, L, L) in one baddbmm, and the (B, H, L, L) shape."""
    b, h, length, d = qs.shape
    shape = torch.Size((b, h, length, length))
    q3 = qs.reshape(b * h, length, d)
    k3 = k.reshape(b * h, length, d).transpose(1, 2)
    if mask is None:
        return torch.bmm(q3, k3), shape
    if mask.shape == shape and not records_grad(mask, q3, k3):  # a fresh mask: add into it
        return mask.view(b * h, length, length).baddbmm_(q3, k3), shape
    return torch.baddbmm(mask.expand(shape).reshape(b * h, length, length), q3, k3), shape
