// SPDX-License-Identifier: Apache-2.0
// linear and matmul through cuBLASLt (gemm.h): float32 compute (CUBLAS_COMPUTE_32F: no TF32) for
// float32, float16 and bfloat16 operands of one dtype; the set-up of one problem (descriptors and
// the heuristic's algorithms) is a plan, made once per problem; running it is one
// cublasLtMatmul. Also the fused-epilogue helpers every GEMM strategy shares.
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/gemm.h"

// --- the fused epilogue

int kiln_cuda_tail_relu_first(const kiln_kernel_args *args) {
    return args->n_tail > 0 && args->tail[0].op == KILN_OP_RELU;
}

int kiln_cuda_tail_gelu_tanh_first(const kiln_kernel_args *args) {
    return args->n_tail > 0 && args->tail[0].op == KILN_OP_GELU &&
           kiln_attrs_int(&args->tail[0].attrs, KILN_A_GELU_APPROXIMATE, 0) == 1;
}

const void *kiln_cuda_tail_residual_first(const kiln_kernel_args *args) {
    const kiln_tensor *y = args->out, *r;
    if (args->n_tail == 0 || args->tail[0].op != KILN_OP_ADD) return NULL;
    r = args->tail[0].operand;
    if (r == NULL || r->data == NULL || r->data == y->data || r->dtype != y->dtype ||
        r->rank != y->rank || memcmp(r->dims, y->dims, y->rank * sizeof(int64_t)) != 0) {
        return NULL;
    }
    return r->data;
}

void kiln_cuda_small_m_epilogue(const kiln_kernel_args *args, int *epi, const void **res) {
    *epi = KILN_CUDA_WG_EPI_NONE;
    *res = NULL;
    if (args->n_tail == 0) return;
    const kiln_tail_op *t = &args->tail[0];
    if (t->op == KILN_OP_RELU) {
        *epi = KILN_CUDA_WG_EPI_RELU;
    } else if (t->op == KILN_OP_GELU) {
        *epi = kiln_attrs_int(&t->attrs, KILN_A_GELU_APPROXIMATE, 0) != 0
                   ? KILN_CUDA_WG_EPI_GELU_TANH
                   : KILN_CUDA_WG_EPI_GELU_ERF;
    } else if ((*res = kiln_cuda_tail_residual_first(args)) != NULL) {
        *epi = KILN_CUDA_WG_EPI_RESIDUAL;
    }
}

// --- problems

static cudaDataType_t lt_type(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F16: return CUDA_R_16F;
    case KILN_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

// (NULL: no constraint)
static uint32_t lt_align(const void *p) {
    return p == NULL ? 256u : (uint32_t)kiln_cuda_align_of(p);
}

extern "C" void kiln_cuda_lt_linear_problem(const kiln_cuda_linear_geom *g,
                                            const kiln_kernel_args *args, kiln_cuda_lt_problem *p) {
    memset(p, 0, sizeof *p);
    p->dtype = g->y->dtype;
    p->trans_a = 1; // D^T[n x m] = W (stored k x n, transposed) * X^T (stored k x m)
    p->m = g->n;
    p->n = g->m;
    p->k = g->k;
    p->lda = g->k;
    p->ldb = g->k;
    p->ldd = g->n;
    p->batch = 1;
    p->a = g->w->data;
    p->b = g->x->data;
    p->bias = g->bias != NULL ? g->bias->data : NULL;
    p->d = g->y->data;
    p->relu = kiln_cuda_tail_relu_first(args);
    p->gelu = kiln_cuda_tail_gelu_tanh_first(args);
    p->c = p->relu || p->gelu ? NULL : kiln_cuda_tail_residual_first(args);
}

extern "C" void kiln_cuda_mm_operand(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int j,
                                     kiln_cuda_strided *out) {
    const kiln_tensor *t = args->in[j];
    const kiln_cuda_strided *v = ctx->sdpa_io[j];
    if (v != NULL && v->rank == t->rank) {
        *out = *v;
        return;
    }
    memset(out, 0, sizeof *out);
    out->data = t->data;
    out->rank = t->rank;
    memcpy(out->dims, t->dims, sizeof(int64_t) * t->rank);
    kc_strides(t, out->str);
}

extern "C" int kiln_cuda_lt_matmul_problem(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                           kiln_cuda_lt_problem *p) {
    const kiln_tensor *a = args->in[0], *b = args->in[1];
    const kiln_tensor *y = args->out;
    kiln_cuda_strided va, vb;
    kiln_cuda_mm_geom g;
    if (a->dtype != b->dtype || a->dtype != y->dtype) return 0;
    kiln_cuda_mm_operand(ctx, args, 0, &va);
    kiln_cuda_mm_operand(ctx, args, 1, &vb);
    const kiln_cuda_strided *vy = ctx->sdpa_io[3]; // the output written through a view
    if (!kiln_cuda_mm_geom_of(&va, &vb, vy, &g) || g.k <= 0 || g.y_rs < g.n) return 0;
    kiln_cuda_mm_gemm c;
    if (!kiln_cuda_mm_gemm_of(&g, &c)) return 0;
    memset(p, 0, sizeof *p);
    p->dtype = y->dtype;
    p->trans_a = c.trans_a;
    p->trans_b = c.trans_b;
    p->m = c.m;
    p->n = c.n;
    p->k = c.k;
    p->lda = c.lda;
    p->ldb = c.ldb;
    p->ldd = c.ldd;
    p->batch = c.batch;
    p->stride_a = c.stride_a;
    p->stride_b = c.stride_b;
    p->stride_d = c.stride_d;
    p->a = vb.data;
    p->b = va.data;
    p->d = vy != NULL ? vy->data : y->data;
    p->alpha = ctx->mm_alpha;
    p->relu = kiln_cuda_tail_relu_first(args);
    // a residual has the dense output's layout (a redirected output has unary tails only)
    p->c = p->relu || vy != NULL ? NULL : kiln_cuda_tail_residual_first(args);
    return 1;
}

// --- set-up and run

static cublasLtEpilogue_t lt_epilogue(const kiln_cuda_lt_problem *p) {
    if (p->bias != NULL) {
        return p->relu   ? CUBLASLT_EPILOGUE_RELU_BIAS
               : p->gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                         : CUBLASLT_EPILOGUE_BIAS;
    }
    return p->relu   ? CUBLASLT_EPILOGUE_RELU
           : p->gelu ? CUBLASLT_EPILOGUE_GELU
                     : CUBLASLT_EPILOGUE_DEFAULT;
}

extern "C" int kiln_cuda_lt_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_lt_problem *p,
                                  int n_ask, cublasLtMatmulAlgo_t *cands, size_t *cand_ws,
                                  int *n_cands, kiln_cuda_lt_plan *plan) {
    cudaDataType_t t = lt_type(p->dtype);
    cublasOperation_t ta = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = lt_epilogue(p);
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t results[KILN_CUDA_LT_CANDIDATES];
    int found = 0;
    uint64_t ws = ctx->workspace_nbytes;
    uint32_t al_a = lt_align(p->a), al_b = lt_align(p->b), al_d = lt_align(p->d);
    uint32_t al_c = p->c != NULL ? lt_align(p->c) : al_d;
    int32_t batch = (int32_t)p->batch;
    cublasStatus_t s;
    *n_cands = 0;
    if (ctx->lt == NULL) return 0;
    if (n_ask < 1) n_ask = 1;
    if (n_ask > KILN_CUDA_LT_CANDIDATES) n_ask = KILN_CUDA_LT_CANDIDATES;
    memset(plan, 0, sizeof *plan);
    plan->us = -1.0f;
    s = cublasLtMatmulDescInit(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                           sizeof ta);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                           sizeof tb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof epi);
    }
    if (s == CUBLAS_STATUS_SUCCESS && p->bias != NULL) {
        s = cublasLtMatmulDescSetAttribute(&plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                           sizeof p->bias);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = p->trans_a
                ? cublasLtMatrixLayoutInit(&plan->a, t, (uint64_t)p->k, (uint64_t)p->m, p->lda)
                : cublasLtMatrixLayoutInit(&plan->a, t, (uint64_t)p->m, (uint64_t)p->k, p->lda);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = p->trans_b
                ? cublasLtMatrixLayoutInit(&plan->b, t, (uint64_t)p->n, (uint64_t)p->k, p->ldb)
                : cublasLtMatrixLayoutInit(&plan->b, t, (uint64_t)p->k, (uint64_t)p->n, p->ldb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutInit(&plan->c, p->d_dtype != 0 ? lt_type(p->d_dtype) : t,
                                     (uint64_t)p->m, (uint64_t)p->n, p->ldd);
    }
    if (s == CUBLAS_STATUS_SUCCESS && p->batch > 1) {
        cublasLtMatrixLayoutOpaque_t *ls[3] = {&plan->a, &plan->b, &plan->c};
        int64_t strides[3] = {p->stride_a, p->stride_b, p->stride_d};
        for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; i++) {
            s = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                 sizeof batch);
            if (s == CUBLAS_STATUS_SUCCESS) {
                s = cublasLtMatrixLayoutSetAttribute(ls[i],
                                                     CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &strides[i], sizeof strides[i]);
            }
        }
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceInit(&pref);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    }
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t al[4] = {al_a, al_b, al_c, al_d};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, al_attr[i], &al[i], sizeof al[i]);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, &plan->desc, &plan->a, &plan->b, &plan->c,
                                           &plan->c, &pref, n_ask, results, &found);
    }
    int n = 0;
    for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < found; i++) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > ws) continue;
        if (n == 0) plan->ws_nbytes = results[i].workspaceSize;
        if (cand_ws != NULL) cand_ws[n] = results[i].workspaceSize;
        cands[n++] = results[i].algo;
    }
    if (n == 0) {
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cuBLASLt has no algorithm for m=%lld n=%lld k=%lld batch=%lld (%s, status "
                      "%d) at %s: Kiln's GEMM kernel",
                      (long long)p->m, (long long)p->n, (long long)p->k, (long long)p->batch,
                      kiln_cuda_dtype_name(p->dtype), (int)s, ctx->where ? ctx->where : "?");
        return 0;
    }
    plan->algo = cands[0];
    plan->bias = p->bias;
    plan->epilogue = (int)epi;
    plan->candidate = 1;
    plan->n_candidates = n;
    *n_cands = n;
    return 1;
}

extern "C" cublasStatus_t kiln_cuda_lt_exec(const kiln_cuda_ctx *ctx, const kiln_cuda_lt_problem *p,
                                            kiln_cuda_lt_plan *plan,
                                            const cublasLtMatmulAlgo_t *algo) {
    const float one = 1.0f, zero = 0.0f, alpha = p->alpha != 0.0f ? p->alpha : 1.0f;
    if (p->bias != plan->bias) { // the same problem with another bias buffer: re-point it
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(
            &plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias, sizeof p->bias);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
        plan->bias = p->bias;
    }
    if (algo == NULL) kiln_cuda_ws_note(ctx, plan->ws_nbytes);
    return cublasLtMatmul(ctx->lt, &plan->desc, &alpha, p->a, &plan->a, p->b, &plan->b,
                          p->c != NULL ? &one : &zero, p->c != NULL ? p->c : p->d, &plan->c, p->d,
                          &plan->c, algo != NULL ? algo : &plan->algo, ctx->workspace,
                          ctx->workspace_nbytes, ctx->stream);
}

extern "C" void kiln_cuda_lt_describe(const kiln_cuda_lt_plan *plan, char *buf, size_t n) {
    int32_t id = -1, tile = -1, stages = -1, splitk = -1;
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                         NULL);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                         sizeof tile, NULL);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof stages, NULL);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof splitk, NULL);
    if (plan->us >= 0.0f) {
        snprintf(buf, n,
                 "algo %d tile %d stages %d split-k %d, epilogue %d, workspace %zu, candidate %d "
                 "of %d (%.2f us)",
                 (int)id, (int)tile, (int)stages, (int)splitk, plan->epilogue, plan->ws_nbytes,
                 plan->candidate, plan->n_candidates, (double)plan->us);
    } else {
        snprintf(buf, n,
                 "algo %d tile %d stages %d split-k %d, epilogue %d, workspace %zu (the "
                 "heuristic's first)",
                 (int)id, (int)tile, (int)stages, (int)splitk, plan->epilogue, plan->ws_nbytes);
    }
}
