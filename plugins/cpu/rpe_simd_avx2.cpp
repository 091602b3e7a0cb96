// rpe_simd.h's softmax rows and weight rows and rpe_attention.h's pairs on AVX2 + FMA (8
// lanes). Compiled with -mavx2 -mfma; called only where the CPU has them (checked at run time).
#include <immintrin.h>

#include "rpe_attention_plan.h"
#include "rpe_simd.h"

namespace irpe_cpu {

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
    static T gather(const float* base, const int32_t* ids)  // 0 where the id is negative
    {
        const __m256i i = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids));
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(-1)));
        return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, i, keep, 4);
    }
    struct Lut {  // a table row looked up by ids (gathers at this width)
        const float* row;
        Lut(const float* r, int64_t) : row(r) {}
        T get(const int32_t* ids) const { return gather(row, ids); }
    };
};

}  // namespace

IRPE_SIMD_ENTRY_POINTS(Avx2, avx2)

void attention_pair_avx2(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                         float* scratch)
{
    attn_pair<Avx2, kAttnRowsAvx2>(p, bh, row0, row1, scratch);
}

}  // namespace irpe_cpu
