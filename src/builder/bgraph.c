// SPDX-License-Identifier: Apache-2.0
// The builder's working graph (src/builder/builder.h): a copy of the caller's graph that the
// passes may rewrite, plus the memory the build owns (computed constants).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/status.h"

#define GROW(b, field, need)                                                                       \
    kiln_ir_grow((void **)&(b)->field, &(b)->cap_##field, (need), sizeof *(b)->field)

int kiln_desc_equal(const kiln_value_desc *a, const kiln_value_desc *b) {
    if (a->dtype != b->dtype || a->shape.rank != b->shape.rank) return 0;
    for (uint32_t i = 0; i < a->shape.rank; i++) {
        if (a->shape.min[i] != b->shape.min[i] || a->shape.max[i] != b->shape.max[i]) return 0;
    }
    return 1;
}

int kiln_desc_max_nbytes(const kiln_value_desc *d, uint64_t *out) {
    uint64_t n;
    if (!kiln_shape_max_numel(&d->shape, &n)) return 0;
    return kiln_mul_u64(n, kiln_dtype_size((kiln_dtype)d->dtype), out);
}

kiln_status kiln_bgraph_init(kiln_bgraph *b, const kiln_graph *g, const kiln_build_options *o) {
    memset(b, 0, sizeof *b);
    b->opts = *o;
    KILN_TRY(GROW(b, values, g->n_values));
    KILN_TRY(GROW(b, nodes, g->n_nodes));
    KILN_TRY(GROW(b, ids, g->n_ids));
    // Pools are never NULL (views offset into them).
    KILN_TRY(GROW(b, attr_refs, g->n_attr_refs + 1));
    KILN_TRY(GROW(b, ints, g->n_ints + 1));
    KILN_TRY(GROW(b, floats, g->n_floats + 1));
    KILN_TRY(GROW(b, inputs, g->n_inputs));
    KILN_TRY(GROW(b, outputs, g->n_outputs));
    KILN_TRY(GROW(b, states, g->n_states));
    for (size_t i = 0; i < g->n_values; i++) {
        const kiln_ir_value *s = &g->values[i];
        kiln_bvalue *v = &b->values[i];
        memset(v, 0, sizeof *v);
        v->kind = s->kind;
        v->index = s->index;
        v->name = kiln_graph_name(g, s->name);
        v->desc = s->desc;
        if (s->kind == KILN_IR_CONSTANT) {
            v->data = g->consts[s->index].data;
            v->nbytes = g->consts[s->index].nbytes;
        } else if (s->kind == KILN_IR_STATE) {
            v->data = g->states[s->index].data;
            v->nbytes = g->states[s->index].nbytes;
        }
    }
    for (size_t i = 0; i < g->n_states; i++) {
        b->states[i].value = g->states[i].value;
        b->states[i].update = g->states[i].update;
        b->states[i].write = -1;
        b->states[i].data = g->states[i].data;
        b->states[i].nbytes = g->states[i].nbytes;
    }
    b->n_states = g->n_states;
    b->n_values = g->n_values;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const kiln_ir_node *s = &g->nodes[i];
        kiln_bnode *n = &b->nodes[i];
        memset(n, 0, sizeof *n);
        n->op = s->op;
        n->input_begin = s->input_begin;
        n->n_inputs = s->n_inputs;
        n->attr_begin = s->attr_begin;
        n->output = s->output;
        n->seq = KILN_SEQ_NODE + (int64_t)i;
        n->head = -1;
    }
    b->n_nodes = g->n_nodes;
    if (g->n_ids > 0) memcpy(b->ids, g->ids, g->n_ids * sizeof *b->ids);
    b->n_ids = g->n_ids;
    if (g->n_attr_refs > 0) {
        memcpy(b->attr_refs, g->attr_refs, g->n_attr_refs * sizeof *b->attr_refs);
    }
    b->n_attr_refs = g->n_attr_refs;
    if (g->n_ints > 0) memcpy(b->ints, g->ints, g->n_ints * sizeof *b->ints);
    b->n_ints = g->n_ints;
    if (g->n_floats > 0) memcpy(b->floats, g->floats, g->n_floats * sizeof *b->floats);
    b->n_floats = g->n_floats;
    if (g->n_inputs > 0) memcpy(b->inputs, g->inputs, g->n_inputs * sizeof *b->inputs);
    b->n_inputs = g->n_inputs;
    for (size_t i = 0; i < g->n_outputs; i++) {
        b->outputs[i].value = g->outputs[i].value;
        b->outputs[i].name = kiln_graph_name(g, g->outputs[i].name);
    }
    b->n_outputs = g->n_outputs;
    return KILN_OK;
}

void kiln_bgraph_release(kiln_bgraph *b) {
    if (b == NULL) return;
    for (size_t i = 0; i < b->n_blobs; i++) kiln_free(b->blobs[i].data, b->blobs[i].nbytes);
    kiln_ir_array_free(b->values, b->cap_values, sizeof *b->values);
    kiln_ir_array_free(b->nodes, b->cap_nodes, sizeof *b->nodes);
    kiln_ir_array_free(b->ids, b->cap_ids, sizeof *b->ids);
    kiln_ir_array_free(b->attr_refs, b->cap_attr_refs, sizeof *b->attr_refs);
    kiln_ir_array_free(b->ints, b->cap_ints, sizeof *b->ints);
    kiln_ir_array_free(b->floats, b->cap_floats, sizeof *b->floats);
    kiln_ir_array_free(b->inputs, b->cap_inputs, sizeof *b->inputs);
    kiln_ir_array_free(b->outputs, b->cap_outputs, sizeof *b->outputs);
    kiln_ir_array_free(b->states, b->cap_states, sizeof *b->states);
    kiln_ir_array_free(b->blobs, b->cap_blobs, sizeof *b->blobs);
    kiln_ir_array_free(b->uses, b->cap_uses, sizeof *b->uses);
    kiln_ir_array_free(b->user, b->cap_user, sizeof *b->user);
    kiln_ir_array_free(b->is_output, b->cap_is_output, sizeof *b->is_output);
    memset(b, 0, sizeof *b);
}

kiln_status kiln_bgraph_blob(kiln_bgraph *b, size_t nbytes, void **out) {
    void *p;
    KILN_TRY(GROW(b, blobs, b->n_blobs + 1));
    p = kiln_calloc(nbytes, KILN_DATA_ALIGN);
    KILN_CHECK(p != NULL, KILN_ERR_NO_MEMORY,
               "out of memory allocating %zu bytes for a computed constant", nbytes);
    b->blobs[b->n_blobs].data = p;
    b->blobs[b->n_blobs].nbytes = nbytes;
    b->n_blobs++;
    *out = p;
    return KILN_OK;
}

static kiln_status value_room(const kiln_bgraph *b) {
    // Ids are int32; the engine format caps tensors far lower (checked at emission).
    KILN_CHECK(b->n_values < (size_t)INT32_MAX, KILN_ERR_UNSUPPORTED,
               "the build created too many values");
    return KILN_OK;
}

kiln_status kiln_bgraph_add_const(kiln_bgraph *b, uint32_t dtype, const kiln_shape *shape,
                                  const void *data, uint64_t nbytes, int32_t *out_value) {
    kiln_bvalue *v;
    KILN_TRY(value_room(b));
    KILN_TRY(GROW(b, values, b->n_values + 1));
    v = &b->values[b->n_values];
    memset(v, 0, sizeof *v);
    v->kind = KILN_IR_CONSTANT;
    v->name = "";
    v->desc.dtype = dtype;
    v->desc.shape = *shape;
    for (uint32_t i = shape->rank; i < KILN_MAX_RANK; i++) {
        v->desc.shape.min[i] = v->desc.shape.max[i] = 0;
    }
    v->data = data;
    v->nbytes = nbytes;
    *out_value = (int32_t)b->n_values++;
    return KILN_OK;
}

static void node_what(const kiln_bgraph *b, uint32_t node, char *buf, size_t n) {
    const kiln_bnode *nd = &b->nodes[node];
    if (nd->seq >= KILN_SEQ_NODE && nd->seq < KILN_SEQ_OUTPUT_CAST) {
        snprintf(buf, n, "node %" PRId64 " (%s)", nd->seq - KILN_SEQ_NODE, kiln_op_name(nd->op));
    } else {
        snprintf(buf, n, "inserted node %u (%s)", node, kiln_op_name(nd->op));
    }
}

kiln_status kiln_bgraph_infer(const kiln_bgraph *b, uint32_t node, kiln_value_desc *out) {
    const kiln_bnode *n = &b->nodes[node];
    const kiln_value_desc *descs[KILN_MAX_INPUTS];
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    char what[64];
    KILN_CHECK(n->n_inputs <= KILN_MAX_INPUTS, KILN_ERR_INTERNAL, "node %u has %u inputs", node,
               n->n_inputs);
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        int32_t v = b->ids[n->input_begin + i];
        descs[i] = v < 0 ? NULL : &b->values[v].desc;
    }
    node_what(b, node, what, sizeof what);
    return kiln_infer(n->op, &a, descs, n->n_inputs, what, out);
}

kiln_status kiln_bgraph_add_node(kiln_bgraph *b, uint32_t op, const int32_t *inputs,
                                 uint32_t n_inputs, const kiln_attrs *attrs, int64_t seq,
                                 int32_t *out_value) {
    const kiln_op_def *d = kiln_op_def_get(op);
    size_t n_ints = 0, n_floats = 0;
    kiln_bnode *n;
    kiln_bvalue *v;
    kiln_value_desc out;
    uint32_t node;
    KILN_CHECK(d != NULL && n_inputs <= KILN_MAX_INPUTS, KILN_ERR_INTERNAL,
               "kiln_bgraph_add_node: op %u with %u inputs", op, n_inputs);
    KILN_CHECK(attrs == NULL || attrs->n_attrs == d->n_attrs, KILN_ERR_INTERNAL,
               "kiln_bgraph_add_node: %s needs %u attributes", d->name, d->n_attrs);
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        uint32_t cnt = attrs != NULL ? attrs->refs[i].n : d->attrs[i].n_default;
        if (d->attrs[i].kind == KILN_ATTR_INTS) {
            n_ints += cnt;
        } else {
            n_floats += cnt;
        }
    }
    KILN_TRY(value_room(b));
    KILN_TRY(GROW(b, values, b->n_values + 1));
    KILN_TRY(GROW(b, nodes, b->n_nodes + 1));
    KILN_TRY(GROW(b, ids, b->n_ids + n_inputs));
    KILN_TRY(GROW(b, attr_refs, b->n_attr_refs + d->n_attrs));
    KILN_TRY(GROW(b, ints, b->n_ints + n_ints));
    KILN_TRY(GROW(b, floats, b->n_floats + n_floats));
    node = (uint32_t)b->n_nodes;
    n = &b->nodes[node];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->input_begin = (uint32_t)b->n_ids;
    n->n_inputs = n_inputs;
    n->attr_begin = (uint32_t)b->n_attr_refs;
    n->output = (int32_t)b->n_values;
    n->seq = seq;
    n->head = -1;
    if (n_inputs > 0) memcpy(b->ids + b->n_ids, inputs, n_inputs * sizeof *inputs);
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        kiln_attr_ref *r = &b->attr_refs[b->n_attr_refs + i];
        r->kind = d->attrs[i].kind;
        r->n = attrs != NULL ? attrs->refs[i].n : d->attrs[i].n_default;
        if (r->kind == KILN_ATTR_INTS) {
            const int64_t *src =
                attrs != NULL ? attrs->ints + attrs->refs[i].begin : d->attrs[i].default_ints;
            r->begin = b->n_ints;
            if (r->n > 0) memcpy(b->ints + b->n_ints, src, r->n * sizeof *src);
            b->n_ints += r->n;
        } else {
            const double *src =
                attrs != NULL ? attrs->floats + attrs->refs[i].begin : d->attrs[i].default_floats;
            r->begin = b->n_floats;
            if (r->n > 0) memcpy(b->floats + b->n_floats, src, r->n * sizeof *src);
            b->n_floats += r->n;
        }
    }
    // Commit the node before inference (it reads the pools through the node); a failure
    // leaves an unreferenced dead node, which emission ignores.
    b->n_ids += n_inputs;
    b->n_attr_refs += d->n_attrs;
    b->n_nodes++;
    kiln_status st = kiln_bgraph_infer(b, node, &out);
    if (st != KILN_OK) {
        b->nodes[node].dead = 1;
        return st;
    }
    v = &b->values[b->n_values];
    memset(v, 0, sizeof *v);
    v->kind = KILN_IR_NODE;
    v->index = node;
    v->name = "";
    v->desc = out;
    *out_value = (int32_t)b->n_values++;
    return KILN_OK;
}

int kiln_bgraph_copy_attrs(const kiln_bgraph *b, const kiln_bnode *n, kiln_battrs_copy *c) {
    const kiln_attrs a = kiln_bgraph_attrs(b, n);
    uint32_t ni = 0, nf = 0;
    if (a.n_attrs > KILN_MAX_ATTRS) return 0;
    for (uint32_t i = 0; i < a.n_attrs; i++) {
        const kiln_attr_ref r = a.refs[i];
        const int ints = r.kind == KILN_ATTR_INTS;
        if ((ints ? ni : nf) + r.n > KILN_BATTRS_MAX_VALUES) return 0;
        c->refs[i] = r;
        c->refs[i].begin = ints ? ni : nf;
        if (r.n > 0 && ints) memcpy(c->ints + ni, a.ints + r.begin, r.n * sizeof *c->ints);
        if (r.n > 0 && !ints) memcpy(c->floats + nf, a.floats + r.begin, r.n * sizeof *c->floats);
        if (ints) {
            ni += r.n;
        } else {
            nf += r.n;
        }
    }
    c->a.refs = c->refs;
    c->a.n_attrs = a.n_attrs;
    c->a.ints = c->ints;
    c->a.floats = c->floats;
    return 1;
}

kiln_status kiln_bgraph_set_inputs(kiln_bgraph *b, uint32_t node, const int32_t *inputs,
                                   uint32_t n_inputs) {
    kiln_bnode *n = &b->nodes[node];
    if (n_inputs > n->n_inputs) {
        KILN_TRY(GROW(b, ids, b->n_ids + n_inputs));
        n = &b->nodes[node];
        n->input_begin = (uint32_t)b->n_ids;
        b->n_ids += n_inputs;
    }
    memmove(b->ids + n->input_begin, inputs, n_inputs * sizeof *inputs);
    n->n_inputs = n_inputs;
    return KILN_OK;
}

kiln_status kiln_bgraph_replace_node(kiln_bgraph *b, uint32_t old_node, int32_t new_value,
                                     const char *what) {
    uint32_t nn = b->values[new_value].index;
    int32_t out = b->nodes[old_node].output;
    kiln_value_desc check;
    KILN_TRY(kiln_bgraph_infer(b, nn, &check));
    KILN_CHECK(kiln_desc_equal(&check, &b->values[out].desc), KILN_ERR_INTERNAL,
               "%s changed the output of node %u", what, old_node);
    b->values[new_value].kind = KILN_BV_DEAD;
    b->nodes[nn].output = out;
    b->values[out].index = nn;
    b->nodes[old_node].dead = 1;
    return KILN_OK;
}

typedef struct seq_key {
    int64_t seq;
    uint32_t node;
} seq_key;

static int cmp_seq_key(const void *a, const void *b) {
    const seq_key *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->node < y->node ? -1 : (x->node > y->node);
}

// Pops the least (seq, node) key of a binary min-heap of *n keys.
static seq_key heap_pop(seq_key *h, size_t *n) {
    const seq_key top = h[0];
    const seq_key last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cmp_seq_key(&h[c + 1], &h[c]) < 0) c++;
        if (cmp_seq_key(&h[c], &last) >= 0) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void heap_push(seq_key *h, size_t *n, seq_key k) {
    size_t i = (*n)++;
    while (i > 0 && cmp_seq_key(&k, &h[(i - 1) / 2]) < 0) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = k;
}

// The producing node of value v when it is a live node other than `self`, else -1.
static int64_t live_producer(const kiln_bgraph *b, int32_t v, size_t self) {
    if (v < 0 || (size_t)v >= b->n_values || b->values[v].kind != KILN_IR_NODE) return -1;
    const uint32_t p = b->values[v].index;
    if (p >= b->n_nodes || p == self || b->nodes[p].dead) return -1;
    return p;
}

// The order: repeatedly the least (seq, index) among the nodes whose live producers are placed
// (Kahn's algorithm with a heap), so that nodes sharing a seq (a node split in two by one pass,
// then rewritten by another) still come after what they read.
static kiln_status topo_order(const kiln_bgraph *b, seq_key *order) {
    const size_t n = b->n_nodes;
    uint32_t *indeg = kiln_calloc(n * sizeof(uint32_t), KILN_ALIGN);
    uint32_t *first = kiln_calloc((n + 1) * sizeof(uint32_t), KILN_ALIGN);
    uint32_t *edges = NULL, *fill = NULL;
    seq_key *heap = kiln_malloc(n * sizeof *heap, KILN_ALIGN);
    size_t n_edges = 0, n_heap = 0, placed = 0;
    kiln_status st = KILN_OK;
    if (indeg == NULL || first == NULL || heap == NULL) goto oom;
    for (size_t i = 0; i < n; i++) {
        const kiln_bnode *nd = &b->nodes[i];
        if (nd->dead) continue;
        for (uint32_t j = 0; j < nd->n_inputs; j++) {
            const int64_t p = live_producer(b, b->ids[nd->input_begin + j], i);
            if (p < 0) continue;
            first[p + 1]++;
            indeg[i]++;
            n_edges++;
        }
    }
    for (size_t i = 0; i < n; i++) first[i + 1] += first[i];
    edges = kiln_malloc((n_edges + 1) * sizeof *edges, KILN_ALIGN);
    fill = kiln_malloc(n * sizeof *fill, KILN_ALIGN);
    if (edges == NULL || fill == NULL) goto oom;
    memcpy(fill, first, n * sizeof *fill);
    for (size_t i = 0; i < n; i++) {
        const kiln_bnode *nd = &b->nodes[i];
        if (nd->dead) continue;
        for (uint32_t j = 0; j < nd->n_inputs; j++) {
            const int64_t p = live_producer(b, b->ids[nd->input_begin + j], i);
            if (p >= 0) edges[fill[p]++] = (uint32_t)i;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (indeg[i] == 0) heap_push(heap, &n_heap, (seq_key){b->nodes[i].seq, (uint32_t)i});
    }
    while (n_heap > 0) {
        const seq_key k = heap_pop(heap, &n_heap);
        order[placed++] = k;
        for (uint32_t e = first[k.node]; e < first[k.node + 1]; e++) {
            const uint32_t c = edges[e];
            if (--indeg[c] == 0) heap_push(heap, &n_heap, (seq_key){b->nodes[c].seq, c});
        }
    }
    if (placed != n) st = kiln_fail(KILN_ERR_INTERNAL, "the graph's %zu nodes hold a cycle", n);
    goto done;
oom:
    st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory ordering %zu nodes", n);
done:
    kiln_free(indeg, n * sizeof *indeg);
    kiln_free(first, (n + 1) * sizeof *first);
    kiln_free(edges, (n_edges + 1) * sizeof *edges);
    kiln_free(fill, n * sizeof *fill);
    kiln_free(heap, n * sizeof *heap);
    return st;
}

kiln_status kiln_bgraph_sort_nodes(kiln_bgraph *b) {
    size_t n = b->n_nodes;
    seq_key *keys;
    uint32_t *new_index;
    kiln_bnode *sorted;
    if (n < 2) return KILN_OK;
    keys = kiln_malloc(n * sizeof *keys, KILN_ALIGN);
    new_index = kiln_malloc(n * sizeof *new_index, KILN_ALIGN);
    sorted = kiln_malloc(n * sizeof *sorted, KILN_ALIGN);
    kiln_status st = keys == NULL || new_index == NULL || sorted == NULL
                         ? kiln_fail(KILN_ERR_NO_MEMORY, "out of memory ordering %zu nodes", n)
                         : topo_order(b, keys);
    if (st != KILN_OK) {
        kiln_free(keys, n * sizeof *keys);
        kiln_free(new_index, n * sizeof *new_index);
        kiln_free(sorted, n * sizeof *sorted);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        sorted[i] = b->nodes[keys[i].node];
        new_index[keys[i].node] = (uint32_t)i;
    }
    for (size_t i = 0; i < n; i++) {
        kiln_bnode *nd = &sorted[i];
        if (nd->head >= 0) nd->head = (int32_t)new_index[nd->head];
        for (uint32_t t = 0; t < nd->n_tail; t++) nd->tails[t] = (int32_t)new_index[nd->tails[t]];
    }
    for (size_t v = 0; v < b->n_values; v++) {
        kiln_bvalue *val = &b->values[v];
        if ((val->kind == KILN_IR_NODE || val->kind == KILN_BV_DEAD) && val->index < n) {
            val->index = new_index[val->index];
        }
    }
    memcpy(b->nodes, sorted, n * sizeof *sorted);
    kiln_free(keys, n * sizeof *keys);
    kiln_free(new_index, n * sizeof *new_index);
    kiln_free(sorted, n * sizeof *sorted);
    return KILN_OK;
}

int32_t kiln_bgraph_only_reader(const kiln_bgraph *b, int32_t v) {
    if (v < 0 || (size_t)v >= b->n_use_info || b->uses[v] != 1 || b->is_output[v]) return -1;
    const int32_t u = b->user[v];
    if (u < 0 || b->nodes[u].dead || b->nodes[u].n_tail > 0 || b->nodes[u].head >= 0) return -1;
    return u;
}

kiln_status kiln_bgraph_count_uses(kiln_bgraph *b) {
    size_t n = b->n_values;
    KILN_TRY(GROW(b, uses, n));
    KILN_TRY(GROW(b, user, n));
    KILN_TRY(GROW(b, is_output, n));
    b->n_use_info = n;
    memset(b->uses, 0, n * sizeof *b->uses);
    memset(b->is_output, 0, n * sizeof *b->is_output);
    for (size_t i = 0; i < n; i++) b->user[i] = -1;
    for (size_t i = 0; i < b->n_nodes; i++) {
        const kiln_bnode *nd = &b->nodes[i];
        if (nd->dead) continue;
        for (uint32_t j = 0; j < nd->n_inputs; j++) {
            int32_t v = b->ids[nd->input_begin + j];
            if (v < 0) continue;
            b->uses[v]++;
            b->user[v] = (int32_t)i;
        }
    }
    for (size_t i = 0; i < b->n_outputs; i++) b->is_output[b->outputs[i].value] = 1;
    for (size_t i = 0; i < b->n_states; i++) {
        if (b->states[i].update >= 0) b->is_output[b->states[i].update] = 1;
    }
    return KILN_OK;
}

// Progress: every step of the build (passes, layers, outputs) is reported through here.
static const char *phase_name(kiln_build_phase phase) {
    switch (phase) {
    case KILN_BUILD_PHASE_PASS: return "pass";
    case KILN_BUILD_PHASE_LAYER: return "layer";
    case KILN_BUILD_PHASE_TUNE: return "tuning step";
    case KILN_BUILD_PHASE_OUTPUT: return "output";
    }
    return "step";
}

kiln_status kiln_build_report(const kiln_build_options *o, kiln_build_phase phase, const char *name,
                              uint32_t step, uint32_t n_steps) {
    if (o->progress == NULL) return KILN_OK;
    kiln_build_progress p = {(uint32_t)sizeof p, phase, name, step, n_steps};
    int rc = o->progress(o->progress_user_data, &p);
    KILN_CHECK(rc == 0, KILN_ERR_INVALID_STATE,
               "kiln_build: stopped by the progress callback (it returned %d) after %s %u of %u "
               "('%s')",
               rc, phase_name(phase), step, n_steps, name);
    return KILN_OK;
}
