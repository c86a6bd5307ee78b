// SPDX-License-Identifier: Apache-2.0
// linear and matmul on Kiln's tiled GEMM kernel (tiled_gemm.cuh, gemm.h): what cuBLASLt does not
// take (mixed dtypes, general batch broadcasting, K = 0, no algorithm) and everything with the
// policy's cuda.cublaslt off. C[b][i][j] = sum_k A[b](i, k) B[b](k, j) (+ bias[j]), float32
// accumulation, any operand dtypes; A, B and C through any strides (C's columns dense).
#include <string.h>

#include "cuda/gemm.h"
#include "cuda/tiled_gemm.cuh"

typedef struct gemm_view {
    const void *a, *b, *bias;
    uint32_t a_dt, b_dt, bias_dt, c_dt;
    void *c;
    int64_t a_rs, a_cs, b_rs, b_cs, c_rs; // element strides inside one matrix (C's columns: 1)
    int nb;                               // batch rank
    int64_t bdims[KC_MAX_RANK], a_bstr[KC_MAX_RANK], b_bstr[KC_MAX_RANK], c_bstr[KC_MAX_RANK];
    int64_t m, n;
    float alpha; // C = alpha A B (+ bias): 0 means 1
} gemm_view;

template <bool BKF> struct gemm_loader {
    gemm_view v;
    static constexpr bool b_k_fast = BKF;
    __device__ __forceinline__ int64_t off(int64_t bt, const int64_t *str) const {
        int64_t o = 0;
        for (int d = v.nb - 1; d >= 0; d--) {
            o += (bt % v.bdims[d]) * str[d];
            bt /= v.bdims[d];
        }
        return o;
    }
    __device__ __forceinline__ float a(int64_t bt, int64_t i, int64_t k) const {
        return kc_ld_f(v.a, v.a_dt, off(bt, v.a_bstr) + i * v.a_rs + k * v.a_cs);
    }
    __device__ __forceinline__ float b(int64_t bt, int64_t k, int64_t j) const {
        return kc_ld_f(v.b, v.b_dt, off(bt, v.b_bstr) + k * v.b_rs + j * v.b_cs);
    }
    __device__ __forceinline__ void store(int64_t bt, int64_t i, int64_t j, float acc) const {
        if (v.alpha != 0.0f) acc *= v.alpha;
        if (v.bias != NULL) acc += kc_ld_f(v.bias, v.bias_dt, j);
        kc_st_f(v.c, v.c_dt, off(bt, v.c_bstr) + i * v.c_rs + j, acc);
    }
};

static kiln_status gemm_tiled(const kiln_cuda_ctx *ctx, const gemm_view *v, int64_t k,
                              int64_t batch) {
    if (v->m == 0 || v->n == 0 || batch == 0) return KILN_OK;
    dim3 grid = tg_grid(v->m, v->n, batch);
    if (v->b_cs != 1 && v->b_rs == 1) {
        gemm_loader<true> ld = {*v};
        tiled_gemm_kernel<gemm_loader<true>>
            <<<grid, TG_THREADS, 0, ctx->stream>>>(ld, v->m, v->n, k, batch);
    } else {
        gemm_loader<false> ld = {*v};
        tiled_gemm_kernel<gemm_loader<false>>
            <<<grid, TG_THREADS, 0, ctx->stream>>>(ld, v->m, v->n, k, batch);
    }
    return kiln_cuda_check_launch(ctx, "tiled_gemm_kernel");
}

extern "C" kiln_status kiln_cuda_tiled_linear(const kiln_cuda_ctx *ctx,
                                              const kiln_cuda_linear_geom *g) {
    gemm_view v;
    memset(&v, 0, sizeof v);
    v.a = g->x->data;
    v.a_dt = g->x->dtype;
    v.a_rs = g->k;
    v.a_cs = 1;
    v.b = g->w->data; // B(k, j) = w[j][k]
    v.b_dt = g->w->dtype;
    v.b_rs = 1;
    v.b_cs = g->k;
    v.bias = g->bias ? g->bias->data : NULL;
    v.bias_dt = g->bias ? g->bias->dtype : 0;
    v.c = g->y->data;
    v.c_dt = g->y->dtype;
    v.c_rs = g->n;
    v.m = g->m;
    v.n = g->n;
    return gemm_tiled(ctx, &v, g->k, 1);
}

extern "C" kiln_status kiln_cuda_tiled_matmul(const kiln_cuda_ctx *ctx,
                                              const kiln_kernel_args *args) {
    const kiln_tensor *a = args->in[0], *b = args->in[1];
    const kiln_tensor *y = args->out;
    int ar = (int)a->rank, br = (int)b->rank;
    kiln_cuda_strided va, vb; // dense, or the attention fold's views (any strides)
    kiln_cuda_mm_operand(ctx, args, 0, &va);
    kiln_cuda_mm_operand(ctx, args, 1, &vb);
    gemm_view v;
    memset(&v, 0, sizeof v);
    int nab = ar >= 2 ? ar - 2 : 0, nbb = br >= 2 ? br - 2 : 0;
    int64_t batch = 1;
    int64_t k = a->dims[ar - 1];
    v.nb = nab > nbb ? nab : nbb;
    for (int d = 0; d < v.nb; d++) {
        int ia = d - (v.nb - nab), ib = d - (v.nb - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        v.bdims[d] = da > db ? da : db;
        if (da == 0 || db == 0) v.bdims[d] = 0;
        v.a_bstr[d] = (ia >= 0 && da != 1) ? va.str[ia] : 0;
        v.b_bstr[d] = (ib >= 0 && db != 1) ? vb.str[ib] : 0;
        batch *= v.bdims[d];
    }
    v.m = ar >= 2 ? a->dims[ar - 2] : 1;
    v.n = br >= 2 ? b->dims[br - 1] : 1;
    v.a = va.data;
    v.a_dt = a->dtype;
    v.a_rs = ar >= 2 ? va.str[ar - 2] : k;
    v.a_cs = va.str[ar - 1];
    v.b = vb.data;
    v.b_dt = b->dtype;
    v.b_rs = br >= 2 ? vb.str[br - 2] : vb.str[0];
    v.b_cs = br >= 2 ? vb.str[br - 1] : 1;
    v.c = y->data;
    v.c_dt = y->dtype;
    v.c_rs = v.n;
    v.alpha = ctx->mm_alpha;
    for (int d = v.nb; d-- > 0;) { // dense y [.., m, n]
        v.c_bstr[d] = d == v.nb - 1 ? v.m * v.n : v.c_bstr[d + 1] * v.bdims[d + 1];
    }
    const kiln_cuda_strided *vy = ctx->sdpa_io[3]; // written through the fold's view
    if (vy != NULL && (int)vy->rank == v.nb + 2 && ar >= 2 && br >= 2) {
        v.c = vy->data;
        v.c_rs = vy->str[v.nb];
        for (int d = 0; d < v.nb; d++) v.c_bstr[d] = vy->str[d];
    }
    return gemm_tiled(ctx, &v, k, batch);
}
