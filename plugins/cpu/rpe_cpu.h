// CPU rows of RPEGather / RPEScatter: the same contract as the CUDA kernels (irpe_kernels.h):
//   gather : out[j] = row[id[j]]                        (0 where id is outside [0, K))
//   scatter: out[t] = sum over j with id[j] = t of a[j]  (fp32 accumulation in ascending j,
//            through per-row bucket lists; ids outside [0, K) dropped)
// One call handles ONE output row, so rows can go to different threads without any shared
// writes: the result does not depend on the thread count (no atomics, fixed summation order).
// On-the-fly ids come from irpe_bucket.h, the header the CUDA kernels use too. Shared by the
// ONNX Runtime library (plugins/onnxruntime) and the OpenVINO library (plugins/openvino).
#ifndef IRPE_CPU_RPE_CPU_H
#define IRPE_CPU_RPE_CPU_H

#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "irpe_bucket.h"

namespace irpe_cpu {

// Element conversion for the scatter's fp32 accumulation (identity for float).
template <typename T>
struct Acc {
    static float load(T v) { return static_cast<float>(v); }
    static T store(float v) { return T(v); }
};

template <>
struct Acc<float> {
    static float load(float v) { return v; }
    static float store(float v) { return v; }
};

// Gather copies bits: T is a same-sized unsigned integer (uint32_t for fp32, uint16_t for
// fp16/bf16), so no value is ever converted and the result is bit-identical to any copy.
template <typename T, typename I>
inline void gather_row(const T* __restrict table_row, const I* __restrict ids, int64_t lk,
                       int64_t k, T* __restrict out)
{
    for (int64_t j = 0; j < lk; ++j) {
        const int64_t t = static_cast<int64_t>(ids[j]);
        out[j] = static_cast<uint64_t>(t) < static_cast<uint64_t>(k) ? table_row[t] : T{};
    }
}

// The ids of a table with K buckets as int32, -1 outside [0, K) (the form the SIMD rows index
// with); false when K does not fit int32.
inline bool narrow_ids(const void* ids, bool wide, int64_t count, int64_t k,
                       std::vector<int32_t>& out)
{
    if (k > INT32_MAX) {
        return false;
    }
    out.resize(static_cast<size_t>(count));
    for (int64_t n = 0; n < count; ++n) {
        const int64_t v = wide ? static_cast<const int64_t*>(ids)[n]
                               : static_cast<const int32_t*>(ids)[n];
        out[static_cast<size_t>(n)] =
            static_cast<uint64_t>(v) < static_cast<uint64_t>(k) ? static_cast<int32_t>(v) : -1;
    }
    return true;
}

// Bucket lists of one index row (CSR): the keys j with id t are pos[off[t] .. off[t+1]), in
// ascending j; ids outside [0, K) are left out. Built once per query row, shared by all (b, h).
template <typename I>
inline void bucket_lists(const I* __restrict ids, int64_t lk, int64_t k, int32_t* __restrict off,
                         int32_t* __restrict pos)
{
    std::memset(off, 0, sizeof(int32_t) * static_cast<size_t>(k + 1));
    for (int64_t j = 0; j < lk; ++j) {
        const int64_t t = static_cast<int64_t>(ids[j]);
        if (static_cast<uint64_t>(t) < static_cast<uint64_t>(k)) {
            ++off[t + 1];
        }
    }
    for (int64_t t = 0; t < k; ++t) {
        off[t + 1] += off[t];
    }
    std::vector<int32_t> next(off, off + k);
    for (int64_t j = 0; j < lk; ++j) {
        const int64_t t = static_cast<int64_t>(ids[j]);
        if (static_cast<uint64_t>(t) < static_cast<uint64_t>(k)) {
            pos[next[static_cast<size_t>(t)]++] = static_cast<int32_t>(j);
        }
    }
}

// Bucket lists (bucket_lists) of every row of an [Lq, Lk] index: row i's at off[i * (K + 1)]
// and pos[i * Lk].
struct BucketLists {
    std::vector<int32_t> off, pos;
};

// The bucket lists of every row of `ids`, one row after another (the ONNX Runtime library
// builds them on its pool instead: rpe_ort_rows.cpp).
template <typename I>
inline BucketLists all_bucket_lists(const I* ids, int64_t lq, int64_t lk, int64_t k)
{
    BucketLists b{std::vector<int32_t>(static_cast<size_t>(lq * (k + 1))),
                  std::vector<int32_t>(static_cast<size_t>(lq * lk))};
    for (int64_t i = 0; i < lq; ++i) {
        bucket_lists(ids + i * lk, lk, k, b.off.data() + i * (k + 1), b.pos.data() + i * lk);
    }
    return b;
}

// Each bucket's sum stays in a register (no store-to-load chain through an accumulator array
// when neighbouring keys share a bucket) and is taken in ascending j: the order of a
// sequential scatter-add, so the fp32 result equals PyTorch's CPU scatter_add_.
template <typename T>
inline void scatter_row(const T* __restrict attn_row, const int32_t* __restrict off,
                        const int32_t* __restrict pos, int64_t k, T* __restrict out)
{
    for (int64_t t = 0; t < k; ++t) {
        float s = 0.0f;
        for (int32_t n = off[t]; n < off[t + 1]; ++n) {
            s += Acc<T>::load(attn_row[pos[n]]);
        }
        out[t] = Acc<T>::store(s);
    }
}

// Four rows (b, h) of the same query i at once (element strides in_stride, out_stride): the
// bucket lists are walked once and the four independent sums overlap in the pipeline. Each
// row's order is scatter_row's, so the results are the same bit for bit.
template <typename T>
inline void scatter_rows4(const T* __restrict a, int64_t in_stride, const int32_t* __restrict off,
                          const int32_t* __restrict pos, int64_t k, T* __restrict out,
                          int64_t out_stride)
{
    const T* a1 = a + in_stride;
    const T* a2 = a1 + in_stride;
    const T* a3 = a2 + in_stride;
    for (int64_t t = 0; t < k; ++t) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int32_t n = off[t]; n < off[t + 1]; ++n) {
            const int32_t j = pos[n];
            s0 += Acc<T>::load(a[j]);
            s1 += Acc<T>::load(a1[j]);
            s2 += Acc<T>::load(a2[j]);
            s3 += Acc<T>::load(a3[j]);
        }
        out[t] = Acc<T>::store(s0);
        out[out_stride + t] = Acc<T>::store(s1);
        out[2 * out_stride + t] = Acc<T>::store(s2);
        out[3 * out_stride + t] = Acc<T>::store(s3);
    }
}

// The (skip + H*W)^2 id table of an on-the-fly node, computed with the kernels' header.
inline std::vector<int32_t> grid_ids(const irpe_bucket_params& p)
{
    const int64_t n = static_cast<int64_t>(p.skip) + static_cast<int64_t>(p.height) * p.width;
    std::vector<int32_t> ids(static_cast<size_t>(n * n));
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            ids[static_cast<size_t>(i * n + j)] = irpe_bucket_id(&p, i, j);
        }
    }
    return ids;
}

}  // namespace irpe_cpu

#endif  // IRPE_CPU_RPE_CPU_H
