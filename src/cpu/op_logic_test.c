// SPDX-License-Identifier: Apache-2.0
// Comparisons and bitwise ops on the CPU backend, against loop references: every comparison
// over float (NaN included), integer and bool inputs with broadcasting; bitwise and/or/xor/not
// on int32, int64 (negative values) and bool; unsupported dtype combinations refused.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static double cmp_ref(uint32_t op, double a, double b) {
    switch (op) {
    case KILN_OP_EQ: return a == b;
    case KILN_OP_NE: return a != b;
    case KILN_OP_LT: return a < b;
    case KILN_OP_LE: return a <= b;
    case KILN_OP_GT: return a > b;
    default: return a >= b;
    }
}

static void test_compare(void) {
    static const uint32_t ops[] = {KILN_OP_EQ, KILN_OP_NE, KILN_OP_LT,
                                   KILN_OP_LE, KILN_OP_GT, KILN_OP_GE};
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                   KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL};
    for (int o = 0; o < 6; o++) {
        for (int d = 0; d < 6; d++) {
            // a [3, 1, 5] against b [4, 1]: output [3, 4, 5]
            kiln_tensor *a = tt_new3(dts[d], 3, 1, 5), *b = tt_new2(dts[d], 4, 1);
            kiln_tensor *y = tt_new3(KILN_DTYPE_BOOL, 3, 4, 5);
            tt_rand(a, -2, 2); // small integers so that equality happens
            tt_rand(b, -2, 2);
            if (dts[d] < KILN_DTYPE_I32) {
                for (int64_t i = 0; i < 15; i++) tt_set(a, i, floor(tt_get(a, i)));
                for (int64_t i = 0; i < 4; i++) tt_set(b, i, floor(tt_get(b, i)));
                tt_set(a, 3, NAN);
            }
            kiln_tensor *ins[2] = {a, b};
            CHECK_OK(trun(ops[o], NULL, ins, 2, y));
            double ref[60];
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++)
                    for (int k = 0; k < 5; k++)
                        ref[(i * 4 + j) * 5 + k] =
                            cmp_ref(ops[o], tt_get(a, i * 5 + k), tt_get(b, j));
            tt_close(y, ref, 0, 0, kiln_op_name(ops[o]));
            tt_free(a), tt_free(b), tt_free(y);
        }
    }
    // int64 values beyond float precision compare exactly
    kiln_tensor *a = tt_new1(KILN_DTYPE_I64, 2), *b = tt_new1(KILN_DTYPE_I64, 2);
    kiln_tensor *y = tt_new1(KILN_DTYPE_BOOL, 2);
    ((int64_t *)a->data)[0] = (INT64_C(1) << 53) + 1;
    ((int64_t *)b->data)[0] = INT64_C(1) << 53;
    ((int64_t *)a->data)[1] = INT64_MIN;
    ((int64_t *)b->data)[1] = INT64_MIN;
    kiln_tensor *ins[2] = {a, b};
    CHECK_OK(trun(KILN_OP_GT, NULL, ins, 2, y));
    CHECK(((uint8_t *)y->data)[0] == 1 && ((uint8_t *)y->data)[1] == 0);
    tt_free(a), tt_free(b), tt_free(y);
}

static void test_bitwise(void) {
    static const uint32_t ops[] = {KILN_OP_BITWISE_AND, KILN_OP_BITWISE_OR, KILN_OP_BITWISE_XOR,
                                   KILN_OP_BITWISE_NOT};
    static const uint32_t dts[] = {KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL};
    for (int o = 0; o < 4; o++) {
        for (int d = 0; d < 3; d++) {
            int n_in = ops[o] == KILN_OP_BITWISE_NOT ? 1 : 2;
            kiln_tensor *a = tt_new2(dts[d], 2, 7), *b = tt_new1(dts[d], 7);
            kiln_tensor *y = tt_new2(dts[d], 2, 7);
            tt_rand(a, -100000, 100000);
            tt_rand(b, -100000, 100000);
            kiln_tensor *ins[2] = {a, b};
            CHECK_OK(trun(ops[o], NULL, ins, (uint32_t)n_in, y));
            double ref[14];
            for (int i = 0; i < 14; i++) {
                int64_t x = (int64_t)tt_get(a, i), z = (int64_t)tt_get(b, i % 7), r;
                switch (ops[o]) {
                case KILN_OP_BITWISE_AND: r = x & z; break;
                case KILN_OP_BITWISE_OR: r = x | z; break;
                case KILN_OP_BITWISE_XOR: r = x ^ z; break;
                default: r = ~x; break;
                }
                if (dts[d] == KILN_DTYPE_BOOL) r = ops[o] == KILN_OP_BITWISE_NOT ? !x : (r & 1);
                ref[i] = (double)r;
            }
            tt_close(y, ref, 0, 0, kiln_op_name(ops[o]));
            tt_free(a), tt_free(b), tt_free(y);
        }
    }
}

static void test_refused(void) {
    kiln_tensor *a = tt_new1(KILN_DTYPE_F32, 3), *b = tt_new1(KILN_DTYPE_F32, 3);
    kiln_tensor *yb = tt_new1(KILN_DTYPE_BOOL, 3), *yf = tt_new1(KILN_DTYPE_F32, 3);
    kiln_tensor *c = tt_new1(KILN_DTYPE_I64, 3), *w = tt_new1(KILN_DTYPE_F32, 4);
    kiln_tensor *ins[2] = {a, b};
    CHECK_STATUS(trun(KILN_OP_BITWISE_AND, NULL, ins, 2, yf), KILN_ERR_UNSUPPORTED);
    CHECK_STATUS(trun(KILN_OP_EQ, NULL, ins, 2, yf), KILN_ERR_UNSUPPORTED); // not bool out
    ins[1] = c;
    CHECK_STATUS(trun(KILN_OP_EQ, NULL, ins, 2, yb), KILN_ERR_UNSUPPORTED); // mixed dtypes
    ins[1] = w;
    CHECK_STATUS(trun(KILN_OP_LT, NULL, ins, 2, yb), KILN_ERR_UNSUPPORTED); // no broadcast
    CHECK(strstr(kiln_last_error(), "broadcast") != NULL);
    tt_free(a), tt_free(b), tt_free(yb), tt_free(yf), tt_free(c), tt_free(w);
}

int main(void) {
    check_rng_seed();
    test_compare();
    test_bitwise();
    test_refused();
    return check_summary();
}
