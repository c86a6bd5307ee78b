// SPDX-License-Identifier: Apache-2.0
// Larger graphs end to end (build -> load -> execute on the CPU) against references computed
// here from the same weights with naive loops in double: a small ResNet-style stack (stem,
// two residual blocks, a strided down-sampling stage, global pooling, classifier), a pre-norm
// transformer encoder layer (multi-head sdpa + GELU feed-forward, residuals), and a deep MLP
// (GELU, SiLU). fp32 with tight tolerances, fp16/bf16 with loose ones; dynamic batch and
// sequence lengths; inline and external weights.
#include "test_util.h"

// Observed worst errors (values of magnitude ~1-3): fp32 ~5e-7, fp16 ~1.5e-3, bf16 ~1.2e-2;
// the tolerances leave a margin of about 4x.
static double atol_of(kiln_precision p) {
    return p == KILN_PRECISION_FP32 ? 1e-5 : p == KILN_PRECISION_FP16 ? 6e-3 : 4e-2;
}
static double rtol_of(kiln_precision p) {
    return p == KILN_PRECISION_FP32 ? 1e-5 : p == KILN_PRECISION_FP16 ? 6e-3 : 2e-2;
}
static const char *pname(kiln_precision p) {
    return p == KILN_PRECISION_FP32 ? "fp32" : p == KILN_PRECISION_FP16 ? "fp16" : "bf16";
}

// Builds, loads (CPU) and frees the built engine; NULL on failure.
static kiln_engine *build_load(kiln_graph *g, kiln_precision prec, int external) {
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    if (g == NULL) return NULL;
    CHECK_OK(tu_build(g, prec, external, &b));
    kiln_graph_free(g);
    if (b == NULL) return NULL;
    CHECK_OK(tu_load(b, "cpu", &e));
    kiln_built_free(b);
    return e;
}

// Runs one input / one output; returns the status of execute.
static kiln_status run1(kiln_context *c, uint32_t rank, const int64_t *dims, const float *x,
                        float *y, size_t y_nbytes) {
    TU_TRY(kiln_context_set_input(c, 0, rank, dims, x));
    TU_TRY(kiln_context_set_output(c, 0, y, y_nbytes));
    return kiln_context_execute(c);
}

// --- ResNet-style stack: x[N, 4, 8, 8], N in [1, 2]

#define RC0 4
#define RC 8
#define RC2 16
#define RHW 8
#define RN 2
#define RCLS 10

typedef struct conv_bn {
    int64_t cin, cout, stride;
    int has_bias;
    float *w, *b, *g, *beta, *mean, *var;
} conv_bn;

static void conv_bn_init(conv_bn *c, int64_t cin, int64_t cout, int64_t stride, int has_bias) {
    float s = 1.0f / sqrtf((float)(cin * 9));
    c->cin = cin;
    c->cout = cout;
    c->stride = stride;
    c->has_bias = has_bias;
    c->w = tu_rand(cout * cin * 9, -s * 1.7f, s * 1.7f);
    c->b = has_bias ? tu_rand(cout, -0.1f, 0.1f) : NULL;
    c->g = tu_rand(cout, 0.7f, 1.3f);
    c->beta = tu_rand(cout, -0.1f, 0.1f);
    c->mean = tu_rand(cout, -0.1f, 0.1f);
    c->var = tu_rand(cout, 0.6f, 1.4f);
}

static void conv_bn_free(conv_bn *c) {
    free(c->w);
    free(c->b);
    free(c->g);
    free(c->beta);
    free(c->mean);
    free(c->var);
}

// conv3x3 (padding 1) + batch norm, optionally + relu.
static int32_t conv_bn_nodes(kiln_graph *g, const conv_bn *c, int32_t x, int relu) {
    int32_t w = tu_const(g, NULL, KILN_DTYPE_F32, 4, TU_DIMS(c->cout, c->cin, 3, 3), c->w);
    int32_t b = c->has_bias ? tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(c->cout), c->b) : -1;
    int32_t ga = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(c->cout), c->g);
    int32_t be = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(c->cout), c->beta);
    int32_t mu = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(c->cout), c->mean);
    int32_t va = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(c->cout), c->var);
    int32_t h =
        tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w, b),
                TU_ATTRS(TU_INTS("stride", c->stride, c->stride), TU_INTS("padding", 1, 1)));
    h = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(h, ga, be, mu, va), TU_NO_ATTRS);
    return relu ? tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS) : h;
}

// Reference of conv_bn_nodes: y gets [n, cout, hw / stride, hw / stride].
static void conv_bn_ref(const conv_bn *c, const float *x, int64_t n, int64_t hw, int relu,
                        float *y) {
    int64_t ohw = (hw + 2 - 3) / c->stride + 1;
    ref_conv2d(x, n, c->cin, hw, hw, c->w, c->cout, 3, 3, c->stride, 1, c->b, y);
    ref_batch_norm(y, n, c->cout, ohw * ohw, c->g, c->beta, c->mean, c->var, 1e-5);
    if (relu) ref_relu(y, n * c->cout * ohw * ohw);
}

typedef struct resnet {
    conv_bn stem, blk[2][2], down;
    float *fc_w, *fc_b;
} resnet;

static void test_resnet(kiln_precision prec, int external) {
    resnet r;
    kiln_graph *g = NULL;
    kiln_engine *e;
    kiln_context *c = NULL;
    int32_t x, h, t, w, b;
    char what[64];
    conv_bn_init(&r.stem, RC0, RC, 1, 1);
    for (int i = 0; i < 2; i++) {
        conv_bn_init(&r.blk[i][0], RC, RC, 1, 0);
        conv_bn_init(&r.blk[i][1], RC, RC, 1, 0);
    }
    conv_bn_init(&r.down, RC, RC2, 2, 0);
    r.fc_w = tu_rand(RCLS * RC2, -0.25f, 0.25f);
    r.fc_b = tu_rand(RCLS, -0.1f, 0.1f);

    CHECK_OK(kiln_graph_new(&g));
    if (g != NULL) {
        x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, RC0, RHW, RHW),
                     TU_DIMS(RN, RC0, RHW, RHW));
        h = conv_bn_nodes(g, &r.stem, x, 1);
        for (int i = 0; i < 2; i++) {
            t = conv_bn_nodes(g, &r.blk[i][0], h, 1);
            t = conv_bn_nodes(g, &r.blk[i][1], t, 0);
            h = tu_node(g, KILN_OP_ADD, TU_IDS(t, h), TU_NO_ATTRS);
            h = tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS);
        }
        h = conv_bn_nodes(g, &r.down, h, 1);
        h = tu_node(g, KILN_OP_ADAPTIVE_AVG_POOL2D, TU_IDS(h),
                    TU_ATTRS(TU_INTS("output_size", 1, 1)));
        h = tu_node(g, KILN_OP_RESHAPE, TU_IDS(h), TU_ATTRS(TU_INTS("shape", -2, RC2)));
        w = tu_const(g, "fc.w", KILN_DTYPE_F32, 2, TU_DIMS(RCLS, RC2), r.fc_w);
        b = tu_const(g, "fc.b", KILN_DTYPE_F32, 1, TU_DIMS(RCLS), r.fc_b);
        h = tu_node(g, KILN_OP_LINEAR, TU_IDS(h, w, b), TU_NO_ATTRS);
        tu_output(g, h, "logits");
    }
    e = build_load(g, prec, external);
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c));
    for (int64_t n = RN; c != NULL && n >= 1; n--) {
        int64_t big = n * RC2 * RHW * RHW;
        float *xd = tu_rand(n * RC0 * RHW * RHW, -1, 1), *a = tu_alloc(big), *t1 = tu_alloc(big),
              *t2 = tu_alloc(big), *d = tu_alloc(big), *pooled = tu_alloc(n * RC2),
              *ref = tu_alloc(n * RCLS), *out = tu_alloc(RN * RCLS);
        int64_t dims[KILN_MAX_RANK];
        uint32_t rank = 0;
        conv_bn_ref(&r.stem, xd, n, RHW, 1, a);
        for (int i = 0; i < 2; i++) {
            conv_bn_ref(&r.blk[i][0], a, n, RHW, 1, t1);
            conv_bn_ref(&r.blk[i][1], t1, n, RHW, 0, t2);
            ref_add(a, t2, n * RC * RHW * RHW);
            ref_relu(a, n * RC * RHW * RHW);
        }
        conv_bn_ref(&r.down, a, n, RHW, 1, d);
        for (int64_t i = 0; i < n * RC2; i++) {
            double s = 0;
            for (int j = 0; j < (RHW / 2) * (RHW / 2); j++) s += d[i * (RHW / 2) * (RHW / 2) + j];
            pooled[i] = (float)(s / ((RHW / 2) * (RHW / 2)));
        }
        ref_linear(pooled, n, RC2, r.fc_w, RCLS, r.fc_b, ref);
        CHECK_OK(run1(c, 4, TU_DIMS(n, RC0, RHW, RHW), xd, out, RN * RCLS * 4));
        snprintf(what, sizeof what, "resnet %s%s N=%lld", pname(prec), external ? " ext" : "",
                 (long long)n);
        tu_check_close(what, out, ref, n * RCLS, atol_of(prec), rtol_of(prec));
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, dims));
        CHECK(rank == 2 && dims[0] == n && dims[1] == RCLS);
        free(xd);
        free(a);
        free(t1);
        free(t2);
        free(d);
        free(pooled);
        free(ref);
        free(out);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
    conv_bn_free(&r.stem);
    for (int i = 0; i < 2; i++) {
        conv_bn_free(&r.blk[i][0]);
        conv_bn_free(&r.blk[i][1]);
    }
    conv_bn_free(&r.down);
    free(r.fc_w);
    free(r.fc_b);
}

// --- transformer encoder layer (pre-norm): x[B, S, 32], B in [1, 2], S in [1, 16]

#define TD 32
#define TH 4
#define TE 8
#define TF 64
#define TB 2
#define TS 16

typedef struct encoder {
    float ln1_g[TD], ln1_b[TD], ln2_g[TD], ln2_b[TD];
    float wq[TD * TD], bq[TD], wk[TD * TD], bk[TD], wv[TD * TD], bv[TD], wo[TD * TD], bo[TD];
    float w1[TF * TD], b1[TF], w2[TD * TF], b2[TD];
} encoder;

static int32_t linear_nodes(kiln_graph *g, int32_t x, const float *w, const float *b, int64_t n,
                            int64_t k) {
    int32_t wv = tu_const(g, NULL, KILN_DTYPE_F32, 2, TU_DIMS(n, k), w);
    int32_t bv = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(n), b);
    return tu_node(g, KILN_OP_LINEAR, TU_IDS(x, wv, bv), TU_NO_ATTRS);
}

static int32_t ln_nodes(kiln_graph *g, int32_t x, const float *gamma, const float *beta) {
    int32_t ga = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(TD), gamma);
    int32_t be = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(TD), beta);
    return tu_node(g, KILN_OP_LAYER_NORM, TU_IDS(x, ga, be),
                   TU_ATTRS(TU_INTS("normalized_ndim", 1), TU_FLOATS("eps", 1e-5)));
}

static int32_t heads_split(kiln_graph *g, int32_t x) {
    x = tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", -2, -3, TH, TE)));
    return tu_node(g, KILN_OP_PERMUTE, TU_IDS(x), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
}

static kiln_graph *encoder_graph(const encoder *m) {
    kiln_graph *g = NULL;
    int32_t x, h, q, k, v, a, y, f;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return NULL;
    x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 1, TD), TU_DIMS(TB, TS, TD));
    h = ln_nodes(g, x, m->ln1_g, m->ln1_b);
    q = heads_split(g, linear_nodes(g, h, m->wq, m->bq, TD, TD));
    k = heads_split(g, linear_nodes(g, h, m->wk, m->bk, TD, TD));
    v = heads_split(g, linear_nodes(g, h, m->wv, m->bv, TD, TD));
    a = tu_node(g, KILN_OP_SDPA, TU_IDS(q, k, v), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_PERMUTE, TU_IDS(a), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    a = tu_node(g, KILN_OP_RESHAPE, TU_IDS(a), TU_ATTRS(TU_INTS("shape", -2, -3, TD)));
    a = linear_nodes(g, a, m->wo, m->bo, TD, TD);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(x, a), TU_NO_ATTRS);
    f = ln_nodes(g, y, m->ln2_g, m->ln2_b);
    f = linear_nodes(g, f, m->w1, m->b1, TF, TD);
    f = tu_node(g, KILN_OP_GELU, TU_IDS(f), TU_NO_ATTRS);
    f = linear_nodes(g, f, m->w2, m->b2, TD, TF);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, f), TU_NO_ATTRS);
    tu_output(g, y, "y");
    return g;
}

static void encoder_ref(const encoder *m, const float *x, int64_t b, int64_t s, float *out) {
    int64_t rows = b * s, n = rows * TD;
    float *h = tu_alloc(n), *q = tu_alloc(n), *k = tu_alloc(n), *v = tu_alloc(n), *a = tu_alloc(n),
          *o = tu_alloc(n), *f = tu_alloc(rows * TF);
    ref_layer_norm(x, rows, TD, m->ln1_g, m->ln1_b, 1e-5, h);
    ref_linear(h, rows, TD, m->wq, TD, m->bq, q);
    ref_linear(h, rows, TD, m->wk, TD, m->bk, k);
    ref_linear(h, rows, TD, m->wv, TD, m->bv, v);
    ref_mha(q, k, v, b, s, TH, TE, 0, a);
    ref_linear(a, rows, TD, m->wo, TD, m->bo, o);
    ref_add(o, x, n); // o = y = x + attention
    ref_layer_norm(o, rows, TD, m->ln2_g, m->ln2_b, 1e-5, h);
    ref_linear(h, rows, TD, m->w1, TF, m->b1, f);
    ref_gelu(f, rows * TF);
    ref_linear(f, rows, TF, m->w2, TD, m->b2, out);
    ref_add(out, o, n);
    free(h);
    free(q);
    free(k);
    free(v);
    free(a);
    free(o);
    free(f);
}

static void test_encoder(kiln_precision prec, int external) {
    static encoder m;
    static const int64_t shapes[][2] = {{2, 16}, {1, 1}, {1, 7}, {2, 5}, {2, 16}};
    kiln_engine *e;
    kiln_context *c = NULL;
    char what[80];
    float s = 1.0f / sqrtf(TD);
    tu_fill(m.ln1_g, TD, 0.8f, 1.2f);
    tu_fill(m.ln1_b, TD, -0.1f, 0.1f);
    tu_fill(m.ln2_g, TD, 0.8f, 1.2f);
    tu_fill(m.ln2_b, TD, -0.1f, 0.1f);
    tu_fill(m.wq, TD * TD, -s, s);
    tu_fill(m.wk, TD * TD, -s, s);
    tu_fill(m.wv, TD * TD, -s, s);
    tu_fill(m.wo, TD * TD, -s, s);
    tu_fill(m.bq, TD, -0.1f, 0.1f);
    tu_fill(m.bk, TD, -0.1f, 0.1f);
    tu_fill(m.bv, TD, -0.1f, 0.1f);
    tu_fill(m.bo, TD, -0.1f, 0.1f);
    tu_fill(m.w1, TF * TD, -s, s);
    tu_fill(m.b1, TF, -0.1f, 0.1f);
    tu_fill(m.w2, TD * TF, -0.125f, 0.125f);
    tu_fill(m.b2, TD, -0.1f, 0.1f);
    e = build_load(encoder_graph(&m), prec, external);
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c));
    for (size_t i = 0; c != NULL && i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t b = shapes[i][0], sq = shapes[i][1], n = b * sq * TD;
        float *x = tu_rand(n, -1, 1), *ref = tu_alloc(n), *out = tu_alloc(TB * TS * TD);
        int64_t dims[KILN_MAX_RANK];
        uint32_t rank = 0;
        encoder_ref(&m, x, b, sq, ref);
        CHECK_OK(run1(c, 3, TU_DIMS(b, sq, TD), x, out, TB * TS * TD * 4));
        snprintf(what, sizeof what, "encoder %s%s B=%lld S=%lld", pname(prec),
                 external ? " ext" : "", (long long)b, (long long)sq);
        tu_check_close(what, out, ref, n, atol_of(prec), rtol_of(prec));
        CHECK_OK(kiln_context_output_shape(c, 0, &rank, dims));
        CHECK(rank == 3 && dims[0] == b && dims[1] == sq && dims[2] == TD);
        free(x);
        free(ref);
        free(out);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
}

// --- deep MLP: x[B, 64], B in [1, 16]: 64 -> 128 gelu -> 128 silu -> 128 relu -> 10

#define MI 64
#define MH 128
#define MO 10
#define MB 16

static void test_mlp(kiln_precision prec, int external) {
    static float w[4][MH * MH], b[4][MH];
    static const int64_t ins[4] = {MI, MH, MH, MH}, outs[4] = {MH, MH, MH, MO};
    static const uint32_t acts[4] = {KILN_OP_GELU, KILN_OP_SILU, KILN_OP_RELU, 0};
    kiln_graph *g = NULL;
    kiln_engine *e;
    kiln_context *c = NULL;
    char what[64];
    for (int l = 0; l < 4; l++) {
        float s = 1.5f / sqrtf((float)ins[l]);
        tu_fill(w[l], outs[l] * ins[l], -s, s);
        tu_fill(b[l], outs[l], -0.1f, 0.1f);
    }
    CHECK_OK(kiln_graph_new(&g));
    if (g != NULL) {
        int32_t h = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, MI), TU_DIMS(MB, MI));
        for (int l = 0; l < 4; l++) {
            h = linear_nodes(g, h, w[l], b[l], outs[l], ins[l]);
            if (acts[l]) h = tu_node(g, acts[l], TU_IDS(h), TU_NO_ATTRS);
        }
        tu_output(g, h, "y");
    }
    e = build_load(g, prec, external);
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c));
    for (int64_t n = 1; c != NULL && n <= MB; n = n * 2 + 1) {
        float *x = tu_rand(n * MI, -1, 1), *a = tu_alloc(n * MH), *t = tu_alloc(n * MH),
              *out = tu_alloc(MB * MO);
        memcpy(a, x, (size_t)(n * MI) * 4);
        for (int l = 0; l < 4; l++) {
            ref_linear(a, n, ins[l], w[l], outs[l], b[l], t);
            if (acts[l] == KILN_OP_GELU) ref_gelu(t, n * outs[l]);
            if (acts[l] == KILN_OP_RELU) ref_relu(t, n * outs[l]);
            if (acts[l] == KILN_OP_SILU) {
                for (int64_t i = 0; i < n * outs[l]; i++) t[i] = (float)(t[i] / (1.0 + exp(-t[i])));
            }
            memcpy(a, t, (size_t)(n * outs[l]) * 4);
        }
        CHECK_OK(run1(c, 2, TU_DIMS(n, MI), x, out, MB * MO * 4));
        snprintf(what, sizeof what, "mlp %s%s B=%lld", pname(prec), external ? " ext" : "",
                 (long long)n);
        tu_check_close(what, out, a, n * MO, atol_of(prec), rtol_of(prec));
        free(x);
        free(a);
        free(t);
        free(out);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
}

int main(void) {
    static const kiln_precision precs[] = {KILN_PRECISION_FP32, KILN_PRECISION_FP16,
                                           KILN_PRECISION_BF16};
    kiln_log_set(NULL, NULL, KILN_LOG_ERROR);
    for (int p = 0; p < 3; p++) {
        test_resnet(precs[p], 0);
        test_encoder(precs[p], 0);
        test_mlp(precs[p], 0);
    }
    test_resnet(KILN_PRECISION_FP32, 1);
    test_encoder(KILN_PRECISION_FP16, 1);
    test_mlp(KILN_PRECISION_FP32, 1);
    return check_summary();
}
