// SPDX-License-Identifier: Apache-2.0
// Planning sdpa layers (attn.h, cuda_plan.h). Kiln's own kernel for the layer's shapes first:
// float16/bfloat16 with E = Ev in {32, 64, 80, 128, 256} and aligned operands take the tensor-core
// kernels (attn_tc.cu), split-key for grids of up to one wave, pipelined otherwise, at a CTA size
// by occupancy; everything else the fp32-FMA kernels (attn_flash.cu). Then, without a mask or
// causality, cuDNN's fused SDPA where it takes the geometry: the heuristic's first engine
// configuration, or with tuning the fastest one, kept only when it beats Kiln's kernel
// (attn_tune.c). The policy's forced choices (cuda.tc_attention false, cuda.sdpa_rows,
// cuda.sdpa_split) keep Kiln's kernels.
#include <stdio.h>
#include <string.h>

#include "cuda/attn.h"
#include "cuda/attn_common.cuh"

static int64_t align_bits(const void *p) {
    return ((uintptr_t)p % 16 == 0) | (((uintptr_t)p % 4 == 0) << 1);
}

extern "C" void kiln_cuda_sdpa_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                   int64_t *key) {
    sdpa_params P;
    memset(key, 0, KILN_CUDA_PLAN_KEY * sizeof *key);
    key[0] = KILN_OP_SDPA;
    if (kiln_cuda_sdpa_params_of(ctx, args, &P) != KILN_OK) {
        kiln_cuda_consume();
        key[0] = -1; // never current: planning reports the error
        return;
    }
    union {
        float f;
        uint32_t u;
    } sc = {.f = P.scale};
    int64_t *k = key + 1;
    *k++ = (int64_t)args->out->dtype | ((int64_t)P.mask_dt << 8) | ((int64_t)P.causal << 16) |
           ((int64_t)P.nb << 20) | ((int64_t)(P.mask != NULL) << 28);
    *k++ = sc.u;
    *k++ = P.l;
    *k++ = P.s;
    *k++ = P.e;
    *k++ = P.ev;
    *k++ = align_bits(P.q) | (align_bits(P.k) << 2) | (align_bits(P.v) << 4) |
           (align_bits(P.out) << 6);
    *k++ = P.q_rs;
    *k++ = P.k_rs;
    *k++ = P.v_rs;
    *k++ = P.o_rs;
    *k++ = P.m_sl;
    *k++ = P.m_ss;
    for (int d = 0; d < P.nb && d < KC_MAX_RANK - 2; d++) { // 6 dims x 6 = 36 more
        *k++ = P.bdims[d];
        *k++ = P.q_bstr[d];
        *k++ = P.k_bstr[d];
        *k++ = P.v_bstr[d];
        *k++ = P.o_bstr[d];
        *k++ = P.m_bstr[d];
    }
}

extern "C" kiln_status kiln_cuda_sdpa_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                           int tune, kiln_cuda_layer_plan *plan) {
    sdpa_params P;
    const uint32_t dtype = args->out->dtype;
    KILN_CUDA_TRY(kiln_cuda_sdpa_params_of(ctx, args, &P));
    plan->sdpa.dnn = -1;
    plan->sdpa.dnn_us = plan->sdpa.own_us = -1.0f;
    if (P.batch * P.l * P.ev == 0) {
        plan->kernel = KILN_CUDA_K_EMPTY;
        return KILN_OK;
    }
    if (kiln_cuda_sdpa_tc_ok(ctx, &P, dtype)) {
        plan->sdpa.split = kiln_cuda_sdpa_split_warps(ctx, &P);
        plan->sdpa.rows = plan->sdpa.split > 0 ? 0 : kiln_cuda_sdpa_tc_rows(ctx, &P);
        plan->sdpa.own = plan->sdpa.split > 0 ? KILN_CUDA_K_SDPA_TC_SPLIT : KILN_CUDA_K_SDPA_TC;
        plan->sdpa.chunks =
            plan->sdpa.split > 0 ? kiln_cuda_sdpa_tc_chunks(ctx, &P, plan->sdpa.split) : 1;
    } else {
        plan->sdpa.own = P.e > 0 && P.e <= SDPA_MAX_HEAD && P.ev <= SDPA_MAX_HEAD
                             ? KILN_CUDA_K_SDPA_FLASH
                             : KILN_CUDA_K_SDPA_SIMPLE;
    }
    plan->kernel = plan->sdpa.own;
    kiln_cuda_attn_geom g;
    if (!kiln_cuda_sdpa_dnn_geom(ctx, args, &g)) return KILN_OK;
    if (tune && ctx->choice != NULL) {
        plan->cached = kiln_cuda_sdpa_apply(ctx, &g, plan);
        return KILN_OK;
    }
    if (tune) {
        kiln_cuda_sdpa_tune(ctx, args, &g, plan);
        return KILN_OK;
    }
    int n = 0;
    const int entry = kiln_cuda_dnn_sdpa_entry(ctx, ctx->sdpa_store, &g, &n);
    if (entry >= 0 && kiln_cuda_dnn_sdpa_use_first(ctx, ctx->sdpa_store, entry)) {
        plan->kernel = KILN_CUDA_K_CUDNN;
        plan->sdpa.dnn = entry;
    }
    return KILN_OK;
}

extern "C" void kiln_cuda_sdpa_describe(const kiln_cuda_layer_plan *plan, char *buf, size_t n) {
    const kiln_cuda_sdpa_rec *s = &plan->sdpa;
    char times[96] = "";
    if (s->dnn_us >= 0.0f) {
        snprintf(times, sizeof times, " (cuDNN %.2f us, Kiln's kernel %.2f us)", (double)s->dnn_us,
                 (double)s->own_us);
    }
    switch (plan->kernel) {
    case KILN_CUDA_K_CUDNN: snprintf(buf, n, "cuDNN fused SDPA%s", times); break;
    case KILN_CUDA_K_SDPA_TC:
        snprintf(buf, n, "tensor-core kernel, %d query rows per CTA%s", s->rows, times);
        break;
    case KILN_CUDA_K_SDPA_TC_SPLIT:
        if (s->chunks > 1) {
            snprintf(buf, n,
                     "tensor-core kernel, keys in %d chunks over CTAs, %d warps per 16-row "
                     "block%s",
                     s->chunks, s->split, times);
        } else {
            snprintf(buf, n, "tensor-core kernel, keys split over %d warps per 16-row block%s",
                     s->split, times);
        }
        break;
    case KILN_CUDA_K_SDPA_FLASH: snprintf(buf, n, "fp32-FMA flash kernel"); break;
    case KILN_CUDA_K_SDPA_SIMPLE:
        snprintf(buf, n, "fp32-FMA kernel, one block per query row");
        break;
    default: snprintf(buf, n, "no elements"); break;
    }
}

// Raises the dynamic shared-memory limit of the kernels (once per device, before any launch or
// graph capture: the plugin calls it when it starts using a device).
extern "C" kiln_status kiln_cuda_attention_init(void) {
    cudaError_t e = kiln_cuda_sdpa_fma_init();
    if (e == cudaSuccess) e = kiln_cuda_sdpa_tc_init();
    if (e != cudaSuccess) {
        kiln_cuda_consume(); // reported here: leave nothing pending
        return kiln_cuda_error(NULL, "cudaFuncSetAttribute (sdpa)", e);
    }
    return KILN_OK;
}
