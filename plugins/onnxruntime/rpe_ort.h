// ONNX Runtime custom ops RPEGather / RPEScatter (domain "irpe"): shared declarations.
#ifndef IRPE_ORT_RPE_ORT_H
#define IRPE_ORT_RPE_ORT_H

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include "irpe_bucket.h"
#include "rpe_cpu.h"
#include "rpe_simd.h"

namespace irpe_cpu {
struct AttnProblem;  // rpe_attention_problem.h
}  // namespace irpe_cpu

namespace irpe_ort {

// The shared CPU kernels (plugins/cpu, namespace irpe_cpu) these ops run: their vector level and
// the bucket lists of an index.
using irpe_cpu::BucketLists;
using irpe_cpu::Simd;

enum class Op { kGather, kScatter };

// The load-time fused forms beyond RPEGatherAdd* (irpe/runtime/onnxruntime/rewrites.py): Softmax of the
// gather-add (kSoftmax), the same plus the iRPE-V bucket sums as a 2nd output
// (kSoftmaxScatter), and base + sums @ weight (kBucketMatMulAdd, RPEBucketMatMulAdd).
enum class Fused { kNone, kSoftmax, kSoftmaxScatter, kBucketMatMulAdd };

// The node's attributes: exactly the fields the TensorRT creator of the same name advertises
// (plugins/tensorrt/README.md): RPEGather/RPEScatter num_buckets; the *Grid forms (ids computed
// on the fly from input 1's last two dims) method, ratio, skip and an optional num_buckets.
// One name for the concept: irpe_trt::RPEConfig (plugins/tensorrt/rpe_plugin.h) holds the same
// plugin fields as TensorRT serializes them (int32); this one has ONNX's int64 attributes and the
// forms fused at session load (grid, adds, fused, simd, scatter_buckets), so they stay two types.
struct RPEConfig {
    Op op = Op::kGather;
    bool grid = false;
    int adds = 0;  // RPEGatherAdd (1): input 2 + gather; RPEGatherAdd2 (2): + a 2nd gather of
                   // inputs 3, 4. Adds fused at session load (irpe/runtime/onnxruntime/rewrites.py)
    Fused fused = Fused::kNone;
    Simd simd = Simd::kPortable;
    int64_t num_buckets = 0;  // 0 = not set (RPEGather: the table's last dim)
    int64_t scatter_buckets = 0;  // kSoftmaxScatter: K of the iRPE-V index (attribute)
    std::string method;       // "" = ids from input 1; else computed (on the fly)
    float ratio = 0.0f;
    int64_t skip = 0;
    bool on_the_fly() const { return !method.empty(); }
    int method_id() const;
};

char const* op_name(Op op, bool grid = false, int adds = 0, Fused fused = Fused::kNone);

// Reads and checks the node's attributes; returns "" or what is wrong with them.
std::string read_config(const OrtApi& api, const OrtKernelInfo* info, RPEConfig& config);

// Bucket parameters of an on-the-fly node for an H x W grid.
std::string grid_params(const RPEConfig& c, int64_t height, int64_t width, irpe_bucket_params& p);

// Per-kernel cache of on-the-fly id tables (one per grid size seen).
class GridIdCache {
 public:
    std::shared_ptr<const std::vector<int32_t>> get(const irpe_bucket_params& p);

 private:
    std::mutex mutex_;
    std::vector<std::pair<std::pair<int32_t, int32_t>, std::shared_ptr<const std::vector<int32_t>>>>
        entries_;
};

// Sizes of one call, taken from the input shapes; error is set when the shapes are wrong.
struct Problem {
    int64_t batch = 0, heads = 0, rows = 0, lq = 0, lk = 0, k = 0;
    std::string error;
};

Problem make_problem(const RPEConfig& c, const std::vector<int64_t>& in,
                     const std::vector<int64_t>& index);

// Rows per ParallelFor task for `rows` output rows of `width` elements, and the call itself
// (inline when one task).
int64_t chunk_rows(int64_t rows, int64_t width);
void parallel(Ort::KernelContext& ctx, void (*fn)(void*, size_t), int64_t tasks, void* job);

// ParallelFor task `chunk` of a scatter's first pass: the bucket lists (rpe_cpu.h) of its index
// rows. Job: p (Problem), ids (I*), off and pos (int32 vectors sized Lq*(K+1), Lq*Lk).
template <typename I, typename Job>
void lists_task(void* data, size_t chunk)
{
    Job& job = *static_cast<Job*>(data);
    const Problem& p = job.p;
    const int64_t rows = chunk_rows(p.lq, p.lk);
    const int64_t begin = static_cast<int64_t>(chunk) * rows;
    const int64_t end = std::min(begin + rows, p.lq);
    const I* ids = static_cast<const I*>(job.ids);
    for (int64_t i = begin; i < end; ++i) {
        irpe_cpu::bucket_lists(ids + i * p.lk, p.lk, p.k, job.off.data() + i * (p.k + 1),
                               job.pos.data() + i * p.lk);
    }
}

// A kernel's bucket lists: built once per (Lq, Lk, K) when its index input is constant (an
// initializer), else on every call (rpe_ort_rows.cpp).
class BucketListCache {
 public:
    bool constant = false;
    std::shared_ptr<const BucketLists> get(Ort::KernelContext& ctx, const void* ids, bool wide,
                                           int64_t lq, int64_t lk, int64_t k);

 private:
    struct Entry {
        int64_t lq, lk, k;
        std::shared_ptr<const BucketLists> lists;
    };
    std::mutex mutex_;
    std::vector<Entry> entries_;
};

class NarrowedIds;  // rpe_terms.h

// CPU compute of RPEGather / RPEScatter (rpe_ort_rows.cpp): every output row on ORT's pool.
OrtStatusPtr rows_cpu(const RPEConfig& c, GridIdCache& cache, Ort::KernelContext& ctx);

// CPU compute of RPEGatherAdd / RPEGatherAdd2 (rpe_gather_add.cpp), float32.
OrtStatusPtr gather_add_cpu(const RPEConfig& c, NarrowedIds& ids, Ort::KernelContext& ctx);

// CPU compute of RPEGatherAdd*Softmax* (rpe_softmax.cpp), float32.
OrtStatusPtr softmax_cpu(const RPEConfig& c, NarrowedIds& ids, BucketListCache& lists,
                         Ort::KernelContext& ctx);

// RPEConfig::adds of RPEScatterMatMulAdd (base + RPEScatter @ weight; rpe_scatter_matmul_add.cpp,
// fp32 CPU).
constexpr int kScatterMatMulAdd = 3;
constexpr const char* kScatterMatMulAddName = "RPEScatterMatMulAdd";
OrtStatusPtr scatter_matmul_add_cpu(const RPEConfig& c, Ort::KernelContext& ctx);

// RPEBucketMatMulAdd(sums, weight, base) = base + sums @ weight (rpe_scatter_matmul_add.cpp, fp32 CPU):
// the iRPE-V term when RPEGatherAdd*SoftmaxScatter already gave the bucket sums.
OrtStatusPtr bucket_matmul_add_cpu(Simd simd, Ort::KernelContext& ctx);

// Whether input `index` of the node is a constant (an initializer): its data never changes.
bool constant_input(const OrtApi& api, const OrtKernelInfo* info, size_t index);

// RPEAttention (rpe_attention.cpp, rpe_attention.h): a whole iRPE attention block, CPU fp32;
// made at session load by the fusion stage "attention" (irpe/runtime/onnxruntime/rewrite_attention.py).
constexpr const char* kAttentionName = "RPEAttention";
OrtCustomOp* attention_op();
// Runs every pair of `p` on ORT's pool (plugins/cpu/rpe_attention_run.cpp's tasks); throws when
// it cannot.
void run_attention(Ort::KernelContext& ctx, const irpe_cpu::AttnProblem& p, Simd simd);

#ifdef IRPE_ORT_WITH_CUDA
// CUDA EP compute (rpe_ort_cuda.cpp): runs the plugins/kernels kernels on ORT's stream.
OrtStatusPtr cuda_compute(const OrtApi& api, const RPEConfig& c, Ort::KernelContext& ctx);
#endif

}  // namespace irpe_ort

#endif  // IRPE_ORT_RPE_ORT_H
