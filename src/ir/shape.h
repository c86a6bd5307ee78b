// SPDX-License-Identifier: Apache-2.0
// Shape and dtype inference, one function for every op, over per-dimension [min, max] ranges.
// The builder runs it over the ranges of a dynamic graph; the runtime runs the same code with
// min == max on the actual input shapes, so build-time and run-time shapes cannot disagree.
#ifndef KILN_IR_SHAPE_H
#define KILN_IR_SHAPE_H

#include <stdint.h>

#include "core/ops.h"
#include "kiln/kiln.h"

// Largest dimension kiln_infer accepts or produces (2^40), and the bound on size-like attribute
// values (kernel, stride, padding, dilation, reshape literals): keeps every intermediate of the
// shape formulas inside int64. Larger values are KILN_ERR_UNSUPPORTED.
#define KILN_SHAPE_MAX_DIM (INT64_C(1) << 40)

typedef struct kiln_shape {
    uint32_t rank;
    int64_t min[KILN_MAX_RANK];
    int64_t max[KILN_MAX_RANK];
} kiln_shape;

typedef struct kiln_value_desc {
    uint32_t dtype; // kiln_dtype
    kiln_shape shape;
} kiln_value_desc;

// Infers the output of one node of `op`. inputs[i] is NULL for an absent optional input.
// Validates arity, dtypes, ranks, dimension agreement and attribute values (axis ranges,
// kernel sizes, ...); failures return KILN_ERR_UNSUPPORTED or KILN_ERR_SHAPE with a message
// naming the op, the input or attribute and the values (KILN_ERR_INVALID_ARG for malformed
// arguments: wrong input count, an absent required input, attribute kinds or counts that do not
// match the schema, an invalid input descriptor). Rules: docs/builder.md. `what` names the node in
// messages (e.g. "node 12 (linear)"), may be NULL.
kiln_status kiln_infer(uint32_t op, const kiln_attrs *attrs, const kiln_value_desc *const *inputs,
                       uint32_t n_inputs, const char *what, kiln_value_desc *out);

// Number of elements at the largest shape (false on overflow or a negative dimension).
bool kiln_shape_max_numel(const kiln_shape *s, uint64_t *out);
// A concrete shape (min == max) from dims.
void kiln_shape_from_dims(kiln_shape *s, uint32_t rank, const int64_t *dims);

#endif // KILN_IR_SHAPE_H
