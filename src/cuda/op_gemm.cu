// SPDX-License-Identifier: Apache-2.0
// Planning linear and matmul layers (gemm.h, cuda_plan.h). A linear goes, in order, to:
//  - the GEMV when it has at most 8 rows (and the policy allows it): no choice to time;
//  - the wgmma kernel or the K split when the policy forces a configuration (untimed);
//  - cuBLASLt when its operands share a dtype and K > 0 (the heuristic's algorithm, or with
//    tuning the fastest of its candidates, then the K split and the wgmma kernel timed against
//    it: gemm_tune.cu), else Kiln's tiled kernel.
// A matmul goes to cuBLASLt when it can take it (one dtype, K > 0, no general batch
// broadcasting), else to the tiled kernel. The key of a plan is the problem's sizes, dtypes,
// pointer alignments and fused epilogue: a new shape, or a caller's buffer of another alignment,
// is planned again (untimed) at execute.
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/gemm.h"

static const kiln_tensor *opt_in(const kiln_kernel_args *args, uint32_t i) {
    return i < args->n_in ? args->in[i] : NULL;
}

static kiln_status gemm_bad(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                            const char *what) {
    return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda %s: %s at %s", kiln_cuda_op_name(args->op),
                          what, ctx->where ? ctx->where : "?");
}

extern "C" kiln_status kiln_cuda_linear_geom_of(const kiln_cuda_ctx *ctx,
                                                const kiln_kernel_args *args,
                                                kiln_cuda_linear_geom *g) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *bias = opt_in(args, 2);
    kiln_tensor *y = args->out;
    if (x == NULL || w == NULL || w->rank != 2 || !kiln_cuda_is_float(x->dtype) ||
        !kiln_cuda_is_float(w->dtype) || !kiln_cuda_is_float(y->dtype) ||
        (bias != NULL && !kiln_cuda_is_float(bias->dtype))) {
        return gemm_bad(ctx, args, "needs float operands and a 2-D weight");
    }
    g->x = x;
    g->w = w;
    g->bias = bias;
    g->y = y;
    g->k = x->rank > 0 ? x->dims[x->rank - 1] : 1;
    g->n = y->rank > 0 ? y->dims[y->rank - 1] : 1;
    g->m = 1;
    for (uint32_t i = 0; i + 1 < y->rank; i++) g->m *= y->dims[i];
    if (w->dims[0] != g->n || w->dims[1] != g->k || (bias != NULL && kc_numel(bias) != g->n)) {
        return gemm_bad(ctx, args, "weight or bias shape does not match");
    }
    return KILN_OK;
}

// The fused epilogue as the strategies see it, in one number.
static int64_t epilogue_code(const kiln_kernel_args *args) {
    int epi = 0;
    const void *res = NULL;
    kiln_cuda_small_m_epilogue(args, &epi, &res);
    return (int64_t)epi | ((int64_t)kiln_cuda_tail_relu_first(args) << 4) |
           ((int64_t)kiln_cuda_tail_gelu_tanh_first(args) << 5) |
           ((int64_t)(kiln_cuda_tail_residual_first(args) != NULL) << 6) |
           (kiln_cuda_align_of(res) << 8);
}

static int64_t dtypes_of(const kiln_kernel_args *args) {
    int64_t d = args->out->dtype;
    for (uint32_t i = 0; i < args->n_in && i < 3; i++) {
        d |= (int64_t)(args->in[i] != NULL ? args->in[i]->dtype + 1 : 0) << (8 * (i + 1));
    }
    return d;
}

extern "C" void kiln_cuda_linear_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                     int64_t *key) {
    kiln_cuda_linear_geom g;
    memset(key, 0, KILN_CUDA_PLAN_KEY * sizeof *key);
    key[0] = KILN_OP_LINEAR;
    if (kiln_cuda_linear_geom_of(ctx, args, &g) != KILN_OK) {
        kiln_cuda_consume();
        key[0] = -1; // never current: planning reports the error
        return;
    }
    key[1] = g.m;
    key[2] = g.n;
    key[3] = g.k;
    key[4] = dtypes_of(args);
    key[5] = epilogue_code(args);
    key[6] = kiln_cuda_align_of(g.x->data);
    key[7] = kiln_cuda_align_of(g.w->data);
    key[8] = kiln_cuda_align_of(g.y->data);
    key[9] = kiln_cuda_align_of(g.bias != NULL ? g.bias->data : NULL);
    key[10] = ctx->l2_keep;
}

extern "C" void kiln_cuda_matmul_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                     int64_t *key) {
    const kiln_tensor *a = args->in[0], *b = args->in[1];
    kiln_cuda_strided v[2];
    memset(key, 0, KILN_CUDA_PLAN_KEY * sizeof *key);
    key[0] = KILN_OP_MATMUL;
    if (a == NULL || b == NULL) {
        key[0] = -1;
        return;
    }
    kiln_cuda_mm_operand(ctx, args, 0, &v[0]);
    kiln_cuda_mm_operand(ctx, args, 1, &v[1]);
    key[1] = (int64_t)a->rank | ((int64_t)b->rank << 8) | ((int64_t)args->out->rank << 16);
    for (uint32_t d = 0; d < KILN_MAX_RANK; d++) {
        key[2 + d] = d < a->rank ? a->dims[d] : 0;
        key[2 + KILN_MAX_RANK + d] = d < b->rank ? b->dims[d] : 0;
    }
    key[2 + 2 * KILN_MAX_RANK] = dtypes_of(args);
    key[3 + 2 * KILN_MAX_RANK] = epilogue_code(args);
    key[4 + 2 * KILN_MAX_RANK] = kiln_cuda_align_of(v[0].data);
    key[5 + 2 * KILN_MAX_RANK] = kiln_cuda_align_of(v[1].data);
    const kiln_cuda_strided *vy = ctx->sdpa_io[3];
    key[6 + 2 * KILN_MAX_RANK] = kiln_cuda_align_of(vy != NULL ? vy->data : args->out->data);
    // operands read and outputs written through the attention fold's views: their strides
    // (dense: 0)
    for (int j = 0; j < 2; j++) {
        if (ctx->sdpa_io[j] == NULL) continue;
        for (uint32_t d = 0; d < v[j].rank; d++) {
            key[7 + (2 + j) * KILN_MAX_RANK + d] = v[j].str[d];
        }
    }
    for (uint32_t d = 0; vy != NULL && d < vy->rank && d < KILN_MAX_RANK; d++) {
        key[7 + 4 * KILN_MAX_RANK + d] = vy->str[d];
    }
    if (ctx->mm_alpha != 1.0f && ctx->mm_alpha != 0.0f) { // a folded scale: its bits
        uint32_t bits;
        memcpy(&bits, &ctx->mm_alpha, sizeof bits);
        key[7 + 5 * KILN_MAX_RANK] = (int64_t)bits + 1;
    }
}

extern "C" kiln_status kiln_cuda_linear_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                             int tune, kiln_cuda_layer_plan *plan) {
    const kiln_cuda_policy *pol = ctx->policy;
    kiln_cuda_linear_geom g;
    kiln_cuda_wg_problem wp;
    cublasLtMatmulAlgo_t cands[KILN_CUDA_LT_CANDIDATES];
    size_t cand_ws[KILN_CUDA_LT_CANDIDATES];
    int n_cands = 0, epi = 0;
    const void *res = NULL;
    KILN_CUDA_TRY(kiln_cuda_linear_geom_of(ctx, args, &g));
    plan->gemm.us = plan->gemm.wg_alt_us = -1.0f;
    plan->gemm.lt.us = -1.0f;
    if (g.m == 0 || g.n == 0) {
        plan->kernel = KILN_CUDA_K_EMPTY;
        return KILN_OK;
    }
    kiln_cuda_small_m_epilogue(args, &epi, &res);
    plan->gemm.epi = epi;
    if (kiln_cuda_gemv_applies(ctx, &g)) {
        plan->kernel = KILN_CUDA_K_GEMV;
        plan->fused = epi != KILN_CUDA_WG_EPI_NONE || kiln_cuda_gemv_tail_act(args) != 0 ? 1 : 0;
        return KILN_OK;
    }
    const int wg = kiln_cuda_wg_problem_of(ctx, &g, args, &wp);
    if (wg && pol->wgmma_bn > 0) { // forced (cuda.wgmma_config)
        plan->kernel = KILN_CUDA_K_WGMMA;
        plan->gemm.wg.bn = pol->wgmma_bn;
        plan->gemm.wg.split = pol->wgmma_split;
        plan->gemm.wg.occ = pol->wgmma_occ;
        plan->gemm.forced = 1;
        plan->fused = wp.epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0;
        return KILN_OK;
    }
    if (pol->splitk > 0 && kiln_cuda_splitk_fits(ctx, &g, pol->splitk) &&
        kiln_cuda_splitk_setup(ctx, &g, pol->splitk, 1, cands, NULL, &n_cands,
                               &plan->gemm.lt)) { // forced (cuda.splitk)
        plan->kernel = KILN_CUDA_K_SPLITK;
        plan->gemm.splitk = pol->splitk;
        plan->gemm.forced = 1;
        plan->fused = epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0;
        return KILN_OK;
    }
    const int same = g.x->dtype == g.w->dtype && g.x->dtype == g.y->dtype &&
                     (g.bias == NULL || g.bias->dtype == g.y->dtype);
    plan->kernel = KILN_CUDA_K_TILED;
    plan->fused = 0;
    if (same && g.k > 0 && ctx->lt != NULL) {
        kiln_cuda_lt_problem p;
        kiln_cuda_lt_linear_problem(&g, args, &p);
        if (kiln_cuda_lt_setup(ctx, &p, tune ? KILN_CUDA_LT_CANDIDATES : 1, cands, cand_ws,
                               &n_cands, &plan->gemm.lt)) {
            plan->kernel = KILN_CUDA_K_CUBLASLT;
            plan->fused = p.relu || p.gelu || p.c != NULL ? 1 : 0;
        }
    }
    if (tune && ctx->choice != NULL) {
        plan->cached = kiln_cuda_linear_apply(ctx, args, &g, cands, cand_ws, n_cands, plan);
    } else if (tune) {
        kiln_cuda_linear_tune(ctx, args, &g, cands, cand_ws, n_cands, plan);
    }
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_matmul_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                             int tune, kiln_cuda_layer_plan *plan) {
    const kiln_tensor *a = args->in[0], *b = args->in[1];
    kiln_tensor *y = args->out;
    cublasLtMatmulAlgo_t cands[KILN_CUDA_LT_CANDIDATES];
    size_t cand_ws[KILN_CUDA_LT_CANDIDATES];
    int n_cands = 0;
    if (a == NULL || b == NULL || a->rank < 1 || b->rank < 1 || !kiln_cuda_is_float(a->dtype) ||
        !kiln_cuda_is_float(b->dtype) || !kiln_cuda_is_float(y->dtype)) {
        return gemm_bad(ctx, args, "needs float operands of rank >= 1");
    }
    int ar = (int)a->rank, br = (int)b->rank;
    if (b->dims[br >= 2 ? br - 2 : 0] != a->dims[ar - 1]) {
        return gemm_bad(ctx, args, "inner dims differ");
    }
    int64_t batch = 1;
    int nab = ar >= 2 ? ar - 2 : 0, nbb = br >= 2 ? br - 2 : 0, nb = nab > nbb ? nab : nbb;
    for (int d = 0; d < nb; d++) {
        int ia = d - (nb - nab), ib = d - (nb - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        batch *= (da == 0 || db == 0) ? 0 : da > db ? da : db;
    }
    const int64_t m = ar >= 2 ? a->dims[ar - 2] : 1, n = br >= 2 ? b->dims[br - 1] : 1;
    if (kc_numel(y) != batch * m * n) return gemm_bad(ctx, args, "output size does not match");
    plan->gemm.us = plan->gemm.wg_alt_us = -1.0f;
    plan->gemm.lt.us = -1.0f;
    if (batch * m * n == 0) {
        plan->kernel = KILN_CUDA_K_EMPTY;
        return KILN_OK;
    }
    plan->kernel = KILN_CUDA_K_TILED;
    plan->fused = 0;
    kiln_cuda_lt_problem p;
    if (ctx->lt != NULL && kiln_cuda_lt_matmul_problem(ctx, args, &p) &&
        kiln_cuda_lt_setup(ctx, &p, tune ? KILN_CUDA_LT_CANDIDATES : 1, cands, cand_ws, &n_cands,
                           &plan->gemm.lt)) {
        plan->kernel = KILN_CUDA_K_CUBLASLT;
        plan->fused = p.relu || p.c != NULL ? 1 : 0;
        if (tune && ctx->choice != NULL) {
            plan->cached = kiln_cuda_matmul_apply(ctx, cands, cand_ws, n_cands, plan);
        } else if (tune) {
            kiln_cuda_matmul_tune(ctx, args, cands, cand_ws, n_cands, plan);
        }
    }
    return KILN_OK;
}

extern "C" void kiln_cuda_gemm_describe(const kiln_cuda_layer_plan *plan, char *buf, size_t n) {
    const kiln_cuda_gemm_rec *g = &plan->gemm;
    char lt[192];
    switch (plan->kernel) {
    case KILN_CUDA_K_CUBLASLT:
        kiln_cuda_lt_describe(&g->lt, lt, sizeof lt);
        snprintf(buf, n, "%s%s%s%s", lt, g->why[0] ? "; " : "", g->why,
                 g->wg_alt_us >= 0.0f ? " (wgmma timed too)" : "");
        break;
    case KILN_CUDA_K_WGMMA:
        if (g->forced) {
            snprintf(buf, n,
                     "configuration %dx%d/%d (BN x K split / CTAs per SM), forced by "
                     "cuda.wgmma_config",
                     g->wg.bn, g->wg.split, g->wg.occ);
        } else {
            snprintf(buf, n, "configuration %dx%d/%d (BN x K split / CTAs per SM), %s (%.2f us)",
                     g->wg.bn, g->wg.split, g->wg.occ, g->why, (double)g->us);
        }
        break;
    case KILN_CUDA_K_SPLITK:
        if (g->forced) {
            snprintf(buf, n, "K over %d slices of a batched cuBLASLt GEMM, forced by cuda.splitk",
                     g->splitk);
        } else {
            snprintf(buf, n, "K over %d slices of a batched cuBLASLt GEMM (%.2f us)", g->splitk,
                     (double)g->us);
        }
        break;
    case KILN_CUDA_K_GEMV: snprintf(buf, n, "weight-streaming GEMV, epilogue %d", g->epi); break;
    case KILN_CUDA_K_TILED:
        snprintf(buf, n, "Kiln's tiled GEMM kernel (float32 accumulation)");
        break;
    default: snprintf(buf, n, "no elements"); break;
    }
}
