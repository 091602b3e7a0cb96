// Row softmax and the small bucket-sum x weight product on SIMD registers, written once for any
// vector type V (rpe_simd_avx2.cpp and
// rpe_simd_avx512.cpp instantiate it, each compiled for its instruction set; only intrinsics and
// plain loops here, no standard-library templates, so nothing of another ISA leaks into shared
// code). V provides: T, kLanes, set1, load, store, max, add, sub, mul, fmadd, fnmadd,
// round (to nearest), scale (y * 2^n), reduce_max, reduce_add.
#ifndef IRPE_CPU_RPE_SIMD_H
#define IRPE_CPU_RPE_SIMD_H

#include <cmath>
#include <cstdint>

namespace irpe_cpu {

// The vector code the CPU kernels use: the widest the CPU has, capped by $IRPE_ORT_SIMD
// (portable | avx2 | avx512; read when a kernel is created) to test or compare the paths.
// rpe_simd_level.cpp (no ONNX Runtime in it: libirpe_cpu_attention uses it too).
enum class Simd { kPortable, kAvx2, kAvx512 };
Simd simd_level();
// AVX512_BF16 (and AVX512BW) at the AVX-512 level: the bf16 attention products can run.
bool cpu_has_bf16();

// exp(x) for x <= 0 (Cephes-style: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial, times
// 2^n; under about -88.38 the result is 0). NaN stays NaN.
template <class V>
inline typename V::T exp_nonpositive(typename V::T x)
{
    x = V::max(V::set1(-88.3762626647949f), V::min(V::set1(88.3762626647949f), x));
    const typename V::T n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    x = V::fnmadd(n, V::set1(0.693359375f), x);
    x = V::fnmadd(n, V::set1(-2.12194440e-4f), x);
    typename V::T y = V::set1(1.9875691500e-4f);
    y = V::fmadd(y, x, V::set1(1.3981999507e-3f));
    y = V::fmadd(y, x, V::set1(8.3334519073e-3f));
    y = V::fmadd(y, x, V::set1(4.1665795894e-2f));
    y = V::fmadd(y, x, V::set1(1.6666665459e-1f));
    y = V::fmadd(y, x, V::set1(5.0000001201e-1f));
    y = V::fmadd(y, V::mul(x, x), V::add(x, V::set1(1.0f)));
    return V::scale(y, n);
}

// Softmax of R rows x[r] (n values, padded with -inf to a multiple of V::kLanes; overwritten
// with exps) into out[r] (n values). The R rows go through each phase together, so their
// dependency chains (max, sum) overlap instead of running one after another.
template <class V, int R>
inline void softmax_rows(float* const* x, int64_t n, float* const* out)
{
    using T = typename V::T;
    const int64_t padded = (n + V::kLanes - 1) / V::kLanes * V::kLanes;
    const int64_t full = n / V::kLanes * V::kLanes;
    T m[R], s[R];
    for (int r = 0; r < R; ++r) {
        m[r] = V::set1(-INFINITY);
        s[r] = V::set1(0.0f);
    }
    for (int64_t j = 0; j < padded; j += V::kLanes) {
        for (int r = 0; r < R; ++r) {
            m[r] = V::max(m[r], V::load(x[r] + j));
        }
    }
    for (int r = 0; r < R; ++r) {
        m[r] = V::set1(V::reduce_max(m[r]));
    }
    for (int64_t j = 0; j < padded; j += V::kLanes) {
        for (int r = 0; r < R; ++r) {
            const T e = exp_nonpositive<V>(V::sub(V::load(x[r] + j), m[r]));
            V::store(x[r] + j, e);
            s[r] = V::add(s[r], e);
        }
    }
    float inv[R];
    for (int r = 0; r < R; ++r) {
        inv[r] = 1.0f / V::reduce_add(s[r]);
        s[r] = V::set1(inv[r]);
    }
    for (int64_t j = 0; j < full; j += V::kLanes) {
        for (int r = 0; r < R; ++r) {
            V::store(out[r] + j, V::mul(V::load(x[r] + j), s[r]));
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int64_t j = full; j < n; ++j) {
            out[r][j] = x[r][j] * inv[r];
        }
    }
}

// out_r = base_r + s_r @ w for R rows (s_r: K sums at s + r * k; w: K x d, row-major) over
// strips of 2 vectors of columns: 2R accumulators stay in registers over all K buckets.
// Returns the first column not done (d minus the last partial strip) for the caller's tail.
template <class V, int R>
inline int64_t rows_times_weight(const float* s, int64_t k, const float* w, int64_t d,
                                 const float* const* base, float* const* out)
{
    using T = typename V::T;
    int64_t c0 = 0;
    for (; c0 + 2 * V::kLanes <= d; c0 += 2 * V::kLanes) {
        T lo[R], hi[R];
        for (int r = 0; r < R; ++r) {
            lo[r] = V::set1(0.0f);
            hi[r] = V::set1(0.0f);
        }
        for (int64_t t = 0; t < k; ++t) {
            const T w0 = V::load(w + t * d + c0), w1 = V::load(w + t * d + c0 + V::kLanes);
            for (int r = 0; r < R; ++r) {
                const T st = V::set1(s[r * k + t]);
                lo[r] = V::fmadd(st, w0, lo[r]);
                hi[r] = V::fmadd(st, w1, hi[r]);
            }
        }
        for (int r = 0; r < R; ++r) {
            V::store(out[r] + c0, V::add(V::load(base[r] + c0), lo[r]));
            V::store(out[r] + c0 + V::kLanes, V::add(V::load(base[r] + c0 + V::kLanes), hi[r]));
        }
    }
    return c0;
}

using WeightRowsFn = int64_t (*)(const float*, int64_t, const float*, int64_t, const float* const*,
                                 float* const*);

// The instantiations (defined in rpe_simd_*.cpp): 4 rows and 1 row. Padding: kSoftmaxPad.
constexpr int64_t kSoftmaxPad = 16;
void softmax_rows4_avx2(float* const* x, int64_t n, float* const* out);
void softmax_rows1_avx2(float* const* x, int64_t n, float* const* out);
void softmax_rows4_avx512(float* const* x, int64_t n, float* const* out);
void softmax_rows1_avx512(float* const* x, int64_t n, float* const* out);
int64_t weight_rows4_avx2(const float*, int64_t, const float*, int64_t, const float* const*,
                          float* const*);
int64_t weight_rows1_avx2(const float*, int64_t, const float*, int64_t, const float* const*,
                          float* const*);
int64_t weight_rows4_avx512(const float*, int64_t, const float*, int64_t, const float* const*,
                            float* const*);
int64_t weight_rows1_avx512(const float*, int64_t, const float*, int64_t, const float* const*,
                            float* const*);

// Zeroes zmm16-31 and the upper halves (vzeroupper leaves zmm16-31 alone). Every task on an
// AVX-512 CPU ends with it (rpe_ort_rows.cpp parallel): dirty zmm16-31 slow down the SSE code
// ONNX Runtime runs next on that thread (measured: docs/export.md).
void leave_avx512();

}  // namespace irpe_cpu

// The members of a vector type V that only differ by the intrinsics' width W (256 / 512):
// element-wise float ops and scale (y * 2^n for integral n in [-127, 127]; 2^-127 encodes as 0,
// so exp gives 0 there). min(a, b) returns b when either is NaN: exp keeps a NaN.
#define IRPE_SIMD_ELEMENTWISE(W)                                                               \
    static T set1(float v) { return _mm##W##_set1_ps(v); }                                     \
    static T load(const float* p) { return _mm##W##_loadu_ps(p); }                            \
    static void store(float* p, T v) { _mm##W##_storeu_ps(p, v); }                             \
    static T max(T a, T b) { return _mm##W##_max_ps(a, b); }                                   \
    static T min(T a, T b) { return _mm##W##_min_ps(a, b); }                                   \
    static T add(T a, T b) { return _mm##W##_add_ps(a, b); }                                   \
    static T sub(T a, T b) { return _mm##W##_sub_ps(a, b); }                                   \
    static T mul(T a, T b) { return _mm##W##_mul_ps(a, b); }                                   \
    static T fmadd(T a, T b, T c) { return _mm##W##_fmadd_ps(a, b, c); }                      \
    static T fnmadd(T a, T b, T c) { return _mm##W##_fnmadd_ps(a, b, c); }                     \
    static T scale(T y, T n)                                                                   \
    {                                                                                          \
        return _mm##W##_mul_ps(y, _mm##W##_castsi##W##_ps(_mm##W##_slli_epi32(                 \
            _mm##W##_add_epi32(_mm##W##_cvtps_epi32(n), _mm##W##_set1_epi32(127)), 23)));      \
    }

// The entry points above for vector type V, named with suffix ISA (one use per rpe_simd_*.cpp,
// inside namespace irpe_cpu).
#define IRPE_SIMD_ENTRY_POINTS(V, ISA)                                                         \
    void softmax_rows4_##ISA(float* const* x, int64_t n, float* const* out)                    \
    {                                                                                          \
        softmax_rows<V, 4>(x, n, out);                                                         \
    }                                                                                          \
    void softmax_rows1_##ISA(float* const* x, int64_t n, float* const* out)                    \
    {                                                                                          \
        softmax_rows<V, 1>(x, n, out);                                                         \
    }                                                                                          \
    int64_t weight_rows4_##ISA(const float* s, int64_t k, const float* w, int64_t d,           \
                               const float* const* base, float* const* out)                    \
    {                                                                                          \
        return rows_times_weight<V, 4>(s, k, w, d, base, out);                                 \
    }                                                                                          \
    int64_t weight_rows1_##ISA(const float* s, int64_t k, const float* w, int64_t d,           \
                               const float* const* base, float* const* out)                    \
    {                                                                                          \
        return rows_times_weight<V, 1>(s, k, w, d, base, out);                                 \
    }

#endif  // IRPE_CPU_RPE_SIMD_H
