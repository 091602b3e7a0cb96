// RPEAttention: one (b, h) pair of an iRPE attention block computed in cache, FlashAttention's
// pattern on a CPU: per block of query rows the logits q k^T, the iRPE-K and iRPE-Q terms, the
// softmax, the iRPE-V bucket sums and the products with v and the V table never leave the
// thread's scratch; only q, k, v and the output go through memory. Written once over a vector
// type V (rpe_simd.h) and compiled per instruction set (rpe_simd_avx2.cpp, rpe_simd_avx512.cpp);
// rpe_attention_run.cpp holds the portable (scalar) path; the tasks, the plan and the id tables
// are declared in rpe_attention_plan.h, the binding of a caller's inputs in rpe_attention_bind.h.
#ifndef IRPE_CPU_RPE_ATTENTION_H
#define IRPE_CPU_RPE_ATTENTION_H

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "rpe_attention_problem.h"
#include "rpe_simd.h"

namespace irpe_cpu {

// C[MR rows, NV vectors] (+)= A[MR, kk] B[kk, NV vectors]: A's rows at stride lda (rows >= m
// repeat row m - 1; C always gets MR rows), B's at ldb. The accumulators stay in registers.
template <class V, int MR, int NV>
inline void attn_tile(const float* a, int64_t lda, int m, const float* b, int64_t ldb,
                      int64_t kk, float* c, int64_t ldc, bool acc)
{
    using T = typename V::T;
    const float* ar[MR];
    T cv[NV][MR];
    for (int r = 0; r < MR; ++r) {
        ar[r] = a + (r < m ? r : m - 1) * lda;
        for (int u = 0; u < NV; ++u) {
            cv[u][r] = acc ? V::load(c + r * ldc + u * V::kLanes) : V::set1(0.0f);
        }
    }
    for (int64_t t = 0; t < kk; ++t) {
        T bv[NV];
        for (int u = 0; u < NV; ++u) {
            bv[u] = V::load(b + t * ldb + u * V::kLanes);
        }
        for (int r = 0; r < MR; ++r) {
            const T x = V::set1(ar[r][t]);
            for (int u = 0; u < NV; ++u) {
                cv[u][r] = V::fmadd(x, bv[u], cv[u][r]);
            }
        }
    }
    for (int r = 0; r < MR; ++r) {
        for (int u = 0; u < NV; ++u) {
            V::store(c + r * ldc + u * V::kLanes, cv[u][r]);
        }
    }
}

// C[MR, n] (+)= A[m rows, kk] B[kk, n], n a multiple of kAttnPad: 2-vector tiles, then a
// 1-vector one; m at most half of MR runs the half-height tiles (the last query block).
template <class V, int MR>
inline void attn_gemm(const float* a, int64_t lda, int m, const float* b, int64_t ldb, int64_t kk,
                      int64_t n, float* c, int64_t ldc, bool acc)
{
    if constexpr (MR % 2 == 0 && MR > 2) {
        if (2 * m <= MR) {
            attn_gemm<V, MR / 2>(a, lda, m, b, ldb, kk, n, c, ldc, acc);
            return;
        }
    }
    int64_t j = 0;
    for (; j + 2 * V::kLanes <= n; j += 2 * V::kLanes) {
        attn_tile<V, MR, 2>(a, lda, m, b + j, ldb, kk, c + j, ldc, acc);
    }
    for (; j < n; j += V::kLanes) {
        attn_tile<V, MR, 1>(a, lda, m, b + j, ldb, kk, c + j, ldc, acc);
    }
}

// Logits row = scale * row + looked-up terms (K first, then Q: the graph's order); padding
// set to -inf.
// The Q term: q.bias, the row's bias made by key, else gathered from q.table by p.idq.
struct AttnQ {
    const float* table;
    const float* bias;
};

template <class V>
inline void attn_terms(const AttnProblem& p, int64_t i, float* row, const float* tk, AttnQ q)
{
    using T = typename V::T;
    const int64_t lp = attn_pad(p.l);
    const typename V::Lut lut(tk, attn_pad(p.kk));
    const int32_t* idk = tk != nullptr ? p.idk + i * lp : nullptr;
    const int32_t* idq = q.table != nullptr ? p.idq + i * lp : nullptr;
    const bool has_q = q.table != nullptr || q.bias != nullptr;
    const T scale = V::set1(p.scale);
    auto q_term = [&](int64_t j) {
        return q.bias != nullptr ? V::load(q.bias + j) : V::gather(q.table, idq + j);
    };
    if (tk != nullptr && has_q) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            const T x = V::add(V::mul(V::load(row + j), scale), lut.get(idk + j));
            V::store(row + j, V::add(x, q_term(j)));
        }
    } else if (tk != nullptr) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            V::store(row + j, V::add(V::mul(V::load(row + j), scale), lut.get(idk + j)));
        }
    } else if (has_q) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            V::store(row + j, V::add(V::mul(V::load(row + j), scale), q_term(j)));
        }
    } else if (p.scale != 1.0f) {
        for (int64_t j = 0; j < lp; j += V::kLanes) {
            V::store(row + j, V::mul(V::load(row + j), scale));
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

// One softmax row's V bucket sums: sums[t] = sum of row[j] over the keys j with id t (ids
// `vid`, kv where a key is in no bucket: a slot never read), without branches, in kVCopies
// partial sums (acc: kVCopies * (kv + 1) floats): per-row bucket lists (RPEScatter's) loop a
// few keys per bucket and mispredict at nearly every bucket (docs/kernels.md).
inline void attn_vsums(const float* __restrict row, const int32_t* __restrict vid, int64_t l,
                       int64_t kv, float* __restrict acc, float* __restrict sums)
{
    static_assert(kVCopies == 4, "the last loop adds exactly four copies");
    const int64_t stride = kv + 1;
    for (int64_t t = 0; t < kVCopies * stride; ++t) {
        acc[t] = 0.0f;
    }
    int64_t j = 0;
    for (; j + kVCopies <= l; j += kVCopies) {
        for (int c = 0; c < kVCopies; ++c) {
            acc[c * stride + vid[j + c]] += row[j + c];
        }
    }
    for (; j < l; ++j) {
        acc[vid[j]] += row[j];
    }
    for (int64_t t = 0; t < kv; ++t) {
        sums[t] = (acc[t] + acc[stride + t]) + (acc[2 * stride + t] + acc[3 * stride + t]);
    }
}

// The output tile c [m, attn_pad(d)] of query rows [i0, i0 + m) of pair bh to p.out.
inline void attn_store(const AttnProblem& p, int64_t bh, int64_t i0, int m, const float* c)
{
    const int64_t d = p.d, dp = attn_pad(d);
    float* out = p.out + p.out_layout.at(bh, p.heads) + i0 * p.out_layout.row;
    for (int r = 0; r < m; ++r) {
        for (int64_t j = 0; j < d; ++j) {
            out[r * p.out_layout.row + j] = c[r * dp + j];
        }
    }
}

// k^T of pair bh packed [d, attn_pad(L)] (zero padding) into kt: 16 x 16 blocks through
// V::transpose16 where V has 16 lanes (a scalar transpose reads a cache line per key for
// every dim), the rest one value at a time.
template <class V>
inline void attn_pack_kt(const AttnProblem& p, int64_t bh, float* kt)
{
    const int64_t l = p.l, lp = attn_pad(l), ld = p.in.row;
    const float* k = p.k + p.in.at(bh, p.heads);
    int64_t jb = 0, tb = 0;  // keys [0, jb) x dims [0, tb) go by blocks
    if constexpr (V::kLanes == kAttnPad) {
        jb = l / kAttnPad * kAttnPad;
        tb = p.d / kAttnPad * kAttnPad;
        for (int64_t j0 = 0; j0 < jb; j0 += kAttnPad) {
            for (int64_t t0 = 0; t0 < tb; t0 += kAttnPad) {
                V::transpose16(k + j0 * ld + t0, ld, kt + t0 * lp + j0, lp);
            }
        }
    }
    for (int64_t t = 0; t < p.d; ++t) {
        for (int64_t j = t < tb ? jb : 0; j < l; ++j) {
            kt[t * lp + j] = k[j * ld + t];
        }
        for (int64_t j = l; j < lp; ++j) {
            kt[t * lp + j] = 0.0f;
        }
    }
}

// The bucket-major Q table wq @ k^T [kq, attn_pad(L)] into tq (when the Q term is present).
template <class V, int MR>
inline void attn_q_table(const AttnProblem& p, const float* kt, float* tq)
{
    const int64_t lp = attn_pad(p.l);
    for (int64_t c0 = 0; p.wq != nullptr && c0 < p.kq; c0 += MR) {
        const int m = static_cast<int>(p.kq - c0 < MR ? p.kq - c0 : MR);
        attn_gemm<V, MR>(p.wq + c0 * p.d, p.d, m, kt, lp, p.d, lp, tq + c0 * lp, lp, false);
    }
}

// By key (kQByKey): the Q bias of query rows [row0, row1) into w.bq [Lp, Lp] (row i the bias
// of query i) from the bucket-major table tq [64 rows, Lp]; false where V or p do not allow
// it (then the rows gather from tq).
template <class V>
inline bool attn_q_bias(const AttnProblem& p, int64_t row0, int64_t row1, const float* tq,
                        const AttnScratch& w)
{
    if constexpr (V::kLanes != kAttnPad) {
        return false;
    } else {
        if (!attn_q_by_key(p)) {
            return false;
        }
        const int64_t l = p.l, lp = attn_pad(l);
        for (int64_t j = 0; j < lp; j += kAttnPad) {  // tqt [Lp, 64]: row j the Q term of key j
            for (int64_t c = 0; c < kQByKey; c += kAttnPad) {
                V::transpose16(tq + c * lp + j, lp, w.tqt + j * kQByKey + c, kQByKey);
            }
        }
        const int64_t i0 = row0 / kAttnPad * kAttnPad, i1 = attn_pad(row1);
        for (int64_t j = 0; j < lp; ++j) {  // bias^T: row j over the queries
            const typename V::Lut lut(w.tqt + j * kQByKey, kQByKey);
            for (int64_t i = i0; i < i1; i += kAttnPad) {
                V::store(w.bt + j * lp + i,
                         j < l ? lut.get(p.idqt + j * lp + i) : V::set1(0.0f));
            }
        }
        for (int64_t i = i0; i < i1; i += kAttnPad) {
            for (int64_t j = 0; j < lp; j += kAttnPad) {
                V::transpose16(w.bt + j * lp + i, lp, w.bq + i * lp + j, lp);
            }
        }
        return true;
    }
}

// The V bucket sums of query rows [i0, i0 + m) (softmax rows in w.s) into w.sums: by runs
// where V has 16 lanes and p.vruns is given, else key by key (attn_vsums).
template <class V>
inline void attn_block_vsums(const AttnProblem& p, int64_t i0, int m, const AttnScratch& w)
{
    const int64_t l = p.l, lp = attn_pad(l);
    for (int r = 0; r < m; ++r) {
        float* sums = w.sums + r * p.kv;
        if constexpr (V::kLanes == kAttnPad) {
            if (p.vruns != nullptr) {
                V::prefix_sums(w.s + r * lp, lp, w.pre);
                const int32_t* run = p.vruns + (i0 + r) * attn_runs_stride(l);
                for (int64_t t = 0; t <= p.kv; ++t) {
                    w.vacc[t] = 0.0f;
                }
                float before = 0.0f;
                for (;; run += 2) {
                    const float upto = w.pre[run[0] - 1];
                    w.vacc[run[1]] += upto - before;
                    before = upto;
                    if (run[0] == l) {
                        break;
                    }
                }
                for (int64_t t = 0; t < p.kv; ++t) {
                    sums[t] = w.vacc[t];
                }
                continue;
            }
        }
        attn_vsums(w.s + r * lp, p.idv + (i0 + r) * lp, l, p.kv, w.vacc, sums);
    }
}

// Query rows [i0, i0 + m) of pair bh; the scratch pieces are set up by attn_pair.
template <class V, int MR>
inline void attn_block(const AttnProblem& p, int64_t bh, int64_t i0, int m, const float* kt,
                       const float* tq, const float* bq, const float* v, int64_t ldv,
                       const AttnScratch& w)
{
    const int64_t l = p.l, d = p.d, lp = attn_pad(l), dp = attn_pad(d), kp = attn_pad(p.kk);
    const int64_t ld = p.in.row;
    float *s = w.s, *tk = w.tk, *c = w.c, *sums = w.sums;
    const float* q = p.q + p.in.at(bh, p.heads) + i0 * ld;
    attn_gemm<V, MR>(q, ld, m, kt, lp, d, lp, s, lp, false);
    if (p.wk != nullptr) {
        attn_gemm<V, MR>(q, ld, m, p.wk, kp, d, kp, tk, kp, false);
    }
    for (int r = 0; r < m; ++r) {
        const AttnQ qt{bq != nullptr ? nullptr : tq, bq != nullptr ? bq + (i0 + r) * lp : nullptr};
        attn_terms<V>(p, i0 + r, s + r * lp, p.wk != nullptr ? tk + r * kp : nullptr, qt);
    }
    attn_softmax<V>(s, lp, l, m);
    attn_gemm<V, MR>(s, lp, m, v, ldv, l, dp, c, dp, false);
    if (p.wv != nullptr) {
        attn_block_vsums<V>(p, i0, m, w);
        attn_gemm<V, MR>(sums, p.kv, m, p.wv, dp, p.kv, dp, c, dp, true);
    }
    attn_store(p, bh, i0, m, c);
}

// Query rows [row0, row1) of pair bh: k^T packed [d, lp] (zero padding), the bucket-major Q
// table, v padded when d is not a multiple of kAttnPad, then the query row blocks. scratch:
// attn_scratch(p, MR) floats.
template <class V, int MR>
inline void attn_pair(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                      float* scratch)
{
    const int64_t l = p.l, d = p.d, dp = attn_pad(d), ld = p.in.row;
    const int64_t at = p.in.at(bh, p.heads);
    AttnScratch w;
    attn_carve(p, MR, scratch, &w);
    float *kt = w.kt, *tq = w.tq, *vp = w.vp;
    attn_pack_kt<V>(p, bh, kt);
    attn_q_table<V, MR>(p, kt, tq);
    const bool by_key = p.wq != nullptr && attn_q_bias<V>(p, row0, row1, tq, w);
    const float* v = p.v + at;
    int64_t ldv = ld;
    if (d != dp) {
        for (int64_t j = 0; j < l; ++j) {
            for (int64_t t = 0; t < dp; ++t) {
                vp[j * dp + t] = t < d ? v[j * ld + t] : 0.0f;
            }
        }
        v = vp;
        ldv = dp;
    }
    for (int64_t i0 = row0; i0 < row1; i0 += MR) {
        const int m = static_cast<int>(row1 - i0 < MR ? row1 - i0 : MR);
        attn_block<V, MR>(p, bh, i0, m, kt, p.wq != nullptr ? tq : nullptr,
                          by_key ? w.bq : nullptr, v, ldv, w);
    }
}

}  // namespace irpe_cpu

#endif  // IRPE_CPU_RPE_ATTENTION_H
