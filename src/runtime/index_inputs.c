// SPDX-License-Identifier: Apache-2.0
// Token ids checked before an execute (index_inputs.h).
#include "runtime/index_inputs.h"

#include <inttypes.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/status.h"

// The input binding whose values tensor t holds, every one of them (t itself, or t through views
// that keep every value); UINT32_MAX when there is none.
static uint32_t input_of(const kiln_plan *p, int32_t t) {
    for (uint32_t hops = 0; t >= 0 && hops < p->n_layers; hops++) {
        if (p->tensors[t].kind == KILN_TENSOR_INPUT) return kiln_plan_input_index(p, (uint32_t)t);
        int32_t from = -1;
        for (uint32_t li = 0; li < p->n_layers && from < 0; li++) {
            const kiln_plan_layer *l = &p->layers[li];
            if (l->n_outputs != 1 || p->ids[l->output_begin] != t || l->n_inputs < 1) continue;
            switch (l->op) {
            case KILN_OP_RESHAPE:
            case KILN_OP_SQUEEZE:
            case KILN_OP_UNSQUEEZE:
            case KILN_OP_EXPAND:
            case KILN_OP_PERMUTE: from = p->ids[l->input_begin]; break;
            default: return UINT32_MAX;
            }
        }
        t = from;
    }
    return UINT32_MAX;
}

kiln_status kiln_index_inputs_find(const kiln_plan *p, kiln_index_input **out, uint32_t *n) {
    uint32_t count = 0;
    *out = NULL;
    *n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t li = 0; li < p->n_layers; li++) {
            const kiln_plan_layer *l = &p->layers[li];
            if (l->op != KILN_OP_EMBEDDING || l->n_inputs < 2) continue;
            const int32_t w = p->ids[l->input_begin], ix = p->ids[l->input_begin + 1];
            if (w < 0 || ix < 0 || p->tensors[w].shape.rank != 2 ||
                p->tensors[w].shape.min[0] != p->tensors[w].shape.max[0] ||
                (p->tensors[ix].dtype != KILN_DTYPE_I32 && p->tensors[ix].dtype != KILN_DTYPE_I64))
                continue;
            const uint32_t input = input_of(p, ix);
            if (input == UINT32_MAX) continue;
            const uint32_t dt = p->tensors[p->inputs[input]].dtype;
            if (dt != KILN_DTYPE_I32 && dt != KILN_DTYPE_I64) continue;
            if (pass == 1) {
                kiln_index_input *x = &(*out)[count];
                x->input = input;
                x->table = (uint32_t)w;
                x->rows = p->tensors[w].shape.max[0];
                x->layer = li;
            }
            count++;
        }
        if (pass == 0) {
            if (count == 0) return KILN_OK;
            *out = kiln_calloc(count * sizeof **out, KILN_ALIGN);
            KILN_CHECK(*out != NULL, KILN_ERR_NO_MEMORY, "out of memory (index input records)");
            *n = count;
            count = 0;
        }
    }
    return KILN_OK;
}

void kiln_index_inputs_free(kiln_index_input *x, uint32_t n) {
    if (x != NULL) kiln_free(x, n * sizeof *x);
}

kiln_status kiln_index_inputs_check(const kiln_plan *p, const kiln_index_input *x, uint32_t n,
                                    const void *const *in_data, const int64_t *in_numel) {
    for (uint32_t k = 0; k < n; k++) {
        const kiln_index_input *r = &x[k];
        const void *data = in_data[r->input];
        if (data == NULL) continue;
        const uint32_t dt = p->tensors[p->inputs[r->input]].dtype;
        for (int64_t i = 0; i < in_numel[r->input]; i++) {
            const int64_t v = kiln_load_i64(data, dt, i);
            KILN_CHECK(v >= 0 && v < r->rows, KILN_ERR_INVALID_ARG,
                       "input %u '%s': index %" PRId64 " (element %" PRId64 ") is out of range "
                       "[0, %" PRId64 ") for the embedding '%s' (a token id outside the "
                       "vocabulary of %" PRId64 " rows); nothing ran",
                       r->input, kiln_plan_tensor_name(p, p->inputs[r->input]), v, i, r->rows,
                       kiln_plan_tensor_name(p, r->table), r->rows);
        }
    }
    return KILN_OK;
}
