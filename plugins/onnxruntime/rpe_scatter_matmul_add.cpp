// RPEScatterMatMulAdd(attn, index, weight, base) = base + RPEScatter(attn, index) @ weight: the
// iRPE-V term and its Add into the attention output as one pass. Not an exported op:
// irpe.runtime.onnxruntime.rewrites rewrites RPEScatter -> MatMul(weight) -> Add(base) into it when a session
// loads with this library. Per group of 4 (b, h) rows of one query i: the bucket sums (rpe_cpu.h,
// the order of RPEScatter) go to a K x 4 buffer, then a K x D product is added to the base rows,
// so the (B, H, Lq, K) scatter output and the MatMul's (B, H, Lq, D) result never reach memory.
// fp32 only; weight [..., K, D] shared by all heads (leading dims 1); base broadcasts to
// [B, H, Lq, D] (ONNX rules, rank <= 4, its last dim D).
#include <immintrin.h>

#include <algorithm>

#include "rpe_cpu.h"
#include "rpe_ort.h"
#include "rpe_simd.h"

namespace irpe_ort {

// The shared rows (plugins/cpu/rpe_cpu.h, rpe_simd.h) this op runs.
using irpe_cpu::scatter_row;
using irpe_cpu::scatter_rows4;
using irpe_cpu::WeightRowsFn;

namespace {

// 4 floats as one SSE register (GCC/Clang vector extension); unaligned loads and stores.
typedef float V4 __attribute__((vector_size(16), aligned(4)));
constexpr int64_t kStrip = 8;  // output columns per register strip: 2 x V4

struct VJob {
    Problem p;
    int64_t d = 0, groups = 0, chunk = 1;
    const float* attn = nullptr;
    const void* ids = nullptr;
    const float* weight = nullptr;
    const float* base = nullptr;
    int64_t base_stride[3] = {0, 0, 0};  // element strides of base over b, h, i (0: broadcast)
    float* out = nullptr;
    WeightRowsFn simd4 = nullptr, simd1 = nullptr;  // rpe_simd.h weight rows (4 rows, 1 row)
    std::vector<int32_t> off, pos;
};

// out_r = base_r + s_r @ weight for R rows (s_r: K sums, stride k; weight K x d, row stride
// ld): 2R accumulators of a strip of kStrip columns stay in registers over all K buckets; a
// scalar tail handles d % kStrip.
template <int R>
void rows_times_weight(const float* s, int64_t k, const float* __restrict w, int64_t ld,
                       int64_t d, const float* const* base, float* const* out)
{
    int64_t c0 = 0;
    for (; c0 + kStrip <= d; c0 += kStrip) {
        V4 lo[R], hi[R];
        for (int r = 0; r < R; ++r) {
            lo[r] = V4{0, 0, 0, 0};
            hi[r] = V4{0, 0, 0, 0};
        }
        for (int64_t t = 0; t < k; ++t) {
            const V4 w0 = *reinterpret_cast<const V4*>(w + t * ld + c0);
            const V4 w1 = *reinterpret_cast<const V4*>(w + t * ld + c0 + 4);
            for (int r = 0; r < R; ++r) {
                const float st = s[r * k + t];
                lo[r] += st * w0;
                hi[r] += st * w1;
            }
        }
        for (int r = 0; r < R; ++r) {
            *reinterpret_cast<V4*>(out[r] + c0) = *reinterpret_cast<const V4*>(base[r] + c0) + lo[r];
            *reinterpret_cast<V4*>(out[r] + c0 + 4) =
                *reinterpret_cast<const V4*>(base[r] + c0 + 4) + hi[r];
        }
    }
    for (; c0 < d; ++c0) {
        for (int r = 0; r < R; ++r) {
            float acc = 0.0f;
            for (int64_t t = 0; t < k; ++t) {
                acc += s[r * k + t] * w[t * ld + c0];
            }
            out[r][c0] = base[r][c0] + acc;
        }
    }
}

// out_r = base_r + s_r @ weight for R rows: the SIMD strips (rpe_simd.h) where the CPU has
// them, the portable strips and tail for the rest of the columns.
template <int R>
void times_weight(const VJob& job, const float* s, const float* const* base, float* const* out)
{
    const WeightRowsFn simd = R == 4 ? job.simd4 : job.simd1;
    const int64_t c0 = simd != nullptr ? simd(s, job.p.k, job.weight, job.d, base, out) : 0;
    if (c0 == job.d) {
        return;
    }
    const float* b2[R];
    float* o2[R];
    for (int r = 0; r < R; ++r) {
        b2[r] = base[r] + c0;
        o2[r] = out[r] + c0;
    }
    rows_times_weight<R>(s, job.p.k, job.weight + c0, job.d, job.d - c0, b2, o2);
}

// The weight rows of this SIMD level (rpe_simd_*.cpp); portable: the V4 strips only.
void pick_simd(VJob& job, Simd simd)
{
    if (simd == Simd::kAvx512) {
        job.simd4 = &irpe_cpu::weight_rows4_avx512;
        job.simd1 = &irpe_cpu::weight_rows1_avx512;
    } else if (simd == Simd::kAvx2) {
        job.simd4 = &irpe_cpu::weight_rows4_avx2;
        job.simd1 = &irpe_cpu::weight_rows1_avx2;
    }
}

// Groups g = (block of 4 (b, h) rows, query i), i fastest, as RPEScatter's tasks.
void v_chunk(void* data, size_t chunk)
{
    const VJob& job = *static_cast<const VJob*>(data);
    const Problem& p = job.p;
    const int64_t bh = p.batch * p.heads;
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk;
    const int64_t end = std::min(begin + job.chunk, job.groups);
    std::vector<float> sums(static_cast<size_t>(4 * p.k));
    for (int64_t g = begin; g < end; ++g) {
        const int64_t i = g % p.lq, first = g / p.lq * 4, count = std::min<int64_t>(4, bh - first);
        const int32_t* off = job.off.data() + i * (p.k + 1);
        const int32_t* pos = job.pos.data() + i * p.lk;
        const int64_t r = first * p.lq + i;
        const float* base[4];
        float* out[4];
        for (int64_t c = 0; c < count; ++c) {
            const int64_t b = (first + c) / p.heads, h = (first + c) % p.heads;
            const int64_t* bs = job.base_stride;
            base[c] = job.base + b * bs[0] + h * bs[1] + i * bs[2];
            out[c] = job.out + (r + c * p.lq) * job.d;
        }
        if (count == 4) {
            scatter_rows4(job.attn + r * p.lk, p.lq * p.lk, off, pos, p.k, sums.data(), p.k);
            times_weight<4>(job, sums.data(), base, out);
            continue;
        }
        for (int64_t c = 0; c < count; ++c) {
            scatter_row(job.attn + (r + c * p.lq) * p.lk, off, pos, p.k, sums.data());
            times_weight<1>(job, sums.data(), base + c, out + c);
        }
    }
}

// RPEBucketMatMulAdd: blocks of 4 consecutive rows r (flattened b, h, i) of the given sums.
void bucket_chunk(void* data, size_t chunk)
{
    const VJob& job = *static_cast<const VJob*>(data);
    const Problem& p = job.p;
    const int64_t rows = p.batch * p.heads * p.lq;
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk * 4;
    const int64_t end = std::min(begin + job.chunk * 4, rows);
    const float* sums = static_cast<const float*>(job.ids);
    const int64_t* bs = job.base_stride;
    for (int64_t r = begin; r < end; r += 4) {
        const int64_t count = std::min<int64_t>(4, end - r);
        const float* base[4];
        float* out[4];
        for (int64_t c = 0; c < count; ++c) {
            const int64_t i = (r + c) % p.lq, bh = (r + c) / p.lq;
            base[c] = job.base + bh / p.heads * bs[0] + bh % p.heads * bs[1] + i * bs[2];
            out[c] = job.out + (r + c) * job.d;
        }
        if (count == 4) {
            times_weight<4>(job, sums + r * p.k, base, out);
            continue;
        }
        for (int64_t c = 0; c < count; ++c) {
            times_weight<1>(job, sums + (r + c) * p.k, base + c, out + c);
        }
    }
}

OrtStatusPtr v_fail(const std::string& message, const char* op = "RPEScatterMatMulAdd")
{
    const std::string text = std::string(op) + ": " + message;
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, text.c_str());
}

// Weight [..., K, D] with leading dims 1; base broadcasting to [B, H, Lq, D] along its first
// three dims (strides set here): "" or what is wrong.
std::string check_shapes(VJob& job, const std::vector<int64_t>& w, std::vector<int64_t> base,
                         int weight_input)
{
    if (w.size() < 2 || w[w.size() - 2] != job.p.k) {
        return "input " + std::to_string(weight_input) + " (weight) must be [..., K=" +
               std::to_string(job.p.k) + ", D]";
    }
    for (size_t n = 0; n + 2 < w.size(); ++n) {
        if (w[n] != 1) {
            return "input " + std::to_string(weight_input) +
                   " (weight) must be shared by all heads (leading dims 1)";
        }
    }
    const Problem& p = job.p;
    const int64_t out[4] = {p.batch, p.heads, p.lq, w.back()};
    if (base.size() > 4 || base.empty() || base.back() != w.back()) {
        return "input " + std::to_string(weight_input + 1) +
               " (base) must broadcast to [B, H, Lq, D] with its last dim D = " +
               std::to_string(w.back());
    }
    base.insert(base.begin(), 4 - base.size(), 1);
    int64_t stride = base[3];
    for (int d = 2; d >= 0; --d) {
        if (base[d] != out[d] && base[d] != 1) {
            return "input " + std::to_string(weight_input + 1) + " (base) dim " +
                   std::to_string(d) + " is " + std::to_string(base[d]) +
                   ", the output's " + std::to_string(out[d]);
        }
        job.base_stride[d] = base[d] == 1 ? 0 : stride;
        stride *= base[d];
    }
    return {};
}

}  // namespace

OrtStatusPtr scatter_matmul_add_cpu(const RPEConfig& c, Ort::KernelContext& ctx)
{
    auto attn = ctx.GetInput(0);
    auto index = ctx.GetInput(1);
    auto weight = ctx.GetInput(2);
    auto base = ctx.GetInput(3);
    const auto index_info = index.GetTensorTypeAndShapeInfo();
    VJob job;
    job.p = make_problem(c, attn.GetTensorTypeAndShapeInfo().GetShape(), index_info.GetShape());
    if (!job.p.error.empty()) {
        return v_fail(job.p.error);
    }
    const auto type = index_info.GetElementType();
    if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        return v_fail("index must be int32 or int64");
    }
    const auto w_dims = weight.GetTensorTypeAndShapeInfo().GetShape();
    const std::string error =
        check_shapes(job, w_dims, base.GetTensorTypeAndShapeInfo().GetShape(), 2);
    if (!error.empty()) {
        return v_fail(error);
    }
    const Problem& p = job.p;
    job.d = w_dims.back();
    auto out = ctx.GetOutput(0, {p.batch, p.heads, p.lq, job.d});
    if (p.batch * p.heads * p.lq == 0 || job.d == 0) {
        return nullptr;
    }
    job.attn = attn.GetTensorData<float>();
    job.ids = index.GetTensorRawData();
    job.weight = weight.GetTensorData<float>();
    job.base = base.GetTensorData<float>();
    job.out = out.GetTensorMutableData<float>();
    pick_simd(job, c.simd);
    job.off.assign(static_cast<size_t>(p.lq * (p.k + 1)), 0);
    job.pos.resize(static_cast<size_t>(p.lq * p.lk));
    const int64_t rows = chunk_rows(p.lq, p.lk);
    const bool wide = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    parallel(ctx, wide ? &lists_task<int64_t, VJob> : &lists_task<int32_t, VJob>,
             (p.lq + rows - 1) / rows, &job);
    job.groups = (p.batch * p.heads + 3) / 4 * p.lq;
    job.chunk = chunk_rows(job.groups, 4 * (p.lk + p.k * job.d / 4));
    parallel(ctx, &v_chunk, (job.groups + job.chunk - 1) / job.chunk, &job);
    return nullptr;
}

OrtStatusPtr bucket_matmul_add_cpu(Simd simd, Ort::KernelContext& ctx)
{
    auto sums = ctx.GetInput(0);
    auto weight = ctx.GetInput(1);
    auto base = ctx.GetInput(2);
    const auto dims = sums.GetTensorTypeAndShapeInfo().GetShape();
    constexpr const char* kOp = "RPEBucketMatMulAdd";
    if (dims.size() != 4) {
        return v_fail("input 0 (bucket sums) must be [B, H, Lq, K]", kOp);
    }
    VJob job;
    job.p.batch = dims[0];
    job.p.heads = dims[1];
    job.p.lq = dims[2];
    job.p.k = dims[3];
    const auto w_dims = weight.GetTensorTypeAndShapeInfo().GetShape();
    const std::string error =
        check_shapes(job, w_dims, base.GetTensorTypeAndShapeInfo().GetShape(), 1);
    if (!error.empty()) {
        return v_fail(error, kOp);
    }
    const Problem& p = job.p;
    job.d = w_dims.back();
    auto out = ctx.GetOutput(0, {p.batch, p.heads, p.lq, job.d});
    const int64_t rows = p.batch * p.heads * p.lq;
    if (rows == 0 || job.d == 0) {
        return nullptr;
    }
    job.ids = sums.GetTensorData<float>();
    job.weight = weight.GetTensorData<float>();
    job.base = base.GetTensorData<float>();
    job.out = out.GetTensorMutableData<float>();
    pick_simd(job, simd);
    job.chunk = chunk_rows((rows + 3) / 4, 4 * p.k * job.d / 4);
    const int64_t blocks = (rows + 3) / 4;
    parallel(ctx, &bucket_chunk, (blocks + job.chunk - 1) / job.chunk, &job);
    return nullptr;
}

}  // namespace irpe_ort
