// SPDX-License-Identifier: Apache-2.0
// Precision conversion: float32 weights and activations become float16/bfloat16, bindings keep
// their dtypes through boundary casts, integer paths are untouched; results stay within the
// target dtype's tolerance of the float32 engine (and are exact where no arithmetic happens).
#include <float.h>
#include <math.h>

#include "builder/builder_test_util.h"

#define K 16
#define N 8
#define V 10

static void test_mlp(void) {
    float *w = tu_rand(N * K, -1, 1), *b = tu_rand(N, -1, 1), *lw = tu_rand(N, 0.5f, 1.5f);
    kiln_graph *g;
    int32_t x, cw, cb, cl, y;
    bt_shape s[1] = {{2, {3, K}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(4, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(N), b);
    cl = tu_const(g, "ln.w", KILN_DTYPE_F32, 1, TU_DIMS(N), lw);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw, cb), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_GELU, TU_IDS(y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_LAYER_NORM, TU_IDS(y, cl, -1), TU_ATTRS(TU_INTS("normalized_ndim", 1)));
    y = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(y), TU_ATTRS(TU_INTS("dim", -1)));
    tu_output(g, y, "probs");
    for (int prec = 1; prec <= 2; prec++) {
        kiln_build_options o32 = bt_opts(1, KILN_PRECISION_FP32, 0);
        kiln_build_options oh = bt_opts(1, (kiln_precision)prec, 0);
        uint32_t half = prec == 1 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
        kiln_plan p;
        if (bt_plan(g, &oh, &p)) {
            BT_EXPECT_LAYERS(&p, "cast|linear,gelu|layer_norm|softmax|cast");
            CHECK(p.precision == (uint32_t)prec);
            CHECK(p.tensors[p.inputs[0]].dtype == KILN_DTYPE_F32);
            CHECK(p.tensors[p.outputs[0]].dtype == KILN_DTYPE_F32);
            for (uint32_t i = 0; i < p.n_tensors; i++) {
                const kiln_plan_tensor *t = &p.tensors[i];
                if (t->kind == KILN_TENSOR_WEIGHT || t->kind == KILN_TENSOR_ACTIVATION) {
                    CHECK_MSG(t->dtype == half, "tensor %u is %s", i,
                              kiln_dtype_name((kiln_dtype)t->dtype));
                }
            }
            // the weights are the float32 ones rounded to the target dtype
            for (uint32_t i = 0; i < p.n_tensors; i++) {
                const kiln_plan_tensor *t = &p.tensors[i];
                if (t->kind != KILN_TENSOR_WEIGHT || t->shape.rank != 2) continue;
                for (int j = 0; j < N * K; j++) {
                    CHECK(kiln_load_f32(p.weights + t->offset, half, j) ==
                          tu_round(w[j], (kiln_dtype)half));
                }
            }
            kiln_plan_release(&p);
        }
        bt_compare(g, &o32, &oh, 1, s, 0, prec == 1 ? 1e-2 : 4e-2, 2e-2, "mlp in half precision");
        // without optimization the conversion still applies
        oh.optimize = 0;
        if (bt_plan(g, &oh, &p)) {
            BT_EXPECT_LAYERS(&p, "cast|linear|gelu|layer_norm|softmax|cast");
            kiln_plan_release(&p);
        }
    }
    kiln_graph_free(g);
    free(w);
    free(b);
    free(lw);
}

// Embedding indices stay integer; a gather of converted weights is exact; float32 math on
// integer inputs and small constants (position math) stays float32, explicit cast included; an
// input that is also an output is copied in its own dtype.
static void test_integer_paths(void) {
    float *emb = tu_rand(V * N, -1, 1), scale = 3.0f;
    kiln_graph *g;
    kiln_plan p;
    kiln_built *bt = NULL;
    int32_t idx, cnt, ce, cs, y, z;
    kiln_build_options oh = bt_opts(1, KILN_PRECISION_FP16, 0);
    CHECK_OK(kiln_graph_new(&g));
    idx = tu_input(g, "tokens", KILN_DTYPE_I64, 2, TU_DIMS(1, 1), TU_DIMS(2, 5));
    cnt = tu_input(g, "count", KILN_DTYPE_I32, 1, TU_DIMS(3), TU_DIMS(3));
    ce = tu_const(g, "emb", KILN_DTYPE_F32, 2, TU_DIMS(V, N), emb);
    cs = tu_const(g, "scale", KILN_DTYPE_F32, 0, TU_DIMS(0), &scale);
    y = tu_node(g, KILN_OP_EMBEDDING, TU_IDS(ce, idx), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_CAST, TU_IDS(cnt), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    z = tu_node(g, KILN_OP_MUL, TU_IDS(z, cs), TU_NO_ATTRS);
    tu_output(g, y, "embedded");
    tu_output(g, z, "scaled");
    tu_output(g, idx, "tokens_out");
    if (bt_plan(g, &oh, &p)) {
        BT_EXPECT_LAYERS(&p, "embedding|cast|mul|cast|copy");
        CHECK(p.tensors[p.inputs[0]].dtype == KILN_DTYPE_I64);
        CHECK(p.tensors[p.outputs[0]].dtype == KILN_DTYPE_F32);
        CHECK(p.tensors[p.outputs[1]].dtype == KILN_DTYPE_F32);
        CHECK(p.tensors[p.outputs[2]].dtype == KILN_DTYPE_I64);
        {
            // the model's cast of an integer input to float32 stays float32
            const kiln_plan_layer *l = &p.layers[1];
            kiln_attrs a = kiln_plan_layer_attrs(&p, l);
            CHECK(kiln_attrs_int(&a, KILN_A_CAST_DTYPE, 0) == KILN_DTYPE_F32);
        }
        kiln_plan_release(&p);
    }
    CHECK_OK(kiln_build(g, &oh, &bt));
    if (bt != NULL) {
        int64_t tok[2 * 5];
        int32_t c[3] = {7, -2, 1000};
        void *in[2] = {tok, c};
        bt_shape s[2] = {{2, {2, 5}}, {1, {3}}};
        bt_outputs r;
        for (int i = 0; i < 10; i++) tok[i] = check_rng_int(0, V - 1);
        if (bt_run(bt, 2, s, in, &r)) {
            for (int i = 0; i < 10; i++) {
                for (int j = 0; j < N; j++) {
                    CHECK(r.data[0][i * N + j] == tu_round(emb[tok[i] * N + j], KILN_DTYPE_F16));
                }
            }
            CHECK(r.data[1][0] == 21.0f && r.data[1][1] == -6.0f && r.data[1][2] == 3000.0f);
            for (int i = 0; i < 10; i++) CHECK(r.data[2][i] == (float)tok[i]);
            bt_outputs_free(&r);
        }
        kiln_built_free(bt);
    }
    kiln_graph_free(g);
    free(emb);
}

// A float16 model built in float16 needs no casts; a value output twice is cast once and
// copied once.
// Rotary embedding from position ids: angle = pos * inv_freq, y = x * cos(angle). In float16 a
// position near 2000 is off by up to 1 (its spacing), the angle by radians; the position math
// stays float32 and only y is float16.
static void test_position_math(void) {
    enum { S = 6, H = 4 };
    float inv_freq[H] = {1.0f, 0.1f, 0.01f, 0.001f};
    kiln_graph *g;
    kiln_built *bt = NULL;
    int32_t pos, x, cf, a, c, y;
    CHECK_OK(kiln_graph_new(&g));
    pos = tu_input(g, "pos", KILN_DTYPE_I64, 2, TU_DIMS(S, 1), TU_DIMS(S, 1));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(S, H), TU_DIMS(S, H));
    cf = tu_const(g, "inv_freq", KILN_DTYPE_F32, 2, TU_DIMS(1, H), inv_freq);
    a = tu_node(g, KILN_OP_CAST, TU_IDS(pos), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    a = tu_node(g, KILN_OP_MUL, TU_IDS(a, cf), TU_NO_ATTRS);
    c = tu_node(g, KILN_OP_COS, TU_IDS(a), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_MUL, TU_IDS(x, c), TU_NO_ATTRS);
    tu_output(g, y, "y");
    kiln_build_options oh = bt_opts(1, KILN_PRECISION_FP16, 0);
    CHECK_OK(kiln_build(g, &oh, &bt));
    if (bt != NULL) {
        int64_t p[S] = {1997, 2001, 2047, 1023, 513, 7};
        float xv[S * H];
        void *in[2] = {p, xv};
        bt_shape sh[2] = {{2, {S, 1}}, {2, {S, H}}};
        bt_outputs r;
        tu_fill(xv, S * H, 0.5f, 1.0f);
        for (int i = 0; i < S * H; i++) xv[i] = tu_round(xv[i], KILN_DTYPE_F16);
        if (bt_run(bt, 2, sh, in, &r)) {
            for (int i = 0; i < S; i++) {
                for (int j = 0; j < H; j++) {
                    double want = xv[i * H + j] * cos((double)p[i] * (double)inv_freq[j]);
                    CHECK_MSG(fabs(r.data[0][i * H + j] - want) < 4e-3,
                              "position %lld, frequency %d: %g, want %g", (long long)p[i], j,
                              r.data[0][i * H + j], want);
                }
            }
            bt_outputs_free(&r);
        }
        kiln_built_free(bt);
    }
    kiln_graph_free(g);
}

static void test_no_casts_and_shared_output(void) {
    kiln_graph *g;
    kiln_plan p;
    int32_t x, y;
    kiln_build_options oh = bt_opts(1, KILN_PRECISION_FP16, 0);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F16, 1, TU_DIMS(1), TU_DIMS(8));
    y = tu_node(g, KILN_OP_SILU, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "y");
    if (bt_plan(g, &oh, &p)) {
        BT_EXPECT_LAYERS(&p, "silu");
        kiln_plan_release(&p);
    }
    kiln_graph_free(g);

    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(1), TU_DIMS(8));
    y = tu_node(g, KILN_OP_SILU, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "a");
    tu_output(g, y, "b");
    if (bt_plan(g, &oh, &p)) {
        BT_EXPECT_LAYERS(&p, "cast|silu|cast|copy");
        CHECK(p.tensors[p.outputs[0]].dtype == KILN_DTYPE_F32 &&
              p.tensors[p.outputs[1]].dtype == KILN_DTYPE_F32);
        kiln_plan_release(&p);
    }
    {
        kiln_build_options o32 = bt_opts(1, KILN_PRECISION_FP32, 0);
        bt_shape s[1] = {{1, {7}}};
        bt_compare(g, &o32, &oh, 1, s, 0, 5e-3, 5e-3, "shared output");
    }
    kiln_graph_free(g);
}

// A float16 model whose norm computes in float32 (x.float() ... .to(x.dtype), as HF models'
// RMSNorm do): under fp16 precision the casts convert nothing and are removed; a cast that is a
// graph output stays (the engine's output is a value of its own), and without optimization
// every cast stays. Against the float32 engine on the same inputs.
static void test_identity_casts(void) {
    float *lw = tu_rand(K, 0.5f, 1.5f);
    kiln_graph *g;
    kiln_plan p;
    int32_t x, cl, y, z;
    bt_shape s[1] = {{2, {3, K}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F16, 2, TU_DIMS(1, K), TU_DIMS(4, K));
    cl = tu_const(g, "ln.w", KILN_DTYPE_F32, 1, TU_DIMS(K), lw);
    y = tu_node(g, KILN_OP_CAST, TU_IDS(x), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    y = tu_node(g, KILN_OP_LAYER_NORM, TU_IDS(y, cl, -1), TU_ATTRS(TU_INTS("normalized_ndim", 1)));
    y = tu_node(g, KILN_OP_CAST, TU_IDS(y), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F16)));
    z = tu_node(g, KILN_OP_SILU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, z, "z");
    y = tu_node(g, KILN_OP_CAST, TU_IDS(z), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    tu_output(g, y, "z32");
    kiln_build_options oh = bt_opts(1, KILN_PRECISION_FP16, 0);
    if (bt_plan(g, &oh, &p)) {
        BT_EXPECT_LAYERS(&p, "layer_norm|silu|cast");
        CHECK(p.tensors[p.outputs[0]].dtype == KILN_DTYPE_F16);
        CHECK(p.tensors[p.outputs[1]].dtype == KILN_DTYPE_F32); // cast back once
        kiln_plan_release(&p);
    }
    {
        kiln_build_options o32 = bt_opts(1, KILN_PRECISION_FP32, 0);
        bt_compare(g, &o32, &oh, 1, s, 0, 1e-2, 1e-2, "identity casts removed");
    }
    oh.optimize = 0;
    if (bt_plan(g, &oh, &p)) {
        CHECK(bt_count(&p, KILN_OP_CAST) == 4); // and the float32 output cast back
        kiln_plan_release(&p);
    }
    kiln_graph_free(g);
    free(lw);
}

// Constants beyond the target's range saturate at its largest finite value instead of becoming
// infinite: an attention mask filled with torch.finfo(torch.float32).min gives a row masked whole
// equal finite scores (softmax: uniform, as in float32), not -inf everywhere (softmax: NaN).
// Infinities stay infinite and in-range values round as before.
static void test_out_of_range_constants_saturate(void) {
    const float big[5] = {1e6f, -1e6f, INFINITY, -INFINITY, 1.5f};
    float *fill = tu_alloc(1);
    kiln_graph *g;
    int32_t x, m, cf, y;
    fill[0] = -FLT_MAX;
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(2, K), TU_DIMS(2, K));
    m = tu_input(g, "mask", KILN_DTYPE_BOOL, 2, TU_DIMS(2, K), TU_DIMS(2, K));
    cf = tu_const(g, "fill", KILN_DTYPE_F32, 0, TU_DIMS(1), fill);
    y = tu_node(g, KILN_OP_WHERE, TU_IDS(m, x, cf), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(y), TU_ATTRS(TU_INTS("dim", -1)));
    tu_output(g, y, "probs");
    for (int prec = 1; prec <= 2; prec++) {
        kiln_build_options oh = bt_opts(0, (kiln_precision)prec, 0);
        uint32_t half = prec == 1 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
        float hmax = prec == 1 ? 65504.0f : 3.38953139e38f;
        kiln_built *built = NULL;
        kiln_plan p;
        if (bt_plan(g, &oh, &p)) {
            int seen = 0;
            for (uint32_t i = 0; i < p.n_tensors; i++) {
                const kiln_plan_tensor *t = &p.tensors[i];
                if (t->kind != KILN_TENSOR_WEIGHT || t->shape.rank != 0) continue;
                CHECK(t->dtype == half);
                CHECK_MSG(kiln_load_f32(p.weights + t->offset, half, 0) == -hmax,
                          "fill became %g, not %g", kiln_load_f32(p.weights + t->offset, half, 0),
                          -hmax);
                seen++;
            }
            CHECK(seen == 1);
            kiln_plan_release(&p);
        }
        // Row 0 masked whole, row 1 half: row 0 uniform (finite), row 1 over its kept entries.
        uint8_t mask[2 * K];
        float *xin = tu_rand(2 * K, -1, 1);
        for (int j = 0; j < 2 * K; j++) mask[j] = j >= K && (j % 2 == 0);
        bt_shape s[2] = {{2, {2, K}}, {2, {2, K}}};
        void *in[2] = {xin, mask};
        bt_outputs r;
        if (kiln_build(g, &oh, &built) == KILN_OK && bt_run(built, 2, s, in, &r)) {
            double sum1 = 0;
            for (int j = 0; j < K; j++) {
                CHECK_MSG(fabsf(r.data[0][j] - 1.0f / K) < 1e-3f, "row 0 entry %d = %g", j,
                          r.data[0][j]);
            }
            for (int j = K; j < 2 * K; j++) {
                if (!mask[j]) CHECK_MSG(r.data[0][j] == 0.0f, "entry %d = %g", j, r.data[0][j]);
                sum1 += r.data[0][j];
            }
            CHECK(fabs(sum1 - 1.0) < 1e-2);
            bt_outputs_free(&r);
        } else {
            CHECK_MSG(0, "build or run: %s", kiln_last_error());
        }
        kiln_built_free(built);
        free(xin);
    }
    // The constant read by a node of its own, checked value by value.
    {
        kiln_graph *g2;
        int32_t x2, c2;
        kiln_plan p;
        CHECK_OK(kiln_graph_new(&g2));
        x2 = tu_input(g2, "x", KILN_DTYPE_F32, 1, TU_DIMS(5), TU_DIMS(5));
        c2 = tu_const(g2, "big", KILN_DTYPE_F32, 1, TU_DIMS(5), big);
        tu_output(g2, tu_node(g2, KILN_OP_ADD, TU_IDS(x2, c2), TU_NO_ATTRS), "y");
        for (int prec = 1; prec <= 2; prec++) {
            kiln_build_options oh = bt_opts(0, (kiln_precision)prec, 0);
            uint32_t half = prec == 1 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
            float hmax = prec == 1 ? 65504.0f : 3.38953139e38f;
            const float want[5] = {prec == 1 ? hmax : 1e6f, prec == 1 ? -hmax : -1e6f, INFINITY,
                                   -INFINITY, 1.5f};
            if (bt_plan(g2, &oh, &p)) {
                for (uint32_t i = 0; i < p.n_tensors; i++) {
                    const kiln_plan_tensor *t = &p.tensors[i];
                    if (t->kind != KILN_TENSOR_WEIGHT) continue;
                    for (int j = 0; j < 5; j++) {
                        float got = kiln_load_f32(p.weights + t->offset, half, j);
                        CHECK_MSG(got == tu_round(want[j], (kiln_dtype)half),
                                  "%s entry %d: %g, want %g", kiln_dtype_name((kiln_dtype)half), j,
                                  got, want[j]);
                    }
                }
                kiln_plan_release(&p);
            }
        }
        kiln_graph_free(g2);
    }
    kiln_graph_free(g);
    free(fill);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    test_mlp();
    test_integer_paths();
    test_position_math();
    test_no_casts_and_shared_output();
    test_identity_casts();
    test_out_of_range_constants_saturate();
    return check_summary();
}
