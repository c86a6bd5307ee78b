// SPDX-License-Identifier: Apache-2.0
// The written rows of the states (state_rows.h): a bit per row along the written dim, reference
// counted so that contexts sharing a state share its record.
#include "runtime/state_rows.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/status.h"

struct kiln_state_rows {
    atomic_uint refs;
    atomic_int off; // 1: a context sharing the state writes it unrecorded; no longer checked
    int64_t n_rows;
    size_t nbytes; // of this allocation
    uint64_t bits[];
};

// Whether state tensor st reaches the keys or values of an sdpa through views, casts and copies
// (a KV cache: attention reads every row below the query's position).
static int read_by_attention(const kiln_plan *p, int32_t st) {
    uint8_t *in_set = kiln_calloc(p->n_tensors + 1, KILN_ALIGN);
    int found = 0;
    if (in_set == NULL) return 0;
    in_set[st] = 1;
    for (uint32_t li = 0; li < p->n_layers && !found; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        const int32_t x = l->n_inputs > 0 ? p->ids[l->input_begin] : -1;
        switch (l->op) {
        case KILN_OP_SDPA:
            for (uint32_t j = 1; j < 3 && j < l->n_inputs; j++) {
                const int32_t t = p->ids[l->input_begin + j];
                found |= t >= 0 && in_set[t];
            }
            break;
        case KILN_OP_RESHAPE:
        case KILN_OP_EXPAND:
        case KILN_OP_PERMUTE:
        case KILN_OP_SLICE:
        case KILN_OP_SELECT:
        case KILN_OP_SQUEEZE:
        case KILN_OP_UNSQUEEZE:
        case KILN_OP_CAST:
        case KILN_OP_COPY:
            if (x >= 0 && in_set[x] && l->n_outputs == 1 && p->ids[l->output_begin] >= 0) {
                in_set[p->ids[l->output_begin]] = 1;
            }
            break;
        default: break;
        }
    }
    kiln_free(in_set, p->n_tensors + 1);
    return found;
}

kiln_status kiln_row_writes_find(const kiln_plan *p, kiln_row_write **out, uint32_t *n) {
    uint32_t count = 0;
    *out = NULL;
    *n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t li = 0; li < p->n_layers; li++) {
            const kiln_plan_layer *l = &p->layers[li];
            if (l->op != KILN_OP_INDEX_COPY || l->n_inputs < 3 || l->n_outputs != 1) continue;
            const int32_t st = p->ids[l->output_begin], idx = p->ids[l->input_begin + 1];
            if (st < 0 || idx < 0 || p->tensors[st].kind != KILN_TENSOR_STATE ||
                p->ids[l->input_begin] != st || p->tensors[idx].kind != KILN_TENSOR_INPUT) {
                continue;
            }
            const uint32_t input = kiln_plan_input_index(p, (uint32_t)idx);
            const kiln_attrs a = kiln_plan_layer_attrs(p, l);
            const kiln_shape *s = &p->tensors[st].shape;
            int64_t dim = kiln_attrs_int(&a, KILN_A_INDEX_COPY_DIM, 0);
            if (dim < 0) dim += s->rank;
            // A state that starts with data of its own (not zeros) or that another layer also
            // writes has rows this record could not know of: not guarded.
            const kiln_plan_tensor *stt = &p->tensors[st];
            int other_writer = 0;
            for (uint32_t lj = 0; lj < p->n_layers && !other_writer; lj++) {
                const kiln_plan_layer *m = &p->layers[lj];
                if (lj == li) continue;
                for (uint32_t o = 0; o < m->n_outputs; o++) {
                    other_writer |= p->ids[m->output_begin + o] == st;
                }
            }
            if (input == UINT32_MAX || dim < 0 || dim >= (int64_t)s->rank ||
                s->min[dim] != s->max[dim] || stt->key != KILN_NO_KEY ||
                stt->offset != KILN_STATE_ZERO || other_writer) {
                continue;
            }
            if (pass == 1) {
                kiln_row_write *w = &(*out)[count];
                w->input = input;
                w->state = (uint32_t)st;
                w->dim = (uint32_t)dim;
                w->rows = s->max[dim];
                w->wrap = kiln_attrs_int(&a, KILN_A_INDEX_COPY_WRAP, 0) != 0;
                w->cache = read_by_attention(p, st);
                w->layer = li;
            }
            count++;
        }
        if (pass == 0) {
            if (count == 0) return KILN_OK;
            *out = kiln_calloc(count * sizeof **out, KILN_ALIGN);
            KILN_CHECK(*out != NULL, KILN_ERR_NO_MEMORY, "out of memory (state row records)");
            *n = count;
            count = 0;
        }
    }
    return KILN_OK;
}

void kiln_row_writes_free(kiln_row_write *w, uint32_t n) {
    if (w != NULL) kiln_free(w, n * sizeof *w);
}

static kiln_state_rows *rows_new(int64_t n_rows) {
    const size_t nbytes = sizeof(kiln_state_rows) + (size_t)((n_rows + 63) / 64) * sizeof(uint64_t);
    kiln_state_rows *r = kiln_calloc(nbytes, KILN_ALIGN);
    if (r == NULL) return NULL;
    atomic_init(&r->refs, 1);
    atomic_init(&r->off, 0);
    r->n_rows = n_rows;
    r->nbytes = nbytes;
    return r;
}

static void rows_release(kiln_state_rows *r) {
    if (r != NULL && atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) {
        kiln_free(r, r->nbytes);
    }
}

kiln_status kiln_state_rows_new(const kiln_plan *p, const kiln_row_write *w, uint32_t n,
                                kiln_state_rows ***out) {
    *out = NULL;
    if (n == 0) return KILN_OK;
    kiln_state_rows **rows = kiln_calloc(p->n_tensors * sizeof *rows, KILN_ALIGN);
    KILN_CHECK(rows != NULL, KILN_ERR_NO_MEMORY, "out of memory (state row records)");
    for (uint32_t k = 0; k < n; k++) {
        if (rows[w[k].state] != NULL) continue;
        rows[w[k].state] = rows_new(w[k].rows);
        if (rows[w[k].state] == NULL) {
            kiln_state_rows_free(p, rows);
            return kiln_fail(KILN_ERR_NO_MEMORY, "out of memory (state row records)");
        }
    }
    *out = rows;
    return KILN_OK;
}

void kiln_state_rows_free(const kiln_plan *p, kiln_state_rows **rows) {
    if (rows == NULL) return;
    for (uint32_t t = 0; t < p->n_tensors; t++) rows_release(rows[t]);
    kiln_free(rows, p->n_tensors * sizeof *rows);
}

// The row a position names (negative ones from the end, with wrap).
static int64_t row_of(const kiln_row_write *g, int64_t q) {
    return g->wrap && q < 0 ? q + g->rows : q;
}

// The host positions of write g and its record, or NULL when this call is not checked
// (positions in device memory, a state without a record, positions of another dtype).
static const void *write_of(const kiln_plan *p, const kiln_row_write *g,
                            kiln_state_rows *const *rows, const void *const *in_data, uint32_t *dt,
                            kiln_state_rows **r) {
    *dt = p->tensors[p->inputs[g->input]].dtype;
    *r = rows != NULL ? rows[g->state] : NULL;
    if (*r == NULL || (*dt != KILN_DTYPE_I32 && *dt != KILN_DTYPE_I64)) return NULL;
    return in_data[g->input];
}

static int bit(const kiln_state_rows *r, int64_t row) {
    return (int)((r->bits[row / 64] >> (row % 64)) & 1u);
}

kiln_status kiln_state_rows_check(const kiln_plan *p, const kiln_row_write *w, uint32_t n,
                                  kiln_state_rows *const *rows, const void *const *in_data,
                                  const int64_t *in_numel, int gaps) {
    for (uint32_t k = 0; k < n; k++) {
        const kiln_row_write *g = &w[k];
        uint32_t dt;
        kiln_state_rows *r;
        const void *data = write_of(p, g, rows, in_data, &dt, &r);
        if (data == NULL) continue;
        const int64_t m = in_numel[g->input];
        int64_t hi = -1;
        for (int64_t i = 0; i < m; i++) {
            const int64_t q = kiln_load_i64(data, dt, i), v = row_of(g, q);
            KILN_CHECK(v >= 0 && v < g->rows, KILN_ERR_INVALID_ARG,
                       "input %u '%s': index %" PRId64 " (element %" PRId64 ") is out of range "
                       "for the cache '%s' of %" PRId64 " rows along dim %u (a position past the "
                       "end of the cache: valid positions are 0..%" PRId64 "%s); nothing was "
                       "written",
                       g->input, kiln_plan_tensor_name(p, p->inputs[g->input]), q, i,
                       kiln_plan_tensor_name(p, g->state), g->rows, g->dim, g->rows - 1,
                       g->wrap ? ", or negative from the end" : "");
            if (v > hi) hi = v;
        }
        // A KV cache: every row below the highest position must be written, before or by this
        // call (attention reads them).
        for (int64_t row = 0; gaps && g->cache && row < hi && !atomic_load(&r->off); row++) {
            if (bit(r, row)) continue;
            int here = 0;
            for (int64_t i = 0; i < m && !here; i++)
                here = row_of(g, kiln_load_i64(data, dt, i)) == row;
            KILN_CHECK(here, KILN_ERR_INVALID_ARG,
                       "input %u '%s': position %" PRId64 " would leave row %" PRId64
                       " of the cache '%s' unwritten (no call of this context, or of the "
                       "contexts sharing its states, has written it since the load or the last "
                       "reset): a decode before its prefill? Write the positions from 0 first "
                       "(run the prefill); nothing was written",
                       g->input, kiln_plan_tensor_name(p, p->inputs[g->input]), hi, row,
                       kiln_plan_tensor_name(p, g->state));
        }
    }
    return KILN_OK;
}

void kiln_state_rows_commit(const kiln_plan *p, const kiln_row_write *w, uint32_t n,
                            kiln_state_rows *const *rows, const void *const *in_data,
                            const int64_t *in_numel) {
    for (uint32_t k = 0; k < n; k++) {
        const kiln_row_write *g = &w[k];
        uint32_t dt;
        kiln_state_rows *r;
        const void *data = write_of(p, g, rows, in_data, &dt, &r);
        if (data == NULL) continue;
        for (int64_t i = 0; i < in_numel[g->input]; i++) {
            const int64_t v = row_of(g, kiln_load_i64(data, dt, i));
            if (v >= 0 && v < r->n_rows) r->bits[v / 64] |= (uint64_t)1 << (v % 64);
        }
    }
}

void kiln_state_rows_clear(const kiln_plan *p, kiln_state_rows *const *rows) {
    if (rows == NULL) return;
    for (uint32_t t = 0; t < p->n_tensors; t++) {
        kiln_state_rows *r = rows[t];
        if (r != NULL) memset(r->bits, 0, (size_t)((r->n_rows + 63) / 64) * sizeof(uint64_t));
    }
}

static int plan_writes(const kiln_plan *p, uint32_t t) {
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        for (uint32_t o = 0; o < l->n_outputs; o++) {
            if (p->ids[l->output_begin + o] == (int32_t)t) return 1;
        }
    }
    return 0;
}

kiln_status kiln_state_rows_share(const kiln_plan *p, kiln_state_rows **rows,
                                  const kiln_plan *owner_p, kiln_state_rows **owner_rows,
                                  const uint32_t *map) {
    (void)owner_p;
    for (uint32_t t = 0; t < p->n_tensors; t++) {
        if (map[t] == UINT32_MAX) continue;
        kiln_state_rows *shared = owner_rows != NULL ? owner_rows[map[t]] : NULL;
        kiln_state_rows *mine = rows != NULL ? rows[t] : NULL;
        if (mine == NULL) {
            // This engine writes the state at positions no record sees: the owner's record
            // (if any) can no longer be trusted.
            if (shared != NULL && plan_writes(p, t)) atomic_store(&shared->off, 1);
            continue;
        }
        if (shared != NULL) atomic_fetch_add_explicit(&shared->refs, 1, memory_order_relaxed);
        // An owner that keeps no record of the state may write it in ways no record sees (at
        // positions it computes): the state is no longer checked here.
        rows_release(mine);
        rows[t] = shared;
    }
    return KILN_OK;
}
