// SPDX-License-Identifier: Apache-2.0
// embedding: weight[V, D] gathered by integer indices of any shape -> [..., D]. Indices are data,
// not validated at load: every index is checked against [0, V) before anything is written, and
// an out-of-range one fails with KILN_ERR_INVALID_ARG (never a read out of bounds).
#include <string.h>

#include "cpu/cpu_internal.h"

#define CHUNK 256

size_t kiln_cpu_embedding_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_embedding(const kiln_kernel_args *args) {
    const kiln_tensor *w = args->in[0], *ix = args->in[1];
    kiln_tensor *y = args->out;
    KILN_CHECK(w->rank == 2, KILN_ERR_INVALID_ARG, "cpu embedding: weight must be [V, D] (rank %u)",
               w->rank);
    KILN_CHECK(ix->dtype == KILN_DTYPE_I32 || ix->dtype == KILN_DTYPE_I64, KILN_ERR_INVALID_ARG,
               "cpu embedding: indices must be int32 or int64, not %s",
               kiln_dtype_name((kiln_dtype)ix->dtype));
    int64_t v = w->dims[0], d = w->dims[1], n = kiln_tensor_numel(ix);
    KILN_CHECK(kiln_tensor_numel(y) == n * d, KILN_ERR_INVALID_ARG,
               "cpu embedding: output has %lld elements, expected %lld x %lld",
               (long long)kiln_tensor_numel(y), (long long)n, (long long)d);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = kiln_load_i64(ix->data, ix->dtype, i);
        KILN_CHECK(id >= 0 && id < v, KILN_ERR_INVALID_ARG,
                   "embedding: index %lld at position %lld is out of range [0, %lld); indices "
                   "must be valid rows of the weight",
                   (long long)id, (long long)i, (long long)v);
    }
    size_t es = kiln_dtype_size((kiln_dtype)w->dtype);
    float buf[CHUNK];
    for (int64_t i = 0; i < n; i++) {
        int64_t id = kiln_load_i64(ix->data, ix->dtype, i);
        if (w->dtype == y->dtype) {
            memcpy((uint8_t *)y->data + (size_t)(i * d) * es,
                   (const uint8_t *)w->data + (size_t)(id * d) * es, (size_t)d * es);
            continue;
        }
        for (int64_t j = 0; j < d; j += CHUNK) {
            int64_t m = d - j < CHUNK ? d - j : CHUNK;
            kiln_cpu_load_f32(w->data, w->dtype, id * d + j, 1, m, buf);
            kiln_cpu_store_f32(y->data, y->dtype, i * d + j, m, buf);
        }
    }
    return KILN_OK;
}
