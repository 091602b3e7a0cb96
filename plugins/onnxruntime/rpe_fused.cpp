// RPEGatherAdd(table, index, base) = base + RPEGather(table, index), with ONNX's broadcasting
// of base (rank <= 4, dims equal or 1). Not an exported op: irpe.deploy.ort rewrites
// Add(x, RPEGather(...)) into it when the session loads with this library, so the attention
// logits are read and written once instead of a gather pass plus an Add pass. IEEE addition
// is commutative, so the result equals the unfused Add bit for bit.
#include <algorithm>

#include "rpe_ort.h"

namespace irpe_ort {

namespace {

struct AddJob {
    Problem p;                    // the gather (B, H: the table's)
    int64_t out_b = 0, out_h = 0;  // output batch / heads (broadcast with base)
    int64_t base_stride[4] = {0, 0, 0, 0};
    const float* table = nullptr;
    const void* ids = nullptr;
    const float* base = nullptr;
    float* out = nullptr;
    int64_t total_rows = 0, chunk = 1;
};

template <typename I>
void add_chunk(void* data, size_t chunk)
{
    const AddJob& job = *static_cast<const AddJob*>(data);
    const Problem& p = job.p;
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk;
    const int64_t end = std::min(begin + job.chunk, job.total_rows);
    const I* ids = static_cast<const I*>(job.ids);
    const int64_t* bs = job.base_stride;
    for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % p.lq, h = (r / p.lq) % job.out_h, b = r / (p.lq * job.out_h);
        const int64_t tb = p.batch == 1 ? 0 : b, th = p.heads == 1 ? 0 : h;
        const float* row = job.table + ((tb * p.heads + th) * p.rows + (p.rows == 1 ? 0 : i)) * p.k;
        const float* base = job.base + b * bs[0] + h * bs[1] + i * bs[2];
        const I* id = ids + i * p.lk;
        float* out = job.out + r * p.lk;
        for (int64_t j = 0; j < p.lk; ++j) {
            const int64_t t = static_cast<int64_t>(id[j]);
            const float g = static_cast<uint64_t>(t) < static_cast<uint64_t>(p.k) ? row[t] : 0.0f;
            out[j] = base[j * bs[3]] + g;
        }
    }
}

// Output dims (broadcast of the gather's [B,H,Lq,Lk] and base) and base's element strides.
std::string broadcast(AddJob& job, const std::vector<int64_t>& base_dims)
{
    if (base_dims.size() > 4) {
        return "RPEGatherAdd: input 2 has rank " + std::to_string(base_dims.size()) + " (<= 4)";
    }
    std::vector<int64_t> dims(4 - base_dims.size(), 1);
    dims.insert(dims.end(), base_dims.begin(), base_dims.end());
    const int64_t gather[4] = {job.p.batch, job.p.heads, job.p.lq, job.p.lk};
    int64_t out[4], stride = 1;
    for (int d = 3; d >= 0; --d) {
        if (dims[d] != gather[d] && dims[d] != 1 && gather[d] != 1) {
            return "RPEGatherAdd: input 2 dim " + std::to_string(d) + " is " +
                   std::to_string(dims[d]) + ", the gather's " + std::to_string(gather[d]);
        }
        out[d] = std::max(dims[d], gather[d]);
        job.base_stride[d] = dims[d] == 1 ? 0 : stride;
        stride *= dims[d];
    }
    if (out[2] != job.p.lq || out[3] != job.p.lk) {
        return "RPEGatherAdd: input 2 would broadcast the gather over queries or keys";
    }
    job.out_b = out[0];
    job.out_h = out[1];
    return {};
}

OrtStatusPtr fail(const std::string& message)
{
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, message.c_str());
}

}  // namespace

OrtStatusPtr gather_add_cpu(const RpeConfig& c, Ort::KernelContext& ctx)
{
    auto table = ctx.GetInput(0);
    auto index = ctx.GetInput(1);
    auto base = ctx.GetInput(2);
    const auto index_info = index.GetTensorTypeAndShapeInfo();
    AddJob job;
    job.p = make_problem(c, table.GetTensorTypeAndShapeInfo().GetShape(), index_info.GetShape());
    if (!job.p.error.empty()) {
        return fail(job.p.error);
    }
    const auto index_type = index_info.GetElementType();
    if (index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
        index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        return fail("RPEGatherAdd: index must be int32 or int64");
    }
    const std::string error = broadcast(job, base.GetTensorTypeAndShapeInfo().GetShape());
    if (!error.empty()) {
        return fail(error);
    }
    auto out = ctx.GetOutput(0, {job.out_b, job.out_h, job.p.lq, job.p.lk});
    job.total_rows = job.out_b * job.out_h * job.p.lq;
    if (job.total_rows == 0 || job.p.lk == 0) {
        return nullptr;
    }
    job.table = table.GetTensorData<float>();
    job.ids = index.GetTensorRawData();
    job.base = base.GetTensorData<float>();
    job.out = out.GetTensorMutableData<float>();
    job.chunk = chunk_rows(job.total_rows, job.p.lk);
    const int64_t tasks = (job.total_rows + job.chunk - 1) / job.chunk;
    parallel(ctx, index_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? &add_chunk<int64_t>
                                                                   : &add_chunk<int32_t>,
             tasks, &job);
    return nullptr;
}

}  // namespace irpe_ort
