// SPDX-License-Identifier: Apache-2.0
// Determinism: the same graph and options build byte-identical engines (also from two graphs
// constructed separately with the same calls), in every precision and with external weights;
// load + serialize round-trips to the same bytes; external and inline weights give bit-identical
// outputs; repeated executes and separate contexts give bit-identical outputs.
#include "builder/serialize.h"
#include "core/alloc.h"
#include "runtime/load.h"
#include "test_util.h"

#define B_MAX 4
#define C_IN 3
#define HW 8
#define C1 8
#define D 16
#define NCLS 5

typedef struct model {
    float conv_w[C1 * C_IN * 9], conv_b[C1], gamma[C1], beta[C1], mean[C1], var[C1];
    float fc_w[NCLS * C1], fc_b[NCLS];
} model;

static model m;

// conv3x3 + bn + relu -> max_pool 2x2 -> adaptive avg pool 1x1 -> reshape [N, C1] -> linear ->
// softmax, plus a second output: the pooled features through gelu.
static kiln_graph *make_graph(void) {
    kiln_graph *g = NULL;
    int32_t x, w, b, ga, be, mu, va, fw, fb, h, f, y, z;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return NULL;
    x = tu_input(g, "image", KILN_DTYPE_F32, 4, TU_DIMS(1, C_IN, HW, HW),
                 TU_DIMS(B_MAX, C_IN, HW, HW));
    w = tu_const(g, "conv.w", KILN_DTYPE_F32, 4, TU_DIMS(C1, C_IN, 3, 3), m.conv_w);
    b = tu_const(g, "conv.b", KILN_DTYPE_F32, 1, TU_DIMS(C1), m.conv_b);
    ga = tu_const(g, "bn.g", KILN_DTYPE_F32, 1, TU_DIMS(C1), m.gamma);
    be = tu_const(g, "bn.b", KILN_DTYPE_F32, 1, TU_DIMS(C1), m.beta);
    mu = tu_const(g, "bn.mean", KILN_DTYPE_F32, 1, TU_DIMS(C1), m.mean);
    va = tu_const(g, "bn.var", KILN_DTYPE_F32, 1, TU_DIMS(C1), m.var);
    fw = tu_const(g, "fc.w", KILN_DTYPE_F32, 2, TU_DIMS(NCLS, C1), m.fc_w);
    fb = tu_const(g, "fc.b", KILN_DTYPE_F32, 1, TU_DIMS(NCLS), m.fc_b);
    h = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w, b), TU_ATTRS(TU_INTS("padding", 1, 1)));
    h = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(h, ga, be, mu, va), TU_NO_ATTRS);
    h = tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS);
    h = tu_node(g, KILN_OP_MAX_POOL2D, TU_IDS(h),
                TU_ATTRS(TU_INTS("kernel", 2, 2), TU_INTS("stride", 2, 2)));
    h = tu_node(g, KILN_OP_ADAPTIVE_AVG_POOL2D, TU_IDS(h), TU_ATTRS(TU_INTS("output_size", 1, 1)));
    f = tu_node(g, KILN_OP_RESHAPE, TU_IDS(h), TU_ATTRS(TU_INTS("shape", -2, C1)));
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(f, fw, fb), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(y), TU_ATTRS(TU_INTS("dim", -1)));
    z = tu_node(g, KILN_OP_GELU, TU_IDS(f), TU_NO_ATTRS);
    tu_output(g, y, "probs");
    tu_output(g, z, "features");
    return g;
}

static int same_bytes(const kiln_built *a, const kiln_built *b) {
    const void *pa, *pb;
    size_t na = 0, nb = 1;
    if (kiln_built_engine(a, &pa, &na) != KILN_OK || kiln_built_engine(b, &pb, &nb) != KILN_OK)
        return 0;
    return na == nb && memcmp(pa, pb, na) == 0;
}

static void test_builds(void) {
    static const kiln_precision precs[] = {KILN_PRECISION_FP32, KILN_PRECISION_FP16,
                                           KILN_PRECISION_BF16};
    kiln_graph *g1 = make_graph(), *g2 = make_graph();
    if (g1 == NULL || g2 == NULL) goto done;
    for (int p = 0; p < 3; p++) {
        for (int ext = 0; ext < 2; ext++) {
            kiln_built *a = NULL, *b = NULL, *c = NULL;
            CHECK_OK(tu_build(g1, precs[p], ext, &a));
            CHECK_OK(tu_build(g1, precs[p], ext, &b)); // same graph again
            CHECK_OK(tu_build(g2, precs[p], ext, &c)); // an identical graph built separately
            if (a != NULL && b != NULL && c != NULL) {
                CHECK_MSG(same_bytes(a, b), "precision %d external %d: rebuild differs", p, ext);
                CHECK_MSG(same_bytes(a, c), "precision %d external %d: twin graph differs", p, ext);
                CHECK_EQ_INT(kiln_built_n_weights(a), kiln_built_n_weights(c));
                if (ext) CHECK(kiln_built_n_weights(a) > 0);
                for (uint32_t i = 0; i < kiln_built_n_weights(a); i++) {
                    const char *ka, *kc;
                    const void *da, *dc;
                    size_t na, nc;
                    CHECK_OK(kiln_built_weight(a, i, &ka, &da, &na));
                    CHECK_OK(kiln_built_weight(c, i, &kc, &dc, &nc));
                    CHECK(strcmp(ka, kc) == 0 && na == nc && memcmp(da, dc, na) == 0);
                    CHECK(strncmp(ka, "kiln-t-", 7) == 0);
                }
                // load + serialize gives the same bytes back.
                {
                    const void *bytes;
                    size_t n;
                    kiln_plan plan;
                    uint8_t *again = NULL;
                    size_t n_again = 0;
                    CHECK_OK(kiln_built_engine(a, &bytes, &n));
                    memset(&plan, 0, sizeof plan);
                    CHECK_OK(kiln_load_plan(bytes, n, &plan));
                    CHECK_OK(kiln_serialize(&plan, &again, &n_again));
                    CHECK(again != NULL && n_again == n && memcmp(again, bytes, n) == 0);
                    kiln_free(again, n_again);
                    kiln_plan_release(&plan);
                }
            }
            // Different options give different engines (the comparison can fail).
            if (p > 0 && ext == 0) {
                kiln_built *f32 = NULL;
                CHECK_OK(tu_build(g1, KILN_PRECISION_FP32, 0, &f32));
                if (f32 != NULL && a != NULL) CHECK(!same_bytes(a, f32));
                kiln_built_free(f32);
            }
            kiln_built_free(a);
            kiln_built_free(b);
            kiln_built_free(c);
        }
    }
done:
    kiln_graph_free(g1);
    kiln_graph_free(g2);
}

// Runs batch n of x through a fresh context; outputs into probs/features.
static void run(kiln_engine *e, int64_t n, const float *x, float *probs, float *features) {
    kiln_context *c = NULL;
    CHECK_OK(kiln_context_new(e, &c));
    if (c == NULL) return;
    CHECK_OK(kiln_context_set_input(c, 0, 4, TU_DIMS(n, C_IN, HW, HW), x));
    CHECK_OK(kiln_context_set_output(c, 0, probs, B_MAX * NCLS * 4));
    CHECK_OK(kiln_context_set_output(c, 1, features, B_MAX * C1 * 4));
    CHECK_OK(kiln_context_execute(c));
    kiln_context_free(c);
}

static void test_outputs(kiln_precision prec) {
    kiln_graph *g = make_graph();
    kiln_built *inl = NULL, *ext = NULL;
    kiln_engine *ei = NULL, *ee = NULL;
    kiln_context *c = NULL;
    float x[B_MAX * C_IN * HW * HW];
    float p1[B_MAX * NCLS] = {0}, f1[B_MAX * C1] = {0}, p2[B_MAX * NCLS] = {0},
                     f2[B_MAX * C1] = {0}, p3[B_MAX * NCLS] = {0}, f3[B_MAX * C1] = {0};
    int64_t n = 3;
    if (g == NULL) return;
    CHECK_OK(tu_build(g, prec, 0, &inl));
    CHECK_OK(tu_build(g, prec, 1, &ext));
    kiln_graph_free(g);
    if (inl == NULL || ext == NULL) goto done;
    CHECK_OK(tu_load(inl, "cpu", &ei));
    CHECK_OK(tu_load(ext, "cpu", &ee));
    if (ei == NULL || ee == NULL) goto done;
    CHECK_EQ_INT(kiln_engine_weight_nbytes(ei), kiln_engine_weight_nbytes(ee));
    tu_fill(x, n * C_IN * HW * HW, -1, 1);
    run(ei, n, x, p1, f1);
    run(ee, n, x, p2, f2);
    CHECK_MSG(memcmp(p1, p2, sizeof p1) == 0 && memcmp(f1, f2, sizeof f1) == 0,
              "external and inline weights give different outputs (precision %d)", (int)prec);
    // Sanity: the outputs are real (probabilities sum to 1), so equality means something.
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < NCLS; k++) s += p1[i * NCLS + k];
        CHECK_NEAR(s, 1.0, 2e-2, 0);
    }
    // Repeated executes on one context, with a shape change in between.
    CHECK_OK(kiln_context_new(ei, &c));
    if (c != NULL) {
        float xb[B_MAX * C_IN * HW * HW];
        tu_fill(xb, B_MAX * C_IN * HW * HW, -1, 1);
        CHECK_OK(kiln_context_set_output(c, 0, p3, sizeof p3));
        CHECK_OK(kiln_context_set_output(c, 1, f3, sizeof f3));
        CHECK_OK(kiln_context_set_input(c, 0, 4, TU_DIMS(n, C_IN, HW, HW), x));
        CHECK_OK(kiln_context_execute(c));
        CHECK(memcmp(p1, p3, sizeof p1) == 0 && memcmp(f1, f3, sizeof f1) == 0);
        CHECK_OK(kiln_context_set_input(c, 0, 4, TU_DIMS(B_MAX, C_IN, HW, HW), xb));
        CHECK_OK(kiln_context_execute(c));
        CHECK_OK(kiln_context_set_input(c, 0, 4, TU_DIMS(n, C_IN, HW, HW), x));
        memset(p3, 0, sizeof p3);
        memset(f3, 0, sizeof f3);
        CHECK_OK(kiln_context_execute(c));
        CHECK(memcmp(p1, p3, sizeof p1) == 0 && memcmp(f1, f3, sizeof f1) == 0);
    }
done:
    kiln_context_free(c);
    kiln_engine_free(ei);
    kiln_engine_free(ee);
    kiln_built_free(inl);
    kiln_built_free(ext);
}

int main(void) {
    kiln_log_set(NULL, NULL, KILN_LOG_ERROR);
    tu_fill(m.conv_w, C1 * C_IN * 9, -0.4f, 0.4f);
    tu_fill(m.conv_b, C1, -0.2f, 0.2f);
    tu_fill(m.gamma, C1, 0.5f, 1.5f);
    tu_fill(m.beta, C1, -0.2f, 0.2f);
    tu_fill(m.mean, C1, -0.2f, 0.2f);
    tu_fill(m.var, C1, 0.5f, 1.5f);
    tu_fill(m.fc_w, NCLS * C1, -0.5f, 0.5f);
    tu_fill(m.fc_b, NCLS, -0.2f, 0.2f);
    test_builds();
    test_outputs(KILN_PRECISION_FP32);
    test_outputs(KILN_PRECISION_FP16);
    test_outputs(KILN_PRECISION_BF16);
    return check_summary();
}
