// The gather terms of the load-time fused ops (RPEGatherAdd*, RPEGatherAdd*Softmax*): one
// output row of base + gather (+ gather2), the additions in the graph's order, so a fused op's
// logits equal the unfused graph's bit for bit. Shared by rpe_gather_add.cpp and rpe_softmax.cpp.
#ifndef IRPE_ORT_RPE_TERMS_H
#define IRPE_ORT_RPE_TERMS_H

#include <immintrin.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rpe_ort.h"

namespace irpe_ort {

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
    bool wide = true;                   // ids are int64 (else int32)
    const int32_t* ids32[2] = {nullptr, nullptr};  // AVX2 rows: ids as int32, -1 outside [0, K)
    bool avx512 = false;                // with ids32: the AVX-512 rows (rpe_rows_avx512.cpp)
    std::shared_ptr<const std::vector<int32_t>> narrowed[2];  // ids32's storage
};

// A kernel's constant index inputs (initializers: the data never changes), narrowed to int32
// once per K instead of on every call.
class NarrowedIds {
 public:
    bool constant[2] = {false, false};  // set at kernel creation for the index of term 0 / 1
    std::shared_ptr<const std::vector<int32_t>> get(int term, const void* ids, bool wide,
                                                    int64_t count, int64_t k);

 private:
    struct Entry {
        int term;
        int64_t count, k;
        std::shared_ptr<const std::vector<int32_t>> ids;
    };
    std::mutex mutex_;
    std::vector<Entry> entries_;
};

// Reads inputs (table, index) at `first` as one term: "" or what is wrong.
std::string read_term(const RPEConfig& c, Ort::KernelContext& ctx, size_t first, Term& term,
                      ONNXTensorElementDataType& index_type);

// Reads the terms (inputs 0, 1 and 3, 4) and base (input 2) and sets the output dims and
// base strides: "" or what is wrong.
std::string read_add_job(const RPEConfig& c, Ort::KernelContext& ctx, AddJob& job);

// Sets job.ids32 (and job.avx512 at that level) when the SIMD rows can run (CPU, base contiguous
// along keys, ids fit int32):
// from `cache` for constant ids, else narrowed now. False: the scalar rows.
bool use_avx2(AddJob& job, NarrowedIds* cache, Simd simd);

// The ids of a table with K buckets as int32, -1 outside [0, K) (plugins/cpu/rpe_cpu.h).
using irpe_cpu::narrow_ids;

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

// Row r (flattened b, h, i) of base + gather (+ gather2) into out (Lk floats).
template <typename I, int kTerms>
void add_row(const AddJob& job, int64_t r, float* __restrict out)
{
    const int64_t* bs = job.base_stride;
    const int64_t lq = job.lq, lk = job.lk, k0 = job.term[0].p.k, k1 = job.term[1].p.k;
    const int64_t i = r % lq, h = (r / lq) % job.out_h, b = r / (lq * job.out_h);
    const float* row0 = table_row(job.term[0], b, h, i);
    const I* id0 = static_cast<const I*>(job.term[0].ids) + i * lk;
    const float* row1 = kTerms == 2 ? table_row(job.term[1], b, h, i) : nullptr;
    const I* id1 = kTerms == 2 ? static_cast<const I*>(job.term[1].ids) + i * lk : nullptr;
    const float* base = job.base + b * bs[0] + h * bs[1] + i * bs[2];
    for (int64_t j = 0; j < lk; ++j) {
        float v = base[j * bs[3]] + pick(row0, static_cast<int64_t>(id0[j]), k0);
        if constexpr (kTerms == 2) {
            v = v + pick(row1, static_cast<int64_t>(id1[j]), k1);
        }
        out[j] = v;
    }
}

// The same with AVX2: 8 keys at a time, masked gathers (0 where the id is -1), the same
// additions in the same order (base contiguous along keys).
template <int kTerms>
__attribute__((target("avx2"))) void add_row_avx2(const AddJob& job, int64_t r,
                                                  float* __restrict out)
{
    const int64_t* bs = job.base_stride;
    const int64_t lq = job.lq, lk = job.lk;
    const int64_t i = r % lq, h = (r / lq) % job.out_h, b = r / (lq * job.out_h);
    const float* row0 = table_row(job.term[0], b, h, i);
    const int32_t* id0 = job.ids32[0] + i * lk;
    const float* row1 = kTerms == 2 ? table_row(job.term[1], b, h, i) : nullptr;
    const int32_t* id1 = kTerms == 2 ? job.ids32[1] + i * lk : nullptr;
    const float* base = job.base + b * bs[0] + h * bs[1] + i * bs[2];
    const __m256i none = _mm256_set1_epi32(-1);
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

using AddRowFn = void (*)(const AddJob&, int64_t, float*);

// The AVX-512 row function for this job's terms (rpe_rows_avx512.cpp); needs job.ids32.
AddRowFn add_row_avx512_fn(const AddJob& job);

// The row function for this job: AVX-512 or AVX2 when job.ids32 is set, else scalar by index type.
inline AddRowFn add_row_fn(const AddJob& job)
{
    if (job.ids32[0] != nullptr && job.avx512) {
        return add_row_avx512_fn(job);
    }
    if (job.ids32[0] != nullptr) {
        return job.terms == 2 ? &add_row_avx2<2> : &add_row_avx2<1>;
    }
    if (job.wide) {
        return job.terms == 2 ? &add_row<int64_t, 2> : &add_row<int64_t, 1>;
    }
    return job.terms == 2 ? &add_row<int32_t, 2> : &add_row<int32_t, 1>;
}

}  // namespace irpe_ort

#endif  // IRPE_ORT_RPE_TERMS_H
