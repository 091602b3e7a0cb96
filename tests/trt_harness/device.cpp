// Device buffers and enqueue for the harness (device.h).
#include "device.h"

#include <cuda_runtime_api.h>

namespace harness {

using namespace nvinfer1;

namespace {

// Device allocations freed on every path.
struct Buffers {
    std::vector<void*> list;
    ~Buffers()
    {
        for (void* p : list) cudaFree(p);
    }
    void* make(size_t bytes, cudaError_t& err)
    {
        void* p = nullptr;
        err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
        if (err == cudaSuccess) list.push_back(p);
        return p;
    }
};

std::string cuda_text(char const* what, cudaError_t err)
{
    return std::string(what) + ": " + cudaGetErrorName(err) + " " + cudaGetErrorString(err);
}

IPluginV3OneRuntime* runtime_of(IPluginV3* p)
{
    return static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}

}  // namespace

int device_count()
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string enqueue_on_device(Case const& c, std::vector<IPluginV3*> const& plugins, size_t workspace,
                              std::vector<std::vector<uint8_t>>& outs)
{
    Buffers buffers;
    cudaError_t err = cudaSuccess;
    void* in[2] = {nullptr, nullptr};
    for (int i = 0; i < 2; ++i) {
        in[i] = buffers.make(c.inputs[i].bytes.size(), err);
        if (err != cudaSuccess) return cuda_text("cudaMalloc", err);
        err = cudaMemcpy(in[i], c.inputs[i].bytes.data(), c.inputs[i].bytes.size(), cudaMemcpyHostToDevice);
        if (err != cudaSuccess) return cuda_text("cudaMemcpy to device", err);
    }
    void* ws = workspace > 0 ? buffers.make(workspace, err) : nullptr;
    if (err != cudaSuccess) return cuda_text("cudaMalloc workspace", err);
    cudaStream_t stream = nullptr;
    if ((err = cudaStreamCreate(&stream)) != cudaSuccess) return cuda_text("cudaStreamCreate", err);
    PluginTensorDesc const in_desc[2] = {desc_of(c.inputs[0]), desc_of(c.inputs[1])};
    PluginTensorDesc const out_desc = desc_of(c.output);
    size_t const bytes = c.output.size_bytes();
    std::string error;
    outs.assign(plugins.size(), std::vector<uint8_t>(bytes));
    for (size_t k = 0; k < plugins.size() && error.empty(); ++k) {
        void* out = buffers.make(bytes, err);
        if (err != cudaSuccess) { error = cuda_text("cudaMalloc output", err); break; }
        // a stale or partial write cannot pass for a result: the buffer starts as NaN / -1 bytes
        if ((err = cudaMemsetAsync(out, 0xFF, bytes, stream)) != cudaSuccess) { error = cuda_text("memset", err); break; }
        void const* const inputs[2] = {in[0], in[1]};
        void* const outputs[1] = {out};
        if (runtime_of(plugins[k])->enqueue(in_desc, &out_desc, inputs, outputs, ws, stream) != 0) {
            error = "enqueue returned an error for plugin " + std::to_string(k);
            break;
        }
        if ((err = cudaStreamSynchronize(stream)) != cudaSuccess) { error = cuda_text("synchronize", err); break; }
        err = cudaMemcpy(outs[k].data(), out, bytes, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) error = cuda_text("cudaMemcpy to host", err);
    }
    cudaStreamDestroy(stream);
    return error;
}

int enqueue_without_device(Case const& c, IPluginV3* plugin)
{
    static char placeholder[16];
    PluginTensorDesc const in_desc[2] = {desc_of(c.inputs[0]), desc_of(c.inputs[1])};
    PluginTensorDesc const out_desc = desc_of(c.output);
    void const* const inputs[2] = {placeholder, placeholder};
    void* const outputs[1] = {placeholder};
    return runtime_of(plugin)->enqueue(in_desc, &out_desc, inputs, outputs, nullptr, nullptr);
}

}  // namespace harness
