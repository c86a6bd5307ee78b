// SPDX-License-Identifier: Apache-2.0
// Fusion of biases and elementwise tails into linear/matmul/conv heads: which ops fuse (and
// which must not), the layer structure the loader accepts, and that fused engines compute what
// the unfused ones do.
#include "builder/builder_test_util.h"

#define B_MAX 4
#define K 12
#define N 6

static kiln_build_options o0, o1;

static float *rnd(int64_t n) { return tu_rand(n, -1, 1); }

static void expect(kiln_graph *g, const char *layers, uint32_t n_in, const bt_shape *shapes,
                   const char *what) {
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, layers);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, n_in, shapes, 0, 1e-5, 1e-5, what);
}

static void test_linear_chain(void) {
    float *w = rnd(N * K), *b = rnd(N), *s = rnd(N), half = 0.5f;
    kiln_graph *g;
    kiln_plan p;
    int32_t x, r, cw, cb, cs, ch, y;
    bt_shape shapes[2] = {{2, {3, K}}, {2, {3, N}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    r = tu_input(g, "residual", KILN_DTYPE_F32, 2, TU_DIMS(1, N), TU_DIMS(B_MAX, N));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    cb = tu_const(g, "b", KILN_DTYPE_F32, 2, TU_DIMS(1, N), b); // [1, N]: still a bias
    cs = tu_const(g, "scale", KILN_DTYPE_F32, 1, TU_DIMS(N), s);
    ch = tu_const(g, "half", KILN_DTYPE_F32, 0, TU_DIMS(0), &half);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, cb), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(r, y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_GELU, TU_IDS(y), TU_ATTRS(TU_INTS("approximate", 1)));
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, ch), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_DIV, TU_IDS(y, cs), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_CLAMP, TU_IDS(y),
                TU_ATTRS(TU_FLOATS("min", -0.25), TU_FLOATS("max", 0.25)));
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "linear,add,gelu,mul,div,clamp");
        CHECK(p.layers[0].n_inputs == 3 && p.layers[0].n_tail == 5);
        // the whole group writes the output binding in place
        for (uint32_t i = 0; i < p.n_layers; i++) {
            CHECK(p.ids[p.layers[i].output_begin] == (int32_t)p.outputs[0]);
        }
        // the residual add reads the running value on the right
        CHECK(p.ids[p.layers[1].input_begin + 1] == (int32_t)p.outputs[0]);
        CHECK(p.arena_nbytes == 0);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 2, shapes, 0, 1e-5, 1e-5, "linear chain");
    shapes[0].dims[0] = shapes[1].dims[0] = 1;
    bt_compare(g, &o0, &o1, 2, shapes, 0, 1e-5, 1e-5, "linear chain, batch 1");
    kiln_graph_free(g);
    free(w);
    free(b);
    free(s);
}

static void test_conv(void) {
    float *w = rnd(8 * 3 * 9), *b = rnd(8), *c2 = rnd(8), *wt = rnd(8 * 4 * 9), *bt = rnd(4);
    kiln_graph *g;
    int32_t x, cw, cb, cc, ct, ctb, y;
    bt_shape shapes[1] = {{4, {2, 3, 9, 7}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 3, 5, 5), TU_DIMS(2, 3, 12, 12));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(8, 3, 3, 3), w);
    cb = tu_const(g, "b", KILN_DTYPE_F32, 4, TU_DIMS(1, 8, 1, 1), b);
    cc = tu_const(g, "c", KILN_DTYPE_F32, 3, TU_DIMS(8, 1, 1), c2);
    ct = tu_const(g, "wt", KILN_DTYPE_F32, 4, TU_DIMS(8, 4, 3, 3), wt);
    ctb = tu_const(g, "bt", KILN_DTYPE_F32, 3, TU_DIMS(4, 1, 1), bt);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw), TU_ATTRS(TU_INTS("padding", 1, 1)));
    y = tu_node(g, KILN_OP_ADD, TU_IDS(cb, y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SUB, TU_IDS(cc, y), TU_NO_ATTRS); // running value on the right
    y = tu_node(g, KILN_OP_CONV_TRANSPOSE2D, TU_IDS(y, ct),
                TU_ATTRS(TU_INTS("stride", 2, 2), TU_INTS("padding", 1, 1)));
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, ctb), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_HARDSWISH, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "conv2d,relu,sub|conv_transpose2d,hardswish", 1, shapes, "conv chain");
    shapes[0] = (bt_shape){4, {1, 3, 5, 12}};
    bt_compare(g, &o0, &o1, 1, shapes, 0, 1e-5, 1e-5, "conv chain, other size");
    kiln_graph_free(g);
    free(w);
    free(b);
    free(c2);
    free(wt);
    free(bt);
}

// Cases that must not fuse, or fuse only partly.
static void test_rules(void) {
    float *w = rnd(N * K), *w1 = rnd(K);
    kiln_graph *g;
    int32_t x, x2, cw, cw1, y, a, b, z;
    bt_shape s1[1] = {{2, {3, K}}};
    bt_shape s2[2] = {{2, {3, K}}, {2, {3, N}}};

    // an intermediate with two readers
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    b = tu_node(g, KILN_OP_SIGMOID, TU_IDS(y), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_ADD, TU_IDS(a, b), TU_NO_ATTRS);
    tu_output(g, z, "z");
    expect(g, "linear|sigmoid|relu,add", 1, s1, "two readers"); // relu heads the add
    kiln_graph_free(g);

    // an intermediate that is a graph output ends the group (the last value may be one)
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    b = tu_node(g, KILN_OP_TANH, TU_IDS(a), TU_NO_ATTRS);
    tu_output(g, a, "r");
    tu_output(g, b, "t");
    expect(g, "linear,relu|tanh", 1, s1, "output intermediate");
    kiln_graph_free(g);

    // at most KILN_MAX_TAIL tails
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    for (int i = 0; i < KILN_MAX_TAIL + 2; i++) y = tu_node(g, KILN_OP_NEG, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "linear,neg,neg,neg,neg,neg,neg,neg,neg|neg,neg", 1, s1, "tail cap");
    kiln_graph_free(g);

    // a binary op that broadcasts the running value to a larger shape; x + x of the head
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    x2 = tu_input(g, "x2", KILN_DTYPE_F32, 2, TU_DIMS(1, N), TU_DIMS(B_MAX, N));
    cw1 = tu_const(g, "w1", KILN_DTYPE_F32, 2, TU_DIMS(1, K), w1);
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw1), TU_NO_ATTRS); // [B, 1]
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, x2), TU_NO_ATTRS);     // [B, N]: larger
    a = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_ADD, TU_IDS(a, a), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_SUB, TU_IDS(y, a), TU_NO_ATTRS);
    tu_output(g, z, "z");
    expect(g, "linear|linear|add|mul,sub", 2, s2, "broadcast and self");
    kiln_graph_free(g);

    // dynamic ranges: an operand whose static dimension would narrow the range does not fuse
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    x2 = tu_input(g, "x2", KILN_DTYPE_F32, 2, TU_DIMS(B_MAX, N), TU_DIMS(B_MAX, N));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, x2), TU_NO_ATTRS);
    tu_output(g, y, "y");
    {
        kiln_plan p;
        if (bt_plan(g, &o1, &p)) {
            BT_EXPECT_LAYERS(&p, "linear|add");
            kiln_plan_release(&p);
        }
        bt_shape s[2] = {{2, {B_MAX, K}}, {2, {B_MAX, N}}};
        bt_compare(g, &o0, &o1, 2, s, 0, 1e-5, 1e-5, "narrowing operand");
    }
    kiln_graph_free(g);
    free(w);
    free(w1);
}

// A tail operand computed after the head: the group moves to its last tail.
static void test_order(void) {
    float *w = rnd(N * K), *wb = rnd(K * N);
    kiln_graph *g;
    int32_t x, x2, a, bm, cw, y, r;
    bt_shape s[3] = {{2, {3, K}}, {2, {3, N}}, {3, {2, 3, K}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    x2 = tu_input(g, "x2", KILN_DTYPE_F32, 2, TU_DIMS(1, N), TU_DIMS(B_MAX, N));
    a = tu_input(g, "a", KILN_DTYPE_F32, 3, TU_DIMS(2, 1, K), TU_DIMS(2, B_MAX, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    r = tu_node(g, KILN_OP_SIGMOID, TU_IDS(x2), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, r), TU_NO_ATTRS);
    tu_output(g, y, "y");
    // matmul of two activations: no bias slot, a constant add stays a tail
    bm = tu_node(g, KILN_OP_PERMUTE, TU_IDS(a), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    bm = tu_node(g, KILN_OP_MATMUL, TU_IDS(a, bm), TU_NO_ATTRS);
    {
        float one = 1.0f;
        int32_t c1 = tu_const(g, "one", KILN_DTYPE_F32, 0, TU_DIMS(0), &one);
        bm = tu_node(g, KILN_OP_ADD, TU_IDS(bm, c1), TU_NO_ATTRS);
    }
    tu_output(g, bm, "m");
    (void)wb;
    expect(g, "sigmoid|linear,mul|permute|matmul,add", 3, s, "order");
    kiln_graph_free(g);
    free(w);
    free(wb);
}

// Elementwise ops and concatenations that no GEMM/conv head takes carry the tail themselves
// (fusion after precision): a chain from an input, a concatenation with a per-channel scale and
// a ReLU; integer ops and a value read twice do not.
static void test_ew_heads(void) {
    float c[K], sc[8];
    kiln_graph *g;
    int32_t x, x2, cc, y, a, b;
    bt_shape s2[2] = {{2, {3, K}}, {2, {3, K}}};
    bt_shape s4[2] = {{4, {2, 3, 4, 5}}, {4, {2, 5, 4, 5}}};
    tu_fill(c, K, -1, 1);
    tu_fill(sc, 8, -2, 2);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    x2 = tu_input(g, "x2", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    cc = tu_const(g, "c", KILN_DTYPE_F32, 1, TU_DIMS(K), c);
    y = tu_node(g, KILN_OP_SIGMOID, TU_IDS(x), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_MUL, TU_IDS(cc, y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, x2), TU_NO_ATTRS);
    a = tu_node(g, KILN_OP_TANH, TU_IDS(y), TU_NO_ATTRS);
    b = tu_node(g, KILN_OP_RELU, TU_IDS(x2), TU_NO_ATTRS); // read twice: heads nothing
    b = tu_node(g, KILN_OP_SUB, TU_IDS(b, b), TU_NO_ATTRS);
    tu_output(g, a, "a");
    tu_output(g, b, "b");
    expect(g, "sigmoid,mul,add,tanh|relu|sub", 2, s2, "elementwise chain");
    kiln_graph_free(g);

    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 3, 4, 5), TU_DIMS(2, 3, 4, 5));
    x2 = tu_input(g, "x2", KILN_DTYPE_F32, 4, TU_DIMS(1, 5, 4, 5), TU_DIMS(2, 5, 4, 5));
    cc = tu_const(g, "scale", KILN_DTYPE_F32, 4, TU_DIMS(1, 8, 1, 1), sc);
    y = tu_node(g, KILN_OP_CAT, TU_IDS(x, x2), TU_ATTRS(TU_INTS("dim", 1)));
    y = tu_node(g, KILN_OP_MUL, TU_IDS(y, cc), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "cat,mul,relu", 2, s4, "concatenation head");
    kiln_graph_free(g);

    // a concatenation of one tensor is that tensor
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 3, 4, 5), TU_DIMS(2, 3, 4, 5));
    y = tu_node(g, KILN_OP_CAT, TU_IDS(x), TU_ATTRS(TU_INTS("dim", 1)));
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_NEG, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "relu,neg", 1, s4, "concatenation of one");
    kiln_graph_free(g);

    // integer values carry no tail
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "i", KILN_DTYPE_I64, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    y = tu_node(g, KILN_OP_NEG, TU_IDS(x), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, x), TU_NO_ATTRS);
    tu_output(g, y, "y");
    {
        kiln_plan p;
        if (bt_plan(g, &o1, &p)) {
            BT_EXPECT_LAYERS(&p, "neg|add");
            kiln_plan_release(&p);
        }
    }
    kiln_graph_free(g);
}

// An activation behind reshapes and permutes of a head's output moves onto the head as a tail
// (pass_views.c rewrite 5; SegFormer's depthwise conv -> flatten -> transpose -> GELU); not past
// a view that has another reader.
static void test_act_through_views(void) {
    float *w = rnd(8 * 9), *b = rnd(8), *wl = rnd(N * K);
    kiln_graph *g;
    int32_t x, cw, cb, y, v, z;
    bt_shape shapes[1] = {{4, {2, 8, 5, 6}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 8, 5, 6), TU_DIMS(2, 8, 5, 6));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(8, 1, 3, 3), w);
    cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(8), b);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw, cb),
                TU_ATTRS(TU_INTS("padding", 1, 1), TU_INTS("groups", 8)));
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -1, 8, 30)));
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    y = tu_node(g, KILN_OP_GELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "conv2d,gelu|reshape|permute", 1, shapes, "conv, views, gelu");
    kiln_graph_free(g);

    // no head at the chain's start: the activation moves, nothing to fuse into
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 8, 5, 6), TU_DIMS(2, 8, 5, 6));
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(x), TU_ATTRS(TU_INTS("dims", 0, 2, 3, 1)));
    y = tu_node(g, KILN_OP_SILU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "silu|permute", 1, shapes, "input, view, silu");
    kiln_graph_free(g);

    // the view read twice: both readers see the head's own output
    shapes[0] = (bt_shape){2, {3, K}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), wl);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -1, 2, 3)));
    z = tu_node(g, KILN_OP_RELU, TU_IDS(v), TU_NO_ATTRS);
    tu_output(g, z, "z");
    tu_output(g, v, "v");
    expect(g, "linear|reshape|relu", 1, shapes, "linear, view read twice");
    kiln_graph_free(g);

    // a linear, a reshape, then silu: the silu becomes the linear's tail
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), wl);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -1, 2, 3)));
    y = tu_node(g, KILN_OP_SILU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    expect(g, "linear,silu|reshape", 1, shapes, "linear, view, silu");
    kiln_graph_free(g);
    free(w);
    free(b);
    free(wl);
}

// A channels-last block's layer scale and residual add after its permute back (ConvNeXt:
// permute -> linear -> permute(0, 3, 1, 2) -> * gamma -> + x) move before the permute: the
// scale folds into the linear's weight (bn_fold's second run) and the add becomes its tail,
// over the inverse permute of x (which common-subexpression elimination merges with the
// block's own permute of x); without a head before the permute nothing moves.
static void test_residual_through_permute(void) {
    float *w = rnd(8 * 8), *g = rnd(8);
    kiln_graph *gr;
    int32_t x, cw, cg, t, y;
    bt_shape shapes[1] = {{4, {2, 8, 5, 6}}};
    for (int scale = 0; scale < 2; scale++) {
        CHECK_OK(kiln_graph_new(&gr));
        x = tu_input(gr, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 8, 5, 6), TU_DIMS(2, 8, 5, 6));
        cw = tu_const(gr, "w", KILN_DTYPE_F32, 2, TU_DIMS(8, 8), w);
        cg = tu_const(gr, "gamma", KILN_DTYPE_F32, 3, TU_DIMS(8, 1, 1), g);
        t = tu_node(gr, KILN_OP_PERMUTE, TU_IDS(x), TU_ATTRS(TU_INTS("dims", 0, 2, 3, 1)));
        y = tu_node(gr, KILN_OP_LINEAR, TU_IDS(t, cw), TU_NO_ATTRS);
        y = tu_node(gr, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 3, 1, 2)));
        if (scale) y = tu_node(gr, KILN_OP_MUL, TU_IDS(cg, y), TU_NO_ATTRS);
        y = tu_node(gr, KILN_OP_ADD, TU_IDS(y, x), TU_NO_ATTRS);
        tu_output(gr, y, "y");
        expect(gr, "permute|linear,add|permute", 1, shapes,
               scale ? "layer scale and residual through a permute" : "residual through a permute");
        kiln_graph_free(gr);
    }
    // the permute reads an input, not a head's output: the add stays after it
    CHECK_OK(kiln_graph_new(&gr));
    x = tu_input(gr, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 8, 5, 6), TU_DIMS(2, 8, 5, 6));
    t = tu_input(gr, "t", KILN_DTYPE_F32, 4, TU_DIMS(1, 5, 6, 8), TU_DIMS(2, 5, 6, 8));
    y = tu_node(gr, KILN_OP_PERMUTE, TU_IDS(t), TU_ATTRS(TU_INTS("dims", 0, 3, 1, 2)));
    y = tu_node(gr, KILN_OP_ADD, TU_IDS(y, x), TU_NO_ATTRS);
    tu_output(gr, y, "y");
    bt_shape two[2] = {{4, {2, 8, 5, 6}}, {4, {2, 5, 6, 8}}};
    expect(gr, "permute|add", 2, two, "add after an input's permute");
    kiln_graph_free(gr);
    free(w);
    free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    test_linear_chain();
    test_conv();
    test_rules();
    test_order();
    test_ew_heads();
    test_act_through_views();
    test_residual_through_permute();
    return check_summary();
}
