// SPDX-License-Identifier: Apache-2.0
// Elementwise ops on the CPU backend: unary math, clamp, copy, cast (every dtype pair), the
// broadcasting binary ops (float and integer), remainder / fmod / floor_divide, abs, sign, ceil,
// floor, round, trunc, maximum and minimum, where.
// Hand-computed cases, then random inputs against double-precision formulas on awkward shapes for
// every dtype.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static double ref_unary(uint32_t op, double x, int approx) {
    switch (op) {
    case KILN_OP_RELU: return x > 0 ? x : 0;
    case KILN_OP_GELU:
        if (approx) return 0.5 * x * (1 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
        return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case KILN_OP_SILU: return x / (1 + exp(-x));
    case KILN_OP_SIGMOID: return 1 / (1 + exp(-x));
    case KILN_OP_TANH: return tanh(x);
    case KILN_OP_HARDSWISH: return x * fmin(fmax(x + 3, 0), 6) / 6;
    case KILN_OP_HARDSIGMOID: return fmin(fmax(x + 3, 0), 6) / 6;
    case KILN_OP_NEG: return -x;
    case KILN_OP_SQRT: return sqrt(x);
    case KILN_OP_RSQRT: return 1 / sqrt(x);
    case KILN_OP_EXP: return exp(x);
    case KILN_OP_LOG: return log(x);
    case KILN_OP_LOG1P: return log1p(x);
    case KILN_OP_ERF: return erf(x);
    default: return x;
    }
}

static void test_hand(void) {
    kiln_tensor *x = tt_new1(KILN_DTYPE_F32, 5), *y = tt_new1(KILN_DTYPE_F32, 5);
    tt_set_all(x, (const double[]){-1, 0, 2, NAN, -0.5});
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_RELU, NULL, ins, 1, y));
    tt_close(y, (const double[]){0, 0, 2, NAN, 0}, 0, 0, "relu hand");
    tattrs a;
    tattrs_init(&a, KILN_OP_CLAMP); // both bounds NaN: identity
    CHECK_OK(trun(KILN_OP_CLAMP, &a, ins, 1, y));
    tt_close(y, (const double[]){-1, 0, 2, NAN, -0.5}, 0, 0, "clamp no bounds");
    tattrs_float(&a, KILN_A_CLAMP_MAX, 0.25); // max only
    CHECK_OK(trun(KILN_OP_CLAMP, &a, ins, 1, y));
    tt_close(y, (const double[]){-1, 0, 0.25, NAN, -0.5}, 0, 0, "clamp max only");
    tattrs_float(&a, KILN_A_CLAMP_MIN, -0.75);
    CHECK_OK(trun(KILN_OP_CLAMP, &a, ins, 1, y));
    tt_close(y, (const double[]){-0.75, 0, 0.25, NAN, -0.5}, 0, 0, "clamp both");
    tattrs_init(&a, KILN_OP_CLAMP); // min > max: everything becomes max (PyTorch)
    tattrs_float(&a, KILN_A_CLAMP_MIN, 1);
    tattrs_float(&a, KILN_A_CLAMP_MAX, 0);
    CHECK_OK(trun(KILN_OP_CLAMP, &a, ins, 1, y));
    tt_close(y, (const double[]){0, 0, 0, NAN, 0}, 0, 0, "clamp min > max");

    // cast: floats truncate toward zero into ints; anything non-zero is true.
    kiln_tensor *f = tt_new1(KILN_DTYPE_F32, 4), *i32 = tt_new1(KILN_DTYPE_I32, 4);
    kiln_tensor *bl = tt_new1(KILN_DTYPE_BOOL, 4);
    tt_set_all(f, (const double[]){1.5, -1.5, 0.5, -0.0});
    kiln_tensor *fin[1] = {f};
    tattrs ca;
    tattrs_init(&ca, KILN_OP_CAST);
    tattrs_int(&ca, KILN_A_CAST_DTYPE, KILN_DTYPE_I32);
    CHECK_OK(trun(KILN_OP_CAST, &ca, fin, 1, i32));
    tt_close(i32, (const double[]){1, -1, 0, 0}, 0, 0, "cast f32->i32");
    tattrs_int(&ca, KILN_A_CAST_DTYPE, KILN_DTYPE_BOOL);
    CHECK_OK(trun(KILN_OP_CAST, &ca, fin, 1, bl));
    tt_close(bl, (const double[]){1, 1, 1, 0}, 0, 0, "cast f32->bool");

    // Integer add stays exact past 2^53.
    kiln_tensor *ia = tt_new1(KILN_DTYPE_I64, 2), *ib = tt_new1(KILN_DTYPE_I64, 2);
    kiln_tensor *ic = tt_new1(KILN_DTYPE_I64, 2);
    ((int64_t *)ia->data)[0] = (INT64_C(1) << 60) + 1;
    ((int64_t *)ia->data)[1] = -7;
    ((int64_t *)ib->data)[0] = 2;
    ((int64_t *)ib->data)[1] = 3;
    kiln_tensor *iins[2] = {ia, ib};
    CHECK_OK(trun(KILN_OP_ADD, NULL, iins, 2, ic));
    CHECK(((int64_t *)ic->data)[0] == (INT64_C(1) << 60) + 3);
    CHECK(((int64_t *)ic->data)[1] == -4);
    CHECK_OK(trun(KILN_OP_MUL, NULL, iins, 2, ic));
    CHECK(((int64_t *)ic->data)[0] == (INT64_C(1) << 61) + 2);
    CHECK(((int64_t *)ic->data)[1] == -21);
    tt_free(x), tt_free(y), tt_free(f), tt_free(i32), tt_free(bl), tt_free(ia), tt_free(ib);
    tt_free(ic);
}

// remainder, fmod and floor_divide against values worked out by hand from PyTorch's rules
// (remainder takes the divisor's sign, fmod the dividend's, floor_divide rounds toward minus
// infinity), with the cases a C division traps on: a zero integer divisor gives 0 and
// INT64_MIN / -1 wraps.
static void test_divmod(void) {
    enum { N = 8 };
    static const int64_t ia[N] = {7, -7, 7, -7, 0, INT64_MIN, INT64_MIN, 5};
    static const int64_t ib[N] = {3, 3, -3, -3, -4, -1, 0, 0};
    static const int64_t rem[N] = {1, 2, -2, -1, 0, 0, 0, 0};
    static const int64_t fmd[N] = {1, -1, 1, -1, 0, 0, 0, 0};
    static const int64_t fdv[N] = {2, -3, -3, 2, 0, INT64_MIN, 0, 0};
    static const uint32_t ops[3] = {KILN_OP_REMAINDER, KILN_OP_FMOD, KILN_OP_FLOOR_DIVIDE};
    const int64_t *want[3] = {rem, fmd, fdv};
    kiln_tensor *a = tt_new1(KILN_DTYPE_I64, N), *b = tt_new1(KILN_DTYPE_I64, N);
    kiln_tensor *y = tt_new1(KILN_DTYPE_I64, N);
    memcpy(a->data, ia, sizeof ia);
    memcpy(b->data, ib, sizeof ib);
    kiln_tensor *ins[2] = {a, b};
    for (int o = 0; o < 3; o++) {
        CHECK_OK(trun(ops[o], NULL, ins, 2, y));
        for (int i = 0; i < N; i++) {
            CHECK_MSG(((int64_t *)y->data)[i] == want[o][i], "%s int64 element %d: %lld",
                      o == 0   ? "remainder"
                      : o == 1 ? "fmod"
                               : "floor_divide",
                      i, (long long)((int64_t *)y->data)[i]);
        }
    }
    // int32: the same rules, then narrowed
    kiln_tensor *a32 = tt_new1(KILN_DTYPE_I32, 4), *b32 = tt_new1(KILN_DTYPE_I32, 4);
    kiln_tensor *y32 = tt_new1(KILN_DTYPE_I32, 4);
    tt_set_all(a32, (const double[]){-9, 9, -1, 10});
    tt_set_all(b32, (const double[]){4, -4, 5, 0});
    kiln_tensor *ins32[2] = {a32, b32};
    CHECK_OK(trun(KILN_OP_REMAINDER, NULL, ins32, 2, y32));
    tt_close(y32, (const double[]){3, -3, 4, 0}, 0, 0, "remainder int32");
    CHECK_OK(trun(KILN_OP_FLOOR_DIVIDE, NULL, ins32, 2, y32));
    tt_close(y32, (const double[]){-3, -3, -1, 0}, 0, 0, "floor_divide int32");
    // float32: signs, an exact multiple, a zero divisor (NaN and infinities as PyTorch gives)
    kiln_tensor *fa = tt_new1(KILN_DTYPE_F32, 6), *fb = tt_new1(KILN_DTYPE_F32, 6);
    kiln_tensor *fy = tt_new1(KILN_DTYPE_F32, 6);
    tt_set_all(fa, (const double[]){5.5, -5.5, 5.5, -6, 1, -1});
    tt_set_all(fb, (const double[]){2, 2, -2, 3, 0, 0});
    kiln_tensor *fins[2] = {fa, fb};
    CHECK_OK(trun(KILN_OP_REMAINDER, NULL, fins, 2, fy));
    tt_close(fy, (const double[]){1.5, 0.5, -0.5, 0, NAN, NAN}, 0, 0, "remainder f32");
    CHECK_OK(trun(KILN_OP_FMOD, NULL, fins, 2, fy));
    tt_close(fy, (const double[]){1.5, -1.5, 1.5, 0, NAN, NAN}, 0, 0, "fmod f32");
    CHECK_OK(trun(KILN_OP_FLOOR_DIVIDE, NULL, fins, 2, fy));
    tt_close(fy, (const double[]){2, -3, -3, -2, INFINITY, -INFINITY}, 0, 0, "floor_divide f32");
    tt_free(a), tt_free(b), tt_free(y), tt_free(a32), tt_free(b32), tt_free(y32);
    tt_free(fa), tt_free(fb), tt_free(fy);
}

// abs, sign, the roundings, maximum and minimum: NaN propagates through maximum and minimum
// (PyTorch's rule, unlike fmaxf), abs of INT64_MIN wraps.
static void test_abs_sign_minmax(void) {
    kiln_tensor *a = tt_new1(KILN_DTYPE_F32, 4), *b = tt_new1(KILN_DTYPE_F32, 4);
    kiln_tensor *y = tt_new1(KILN_DTYPE_F32, 4);
    tt_set_all(a, (const double[]){-1.5, NAN, 2, -0.0});
    tt_set_all(b, (const double[]){1, 3, NAN, -4});
    kiln_tensor *ins[2] = {a, b};
    CHECK_OK(trun(KILN_OP_MAXIMUM, NULL, ins, 2, y));
    tt_close(y, (const double[]){1, NAN, NAN, 0}, 0, 0, "maximum f32");
    CHECK_OK(trun(KILN_OP_MINIMUM, NULL, ins, 2, y));
    tt_close(y, (const double[]){-1.5, NAN, NAN, -4}, 0, 0, "minimum f32");
    CHECK_OK(trun(KILN_OP_ABS, NULL, ins, 1, y));
    tt_close(y, (const double[]){1.5, NAN, 2, 0}, 0, 0, "abs f32");
    // sign (NaN and both zeros give 0) and the roundings (round: half to even)
    kiln_tensor *r = tt_new1(KILN_DTYPE_F32, 6), *ry = tt_new1(KILN_DTYPE_F32, 6);
    tt_set_all(r, (const double[]){2.5, -2.5, 1.5, -0.4, NAN, -0.0});
    kiln_tensor *rin[1] = {r};
    CHECK_OK(trun(KILN_OP_SIGN, NULL, rin, 1, ry));
    tt_close(ry, (const double[]){1, -1, 1, -1, 0, 0}, 0, 0, "sign f32");
    CHECK_OK(trun(KILN_OP_ROUND, NULL, rin, 1, ry));
    tt_close(ry, (const double[]){2, -2, 2, -0.0, NAN, -0.0}, 0, 0, "round f32");
    CHECK_OK(trun(KILN_OP_CEIL, NULL, rin, 1, ry));
    tt_close(ry, (const double[]){3, -2, 2, -0.0, NAN, -0.0}, 0, 0, "ceil f32");
    CHECK_OK(trun(KILN_OP_FLOOR, NULL, rin, 1, ry));
    tt_close(ry, (const double[]){2, -3, 1, -1, NAN, -0.0}, 0, 0, "floor f32");
    CHECK_OK(trun(KILN_OP_TRUNC, NULL, rin, 1, ry));
    tt_close(ry, (const double[]){2, -2, 1, -0.0, NAN, -0.0}, 0, 0, "trunc f32");
    tt_free(r), tt_free(ry);
    kiln_tensor *ia = tt_new1(KILN_DTYPE_I64, 3), *iy = tt_new1(KILN_DTYPE_I64, 3);
    ((int64_t *)ia->data)[0] = INT64_MIN;
    ((int64_t *)ia->data)[1] = -7;
    ((int64_t *)ia->data)[2] = 9;
    kiln_tensor *iins[1] = {ia};
    CHECK_OK(trun(KILN_OP_ABS, NULL, iins, 1, iy));
    CHECK(((int64_t *)iy->data)[0] == INT64_MIN && ((int64_t *)iy->data)[1] == 7 &&
          ((int64_t *)iy->data)[2] == 9);
    CHECK_OK(trun(KILN_OP_SIGN, NULL, iins, 1, iy));
    CHECK(((int64_t *)iy->data)[0] == -1 && ((int64_t *)iy->data)[1] == -1 &&
          ((int64_t *)iy->data)[2] == 1);
    CHECK_OK(trun(KILN_OP_CEIL, NULL, iins, 1, iy)); // ints: a copy
    CHECK(((int64_t *)iy->data)[0] == INT64_MIN && ((int64_t *)iy->data)[1] == -7);
    tt_free(a), tt_free(b), tt_free(y), tt_free(ia), tt_free(iy);
}

typedef struct shape {
    uint32_t rank;
    int64_t d[4];
} shape;

static void test_unary_random(void) {
    static const uint32_t ops[] = {
        KILN_OP_RELU,      KILN_OP_GELU,        KILN_OP_SILU, KILN_OP_SIGMOID, KILN_OP_TANH,
        KILN_OP_HARDSWISH, KILN_OP_HARDSIGMOID, KILN_OP_NEG,  KILN_OP_SQRT,    KILN_OP_RSQRT,
        KILN_OP_EXP,       KILN_OP_LOG,         KILN_OP_COPY, KILN_OP_LOG1P,   KILN_OP_ERF};
    static const shape shapes[] = {{1, {0}}, {1, {1}},        {0, {0}},
                                   {1, {7}}, {3, {3, 5, 17}}, {2, {2, 300}}};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (int approx = 0; approx < (ops[o] == KILN_OP_GELU ? 2 : 1); approx++) {
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                for (int di = 0; di < 3; di++) {
                    uint32_t dt = tt_float_dtype(di);
                    kiln_tensor *x = tt_new(dt, shapes[s].rank, shapes[s].d);
                    kiln_tensor *y = tt_new(dt, shapes[s].rank, shapes[s].d);
                    int positive = ops[o] == KILN_OP_SQRT || ops[o] == KILN_OP_RSQRT ||
                                   ops[o] == KILN_OP_LOG || ops[o] == KILN_OP_LOG1P;
                    tt_rand(x, positive ? 0.05 : -5, 5);
                    tattrs a;
                    tattrs_init(&a, ops[o]);
                    if (ops[o] == KILN_OP_GELU) tattrs_int(&a, KILN_A_GELU_APPROXIMATE, approx);
                    kiln_tensor *ins[1] = {x};
                    CHECK_OK(trun(ops[o], &a, ins, 1, y));
                    int64_t n = tt_numel(x);
                    double *ref = (double *)calloc((size_t)n + 1, sizeof(double));
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = ref_unary(ops[o], tt_get(x, i), approx);
                    char what[64];
                    snprintf(what, sizeof what, "%s (approx %d) shape %zu", kiln_op_name(ops[o]),
                             approx, s);
                    tt_close(y, ref, 1e-6, tt_rtol(dt) + 2e-6, what);
                    free(ref);
                    tt_free(x), tt_free(y);
                }
            }
        }
    }
}

static double ref_binary(uint32_t op, double a, double b) {
    switch (op) {
    case KILN_OP_ADD: return a + b;
    case KILN_OP_SUB: return a - b;
    case KILN_OP_MUL: return a * b;
    case KILN_OP_DIV: return a / b;
    case KILN_OP_POW: return pow(a, b);
    default: return NAN;
    }
}

// Offset of the element of t that broadcasts to flat output index o of shape y.
static int64_t bcast_index(const kiln_tensor *t, const kiln_tensor *y, int64_t o) {
    int64_t idx[KILN_MAX_RANK];
    for (int d = (int)y->rank - 1; d >= 0; d--) {
        idx[d] = o % y->dims[d];
        o /= y->dims[d];
    }
    int64_t off = 0;
    for (uint32_t d = 0; d < t->rank; d++) {
        int64_t i = idx[y->rank - t->rank + d];
        off = off * t->dims[d] + (t->dims[d] == 1 ? 0 : i);
    }
    return off;
}

static void test_binary_random(void) {
    static const uint32_t ops[] = {KILN_OP_ADD, KILN_OP_SUB, KILN_OP_MUL, KILN_OP_DIV, KILN_OP_POW};
    static const shape cases[][3] = {
        {{3, {3, 1, 5}}, {2, {4, 1}}, {3, {3, 4, 5}}},
        {{1, {1}}, {2, {2, 3}}, {2, {2, 3}}},
        {{2, {2, 3}}, {2, {2, 3}}, {2, {2, 3}}},
        {{2, {0, 3}}, {1, {3}}, {2, {0, 3}}},
        {{0, {0}}, {1, {4}}, {1, {4}}},
        {{4, {2, 1, 3, 1}}, {3, {5, 1, 1}}, {4, {2, 5, 3, 1}}},
        {{2, {7, 300}}, {2, {7, 1}}, {2, {7, 300}}},
    };
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            for (int di = 0; di < 3; di++) {
                uint32_t dt = tt_float_dtype(di);
                // The second operand is float32 in the 16-bit runs: mixed dtypes convert.
                uint32_t dt_b = di == 2 ? KILN_DTYPE_F32 : dt;
                kiln_tensor *a = tt_new(dt, cases[c][0].rank, cases[c][0].d);
                kiln_tensor *b = tt_new(dt_b, cases[c][1].rank, cases[c][1].d);
                kiln_tensor *y = tt_new(dt, cases[c][2].rank, cases[c][2].d);
                tt_rand(a, ops[o] == KILN_OP_POW ? 0.1 : -3, 3);
                tt_rand(b, ops[o] == KILN_OP_DIV ? 0.5 : -3, 3);
                kiln_tensor *ins[2] = {a, b};
                CHECK_OK(trun(ops[o], NULL, ins, 2, y));
                int64_t n = tt_numel(y);
                double *ref = (double *)calloc((size_t)n + 1, sizeof(double));
                for (int64_t i = 0; i < n; i++) {
                    ref[i] = ref_binary(ops[o], tt_get(a, bcast_index(a, y, i)),
                                        tt_get(b, bcast_index(b, y, i)));
                }
                char what[64];
                snprintf(what, sizeof what, "%s case %zu", kiln_op_name(ops[o]), c);
                tt_close(y, ref, 1e-6, tt_rtol(dt) + 2e-6, what);
                free(ref);
                tt_free(a), tt_free(b), tt_free(y);
            }
        }
    }
}

static void test_int_random(void) {
    static const uint32_t ops[] = {KILN_OP_ADD, KILN_OP_SUB, KILN_OP_MUL};
    static const uint32_t dts[] = {KILN_DTYPE_I32, KILN_DTYPE_I64};
    for (size_t o = 0; o < 3; o++) {
        for (int di = 0; di < 2; di++) {
            kiln_tensor *a = tt_new3(dts[di], 3, 1, 5), *b = tt_new2(dts[di], 4, 1);
            kiln_tensor *y = tt_new3(dts[di], 3, 4, 5);
            tt_rand(a, -1000, 1000);
            tt_rand(b, -1000, 1000);
            kiln_tensor *ins[2] = {a, b};
            CHECK_OK(trun(ops[o], NULL, ins, 2, y));
            double ref[60];
            for (int64_t i = 0; i < 60; i++) {
                ref[i] = ref_binary(ops[o], tt_get(a, bcast_index(a, y, i)),
                                    tt_get(b, bcast_index(b, y, i)));
            }
            tt_close(y, ref, 0, 0, kiln_op_name(ops[o]));
            tt_free(a), tt_free(b), tt_free(y);
        }
    }
    // neg and clamp on integers; clamp bounds round inward (min 2.5 -> 3, max 7.5 -> 7).
    kiln_tensor *x = tt_new1(KILN_DTYPE_I32, 5), *y = tt_new1(KILN_DTYPE_I32, 5);
    tt_set_all(x, (const double[]){1, 5, 9, -4, 3});
    kiln_tensor *ins[1] = {x};
    CHECK_OK(trun(KILN_OP_NEG, NULL, ins, 1, y));
    tt_close(y, (const double[]){-1, -5, -9, 4, -3}, 0, 0, "neg int32");
    tattrs a;
    tattrs_init(&a, KILN_OP_CLAMP);
    tattrs_float(&a, KILN_A_CLAMP_MIN, 2.5);
    tattrs_float(&a, KILN_A_CLAMP_MAX, 7.5);
    CHECK_OK(trun(KILN_OP_CLAMP, &a, ins, 1, y));
    tt_close(y, (const double[]){3, 5, 7, 3, 3}, 0, 0, "clamp int32");
    // An integer output from float inputs is refused (the builder inserts casts).
    kiln_tensor *f = tt_new1(KILN_DTYPE_F32, 5);
    tt_rand(f, -1, 1);
    kiln_tensor *mixed[2] = {f, x};
    CHECK_STATUS(trun(KILN_OP_ADD, NULL, mixed, 2, y), KILN_ERR_UNSUPPORTED);
    // div and pow are float-only.
    kiln_tensor *iins[2] = {x, x};
    CHECK_STATUS(trun(KILN_OP_DIV, NULL, iins, 2, y), KILN_ERR_UNSUPPORTED);
    tt_free(x), tt_free(y), tt_free(f);
}

static void test_where(void) {
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                   KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL};
    for (int di = 0; di < 6; di++) {
        kiln_tensor *c = tt_new2(KILN_DTYPE_BOOL, 4, 1), *a = tt_new3(dts[di], 2, 1, 6);
        kiln_tensor *b = tt_new1(dts[di], 6), *y = tt_new3(dts[di], 2, 4, 6);
        tt_rand(c, 0, 1);
        tt_rand(a, -100, 100);
        tt_rand(b, -100, 100);
        kiln_tensor *ins[3] = {c, a, b};
        CHECK_OK(trun(KILN_OP_WHERE, NULL, ins, 3, y));
        double ref[48];
        for (int64_t i = 0; i < 48; i++) {
            ref[i] = tt_get(c, bcast_index(c, y, i)) != 0 ? tt_get(a, bcast_index(a, y, i))
                                                          : tt_get(b, bcast_index(b, y, i));
        }
        tt_close(y, ref, 0, 0, "where");
        tt_free(c), tt_free(a), tt_free(b), tt_free(y);
    }
}

// Expected value of casting v (exactly representable in the source dtype) to dtype `to`.
static double ref_cast(double v, uint32_t from, uint32_t to) {
    if (to == KILN_DTYPE_BOOL) return v != 0;
    if (to == KILN_DTYPE_I32 || to == KILN_DTYPE_I64)
        return kiln_dtype_is_float(from) ? trunc(v) : v;
    (void)from;
    float f = (float)v; // round once to the destination's precision
    if (to == KILN_DTYPE_F16) return kiln_f16_to_f32(kiln_f32_to_f16(f));
    if (to == KILN_DTYPE_BF16) return kiln_bf16_to_f32(kiln_f32_to_bf16(f));
    return f;
}

static void test_cast_and_copy(void) {
    for (uint32_t from = KILN_DTYPE_F32; from < KILN_DTYPE_COUNT; from++) {
        for (uint32_t to = KILN_DTYPE_F32; to < KILN_DTYPE_COUNT; to++) {
            int64_t dims[3] = {3, 1, 37};
            kiln_tensor *x = tt_new(from, 3, dims), *y = tt_new(to, 3, dims);
            tt_rand(x, -100, 100);
            if (from == KILN_DTYPE_I64) ((int64_t *)x->data)[1] = (INT64_C(1) << 40) + 3;
            tattrs a;
            tattrs_init(&a, KILN_OP_CAST);
            tattrs_int(&a, KILN_A_CAST_DTYPE, to);
            kiln_tensor *ins[1] = {x};
            CHECK_OK(trun(KILN_OP_CAST, &a, ins, 1, y));
            double ref[111];
            for (int64_t i = 0; i < 111; i++) ref[i] = ref_cast(tt_get(x, i), from, to);
            if (from == KILN_DTYPE_I64 && to == KILN_DTYPE_I32) ref[1] = 3; // wraps
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", kiln_dtype_name((kiln_dtype)from),
                     kiln_dtype_name((kiln_dtype)to));
            tt_close(y, ref, 0, 0, what);
            if (from == to) { // copy is exact for every dtype
                kiln_tensor *z = tt_new(to, 3, dims);
                CHECK_OK(trun(KILN_OP_COPY, NULL, ins, 1, z));
                CHECK(memcmp(z->data, x->data, 111 * kiln_dtype_size((kiln_dtype)to)) == 0);
                tt_free(z);
            }
            tt_free(x), tt_free(y);
        }
    }
}

// cos and sin against libm in double, over several periods, every float dtype.
static void test_trig(void) {
    for (int d = 0; d < 3; d++) {
        for (int op = 0; op < 2; op++) {
            uint32_t dt = tt_float_dtype(d);
            kiln_tensor *x = tt_new2(dt, 5, 13), *y = tt_new2(dt, 5, 13);
            tt_rand(x, -20, 20);
            kiln_tensor *ins[1] = {x};
            CHECK_OK(trun(op ? KILN_OP_SIN : KILN_OP_COS, NULL, ins, 1, y));
            double ref[65];
            for (int i = 0; i < 65; i++) ref[i] = op ? sin(tt_get(x, i)) : cos(tt_get(x, i));
            tt_close(y, ref, 1e-6, tt_rtol(dt), op ? "sin" : "cos");
            tt_free(x), tt_free(y);
        }
    }
}

// rotary: x [2, 3, 4, 6] with cos/sin [2, 1, 4, 6] (broadcast over the heads), [6], or [4, 1]
// (broadcast along the last dim too), each of x's dtype or float32, against a double loop of
// q * cos + rotate_half(q) * sin with rotate_half(q) = cat(-q[.., 3:], q[.., :3]); interleaved,
// rotate_every_two(q): (-q[1], q[0], -q[3], q[2], ...).
static void test_rotary(void) {
    static const int64_t xd[4] = {2, 3, 4, 6};
    static const struct {
        uint32_t rank;
        int64_t d[4];
    } cshapes[] = {{4, {2, 1, 4, 6}}, {1, {6}}, {2, {4, 1}}};
    for (int pairs = 0; pairs < 2; pairs++)
        for (int di = 0; di < 3; di++) {
            for (size_t c = 0; c < sizeof cshapes / sizeof cshapes[0]; c++) {
                for (int f32 = 0; f32 < 2; f32++) {
                    uint32_t dt = tt_float_dtype(di), cdt = f32 ? KILN_DTYPE_F32 : dt;
                    kiln_tensor *x = tt_new(dt, 4, xd), *y = tt_new(dt, 4, xd);
                    kiln_tensor *co = tt_new(cdt, cshapes[c].rank, cshapes[c].d);
                    kiln_tensor *si = tt_new(cdt, cshapes[c].rank, cshapes[c].d);
                    tt_rand(x, -2, 2);
                    tt_rand(co, -1, 1);
                    tt_rand(si, -1, 1);
                    kiln_tensor *ins[3] = {x, co, si};
                    tattrs ra;
                    tattrs_init(&ra, KILN_OP_ROTARY);
                    tattrs_int(&ra, KILN_A_ROTARY_INTERLEAVED, pairs);
                    CHECK_OK(trun(KILN_OP_ROTARY, &ra, ins, 3, y));
                    double ref[144];
                    for (int64_t i = 0; i < 144; i++) {
                        int64_t l = (i / 6) % 4, b = i / 72, k = i % 6, ci;
                        switch (c) {
                        case 0: ci = (b * 4 + l) * 6 + k; break;
                        case 1: ci = k; break;
                        default: ci = l; break;
                        }
                        double rot = pairs   ? (k % 2 == 0 ? -tt_get(x, i + 1) : tt_get(x, i - 1))
                                     : k < 3 ? -tt_get(x, i + 3)
                                             : tt_get(x, i - 3);
                        ref[i] = tt_get(x, i) * tt_get(co, ci) + rot * tt_get(si, ci);
                    }
                    tt_close(y, ref, 1e-6, tt_rtol(dt) + 1e-6, "rotary");
                    tt_free(x), tt_free(y), tt_free(co), tt_free(si);
                }
            }
        }
    // cos that does not broadcast to x fails
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 2, 4), *y = tt_new2(KILN_DTYPE_F32, 2, 4);
    kiln_tensor *bad = tt_new2(KILN_DTYPE_F32, 3, 4);
    kiln_tensor *ins[3] = {x, bad, bad};
    CHECK(trun(KILN_OP_ROTARY, NULL, ins, 3, y) != KILN_OK);
    tt_free(x), tt_free(y), tt_free(bad);
}

int main(void) {
    check_rng_seed();
    test_rotary();
    test_trig();
    test_hand();
    test_divmod();
    test_abs_sign_minmax();
    test_unary_random();
    test_binary_random();
    test_int_random();
    test_where();
    test_cast_and_copy();
    return check_summary();
}
