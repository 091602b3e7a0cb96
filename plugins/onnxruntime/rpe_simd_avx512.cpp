// rpe_simd.h's softmax rows and weight rows on AVX-512F (16 lanes). Compiled with
// -mavx512f; called only where the CPU has it (rpe_softmax.cpp checks at run time).
#include <immintrin.h>

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
};

}  // namespace

IRPE_SIMD_ENTRY_POINTS(Avx512, avx512)

}  // namespace irpe_ort
