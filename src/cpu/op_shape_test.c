// SPDX-License-Identifier: Apache-2.0
// Data-movement ops on the CPU backend for every dtype: reshape / squeeze / unsqueeze, expand,
// permute (every permutation of a rank-4 tensor, with size-1 and size-0 dims), cat, slice
// (indices checked against Python's list slicing), select; errors for bad attributes.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static const uint32_t all_dtypes[6] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                       KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL};

// Random contents for any dtype (bool 0/1, ints in [-50, 50], floats in [-50, 50)).
static void fill(kiln_tensor *t) { tt_rand(t, -50, 50); }

// Exact comparison of element x[xi] and y[yi] (bytes).
static int same_elem(const kiln_tensor *x, int64_t xi, const kiln_tensor *y, int64_t yi) {
    size_t es = kiln_dtype_size((kiln_dtype)x->dtype);
    return memcmp((const uint8_t *)x->data + (size_t)xi * es,
                  (const uint8_t *)y->data + (size_t)yi * es, es) == 0;
}

static void test_reshape(void) {
    for (int di = 0; di < 6; di++) {
        kiln_tensor *x = tt_new3(all_dtypes[di], 2, 3, 4), *y = tt_new2(all_dtypes[di], 6, 4);
        fill(x);
        tattrs a;
        tattrs_init(&a, KILN_OP_RESHAPE);
        tattrs_int2(&a, KILN_A_RESHAPE_SHAPE, -1, -4); // codes: the kernel copies, shape is given
        kiln_tensor *ins[1] = {x};
        CHECK_OK(trun(KILN_OP_RESHAPE, &a, ins, 1, y));
        CHECK(memcmp(x->data, y->data, 24 * kiln_dtype_size((kiln_dtype)x->dtype)) == 0);
        int64_t d5[5] = {2, 1, 3, 4, 1};
        kiln_tensor *u = tt_new(all_dtypes[di], 5, d5);
        tattrs_init(&a, KILN_OP_UNSQUEEZE);
        tattrs_int(&a, KILN_A_UNSQUEEZE_DIM, 1);
        CHECK_OK(trun(KILN_OP_UNSQUEEZE, &a, ins, 1, u));
        CHECK(memcmp(x->data, u->data, 24 * kiln_dtype_size((kiln_dtype)x->dtype)) == 0);
        kiln_tensor *uins[1] = {u};
        tattrs_init(&a, KILN_OP_SQUEEZE);
        tattrs_int2(&a, KILN_A_SQUEEZE_DIMS, 1, 4);
        CHECK_OK(trun(KILN_OP_SQUEEZE, &a, uins, 1, y));
        CHECK(memcmp(x->data, y->data, 24 * kiln_dtype_size((kiln_dtype)x->dtype)) == 0);
        tt_free(x), tt_free(y), tt_free(u);
    }
    // Element counts that disagree are an error, not an overrun.
    kiln_tensor *x = tt_new1(KILN_DTYPE_F32, 6), *y = tt_new1(KILN_DTYPE_F32, 7);
    fill(x);
    tattrs a;
    tattrs_init(&a, KILN_OP_RESHAPE);
    tattrs_int(&a, KILN_A_RESHAPE_SHAPE, 7);
    kiln_tensor *ins[1] = {x};
    CHECK_STATUS(trun(KILN_OP_RESHAPE, &a, ins, 1, y), KILN_ERR_INVALID_ARG);
    tt_free(x), tt_free(y);
}

static void test_expand(void) {
    for (int di = 0; di < 6; di++) {
        kiln_tensor *x = tt_new2(all_dtypes[di], 3, 1), *y = tt_new3(all_dtypes[di], 2, 3, 4);
        fill(x);
        tattrs a;
        tattrs_init(&a, KILN_OP_EXPAND);
        int64_t shape[3] = {2, -1, 4};
        tattrs_ints(&a, KILN_A_EXPAND_SHAPE, 3, shape);
        kiln_tensor *ins[1] = {x};
        CHECK_OK(trun(KILN_OP_EXPAND, &a, ins, 1, y));
        int ok = 1;
        for (int64_t i = 0; i < 24; i++) ok &= same_elem(x, (i / 4) % 3, y, i);
        CHECK_MSG(ok, "expand %s", kiln_dtype_name((kiln_dtype)all_dtypes[di]));
        kiln_tensor *s = tt_new(all_dtypes[di], 0, NULL), *z = tt_new1(all_dtypes[di], 5);
        fill(s);
        kiln_tensor *sins[1] = {s};
        CHECK_OK(trun(KILN_OP_EXPAND, &a, sins, 1, z));
        ok = 1;
        for (int64_t i = 0; i < 5; i++) ok &= same_elem(s, 0, z, i);
        CHECK_MSG(ok, "expand scalar %s", kiln_dtype_name((kiln_dtype)all_dtypes[di]));
        tt_free(x), tt_free(y), tt_free(s), tt_free(z);
    }
}

static void test_permute(void) {
    static const int64_t shapes[][4] = {{2, 3, 4, 5}, {1, 7, 1, 3}, {2, 0, 3, 1}, {3, 1, 33, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int p = 0; p < 24; p++) { // every permutation of 4 dims
            int64_t perm[4], pool[4] = {0, 1, 2, 3};
            int r = p;
            for (int i = 0; i < 4; i++) {
                int k = r % (4 - i);
                r /= 4 - i;
                perm[i] = pool[k];
                for (int j = k; j < 3 - i; j++) pool[j] = pool[j + 1];
            }
            uint32_t dt = all_dtypes[(s + (size_t)p) % 6];
            int64_t od[4];
            for (int i = 0; i < 4; i++) od[i] = shapes[s][perm[i]];
            kiln_tensor *x = tt_new(dt, 4, shapes[s]), *y = tt_new(dt, 4, od);
            fill(x);
            int64_t nperm[4]; // negative entries are accepted too
            for (int i = 0; i < 4; i++) nperm[i] = (p & 1) ? perm[i] - 4 : perm[i];
            tattrs a;
            tattrs_init(&a, KILN_OP_PERMUTE);
            tattrs_ints(&a, KILN_A_PERMUTE_DIMS, 4, nperm);
            kiln_tensor *ins[1] = {x};
            CHECK_OK(trun(KILN_OP_PERMUTE, &a, ins, 1, y));
            int ok = 1;
            for (int64_t o = 0; o < tt_numel(y); o++) {
                int64_t rest = o, oi[4], xi[4] = {0, 0, 0, 0};
                for (int d = 3; d >= 0; d--) {
                    oi[d] = rest % od[d];
                    rest /= od[d];
                }
                for (int d = 0; d < 4; d++) xi[perm[d]] = oi[d];
                int64_t off =
                    ((xi[0] * shapes[s][1] + xi[1]) * shapes[s][2] + xi[2]) * shapes[s][3] + xi[3];
                ok &= same_elem(x, off, y, o);
            }
            CHECK_MSG(ok, "permute shape %zu perm %d", s, p);
            tt_free(x), tt_free(y);
        }
    }
    // Not a permutation: refused.
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 2, 2), *y = tt_new2(KILN_DTYPE_F32, 2, 2);
    fill(x);
    tattrs a;
    tattrs_init(&a, KILN_OP_PERMUTE);
    tattrs_int2(&a, KILN_A_PERMUTE_DIMS, 0, 0);
    kiln_tensor *ins[1] = {x};
    CHECK_STATUS(trun(KILN_OP_PERMUTE, &a, ins, 1, y), KILN_ERR_INVALID_ARG);
    tt_free(x), tt_free(y);
}

static void test_cat(void) {
    for (int di = 0; di < 6; di++) {
        for (int64_t dim = -3; dim < 3; dim++) {
            int d = (int)(dim < 0 ? dim + 3 : dim);
            int64_t sizes[3] = {2, 0, 3}, base[3] = {2, 3, 4};
            kiln_tensor *xs[3];
            for (int i = 0; i < 3; i++) {
                int64_t dd[3] = {base[0], base[1], base[2]};
                dd[d] = sizes[i];
                xs[i] = tt_new(all_dtypes[di], 3, dd);
                fill(xs[i]);
            }
            int64_t yd[3] = {base[0], base[1], base[2]};
            yd[d] = 5;
            kiln_tensor *y = tt_new(all_dtypes[di], 3, yd);
            tattrs a;
            tattrs_init(&a, KILN_OP_CAT);
            tattrs_int(&a, KILN_A_CAT_DIM, dim);
            CHECK_OK(trun(KILN_OP_CAT, &a, xs, 3, y));
            int ok = 1;
            for (int64_t o = 0; o < tt_numel(y); o++) {
                int64_t rest = o, yi[3];
                for (int k = 2; k >= 0; k--) {
                    yi[k] = rest % yd[k];
                    rest /= yd[k];
                }
                int src = yi[d] < 2 ? 0 : 2;
                int64_t xi[3] = {yi[0], yi[1], yi[2]};
                xi[d] -= src == 0 ? 0 : 2;
                const int64_t *xd = xs[src]->dims;
                ok &= same_elem(xs[src], (xi[0] * xd[1] + xi[1]) * xd[2] + xi[2], y, o);
            }
            CHECK_MSG(ok, "cat dim %lld %s", (long long)dim,
                      kiln_dtype_name((kiln_dtype)all_dtypes[di]));
            for (int i = 0; i < 3; i++) tt_free(xs[i]);
            tt_free(y);
        }
    }
}

typedef struct slc {
    int64_t start, end, step, count;
    int64_t idx[7];
} slc;

static void test_slice_select(void) {
    // Expected indices from Python: list(range(7))[start:end:step].
    static const slc cases[] = {
        {0, INT64_MAX, 1, 7, {0, 1, 2, 3, 4, 5, 6}},
        {1, 5, 2, 2, {1, 3}},
        {-3, INT64_MAX, 1, 3, {4, 5, 6}},
        {-100, 100, 3, 3, {0, 3, 6}},
        {5, 2, 1, 0, {0}},
        {2, -1, 2, 2, {2, 4}},
        {7, 9, 1, 0, {0}},
        {-1, -2, 1, 0, {0}},
        {0, 7, 7, 1, {0}},
        {3, 4, 1, 1, {3}},
        {-7, -6, 1, 1, {0}},
        {6, 100, 4, 1, {6}},
        {0, INT64_MAX, INT64_MAX, 1, {0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const slc *sc = &cases[c];
        uint32_t dt = all_dtypes[c % 6];
        kiln_tensor *x = tt_new3(dt, 2, 7, 3), *y = tt_new3(dt, 2, sc->count, 3);
        fill(x);
        tattrs a;
        tattrs_init(&a, KILN_OP_SLICE);
        tattrs_int(&a, KILN_A_SLICE_DIM, c % 2 ? -2 : 1);
        tattrs_int(&a, KILN_A_SLICE_START, sc->start);
        tattrs_int(&a, KILN_A_SLICE_END, sc->end);
        tattrs_int(&a, KILN_A_SLICE_STEP, sc->step);
        kiln_tensor *ins[1] = {x};
        CHECK_OK(trun(KILN_OP_SLICE, &a, ins, 1, y));
        int ok = 1;
        for (int64_t o = 0; o < 2; o++) {
            for (int64_t i = 0; i < sc->count; i++) {
                for (int64_t k = 0; k < 3; k++) {
                    ok &=
                        same_elem(x, (o * 7 + sc->idx[i]) * 3 + k, y, (o * sc->count + i) * 3 + k);
                }
            }
        }
        CHECK_MSG(ok, "slice case %zu", c);
        tt_free(x), tt_free(y);
    }
    // select: negative index counts from the end; out of range is refused.
    for (int di = 0; di < 6; di++) {
        kiln_tensor *x = tt_new3(all_dtypes[di], 2, 5, 3), *y = tt_new2(all_dtypes[di], 2, 3);
        fill(x);
        tattrs a;
        tattrs_init(&a, KILN_OP_SELECT);
        tattrs_int(&a, KILN_A_SELECT_DIM, 1);
        tattrs_int(&a, KILN_A_SELECT_INDEX, -2);
        kiln_tensor *ins[1] = {x};
        CHECK_OK(trun(KILN_OP_SELECT, &a, ins, 1, y));
        int ok = 1;
        for (int64_t o = 0; o < 2; o++) {
            for (int64_t k = 0; k < 3; k++) ok &= same_elem(x, (o * 5 + 3) * 3 + k, y, o * 3 + k);
        }
        CHECK_MSG(ok, "select %s", kiln_dtype_name((kiln_dtype)all_dtypes[di]));
        tattrs_int(&a, KILN_A_SELECT_INDEX, 5);
        CHECK_STATUS(trun(KILN_OP_SELECT, &a, ins, 1, y), KILN_ERR_INVALID_ARG);
        tattrs_int(&a, KILN_A_SELECT_INDEX, -6);
        CHECK_STATUS(trun(KILN_OP_SELECT, &a, ins, 1, y), KILN_ERR_INVALID_ARG);
        tt_free(x), tt_free(y);
    }
    // A rank-1 select gives a rank-0 output.
    kiln_tensor *v = tt_new1(KILN_DTYPE_I64, 4), *s = tt_new(KILN_DTYPE_I64, 0, NULL);
    tt_set_all(v, (const double[]){10, 11, 12, 13});
    tattrs a;
    tattrs_init(&a, KILN_OP_SELECT);
    tattrs_int(&a, KILN_A_SELECT_DIM, 0);
    tattrs_int(&a, KILN_A_SELECT_INDEX, 2);
    kiln_tensor *ins[1] = {v};
    CHECK_OK(trun(KILN_OP_SELECT, &a, ins, 1, s));
    CHECK_EQ_INT(((int64_t *)s->data)[0], 12);
    tt_free(v), tt_free(s);
}

// pad: constant padding and cropping over the last dims, every dtype, against a loop reference.
static void test_pad(void) {
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                   KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL};
    for (int d = 0; d < 6; d++) {
        // x [2, 3, 4] padded (1, 2) on the last dim, (-1, 2) on dim 1: y [2, 4, 7]
        kiln_tensor *x = tt_new3(dts[d], 2, 3, 4), *y = tt_new3(dts[d], 2, 4, 7);
        tt_rand(x, -9, 9);
        tattrs a;
        tattrs_init(&a, KILN_OP_PAD);
        int64_t pads[4] = {1, 2, -1, 2};
        tattrs_ints(&a, KILN_A_PAD_PADS, 4, pads);
        a.floats[a.refs[KILN_A_PAD_VALUE].begin] = 1.0;
        kiln_tensor *ins[1] = {x};
        CHECK_OK(trun(KILN_OP_PAD, &a, ins, 1, y));
        double ref[56];
        for (int n = 0; n < 2; n++)
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 7; q++) {
                    int xr = r + 1, xq = q - 1;
                    ref[(n * 4 + r) * 7 + q] = (xr >= 0 && xr < 3 && xq >= 0 && xq < 4)
                                                   ? tt_get(x, (n * 3 + xr) * 4 + xq)
                                                   : 1.0;
                }
        tt_close(y, ref, 0, 0, "pad");
        tt_free(x), tt_free(y);
    }
}

// arange: the length comes from the like input's dim; values in double, stored per dtype.
static void test_arange(void) {
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32,
                                   KILN_DTYPE_I64};
    for (int d = 0; d < 5; d++) {
        kiln_tensor *like = tt_new2(KILN_DTYPE_BOOL, 2, 37), *y = tt_new1(dts[d], 37);
        tattrs a;
        tattrs_init(&a, KILN_OP_ARANGE);
        tattrs_int(&a, KILN_A_ARANGE_DIM, 1);
        tattrs_int(&a, KILN_A_ARANGE_DTYPE, dts[d]);
        double start = d < 3 ? -1.5 : 5.0, step = d < 3 ? 0.125 : -3.0;
        tattrs_float(&a, KILN_A_ARANGE_START, start);
        tattrs_float(&a, KILN_A_ARANGE_STEP, step);
        kiln_tensor *ins[1] = {like};
        CHECK_OK(trun(KILN_OP_ARANGE, &a, ins, 1, y));
        double ref[37];
        for (int i = 0; i < 37; i++) ref[i] = start + i * step;
        tt_close(y, ref, 0, tt_rtol(dts[d]), "arange");
        tt_free(like), tt_free(y);
    }
}

int main(void) {
    check_rng_seed();
    test_arange();
    test_pad();
    test_reshape();
    test_expand();
    test_permute();
    test_cat();
    test_slice_select();
    return check_summary();
}
