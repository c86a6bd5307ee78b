// SPDX-License-Identifier: Apache-2.0
// Patchify convolutions (pass_patchify.c): a stride = kernel conv2d becomes gather + linear +
// transpose, a 1x1 conv of a one-pixel image a linear, and each computes what the convolution does
// (CPU backend, random inputs, against the unoptimized engine); convolutions that are not patchify
// stay convolutions.
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
    return check_summary();
}
