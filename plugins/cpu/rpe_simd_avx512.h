// The AVX-512F vector type V of rpe_simd.h and rpe_attention.h (16 float lanes), for the files
// compiled with -mavx512f (rpe_simd_avx512.cpp, rpe_attention_bf16.cpp). In an unnamed
// namespace: each such file gets its own copy, built with its own flags.
#ifndef IRPE_CPU_RPE_SIMD_AVX512_H
#define IRPE_CPU_RPE_SIMD_AVX512_H

#include <immintrin.h>

#include "rpe_simd.h"

namespace irpe_cpu {

namespace {

struct Avx512 {
    using T = __m512;
    static constexpr int kLanes = 16;
    IRPE_SIMD_ELEMENTWISE(512)
    static T round(T v)
    {
        return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    static float reduce_max(T v) { return _mm512_reduce_max_ps(v); }
    static float reduce_add(T v) { return _mm512_reduce_add_ps(v); }
    static T gather(const float* base, const int32_t* ids)  // 0 where the id is negative
    {
        const __m512i i = _mm512_loadu_si512(ids);
        const __mmask16 keep = _mm512_cmpgt_epi32_mask(i, _mm512_set1_epi32(-1));
        return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, i, base, 4);
    }
    // The 16 x 16 block `in` (rows at stride ldi) transposed into out (rows at stride ldo):
    // 32-bit and 64-bit interleaves, then a 4 x 4 transpose of 128-bit lanes.
    static void transpose16(const float* in, int64_t ldi, float* out, int64_t ldo)
    {
        T r[16], t[16];
        for (int i = 0; i < 16; ++i) {
            r[i] = load(in + ldi * i);
        }
        for (int i = 0; i < 8; ++i) {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; ++i) {  // r[4i + m], lane L: rows 4i..4i+3 of column 4L + m
            const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
            const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
            r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
            r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
            r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
        }
        for (int m = 0; m < 4; ++m) {
            const T u0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44);
            const T u1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xEE);
            const T u2 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44);
            const T u3 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xEE);
            store(out + m * ldo, _mm512_shuffle_f32x4(u0, u2, 0x88));
            store(out + (4 + m) * ldo, _mm512_shuffle_f32x4(u0, u2, 0xDD));
            store(out + (8 + m) * ldo, _mm512_shuffle_f32x4(u1, u3, 0x88));
            store(out + (12 + m) * ldo, _mm512_shuffle_f32x4(u1, u3, 0xDD));
        }
    }
    // Inclusive prefix sums of x (n floats, a multiple of 16) into out: each vector scanned on
    // its own (four shifted adds, valignd with zeros), then, 16 vectors at a time, the totals
    // before each vector added: no dependency runs from one vector's scan to the next.
    static void prefix_sums(const float* x, int64_t n, float* out)
    {
        const __m512i zero = _mm512_setzero_si512();
        float carry = 0.0f;
        for (int64_t j0 = 0; j0 < n; j0 += 256) {
            const int64_t j1 = j0 + 256 < n ? j0 + 256 : n;
            float before[16];
            for (int64_t j = j0; j < j1; j += 16) {
                __m512i v = _mm512_castps_si512(load(x + j));
                for (const int shift : {15, 14, 12, 8}) {
                    v = _mm512_castps_si512(_mm512_add_ps(
                        _mm512_castsi512_ps(v),
                        _mm512_castsi512_ps(_mm512_alignr_epi32(v, zero, shift))));
                }
                store(out + j, _mm512_castsi512_ps(v));
            }
            for (int64_t j = j0; j < j1; j += 16) {
                before[(j - j0) / 16] = carry;
                carry += out[j + 15];
            }
            for (int64_t j = j0; j < j1; j += 16) {
                store(out + j, add(load(out + j), set1(before[(j - j0) / 16])));
            }
        }
    }
    struct Lut {  // a table row of <= 64 entries in 4 registers (permutes), else gathers
        const float* row;
        bool regs;
        T t0, t1, t2, t3;
        Lut(const float* r, int64_t n) : row(r), regs(r != nullptr && n <= 64)
        {
            const T zero = set1(0.0f);  // the row is padded to a multiple of 16 (attn_pad)
            t0 = regs ? load(r) : zero;
            t1 = regs && n > 16 ? load(r + 16) : zero;
            t2 = regs && n > 32 ? load(r + 32) : zero;
            t3 = regs && n > 48 ? load(r + 48) : zero;
        }
        T get(const int32_t* ids) const
        {
            if (!regs) {
                return gather(row, ids);
            }
            const __m512i i = _mm512_loadu_si512(ids);
            const __mmask16 keep = _mm512_cmpgt_epi32_mask(i, _mm512_set1_epi32(-1));
            const __mmask16 high = _mm512_test_epi32_mask(i, _mm512_set1_epi32(32));
            const T lo = _mm512_permutex2var_ps(t0, i, t1), hi = _mm512_permutex2var_ps(t2, i, t3);
            return _mm512_maskz_mov_ps(keep, _mm512_mask_blend_ps(high, lo, hi));
        }
    };
};

}  // namespace

}  // namespace irpe_cpu

#endif  // IRPE_CPU_RPE_SIMD_AVX512_H
