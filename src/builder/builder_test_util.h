// SPDX-License-Identifier: Apache-2.0
// Helpers for the builder's tests: build and load back the plan through the real serializer and
// loader (so every plan a test inspects passed the loader's validation), count layers, and run
// two builds of one graph on the same random inputs to compare their outputs.
#ifndef KILN_BUILDER_TEST_UTIL_H
#define KILN_BUILDER_TEST_UTIL_H

#include "builder/builder.h"
#include "runtime/load.h"
#include "test_util.h"

static inline kiln_build_options bt_opts(int optimize, kiln_precision precision, int external) {
    kiln_build_options o;
    kiln_build_options_init(&o);
    o.optimize = optimize;
    o.precision = precision;
    o.external_weights = external;
    return o;
}

// Builds and reads the engine back with the loader (validation included). 0 on failure.
static inline int bt_plan(const kiln_graph *g, const kiln_build_options *o, kiln_plan *out) {
    kiln_built *b = NULL;
    const void *bytes;
    size_t n;
    kiln_status st = kiln_build(g, o, &b);
    CHECK_MSG(st == KILN_OK, "kiln_build: %s: %s", kiln_status_str(st), kiln_last_error());
    if (st != KILN_OK) return 0;
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    memset(out, 0, sizeof *out);
    st = kiln_load_plan(bytes, n, out);
    CHECK_MSG(st == KILN_OK, "kiln_load_plan rejects the built engine: %s: %s", kiln_status_str(st),
              kiln_last_error());
    kiln_built_free(b);
    return st == KILN_OK;
}

static inline uint32_t bt_count(const kiln_plan *p, uint32_t op) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_layers; i++) n += p->layers[i].op == op;
    return n;
}

static inline uint32_t bt_count_kind(const kiln_plan *p, uint32_t kind) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) n += p->tensors[i].kind == kind;
    return n;
}

// "linear+2|relu" style summary of the layers: op names, "+N" for heads with N tails, '|'
// between groups, ',' between a head and its tails.
static inline const char *bt_layers(const kiln_plan *p, char *buf, size_t n) {
    size_t u = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < p->n_layers && u < n; i++) {
        const kiln_plan_layer *l = &p->layers[i];
        int w = snprintf(buf + u, n - u, "%s%s",
                         i == 0                         ? ""
                         : (l->flags & KILN_LAYER_TAIL) ? ","
                                                        : "|",
                         kiln_op_name(l->op));
        if (w < 0) break;
        u += (size_t)w;
    }
    return buf;
}

#define BT_EXPECT_LAYERS(plan, want)                                                               \
    do {                                                                                           \
        char bt_buf_[512];                                                                         \
        bt_layers((plan), bt_buf_, sizeof bt_buf_);                                                \
        CHECK_MSG(strcmp(bt_buf_, (want)) == 0, "layers are '%s', expected '%s'", bt_buf_,         \
                  (want));                                                                         \
    } while (0)

typedef struct bt_shape {
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
} bt_shape;

typedef struct bt_outputs {
    uint32_t n;
    float *data[8];
    int64_t numel[8];
    bt_shape shape[8];
} bt_outputs;

static inline void bt_outputs_free(bt_outputs *o) {
    for (uint32_t i = 0; i < o->n; i++) free(o->data[i]);
    memset(o, 0, sizeof *o);
}

// Random input data of a binding's dtype: floats in [-1, 1), integers in [0, int_hi], bools.
static inline void *bt_random_input(kiln_dtype dtype, int64_t n, int64_t int_hi) {
    size_t es = kiln_dtype_size(dtype);
    uint8_t *p = calloc((size_t)(n > 0 ? n : 1), es);
    if (p == NULL) exit(2);
    for (int64_t i = 0; i < n; i++) {
        switch (dtype) {
        case KILN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)check_rng_int(0, int_hi); break;
        case KILN_DTYPE_I64: ((int64_t *)p)[i] = check_rng_int(0, int_hi); break;
        case KILN_DTYPE_BOOL: p[i] = (uint8_t)check_rng_int(0, 1); break;
        default: kiln_store_f32(p, dtype, i, check_rng_uniform(-1.0f, 1.0f)); break;
        }
    }
    return p;
}

// Loads a built engine on the CPU and runs it once on inputs (data in the bindings' dtypes);
// outputs come back as float. 0 on failure.
static inline int bt_run(const kiln_built *b, uint32_t n_in, const bt_shape *shapes,
                         void *const *in_data, bt_outputs *out) {
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    void *obuf[8] = {0};
    int ok = 0;
    memset(out, 0, sizeof *out);
    if (tu_load(b, NULL, &e) != KILN_OK || kiln_context_new(e, &c) != KILN_OK) {
        CHECK_MSG(0, "load: %s", kiln_last_error());
        goto done;
    }
    CHECK(kiln_engine_n_inputs(e) == n_in);
    out->n = kiln_engine_n_outputs(e);
    if (out->n > 8) goto done;
    for (uint32_t i = 0; i < n_in; i++) {
        if (kiln_context_set_input(c, i, shapes[i].rank, shapes[i].dims, in_data[i]) != KILN_OK) {
            CHECK_MSG(0, "set_input %u: %s", i, kiln_last_error());
            goto done;
        }
    }
    for (uint32_t i = 0; i < out->n; i++) {
        kiln_binding_info bi;
        CHECK_OK(kiln_engine_binding(e, 0, i, &bi));
        obuf[i] = calloc((size_t)bi.max_nbytes + 1, 1);
        CHECK_OK(kiln_context_set_output(c, i, obuf[i], (size_t)bi.max_nbytes));
    }
    if (kiln_context_execute(c) != KILN_OK) {
        CHECK_MSG(0, "execute: %s", kiln_last_error());
        goto done;
    }
    for (uint32_t i = 0; i < out->n; i++) {
        kiln_binding_info bi;
        CHECK_OK(kiln_engine_binding(e, 0, i, &bi));
        CHECK_OK(kiln_context_output_shape(c, i, &out->shape[i].rank, out->shape[i].dims));
        out->numel[i] = tu_numel(out->shape[i].rank, out->shape[i].dims);
        out->data[i] = tu_alloc(out->numel[i]);
        for (int64_t k = 0; k < out->numel[i]; k++) {
            out->data[i][k] = kiln_load_f32(obuf[i], bi.dtype, k);
        }
    }
    ok = 1;
done:
    for (uint32_t i = 0; i < 8; i++) free(obuf[i]);
    kiln_context_free(c);
    kiln_engine_free(e);
    return ok;
}

// Builds g twice (options a and b), runs both on the same random inputs of the given concrete
// shapes and compares every output. Integer inputs get values in [0, int_hi].
static inline void bt_compare(const kiln_graph *g, const kiln_build_options *oa,
                              const kiln_build_options *ob, uint32_t n_in, const bt_shape *shapes,
                              int64_t int_hi, double atol, double rtol, const char *what) {
    kiln_built *ba = NULL, *bb = NULL;
    void *in[8] = {0};
    bt_outputs ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    if (kiln_build(g, oa, &ba) != KILN_OK || kiln_build(g, ob, &bb) != KILN_OK) {
        CHECK_MSG(0, "%s: build: %s", what, kiln_last_error());
        goto done;
    }
    {
        kiln_engine *e = NULL;
        CHECK_OK(tu_load(ba, NULL, &e));
        for (uint32_t i = 0; i < n_in && e != NULL; i++) {
            kiln_binding_info bi;
            CHECK_OK(kiln_engine_binding(e, 1, i, &bi));
            in[i] = bt_random_input(bi.dtype, tu_numel(shapes[i].rank, shapes[i].dims), int_hi);
        }
        kiln_engine_free(e);
    }
    if (!bt_run(ba, n_in, shapes, in, &ra) || !bt_run(bb, n_in, shapes, in, &rb)) goto done;
    CHECK(ra.n == rb.n);
    for (uint32_t i = 0; i < ra.n && i < rb.n; i++) {
        char name[128];
        CHECK_MSG(
            ra.shape[i].rank == rb.shape[i].rank &&
                memcmp(ra.shape[i].dims, rb.shape[i].dims, ra.shape[i].rank * sizeof(int64_t)) == 0,
            "%s: output %u shapes differ", what, i);
        snprintf(name, sizeof name, "%s: output %u", what, i);
        if (ra.numel[i] == rb.numel[i]) {
            tu_check_close(name, ra.data[i], rb.data[i], ra.numel[i], atol, rtol);
        }
    }
done:
    for (uint32_t i = 0; i < 8; i++) free(in[i]);
    bt_outputs_free(&ra);
    bt_outputs_free(&rb);
    kiln_built_free(ba);
    kiln_built_free(bb);
}

#endif // KILN_BUILDER_TEST_UTIL_H
