// SPDX-License-Identifier: Apache-2.0
// Small valid engine plans built by hand (no builder), for the format tests, the malformed-input
// battery and the fuzz corpus generator: a fused MLP, a conv net with a broadcast tail and pooling,
// an engine with external weights and float attributes, and an elementwise chain whose memory plan
// reuses arena bytes. Also a field-by-field plan comparison.
#ifndef KILN_TESTS_FORMAT_FIXTURES_H
#define KILN_TESTS_FORMAT_FIXTURES_H

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "runtime/plan.h"

// --- a tiny plan builder with fixed capacity; fx_finish copies into exactly sized kiln_malloc'd
// arrays (what kiln_plan_release expects).

#define FX_CAP 64

typedef struct fx_builder {
    kiln_plan_tensor tensors[FX_CAP];
    uint32_t n_tensors;
    kiln_plan_layer layers[FX_CAP];
    uint32_t n_layers;
    int32_t ids[FX_CAP * 4];
    uint32_t n_ids;
    kiln_attr_ref refs[FX_CAP];
    uint32_t n_refs;
    int64_t ints[FX_CAP];
    uint32_t n_ints;
    double floats[FX_CAP];
    uint32_t n_floats;
    uint32_t inputs[FX_CAP], n_inputs, outputs[FX_CAP], n_outputs;
    char strings[4096];
    uint32_t strings_nbytes;
    uint8_t weights[8192];
    uint64_t weights_nbytes;
    uint64_t arena_nbytes;
    uint32_t precision_;
} fx_builder;

static inline void fx_init(fx_builder *b) {
    memset(b, 0, sizeof *b);
    b->strings_nbytes = 1; // "" at offset 0
}

static inline uint32_t fx_str(fx_builder *b, const char *s) {
    uint32_t off = b->strings_nbytes;
    size_t n = strlen(s) + 1;
    memcpy(b->strings + off, s, n);
    b->strings_nbytes += (uint32_t)n;
    return off;
}

static inline uint32_t fx_tensor(fx_builder *b, uint32_t kind, uint32_t dtype, const char *name,
                                 uint32_t rank, const int64_t *mins, const int64_t *maxs) {
    uint32_t id = b->n_tensors++;
    kiln_plan_tensor *t = &b->tensors[id];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->dtype = dtype;
    t->shape.rank = rank;
    for (uint32_t d = 0; d < rank; d++) {
        t->shape.min[d] = mins[d];
        t->shape.max[d] = maxs ? maxs[d] : mins[d];
    }
    t->name = name ? fx_str(b, name) : 0;
    t->key = KILN_NO_KEY;
    if (kind == KILN_TENSOR_INPUT) {
        t->binding = b->n_inputs;
        b->inputs[b->n_inputs++] = id;
    } else if (kind == KILN_TENSOR_OUTPUT) {
        t->binding = b->n_outputs;
        b->outputs[b->n_outputs++] = id;
    }
    return id;
}

static inline uint64_t fx_max_nbytes(const kiln_plan_tensor *t) {
    uint64_t n = kiln_dtype_size((kiln_dtype)t->dtype);
    for (uint32_t d = 0; d < t->shape.rank; d++) n *= (uint64_t)t->shape.max[d];
    return n;
}

// An inline weight with deterministic non-zero data.
static inline uint32_t fx_weight(fx_builder *b, const char *name, uint32_t rank,
                                 const int64_t *dims) {
    uint32_t id = fx_tensor(b, KILN_TENSOR_WEIGHT, KILN_DTYPE_F32, name, rank, dims, NULL);
    kiln_plan_tensor *t = &b->tensors[id];
    t->nbytes = fx_max_nbytes(t);
    t->offset = (b->weights_nbytes + 63) & ~(uint64_t)63;
    for (uint64_t i = 0; i < t->nbytes / 4; i++) {
        float v = 0.01f * (float)((i * 7 + id) % 23) - 0.1f;
        memcpy(b->weights + t->offset + 4 * i, &v, 4);
    }
    b->weights_nbytes = t->offset + t->nbytes;
    return id;
}

static inline uint32_t fx_external_weight(fx_builder *b, const char *name, const char *key,
                                          uint32_t rank, const int64_t *dims) {
    uint32_t id = fx_tensor(b, KILN_TENSOR_WEIGHT, KILN_DTYPE_F32, name, rank, dims, NULL);
    kiln_plan_tensor *t = &b->tensors[id];
    t->nbytes = fx_max_nbytes(t);
    t->key = fx_str(b, key);
    return id;
}

// An activation at a given arena offset (capacity: the largest shape).
static inline uint32_t fx_act(fx_builder *b, uint32_t dtype, uint64_t offset, uint32_t rank,
                              const int64_t *mins, const int64_t *maxs) {
    uint32_t id = fx_tensor(b, KILN_TENSOR_ACTIVATION, dtype, NULL, rank, mins, maxs);
    kiln_plan_tensor *t = &b->tensors[id];
    t->offset = offset;
    t->nbytes = fx_max_nbytes(t);
    if (offset + t->nbytes > b->arena_nbytes) b->arena_nbytes = offset + t->nbytes;
    return id;
}

static inline uint32_t fx_ints(fx_builder *b, uint32_t n, const int64_t *v) {
    uint32_t r = b->n_refs++;
    b->refs[r] = (kiln_attr_ref){KILN_ATTR_INTS, n, b->n_ints};
    for (uint32_t i = 0; i < n; i++) b->ints[b->n_ints++] = v[i];
    return r;
}

static inline uint32_t fx_floats(fx_builder *b, uint32_t n, const double *v) {
    uint32_t r = b->n_refs++;
    b->refs[r] = (kiln_attr_ref){KILN_ATTR_FLOATS, n, b->n_floats};
    for (uint32_t i = 0; i < n; i++) b->floats[b->n_floats++] = v[i];
    return r;
}

// A layer; attrs are the refs created just before (attr_begin = first_ref, n = n_attrs).
static inline uint32_t fx_layer(fx_builder *b, uint32_t op, uint32_t flags, uint32_t n_in,
                                const int32_t *in, int32_t out, uint32_t first_ref,
                                uint32_t n_attrs) {
    uint32_t i = b->n_layers++;
    kiln_plan_layer *l = &b->layers[i];
    memset(l, 0, sizeof *l);
    l->op = op;
    l->flags = flags;
    l->input_begin = b->n_ids;
    l->n_inputs = n_in;
    for (uint32_t j = 0; j < n_in; j++) b->ids[b->n_ids++] = in[j];
    l->output_begin = b->n_ids;
    l->n_outputs = 1;
    b->ids[b->n_ids++] = out;
    l->attr_begin = first_ref;
    l->n_attrs = n_attrs;
    if (flags & KILN_LAYER_TAIL) {
        for (int64_t h = (int64_t)i - 1; h >= 0; h--) {
            if (!(b->layers[h].flags & KILN_LAYER_TAIL)) {
                b->layers[h].n_tail++;
                break;
            }
        }
    }
    return i;
}

static inline void *fx_dup(const void *src, size_t nbytes, size_t align) {
    void *p = kiln_malloc(nbytes, align);
    if (p != NULL && nbytes > 0) memcpy(p, src, nbytes);
    return p;
}

static inline void fx_finish(const fx_builder *b, kiln_plan *p) {
    memset(p, 0, sizeof *p);
    p->n_tensors = b->n_tensors;
    p->tensors = fx_dup(b->tensors, b->n_tensors * sizeof(kiln_plan_tensor), 16);
    p->n_layers = b->n_layers;
    p->layers = fx_dup(b->layers, b->n_layers * sizeof(kiln_plan_layer), 16);
    p->n_ids = b->n_ids;
    p->ids = fx_dup(b->ids, b->n_ids * sizeof(int32_t), 16);
    p->n_attr_refs = b->n_refs;
    p->attr_refs = fx_dup(b->refs, b->n_refs * sizeof(kiln_attr_ref), 16);
    p->n_ints = b->n_ints;
    p->ints = fx_dup(b->ints, b->n_ints * sizeof(int64_t), 16);
    p->n_floats = b->n_floats;
    p->floats = fx_dup(b->floats, b->n_floats * sizeof(double), 16);
    p->n_inputs = b->n_inputs;
    p->inputs = fx_dup(b->inputs, b->n_inputs * sizeof(uint32_t), 16);
    p->n_outputs = b->n_outputs;
    p->outputs = fx_dup(b->outputs, b->n_outputs * sizeof(uint32_t), 16);
    p->strings_nbytes = b->strings_nbytes;
    p->strings = fx_dup(b->strings, b->strings_nbytes, 1);
    p->weights_nbytes = b->weights_nbytes;
    p->weights = fx_dup(b->weights, (size_t)b->weights_nbytes, 64);
    p->arena_nbytes = b->arena_nbytes;
    p->precision = b->precision_;
}

// --- the fixtures

// x[1..4, 8] -> linear(w1[16,8], b1[16]) + relu (fused tail) -> linear(w2[4,16]) -> y[1..4, 4]
static inline void fx_mlp(kiln_plan *p) {
    static fx_builder b;
    fx_init(&b);
    int64_t xmin[] = {1, 8}, xmax[] = {4, 8};
    uint32_t x = fx_tensor(&b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "x", 2, xmin, xmax);
    int64_t w1d[] = {16, 8}, b1d[] = {16}, w2d[] = {4, 16};
    uint32_t w1 = fx_weight(&b, "fc1.weight", 2, w1d);
    uint32_t b1 = fx_weight(&b, "fc1.bias", 1, b1d);
    uint32_t w2 = fx_weight(&b, "fc2.weight", 2, w2d);
    int64_t hmin[] = {1, 16}, hmax[] = {4, 16};
    uint32_t h = fx_act(&b, KILN_DTYPE_F32, 0, 2, hmin, hmax);
    int64_t ymin[] = {1, 4}, ymax[] = {4, 4};
    uint32_t y = fx_tensor(&b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, "y", 2, ymin, ymax);
    int32_t in0[] = {(int32_t)x, (int32_t)w1, (int32_t)b1};
    fx_layer(&b, KILN_OP_LINEAR, 0, 3, in0, (int32_t)h, 0, 0);
    int32_t in1[] = {(int32_t)h};
    fx_layer(&b, KILN_OP_RELU, KILN_LAYER_TAIL, 1, in1, (int32_t)h, 0, 0);
    int32_t in2[] = {(int32_t)h, (int32_t)w2, -1};
    fx_layer(&b, KILN_OP_LINEAR, 0, 3, in2, (int32_t)y, 0, 0);
    fx_finish(&b, p);
}

// x[1..2, 3, 8, 8] -> conv2d(w[4,3,3,3], bias[4], pad 1) + add(scale[4,1,1]) (fused tail)
// -> max_pool2d(2, 2) -> reshape([x.dim0, 64]) -> y[1..2, 64]
static inline void fx_conv(kiln_plan *p) {
    static fx_builder b;
    fx_init(&b);
    int64_t xmin[] = {1, 3, 8, 8}, xmax[] = {2, 3, 8, 8};
    uint32_t x = fx_tensor(&b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "image", 4, xmin, xmax);
    int64_t wd[] = {4, 3, 3, 3}, bd[] = {4}, sd[] = {4, 1, 1};
    uint32_t w = fx_weight(&b, "conv.weight", 4, wd);
    uint32_t bias = fx_weight(&b, "conv.bias", 1, bd);
    uint32_t sc = fx_weight(&b, "scale", 3, sd);
    int64_t cmin[] = {1, 4, 8, 8}, cmax[] = {2, 4, 8, 8};
    uint32_t c = fx_act(&b, KILN_DTYPE_F32, 0, 4, cmin, cmax);
    int64_t pmin[] = {1, 4, 4, 4}, pmax[] = {2, 4, 4, 4};
    uint32_t pl = fx_act(&b, KILN_DTYPE_F32, 2048, 4, pmin, pmax);
    int64_t ymin[] = {1, 64}, ymax[] = {2, 64};
    uint32_t y = fx_tensor(&b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, "logits", 2, ymin, ymax);
    int64_t one2[] = {1, 1}, zero2[] = {0, 0}, one[] = {1}, two2[] = {2, 2}, zero[] = {0};
    uint32_t r = fx_ints(&b, 2, one2);
    fx_ints(&b, 2, one2); // padding 1
    fx_ints(&b, 2, one2); // dilation
    fx_ints(&b, 1, one);  // groups
    int32_t in0[] = {(int32_t)x, (int32_t)w, (int32_t)bias};
    fx_layer(&b, KILN_OP_CONV2D, 0, 3, in0, (int32_t)c, r, 4);
    int32_t in1[] = {(int32_t)c, (int32_t)sc};
    fx_layer(&b, KILN_OP_ADD, KILN_LAYER_TAIL, 2, in1, (int32_t)c, 0, 0);
    r = fx_ints(&b, 2, two2);
    fx_ints(&b, 2, two2);
    fx_ints(&b, 2, zero2);
    fx_ints(&b, 2, one2);
    fx_ints(&b, 1, zero);
    int32_t in2[] = {(int32_t)c};
    fx_layer(&b, KILN_OP_MAX_POOL2D, 0, 1, in2, (int32_t)pl, r, 5);
    int64_t shape[] = {-2, 64};
    r = fx_ints(&b, 2, shape);
    int32_t in3[] = {(int32_t)pl};
    fx_layer(&b, KILN_OP_RESHAPE, 0, 1, in3, (int32_t)y, r, 1);
    fx_finish(&b, p);
}

// x[2, 3] -> linear(external w[5,3]) -> clamp(min -0.5, max NaN) -> softmax(dim -1) -> y[2, 5]
static inline void fx_external(kiln_plan *p) {
    static fx_builder b;
    fx_init(&b);
    int64_t xd[] = {2, 3}, wd[] = {5, 3}, td[] = {2, 5};
    uint32_t x = fx_tensor(&b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "x", 2, xd, NULL);
    uint32_t w = fx_external_weight(&b, "proj.weight", "kiln-w-0123456789abcdef", 2, wd);
    uint32_t t = fx_act(&b, KILN_DTYPE_F32, 0, 2, td, NULL);
    uint32_t u = fx_act(&b, KILN_DTYPE_F32, 64, 2, td, NULL);
    uint32_t y = fx_tensor(&b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, "probs", 2, td, NULL);
    int32_t in0[] = {(int32_t)x, (int32_t)w};
    fx_layer(&b, KILN_OP_LINEAR, 0, 2, in0, (int32_t)t, 0, 0);
    double lo[] = {-0.5}, hi[] = {NAN};
    uint32_t r = fx_floats(&b, 1, lo);
    fx_floats(&b, 1, hi);
    int32_t in1[] = {(int32_t)t};
    fx_layer(&b, KILN_OP_CLAMP, 0, 1, in1, (int32_t)u, r, 2);
    int64_t dim[] = {-1};
    r = fx_ints(&b, 1, dim);
    int32_t in2[] = {(int32_t)u};
    fx_layer(&b, KILN_OP_SOFTMAX, 0, 1, in2, (int32_t)y, r, 1);
    b.precision_ = KILN_PRECISION_FP16;
    fx_finish(&b, p);
}

// x[3, 1..5], s[1] -> relu a0 -> sigmoid a1 -> tanh a2 -> mul(a2, s) a3 -> gelu(tanh) y
//                                                                        -> cast(f16) z
// The memory plan reuses arena bytes: a0/a2 at 0 and a1/a3 at 64 are never live together.
static inline void fx_chain(kiln_plan *p) {
    static fx_builder b;
    fx_init(&b);
    int64_t mn[] = {3, 1}, mx[] = {3, 5}, one[] = {1};
    uint32_t x = fx_tensor(&b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "x", 2, mn, mx);
    uint32_t s = fx_tensor(&b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "s", 1, one, NULL);
    uint32_t a0 = fx_act(&b, KILN_DTYPE_F32, 0, 2, mn, mx);
    uint32_t a1 = fx_act(&b, KILN_DTYPE_F32, 64, 2, mn, mx);
    uint32_t a2 = fx_act(&b, KILN_DTYPE_F32, 0, 2, mn, mx);
    uint32_t a3 = fx_act(&b, KILN_DTYPE_F32, 64, 2, mn, mx);
    uint32_t y = fx_tensor(&b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, "y", 2, mn, mx);
    uint32_t z = fx_tensor(&b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F16, "z", 2, mn, mx);
    int32_t i0[] = {(int32_t)x}, i1[] = {(int32_t)a0}, i2[] = {(int32_t)a1};
    int32_t i3[] = {(int32_t)a2, (int32_t)s}, i4[] = {(int32_t)a3};
    fx_layer(&b, KILN_OP_RELU, 0, 1, i0, (int32_t)a0, 0, 0);
    fx_layer(&b, KILN_OP_SIGMOID, 0, 1, i1, (int32_t)a1, 0, 0);
    fx_layer(&b, KILN_OP_TANH, 0, 1, i2, (int32_t)a2, 0, 0);
    fx_layer(&b, KILN_OP_MUL, 0, 2, i3, (int32_t)a3, 0, 0);
    int64_t approx[] = {1}, f16[] = {KILN_DTYPE_F16};
    uint32_t r = fx_ints(&b, 1, approx);
    fx_layer(&b, KILN_OP_GELU, 0, 1, i4, (int32_t)y, r, 1);
    r = fx_ints(&b, 1, f16);
    fx_layer(&b, KILN_OP_CAST, 0, 1, i4, (int32_t)z, r, 1);
    fx_finish(&b, p);
}

#define FX_N_FIXTURES 4
static inline const char *fx_name(int i) {
    static const char *const names[] = {"mlp", "conv", "external", "chain"};
    return names[i];
}
static inline void fx_make(int i, kiln_plan *p) {
    switch (i) {
    case 0: fx_mlp(p); break;
    case 1: fx_conv(p); break;
    case 2: fx_external(p); break;
    default: fx_chain(p); break;
    }
}

// --- comparison: returns NULL when equal, else the name of the first differing field.

static inline const char *fx_plan_diff(const kiln_plan *a, const kiln_plan *b) {
#define FX_SAME(f)                                                                                 \
    if (a->f != b->f) return #f
#define FX_SAME_MEM(f, n)                                                                          \
    if ((n) > 0 && memcmp(a->f, b->f, (size_t)(n)) != 0) return #f
    FX_SAME(n_tensors);
    for (uint32_t i = 0; i < a->n_tensors; i++) {
        const kiln_plan_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (x->kind != y->kind || x->dtype != y->dtype || x->shape.rank != y->shape.rank ||
            x->name != y->name || x->binding != y->binding || x->offset != y->offset ||
            x->nbytes != y->nbytes || x->key != y->key)
            return "tensors";
        for (uint32_t d = 0; d < x->shape.rank && d < KILN_MAX_RANK; d++) {
            if (x->shape.min[d] != y->shape.min[d] || x->shape.max[d] != y->shape.max[d])
                return "tensors.shape";
        }
    }
    FX_SAME(n_layers);
    for (uint32_t i = 0; i < a->n_layers; i++) {
        const kiln_plan_layer *x = &a->layers[i], *y = &b->layers[i];
        if (x->op != y->op || x->flags != y->flags || x->input_begin != y->input_begin ||
            x->n_inputs != y->n_inputs || x->output_begin != y->output_begin ||
            x->n_outputs != y->n_outputs || x->attr_begin != y->attr_begin ||
            x->n_attrs != y->n_attrs || x->n_tail != y->n_tail)
            return "layers";
    }
    FX_SAME(n_ids);
    FX_SAME_MEM(ids, a->n_ids * sizeof(int32_t));
    FX_SAME(n_attr_refs);
    for (uint32_t i = 0; i < a->n_attr_refs; i++) {
        if (a->attr_refs[i].kind != b->attr_refs[i].kind ||
            a->attr_refs[i].n != b->attr_refs[i].n ||
            a->attr_refs[i].begin != b->attr_refs[i].begin)
            return "attr_refs";
    }
    FX_SAME(n_ints);
    FX_SAME_MEM(ints, a->n_ints * sizeof(int64_t));
    FX_SAME(n_floats);
    FX_SAME_MEM(floats, a->n_floats * sizeof(double)); // bitwise: NaN == NaN
    FX_SAME(n_inputs);
    FX_SAME_MEM(inputs, a->n_inputs * sizeof(uint32_t));
    FX_SAME(n_outputs);
    FX_SAME_MEM(outputs, a->n_outputs * sizeof(uint32_t));
    FX_SAME(strings_nbytes);
    FX_SAME_MEM(strings, a->strings_nbytes);
    FX_SAME(arena_nbytes);
    FX_SAME(weights_nbytes);
    FX_SAME_MEM(weights, a->weights_nbytes);
    FX_SAME(precision);
    return NULL;
#undef FX_SAME
#undef FX_SAME_MEM
}

#endif // KILN_TESTS_FORMAT_FIXTURES_H
