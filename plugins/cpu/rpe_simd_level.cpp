// simd_level (rpe_simd.h): the CPU's widest vector code, capped by $IRPE_ORT_SIMD; cpu_has_bf16.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "rpe_simd.h"

namespace irpe_cpu {

Simd simd_level()
{
    Simd cpu = Simd::kPortable;
    if (__builtin_cpu_supports("avx512f")) {
        cpu = Simd::kAvx512;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        cpu = Simd::kAvx2;
    }
    const char* cap = std::getenv("IRPE_ORT_SIMD");
    const std::string want = cap ? cap : "";
    const Simd limit = want == "portable" ? Simd::kPortable
                       : want == "avx2"   ? Simd::kAvx2
                                          : Simd::kAvx512;
    return std::min(cpu, limit);
}

bool cpu_has_bf16()
{
    return simd_level() == Simd::kAvx512 && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
}

}  // namespace irpe_cpu
