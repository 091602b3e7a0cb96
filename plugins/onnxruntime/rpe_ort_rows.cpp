// CPU row kernels of RPEGather / RPEScatter: the flattened (B*H*Lq) output rows split into
// chunks on ORT's intra-op thread pool (KernelContext_ParallelFor); each row is written by one
// task only, so results do not depend on the thread count (see rpe_cpu.h).
#include <algorithm>

#include "rpe_cpu.h"
#include "rpe_ort.h"
#include "rpe_simd.h"

namespace irpe_ort {

// The shared rows (plugins/cpu/rpe_cpu.h, rpe_simd.h) these kernels run.
using irpe_cpu::gather_row;
using irpe_cpu::leave_avx512;
using irpe_cpu::scatter_row;
using irpe_cpu::scatter_rows4;

namespace {
constexpr int64_t kMinElementsPerTask = 16384;
constexpr int64_t kMaxTasks = 64;
}  // namespace

int64_t chunk_rows(int64_t rows, int64_t width)
{
    const int64_t by_work = std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, width));
    return std::max(by_work, (rows + kMaxTasks - 1) / kMaxTasks);
}

namespace {

struct Task {  // a kernel's task function and job, and whether the CPU has AVX-512
    void (*fn)(void*, size_t);
    void* job;
    bool avx512;
};

// Runs one task, then leaves the thread's AVX-512 state clean (rpe_simd.h leave_avx512).
void run_task(void* data, size_t chunk)
{
    const Task& task = *static_cast<const Task*>(data);
    task.fn(task.job, chunk);
    if (task.avx512) {
        leave_avx512();
    }
}

}  // namespace

void parallel(Ort::KernelContext& ctx, void (*fn)(void*, size_t), int64_t tasks, void* job)
{
    static const bool avx512 = __builtin_cpu_supports("avx512f");
    Task task{fn, job, avx512};
    if (tasks <= 1) {
        run_task(&task, 0);
    } else {
        ctx.ParallelFor(&run_task, static_cast<size_t>(tasks), 0, &task);
    }
}

namespace {

struct ListsJob {  // lists_task's job
    Problem p;
    const void* ids = nullptr;
    std::vector<int32_t> off, pos;
};

}  // namespace

std::shared_ptr<const BucketLists> BucketListCache::get(Ort::KernelContext& ctx, const void* ids,
                                                        bool wide, int64_t lq, int64_t lk,
                                                        int64_t k)
{
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    if (constant) {
        lock.lock();  // one build per size even when sessions run concurrently
        for (const Entry& e : entries_) {
            if (e.lq == lq && e.lk == lk && e.k == k) {
                return e.lists;
            }
        }
    }
    ListsJob job;
    job.p.lq = lq;
    job.p.lk = lk;
    job.p.k = k;
    job.ids = ids;
    job.off.assign(static_cast<size_t>(lq * (k + 1)), 0);
    job.pos.resize(static_cast<size_t>(lq * lk));
    const int64_t rows = chunk_rows(lq, lk);
    parallel(ctx, wide ? &lists_task<int64_t, ListsJob> : &lists_task<int32_t, ListsJob>,
             (lq + rows - 1) / rows, &job);
    auto lists = std::make_shared<BucketLists>();
    lists->off = std::move(job.off);
    lists->pos = std::move(job.pos);
    if (constant) {
        entries_.push_back({lq, lk, k, lists});
    }
    return lists;
}

namespace {

OrtStatusPtr fail(const std::string& message)
{
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, message.c_str());
}

// One ParallelFor job: rows [chunk * chunk_rows, ...) of the flattened (B*H*Lq) output. The
// scatter first builds the bucket lists of every index row (off, pos), in parallel too.
struct Job {
    Problem p;
    const void* in = nullptr;
    const void* ids = nullptr;
    void* out = nullptr;
    int64_t total_rows = 0, chunk_rows = 1;
    std::vector<int32_t> off, pos;
};

template <typename T, typename I>
void gather_chunk(void* data, size_t chunk)
{
    const Job& job = *static_cast<const Job*>(data);
    const Problem& p = job.p;
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk_rows;
    const int64_t end = std::min(begin + job.chunk_rows, job.total_rows);
    const T* in = static_cast<const T*>(job.in);
    const I* ids = static_cast<const I*>(job.ids);
    T* out = static_cast<T*>(job.out);
    for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % p.lq;
        const int64_t table_row = (r / p.lq) * p.rows + (p.rows == 1 ? 0 : i);
        gather_row(in + table_row * p.k, ids + i * p.lk, p.lk, p.k, out + r * p.lk);
    }
}

// Scatter task: groups g = (block of 4 (b, h) rows, query i), i fastest; see scatter_rows4.
template <typename T>
void scatter_chunk(void* data, size_t chunk)
{
    const Job& job = *static_cast<const Job*>(data);
    const Problem& p = job.p;
    const int64_t bh = p.batch * p.heads, groups = (bh + 3) / 4 * p.lq;
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk_rows;
    const int64_t end = std::min(begin + job.chunk_rows, groups);
    const T* in = static_cast<const T*>(job.in);
    T* out = static_cast<T*>(job.out);
    for (int64_t g = begin; g < end; ++g) {
        const int64_t i = g % p.lq, first = g / p.lq * 4, count = std::min<int64_t>(4, bh - first);
        const int32_t* off = job.off.data() + i * (p.k + 1);
        const int32_t* pos = job.pos.data() + i * p.lk;
        const int64_t r = first * p.lq + i;
        if (count == 4) {
            scatter_rows4(in + r * p.lk, p.lq * p.lk, off, pos, p.k, out + r * p.k, p.lq * p.k);
            continue;
        }
        for (int64_t c = 0; c < count; ++c) {
            const int64_t rc = r + c * p.lq;
            scatter_row(in + rc * p.lk, off, pos, p.k, out + rc * p.k);
        }
    }
}

template <typename T, typename I, bool kGather>
void run_rows(Ort::KernelContext& ctx, Job& job)
{
    const Problem& p = job.p;
    if constexpr (!kGather) {
        job.off.assign(static_cast<size_t>(p.lq * (p.k + 1)), 0);
        job.pos.resize(static_cast<size_t>(p.lq * p.lk));
        const int64_t rows = chunk_rows(p.lq, p.lk);
        parallel(ctx, &lists_task<I, Job>, (p.lq + rows - 1) / rows, &job);
        const int64_t groups = (p.batch * p.heads + 3) / 4 * p.lq;
        job.chunk_rows = chunk_rows(groups, 4 * std::max(p.lk, p.k));
        parallel(ctx, &scatter_chunk<T>, (groups + job.chunk_rows - 1) / job.chunk_rows, &job);
    } else {
        job.chunk_rows = chunk_rows(job.total_rows, p.lk);
        parallel(ctx, &gather_chunk<T, I>, (job.total_rows + job.chunk_rows - 1) / job.chunk_rows,
                 &job);
    }
}

template <typename T, bool kGather>
void dispatch_index(Ort::KernelContext& ctx, Job& job, ONNXTensorElementDataType index_type)
{
    if (index_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        run_rows<T, int64_t, kGather>(ctx, job);
    } else {
        run_rows<T, int32_t, kGather>(ctx, job);
    }
}

// Gather moves bits (same-sized unsigned ints); scatter converts to fp32 and back.
void dispatch(Ort::KernelContext& ctx, Op op, Job& job, ONNXTensorElementDataType value_type,
              ONNXTensorElementDataType index_type)
{
    const bool wide = value_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    if (op == Op::kGather) {
        if (wide) {
            dispatch_index<uint32_t, true>(ctx, job, index_type);
        } else {
            dispatch_index<uint16_t, true>(ctx, job, index_type);
        }
    } else if (wide) {
        dispatch_index<float, false>(ctx, job, index_type);
    } else if (value_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
        dispatch_index<Ort::Float16_t, false>(ctx, job, index_type);
    } else {
        dispatch_index<Ort::BFloat16_t, false>(ctx, job, index_type);
    }
}

}  // namespace

OrtStatusPtr rows_cpu(const RPEConfig& c, GridIdCache& cache, Ort::KernelContext& ctx)
{
    auto in = ctx.GetInput(0);
    auto index = ctx.GetInput(1);
    const auto in_info = in.GetTensorTypeAndShapeInfo();
    const auto index_info = index.GetTensorTypeAndShapeInfo();
    Job job;
    job.p = make_problem(c, in_info.GetShape(), index_info.GetShape());
    if (!job.p.error.empty()) {
        return fail(job.p.error);
    }
    ONNXTensorElementDataType index_type = index_info.GetElementType();
    std::shared_ptr<const std::vector<int32_t>> grid;
    if (c.on_the_fly()) {
        const auto dims = index_info.GetShape();
        irpe_bucket_params bp;
        const std::string error = grid_params(c, dims[dims.size() - 2], dims.back(), bp);
        if (!error.empty()) {
            return fail(std::string(op_name(c.op, c.grid, c.adds)) + ": " + error);
        }
        grid = cache.get(bp);
        job.ids = grid->data();
        index_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    } else if (index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
               index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        return fail(std::string(op_name(c.op, c.grid, c.adds)) + ": index must be int32 or int64");
    } else {
        job.ids = index.GetTensorRawData();
    }
    const Problem& p = job.p;
    const std::vector<int64_t> out_dims{p.batch, p.heads, p.lq,
                                        c.op == Op::kGather ? p.lk : p.k};
    auto out = ctx.GetOutput(0, out_dims);
    job.total_rows = p.batch * p.heads * p.lq;
    if (job.total_rows == 0 || out_dims[3] == 0) {
        return nullptr;
    }
    job.in = in.GetTensorRawData();
    job.out = out.GetTensorMutableRawData();
    dispatch(ctx, c.op, job, in_info.GetElementType(), index_type);
    return nullptr;
}

}  // namespace irpe_ort
