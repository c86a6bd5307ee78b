// SPDX-License-Identifier: Apache-2.0
// The small-M linear on Hopper (gemm.h): the host side of Kiln's TMA + wgmma kernel
// (op_linear_wg.cu, cuda_wg.h) for 8 < M <= KILN_CUDA_WG_MAX_M float16/bfloat16 linears on sm_90:
// whether a linear fits it, and running it with one configuration (one wave of 64 x BN tiles,
// K split over a cluster of 1-8 CTAs) with the epilogue fused. Which configuration, and whether
// it or cuBLASLt runs a layer, is decided by timing at context creation (gemm_tune.cu) or forced
// by the policy's cuda.wgmma_config.
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/gemm.h"

extern "C" int kiln_cuda_wg_problem_of(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g,
                                       const kiln_kernel_args *args, kiln_cuda_wg_problem *p) {
    const uint32_t dt = g->y->dtype;
    if (!ctx->wg_ok) return 0;
    if (g->m < 1 || g->m > KILN_CUDA_WG_MAX_M || g->k < 64 || g->k % 8 != 0 || g->n < 1 ||
        g->n > 0x7fffffff || g->k > 0x7fffffff)
        return 0;
    if (dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) return 0;
    if (g->x->dtype != dt || g->w->dtype != dt || (g->bias != NULL && g->bias->dtype != dt))
        return 0;
    if (((uintptr_t)g->x->data % 16) != 0 || ((uintptr_t)g->w->data % 16) != 0 ||
        ((uintptr_t)g->y->data % 8) != 0)
        return 0;
    memset(p, 0, sizeof *p);
    p->dtype = dt;
    p->m = g->m;
    p->n = g->n;
    p->k = g->k;
    p->x = g->x->data;
    p->w = g->w->data;
    p->bias = g->bias != NULL ? g->bias->data : NULL;
    p->y = g->y->data;
    p->keep = ctx->l2_keep; // the engine's L2 plan (-1: none)
    kiln_cuda_small_m_epilogue(args, &p->epi, &p->res);
    if (p->res != NULL && ((uintptr_t)p->res % 8) != 0) {
        p->epi = KILN_CUDA_WG_EPI_NONE; // the residual then runs in the tail kernel
        p->res = NULL;
    }
    return 1;
}

extern "C" kiln_status kiln_cuda_wg_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                        const kiln_cuda_wg_problem *p, kiln_cuda_wg_cfg cfg,
                                        kiln_cuda_wg_maps_t *maps) {
    if (!kiln_cuda_wg_maps(maps, p, cfg)) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "cuda linear: the driver refused a tensor map (m=%lld n=%lld "
                              "k=%lld) at %s; set the option cuda.wgmma to false to run it on "
                              "cuBLASLt",
                              (long long)p->m, (long long)p->n, (long long)p->k,
                              ctx->where ? ctx->where : "?");
    }
    cudaError_t err = kiln_cuda_wg_launch(ctx->stream, maps, p, cfg, ctx->policy->pdl);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "CUDA error in cudaLaunchKernelEx (wg_linear_kernel, configuration "
                              "%dx%d/%d) at %s: %s (%s); set the option cuda.wgmma to false to run "
                              "the small-M linears on cuBLASLt",
                              cfg.bn, cfg.split, cfg.occ, ctx->where ? ctx->where : "?",
                              cudaGetErrorName(err), cudaGetErrorString(err));
    }
    return kiln_cuda_tail(ctx, args, p->epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0);
}
