// rpe_simd.h's softmax rows and weight rows on AVX-512F (16 lanes). Compiled with -mavx512f; called only where
// the CPU has it (rpe_softmax.cpp checks at run time).
#include <immintrin.h>

#include "rpe_simd.h"

namespace irpe_ort {

namespace {

struct Avx512 {
    using T = __m512;
    static constexpr int kLanes = 16;
    static T set1(float v) { return _mm512_set1_ps(v); }
    static T load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
    static T max(T a, T b) { return _mm512_max_ps(a, b); }
    static T min(T a, T b) { return _mm512_min_ps(a, b); }  // b when either is NaN: NaN stays
    static T add(T a, T b) { return _mm512_add_ps(a, b); }
    static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
    static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
    static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
    static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
    static T round(T v)
    {
        return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    static T scale(T y, T n)  // y * 2^n for integral n in [-127, 127] (2^-127 encodes as 0)
    {
        const __m512i e = _mm512_slli_epi32(
            _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
        return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    }
    static float reduce_max(T v) { return _mm512_reduce_max_ps(v); }
    static float reduce_add(T v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

void softmax_rows4_avx512(float* const* x, int64_t n, float* const* out)
{
    softmax_rows<Avx512, 4>(x, n, out);
}

void softmax_rows1_avx512(float* const* x, int64_t n, float* const* out)
{
    softmax_rows<Avx512, 1>(x, n, out);
}

int64_t weight_rows4_avx512(const float* s, int64_t k, const float* w, int64_t d,
                          const float* const* base, float* const* out)
{
    return rows_times_weight<Avx512, 4>(s, k, w, d, base, out);
}

int64_t weight_rows1_avx512(const float* s, int64_t k, const float* w, int64_t d,
                          const float* const* base, float* const* out)
{
    return rows_times_weight<Avx512, 1>(s, k, w, d, base, out);
}

}  // namespace irpe_ort
