// SPDX-License-Identifier: Apache-2.0
// Runs a linear's or matmul's plan (gemm.h): the strategy the record names, with its algorithm
// or configuration, then the tail ops the kernel did not fuse. Nothing is decided here; a
// library that refuses what its plan set up (it should not: the plan queried it for these very
// sizes) sends the layer to Kiln's tiled kernel from then on, with a warning.
#include "cuda/gemm.h"

static kiln_status lt_refused(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                              kiln_cuda_layer_plan *plan, const kiln_cuda_lt_problem *p,
                              cublasStatus_t s) {
    kiln_cuda_log(KILN_LOG_WARN,
                  "cublasLtMatmul rejected m=%lld n=%lld k=%lld batch=%lld %s at %s: %s (%d); "
                  "using Kiln's GEMM kernel for this layer",
                  (long long)p->m, (long long)p->n, (long long)p->k, (long long)p->batch,
                  kiln_cuda_dtype_name(p->dtype), ctx->where ? ctx->where : "?",
                  cublasLtGetStatusString(s), (int)s);
    kiln_cuda_consume(); // rejected before any work was enqueued
    plan->kernel = KILN_CUDA_K_TILED;
    plan->fused = 0;
    plan->fell_back = 1;
    (void)args;
    return KILN_OK;
}

extern "C" int kiln_cuda_gemv_tail_act(const kiln_kernel_args *args) {
    if (args->n_tail == 0 || args->tail[0].operand != NULL) return KILN_CUDA_WG_EPI_NONE;
    switch (args->tail[0].op) {
    case KILN_OP_SILU: return KILN_CUDA_GEMV_ACT_SILU;
    case KILN_OP_SIGMOID: return KILN_CUDA_GEMV_ACT_SIGMOID;
    case KILN_OP_HARDSIGMOID: return KILN_CUDA_GEMV_ACT_HARDSIGMOID;
    case KILN_OP_HARDSWISH: return KILN_CUDA_GEMV_ACT_HARDSWISH;
    default: return KILN_CUDA_WG_EPI_NONE;
    }
}

static kiln_status linear_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                              kiln_cuda_layer_plan *plan) {
    kiln_cuda_linear_geom g;
    KILN_CUDA_TRY(kiln_cuda_linear_geom_of(ctx, args, &g));
    if ((ctx->gemv_x != NULL || ctx->gemv_up_w != NULL || ctx->gemv_n_sib > 0) &&
        plan->kernel != KILN_CUDA_K_GEMV) {
        // the folded norm's, the up projection's or the siblings' outputs would not be written
        // (cuda_fold.h)
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "%s: a linear with GEMV folds is not planned on the GEMV; set the "
                              "option cuda.gemv_fold to false",
                              ctx->where ? ctx->where : "?");
    }
    switch (plan->kernel) {
    case KILN_CUDA_K_EMPTY: return KILN_OK;
    case KILN_CUDA_K_GEMV: {
        int epi = 0;
        const void *res = NULL;
        if (ctx->gemv_up_w != NULL) { // a gated pair: the activation and the product are fused
            KILN_CUDA_TRY(kiln_cuda_gemv_run(ctx, &g, KILN_CUDA_WG_EPI_NONE, NULL));
            return kiln_cuda_tail(ctx, args, 2);
        }
        kiln_cuda_small_m_epilogue(args, &epi, &res);
        if (epi == KILN_CUDA_WG_EPI_NONE) epi = kiln_cuda_gemv_tail_act(args);
        KILN_CUDA_TRY(kiln_cuda_gemv_run(ctx, &g, epi, res));
        return kiln_cuda_tail(ctx, args, epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0);
    }
    case KILN_CUDA_K_WGMMA: {
        kiln_cuda_wg_problem p;
        if (!kiln_cuda_wg_problem_of(ctx, &g, args, &p)) break; // (the key rules it out)
        return kiln_cuda_wg_run(ctx, args, &p, plan->gemm.wg, &plan->gemm.maps);
    }
    case KILN_CUDA_K_SPLITK:
        return kiln_cuda_splitk_run(ctx, args, &g, plan->gemm.splitk, &plan->gemm.lt);
    case KILN_CUDA_K_CUBLASLT: {
        kiln_cuda_lt_problem p;
        kiln_cuda_lt_linear_problem(&g, args, &p);
        cublasStatus_t s = kiln_cuda_lt_exec(ctx, &p, &plan->gemm.lt, NULL);
        if (s == CUBLAS_STATUS_SUCCESS) {
            KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "cublasLtMatmul"));
            return kiln_cuda_tail(ctx, args, plan->fused);
        }
        KILN_CUDA_TRY(lt_refused(ctx, args, plan, &p, s));
        break;
    }
    default: break;
    }
    KILN_CUDA_TRY(kiln_cuda_tiled_linear(ctx, &g));
    return kiln_cuda_tail(ctx, args, 0);
}

static kiln_status matmul_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *in_args,
                              kiln_cuda_layer_plan *plan) {
    // an output the attention fold redirected (cuda_fold.h): the matmul writes the permute's
    // output through strides; its tail ops, unary there, run over those bytes
    kiln_kernel_args redirected;
    kiln_tensor dst;
    const kiln_kernel_args *args = in_args;
    if (ctx->sdpa_io[3] != NULL) {
        dst = *in_args->out;
        dst.data = ctx->sdpa_io[3]->data;
        redirected = *in_args;
        redirected.out = &dst;
        args = &redirected;
    }
    if (plan->kernel == KILN_CUDA_K_EMPTY) return kiln_cuda_tail(ctx, args, 0);
    if (plan->kernel == KILN_CUDA_K_CUBLASLT) {
        kiln_cuda_lt_problem p;
        if (kiln_cuda_lt_matmul_problem(ctx, args, &p)) {
            cublasStatus_t s = kiln_cuda_lt_exec(ctx, &p, &plan->gemm.lt, NULL);
            if (s == CUBLAS_STATUS_SUCCESS) {
                KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "cublasLtMatmul"));
                return kiln_cuda_tail(ctx, args, plan->fused);
            }
            KILN_CUDA_TRY(lt_refused(ctx, args, plan, &p, s));
        }
    }
    KILN_CUDA_TRY(kiln_cuda_tiled_matmul(ctx, args));
    return kiln_cuda_tail(ctx, args, 0);
}

extern "C" kiln_status kiln_cuda_gemm_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                          kiln_cuda_layer_plan *plan) {
    return args->op == KILN_OP_LINEAR ? linear_run(ctx, args, plan) : matmul_run(ctx, args, plan);
}
