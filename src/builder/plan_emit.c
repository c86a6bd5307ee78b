// SPDX-License-Identifier: Apache-2.0
// Emission: lays out the engine plan (src/runtime/plan.h) of a checked working graph.
//
//  - Layer order: live nodes by emission key (src/builder/builder.h); a head with fused tails is
//    emitted where its last tail was, immediately followed by its tails (every operand of a
//    tail is defined before the tail, and the group's result is only read after it).
//  - Tensors: the inputs first (binding order), then, in layer order, each weight at its first
//    reader and each layer's output. A fused group has one tensor: the head writes it and each
//    tail rewrites it in place; it is an OUTPUT when the group's last value is one.
//  - Memory: activations get arena offsets from kiln_plan_memory over their lifetimes
//    [writing layer, last reading layer], sized at their largest shape.
//  - Weights: inline at KILN_FORMAT_WEIGHT_ALIGN offsets of the weights blob, or (with
//    external_weights, from min_external_nbytes up) named "kiln-t-<hex>" by content (the
//    SHA-256 tree digest, core/sha256.h).
//  - States: one STATE tensor each, after the inputs, in state order; the layer I/O lowering
//    chose (kiln_bstate.write) writes it. Initial values are placed like weights; a state that
//    starts as zeros stores none (offset KILN_STATE_ZERO).
// Everything follows from node and value indices: no pointers or hash order reach the plan.
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/sha256.h"
#include "core/status.h"
#include "kiln/kiln_format.h"

typedef struct emit_state {
    const kiln_bgraph *b;
    int32_t *tensor_of;   // per value
    int32_t *out_binding; // per value: output index, or -1
    int32_t *state_write; // per value: the state its layer writes, or -1
    // growable plan arrays
    kiln_plan_tensor *tensors;
    size_t n_tensors, cap_tensors;
    int32_t *tensor_value; // per tensor: the value it holds (weights: the constant)
    size_t n_tensor_value, cap_tensor_value;
    kiln_plan_layer *layers;
    size_t n_layers, cap_layers;
    int32_t *ids;
    size_t n_ids, cap_ids;
    kiln_attr_ref *attr_refs;
    size_t n_attr_refs, cap_attr_refs;
    int64_t *ints;
    size_t n_ints, cap_ints;
    double *floats;
    size_t n_floats, cap_floats;
    char *strings;
    size_t n_strings, cap_strings;
    int32_t *first, *last; // per tensor: writing layer and last reading layer
    size_t cap_first, cap_last;
    kiln_ext_weight *ext;
    size_t n_ext, cap_ext;
} emit_state;

#define GROW(s, field, need)                                                                       \
    kiln_ir_grow((void **)&(s)->field, &(s)->cap_##field, (need), sizeof *(s)->field)

static kiln_status add_string(emit_state *s, const char *str, uint32_t *out) {
    size_t len = strlen(str) + 1;
    if (len == 1) {
        *out = 0;
        return KILN_OK;
    }
    KILN_TRY(GROW(s, strings, s->n_strings + len));
    memcpy(s->strings + s->n_strings, str, len);
    KILN_CHECK(s->n_strings <= UINT32_MAX - len, KILN_ERR_UNSUPPORTED, "engine strings overflow");
    *out = (uint32_t)s->n_strings;
    s->n_strings += len;
    return KILN_OK;
}

static kiln_status new_tensor(emit_state *s, int32_t value, uint32_t kind, uint32_t binding,
                              const char *name, int32_t *out) {
    const kiln_bvalue *v = &s->b->values[value];
    kiln_plan_tensor *t;
    KILN_CHECK(s->n_tensors < KILN_FORMAT_MAX_TENSORS, KILN_ERR_UNSUPPORTED,
               "the engine would have more than %u tensors (Kiln's limit); split the model",
               KILN_FORMAT_MAX_TENSORS);
    KILN_TRY(GROW(s, tensors, s->n_tensors + 1));
    KILN_TRY(GROW(s, tensor_value, s->n_tensors + 1));
    KILN_TRY(GROW(s, first, s->n_tensors + 1));
    KILN_TRY(GROW(s, last, s->n_tensors + 1));
    t = &s->tensors[s->n_tensors];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->dtype = v->desc.dtype;
    t->shape = v->desc.shape;
    t->binding = binding;
    t->key = KILN_NO_KEY;
    KILN_TRY(add_string(s, name, &t->name));
    if (kind == KILN_TENSOR_WEIGHT) t->nbytes = v->nbytes;
    if (kind == KILN_TENSOR_STATE) {
        KILN_CHECK(kiln_desc_max_nbytes(&v->desc, &t->nbytes), KILN_ERR_UNSUPPORTED,
                   "a state's size overflows");
    }
    s->tensor_value[s->n_tensors] = value;
    s->first[s->n_tensors] = -1;
    s->last[s->n_tensors] = -1;
    *out = (int32_t)s->n_tensors++;
    return KILN_OK;
}

// The tensor a layer reads for value v (weights are created at their first reader).
static kiln_status read_tensor(emit_state *s, int32_t v, int32_t layer, int32_t *out) {
    if (s->tensor_of[v] < 0) {
        const kiln_bvalue *bv = &s->b->values[v];
        KILN_CHECK(bv->kind == KILN_IR_CONSTANT, KILN_ERR_INTERNAL,
                   "emission: value %" PRId32 " is read before any layer writes it", v);
        KILN_TRY(new_tensor(s, v, KILN_TENSOR_WEIGHT, 0, bv->name, &s->tensor_of[v]));
    }
    *out = s->tensor_of[v];
    if (s->last[*out] < layer) s->last[*out] = layer;
    return KILN_OK;
}

static kiln_status add_layer(emit_state *s, uint32_t node, uint32_t flags, int32_t out_tensor) {
    const kiln_bgraph *b = s->b;
    const kiln_bnode *n = &b->nodes[node];
    const kiln_op_def *d = kiln_op_def_get(n->op);
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int32_t li = (int32_t)s->n_layers;
    kiln_plan_layer *l;
    KILN_TRY(GROW(s, layers, s->n_layers + 1));
    KILN_TRY(GROW(s, ids, s->n_ids + n->n_inputs + 1));
    KILN_TRY(GROW(s, attr_refs, s->n_attr_refs + d->n_attrs));
    l = &s->layers[s->n_layers];
    memset(l, 0, sizeof *l);
    l->op = n->op;
    l->flags = flags;
    l->input_begin = (uint32_t)s->n_ids;
    l->n_inputs = n->n_inputs;
    for (uint32_t j = 0; j < n->n_inputs; j++) {
        int32_t v = b->ids[n->input_begin + j], t = -1;
        if (v >= 0) KILN_TRY(read_tensor(s, v, li, &t));
        s->ids[s->n_ids++] = t;
    }
    l = &s->layers[s->n_layers];
    l->output_begin = (uint32_t)s->n_ids;
    l->n_outputs = 1;
    s->ids[s->n_ids++] = out_tensor;
    if (s->first[out_tensor] < 0) s->first[out_tensor] = li;
    if (s->last[out_tensor] < li) s->last[out_tensor] = li;
    l->attr_begin = (uint32_t)s->n_attr_refs;
    l->n_attrs = d->n_attrs;
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        kiln_attr_ref r = a.refs[i];
        if (r.kind == KILN_ATTR_INTS) {
            KILN_TRY(GROW(s, ints, s->n_ints + r.n));
            if (r.n > 0) memcpy(s->ints + s->n_ints, b->ints + r.begin, r.n * sizeof *s->ints);
            r.begin = s->n_ints;
            s->n_ints += r.n;
        } else {
            KILN_TRY(GROW(s, floats, s->n_floats + r.n));
            if (r.n > 0) {
                memcpy(s->floats + s->n_floats, b->floats + r.begin, r.n * sizeof *s->floats);
            }
            r.begin = s->n_floats;
            s->n_floats += r.n;
        }
        s->attr_refs[s->n_attr_refs++] = r;
    }
    s->layers[s->n_layers].n_tail = flags & KILN_LAYER_TAIL ? 0 : n->n_tail;
    s->n_layers++;
    return KILN_OK;
}

// Emits a node and its fused tails.
static kiln_status emit_group(emit_state *s, uint32_t node) {
    const kiln_bgraph *b = s->b;
    const kiln_bnode *n = &b->nodes[node];
    int32_t final = n->n_tail > 0 ? b->nodes[n->tails[n->n_tail - 1]].output : n->output;
    int32_t binding = s->out_binding[final], t;
    if (s->state_write[final] >= 0) {
        t = s->tensor_of[b->states[s->state_write[final]].value];
    } else if (binding >= 0) {
        KILN_TRY(new_tensor(s, final, KILN_TENSOR_OUTPUT, (uint32_t)binding,
                            b->outputs[binding].name, &t));
    } else {
        KILN_TRY(new_tensor(s, final, KILN_TENSOR_ACTIVATION, 0, "", &t));
    }
    s->tensor_of[n->output] = t;
    for (uint32_t k = 0; k < n->n_tail; k++) s->tensor_of[b->nodes[n->tails[k]].output] = t;
    KILN_TRY(add_layer(s, node, 0, t));
    for (uint32_t k = 0; k < n->n_tail; k++) {
        KILN_TRY(add_layer(s, (uint32_t)n->tails[k], KILN_LAYER_TAIL, t));
    }
    return KILN_OK;
}

typedef struct unit_key {
    int64_t key;
    uint32_t node;
} unit_key;

static int cmp_unit(const void *a, const void *b) {
    const unit_key *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->node < y->node ? -1 : (x->node > y->node);
}

static kiln_status emit_layers(emit_state *s) {
    const kiln_bgraph *b = s->b;
    unit_key *units;
    size_t n_units = 0;
    kiln_status st = KILN_OK;
    units = kiln_malloc((b->n_nodes + 1) * sizeof *units, KILN_ALIGN);
    KILN_CHECK(units != NULL, KILN_ERR_NO_MEMORY, "out of memory ordering %zu layers", b->n_nodes);
    for (size_t i = 0; i < b->n_nodes; i++) {
        const kiln_bnode *n = &b->nodes[i];
        if (n->dead || n->head >= 0) continue;
        units[n_units].key = n->n_tail > 0 ? b->nodes[n->tails[n->n_tail - 1]].seq : n->seq;
        units[n_units].node = (uint32_t)i;
        n_units++;
    }
    qsort(units, n_units, sizeof *units, cmp_unit);
    for (size_t i = 0; i < n_units && st == KILN_OK; i++) {
        st = emit_group(s, units[i].node);
        if (st == KILN_OK) {
            st = kiln_build_report(&b->opts, KILN_BUILD_PHASE_LAYER,
                                   kiln_op_name(b->nodes[units[i].node].op), (uint32_t)(i + 1),
                                   (uint32_t)n_units);
        }
    }
    kiln_free(units, (b->n_nodes + 1) * sizeof *units);
    return st;
}

static kiln_status plan_activations(emit_state *s, uint64_t *arena) {
    kiln_mem_item *items;
    uint32_t n = 0, k = 0;
    kiln_status st;
    for (size_t i = 0; i < s->n_tensors; i++) n += s->tensors[i].kind == KILN_TENSOR_ACTIVATION;
    items = kiln_malloc((size_t)(n + 1) * sizeof *items, KILN_ALIGN);
    KILN_CHECK(items != NULL, KILN_ERR_NO_MEMORY, "out of memory planning activations");
    for (size_t i = 0; i < s->n_tensors; i++) {
        kiln_plan_tensor *t = &s->tensors[i];
        kiln_value_desc d;
        if (t->kind != KILN_TENSOR_ACTIVATION) continue;
        d.dtype = t->dtype;
        d.shape = t->shape;
        if (!kiln_desc_max_nbytes(&d, &t->nbytes)) {
            kiln_free(items, (size_t)(n + 1) * sizeof *items);
            return kiln_fail(KILN_ERR_UNSUPPORTED, "an activation's largest shape overflows");
        }
        items[k].nbytes = t->nbytes;
        items[k].first = s->first[i];
        items[k].last = s->last[i];
        items[k].offset = 0;
        k++;
    }
    st = kiln_plan_memory(items, n, KILN_FORMAT_ACTIVATION_ALIGN, arena);
    k = 0;
    for (size_t i = 0; i < s->n_tensors && st == KILN_OK; i++) {
        if (s->tensors[i].kind == KILN_TENSOR_ACTIVATION) s->tensors[i].offset = items[k++].offset;
    }
    kiln_free(items, (size_t)(n + 1) * sizeof *items);
    return st;
}

// Weights: keys for external ones (deduplicated by content), offsets for inline ones.
static kiln_status place_weights(emit_state *s, uint64_t *weights_nbytes) {
    const kiln_bgraph *b = s->b;
    uint64_t off = 0;
    for (size_t i = 0; i < s->n_tensors; i++) {
        kiln_plan_tensor *t = &s->tensors[i];
        const kiln_bvalue *v = &b->values[s->tensor_value[i]];
        if (t->kind == KILN_TENSOR_STATE && v->data == NULL) t->offset = KILN_STATE_ZERO;
        if (t->kind == KILN_TENSOR_STATE && v->data == NULL) continue;
        if (t->kind != KILN_TENSOR_WEIGHT && t->kind != KILN_TENSOR_STATE) continue;
        if (b->opts.external_weights && t->nbytes >= b->opts.min_external_nbytes) {
            uint8_t digest[KILN_SHA256_NBYTES];
            char key[8 + 64];
            size_t e;
            kiln_sha256_tree(v->data, (size_t)v->nbytes, digest);
            for (e = 0; e < s->n_ext; e++) {
                if (memcmp(s->ext[e].digest, digest, sizeof digest) == 0) break;
            }
            if (e == s->n_ext) {
                memcpy(key, "kiln-t-", 7);
                kiln_sha256_hex(digest, key + 7);
                KILN_TRY(GROW(s, ext, s->n_ext + 1));
                KILN_TRY(add_string(s, key, &s->ext[e].key));
                memcpy(s->ext[e].digest, digest, sizeof digest);
                s->ext[e].data = v->data;
                s->ext[e].nbytes = v->nbytes;
                s->n_ext++;
            }
            t->key = s->ext[e].key;
            t->offset = 0;
            continue;
        }
        KILN_CHECK(kiln_align_up_u64(off, KILN_FORMAT_WEIGHT_ALIGN, &off), KILN_ERR_UNSUPPORTED,
                   "the weights overflow");
        t->offset = off;
        KILN_CHECK(kiln_add_u64(off, t->nbytes, &off), KILN_ERR_UNSUPPORTED,
                   "the weights overflow");
    }
    *weights_nbytes = off;
    return KILN_OK;
}

// Moves a growable array into an exactly sized allocation (NULL when empty).
static kiln_status shrink(void **p, size_t n, size_t cap, size_t elem, void **out) {
    void *q = NULL;
    if (n > 0) {
        q = kiln_malloc(n * elem, KILN_ALIGN);
        KILN_CHECK(q != NULL, KILN_ERR_NO_MEMORY, "out of memory finishing the plan");
        memcpy(q, *p, n * elem);
    }
    kiln_free(*p, cap * elem);
    *p = NULL;
    *out = q;
    return KILN_OK;
}

static void state_free(emit_state *s) {
    size_t nv = s->b->n_values;
    kiln_free(s->tensor_of, nv * sizeof *s->tensor_of);
    kiln_free(s->out_binding, nv * sizeof *s->out_binding);
    kiln_free(s->state_write, nv * sizeof *s->state_write);
    kiln_ir_array_free(s->tensors, s->cap_tensors, sizeof *s->tensors);
    kiln_ir_array_free(s->tensor_value, s->cap_tensor_value, sizeof *s->tensor_value);
    kiln_ir_array_free(s->layers, s->cap_layers, sizeof *s->layers);
    kiln_ir_array_free(s->ids, s->cap_ids, sizeof *s->ids);
    kiln_ir_array_free(s->attr_refs, s->cap_attr_refs, sizeof *s->attr_refs);
    kiln_ir_array_free(s->ints, s->cap_ints, sizeof *s->ints);
    kiln_ir_array_free(s->floats, s->cap_floats, sizeof *s->floats);
    kiln_ir_array_free(s->strings, s->cap_strings, 1);
    kiln_ir_array_free(s->first, s->cap_first, sizeof *s->first);
    kiln_ir_array_free(s->last, s->cap_last, sizeof *s->last);
    kiln_ir_array_free(s->ext, s->cap_ext, sizeof *s->ext);
}

static kiln_status emit(emit_state *s, kiln_plan *p) {
    const kiln_bgraph *b = s->b;
    size_t nv = b->n_values;
    void *q = NULL;
    s->tensor_of = kiln_malloc(nv * sizeof *s->tensor_of, KILN_ALIGN);
    s->out_binding = kiln_malloc(nv * sizeof *s->out_binding, KILN_ALIGN);
    s->state_write = kiln_malloc(nv * sizeof *s->state_write, KILN_ALIGN);
    KILN_CHECK(s->tensor_of != NULL && s->out_binding != NULL && s->state_write != NULL,
               KILN_ERR_NO_MEMORY, "out of memory laying out the plan");
    for (size_t v = 0; v < nv; v++) s->tensor_of[v] = s->out_binding[v] = s->state_write[v] = -1;
    for (size_t k = 0; k < b->n_states; k++) {
        int32_t w = b->states[k].write;
        if (w < 0) continue;
        KILN_CHECK(s->state_write[w] < 0 && b->values[w].kind == KILN_IR_NODE, KILN_ERR_INTERNAL,
                   "emission: state %zu's update shares its value or is not computed", k);
        s->state_write[w] = (int32_t)k;
    }
    for (size_t i = 0; i < b->n_outputs; i++) {
        int32_t v = b->outputs[i].value;
        KILN_CHECK(s->out_binding[v] < 0 && b->values[v].kind == KILN_IR_NODE, KILN_ERR_INTERNAL,
                   "emission: output %zu shares its value or is not computed", i);
        s->out_binding[v] = (int32_t)i;
    }
    KILN_TRY(GROW(s, strings, 1));
    s->strings[0] = '\0';
    s->n_strings = 1;
    for (size_t i = 0; i < b->n_inputs; i++) {
        int32_t v = b->inputs[i];
        KILN_TRY(
            new_tensor(s, v, KILN_TENSOR_INPUT, (uint32_t)i, b->values[v].name, &s->tensor_of[v]));
    }
    for (size_t k = 0; k < b->n_states; k++) {
        int32_t v = b->states[k].value;
        KILN_TRY(
            new_tensor(s, v, KILN_TENSOR_STATE, (uint32_t)k, b->values[v].name, &s->tensor_of[v]));
    }
    KILN_TRY(emit_layers(s));
    for (size_t i = 0; i < b->n_outputs; i++) {
        int32_t t = s->tensor_of[b->outputs[i].value];
        KILN_CHECK(t >= 0 && s->tensors[t].kind == KILN_TENSOR_OUTPUT, KILN_ERR_INTERNAL,
                   "emission: output %zu is not written by any layer", i);
    }
    KILN_TRY(plan_activations(s, &p->arena_nbytes));
    KILN_TRY(place_weights(s, &p->weights_nbytes));
    KILN_CHECK(s->n_strings <= KILN_FORMAT_MAX_STRINGS_NBYTES, KILN_ERR_UNSUPPORTED,
               "the engine's names take %zu bytes, more than the format's %u", s->n_strings,
               (unsigned)KILN_FORMAT_MAX_STRINGS_NBYTES);

    // Bindings.
    p->n_inputs = (uint32_t)b->n_inputs;
    if (b->n_inputs > 0) {
        p->inputs = kiln_malloc(b->n_inputs * sizeof *p->inputs, KILN_ALIGN);
        KILN_CHECK(p->inputs != NULL, KILN_ERR_NO_MEMORY, "out of memory finishing the plan");
        for (size_t i = 0; i < b->n_inputs; i++)
            p->inputs[i] = (uint32_t)s->tensor_of[b->inputs[i]];
    }
    p->n_outputs = (uint32_t)b->n_outputs;
    p->outputs = kiln_malloc(b->n_outputs * sizeof *p->outputs, KILN_ALIGN);
    KILN_CHECK(p->outputs != NULL, KILN_ERR_NO_MEMORY, "out of memory finishing the plan");
    for (size_t i = 0; i < b->n_outputs; i++) {
        p->outputs[i] = (uint32_t)s->tensor_of[b->outputs[i].value];
    }
    // Weight bytes.
    if (p->weights_nbytes > 0) {
        p->weights = kiln_calloc((size_t)p->weights_nbytes, KILN_DATA_ALIGN);
        KILN_CHECK(p->weights != NULL, KILN_ERR_NO_MEMORY,
                   "out of memory: %" PRIu64 " bytes of inline weights", p->weights_nbytes);
        for (size_t i = 0; i < s->n_tensors; i++) {
            const kiln_plan_tensor *t = &s->tensors[i];
            if ((t->kind != KILN_TENSOR_WEIGHT && t->kind != KILN_TENSOR_STATE) ||
                t->key != KILN_NO_KEY || t->offset == KILN_STATE_ZERO || t->nbytes == 0) {
                continue;
            }
            memcpy(p->weights + t->offset, b->values[s->tensor_value[i]].data, (size_t)t->nbytes);
        }
    }
    p->n_tensors = (uint32_t)s->n_tensors;
    KILN_TRY(shrink((void **)&s->tensors, s->n_tensors, s->cap_tensors, sizeof *s->tensors, &q));
    p->tensors = q;
    p->n_layers = (uint32_t)s->n_layers;
    KILN_TRY(shrink((void **)&s->layers, s->n_layers, s->cap_layers, sizeof *s->layers, &q));
    p->layers = q;
    p->n_ids = (uint32_t)s->n_ids;
    KILN_TRY(shrink((void **)&s->ids, s->n_ids, s->cap_ids, sizeof *s->ids, &q));
    p->ids = q;
    p->n_attr_refs = (uint32_t)s->n_attr_refs;
    KILN_TRY(
        shrink((void **)&s->attr_refs, s->n_attr_refs, s->cap_attr_refs, sizeof *s->attr_refs, &q));
    p->attr_refs = q;
    p->n_ints = s->n_ints;
    KILN_TRY(shrink((void **)&s->ints, s->n_ints, s->cap_ints, sizeof *s->ints, &q));
    p->ints = q;
    p->n_floats = s->n_floats;
    KILN_TRY(shrink((void **)&s->floats, s->n_floats, s->cap_floats, sizeof *s->floats, &q));
    p->floats = q;
    p->strings_nbytes = s->n_strings;
    KILN_TRY(shrink((void **)&s->strings, s->n_strings, s->cap_strings, 1, &q));
    p->strings = q;
    p->precision = (uint32_t)b->opts.precision;
    return KILN_OK;
}

kiln_status kiln_bgraph_emit(const kiln_bgraph *b, kiln_plan *out, kiln_ext_weight **out_ext,
                             uint32_t *out_n_ext) {
    emit_state s;
    kiln_plan p;
    kiln_status st;
    memset(&s, 0, sizeof s);
    memset(&p, 0, sizeof p);
    s.b = b;
    st = emit(&s, &p);
    if (st == KILN_OK && s.n_ext > 0) {
        void *q = NULL;
        st = shrink((void **)&s.ext, s.n_ext, s.cap_ext, sizeof *s.ext, &q);
        if (st == KILN_OK) {
            *out_ext = q;
            *out_n_ext = (uint32_t)s.n_ext;
        }
    } else if (st == KILN_OK) {
        *out_ext = NULL;
        *out_n_ext = 0;
    }
    state_free(&s);
    if (st != KILN_OK) {
        kiln_plan_release(&p);
        return st;
    }
    *out = p;
    return KILN_OK;
}
