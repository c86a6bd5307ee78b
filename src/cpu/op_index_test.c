// SPDX-License-Identifier: Apache-2.0
// index (advanced indexing) and gather on the CPU backend, against loop references: one and two
// broadcasting index tensors at several dims, int32 and int64 indices with negative values,
// every dtype moved exactly, and out-of-range indices refused before anything is written.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static void test_index_two(void) {
    // x [2, 5, 6, 3]; y = x[:, i, j] with i [4, 1] (int32), j [3] (int64): y [2, 4, 3, 3]
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_I64,
                                   KILN_DTYPE_BOOL};
    for (int d = 0; d < 4; d++) {
        kiln_tensor *x = tt_new4(dts[d], 2, 5, 6, 3);
        kiln_tensor *i = tt_new2(KILN_DTYPE_I32, 4, 1), *j = tt_new1(KILN_DTYPE_I64, 3);
        kiln_tensor *y = tt_new4(dts[d], 2, 4, 3, 3);
        tt_rand(x, -50, 50);
        tt_rand(i, -5, 4);
        tt_rand(j, -6, 5);
        tattrs a;
        tattrs_init(&a, KILN_OP_INDEX);
        tattrs_int(&a, KILN_A_INDEX_DIM, 1);
        kiln_tensor *ins[3] = {x, i, j};
        CHECK_OK(trun(KILN_OP_INDEX, &a, ins, 3, y));
        double ref[72];
        for (int n = 0; n < 2; n++)
            for (int p = 0; p < 4; p++)
                for (int q = 0; q < 3; q++) {
                    int64_t ii = (int64_t)tt_get(i, p), jj = (int64_t)tt_get(j, q);
                    ii = ii < 0 ? ii + 5 : ii;
                    jj = jj < 0 ? jj + 6 : jj;
                    for (int c = 0; c < 3; c++)
                        ref[((n * 4 + p) * 3 + q) * 3 + c] =
                            tt_get(x, ((n * 5 + ii) * 6 + jj) * 3 + c);
                }
        tt_close(y, ref, 0, 0, "index");
        tt_free(x), tt_free(i), tt_free(j), tt_free(y);
    }
}

static void test_index_select_last(void) {
    // index_select along the last dim: x [3, 8] (float16), idx [5] -> [3, 5]
    kiln_tensor *x = tt_new2(KILN_DTYPE_F16, 3, 8), *ix = tt_new1(KILN_DTYPE_I64, 5);
    kiln_tensor *y = tt_new2(KILN_DTYPE_F16, 3, 5);
    tt_rand(x, -1, 1);
    tt_rand(ix, 0, 7);
    tattrs a;
    tattrs_init(&a, KILN_OP_INDEX);
    tattrs_int(&a, KILN_A_INDEX_DIM, 1);
    kiln_tensor *ins[2] = {x, ix};
    CHECK_OK(trun(KILN_OP_INDEX, &a, ins, 2, y));
    double ref[15];
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 5; k++) ref[r * 5 + k] = tt_get(x, r * 8 + (int64_t)tt_get(ix, k));
    tt_close(y, ref, 0, 0, "index_select");
    // out of range: 8 and -9 refused, and -1 without wrap (index_select); output untouched
    static const int64_t bad[] = {8, -9, -1};
    for (int b = 0; b < 3; b++) {
        tattrs_int(&a, KILN_A_INDEX_WRAP, b == 2 ? 0 : 1);
        ((int64_t *)ix->data)[3] = bad[b];
        memset(y->data, 0x5A, 15 * 2);
        CHECK_STATUS(trun(KILN_OP_INDEX, &a, ins, 2, y), KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "out of range") != NULL);
        CHECK(((uint8_t *)y->data)[0] == 0x5A && ((uint8_t *)y->data)[29] == 0x5A);
    }
    tt_free(x), tt_free(ix), tt_free(y);
}

static void test_gather(void) {
    for (int dim = 0; dim < 3; dim++) {
        int64_t xd[3] = {3, 5, 4}, id[3] = {2, 4, 3};
        id[dim] = 7; // longer than x along dim
        kiln_tensor *x = tt_new(KILN_DTYPE_F32, 3, xd), *ix = tt_new(KILN_DTYPE_I64, 3, id);
        kiln_tensor *y = tt_new(KILN_DTYPE_F32, 3, id);
        tt_rand(x, -1, 1);
        tt_rand(ix, 0, xd[dim] - 1);
        tattrs a;
        tattrs_init(&a, KILN_OP_GATHER);
        tattrs_int(&a, KILN_A_GATHER_DIM, dim - 3); // negative dim
        kiln_tensor *ins[2] = {x, ix};
        CHECK_OK(trun(KILN_OP_GATHER, &a, ins, 2, y));
        int64_t n = tt_numel(ix);
        double *ref = (double *)calloc((size_t)n, sizeof(double));
        for (int64_t e = 0; e < n; e++) {
            int64_t c[3] = {e / (id[1] * id[2]), (e / id[2]) % id[1], e % id[2]};
            int64_t v = (int64_t)tt_get(ix, e);
            c[dim] = v;
            ref[e] = tt_get(x, (c[0] * xd[1] + c[1]) * xd[2] + c[2]);
        }
        tt_close(y, ref, 0, 0, "gather");
        ((int64_t *)ix->data)[n - 1] = xd[dim];
        CHECK_STATUS(trun(KILN_OP_GATHER, &a, ins, 2, y), KILN_ERR_INVALID_ARG);
        ((int64_t *)ix->data)[n - 1] = -1; // torch.gather takes no negative index
        CHECK_STATUS(trun(KILN_OP_GATHER, &a, ins, 2, y), KILN_ERR_INVALID_ARG);
        free(ref);
        tt_free(x), tt_free(ix), tt_free(y);
    }
}

int main(void) {
    check_rng_seed();
    test_index_two();
    test_index_select_last();
    test_gather();
    return check_summary();
}
