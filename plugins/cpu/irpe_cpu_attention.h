/* C ABI of libirpe_cpu_attention: RPEAttention (rpe_attention.h), the fused iRPE attention
 * block that the ONNX Runtime and OpenVINO libraries run as an op, for callers outside both
 * (PyTorch's CPU inference: irpe/fused/cpu_library.py). float32, one call = one attention of
 * B x H pairs:
 *
 *   logits = scale * q k^T + (scale * q @ wk)[i, idk[i, j]] + (wq @ k^T)[idq[i, j]]
 *   out    = softmax(logits) @ v + (bucket sums of softmax by idv) @ wv
 *
 * q, k, v share element strides (batch, head, row) with d contiguous; out has its own. A term is
 * present when its weight is not NULL; weights are shared by the heads: wk [d, kk], wq [kq, d],
 * wv [kv, d], row-major. The id tables come from irpe_cpu_attention_ids once per shape (the
 * caller keeps them): idk, idq, idv [l, irpe_cpu_attention_pad(l)]. Every function returns
 * IRPE_CPU_OK or IRPE_CPU_ERR (nothing written; irpe_cpu_attention_error() says why, per
 * thread). Results do not depend on `threads`.
 */
#ifndef IRPE_CPU_ATTENTION_H
#define IRPE_CPU_ATTENTION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IRPE_CPU_API __attribute__((visibility("default")))
#define IRPE_CPU_OK 0
#define IRPE_CPU_ERR 1

typedef struct {
    int64_t batch, heads, l, d;
    float scale;
    const float *q, *k, *v;
    int64_t in_stride[3];  /* batch, head, row */
    float* out;
    int64_t out_stride[3];
    int64_t kk;
    const float* wk;
    const int32_t* idk;
    int64_t kq;
    const float* wq;
    const int32_t* idq;
    int64_t kv;
    const float* wv;
    const int32_t* idv;
} irpe_cpu_attention_args;

/* Row length of the padded id tables: l rounded up to 16. */
IRPE_CPU_API int64_t irpe_cpu_attention_pad(int64_t l);
/* [l, l] int64 ids -> out [l, pad(l)]: kind 0 (K: ids into the query's table row, -1 outside
 * [0, k)), kind 1 (Q: bucket-major c * l + j, in [0, k * l)), kind 2 (V: buckets, k outside). */
IRPE_CPU_API int irpe_cpu_attention_ids(int kind, const int64_t* ids, int64_t l, int64_t k,
                                        int32_t* out);
/* One attention on `threads` threads (< 1: the CPU's); the calling thread is one of them. */
IRPE_CPU_API int irpe_cpu_attention(const irpe_cpu_attention_args* args, int threads);
IRPE_CPU_API const char* irpe_cpu_attention_error(void);
/* The vector code in use: "avx512", "avx2" or "portable" ($IRPE_ORT_SIMD caps it). */
IRPE_CPU_API const char* irpe_cpu_attention_simd(void);

#ifdef __cplusplus
}
#endif

#endif /* IRPE_CPU_ATTENTION_H */
