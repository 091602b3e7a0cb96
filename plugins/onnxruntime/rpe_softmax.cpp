// RPEGatherAddSoftmax(table, index, base) = Softmax(RPEGatherAdd(table, index, base), axis=-1)
// and RPEGatherAdd2Softmax with a second gather (inputs 3, 4), as RPEGatherAdd*: the logits of
// a row are built in the output row, then max / exp / sum / scale run on it while it is in L1,
// so the attention logits are written and read once instead of twice. The *Scatter forms take
// the iRPE-V index as their last input (attribute scatter_buckets K) and give a second output,
// the bucket sums of the probabilities [B, H, Lq, K] (RPEScatter of output 0, same order),
// taken from the same row. Not exported ops: irpe.runtime.onnxruntime.rewrites rewrites Softmax(RPEGatherAdd*)
// into them at session load. fp32, CPU; the logits equal RPEGatherAdd's bit for bit, the
// probabilities are ONNX Runtime's Softmax within float rounding (own vectorised exp).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "rpe_simd.h"
#include "rpe_terms.h"

namespace irpe_ort {

// The shared rows (plugins/cpu/rpe_cpu.h, rpe_simd.h) these ops run.
using irpe_cpu::kSoftmaxPad;
using irpe_cpu::scatter_row;
using irpe_cpu::scatter_rows4;

namespace {

using SoftmaxRowsFn = void (*)(float* const*, int64_t, float* const*);

struct SoftmaxJob {
    AddJob add;
    AddRowFn row = nullptr;
    SoftmaxRowsFn rows4 = nullptr, rows1 = nullptr;  // SIMD softmax (rpe_simd.h) or portable
    float* out = nullptr;
    float* sums = nullptr;  // *Scatter: [rows, kv]
    const BucketLists* lists = nullptr;
    int64_t kv = 0, groups = 0, chunk = 1;
};

// The softmax rows of this SIMD level (4-row and 1-row forms); nullptr: the portable path.
void pick_simd(Simd simd, SoftmaxRowsFn& four, SoftmaxRowsFn& one)
{
    four = simd == Simd::kAvx512 ? &irpe_cpu::softmax_rows4_avx512
           : simd == Simd::kAvx2 ? &irpe_cpu::softmax_rows4_avx2
                                 : nullptr;
    one = simd == Simd::kAvx512 ? &irpe_cpu::softmax_rows1_avx512
          : simd == Simd::kAvx2 ? &irpe_cpu::softmax_rows1_avx2
                                : nullptr;
}

// The portable path: one row at a time with std::exp.
void softmax_rows(float* const* x, int count, int64_t n, float* const* out)
{
    for (int r = 0; r < count; ++r) {
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            m = std::max(m, x[r][j]);
        }
        for (int64_t j = 0; j < n; ++j) {
            x[r][j] = std::exp(x[r][j] - m);
            s += x[r][j];
        }
        const float inv = 1.0f / s;
        for (int64_t j = 0; j < n; ++j) {
            out[r][j] = x[r][j] * inv;
        }
    }
}

// The *Scatter output of `count` rows r0 + c * Lq (query i): RPEScatter's sums of the
// probabilities just written (rpe_cpu.h: same order, so the same bits as RPEScatter).
void sum_buckets(const SoftmaxJob& job, int64_t i, int64_t r0, int count)
{
    const int64_t lq = job.add.lq, lk = job.add.lk, kv = job.kv;
    const int32_t* off = job.lists->off.data() + i * (kv + 1);
    const int32_t* pos = job.lists->pos.data() + i * lk;
    if (count == 4) {
        scatter_rows4(job.out + r0 * lk, lq * lk, off, pos, kv, job.sums + r0 * kv, lq * kv);
        return;
    }
    for (int c = 0; c < count; ++c) {
        const int64_t r = r0 + c * lq;
        scatter_row(job.out + r * lk, off, pos, kv, job.sums + r * kv);
    }
}

// Groups g = (block of 4 (b, h) rows, query i), i fastest: the 4 rows' logits go to a scratch
// block, their softmax to the output, and (*Scatter) their bucket sums are taken from the
// output rows just written, 4 rows per walk of the bucket lists (rpe_cpu.h scatter_rows4).
void softmax_chunk(void* data, size_t chunk)
{
    const SoftmaxJob& job = *static_cast<const SoftmaxJob*>(data);
    const int64_t lq = job.add.lq, lk = job.add.lk, bh = job.add.out_b * job.add.out_h;
    const int64_t ld = (lk + kSoftmaxPad - 1) / kSoftmaxPad * kSoftmaxPad;
    std::vector<float> scratch(static_cast<size_t>(4 * ld));
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk;
    const int64_t end = std::min(begin + job.chunk, job.groups);
    for (int64_t g = begin; g < end; ++g) {
        const int64_t i = g % lq, first = g / lq * 4;
        const int count = static_cast<int>(std::min<int64_t>(4, bh - first));
        const int64_t r0 = first * lq + i;
        float* x[4];
        float* out[4];
        for (int c = 0; c < count; ++c) {
            x[c] = scratch.data() + c * ld;
            out[c] = job.out + (r0 + c * lq) * lk;
            job.row(job.add, r0 + c * lq, x[c]);
            std::fill(x[c] + lk, x[c] + ld, -INFINITY);  // the last phase left exps there
        }
        if (job.rows4 != nullptr && count == 4) {
            job.rows4(x, lk, out);
        } else if (job.rows1 != nullptr) {
            for (int c = 0; c < count; ++c) {
                job.rows1(x + c, lk, out + c);
            }
        } else {
            softmax_rows(x, count, lk, out);
        }
        if (job.sums != nullptr) {
            sum_buckets(job, i, r0, count);
        }
    }
}

OrtStatusPtr softmax_fail(const RPEConfig& c, const std::string& message)
{
    const std::string text = std::string(op_name(c.op, c.grid, c.adds, c.fused)) + ": " + message;
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, text.c_str());
}

// The *Scatter forms' bucket lists of the V index (last input): "" or what is wrong.
std::string read_lists(const RPEConfig& c, Ort::KernelContext& ctx, SoftmaxJob& job,
                       BucketListCache& cache, std::shared_ptr<const BucketLists>& keep)
{
    auto index = ctx.GetInput(c.adds == 2 ? 5 : 3);
    const auto info = index.GetTensorTypeAndShapeInfo();
    const auto dims = info.GetShape();
    const auto type = info.GetElementType();
    if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
        type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        return "the scatter index must be int32 or int64";
    }
    if (dims.size() != 2 || dims[0] != job.add.lq || dims[1] != job.add.lk) {
        return "the scatter index must be [Lq, Lk] = [" + std::to_string(job.add.lq) + ", " +
               std::to_string(job.add.lk) + "]";
    }
    job.kv = c.scatter_buckets;
    keep = cache.get(ctx, index.GetTensorRawData(), type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
                     job.add.lq, job.add.lk, job.kv);
    job.lists = keep.get();
    return {};
}

}  // namespace

OrtStatusPtr softmax_cpu(const RPEConfig& c, NarrowedIds& ids, BucketListCache& lists,
                         Ort::KernelContext& ctx)
{
    SoftmaxJob job;
    std::string error = read_add_job(c, ctx, job.add);
    std::shared_ptr<const BucketLists> keep;
    if (error.empty() && c.fused == Fused::kSoftmaxScatter) {
        error = read_lists(c, ctx, job, lists, keep);
    }
    if (error.empty() && job.add.base_stride[3] != 1) {
        error = "input 2 (base) must not broadcast along the keys";
    }
    if (!error.empty()) {
        return softmax_fail(c, error);
    }
    const AddJob& a = job.add;
    auto out = ctx.GetOutput(0, {a.out_b, a.out_h, a.lq, a.lk});
    const int64_t rows = a.out_b * a.out_h * a.lq;
    if (c.fused == Fused::kSoftmaxScatter) {
        auto sums = ctx.GetOutput(1, {a.out_b, a.out_h, a.lq, job.kv});
        job.sums = sums.GetTensorMutableData<float>();
    }
    if (rows == 0 || a.lk == 0) {
        if (job.sums != nullptr) {
            std::fill(job.sums, job.sums + rows * job.kv, 0.0f);
        }
        return nullptr;
    }
    job.out = out.GetTensorMutableData<float>();
    use_avx2(job.add, &ids, c.simd);
    job.row = add_row_fn(job.add);
    pick_simd(c.simd, job.rows4, job.rows1);
    job.groups = (a.out_b * a.out_h + 3) / 4 * a.lq;
    job.chunk = chunk_rows(job.groups, 4 * a.lk);
    parallel(ctx, &softmax_chunk, (job.groups + job.chunk - 1) / job.chunk, &job);
    return nullptr;
}

}  // namespace irpe_ort
