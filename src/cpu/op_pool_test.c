// SPDX-License-Identifier: Apache-2.0
// max_pool2d, avg_pool2d and adaptive_avg_pool2d on the CPU backend: hand-computed values, then
// random inputs against loops that enumerate window positions in padded coordinates (a
// formulation different from the kernel's clip-and-divide), with ceil_mode output sizes,
// padding, dilation, count_include_pad, divisor_override, rank 3 and 4, every float dtype.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

typedef struct pl {
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ceil, count_pad, divisor;
} pl;

// PyTorch's pooling_output_shape.
static int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, int64_t ceil) {
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
    int64_t o = num / s + 1; // num >= 0 in every case below
    if (ceil && (o - 1) * s >= in + p) o--;
    return o;
}

static void test_hand(void) {
    kiln_tensor *x = tt_new3(KILN_DTYPE_F32, 1, 3, 3), *y = tt_new3(KILN_DTYPE_F32, 1, 2, 2);
    tt_set_all(x, (const double[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
    tattrs a;
    tattrs_init(&a, KILN_OP_MAX_POOL2D);
    tattrs_int2(&a, KILN_A_MAXPOOL_KERNEL, 2, 2);
    tattrs_int2(&a, KILN_A_MAXPOOL_STRIDE, 1, 1);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_MAX_POOL2D, &a, ins, 1, y));
    tt_close(y, (const double[]){5, 6, 8, 9}, 0, 0, "max_pool2d hand");
    tattrs_init(&a, KILN_OP_AVG_POOL2D);
    tattrs_int2(&a, KILN_A_AVGPOOL_KERNEL, 2, 2);
    tattrs_int2(&a, KILN_A_AVGPOOL_STRIDE, 1, 1);
    CHECK_OK(trun(KILN_OP_AVG_POOL2D, &a, ins, 1, y));
    tt_close(y, (const double[]){3, 4, 6, 7}, 0, 0, "avg_pool2d hand");
    // Padding 1, stride 2, kernel 2 on 3x3: windows {pad, 1}, {2, 3}, ... counting the pad.
    tattrs_int2(&a, KILN_A_AVGPOOL_STRIDE, 2, 2);
    tattrs_int2(&a, KILN_A_AVGPOOL_PADDING, 1, 1);
    CHECK_OK(trun(KILN_OP_AVG_POOL2D, &a, ins, 1, y));
    tt_close(y, (const double[]){0.25, 1.25, 2.75, 7}, 0, 0, "avg_pool2d padded hand");
    tattrs_int(&a, KILN_A_AVGPOOL_COUNT_PAD, 0);
    CHECK_OK(trun(KILN_OP_AVG_POOL2D, &a, ins, 1, y));
    tt_close(y, (const double[]){1, 2.5, 5.5, 7}, 0, 0, "avg_pool2d padded, pad not counted");
    kiln_tensor *g = tt_new3(KILN_DTYPE_F32, 1, 1, 1);
    tattrs_init(&a, KILN_OP_ADAPTIVE_AVG_POOL2D);
    tattrs_int2(&a, KILN_A_ADAPTIVE_OUTPUT, 1, 1);
    CHECK_OK(trun(KILN_OP_ADAPTIVE_AVG_POOL2D, &a, ins, 1, g));
    tt_close(g, (const double[]){5}, 0, 0, "adaptive_avg_pool2d hand");
    tt_free(x), tt_free(y), tt_free(g);
}

static void run_pool(uint32_t op, const pl *p, uint32_t dt, int rank3) {
    int mx = op == KILN_OP_MAX_POOL2D;
    int64_t oh = out_size(p->h, p->kh, p->sh, p->ph, mx ? p->dh : 1, p->ceil);
    int64_t ow = out_size(p->w, p->kw, p->sw, p->pw, mx ? p->dw : 1, p->ceil);
    kiln_tensor *x = tt_new4(dt, p->n, p->c, p->h, p->w), *y = tt_new4(dt, p->n, p->c, oh, ow);
    tt_rand(x, -4, 4);
    if (rank3) {
        x->rank = y->rank = 3;
        x->dims[0] *= x->dims[1], y->dims[0] *= y->dims[1];
        for (int i = 1; i < 3; i++) x->dims[i] = x->dims[i + 1], y->dims[i] = y->dims[i + 1];
    }
    tattrs a;
    tattrs_init(&a, op);
    if (mx) {
        tattrs_int2(&a, KILN_A_MAXPOOL_KERNEL, p->kh, p->kw);
        tattrs_int2(&a, KILN_A_MAXPOOL_STRIDE, p->sh, p->sw);
        tattrs_int2(&a, KILN_A_MAXPOOL_PADDING, p->ph, p->pw);
        tattrs_int2(&a, KILN_A_MAXPOOL_DILATION, p->dh, p->dw);
        tattrs_int(&a, KILN_A_MAXPOOL_CEIL, p->ceil);
    } else {
        tattrs_int2(&a, KILN_A_AVGPOOL_KERNEL, p->kh, p->kw);
        tattrs_int2(&a, KILN_A_AVGPOOL_STRIDE, p->sh, p->sw);
        tattrs_int2(&a, KILN_A_AVGPOOL_PADDING, p->ph, p->pw);
        tattrs_int(&a, KILN_A_AVGPOOL_CEIL, p->ceil);
        tattrs_int(&a, KILN_A_AVGPOOL_COUNT_PAD, p->count_pad);
        tattrs_int(&a, KILN_A_AVGPOOL_DIVISOR, p->divisor);
    }
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(op, &a, ins, 1, y));
    int64_t planes = p->n * p->c;
    double *ref = (double *)calloc((size_t)(planes * oh * ow + 1), sizeof(double));
    for (int64_t pl_i = 0; pl_i < planes; pl_i++) {
        for (int64_t i = 0; i < oh; i++) {
            for (int64_t j = 0; j < ow; j++) {
                double best = -INFINITY, sum = 0;
                int64_t in_padded = 0, in_image = 0;
                for (int64_t ki = 0; ki < p->kh; ki++) {
                    for (int64_t kj = 0; kj < p->kw; kj++) {
                        // position in padded coordinates (0 = first padding row)
                        int64_t ph_ = i * p->sh + ki * (mx ? p->dh : 1);
                        int64_t pw_ = j * p->sw + kj * (mx ? p->dw : 1);
                        if (ph_ < p->h + 2 * p->ph && pw_ < p->w + 2 * p->pw) in_padded++;
                        int64_t ih = ph_ - p->ph, iw = pw_ - p->pw;
                        if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w) continue;
                        double v = tt_get(x, (pl_i * p->h + ih) * p->w + iw);
                        best = v > best ? v : best;
                        sum += v;
                        in_image++;
                    }
                }
                double r;
                if (mx) {
                    r = best;
                } else if (in_image == 0) {
                    r = 0;
                } else {
                    int64_t div = p->divisor ? p->divisor : (p->count_pad ? in_padded : in_image);
                    r = sum / (double)div;
                }
                ref[(pl_i * oh + i) * ow + j] = r;
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%s %lldx%lld k%lldx%lld s%lld p%lld ceil%lld", kiln_op_name(op),
             (long long)p->h, (long long)p->w, (long long)p->kh, (long long)p->kw, (long long)p->sh,
             (long long)p->ph, (long long)p->ceil);
    tt_close(y, ref, 1e-6, tt_rtol(dt) + 1e-6, what);
    free(ref);
    tt_free(x), tt_free(y);
}

static void test_pool_random(void) {
    static const pl cases[] = {
        // n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ceil, count_pad, divisor
        {2, 3, 5, 5, 2, 2, 2, 2, 0, 0, 1, 1, 0, 1, 0},
        {1, 2, 5, 5, 2, 2, 2, 2, 0, 0, 1, 1, 1, 1, 0},
        {2, 3, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0},
        {1, 2, 8, 9, 3, 3, 1, 1, 1, 1, 2, 2, 0, 1, 0},
        {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 0},
        {1, 2, 6, 7, 3, 2, 2, 3, 1, 1, 1, 1, 0, 1, 3},
        {2, 2, 6, 6, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0, 0},
        {1, 3, 6, 6, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 0},
        {1, 3, 6, 6, 3, 3, 3, 3, 1, 1, 1, 1, 1, 0, 0},
        {1, 4, 112, 112, 3, 3, 2, 2, 1, 1, 1, 1, 0, 1, 0}, // ResNet stem max pool
        {1, 2, 4, 5, 3, 1, 1, 2, 1, 0, 3, 1, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int di = 0; di < 3; di++) {
            run_pool(KILN_OP_MAX_POOL2D, &cases[i], tt_float_dtype(di), 0);
            run_pool(KILN_OP_AVG_POOL2D, &cases[i], tt_float_dtype(di), 0);
        }
        run_pool(KILN_OP_MAX_POOL2D, &cases[i], KILN_DTYPE_F32, 1);
        run_pool(KILN_OP_AVG_POOL2D, &cases[i], KILN_DTYPE_F32, 1);
    }
}

static void test_adaptive_random(void) {
    static const int64_t cases[][4] = {{7, 7, 1, 1}, {5, 7, 3, 2},  {4, 4, 4, 4},
                                       {3, 3, 5, 5}, {10, 1, 3, 1}, {1, 9, 1, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t h = cases[i][0], w = cases[i][1], oh = cases[i][2], ow = cases[i][3];
        for (int di = 0; di < 3; di++) {
            uint32_t dt = tt_float_dtype(di);
            kiln_tensor *x = tt_new4(dt, 2, 3, h, w), *y = tt_new4(dt, 2, 3, oh, ow);
            tt_rand(x, -4, 4);
            tattrs a;
            tattrs_init(&a, KILN_OP_ADAPTIVE_AVG_POOL2D);
            tattrs_int2(&a, KILN_A_ADAPTIVE_OUTPUT, oh, ow);
            kiln_tensor *ins[1] = {x};
            CHECK_OK(trun(KILN_OP_ADAPTIVE_AVG_POOL2D, &a, ins, 1, y));
            double *ref = (double *)calloc((size_t)(6 * oh * ow), sizeof(double));
            for (int64_t p = 0; p < 6; p++) {
                for (int64_t r = 0; r < oh; r++) {
                    for (int64_t c = 0; c < ow; c++) {
                        int64_t hs = (int64_t)floor((double)(r * h) / (double)oh);
                        int64_t he = (int64_t)ceil((double)((r + 1) * h) / (double)oh);
                        int64_t ws = (int64_t)floor((double)(c * w) / (double)ow);
                        int64_t we = (int64_t)ceil((double)((c + 1) * w) / (double)ow);
                        double s = 0;
                        for (int64_t u = hs; u < he; u++) {
                            for (int64_t v = ws; v < we; v++) s += tt_get(x, (p * h + u) * w + v);
                        }
                        ref[(p * oh + r) * ow + c] = s / (double)((he - hs) * (we - ws));
                    }
                }
            }
            tt_close(y, ref, 1e-6, tt_rtol(dt) + 1e-6, "adaptive_avg_pool2d");
            free(ref);
            tt_free(x), tt_free(y);
        }
    }
}

int main(void) {
    check_rng_seed();
    test_hand();
    test_pool_random();
    test_adaptive_random();
    return check_summary();
}
