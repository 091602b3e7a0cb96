// Deterministic bucket scatter-add: out[b,h,i,t] = sum over j with id(i,j) = t of attn[b,h,i,j].
//
// One task = one query row i for a chunk of (b, h) pairs; the block keeps fp32 bucket sums in
// shared memory, one private copy per warp: acc[chunk][warp][K]. A warp takes 32*VEC
// consecutive keys. Ids come in runs (neighbouring keys mostly share a bucket), so a warp
// first finds the runs of equal ids among its lanes - once for the whole chunk, ids do not
// depend on (b, h) - then per (b, h) sums each run with a segmented shuffle scan (5 steps,
// fixed tree order), and the first lane ending a run of a bucket adds, in lane order, the
// sums of all runs of that bucket (usually one) into the warp's own copy. No two threads ever
// add to one address, so there are no atomics, and every sum is taken in an order fixed by
// the launch shape: the result is bitwise reproducible. Finally the warp copies are added in
// warp order. If one (b, h) row of sums does not fit in shared memory (K > ~2000), a slower
// one-thread-per-output kernel keeps the same guarantees.
#include <algorithm>

#include "irpe_device.cuh"

namespace irpe {
namespace {

constexpr int kScatterWarps = 4;
constexpr int kScatterThreads = 32 * kScatterWarps;
constexpr unsigned kFullMask = 0xffffffffu;

// Where this lane's run of equal ids starts, and who adds the run sums into the bucket.
struct Runs {
    int start;       // first lane of this lane's run
    unsigned tails;  // lanes that end a run of this lane's (valid) id
    bool lead;       // lowest lane of `tails`: it adds their run sums
};

// key = bucket id, or -1 for keys past the row / ids out of range. All 32 lanes must call.
__device__ __forceinline__ Runs find_runs(int key, int lane)
{
    const int prev = __shfl_up_sync(kFullMask, key, 1);
    const int next = __shfl_down_sync(kFullMask, key, 1);
    const unsigned starts = __ballot_sync(kFullMask, lane == 0 || prev != key);
    const bool tail = lane == 31 || next != key;
    Runs r;
    r.start = 31 - __clz(starts & (kFullMask >> (31 - lane)));
    const int tail_key = (tail && key >= 0) ? key : -1;
    r.tails = __match_any_sync(kFullMask, tail_key);
    r.lead = tail_key >= 0 && __ffs(r.tails) - 1 == lane;
    return r;
}

// Inclusive sum of the run up to this lane (segmented Hillis-Steele scan). All lanes call.
__device__ __forceinline__ float run_sum(float s, int start, int lane)
{
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const float y = __shfl_up_sync(kFullMask, s, d);
        if (lane - d >= start) {
            s += y;
        }
    }
    return s;
}

// Sum of stage[lane] over the lanes of `lanes`, in lane order.
__device__ __forceinline__ float sum_lanes(const float* stage, unsigned lanes)
{
    float s = 0.0f;
    while (lanes) {
        s += stage[__ffs(lanes) - 1];
        lanes &= lanes - 1;
    }
    return s;
}

// Adds one vector of attn values of one (b, h) row into the warp's bucket sums.
template <typename T, int VEC>
__device__ __forceinline__ void add_vector(const Vec<T, VEC>& v, bool in_row, const int (&t)[VEC],
                                           const Runs (&runs)[VEC], float* stage, float* sums,
                                           int lane)
{
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        stage[lane] = run_sum(in_row ? to_float(v.v[e]) : 0.0f, runs[e].start, lane);
        __syncwarp();
        if (runs[e].lead) {
            sums[t[e]] += sum_lanes(stage, runs[e].tails);
        }
        __syncwarp();
    }
}

template <typename T, typename Ids, int VEC>
__global__ void __launch_bounds__(kScatterThreads)
    scatter_kernel(const T* __restrict__ attn, Ids ids, T* __restrict__ out, irpe_problem p,
                   int chunk, int64_t n_chunks)
{
    extern __shared__ __align__(16) float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t k = p.num_buckets, bh_total = p.batch * p.heads;
    float* stage = smem + warp * 32;         // [warps][32]
    float* acc = smem + kScatterWarps * 32;  // [chunk][warps][K]
    for (int64_t task = blockIdx.x; task < p.lq * n_chunks; task += gridDim.x) {
        const int64_t i = task / n_chunks, bh0 = (task % n_chunks) * chunk;
        const int nbh = (int)min((int64_t)chunk, bh_total - bh0);
        __syncthreads();  // the previous task is done with `acc`
        for (int64_t e = threadIdx.x; e < nbh * kScatterWarps * k; e += blockDim.x) {
            acc[e] = 0.0f;
        }
        __syncthreads();
        // Warp-uniform loop: every lane runs every iteration, so the warp intrinsics see all 32.
        for (int64_t base = (int64_t)warp * 32 * VEC; base < p.lk; base += kScatterThreads * VEC) {
            const int64_t j = base + (int64_t)lane * VEC;
            const bool in_row = j < p.lk;  // Lk % VEC == 0: a vector is all in or all out
            int t[VEC];
            Runs runs[VEC];
            if (in_row) {
                ids.template load<VEC>(i, j, t);
            }
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                t[e] = (in_row && t[e] >= 0 && t[e] < k) ? t[e] : -1;
                runs[e] = find_runs(t[e], lane);
            }
            for (int c = 0; c < nbh; ++c) {
                const T* row = attn + row_offset(p, bh0 + c, i);
                Vec<T, VEC> v;
                if constexpr (VEC > 1) {  // the host checked stride[3] == 1 and alignment
                    if (in_row) {
                        v = load_vec<T, VEC>(row + j);
                    }
                } else if (in_row) {
                    v.v[0] = row[j * p.stride[3]];
                }
                float* sums = acc + ((int64_t)c * kScatterWarps + warp) * k;
                add_vector<T, VEC>(v, in_row, t, runs, stage, sums, lane);
            }
        }
        __syncthreads();
        for (int64_t e = threadIdx.x; e < nbh * k; e += blockDim.x) {
            const int64_t c = e / k, bucket = e % k;
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < kScatterWarps; ++w) {
                s += acc[(c * kScatterWarps + w) * k + bucket];
            }
            out[((bh0 + c) * p.lq + i) * k + bucket] = from_float<T>(s);
        }
    }
}

// Fallback for huge K: one thread per output element scans its row in key order.
template <typename T, typename Ids>
__global__ void scatter_scan_kernel(const T* __restrict__ attn, Ids ids, T* __restrict__ out,
                                    irpe_problem p)
{
    const int64_t k = p.num_buckets, total = p.batch * p.heads * p.lq * k;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bucket = e % k, i = (e / k) % p.lq, bh = e / (k * p.lq);
        const T* row = attn + row_offset(p, bh, i);
        float s = 0.0f;
        for (int64_t j = 0; j < p.lk; ++j) {
            int t[1];
            ids.template load<1>(i, j, t);
            s += t[0] == bucket ? to_float(row[j * p.stride[3]]) : 0.0f;
        }
        out[e] = from_float<T>(s);
    }
}

template <typename T, typename Ids, int VEC>
int launch(const irpe_problem& p, const void* attn, Ids ids, void* out, cudaStream_t stream)
{
    const size_t fixed = kScatterWarps * 32 * sizeof(float);
    const size_t per_bh = (size_t)kScatterWarps * p.num_buckets * sizeof(float);
    const T* in = static_cast<const T*>(attn);
    if (fixed + per_bh > kSmemBudget) {
        const int64_t total = p.batch * p.heads * p.lq * p.num_buckets;
        const int blocks = (int)std::min<int64_t>((total + 255) / 256, 65535);
        scatter_scan_kernel<T, Ids><<<blocks, 256, 0, stream>>>(in, ids, static_cast<T*>(out), p);
        return finish_launch();
    }
    const Plan plan = make_plan(p, per_bh, fixed);
    scatter_kernel<T, Ids, VEC><<<plan.grid, kScatterThreads, plan.smem, stream>>>(
        in, ids, static_cast<T*>(out), p, plan.chunk, plan.n_chunks);
    return finish_launch();
}

// The launch for one element type and id source; 16-byte loads when every attn row and the
// index allow them, else scalar (still coalesced) loads.
struct ScatterOp {
    const irpe_problem& p;
    const void* in;  // attn
    void* out;
    cudaStream_t stream;

    template <typename T, typename Ids>
    int run(Ids ids, const void* index, size_t index_bytes) const
    {
        constexpr int kVec = 16 / sizeof(T);
        const bool vec = p.lk % kVec == 0 && p.stride[3] == 1 && p.stride[0] % kVec == 0 &&
                         p.stride[1] % kVec == 0 && p.stride[2] % kVec == 0 &&
                         aligned(in, 16) && (!index || aligned(index, index_bytes * kVec));
        return vec ? launch<T, Ids, kVec>(p, in, ids, out, stream)
                   : launch<T, Ids, 1>(p, in, ids, out, stream);
    }
};

}  // namespace
}  // namespace irpe

extern "C" int irpe_scatter(const irpe_problem* problem, irpe_dtype dtype, const void* attn,
                            irpe_index_dtype index_dtype, const void* index, void* out,
                            void* stream)
{
    return irpe::check_and_run<irpe::ScatterOp>(problem, dtype, attn, index_dtype, index, nullptr,
                                                out, stream);
}

// params == NULL is rejected by the check (neither an index nor a grid).
extern "C" int irpe_scatter_grid(const irpe_problem* problem, irpe_dtype dtype, const void* attn,
                                 const irpe_bucket_params* params, void* out, void* stream)
{
    return irpe::check_and_run<irpe::ScatterOp>(problem, dtype, attn, IRPE_INT32, nullptr, params,
                                                out, stream);
}
