// SPDX-License-Identifier: Apache-2.0
// View simplification: permutes of size-1 dims, squeezes and unsqueezes become reshapes,
// reshape chains collapse (dynamic dims included), identity reshapes go; a real transpose stays.
// The plan's layers after the passes, and the optimized engine against the unoptimized one on
// random inputs.
#include "builder/builder_test_util.h"

// A decode step's head split and merge: [B, 1, H * E] -> [B, 1, H, E] -> [B, H, 1, E] -> tanh
// -> [B, 1, H, E] -> [B, 1, H * E] -> sigmoid (B dynamic): the activations move in front of the
// views (rewrite 5), which collapse into the output's one reshape.
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
        BT_EXPECT_LAYERS(&p, "tanh,sigmoid|reshape");
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

// A pad of nothing (Swin's pad to a multiple of the window when the map is one already) is
// removed, dynamic batch included; a pad of something, and one that is an output, stay.
static void test_zero_pad(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 4, 4, 3), TU_DIMS(5, 4, 4, 3));
    int32_t v = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_PAD, TU_IDS(v), TU_ATTRS(TU_INTS("pads", 0, 0, 0, 0, 0, 0)));
    v = tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS);
    int32_t w = tu_node(g, KILN_OP_PAD, TU_IDS(v), TU_ATTRS(TU_INTS("pads", 0, 0, 0, 1, 0, 0)));
    tu_output(g, tu_node(g, KILN_OP_EXP, TU_IDS(w), TU_NO_ATTRS), "y");
    tu_output(g, tu_node(g, KILN_OP_PAD, TU_IDS(v), TU_ATTRS(TU_INTS("pads", 0, 0))), "z");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "exp|neg|pad|exp|pad");
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{4, {3, 4, 4, 3}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, "pad of nothing removed");
    kiln_graph_free(g);
}

// Rewrite 7: tokens [B, H * W, C] viewed as a channels-first map and flattened back
// (reshape, permute, reshape, permute) keep every element in place: one reshape, then nothing
// (an identity). variant 1: H and W swapped on the way (a real transpose) stays; 2: the map is
// also an output (the chain is read twice) and stays.
static void test_order_keeping_chain(int variant, const char *want, const char *what) {
    enum { B = 2, H = 3, W = 4, C = 5 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(B, H * W, C), TU_DIMS(B, H * W, C));
    int32_t v = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", B, H, W, C)));
    v = variant == 1
            ? tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 3, 2, 1)))
            : tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 3, 1, 2)));
    if (variant == 2) tu_output(g, v, "map");
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", B, C, H * W)));
    v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {B, H * W, C}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, what);
    kiln_graph_free(g);
}

// An einsum's operand views after a head split (x [B, L, H * E] -> [B, L, H, E] -> permute to
// [B, H, L, E], then unsqueeze, two permutes, a clone and a reshape to [B H, ..], as torch's export
// writes them): variant 0, v's views keep the element order: from the split on, one reshape
// (rewrite 7 from the nearer start); 1, k's views transpose L and E: a reshape to [B H, L, E]
// and a swap (rewrite 9); 2, as 1 with the clone read twice: not 9 (the copy ends the chain),
// but its two transposes are one (rewrite 17).
static void test_einsum_views(int variant, const char *want, const char *what) {
    enum { B = 2, L = 3, H = 2, E = 4 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(B, L, H * E), TU_DIMS(B, L, H * E));
    int32_t v = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", B, L, H, E)));
    v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    v = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(v), TU_ATTRS(TU_INTS("dim", 4))); // [B, H, L, E, 1]
    if (variant == 0) { // [B, H, 1, E, L], then [B, H, L, 1, E]
        v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 1, 4, 3, 2)));
        v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 1, 4, 2, 3)));
    } else { // [B, H, 1, L, E], then [B, H, 1, E, L]
        v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 1, 4, 2, 3)));
        v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 4, 3)));
    }
    v = tu_node(g, KILN_OP_COPY, TU_IDS(v), TU_NO_ATTRS);
    if (variant == 2) tu_output(g, v, "clone");
    v = variant == 0
            ? tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", B * H, L, E)))
            : tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", B * H, E, L)));
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {B, L, H * E}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, what);
    kiln_graph_free(g);
}

// Rewrite 10: SegFormer's Mix-FFN, tokens [N, H W, C] from a linear, `transpose(1, 2).view(N, C,
// H, W)`, a depthwise conv, `flatten(2).transpose(1, 2)`: reshape + permute(0, 3, 1, 2) before
// the conv, permute(0, 2, 3, 1) + reshape after it; variant 1: the tokens are the engine's input
// (not a view either): the same.
static void test_token_map(int variant, const char *want, const char *what) {
    enum { N = 2, H = 3, W = 4, C = 8 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float *wt = tu_rand(C * 9, -0.3f, 0.3f);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(N, H * W, C), TU_DIMS(N, H * W, C));
    int32_t t = variant == 1 ? x : tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", N, C, H, W)));
    int32_t w = tu_const(g, NULL, KILN_DTYPE_F32, 4, TU_DIMS(C, 1, 3, 3), wt);
    t = tu_node(g, KILN_OP_CONV2D, TU_IDS(t, w),
                TU_ATTRS(TU_INTS("stride", 1, 1), TU_INTS("padding", 1, 1),
                         TU_INTS("dilation", 1, 1), TU_INTS("groups", C)));
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", N, C, H * W)));
    t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(t), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {N, H * W, C}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, what);
    kiln_graph_free(g);
    free(wt);
}

// Rewrite 11: Swin's patch merging, x [N, H, W, C] sliced x[:, a::S, b::S, :] for every offset
// pair and concatenated over C. variant 0: torchvision's order (a + 2 b: (0, 0), (1, 0), (0, 1),
// (1, 1)), H sliced first; 1: the order 2 a + b, W sliced first; 2: S = 3; 3: an order that is
// neither (stays); 4: concatenated over W (stays); 5: one part sliced from another tensor
// (stays).
static void test_space_to_depth(int variant, const char *want, const char *what) {
    const int64_t S = variant == 2 ? 3 : 2, N = 2, H = 2 * S, W = 3 * S, C = 8;
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(N, H, W, C), TU_DIMS(N, H, W, C));
    const int32_t x2 = tu_node(g, KILN_OP_SIN, TU_IDS(x), TU_NO_ATTRS);
    x = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    int32_t parts[9];
    static const int swap3[4] = {0, 3, 2, 1}; // variant 3: (0, 0), (1, 1), (0, 1), (1, 0)
    for (int i = 0; i < S * S; i++) {
        const int j = variant == 3 ? swap3[i] : i;
        const int64_t a = variant == 1 ? j / S : j % S, bo = variant == 1 ? j % S : j / S;
        const int32_t src = variant == 5 && i == 1 ? x2 : x;
        int32_t t = variant == 1 ? src
                                 : tu_node(g, KILN_OP_SLICE, TU_IDS(src),
                                           TU_ATTRS(TU_INTS("dim", 1), TU_INTS("start", a),
                                                    TU_INTS("end", INT64_MAX), TU_INTS("step", S)));
        t = tu_node(g, KILN_OP_SLICE, TU_IDS(t),
                    TU_ATTRS(TU_INTS("dim", 2), TU_INTS("start", bo), TU_INTS("end", INT64_MAX),
                             TU_INTS("step", S)));
        if (variant == 1)
            t = tu_node(g, KILN_OP_SLICE, TU_IDS(t),
                        TU_ATTRS(TU_INTS("dim", -3), TU_INTS("start", a), TU_INTS("end", INT64_MAX),
                                 TU_INTS("step", S)));
        parts[i] = t;
    }
    const int64_t cd = variant == 4 ? 2 : -1;
    int32_t y = -1;
    kiln_attr ca = {"dim", &cd, NULL, 1};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_CAT, parts, (uint32_t)(S * S), &ca, 1, &y, 1));
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(y), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{4, {N, H, W, C}}};
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-6, 1e-6, what);
    kiln_graph_free(g);
}

// Rewrite 12: Swin-V2's cosine attention after its head split, x [B, L, H E] -> exp -> [B, L, H,
// E] -> permute(0, 2, 1, 3) -> rms_norm over E -> a per-head scale [H, 1, 1] -> neg: the norm and
// the mul run before the permute. variant 1: a layer_norm with weight and bias; 2: the permute
// moves E (stays); 3: the permute also read by an add (stays); 4: a scale [H, 1, E] (the norm
// moves, the mul stays after the permute); 5: a scale [H, L, E] (its dims H and L would swap:
// the norm moves, the mul stays).
static void test_op_before_permute(int variant, const char *want, const char *what) {
    enum { B = 2, L = 5, H = 3, E = 4 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float *w = tu_rand(E, 0.5f, 1.5f), *bb = tu_rand(E, -0.5f, 0.5f),
          *sc = tu_rand(H * L * E, 0.5f, 2.0f);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(B, L, H * E), TU_DIMS(B, L, H * E));
    int32_t t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", B, L, H, E)));
    int32_t pm =
        variant == 2
            ? tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 3, 1, 2)))
            : tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    const int64_t ne = variant == 2 ? H : E; // the permuted tensor's last dim
    int32_t cw = tu_const(g, "w", KILN_DTYPE_F32, 1, TU_DIMS(ne), w);
    if (variant == 1) {
        int32_t cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(ne), bb);
        t = tu_node(g, KILN_OP_LAYER_NORM, TU_IDS(pm, cw, cb),
                    TU_ATTRS(TU_INTS("normalized_ndim", 1), TU_FLOATS("eps", 1e-5)));
    } else {
        t = tu_node(g, KILN_OP_RMS_NORM, TU_IDS(pm, cw), TU_ATTRS(TU_FLOATS("eps", 1e-6)));
    }
    int32_t cs = variant == 5   ? tu_const(g, "s", KILN_DTYPE_F32, 3, TU_DIMS(H, L, E), sc)
                 : variant == 4 ? tu_const(g, "s", KILN_DTYPE_F32, 3, TU_DIMS(H, 1, E), sc)
                 : variant == 2 ? tu_const(g, "s", KILN_DTYPE_F32, 3, TU_DIMS(E, 1, 1), sc)
                                : tu_const(g, "s", KILN_DTYPE_F32, 3, TU_DIMS(H, 1, 1), sc);
    t = tu_node(g, KILN_OP_MUL, TU_IDS(t, cs), TU_NO_ATTRS);
    if (variant == 3) t = tu_node(g, KILN_OP_ADD, TU_IDS(t, pm), TU_NO_ATTRS);
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(t), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{3, {B, L, H * E}}};
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-5, 1e-5, what);
    kiln_graph_free(g);
    free(w);
    free(bb);
    free(sc);
}

// Rewrite 12 for a rotary embedding: q [B, L, H E] -> exp -> [B, L, H, E] -> permute(0, 2, 1, 3)
// -> rotary with constant tables [L, E] (transformers' Llama at static shapes) -> neg: the
// rotary runs before the permute, its tables at [L, 1, E]. variant 1: tables [1, 1, L, R] over
// the first R = E / 2 (a partial rotation); 2: the rotary's output also written into a buffer
// by index_copy (a cache: stays); 3: L = 1, the permute moves only a dim of size 1 (a view:
// the rotary reads the reshape, nothing moves);
// 4: tables given as inputs (not constant: stays); 5: tables [H, L, E] (their dims H and L
// would swap: stays).
static void test_rotary_before_permute(int variant, const char *want, const char *what) {
    const int64_t B = 2, L = variant == 3 ? 1 : 5, H = 3, E = 8;
    const int64_t R = variant == 1 ? E / 2 : E, TH = variant == 5 ? H : 1;
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float *cv = tu_rand(TH * L * R, -1.0f, 1.0f), *sv = tu_rand(TH * L * R, -1.0f, 1.0f);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(B, L, H * E), TU_DIMS(B, L, H * E));
    int32_t t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", B, L, H, E)));
    int32_t pm = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    int32_t c, s;
    if (variant == 4) {
        c = tu_input(g, "cos", KILN_DTYPE_F32, 2, TU_DIMS(L, E), TU_DIMS(L, E));
        s = tu_input(g, "sin", KILN_DTYPE_F32, 2, TU_DIMS(L, E), TU_DIMS(L, E));
    } else if (variant == 1) {
        c = tu_const(g, "cos", KILN_DTYPE_F32, 4, TU_DIMS(1, 1, L, R), cv);
        s = tu_const(g, "sin", KILN_DTYPE_F32, 4, TU_DIMS(1, 1, L, R), sv);
    } else if (variant == 5) {
        c = tu_const(g, "cos", KILN_DTYPE_F32, 3, TU_DIMS(H, L, E), cv);
        s = tu_const(g, "sin", KILN_DTYPE_F32, 3, TU_DIMS(H, L, E), sv);
    } else {
        c = tu_const(g, "cos", KILN_DTYPE_F32, 2, TU_DIMS(L, E), cv);
        s = tu_const(g, "sin", KILN_DTYPE_F32, 2, TU_DIMS(L, E), sv);
    }
    int32_t rt = tu_node(g, KILN_OP_ROTARY, TU_IDS(pm, c, s), TU_NO_ATTRS);
    if (variant == 2) {
        int32_t buf =
            tu_input(g, "buf", KILN_DTYPE_F32, 4, TU_DIMS(B, H, 2 * L, E), TU_DIMS(B, H, 2 * L, E));
        int32_t idx = tu_input(g, "pos", KILN_DTYPE_I64, 1, TU_DIMS(L), TU_DIMS(L));
        tu_output(g,
                  tu_node(g, KILN_OP_INDEX_COPY, TU_IDS(buf, idx, rt),
                          TU_ATTRS(TU_INTS("dim", 2), TU_INTS("wrap", 0))),
                  "cache");
    }
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(rt), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    if (variant == 2) {
        bt_shape sh[3] = {{3, {B, L, H * E}}, {4, {B, H, 2 * L, E}}, {1, {L}}};
        bt_compare(g, &o0, &o1, 3, sh, 2 * L - 1, 1e-5, 1e-5, what);
    } else if (variant == 4) {
        bt_shape sh[3] = {{3, {B, L, H * E}}, {2, {L, E}}, {2, {L, E}}};
        bt_compare(g, &o0, &o1, 3, sh, 0, 1e-5, 1e-5, what);
    } else {
        bt_shape sh[1] = {{3, {B, L, H * E}}};
        bt_compare(g, &o0, &o1, 1, sh, 0, 1e-5, 1e-5, what);
    }
    kiln_graph_free(g);
    free(cv);
    free(sv);
}

// Rewrite 14: GPT-NeoX's packed per-head projection, x [B, L, H * 3E] -> exp -> [B, L, H, 3E] ->
// permute(0, 2, 1, 3) -> q, k, v as slices of the last dim -> sdpa -> permute back -> reshape ->
// neg: each slice reads the reshape and is permuted on its own (the permutes feed sdpa).
// variant 1: q and k through a rotary with constant tables [L, E] (12 then moves them before
// their permutes); 2: v also read by a relu (an output: stays); 3: tables as inputs (the rotary
// cannot move: stays); 4: B dynamic; 5: constant tables [H, L, E] (their dims H and L would swap
// in front of the permute: 12 cannot move the rotaries, so the one permute stays).
static void test_slices_before_permute(int variant, const char *want, const char *what) {
    const int64_t B = 2, L = 5, H = 3, E = 8;
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float *cv = tu_rand(H * L * E, -1.0f, 1.0f), *sv = tu_rand(H * L * E, -1.0f, 1.0f);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(variant == 4 ? 1 : B, L, H * 3 * E),
                         TU_DIMS(B, L, H * 3 * E));
    int32_t t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", -2, L, H, 3 * E)));
    int32_t pm = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    int32_t qkv[3], c = -1, s = -1;
    if (variant == 3) {
        c = tu_input(g, "cos", KILN_DTYPE_F32, 2, TU_DIMS(L, E), TU_DIMS(L, E));
        s = tu_input(g, "sin", KILN_DTYPE_F32, 2, TU_DIMS(L, E), TU_DIMS(L, E));
    } else if (variant == 1) {
        c = tu_const(g, "cos", KILN_DTYPE_F32, 2, TU_DIMS(L, E), cv);
        s = tu_const(g, "sin", KILN_DTYPE_F32, 2, TU_DIMS(L, E), sv);
    } else if (variant == 5) {
        c = tu_const(g, "cos", KILN_DTYPE_F32, 3, TU_DIMS(H, L, E), cv);
        s = tu_const(g, "sin", KILN_DTYPE_F32, 3, TU_DIMS(H, L, E), sv);
    }
    for (int64_t j = 0; j < 3; j++) {
        qkv[j] = tu_node(
            g, KILN_OP_SLICE, TU_IDS(pm),
            TU_ATTRS(TU_INTS("dim", -1), TU_INTS("start", j * E), TU_INTS("end", (j + 1) * E)));
        if (c >= 0 && j < 2) qkv[j] = tu_node(g, KILN_OP_ROTARY, TU_IDS(qkv[j], c, s), TU_NO_ATTRS);
    }
    int32_t a = tu_node(g, KILN_OP_SDPA, TU_IDS(qkv[0], qkv[1], qkv[2]), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_PERMUTE, TU_IDS(a), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    a = tu_node(g, KILN_OP_RESHAPE, TU_IDS(a), TU_ATTRS(TU_INTS("shape", -2, L, H * E)));
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(a), TU_NO_ATTRS), "y");
    if (variant == 2) tu_output(g, tu_node(g, KILN_OP_RELU, TU_IDS(qkv[2]), TU_NO_ATTRS), "r");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape sh[3] = {{3, {B, L, H * 3 * E}}, {2, {L, E}}, {2, {L, E}}};
    bt_compare(g, &o0, &o1, variant == 3 ? 3 : 1, sh, 0, 1e-5, 1e-5, what);
    if (variant == 4) {
        sh[0].dims[0] = 1;
        bt_compare(g, &o0, &o1, 1, sh, 0, 1e-5, 1e-5, what);
    }
    kiln_graph_free(g);
    free(cv);
    free(sv);
}

// Rewrite 13: Swin's shifted windows, x [1, 8, 8, C] -> exp -> torch.roll by -3 over H and W
// (two index ops with constant indices) -> window partition (reshape [1, 2, 4, 2, 4, C], permute
// (0, 1, 3, 2, 4, 5), reshape [4, 16, C]) -> neg: one row gather. variant 1: the window reverse
// and the roll back (the same links in the other order, from [4, 16, C]); 2: no roll (a chain
// of views and a permute: stays); 3: a roll over H alone, no partition (one copy: stays); 4:
// indices as int64 with negative entries (wrap).
static void test_row_gather(int variant, const char *want, const char *what) {
    enum { H = 8, C = 8, S = 3 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    int32_t i32[H];
    int64_t i64[H];
    for (int i = 0; i < H; i++) {
        i32[i] = variant == 1 ? (i + H - S) % H : (i + S) % H; // roll by +S, or by -S
        i64[i] = i32[i] >= H / 2 ? i32[i] - H : i32[i];        // the same rows, wrapped
    }
    const kiln_dtype it = variant == 4 ? KILN_DTYPE_I64 : KILN_DTYPE_I32;
    CHECK_OK(kiln_graph_new(&g));
    const int rev = variant == 1;
    int32_t x = rev ? tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(4, 16, C), TU_DIMS(4, 16, C))
                    : tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, H, H, C), TU_DIMS(1, H, H, C));
    int32_t t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    int32_t ix = -1;
    const int64_t idims[1] = {H};
    CHECK_OK(kiln_graph_add_constant(g, NULL, it, 1, idims, variant == 4 ? (const void *)i64 : i32,
                                     variant == 4 ? sizeof i64 : sizeof i32, &ix));
    if (rev) {
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, 2, 2, 4, 4, C)));
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 1, 3, 2, 4, 5)));
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, H, H, C)));
    }
    if (variant != 2) {
        t = tu_node(g, KILN_OP_INDEX, TU_IDS(t, ix),
                    TU_ATTRS(TU_INTS("dim", 1), TU_INTS("wrap", 1)));
        if (variant != 3)
            t = tu_node(g, KILN_OP_INDEX, TU_IDS(t, ix),
                        TU_ATTRS(TU_INTS("dim", 2), TU_INTS("wrap", 1)));
    }
    if (!rev && variant != 3) {
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, 2, 4, 2, 4, C)));
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 1, 3, 2, 4, 5)));
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 4, 16, C)));
    }
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(t), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{rev ? 3u : 4u, {rev ? 4 : 1, rev ? 16 : H, rev ? C : H, C}}};
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-6, 1e-6, what);
    kiln_graph_free(g);
}

// Rewrite 17: SegFormer's spatial reduction over tokens, x [1, 64, C] (an 8 x 8 map) -> exp ->
// permute (0, 2, 1) -> reshape [1, C, 4, 2, 4, 2] -> permute (0, 2, 4, 1, 3, 5) -> reshape
// [1, 16, 4 C] (2 x 2 patches) -> neg: two transposes, one permute of x split as [1, 4, 2, 4,
// 2, C]. variant 1: the patches read by an sdpa as q, k and v (stays); 2: the patches viewed
// again ([1, 4, 4, 4 C], a permute swapping the patch rows and columns, [1, 16, 4 C]): the
// chain, taken from its end, is not one transpose (its middle reshape merges dims the second
// permute left apart), and stays.
static void test_one_transpose(int variant, const char *want, const char *what) {
    enum { C = 8 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    bt_shape sh[1] = {{3, {1, 64, C}}};
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 64, C), TU_DIMS(1, 64, C));
    int32_t t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, C, 4, 2, 4, 2)));
    t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 4, 1, 3, 5)));
    t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, 16, 4 * C)));
    if (variant == 1) t = tu_node(g, KILN_OP_SDPA, TU_IDS(t, t, t), TU_NO_ATTRS);
    if (variant == 2) {
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, 4, 4, 4 * C)));
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, 16, 4 * C)));
    }
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(t), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-6, 1e-6, what);
    kiln_graph_free(g);
}

// Rewrite 15: MaxViT's move from window tokens to grid tokens, x [1, 4, 9, C] (2 x 2 windows of
// 3 x 3) -> exp -> reshape [1, 2, 2, 3, 3, C] -> permute (0, 5, 1, 3, 2, 4) (a channels-first
// map) -> reshape [1, C, 3, 2, 3, 2] -> permute (0, 2, 4, 3, 5, 1) -> reshape [1, 9, 4, C] ->
// permute (0, 2, 1, 3) -> neg: every row of C moves whole, one row gather. variant 1: the
// result read by an sdpa as q, k and v (a head split backends may read as a view: stays); 2:
// the last two permutes only, from x viewed as the channels-first map [1, C, 3, 2, 3, 2] (a
// row of the result gathers C strided elements: stays); 3: two permutes that move elements
// within rows ([2, 4, C] -> (0, 2, 1) -> (1, 0, 2) -> reshape [2, 4, C]): not a gather, one
// transpose (rewrite 17).
static void test_move_gather(int variant, const char *want, const char *what) {
    enum { C = 8 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    bt_shape sh[1] = {{4, {1, 4, 9, C}}};
    CHECK_OK(kiln_graph_new(&g));
    int32_t x, t;
    if (variant == 3) {
        sh[0] = (bt_shape){3, {2, 4, C}};
        x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, 4, C), TU_DIMS(2, 4, C));
        t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 1, 0, 2)));
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 2, 4, C)));
    } else {
        x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 4, 9, C), TU_DIMS(1, 4, 9, C));
        t = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
        if (variant != 2) {
            t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t),
                        TU_ATTRS(TU_INTS("shape", 1, 2, 2, 3, 3, C)));
            t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 5, 1, 3, 2, 4)));
        }
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, C, 3, 2, 3, 2)));
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 4, 3, 5, 1)));
        t = tu_node(g, KILN_OP_RESHAPE, TU_IDS(t), TU_ATTRS(TU_INTS("shape", 1, 9, 4, C)));
        t = tu_node(g, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    }
    if (variant == 1) t = tu_node(g, KILN_OP_SDPA, TU_IDS(t, t, t), TU_NO_ATTRS);
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(t), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-6, 1e-6, what);
    kiln_graph_free(g);
}

// Rewrite 3's elementwise identities: exp(x) * 1, then + [0, 0, ..] (as many as x's last dim),
// then / 1 and - 0: removed, neg reads the exp. variant 1: the ones widen x ([2, 3, 4] * [5, 1,
// 1, 1] ones): stays; 2: * 2: stays; 3: 0 - x: stays; 4: the * 1 is also an output: stays.
static void test_identities(int variant, const char *want, const char *what) {
    enum { A = 2, Bd = 3, C = 4 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float one = variant == 2 ? 2.0f : 1.0f, zero = 0.0f, zeros[C] = {0}, ones[5] = {1, 1, 1, 1, 1};
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(A, Bd, C), TU_DIMS(A, Bd, C));
    int32_t v = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    int32_t c1 = variant == 1 ? tu_const(g, NULL, KILN_DTYPE_F32, 4, TU_DIMS(5, 1, 1, 1), ones)
                              : tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &one);
    v = tu_node(g, KILN_OP_MUL, TU_IDS(v, c1), TU_NO_ATTRS);
    if (variant == 4) tu_output(g, v, "scaled");
    int32_t cz = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(C), zeros);
    v = tu_node(g, KILN_OP_ADD, TU_IDS(cz, v), TU_NO_ATTRS);
    int32_t c0 = tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &zero);
    v = variant == 3 ? tu_node(g, KILN_OP_SUB, TU_IDS(c0, v), TU_NO_ATTRS)
                     : tu_node(g, KILN_OP_SUB, TU_IDS(v, c0), TU_NO_ATTRS);
    if (variant != 1) {
        float one1 = 1.0f;
        int32_t cd = tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &one1);
        v = tu_node(g, KILN_OP_DIV, TU_IDS(v, cd), TU_NO_ATTRS);
    }
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {A, Bd, C}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, what);
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

// Rewrite 4: a linear between the reshapes torch's export puts around it, then an activation
// and a residual add. variant 0: x [2, 5, K] -> [10, K] -> linear -> [2, 5, N]; 1: addmm's
// form (a biasless linear, then add of a bias [N]); 2: a head merge x [2, 5, 4, 6] ->
// [10, 24]; 3: x [B, 5, K] with B dynamic; 4: the result split the other way ([5, 2, N]):
// the reshapes stay (the GELU moves in front of the second one: rewrite 5).
static void test_linear_through(int variant, const char *want, const char *what) {
    enum { K = 24, N = 16 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float *w = tu_rand(N * K, -0.5f, 0.5f), *b = tu_rand(N, -0.5f, 0.5f);
    int dyn = variant == 3;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = variant == 2
                    ? tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(2, 5, 4, 6), TU_DIMS(2, 5, 4, 6))
                    : tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(dyn ? 1 : 2, 5, K),
                               TU_DIMS(dyn ? 3 : 2, 5, K));
    int32_t r =
        tu_input(g, "r", KILN_DTYPE_F32, 3, TU_DIMS(dyn ? 1 : 2, 5, N), TU_DIMS(dyn ? 3 : 2, 5, N));
    if (variant == 4) {
        kiln_graph_free(g);
        CHECK_OK(kiln_graph_new(&g));
        x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, 5, K), TU_DIMS(2, 5, K));
        r = tu_input(g, "r", KILN_DTYPE_F32, 3, TU_DIMS(5, 2, N), TU_DIMS(5, 2, N));
    }
    int32_t cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    int32_t cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(N), b), y;
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", -1, K)));
    if (variant == 1) {
        y = tu_node(g, KILN_OP_LINEAR, TU_IDS(y, cw), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_ADD, TU_IDS(cb, y), TU_NO_ATTRS);
    } else {
        y = tu_node(g, KILN_OP_LINEAR, TU_IDS(y, cw, cb), TU_NO_ATTRS);
    }
    if (variant == 4) {
        y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", 5, 2, N)));
    } else {
        y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", dyn ? -1 : 2, 5, N)));
    }
    y = tu_node(g, KILN_OP_GELU, TU_IDS(y), TU_ATTRS(TU_INTS("approximate", 1)));
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, r), TU_NO_ATTRS);
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape s[2] = {{3, {2, 5, K}}, {3, {2, 5, N}}};
    if (variant == 2) s[0] = (bt_shape){4, {2, 5, 4, 6}};
    if (variant == 4) s[1] = (bt_shape){3, {5, 2, N}};
    bt_compare(g, &o0, &o1, 2, s, 0, 1e-5, 1e-5, what);
    if (dyn) {
        bt_shape s3[2] = {{3, {3, 5, K}}, {3, {3, 5, N}}};
        bt_compare(g, &o0, &o1, 2, s3, 0, 1e-5, 1e-5, what);
    }
    kiln_graph_free(g);
    free(w);
    free(b);
}

// Rewrite 5: squeeze-excite's tail. s = sigmoid(reshape(linear(p), [N, C, 1, 1])) scales
// x [N, C, H, W]: the sigmoid moves in front of the reshape and fuses into the linear. variant
// 1: the reshape has a second reader (an output): the sigmoid stays after it.
static void test_unary_before_reshape(int variant, const char *want, const char *what) {
    enum { C = 8, K = 4 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float *w = tu_rand(C * K, -0.5f, 0.5f), *b = tu_rand(C, -0.5f, 0.5f);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, C, 3, 5), TU_DIMS(3, C, 3, 5));
    int32_t q = tu_input(g, "q", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(3, K));
    int32_t cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(C, K), w);
    int32_t cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(C), b);
    int32_t l = tu_node(g, KILN_OP_LINEAR, TU_IDS(q, cw, cb), TU_NO_ATTRS);
    int32_t r = tu_node(g, KILN_OP_RESHAPE, TU_IDS(l), TU_ATTRS(TU_INTS("shape", -2, C, 1, 1)));
    int32_t s = tu_node(g, KILN_OP_SIGMOID, TU_IDS(r), TU_NO_ATTRS);
    int32_t y = tu_node(g, KILN_OP_MUL, TU_IDS(x, s), TU_NO_ATTRS);
    tu_output(g, y, "y");
    if (variant == 1) tu_output(g, r, "logits");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape sh[2] = {{4, {2, C, 3, 5}}, {2, {2, K}}};
    bt_compare(g, &o0, &o1, 2, sh, 0, 1e-5, 1e-5, what);
    sh[0].dims[0] = sh[1].dims[0] = 3;
    bt_compare(g, &o0, &o1, 2, sh, 0, 1e-5, 1e-5, what);
    kiln_graph_free(g);
    free(w);
    free(b);
}

// Rewrite 6: MobileViTv2's linear attention, relu(v) * expand(sum(x, -1), v's shape): the mul
// broadcasts the sum itself and the expand goes. variant 1: the other operand lacks the
// expanded dim (the output would shrink): the expand stays. variant 2: the expand is also an
// output: it stays.
static void test_expand_into_readers(int variant, const char *want, const char *what) {
    enum { C = 8, L = 6 };
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, C, 3, L), TU_DIMS(3, C, 3, L));
    int32_t m =
        tu_node(g, KILN_OP_SUM, TU_IDS(x), TU_ATTRS(TU_INTS("dims", 3), TU_INTS("keepdim", 1)));
    int32_t e = tu_node(g, KILN_OP_EXPAND, TU_IDS(m), TU_ATTRS(TU_INTS("shape", -1, C, 3, L)));
    int32_t other = variant == 1 ? tu_node(g, KILN_OP_NEG, TU_IDS(m), TU_NO_ATTRS)
                                 : tu_node(g, KILN_OP_RELU, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, tu_node(g, KILN_OP_MUL, TU_IDS(other, e), TU_NO_ATTRS), "y");
    if (variant == 2) tu_output(g, e, "e");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, want);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{4, {2, C, 3, L}}};
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-5, 1e-5, what);
    kiln_graph_free(g);
}

// Rewrite 8: a per-channel scale [C, 1, 1] (ConvNeXt's layer scale) and a one-element bias [1]
// multiplied and added over a 4-d map become [1, C, 1, 1] and [1, 1, 1, 1] constants with the
// same bytes and name; the values are unchanged (dynamic batch).
static void test_rank_align(void) {
    kiln_graph *g;
    kiln_plan p;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0),
                       o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    float scale[6], one[1] = {0.25f};
    tu_fill(scale, 6, -1, 1);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 6, 3, 5), TU_DIMS(4, 6, 3, 5));
    int32_t cs = tu_const(g, "layer_scale", KILN_DTYPE_F32, 3, TU_DIMS(6, 1, 1), scale);
    int32_t cb = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(1), one);
    int32_t v = tu_node(g, KILN_OP_EXP, TU_IDS(x), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_MUL, TU_IDS(cs, v), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_ADD, TU_IDS(v, cb), TU_NO_ATTRS);
    tu_output(g, tu_node(g, KILN_OP_NEG, TU_IDS(v), TU_NO_ATTRS), "y");
    if (bt_plan(g, &o1, &p)) {
        uint32_t n4 = 0;
        for (uint32_t i = 0; i < p.n_tensors; i++) {
            const kiln_plan_tensor *t = &p.tensors[i];
            if (t->kind != KILN_TENSOR_WEIGHT) continue;
            CHECK_MSG(t->shape.rank == 4, "a weight of rank %u", t->shape.rank);
            n4 += t->shape.rank == 4;
            if (t->shape.max[1] == 6) {
                CHECK(memcmp(p.weights + t->offset, scale, sizeof scale) == 0);
                CHECK_MSG(strcmp(kiln_plan_string(&p, t->name), "layer_scale") == 0, "named %s",
                          kiln_plan_string(&p, t->name));
            }
        }
        CHECK_EQ_INT(n4, 2);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{4, {3, 6, 3, 5}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-6, 1e-6, "constant operands at the output's rank");
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    test_head_split_merge();
    test_transpose_and_identity();
    test_dynamic_chain();
    test_zero_pad();
    test_rank_align();
    test_order_keeping_chain(0, "exp|neg", "tokens through a channels-first map and back");
    test_order_keeping_chain(1, "exp|reshape|permute|reshape|permute|neg", "a real transpose");
    test_order_keeping_chain(2, "exp|reshape|permute|reshape|permute|neg", "the map read twice");
    test_einsum_views(0, "exp|reshape|permute|reshape|neg", "einsum's v views: one reshape");
    test_einsum_views(1, "exp|reshape|permute|reshape|permute|neg", "einsum's k views: a swap");
    test_einsum_views(2, "exp|reshape|permute|reshape|copy|reshape|neg",
                      "einsum's k views, the clone read twice: one transpose");
    test_token_map(0, "exp|reshape|permute|conv2d|permute|reshape|neg", "tokens to a map and back");
    test_token_map(1, "reshape|permute|conv2d|permute|reshape|neg", "tokens from the input");
    test_space_to_depth(0, "exp|reshape|permute|reshape|neg", "patch merging: one transpose");
    test_space_to_depth(1, "exp|reshape|permute|reshape|neg", "the order 2a + b, W first");
    test_space_to_depth(2, "exp|reshape|permute|reshape|neg", "a stride of 3");
    test_space_to_depth(3, "exp|slice|slice|slice|slice|slice|slice|cat,neg",
                        "an order that is neither: stays");
    test_space_to_depth(4, "exp|slice|slice|slice|slice|slice|slice|cat,neg",
                        "concatenated over W: stays");
    test_space_to_depth(5, "sin|exp|slice|slice|slice|slice|slice|slice|slice|cat,neg",
                        "a part from another tensor: stays");
    test_op_before_permute(0, "exp|reshape|rms_norm|mul|permute|neg",
                           "rms_norm and a per-head scale before the head split");
    test_op_before_permute(1, "exp|reshape|layer_norm|mul|permute|neg",
                           "layer_norm before the head split");
    test_op_before_permute(2, "exp|reshape|permute|rms_norm|mul,neg",
                           "a permute that moves the last dim: stays");
    test_op_before_permute(3, "exp|reshape|permute|rms_norm|mul,add,neg",
                           "the head split read twice: stays");
    test_op_before_permute(4, "exp|reshape|rms_norm|mul|permute|neg",
                           "a scale [H, 1, E]: its dims keep their order, both move");
    test_op_before_permute(5, "exp|reshape|rms_norm|permute|mul,neg",
                           "a scale [H, L, E]: the norm moves, the mul stays");
    test_rotary_before_permute(0, "exp|reshape|rotary|permute|neg",
                               "rotary with tables [L, E] before the head split");
    test_rotary_before_permute(1, "exp|reshape|rotary|permute|neg",
                               "a partial rotary with tables [1, 1, L, R]");
    test_rotary_before_permute(2, "exp|reshape|permute|rotary|index_copy|neg",
                               "rotary written into a cache: stays");
    test_rotary_before_permute(3, "exp|reshape|rotary|neg",
                               "L = 1: the permute is a view (rewrite 1), the rotary stays after");
    test_rotary_before_permute(4, "exp|reshape|permute|rotary|neg", "tables as inputs: stay");
    test_rotary_before_permute(5, "exp|reshape|permute|rotary|neg", "tables [H, L, E]: stay");
    test_slices_before_permute(
        0, "exp|reshape|slice|permute|slice|permute|slice|permute|sdpa|permute|reshape|neg",
        "q, k, v slices of a head split");
    test_slices_before_permute(
        1,
        "exp|reshape|slice|rotary|permute|slice|rotary|permute|slice|permute|sdpa|"
        "permute|reshape|neg",
        "q and k through rotaries with constant tables");
    test_slices_before_permute(
        2, "exp|reshape|permute|slice|slice|slice|sdpa|permute|reshape|neg|relu",
        "v read elsewhere too: stays");
    test_slices_before_permute(
        3, "exp|reshape|permute|slice|rotary|slice|rotary|slice|sdpa|permute|reshape|neg",
        "rotary tables as inputs: stays");
    test_slices_before_permute(
        4, "exp|reshape|slice|permute|slice|permute|slice|permute|sdpa|permute|reshape|neg",
        "dynamic batch");
    test_slices_before_permute(
        5, "exp|reshape|permute|slice|rotary|slice|rotary|slice|sdpa|permute|reshape|neg",
        "rotary tables [H, L, E]: stays");
    test_move_gather(0, "exp|reshape|index|reshape|neg",
                     "window tokens to grid tokens: one row gather");
    test_move_gather(1, "exp|reshape|permute|reshape|permute|reshape|permute|sdpa|neg",
                     "read by sdpa: stays");
    test_move_gather(2, "exp|reshape|permute|reshape|permute|neg",
                     "from a channels-first map: stays");
    test_move_gather(3, "exp|reshape|permute|reshape|neg", "permutes within rows: one transpose");
    test_one_transpose(0, "exp|reshape|permute|reshape|neg", "spatial reduction: one transpose");
    test_one_transpose(1, "exp|permute|reshape|permute|reshape|sdpa|neg", "read by sdpa: stays");
    test_one_transpose(2, "exp|permute|reshape|permute|reshape|permute|reshape|neg",
                       "viewed again: not one transpose, stays");
    test_row_gather(0, "exp|reshape|index|reshape|neg",
                    "roll and window partition: one row gather");
    test_row_gather(1, "exp|reshape|index|reshape|neg",
                    "window reverse and roll back: one row gather");
    test_row_gather(2, "exp|reshape|permute|reshape|neg", "window partition alone: stays");
    test_row_gather(3, "exp|index|neg", "one roll alone: stays");
    test_row_gather(4, "exp|reshape|index|reshape|neg", "int64 indices, negative ones wrapped");
    test_identities(0, "exp|neg", "x * 1, 0 + x, x - 0, x / 1 removed");
    test_identities(1, "exp|mul,neg", "ones that widen x: stay");
    test_identities(2, "exp|mul,neg", "x * 2 stays");
    test_identities(3, "exp|sub,neg", "0 - x stays");
    test_identities(4, "exp|mul|neg", "x * 1 that is an output stays");
    test_linear_through(0, "linear,gelu,add", "linear between reshapes");
    test_linear_through(1, "linear,gelu,add", "addmm between reshapes");
    test_linear_through(2, "reshape|linear,gelu,add", "linear after a head merge");
    test_linear_through(3, "linear,gelu,add", "linear between reshapes, dynamic batch");
    test_linear_through(4, "reshape|linear,gelu|reshape|add", "result split another way");
    test_unary_before_reshape(0, "linear,sigmoid|reshape|mul", "sigmoid in front of a reshape");
    test_unary_before_reshape(1, "linear|reshape|sigmoid|mul", "reshape read twice: stays");
    test_expand_into_readers(0, "sum|relu,mul", "expand read by a broadcasting mul: removed");
    test_expand_into_readers(1, "sum|expand|neg|mul", "expand the output needs: stays");
    test_expand_into_readers(2, "sum|expand|relu,mul", "expand that is an output: stays");
    return check_summary();
}
