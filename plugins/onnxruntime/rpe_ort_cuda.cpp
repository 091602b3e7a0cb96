// CUDA EP compute of RPEGather / RPEScatter: the plugins/kernels kernels (irpe_kernels.h C ABI)
// launched on ONNX Runtime's compute stream. Plain C++: the kernels take the stream as void*,
// so this file needs no CUDA headers; the library links the kernels' objects and cudart.
#include "irpe_kernels.h"
#include "rpe_ort.h"

namespace irpe_ort {

namespace {

OrtStatusPtr fail(const OrtApi& api, OrtErrorCode code, const std::string& message)
{
    return api.CreateStatus(code, message.c_str());
}

bool kernel_dtype(ONNXTensorElementDataType t, irpe_dtype& out)
{
    switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: out = IRPE_FLOAT32; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: out = IRPE_FLOAT16; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: out = IRPE_BFLOAT16; return true;
    default: return false;
    }
}

// Dense row-major input; a 1-row gather table is broadcast over the queries (row stride 0).
irpe_problem kernel_problem(const Problem& p, const std::vector<int64_t>& dims, bool gather)
{
    irpe_problem k{};
    k.batch = p.batch;
    k.heads = p.heads;
    k.lq = p.lq;
    k.lk = p.lk;
    k.num_buckets = p.k;
    k.stride[3] = 1;
    k.stride[2] = dims[3];
    k.stride[1] = dims[2] * dims[3];
    k.stride[0] = dims[1] * k.stride[1];
    if (gather && p.rows == 1 && p.lq != 1) {
        k.stride[2] = 0;
    }
    return k;
}

}  // namespace

OrtStatusPtr cuda_compute(const OrtApi& api, const RPEConfig& c, Ort::KernelContext& ctx)
{
    auto in = ctx.GetInput(0);
    auto index = ctx.GetInput(1);
    const auto in_info = in.GetTensorTypeAndShapeInfo();
    const auto index_info = index.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> dims = in_info.GetShape();
    const std::vector<int64_t> index_dims = index_info.GetShape();
    const Problem p = make_problem(c, dims, index_dims);
    if (!p.error.empty()) {
        return fail(api, ORT_INVALID_ARGUMENT, p.error);
    }
    irpe_dtype dtype;
    if (!kernel_dtype(in_info.GetElementType(), dtype)) {
        return fail(api, ORT_INVALID_ARGUMENT, std::string(op_name(c.op, c.grid)) + ": unsupported dtype");
    }
    const bool gather = c.op == Op::kGather;
    auto out = ctx.GetOutput(0, {p.batch, p.heads, p.lq, gather ? p.lk : p.k});
    if (p.batch * p.heads * p.lq == 0 || (gather ? p.lk : p.k) == 0) {
        return nullptr;
    }
    irpe_problem kp = kernel_problem(p, dims, gather);
    void* stream = ctx.GetGPUComputeStream();
    const void* x = in.GetTensorRawData();
    void* y = out.GetTensorMutableRawData();
    int status;
    if (c.on_the_fly()) {
        irpe_bucket_params bp;
        const std::string error = grid_params(c, index_dims[index_dims.size() - 2],
                                              index_dims.back(), bp);
        if (!error.empty()) {
            return fail(api, ORT_INVALID_ARGUMENT, std::string(op_name(c.op, c.grid)) + ": " + error);
        }
        status = gather ? irpe_gather_grid(&kp, dtype, x, &bp, y, stream)
                        : irpe_scatter_grid(&kp, dtype, x, &bp, y, stream);
    } else {
        const auto it = index_info.GetElementType();
        if (it != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && it != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
            return fail(api, ORT_INVALID_ARGUMENT,
                        std::string(op_name(c.op, c.grid)) + ": index must be int32 or int64");
        }
        const irpe_index_dtype idt = it == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? IRPE_INT64
                                                                              : IRPE_INT32;
        const void* ids = index.GetTensorRawData();
        status = gather ? irpe_gather(&kp, dtype, x, idt, ids, y, stream)
                        : irpe_scatter(&kp, dtype, x, idt, ids, y, stream);
    }
    if (status == IRPE_OK) {
        return nullptr;
    }
    return fail(api, status == IRPE_ERR_ARGUMENT ? ORT_INVALID_ARGUMENT : ORT_EP_FAIL,
                std::string(op_name(c.op, c.grid)) + " CUDA kernel: " +
                    (status == IRPE_ERR_ARGUMENT ? "invalid argument" : irpe_last_error()));
}

}  // namespace irpe_ort
