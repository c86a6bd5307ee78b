// SPDX-License-Identifier: Apache-2.0
// mean, sum and vector_norm on the CPU backend: hand-computed values, then random inputs against a
// loop that recomputes each output element from its own index, over dim subsets (empty = all,
// negative, innermost, outermost, non-adjacent), keepdim on and off, size-0 and size-1 dims, float
// and integer dtypes.
#include <stdlib.h>

#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static void test_hand(void) {
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 2, 3), *y = tt_new1(KILN_DTYPE_F32, 2);
    tt_set_all(x, (const double[]){1, 2, 3, 4, 5, 6});
    tattrs a;
    tattrs_init(&a, KILN_OP_SUM);
    tattrs_int(&a, KILN_A_REDUCE_DIMS, -1);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_SUM, &a, ins, 1, y));
    tt_close(y, (const double[]){6, 15}, 0, 0, "sum hand");
    kiln_tensor *z = tt_new(KILN_DTYPE_F32, 0, NULL);
    tattrs_init(&a, KILN_OP_MEAN);
    tattrs_ints(&a, KILN_A_REDUCE_DIMS, 0, NULL); // all dims
    CHECK_OK(trun(KILN_OP_MEAN, &a, ins, 1, z));
    tt_close(z, (const double[]){3.5}, 0, 0, "mean hand");
    // mean of an empty tensor is NaN, sum is 0
    kiln_tensor *e = tt_new2(KILN_DTYPE_F32, 0, 3);
    kiln_tensor *eins[1] = {e};
    CHECK_OK(trun(KILN_OP_MEAN, &a, eins, 1, z));
    tt_close(z, (const double[]){NAN}, 0, 0, "mean empty");
    tattrs_init(&a, KILN_OP_SUM);
    tattrs_ints(&a, KILN_A_REDUCE_DIMS, 0, NULL);
    CHECK_OK(trun(KILN_OP_SUM, &a, eins, 1, z));
    tt_close(z, (const double[]){0}, 0, 0, "sum empty");
    // the 2-norm of the rows [1, 2, 3] and [4, 5, 6]: sqrt(14), sqrt(77)
    tattrs_init(&a, KILN_OP_VECTOR_NORM);
    tattrs_int(&a, KILN_A_REDUCE_DIMS, 1);
    CHECK_OK(trun(KILN_OP_VECTOR_NORM, &a, ins, 1, y));
    tt_close(y, (const double[]){sqrt(14.0), sqrt(77.0)}, 1e-6, 1e-6, "vector_norm hand");
    tt_free(x), tt_free(y), tt_free(z), tt_free(e);
}

typedef struct rcase {
    uint32_t rank;
    int64_t d[4];
    uint32_t nd;
    int64_t dims[4];
} rcase;

static void test_random(void) {
    static const rcase cases[] = {
        {4, {2, 3, 4, 5}, 2, {2, 3}},  {4, {2, 3, 4, 5}, 1, {0}}, {4, {2, 3, 4, 5}, 2, {0, 2}},
        {4, {2, 3, 4, 5}, 0, {0}},     {3, {3, 1, 7}, 1, {-2}},   {2, {5, 300}, 1, {1}},
        {2, {300, 5}, 1, {0}},         {3, {2, 0, 3}, 1, {2}},    {3, {2, 0, 3}, 1, {1}},
        {3, {4, 5, 6}, 3, {-1, 0, 1}}, {1, {1}, 1, {0}},          {4, {1, 8, 7, 7}, 2, {-1, -2}},
    };
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32,
                                   KILN_DTYPE_I64};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const rcase *rc = &cases[c];
        int red[4] = {rc->nd == 0, rc->nd == 0, rc->nd == 0, rc->nd == 0};
        for (uint32_t i = 0; i < rc->nd; i++)
            red[rc->dims[i] < 0 ? rc->dims[i] + rc->rank : rc->dims[i]] = 1;
        for (int keep = 0; keep < 2; keep++) {
            int64_t od[4];
            uint32_t orank = 0;
            for (uint32_t d = 0; d < rc->rank; d++) {
                if (!red[d])
                    od[orank++] = rc->d[d];
                else if (keep)
                    od[orank++] = 1;
            }
            for (int di = 0; di < 5; di++) {
                for (int mode = 0; mode < 3; mode++) { // sum, mean, vector_norm
                    const int mean = mode == 1, norm = mode == 2;
                    uint32_t dt = dts[di], op = norm   ? KILN_OP_VECTOR_NORM
                                                : mean ? KILN_OP_MEAN
                                                       : KILN_OP_SUM;
                    if (mode > 0 && kiln_cpu_is_int(dt)) continue;
                    // sum of int32 gives int64, as in PyTorch
                    uint32_t odt = dt == KILN_DTYPE_I32 ? KILN_DTYPE_I64 : dt;
                    kiln_tensor *x = tt_new(dt, rc->rank, rc->d), *y = tt_new(odt, orank, od);
                    tt_rand(x, kiln_cpu_is_int(dt) ? -1000 : -2, kiln_cpu_is_int(dt) ? 1000 : 2);
                    tattrs a;
                    tattrs_init(&a, op);
                    tattrs_ints(&a, KILN_A_REDUCE_DIMS, rc->nd, rc->dims);
                    tattrs_int(&a, KILN_A_REDUCE_KEEPDIM, keep);
                    kiln_tensor *ins[1] = {x};
                    CHECK_OK(trun(op, &a, ins, 1, y));
                    int64_t n_out = tt_numel(y), n_in = tt_numel(x);
                    double *ref = (double *)calloc((size_t)n_out + 1, sizeof(double));
                    double *cnt = (double *)calloc((size_t)n_out + 1, sizeof(double));
                    for (int64_t i = 0; i < n_in; i++) { // scatter each input to its output
                        int64_t rest = i, idx[4], o = 0;
                        for (int d = (int)rc->rank - 1; d >= 0; d--) {
                            idx[d] = rest % rc->d[d];
                            rest /= rc->d[d];
                        }
                        for (uint32_t d = 0; d < rc->rank; d++) {
                            if (!red[d]) o = o * rc->d[d] + idx[d];
                        }
                        ref[o] += norm ? tt_get(x, i) * tt_get(x, i) : tt_get(x, i);
                        cnt[o] += 1;
                    }
                    int64_t per = n_out ? n_in / n_out : 0;
                    for (int64_t o = 0; o < n_out; o++) {
                        if (mean) ref[o] = per ? ref[o] / (double)per : NAN;
                        if (norm) ref[o] = sqrt(ref[o]);
                    }
                    char what[64];
                    snprintf(what, sizeof what, "%s case %zu keepdim %d", kiln_op_name(op), c,
                             keep);
                    tt_close(y, ref, 1e-5, tt_rtol(odt) + 1e-6, what);
                    free(ref);
                    free(cnt);
                    tt_free(x), tt_free(y);
                }
            }
        }
    }
}

// cumsum along each dim against a loop reference: float dtypes, int32 and int64 (exact, with
// values whose float32 sum would round), and a hand case.
static void test_cumsum(void) {
    for (int dim = 0; dim < 3; dim++) {
        static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                       KILN_DTYPE_I32, KILN_DTYPE_I64};
        for (int d = 0; d < 5; d++) {
            int64_t dims[3] = {3, 9, 2};
            kiln_tensor *x = tt_new(dts[d], 3, dims), *y = tt_new(dts[d], 3, dims);
            tt_rand(x, -20, 20);
            tattrs a;
            tattrs_init(&a, KILN_OP_CUMSUM);
            tattrs_int(&a, KILN_A_CUMSUM_DIM, dim == 2 ? -1 : dim);
            kiln_tensor *ins[1] = {x};
            CHECK_OK(trun(KILN_OP_CUMSUM, &a, ins, 1, y));
            double ref[54];
            int64_t st[3] = {18, 2, 1};
            for (int64_t e = 0; e < 54; e++) {
                int64_t c[3] = {e / 18, (e / 2) % 9, e % 2};
                double acc = 0;
                for (int64_t k = 0; k <= c[dim]; k++) {
                    int64_t cc[3] = {c[0], c[1], c[2]};
                    cc[dim] = k;
                    acc += tt_get(x, cc[0] * st[0] + cc[1] * st[1] + cc[2] * st[2]);
                }
                ref[e] = acc;
            }
            tt_close(y, ref, 1e-4, tt_rtol(dts[d]) * 4, "cumsum");
            tt_free(x), tt_free(y);
        }
    }
    kiln_tensor *x = tt_new1(KILN_DTYPE_I64, 3), *y = tt_new1(KILN_DTYPE_I64, 3);
    int64_t *xv = (int64_t *)x->data, *yv = (int64_t *)y->data;
    xv[0] = (INT64_C(1) << 53) + 1;
    xv[1] = 1;
    xv[2] = -2;
    tattrs a;
    tattrs_init(&a, KILN_OP_CUMSUM);
    tattrs_int(&a, KILN_A_CUMSUM_DIM, 0);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_CUMSUM, &a, ins, 1, y));
    CHECK(yv[0] == (INT64_C(1) << 53) + 1 && yv[1] == (INT64_C(1) << 53) + 2 &&
          yv[2] == INT64_C(1) << 53);
    tt_free(x), tt_free(y);
}

// argmax along each dim against a loop reference (float dtypes and integers; the first of equal
// maxima), keepdim, and NaN winning as in PyTorch.
static void test_argmax(void) {
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32,
                                   KILN_DTYPE_I64};
    for (int dim = 0; dim < 3; dim++) {
        for (int d = 0; d < 5; d++) {
            int64_t dims[3] = {3, 9, 2}, odims[3] = {3, 9, 2};
            odims[dim] = 1;
            kiln_tensor *x = tt_new(dts[d], 3, dims), *y = tt_new(KILN_DTYPE_I64, 3, odims);
            tt_rand(x, -4, 4); // integers: many ties
            tattrs a;
            tattrs_init(&a, KILN_OP_ARGMAX);
            tattrs_int(&a, KILN_A_ARGMAX_DIM, dim == 2 ? -1 : dim);
            tattrs_int(&a, KILN_A_ARGMAX_KEEPDIM, 1);
            kiln_tensor *ins[1] = {x};
            CHECK_OK(trun(KILN_OP_ARGMAX, &a, ins, 1, y));
            int64_t st[3] = {18, 2, 1}, bad = 0;
            for (int64_t e = 0; e < 54; e++) {
                int64_t c[3] = {e / 18, (e / 2) % 9, e % 2};
                if (c[dim] != 0) continue;
                int64_t best = 0;
                double m = tt_get(x, c[0] * st[0] + c[1] * st[1] + c[2] * st[2]);
                for (int64_t k = 1; k < dims[dim]; k++) {
                    int64_t cc[3] = {c[0], c[1], c[2]};
                    cc[dim] = k;
                    double v = tt_get(x, cc[0] * st[0] + cc[1] * st[1] + cc[2] * st[2]);
                    if (v > m) m = v, best = k;
                }
                int64_t oi = dim == 0   ? c[1] * 2 + c[2]
                             : dim == 1 ? c[0] * 2 + c[2]
                                        : c[0] * 9 + c[1];
                bad += ((int64_t *)y->data)[oi] != best;
            }
            CHECK_MSG(bad == 0, "argmax dim %d dtype %u: %lld wrong", dim, dts[d], (long long)bad);
            tt_free(x), tt_free(y);
        }
    }
    kiln_tensor *x = tt_new1(KILN_DTYPE_F32, 5), *y = tt_new(KILN_DTYPE_I64, 0, NULL);
    float *xv = (float *)x->data;
    xv[0] = 1.0f, xv[1] = 3.0f, xv[2] = NAN, xv[3] = 7.0f, xv[4] = NAN;
    tattrs a;
    tattrs_init(&a, KILN_OP_ARGMAX);
    tattrs_int(&a, KILN_A_ARGMAX_DIM, 0);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_ARGMAX, &a, ins, 1, y));
    CHECK(((int64_t *)y->data)[0] == 2); // the first NaN
    xv[2] = 5.0f, xv[4] = 7.0f;
    CHECK_OK(trun(KILN_OP_ARGMAX, &a, ins, 1, y));
    CHECK(((int64_t *)y->data)[0] == 3); // the first of two maxima
    tt_free(x), tt_free(y);
}

// topk against a reference that sorts each line's (value, index) pairs with qsort (descending
// or ascending value, then index): k of 0, 1, 3 and the whole line over every dim of [3, 9, 2],
// float and integer dtypes (integers: many ties, ordered by index); then NaN by hand.
static int g_largest;
static int topk_ref_cmp(const void *pa, const void *pb) {
    const double *a = (const double *)pa, *b = (const double *)pb; // {value, index}
    if (a[0] != b[0]) return (g_largest ? a[0] > b[0] : a[0] < b[0]) ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

static void test_topk(void) {
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32,
                                   KILN_DTYPE_I64};
    const int64_t dims[3] = {3, 9, 2}, st[3] = {18, 2, 1};
    for (int largest = 0; largest < 2; largest++) {
        for (int dim = 0; dim < 3; dim++) {
            const int64_t ks[4] = {0, 1, dims[dim] < 3 ? dims[dim] : 3, dims[dim]};
            for (int ki = 0; ki < 4; ki++) {
                for (int d = 0; d < 5; d++) {
                    const int64_t k = ks[ki];
                    int64_t odims[3] = {3, 9, 2};
                    odims[dim] = k;
                    kiln_tensor *x = tt_new(dts[d], 3, dims), *y = tt_new(KILN_DTYPE_I64, 3, odims);
                    tt_rand(x, -4, 4);
                    tattrs a;
                    tattrs_init(&a, KILN_OP_TOPK);
                    tattrs_int(&a, KILN_A_TOPK_DIM, dim == 2 ? -1 : dim);
                    tattrs_int(&a, KILN_A_TOPK_K, k);
                    tattrs_int(&a, KILN_A_TOPK_LARGEST, largest);
                    kiln_tensor *ins[1] = {x};
                    CHECK_OK(trun(KILN_OP_TOPK, &a, ins, 1, y));
                    int64_t bad = 0, ost[3] = {odims[1] * odims[2], odims[2], 1};
                    for (int64_t e = 0; e < 54; e++) {
                        int64_t c[3] = {e / 18, (e / 2) % 9, e % 2};
                        if (c[dim] != 0) continue;
                        double pairs[9][2];
                        for (int64_t l = 0; l < dims[dim]; l++) {
                            int64_t cc[3] = {c[0], c[1], c[2]};
                            cc[dim] = l;
                            pairs[l][0] = tt_get(x, cc[0] * st[0] + cc[1] * st[1] + cc[2] * st[2]);
                            pairs[l][1] = (double)l;
                        }
                        g_largest = largest;
                        qsort(pairs, (size_t)dims[dim], sizeof pairs[0], topk_ref_cmp);
                        for (int64_t j = 0; j < k; j++) {
                            int64_t oc[3] = {c[0], c[1], c[2]};
                            oc[dim] = j;
                            const int64_t got =
                                ((int64_t *)y->data)[oc[0] * ost[0] + oc[1] * ost[1] + oc[2]];
                            bad += got != (int64_t)pairs[j][1];
                        }
                    }
                    CHECK_MSG(bad == 0, "topk largest %d dim %d k %lld dtype %u: %lld wrong",
                              largest, dim, (long long)k, dts[d], (long long)bad);
                    tt_free(x), tt_free(y);
                }
            }
        }
    }
    // NaN ranks above every number when largest, below when not; ties by index
    kiln_tensor *x = tt_new1(KILN_DTYPE_F32, 6), *y = tt_new1(KILN_DTYPE_I64, 4);
    float *xv = (float *)x->data;
    xv[0] = 1.0f, xv[1] = NAN, xv[2] = 3.0f, xv[3] = 3.0f, xv[4] = NAN, xv[5] = -2.0f;
    tattrs a;
    tattrs_init(&a, KILN_OP_TOPK);
    tattrs_int(&a, KILN_A_TOPK_DIM, 0);
    tattrs_int(&a, KILN_A_TOPK_K, 4);
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_TOPK, &a, ins, 1, y));
    const int64_t *yv = (const int64_t *)y->data;
    CHECK_MSG(yv[0] == 1 && yv[1] == 4 && yv[2] == 2 && yv[3] == 3,
              "topk NaN largest: %lld %lld "
              "%lld %lld",
              (long long)yv[0], (long long)yv[1], (long long)yv[2], (long long)yv[3]);
    tattrs_int(&a, KILN_A_TOPK_LARGEST, 0);
    CHECK_OK(trun(KILN_OP_TOPK, &a, ins, 1, y));
    CHECK_MSG(yv[0] == 5 && yv[1] == 0 && yv[2] == 2 && yv[3] == 3,
              "topk NaN smallest: %lld "
              "%lld %lld %lld",
              (long long)yv[0], (long long)yv[1], (long long)yv[2], (long long)yv[3]);
    tattrs_int(&a, KILN_A_TOPK_K, 7); // k above the dimension: refused
    CHECK(trun(KILN_OP_TOPK, &a, ins, 1, y) != KILN_OK);
    tt_free(x), tt_free(y);
}

// selective_scan: h_t = a_t h_{t-1} + u_t from h0, y_t = h_t . c_t, against a double-precision
// loop (every float dtype; N past the stack buffer too), and a hand case.
static void test_selective_scan(void) {
    static const int64_t shapes[][4] = {{1, 3, 5, 4}, {2, 7, 9, 16}, {1, 2, 3, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t nb = shapes[s][0], nd = shapes[s][1], nl = shapes[s][2], nn = shapes[s][3];
        for (int di = 0; di < 3; di++) {
            const uint32_t dt = tt_float_dtype(di);
            kiln_tensor *a = tt_new4(dt, nb, nd, nl, nn), *u = tt_new4(dt, nb, nd, nl, nn);
            kiln_tensor *c = tt_new3(dt, nb, nl, nn), *h0 = tt_new3(dt, nb, nd, nn);
            kiln_tensor *y = tt_new3(dt, nb, nd, nl);
            tt_rand(a, 0.2, 1.0); // a decay, as exp(dt * A) is
            tt_rand(u, -1, 1);
            tt_rand(c, -1, 1);
            tt_rand(h0, -1, 1);
            kiln_tensor *ins[4] = {a, u, c, h0};
            CHECK_OK(trun(KILN_OP_SELECTIVE_SCAN, NULL, ins, 4, y));
            double *ref = (double *)calloc((size_t)(nb * nd * nl), sizeof(double));
            double *h = (double *)calloc((size_t)nn, sizeof(double));
            for (int64_t b = 0; b < nb; b++)
                for (int64_t d = 0; d < nd; d++) {
                    for (int64_t n = 0; n < nn; n++) h[n] = tt_get(h0, (b * nd + d) * nn + n);
                    for (int64_t t = 0; t < nl; t++) {
                        double acc = 0.0;
                        for (int64_t n = 0; n < nn; n++) {
                            const int64_t i = ((b * nd + d) * nl + t) * nn + n;
                            h[n] = tt_get(a, i) * h[n] + tt_get(u, i);
                            acc += h[n] * tt_get(c, (b * nl + t) * nn + n);
                        }
                        ref[(b * nd + d) * nl + t] = acc;
                    }
                }
            char what[64];
            snprintf(what, sizeof what, "selective_scan case %zu", s);
            tt_close(y, ref, 1e-5 * (double)(nn * nl + 1), tt_rtol(dt) + 1e-5, what);
            free(ref), free(h);
            tt_free(a), tt_free(u), tt_free(c), tt_free(h0), tt_free(y);
        }
    }
    // by hand: N 1, a 0.5, u 1, c 2, h0 0: h = 1, 1.5, 1.75; y = 2, 3, 3.5
    kiln_tensor *a = tt_new4(KILN_DTYPE_F32, 1, 1, 3, 1), *u = tt_new4(KILN_DTYPE_F32, 1, 1, 3, 1);
    kiln_tensor *c = tt_new3(KILN_DTYPE_F32, 1, 3, 1), *h0 = tt_new3(KILN_DTYPE_F32, 1, 1, 1);
    kiln_tensor *y = tt_new3(KILN_DTYPE_F32, 1, 1, 3);
    tt_set_all(a, (const double[]){0.5, 0.5, 0.5});
    tt_set_all(u, (const double[]){1, 1, 1});
    tt_set_all(c, (const double[]){2, 2, 2});
    tt_set_all(h0, (const double[]){0});
    kiln_tensor *ins[4] = {a, u, c, h0};
    CHECK_OK(trun(KILN_OP_SELECTIVE_SCAN, NULL, ins, 4, y));
    const double want[3] = {2, 3, 3.5};
    tt_close(y, want, 0, 0, "selective_scan by hand");
    tt_free(a), tt_free(u), tt_free(c), tt_free(h0), tt_free(y);
}

int main(void) {
    check_rng_seed();
    test_selective_scan();
    test_topk();
    test_cumsum();
    test_argmax();
    test_hand();
    test_random();
    return check_summary();
}
