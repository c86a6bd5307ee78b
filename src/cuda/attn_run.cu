// SPDX-License-Identifier: Apache-2.0
// Running an sdpa plan (attn.h): the layer's operands as kernel parameters (dense tensors, or
// the strided views of folded head split/merge layers: cuda_fold.h), cuDNN's view of them, and
// the kernel the plan names. Nothing is decided here; cuDNN declining a plan it accepted (it
// should not) sends the layer to Kiln's kernel the plan recorded.
#include <string.h>

#include "cuda/attn.h"
#include "cuda/attn_common.cuh"

// The kernel parameters of sdpa layer args; KILN_ERR_UNSUPPORTED / INVALID_ARG naming the layer
// when its operands are not an sdpa the kernels take.
kiln_status kiln_cuda_sdpa_params_of(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                     sdpa_params *out) {
    const kiln_tensor *q = args->in[0], *k = args->in[1], *v = args->in[2];
    const kiln_tensor *mask = args->n_in > 3 ? args->in[3] : NULL;
    const kiln_tensor *y = args->out;
    sdpa_params &P = *out;
    memset(&P, 0, sizeof P);
    if (q == NULL || k == NULL || v == NULL || q->rank < 2 || k->rank < 2 || v->rank < 2 ||
        y->rank < 2 || q->dtype != y->dtype || k->dtype != y->dtype || v->dtype != y->dtype ||
        !kiln_cuda_is_float(y->dtype) ||
        (mask != NULL && !(mask->dtype == KILN_DTYPE_BOOL || kiln_cuda_is_float(mask->dtype)))) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda sdpa: q, k, v and the output must share one float dtype, the "
                              "mask bool or float, ranks >= 2 at %s",
                              ctx->where ? ctx->where : "?");
    }
    P.l = q->dims[q->rank - 2];
    P.e = q->dims[q->rank - 1];
    P.s = k->dims[k->rank - 2];
    P.ev = v->dims[v->rank - 1];
    if (k->dims[k->rank - 1] != P.e || v->dims[v->rank - 2] != P.s || y->dims[y->rank - 2] != P.l ||
        y->dims[y->rank - 1] != P.ev) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda sdpa: q, k, v shapes disagree at %s",
                              ctx->where ? ctx->where : "?");
    }
    double scale = kiln_attrs_float(&args->attrs, KILN_A_SDPA_SCALE, 0);
    P.scale = isnan(scale) ? (float)(1.0 / sqrt((double)(P.e > 0 ? P.e : 1))) : (float)scale;
    P.causal = kiln_attrs_int(&args->attrs, KILN_A_SDPA_CAUSAL, 0) != 0;
    P.q = q->data;
    P.k = k->data;
    P.v = v->data;
    P.out = y->data;
    P.nb = (int)y->rank - 2;
    P.batch = 1;
    // q, k, v, out: dense, or folded strided views (cuda_fold.h: same logical dims)
    const kiln_tensor *bt[4] = {q, k, v, y};
    int64_t *bstr[4] = {P.q_bstr, P.k_bstr, P.v_bstr, P.o_bstr};
    int64_t *rstr[4] = {&P.q_rs, &P.k_rs, &P.v_rs, &P.o_rs};
    for (int i = 0; i < 4; i++) {
        const kiln_cuda_strided *sv = ctx->sdpa_io[i];
        int64_t st[KC_MAX_RANK];
        if (sv != NULL && (sv->rank != bt[i]->rank || sv->str[sv->rank - 1] != 1)) {
            return kiln_cuda_fail(KILN_ERR_INTERNAL,
                                  "cuda sdpa: a folded view of operand %d has rank %u or an "
                                  "innermost stride other than 1 at %s; set "
                                  "the option cuda.attention_fold to false",
                                  i, sv->rank, ctx->where ? ctx->where : "?");
        }
        if (sv != NULL) {
            memcpy(st, sv->str, sizeof(int64_t) * sv->rank);
            if (i == 0) P.q = sv->data;
            if (i == 1) P.k = sv->data;
            if (i == 2) P.v = sv->data;
            if (i == 3) P.out = sv->data;
        } else {
            kc_strides(bt[i], st);
        }
        int nbi = (int)bt[i]->rank - 2;
        *rstr[i] = st[bt[i]->rank - 2];
        for (int d = 0; d < P.nb; d++) {
            int id = d - (P.nb - nbi);
            bstr[i][d] = (id < 0 || (i < 3 && bt[i]->dims[id] == 1)) ? 0 : st[id];
        }
    }
    for (int d = 0; d < P.nb; d++) {
        P.bdims[d] = y->dims[d];
        P.batch *= y->dims[d];
    }
    if (mask != NULL) {
        // mask right-aligned against [batch.., L, S]
        int64_t st[KC_MAX_RANK];
        int full = P.nb + 2, mr = (int)mask->rank;
        kc_strides(mask, st);
        for (int d = 0; d < full; d++) {
            int id = d - (full - mr);
            int64_t s = (id < 0 || mask->dims[id] == 1) ? 0 : st[id];
            if (d < P.nb) {
                P.m_bstr[d] = s;
            } else if (d == P.nb) {
                P.m_sl = s;
            } else {
                P.m_ss = s;
            }
        }
        P.mask = mask->data;
        P.mask_dt = mask->dtype;
    }
    return KILN_OK;
}

// The batch dims as cuDNN's (B, H) for one operand: the last batch dim is H, the ones before it
// merge into B when their strides chain (size-1 dims skipped). 0 when not mappable: a stride of
// 0 on a dim larger than 1 (a broadcast operand) or strides that do not chain.
static int sdpa_dnn_bh(const sdpa_params *P, const int64_t *bstr, int64_t rows, int64_t rs,
                       int64_t *b_str, int64_t *h_str) {
    int64_t hs = rows * rs, hn = 1, expect = -1;
    if (P->nb >= 1) {
        hn = P->bdims[P->nb - 1];
        if (hn > 1 && bstr[P->nb - 1] == 0) return 0;
        if (hn > 1) hs = bstr[P->nb - 1];
    }
    int64_t bs = hn * hs;
    for (int d = P->nb - 2; d >= 0; d--) {
        const int64_t n = P->bdims[d], st = bstr[d];
        if (n == 1) continue;
        if (st == 0 || (expect >= 0 && st != expect)) return 0;
        if (expect < 0) bs = st; // the innermost merged dim sets B's stride
        expect = st * n;
    }
    *b_str = bs;
    *h_str = hs;
    return 1;
}

static int dnn_geom(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype,
                    kiln_cuda_attn_geom *g) {
    const kiln_cuda_policy *pol = ctx->policy;
    if (ctx->dnn == NULL || ctx->sdpa_store == NULL || !pol->cudnn_sdpa || !pol->tc_attention ||
        pol->sdpa_rows != 0 || pol->sdpa_split != 0)
        return 0; // a forced kernel choice (tests, debugging) keeps Kiln's kernels
    if (P->mask != NULL || P->causal || (dtype != KILN_DTYPE_F16 && dtype != KILN_DTYPE_BF16))
        return 0;
    if (P->e % 8 != 0 || P->ev % 8 != 0 || P->e > 256 || P->ev > 256) return 0;
    const void *ptr[4] = {P->q, P->k, P->v, P->out};
    const int64_t *bs[4] = {P->q_bstr, P->k_bstr, P->v_bstr, P->o_bstr};
    const int64_t rs[4] = {P->q_rs, P->k_rs, P->v_rs, P->o_rs};
    const int64_t rows[4] = {P->l, P->s, P->s, P->l};
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 4; i++) {
        if ((uintptr_t)ptr[i] % 16 != 0 || rs[i] % 8 != 0) return 0;
        if (!sdpa_dnn_bh(P, bs[i], rows[i], rs[i], &g->str[i][0], &g->str[i][1])) return 0;
        if (g->str[i][0] % 8 != 0 || g->str[i][1] % 8 != 0) return 0;
        g->str[i][2] = rs[i];
        g->str[i][3] = 1;
    }
    g->dtype = dtype;
    g->hq = P->nb >= 1 ? P->bdims[P->nb - 1] : 1;
    g->hk = g->hq; // k and v have the query's batch dims (the op's shape inference)
    g->b = g->hq > 0 ? P->batch / g->hq : 0;
    g->sq = P->l;
    g->skv = P->s;
    g->d = P->e;
    g->dv = P->ev;
    g->scale = P->scale;
    g->q = P->q;
    g->k = P->k;
    g->v = P->v;
    g->out = P->out;
    return g->b > 0 && g->sq > 0 && g->skv > 0;
}

extern "C" int kiln_cuda_sdpa_dnn_geom(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                       kiln_cuda_attn_geom *g) {
    sdpa_params P;
    if (kiln_cuda_sdpa_params_of(ctx, args, &P) != KILN_OK) {
        kiln_cuda_consume();
        return 0;
    }
    return dnn_geom(ctx, &P, args->out->dtype, g);
}

static kiln_status run_own(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype,
                           const kiln_cuda_layer_plan *plan) {
    switch (plan->kernel) {
    case KILN_CUDA_K_SDPA_TC_SPLIT:
        return kiln_cuda_sdpa_tc_run(ctx, P, dtype, plan->sdpa.split, 0);
    case KILN_CUDA_K_SDPA_TC: return kiln_cuda_sdpa_tc_run(ctx, P, dtype, 0, plan->sdpa.rows);
    default: return kiln_cuda_sdpa_fma(ctx, P, dtype);
    }
}

extern "C" kiln_status kiln_cuda_sdpa_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                          kiln_cuda_layer_plan *plan) {
    sdpa_params P;
    const uint32_t dtype = args->out->dtype;
    KILN_CUDA_TRY(kiln_cuda_sdpa_params_of(ctx, args, &P));
    if (plan->kernel == KILN_CUDA_K_EMPTY || P.batch * P.l * P.ev == 0) return KILN_OK;
    if (plan->kernel == KILN_CUDA_K_CUDNN) {
        kiln_cuda_attn_geom g;
        int done = 0;
        if (dnn_geom(ctx, &P, dtype, &g)) {
            KILN_CUDA_TRY(kiln_cuda_dnn_sdpa_run(ctx, ctx->sdpa_store, plan->sdpa.dnn, &g, &done));
        }
        if (done) return KILN_OK;
        plan->kernel = plan->sdpa.own; // declined (logged at DEBUG): Kiln's kernel from now on
        plan->fell_back = 1;
    }
    return run_own(ctx, &P, dtype, plan);
}
