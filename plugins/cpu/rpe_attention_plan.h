// RPEAttention's pairs per instruction set, one call's plan and tasks, and the id tables and
// weights the kernel reads (defined in rpe_attention_run.cpp, rpe_simd_*.cpp and
// rpe_attention_bf16.cpp); the block itself is rpe_attention.h. What the ONNX Runtime op, the
// OpenVINO op and the C API run, after binding their inputs (rpe_attention_bind.h).
#ifndef IRPE_CPU_RPE_ATTENTION_PLAN_H
#define IRPE_CPU_RPE_ATTENTION_PLAN_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "rpe_attention.h"

namespace irpe_cpu {

using AttnPairFn = void (*)(const AttnProblem&, int64_t, int64_t, int64_t, float*);
void attention_pair_avx2(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                         float* scratch);
void attention_pair_avx512(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                           float* scratch);
constexpr int kAttnRowsAvx2 = 6, kAttnRowsAvx512 = 12;
// The AVX-512 pair with q k^T and p v in bf16 (AttnProblem::bf16), its scratch floats at row
// block mr; taken where cpu_has_bf16() (rpe_simd.h).
void attention_pair_bf16(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                         float* scratch);
int64_t attn_scratch_bf16(const AttnProblem& p, int mr);

// One call's tasks (rpe_attention_run.cpp): plan_attention splits the (b, h) pairs, and their
// queries when pairs are fewer than twice `threads` (< 1: the CPU's threads); attention_task(
// &plan, t) runs task t < tasks() with the calling thread's scratch, on any pool, never
// throwing (a failure sets `failed`). The result does not depend on the thread count.
struct AttnPlan {
    AttnProblem p;
    AttnPairFn pair = nullptr;
    int64_t scratch = 0, parts = 1, rows = 0;
    std::atomic<bool> failed{false};
    int64_t tasks() const { return p.bh * parts; }
};
void plan_attention(AttnPlan& plan, const AttnProblem& problem, Simd simd, int64_t threads);
void attention_task(void* plan, size_t task);

// The kernel's id tables from [L, L] ids (int64 when `wide`, else int32): K ids stay ids
// (-1 outside [0, K)); Q ids bucket-major c * L + j become c * attn_pad(L) + j; V ids stay ids
// (K outside [0, K): a partial-sum slot never read). [L, attn_pad(L)]; a Q table is followed
// by its by-key part idqt [L, attn_pad(L)]: row j, column i the bucket c of (i, j), -1 outside;
// a V table by its runs [L, attn_runs_stride(L)] (rpe_attention.h).
enum class AttnIds { kK, kQ, kV };
std::vector<int32_t> pad_ids(const void* ids, bool wide, int64_t l, int64_t k, AttnIds kind);
// A weight [rows, cols] times `factor`, padded with zero columns to attn_pad(cols).
std::vector<float> pad_columns(const float* w, int64_t rows, int64_t cols, float factor);

}  // namespace irpe_cpu

#endif  // IRPE_CPU_RPE_ATTENTION_PLAN_H
