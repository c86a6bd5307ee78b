// SPDX-License-Identifier: Apache-2.0
// Token ids checked before an execute: an embedding whose indices are an input binding (directly
// or through views that keep every value: reshape, squeeze, unsqueeze, expand, permute). Before
// each execute whose index input is in host memory, the runtime checks every value against the
// table's rows on every backend: a token id outside the vocabulary is KILN_ERR_INVALID_ARG naming
// the input, the id, its element and the table's size, and nothing runs (the CUDA kernels would
// write zeros for it; the CPU kernel refuses it after the layers before it ran). Indices in
// device memory are not read (no synchronization is added to an execute): such calls are not
// checked.
#ifndef KILN_RUNTIME_INDEX_INPUTS_H
#define KILN_RUNTIME_INDEX_INPUTS_H

#include <stdint.h>

#include "kiln/kiln.h"
#include "runtime/plan.h"

// One checked index input of an engine (found in its plan at load).
typedef struct kiln_index_input {
    uint32_t input; // the input binding holding the indices (int32 or int64)
    uint32_t table; // the table tensor (the embedding's weight)
    int64_t rows;   // the table's rows
    uint32_t layer; // the embedding layer
} kiln_index_input;

// The checked index inputs of a plan (*out NULL and *n 0 when there are none).
kiln_status kiln_index_inputs_find(const kiln_plan *p, kiln_index_input **out, uint32_t *n);
void kiln_index_inputs_free(kiln_index_input *x, uint32_t n);

// Checks one execute: in_data[i] is input i's host data (NULL: in device memory, not checked),
// in_numel[i] its element count.
kiln_status kiln_index_inputs_check(const kiln_plan *p, const kiln_index_input *x, uint32_t n,
                                    const void *const *in_data, const int64_t *in_numel);

#endif // KILN_RUNTIME_INDEX_INPUTS_H
