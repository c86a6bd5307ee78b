// SPDX-License-Identifier: Apache-2.0
// conv2d and conv_transpose2d on the CPU backend: a hand-computed case, then random cases
// against naive loops (conv_transpose in gather form, unlike the kernel's scatter) over
// stride, padding, dilation, groups (depthwise, channel multiplier), 1x1, kernels larger than
// the input, block-size boundaries and rank-3 inputs, for every float dtype; plus fused tails.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

typedef struct cv {
    int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, oph, opw;
} cv;

static int64_t x_at(const cv *p, int64_t n, int64_t c, int64_t i, int64_t j) {
    return ((n * p->c + c) * p->h + i) * p->w + j;
}

static double *ref_conv(const kiln_tensor *x, const kiln_tensor *w, const kiln_tensor *b,
                        const cv *p, int64_t oh, int64_t ow) {
    int64_t cg = p->c / p->groups, og = p->o / p->groups;
    double *y = (double *)calloc((size_t)(p->n * p->o * oh * ow + 1), sizeof(double));
    for (int64_t n = 0; n < p->n; n++) {
        for (int64_t o = 0; o < p->o; o++) {
            for (int64_t i = 0; i < oh; i++) {
                for (int64_t j = 0; j < ow; j++) {
                    double acc = b ? tt_get(b, o) : 0;
                    for (int64_t c = 0; c < cg; c++) {
                        for (int64_t ki = 0; ki < p->kh; ki++) {
                            for (int64_t kj = 0; kj < p->kw; kj++) {
                                int64_t ih = i * p->sh - p->ph + ki * p->dh;
                                int64_t iw = j * p->sw - p->pw + kj * p->dw;
                                if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w) continue;
                                acc += tt_get(x, x_at(p, n, (o / og) * cg + c, ih, iw)) *
                                       tt_get(w, ((o * cg + c) * p->kh + ki) * p->kw + kj);
                            }
                        }
                    }
                    y[((n * p->o + o) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    return y;
}

// Gather form: output (oh, ow) receives x[ih][iw] * w[.., ki, kj] where
// oh = ih*sh - ph + ki*dh, i.e. ih = (oh + ph - ki*dh) / sh when that divides exactly.
static double *ref_convt(const kiln_tensor *x, const kiln_tensor *w, const kiln_tensor *b,
                         const cv *p, int64_t oh, int64_t ow) {
    int64_t cg = p->c / p->groups, og = p->o / p->groups;
    double *y = (double *)calloc((size_t)(p->n * p->o * oh * ow + 1), sizeof(double));
    for (int64_t n = 0; n < p->n; n++) {
        for (int64_t o = 0; o < p->o; o++) {
            int64_t g = o / og, ol = o % og;
            for (int64_t i = 0; i < oh; i++) {
                for (int64_t j = 0; j < ow; j++) {
                    double acc = b ? tt_get(b, o) : 0;
                    for (int64_t ki = 0; ki < p->kh; ki++) {
                        int64_t ti = i + p->ph - ki * p->dh;
                        if (ti < 0 || ti % p->sh != 0 || ti / p->sh >= p->h) continue;
                        for (int64_t kj = 0; kj < p->kw; kj++) {
                            int64_t tj = j + p->pw - kj * p->dw;
                            if (tj < 0 || tj % p->sw != 0 || tj / p->sw >= p->w) continue;
                            for (int64_t c = 0; c < cg; c++) {
                                int64_t ci = g * cg + c;
                                acc += tt_get(x, x_at(p, n, ci, ti / p->sh, tj / p->sw)) *
                                       tt_get(w, ((ci * og + ol) * p->kh + ki) * p->kw + kj);
                            }
                        }
                    }
                    y[((n * p->o + o) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    return y;
}

static void set_conv_attrs(tattrs *a, uint32_t op, const cv *p) {
    tattrs_init(a, op);
    int t = op == KILN_OP_CONV_TRANSPOSE2D;
    tattrs_int2(a, t ? KILN_A_CONVT_STRIDE : KILN_A_CONV_STRIDE, p->sh, p->sw);
    tattrs_int2(a, t ? KILN_A_CONVT_PADDING : KILN_A_CONV_PADDING, p->ph, p->pw);
    tattrs_int2(a, t ? KILN_A_CONVT_DILATION : KILN_A_CONV_DILATION, p->dh, p->dw);
    tattrs_int(a, t ? KILN_A_CONVT_GROUPS : KILN_A_CONV_GROUPS, p->groups);
    if (t) tattrs_int2(a, KILN_A_CONVT_OUTPUT_PADDING, p->oph, p->opw);
}

static void test_hand(void) {
    // 1x1x3x3 input, 2x2 kernel of ones, stride 1: sums of 2x2 windows.
    kiln_tensor *x = tt_new4(KILN_DTYPE_F32, 1, 1, 3, 3), *w = tt_new4(KILN_DTYPE_F32, 1, 1, 2, 2);
    kiln_tensor *y = tt_new4(KILN_DTYPE_F32, 1, 1, 2, 2);
    tt_set_all(x, (const double[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
    tt_set_all(w, (const double[]){1, 1, 1, 1});
    kiln_tensor *ins[2] = {x, w};
    tattrs a;
    tattrs_init(&a, KILN_OP_CONV2D);
    CHECK_OK(trun(KILN_OP_CONV2D, &a, ins, 2, y));
    tt_close(y, (const double[]){12, 16, 24, 28}, 0, 0, "conv2d hand");
    // Transposed: a 2x2 input through a 2x2 kernel of ones, stride 2: each value fills a block.
    kiln_tensor *xt = tt_new4(KILN_DTYPE_F32, 1, 1, 2, 2),
                *yt = tt_new4(KILN_DTYPE_F32, 1, 1, 4, 4);
    tt_set_all(xt, (const double[]){1, 2, 3, 4});
    kiln_tensor *tins[2] = {xt, w};
    tattrs_init(&a, KILN_OP_CONV_TRANSPOSE2D);
    tattrs_int2(&a, KILN_A_CONVT_STRIDE, 2, 2);
    CHECK_OK(trun(KILN_OP_CONV_TRANSPOSE2D, &a, tins, 2, yt));
    tt_close(yt, (const double[]){1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, 0, 0,
             "conv_transpose2d hand");
    tt_free(x), tt_free(w), tt_free(y), tt_free(xt), tt_free(yt);
}

static void run_case(uint32_t op, const cv *p, int rank3, uint32_t dt, int with_bias) {
    int t = op == KILN_OP_CONV_TRANSPOSE2D;
    int64_t oh, ow;
    if (t) {
        oh = (p->h - 1) * p->sh - 2 * p->ph + p->dh * (p->kh - 1) + p->oph + 1;
        ow = (p->w - 1) * p->sw - 2 * p->pw + p->dw * (p->kw - 1) + p->opw + 1;
    } else {
        oh = (p->h + 2 * p->ph - p->dh * (p->kh - 1) - 1) / p->sh + 1;
        ow = (p->w + 2 * p->pw - p->dw * (p->kw - 1) - 1) / p->sw + 1;
    }
    kiln_tensor *x = tt_new4(dt, p->n, p->c, p->h, p->w);
    kiln_tensor *w = t ? tt_new4(dt, p->c, p->o / p->groups, p->kh, p->kw)
                       : tt_new4(dt, p->o, p->c / p->groups, p->kh, p->kw);
    kiln_tensor *b = tt_new1(dt, p->o), *y = tt_new4(dt, p->n, p->o, oh, ow);
    tt_rand(x, -1, 1);
    tt_rand(w, -1, 1);
    tt_rand(b, -1, 1);
    if (rank3) { // [C, H, W]: drop the batch dim of x and y
        x->rank = y->rank = 3;
        for (int i = 0; i < 3; i++) {
            x->dims[i] = x->dims[i + 1];
            y->dims[i] = y->dims[i + 1];
        }
    }
    tattrs a;
    set_conv_attrs(&a, op, p);
    kiln_tensor *ins[3] = {x, w, b};
    CHECK_OK(trun(op, &a, ins, with_bias ? 3 : 2, y));
    double *ref = t ? ref_convt(x, w, with_bias ? b : NULL, p, oh, ow)
                    : ref_conv(x, w, with_bias ? b : NULL, p, oh, ow);
    char what[128];
    snprintf(what, sizeof what, "%s c=%lld o=%lld %lldx%lld k=%lldx%lld s=%lld g=%lld bias=%d",
             kiln_op_name(op), (long long)p->c, (long long)p->o, (long long)p->h, (long long)p->w,
             (long long)p->kh, (long long)p->kw, (long long)p->sh, (long long)p->groups, with_bias);
    int64_t k = p->c * p->kh * p->kw;
    tt_close(y, ref, 2e-6 * (double)(k + 1), tt_rtol(dt) + 1e-5, what);
    free(ref);
    tt_free(x), tt_free(w), tt_free(b), tt_free(y);
}

static void test_conv_random(void) {
    static const cv cases[] = {
        // n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups
        {1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0, 0},
        {2, 3, 7, 6, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0, 0},
        {1, 4, 9, 9, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2, 0, 0},
        {2, 6, 8, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6, 0, 0},   // depthwise
        {1, 3, 6, 6, 6, 3, 5, 2, 1, 2, 1, 1, 1, 3, 0, 0},   // depthwise, multiplier 2
        {1, 4, 9, 9, 4, 3, 3, 2, 2, 2, 2, 2, 2, 4, 0, 0},   // depthwise, stride + dilation
        {1, 5, 1, 1, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 0, 0},   // depthwise, 1x1 image
        {1, 16, 5, 5, 9, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0},  // pointwise
        {1, 8, 6, 6, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1, 0, 0},   // 1x1 stride 2
        {1, 3, 4, 10, 5, 1, 7, 1, 1, 0, 3, 1, 1, 1, 0, 0},  // 1x7
        {1, 40, 6, 6, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}, // K = 360 > KC
        {1, 2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0},   // kernel as large as padded input
        {1, 3, 5, 5, 100, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}, // O > MC
        {1, 2, 24, 24, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}, // OH*OW > NC
        {1, 4, 7, 7, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0, 0},   // a ResNet stem in miniature
        {2, 6, 5, 4, 4, 2, 3, 1, 2, 0, 1, 1, 2, 2, 0, 0},   // mixed everything
        {1, 3, 9, 40, 4, 3, 3, 2, 2, 1, 1, 2, 2, 1, 0, 0},  // wide rows: stride 2, dilation 2
        {1, 2, 5, 37, 3, 3, 5, 1, 1, 2, 3, 1, 2, 1, 0, 0},  // wide rows: stride 1, dilated kw
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int di = 0; di < 3; di++) {
            run_case(KILN_OP_CONV2D, &cases[i], 0, tt_float_dtype(di), 1);
        }
        run_case(KILN_OP_CONV2D, &cases[i], 0, KILN_DTYPE_F32, 0);
        if (cases[i].n == 1) run_case(KILN_OP_CONV2D, &cases[i], 1, KILN_DTYPE_F32, 1);
    }
}

static void test_convt_random(void) {
    static const cv cases[] = {
        // n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, oph, opw
        {1, 2, 3, 3, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0, 0},
        {2, 4, 4, 5, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2, 1, 1},
        {1, 3, 5, 4, 2, 2, 2, 2, 2, 0, 0, 1, 1, 1, 0, 0},
        {1, 2, 3, 3, 2, 3, 3, 2, 2, 1, 1, 2, 2, 1, 1, 0},
        {1, 6, 4, 4, 6, 4, 4, 2, 2, 1, 1, 1, 1, 6, 0, 0},
        {1, 1, 1, 1, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0},
        {1, 300, 2, 3, 4, 3, 2, 3, 1, 1, 0, 1, 1, 1, 2, 0}, // K = 300 > KC
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int di = 0; di < 3; di++) {
            run_case(KILN_OP_CONV_TRANSPOSE2D, &cases[i], 0, tt_float_dtype(di), 1);
        }
        run_case(KILN_OP_CONV_TRANSPOSE2D, &cases[i], 0, KILN_DTYPE_F32, 0);
        if (cases[i].n == 1) run_case(KILN_OP_CONV_TRANSPOSE2D, &cases[i], 1, KILN_DTYPE_F32, 1);
    }
}

// ResNet-style: y = relu(conv(x) + residual).
static void test_tail(void) {
    cv p = {2, 3, 6, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    for (int di = 0; di < 3; di++) {
        uint32_t dt = tt_float_dtype(di);
        kiln_tensor *x = tt_new4(dt, 2, 3, 6, 5), *w = tt_new4(dt, 4, 3, 3, 3);
        kiln_tensor *r = tt_new4(dt, 2, 4, 6, 5), *y = tt_new4(dt, 2, 4, 6, 5);
        tt_rand(x, -1, 1);
        tt_rand(w, -1, 1);
        tt_rand(r, -1, 1);
        tattrs a, none;
        set_conv_attrs(&a, KILN_OP_CONV2D, &p);
        tattrs_init(&none, KILN_OP_RELU);
        kiln_tail_op tail[2] = {{KILN_OP_ADD, none.view, r, 0}, {KILN_OP_RELU, none.view, NULL, 1}};
        kiln_tensor *ins[2] = {x, w};
        kiln_kernel_args args = targs(KILN_OP_CONV2D, &a, ins, 2, y);
        args.tail = tail;
        args.n_tail = 2;
        CHECK_OK(trun_args(&args));
        double *ref = ref_conv(x, w, NULL, &p, 6, 5);
        for (int64_t i = 0; i < tt_numel(y); i++) {
            double v = ref[i] + tt_get(r, i);
            ref[i] = v > 0 ? v : 0;
        }
        tt_close(y, ref, 1e-4 + 2 * tt_rtol(dt), 2 * tt_rtol(dt), "conv2d + add + relu");
        free(ref);
        tt_free(x), tt_free(w), tt_free(r), tt_free(y);
    }
}

static void test_errors(void) {
    // Channels that do not divide by groups are refused with a message, not run.
    kiln_tensor *x = tt_new4(KILN_DTYPE_F32, 1, 3, 4, 4), *w = tt_new4(KILN_DTYPE_F32, 2, 1, 3, 3);
    kiln_tensor *y = tt_new4(KILN_DTYPE_F32, 1, 2, 2, 2);
    tt_rand(x, -1, 1);
    tt_rand(w, -1, 1);
    tattrs a;
    tattrs_init(&a, KILN_OP_CONV2D);
    tattrs_int(&a, KILN_A_CONV_GROUPS, 2);
    kiln_tensor *ins[2] = {x, w};
    CHECK_STATUS(trun(KILN_OP_CONV2D, &a, ins, 2, y), KILN_ERR_INVALID_ARG);
    // An integer input is not supported.
    kiln_tensor *xi = tt_new4(KILN_DTYPE_I32, 1, 1, 4, 4);
    tt_rand(xi, -3, 3);
    kiln_tensor *iins[2] = {xi, w};
    tattrs_init(&a, KILN_OP_CONV2D);
    CHECK_STATUS(trun(KILN_OP_CONV2D, &a, iins, 2, y), KILN_ERR_UNSUPPORTED);
    tt_free(x), tt_free(w), tt_free(y), tt_free(xi);
}

int main(void) {
    check_rng_seed();
    test_hand();
    test_conv_random();
    test_convt_random();
    test_tail();
    test_errors();
    return check_summary();
}
