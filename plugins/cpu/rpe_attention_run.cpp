// RPEAttention's tasks, for any thread pool: the (b, h) pairs, or parts of their queries, each
// with the running thread's scratch, at a SIMD level (the portable level runs rpe_attention.h on
// plain floats), and the padded id tables and weights the kernel reads. No runtime here: the
// ONNX Runtime op (plugins/onnxruntime/rpe_attention.cpp) runs the tasks on ONNX Runtime's pool,
// the OpenVINO op (plugins/openvino/rpe_ov_attention.cpp) on OpenVINO's, rpe_attention_capi.cpp
// on threads of its own (libirpe_cpu_attention).
#include <algorithm>
#include <cmath>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "rpe_attention_plan.h"

namespace irpe_cpu {

namespace {

constexpr size_t kCacheLine = 64;

struct Scalar {  // the portable path: rpe_attention.h's templates on plain floats
    using T = float;
    static constexpr int kLanes = 1;
    static T set1(float v) { return v; }
    static T load(const float* p) { return *p; }
    static void store(float* p, T v) { *p = v; }
    static T max(T a, T b) { return a > b ? a : b; }
    static T min(T a, T b) { return b < a ? b : a; }
    static T add(T a, T b) { return a + b; }
    static T sub(T a, T b) { return a - b; }
    static T mul(T a, T b) { return a * b; }
    static T fmadd(T a, T b, T c) { return a * b + c; }
    static T fnmadd(T a, T b, T c) { return c - a * b; }
    static T round(T v) { return std::nearbyint(v); }
    static T scale(T y, T n) { return std::ldexp(y, static_cast<int>(n)); }
    static float reduce_max(T v) { return v; }
    static float reduce_add(T v) { return v; }
    static T gather(const float* base, const int32_t* ids) { return *ids < 0 ? 0.0f : base[*ids]; }
    struct Lut {
        const float* row;
        Lut(const float* r, int64_t) : row(r) {}
        T get(const int32_t* ids) const { return gather(row, ids); }
    };
};
constexpr int kAttnRowsPortable = 4;

void attention_pair_portable(const AttnProblem& p, int64_t bh, int64_t row0, int64_t row1,
                             float* scratch)
{
    attn_pair<Scalar, kAttnRowsPortable>(p, bh, row0, row1, scratch);
}

// Tasks per pair: 1, unless there are fewer pairs than twice the threads (small batches): then
// the queries of a pair are split too (each part repeats the pair's k^T / Q-table setup).
int64_t parts_per_pair(int64_t pairs, int64_t l, int mr, int64_t threads)
{
    const int64_t want = 2 * std::max<int64_t>(1, threads);
    const int64_t most = std::max<int64_t>(1, l / (2 * mr));  // at least 2 row blocks a part
    return pairs >= want ? 1 : std::min(most, (want + pairs - 1) / pairs);
}

// The calling thread's scratch, at least `floats` long: kept between calls (no allocation and
// no zero fill per pair; every pair writes what it reads).
// Aligned to a cache line: every scratch row is a multiple of 16 floats, so no vector access
// then straddles two lines (malloc's 16-byte alignment split every one of them).
struct AlignedFree {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{kCacheLine}); }
};

float* thread_scratch(int64_t floats)
{
    thread_local std::unique_ptr<float[], AlignedFree> buffer;
    thread_local int64_t size = 0;
    if (size < floats) {
        buffer.reset();
        size = 0;
        buffer.reset(static_cast<float*>(::operator new[](
            static_cast<size_t>(floats) * sizeof(float), std::align_val_t{kCacheLine})));
        size = floats;
    }
    return buffer.get();
}

AttnPairFn pair_fn(Simd simd, int& rows)
{
    rows = simd == Simd::kAvx512 ? kAttnRowsAvx512 : simd == Simd::kAvx2 ? kAttnRowsAvx2
                                                                           : kAttnRowsPortable;
    return simd == Simd::kAvx512 ? &attention_pair_avx512
           : simd == Simd::kAvx2 ? &attention_pair_avx2
                                 : &attention_pair_portable;
}

}  // namespace

void plan_attention(AttnPlan& plan, const AttnProblem& problem, Simd simd, int64_t threads)
{
    plan.p = problem;
    int mr = 1;
    plan.pair = pair_fn(simd, mr);
    plan.scratch = attn_scratch(plan.p, mr);
    if (plan.p.bf16 && simd == Simd::kAvx512 && cpu_has_bf16()) {
        plan.pair = &attention_pair_bf16;
        plan.scratch = attn_scratch_bf16(plan.p, mr);
    }
    if (threads < 1) {
        threads = std::max(1u, std::thread::hardware_concurrency());
    }
    plan.parts = parts_per_pair(plan.p.bh, plan.p.l, mr, threads);
    plan.rows = (plan.p.l + plan.parts - 1) / plan.parts;
    plan.rows = (plan.rows + mr - 1) / mr * mr;
    plan.parts = (plan.p.l + plan.rows - 1) / plan.rows;
}

void attention_task(void* data, size_t task)
{
    AttnPlan& plan = *static_cast<AttnPlan*>(data);
    try {
        const int64_t bh = static_cast<int64_t>(task) / plan.parts;
        const int64_t row0 = static_cast<int64_t>(task) % plan.parts * plan.rows;
        plan.pair(plan.p, bh, row0, std::min(plan.p.l, row0 + plan.rows),
                  thread_scratch(plan.scratch));
    } catch (...) {  // never let an exception into a thread pool
        plan.failed = true;
    }
}

std::vector<int32_t> pad_ids(const void* ids, bool wide, int64_t l, int64_t k, AttnIds kind)
{
    const int64_t lp = attn_pad(l);
    const int32_t outside = kind == AttnIds::kV ? static_cast<int32_t>(k) : -1;
    const int64_t extra = kind == AttnIds::kQ ? l * lp : kind == AttnIds::kV ? l * attn_runs_stride(l)
                                                                             : 0;
    std::vector<int32_t> out(static_cast<size_t>(l * lp + extra), outside);
    int32_t* by_key = out.data() + l * lp;  // Q: [L, lp], row j column i the bucket
    for (int64_t i = 0; i < l; ++i) {
        for (int64_t j = 0; j < l; ++j) {
            const int64_t id = wide ? static_cast<const int64_t*>(ids)[i * l + j]
                                    : static_cast<const int32_t*>(ids)[i * l + j];
            if (kind != AttnIds::kQ) {
                out[i * lp + j] = id >= 0 && id < k ? static_cast<int32_t>(id) : outside;
            } else if (id >= 0 && id < k * l) {  // bucket-major c * L + j -> c * lp + j
                if (id % l != j) {
                    throw std::invalid_argument("the Q index must be bucket-major (c * L + j)");
                }
                out[i * lp + j] = static_cast<int32_t>(id / l * lp + j);
                by_key[j * lp + i] = static_cast<int32_t>(id / l);
            }
        }
    }
    if (kind == AttnIds::kV) {  // the runs of equal consecutive ids: (end, bucket) pairs
        for (int64_t i = 0; i < l; ++i) {
            const int32_t* row = out.data() + i * lp;
            int32_t* run = out.data() + l * lp + i * attn_runs_stride(l);
            for (int64_t j = 0; j < l; ++j) {
                if (j + 1 == l || row[j + 1] != row[j]) {
                    *run++ = static_cast<int32_t>(j + 1);
                    *run++ = row[j];
                }
            }
        }
    }
    return out;
}

std::vector<float> pad_columns(const float* w, int64_t rows, int64_t cols, float factor)
{
    const int64_t cp = attn_pad(cols);
    std::vector<float> out(static_cast<size_t>(rows * cp), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            out[r * cp + c] = factor * w[r * cols + c];
        }
    }
    return out;
}

}  // namespace irpe_cpu
