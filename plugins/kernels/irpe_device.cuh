// Device helpers shared by the gather and scatter kernels: dtype conversion, aligned vector
// access, the two sources of bucket ids (index tensor or on-the-fly math) and launch planning.
#ifndef IRPE_DEVICE_CUH
#define IRPE_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "irpe_kernels.h"

namespace irpe {

// fp32 is the accumulation type of every dtype.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

// N consecutive elements moved as one (or a few) wide memory operations; the host only picks
// N > 1 when every address used is a multiple of sizeof(Vec).
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

template <typename T, int N> __device__ __forceinline__ Vec<T, N> load_vec(const T* p)
{
    return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N> __device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v)
{
    *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// Bucket ids read from a dense [Lq, Lk] index tensor (int32 or int64).
template <typename I> struct TensorIds {
    const I* index;
    int64_t lk;

    template <int N> __device__ __forceinline__ void load(int64_t i, int64_t j, int (&t)[N]) const
    {
        const Vec<I, N> v = load_vec<I, N>(index + i * lk + j);
#pragma unroll
        for (int e = 0; e < N; ++e) {
            t[e] = static_cast<int>(v.v[e]);
        }
    }
};

// Bucket ids computed from the grid parameters: no index tensor in memory at all.
struct GridIds {
    irpe_bucket_params params;

    template <int N> __device__ __forceinline__ void load(int64_t i, int64_t j, int (&t)[N]) const
    {
#pragma unroll
        for (int e = 0; e < N; ++e) {
            t[e] = irpe_bucket_id(&params, i, j + e);
        }
    }
};

// Offset of row (bh, i) of a strided 4-D operand; bh = b * heads + h.
__device__ __forceinline__ int64_t row_offset(const irpe_problem& p, int64_t bh, int64_t i)
{
    return (bh / p.heads) * p.stride[0] + (bh % p.heads) * p.stride[1] + i * p.stride[2];
}

// How one launch covers its work: a task is one query row i for `chunk` consecutive (b, h)
// pairs; blocks walk the tasks with a grid-stride loop, so no size is ever too large.
struct Plan {
    int chunk;        // (b, h) pairs per task
    int64_t n_chunks; // tasks per query row
    int64_t tasks;    // lq * n_chunks
    int grid;         // blocks launched (<= tasks)
    size_t smem;      // dynamic shared memory per block
};

// Shared-memory budget per block; below the 48 KiB that needs no opt-in on any architecture.
constexpr size_t kSmemBudget = 32 * 1024;

// bytes_per_bh: shared memory one (b, h) pair of a task needs; fixed_bytes: per block.
Plan make_plan(const irpe_problem& p, size_t bytes_per_bh, size_t fixed_bytes);

// IRPE_ERR_ARGUMENT unless sizes are positive, pointers set and, for the on-the-fly variant
// (grid != NULL, index unused), the grid describes exactly Lq = Lk tokens.
int check_call(const irpe_problem* p, const void* in, const void* out, const void* index,
               const irpe_bucket_params* grid);

// After a launch: IRPE_OK, or IRPE_ERR_CUDA with the message kept for irpe_last_error().
int finish_launch();

// True when `ptr` may be accessed as Vec<T, N> (address a multiple of the vector size).
inline bool aligned(const void* ptr, size_t bytes)
{
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Runs op.template run<T>(ids, index, index_bytes) with T the element type of `dtype` and ids
// the bucket-id source: the grid math when `grid` is set, else the int32/int64 index tensor.
template <typename T, typename Op>
int with_ids(const Op& op, irpe_index_dtype index_dtype, const void* index,
             const irpe_bucket_params* grid, int64_t lk)
{
    if (grid) {
        return op.template run<T>(GridIds{*grid}, nullptr, 0);
    }
    if (index_dtype == IRPE_INT32) {
        const TensorIds<int32_t> ids{static_cast<const int32_t*>(index), lk};
        return op.template run<T>(ids, index, sizeof(int32_t));
    }
    if (index_dtype == IRPE_INT64) {
        const TensorIds<int64_t> ids{static_cast<const int64_t*>(index), lk};
        return op.template run<T>(ids, index, sizeof(int64_t));
    }
    return IRPE_ERR_ARGUMENT;
}

template <typename Op>
int dispatch(const Op& op, irpe_dtype dtype, irpe_index_dtype index_dtype, const void* index,
             const irpe_bucket_params* grid, int64_t lk)
{
    switch (dtype) {
    case IRPE_FLOAT32:
        return with_ids<float>(op, index_dtype, index, grid, lk);
    case IRPE_FLOAT16:
        return with_ids<__half>(op, index_dtype, index, grid, lk);
    case IRPE_BFLOAT16:
        return with_ids<__nv_bfloat16>(op, index_dtype, index, grid, lk);
    }
    return IRPE_ERR_ARGUMENT;
}

// What every entry point does: check the call, then run Op{problem, in, out, stream} for the
// element type and id source (Op = the gather or scatter launcher).
template <typename Op>
int check_and_run(const irpe_problem* p, irpe_dtype dtype, const void* in,
                  irpe_index_dtype index_dtype, const void* index, const irpe_bucket_params* grid,
                  void* out, void* stream)
{
    const int status = check_call(p, in, out, index, grid);
    if (status != IRPE_OK) {
        return status;
    }
    const Op op{*p, in, out, static_cast<cudaStream_t>(stream)};
    return dispatch(op, dtype, index_dtype, index, grid, p->lk);
}

}  // namespace irpe

#endif  // IRPE_DEVICE_CUH
