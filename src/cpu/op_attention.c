// SPDX-License-Identifier: Apache-2.0
// sdpa: scaled dot-product attention, torch.nn.functional.scaled_dot_product_attention.
//   q[..., L, E], k[..., S, E], v[..., S, Ev], mask? broadcastable to [..., L, S] -> [..., L, Ev]
// Per batch (batch dims broadcast): scores = q k^T * scale (GEMM), + float mask / bool mask
// (false = -inf) / causal mask (j > i masked: top-left aligned), row softmax, out = P v (GEMM).
// A row with every score masked gives zeros, like PyTorch's safe softmax.
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

typedef struct sdpa_shape {
    int64_t l, s, e, ev;
    int nb;
    int64_t bdims[KILN_MAX_RANK];
    int64_t qs[KILN_MAX_RANK], ks[KILN_MAX_RANK], vs[KILN_MAX_RANK], ms[KILN_MAX_RANK];
    int64_t mask_l, mask_s; // mask strides along L and S (0: broadcast)
} sdpa_shape;

// Strides of t broadcast (right-aligned) to `rank` dims; size-1 dims get 0.
static void bcast_strides(const kiln_tensor *t, int rank, int64_t *out) {
    int64_t ts[KILN_MAX_RANK];
    kiln_cpu_strides(t, ts);
    for (int d = 0; d < rank; d++) {
        int id = d - (rank - (int)t->rank);
        out[d] = (id < 0 || t->dims[id] == 1) ? 0 : ts[id];
    }
}

static kiln_status sdpa_analyze(const kiln_kernel_args *args, sdpa_shape *sh) {
    const kiln_tensor *q = args->in[0], *k = args->in[1], *v = args->in[2], *y = args->out;
    const kiln_tensor *mask = args->n_in > 3 ? args->in[3] : NULL;
    memset(sh, 0, sizeof *sh);
    KILN_CHECK(q->rank >= 2 && k->rank >= 2 && v->rank >= 2 && y->rank >= 2, KILN_ERR_INVALID_ARG,
               "cpu sdpa: q, k, v must have rank >= 2");
    sh->l = q->dims[q->rank - 2];
    sh->e = q->dims[q->rank - 1];
    sh->s = k->dims[k->rank - 2];
    sh->ev = v->dims[v->rank - 1];
    KILN_CHECK(k->dims[k->rank - 1] == sh->e && v->dims[v->rank - 2] == sh->s &&
                   y->dims[y->rank - 2] == sh->l && y->dims[y->rank - 1] == sh->ev,
               KILN_ERR_INVALID_ARG,
               "cpu sdpa: shapes disagree (q [.., %lld, %lld], k [.., %lld, %lld], v [.., %lld, "
               "%lld])",
               (long long)sh->l, (long long)sh->e, (long long)k->dims[k->rank - 2],
               (long long)k->dims[k->rank - 1], (long long)v->dims[v->rank - 2], (long long)sh->ev);
    sh->nb = (int)y->rank - 2;
    for (int d = 0; d < sh->nb; d++) sh->bdims[d] = y->dims[d];
    const kiln_tensor *qkv[3] = {q, k, v};
    int64_t *st[3] = {sh->qs, sh->ks, sh->vs};
    for (int i = 0; i < 3; i++) {
        KILN_CHECK(qkv[i]->rank <= y->rank, KILN_ERR_INVALID_ARG,
                   "cpu sdpa: input %d has a higher rank than the output", i);
        int64_t full[KILN_MAX_RANK];
        bcast_strides(qkv[i], (int)y->rank, full);
        for (int d = 0; d < sh->nb; d++) st[i][d] = full[d];
    }
    if (mask != NULL) {
        KILN_CHECK(mask->rank <= y->rank, KILN_ERR_INVALID_ARG,
                   "cpu sdpa: the mask has a higher rank than the output");
        int64_t full[KILN_MAX_RANK];
        kiln_tensor virt = *y; // [batch..., L, S]
        virt.dims[y->rank - 1] = sh->s;
        for (uint32_t d = 0; d < mask->rank; d++) {
            int64_t md = mask->dims[d], vd = virt.dims[y->rank - mask->rank + d];
            KILN_CHECK(md == 1 || md == vd, KILN_ERR_INVALID_ARG,
                       "cpu sdpa: mask dim %u (%lld) does not broadcast to %lld", d, (long long)md,
                       (long long)vd);
        }
        bcast_strides(mask, (int)y->rank, full);
        for (int d = 0; d < sh->nb; d++) sh->ms[d] = full[d];
        sh->mask_l = full[y->rank - 2];
        sh->mask_s = full[y->rank - 1];
    }
    return KILN_OK;
}

size_t kiln_cpu_sdpa_scratch(const kiln_kernel_args *args) {
    sdpa_shape sh;
    if (sdpa_analyze(args, &sh) != KILN_OK) return 0;
    size_t g1 = kiln_cpu_gemm_scratch_nbytes(sh.l, sh.s, sh.e);
    size_t g2 = kiln_cpu_gemm_scratch_nbytes(sh.l, sh.ev, sh.s);
    return KILN_CPU_SCRATCH_SLACK + kiln_cpu_f32_nbytes(sh.l * sh.s) + kiln_cpu_f32_nbytes(sh.s) +
           (g1 > g2 ? g1 : g2);
}

kiln_status kiln_cpu_sdpa(const kiln_kernel_args *args) {
    const kiln_tensor *q = args->in[0], *k = args->in[1], *v = args->in[2];
    const kiln_tensor *mask = args->n_in > 3 ? args->in[3] : NULL;
    kiln_tensor *y = args->out;
    sdpa_shape sh;
    KILN_TRY(sdpa_analyze(args, &sh));
    int64_t l = sh.l, s = sh.s, e = sh.e, ev = sh.ev;
    int causal = kiln_attrs_int(&args->attrs, KILN_A_SDPA_CAUSAL, 0) != 0;
    double scale_attr = kiln_attrs_float(&args->attrs, KILN_A_SDPA_SCALE, 0);
    float scale =
        isnan(scale_attr) ? (float)(1.0 / sqrt((double)(e > 0 ? e : 1))) : (float)scale_attr;
    int64_t batch = 1;
    for (int d = 0; d < sh.nb; d++) batch *= sh.bdims[d];
    if (batch == 0 || l == 0 || ev == 0) return KILN_OK;
    kiln_cpu_scratch sc;
    kiln_cpu_scratch_init(&sc, args);
    float *scores = kiln_cpu_scratch_f32(&sc, l * s, "sdpa scores");
    float *maskrow = kiln_cpu_scratch_f32(&sc, s, "sdpa mask row");
    if (scores == NULL || maskrow == NULL) return KILN_ERR_INTERNAL;
    size_t mark = sc.used;
    int64_t idx[KILN_MAX_RANK] = {0};
    for (int64_t b = 0; b < batch; b++) {
        int64_t qo = 0, ko = 0, vo = 0, mo = 0;
        for (int d = 0; d < sh.nb; d++) {
            qo += idx[d] * sh.qs[d];
            ko += idx[d] * sh.ks[d];
            vo += idx[d] * sh.vs[d];
            mo += idx[d] * sh.ms[d];
        }
        // scores[L, S] = scale * q k^T
        kiln_cpu_matrix qm = {q->data, q->dtype, qo, e, 1};
        kiln_cpu_matrix km = {k->data, k->dtype, ko, 1, e};
        kiln_cpu_store ss = {scores, KILN_DTYPE_F32, 0, s, scale, NULL, NULL};
        kiln_cpu_gemm g1 = {l,   s,
                            e,   kiln_cpu_pack_a_matrix,
                            &qm, kiln_cpu_pack_b_matrix,
                            &km, kiln_cpu_epilogue_store,
                            &ss};
        sc.used = mark;
        KILN_TRY(kiln_cpu_gemm_run(&g1, &sc));
        for (int64_t i = 0; i < l; i++) {
            float *row = scores + i * s;
            if (mask != NULL) {
                kiln_cpu_load_f32(mask->data, mask->dtype, mo + i * sh.mask_l, sh.mask_s, s,
                                  maskrow);
                if (mask->dtype == KILN_DTYPE_BOOL) {
                    for (int64_t j = 0; j < s; j++) {
                        if (maskrow[j] == 0.0f) row[j] = -INFINITY;
                    }
                } else {
                    for (int64_t j = 0; j < s; j++) row[j] += maskrow[j];
                }
            }
            if (causal) {
                for (int64_t j = i + 1; j < s; j++) row[j] = -INFINITY;
            }
            float mx = -INFINITY;
            for (int64_t j = 0; j < s; j++) {
                if (row[j] > mx || isnan(row[j])) mx = row[j];
            }
            if (mx == -INFINITY) { // every key masked
                for (int64_t j = 0; j < s; j++) row[j] = 0.0f;
                continue;
            }
            double sum = 0.0;
            for (int64_t j = 0; j < s; j++) {
                row[j] = expf(row[j] - mx);
                sum += row[j];
            }
            float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < s; j++) row[j] *= inv;
        }
        // out[L, Ev] = P v
        kiln_cpu_matrix pm = {scores, KILN_DTYPE_F32, 0, s, 1};
        kiln_cpu_matrix vm = {v->data, v->dtype, vo, ev, 1};
        kiln_cpu_store os = {y->data, y->dtype, b * l * ev, ev, 1.0f, NULL, NULL};
        kiln_cpu_gemm g2 = {l,   ev,
                            s,   kiln_cpu_pack_a_matrix,
                            &pm, kiln_cpu_pack_b_matrix,
                            &vm, kiln_cpu_epilogue_store,
                            &os};
        sc.used = mark;
        KILN_TRY(kiln_cpu_gemm_run(&g2, &sc));
        for (int d = sh.nb - 1; d >= 0; d--) {
            if (++idx[d] < sh.bdims[d]) break;
            idx[d] = 0;
        }
    }
    return KILN_OK;
}
