// SPDX-License-Identifier: Apache-2.0
// Activation formulas (pass_act.c): GELU's tanh form as GPT-2 and FastGELU spell it, its erf
// form as ESM does, swish and hard-swish written out become one gelu / silu / hardswish op,
// fused after the linear that feeds them; formulas that compute something else (quick GELU, a
// different constant) or whose intermediates are read elsewhere stay as they are. Every engine
// computes what the unoptimized one does (the ops one by one on the CPU backend, random inputs),
// and the fused op is checked against a direct double computation too.
#include <math.h>

#include "builder/builder_test_util.h"

#define K 24
#define N 40

static kiln_build_options o0, o1, o1_bf16;

enum {
    F_NEW_GELU,   // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))
    F_FAST_GELU,  // 0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))
    F_SWISH,      // x * sigmoid(x)
    F_HARDSWISH,  // x * clamp(x + 3, 0, 6) / 6
    F_QUICK_GELU, // x * sigmoid(1.702 * x): no Kiln op, stays
    F_WRONG_C,    // NewGELU with 0.05 in place of 0.044715: stays
    F_LEAK,       // NewGELU whose tanh is also an output: stays
    F_ERF_GELU,   // x * 0.5 * (1 + erf(x / sqrt(2))) (ESM, older BERT code)
    F_ERF,        // erf(x) alone: no activation, stays
};

static int32_t cst(kiln_graph *g, kiln_dtype dt, float v) {
    return tu_const(g, "c", dt, 0, NULL, &v);
}

static int32_t op2(kiln_graph *g, uint32_t op, int32_t a, int32_t b) {
    return tu_node(g, op, TU_IDS(a, b), TU_NO_ATTRS);
}

// y = formula(linear(x, w, b)), x [2, 3, K]
static kiln_graph *graph(int f, kiln_dtype dt, const float *w, const float *bias) {
    kiln_graph *g;
    int32_t t = -1;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", dt, 3, TU_DIMS(2, 3, K), TU_DIMS(2, 3, K));
    int32_t cw = tu_const(g, "w", dt, 2, TU_DIMS(N, K), w);
    int32_t cb = tu_const(g, "b", dt, 1, TU_DIMS(N), bias);
    int32_t h = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw, cb), TU_NO_ATTRS), y;
    switch (f) {
    case F_NEW_GELU:
    case F_WRONG_C:
    case F_LEAK: {
        int32_t p = op2(g, KILN_OP_POW, h, cst(g, dt, 3.0f));
        p = op2(g, KILN_OP_MUL, cst(g, dt, f == F_WRONG_C ? 0.05f : 0.044715f), p);
        p = op2(g, KILN_OP_ADD, h, p);
        p = op2(g, KILN_OP_MUL, cst(g, dt, 0.7978845608f), p);
        t = tu_node(g, KILN_OP_TANH, TU_IDS(p), TU_NO_ATTRS);
        p = op2(g, KILN_OP_ADD, cst(g, dt, 1.0f), t);
        y = op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, cst(g, dt, 0.5f), h), p);
        break;
    }
    case F_FAST_GELU: {
        int32_t s = op2(g, KILN_OP_MUL, h, cst(g, dt, 0.7978845608f));
        int32_t q = op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, cst(g, dt, 0.044715f), h), h);
        q = op2(g, KILN_OP_ADD, cst(g, dt, 1.0f), q);
        q = tu_node(g, KILN_OP_TANH, TU_IDS(op2(g, KILN_OP_MUL, s, q)), TU_NO_ATTRS);
        q = op2(g, KILN_OP_ADD, q, cst(g, dt, 1.0f));
        y = op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, h, cst(g, dt, 0.5f)), q);
        break;
    }
    case F_SWISH:
        y = op2(g, KILN_OP_MUL, h, tu_node(g, KILN_OP_SIGMOID, TU_IDS(h), TU_NO_ATTRS));
        break;
    case F_HARDSWISH: {
        int32_t c = tu_node(g, KILN_OP_CLAMP, TU_IDS(op2(g, KILN_OP_ADD, h, cst(g, dt, 3.0f))),
                            TU_ATTRS(TU_FLOATS("min", 0.0), TU_FLOATS("max", 6.0)));
        y = op2(g, KILN_OP_DIV, op2(g, KILN_OP_MUL, h, c), cst(g, dt, 6.0f));
        break;
    }
    case F_ERF_GELU: {
        int32_t e = tu_node(g, KILN_OP_ERF, TU_IDS(op2(g, KILN_OP_DIV, h, cst(g, dt, 1.41421356f))),
                            TU_NO_ATTRS);
        y = op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, h, cst(g, dt, 0.5f)),
                op2(g, KILN_OP_ADD, cst(g, dt, 1.0f), e));
        break;
    }
    case F_ERF: y = tu_node(g, KILN_OP_ERF, TU_IDS(h), TU_NO_ATTRS); break;
    default: { // F_QUICK_GELU
        int32_t s = op2(g, KILN_OP_MUL, h, cst(g, dt, 1.702f));
        y = op2(g, KILN_OP_MUL, h, tu_node(g, KILN_OP_SIGMOID, TU_IDS(s), TU_NO_ATTRS));
        break;
    }
    }
    tu_output(g, y, "y");
    if (f == F_LEAK) tu_output(g, t, "t");
    return g;
}

static void test_formula(int f, kiln_dtype dt, const char *want_layers, uint32_t want_act,
                         const char *what) {
    float *w = tu_rand(N * K, -0.6f, 0.6f), *bias = tu_rand(N, -1.0f, 1.0f);
    kiln_graph *g = graph(f, dt, w, bias);
    kiln_plan p;
    kiln_build_stats st;
    if (bt_plan(g, &o1, &p)) {
        char buf[512];
        bt_layers(&p, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, want_layers) == 0, "%s: layers '%s', expected '%s'", what, buf,
                  want_layers);
        kiln_plan_release(&p);
    }
    memset(&st, 0, sizeof st);
    if (kiln_build_plan(g, &o1, &p, &st) == KILN_OK) {
        CHECK_MSG(st.n_act == want_act, "%s: %u activations counted, want %u", what, st.n_act,
                  want_act);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {2, 3, K}}};
    double tol = dt == KILN_DTYPE_F32 ? 2e-5 : 2e-2;
    bt_compare(g, &o0, &o1, 1, s, 0, tol, tol, what);
    if (dt == KILN_DTYPE_F32) bt_compare(g, &o0, &o1_bf16, 1, s, 0, 5e-2, 5e-2, what);
    kiln_graph_free(g);
    free(w);
    free(bias);
}

// The fused GELU against 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in double, over
// pre-activations that reach the far tails.
static void test_gelu_values(void) {
    float *w = tu_rand(N * K, -2.0f, 2.0f), *bias = tu_rand(N, -3.0f, 3.0f);
    float *x = tu_rand(2 * 3 * K, -2.0f, 2.0f);
    kiln_graph *g = graph(F_NEW_GELU, KILN_DTYPE_F32, w, bias);
    kiln_built *b = NULL;
    bt_outputs out;
    CHECK_OK(kiln_build(g, &o1, &b));
    bt_shape s[1] = {{3, {2, 3, K}}};
    void *in[1] = {x};
    if (b != NULL && bt_run(b, 1, s, in, &out)) {
        float *ref = malloc(sizeof(float) * 6 * N);
        for (int r = 0; r < 6; r++) {
            for (int n = 0; n < N; n++) {
                double h = bias[n];
                for (int k = 0; k < K; k++) h += (double)x[r * K + k] * w[n * K + k];
                ref[r * N + n] =
                    (float)(0.5 * h *
                            (1.0 + tanh(0.79788456080286535588 * (h + 0.044715 * h * h * h))));
            }
        }
        tu_check_close("gelu values", out.data[0], ref, 6 * N, 1e-4, 1e-4);
        free(ref);
        bt_outputs_free(&out);
    }
    kiln_built_free(b);
    kiln_graph_free(g);
    free(w);
    free(bias);
    free(x);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    o1_bf16 = bt_opts(1, KILN_PRECISION_BF16, 0);
    test_formula(F_NEW_GELU, KILN_DTYPE_F32, "linear,gelu", 1, "NewGELU");
    test_formula(F_NEW_GELU, KILN_DTYPE_F16, "linear,gelu", 1, "NewGELU float16");
    test_formula(F_NEW_GELU, KILN_DTYPE_BF16, "linear,gelu", 1, "NewGELU bfloat16");
    test_formula(F_FAST_GELU, KILN_DTYPE_F32, "linear,gelu", 1, "FastGELU");
    test_formula(F_ERF_GELU, KILN_DTYPE_F32, "linear,gelu", 1, "GELU written with erf");
    test_formula(F_ERF_GELU, KILN_DTYPE_BF16, "linear,gelu", 1, "GELU written with erf, bfloat16");
    test_formula(F_ERF, KILN_DTYPE_F32, "linear|erf", 0, "erf");
    test_formula(F_SWISH, KILN_DTYPE_F32, "linear,silu", 1, "swish");
    test_formula(F_HARDSWISH, KILN_DTYPE_F32, "linear,hardswish", 1, "hard-swish");
    test_formula(F_QUICK_GELU, KILN_DTYPE_F32, "linear|mul,sigmoid,mul", 0, "quick GELU");
    test_formula(F_WRONG_C, KILN_DTYPE_F32, "linear|mul|pow,mul,add,mul,tanh,add,mul", 0,
                 "NewGELU with another constant");
    test_formula(F_LEAK, KILN_DTYPE_F32, "linear|pow,mul,add,mul,tanh|mul|add,mul", 0,
                 "NewGELU with its tanh read elsewhere");
    test_gelu_values();
    return check_summary();
}
