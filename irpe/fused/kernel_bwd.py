"""Triton backward kernel of fused iRPE attention (FlashAttention-2 style, O(L) extra memory).

One program owns BLOCK_N keys of one (batch, head) and walks the queries in BLOCK_M tiles. It
recomputes the logits tile exactly as the forward (same gathers, padding after the terms) and
p = exp2(logits * log2(e) - lse) from the forward's saved log2-sum-exp2, then
dv_j += p^T do; dp = do v^T (+ ds gathered at ids_v for the V term); dz = p (dp - delta);
dk_j += dz^T q. dq, the K-table gradient (rows of the queries, bucket ids_k[i, j]) and the
Q-table gradient (rows of the keys, bucket ids_q[j, i]) take atomic adds into fp32 buffers.
"""
from __future__ import annotations

import triton.language as tl

from .jit import lazy_jit

__all__ = ["get_backward_kernel"]


def _rpe_attention_bwd(
        Q, K, V, TK, TQ, IDK, IDQ, IDV, MASK, DO, DS, LSE, DELTA, DQ, DK, DV, DTK, DTQ,
        sqb, sqh, sql, skb, skh, skl, svb, svh, svl,
        stkb, stkh, stkl, stqb, stqh, stql, smb, sdob, sdoh, sdol, ssb, ssh, ssl,
        H, L, D, NBK, NBQ, GH, GW, SKIP, PLANE,
        ID_TABLE: tl.constexpr, HAS_TK: tl.constexpr, HAS_TQ: tl.constexpr,
        HAS_V: tl.constexpr, HAS_MASK: tl.constexpr, NIDK: tl.constexpr, NIDQ: tl.constexpr,
        NIDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr):
    """Gradients for one (key block, batch*head); dq/dk/dv/dtk/dtq buffers are contiguous fp32."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < L
    d_ok = offs_d < D
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skl + offs_d[None, :], mask=kv_mask,
                other=0.0)
    v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :], mask=kv_mask,
                other=0.0)
    if DOT_F32:  # bf16 on the CPU interpreter (tl.dot mishandles it): upcast; launch.dot_in_f32
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    keep = col_ok
    if HAS_MASK:
        pad = tl.load(MASK + b * smb + offs_n, mask=col_ok, other=1)
        keep = keep & (pad == 0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    pos_n = tl.maximum(offs_n - SKIP, 0)
    r_n = pos_n // GW
    c_n = pos_n % GW
    rel_w = 2 * GW - 1
    bh_rows = pid_bh * L
    for start_m in range(0, L, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < L
        tile_ok = row_ok[:, None] & col_ok[None, :]
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :], mask=q_mask,
                    other=0.0)
        do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdol + offs_d[None, :],
                     mask=q_mask, other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        if ID_TABLE:
            pos_m = tl.maximum(offs_m - SKIP, 0)
            dr = (pos_m // GW)[:, None] - r_n[None, :]
            dc = (pos_m % GW)[:, None] - c_n[None, :]
            grid_pair = (offs_m >= SKIP)[:, None] & (offs_n >= SKIP)[None, :]
            idx_ij = tl.where(grid_pair, (dr + GH - 1) * rel_w + dc + GW - 1, PLANE - 1)
            idx_ji = tl.where(grid_pair, (GH - 1 - dr) * rel_w + GW - 1 - dc, PLANE - 1)
        else:
            idx_ij = offs_m[:, None] * L + offs_n[None, :]
            idx_ji = offs_n[None, :] * L + offs_m[:, None]
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        if HAS_TK:
            for p in tl.static_range(NIDK):
                ids = tl.load(IDK + p * PLANE + idx_ij, mask=tile_ok, other=0)
                qk += tl.load(TK + b * stkb + h * stkh + offs_m[:, None] * stkl + ids,
                              mask=tile_ok, other=0.0).to(tl.float32)
        if HAS_TQ:
            for p in tl.static_range(NIDQ):
                ids = tl.load(IDQ + p * PLANE + idx_ji, mask=tile_ok, other=0)
                qk += tl.load(TQ + b * stqb + h * stqh + offs_n[None, :] * stql + ids,
                              mask=tile_ok, other=0.0).to(tl.float32)
        lse = tl.load(LSE + bh_rows + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh_rows + offs_m, mask=row_ok, other=0.0)
        p_ij = tl.exp2(qk * 1.4426950408889634 - lse[:, None])
        p_ij = tl.where(keep[None, :] & row_ok[:, None], p_ij, 0.0)
        if IEEE:
            dv += tl.dot(tl.trans(p_ij), do, input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            dv += tl.dot(tl.trans(p_ij.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
        if HAS_V:
            for p in tl.static_range(NIDV):
                ids = tl.load(IDV + p * PLANE + idx_ij, mask=tile_ok, other=0)
                dp += tl.load(DS + b * ssb + h * ssh + offs_m[:, None] * ssl + ids, mask=tile_ok,
                              other=0.0)
        dz = p_ij * (dp - delta[:, None])
        if IEEE:
            dk += tl.dot(tl.trans(dz), q, input_precision="ieee")
            dq = tl.dot(dz, k, input_precision="ieee")
        else:
            dk += tl.dot(tl.trans(dz.to(q.dtype)), q)
            dq = tl.dot(dz.to(k.dtype), k)
        tl.atomic_add(DQ + (bh_rows + offs_m[:, None]) * D + offs_d[None, :], dq, mask=q_mask)
        if HAS_TK:
            for p in tl.static_range(NIDK):
                ids = tl.load(IDK + p * PLANE + idx_ij, mask=tile_ok, other=0)
                tl.atomic_add(DTK + (bh_rows + offs_m[:, None]) * NBK + ids, dz, mask=tile_ok)
        if HAS_TQ:
            for p in tl.static_range(NIDQ):
                ids = tl.load(IDQ + p * PLANE + idx_ji, mask=tile_ok, other=0)
                tl.atomic_add(DTQ + (bh_rows + offs_n[None, :]) * NBQ + ids, dz, mask=tile_ok)
    out_rows = (bh_rows + offs_n[:, None]) * D + offs_d[None, :]
    tl.store(DK + out_rows, dk, mask=kv_mask)
    tl.store(DV + out_rows, dv, mask=kv_mask)


# The jitted backward kernel, built on first use (as kernel.get_kernel).
get_backward_kernel = lazy_jit(_rpe_attention_bwd)
