// RPEGatherAdd(table, index, base) = base + RPEGather(table, index), and
// RPEGatherAdd2(table, index, base, table2, index2) = (base + gather) + gather2, with ONNX's
// broadcasting of base (rank <= 4, dims equal or 1). Not exported ops: irpe.runtime.onnxruntime.rewrites
// rewrites Add(x, RPEGather(...)) (and a chain of two) into them when a session loads with
// this library, so the attention logits are read and written once instead of once per gather
// and once per Add. The additions happen in the graph's order, so the result equals the
// unfused graph bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <climits>

#include "rpe_terms.h"

namespace irpe_ort {

namespace {

struct GatherAddJob {
    AddJob add;
    AddRowFn row = nullptr;
    float* out = nullptr;
    int64_t total_rows = 0, chunk = 1;
};

void add_chunk(void* data, size_t chunk)
{
    const GatherAddJob& job = *static_cast<const GatherAddJob*>(data);
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk;
    const int64_t end = std::min(begin + job.chunk, job.total_rows);
    for (int64_t r = begin; r < end; ++r) {
        job.row(job.add, r, job.out + r * job.add.lk);
    }
}

// Output dims (broadcast of the gathers' [B,H,Lq,Lk] and base) and base's element strides.
std::string broadcast(AddJob& job, const std::vector<int64_t>& base_dims)
{
    if (base_dims.size() > 4) {
        return "input 2 has rank " + std::to_string(base_dims.size()) + " (<= 4)";
    }
    std::vector<int64_t> dims(4 - base_dims.size(), 1);
    dims.insert(dims.end(), base_dims.begin(), base_dims.end());
    int64_t out[4] = {1, 1, job.lq, job.lk}, stride = 1;
    for (int n = 0; n < job.terms; ++n) {
        const Problem& p = job.term[n].p;
        for (int d = 0; d < 2; ++d) {
            const int64_t g = d == 0 ? p.batch : p.heads;
            if (g != 1 && out[d] != 1 && g != out[d]) {
                return "the gathers' batch/heads differ";
            }
            out[d] = std::max(out[d], g);
        }
    }
    for (int d = 3; d >= 0; --d) {
        if (dims[d] != out[d] && dims[d] != 1 && out[d] != 1) {
            return "input 2 dim " + std::to_string(d) + " is " + std::to_string(dims[d]) +
                   ", the gather's " + std::to_string(out[d]);
        }
        if (d >= 2 && dims[d] > out[d]) {
            return "input 2 would broadcast the gather over queries or keys";
        }
        out[d] = std::max(dims[d], out[d]);
        job.base_stride[d] = dims[d] == 1 ? 0 : stride;
        stride *= dims[d];
    }
    job.out_b = out[0];
    job.out_h = out[1];
    return {};
}

}  // namespace

// Inputs (table, index) at `first` as one term; "" or what is wrong.
std::string read_term(const RPEConfig& c, Ort::KernelContext& ctx, size_t first, Term& term,
                      ONNXTensorElementDataType& index_type)
{
    auto table = ctx.GetInput(first);
    auto index = ctx.GetInput(first + 1);
    const auto info = index.GetTensorTypeAndShapeInfo();
    RPEConfig plain = c;
    plain.num_buckets = first == 0 ? c.num_buckets : 0;  // the 2nd table's K is its own
    term.p = make_problem(plain, table.GetTensorTypeAndShapeInfo().GetShape(), info.GetShape());
    index_type = info.GetElementType();
    if (index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
        index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        return "index must be int32 or int64";
    }
    term.table = table.GetTensorData<float>();
    term.ids = index.GetTensorRawData();
    return term.p.error;
}

std::string read_add_job(const RPEConfig& c, Ort::KernelContext& ctx, AddJob& job)
{
    job.terms = c.adds == 2 ? 2 : 1;
    ONNXTensorElementDataType types[2] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
                                          ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64};
    for (int n = 0; n < job.terms; ++n) {
        const std::string error = read_term(c, ctx, n == 0 ? 0 : 3, job.term[n], types[n]);
        if (!error.empty()) {
            return error;
        }
    }
    job.lq = job.term[0].p.lq;
    job.lk = job.term[0].p.lk;
    if (job.terms == 2 && (job.term[1].p.lq != job.lq || job.term[1].p.lk != job.lk ||
                           types[1] != types[0])) {
        return "the two gathers differ in Lq, Lk or index type";
    }
    job.wide = types[0] == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    auto base = ctx.GetInput(2);
    job.base = base.GetTensorData<float>();
    return broadcast(job, base.GetTensorTypeAndShapeInfo().GetShape());
}

std::shared_ptr<const std::vector<int32_t>> NarrowedIds::get(int term, const void* ids, bool wide,
                                                             int64_t count, int64_t k)
{
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& e : entries_) {
        if (e.term == term && e.count == count && e.k == k) {
            return e.ids;
        }
    }
    auto narrowed = std::make_shared<std::vector<int32_t>>();
    if (!narrow_ids(ids, wide, count, k, *narrowed)) {
        return nullptr;
    }
    entries_.push_back({term, count, k, narrowed});
    return narrowed;
}

bool use_avx2(AddJob& job, NarrowedIds* cache, Simd simd)
{
    if (job.base_stride[3] != 1 || simd == Simd::kPortable) {
        return false;
    }
    const int64_t count = job.lq * job.lk;
    for (int n = 0; n < job.terms; ++n) {
        const Term& t = job.term[n];
        if (cache != nullptr && cache->constant[n]) {
            job.narrowed[n] = cache->get(n, t.ids, job.wide, count, t.p.k);
        } else {
            auto now = std::make_shared<std::vector<int32_t>>();
            job.narrowed[n] = narrow_ids(t.ids, job.wide, count, t.p.k, *now) ? now : nullptr;
        }
        if (job.narrowed[n] == nullptr) {
            job.ids32[0] = job.ids32[1] = nullptr;
            return false;
        }
        job.ids32[n] = job.narrowed[n]->data();
    }
    job.avx512 = simd == Simd::kAvx512;
    return true;
}

OrtStatusPtr gather_add_cpu(const RPEConfig& c, NarrowedIds& ids, Ort::KernelContext& ctx)
{
    GatherAddJob job;
    const std::string error = read_add_job(c, ctx, job.add);
    if (!error.empty()) {
        return Ort::GetApi().CreateStatus(
            ORT_INVALID_ARGUMENT, (std::string(op_name(c.op, c.grid, c.adds)) + ": " + error).c_str());
    }
    const AddJob& a = job.add;
    auto out = ctx.GetOutput(0, {a.out_b, a.out_h, a.lq, a.lk});
    job.total_rows = a.out_b * a.out_h * a.lq;
    if (job.total_rows == 0 || a.lk == 0) {
        return nullptr;
    }
    job.out = out.GetTensorMutableData<float>();
    job.chunk = chunk_rows(job.total_rows, a.lk);
    use_avx2(job.add, &ids, c.simd);
    job.row = add_row_fn(job.add);
    parallel(ctx, &add_chunk, (job.total_rows + job.chunk - 1) / job.chunk, &job);
    return nullptr;
}

}  // namespace irpe_ort
