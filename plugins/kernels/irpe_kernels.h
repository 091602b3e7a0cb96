/* C ABI of the iRPE CUDA kernels (libirpe_kernels): bucket gather and deterministic bucket
 * scatter-add, with the bucket ids read from an index tensor or computed on the fly.
 *
 *   gather : out[b,h,i,j] = table[b,h,i,id(i,j)]                  table [B,H,Lq,K] -> [B,H,Lq,Lk]
 *   scatter: out[b,h,i,t] = sum over j with id(i,j)=t of attn[b,h,i,j]   [B,H,Lq,Lk] -> [B,H,Lq,K]
 *
 * Layout: the 4-D input (table or attn) may have any element strides (0 = broadcast B or H);
 * the index [Lq,Lk] and every output are dense row-major. Ids outside [0, K) are ignored: a
 * gather writes 0 there, a scatter drops the value (no out-of-bounds access either way).
 * Scatter accumulates in fp32 and is bitwise deterministic: no atomics, a fixed summation order.
 * Every function is asynchronous on `stream` (a cudaStream_t; NULL = legacy default stream)
 * and returns IRPE_OK, IRPE_ERR_ARGUMENT (nothing launched) or IRPE_ERR_CUDA (launch failed;
 * irpe_last_error() has the CUDA message).
 */
#ifndef IRPE_KERNELS_H
#define IRPE_KERNELS_H

#include <stdint.h>

#include "irpe_bucket.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define IRPE_API __declspec(dllexport)
#else
#define IRPE_API __attribute__((visibility("default")))
#endif

typedef enum { IRPE_FLOAT32 = 0, IRPE_FLOAT16 = 1, IRPE_BFLOAT16 = 2 } irpe_dtype;
typedef enum { IRPE_INT32 = 0, IRPE_INT64 = 1 } irpe_index_dtype;

/* Sizes of one call and the element strides of its 4-D input (b, h, query, last dim). */
typedef struct {
    int64_t batch, heads, lq, lk, num_buckets;
    int64_t stride[4];
} irpe_problem;

/* table [B,H,Lq,K] (strided), index [Lq,Lk] -> out [B,H,Lq,Lk]. */
IRPE_API int irpe_gather(const irpe_problem* problem, irpe_dtype dtype, const void* table,
                         irpe_index_dtype index_dtype, const void* index, void* out,
                         void* stream);

/* attn [B,H,Lq,Lk] (strided), index [Lq,Lk] -> out [B,H,Lq,K]. */
IRPE_API int irpe_scatter(const irpe_problem* problem, irpe_dtype dtype, const void* attn,
                          irpe_index_dtype index_dtype, const void* index, void* out,
                          void* stream);

/* On-the-fly ids from `params` (no index tensor); needs Lq == Lk == skip + H*W. */
IRPE_API int irpe_gather_grid(const irpe_problem* problem, irpe_dtype dtype, const void* table,
                              const irpe_bucket_params* params, void* out, void* stream);
IRPE_API int irpe_scatter_grid(const irpe_problem* problem, irpe_dtype dtype, const void* attn,
                               const irpe_bucket_params* params, void* out, void* stream);

/* Fill out [(skip+H*W)^2] int32 with the ids on the device (same math as *_grid). */
IRPE_API int irpe_bucket_ids_device(const irpe_bucket_params* params, int32_t* out, void* stream);

/* Host code (bucket_host.c, also built alone as the host test library): the exported form
 * of irpe_bucket_params_init, and the id table computed on the CPU with the same math. */
IRPE_API int irpe_make_bucket_params(irpe_bucket_params* out, int method, double ratio,
                                     int64_t height, int64_t width, int64_t skip);
IRPE_API int irpe_bucket_ids_host(const irpe_bucket_params* params, int32_t* out);

/* CUDA devices visible to this library, or -1 when the runtime reports an error (no driver). */
IRPE_API int irpe_device_count(void);

/* Message of the last IRPE_ERR_CUDA on this thread ("" if none). */
IRPE_API const char* irpe_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* IRPE_KERNELS_H */
