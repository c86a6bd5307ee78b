// SPDX-License-Identifier: Apache-2.0
// sdpa on the CPU backend: a hand-computed case, then random cases against a naive
// per-query loop: bool and float masks of several ranks (broadcast), fully masked rows (zeros,
// as PyTorch), causal masks with L < S and L > S, explicit and default scale, broadcast batch
// dims, no batch dims, sizes past the GEMM block sizes, every float dtype.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

typedef struct tshape {
    uint32_t rank;
    int64_t d[4];
} tshape;

typedef struct acase {
    tshape q, k, v, mask, y;
    int mask_kind; // 0 none, 1 bool, 2 float
    int causal;
    double scale; // NaN: default
} acase;

// Offset of the batch part of t (dims before the last two, right-aligned against y's batch).
static int64_t batch_off(const kiln_tensor *t, const int64_t *bidx, int nb, int64_t tail) {
    int tb = (int)t->rank - 2;
    int64_t off = 0;
    for (int d = 0; d < tb; d++) {
        int64_t i = bidx[nb - tb + d];
        off = off * t->dims[d] + (t->dims[d] == 1 ? 0 : i);
    }
    return off * tail;
}

static double mask_at(const kiln_tensor *m, const int64_t *full_idx, int full_rank) {
    int64_t off = 0;
    for (uint32_t d = 0; d < m->rank; d++) {
        int64_t i = full_idx[full_rank - (int)m->rank + (int)d];
        off = off * m->dims[d] + (m->dims[d] == 1 ? 0 : i);
    }
    return tt_get(m, off);
}

static double *ref_sdpa(const acase *c, const kiln_tensor *q, const kiln_tensor *k,
                        const kiln_tensor *v, const kiln_tensor *m, const kiln_tensor *y) {
    int nb = (int)y->rank - 2;
    int64_t l = q->dims[q->rank - 2], e = q->dims[q->rank - 1], s = k->dims[k->rank - 2];
    int64_t ev = v->dims[v->rank - 1], batch = 1;
    for (int d = 0; d < nb; d++) batch *= y->dims[d];
    double scale = isnan(c->scale) ? 1 / sqrt((double)e) : c->scale;
    double *out = (double *)calloc((size_t)(batch * l * ev + 1), sizeof(double));
    double *p = (double *)calloc((size_t)s + 1, sizeof(double));
    for (int64_t b = 0; b < batch; b++) {
        int64_t bidx[KILN_MAX_RANK + 2], rest = b;
        for (int d = nb - 1; d >= 0; d--) {
            bidx[d] = rest % y->dims[d];
            rest /= y->dims[d];
        }
        int64_t qo = batch_off(q, bidx, nb, l * e), ko = batch_off(k, bidx, nb, s * e);
        int64_t vo = batch_off(v, bidx, nb, s * ev);
        for (int64_t i = 0; i < l; i++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < s; j++) {
                double dot = 0;
                for (int64_t t = 0; t < e; t++) {
                    dot += tt_get(q, qo + i * e + t) * tt_get(k, ko + j * e + t);
                }
                double sc = dot * scale;
                bidx[nb] = i;
                bidx[nb + 1] = j;
                if (m && c->mask_kind == 1 && mask_at(m, bidx, nb + 2) == 0) sc = -INFINITY;
                if (m && c->mask_kind == 2) sc += mask_at(m, bidx, nb + 2);
                if (c->causal && j > i) sc = -INFINITY;
                p[j] = sc;
                if (sc > mx) mx = sc;
            }
            double sum = 0;
            for (int64_t j = 0; j < s; j++) {
                p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx);
                sum += p[j];
            }
            for (int64_t t = 0; t < ev; t++) {
                double acc = 0;
                for (int64_t j = 0; j < s; j++) acc += p[j] * tt_get(v, vo + j * ev + t);
                out[(b * l + i) * ev + t] = sum > 0 ? acc / sum : 0;
            }
        }
    }
    free(p);
    return out;
}

static void test_hand(void) {
    // One query, two keys: scores [0, ln 3] with scale 1 -> weights [1/4, 3/4].
    kiln_tensor *q = tt_new2(KILN_DTYPE_F32, 1, 1), *k = tt_new2(KILN_DTYPE_F32, 2, 1);
    kiln_tensor *v = tt_new2(KILN_DTYPE_F32, 2, 2), *y = tt_new2(KILN_DTYPE_F32, 1, 2);
    tt_set_all(q, (const double[]){1});
    tt_set_all(k, (const double[]){0, log(3.0)});
    tt_set_all(v, (const double[]){4, 8, 0, -4});
    tattrs a;
    tattrs_init(&a, KILN_OP_SDPA);
    tattrs_float(&a, KILN_A_SDPA_SCALE, 1.0);
    kiln_tensor *ins[3] = {q, k, v};
    CHECK_OK(trun(KILN_OP_SDPA, &a, ins, 3, y));
    tt_close(y, (const double[]){1, -1}, 1e-6, 1e-6, "sdpa hand");
    tt_free(q), tt_free(k), tt_free(v), tt_free(y);
}

static void test_random(void) {
    static const acase cases[] = {
        {{4, {2, 3, 4, 5}},
         {4, {2, 3, 6, 5}},
         {4, {2, 3, 6, 7}},
         {0, {0}},
         {4, {2, 3, 4, 7}},
         0,
         0,
         NAN},
        {{3, {2, 4, 5}}, {3, {2, 6, 5}}, {3, {2, 6, 3}}, {2, {4, 6}}, {3, {2, 4, 3}}, 1, 0, NAN},
        {{4, {2, 3, 4, 5}},
         {4, {2, 3, 6, 5}},
         {4, {2, 3, 6, 5}},
         {4, {2, 1, 4, 6}},
         {4, {2, 3, 4, 5}},
         2,
         0,
         NAN},
        {{3, {1, 4, 8}}, {3, {1, 6, 8}}, {3, {1, 6, 8}}, {0, {0}}, {3, {1, 4, 8}}, 0, 1, NAN},
        {{3, {2, 6, 8}}, {3, {2, 4, 8}}, {3, {2, 4, 2}}, {0, {0}}, {3, {2, 6, 2}}, 0, 1, NAN},
        {{4, {2, 1, 4, 5}},
         {4, {1, 3, 6, 5}},
         {3, {3, 6, 5}},
         {0, {0}},
         {4, {2, 3, 4, 5}},
         0,
         0,
         0.3},
        {{2, {4, 5}}, {2, {6, 5}}, {2, {6, 3}}, {1, {6}}, {2, {4, 3}}, 1, 0, NAN},
        {{3, {1, 100, 64}},
         {3, {1, 130, 64}},
         {3, {1, 130, 20}},
         {3, {1, 100, 130}},
         {3, {1, 100, 20}},
         2,
         1,
         NAN},
        {{2, {3, 300}}, {2, {9, 300}}, {2, {9, 4}}, {0, {0}}, {2, {3, 4}}, 0, 0, 0.05},
        {{3, {2, 1, 4}}, {3, {2, 5, 4}}, {3, {2, 5, 4}}, {3, {2, 1, 5}}, {3, {2, 1, 4}}, 2, 0, NAN},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const acase *c = &cases[ci];
        for (int di = 0; di < 3; di++) {
            uint32_t dt = tt_float_dtype(di);
            kiln_tensor *q = tt_new(dt, c->q.rank, c->q.d), *k = tt_new(dt, c->k.rank, c->k.d);
            kiln_tensor *v = tt_new(dt, c->v.rank, c->v.d), *y = tt_new(dt, c->y.rank, c->y.d);
            kiln_tensor *m = NULL;
            tt_rand(q, -1, 1);
            tt_rand(k, -1, 1);
            tt_rand(v, -1, 1);
            if (c->mask_kind == 1) {
                m = tt_new(KILN_DTYPE_BOOL, c->mask.rank, c->mask.d);
                tt_rand(m, 0, 1);
                // Row 1 fully masked where the mask has an L dim; key 0 always kept elsewhere.
                int64_t s = c->mask.d[c->mask.rank - 1];
                for (int64_t i = 0; i < tt_numel(m); i++) {
                    int64_t row = c->mask.rank >= 2 ? (i / s) % c->mask.d[c->mask.rank - 2] : 0;
                    if (c->mask.rank >= 2 && row == 1)
                        tt_set(m, i, 0);
                    else if (i % s == 0)
                        tt_set(m, i, 1);
                }
            } else if (c->mask_kind == 2) {
                m = tt_new(dt, c->mask.rank, c->mask.d); // float mask in the data dtype
                tt_rand(m, -2, 2);
            }
            tattrs a;
            tattrs_init(&a, KILN_OP_SDPA);
            tattrs_int(&a, KILN_A_SDPA_CAUSAL, c->causal);
            if (!isnan(c->scale)) tattrs_float(&a, KILN_A_SDPA_SCALE, c->scale);
            kiln_tensor *ins[4] = {q, k, v, m};
            CHECK_OK(trun(KILN_OP_SDPA, &a, ins, m ? 4 : 3, y));
            double *ref = ref_sdpa(c, q, k, v, m, y);
            char what[64];
            snprintf(what, sizeof what, "sdpa case %zu", ci);
            int64_t e = q->dims[q->rank - 1];
            tt_close(y, ref, 1e-5 + 1e-6 * (double)e + tt_rtol(dt), 2 * tt_rtol(dt) + 1e-5, what);
            free(ref);
            tt_free(q), tt_free(k), tt_free(v), tt_free(y), tt_free(m);
        }
    }
}

int main(void) {
    check_rng_seed();
    test_hand();
    test_random();
    return check_summary();
}
