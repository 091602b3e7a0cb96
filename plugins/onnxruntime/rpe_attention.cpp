// RPEAttention(q, k, v, [wk, idk], [wq, idq], [idv, wv]) -> out: a whole attention block with
// its iRPE terms in one op, made by the load-time fusion stage "attention"
// (irpe/runtime/graph/rewrite_attention.py), CPU, float32:
//   logits = scale * q @ k^T + (scale * q @ wk)[i, idk[i, j]] + (wq @ k^T)[idq[i, j]]
//   out    = softmax(logits) @ v + (bucket sums of softmax by idv) @ wv
// q, k, v [B, H, L, d], or input 0 the packed qkv [B, L, 3, H, d] (timm's reshape of the qkv
// projection; inputs 1, 2 empty); out [B, H, L, d], or [B, L, H, d] with attribute
// out_layout = 1; attribute scale (default 1). wk [.., d, Kk], wq [.., Kq, d] (idq bucket-major:
// c * L + j), wv [.., Kv, d], weights shared by the heads (leading dims 1); ids [L, L]
// int32/int64, an id outside its table adds 0 (the gathers' contract) or is dropped (the
// scatter's). The ONNX Runtime glue only: the inputs are bound by plugins/cpu's binder
// (rpe_attention_bind.h) and run as its tasks (rpe_attention_plan.h), each (b, h) pair one task
// on ONNX Runtime's pool: deterministic for any thread count.
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rpe_attention_bind.h"
#include "rpe_ort.h"

namespace irpe_ort {

using irpe_cpu::AttnIds;
using irpe_cpu::AttnIdTable;
using irpe_cpu::AttnInput;
using irpe_cpu::AttnProblem;

// The plan's tasks on ONNX Runtime's pool (its size unknown here: the CPU's threads).
void run_attention(Ort::KernelContext& ctx, const AttnProblem& problem, Simd simd)
{
    irpe_cpu::AttnPlan plan;
    irpe_cpu::plan_attention(plan, problem, simd, 0);
    parallel(ctx, &irpe_cpu::attention_task, plan.tasks(), &plan);
    if (plan.failed) {
        throw std::runtime_error("out of memory for the per-task scratch");
    }
}

namespace {

irpe_cpu::AttnType type_of(ONNXTensorElementDataType type)
{
    switch (type) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return irpe_cpu::AttnType::kFloat32;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return irpe_cpu::AttnType::kInt32;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return irpe_cpu::AttnType::kInt64;
        default: return irpe_cpu::AttnType::kOther;
    }
}

// Input i of the node as the binder reads it (absent: data nullptr).
AttnInput read_input(Ort::KernelContext& ctx, size_t i)
{
    if (i >= ctx.GetInputCount()) {
        return {};
    }
    const auto value = ctx.GetInput(i);
    if (!value) {
        return {};
    }
    const auto info = value.GetTensorTypeAndShapeInfo();
    return irpe_cpu::attn_input(i, value.GetTensorRawData(), info.GetShape(),
                                type_of(info.GetElementType()));
}

}  // namespace

class AttentionKernel {
 public:
    Simd simd = Simd::kPortable;
    irpe_cpu::AttnAttributes attributes;  // scale, out_layout (bf16: never, on this op)
    bool constant_ids[3] = {false, false, false};  // idk, idq, idv are initializers

    OrtStatusPtr ComputeV2(OrtKernelContext* context)
    {
        try {
            return compute(context);
        } catch (const std::exception& e) {
            const std::string text = std::string("RPEAttention: ") + e.what();
            return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, text.c_str());
        }
    }

 private:
    OrtStatusPtr compute(OrtKernelContext* context);
    AttnIdTable ids(AttnIds kind, const AttnInput& index, int64_t l, int64_t k);
    std::mutex mutex_;
    struct Entry {
        AttnIds kind;
        const void* data;
        int64_t l, k;
        AttnIdTable table;
    };
    std::vector<Entry> entries_;
};

// A term's id table: made once per (data, L, K) when its index is an initializer.
AttnIdTable AttentionKernel::ids(AttnIds kind, const AttnInput& index, int64_t l, int64_t k)
{
    irpe_cpu::check_attn_index(index, l);
    const bool constant = constant_ids[static_cast<int>(kind)];
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    if (constant) {
        lock.lock();
        for (const Entry& e : entries_) {
            if (e.kind == kind && e.data == index.data && e.l == l && e.k == k) {
                return e.table;
            }
        }
    }
    AttnIdTable made = irpe_cpu::attn_id_table(kind, index, l, k);
    if (constant) {
        entries_.push_back({kind, index.data, l, k, made});
    }
    return made;
}

OrtStatusPtr AttentionKernel::compute(OrtKernelContext* context)
{
    Ort::KernelContext ctx(context);
    AttnInput in[irpe_cpu::kAttnInputs];
    for (size_t i = 0; i < irpe_cpu::kAttnInputs; ++i) {
        in[i] = read_input(ctx, i);
    }
    irpe_cpu::AttnBinding b;
    const bool work = irpe_cpu::bind_attention(
        b, in, attributes,
        [this](AttnIds kind, const AttnInput& index, int64_t l, int64_t k) {
            return ids(kind, index, l, k);
        });
    auto out = ctx.GetOutput(0, b.out_dims);
    b.p.out = out.GetTensorMutableData<float>();
    if (work) {
        run_attention(ctx, b.p, simd);
    }
    return nullptr;
}

namespace {

// scale (float, default 1) and out_layout (default 0), checked: "" or what is wrong.
std::string read_attention_attributes(const OrtApi& api, const OrtKernelInfo* info,
                                      AttentionKernel& kernel)
{
    float scale = 1.0f;
    OrtStatus* status = api.KernelInfoGetAttribute_float(info, "scale", &scale);
    if (status != nullptr) {
        api.ReleaseStatus(status);
        scale = 1.0f;
    }
    int64_t layout = 0;
    status = api.KernelInfoGetAttribute_int64(info, "out_layout", &layout);
    if (status != nullptr) {
        api.ReleaseStatus(status);
        layout = 0;
    }
    const char* error = irpe_cpu::attn_attributes_error(scale, layout);
    if (error != nullptr) {
        return error;
    }
    kernel.attributes.scale = scale;
    kernel.attributes.out_layout = layout;
    return {};
}

// One registration: CPU, float32; inputs 3-8 optional (absent terms), ids of any integer type.
struct AttentionOp : Ort::CustomOpBase<AttentionOp, AttentionKernel, true> {
    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** out) const
    {
        auto kernel = std::make_unique<AttentionKernel>();
        kernel->simd = irpe_cpu::simd_level();
        const std::string error = read_attention_attributes(api, info, *kernel);
        if (!error.empty()) {
            return api.CreateStatus(ORT_INVALID_ARGUMENT, ("RPEAttention: " + error).c_str());
        }
        kernel->constant_ids[0] = constant_input(api, info, 4);
        kernel->constant_ids[1] = constant_input(api, info, 6);
        kernel->constant_ids[2] = constant_input(api, info, 7);
        *out = kernel.release();
        return nullptr;
    }
    const char* GetName() const { return kAttentionName; }
    const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
    size_t GetInputTypeCount() const { return irpe_cpu::kAttnInputs; }
    ONNXTensorElementDataType GetInputType(size_t i) const
    {
        return irpe_cpu::attn_index_input(i) ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
                                             : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const
    {
        return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;  // k, v: not with qkv
    }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const
    {
        return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    }
};

}  // namespace

OrtCustomOp* attention_op()
{
    static AttentionOp op;  // lives as long as the process: sessions keep pointers to it
    return &op;
}

}  // namespace irpe_ort
