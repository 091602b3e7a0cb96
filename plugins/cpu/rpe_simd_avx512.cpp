// rpe_simd.h's softmax rows and weight rows and rpe_attention.h's pairs on AVX-512F (16
// lanes). Compiled with -mavx512f; called only where the CPU has it (checked at run time).
#include <immintrin.h>

#include "rpe_attention_plan.h"
#include "rpe_simd.h"
#include "rpe_simd_avx512.h"

namespace irpe_cpu {

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

}  // namespace irpe_cpu
