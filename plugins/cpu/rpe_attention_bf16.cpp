// RPEAttention's two large products in bfloat16 on AVX-512 BF16 (vdpbf16ps: pairs of bf16
// products summed into float32): q k^T and p v, the work that grows with L^2 d. Everything
// else (the iRPE tables and terms, the softmax, the V bucket sums and their product with the V
// table, the output) stays float32, as in rpe_attention.h, whose pieces this reuses. Asked for
// with AttnProblem::bf16 and taken only where the CPU has AVX512_BF16 (plan_attention);
// compiled with -mavx512f -mavx512bw -mavx512bf16. The operands are rounded to nearest even
// (vcvtne2ps2bf16), as OpenVINO's own bf16 attention rounds them.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "rpe_attention_plan.h"
#include "rpe_simd_avx512.h"

namespace irpe_cpu {

namespace {

// n floats (a multiple of 16) to bf16, rounded to nearest even.
inline void to_bf16(const float* x, int64_t n, uint16_t* out)
{
    for (int64_t j = 0; j < n; j += 32) {
        const __m512 lo = _mm512_loadu_ps(x + j);
        if (j + 16 < n) {
            const __m512 hi = _mm512_loadu_ps(x + j + 16);
            _mm512_storeu_si512(out + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        } else {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                                (__m256i)_mm512_cvtneps_pbh(lo));
        }
    }
}

// C[MR rows, NV vectors] (+)= A[MR, 2 kp] B: A's rows bf16 at stride lda (rows >= m repeat
// row m - 1), B pair-packed (pair t of column c at b[t * ldb + c], two bf16 in 32 bits), the
// sums in float32 registers.
template <int MR, int NV>
inline void tile_bf16(const uint16_t* a, int64_t lda, int m, const uint32_t* b, int64_t ldb,
                      int64_t kp, float* c, int64_t ldc, bool acc)
{
    const uint16_t* ar[MR];
    __m512 cv[NV][MR];
    for (int r = 0; r < MR; ++r) {
        ar[r] = a + (r < m ? r : m - 1) * lda;
        for (int u = 0; u < NV; ++u) {
            cv[u][r] = acc ? _mm512_loadu_ps(c + r * ldc + u * 16) : _mm512_setzero_ps();
        }
    }
    for (int64_t t = 0; t < kp; ++t) {
        __m512bh bv[NV];
        for (int u = 0; u < NV; ++u) {
            bv[u] = (__m512bh)_mm512_loadu_si512(b + t * ldb + u * 16);
        }
        for (int r = 0; r < MR; ++r) {
            int32_t pair;
            std::memcpy(&pair, ar[r] + 2 * t, sizeof(pair));
            const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
            for (int u = 0; u < NV; ++u) {
                cv[u][r] = _mm512_dpbf16_ps(cv[u][r], x, bv[u]);
            }
        }
    }
    for (int r = 0; r < MR; ++r) {
        for (int u = 0; u < NV; ++u) {
            _mm512_storeu_ps(c + r * ldc + u * 16, cv[u][r]);
        }
    }
}

// C[MR, n] (+)= A[m rows, 2 kp] B[2 kp, n], n a multiple of 16: attn_gemm's tiling in bf16.
template <int MR>
inline void gemm_bf16(const uint16_t* a, int64_t lda, int m, const uint32_t* b, int64_t ldb,
                      int64_t kp, int64_t n, float* c, int64_t ldc, bool acc)
{
    if constexpr (MR % 2 == 0 && MR > 2) {
        if (2 * m <= MR) {
            gemm_bf16<MR / 2>(a, lda, m, b, ldb, kp, n, c, ldc, acc);
            return;
        }
    }
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        tile_bf16<MR, 2>(a, lda, m, b + j, ldb, kp, c + j, ldc, acc);
    }
    for (; j < n; j += 16) {
        tile_bf16<MR, 1>(a, lda, m, b + j, ldb, kp, c + j, ldc, acc);
    }
}

// Rows x0, x1 of n floats (a multiple of 16) as pairs: out[c] = (x0[c], x1[c]).
inline void pack_pairs(const float* x0, const float* x1, int64_t n, uint32_t* out)
{
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                           24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                           16, 0);
    for (int64_t c = 0; c < n; c += 16) {
        const __m512 a = _mm512_loadu_ps(x0 + c);
        const __m512 b = _mm512_loadu_ps(x1 + c);
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a in the low half
        _mm512_storeu_si512(out + c, _mm512_permutexvar_epi16(order, both));
    }
}

// Row r of A [rows, cols] at stride ld, np = attn_pad(cols) floats: A's own row when cols is
// np (no copy), else copied into row with zeros past cols; zeros past rows.
inline const float* padded_row(const float* a, int64_t ld, int64_t rows, int64_t cols,
                               int64_t r, float* row)
{
    const int64_t np = attn_pad(cols);
    if (r < rows && cols == np) {
        return a + r * ld;
    }
    std::memset(row, 0, sizeof(float) * np);
    if (r < rows) {
        std::memcpy(row, a + r * ld, sizeof(float) * cols);
    }
    return row;
}

// A [rows, cols] at stride ld as the B operand: `pairs` pair rows of np = attn_pad(cols)
// (zero columns past cols, zero rows past rows). row: 2 np floats.
inline void pack_rows(const float* a, int64_t ld, int64_t rows, int64_t cols, int64_t pairs,
                      float* row, uint32_t* out)
{
    const int64_t np = attn_pad(cols);
    for (int64_t t = 0; t < pairs; ++t) {
        pack_pairs(padded_row(a, ld, rows, cols, 2 * t, row),
                   padded_row(a, ld, rows, cols, 2 * t + 1, row + np), np, out + t * np);
    }
}

// rows x cols floats at stride ld as bf16 rows of np = attn_pad(cols) (zero past cols).
inline void rows_bf16(const float* a, int64_t ld, int64_t rows, int64_t cols, float* row,
                      uint16_t* out)
{
    const int64_t np = attn_pad(cols);
    for (int64_t r = 0; r < rows; ++r) {
        to_bf16(padded_row(a, ld, rows, cols, r, row), np, out + r * np);
    }
}

// The bf16 pieces of one task's scratch, after attn_carve's float32 ones: k^T pairs, v pairs,
// the K and V tables as pairs, the Q weight's rows, a block's bf16 rows, two float rows.
struct Bf16Scratch {
    uint32_t *ktb, *vb, *wkb, *wvb;
    uint16_t *wqb, *ab;
    float* row;
};

int64_t bf16_carve(const AttnProblem& p, int mr, float* base, Bf16Scratch* out)
{
    const int64_t lp = attn_pad(p.l), dp = attn_pad(p.d), kp = attn_pad(p.kk);
    const int64_t vp = attn_pad(p.kv), wide = lp > dp ? (lp > vp ? lp : vp) : (dp > vp ? dp : vp);
    const int64_t words[7] = {dp / 2 * lp, lp / 2 * dp, p.wk != nullptr ? dp / 2 * kp : 0,
                              p.wv != nullptr ? vp / 2 * dp : 0,
                              p.wq != nullptr ? (p.kq * dp + 1) / 2 : 0,
                              (std::max(mr * wide, kAttnPad * dp) + 1) / 2, 2 * wide};
    int64_t at[8] = {0};
    for (int i = 0; i < 7; ++i) {
        at[i + 1] = at[i] + words[i];
    }
    if (out != nullptr) {
        uint32_t* u = reinterpret_cast<uint32_t*>(base);
        *out = Bf16Scratch{u + at[0], u + at[1], u + at[2], u + at[3],
                           reinterpret_cast<uint16_t*>(u + at[4]),
                           reinterpret_cast<uint16_t*>(u + at[5]), base + at[6]};
    }
    return at[7];
}

// Query rows [i0, i0 + m) of pair bh: attn_block with its products in bf16.
template <int MR>
void block_bf16(const AttnProblem& p, int64_t bh, int64_t i0, int m, const AttnScratch& w,
                const Bf16Scratch& b, bool by_key)
{
    using V = Avx512;
    const int64_t l = p.l, lp = attn_pad(l), dp = attn_pad(p.d), kp = attn_pad(p.kk);
    const int64_t vp = attn_pad(p.kv), ld = p.in.row;
    float *s = w.s, *tk = w.tk, *c = w.c;
    rows_bf16(p.q + p.in.at(bh, p.heads) + i0 * ld, ld, m, p.d, b.row, b.ab);
    gemm_bf16<MR>(b.ab, dp, m, b.ktb, lp, dp / 2, lp, s, lp, false);
    if (p.wk != nullptr) {
        gemm_bf16<MR>(b.ab, dp, m, b.wkb, kp, dp / 2, kp, tk, kp, false);
    }
    for (int r = 0; r < m; ++r) {
        const AttnQ qt{by_key || p.wq == nullptr ? nullptr : w.tq,
                       by_key ? w.bq + (i0 + r) * lp : nullptr};
        attn_terms<V>(p, i0 + r, s + r * lp, p.wk != nullptr ? tk + r * kp : nullptr, qt);
    }
    attn_softmax<V>(s, lp, l, m);
    for (int r = 0; r < m; ++r) {
        to_bf16(s + r * lp, lp, b.ab + r * lp);
    }
    gemm_bf16<MR>(b.ab, lp, m, b.vb, dp, (l + 1) / 2, dp, c, dp, false);
    if (p.wv != nullptr) {
        attn_block_vsums<V>(p, i0, m, w);
        rows_bf16(w.sums, p.kv, m, p.kv, b.row, b.ab);
        gemm_bf16<MR>(b.ab, vp, m, b.wvb, dp, (p.kv + 1) / 2, dp, c, dp, true);
    }
    attn_store(p, bh, i0, m, c);
}

}  // namespace

int64_t attn_scratch_bf16(const AttnProblem& p, int mr)
{
    return attn_scratch(p, mr) + bf16_carve(p, mr, nullptr, nullptr);
}

void attention_pair_bf16(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                         float* scratch)
{
    constexpr int MR = kAttnRowsAvx512;
    const int64_t l = p.l, d = p.d, lp = attn_pad(l), dp = attn_pad(d), ld = p.in.row;
    const int64_t at = p.in.at(bh, p.heads);
    AttnScratch w;
    Bf16Scratch b;
    bf16_carve(p, MR, scratch + attn_carve(p, MR, scratch, &w), &b);
    // k^T pairs: ktb[t][j] = (k[j][2t], k[j][2t + 1]); 16 keys x 16 pairs by transposes
    const int64_t half = dp / 2, jb = l / kAttnPad * kAttnPad, tb = half / kAttnPad * kAttnPad;
    for (int64_t j0 = 0; j0 < jb; j0 += kAttnPad) {
        rows_bf16(p.k + at + j0 * ld, ld, kAttnPad, d, b.row, b.ab);  // [16, half] pairs
        const float* pairs = reinterpret_cast<const float*>(b.ab);
        for (int64_t t0 = 0; t0 < tb; t0 += kAttnPad) {
            Avx512::transpose16(pairs + t0, half, reinterpret_cast<float*>(b.ktb + t0 * lp + j0),
                                lp);
        }
        for (int64_t t = tb; t < half; ++t) {
            for (int64_t r = 0; r < kAttnPad; ++r) {
                std::memcpy(b.ktb + t * lp + j0 + r, b.ab + r * dp + 2 * t, sizeof(uint32_t));
            }
        }
    }
    for (int64_t j = jb; j < lp; ++j) {
        if (j < l) {
            rows_bf16(p.k + at + j * ld, ld, 1, d, b.row, b.ab);
        } else {
            std::memset(b.ab, 0, sizeof(uint16_t) * dp);
        }
        for (int64_t t = 0; t < dp / 2; ++t) {
            std::memcpy(b.ktb + t * lp + j, b.ab + 2 * t, sizeof(uint32_t));
        }
    }
    pack_rows(p.v + at, ld, l, d, (l + 1) / 2, b.row, b.vb);
    if (p.wk != nullptr) {  // wk [d, kp] (padded, scale folded in)
        pack_rows(p.wk, attn_pad(p.kk), d, p.kk, dp / 2, b.row, b.wkb);
    }
    if (p.wv != nullptr) {  // wv [kv, dp]
        pack_rows(p.wv, dp, p.kv, d, attn_pad(p.kv) / 2, b.row, b.wvb);
    }
    if (p.wq != nullptr) {  // the Q table wq @ k^T [kq, lp]
        rows_bf16(p.wq, d, p.kq, d, b.row, b.wqb);
        for (int64_t c0 = 0; c0 < p.kq; c0 += MR) {
            const int m = static_cast<int>(p.kq - c0 < MR ? p.kq - c0 : MR);
            gemm_bf16<MR>(b.wqb + c0 * dp, dp, m, b.ktb, lp, dp / 2, lp, w.tq + c0 * lp, lp,
                          false);
        }
    }
    const bool by_key = p.wq != nullptr && attn_q_bias<Avx512>(p, row0, row1, w.tq, w);
    for (int64_t i0 = row0; i0 < row1; i0 += MR) {
        const int m = static_cast<int>(row1 - i0 < MR ? row1 - i0 : MR);
        block_bf16<MR>(p, bh, i0, m, w, b, by_key);
    }
}

}  // namespace irpe_cpu
