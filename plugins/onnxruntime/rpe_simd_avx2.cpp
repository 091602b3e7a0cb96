// rpe_simd.h's softmax rows and weight rows on AVX2 + FMA (8 lanes). Compiled with -mavx2 -mfma; called only
// where the CPU has them (rpe_softmax.cpp checks at run time).
#include <immintrin.h>

#include "rpe_simd.h"

namespace irpe_ort {

namespace {

struct Avx2 {
    using T = __m256;
    static constexpr int kLanes = 8;
    static T set1(float v) { return _mm256_set1_ps(v); }
    static T load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
    static T max(T a, T b) { return _mm256_max_ps(a, b); }
    static T min(T a, T b) { return _mm256_min_ps(a, b); }  // b when either is NaN: NaN stays
    static T add(T a, T b) { return _mm256_add_ps(a, b); }
    static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
    static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
    static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
    static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
    static T round(T v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static T scale(T y, T n)  // y * 2^n for integral n in [-127, 127] (2^-127 encodes as 0)
    {
        const __m256i e = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    }
    static float reduce_max(T v)
    {
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
    }
    static float reduce_add(T v)
    {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    }
};

}  // namespace

void softmax_rows4_avx2(float* const* x, int64_t n, float* const* out)
{
    softmax_rows<Avx2, 4>(x, n, out);
}

void softmax_rows1_avx2(float* const* x, int64_t n, float* const* out)
{
    softmax_rows<Avx2, 1>(x, n, out);
}

int64_t weight_rows4_avx2(const float* s, int64_t k, const float* w, int64_t d,
                          const float* const* base, float* const* out)
{
    return rows_times_weight<Avx2, 4>(s, k, w, d, base, out);
}

int64_t weight_rows1_avx2(const float* s, int64_t k, const float* w, int64_t d,
                          const float* const* base, float* const* out)
{
    return rows_times_weight<Avx2, 1>(s, k, w, d, base, out);
}

}  // namespace irpe_ort
