/* Follows the code of microsoft/Cream iRPE (MIT): see NOTICE. */
/* iRPE bucket-id math, compiled unchanged for the GPU (nvcc) and the host (gcc, g++).
 *
 * Mirrors irpe/bucket.py bit for bit: the official code evaluates the piecewise index in
 * float32 with every Python scalar (alpha, beta, ln(gamma/alpha), beta-alpha) cast to float32,
 * one rounding per operation, torch.round = round half to even (rintf), the clip at beta after
 * rounding and a truncating int cast. Device code therefore uses the *_rn intrinsics (never
 * contracted into FMA); host builds must pass -ffp-contract=off for the same reason.
 *
 * Valid C99, C++ and CUDA. Nothing here allocates or launches anything.
 */
#ifndef IRPE_BUCKET_H
#define IRPE_BUCKET_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define IRPE_HD __host__ __device__ __forceinline__
#else
#define IRPE_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes returned by every C entry point of the kernels library. */
enum { IRPE_OK = 0, IRPE_ERR_ARGUMENT = 1, IRPE_ERR_CUDA = 2 };

/* Method ids: the numeric ids of the official METHOD class (irpe.bucket._ALIASES). CROSS (4)
 * is two independent maps with their own tables: use CROSS_ROWS and CROSS_COLS. */
enum {
    IRPE_METHOD_EUCLIDEAN = 0,
    IRPE_METHOD_QUANT = 1,
    IRPE_METHOD_PRODUCT = 3,
    IRPE_METHOD_CROSS_ROWS = 41,
    IRPE_METHOD_CROSS_COLS = 42
};

/* Everything the id of a (query, key) pair depends on; fill with irpe_bucket_params_init. */
typedef struct {
    int32_t method;      /* IRPE_METHOD_* */
    int32_t height;      /* grid rows H */
    int32_t width;       /* grid cols W */
    int32_t skip;        /* leading non-grid tokens (cls); they all share the extra bucket */
    int32_t beta_int;    /* int(2 * ratio) */
    int32_t extra;       /* id of the skip bucket = buckets without skip */
    int32_t num_buckets; /* buckets allocated: extra + (skip > 0) */
    float alpha;         /* float32(1 * ratio) */
    float beta;          /* float32(2 * ratio), the clip value */
    float log_ratio;     /* float32(ln(gamma / alpha)) computed in double, as math.log does */
    float span;          /* float32(beta - alpha) computed in double */
} irpe_bucket_params;

/* One rounding per operation, never fused: the official code runs these as separate ops. */
IRPE_HD float irpe_fdiv(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

IRPE_HD float irpe_fmul(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

IRPE_HD float irpe_fadd(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

/* Piecewise index of an integer-valued x (Eq. 18): x itself within alpha, else
 * sign(x) * int(min(beta, round(alpha + ln(|x|/alpha) / ln(gamma/alpha) * (beta - alpha)))). */
IRPE_HD int32_t irpe_piecewise(float x, const irpe_bucket_params* p)
{
    const float ax = fabsf(x);
    if (!(ax > p->alpha)) {
        return (int32_t)x;
    }
    const float ln = logf(irpe_fdiv(ax, p->alpha));
    const float y = irpe_fadd(p->alpha, irpe_fmul(irpe_fdiv(ln, p->log_ratio), p->span));
    const int32_t v = (int32_t)fminf(rintf(y), p->beta);
    return x < 0.0f ? -v : v;
}

/* Bucket id of query token i and key token j (token order: skip tokens, then the grid
 * row-major). Returns -1 for an unknown method (irpe_bucket_params_init rejects those). */
IRPE_HD int32_t irpe_bucket_id(const irpe_bucket_params* p, int64_t i, int64_t j)
{
    if (i < p->skip || j < p->skip) {
        return p->extra;
    }
    const int32_t qi = (int32_t)(i - p->skip), kj = (int32_t)(j - p->skip);
    const int32_t dr = qi / p->width - kj / p->width;
    const int32_t dc = qi % p->width - kj % p->width;
    const int64_t sq = (int64_t)dr * dr + (int64_t)dc * dc;
    const int32_t b = p->beta_int;
    switch (p->method) {
    case IRPE_METHOD_PRODUCT:
        return (irpe_piecewise((float)dr, p) + b) * (2 * b + 1) + irpe_piecewise((float)dc, p) + b;
    case IRPE_METHOD_EUCLIDEAN:
        return irpe_piecewise(rintf(sqrtf((float)sq)), p) + b;
    case IRPE_METHOD_QUANT: /* squared distance, no sqrt: the official code does this */
        return irpe_piecewise((float)sq, p) + b;
    case IRPE_METHOD_CROSS_ROWS:
        return irpe_piecewise((float)dr, p) + b;
    case IRPE_METHOD_CROSS_COLS:
        return irpe_piecewise((float)dc, p) + b;
    default:
        return -1;
    }
}

/* Host only: derive the float32 coefficients from ratio the way irpe.bucket.coefficients and
 * the float32 tensor ops do. Returns IRPE_ERR_ARGUMENT for a bad method, ratio or grid. */
static inline int irpe_bucket_params_init(irpe_bucket_params* p, int method, double ratio,
                                          int64_t height, int64_t width, int64_t skip)
{
    const double alpha = 1.0 * ratio, beta = 2.0 * ratio, gamma = 8.0 * ratio;
    const int known = method == IRPE_METHOD_EUCLIDEAN || method == IRPE_METHOD_QUANT ||
                      method == IRPE_METHOD_PRODUCT || method == IRPE_METHOD_CROSS_ROWS ||
                      method == IRPE_METHOD_CROSS_COLS;
    if (!p || !known || !(ratio > 0.0) || beta >= 1e6 || height < 1 || width < 1 || skip < 0 ||
        (height * width + skip) > INT32_MAX) {
        return IRPE_ERR_ARGUMENT;
    }
    p->method = method;
    p->height = (int32_t)height;
    p->width = (int32_t)width;
    p->skip = (int32_t)skip;
    p->beta_int = (int32_t)beta;
    p->extra = method == IRPE_METHOD_PRODUCT ? (2 * p->beta_int + 1) * (2 * p->beta_int + 1)
                                             : 2 * p->beta_int + 1;
    p->num_buckets = p->extra + (skip > 0 ? 1 : 0);
    p->alpha = (float)alpha;
    p->beta = (float)beta;
    p->log_ratio = (float)log(gamma / alpha);
    p->span = (float)(beta - alpha);
    return IRPE_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* IRPE_BUCKET_H */
