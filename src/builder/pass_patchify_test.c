// SPDX-License-Identifier: Apache-2.0
// Patchify convolutions (pass_patchify.c): a stride = kernel conv2d becomes gather + linear +
// transpose, a 1x1 conv of a one-pixel image a linear, and each computes what the convolution does
// (CPU backend, random inputs, against the unoptimized engine); convolutions that are not patchify
// stay convolutions. A pointwise conv read only by an average pool that shrinks the image pools
// first, with the same values; convolutions and pools the rewrite does not hold for keep their
// order.
#include "builder/builder_test_util.h"

static kiln_build_options o0, o1;

// conv2d(x [n, 3, h, w], w [o, 3, k, k]) with the given stride/padding, bias or not, then a ReLU.
static void check(int64_t n_max, int dyn, int64_t h, int64_t w, int64_t o, int64_t k,
                  int64_t stride, int64_t pad, int bias, uint32_t want_conv, const char *what) {
    float *wd = tu_rand(o * 3 * k * k, -0.5f, 0.5f), *bd = tu_rand(o, -0.5f, 0.5f);
    kiln_graph *g;
    kiln_plan p;
    int32_t x, cw, cb = -1, y;
    bt_shape s[1] = {{4, {n_max, 3, h, w}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(dyn ? 1 : n_max, 3, h, w),
                 TU_DIMS(n_max, 3, h, w));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(o, 3, k, k), wd);
    if (bias) cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(o), bd);
    y = bias ? tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw, cb),
                       TU_ATTRS(TU_INTS("stride", stride, stride), TU_INTS("padding", pad, pad)))
             : tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw),
                       TU_ATTRS(TU_INTS("stride", stride, stride), TU_INTS("padding", pad, pad)));
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_CONV2D) == want_conv, "%s: %u conv2d layers, want %u", what,
                  bt_count(&p, KILN_OP_CONV2D), want_conv);
        CHECK_MSG(bt_count(&p, KILN_OP_LINEAR) == 1 - want_conv, "%s: %u linear layers", what,
                  bt_count(&p, KILN_OP_LINEAR));
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, what);
    if (dyn) {
        s[0].dims[0] = 1;
        bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, what);
    }
    kiln_graph_free(g);
    free(wd);
    free(bd);
}

// The first layer index of op in the plan (n_layers when absent).
static uint32_t first_layer(const kiln_plan *p, uint32_t op) {
    for (uint32_t i = 0; i < p->n_layers; i++) {
        if (p->layers[i].op == op) return i;
    }
    return p->n_layers;
}

typedef struct pool_case {
    int64_t c, o, h, groups, ck, cpad; // channels in/out, size, the conv's groups, kernel, padding
    int64_t pk, ps, ppad, ceil, divisor; // the pool
    int bias, extra_reader, dyn;
    int want_first; // 1: the pool runs before the conv
    const char *what;
} pool_case;

// relu(x) -> conv2d -> avg_pool2d (-> + relu(conv) when extra_reader), against the unoptimized
// engine on random inputs.
static void check_pool(const pool_case *t) {
    const int64_t n = 2, cg = t->c / t->groups;
    float *wd = tu_rand(t->o * cg * t->ck * t->ck, -0.5f, 0.5f), *bd = tu_rand(t->o, -0.5f, 0.5f);
    kiln_graph *g;
    kiln_plan p;
    int32_t x, cw, cb = -1, y, z;
    bt_shape s[1] = {{4, {n, t->c, t->h, t->h}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(t->dyn ? 1 : n, t->c, t->h, t->h),
                 TU_DIMS(n, t->c, t->h, t->h));
    x = tu_node(g, KILN_OP_RELU, TU_IDS(x), TU_NO_ATTRS);
    cw = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(t->o, cg, t->ck, t->ck), wd);
    if (t->bias) cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(t->o), bd);
    y = t->bias
            ? tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw, cb),
                      TU_ATTRS(TU_INTS("padding", t->cpad, t->cpad), TU_INTS("groups", t->groups)))
            : tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw),
                      TU_ATTRS(TU_INTS("padding", t->cpad, t->cpad), TU_INTS("groups", t->groups)));
    z = tu_node(g, KILN_OP_AVG_POOL2D, TU_IDS(y),
                TU_ATTRS(TU_INTS("kernel", t->pk, t->pk), TU_INTS("stride", t->ps, t->ps),
                         TU_INTS("padding", t->ppad, t->ppad), TU_INTS("ceil_mode", t->ceil),
                         TU_INTS("divisor_override", t->divisor)));
    tu_output(g, z, "z");
    if (t->extra_reader) tu_output(g, tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS), "r");
    if (bt_plan(g, &o1, &p)) {
        const uint32_t pi = first_layer(&p, KILN_OP_AVG_POOL2D),
                       ci = first_layer(&p, KILN_OP_CONV2D);
        CHECK_MSG(pi < p.n_layers && ci < p.n_layers, "%s: a pool and a conv", t->what);
        CHECK_MSG((pi < ci) == t->want_first, "%s: pool at layer %u, conv at %u", t->what, pi, ci);
        CHECK_MSG(bt_count(&p, KILN_OP_CONV2D) == 1, "%s: %u convs", t->what,
                  bt_count(&p, KILN_OP_CONV2D));
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, t->what);
    if (t->dyn) {
        s[0].dims[0] = 1;
        bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, t->what);
    }
    kiln_graph_free(g);
    free(wd);
    free(bd);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    check(2, 0, 8, 12, 5, 4, 4, 0, 1, 0, "patchify 4x4, bias");
    check(3, 1, 16, 16, 7, 8, 8, 0, 0, 0, "patchify 8x8, no bias, dynamic batch");
    check(1, 0, 14, 14, 6, 7, 7, 0, 1, 0, "patchify 7x7, one patch row per 7 pixels");
    check(2, 0, 9, 9, 4, 3, 3, 1, 1, 1, "padding: stays a convolution");
    check(2, 0, 9, 9, 4, 3, 2, 0, 1, 1, "stride below the kernel: stays a convolution");
    check(2, 0, 10, 10, 4, 4, 4, 0, 1, 1, "size not a multiple of the kernel: stays");
    check(4, 1, 1, 1, 8, 1, 1, 0, 1, 0, "1x1 conv of one pixel (squeeze-excite), dynamic batch");
    check(2, 0, 1, 1, 5, 1, 2, 0, 0, 0, "1x1 conv of one pixel, stride 2, no bias");
    check(2, 0, 6, 6, 4, 1, 1, 0, 1, 1, "1x1 conv of an image: stays a convolution");
    check(2, 0, 3, 3, 4, 3, 1, 1, 1, 1, "3x3 conv of a padded 3x3 image: stays");

    static const pool_case pools[] = {
        // c, o, h, groups, ck, cpad, pk, ps, ppad, ceil, divisor, bias, extra, dyn, first
        {16, 8, 8, 1, 1, 0, 2, 2, 0, 0, 0, 1, 0, 1, 1, "DenseNet transition: 1x1, 2x2/2, bias"},
        {8, 12, 9, 2, 1, 0, 3, 2, 0, 0, 0, 0, 0, 0, 1, "grouped 1x1, overlapping 3x3/2 pool"},
        {6, 4, 7, 1, 1, 0, 2, 2, 0, 0, 0, 1, 0, 0, 1, "odd size: the last row is dropped"},
        {8, 4, 8, 1, 3, 1, 2, 2, 0, 0, 0, 1, 0, 0, 0, "3x3 conv: stays"},
        {8, 4, 8, 1, 1, 1, 2, 2, 0, 0, 0, 1, 0, 0, 0, "padded 1x1 conv: stays"},
        {8, 4, 8, 1, 1, 0, 3, 2, 1, 0, 0, 1, 0, 0, 0, "padded pool: stays (the bias)"},
        {8, 4, 7, 1, 1, 0, 2, 2, 0, 1, 0, 1, 0, 0, 0, "ceil mode: stays"},
        {8, 4, 8, 1, 1, 0, 2, 2, 0, 0, 3, 1, 0, 0, 0, "divisor override: stays"},
        {8, 4, 8, 1, 1, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, "a pool that keeps the size: stays"},
        {8, 4, 8, 1, 1, 0, 2, 2, 0, 0, 0, 1, 1, 0, 0, "the conv read elsewhere too: stays"},
    };
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) check_pool(&pools[i]);
    return check_summary();
}
