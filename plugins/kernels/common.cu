// Launch planning, argument checks, error reporting and the device id-table kernel.
#include <algorithm>
#include <climits>
#include <cstdio>

#include "irpe_device.cuh"

namespace irpe {

namespace {
thread_local char last_error[256] = "";

int sm_count()
{
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        return 1;  // the launch that follows reports the real error
    }
    return std::max(sms, 1);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Plan make_plan(const irpe_problem& p, size_t bytes_per_bh, size_t fixed_bytes)
{
    const int sms = sm_count();
    const int64_t bh = p.batch * p.heads;
    // Enough tasks to fill the device ~4 blocks deep, but as many (b, h) pairs per task as
    // possible: each task reads its index row once for all of them.
    const int64_t wanted = std::min(std::max<int64_t>(ceil_div(4 * sms, p.lq), 1), bh);
    int64_t chunk = ceil_div(bh, wanted);
    if (bytes_per_bh > 0) {
        const int64_t cap = (int64_t)((kSmemBudget - std::min(fixed_bytes, kSmemBudget)) / bytes_per_bh);
        chunk = std::min(chunk, std::max<int64_t>(cap, 1));
    }
    chunk = std::min<int64_t>(chunk, INT_MAX);
    Plan plan;
    plan.chunk = (int)chunk;
    plan.n_chunks = ceil_div(bh, chunk);
    plan.tasks = p.lq * plan.n_chunks;
    plan.grid = (int)std::min<int64_t>(plan.tasks, (int64_t)sms * 32);
    plan.smem = fixed_bytes + (size_t)chunk * bytes_per_bh;
    return plan;
}

int check_call(const irpe_problem* p, const void* in, const void* out, const void* index,
               const irpe_bucket_params* grid)
{
    if (!p || !in || !out || p->batch < 1 || p->heads < 1 || p->lq < 1 || p->lk < 1 ||
        p->num_buckets < 1 || p->num_buckets > INT_MAX) {
        return IRPE_ERR_ARGUMENT;
    }
    for (int d = 0; d < 4; ++d) {
        if (p->stride[d] < 0) {
            return IRPE_ERR_ARGUMENT;
        }
    }
    if (!grid) {
        return index ? IRPE_OK : IRPE_ERR_ARGUMENT;
    }
    if (grid->width < 1 || grid->height < 1 || grid->skip < 0) {
        return IRPE_ERR_ARGUMENT;
    }
    const int64_t tokens = (int64_t)grid->skip + (int64_t)grid->height * grid->width;
    return (p->lq == tokens && p->lk == tokens) ? IRPE_OK : IRPE_ERR_ARGUMENT;
}

int finish_launch()
{
    const cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        return IRPE_OK;
    }
    std::snprintf(last_error, sizeof(last_error), "%s: %s", cudaGetErrorName(err),
                  cudaGetErrorString(err));
    return IRPE_ERR_CUDA;
}

namespace {
// One thread per (i, j) pair, grid-stride.
__global__ void bucket_ids_kernel(irpe_bucket_params params, int32_t* out, int64_t n)
{
    const int64_t total = n * n;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        out[e] = irpe_bucket_id(&params, e / n, e % n);
    }
}
}  // namespace

}  // namespace irpe

extern "C" const char* irpe_last_error(void) { return irpe::last_error; }

extern "C" int irpe_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : -1;
}

extern "C" int irpe_bucket_ids_device(const irpe_bucket_params* params, int32_t* out, void* stream)
{
    if (!params || !out || params->width < 1 || params->height < 1 || params->skip < 0) {
        return IRPE_ERR_ARGUMENT;
    }
    const int64_t n = (int64_t)params->skip + (int64_t)params->height * params->width;
    const int64_t blocks = std::min<int64_t>((n * n + 255) / 256, 65535);
    irpe::bucket_ids_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(*params, out, n);
    return irpe::finish_launch();
}
