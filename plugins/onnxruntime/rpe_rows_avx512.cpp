// rpe_terms.h's gather rows on AVX-512F, 16 keys at a time. A table row of at most 64 buckets
// (a per-query lookup table: iRPE-K, DETR) is held in four registers and looked up with two
// two-table permutes and a blend instead of a memory gather; a longer row (the 1-row iRPE-Q
// table) is gathered. Same values, same additions in the same order as add_row: bit-identical.
// Only these functions are AVX-512 (target attribute; the file is compiled for the baseline, so
// no inline function of a shared header is emitted with AVX-512 code); chosen only where the
// CPU has it (use_avx2 / add_row_fn).
#include <immintrin.h>

#include "rpe_terms.h"

namespace irpe_ort {

namespace {

constexpr int64_t kRegisterBuckets = 64;

struct Lut {  // one term's table row for one query
    const float* row;
    __m512 r[4];
};

#define IRPE_AVX512 __attribute__((target("avx512f")))

template <bool kRegs>
IRPE_AVX512 inline void load_lut(Lut& lut, const float* row, int64_t k)
{
    lut.row = row;
    if constexpr (kRegs) {
        for (int q = 0; q < 4; ++q) {
            const int64_t left = k - 16 * q, n = left < 0 ? 0 : left > 16 ? 16 : left;
            lut.r[q] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), row + 16 * q);
        }
    }
}

// The table values at 16 ids (int32, -1 = outside the table: 0).
template <bool kRegs>
IRPE_AVX512 inline __m512 pick16(const Lut& lut, __m512i id)
{
    const __mmask16 valid = _mm512_cmpge_epi32_mask(id, _mm512_setzero_si512());
    if constexpr (kRegs) {
        const __m512 low = _mm512_permutex2var_ps(lut.r[0], id, lut.r[1]);
        const __m512 high = _mm512_permutex2var_ps(lut.r[2], id, lut.r[3]);
        const __mmask16 upper = _mm512_test_epi32_mask(id, _mm512_set1_epi32(32));
        return _mm512_maskz_mov_ps(valid, _mm512_mask_blend_ps(upper, low, high));
    }
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, id, lut.row, 4);
}

template <int kTerms, bool kRegs0, bool kRegs1>
IRPE_AVX512 void add_row_avx512(const AddJob& job, int64_t r, float* __restrict out)
{
    const int64_t* bs = job.base_stride;
    const int64_t lq = job.lq, lk = job.lk;
    const int64_t i = r % lq, h = (r / lq) % job.out_h, b = r / (lq * job.out_h);
    Lut lut0, lut1;
    load_lut<kRegs0>(lut0, table_row(job.term[0], b, h, i), job.term[0].p.k);
    const int32_t* id0 = job.ids32[0] + i * lk;
    const int32_t* id1 = kTerms == 2 ? job.ids32[1] + i * lk : nullptr;
    if constexpr (kTerms == 2) {
        load_lut<kRegs1>(lut1, table_row(job.term[1], b, h, i), job.term[1].p.k);
    }
    const float* base = job.base + b * bs[0] + h * bs[1] + i * bs[2];
    for (int64_t j = 0; j < lk; j += 16) {
        const int64_t n = lk - j < 16 ? lk - j : 16;
        const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, base + j),
                                 pick16<kRegs0>(lut0, _mm512_maskz_loadu_epi32(m, id0 + j)));
        if constexpr (kTerms == 2) {
            v = _mm512_add_ps(v, pick16<kRegs1>(lut1, _mm512_maskz_loadu_epi32(m, id1 + j)));
        }
        _mm512_mask_storeu_ps(out + j, m, v);
    }
}

}  // namespace

AddRowFn add_row_avx512_fn(const AddJob& job)
{
    const bool r0 = job.term[0].p.k <= kRegisterBuckets;
    const bool r1 = job.terms == 2 && job.term[1].p.k <= kRegisterBuckets;
    if (job.terms == 1) {
        return r0 ? &add_row_avx512<1, true, false> : &add_row_avx512<1, false, false>;
    }
    if (r0) {
        return r1 ? &add_row_avx512<2, true, true> : &add_row_avx512<2, true, false>;
    }
    return r1 ? &add_row_avx512<2, false, true> : &add_row_avx512<2, false, false>;
}

}  // namespace irpe_ort
