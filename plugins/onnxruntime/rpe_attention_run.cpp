// RPEAttention's run (rpe_attention.cpp reads the inputs): the (b, h) pairs, or parts of their
// queries, as tasks on ONNX Runtime's pool, each with the calling thread's scratch, at the SIMD
// level of the kernel; the portable level runs rpe_attention.h on plain floats.
#include <atomic>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <thread>

#include "rpe_attention.h"
#include "rpe_ort.h"

namespace irpe_ort {

namespace {

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

struct AttnJob {
    AttnProblem p;
    AttnPairFn pair = nullptr;
    int64_t scratch = 0;
    int64_t parts = 1, rows = 0;  // tasks per pair and query rows per task (a multiple of MR)
    std::atomic<bool> failed{false};
};

// Tasks per pair: 1, unless there are fewer pairs than twice the CPU's threads (small batches):
// then the queries of a pair are split too (each part repeats the pair's k^T / Q-table setup).
int64_t parts_per_pair(int64_t pairs, int64_t l, int mr)
{
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    const int64_t want = 2 * static_cast<int64_t>(threads);
    const int64_t most = std::max<int64_t>(1, l / (2 * mr));  // at least 2 row blocks a part
    return pairs >= want ? 1 : std::min(most, (want + pairs - 1) / pairs);
}

// The calling thread's scratch, at least `floats` long: kept between calls (no allocation and
// no zero fill per pair; every pair writes what it reads).
float* thread_scratch(int64_t floats)
{
    thread_local std::unique_ptr<float[]> buffer;
    thread_local int64_t size = 0;
    if (size < floats) {
        buffer.reset();
        size = 0;
        buffer.reset(new float[static_cast<size_t>(floats)]);
        size = floats;
    }
    return buffer.get();
}

void attn_task(void* data, size_t task)
{
    AttnJob& job = *static_cast<AttnJob*>(data);
    try {
        const int64_t bh = static_cast<int64_t>(task) / job.parts;
        const int64_t row0 = static_cast<int64_t>(task) % job.parts * job.rows;
        job.pair(job.p, bh, row0, std::min(job.p.l, row0 + job.rows), thread_scratch(job.scratch));
    } catch (...) {  // never let an exception into ONNX Runtime's pool
        job.failed = true;
    }
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

void run_attention(Ort::KernelContext& ctx, const AttnProblem& problem, Simd simd)
{
    AttnJob job;
    job.p = problem;
    int mr = 1;
    job.pair = pair_fn(simd, mr);
    job.scratch = attn_scratch(job.p, mr);
    job.parts = parts_per_pair(job.p.bh, job.p.l, mr);
    job.rows = (job.p.l + job.parts - 1) / job.parts;
    job.rows = (job.rows + mr - 1) / mr * mr;
    job.parts = (job.p.l + job.rows - 1) / job.rows;
    parallel(ctx, &attn_task, job.p.bh * job.parts, &job);
    if (job.failed) {
        throw std::runtime_error("out of memory for the per-task scratch");
    }
}

}  // namespace irpe_ort
