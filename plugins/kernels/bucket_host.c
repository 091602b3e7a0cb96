/* Follows the code of microsoft/Cream iRPE (MIT): see NOTICE. */
/* Host-side entry points of the bucket math (plain C, no CUDA needed).
 *
 * Built into libirpe_kernels and, alone, into the small host library that the CPU tests load
 * with ctypes to compare these ids with irpe.bucket.bucket_ids. Compile with
 * -ffp-contract=off so the float32 formula is rounded exactly like the official code. */
#include "irpe_kernels.h"

int irpe_make_bucket_params(irpe_bucket_params* out, int method, double ratio, int64_t height,
                            int64_t width, int64_t skip)
{
    return irpe_bucket_params_init(out, method, ratio, height, width, skip);
}

int irpe_bucket_ids_host(const irpe_bucket_params* params, int32_t* out)
{
    if (!params || !out || params->width < 1 || params->height < 1) {
        return IRPE_ERR_ARGUMENT;
    }
    const int64_t n = (int64_t)params->skip + (int64_t)params->height * params->width;
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            out[i * n + j] = irpe_bucket_id(params, i, j);
        }
    }
    return IRPE_OK;
}
