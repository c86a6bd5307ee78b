// SPDX-License-Identifier: Apache-2.0
// View simplification: permutes of size-1 dims, squeezes and unsqueezes become reshapes,
// reshape chains collapse (dynamic dims included), identity reshapes go; a real transpose stays.
// The plan's layers after the passes, and the optimized engine against the unoptimized one on
// random inputs.
#include "builder/builder_test_util.h"

// A decode step's head split and merge: [B, 1, H * E] -> [B, 1, H, E] -> [B, H, 1, E] -> tanh
// -> [B, 1, H, E] -> [B, 1, H * E] (B dynamic): every view collapses into one reshape per side.
static void test_head_split_merge(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 1, 24), TU_DIMS(4, 1, 24));
    int32_t v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", -2, 1, 4, 6)));
    v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    v = tu_node(g, KILN_OP_TANH, TU_IDS(v), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", -2, 1, 4, 6)));
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", -2, 1, 24)));
    v = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(v), TU_ATTRS(TU_INTS("dim", 0)));
    v = tu_node(g, KILN_OP_SQUEEZE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0)));
    v = tu_node(g, KILN_OP_SIGMOID, TU_IDS(v), TU_NO_ATTRS);
    tu_output(g, v, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "reshape|tanh|reshape|sigmoid");
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {3, 1, 24}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, "head split and merge at L = 1");
    kiln_graph_free(g);
}

// A permute that swaps two dims larger than 1 is a transpose: it stays; a reshape whose output
// is its input goes, as does a copy (clone) inside the graph; a copy that is the output stays.
static void test_transpose_and_identity(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 3, 5), TU_DIMS(6, 3, 5));
    int32_t v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(x), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    v = tu_node(g, KILN_OP_EXP, TU_IDS(v), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_COPY, TU_IDS(v), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", -1, 5, 3)));
    v = tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS);
    tu_output(g, v, "y");
    tu_output(g, tu_node(g, KILN_OP_COPY, TU_IDS(v), TU_NO_ATTRS), "y_copy");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "permute|exp|neg|copy");
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {4, 3, 5}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, "transpose kept, identity removed");
    kiln_graph_free(g);
}

// Two dynamic dims: a chain whose codes copy dims collapses with the copies rewritten to the
// first input's dims; the swapped copy (a reinterpretation, not an identity) stays a reshape.
static void test_dynamic_chain(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 1, 4), TU_DIMS(3, 5, 4));
    // [B, S, 4] -> [B, S, 2, 2] -> [B, S, 1, 2, 2] -> [B, S, 4] (the identity), then
    // [S, B, 4]: the same bytes read as another shape
    int32_t v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", -2, -3, 2, 2)));
    v = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(v), TU_ATTRS(TU_INTS("dim", 2)));
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", -2, -3, 4)));
    v = tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", -3, -2, 4)));
    tu_output(g, v, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "neg|reshape");
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {2, 5, 4}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, "dynamic chain");
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    test_head_split_merge();
    test_transpose_and_identity();
    test_dynamic_chain();
    return check_summary();
}
