// SPDX-License-Identifier: Apache-2.0
// upsample_nearest2d and upsample_bilinear2d on the CPU backend against references written
// from PyTorch's formulas in double: up- and down-sizing, non-integer ratios, given scales,
// align_corners both ways, every float dtype; and hand-computed values for a 2x2 image.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static double src_linear(int64_t dst, int64_t in, int64_t out, double given, int align, int64_t *i0,
                         int64_t *i1) {
    double s, src;
    if (align) {
        s = out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
        src = s * (double)dst;
    } else {
        s = isnan(given) ? (double)in / (double)out : 1.0 / given;
        src = s * ((double)dst + 0.5) - 0.5;
        if (src < 0) src = 0;
    }
    *i0 = (int64_t)src;
    if (*i0 > in - 1) *i0 = in - 1;
    *i1 = *i0 + (*i0 < in - 1);
    return src - (double)*i0;
}

static void check_resize(uint32_t op, uint32_t dt, int64_t h, int64_t w, int64_t oh, int64_t ow,
                         double sh, double sw, int align) {
    kiln_tensor *x = tt_new4(dt, 2, 3, h, w), *y = tt_new4(dt, 2, 3, oh, ow);
    tt_rand(x, -1, 1);
    tattrs a;
    tattrs_init(&a, op);
    tattrs_int2(&a, KILN_A_UPSAMPLE_SIZE, oh, ow);
    a.floats[a.refs[KILN_A_UPSAMPLE_SCALES].begin] = sh;
    a.floats[a.refs[KILN_A_UPSAMPLE_SCALES].begin + 1] = sw;
    if (op == KILN_OP_UPSAMPLE_BILINEAR2D) tattrs_int(&a, KILN_A_UPSAMPLE_ALIGN, align);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(op, &a, ins, 1, y));
    int64_t n = tt_numel(y);
    double *ref = (double *)calloc((size_t)n, sizeof(double));
    for (int64_t p = 0; p < 6; p++)
        for (int64_t r = 0; r < oh; r++)
            for (int64_t q = 0; q < ow; q++) {
                double v;
                if (op == KILN_OP_UPSAMPLE_NEAREST2D) {
                    double fr = isnan(sh) ? (double)h / (double)oh : 1.0 / sh;
                    double fc = isnan(sw) ? (double)w / (double)ow : 1.0 / sw;
                    int64_t sr = (int64_t)floor(r * fr), sc = (int64_t)floor(q * fc);
                    sr = sr < h - 1 ? sr : h - 1;
                    sc = sc < w - 1 ? sc : w - 1;
                    v = tt_get(x, (p * h + sr) * w + sc);
                } else {
                    int64_t r0, r1, c0, c1;
                    double wr = src_linear(r, h, oh, sh, align, &r0, &r1);
                    double wc = src_linear(q, w, ow, sw, align, &c0, &c1);
                    const int64_t b = p * h * w;
                    v = (1 - wr) * ((1 - wc) * tt_get(x, b + r0 * w + c0) +
                                    wc * tt_get(x, b + r0 * w + c1)) +
                        wr * ((1 - wc) * tt_get(x, b + r1 * w + c0) +
                              wc * tt_get(x, b + r1 * w + c1));
                }
                ref[(p * oh + r) * ow + q] = v;
            }
    tt_close(y, ref, 1e-6, tt_rtol(dt) * 2, kiln_op_name(op));
    free(ref);
    tt_free(x), tt_free(y);
}

static void test_resize(void) {
    for (int d = 0; d < 3; d++) {
        uint32_t dt = tt_float_dtype(d);
        for (int op = 0; op < 2; op++) {
            uint32_t o = op ? KILN_OP_UPSAMPLE_BILINEAR2D : KILN_OP_UPSAMPLE_NEAREST2D;
            check_resize(o, dt, 4, 5, 8, 10, NAN, NAN, 0);
            check_resize(o, dt, 4, 5, 7, 3, NAN, NAN, 0);
            check_resize(o, dt, 3, 3, 9, 6, 3.0, 2.0, 0);
            check_resize(o, dt, 5, 7, 5, 7, NAN, NAN, 0);
            check_resize(o, dt, 1, 4, 3, 9, NAN, NAN, 0);
        }
        check_resize(KILN_OP_UPSAMPLE_BILINEAR2D, dt, 4, 5, 9, 11, NAN, NAN, 1);
        check_resize(KILN_OP_UPSAMPLE_BILINEAR2D, dt, 3, 2, 1, 1, NAN, NAN, 1);
    }
    // hand-computed: [[0, 1], [2, 3]] to 4x4, half-pixel centres: first row 0, .25, .75, 1
    kiln_tensor *x = tt_new4(KILN_DTYPE_F32, 1, 1, 2, 2), *y = tt_new4(KILN_DTYPE_F32, 1, 1, 4, 4);
    double xv[4] = {0, 1, 2, 3};
    tt_set_all(x, xv);
    tattrs a;
    tattrs_init(&a, KILN_OP_UPSAMPLE_BILINEAR2D);
    tattrs_int2(&a, KILN_A_UPSAMPLE_SIZE, 4, 4);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_UPSAMPLE_BILINEAR2D, &a, ins, 1, y));
    double ref[16] = {0,   0.25, 0.75, 1,   0.5, 0.75, 1.25, 1.5,
                      1.5, 1.75, 2.25, 2.5, 2,   2.25, 2.75, 3};
    tt_close(y, ref, 1e-6, 0, "bilinear 2x2");
    tt_free(x), tt_free(y);
}

// grid_sample by hand over x = [[1, 2, 3], [4, 5, 6]] (H 2, W 3) at four points (x, y): the
// centre (0, 0), the corner (-1, -1), (0.9, 0.9) near the bottom right, (0.9, 1.5) below it.
static void check_grid(int mode, int border, int align, const double *want, const char *what) {
    kiln_tensor *x = tt_new4(KILN_DTYPE_F32, 1, 1, 2, 3), *g = tt_new4(KILN_DTYPE_F32, 1, 1, 4, 2);
    kiln_tensor *y = tt_new4(KILN_DTYPE_F32, 1, 1, 1, 4);
    double xv[6] = {1, 2, 3, 4, 5, 6}, gv[8] = {0, 0, -1, -1, 0.9, 0.9, 0.9, 1.5};
    tt_set_all(x, xv);
    tt_set_all(g, gv);
    tattrs a;
    tattrs_init(&a, KILN_OP_GRID_SAMPLE);
    tattrs_int(&a, KILN_A_GRID_MODE, mode);
    tattrs_int(&a, KILN_A_GRID_PADDING, border);
    tattrs_int(&a, KILN_A_GRID_ALIGN, align);
    kiln_tensor *ins[2] = {x, g};
    CHECK_OK(trun(KILN_OP_GRID_SAMPLE, &a, ins, 2, y));
    tt_close(y, want, 1e-5, 0, what);
    tt_free(x), tt_free(g), tt_free(y);
}

static void test_grid_sample(void) {
    // sources (ix, iy) = (((g + 1) W - 1) / 2, ((g + 1) H - 1) / 2): (1, 0.5), (-0.5, -0.5),
    // (2.35, 1.4), (2.35, 2). Bilinear: (1, 0.5) is halfway between 2 and 5; the corner keeps a
    // quarter of x[0][0]; (2.35, 1.4) keeps 0.65 * 0.6 of x[1][2]; (2.35, 2) lies on row 2
    const double bz[4] = {3.5, 0.25, 2.34, 0.0}, bb[4] = {3.5, 1.0, 6.0, 6.0};
    check_grid(0, 0, 0, bz, "grid_sample bilinear zeros");
    check_grid(0, 1, 0, bb, "grid_sample bilinear border"); // clamped: (0, 0), (2, 1), (2, 1)
    // nearest: rint (half to even) of (1, 0.5) is (1, 0); of (-0.5, -0.5) (-0, -0): x[0][0];
    // (2, 1); (2, 2) outside, or with border (2, 1)
    const double nz[4] = {2.0, 1.0, 6.0, 0.0}, nb[4] = {2.0, 1.0, 6.0, 6.0};
    check_grid(1, 0, 0, nz, "grid_sample nearest zeros");
    check_grid(1, 1, 0, nb, "grid_sample nearest border");
    // align_corners: ((g + 1) / 2 (W - 1), (g + 1) / 2 (H - 1)) = (1, 0.5), (0, 0), (1.9, 0.95),
    // (1.9, 1.25): 0.1 * 0.05 * 2 + 0.9 * 0.05 * 3 + 0.1 * 0.95 * 5 + 0.9 * 0.95 * 6 = 5.75, and
    // row 1 alone with weight 0.75: 0.75 * (0.1 * 5 + 0.9 * 6) = 4.425
    const double ba[4] = {3.5, 1.0, 5.75, 4.425};
    check_grid(0, 0, 1, ba, "grid_sample bilinear zeros align_corners");
}

int main(void) {
    check_rng_seed();
    test_resize();
    test_grid_sample();
    return check_summary();
}
