// SPDX-License-Identifier: Apache-2.0
// embedding on the CPU backend: rows gathered for int32 and int64 indices of several shapes,
// every float dtype, and out-of-range indices (negative, == V, huge) refused with
// KILN_ERR_INVALID_ARG before anything is written.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static void test_gather(void) {
    static const int64_t idx_shapes[][3] = {{1, 5, 0}, {2, 2, 3}, {1, 1, 0}, {1, 0, 0}};
    static const uint32_t idx_ranks[] = {1, 2, 0, 1};
    for (int s = 0; s < 4; s++) {
        for (int di = 0; di < 3; di++) {
            for (int it = 0; it < 2; it++) {
                uint32_t dt = tt_float_dtype(di), ity = it ? KILN_DTYPE_I64 : KILN_DTYPE_I32;
                int64_t v = 11, d = 7;
                const int64_t *shp = idx_shapes[s] + 1; // [0] is unused padding
                kiln_tensor *w = tt_new2(dt, v, d), *ix = tt_new(ity, idx_ranks[s], shp);
                int64_t yd[3] = {0, 0, 0};
                for (uint32_t i = 0; i < idx_ranks[s]; i++) yd[i] = shp[i];
                yd[idx_ranks[s]] = d;
                kiln_tensor *y = tt_new(dt, idx_ranks[s] + 1, yd);
                tt_rand(w, -1, 1);
                tt_rand(ix, 0, (double)(v - 1));
                kiln_tensor *ins[2] = {w, ix};
                CHECK_OK(trun(KILN_OP_EMBEDDING, NULL, ins, 2, y));
                int64_t n = tt_numel(ix);
                double *ref = (double *)calloc((size_t)(n * d + 1), sizeof(double));
                for (int64_t i = 0; i < n; i++) {
                    int64_t row = (int64_t)tt_get(ix, i);
                    for (int64_t j = 0; j < d; j++) ref[i * d + j] = tt_get(w, row * d + j);
                }
                tt_close(y, ref, 0, 0, "embedding");
                free(ref);
                tt_free(w), tt_free(ix), tt_free(y);
            }
        }
    }
}

static void test_out_of_range(void) {
    static const int64_t bad[] = {-1, 5, INT64_C(1) << 40, INT64_MIN};
    for (int b = 0; b < 4; b++) {
        kiln_tensor *w = tt_new2(KILN_DTYPE_F32, 5, 3), *ix = tt_new1(KILN_DTYPE_I64, 3);
        kiln_tensor *y = tt_new2(KILN_DTYPE_F32, 3, 3);
        tt_rand(w, -1, 1);
        ((int64_t *)ix->data)[0] = 1;
        ((int64_t *)ix->data)[1] = bad[b];
        ((int64_t *)ix->data)[2] = 2;
        memset(y->data, 0x7F, 9 * sizeof(float));
        kiln_tensor *ins[2] = {w, ix};
        CHECK_STATUS(trun(KILN_OP_EMBEDDING, NULL, ins, 2, y), KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "out of range") != NULL);
        unsigned char untouched[9 * sizeof(float)];
        memset(untouched, 0x7F, sizeof untouched);
        CHECK(memcmp(y->data, untouched, sizeof untouched) == 0);
        tt_free(w), tt_free(ix), tt_free(y);
    }
    // int32 indices too.
    kiln_tensor *w = tt_new2(KILN_DTYPE_F16, 4, 2), *ix = tt_new1(KILN_DTYPE_I32, 1);
    kiln_tensor *y = tt_new2(KILN_DTYPE_F16, 1, 2);
    tt_rand(w, -1, 1);
    ((int32_t *)ix->data)[0] = 4;
    kiln_tensor *ins[2] = {w, ix};
    CHECK_STATUS(trun(KILN_OP_EMBEDDING, NULL, ins, 2, y), KILN_ERR_INVALID_ARG);
    // Float indices are not supported.
    kiln_tensor *fx = tt_new1(KILN_DTYPE_F32, 1);
    tt_rand(fx, 0, 1);
    kiln_tensor *fins[2] = {w, fx};
    CHECK_STATUS(trun(KILN_OP_EMBEDDING, NULL, fins, 2, y), KILN_ERR_UNSUPPORTED);
    tt_free(w), tt_free(ix), tt_free(y), tt_free(fx);
}

int main(void) {
    check_rng_seed();
    test_gather();
    test_out_of_range();
    return check_summary();
}
