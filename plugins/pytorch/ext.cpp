// PyTorch binding of the iRPE CUDA kernels (C ABI in plugins/kernels/irpe_kernels.h).
//
// Each function checks devices, dtypes and shapes, allocates the output and launches on the
// current CUDA stream. The 4-D input keeps its strides (broadcast B/H is free); the index is
// made contiguous. Registered as the CUDA implementation of irpe::rpe_gather / rpe_scatter by
// plugins/pytorch/__init__.py; the *_grid functions compute the ids on the fly.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>

#include "irpe_kernels.h"

namespace {

irpe_dtype value_dtype(const at::Tensor& t)
{
    switch (t.scalar_type()) {
    case at::kFloat: return IRPE_FLOAT32;
    case at::kHalf: return IRPE_FLOAT16;
    case at::kBFloat16: return IRPE_BFLOAT16;
    default: TORCH_CHECK(false, "irpe CUDA ops: unsupported dtype ", t.scalar_type(),
                         " (float32, float16, bfloat16)");
    }
}

irpe_index_dtype index_dtype(const at::Tensor& t)
{
    TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong,
                "irpe CUDA ops: index must be int32 or int64, got ", t.scalar_type());
    return t.scalar_type() == at::kInt ? IRPE_INT32 : IRPE_INT64;
}

void check_input(const at::Tensor& x, const char* name)
{
    TORCH_CHECK(x.is_cuda(), name, ": expected a CUDA tensor, got ", x.device());
    TORCH_CHECK(x.dim() == 4, name, ": expected [B,H,Lq,*], got ", x.sizes());
}

irpe_problem make_problem(const at::Tensor& x, int64_t lk, int64_t num_buckets)
{
    irpe_problem p{};
    p.batch = x.size(0);
    p.heads = x.size(1);
    p.lq = x.size(2);
    p.lk = lk;
    p.num_buckets = num_buckets;
    for (int d = 0; d < 4; ++d) {
        p.stride[d] = x.stride(d);
    }
    return p;
}

void check_status(int status, const char* what)
{
    TORCH_CHECK(status == IRPE_OK, what, " failed: ",
                status == IRPE_ERR_ARGUMENT ? std::string("invalid argument") : irpe_last_error());
}

void* stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

irpe_bucket_params grid_params(int64_t method, double ratio, int64_t height, int64_t width,
                               int64_t skip)
{
    irpe_bucket_params params;
    TORCH_CHECK(irpe_bucket_params_init(&params, (int)method, ratio, height, width, skip) == IRPE_OK,
                "irpe: invalid bucket parameters (method ", method, ", ratio ", ratio, ", grid ",
                height, "x", width, ", skip ", skip, ")");
    return params;
}

at::Tensor gather(const at::Tensor& table, const at::Tensor& index)
{
    check_input(table, "rpe_gather");
    TORCH_CHECK(index.dim() == 2 && index.size(0) == table.size(2),
                "rpe_gather: index must be [Lq, Lk] with Lq = ", table.size(2), ", got ", index.sizes());
    const c10::cuda::CUDAGuard guard(table.device());
    const at::Tensor idx = index.to(table.device()).contiguous();
    at::Tensor out = at::empty({table.size(0), table.size(1), table.size(2), idx.size(1)},
                               table.options().memory_format(at::MemoryFormat::Contiguous));
    if (out.numel() == 0) {
        return out;
    }
    const irpe_problem p = make_problem(table, idx.size(1), table.size(3));
    check_status(irpe_gather(&p, value_dtype(table), table.data_ptr(), index_dtype(idx),
                             idx.data_ptr(), out.data_ptr(), stream()),
                 "irpe_gather");
    return out;
}

at::Tensor scatter(const at::Tensor& attn, const at::Tensor& index, int64_t num_buckets)
{
    check_input(attn, "rpe_scatter");
    TORCH_CHECK(num_buckets >= 1, "rpe_scatter: num_buckets must be >= 1, got ", num_buckets);
    TORCH_CHECK(index.dim() == 2 && index.size(0) == attn.size(2) && index.size(1) == attn.size(3),
                "rpe_scatter: index must be [Lq, Lk] = ", attn.sizes().slice(2), ", got ", index.sizes());
    const c10::cuda::CUDAGuard guard(attn.device());
    const at::Tensor idx = index.to(attn.device()).contiguous();
    at::Tensor out = at::empty({attn.size(0), attn.size(1), attn.size(2), num_buckets}, attn.options());
    if (out.numel() == 0 || attn.size(3) == 0) {
        return out.zero_();
    }
    const irpe_problem p = make_problem(attn, attn.size(3), num_buckets);
    check_status(irpe_scatter(&p, value_dtype(attn), attn.data_ptr(), index_dtype(idx),
                              idx.data_ptr(), out.data_ptr(), stream()),
                 "irpe_scatter");
    return out;
}

// On-the-fly ids: a gather ([B,H,L,K] -> [B,H,L,L]) or a scatter ([B,H,L,L] -> [B,H,L,K]).
at::Tensor run_grid(const at::Tensor& x, bool is_gather, int64_t method, double ratio,
                    int64_t height, int64_t width, int64_t skip)
{
    const char* what = is_gather ? "irpe_gather_grid" : "irpe_scatter_grid";
    check_input(x, what);
    const irpe_bucket_params params = grid_params(method, ratio, height, width, skip);
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t k = is_gather ? x.size(3) : params.num_buckets;
    at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2), is_gather ? x.size(2) : k},
                               x.options().memory_format(at::MemoryFormat::Contiguous));
    if (out.numel() == 0) {
        return out;
    }
    const irpe_problem p = make_problem(x, is_gather ? x.size(2) : x.size(3), k);
    const auto launch = is_gather ? irpe_gather_grid : irpe_scatter_grid;
    check_status(launch(&p, value_dtype(x), x.data_ptr(), &params, out.data_ptr(), stream()), what);
    return out;
}

at::Tensor gather_grid(const at::Tensor& table, int64_t method, double ratio, int64_t height,
                       int64_t width, int64_t skip)
{
    return run_grid(table, true, method, ratio, height, width, skip);
}

at::Tensor scatter_grid(const at::Tensor& attn, int64_t method, double ratio, int64_t height,
                        int64_t width, int64_t skip)
{
    return run_grid(attn, false, method, ratio, height, width, skip);
}

at::Tensor bucket_ids(int64_t method, double ratio, int64_t height, int64_t width, int64_t skip,
                      at::Device device)
{
    TORCH_CHECK(device.is_cuda(), "bucket_ids: expected a CUDA device, got ", device);
    const irpe_bucket_params params = grid_params(method, ratio, height, width, skip);
    const c10::cuda::CUDAGuard guard(device);
    const int64_t n = skip + height * width;
    at::Tensor out = at::empty({n, n}, at::TensorOptions().dtype(at::kInt).device(device));
    check_status(irpe_bucket_ids_device(&params, out.data_ptr<int32_t>(), stream()),
                 "irpe_bucket_ids_device");
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "iRPE CUDA kernels: bucket gather / deterministic scatter, on-the-fly ids";
    m.def("gather", &gather, "table[B,H,Lq,K], index[Lq,Lk] -> [B,H,Lq,Lk]");
    m.def("scatter", &scatter, "attn[B,H,Lq,Lk], index[Lq,Lk], K -> [B,H,Lq,K] (fp32 sums)");
    m.def("gather_grid", &gather_grid, "gather with ids computed from (method, ratio, H, W, skip)");
    m.def("scatter_grid", &scatter_grid, "scatter with ids computed from (method, ratio, H, W, skip)");
    m.def("bucket_ids", &bucket_ids, "int32 [(skip+H*W)^2] id table computed on the device");
}
