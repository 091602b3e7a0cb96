/* The method names of irpe.bucket.Method and their IRPE_METHOD_* ids, in one table shared by the
 * TensorRT plugin fields and the ONNX Runtime op attributes (host code only).
 *
 * Cross is two maps with their own tables: export emits cross_rows and cross_cols separately.
 * tests/test_single_sources.py checks this table against irpe.bucket.METHOD_IDS.
 */
#ifndef IRPE_METHODS_H
#define IRPE_METHODS_H

#include <string.h>

#include "irpe_bucket.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char* name;
    int32_t id;
} irpe_method_name;

static const irpe_method_name IRPE_METHOD_NAMES[] = {
    {"euc", IRPE_METHOD_EUCLIDEAN},   {"quant", IRPE_METHOD_QUANT},
    {"product", IRPE_METHOD_PRODUCT}, {"cross_rows", IRPE_METHOD_CROSS_ROWS},
    {"cross_cols", IRPE_METHOD_CROSS_COLS},
};

/* IRPE_METHOD_* of a method name, -1 if the name is not one of the table's. */
static inline int32_t irpe_method_id(const char* name)
{
    const size_t count = sizeof(IRPE_METHOD_NAMES) / sizeof(IRPE_METHOD_NAMES[0]);
    for (size_t i = 0; i < count; ++i) {
        if (strcmp(name, IRPE_METHOD_NAMES[i].name) == 0) {
            return IRPE_METHOD_NAMES[i].id;
        }
    }
    return -1;
}

#ifdef __cplusplus
}
#endif

#endif /* IRPE_METHODS_H */
