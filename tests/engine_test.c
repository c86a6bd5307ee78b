// SPDX-License-Identifier: Apache-2.0
// End to end through the public API: graph -> kiln_build -> kiln_engine_load -> context ->
// execute, for small graphs (MLP with bias + relu, conv + batch norm + relu, layer norm +
// attention block) against naive references written here, in fp32, fp16 and bf16 precision;
// dynamic shapes; every runtime error a caller can provoke; contexts under threads.
#include <pthread.h> // not C11 threads: ThreadSanitizer only follows pthread_create
#include <stdatomic.h>

#include "runtime/backend.h"
#include "test_util.h"

// Observed worst errors (values of magnitude ~1-3): fp32 ~5e-7, fp16 ~1.5e-3, bf16 ~1.2e-2;
// the tolerances leave a margin of about 4x.
static double tol_atol(kiln_precision p) {
    return p == KILN_PRECISION_FP32 ? 1e-5 : p == KILN_PRECISION_FP16 ? 6e-3 : 4e-2;
}
static double tol_rtol(kiln_precision p) {
    return p == KILN_PRECISION_FP32 ? 1e-5 : p == KILN_PRECISION_FP16 ? 6e-3 : 2e-2;
}
static const char *prec_name(kiln_precision p) {
    return p == KILN_PRECISION_FP32 ? "fp32" : p == KILN_PRECISION_FP16 ? "fp16" : "bf16";
}

// --- MLP: y = linear(relu(linear(x, w1, b1)), w2, b2), x[B, 16], B in [1, 8]

#define MK 16
#define MH 32
#define MO 8
#define MB 8

typedef struct mlp {
    float w1[MH * MK], b1[MH], w2[MO * MH], b2[MO];
} mlp;

static void mlp_init(mlp *m) {
    tu_fill(m->w1, MH * MK, -0.5f, 0.5f);
    tu_fill(m->b1, MH, -0.5f, 0.5f);
    tu_fill(m->w2, MO * MH, -0.5f, 0.5f);
    tu_fill(m->b2, MO, -0.5f, 0.5f);
}

static kiln_graph *mlp_graph(const mlp *m, kiln_dtype io) {
    kiln_graph *g = NULL;
    int32_t x, w1, b1, w2, b2, h, y;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return NULL;
    x = tu_input(g, "x", io, 2, TU_DIMS(1, MK), TU_DIMS(MB, MK));
    w1 = tu_const(g, "w1", KILN_DTYPE_F32, 2, TU_DIMS(MH, MK), m->w1);
    b1 = tu_const(g, "b1", KILN_DTYPE_F32, 1, TU_DIMS(MH), m->b1);
    w2 = tu_const(g, "w2", KILN_DTYPE_F32, 2, TU_DIMS(MO, MH), m->w2);
    b2 = tu_const(g, "b2", KILN_DTYPE_F32, 1, TU_DIMS(MO), m->b2);
    if (io != KILN_DTYPE_F32)
        x = tu_node(g, KILN_OP_CAST, TU_IDS(x), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    h = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w1, b1), TU_NO_ATTRS);
    h = tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(h, w2, b2), TU_NO_ATTRS);
    if (io != KILN_DTYPE_F32)
        y = tu_node(g, KILN_OP_CAST, TU_IDS(y), TU_ATTRS(TU_INTS("dtype", io)));
    tu_output(g, y, "y");
    return g;
}

static void mlp_ref(const mlp *m, const float *x, int64_t b, float *y) {
    float h[MB * MH];
    ref_linear(x, b, MK, m->w1, MH, m->b1, h);
    ref_relu(h, b * MH);
    ref_linear(h, b, MH, m->w2, MO, m->b2, y);
}

// Builds and loads an MLP engine on the CPU; NULL on failure (already CHECKed).
static kiln_engine *mlp_engine(const mlp *m, kiln_precision prec, int external, kiln_dtype io,
                               kiln_built **out_built) {
    kiln_graph *g = mlp_graph(m, io);
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    CHECK_OK(tu_build(g, prec, external, &b));
    kiln_graph_free(g);
    if (b == NULL) return NULL;
    CHECK_OK(tu_load(b, "cpu", &e));
    if (out_built != NULL) {
        *out_built = b;
    } else {
        kiln_built_free(b);
    }
    return e;
}

static void test_mlp(kiln_precision prec, int external) {
    mlp m;
    kiln_engine *e;
    kiln_context *c = NULL;
    kiln_binding_info info;
    char what[64];
    mlp_init(&m);
    e = mlp_engine(&m, prec, external, KILN_DTYPE_F32, NULL);
    if (e == NULL) return;
    CHECK_EQ_INT(kiln_engine_n_inputs(e), 1);
    CHECK_EQ_INT(kiln_engine_n_outputs(e), 1);
    CHECK_OK(kiln_engine_binding(e, 1, 0, &info));
    CHECK(strcmp(info.name, "x") == 0 && info.dtype == KILN_DTYPE_F32 && info.rank == 2);
    CHECK(info.dim_min[0] == 1 && info.dim_max[0] == MB && info.dim_min[1] == MK);
    CHECK_EQ_INT(info.max_nbytes, MB * MK * 4);
    CHECK_OK(kiln_engine_binding(e, 0, 0, &info));
    CHECK(strcmp(info.name, "y") == 0 && info.dtype == KILN_DTYPE_F32 && !info.is_input);
    CHECK_EQ_INT(info.max_nbytes, MB * MO * 4);
    CHECK(strcmp(kiln_engine_device(e), "cpu") == 0);
    // fp32 weights: (32 x 16 + 32 + 8 x 32 + 8) floats; half precision stores the GEMM weights
    // in 2 bytes (so the comparisons below really run in that precision).
    if (prec == KILN_PRECISION_FP32) {
        CHECK_EQ_INT(kiln_engine_weight_nbytes(e), (MH * MK + MH + MO * MH + MO) * 4);
    } else {
        CHECK(kiln_engine_weight_nbytes(e) < (MH * MK + MH + MO * MH + MO) * 4);
    }
    CHECK_OK(kiln_context_new(e, &c));
    // Dynamic batch: several sizes inside the range, repeated and in both directions.
    static const int64_t batches[] = {1, 3, 8, 8, 2, 5};
    for (size_t i = 0; c != NULL && i < sizeof batches / sizeof batches[0]; i++) {
        int64_t b = batches[i];
        float x[MB * MK], y[MB * MO], ref[MB * MO];
        int64_t d[KILN_MAX_RANK];
        uint32_t rank = 0;
        tu_fill(x, b * MK, -1, 1);
        mlp_ref(&m, x, b, ref);
        for (int j = 0; j < MB * MO; j++) y[j] = NAN;
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(b, MK), x));
        CHECK_OK(kiln_context_set_output(c, 0, y, sizeof y));
        CHECK_OK(kiln_context_execute(c));
        snprintf(what, sizeof what, "mlp %s%s B=%lld", prec_name(prec), external ? " external" : "",
                 (long long)b);
        tu_check_close(what, y, ref, b * MO, tol_atol(prec), tol_rtol(prec));
        // Nothing is written past the output's actual size.
        for (int64_t j = b * MO; j < MB * MO; j++) CHECK(isnan(y[j]));
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, d));
        CHECK(rank == 2 && d[0] == b && d[1] == MO);
    }
    if (c != NULL) {
        float x[(MB + 1) * MK] = {0};
        // Outside the range: rejected at bind time, naming the dimension and the range.
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, TU_DIMS(MB + 1, MK), x), KILN_ERR_SHAPE);
        CHECK(strstr(kiln_last_error(), "9") != NULL && strstr(kiln_last_error(), "[1, 8]"));
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, TU_DIMS(0, MK), x), KILN_ERR_SHAPE);
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, TU_DIMS(2, MK + 1), x), KILN_ERR_SHAPE);
        CHECK_STATUS(kiln_context_set_input(c, 0, 3, TU_DIMS(2, MK, 1), x), KILN_ERR_SHAPE);
        CHECK_STATUS(kiln_context_set_input(c, 0, 1, TU_DIMS(MK), x), KILN_ERR_SHAPE);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
}

// Memory where the engine runs (kiln_engine_alloc_memory: host memory on the CPU) bound as an
// input and an output without staging, kiln_engine_copy_memory in and out, and the options the
// engine was loaded with (kiln_engine_get_option).
static void test_engine_memory(void) {
    mlp m;
    kiln_built *b = NULL;
    kiln_engine *e, *e2 = NULL;
    kiln_context *c = NULL;
    void *xin = NULL, *yout = NULL, *empty = NULL;
    float x[3 * MK], y[3 * MO], ref[3 * MO];
    char buf[64];
    mlp_init(&m);
    e = mlp_engine(&m, KILN_PRECISION_FP32, 0, KILN_DTYPE_F32, &b);
    if (e == NULL) return;
    CHECK_OK(kiln_engine_alloc_memory(e, MB * MK * 4, &xin));
    CHECK_OK(kiln_engine_alloc_memory(e, MB * MO * 4, &yout));
    CHECK_OK(kiln_engine_alloc_memory(e, 0, &empty)); // a unique pointer, freed like the others
    CHECK(xin != NULL && yout != NULL && empty != NULL && ((uintptr_t)xin % 64) == 0);
    CHECK_OK(kiln_context_new(e, &c));
    if (c != NULL && xin != NULL && yout != NULL) {
        tu_fill(x, 3 * MK, -1, 1);
        mlp_ref(&m, x, 3, ref);
        CHECK_OK(kiln_engine_copy_memory(e, xin, x, sizeof x));
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(3, MK), xin));
        CHECK_OK(kiln_context_set_output(c, 0, yout, MB * MO * 4));
        CHECK_OK(kiln_context_execute(c));
        CHECK_OK(kiln_engine_copy_memory(e, y, yout, sizeof y));
        tu_check_close("mlp through engine memory", y, ref, 3 * MO, 1e-5, 1e-5);
        CHECK_OK(kiln_engine_copy_memory(e, NULL, NULL, 0)); // nothing to copy
        CHECK_STATUS(kiln_engine_copy_memory(e, y, NULL, 4), KILN_ERR_INVALID_ARG);
    }
    CHECK_STATUS(kiln_engine_alloc_memory(e, 4, NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_engine_alloc_memory(NULL, 4, &xin), KILN_ERR_INVALID_ARG);
    kiln_context_free(c);
    kiln_engine_free_memory(e, xin, MB * MK * 4);
    kiln_engine_free_memory(e, yout, MB * MO * 4);
    kiln_engine_free_memory(e, empty, 0);
    kiln_engine_free_memory(e, NULL, 4); // accepted

    // The options the engine was loaded with: the per-load setting, not the process value.
    CHECK_OK(kiln_engine_get_option(e, "device", buf, sizeof buf));
    CHECK(strcmp(buf, "cpu") == 0);
    CHECK_OK(kiln_engine_get_option(e, "link_delegates", buf, sizeof buf));
    CHECK(strcmp(buf, "true") == 0);
    CHECK_STATUS(kiln_engine_get_option(e, "no_such_option", buf, sizeof buf),
                 KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "link_delegates") != NULL); // the valid names are listed
    CHECK_STATUS(kiln_engine_get_option(NULL, "device", buf, sizeof buf), KILN_ERR_INVALID_ARG);
    if (b != NULL) {
        const void *bytes;
        size_t n;
        kiln_load_options lo;
        kiln_option_setting s[2] = {
            {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"},
            {.name = "link_delegates", .type = KILN_OPTION_BOOL, .int_value = 0}};
        CHECK_OK(kiln_built_engine(b, &bytes, &n));
        kiln_load_options_init(&lo);
        lo.resolve = tu_resolve_built;
        lo.resolve_user_data = (void *)(uintptr_t)b;
        lo.settings = s;
        lo.n_settings = 2;
        CHECK_OK(kiln_engine_load(bytes, n, &lo, &e2));
        CHECK_OK(kiln_engine_get_option(e2, "link_delegates", buf, sizeof buf));
        CHECK(strcmp(buf, "false") == 0);
        CHECK_OK(kiln_get_option("link_delegates", buf, sizeof buf)); // the process value holds
        CHECK(strcmp(buf, "true") == 0);
    }
    kiln_engine_free(e2);
    kiln_built_free(b);
    kiln_engine_free(e);
}

// float16 / bfloat16 model inputs and outputs (cast inside the graph), fp32 precision.
static void test_mlp_io(kiln_dtype io) {
    mlp m;
    kiln_engine *e;
    kiln_context *c = NULL;
    float x[MB * MK], xr[MB * MK], ref[MB * MO], y[MB * MO];
    uint16_t xh[MB * MK], yh[MB * MO];
    int64_t b = 6;
    mlp_init(&m);
    e = mlp_engine(&m, KILN_PRECISION_FP32, 0, io, NULL);
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    tu_fill(x, b * MK, -1, 1);
    for (int64_t i = 0; i < b * MK; i++) {
        xh[i] = io == KILN_DTYPE_F16 ? kiln_f32_to_f16(x[i]) : kiln_f32_to_bf16(x[i]);
        xr[i] = tu_round(x[i], io);
    }
    mlp_ref(&m, xr, b, ref);
    for (int64_t i = 0; i < b * MO; i++) ref[i] = tu_round(ref[i], io);
    CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(b, MK), xh));
    CHECK_OK(kiln_context_set_output(c, 0, yh, b * MO * 2));
    CHECK_OK(kiln_context_execute(c));
    tu_to_f32(yh, b * MO, io, y);
    tu_check_close(io == KILN_DTYPE_F16 ? "mlp f16 io" : "mlp bf16 io", y, ref, b * MO,
                   io == KILN_DTYPE_F16 ? 2e-3 : 2e-2, io == KILN_DTYPE_F16 ? 2e-3 : 1e-2);
    kiln_context_free(c);
    kiln_engine_free(e);
}

// --- conv + batch norm + relu, then a stride-2 conv without bias: x[N, 3, 8, 8], N in [1, 4]

#define CC 3
#define CO 6
#define CO2 4
#define CHW 8
#define CN 4

typedef struct convnet {
    float w1[CO * CC * 9], b1[CO], gamma[CO], beta[CO], mean[CO], var[CO], w2[CO2 * CO * 9];
} convnet;

static void test_conv_bn_relu(kiln_precision prec) {
    convnet m;
    kiln_graph *g = NULL;
    kiln_built *bt = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    int32_t x, w1, b1, ga, be, mu, va, w2, h, y;
    char what[64];
    tu_fill(m.w1, CO * CC * 9, -0.4f, 0.4f);
    tu_fill(m.b1, CO, -0.5f, 0.5f);
    tu_fill(m.gamma, CO, 0.5f, 1.5f);
    tu_fill(m.beta, CO, -0.5f, 0.5f);
    tu_fill(m.mean, CO, -0.3f, 0.3f);
    tu_fill(m.var, CO, 0.5f, 2.0f);
    tu_fill(m.w2, CO2 * CO * 9, -0.3f, 0.3f);
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    x = tu_input(g, "image", KILN_DTYPE_F32, 4, TU_DIMS(1, CC, CHW, CHW),
                 TU_DIMS(CN, CC, CHW, CHW));
    w1 = tu_const(g, "w1", KILN_DTYPE_F32, 4, TU_DIMS(CO, CC, 3, 3), m.w1);
    b1 = tu_const(g, "b1", KILN_DTYPE_F32, 1, TU_DIMS(CO), m.b1);
    ga = tu_const(g, "gamma", KILN_DTYPE_F32, 1, TU_DIMS(CO), m.gamma);
    be = tu_const(g, "beta", KILN_DTYPE_F32, 1, TU_DIMS(CO), m.beta);
    mu = tu_const(g, "mean", KILN_DTYPE_F32, 1, TU_DIMS(CO), m.mean);
    va = tu_const(g, "var", KILN_DTYPE_F32, 1, TU_DIMS(CO), m.var);
    w2 = tu_const(g, "w2", KILN_DTYPE_F32, 4, TU_DIMS(CO2, CO, 3, 3), m.w2);
    h = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w1, b1), TU_ATTRS(TU_INTS("padding", 1, 1)));
    h = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(h, ga, be, mu, va), TU_ATTRS(TU_FLOATS("eps", 1e-3)));
    h = tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(h, w2, -1),
                TU_ATTRS(TU_INTS("stride", 2, 2), TU_INTS("padding", 1, 1)));
    tu_output(g, y, "features");
    CHECK_OK(tu_build(g, prec, 0, &bt));
    kiln_graph_free(g);
    if (bt == NULL) return;
    CHECK_OK(tu_load(bt, "cpu", &e));
    kiln_built_free(bt);
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    for (int64_t n = 1; c != NULL && n <= CN; n += 3) {
        int64_t nx = n * CC * CHW * CHW, nh = n * CO * CHW * CHW, ny = n * CO2 * 4 * 4;
        float *xd = tu_rand(nx, -1, 1), *hd = tu_alloc(nh), *ref = tu_alloc(ny),
              *out = tu_alloc(ny);
        int64_t d[KILN_MAX_RANK];
        uint32_t rank = 0;
        ref_conv2d(xd, n, CC, CHW, CHW, m.w1, CO, 3, 3, 1, 1, m.b1, hd);
        ref_batch_norm(hd, n, CO, CHW * CHW, m.gamma, m.beta, m.mean, m.var, 1e-3);
        ref_relu(hd, nh);
        ref_conv2d(hd, n, CO, CHW, CHW, m.w2, CO2, 3, 3, 2, 1, NULL, ref);
        CHECK_OK(kiln_context_set_input(c, 0, 4, TU_DIMS(n, CC, CHW, CHW), xd));
        CHECK_OK(kiln_context_set_output(c, 0, out, (size_t)ny * 4));
        CHECK_OK(kiln_context_execute(c));
        snprintf(what, sizeof what, "conv-bn-relu %s N=%lld", prec_name(prec), (long long)n);
        tu_check_close(what, out, ref, ny, tol_atol(prec), tol_rtol(prec));
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, d));
        CHECK(rank == 4 && d[0] == n && d[1] == CO2 && d[2] == 4 && d[3] == 4);
        free(xd);
        free(hd);
        free(ref);
        free(out);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
}

// --- layer norm + multi-head attention block with a residual: x[B, S, 16], B in [1, 2],
// S in [1, 8] (both dynamic), 2 heads of 8.

#define AD 16
#define AH 2
#define AE 8
#define AB 2
#define AS 8

typedef struct attn {
    float g[AD], b[AD], wq[AD * AD], bq[AD], wk[AD * AD], bk[AD], wv[AD * AD], bv[AD], wo[AD * AD],
        bo[AD];
} attn;

// Adds q/k/v projections, the heads split and merge, sdpa and the output projection; returns
// the block's output value (x + attention(layer_norm(x))).
static int32_t attn_nodes(kiln_graph *g, const attn *m, int32_t x, int causal) {
    int32_t ga = tu_const(g, "ln.g", KILN_DTYPE_F32, 1, TU_DIMS(AD), m->g);
    int32_t be = tu_const(g, "ln.b", KILN_DTYPE_F32, 1, TU_DIMS(AD), m->b);
    const float *ws[4] = {m->wq, m->wk, m->wv, m->wo}, *bs[4] = {m->bq, m->bk, m->bv, m->bo};
    int32_t heads[3], ln, a, o;
    ln = tu_node(g, KILN_OP_LAYER_NORM, TU_IDS(x, ga, be), TU_ATTRS(TU_INTS("normalized_ndim", 1)));
    for (int i = 0; i < 3; i++) {
        int32_t w = tu_const(g, NULL, KILN_DTYPE_F32, 2, TU_DIMS(AD, AD), ws[i]);
        int32_t b = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(AD), bs[i]);
        int32_t p = tu_node(g, KILN_OP_LINEAR, TU_IDS(ln, w, b), TU_NO_ATTRS);
        p = tu_node(g, KILN_OP_RESHAPE, TU_IDS(p), TU_ATTRS(TU_INTS("shape", -2, -3, AH, AE)));
        heads[i] = tu_node(g, KILN_OP_PERMUTE, TU_IDS(p), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    }
    a = tu_node(g, KILN_OP_SDPA, TU_IDS(heads[0], heads[1], heads[2]),
                TU_ATTRS(TU_INTS("is_causal", causal)));
    a = tu_node(g, KILN_OP_PERMUTE, TU_IDS(a), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    a = tu_node(g, KILN_OP_RESHAPE, TU_IDS(a), TU_ATTRS(TU_INTS("shape", -2, -3, AD)));
    {
        int32_t w = tu_const(g, NULL, KILN_DTYPE_F32, 2, TU_DIMS(AD, AD), ws[3]);
        int32_t b = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(AD), bs[3]);
        o = tu_node(g, KILN_OP_LINEAR, TU_IDS(a, w, b), TU_NO_ATTRS);
    }
    return tu_node(g, KILN_OP_ADD, TU_IDS(o, x), TU_NO_ATTRS);
}

static void attn_ref(const attn *m, const float *x, int64_t b, int64_t s, int causal, float *y) {
    int64_t rows = b * s, n = rows * AD;
    float *ln = tu_alloc(n), *q = tu_alloc(n), *k = tu_alloc(n), *v = tu_alloc(n), *a = tu_alloc(n);
    ref_layer_norm(x, rows, AD, m->g, m->b, 1e-5, ln);
    ref_linear(ln, rows, AD, m->wq, AD, m->bq, q);
    ref_linear(ln, rows, AD, m->wk, AD, m->bk, k);
    ref_linear(ln, rows, AD, m->wv, AD, m->bv, v);
    ref_mha(q, k, v, b, s, AH, AE, causal, a);
    ref_linear(a, rows, AD, m->wo, AD, m->bo, y);
    ref_add(y, x, n);
    free(ln);
    free(q);
    free(k);
    free(v);
    free(a);
}

static void test_attention(kiln_precision prec, int causal) {
    attn m;
    kiln_graph *g = NULL;
    kiln_built *bt = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    int32_t x, y;
    char what[80];
    static const int64_t shapes[][2] = {{1, 1}, {2, 8}, {1, 5}, {2, 3}, {2, 3}};
    tu_fill(m.g, AD, 0.5f, 1.5f);
    tu_fill(m.b, AD, -0.2f, 0.2f);
    tu_fill(m.wq, AD * AD, -0.3f, 0.3f);
    tu_fill(m.wk, AD * AD, -0.3f, 0.3f);
    tu_fill(m.wv, AD * AD, -0.3f, 0.3f);
    tu_fill(m.wo, AD * AD, -0.3f, 0.3f);
    tu_fill(m.bq, AD, -0.2f, 0.2f);
    tu_fill(m.bk, AD, -0.2f, 0.2f);
    tu_fill(m.bv, AD, -0.2f, 0.2f);
    tu_fill(m.bo, AD, -0.2f, 0.2f);
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    x = tu_input(g, "tokens", KILN_DTYPE_F32, 3, TU_DIMS(1, 1, AD), TU_DIMS(AB, AS, AD));
    y = attn_nodes(g, &m, x, causal);
    tu_output(g, y, "hidden");
    CHECK_OK(tu_build(g, prec, 0, &bt));
    kiln_graph_free(g);
    if (bt == NULL) return;
    CHECK_OK(tu_load(bt, "cpu", &e));
    kiln_built_free(bt);
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    for (size_t i = 0; c != NULL && i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t b = shapes[i][0], s = shapes[i][1], n = b * s * AD;
        float *xd = tu_rand(n, -1, 1), *ref = tu_alloc(n), *out = tu_alloc(AB * AS * AD);
        int64_t d[KILN_MAX_RANK];
        uint32_t rank = 0;
        attn_ref(&m, xd, b, s, causal, ref);
        CHECK_OK(kiln_context_set_input(c, 0, 3, TU_DIMS(b, s, AD), xd));
        CHECK_OK(kiln_context_set_output(c, 0, out, AB * AS * AD * 4));
        CHECK_OK(kiln_context_execute(c));
        snprintf(what, sizeof what, "attention %s%s B=%lld S=%lld", prec_name(prec),
                 causal ? " causal" : "", (long long)b, (long long)s);
        tu_check_close(what, out, ref, n, tol_atol(prec), tol_rtol(prec));
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, d));
        CHECK(rank == 3 && d[0] == b && d[1] == s && d[2] == AD);
        free(xd);
        free(ref);
        free(out);
    }
    if (c != NULL) {
        float xd[AB * AS * AD] = {0};
        CHECK_STATUS(kiln_context_set_input(c, 0, 3, TU_DIMS(1, AS + 1, AD), xd), KILN_ERR_SHAPE);
        CHECK(strstr(kiln_last_error(), "dimension 1") != NULL);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
}

// --- errors

static int resolver_mode; // 0: right data, 1: unknown key, 2: one byte short, 3: NO_MEMORY
static kiln_built *resolver_built;

static kiln_status test_resolver(void *ud, const char *key, const void **out, size_t *n) {
    kiln_status st;
    (void)ud;
    if (resolver_mode == 1) return KILN_ERR_MISSING_DATA;
    if (resolver_mode == 3) return KILN_ERR_NO_MEMORY;
    st = tu_resolve_built(resolver_built, key, out, n);
    if (st == KILN_OK && resolver_mode == 2) *n -= 1;
    return st;
}

static kiln_status load_with(const kiln_built *b, kiln_weight_resolver r,
                             const kiln_option_setting *s, uint32_t n_s, kiln_engine **out) {
    const void *bytes;
    size_t n;
    kiln_load_options o;
    TU_TRY(kiln_built_engine(b, &bytes, &n));
    kiln_load_options_init(&o);
    o.resolve = r;
    o.settings = s;
    o.n_settings = n_s;
    return kiln_engine_load(bytes, n, &o, out);
}

static void test_errors(void) {
    mlp m;
    kiln_graph *g;
    kiln_built *ext = NULL, *inl = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    const char *key = NULL;
    const void *wd;
    size_t wn;
    float x[MB * MK], y[MB * MO];
    mlp_init(&m);
    tu_fill(x, MB * MK, -1, 1);
    g = mlp_graph(&m, KILN_DTYPE_F32);
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 1, &ext));
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &inl));
    kiln_graph_free(g);
    if (ext == NULL || inl == NULL) goto done;
    resolver_built = ext;
    CHECK(kiln_built_n_weights(ext) >= 1);
    CHECK_OK(kiln_built_weight(ext, 0, &key, &wd, &wn));

    // External weights: no resolver, an unknown key, a wrong size, a failing resolver.
    CHECK_STATUS(load_with(ext, NULL, NULL, 0, &e), KILN_ERR_MISSING_DATA);
    CHECK(key != NULL && strstr(kiln_last_error(), key) != NULL);
    CHECK(strstr(kiln_last_error(), ".ptd") != NULL);
    CHECK(strstr(kiln_last_error(), "resolve") != NULL);
    resolver_mode = 1;
    CHECK_STATUS(load_with(ext, test_resolver, NULL, 0, &e), KILN_ERR_MISSING_DATA);
    CHECK(strstr(kiln_last_error(), "kiln-t-") != NULL);
    resolver_mode = 2;
    CHECK_STATUS(load_with(ext, test_resolver, NULL, 0, &e), KILN_ERR_CORRUPT);
    CHECK(strstr(kiln_last_error(), "kiln-t-") != NULL && strstr(kiln_last_error(), "bytes"));
    resolver_mode = 3;
    CHECK_STATUS(load_with(ext, test_resolver, NULL, 0, &e), KILN_ERR_NO_MEMORY);
    resolver_mode = 0;
    CHECK_OK(load_with(ext, test_resolver, NULL, 0, &e));
    kiln_engine_free(e);
    e = NULL;

    // Options: unknown, wrongly typed, out of range, process-only; a device without CUDA.
    {
        kiln_option_setting s = {.name = "use_cuda_graph", .type = KILN_OPTION_BOOL};
        CHECK_STATUS(load_with(inl, NULL, &s, 1, &e), KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "use_cuda_graphs (bool)") != NULL);
        s = (kiln_option_setting){
            .name = "use_cuda_graphs", .type = KILN_OPTION_STRING, .string_value = "yes"};
        CHECK_STATUS(load_with(inl, NULL, &s, 1, &e), KILN_ERR_INVALID_ARG);
        s = (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_INT, .int_value = 99};
        CHECK_STATUS(load_with(inl, NULL, &s, 1, &e), KILN_ERR_INVALID_ARG);
        s = (kiln_option_setting){
            .name = "use_shared_activation_scratch", .type = KILN_OPTION_BOOL, .int_value = 1};
        CHECK_STATUS(load_with(inl, NULL, &s, 1, &e), KILN_ERR_INVALID_ARG);
        s = (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_INT, .int_value = 4};
        CHECK_OK(load_with(inl, NULL, &s, 1, &e));
        kiln_engine_free(e);
        e = NULL;
        s = (kiln_option_setting){
            .name = "device", .type = KILN_OPTION_STRING, .string_value = "cuda:0"};
        if (kiln_backend_cuda_get() == NULL) { // no CUDA plugin or GPU here
            CHECK_STATUS(load_with(inl, NULL, &s, 1, &e), KILN_ERR_DEVICE);
            CHECK(strstr(kiln_last_error(), "cuda:0") && strstr(kiln_last_error(), "'cpu'"));
            // The process-wide device applies when no per-load setting overrides it.
            CHECK_OK(kiln_set_option_string("device", "cuda:0"));
            CHECK_STATUS(load_with(inl, NULL, NULL, 0, &e), KILN_ERR_DEVICE);
            s.string_value = "auto";
            CHECK_OK(load_with(inl, NULL, &s, 1, &e));
            CHECK(e != NULL && strcmp(kiln_engine_device(e), "cpu") == 0);
            kiln_engine_free(e);
            e = NULL;
            CHECK_OK(kiln_set_option_string("device", "auto"));
        } else {
            fprintf(stderr, "CUDA is available: device error cases skipped\n");
        }
        kiln_load_options o;
        kiln_load_options_init(&o);
        o.struct_nbytes = 12;
        CHECK_STATUS(kiln_engine_load(x, 64, &o, &e), KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "kiln_load_options_init") != NULL);
        CHECK_STATUS(kiln_engine_load(x, sizeof x, NULL, NULL), KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_engine_load(x, sizeof x, NULL, &e), KILN_ERR_NOT_ENGINE);
    }

    // Binding and state errors on a context.
    CHECK_OK(load_with(inl, NULL, NULL, 0, &e));
    if (e == NULL) goto done;
    CHECK_OK(kiln_context_new(e, &c));
    if (c == NULL) goto done;
    {
        uint32_t rank;
        int64_t d[KILN_MAX_RANK];
        CHECK_STATUS(kiln_context_output_shape(c, 0, &rank, d), KILN_ERR_INVALID_STATE);
        CHECK_STATUS(kiln_context_execute(c), KILN_ERR_INVALID_STATE);
        CHECK(strstr(kiln_last_error(), "input 0 'x'") != NULL);
        CHECK_STATUS(kiln_context_set_input(c, 1, 2, TU_DIMS(2, MK), x), KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, TU_DIMS(2, MK), NULL), KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, NULL, x), KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, TU_DIMS(2, 3), x), KILN_ERR_SHAPE);
        CHECK(strstr(kiln_last_error(), "dimension 1 = 3") && strstr(kiln_last_error(), "'x'"));
        // Buffers not aligned to their float32 elements (what a damaged ExecuTorch memory plan
        // hands over): refused by name, not read or written.
        CHECK_STATUS(kiln_context_set_input(c, 0, 2, TU_DIMS(2, MK), (const char *)x + 1),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "not aligned") && strstr(kiln_last_error(), "float32"));
        CHECK_STATUS(kiln_context_set_output(c, 0, (char *)y + 2, 4 * MO * 4),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "output 0 'y'") && strstr(kiln_last_error(), "re-export"));
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(4, MK), x));
        CHECK_STATUS(kiln_context_execute(c), KILN_ERR_INVALID_STATE);
        CHECK(strstr(kiln_last_error(), "output 0 'y'") != NULL);
        CHECK_STATUS(kiln_context_set_output(c, 1, y, sizeof y), KILN_ERR_INVALID_ARG);
        CHECK_OK(kiln_context_set_output(c, 0, y, 4 * MO * 4 - 1));
        CHECK_STATUS(kiln_context_execute(c), KILN_ERR_SHAPE);
        CHECK(strstr(kiln_last_error(), "128 bytes") && strstr(kiln_last_error(), "127"));
        // The shapes are known though: the caller can size its buffer.
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, d));
        CHECK(rank == 2 && d[0] == 4 && d[1] == MO);
        CHECK_OK(kiln_context_set_output(c, 0, y, 4 * MO * 4));
        CHECK_OK(kiln_context_execute(c));
        // infer_shapes for a new batch before running.
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(7, MK), x));
        CHECK_STATUS(kiln_context_output_shape(c, 0, &rank, d), KILN_ERR_INVALID_STATE);
        CHECK_OK(kiln_context_infer_shapes(c));
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, d));
        CHECK(rank == 2 && d[0] == 7);
        CHECK_STATUS(kiln_context_output_shape(c, 1, &rank, d), KILN_ERR_INVALID_ARG);
        CHECK_OK(kiln_context_set_stream(c, NULL)); // ignored on the CPU
    }
done:
    kiln_context_free(c);
    kiln_engine_free(e);
    kiln_built_free(ext);
    kiln_built_free(inl);
}

// --- threads

typedef struct hammer {
    kiln_context *c;
    atomic_int *stop;
    atomic_int saw_busy; // read by the main thread while this one runs
    long ok, busy, other;
} hammer;

// Rebinds its own input (a random batch) and output, then executes, 3000 times: the two racing
// threads replace each other's bindings, so outputs are not checked here, only that every call
// succeeds or reports BUSY and nothing crashes (ASan watches the memory).
typedef struct rebinder {
    kiln_context *c;
    float x[MB * MK], y[MB * MO];
    long ok, busy, other;
} rebinder;

static void count(kiln_status st, long *ok, long *busy, long *other) {
    if (st == KILN_OK) {
        (*ok)++;
    } else if (st == KILN_ERR_BUSY) {
        (*busy)++;
    } else {
        (*other)++;
    }
}

static void *rebinder_main(void *arg) {
    rebinder *r = arg;
    for (int i = 0; i < 3000; i++) {
        int64_t b = 1 + i % MB;
        count(kiln_context_set_input(r->c, 0, 2, TU_DIMS(b, MK), r->x), &r->ok, &r->busy,
              &r->other);
        count(kiln_context_set_output(r->c, 0, r->y, sizeof r->y), &r->ok, &r->busy, &r->other);
        count(kiln_context_execute(r->c), &r->ok, &r->busy, &r->other);
    }
    return NULL;
}

static void *hammer_main(void *arg) {
    hammer *h = arg;
    while (!atomic_load(h->stop)) {
        count(kiln_context_execute(h->c), &h->ok, &h->busy, &h->other);
        if (h->busy > 0) atomic_store(&h->saw_busy, 1);
    }
    return NULL;
}

// Two threads executing one context: every call succeeds or reports BUSY, and the output is the
// reference afterwards (the bindings never change, so any completed run writes the same values).
static void test_busy_threads(void) {
    mlp m;
    kiln_engine *e;
    kiln_context *c = NULL;
    float x[MB * MK], y[MB * MO], ref[MB * MO];
    atomic_int stop;
    hammer h;
    pthread_t t;
    long ok = 0, busy = 0, other = 0;
    struct timespec t0, t1;
    mlp_init(&m);
    e = mlp_engine(&m, KILN_PRECISION_FP32, 0, KILN_DTYPE_F32, NULL);
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    if (c == NULL) goto done;
    tu_fill(x, MB * MK, -1, 1);
    mlp_ref(&m, x, MB, ref);
    CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(MB, MK), x));
    CHECK_OK(kiln_context_set_output(c, 0, y, sizeof y));
    atomic_init(&stop, 0);
    memset(&h, 0, sizeof h);
    h.c = c;
    h.stop = &stop;
    atomic_init(&h.saw_busy, 0);
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    CHECK(pthread_create(&t, NULL, hammer_main, &h) == 0);
    timespec_get(&t0, TIME_UTC);
    // Until both threads saw a BUSY or 5 s passed (2000 calls at least).
    for (long i = 0;; i++) {
        count(kiln_context_execute(c), &ok, &busy, &other);
        timespec_get(&t1, TIME_UTC);
        if (i >= 2000 && ((busy > 0 && atomic_load(&h.saw_busy)) || t1.tv_sec - t0.tv_sec > 5))
            break;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    CHECK_EQ_INT(other, 0);
    CHECK_EQ_INT(h.other, 0);
    CHECK(ok + h.ok > 0);
    CHECK_MSG(busy + h.busy > 0, "no BUSY seen in %ld + %ld calls", ok + busy, h.ok + h.busy);
    fprintf(stderr, "busy test: main %ld ok %ld busy, thread %ld ok %ld busy\n", ok, busy, h.ok,
            h.busy);
    tu_check_close("output after concurrent executes", y, ref, MB * MO, 1e-4, 1e-4);
    CHECK_OK(kiln_context_execute(c));
    tu_check_close("output after a clean execute", y, ref, MB * MO, 1e-4, 1e-4);
    {
        static rebinder r[2];
        pthread_t rt[2];
        kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
        for (int k = 0; k < 2; k++) {
            r[k].c = c;
            tu_fill(r[k].x, MB * MK, -1, 1);
            CHECK(pthread_create(&rt[k], NULL, rebinder_main, &r[k]) == 0);
        }
        for (int k = 0; k < 2; k++) pthread_join(rt[k], NULL);
        kiln_log_set(NULL, NULL, KILN_LOG_NONE);
        CHECK_EQ_INT(r[0].other + r[1].other, 0);
        CHECK(r[0].ok + r[1].ok > 0);
        // The context is intact: rebind and run cleanly.
        memset(y, 0, sizeof y);
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(MB, MK), x));
        CHECK_OK(kiln_context_set_output(c, 0, y, sizeof y));
        CHECK_OK(kiln_context_execute(c));
        tu_check_close("output after racing rebinds", y, ref, MB * MO, 1e-4, 1e-4);
    }
done:
    kiln_context_free(c);
    kiln_engine_free(e);
}

// K threads, one context each on one shared engine: results bit-identical to a single-threaded
// run of the same input.
#define NT 4
#define NITER 50

typedef struct worker {
    kiln_engine *e;
    const float *x[NITER];
    const float *want[NITER];
    int64_t batch[NITER];
    long mismatches, failures;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    kiln_context *c = NULL;
    float y[MB * MO];
    if (kiln_context_new(w->e, &c) != KILN_OK) {
        w->failures++;
        return NULL;
    }
    for (int i = 0; i < NITER; i++) {
        if (kiln_context_set_input(c, 0, 2, TU_DIMS(w->batch[i], MK), w->x[i]) != KILN_OK ||
            kiln_context_set_output(c, 0, y, sizeof y) != KILN_OK ||
            kiln_context_execute(c) != KILN_OK) {
            w->failures++;
            continue;
        }
        if (memcmp(y, w->want[i], (size_t)w->batch[i] * MO * 4) != 0) w->mismatches++;
    }
    kiln_context_free(c);
    return NULL;
}

static void test_shared_engine_threads(void) {
    mlp m;
    kiln_engine *e;
    kiln_context *c = NULL;
    static float xs[NT][NITER][MB * MK], want[NT][NITER][MB * MO];
    static worker w[NT];
    pthread_t t[NT];
    mlp_init(&m);
    e = mlp_engine(&m, KILN_PRECISION_FP32, 0, KILN_DTYPE_F32, NULL);
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    for (int k = 0; c != NULL && k < NT; k++) {
        w[k].e = e;
        for (int i = 0; i < NITER; i++) {
            int64_t b = check_rng_int(1, MB);
            tu_fill(xs[k][i], b * MK, -1, 1);
            CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(b, MK), xs[k][i]));
            CHECK_OK(kiln_context_set_output(c, 0, want[k][i], sizeof want[k][i]));
            CHECK_OK(kiln_context_execute(c));
            w[k].x[i] = xs[k][i];
            w[k].want[i] = want[k][i];
            w[k].batch[i] = b;
        }
    }
    for (int k = 0; k < NT; k++) CHECK(pthread_create(&t[k], NULL, worker_main, &w[k]) == 0);
    for (int k = 0; k < NT; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < NT; k++) {
        CHECK_EQ_INT(w[k].failures, 0);
        CHECK_EQ_INT(w[k].mismatches, 0);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
}

// kiln_context_layer_info on the CPU: every plan layer is described (the fused ReLU as part of
// its head's group), and with the option profile each group's mean time over the executes.
static void test_layer_info(void) {
    mlp m;
    kiln_graph *g;
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    kiln_layer_info info;
    kiln_load_options lo;
    kiln_option_setting s[2] = {
        {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"},
        {.name = "profile", .type = KILN_OPTION_BOOL, .int_value = 1},
    };
    float x[4 * MK], y[4 * MO], ref[4 * MO];
    mlp_init(&m);
    g = mlp_graph(&m, KILN_DTYPE_F32);
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    const void *bytes;
    size_t n;
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    kiln_load_options_init(&lo);
    lo.settings = s;
    lo.n_settings = 2;
    CHECK_OK(kiln_engine_load(bytes, n, &lo, &e));
    kiln_built_free(b);
    if (e == NULL) return;
    // linear (+ fused relu), linear: three plan layers, two groups
    CHECK_EQ_INT(kiln_engine_n_layers(e), 3);
    CHECK_OK(kiln_context_new(e, &c));
    if (c == NULL) goto out;
    CHECK_OK(kiln_context_layer_info(c, 0, &info));
    CHECK(info.op == KILN_OP_LINEAR && info.head == 0 && info.n_fused == 1 && info.flags == 0);
    CHECK(strcmp(info.kernel, "cpu") == 0 && info.n_profiled == 0 && info.device_us < 0);
    CHECK(info.l2_keep_nbytes == -1 && info.workspace_nbytes == 0);
    CHECK_OK(kiln_context_layer_info(c, 1, &info));
    CHECK(info.op == KILN_OP_RELU && info.head == 0 && (info.flags & KILN_LAYER_INFO_TAIL));
    CHECK_MSG(strcmp(info.kernel, "fused") == 0 && strstr(info.detail, "layer 0 (linear, cpu)"),
              "%s: %s", info.kernel, info.detail);
    tu_fill(x, 4 * MK, -1, 1);
    mlp_ref(&m, x, 4, ref);
    for (int k = 0; k < 3; k++) {
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(4, MK), x));
        CHECK_OK(kiln_context_set_output(c, 0, y, sizeof y));
        CHECK_OK(kiln_context_execute(c));
    }
    tu_check_close("layer info mlp (profiled)", y, ref, 4 * MO, 1e-5, 1e-5);
    for (uint32_t li = 0; li < 3; li += 2) {
        CHECK_OK(kiln_context_layer_info(c, li, &info));
        CHECK_MSG(info.n_profiled == 3 && info.device_us >= 0 && info.host_us == info.device_us,
                  "layer %u: %llu runs, %.3f us", li, (unsigned long long)info.n_profiled,
                  info.device_us);
    }
    CHECK_OK(kiln_context_layer_info(c, 1, &info)); // a tail carries no time of its own
    CHECK(info.n_profiled == 0 && info.device_us < 0);
    CHECK_STATUS(kiln_context_layer_info(c, 3, &info), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "3 layers") != NULL);
    CHECK_STATUS(kiln_context_layer_info(c, 0, NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_context_layer_info(NULL, 0, &info), KILN_ERR_INVALID_ARG);
out:
    kiln_context_free(c);
    kiln_engine_free(e);
}

int main(void) {
    test_layer_info();
    static const kiln_precision precs[] = {KILN_PRECISION_FP32, KILN_PRECISION_FP16,
                                           KILN_PRECISION_BF16};
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    for (int i = 0; i < 3; i++) {
        test_mlp(precs[i], 0);
        test_conv_bn_relu(precs[i]);
        test_attention(precs[i], 0);
    }
    test_mlp(KILN_PRECISION_FP32, 1);
    test_mlp(KILN_PRECISION_FP16, 1);
    test_attention(KILN_PRECISION_FP32, 1);
    test_mlp_io(KILN_DTYPE_F16);
    test_mlp_io(KILN_DTYPE_BF16);
    test_errors();
    test_engine_memory();
    test_busy_threads();
    test_shared_engine_threads();
    return check_summary();
}
