// SPDX-License-Identifier: Apache-2.0
// Constant folding, dead-code elimination and matmul-to-linear: the plan's structure after the
// passes (read back through the loader), and that the optimized engine computes what the
// unoptimized one does on random inputs.
#include "builder/builder_test_util.h"

#define K 16
#define N 8

// An exported nn.Linear: permute(w) -> matmul -> add bias -> relu, plus a dead branch.
static kiln_graph *exported_linear(const float *w, const float *b) {
    kiln_graph *g = NULL;
    int32_t x, cw, cb, wt, y;
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 1, K), TU_DIMS(4, 5, K));
    cw = tu_const(g, "fc.weight", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    cb = tu_const(g, "fc.bias", KILN_DTYPE_F32, 1, TU_DIMS(N), b);
    wt = tu_node(g, KILN_OP_PERMUTE, TU_IDS(cw), TU_ATTRS(TU_INTS("dims", 1, 0)));
    y = tu_node(g, KILN_OP_MATMUL, TU_IDS(x, wt), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(cb, y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    (void)tu_node(g, KILN_OP_SIGMOID, TU_IDS(x), TU_NO_ATTRS); // dead
    tu_output(g, y, "y");
    return g;
}

static void test_exported_linear(void) {
    float w[N * K], b[N];
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    bt_shape shapes[1] = {{3, {3, 5, K}}};
    tu_fill(w, N * K, -1, 1);
    tu_fill(b, N, -1, 1);
    g = exported_linear(w, b);
    if (bt_plan(g, &o0, &p)) {
        BT_EXPECT_LAYERS(&p, "permute|matmul|add|relu|sigmoid");
        CHECK(p.arena_nbytes > 0);
        kiln_plan_release(&p);
    }
    if (bt_plan(g, &o1, &p)) {
        // permute folded, matmul -> linear with the transposed-back weight, add -> bias,
        // relu fused, sigmoid removed
        BT_EXPECT_LAYERS(&p, "linear,relu");
        CHECK(p.layers[0].n_inputs == 3 && p.layers[0].n_tail == 1);
        CHECK(bt_count_kind(&p, KILN_TENSOR_WEIGHT) == 2 && p.arena_nbytes == 0);
        // the weight is back in [N, K] layout, bit for bit the original
        for (uint32_t i = 0; i < p.n_tensors; i++) {
            const kiln_plan_tensor *t = &p.tensors[i];
            if (t->kind != KILN_TENSOR_WEIGHT) continue;
            if (t->shape.rank == 2) {
                CHECK(t->shape.max[0] == N && t->shape.max[1] == K);
                CHECK(memcmp(p.weights + t->offset, w, sizeof w) == 0);
                // the build's transposed-back weight is the caller's bytes: common-subexpression
                // elimination makes it the caller's constant again, with its name
                CHECK(strcmp(kiln_plan_string(&p, t->name), "fc.weight") == 0);
            } else {
                CHECK(memcmp(p.weights + t->offset, b, sizeof b) == 0);
                CHECK(strcmp(kiln_plan_string(&p, t->name), "fc.bias") == 0);
            }
        }
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, shapes, 0, 1e-5, 1e-5, "exported linear");
    shapes[0] = (bt_shape){3, {1, 1, K}};
    bt_compare(g, &o0, &o1, 1, shapes, 0, 1e-5, 1e-5, "exported linear 1x1");
    kiln_graph_free(g);
}

// A weight shared by two matmuls is transposed once; a weight with another reader is kept.
static void test_shared_weight(void) {
    float w[K * N];
    kiln_graph *g;
    kiln_plan p;
    int32_t x, cw, y1, y2, y3;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    bt_shape shapes[1] = {{2, {3, K}}};
    tu_fill(w, K * N, -1, 1);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(4, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(K, N), w);
    y1 = tu_node(g, KILN_OP_MATMUL, TU_IDS(x, cw), TU_NO_ATTRS);
    y2 = tu_node(g, KILN_OP_NEG, TU_IDS(x), TU_NO_ATTRS); // another input: not the same matmul
    y2 = tu_node(g, KILN_OP_MATMUL, TU_IDS(y2, cw), TU_NO_ATTRS);
    y1 = tu_node(g, KILN_OP_SUB, TU_IDS(y1, y2), TU_NO_ATTRS);
    tu_output(g, y1, "d");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "neg|linear|linear,sub");
        CHECK(bt_count_kind(&p, KILN_TENSOR_WEIGHT) == 1);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, shapes, 0, 1e-6, 0, "shared weight");
    kiln_graph_free(g);
    // the weight is also read by an elementwise op on an input: matmul stays (no duplicate)
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(4, K));
    y3 = tu_input(g, "s", KILN_DTYPE_F32, 2, TU_DIMS(K, N), TU_DIMS(K, N));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(K, N), w);
    y1 = tu_node(g, KILN_OP_MATMUL, TU_IDS(x, cw), TU_NO_ATTRS);
    y3 = tu_node(g, KILN_OP_ADD, TU_IDS(cw, y3), TU_NO_ATTRS);
    tu_output(g, y1, "y");
    tu_output(g, y3, "e");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "matmul|add");
        kiln_plan_release(&p);
    }
    {
        bt_shape s2[2] = {{2, {2, K}}, {2, {K, N}}};
        bt_compare(g, &o0, &o1, 2, s2, 0, 1e-6, 0, "weight with another reader");
    }
    kiln_graph_free(g);
}

// A chain over constants folds completely; the output becomes a copy of one weight.
static void test_constant_output(void) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -1, 2};
    float want[6], got[6];
    kiln_graph *g;
    kiln_plan p;
    kiln_built *bt = NULL;
    int32_t x, ca, cb, y, z;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    // y = permute(reshape(a, [3, 2]) ... ) : reshape a[2,3] -> [3,2], permute -> [2,3], * b
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 3; j++) {
            // reshape [3,2] then permute: element (i, j) = reshaped[j][i] = a[j * 2 + i]
            want[i * 3 + j] = a[j * 2 + i] * b[j];
        }
    }
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "unused", KILN_DTYPE_F32, 1, TU_DIMS(2), TU_DIMS(2));
    ca = tu_const(g, "a", KILN_DTYPE_F32, 2, TU_DIMS(2, 3), a);
    cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(3), b);
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(ca), TU_ATTRS(TU_INTS("shape", 3, -1)));
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 1, 0)));
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, cb), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_NEG, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "y");
    tu_output(g, z, "z");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "neg|copy");
        CHECK(bt_count_kind(&p, KILN_TENSOR_WEIGHT) == 1);
        kiln_plan_release(&p);
    }
    CHECK_OK(kiln_build(g, &o1, &bt));
    if (bt != NULL) {
        bt_outputs r;
        float xin[2] = {1, 2};
        void *in[1] = {xin};
        bt_shape s[1] = {{1, {2}}};
        if (bt_run(bt, 1, s, in, &r)) {
            memcpy(got, r.data[0], sizeof got);
            for (int i = 0; i < 6; i++) CHECK(got[i] == want[i]); // exact: one multiply each
            CHECK(r.data[1][0] == -1.0f && r.data[1][1] == -2.0f);
            bt_outputs_free(&r);
        }
        kiln_built_free(bt);
    }
    kiln_graph_free(g);
}

// Folding stops at KILN_FOLD_MAX_NBYTES of output.
static void test_fold_cap(void) {
    float one = 1.5f;
    kiln_graph *g;
    kiln_plan p;
    int32_t x, c, big, y;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    for (int over = 0; over < 2; over++) {
        int64_t cols = over ? 4097 : 4096; // 1024 x 4096 x 4 bytes = 16 MiB exactly
        CHECK_OK(kiln_graph_new(&g));
        x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1024, 1), TU_DIMS(1024, 1));
        c = tu_const(g, "c", KILN_DTYPE_F32, 0, TU_DIMS(0), &one);
        big = tu_node(g, KILN_OP_EXPAND, TU_IDS(c), TU_ATTRS(TU_INTS("shape", 1024, cols)));
        y = tu_node(g, KILN_OP_MUL, TU_IDS(x, big), TU_NO_ATTRS);
        tu_output(g, y, "y");
        if (bt_plan(g, &o1, &p)) {
            CHECK_EQ_INT(bt_count(&p, KILN_OP_EXPAND), over);
            if (!over) CHECK(p.weights_nbytes == (uint64_t)16 << 20);
            kiln_plan_release(&p);
        }
        kiln_graph_free(g);
    }
}

// Over the cap, a fold that consumes its constant inputs (weight normalization: w = v * g / |v|
// over a weight v larger than KILN_FOLD_MAX_NBYTES) still folds into the one weight w; when the
// engine also reads v, the chain stays (folding would store v twice).
static void test_fold_free(void) {
    enum { R = 1024, C = 4100 }; // 16.02 MiB of float32
    float *v = malloc(sizeof(float) * R * C), gain[C];
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    bt_shape shapes[1] = {{2, {R, C}}};
    CHECK(v != NULL);
    if (v == NULL) return;
    tu_fill(v, (int64_t)R * C, -1, 1);
    tu_fill(gain, C, 0.5f, 2);
    for (int shared = 0; shared < 2; shared++) {
        kiln_graph *g;
        kiln_plan p;
        int32_t x, cv, cg, t, y;
        CHECK_OK(kiln_graph_new(&g));
        x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(R, C), TU_DIMS(R, C));
        cv = tu_const(g, "conv.weight_v", KILN_DTYPE_F32, 2, TU_DIMS(R, C), v);
        cg = tu_const(g, "conv.weight_g", KILN_DTYPE_F32, 2, TU_DIMS(1, C), gain);
        t = tu_node(g, KILN_OP_MUL, TU_IDS(cv, cv), TU_NO_ATTRS);
        t = tu_node(g, KILN_OP_SUM, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0), TU_INTS("keepdim", 1)));
        t = tu_node(g, KILN_OP_SQRT, TU_IDS(t), TU_NO_ATTRS);
        t = tu_node(g, KILN_OP_DIV, TU_IDS(cg, t), TU_NO_ATTRS);
        t = tu_node(g, KILN_OP_MUL, TU_IDS(cv, t), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_ADD, TU_IDS(x, t), TU_NO_ATTRS);
        tu_output(g, y, "y");
        if (shared) tu_output(g, tu_node(g, KILN_OP_MUL, TU_IDS(x, cv), TU_NO_ATTRS), "xv");
        if (bt_plan(g, &o1, &p)) {
            if (!shared) {
                BT_EXPECT_LAYERS(&p, "add");
                CHECK(p.weights_nbytes == (uint64_t)R * C * sizeof(float));
            } else {
                // v's norm stays (v is read twice), as one vector_norm
                CHECK(bt_count(&p, KILN_OP_VECTOR_NORM) == 1 && bt_count(&p, KILN_OP_SUM) == 0 &&
                      bt_count(&p, KILN_OP_MUL) == 2);
            }
            kiln_plan_release(&p);
        }
        bt_compare(g, &o1, &o0, 1, shapes, 0, 1e-5, 1e-5, shared ? "shared v" : "weight norm");
        kiln_graph_free(g);
    }
    free(v);
}

// Dead-code elimination keeps what reaches an output, including inputs nothing reads.
static void test_dce(void) {
    kiln_graph *g;
    kiln_plan p;
    int32_t x, u, y, d;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    u = tu_input(g, "unused", KILN_DTYPE_I64, 1, TU_DIMS(1), TU_DIMS(9));
    d = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    d = tu_node(g, KILN_OP_LOG, TU_IDS(d), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_TANH, TU_IDS(x), TU_NO_ATTRS);
    (void)tu_node(g, KILN_OP_SUM, TU_IDS(u), TU_ATTRS(TU_INTS("dims", 0)));
    (void)d;
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "tanh");
        CHECK(p.n_inputs == 2 && p.tensors[p.inputs[1]].dtype == KILN_DTYPE_I64);
        CHECK(p.tensors[p.inputs[1]].shape.max[0] == 9);
        kiln_plan_release(&p);
    }
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    test_exported_linear();
    test_shared_weight();
    test_constant_output();
    test_fold_cap();
    test_fold_free();
    test_dce();
    return check_summary();
}
