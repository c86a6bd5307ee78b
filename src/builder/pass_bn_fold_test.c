// SPDX-License-Identifier: Apache-2.0
// Batch-norm folding into conv2d and 2-D linear: the batch norm disappears when it may (and
// stays when it may not), and the folded engine matches both the unfolded one and a naive
// double-precision reference (conv, batch norm, relu written out in loops).
#include "builder/builder_test_util.h"

#define C_IN 3
#define C_OUT 5
#define H 7
#define W 6

static kiln_build_options o0, o1;

typedef struct bn_params {
    float w[C_OUT * C_IN * 9], b[C_OUT], gamma[C_OUT], beta[C_OUT], mean[C_OUT], var[C_OUT];
} bn_params;

static void fill(bn_params *m) {
    tu_fill(m->w, C_OUT * C_IN * 9, -1, 1);
    tu_fill(m->b, C_OUT, -1, 1);
    tu_fill(m->gamma, C_OUT, 0.5f, 2);
    tu_fill(m->beta, C_OUT, -1, 1);
    tu_fill(m->mean, C_OUT, -0.5f, 0.5f);
    tu_fill(m->var, C_OUT, 0.1f, 3);
}

// conv3x3(pad 1) [+ bias] -> batch_norm [with gamma/beta] -> relu
static kiln_graph *conv_bn(const bn_params *m, int with_bias, int with_affine, kiln_dtype dt) {
    kiln_graph *g = NULL;
    int32_t x, w, b = -1, ga = -1, be = -1, mu, va, y;
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", dt, 4, TU_DIMS(1, C_IN, H, W), TU_DIMS(2, C_IN, H, W));
    w = tu_const(g, "w", dt, 4, TU_DIMS(C_OUT, C_IN, 3, 3), m->w);
    if (with_bias) b = tu_const(g, "b", dt, 1, TU_DIMS(C_OUT), m->b);
    if (with_affine) {
        ga = tu_const(g, "gamma", dt, 1, TU_DIMS(C_OUT), m->gamma);
        be = tu_const(g, "beta", dt, 1, TU_DIMS(C_OUT), m->beta);
    }
    mu = tu_const(g, "mean", dt, 1, TU_DIMS(C_OUT), m->mean);
    va = tu_const(g, "var", dt, 1, TU_DIMS(C_OUT), m->var);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w, b), TU_ATTRS(TU_INTS("padding", 1, 1)));
    y = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(y, ga, be, mu, va), TU_ATTRS(TU_FLOATS("eps", 1e-3)));
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    return g;
}

static void test_conv_bn(void) {
    static bn_params m;
    for (int variant = 0; variant < 4; variant++) {
        int with_bias = variant & 1, with_affine = variant >> 1 & 1;
        kiln_graph *g;
        kiln_plan p;
        kiln_built *bt = NULL;
        fill(&m);
        g = conv_bn(&m, with_bias, with_affine, KILN_DTYPE_F32);
        if (bt_plan(g, &o1, &p)) {
            BT_EXPECT_LAYERS(&p, "conv2d,relu");
            CHECK(p.layers[0].n_inputs == 3 && p.ids[p.layers[0].input_begin + 2] >= 0);
            kiln_plan_release(&p);
        }
        {
            bt_shape s[1] = {{4, {2, C_IN, H, W}}};
            bt_compare(g, &o0, &o1, 1, s, 0, 1e-4, 1e-4, "conv+bn");
        }
        // against the naive reference
        CHECK_OK(kiln_build(g, &o1, &bt));
        if (bt != NULL) {
            float x[2 * C_IN * H * W], ref[2 * C_OUT * H * W];
            void *in[1] = {x};
            bt_shape s[1] = {{4, {2, C_IN, H, W}}};
            bt_outputs r;
            tu_fill(x, 2 * C_IN * H * W, -1, 1);
            ref_conv2d(x, 2, C_IN, H, W, m.w, C_OUT, 3, 3, 1, 1, with_bias ? m.b : NULL, ref);
            ref_batch_norm(ref, 2, C_OUT, H * W, with_affine ? m.gamma : NULL,
                           with_affine ? m.beta : NULL, m.mean, m.var, 1e-3);
            ref_relu(ref, 2 * C_OUT * H * W);
            if (bt_run(bt, 1, s, in, &r)) {
                tu_check_close("conv+bn vs reference", r.data[0], ref, 2 * C_OUT * H * W, 1e-4,
                               1e-4);
                bt_outputs_free(&r);
            }
            kiln_built_free(bt);
        }
        kiln_graph_free(g);
    }
}

static void test_half(void) {
    static bn_params m;
    kiln_graph *g;
    kiln_plan p;
    bt_shape s[1] = {{4, {1, C_IN, H, W}}};
    fill(&m);
    g = conv_bn(&m, 1, 1, KILN_DTYPE_F16);
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "conv2d,relu");
        for (uint32_t i = 0; i < p.n_tensors; i++) CHECK(p.tensors[i].dtype == KILN_DTYPE_F16);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 3e-2, 3e-2, "conv+bn float16");
    kiln_graph_free(g);
}

static void test_linear_bn(void) {
    float w[C_OUT * 8], mean[C_OUT], var[C_OUT], gamma[C_OUT], beta[C_OUT];
    kiln_graph *g;
    kiln_plan p;
    int32_t x, cw, mu, va, ga, be, y;
    tu_fill(w, C_OUT * 8, -1, 1);
    tu_fill(mean, C_OUT, -1, 1);
    tu_fill(var, C_OUT, 0.5f, 2);
    tu_fill(gamma, C_OUT, -2, 2);
    tu_fill(beta, C_OUT, -1, 1);
    for (int rank = 2; rank <= 3; rank++) {
        CHECK_OK(kiln_graph_new(&g));
        if (rank == 2) {
            x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, 8), TU_DIMS(6, 8));
        } else { // [B, C, 8] -> linear -> [B, C, C_OUT]: batch norm over dim 1 (C = C_OUT)
            x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, C_OUT, 8), TU_DIMS(6, C_OUT, 8));
        }
        cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(C_OUT, 8), w);
        mu = tu_const(g, "mean", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), mean);
        va = tu_const(g, "var", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), var);
        ga = tu_const(g, "gamma", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), gamma);
        be = tu_const(g, "beta", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), beta);
        y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(y, ga, be, mu, va), TU_NO_ATTRS);
        tu_output(g, y, "y");
        if (bt_plan(g, &o1, &p)) {
            // a 3-D linear output has its features last but batch norm normalizes dim 1: it
            // becomes a per-channel multiply and add, tails of the linear
            BT_EXPECT_LAYERS(&p, rank == 2 ? "linear" : "linear,mul,add");
            kiln_plan_release(&p);
        }
        {
            bt_shape s[1] = {{(uint32_t)rank, {5, C_OUT, 8}}};
            if (rank == 2) s[0].dims[1] = 8;
            bt_compare(g, &o0, &o1, 1, s, 0, 1e-4, 1e-4, "linear+bn");
        }
        kiln_graph_free(g);
    }
}

// LeViT's linear + BatchNorm1d: linear over [B, L, K], flatten(0, 1) to [B L, C], the norm,
// reshaped back. Folded into the linear through the reshape. negative: the linear's 2 C
// features viewed as [2 B L, C] (a row holds two channels' worth): not folded.
static void test_linear_reshape_bn(int negative) {
    float w[2 * C_OUT * 8], mean[C_OUT], var[C_OUT], gamma[C_OUT], beta[C_OUT];
    const int64_t n = negative ? 2 * C_OUT : C_OUT, rows = negative ? 12 : 6;
    kiln_graph *g;
    kiln_plan p;
    tu_fill(w, 2 * C_OUT * 8, -1, 1);
    tu_fill(mean, C_OUT, -1, 1);
    tu_fill(var, C_OUT, 0.5f, 2);
    tu_fill(gamma, C_OUT, -2, 2);
    tu_fill(beta, C_OUT, -1, 1);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, 3, 8), TU_DIMS(2, 3, 8));
    int32_t cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(n, 8), w);
    int32_t mu = tu_const(g, "mean", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), mean);
    int32_t va = tu_const(g, "var", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), var);
    int32_t ga = tu_const(g, "gamma", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), gamma);
    int32_t be = tu_const(g, "beta", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), beta);
    int32_t y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", rows, C_OUT)));
    y = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(y, ga, be, mu, va), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", 2, 3, n)));
    tu_output(g, tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p,
                         negative ? "linear|reshape|mul,add,relu|reshape" : "linear,relu|reshape");
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {2, 3, 8}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-4, 1e-4, "linear, reshape, bn");
    kiln_graph_free(g);
}

// The conv output is read elsewhere too, or the statistics are not constant: no folding.
static void test_not_folded(void) {
    static bn_params m;
    kiln_graph *g;
    kiln_plan p;
    int32_t x, w, mu, va, mv, y, z;
    bt_shape s[2] = {{4, {1, C_IN, H, W}}, {1, {C_OUT}}};
    fill(&m);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, C_IN, H, W), TU_DIMS(1, C_IN, H, W));
    mv = tu_input(g, "var_in", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), TU_DIMS(C_OUT));
    w = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(C_OUT, C_IN, 3, 3), m.w);
    mu = tu_const(g, "mean", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), m.mean);
    va = tu_const(g, "var", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), m.var);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(y, -1, -1, mu, va), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_ADD, TU_IDS(z, y), TU_NO_ATTRS); // y read twice
    tu_output(g, z, "z");
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_EXP, TU_IDS(mv), TU_NO_ATTRS); // variance from an input
    // the first conv again: common-subexpression elimination makes it the same layer
    z = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(z, -1, -1, mu, y), TU_NO_ATTRS);
    tu_output(g, z, "z2");
    if (bt_plan(g, &o1, &p)) {
        // constant statistics: a multiply and add (a group with the residual add); statistics
        // from an input stay a batch norm
        BT_EXPECT_LAYERS(&p, "conv2d|mul,add,add|exp|batch_norm");
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 2, s, 0, 1e-5, 1e-5, "not folded");
    kiln_graph_free(g);
}

// A batch norm no head takes (DenseNet's reads a concatenation): a per-channel multiply and add,
// one group with the ReLU after it, against the unoptimized engine's batch-norm kernel; also
// converted to float16.
static void test_standalone(void) {
    static bn_params m;
    kiln_graph *g;
    kiln_plan p;
    int32_t x, ga, be, mu, va, y;
    bt_shape s[1] = {{4, {2, C_OUT, H, W}}};
    kiln_build_options o16 = bt_opts(1, KILN_PRECISION_FP16, 0);
    fill(&m);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, C_OUT, H, W), TU_DIMS(2, C_OUT, H, W));
    ga = tu_const(g, "gamma", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), m.gamma);
    be = tu_const(g, "beta", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), m.beta);
    mu = tu_const(g, "mean", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), m.mean);
    va = tu_const(g, "var", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), m.var);
    y = tu_node(g, KILN_OP_BATCH_NORM, TU_IDS(x, ga, be, mu, va), TU_ATTRS(TU_FLOATS("eps", 1e-3)));
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "mul,add,relu");
        kiln_plan_release(&p);
    }
    if (bt_plan(g, &o16, &p)) {
        BT_EXPECT_LAYERS(&p, "cast|mul,add,relu|cast");
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, "standalone bn");
    bt_compare(g, &o0, &o16, 1, s, 0, 3e-2, 3e-2, "standalone bn float16");
    kiln_graph_free(g);
}

// FrozenBatchNorm2d's x * scale + shift after a conv, a scale by one value and a shift after a
// linear, a division and a subtraction: folded into the weights and bias (against the
// unoptimized engine, which runs every op); a scale from an input stays a tail.
static void test_scale_shift(void) {
    static bn_params m;
    kiln_graph *g;
    kiln_plan p;
    int32_t x, w, sc, sh, y, v;
    float k = 0.75f, lw[C_OUT * 8], lb[C_OUT];
    bt_shape s[1] = {{4, {2, C_IN, H, W}}};
    fill(&m);
    tu_fill(lw, C_OUT * 8, -1, 1);
    tu_fill(lb, C_OUT, -1, 1);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, C_IN, H, W), TU_DIMS(2, C_IN, H, W));
    w = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(C_OUT, C_IN, 3, 3), m.w);
    sc = tu_const(g, "scale", KILN_DTYPE_F32, 4, TU_DIMS(1, C_OUT, 1, 1), m.gamma);
    sh = tu_const(g, "shift", KILN_DTYPE_F32, 3, TU_DIMS(C_OUT, 1, 1), m.beta);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, w), TU_ATTRS(TU_INTS("padding", 1, 1)));
    y = tu_node(g, KILN_OP_MUL, TU_IDS(sc, y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, sh), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_DIV, TU_IDS(y, tu_const(g, "k", KILN_DTYPE_F32, 0, TU_DIMS(0), &k)),
                TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SUB, TU_IDS(y, tu_const(g, "row", KILN_DTYPE_F32, 1, TU_DIMS(W), m.w)),
                TU_NO_ATTRS); // [W]: one value per column, not per channel
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        // (the [W] operand stays a tail)
        BT_EXPECT_LAYERS(&p, "conv2d,sub,relu");
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-4, 1e-4, "conv scale/shift");
    kiln_graph_free(g);

    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 4, 8), TU_DIMS(3, 4, 8));
    v = tu_input(g, "v", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), TU_DIMS(C_OUT));
    w = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(C_OUT, 8), lw);
    y = tu_node(g, KILN_OP_LINEAR,
                TU_IDS(x, w, tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(C_OUT), lb)), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, tu_const(g, "k", KILN_DTYPE_F32, 0, TU_DIMS(0), &k)),
                TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SUB,
                TU_IDS(y, tu_const(g, "t", KILN_DTYPE_F32, 2, TU_DIMS(1, C_OUT), m.beta)),
                TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, v), TU_NO_ATTRS); // from an input: a tail
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "linear,mul");
        kiln_plan_release(&p);
    }
    {
        bt_shape s2[2] = {{3, {3, 4, 8}}, {1, {C_OUT}}};
        bt_compare(g, &o0, &o1, 2, s2, 0, 1e-4, 1e-4, "linear scale/shift");
    }
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    test_conv_bn();
    test_half();
    test_linear_bn();
    test_linear_reshape_bn(0);
    test_linear_reshape_bn(1);
    test_not_folded();
    test_standalone();
    test_scale_shift();
    return check_summary();
}
