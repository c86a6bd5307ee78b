// SPDX-License-Identifier: Apache-2.0
// batch_norm, layer_norm, rms_norm, softmax and log_softmax on the CPU backend: hand-computed
// values, then random inputs against double-precision loops (optional affine parameters absent or
// present, every normalized_ndim, positive and negative softmax dims, inner strides > 1, size-1 and
// size-0 dims) for every float dtype.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static void test_hand(void) {
    // softmax([0, ln 3]) = [1/4, 3/4]; log_softmax = log of that.
    kiln_tensor *x = tt_new1(KILN_DTYPE_F32, 2), *y = tt_new1(KILN_DTYPE_F32, 2);
    tt_set_all(x, (const double[]){0, log(3.0)});
    tattrs a;
    tattrs_init(&a, KILN_OP_SOFTMAX);
    tattrs_int(&a, KILN_A_SOFTMAX_DIM, -1);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_SOFTMAX, &a, ins, 1, y));
    tt_close(y, (const double[]){0.25, 0.75}, 1e-7, 1e-6, "softmax hand");
    CHECK_OK(trun(KILN_OP_LOG_SOFTMAX, &a, ins, 1, y));
    tt_close(y, (const double[]){log(0.25), log(0.75)}, 1e-7, 1e-6, "log_softmax hand");
    // layer_norm of [1, 2, 3, 4]: mean 2.5, var 1.25.
    kiln_tensor *l = tt_new1(KILN_DTYPE_F32, 4), *ly = tt_new1(KILN_DTYPE_F32, 4);
    tt_set_all(l, (const double[]){1, 2, 3, 4});
    tattrs_init(&a, KILN_OP_LAYER_NORM);
    tattrs_int(&a, KILN_A_LN_NDIM, 1);
    tattrs_float(&a, KILN_A_LN_EPS, 0.0);
    kiln_tensor *lins[1] = {l};
    CHECK_OK(trun(KILN_OP_LAYER_NORM, &a, lins, 1, ly));
    double s = 1 / sqrt(1.25);
    tt_close(ly, (const double[]){-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s}, 1e-6, 1e-6,
             "layer_norm hand");
    // batch_norm: x [1, 2, 1, 1], mean [1, 2], var [4, 0], eps 0 for channel 0.
    kiln_tensor *bx = tt_new4(KILN_DTYPE_F32, 1, 2, 1, 2),
                *by = tt_new4(KILN_DTYPE_F32, 1, 2, 1, 2);
    kiln_tensor *m = tt_new1(KILN_DTYPE_F32, 2), *v = tt_new1(KILN_DTYPE_F32, 2);
    kiln_tensor *w = tt_new1(KILN_DTYPE_F32, 2), *b = tt_new1(KILN_DTYPE_F32, 2);
    tt_set_all(bx, (const double[]){3, 5, 2, 4});
    tt_set_all(m, (const double[]){1, 2});
    tt_set_all(v, (const double[]){4, 0.25});
    tt_set_all(w, (const double[]){2, 1});
    tt_set_all(b, (const double[]){0.5, -1});
    tattrs_init(&a, KILN_OP_BATCH_NORM);
    tattrs_float(&a, KILN_A_BN_EPS, 0.0);
    kiln_tensor *bins[5] = {bx, w, b, m, v};
    CHECK_OK(trun(KILN_OP_BATCH_NORM, &a, bins, 5, by));
    tt_close(by, (const double[]){2.5, 4.5, -1, 3}, 1e-6, 1e-6, "batch_norm hand");
    tt_free(x), tt_free(y), tt_free(l), tt_free(ly), tt_free(bx), tt_free(by), tt_free(m);
    tt_free(v), tt_free(w), tt_free(b);
}

typedef struct shape {
    uint32_t rank;
    int64_t d[4];
} shape;

static void test_batch_norm_random(void) {
    static const shape shapes[] = {
        {4, {2, 3, 4, 5}}, {2, {7, 5}}, {3, {1, 1, 300}}, {4, {0, 3, 2, 2}}, {4, {2, 16, 1, 1}}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int di = 0; di < 3; di++) {
            for (int affine = 0; affine < 4; affine++) { // bit 0 weight, bit 1 bias
                uint32_t dt = tt_float_dtype(di);
                const shape *sh = &shapes[s];
                int64_t c = sh->d[1], inner = 1;
                for (uint32_t d = 2; d < sh->rank; d++) inner *= sh->d[d];
                kiln_tensor *x = tt_new(dt, sh->rank, sh->d), *y = tt_new(dt, sh->rank, sh->d);
                kiln_tensor *w = tt_new1(dt, c), *b = tt_new1(dt, c), *m = tt_new1(dt, c);
                kiln_tensor *v = tt_new1(dt, c);
                tt_rand(x, -3, 3);
                tt_rand(w, -2, 2);
                tt_rand(b, -1, 1);
                tt_rand(m, -1, 1);
                tt_rand(v, 0.1, 3);
                tattrs a;
                tattrs_init(&a, KILN_OP_BATCH_NORM); // eps default 1e-5
                kiln_tensor *ins[5] = {x, (affine & 1) ? w : NULL, (affine & 2) ? b : NULL, m, v};
                CHECK_OK(trun(KILN_OP_BATCH_NORM, &a, ins, 5, y));
                int64_t n = tt_numel(x);
                double *ref = (double *)calloc((size_t)n + 1, sizeof(double));
                for (int64_t i = 0; i < n; i++) {
                    int64_t ch = (i / inner) % c;
                    double r = (tt_get(x, i) - tt_get(m, ch)) / sqrt(tt_get(v, ch) + 1e-5);
                    if (affine & 1) r *= tt_get(w, ch);
                    if (affine & 2) r += tt_get(b, ch);
                    ref[i] = r;
                }
                tt_close(y, ref, 1e-5, tt_rtol(dt) + 1e-5, "batch_norm");
                free(ref);
                tt_free(x), tt_free(y), tt_free(w), tt_free(b), tt_free(m), tt_free(v);
            }
        }
    }
}

static void test_layer_norm_random(void) {
    static const shape shapes[] = {
        {3, {2, 3, 8}}, {2, {5, 1}}, {3, {4, 3, 300}}, {2, {0, 6}}, {4, {2, 2, 3, 5}}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        for (uint32_t nd = 1; nd <= sh->rank; nd++) {
            for (int di = 0; di < 3; di++) {
                for (int affine = 0; affine < 4; affine += 3) {
                    uint32_t dt = tt_float_dtype(di);
                    int64_t d = 1;
                    for (uint32_t i = sh->rank - nd; i < sh->rank; i++) d *= sh->d[i];
                    kiln_tensor *x = tt_new(dt, sh->rank, sh->d), *y = tt_new(dt, sh->rank, sh->d);
                    kiln_tensor *w = tt_new(dt, nd, sh->d + sh->rank - nd);
                    kiln_tensor *b = tt_new(dt, nd, sh->d + sh->rank - nd);
                    tt_rand(x, -3, 5);
                    tt_rand(w, -2, 2);
                    tt_rand(b, -1, 1);
                    tattrs a;
                    tattrs_init(&a, KILN_OP_LAYER_NORM);
                    tattrs_int(&a, KILN_A_LN_NDIM, nd);
                    tattrs_float(&a, KILN_A_LN_EPS, 1e-3);
                    kiln_tensor *ins[3] = {x, w, b};
                    CHECK_OK(trun(KILN_OP_LAYER_NORM, &a, ins, affine ? 3 : 1, y));
                    int64_t n = tt_numel(x);
                    double *ref = (double *)calloc((size_t)n + 1, sizeof(double));
                    for (int64_t r0 = 0; d > 0 && r0 < n; r0 += d) {
                        double mean = 0, var = 0;
                        for (int64_t i = 0; i < d; i++) mean += tt_get(x, r0 + i) / (double)d;
                        for (int64_t i = 0; i < d; i++) {
                            double t = tt_get(x, r0 + i) - mean;
                            var += t * t / (double)d;
                        }
                        for (int64_t i = 0; i < d; i++) {
                            double v = (tt_get(x, r0 + i) - mean) / sqrt(var + 1e-3);
                            if (affine) v = v * tt_get(w, i) + tt_get(b, i);
                            ref[r0 + i] = v;
                        }
                    }
                    char what[64];
                    snprintf(what, sizeof what, "layer_norm shape %zu ndim %u affine %d", s, nd,
                             affine);
                    tt_close(y, ref, 1e-5, tt_rtol(dt) + 1e-5, what);
                    free(ref);
                    tt_free(x), tt_free(y), tt_free(w), tt_free(b);
                }
            }
        }
    }
}

static void test_softmax_random(void) {
    static const shape shapes[] = {
        {3, {2, 3, 7}}, {1, {1}}, {2, {4, 300}}, {4, {2, 3, 1, 5}}, {2, {0, 4}}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        for (int64_t dim = -(int64_t)sh->rank; dim < (int64_t)sh->rank; dim++) {
            for (int lg = 0; lg < 2; lg++) {
                for (int di = 0; di < 3; di++) {
                    uint32_t dt = tt_float_dtype(di),
                             op = lg ? KILN_OP_LOG_SOFTMAX : KILN_OP_SOFTMAX;
                    kiln_tensor *x = tt_new(dt, sh->rank, sh->d), *y = tt_new(dt, sh->rank, sh->d);
                    tt_rand(x, -8, 8);
                    tattrs a;
                    tattrs_init(&a, op);
                    tattrs_int(&a, KILN_A_SOFTMAX_DIM, dim);
                    kiln_tensor *ins[1] = {x};
                    CHECK_OK(trun(op, &a, ins, 1, y));
                    int dd = (int)(dim < 0 ? dim + sh->rank : dim);
                    int64_t len = sh->d[dd], inner = 1, n = tt_numel(x);
                    for (uint32_t i = (uint32_t)dd + 1; i < sh->rank; i++) inner *= sh->d[i];
                    double *ref = (double *)calloc((size_t)n + 1, sizeof(double));
                    for (int64_t i = 0; i < n; i++) {
                        // the line through element i: same outer and inner index
                        int64_t base = (i / (len * inner)) * len * inner + i % inner;
                        double mx = -INFINITY, sum = 0;
                        for (int64_t k = 0; k < len; k++)
                            mx = fmax(mx, tt_get(x, base + k * inner));
                        for (int64_t k = 0; k < len; k++)
                            sum += exp(tt_get(x, base + k * inner) - mx);
                        double e = tt_get(x, i) - mx;
                        ref[i] = lg ? e - log(sum) : exp(e) / sum;
                    }
                    char what[64];
                    snprintf(what, sizeof what, "%s shape %zu dim %lld", kiln_op_name(op), s,
                             (long long)dim);
                    tt_close(y, ref, 1e-6, tt_rtol(dt) + 1e-5, what);
                    free(ref);
                    tt_free(x), tt_free(y);
                }
            }
        }
    }
    // A dim outside the rank fails cleanly.
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 2, 2), *y = tt_new2(KILN_DTYPE_F32, 2, 2);
    tt_rand(x, -1, 1);
    tattrs a;
    tattrs_init(&a, KILN_OP_SOFTMAX);
    tattrs_int(&a, KILN_A_SOFTMAX_DIM, 2);
    kiln_tensor *ins[1] = {x};
    CHECK_STATUS(trun(KILN_OP_SOFTMAX, &a, ins, 1, y), KILN_ERR_INVALID_ARG);
    tt_free(x), tt_free(y);
}

// group_norm against a double reference: groups of several channels over 3-D and 4-D inputs,
// with and without affine parameters, every float dtype.
static void test_group_norm_random(void) {
    static const int64_t shapes[][4] = {{2, 6, 5, 4}, {3, 4, 10, 1}, {1, 8, 1, 1}};
    static const int64_t groups[] = {3, 2, 8};
    for (int s = 0; s < 3; s++) {
        for (int d = 0; d < 3; d++) {
            for (int affine = 0; affine < 2; affine++) {
                uint32_t dt = tt_float_dtype(d);
                const int64_t *sh = shapes[s];
                uint32_t rank = s == 1 ? 3 : 4;
                kiln_tensor *x = tt_new(dt, rank, sh), *y = tt_new(dt, rank, sh);
                kiln_tensor *w = tt_new1(dt, sh[1]), *b = tt_new1(dt, sh[1]);
                tt_rand(x, -2, 3);
                tt_rand(w, 0.5, 1.5);
                tt_rand(b, -1, 1);
                tattrs a;
                tattrs_init(&a, KILN_OP_GROUP_NORM);
                tattrs_int(&a, KILN_A_GN_GROUPS, groups[s]);
                a.floats[a.refs[KILN_A_GN_EPS].begin] = 1e-3;
                kiln_tensor *ins[3] = {x, affine ? w : NULL, affine ? b : NULL};
                CHECK_OK(trun(KILN_OP_GROUP_NORM, &a, ins, 3, y));
                int64_t n = sh[0], c = sh[1], inner = tt_numel(x) / (n * c), cg = c / groups[s];
                double *ref = (double *)calloc((size_t)tt_numel(x), sizeof(double));
                for (int64_t i = 0; i < n; i++)
                    for (int64_t g = 0; g < groups[s]; g++) {
                        int64_t base = (i * c + g * cg) * inner, len = cg * inner;
                        double m = 0, v = 0;
                        for (int64_t k = 0; k < len; k++) m += tt_get(x, base + k);
                        m /= (double)len;
                        for (int64_t k = 0; k < len; k++)
                            v += (tt_get(x, base + k) - m) * (tt_get(x, base + k) - m);
                        v /= (double)len;
                        for (int64_t k = 0; k < len; k++) {
                            int64_t ch = g * cg + k / inner;
                            double z = (tt_get(x, base + k) - m) / sqrt(v + 1e-3);
                            ref[base + k] = affine ? z * tt_get(w, ch) + tt_get(b, ch) : z;
                        }
                    }
                tt_close(y, ref, 1e-5, tt_rtol(dt) * 2, "group_norm");
                free(ref);
                tt_free(x), tt_free(y), tt_free(w), tt_free(b);
            }
        }
    }
}

// rms_norm: [3, 4] by hand (mean of squares 25/4 + eps 0 -> rstd 0.4), then random rows of
// every float dtype, with and without a weight, against a double loop.
static void test_rms_norm(void) {
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 1, 2), *y = tt_new2(KILN_DTYPE_F32, 1, 2);
    kiln_tensor *w = tt_new1(KILN_DTYPE_F32, 2);
    tt_set_all(x, (const double[]){3, 4}); // mean(x^2) = 12.5
    tt_set_all(w, (const double[]){2, -1});
    tattrs a;
    tattrs_init(&a, KILN_OP_RMS_NORM);
    tattrs_float(&a, KILN_A_RMS_EPS, 0.0);
    kiln_tensor *ins[2] = {x, w};
    CHECK_OK(trun(KILN_OP_RMS_NORM, &a, ins, 2, y));
    double r = 1 / sqrt(12.5);
    tt_close(y, (const double[]){6 * r, -4 * r}, 1e-6, 1e-6, "rms_norm hand");
    tt_free(x), tt_free(y), tt_free(w);
    static const shape shapes[] = {
        {3, {2, 5, 8}}, {2, {7, 13}}, {1, {300}}, {2, {0, 4}}, {4, {2, 1, 3, 1}}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int di = 0; di < 3; di++) {
            for (int wt = 0; wt < 2; wt++) {
                uint32_t dt = tt_float_dtype(di);
                const shape *sh = &shapes[s];
                int64_t d = sh->d[sh->rank - 1];
                kiln_tensor *rx = tt_new(dt, sh->rank, sh->d), *ry = tt_new(dt, sh->rank, sh->d);
                kiln_tensor *rw = tt_new1(dt, d);
                tt_rand(rx, -3, 3);
                tt_rand(rw, 0.5, 2);
                tattrs_init(&a, KILN_OP_RMS_NORM);
                tattrs_float(&a, KILN_A_RMS_EPS, 1e-3);
                kiln_tensor *rins[2] = {rx, wt ? rw : NULL};
                CHECK_OK(trun(KILN_OP_RMS_NORM, &a, rins, 2, ry));
                int64_t n = tt_numel(rx);
                double *ref = (double *)calloc((size_t)n + 1, sizeof(double));
                for (int64_t r0 = 0; d > 0 && r0 < n; r0 += d) {
                    double sq = 0;
                    for (int64_t i = 0; i < d; i++) sq += tt_get(rx, r0 + i) * tt_get(rx, r0 + i);
                    double rs = 1 / sqrt(sq / (double)d + 1e-3);
                    for (int64_t i = 0; i < d; i++) {
                        ref[r0 + i] = tt_get(rx, r0 + i) * rs * (wt ? tt_get(rw, i) : 1.0);
                    }
                }
                tt_close(ry, ref, 1e-5, tt_rtol(dt) + 1e-5, "rms_norm");
                free(ref);
                tt_free(rx), tt_free(ry), tt_free(rw);
            }
        }
    }
}

int main(void) {
    check_rng_seed();
    test_rms_norm();
    test_group_norm_random();
    test_hand();
    test_batch_norm_random();
    test_layer_norm_random();
    test_softmax_random();
    return check_summary();
}
