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

// Element strides of t broadcast to the dims of x (right-aligned; 0 along a broadcast dim) into
// str[x->rank]; 0 when t does not broadcast to x (a dim neither 1 nor x's, or a higher rank).
static inline int kiln_broadcast_strides(const kiln_tensor *t, const kiln_tensor *x, int64_t *str) {
    int64_t s = 1;
    if (t->rank > x->rank) return 0;
    for (uint32_t k = x->rank; k-- > 0;) {
        uint32_t back = x->rank - 1 - k;
        if (back < t->rank) {
            int64_t dim = t->dims[t->rank - 1 - back];
            if (dim != 1 && dim != x->dims[k]) return 0;
            str[k] = dim == 1 ? 0 : s;
            s *= dim;
        } else {
            str[k] = 0;
        }
    }
    return 1;
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
