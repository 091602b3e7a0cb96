// RPEGatherAdd(table, index, base) = base + RPEGather(table, index), and
// RPEGatherAdd2(table, index, base, table2, index2) = (base + gather) + gather2, with ONNX's
// broadcasting of base (rank <= 4, dims equal or 1). Not exported ops: irpe.deploy.ort_fuse
// rewrites Add(x, RPEGather(...)) (and a chain of two) into them when a session loads with
// this library, so the attention logits are read and written once instead of once per gather
// and once per Add. The additions happen in the graph's order, so the result equals the
// unfused graph bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <climits>

#include "rpe_ort.h"

namespace irpe_ort {

namespace {

struct Term {  // one gather: sizes (B, H: the table's) and data
    Problem p;
    const float* table = nullptr;
    const void* ids = nullptr;
};

struct AddJob {
    Term term[2];
    int terms = 1;
    int64_t lq = 0, lk = 0;
    int64_t out_b = 0, out_h = 0;  // output batch / heads (broadcast with base)
    int64_t base_stride[4] = {0, 0, 0, 0};
    const float* base = nullptr;
    float* out = nullptr;
    int64_t total_rows = 0, chunk = 1;
    std::vector<int32_t> ids32[2];  // AVX2 path: the ids as int32, -1 where outside [0, K)
};

inline const float* table_row(const Term& t, int64_t b, int64_t h, int64_t i)
{
    const Problem& p = t.p;
    const int64_t tb = p.batch == 1 ? 0 : b, th = p.heads == 1 ? 0 : h;
    return t.table + ((tb * p.heads + th) * p.rows + (p.rows == 1 ? 0 : i)) * p.k;
}

inline float pick(const float* row, int64_t t, int64_t k)
{
    return static_cast<uint64_t>(t) < static_cast<uint64_t>(k) ? row[t] : 0.0f;
}

template <typename I, int kTerms>
void add_chunk(void* data, size_t chunk)
{
    const AddJob& job = *static_cast<const AddJob*>(data);
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk;
    const int64_t end = std::min(begin + job.chunk, job.total_rows);
    const int64_t* bs = job.base_stride;
    const int64_t lq = job.lq, lk = job.lk, k0 = job.term[0].p.k, k1 = job.term[1].p.k;
    for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % lq, h = (r / lq) % job.out_h, b = r / (lq * job.out_h);
        const float* row0 = table_row(job.term[0], b, h, i);
        const I* id0 = static_cast<const I*>(job.term[0].ids) + i * lk;
        const float* row1 = kTerms == 2 ? table_row(job.term[1], b, h, i) : nullptr;
        const I* id1 = kTerms == 2 ? static_cast<const I*>(job.term[1].ids) + i * lk : nullptr;
        const float* base = job.base + b * bs[0] + h * bs[1] + i * bs[2];
        float* out = job.out + r * lk;
        for (int64_t j = 0; j < lk; ++j) {
            float v = base[j * bs[3]] + pick(row0, static_cast<int64_t>(id0[j]), k0);
            if constexpr (kTerms == 2) {
                v = v + pick(row1, static_cast<int64_t>(id1[j]), k1);
            }
            out[j] = v;
        }
    }
}

// AVX2 rows (chosen at run time when base is contiguous along keys and the ids fit int32): 8
// keys at a time, masked gathers (0 where the id is -1), the same additions in the same order.
template <int kTerms>
__attribute__((target("avx2"))) void add_chunk_avx2(void* data, size_t chunk)
{
    const AddJob& job = *static_cast<const AddJob*>(data);
    const int64_t begin = static_cast<int64_t>(chunk) * job.chunk;
    const int64_t end = std::min(begin + job.chunk, job.total_rows);
    const int64_t* bs = job.base_stride;
    const int64_t lq = job.lq, lk = job.lk;
    const __m256i none = _mm256_set1_epi32(-1);
    for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % lq, h = (r / lq) % job.out_h, b = r / (lq * job.out_h);
        const float* row0 = table_row(job.term[0], b, h, i);
        const int32_t* id0 = job.ids32[0].data() + i * lk;
        const float* row1 = kTerms == 2 ? table_row(job.term[1], b, h, i) : nullptr;
        const int32_t* id1 = kTerms == 2 ? job.ids32[1].data() + i * lk : nullptr;
        const float* base = job.base + b * bs[0] + h * bs[1] + i * bs[2];
        float* out = job.out + r * lk;
        int64_t j = 0;
        for (; j + 8 <= lk; j += 8) {
            const __m256i i0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(id0 + j));
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(base + j), _mm256_mask_i32gather_ps(
                _mm256_setzero_ps(), row0, i0, _mm256_castsi256_ps(_mm256_cmpgt_epi32(i0, none)), 4));
            if constexpr (kTerms == 2) {
                const __m256i i1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(id1 + j));
                v = _mm256_add_ps(v, _mm256_mask_i32gather_ps(
                    _mm256_setzero_ps(), row1, i1, _mm256_castsi256_ps(_mm256_cmpgt_epi32(i1, none)), 4));
            }
            _mm256_storeu_ps(out + j, v);
        }
        for (; j < lk; ++j) {
            float v = base[j] + (id0[j] < 0 ? 0.0f : row0[id0[j]]);
            if constexpr (kTerms == 2) {
                v = v + (id1[j] < 0 ? 0.0f : row1[id1[j]]);
            }
            out[j] = v;
        }
    }
}

// The ids of a term as int32 with -1 outside [0, K); false when K does not fit int32.
template <typename I>
bool narrow_ids(const Term& t, int64_t count, std::vector<int32_t>& out)
{
    if (t.p.k > INT32_MAX) {
        return false;
    }
    const I* ids = static_cast<const I*>(t.ids);
    out.resize(static_cast<size_t>(count));
    for (int64_t n = 0; n < count; ++n) {
        const int64_t v = static_cast<int64_t>(ids[n]);
        out[static_cast<size_t>(n)] =
            static_cast<uint64_t>(v) < static_cast<uint64_t>(t.p.k) ? static_cast<int32_t>(v) : -1;
    }
    return true;
}

// Picks the AVX2 rows when the CPU, base's layout and the ids allow it (ids narrowed here).
void (*avx2_rows(AddJob& job, bool wide))(void*, size_t)
{
    if (job.base_stride[3] != 1 || !__builtin_cpu_supports("avx2")) {
        return nullptr;
    }
    for (int n = 0; n < job.terms; ++n) {
        const int64_t count = job.lq * job.lk;
        if (!(wide ? narrow_ids<int64_t>(job.term[n], count, job.ids32[n])
                   : narrow_ids<int32_t>(job.term[n], count, job.ids32[n]))) {
            return nullptr;
        }
    }
    return job.terms == 2 ? &add_chunk_avx2<2> : &add_chunk_avx2<1>;
}

// Output dims (broadcast of the gathers' [B,H,Lq,Lk] and base) and base's element strides.
std::string broadcast(AddJob& job, const std::vector<int64_t>& base_dims)
{
    if (base_dims.size() > 4) {
        return "input 2 has rank " + std::to_string(base_dims.size()) + " (<= 4)";
    }
    std::vector<int64_t> dims(4 - base_dims.size(), 1);
    dims.insert(dims.end(), base_dims.begin(), base_dims.end());
    int64_t out[4] = {1, 1, job.lq, job.lk}, stride = 1;
    for (int n = 0; n < job.terms; ++n) {
        const Problem& p = job.term[n].p;
        for (int d = 0; d < 2; ++d) {
            const int64_t g = d == 0 ? p.batch : p.heads;
            if (g != 1 && out[d] != 1 && g != out[d]) {
                return "the gathers' batch/heads differ";
            }
            out[d] = std::max(out[d], g);
        }
    }
    for (int d = 3; d >= 0; --d) {
        if (dims[d] != out[d] && dims[d] != 1 && out[d] != 1) {
            return "input 2 dim " + std::to_string(d) + " is " + std::to_string(dims[d]) +
                   ", the gather's " + std::to_string(out[d]);
        }
        if (d >= 2 && dims[d] > out[d]) {
            return "input 2 would broadcast the gather over queries or keys";
        }
        out[d] = std::max(dims[d], out[d]);
        job.base_stride[d] = dims[d] == 1 ? 0 : stride;
        stride *= dims[d];
    }
    job.out_b = out[0];
    job.out_h = out[1];
    return {};
}

OrtStatusPtr fail(const RpeConfig& c, const std::string& message)
{
    const std::string text = std::string(op_name(c.op, c.grid, c.adds)) + ": " + message;
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, text.c_str());
}

// Inputs (table, index) at `first` as one term; "" or what is wrong.
std::string read_term(const RpeConfig& c, Ort::KernelContext& ctx, size_t first, Term& term,
                      ONNXTensorElementDataType& index_type)
{
    auto table = ctx.GetInput(first);
    auto index = ctx.GetInput(first + 1);
    const auto info = index.GetTensorTypeAndShapeInfo();
    RpeConfig plain = c;
    plain.num_buckets = first == 0 ? c.num_buckets : 0;  // the 2nd table's K is its own
    term.p = make_problem(plain, table.GetTensorTypeAndShapeInfo().GetShape(), info.GetShape());
    index_type = info.GetElementType();
    if (index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
        index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        return "index must be int32 or int64";
    }
    term.table = table.GetTensorData<float>();
    term.ids = index.GetTensorRawData();
    return term.p.error;
}

}  // namespace

OrtStatusPtr gather_add_cpu(const RpeConfig& c, Ort::KernelContext& ctx)
{
    AddJob job;
    job.terms = c.adds == 2 ? 2 : 1;
    ONNXTensorElementDataType types[2] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
                                          ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64};
    for (int n = 0; n < job.terms; ++n) {
        const std::string error = read_term(c, ctx, n == 0 ? 0 : 3, job.term[n], types[n]);
        if (!error.empty()) {
            return fail(c, error);
        }
    }
    job.lq = job.term[0].p.lq;
    job.lk = job.term[0].p.lk;
    if (job.terms == 2 && (job.term[1].p.lq != job.lq || job.term[1].p.lk != job.lk ||
                           types[1] != types[0])) {
        return fail(c, "the two gathers differ in Lq, Lk or index type");
    }
    auto base = ctx.GetInput(2);
    const std::string error = broadcast(job, base.GetTensorTypeAndShapeInfo().GetShape());
    if (!error.empty()) {
        return fail(c, error);
    }
    auto out = ctx.GetOutput(0, {job.out_b, job.out_h, job.lq, job.lk});
    job.total_rows = job.out_b * job.out_h * job.lq;
    if (job.total_rows == 0 || job.lk == 0) {
        return nullptr;
    }
    job.base = base.GetTensorData<float>();
    job.out = out.GetTensorMutableData<float>();
    job.chunk = chunk_rows(job.total_rows, job.lk);
    const bool wide = types[0] == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    void (*fn)(void*, size_t) = wide ? &add_chunk<int64_t, 1> : &add_chunk<int32_t, 1>;
    if (job.terms == 2) {
        fn = wide ? &add_chunk<int64_t, 2> : &add_chunk<int32_t, 2>;
    }
    if (auto fast = avx2_rows(job, wide)) {
        fn = fast;
    }
    parallel(ctx, fn, (job.total_rows + job.chunk - 1) / job.chunk, &job);
    return nullptr;
}

}  // namespace irpe_ort
