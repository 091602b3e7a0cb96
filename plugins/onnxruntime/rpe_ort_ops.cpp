// ONNX Runtime custom-op library: RPEGather / RPEScatter in domain "irpe" (CPU EP; the CUDA EP
// too when built with IRPE_ORT_WITH_CUDA). Built with ORT_API_MANUAL_INIT and never linked to
// libonnxruntime: RegisterCustomOps receives the API table from the runtime that loads it.
//
// This file: the kernel object, the op registrations and RegisterCustomOps; the CPU row kernels
// are in rpe_ort_rows.cpp, the load-time fused ops in rpe_gather_add.cpp, rpe_scatter_matmul_add.cpp.
#include <cstdio>
#include <exception>

#include "rpe_terms.h"

#define IRPE_ORT_STR2(x) #x
#define IRPE_ORT_STR(x) IRPE_ORT_STR2(x)

#ifndef IRPE_ORT_API_VERSION
#define IRPE_ORT_API_VERSION ORT_API_VERSION  // tests build a mismatching library with this
#endif

namespace irpe_ort {

using irpe_cpu::simd_level;

namespace {

constexpr const char* kDomain = "irpe";

OrtStatusPtr fail(const std::string& message)
{
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, message.c_str());
}

std::string node_name(const OrtApi& api, const OrtKernelInfo* info)
{
    size_t size = 0;
    OrtStatus* s = api.KernelInfo_GetNodeName(info, nullptr, &size);
    if (s != nullptr || size == 0) {
        if (s != nullptr) {
            api.ReleaseStatus(s);
        }
        return "?";
    }
    std::string name(size, '\0');
    s = api.KernelInfo_GetNodeName(info, &name[0], &size);
    if (s != nullptr) {
        api.ReleaseStatus(s);
        return "?";
    }
    name.resize(std::char_traits<char>::length(name.c_str()));
    return name;
}


}  // namespace

bool constant_input(const OrtApi& api, const OrtKernelInfo* info, size_t index)
{
    int constant = 0;
    const OrtValue* value = nullptr;
    OrtStatus* s = api.KernelInfoGetConstantInput_tensor(info, index, &constant, &value);
    if (s != nullptr) {
        api.ReleaseStatus(s);
        return false;
    }
    return constant != 0;
}

namespace {

struct RpeKernel {
    RPEConfig config;
    bool cuda = false;
    GridIdCache grid_cache;
    NarrowedIds narrowed;    // fused gather terms: constant ids narrowed to int32 once
    BucketListCache lists;   // *SoftmaxScatter: the V index's bucket lists

    OrtStatusPtr ComputeV2(OrtKernelContext* context)
    {
        try {
            Ort::KernelContext ctx(context);
#ifdef IRPE_ORT_WITH_CUDA
            if (cuda) {
                return cuda_compute(Ort::GetApi(), config, ctx);
            }
#endif
            if (config.fused == Fused::kSoftmax || config.fused == Fused::kSoftmaxScatter) {
                return softmax_cpu(config, narrowed, lists, ctx);
            }
            if (config.fused == Fused::kBucketMatMulAdd) {
                return bucket_matmul_add_cpu(config.simd, ctx);
            }
            if (config.adds == kScatterMatMulAdd) {
                return scatter_matmul_add_cpu(config, ctx);
            }
            return config.adds ? gather_add_cpu(config, narrowed, ctx)
                               : rows_cpu(config, grid_cache, ctx);
        } catch (const std::exception& e) {
            const bool v = config.adds == kScatterMatMulAdd;
            return fail(std::string(v ? kScatterMatMulAddName
                                      : op_name(config.op, config.grid, config.adds, config.fused)) +
                        ": " + e.what());
        }
    }

};

// One registration per (op, EP, value type); input 1 accepts any type (checked when run:
// an index must be int32/int64; on the fly only its shape is read).
struct RpeOp : Ort::CustomOpBase<RpeOp, RpeKernel, true> {
    RpeOp(Op op, bool grid, bool cuda, ONNXTensorElementDataType type, int adds = 0,
          Fused fused = Fused::kNone)
        : op_(op), grid_(grid), adds_(adds), fused_(fused), cuda_(cuda), type_(type)
    {
        OrtCustomOp::InferOutputShapeFn = &RpeOp::infer_shape;
        if (adds || fused != Fused::kNone) {  // fused ops may write into their base when ORT can
            OrtCustomOp::GetMayInplace =
                adds == kScatterMatMulAdd ? &RpeOp::base3_inplace : &RpeOp::base_inplace;
            if (fused == Fused::kBucketMatMulAdd) {
                OrtCustomOp::GetMayInplace = &RpeOp::base_inplace;
            }
            OrtCustomOp::ReleaseMayInplace = &RpeOp::release_inplace;
        }
    }

    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** out) const
    {
        auto kernel = std::make_unique<RpeKernel>();
        kernel->config.op = op_;
        kernel->config.grid = grid_;
        kernel->config.adds = adds_;
        kernel->config.fused = fused_;
        kernel->config.simd = simd_level();
        kernel->cuda = cuda_;
        const std::string error = read_config(api, info, kernel->config);
        if (error.empty() && adds_ && adds_ != kScatterMatMulAdd) {  // gather terms' index inputs
            kernel->narrowed.constant[0] = constant_input(api, info, 1);
            kernel->narrowed.constant[1] = adds_ == 2 && constant_input(api, info, 4);
        }
        if (error.empty() && fused_ == Fused::kSoftmaxScatter) {
            kernel->lists.constant = constant_input(api, info, GetInputTypeCount() - 1);
        }
        if (!error.empty()) {
            return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string(GetName()) + " node '" +
                                                           node_name(api, info) + "': " + error)
                                                              .c_str());
        }
        *out = kernel.release();
        return nullptr;
    }

    const char* GetName() const
    {
        return adds_ == kScatterMatMulAdd ? kScatterMatMulAddName
                                          : op_name(op_, grid_, adds_, fused_);
    }
    const char* GetExecutionProviderType() const
    {
        return cuda_ ? "CUDAExecutionProvider" : "CPUExecutionProvider";
    }
    size_t GetInputTypeCount() const
    {
        if (fused_ == Fused::kBucketMatMulAdd) {
            return 3;  // sums, weight, base
        }
        const size_t gathers = adds_ == 2 ? 5 : adds_ == 3 ? 4 : adds_ ? 3 : 2;
        return gathers + (fused_ == Fused::kSoftmaxScatter ? 1 : 0);  // + the V index
    }
    ONNXTensorElementDataType GetInputType(size_t i) const
    {
        const bool index = fused_ == Fused::kBucketMatMulAdd ? false
                           : i == 1 || (i == 4 && adds_ == 2) ||
                                 (fused_ == Fused::kSoftmaxScatter && i + 1 == GetInputTypeCount());
        return index ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : type_;
    }
    size_t GetOutputTypeCount() const { return fused_ == Fused::kSoftmaxScatter ? 2 : 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return type_; }

 private:
    // Output shape [B,H,Lq,Lk] (gather) or [B,H,Lq,K] (scatter) where the inputs tell it.
    static OrtStatusPtr ORT_API_CALL infer_shape(const OrtCustomOp* self, OrtShapeInferContext* c);

    // Output 0 may reuse input 2: each element of base is read before the same one is written.
    static size_t ORT_API_CALL base_inplace(int** input_index, int** output_index)
    {
        *input_index = new int[1]{2};
        *output_index = new int[1]{0};
        return 1;
    }
    static size_t ORT_API_CALL base3_inplace(int** input_index, int** output_index)
    {
        *input_index = new int[1]{3};
        *output_index = new int[1]{0};
        return 1;
    }
    static void ORT_API_CALL release_inplace(int* input_index, int* output_index)
    {
        delete[] input_index;
        delete[] output_index;
    }

    Op op_;
    bool grid_;
    int adds_;
    Fused fused_;
    bool cuda_;
    ONNXTensorElementDataType type_;
};

OrtStatusPtr ORT_API_CALL RpeOp::infer_shape(const OrtCustomOp* self, OrtShapeInferContext* c)
{
    try {
        const RpeOp& op = *static_cast<const RpeOp*>(self);
        Ort::ShapeInferContext ctx(&Ort::GetApi(), c);
        const auto in = ctx.GetInputShape(0);
        const auto index = ctx.GetInputShape(1);
        if (op.grid_ || op.adds_ || op.fused_ != Fused::kNone || in.size() != 4 ||
            index.size() != 2) {
            return nullptr;  // on the fly or unknown rank: the kernel checks at run time
        }
        using Dim = Ort::ShapeInferContext::SymbolicInteger;
        Ort::ShapeInferContext::Shape out{in[0], in[1], index[0], index[1]};
        if (op.op_ == Op::kScatter) {
            out[2] = in[2];
            out[3] = Dim(ctx.GetAttrInt("num_buckets"));
        }
        for (auto& d : out) {  // unknown dims arrive as negative ints: keep them unknown
            if (d.IsInt() && d.AsInt() < 0) {
                d = Dim("");
            }
        }
        return ctx.SetOutputShape(0, out, op.type_).release();
    } catch (const std::exception&) {
        return nullptr;  // leave the shape unknown; the kernel reports bad attributes
    }
}

const ONNXTensorElementDataType kTypes[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                            ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                            ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16};

// Ops and domains live as long as the process: sessions keep pointers to them.
std::mutex g_mutex;
std::vector<std::unique_ptr<RpeOp>> g_ops;
std::vector<Ort::CustomOpDomain> g_domains;

void make_ops()
{
    if (!g_ops.empty()) {
        return;
    }
    for (bool cuda : {false, true}) {
#ifndef IRPE_ORT_WITH_CUDA
        if (cuda) {
            continue;
        }
#endif
        for (Op op : {Op::kGather, Op::kScatter}) {
            for (bool grid : {false, true}) {
                for (auto type : kTypes) {
                    g_ops.push_back(std::make_unique<RpeOp>(op, grid, cuda, type));
                }
            }
        }
        for (int adds = 1; adds <= 2 && !cuda; ++adds) {  // irpe.runtime.onnxruntime.session's fusion (CPU, fp32)
            for (Fused fused : {Fused::kNone, Fused::kSoftmax, Fused::kSoftmaxScatter}) {
                g_ops.push_back(std::make_unique<RpeOp>(Op::kGather, false, false,
                                                        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, adds,
                                                        fused));
            }
        }
        if (!cuda) {  // RPEScatterMatMulAdd (irpe.runtime.onnxruntime.rewrites, CPU, fp32)
            g_ops.push_back(std::make_unique<RpeOp>(Op::kScatter, false, false,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                                    kScatterMatMulAdd));
            g_ops.push_back(std::make_unique<RpeOp>(Op::kScatter, false, false,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 0,
                                                    Fused::kBucketMatMulAdd));
        }
    }
}

}  // namespace

}  // namespace irpe_ort

extern "C" {

__attribute__((visibility("default"))) const char* irpe_ort_ops_info(void)
{
#ifdef IRPE_ORT_WITH_CUDA
    return "irpe_ort_ops api=" IRPE_ORT_STR(IRPE_ORT_API_VERSION) " cuda=1";
#else
    return "irpe_ort_ops api=" IRPE_ORT_STR(IRPE_ORT_API_VERSION) " cuda=0";
#endif
}

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base)
{
    const OrtApi* api = base->GetApi(IRPE_ORT_API_VERSION);
    if (api == nullptr) {
        const OrtApi* oldest = base->GetApi(1);
        const std::string message =
            std::string("libirpe_ort_ops was built for ONNX Runtime API ") +
            IRPE_ORT_STR(IRPE_ORT_API_VERSION) + " and this onnxruntime (" +
            base->GetVersionString() + ") does not provide it: rebuild the library against "
            "this version's headers (ORT_ROOT=...)";
        std::fprintf(stderr, "[irpe_ort_ops] %s\n", message.c_str());
        return oldest ? oldest->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
    }
    Ort::InitApi(api);
    try {
        std::lock_guard<std::mutex> lock(irpe_ort::g_mutex);
        irpe_ort::make_ops();
        Ort::CustomOpDomain domain(irpe_ort::kDomain);
        for (auto& op : irpe_ort::g_ops) {
            domain.Add(op.get());
        }
        domain.Add(irpe_ort::attention_op());
        Ort::UnownedSessionOptions(options).Add(domain);
        irpe_ort::g_domains.push_back(std::move(domain));
        return nullptr;
    } catch (const std::exception& e) {
        return api->CreateStatus(ORT_FAIL, e.what());
    }
}

}  // extern "C"
