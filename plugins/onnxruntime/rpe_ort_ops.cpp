// ONNX Runtime custom-op library: RPEGather / RPEScatter in domain "irpe" (CPU EP; the CUDA EP
// too when built with IRPE_ORT_WITH_CUDA). Built with ORT_API_MANUAL_INIT and never linked to
// libonnxruntime: RegisterCustomOps receives the API table from the runtime that loads it.
//
// CPU kernels split the output rows (b, h, i) into chunks run on ORT's intra-op thread pool
// (KernelContext_ParallelFor); each row is written by one task only (see rpe_cpu.h).
#include <algorithm>
#include <cstdio>
#include <exception>

#include "rpe_cpu.h"
#include "rpe_ort.h"

#define IRPE_ORT_STR2(x) #x
#define IRPE_ORT_STR(x) IRPE_ORT_STR2(x)

#ifndef IRPE_ORT_API_VERSION
#define IRPE_ORT_API_VERSION ORT_API_VERSION  // tests build a mismatching library with this
#endif

namespace irpe_ort {

namespace {
constexpr int64_t kMinElementsPerTask = 16384;
constexpr int64_t kMaxTasks = 64;
}  // namespace

int64_t chunk_rows(int64_t rows, int64_t width)
{
    const int64_t by_work = std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, width));
    return std::max(by_work, (rows + kMaxTasks - 1) / kMaxTasks);
}

void parallel(Ort::KernelContext& ctx, void (*fn)(void*, size_t), int64_t tasks, void* job)
{
    if (tasks <= 1) {
        fn(job, 0);
    } else {
        ctx.ParallelFor(fn, static_cast<size_t>(tasks), 0, job);
    }
}

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

template <typename I>
void list_chunk(void* data, size_t chunk)
{
    Job& job = *static_cast<Job*>(data);
    const Problem& p = job.p;
    const int64_t rows = chunk_rows(p.lq, p.lk);
    const int64_t begin = static_cast<int64_t>(chunk) * rows, end = std::min(begin + rows, p.lq);
    const I* ids = static_cast<const I*>(job.ids);
    for (int64_t i = begin; i < end; ++i) {
        bucket_lists(ids + i * p.lk, p.lk, p.k, job.off.data() + i * (p.k + 1),
                     job.pos.data() + i * p.lk);
    }
}

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
        parallel(ctx, &list_chunk<I>, (p.lq + rows - 1) / rows, &job);
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

struct RpeKernel {
    RpeConfig config;
    bool cuda = false;
    GridIdCache grid_cache;

    OrtStatusPtr ComputeV2(OrtKernelContext* context)
    {
        try {
            Ort::KernelContext ctx(context);
#ifdef IRPE_ORT_WITH_CUDA
            if (cuda) {
                return cuda_compute(Ort::GetApi(), config, ctx);
            }
#endif
            if (config.adds == kScatterMatMulAdd) {
                return scatter_matmul_add_cpu(config, ctx);
            }
            return config.adds ? gather_add_cpu(config, ctx) : compute_cpu(ctx);
        } catch (const std::exception& e) {
            const bool v = config.adds == kScatterMatMulAdd;
            return fail(std::string(v ? kScatterMatMulAddName
                                      : op_name(config.op, config.grid, config.adds)) + ": " + e.what());
        }
    }

    OrtStatusPtr compute_cpu(Ort::KernelContext& ctx)
    {
        auto in = ctx.GetInput(0);
        auto index = ctx.GetInput(1);
        const auto in_info = in.GetTensorTypeAndShapeInfo();
        const auto index_info = index.GetTensorTypeAndShapeInfo();
        Job job;
        job.p = make_problem(config, in_info.GetShape(), index_info.GetShape());
        if (!job.p.error.empty()) {
            return fail(job.p.error);
        }
        ONNXTensorElementDataType index_type = index_info.GetElementType();
        std::shared_ptr<const std::vector<int32_t>> grid;
        if (config.on_the_fly()) {
            const auto dims = index_info.GetShape();
            irpe_bucket_params bp;
            const std::string error = grid_params(config, dims[dims.size() - 2], dims.back(), bp);
            if (!error.empty()) {
                return fail(std::string(op_name(config.op, config.grid, config.adds)) + ": " + error);
            }
            grid = grid_cache.get(bp);
            job.ids = grid->data();
            index_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
        } else if (index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
                   index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
            return fail(std::string(op_name(config.op, config.grid, config.adds)) + ": index must be int32 or int64");
        } else {
            job.ids = index.GetTensorRawData();
        }
        const Problem& p = job.p;
        const std::vector<int64_t> out_dims{p.batch, p.heads, p.lq,
                                            config.op == Op::kGather ? p.lk : p.k};
        auto out = ctx.GetOutput(0, out_dims);
        job.total_rows = p.batch * p.heads * p.lq;
        if (job.total_rows == 0 || out_dims[3] == 0) {
            return nullptr;
        }
        job.in = in.GetTensorRawData();
        job.out = out.GetTensorMutableRawData();
        dispatch(ctx, config.op, job, in_info.GetElementType(), index_type);
        return nullptr;
    }
};

// One registration per (op, EP, value type); input 1 accepts any type (checked when run:
// an index must be int32/int64; on the fly only its shape is read).
struct RpeOp : Ort::CustomOpBase<RpeOp, RpeKernel, true> {
    RpeOp(Op op, bool grid, bool cuda, ONNXTensorElementDataType type, int adds = 0)
        : op_(op), grid_(grid), adds_(adds), cuda_(cuda), type_(type)
    {
        OrtCustomOp::InferOutputShapeFn = &RpeOp::infer_shape;
        if (adds) {  // the fused ops may write into their base when ORT can spare it
            OrtCustomOp::GetMayInplace =
                adds == kScatterMatMulAdd ? &RpeOp::base3_inplace : &RpeOp::base_inplace;
            OrtCustomOp::ReleaseMayInplace = &RpeOp::release_inplace;
        }
    }

    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** out) const
    {
        auto kernel = std::make_unique<RpeKernel>();
        kernel->config.op = op_;
        kernel->config.grid = grid_;
        kernel->config.adds = adds_;
        kernel->cuda = cuda_;
        const std::string error = read_config(api, info, kernel->config);
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
        return adds_ == kScatterMatMulAdd ? kScatterMatMulAddName : op_name(op_, grid_, adds_);
    }
    const char* GetExecutionProviderType() const
    {
        return cuda_ ? "CUDAExecutionProvider" : "CPUExecutionProvider";
    }
    size_t GetInputTypeCount() const { return adds_ == 2 ? 5 : adds_ == 3 ? 4 : adds_ ? 3 : 2; }
    ONNXTensorElementDataType GetInputType(size_t i) const
    {
        return i == 1 || i == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : type_;
    }
    size_t GetOutputTypeCount() const { return 1; }
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
        if (op.grid_ || op.adds_ || in.size() != 4 || index.size() != 2) {
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
        for (int adds = 1; adds <= 2 && !cuda; ++adds) {  // irpe.deploy.ort's fusion (CPU, fp32)
            g_ops.push_back(std::make_unique<RpeOp>(Op::kGather, false, false,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, adds));
        }
        if (!cuda) {  // RPEScatterMatMulAdd (irpe.deploy.ort_fuse, CPU, fp32)
            g_ops.push_back(std::make_unique<RpeOp>(Op::kScatter, false, false,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                                    kScatterMatMulAdd));
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
        Ort::UnownedSessionOptions(options).Add(domain);
        irpe_ort::g_domains.push_back(std::move(domain));
        return nullptr;
    } catch (const std::exception& e) {
        return api->CreateStatus(ORT_FAIL, e.what());
    }
}

}  // extern "C"
