// SPDX-License-Identifier: Apache-2.0
// What a backend kernel receives for one layer: bound tensors (data pointer, dtype, concrete
// shape), the layer's attributes and its fused elementwise tail. Shapes were inferred and
// checked before the call (execute runs blind, per the loader's validation).
#ifndef KILN_RUNTIME_KERNEL_H
#define KILN_RUNTIME_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "kiln/kiln.h"

// Tensors are dense and contiguous (row-major, last dimension fastest).
typedef struct kiln_tensor {
    void *data;
    uint32_t dtype; // kiln_dtype
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
} kiln_tensor;

static inline int64_t kiln_tensor_numel(const kiln_tensor *t) {
    int64_t n = 1;
    for (uint32_t i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

// One fused elementwise op applied to the head's output y, in place:
//   unary:  y = op(y)
//   binary: y = op(y, operand) if running_is_lhs else op(operand, y); operand broadcasts to y.
typedef struct kiln_tail_op {
    uint32_t op;
    kiln_attrs attrs;
    const kiln_tensor *operand; // NULL for unary ops
    int running_is_lhs;
} kiln_tail_op;

#define KILN_MAX_TAIL 8

typedef struct kiln_kernel_args {
    uint32_t op;
    kiln_attrs attrs;
    const kiln_tensor *in[KILN_MAX_INPUTS]; // NULL for an absent optional input
    uint32_t n_in;
    kiln_tensor *out;
    const kiln_tail_op *tail; // applied after the op, in order (n_tail may be 0)
    uint32_t n_tail;
    void *scratch; // backend scratch, scratch_nbytes as the backend asked at load
    size_t scratch_nbytes;
} kiln_kernel_args;

#endif // KILN_RUNTIME_KERNEL_H
