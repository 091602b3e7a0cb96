// RPEAttention: one (b, h) pair of an iRPE attention block computed in cache, FlashAttention's
// pattern on a CPU: per block of query rows the logits q k^T, the iRPE-K and iRPE-Q terms, the
// softmax, the iRPE-V bucket sums and the products with v and the V table never leave the
// thread's scratch; only q, k, v and the output go through memory. Written once over a vector
// type V (rpe_simd.h) and compiled per instruction set (rpe_simd_avx2.cpp, rpe_simd_avx512.cpp);
// rpe_attention.cpp holds the ONNX Runtime kernel and the portable (scalar) path.
#ifndef IRPE_ORT_RPE_ATTENTION_H
#define IRPE_ORT_RPE_ATTENTION_H

#include <cmath>
#include <cstdint>

#include "rpe_cpu.h"
#include "rpe_simd.h"

namespace irpe_ort {

// Column padding of every scratch row and id row: a multiple of both ISAs' 2-vector tiles.
constexpr int64_t kAttnPad = 32;
inline int64_t attn_pad(int64_t n) { return (n + kAttnPad - 1) / kAttnPad * kAttnPad; }

// One call's sizes and data. Ids are int32 [L, attn_pad(L)], -1 outside the table and in the
// padding; a term is present when its weight is not null.
struct AttnProblem {
    int64_t l = 0, d = 0, bh = 0;                // tokens, head dim, batch * heads
    const float* q = nullptr;                    // [bh, L, d], already scaled
    const float* k = nullptr;                    // [bh, L, d]
    const float* v = nullptr;                    // [bh, L, d]
    float* out = nullptr;                        // [bh, L, d]
    int64_t kk = 0;                              // iRPE-K: table q @ wk, wk [d, attn_pad(kk)]
    const float* wk = nullptr;                   //   (zero columns past kk)
    const int32_t* idk = nullptr;                //   ids into the query's table row
    int64_t kq = 0;                              // iRPE-Q: table wq @ k^T [kq, attn_pad(L)],
    const float* wq = nullptr;                   //   wq [kq, d]
    const int32_t* idq = nullptr;                //   ids c * attn_pad(L) + j into that table
    int64_t kv = 0;                              // iRPE-V: out += bucket sums @ wv,
    const float* wv = nullptr;                   //   wv [kv, attn_pad(d)] (zero past d)
    const int32_t* voff = nullptr;               //   the V index's bucket lists (rpe_cpu.h)
    const int32_t* vpos = nullptr;
};

// Scratch floats one task needs at row block MR.
inline int64_t attn_scratch(const AttnProblem& p, int mr)
{
    const int64_t lp = attn_pad(p.l), dp = attn_pad(p.d);
    const int64_t tq = p.wq != nullptr ? (p.kq + mr - 1) / mr * mr * lp : 0;
    return p.d * lp + tq + mr * lp + mr * attn_pad(p.kk) + mr * dp + mr * p.kv + p.l * dp;
}

// C[MR rows, 2 vectors] (+)= A[MR, kk] B[kk, 2 vectors]: A's rows at stride lda (rows >= m
// repeat row m - 1; C always gets MR rows), B's at ldb. The accumulators stay in registers.
template <class V, int MR>
inline void attn_tile(const float* a, int64_t lda, int m, const float* b, int64_t ldb,
                      int64_t kk, float* c, int64_t ldc, bool acc)
{
    using T = typename V::T;
    const float* ar[MR];
    T c0[MR], c1[MR];
    for (int r = 0; r < MR; ++r) {
        ar[r] = a + (r < m ? r : m - 1) * lda;
        c0[r] = acc ? V::load(c + r * ldc) : V::set1(0.0f);
        c1[r] = acc ? V::load(c + r * ldc + V::kLanes) : V::set1(0.0f);
    }
    for (int64_t t = 0; t < kk; ++t) {
        const T b0 = V::load(b + t * ldb), b1 = V::load(b + t * ldb + V::kLanes);
        for (int r = 0; r < MR; ++r) {
            const T x = V::set1(ar[r][t]);
            c0[r] = V::fmadd(x, b0, c0[r]);
            c1[r] = V::fmadd(x, b1, c1[r]);
        }
    }
    for (int r = 0; r < MR; ++r) {
        V::store(c + r * ldc, c0[r]);
        V::store(c + r * ldc + V::kLanes, c1[r]);
    }
}

// C[MR, n] (+)= A[m rows, kk] B[kk, n], n a multiple of 2 vectors.
template <class V, int MR>
inline void attn_gemm(const float* a, int64_t lda, int m, const float* b, int64_t ldb, int64_t kk,
                      int64_t n, float* c, int64_t ldc, bool acc)
{
    for (int64_t j = 0; j < n; j += 2 * V::kLanes) {
        attn_tile<V, MR>(a, lda, m, b + j, ldb, kk, c + j, ldc, acc);
    }
}

// Logits row += looked-up terms (K first, then Q: the graph's order); padding set to -inf.
template <class V>
inline void attn_terms(const AttnProblem& p, int64_t i, float* row, const float* tk,
                       const float* tq)
{
    const int64_t lp = attn_pad(p.l);
    const typename V::Lut lut(tk, attn_pad(p.kk));
    const int32_t* idk = tk != nullptr ? p.idk + i * lp : nullptr;
    const int32_t* idq = tq != nullptr ? p.idq + i * lp : nullptr;
    if (tk != nullptr && tq != nullptr) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            const typename V::T x = V::add(V::load(row + j), lut.get(idk + j));
            V::store(row + j, V::add(x, V::gather(tq, idq + j)));
        }
    } else if (tk != nullptr) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            V::store(row + j, V::add(V::load(row + j), lut.get(idk + j)));
        }
    } else if (tq != nullptr) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            V::store(row + j, V::add(V::load(row + j), V::gather(tq, idq + j)));
        }
    }
    for (int64_t j = p.l; j < lp; ++j) {
        row[j] = -INFINITY;
    }
}

// Softmax of m rows at stride lp, in place, 4 at a time.
template <class V>
inline void attn_softmax(float* s, int64_t lp, int64_t l, int m)
{
    int r = 0;
    for (; r + 4 <= m; r += 4) {
        float* x[4] = {s + r * lp, s + (r + 1) * lp, s + (r + 2) * lp, s + (r + 3) * lp};
        softmax_rows<V, 4>(x, l, x);
    }
    for (; r < m; ++r) {
        float* x[1] = {s + r * lp};
        softmax_rows<V, 1>(x, l, x);
    }
}

// Query rows [i0, i0 + m) of pair bh; the scratch pieces are set up by attn_pair.
template <class V, int MR>
inline void attn_block(const AttnProblem& p, int64_t bh, int64_t i0, int m, const float* kt,
                       const float* tq, const float* v, int64_t ldv, float* s, float* tk,
                       float* c, float* sums)
{
    const int64_t l = p.l, d = p.d, lp = attn_pad(l), dp = attn_pad(d), kp = attn_pad(p.kk);
    const float* q = p.q + (bh * l + i0) * d;
    attn_gemm<V, MR>(q, d, m, kt, lp, d, lp, s, lp, false);
    if (p.wk != nullptr) {
        attn_gemm<V, MR>(q, d, m, p.wk, kp, d, kp, tk, kp, false);
    }
    for (int r = 0; r < m; ++r) {
        attn_terms<V>(p, i0 + r, s + r * lp, p.wk != nullptr ? tk + r * kp : nullptr, tq);
    }
    attn_softmax<V>(s, lp, l, m);
    attn_gemm<V, MR>(s, lp, m, v, ldv, l, dp, c, dp, false);
    if (p.wv != nullptr) {
        for (int r = 0; r < m; ++r) {
            const int64_t i = i0 + r;
            scatter_row(s + r * lp, p.voff + i * (p.kv + 1), p.vpos + i * l, p.kv, sums + r * p.kv);
        }
        attn_gemm<V, MR>(sums, p.kv, m, p.wv, dp, p.kv, dp, c, dp, true);
    }
    float* out = p.out + (bh * l + i0) * d;
    for (int r = 0; r < m; ++r) {
        for (int64_t j = 0; j < d; ++j) {
            out[r * d + j] = c[r * dp + j];
        }
    }
}

// Pair bh: k^T packed [d, lp] (zero padding), the bucket-major Q table, v padded when d is not
// a multiple of kAttnPad, then the query row blocks. scratch: attn_scratch(p, MR) floats.
template <class V, int MR>
inline void attn_pair(const AttnProblem& p, int64_t bh, float* scratch)
{
    const int64_t l = p.l, d = p.d, lp = attn_pad(l), dp = attn_pad(d);
    const float* k = p.k + bh * l * d;
    float* kt = scratch;
    float* tq = kt + d * lp;
    float* s = tq + (p.wq != nullptr ? (p.kq + MR - 1) / MR * MR * lp : 0);
    float* tk = s + MR * lp;
    float* c = tk + MR * attn_pad(p.kk);
    float* sums = c + MR * dp;
    float* vp = sums + MR * p.kv;
    for (int64_t t = 0; t < d; ++t) {
        for (int64_t j = 0; j < l; ++j) {
            kt[t * lp + j] = k[j * d + t];
        }
        for (int64_t j = l; j < lp; ++j) {
            kt[t * lp + j] = 0.0f;
        }
    }
    if (p.wq != nullptr) {
        for (int64_t c0 = 0; c0 < p.kq; c0 += MR) {
            const int m = static_cast<int>(p.kq - c0 < MR ? p.kq - c0 : MR);
            attn_gemm<V, MR>(p.wq + c0 * d, d, m, kt, lp, d, lp, tq + c0 * lp, lp, false);
        }
    }
    const float* v = p.v + bh * l * d;
    int64_t ldv = d;
    if (d != dp) {
        for (int64_t j = 0; j < l; ++j) {
            for (int64_t t = 0; t < dp; ++t) {
                vp[j * dp + t] = t < d ? v[j * d + t] : 0.0f;
            }
        }
        v = vp;
        ldv = dp;
    }
    for (int64_t i0 = 0; i0 < l; i0 += MR) {
        const int m = static_cast<int>(l - i0 < MR ? l - i0 : MR);
        attn_block<V, MR>(p, bh, i0, m, kt, p.wq != nullptr ? tq : nullptr, v, ldv, s, tk, c,
                          sums);
    }
}

using AttnPairFn = void (*)(const AttnProblem&, int64_t, float*);
void attention_pair_avx2(const AttnProblem& p, int64_t bh, float* scratch);
void attention_pair_avx512(const AttnProblem& p, int64_t bh, float* scratch);
constexpr int kAttnRowsAvx2 = 6, kAttnRowsAvx512 = 12;

}  // namespace irpe_ort

#endif  // IRPE_ORT_RPE_ATTENTION_H
