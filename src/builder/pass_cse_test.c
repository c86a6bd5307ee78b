// SPDX-License-Identifier: Apache-2.0
// Common-subexpression elimination: equal nodes (op, inputs, attributes) become one layer, chains
// of them collapse, nodes that differ in an attribute or an input stay, a duplicate that is a
// graph output stays; the optimized engine computes what the unoptimized one does.
#include "builder/builder_test_util.h"

#define D 6

// Per-"layer" views of one shared table (as decoders unsqueeze their rotary tables in every
// layer) and a mask compared in every layer, then used.
static void test_repeated_views(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, 3, D), TU_DIMS(2, 3, D));
    int32_t t = tu_input(g, "table", KILN_DTYPE_F32, 2, TU_DIMS(3, D), TU_DIMS(3, D));
    int32_t y = x;
    for (int layer = 0; layer < 3; layer++) {
        int32_t u = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(t), TU_ATTRS(TU_INTS("dim", 0)));
        int32_t e = tu_node(g, KILN_OP_EXPAND, TU_IDS(u), TU_ATTRS(TU_INTS("shape", 2, 3, D)));
        int32_t m = tu_node(g, KILN_OP_GT, TU_IDS(e, x), TU_NO_ATTRS);
        int32_t s = tu_node(g, KILN_OP_MUL, TU_IDS(y, e), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_WHERE, TU_IDS(m, s, y), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_TANH, TU_IDS(y), TU_NO_ATTRS);
    }
    // unsqueeze at another dim: not the same node
    int32_t u1 = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(t), TU_ATTRS(TU_INTS("dim", 1)));
    tu_output(g, y, "y");
    tu_output(g, u1, "u1");
    if (bt_plan(g, &o1, &p)) {
        // (the unsqueezes become reshapes: pass_views.c)
        CHECK_MSG(bt_count(&p, KILN_OP_RESHAPE) == 2, "reshape layers %u, want 2",
                  bt_count(&p, KILN_OP_RESHAPE));
        // (the one expand left goes too: its readers broadcast the table themselves)
        CHECK(bt_count(&p, KILN_OP_EXPAND) == 0);
        CHECK(bt_count(&p, KILN_OP_GT) == 1);
        CHECK(bt_count(&p, KILN_OP_WHERE) == 3); // different inputs in every layer
        kiln_plan_release(&p);
    }
    bt_shape s[2] = {{3, {2, 3, D}}, {2, {3, D}}};
    bt_compare(g, &o0, &o1, 2, s, 0, 1e-6, 1e-6, "repeated views");
    kiln_graph_free(g);
}

// Two equal nodes that are both graph outputs: each output keeps its layer.
static void test_outputs_kept(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, D), TU_DIMS(4, D));
    int32_t a = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    int32_t b = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    int32_t c = tu_node(g, KILN_OP_CLAMP, TU_IDS(x), TU_ATTRS(TU_FLOATS("min", -0.5)));
    int32_t d = tu_node(g, KILN_OP_CLAMP, TU_IDS(x), TU_ATTRS(TU_FLOATS("min", -0.25)));
    tu_output(g, a, "a");
    tu_output(g, b, "b");
    tu_output(g, tu_node(g, KILN_OP_SUB, TU_IDS(c, d), TU_NO_ATTRS), "c");
    if (bt_plan(g, &o1, &p)) {
        CHECK(bt_count(&p, KILN_OP_EXP) == 2);
        CHECK(bt_count(&p, KILN_OP_CLAMP) == 2); // another min: not equal
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{2, {3, D}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, "outputs kept");
    kiln_graph_free(g);
}

// Tied weights (an embedding table and a logits head of the same bytes, as separate constants)
// and per-layer scalars of equal value are held once; a constant of other bytes stays apart.
static void test_equal_constants(void) {
    enum { V = 11 };
    float table[V * D], other[V * D], eps1 = 1e-5f, eps2 = 1e-5f, eps3 = 2e-5f;
    for (int i = 0; i < V * D; i++) {
        table[i] = (float)((i * 37) % 23) / 23.0f - 0.5f;
        other[i] = table[i];
    }
    other[V * D - 1] += 0.25f; // differs in the last element only
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t ids = tu_input(g, "ids", KILN_DTYPE_I64, 1, TU_DIMS(3), TU_DIMS(3));
    int32_t emb = tu_const(g, "embed", KILN_DTYPE_F32, 2, TU_DIMS(V, D), table);
    int32_t head = tu_const(g, "head", KILN_DTYPE_F32, 2, TU_DIMS(V, D), table);
    int32_t head2 = tu_const(g, "head2", KILN_DTYPE_F32, 2, TU_DIMS(V, D), other);
    int32_t e1 = tu_const(g, "eps1", KILN_DTYPE_F32, 0, TU_DIMS(0), &eps1);
    int32_t e2 = tu_const(g, "eps2", KILN_DTYPE_F32, 0, TU_DIMS(0), &eps2);
    int32_t e3 = tu_const(g, "eps3", KILN_DTYPE_F32, 0, TU_DIMS(0), &eps3);
    int32_t h = tu_node(g, KILN_OP_EMBEDDING, TU_IDS(emb, ids), TU_NO_ATTRS);
    int32_t a = tu_node(g, KILN_OP_ADD, TU_IDS(h, e1), TU_NO_ATTRS);
    int32_t c = tu_node(g, KILN_OP_ADD, TU_IDS(h, e2), TU_NO_ATTRS); // equal to a
    int32_t d = tu_node(g, KILN_OP_ADD, TU_IDS(h, e3), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_MUL, TU_IDS(a, c), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_SUB, TU_IDS(a, d), TU_NO_ATTRS);
    tu_output(g, tu_node(g, KILN_OP_LINEAR, TU_IDS(a, head), TU_NO_ATTRS), "logits");
    tu_output(g, tu_node(g, KILN_OP_LINEAR, TU_IDS(a, head2), TU_NO_ATTRS), "logits2");
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count_kind(&p, KILN_TENSOR_WEIGHT) == 4, "%u weights, want 4",
                  bt_count_kind(&p, KILN_TENSOR_WEIGHT)); // table, other, 1e-5, 2e-5
        CHECK(bt_count(&p, KILN_OP_ADD) == 2);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{1, {3}}};
    bt_compare(g, &o0, &o1, 1, s, V - 1, 1e-5, 1e-5, "equal constants");
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    test_repeated_views();
    test_outputs_kept();
    test_equal_constants();
    return check_summary();
}
