// SPDX-License-Identifier: Apache-2.0
// Common-subexpression elimination: a live node with the same op, the same inputs (value ids)
// and the same attributes as an earlier live node computes the same value, so its readers read
// the earlier node's output and it dies. Every op of the graph is a pure function of its inputs
// (a state's update is a value like any other), so no op is excluded. What repeats in real
// models: per-layer views of one shared tensor (the rotary tables unsqueezed in every decoder
// layer, a mask broadcast for every attention), and casts or comparisons of the same input.
// A node whose output is a graph output or a state's update is kept (the output tables name it).
// One pass in index order (a topological order after kiln_bgraph_sort_nodes): a node's inputs
// are renamed before it is looked up, so chains of equal nodes collapse at once.
#include <stdlib.h>
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + UINT64_C(0x9e3779b97f4a7c15) + (h << 6) + (h >> 2);
    return h;
}

static uint64_t node_hash(const kiln_bgraph *b, const kiln_bnode *n) {
    uint64_t h = mix(UINT64_C(0xcbf29ce484222325), n->op);
    const int32_t *in = kiln_bgraph_inputs(b, n);
    for (uint32_t i = 0; i < n->n_inputs; i++) h = mix(h, (uint64_t)(int64_t)in[i]);
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    for (uint32_t i = 0; i < a.n_attrs; i++) {
        const kiln_attr_ref *r = &a.refs[i];
        h = mix(h, ((uint64_t)r->kind << 32) | r->n);
        for (uint32_t j = 0; j < r->n; j++) {
            uint64_t bits;
            if (r->kind == KILN_ATTR_FLOATS) {
                memcpy(&bits, &a.floats[r->begin + j], sizeof bits);
            } else {
                bits = (uint64_t)a.ints[r->begin + j];
            }
            h = mix(h, bits);
        }
    }
    return h;
}

static int same_node(const kiln_bgraph *b, const kiln_bnode *x, const kiln_bnode *y) {
    if (x->op != y->op || x->n_inputs != y->n_inputs) return 0;
    if (memcmp(kiln_bgraph_inputs(b, x), kiln_bgraph_inputs(b, y), x->n_inputs * sizeof(int32_t)) !=
        0)
        return 0;
    kiln_attrs ax = kiln_bgraph_attrs(b, x), ay = kiln_bgraph_attrs(b, y);
    if (ax.n_attrs != ay.n_attrs) return 0;
    for (uint32_t i = 0; i < ax.n_attrs; i++) {
        const kiln_attr_ref *rx = &ax.refs[i], *ry = &ay.refs[i];
        if (rx->kind != ry->kind || rx->n != ry->n) return 0;
        if (rx->n == 0) continue;
        if (rx->kind == KILN_ATTR_FLOATS) {
            if (memcmp(ax.floats + rx->begin, ay.floats + ry->begin, rx->n * sizeof(double)) != 0)
                return 0;
        } else if (memcmp(ax.ints + rx->begin, ay.ints + ry->begin, rx->n * sizeof(int64_t)) != 0) {
            return 0;
        }
    }
    return kiln_desc_equal(&b->values[x->output].desc, &b->values[y->output].desc);
}

// A constant as merge_constants orders them: runs of equal size, dtype and shape are the
// candidates for equal content.
typedef struct const_ref {
    uint64_t nbytes;
    uint32_t dtype;
    int32_t id;
    const kiln_shape *shape;
} const_ref;

static int cmp_shape(const kiln_shape *a, const kiln_shape *c) {
    if (a->rank != c->rank) return a->rank < c->rank ? -1 : 1;
    for (uint32_t i = 0; i < a->rank && i < KILN_MAX_RANK; i++) {
        if (a->min[i] != c->min[i]) return a->min[i] < c->min[i] ? -1 : 1;
        if (a->max[i] != c->max[i]) return a->max[i] < c->max[i] ? -1 : 1;
    }
    return 0;
}

static int cmp_const(const void *pa, const void *pb) {
    const const_ref *a = pa, *c = pb;
    if (a->nbytes != c->nbytes) return a->nbytes < c->nbytes ? -1 : 1;
    if (a->dtype != c->dtype) return a->dtype < c->dtype ? -1 : 1;
    const int d = cmp_shape(a->shape, c->shape);
    if (d != 0) return d;
    return a->id < c->id ? -1 : (a->id > c->id);
}

// Constants of equal dtype, shape and bytes become one (rename[] maps each to the one with the
// lowest id): the per-layer scalars of exported models (an epsilon, a position offset), and
// tied weights (an LLM's embedding table and its logits head), then held once on the device.
static kiln_status merge_constants(kiln_bgraph *b, int32_t *rename) {
    size_t n = 0;
    for (size_t v = 0; v < b->n_values; v++) n += b->values[v].kind == KILN_IR_CONSTANT;
    if (n < 2) return KILN_OK;
    const_ref *c = kiln_malloc(n * sizeof *c, KILN_ALIGN);
    KILN_CHECK(c != NULL, KILN_ERR_NO_MEMORY, "out of memory in common-subexpression elimination");
    n = 0;
    for (size_t v = 0; v < b->n_values; v++) {
        const kiln_bvalue *x = &b->values[v];
        if (x->kind != KILN_IR_CONSTANT) continue;
        c[n++] = (const_ref){x->nbytes, x->desc.dtype, (int32_t)v, &x->desc.shape};
    }
    qsort(c, n, sizeof *c, cmp_const);
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && c[j].nbytes == c[i].nbytes && c[j].dtype == c[i].dtype &&
               cmp_shape(c[j].shape, c[i].shape) == 0)
            j++;
        // [i, j): equal size, dtype and shape, ids ascending; each maps to the first equal
        // representative before it
        for (size_t k = i + 1; k < j; k++) {
            const void *dk = b->values[c[k].id].data;
            for (size_t r = i; r < k; r++) {
                if (rename[c[r].id] != c[r].id) continue;
                if (c[k].nbytes > 0 && memcmp(b->values[c[r].id].data, dk, c[k].nbytes) != 0)
                    continue;
                rename[c[k].id] = c[r].id;
                b->stats.n_cse++;
                break;
            }
        }
        i = j;
    }
    kiln_free(c, n * sizeof *c);
    return KILN_OK;
}

kiln_status kiln_pass_cse(kiln_bgraph *b) {
    KILN_TRY(kiln_bgraph_sort_nodes(b));
    KILN_TRY(kiln_bgraph_count_uses(b));
    size_t cap = 16;
    while (cap < 2 * b->n_nodes) cap *= 2;
    const size_t nv = b->n_values;
    int32_t *slot = kiln_malloc(cap * sizeof *slot, KILN_ALIGN);
    int32_t *rename = kiln_malloc(nv * sizeof *rename, KILN_ALIGN);
    if (slot == NULL || rename == NULL) {
        kiln_free(slot, cap * sizeof *slot);
        kiln_free(rename, nv * sizeof *rename);
        return kiln_fail(KILN_ERR_NO_MEMORY, "out of memory in common-subexpression elimination");
    }
    for (size_t i = 0; i < cap; i++) slot[i] = -1;
    for (size_t v = 0; v < nv; v++) rename[v] = (int32_t)v;
    kiln_status st = merge_constants(b, rename);
    if (st != KILN_OK) {
        kiln_free(slot, cap * sizeof *slot);
        kiln_free(rename, nv * sizeof *rename);
        return st;
    }
    for (size_t k = 0; k < b->n_nodes; k++) {
        kiln_bnode *n = &b->nodes[k];
        if (n->dead) continue;
        int32_t *in = b->ids + n->input_begin;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            if (in[i] >= 0 && (size_t)in[i] < nv) in[i] = rename[in[i]];
        }
        if (n->head >= 0 || n->n_tail > 0) continue; // fusion groups are not compared
        const int keep = (size_t)n->output < b->n_use_info && b->is_output[n->output];
        size_t h = (size_t)node_hash(b, n) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            if (slot[h] < 0) {
                slot[h] = (int32_t)k;
                break;
            }
            const kiln_bnode *m = &b->nodes[slot[h]];
            if (!same_node(b, m, n)) continue;
            if (!keep) {
                rename[n->output] = m->output;
                n->dead = 1;
                b->stats.n_cse++;
            }
            break;
        }
    }
    kiln_free(slot, cap * sizeof *slot);
    kiln_free(rename, nv * sizeof *rename);
    return kiln_bgraph_count_uses(b);
}
