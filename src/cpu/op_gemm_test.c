// SPDX-License-Identifier: Apache-2.0
// linear and matmul on the CPU backend: hand-computed cases, then random cases against naive
// double-precision loops on awkward shapes (size 0 and 1, odd sizes, sizes past the MC/KC/NC
// block sizes) for every float dtype, plus fused tails.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

// --- references

// y[m][n] = sum_k x[m][k] w[n][k] + b[n]
static double *ref_linear(const kiln_tensor *x, const kiln_tensor *w, const kiln_tensor *b,
                          int64_t m, int64_t n, int64_t k) {
    double *y = (double *)calloc((size_t)(m * n + 1), sizeof(double));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = b ? tt_get(b, j) : 0.0;
            for (int64_t p = 0; p < k; p++) acc += tt_get(x, i * k + p) * tt_get(w, j * k + p);
            y[i * n + j] = acc;
        }
    }
    return y;
}

// torch.matmul semantics written from the definition: out index -> (batch index, i, j).
static double *ref_matmul(const kiln_tensor *a, const kiln_tensor *b, const kiln_tensor *y) {
    int64_t n_out = tt_numel(y);
    double *r = (double *)calloc((size_t)n_out + 1, sizeof(double));
    int ar = (int)a->rank, br = (int)b->rank;
    int64_t k = a->dims[ar - 1];
    int64_t m = ar >= 2 ? a->dims[ar - 2] : 1, n = br >= 2 ? b->dims[br - 1] : 1;
    int nb = (int)y->rank - (ar >= 2) - (br >= 2);
    for (int64_t o = 0; o < n_out; o++) {
        int64_t rest = o, j = rest % n;
        rest /= n;
        int64_t i = rest % m;
        rest /= m;
        int64_t bidx[KILN_MAX_RANK];
        for (int d = nb - 1; d >= 0; d--) {
            bidx[d] = rest % y->dims[d];
            rest /= y->dims[d];
        }
        // a's offset: its batch dims right-aligned against the output's.
        int64_t aoff = 0, boff = 0, mul = m * k;
        for (int d = ar - 3; d >= 0; d--) {
            int64_t id = bidx[nb - (ar - 2) + d];
            aoff += (a->dims[d] == 1 ? 0 : id) * mul;
            mul *= a->dims[d];
        }
        mul = k * n;
        for (int d = br - 3; d >= 0; d--) {
            int64_t id = bidx[nb - (br - 2) + d];
            boff += (b->dims[d] == 1 ? 0 : id) * mul;
            mul *= b->dims[d];
        }
        double acc = 0.0;
        for (int64_t p = 0; p < k; p++) {
            acc += tt_get(a, aoff + i * k + p) * tt_get(b, boff + p * n + j);
        }
        r[o] = acc;
    }
    return r;
}

// --- hand-computed

static void test_hand(void) {
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 2, 2), *w = tt_new2(KILN_DTYPE_F32, 3, 2);
    kiln_tensor *b = tt_new1(KILN_DTYPE_F32, 3), *y = tt_new2(KILN_DTYPE_F32, 2, 3);
    tt_set_all(x, (const double[]){1, 2, 3, 4});
    tt_set_all(w, (const double[]){1, 0, 0, 1, 1, 1});
    tt_set_all(b, (const double[]){0.5, -1, 2});
    kiln_tensor *ins[3] = {x, w, b};
    CHECK_OK(trun(KILN_OP_LINEAR, NULL, ins, 3, y));
    tt_close(y, (const double[]){1.5, 1, 5, 3.5, 3, 9}, 0, 0, "linear hand");
    CHECK_OK(trun(KILN_OP_LINEAR, NULL, ins, 2, y)); // no bias
    tt_close(y, (const double[]){1, 2, 3, 3, 4, 7}, 0, 0, "linear hand, no bias");

    kiln_tensor *a = tt_new2(KILN_DTYPE_F32, 2, 3), *bb = tt_new2(KILN_DTYPE_F32, 3, 2);
    kiln_tensor *c = tt_new2(KILN_DTYPE_F32, 2, 2);
    tt_set_all(a, (const double[]){1, 2, 3, 4, 5, 6});
    tt_set_all(bb, (const double[]){7, 8, 9, 10, 11, 12});
    kiln_tensor *mins[2] = {a, bb};
    CHECK_OK(trun(KILN_OP_MATMUL, NULL, mins, 2, c));
    tt_close(c, (const double[]){58, 64, 139, 154}, 0, 0, "matmul hand");
    // 1-D x 1-D: a dot product into a rank-0 output.
    kiln_tensor *v1 = tt_new1(KILN_DTYPE_F32, 3), *v2 = tt_new1(KILN_DTYPE_F32, 3);
    kiln_tensor *dot = tt_new(KILN_DTYPE_F32, 0, NULL);
    tt_set_all(v1, (const double[]){1, 2, 3});
    tt_set_all(v2, (const double[]){4, -5, 6});
    kiln_tensor *dins[2] = {v1, v2};
    CHECK_OK(trun(KILN_OP_MATMUL, NULL, dins, 2, dot));
    tt_close(dot, (const double[]){12}, 0, 0, "matmul dot");
    tt_free(x), tt_free(w), tt_free(b), tt_free(y), tt_free(a), tt_free(bb), tt_free(c);
    tt_free(v1), tt_free(v2), tt_free(dot);
}

// --- random linear

static void test_linear_random(void) {
    static const int64_t shapes[][4] = {
        // lead0, m, n, k (lead0 > 0: x is [lead0, m, k])
        {0, 1, 1, 1}, {0, 3, 5, 7}, {0, 97, 17, 300}, {0, 5, 520, 9}, {0, 8, 8, 8}, {2, 3, 10, 33},
        {0, 0, 4, 3}, {0, 4, 3, 0}, {0, 1, 1000, 70}, {3, 1, 2, 257}, {0, 9, 0, 5}, {0, 200, 33, 2},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t lead = shapes[s][0], m = shapes[s][1], n = shapes[s][2], k = shapes[s][3];
        for (int di = 0; di < 3; di++) {
            uint32_t dt = tt_float_dtype(di);
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                kiln_tensor *x = lead ? tt_new3(dt, lead, m, k) : tt_new2(dt, m, k);
                kiln_tensor *y = lead ? tt_new3(dt, lead, m, n) : tt_new2(dt, m, n);
                kiln_tensor *w = tt_new2(dt, n, k), *b = tt_new1(dt, n);
                tt_rand(x, -1, 1);
                tt_rand(w, -1, 1);
                tt_rand(b, -1, 1);
                kiln_tensor *ins[3] = {x, w, b};
                CHECK_OK(trun(KILN_OP_LINEAR, NULL, ins, with_bias ? 3 : 2, y));
                int64_t mm = (lead ? lead : 1) * m;
                double *ref = ref_linear(x, w, with_bias ? b : NULL, mm, n, k);
                char what[96];
                snprintf(what, sizeof what, "linear m=%lld n=%lld k=%lld bias=%d", (long long)mm,
                         (long long)n, (long long)k, with_bias);
                tt_close(y, ref, 2e-6 * (double)(k + 1), tt_rtol(dt) + 1e-5, what);
                free(ref);
                tt_free(x), tt_free(y), tt_free(w), tt_free(b);
            }
        }
    }
}

// --- random matmul

typedef struct mm_case {
    uint32_t ar;
    int64_t ad[4];
    uint32_t br;
    int64_t bd[4];
    uint32_t yr;
    int64_t yd[4];
} mm_case;

static void test_matmul_random(void) {
    static const mm_case cases[] = {
        {1, {7}, 1, {7}, 0, {0}},
        {1, {5}, 2, {5, 3}, 1, {3}},
        {2, {4, 5}, 1, {5}, 1, {4}},
        {3, {2, 4, 5}, 1, {5}, 2, {2, 4}},
        {1, {5}, 3, {2, 5, 3}, 2, {2, 3}},
        {4, {2, 1, 4, 5}, 3, {3, 5, 6}, 4, {2, 3, 4, 6}},
        {2, {4, 5}, 3, {2, 5, 3}, 3, {2, 4, 3}},
        {4, {2, 3, 4, 5}, 2, {5, 6}, 4, {2, 3, 4, 6}},
        {3, {3, 1, 9}, 3, {1, 9, 1}, 3, {3, 1, 1}},
        {3, {2, 3, 0}, 3, {2, 0, 4}, 3, {2, 3, 4}},
        {3, {1, 100, 270}, 3, {2, 270, 13}, 3, {2, 100, 13}},
        {2, {3, 4}, 2, {4, 530}, 2, {3, 530}},
        {3, {0, 3, 4}, 2, {4, 5}, 3, {0, 3, 5}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const mm_case *mc = &cases[c];
        for (int di = 0; di < 3; di++) {
            uint32_t dt = tt_float_dtype(di);
            kiln_tensor *a = tt_new(dt, mc->ar, mc->ad), *b = tt_new(dt, mc->br, mc->bd);
            kiln_tensor *y = tt_new(dt, mc->yr, mc->yd);
            tt_rand(a, -1, 1);
            tt_rand(b, -1, 1);
            kiln_tensor *ins[2] = {a, b};
            CHECK_OK(trun(KILN_OP_MATMUL, NULL, ins, 2, y));
            double *ref = ref_matmul(a, b, y);
            char what[64];
            snprintf(what, sizeof what, "matmul case %zu", c);
            int64_t k = a->dims[a->rank - 1];
            tt_close(y, ref, 2e-6 * (double)(k + 1), tt_rtol(dt) + 1e-5, what);
            free(ref);
            tt_free(a), tt_free(b), tt_free(y);
        }
    }
}

// gather_matmul: y[b] = w[idx[b]] @ x[b] against a double loop, int32 and int64 indices (every
// matrix, repeats, negative ones), sizes past the block sizes; an index out of range fails
// execute, by name
static void test_gather_matmul(void) {
    static const int64_t cases[][5] = {{3, 4, 5, 6, 1}, {4, 33, 70, 9, 3}, {2, 130, 300, 5, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t e = cases[c][0], m = cases[c][1], k = cases[c][2], b = cases[c][3];
        const int64_t n = cases[c][4];
        for (int di = 0; di < 3; di++) {
            const uint32_t dt = tt_float_dtype(di);
            const uint32_t it = di == 1 ? KILN_DTYPE_I32 : KILN_DTYPE_I64;
            kiln_tensor *w = tt_new3(dt, e, m, k), *idx = tt_new1(it, b);
            kiln_tensor *x = tt_new3(dt, b, k, n), *y = tt_new3(dt, b, m, n);
            tt_rand(w, -1, 1);
            tt_rand(x, -1, 1);
            for (int64_t i = 0; i < b; i++) // some negative: from the end, as torch indexes
                tt_set(idx, i, (double)((i * 7 + 3) % e - (i % 3 == 0 ? e : 0)));
            kiln_tensor *ins[3] = {w, idx, x};
            CHECK_OK(trun(KILN_OP_GATHER_MATMUL, NULL, ins, 3, y));
            double *ref = (double *)calloc((size_t)(b * m * n), sizeof(double));
            for (int64_t bi = 0; bi < b; bi++) {
                const int64_t ix = (int64_t)tt_get(idx, bi), ei = ix < 0 ? ix + e : ix;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double acc = 0.0;
                        for (int64_t p = 0; p < k; p++)
                            acc +=
                                tt_get(w, (ei * m + i) * k + p) * tt_get(x, (bi * k + p) * n + j);
                        ref[(bi * m + i) * n + j] = acc;
                    }
            }
            char what[64];
            snprintf(what, sizeof what, "gather_matmul case %zu", c);
            tt_close(y, ref, 2e-6 * (double)(k + 1), tt_rtol(dt) + 1e-5, what);
            free(ref);
            if (di == 0 && c == 0) { // an expert index past E
                tt_set(idx, 2, (double)e);
                CHECK_STATUS(trun(KILN_OP_GATHER_MATMUL, NULL, ins, 3, y), KILN_ERR_INVALID_ARG);
                CHECK(strstr(kiln_last_error(), "out of range") != NULL);
            }
            tt_free(w), tt_free(idx), tt_free(x), tt_free(y);
        }
    }
}

// --- fused tails

static double tail_ref(uint32_t op, double y, double operand, int lhs) {
    double a = lhs ? y : operand, b = lhs ? operand : y;
    switch (op) {
    case KILN_OP_RELU: return y > 0 ? y : 0;
    case KILN_OP_ADD: return a + b;
    case KILN_OP_SUB: return a - b;
    case KILN_OP_MUL: return a * b;
    case KILN_OP_DIV: return a / b;
    case KILN_OP_TANH: return tanh(y);
    case KILN_OP_CLAMP: return y < -0.25 ? -0.25 : (y > 0.5 ? 0.5 : y);
    default: return NAN;
    }
}

static void test_tails(void) {
    int64_t m = 13, n = 21, k = 19;
    for (int di = 0; di < 3; di++) {
        uint32_t dt = tt_float_dtype(di);
        kiln_tensor *x = tt_new2(dt, m, k), *w = tt_new2(dt, n, k), *y = tt_new2(dt, m, n);
        kiln_tensor *row = tt_new1(dt, n), *col = tt_new2(dt, m, 1), *full = tt_new2(dt, m, n);
        kiln_tensor *den = tt_new1(KILN_DTYPE_F32, n); // an operand in another dtype
        tt_rand(x, -1, 1);
        tt_rand(w, -1, 1);
        tt_rand(row, -1, 1);
        tt_rand(col, -1, 1);
        tt_rand(full, -1, 1);
        tt_rand(den, 1, 2);
        tattrs clamp;
        tattrs_init(&clamp, KILN_OP_CLAMP);
        tattrs_float(&clamp, KILN_A_CLAMP_MIN, -0.25);
        tattrs_float(&clamp, KILN_A_CLAMP_MAX, 0.5);
        tattrs none;
        tattrs_init(&none, KILN_OP_RELU);
        kiln_tail_op tail[7] = {
            {KILN_OP_ADD, none.view, row, 1},     {KILN_OP_RELU, none.view, NULL, 1},
            {KILN_OP_SUB, none.view, col, 0},     {KILN_OP_MUL, none.view, full, 1},
            {KILN_OP_DIV, none.view, den, 1},     {KILN_OP_TANH, none.view, NULL, 1},
            {KILN_OP_CLAMP, clamp.view, NULL, 1},
        };
        kiln_tensor *ins[2] = {x, w};
        kiln_kernel_args args = targs(KILN_OP_LINEAR, NULL, ins, 2, y);
        args.tail = tail;
        args.n_tail = 7;
        CHECK(kiln_cpu_supports(&args));
        CHECK_OK(trun_args(&args));
        double *ref = ref_linear(x, w, NULL, m, n, k);
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double v = ref[i * n + j];
                v = tail_ref(KILN_OP_ADD, v, tt_get(row, j), 1);
                v = tail_ref(KILN_OP_RELU, v, 0, 1);
                v = tail_ref(KILN_OP_SUB, v, tt_get(col, i), 0);
                v = tail_ref(KILN_OP_MUL, v, tt_get(full, i * n + j), 1);
                v = tail_ref(KILN_OP_DIV, v, tt_get(den, j), 1);
                v = tail_ref(KILN_OP_TANH, v, 0, 1);
                v = tail_ref(KILN_OP_CLAMP, v, 0, 1);
                ref[i * n + j] = v;
            }
        }
        // Seven roundings in the 16-bit dtypes: allow a few ulps more.
        tt_close(y, ref, 1e-4 + 4 * tt_rtol(dt), 4 * tt_rtol(dt), "linear + tail");
        free(ref);

        // A tail with an operand that does not broadcast is rejected, not run.
        kiln_tensor *bad = tt_new1(dt, n + 1);
        kiln_tail_op bt = {KILN_OP_ADD, none.view, bad, 1};
        args.tail = &bt;
        args.n_tail = 1;
        CHECK(!kiln_cpu_supports(&args));
        CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
        tt_free(bad);

        // matmul carries a tail too.
        kiln_tensor *bm = tt_new2(dt, k, n);
        tt_rand(bm, -1, 1);
        kiln_tensor *mins[2] = {x, bm};
        kiln_tail_op t2 = {KILN_OP_ADD, none.view, row, 0};
        args = targs(KILN_OP_MATMUL, NULL, mins, 2, y);
        args.tail = &t2;
        args.n_tail = 1;
        CHECK_OK(trun_args(&args));
        ref = ref_matmul(x, bm, y);
        for (int64_t i = 0; i < m * n; i++) ref[i] += tt_get(row, i % n);
        tt_close(y, ref, 1e-4 + 2 * tt_rtol(dt), 2 * tt_rtol(dt), "matmul + add tail");
        free(ref);
        tt_free(bm);
        tt_free(x), tt_free(w), tt_free(y), tt_free(row), tt_free(col), tt_free(full);
        tt_free(den);
    }
}

// --- scratch too small is an error, never an overflow

static void test_scratch_short(void) {
    kiln_tensor *x = tt_new2(KILN_DTYPE_F32, 20, 30), *w = tt_new2(KILN_DTYPE_F32, 10, 30);
    kiln_tensor *y = tt_new2(KILN_DTYPE_F32, 20, 10);
    tt_rand(x, -1, 1);
    tt_rand(w, -1, 1);
    kiln_tensor *ins[2] = {x, w};
    kiln_kernel_args args = targs(KILN_OP_LINEAR, NULL, ins, 2, y);
    size_t need = kiln_cpu_scratch_nbytes(&args);
    CHECK(need > 0);
    unsigned char *buf = (unsigned char *)malloc(need);
    args.scratch = buf;
    args.scratch_nbytes = need / 2;
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_INTERNAL);
    CHECK(strstr(kiln_last_error(), "scratch") != NULL);
    args.scratch = NULL;
    args.scratch_nbytes = 0;
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_INTERNAL);
    free(buf);
    tt_free(x), tt_free(w), tt_free(y);
}

int main(void) {
    check_rng_seed();
    test_hand();
    test_linear_random();
    test_matmul_random();
    test_gather_matmul();
    test_tails();
    test_scratch_short();
    return check_summary();
}
