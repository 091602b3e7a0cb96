// RPEAttention(q, k, v, [wk, idk], [wq, idq], [idv, wv]) -> out: a whole attention block with
// its iRPE terms in one op (rpe_attention.h per (b, h) pair), made by the load-time fusion stage
// "attention" (irpe/runtime/onnxruntime/rewrite_attention.py), CPU, float32:
//   logits = scale * q @ k^T + (scale * q @ wk)[i, idk[i, j]] + (wq @ k^T)[idq[i, j]]
//   out    = softmax(logits) @ v + (bucket sums of softmax by idv) @ wv
// q, k, v [B, H, L, d], or input 0 the packed qkv [B, L, 3, H, d] (timm's reshape of the qkv
// projection; inputs 1, 2 empty); out [B, H, L, d], or [B, L, H, d] with attribute
// out_layout = 1; attribute scale (default 1). wk [.., d, Kk], wq [.., Kq, d] (idq bucket-major:
// c * L + j), wv
// [.., Kv, d], weights shared by the heads (leading dims 1); ids [L, L] int32/int64, an id
// outside its table adds 0 (the gathers' contract) or is dropped (the scatter's). Each pair is
// one task on ONNX Runtime's pool: deterministic for any thread count.
#include <cmath>
#include <exception>
#include <memory>

#include "rpe_attention_plan.h"
#include "rpe_ort.h"

namespace irpe_ort {

// The plan's tasks on ONNX Runtime's pool (its size unknown here: the CPU's threads).
void run_attention(Ort::KernelContext& ctx, const AttnProblem& problem, Simd simd)
{
    AttnPlan plan;
    plan_attention(plan, problem, simd, 0);
    parallel(ctx, &attention_task, plan.tasks(), &plan);
    if (plan.failed) {
        throw std::runtime_error("out of memory for the per-task scratch");
    }
}

namespace {

struct Input {  // one optional input: data and dims (data == nullptr: absent)
    const void* data = nullptr;
    std::vector<int64_t> dims;
    bool wide = false, index = false;  // int64; int32 or int64
};

Input read_input(Ort::KernelContext& ctx, size_t i)
{
    Input in;
    if (i >= ctx.GetInputCount()) {
        return in;
    }
    const auto value = ctx.GetInput(i);
    if (!value) {
        return in;
    }
    const auto info = value.GetTensorTypeAndShapeInfo();
    in.dims = info.GetShape();
    const auto type = info.GetElementType();
    in.wide = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    in.index = in.wide || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    const bool index_input = i == 4 || i == 6 || i == 7;
    if (index_input != in.index || (!in.index && type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)) {
        throw std::invalid_argument("input " + std::to_string(i) +
                                    (index_input ? " must be an int32/int64 index"
                                                 : " must be float32"));
    }
    in.data = value.GetTensorRawData();
    return in;
}

// A shared weight's two trailing dims (leading dims must be 1).
void weight_dims(const Input& w, const char* name, int64_t& rows, int64_t& cols)
{
    const size_t n = w.dims.size();
    bool shared = n >= 2;
    for (size_t a = 0; a + 2 < n; ++a) {
        shared = shared && w.dims[a] == 1;
    }
    if (!shared) {
        throw std::invalid_argument(std::string(name) +
                                    " must be [.., rows, cols] with leading dims 1");
    }
    rows = w.dims[n - 2];
    cols = w.dims[n - 1];
}

}  // namespace

class AttentionKernel {
 public:
    Simd simd = Simd::kPortable;
    float scale = 1.0f;   // attribute scale
    int64_t out_layout = 0;  // attribute out_layout: 0 [B, H, L, d], 1 [B, L, H, d]
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
    std::shared_ptr<const std::vector<int32_t>> ids(int which, const Input& in, int64_t l,
                                                    int64_t k, AttnIds kind);
    std::mutex mutex_;
    struct Entry {
        int which;
        const void* data;
        int64_t l, k;
        std::shared_ptr<const std::vector<int32_t>> ids;
    };
    std::vector<Entry> entries_;
};

void check_index(const Input& in, int64_t l)
{
    if (in.data == nullptr || in.dims.size() != 2 || in.dims[0] != l || in.dims[1] != l) {
        throw std::invalid_argument("an index must be [L, L] = [" + std::to_string(l) + ", " +
                                    std::to_string(l) + "]");
    }
}

std::shared_ptr<const std::vector<int32_t>> AttentionKernel::ids(int which, const Input& in,
                                                                 int64_t l, int64_t k,
                                                                 AttnIds kind)
{
    check_index(in, l);
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    if (constant_ids[which]) {
        lock.lock();
        for (const Entry& e : entries_) {
            if (e.which == which && e.data == in.data && e.l == l && e.k == k) {
                return e.ids;
            }
        }
    }
    auto made = std::make_shared<const std::vector<int32_t>>(pad_ids(in.data, in.wide, l, k, kind));
    if (constant_ids[which]) {
        entries_.push_back({which, in.data, l, k, made});
    }
    return made;
}

OrtStatusPtr AttentionKernel::compute(OrtKernelContext* context)
{
    Ort::KernelContext ctx(context);
    Input in[9];
    for (size_t i = 0; i < 9; ++i) {
        in[i] = read_input(ctx, i);
    }
    AttnProblem p;
    const int64_t batch = read_qkv(p, in[0].dims, static_cast<const float*>(in[0].data),
                                   in[1].dims, static_cast<const float*>(in[1].data),
                                   in[2].dims, static_cast<const float*>(in[2].data));
    if (p.l > 46340 || p.d > (1 << 20)) {
        throw std::invalid_argument("L must be <= 46340 and d <= 2^20");
    }
    const int64_t h = p.heads, l = p.l, d = p.d;
    p.out_layout = out_layout == 1 ? AttnLayout{l * h * d, d, h * d}
                                   : AttnLayout{h * l * d, l * d, d};
    auto out = ctx.GetOutput(0, out_layout == 1 ? std::vector<int64_t>{batch, l, h, d}
                                                : std::vector<int64_t>{batch, h, l, d});
    p.out = out.GetTensorMutableData<float>();
    p.scale = scale;
    if (p.bh * p.l * p.d == 0) {
        return nullptr;
    }
    std::vector<float> wk, wv;
    std::shared_ptr<const std::vector<int32_t>> idk, idq, idv;
    int64_t rows = 0;
    if ((in[3].data == nullptr) != (in[4].data == nullptr) ||
        (in[5].data == nullptr) != (in[6].data == nullptr) ||
        (in[7].data == nullptr) != (in[8].data == nullptr)) {
        throw std::invalid_argument("each term needs both its weight and its index");
    }
    if (in[3].data != nullptr) {  // iRPE-K
        weight_dims(in[3], "wk", rows, p.kk);
        if (rows != p.d || p.kk < 1) {
            throw std::invalid_argument("wk must be [d, K] with d = " + std::to_string(p.d));
        }
        wk = pad_columns(static_cast<const float*>(in[3].data), p.d, p.kk, scale);
        idk = ids(0, in[4], p.l, p.kk, AttnIds::kK);
        p.wk = wk.data();
        p.idk = idk->data();
    }
    if (in[5].data != nullptr) {  // iRPE-Q, bucket-major
        int64_t cols = 0;
        weight_dims(in[5], "wq", p.kq, cols);
        if (cols != p.d || p.kq < 1 || p.kq * attn_pad(p.l) > INT32_MAX) {
            throw std::invalid_argument("wq must be [K, d] with d = " + std::to_string(p.d) +
                                        " and K * L < 2^31");
        }
        idq = ids(1, in[6], p.l, p.kq, AttnIds::kQ);
        p.wq = static_cast<const float*>(in[5].data);
        p.idq = idq->data();
        p.idqt = idq->data() + p.l * attn_pad(p.l);
    }
    if (in[8].data != nullptr) {  // iRPE-V
        int64_t cols = 0;
        weight_dims(in[8], "wv", p.kv, cols);
        if (cols != p.d || p.kv < 1) {
            throw std::invalid_argument("wv must be [K, d] with d = " + std::to_string(p.d));
        }
        idv = ids(2, in[7], p.l, p.kv, AttnIds::kV);
        wv = pad_columns(static_cast<const float*>(in[8].data), p.kv, p.d, 1.0f);
        p.wv = wv.data();
        p.idv = idv->data();
        p.vruns = idv->data() + p.l * attn_pad(p.l);
    }
    run_attention(ctx, p, simd);
    return nullptr;
}

namespace {

// scale (float, finite, default 1) and out_layout (0 or 1, default 0): "" or what is wrong.
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
    if (!std::isfinite(scale) || (layout != 0 && layout != 1)) {
        return "scale must be finite and out_layout 0 ([B, H, L, d]) or 1 ([B, L, H, d])";
    }
    kernel.scale = scale;
    kernel.out_layout = layout;
    return {};
}

// One registration: CPU, float32; inputs 3-8 optional (absent terms), ids of any integer type.
struct AttentionOp : Ort::CustomOpBase<AttentionOp, AttentionKernel, true> {
    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** out) const
    {
        auto kernel = std::make_unique<AttentionKernel>();
        kernel->simd = simd_level();
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
    size_t GetInputTypeCount() const { return 9; }
    ONNXTensorElementDataType GetInputType(size_t i) const
    {
        return i == 4 || i == 6 || i == 7 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
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
