// SPDX-License-Identifier: Apache-2.0
// K split over a strided-batched cuBLASLt GEMM (gemm.h). A linear whose output has few tiles for
// its K (BERT-base b1's FFN 2: 128 x 768 outputs over K 3072, six 128 x 128 tiles for 132 SMs)
// leaves most SMs idle in cuBLASLt's kernel. Here it runs as one strided-batched GEMM over S
// slices of K (batch i: x[:, i K/S ..] w[:, i K/S ..]^T; the batch count multiplies the tiles)
// writing float32 partial sums into the tail of the context's cuBLASLt workspace (the GEMM is
// given the rest), then one kernel adds the S partial sums, the bias and the first tail op (ReLU,
// GELU erf or tanh, or a residual) in float32 and rounds once. Timed against the plain GEMM with
// its tail where it may pay (kiln_cuda_splitk_worth): float16/bfloat16, M > 64 (smaller M is the
// GEMV's and the wgmma kernel's, whose K split needs no second kernel: the MLP b64 lost 1.5-2 us
// with every eligible layer split), at most 16 output tiles of 128 x 128, K >= 1024.
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/gemm.h"

#define SK_MAX_PART ((size_t)16 << 20) // float32 partial sums at most (bytes)

// The partial sums' bytes, rounded up to 256 (they take the workspace's tail).
static size_t sk_part_nbytes(const kiln_cuda_linear_geom *g, int s) {
    return ((size_t)s * (size_t)g->m * (size_t)g->n * 4u + 255u) & ~(size_t)255u;
}

extern "C" int kiln_cuda_splitk_fits(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g,
                                     int s) {
    const uint32_t dt = g->y->dtype;
    const size_t part = (size_t)s * (size_t)g->m * (size_t)g->n * 4u;
    if ((s != 2 && s != 4 && s != 8) || ctx->lt == NULL || ctx->workspace == NULL) return 0;
    if (dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) return 0;
    if (g->x->dtype != dt || g->w->dtype != dt || (g->bias != NULL && g->bias->dtype != dt))
        return 0;
    if (g->m < 1 || g->n % 4 != 0 || g->k % (8 * s) != 0 || g->k / s < 64) return 0;
    if (((uintptr_t)g->x->data % 16) != 0 || ((uintptr_t)g->w->data % 16) != 0 ||
        ((uintptr_t)g->y->data % 8) != 0)
        return 0;
    return part <= SK_MAX_PART && part <= ctx->workspace_nbytes / 2;
}

extern "C" int kiln_cuda_splitk_worth_mnk(int64_t m, int64_t n, int64_t k) {
    return m > 64 && k >= 1024 && ((m + 127) / 128) * ((n + 127) / 128) <= 16;
}

extern "C" int kiln_cuda_splitk_worth(const kiln_cuda_linear_geom *g) {
    return kiln_cuda_splitk_worth_mnk(g->m, g->n, g->k);
}

template <typename T, int SK>
static __global__ void __launch_bounds__(256)
    sk_reduce_kernel(const float4 *__restrict__ part, int64_t m, int64_t n,
                     const T *__restrict__ bias, int epi, const T *__restrict__ res,
                     T *__restrict__ y) {
    const int64_t plane = m * n / 4;
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= plane) return;
    float4 p[SK];
#pragma unroll
    for (int s = 0; s < SK; s++) p[s] = __ldcs(&part[s * plane + i]); // all loads in flight
    float o[4] = {p[0].x, p[0].y, p[0].z, p[0].w};
#pragma unroll
    for (int s = 1; s < SK; s++) {
        o[0] += p[s].x;
        o[1] += p[s].y;
        o[2] += p[s].z;
        o[3] += p[s].w;
    }
    const int64_t at = i * 4, col = at % n;
    T out[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float v = o[j] + (bias != NULL ? kc_to_f(bias[col + j]) : 0.0f);
        out[j] = kc_from_f<T>(kc_linear_epilogue<T>(v, epi, res, at + j));
    }
    *(uint2 *)&y[at] = *(const uint2 *)out;
}

template <typename T>
static void sk_reduce_t(cudaStream_t st, const float *part, int s, int64_t m, int64_t n,
                        const void *bias, int epi, const void *res, void *y) {
    const unsigned blocks = (unsigned)((m * n / 4 + 255) / 256);
    const float4 *p = (const float4 *)part;
    const T *b = (const T *)bias, *r = (const T *)res;
    if (s == 2) sk_reduce_kernel<T, 2><<<blocks, 256, 0, st>>>(p, m, n, b, epi, r, (T *)y);
    if (s == 4) sk_reduce_kernel<T, 4><<<blocks, 256, 0, st>>>(p, m, n, b, epi, r, (T *)y);
    if (s == 8) sk_reduce_kernel<T, 8><<<blocks, 256, 0, st>>>(p, m, n, b, epi, r, (T *)y);
}

extern "C" void kiln_cuda_splitk_problem(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g,
                                         int s, kiln_cuda_ctx *sctx, kiln_cuda_lt_problem *p) {
    *sctx = *ctx;
    sctx->workspace_nbytes = (ctx->workspace_nbytes - sk_part_nbytes(g, s)) & ~(size_t)255u;
    memset(p, 0, sizeof *p);
    p->dtype = g->y->dtype;
    p->d_dtype = KILN_DTYPE_F32;
    p->trans_a = 1; // D^T[n x m] = W (stored k x n, transposed) * X^T, per slice of K
    p->m = g->n;
    p->n = g->m;
    p->k = g->k / s;
    p->lda = g->k;
    p->ldb = g->k;
    p->ldd = g->n;
    p->batch = s;
    p->stride_a = g->k / s;
    p->stride_b = g->k / s;
    p->stride_d = g->m * g->n;
    p->a = g->w->data;
    p->b = g->x->data;
    p->d = (char *)ctx->workspace + sctx->workspace_nbytes;
}

extern "C" int kiln_cuda_splitk_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g,
                                      int s, int n_ask, cublasLtMatmulAlgo_t *cands,
                                      size_t *cand_ws, int *n_cands, kiln_cuda_lt_plan *lt) {
    kiln_cuda_ctx sctx;
    kiln_cuda_lt_problem p;
    kiln_cuda_splitk_problem(ctx, g, s, &sctx, &p);
    return kiln_cuda_lt_setup(&sctx, &p, n_ask, cands, cand_ws, n_cands, lt);
}

extern "C" kiln_status kiln_cuda_splitk_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                            const kiln_cuda_linear_geom *g, int s,
                                            kiln_cuda_lt_plan *lt) {
    kiln_cuda_ctx sctx;
    kiln_cuda_lt_problem p;
    kiln_cuda_splitk_problem(ctx, g, s, &sctx, &p);
    // the partials sit at the end: the GEMM's own room, rounded, before them
    kiln_cuda_ws_note(ctx, lt->ws_nbytes + sk_part_nbytes(g, s) + 256u);
    cublasStatus_t st = kiln_cuda_lt_exec(&sctx, &p, lt, NULL);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "cublasLtMatmul refused the K split's GEMM (%d slices, m=%lld "
                              "n=%lld k=%lld) at %s: %s; set the option cuda.splitk to off",
                              s, (long long)g->m, (long long)g->n, (long long)g->k,
                              ctx->where ? ctx->where : "?", cublasLtGetStatusString(st));
    }
    KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "cublasLtMatmul (K split)"));
    int epi = 0;
    const void *res = NULL;
    kiln_cuda_small_m_epilogue(args, &epi, &res);
    const void *bias = g->bias != NULL ? g->bias->data : NULL;
    if (g->y->dtype == KILN_DTYPE_F16) {
        sk_reduce_t<__half>(ctx->stream, (const float *)p.d, s, g->m, g->n, bias, epi, res,
                            g->y->data);
    } else {
        sk_reduce_t<__nv_bfloat16>(ctx->stream, (const float *)p.d, s, g->m, g->n, bias, epi, res,
                                   g->y->data);
    }
    KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "sk_reduce_kernel"));
    return kiln_cuda_tail(ctx, args, epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0);
}
