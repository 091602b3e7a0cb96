"""Triton forward kernel of fused iRPE attention (FlashAttention tiles, online softmax).

One program owns BLOCK_M queries of one (batch, head) and walks the keys in BLOCK_N tiles; no
L x L tensor is written. Per tile: logits = q_scaled @ k^T (fp32), + K-term table rows of the
queries gathered at ids_k[i, j], + Q-term table rows of the keys gathered at ids_q[j, i], then
the key padding mask (after the RPE terms, as DETR), online softmax, acc += p @ v and, for the
V term, bucket sums s[i, t] += sum_j p[i, j] [ids_v[i, j] == t] with the same rescaling.
Every id input is a stack of NID planes (cross: rows and cols, cols offset by their bucket count),
either (L, L) id matrices or, with ID_TABLE, tables over the relative offsets (dr, dc) of the
GH x GW grid plus one skip-bucket entry: O(L) ids, exact for every method.
"""
from __future__ import annotations

import triton.language as tl

from .jit import lazy_jit

__all__ = ["get_kernel"]


def _rpe_attention_fwd(
        Q, K, V, TK, TQ, IDK, IDQ, IDV, MASK, OUT, S, LSE,
        sqb, sqh, sql, skb, skh, skl, svb, svh, svl,
        stkb, stkh, stkl, stqb, stqh, stql, smb,
        sob, soh, sol, ssb, ssh, ssl,
        H, L, D, NBV, GH, GW, SKIP, PLANE,
        ID_TABLE: tl.constexpr, HAS_TK: tl.constexpr, HAS_TQ: tl.constexpr, HAS_V: tl.constexpr,
        HAS_MASK: tl.constexpr, NIDK: tl.constexpr, NIDQ: tl.constexpr, NIDV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_T: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr,
        STORE_LSE: tl.constexpr):
    """Forward of one (query block, batch*head); the last dims of q/k/v/out/s are contiguous.
    STORE_LSE: also write the rows' log2-sum-exp2 (B*H, L) fp32 for the backward kernel."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    d_ok = offs_d < D
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_F32:  # bf16 on the CPU interpreter (tl.dot mishandles it): upcast; launch.dot_in_f32
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    s_acc = tl.zeros([BLOCK_M, BLOCK_T], tl.float32)
    offs_t = tl.arange(0, BLOCK_T)
    # ID_TABLE: ids from the (2GH-1, 2GW-1) table of relative offsets (+1 entry: skip bucket)
    pos_m = tl.maximum(offs_m - SKIP, 0)
    r_m = pos_m // GW
    c_m = pos_m % GW
    rel_w = 2 * GW - 1
    offs_j = tl.arange(0, BLOCK_N)
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < L
        tile_ok = row_ok[:, None] & col_ok[None, :]
        if ID_TABLE:
            pos_n = tl.maximum(offs_n - SKIP, 0)
            dr = r_m[:, None] - (pos_n // GW)[None, :]
            dc = c_m[:, None] - (pos_n % GW)[None, :]
            grid_pair = (offs_m >= SKIP)[:, None] & (offs_n >= SKIP)[None, :]
            idx_ij = tl.where(grid_pair, (dr + GH - 1) * rel_w + dc + GW - 1, PLANE - 1)
            idx_ji = tl.where(grid_pair, (GH - 1 - dr) * rel_w + GW - 1 - dc, PLANE - 1)
        else:  # the (L, L) id matrix
            idx_ij = offs_m[:, None] * L + offs_n[None, :]
            idx_ji = offs_n[None, :] * L + offs_m[:, None]
        kt = tl.load(K + b * skb + h * skh + offs_n[None, :] * skl + offs_d[:, None],
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        if DOT_F32:
            kt = kt.to(tl.float32)
        if IEEE:
            qk = tl.dot(q, kt, input_precision="ieee")
        else:
            qk = tl.dot(q, kt)
        if HAS_TK:  # table rows of the queries, bucket ids_k[i, j]
            for p in tl.static_range(NIDK):
                ids = tl.load(IDK + p * PLANE + idx_ij, mask=tile_ok, other=0)
                qk += tl.load(TK + b * stkb + h * stkh + offs_m[:, None] * stkl + ids,
                              mask=tile_ok, other=0.0).to(tl.float32)
        if HAS_TQ:  # table rows of the keys, bucket ids_q[j, i] (the transposed term)
            for p in tl.static_range(NIDQ):
                ids = tl.load(IDQ + p * PLANE + idx_ji, mask=tile_ok, other=0)
                qk += tl.load(TQ + b * stqb + h * stqh + offs_n[None, :] * stql + ids,
                              mask=tile_ok, other=0.0).to(tl.float32)
        keep = col_ok
        if HAS_MASK:  # DETR key padding, applied after the RPE terms
            pad = tl.load(MASK + b * smb + offs_n, mask=col_ok, other=1)
            keep = keep & (pad == 0)
        qk = tl.where(keep[None, :], qk * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p_ij = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            v = v.to(tl.float32)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p_ij.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p_ij.to(v.dtype), v)
        if HAS_V:  # bucket sums with the same online-softmax rescaling, one key column at
            # a time: the live one-hot is (BLOCK_M, BLOCK_T), never (BLOCK_M, BLOCK_N, BLOCK_T),
            # so DETR-size tables (BLOCK_T 128) stay in registers beside the tensor-core tiles
            s_acc = s_acc * alpha[:, None]
            for jj in range(BLOCK_N):
                n = offs_m * 0 + start_n + jj  # the key, as a (BLOCK_M,) vector
                p_col = tl.sum(tl.where(offs_j[None, :] == jj, p_ij, 0.0), 1)
                if ID_TABLE:
                    pos_j = tl.maximum(n - SKIP, 0)
                    pair = (offs_m >= SKIP) & (n >= SKIP)
                    idx_col = tl.where(pair, (r_m - pos_j // GW + GH - 1) * rel_w
                                       + c_m - pos_j % GW + GW - 1, PLANE - 1)
                else:
                    idx_col = offs_m * L + n
                for p in tl.static_range(NIDV):
                    id_col = tl.load(IDV + p * PLANE + idx_col, mask=row_ok & (n < L), other=-1)
                    s_acc += tl.where(id_col[:, None] == offs_t[None, :], p_col[:, None], 0.0)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(OUT + b * sob + h * soh + offs_m[:, None] * sol + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if STORE_LSE:
        tl.store(LSE + pid_bh * L + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    if HAS_V:
        s_val = s_acc / l_i[:, None]
        tl.store(S + b * ssb + h * ssh + offs_m[:, None] * ssl + offs_t[None, :], s_val,
                 mask=row_ok[:, None] & (offs_t[None, :] < NBV))


# The jitted kernel, built on first use (triton.jit reads TRITON_INTERPRET when applied).
get_kernel = lazy_jit(_rpe_attention_fwd)
