// rpe_simd.h's softmax rows and weight rows and rpe_attention.h's pairs on AVX-512F (16
// lanes). Compiled with -mavx512f; called only where the CPU has it (checked at run time).
#include <immintrin.h>

#include "rpe_attention.h"
#include "rpe_simd.h"

namespace irpe_ort {

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

IRPE_SIMD_ENTRY_POINTS(Avx512, avx512)

void attention_pair_avx512(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                          float* scratch)
{
    attn_pair<Avx512, kAttnRowsAvx512>(p, bh, row0, row1, scratch);
}

void leave_avx512()
{
    asm volatile(
        "vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t"
        "vpxord %%zmm18, %%zmm18, %%zmm18\n\tvpxord %%zmm19, %%zmm19, %%zmm19\n\t"
        "vpxord %%zmm20, %%zmm20, %%zmm20\n\tvpxord %%zmm21, %%zmm21, %%zmm21\n\t"
        "vpxord %%zmm22, %%zmm22, %%zmm22\n\tvpxord %%zmm23, %%zmm23, %%zmm23\n\t"
        "vpxord %%zmm24, %%zmm24, %%zmm24\n\tvpxord %%zmm25, %%zmm25, %%zmm25\n\t"
        "vpxord %%zmm26, %%zmm26, %%zmm26\n\tvpxord %%zmm27, %%zmm27, %%zmm27\n\t"
        "vpxord %%zmm28, %%zmm28, %%zmm28\n\tvpxord %%zmm29, %%zmm29, %%zmm29\n\t"
        "vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"
        "vzeroupper" ::: "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",
        "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
}

}  // namespace irpe_ort
