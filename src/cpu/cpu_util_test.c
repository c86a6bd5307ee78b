// SPDX-License-Identifier: Apache-2.0
// The CPU backend's shared machinery: the fast float16 conversions against the core's reference
// converters (every half value; every rounding boundary between neighbouring halves; a sweep of
// float bit patterns), saturating float->int, row loads/stores for every dtype, the broadcasting
// iterator (against a naive offset computation) and the scratch carver.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_f16(void) {
    int64_t bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (bits_of(kiln_cpu_f16_to_f32((uint16_t)h)) != bits_of(kiln_f16_to_f32((uint16_t)h)))
            bad++;
    }
    CHECK_MSG(bad == 0, "%lld half values convert differently", (long long)bad);
    // Around every half value and every midpoint between neighbours (the rounding ties).
    bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (uint32_t s = 0; s < 2; s++) {
            uint16_t hh = (uint16_t)(h | (s << 15));
            float a = kiln_f16_to_f32(hh), b = kiln_f16_to_f32((uint16_t)(hh + 1));
            float mid = (a + b) / 2; // exact in float32
            float probes[6] = {a,
                               mid,
                               float_of(bits_of(mid) + 1),
                               float_of(bits_of(mid) - 1),
                               float_of(bits_of(a) + 1),
                               b};
            for (int i = 0; i < 6; i++) {
                if (kiln_cpu_f32_to_f16(probes[i]) != kiln_f32_to_f16(probes[i])) bad++;
            }
        }
    }
    // A sweep over float bit patterns (NaNs, infinities, huge and tiny values included).
    for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += 4093) {
        float f = float_of((uint32_t)u);
        if (kiln_cpu_f32_to_f16(f) != kiln_f32_to_f16(f)) bad++;
    }
    CHECK_MSG(bad == 0, "%lld floats convert to half differently", (long long)bad);
    CHECK(kiln_cpu_f32_to_f16(65520.0f) == 0x7c00);  // rounds to infinity
    CHECK(kiln_cpu_f32_to_f16(65519.99f) == 0x7bff); // largest half
    CHECK(kiln_cpu_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK((kiln_cpu_f32_to_f16(NAN) & 0x7fff) == 0x7e00);
}

static void test_int_conversion(void) {
    CHECK(kiln_cpu_f32_to_i64(NAN) == 0);
    CHECK(kiln_cpu_f32_to_i64(1e30f) == INT64_MAX);
    CHECK(kiln_cpu_f32_to_i64(-1e30f) == INT64_MIN);
    CHECK(kiln_cpu_f32_to_i64(-2.9f) == -2);
    float big[3] = {3e9f, -3e9f, NAN};
    int32_t out[3];
    kiln_cpu_store_f32(out, KILN_DTYPE_I32, 0, 3, big);
    CHECK(out[0] == INT32_MAX && out[1] == INT32_MIN && out[2] == 0);
}

static void test_rows(void) {
    static const uint32_t dts[6] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                    KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL};
    for (int d = 0; d < 6; d++) {
        kiln_tensor *t = tt_new1(dts[d], 20);
        tt_rand(t, -9, 9);
        float f[7];
        int64_t i64[7];
        kiln_cpu_load_f32(t->data, t->dtype, 3, 2, 7, f); // elements 3, 5, ..., 15
        kiln_cpu_load_i64(t->data, t->dtype, 3, 2, 7, i64);
        int ok = 1;
        for (int i = 0; i < 7; i++) {
            double want = tt_get(t, 3 + 2 * i);
            ok &= f[i] == (float)want;
            ok &= i64[i] == (int64_t)want; // floats truncate toward zero
        }
        kiln_cpu_load_f32(t->data, t->dtype, 4, 0, 3, f); // stride 0 broadcasts
        ok &= f[0] == (float)tt_get(t, 4) && f[2] == f[0];
        kiln_tensor *u = tt_new1(dts[d], 7);
        kiln_cpu_store_f32(u->data, u->dtype, 0, 7, (const float[]){1, -2, 3, 0, 5, -6, 7});
        static const double vals[7] = {1, -2, 3, 0, 5, -6, 7};
        for (int i = 0; i < 7; i++) {
            ok &= tt_get(u, i) == (dts[d] == KILN_DTYPE_BOOL ? (vals[i] != 0) : vals[i]);
        }
        CHECK_MSG(ok, "row load/store %s", kiln_dtype_name((kiln_dtype)dts[d]));
        tt_free(t), tt_free(u);
    }
}

typedef struct visit {
    int64_t n_rows, n_elems;
    int64_t offs[64][3];
    const kiln_tensor *out, *a, *b;
    int bad;
} visit;

static int64_t naive_off(const kiln_tensor *t, const kiln_tensor *y, int64_t o) {
    int64_t idx[KILN_MAX_RANK], off = 0;
    for (int d = (int)y->rank - 1; d >= 0; d--) {
        idx[d] = o % y->dims[d];
        o /= y->dims[d];
    }
    for (uint32_t d = 0; d < t->rank; d++) {
        off = off * t->dims[d] + (t->dims[d] == 1 ? 0 : idx[y->rank - t->rank + d]);
    }
    return off;
}

static void row_visit(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    visit *v = (visit *)vctx;
    for (int64_t i = 0; i < n; i++) {
        int64_t o = offs[0] + i * inner[0];
        if (o != v->n_elems) v->bad = 1; // rows come in output order
        if (offs[1] + i * inner[1] != naive_off(v->a, v->out, o)) v->bad = 1;
        if (offs[2] + i * inner[2] != naive_off(v->b, v->out, o)) v->bad = 1;
        v->n_elems++;
    }
    v->n_rows++;
}

static void test_iter(void) {
    static const int64_t shapes[][3][4] = {
        {{2, 3, 4, 5}, {2, 3, 4, 5}, {1, 1, 1, 5}},
        {{2, 3, 4, 5}, {1, 3, 1, 5}, {2, 1, 4, 1}},
        {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}},
        {{3, 1, 4, 1}, {1, 1, 4, 1}, {3, 1, 1, 1}},
    };
    for (int s = 0; s < 4; s++) {
        kiln_tensor *y = tt_new(KILN_DTYPE_F32, 4, shapes[s][0]);
        kiln_tensor *a = tt_new(KILN_DTYPE_F32, 4, shapes[s][1]);
        kiln_tensor *b = tt_new(KILN_DTYPE_F32, 3, shapes[s][2] + 1); // rank 3: right-aligned
        const kiln_tensor *ins[2] = {a, b};
        kiln_cpu_iter it;
        kiln_cpu_iter_init(&it, y, ins, 2);
        visit v;
        memset(&v, 0, sizeof v);
        v.out = y, v.a = a, v.b = b;
        kiln_cpu_iter_run(&it, row_visit, &v);
        CHECK_MSG(!v.bad && v.n_elems == tt_numel(y), "iterator case %d", s);
        if (s == 0) CHECK_EQ_INT(it.rank, 2); // [24, 5]: the leading dims coalesce
        tt_free(y), tt_free(a), tt_free(b);
    }
    // A zero-size output visits nothing.
    kiln_tensor *y = tt_new2(KILN_DTYPE_F32, 3, 0);
    kiln_cpu_iter it;
    kiln_cpu_iter_init(&it, y, NULL, 0);
    visit v;
    memset(&v, 0, sizeof v);
    kiln_cpu_iter_run(&it, row_visit, &v);
    CHECK_EQ_INT(v.n_rows, 0);
    tt_free(y);
}

static void test_scratch(void) {
    unsigned char buf[300];
    kiln_kernel_args args;
    memset(&args, 0, sizeof args);
    args.scratch = buf + 3; // misaligned on purpose
    args.scratch_nbytes = sizeof buf - 3;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, &args);
    float *a = kiln_cpu_scratch_f32(&s, 10, "a");
    float *b = kiln_cpu_scratch_f32(&s, 10, "b");
    CHECK(a != NULL && b != NULL && ((uintptr_t)a % KILN_CPU_ALIGN) == 0 && b >= a + 10);
    CHECK(kiln_cpu_scratch_f32(&s, 0, "empty") != NULL); // takes nothing
    CHECK(kiln_cpu_scratch_f32(&s, 1000, "too big") == NULL);
    CHECK(strstr(kiln_last_error(), "too big") != NULL);
    args.scratch = NULL;
    kiln_cpu_scratch_init(&s, &args);
    CHECK(kiln_cpu_scratch_f32(&s, 1, "none") == NULL);
}

int main(void) {
    check_rng_seed();
    test_f16();
    test_int_conversion();
    test_rows();
    test_iter();
    test_scratch();
    return check_summary();
}
