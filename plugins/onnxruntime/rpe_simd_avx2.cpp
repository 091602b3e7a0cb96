// rpe_simd.h's softmax rows and weight rows on AVX2 + FMA (8 lanes). Compiled with
// -mavx2 -mfma; called only where the CPU has them (rpe_softmax.cpp checks at run time).
#include <immintrin.h>

#include "rpe_simd.h"

namespace irpe_ort {

namespace {

struct Avx2 {
    using T = __m256;
    static constexpr int kLanes = 8;
    IRPE_SIMD_ELEMENTWISE(256)
    static T round(T v)
    {
        return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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

IRPE_SIMD_ENTRY_POINTS(Avx2, avx2)

}  // namespace irpe_ort
