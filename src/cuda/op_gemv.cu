// SPDX-License-Identifier: Apache-2.0
// The GEMV for linears of at most 8 rows (gemm.h).
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_layout.h"
#include "cuda/gemm.h"

// A weight-streaming GEMV kernel (M <= GEMV_MAX_M rows).
// At M = 1..8 a linear is a pass over the weight: cuBLASLt's tiles leave most of each CTA idle
// and split K across a second reduction kernel. Here each warp owns GEMV_COLS output columns
// (weight rows), streams them with 16-byte loads (several in flight per lane), multiplies by the
// M input rows (16-byte __ldg: every warp of the block reads the same rows, so they stay in L1),
// reduces across the warp, and applies the epilogue in float32 before the one rounding: bias,
// then one of ReLU, GELU (erf or tanh form) or a residual add of the output's shape.
// float16/bfloat16, K a multiple of 8, 16-byte aligned x and w.
// Programmatic dependent launch (sm_90): the kernel is launched with programmatic stream
// serialization, so it may start while the previous kernel of the stream still runs; it touches
// no memory before griddepcontrol.wait (which returns once the previous grid has finished and
// its writes are visible), so arena reuse stays safe, and then lets the next kernel launch
// early. Back-to-back linears (the MLP at batch 1) overlap one's launch with the other's tail.
// (Prefetching the weight rows into L2 before the wait was measured on the H200 and removed:
// the MLP b1 took 29.3-30.7 us with it, 27.4-28.4 us without.) With cuda.pdl off it launches
// plainly.
// GEMV folds (cuda_fold.h; the FUSED instances, so the plain kernel keeps its registers):
//  - norm: x is the RMSNorm's input; each lane also sums the squares of the x vectors it reads and
//    multiplies them by the norm's weight before the products; the row's sum of squares meets the
//    products' (a warp sum, or through shared memory across the K split), and the product is
//    scaled by rsqrt(sum / K + eps) before the bias. The normalized x is never rounded;
//  - pair: a warp's two columns are row j of the gate's weight and row j of the up projection's;
//    the lane finishing column 0 also takes column 1's sum (a shuffle) and writes
//    act(gate + b_g) * (up + b_u) to column j.
// L2 plan (ctx->l2_keep, per engine: kiln_cuda_plan_l2 in cuda_layout.h): the weight
// loads carry an L2 cache policy that keeps the first `keep` bytes of the weight (evict-last:
// they stay cached from one execute to the next) and streams the rest (evict-first: read once,
// it pushes out neither the kept bytes nor the activations).

#define GEMV_MAX_M KILN_CUDA_GEMV_MAX_M
#define GEMV_WARPS 8
#define GEMV_COLS 2
#define GEMV_UNROLL 4

// (the same codes as Kiln's small-M wgmma linear's, cuda_wg.h)
enum {
    GEMV_EPI_NONE = KILN_CUDA_WG_EPI_NONE,
    GEMV_EPI_RELU = KILN_CUDA_WG_EPI_RELU,
    GEMV_EPI_GELU_ERF = KILN_CUDA_WG_EPI_GELU_ERF,
    GEMV_EPI_GELU_TANH = KILN_CUDA_WG_EPI_GELU_TANH,
    GEMV_EPI_RESIDUAL = KILN_CUDA_WG_EPI_RESIDUAL
};

// The L2 cache policy of a GEMV weight of `total` bytes at w whose first `keep` bytes are kept
// (evict-last) and the rest streamed (evict-first).
__device__ __forceinline__ uint64_t gemv_policy(const void *w, int64_t keep, int64_t total) {
    uint64_t cp;
    if (keep >= total) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(cp));
    } else if (keep <= 0 || total > 0xffffffffll) {
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(cp));
    } else {
        asm("createpolicy.range.global.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
            : "=l"(cp)
            : "l"(w), "r"((unsigned)keep), "r"((unsigned)total));
    }
    return cp;
}

// A weight vector: a plain non-coherent load, or with `hint` one with L2 cache policy cp.
__device__ __forceinline__ uint4 gemv_ldw(const uint4 *p, bool hint, uint64_t cp) {
    if (!hint) return __ldg(p);
    uint4 v;
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(cp));
    return v;
}

template <typename T> __device__ __forceinline__ void gemv_unpack(const uint4 &u, float *f) {
    const T *h = (const T *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = kc_to_f(h[i]);
}

// What the FUSED instances add (cuda_fold.h): the norm's weight (or NULL) and eps, with `norm`;
// the up projection's weight and bias (w2 != NULL: a gated pair, act the gate's activation).
// The FUSED instances exist for one row only (KILN_CUDA_GEMV_FOLD_M: a decode step of batch 1;
// fewer kernels in the plugin).
// One sibling of a launch (cuda_fold.h): its weight, bias, output, columns, L2 plan, and the first
// block on it.
template <typename T> struct gemv_seg {
    const T *w, *b;
    T *y;
    int64_t n, keep, begin;
};

template <typename T> struct gemv_fuse {
    const T *g;
    float eps;
    int norm;
    const T *w2, *b2;
    int act;
    int nseg; // siblings (0: none; else seg[0] is the layer's own linear)
    gemv_seg<T> seg[KILN_CUDA_GEMV_MAX_SIB];
};

template <typename T> __device__ __forceinline__ float gemv_act(float v, int act) {
    switch (act) {
    case KILN_CUDA_GEMV_ACT_SILU: return v / (1.0f + __expf(-v));
    case KILN_CUDA_GEMV_ACT_SIGMOID: return 1.0f / (1.0f + __expf(-v));
    case KILN_CUDA_GEMV_ACT_HARDSIGMOID: return fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
    case KILN_CUDA_GEMV_ACT_HARDSWISH:
        return v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
    default: return kc_linear_epilogue<T>(v, act, (const T *)NULL, 0);
    }
}

// The epilogue of column i of a plain GEMV: a KILN_CUDA_WG_EPI_* code or a GEMV activation.
template <typename T>
__device__ __forceinline__ float gemv_epilogue(float v, int epi, const T *res, int64_t i) {
    return epi >= KILN_CUDA_GEMV_ACT_SILU ? gemv_act<T>(v, epi)
                                          : kc_linear_epilogue<T>(v, epi, res, i);
}

// KS warps share a column group and split K among them (KS = 1: each warp its own columns;
// KS = GEMV_WARPS: the block's warps all work on GEMV_COLS columns, partial sums meet in shared
// memory), so that a narrow output (N = 1024 at K = 4096) still spreads over every SM.
// n counts columns as the warps see them: with a pair, twice the output's (gate j, up j).
template <typename T, int M, int KS, bool FUSED>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ bias,
                const T *__restrict__ res, T *__restrict__ y, int64_t n, int64_t k, int epi,
                int64_t keep, const gemv_fuse<T> fu) {
    constexpr int GROUPS = GEMV_WARPS / KS; // column groups per block
    __shared__ float part[KS > 1 ? GEMV_WARPS * GEMV_COLS * M : 1];
    __shared__ float part_ss[FUSED && KS > 1 ? GEMV_WARPS * M : 1];
    const bool pair = FUSED && fu.w2 != NULL, norm = FUSED && fu.norm;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = warp / KS, ks = warp % KS;
    int64_t bx = blockIdx.x;
    if constexpr (FUSED) {
        if (fu.nseg > 0) { // siblings: the member this block works on
            int s = 0;
            while (s + 1 < fu.nseg && bx >= fu.seg[s + 1].begin) s++;
            bx -= fu.seg[s].begin;
            w = fu.seg[s].w;
            bias = fu.seg[s].b;
            y = fu.seg[s].y;
            n = fu.seg[s].n;
            keep = fu.seg[s].keep;
        }
    }
    const int64_t col0 = (bx * GROUPS + grp) * GEMV_COLS;
    if (KS == 1 && col0 >= n) return; // (split blocks stay whole for the barrier)
    const int64_t kv = k / 8;         // 16-byte vectors per row
    float acc[GEMV_COLS][M];
#pragma unroll
    for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
        for (int r = 0; r < M; r++) acc[c][r] = 0.0f;
    }
    float ss[FUSED ? M : 1];
#pragma unroll
    for (int r = 0; r < (FUSED ? M : 1); r++) ss[r] = 0.0f;
    const uint4 *wv[GEMV_COLS];
#pragma unroll
    for (int c = 0; c < GEMV_COLS; c++) {
        const int64_t col = col0 + c < n ? col0 + c : n - 1; // a clamped duplicate, not stored
        wv[c] = pair ? (const uint4 *)((c == 0 ? w : fu.w2) + (col0 / 2) * k)
                     : (const uint4 *)(w + col * k);
    }
    const uint4 *xv = (const uint4 *)x;
    const bool hint = keep >= 0; // the L2 plan (cuda_layout.h)
    const uint64_t cp = hint ? gemv_policy(w, keep, n * k * (int64_t)sizeof(T)) : 0;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    for (int64_t j0 = lane + 32 * ks; j0 < kv; j0 += 32 * KS * GEMV_UNROLL) {
        uint4 wb[GEMV_UNROLL][GEMV_COLS];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t j = j0 + 32 * KS * u;
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) {
                wb[u][c] = j < kv ? gemv_ldw(wv[c] + j, hint, cp) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t j = j0 + 32 * KS * u;
            if (j >= kv) break;
            float wf[GEMV_COLS][8], gf[8];
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) gemv_unpack<T>(wb[u][c], wf[c]);
            if (norm) {
                if (fu.g != NULL) {
                    gemv_unpack<T>(__ldg((const uint4 *)fu.g + j), gf);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) gf[e] = 1.0f;
                }
            }
#pragma unroll
            for (int r = 0; r < M; r++) {
                float xf[8];
                gemv_unpack<T>(__ldg(xv + r * kv + j), xf);
                if (norm) {
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        ss[FUSED ? r : 0] = fmaf(xf[e], xf[e], ss[FUSED ? r : 0]);
                        xf[e] *= gf[e];
                    }
                }
#pragma unroll
                for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[c][r] = fmaf(wf[c][e], xf[e], acc[c][r]);
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
        for (int r = 0; r < M; r++) acc[c][r] = kc_warp_sum(acc[c][r]);
    }
    if (norm) {
#pragma unroll
        for (int r = 0; r < (FUSED ? M : 1); r++) ss[r] = kc_warp_sum(ss[r]);
    }
    // thread `lane` = c * M + r of the group finishes column col0 + c of row r
    int mine = -1;
    float v = 0.0f, sq = 0.0f;
    if (KS == 1) {
#pragma unroll
        for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (lane == c * M + r) v = acc[c][r];
            }
        }
        mine = lane < GEMV_COLS * M ? lane : -1;
        if (norm) {
#pragma unroll
            for (int r = 0; r < (FUSED ? M : 1); r++) {
                if (mine >= 0 && mine % M == r) sq = ss[r];
            }
        }
    } else {
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
                for (int r = 0; r < M; r++) part[(warp * GEMV_COLS + c) * M + r] = acc[c][r];
            }
            if (norm) {
#pragma unroll
                for (int r = 0; r < (FUSED ? M : 1); r++) part_ss[warp * M + r] = ss[r];
            }
        }
        __syncthreads();
        if (ks == 0 && lane < GEMV_COLS * M) {
            for (int s = 0; s < KS; s++) v += part[((grp * KS + s) * GEMV_COLS) * M + lane];
            if (norm) {
                for (int s = 0; s < KS; s++) sq += part_ss[(grp * KS + s) * M + lane % M];
            }
            mine = lane;
        }
    }
    if (FUSED) {
        if (norm) v *= rsqrtf(sq / (float)k + fu.eps);
        // a pair: lane r (column 0, the gate) takes lane M + r's sum (column 1, the up projection)
        const float other = __shfl_down_sync(0xffffffffu, v, M);
        if (pair) {
            if (mine < 0 || mine >= M || col0 >= n) return;
            const int64_t j = col0 / 2, no = n / 2;
            float g = v, u = other;
            if (bias != NULL) g += kc_to_f(bias[j]);
            if (fu.b2 != NULL) u += kc_to_f(fu.b2[j]);
            y[mine * no + j] = kc_from_f<T>(gemv_act<T>(g, fu.act) * u);
            return;
        }
    }
    if (mine < 0) return;
    const int c = mine / M, r = mine % M;
    const int64_t col = col0 + c;
    if (col >= n) return;
    if (bias != NULL) v += kc_to_f(bias[col]);
    v = gemv_epilogue<T>(v, epi, res, r * n + col);
    y[r * n + col] = kc_from_f<T>(v);
}

// The GEMV of a small linear whose rows are not 16-byte vectors (K % 8 != 0 or an unaligned
// operand: squeeze-excite's second linear reads 4, 6, 10 ... channels): a warp per column and
// row block, scalar loads, the same epilogue. Only for n * k <= GEMV_SMALL_NK, where the whole
// weight is a few L2 lines per warp.
#define GEMV_SMALL_NK 65536
template <typename T>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_small_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ bias,
                      const T *__restrict__ res, T *__restrict__ y, int m, int n, int k, int epi) {
    const int lane = threadIdx.x & 31;
    const int col = (int)blockIdx.x * GEMV_WARPS + (int)(threadIdx.x >> 5);
    if (col >= n) return;
    kc_pdl_enter();
    const T *wr = w + (int64_t)col * k;
    for (int r = 0; r < m; r++) {
        float acc = 0.0f;
        for (int j = lane; j < k; j += 32) {
            acc = fmaf(kc_to_f(wr[j]), kc_to_f(x[(int64_t)r * k + j]), acc);
        }
        acc = kc_warp_sum(acc);
        if (lane == 0) {
            if (bias != NULL) acc += kc_to_f(bias[col]);
            const int64_t i = (int64_t)r * n + col;
            y[i] = kc_from_f<T>(gemv_epilogue<T>(acc, epi, res, i));
        }
    }
}

// Whether a GEMV takes the linear on the scalar kernel (rows that are not 16-byte vectors).
static bool gemv_scalar(const kiln_cuda_linear_geom *g) {
    return g->k % 8 != 0 || ((uintptr_t)g->x->data % 16) != 0 || ((uintptr_t)g->w->data % 16) != 0;
}

template <typename T>
static kiln_status gemv_small_t(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g, int epi,
                                const void *res) {
    cudaError_t err =
        kc_launch(ctx, gemv_small_kernel<T>, (unsigned)((g->n + GEMV_WARPS - 1) / GEMV_WARPS),
                  GEMV_WARPS * 32, 0, (const T *)g->x->data, (const T *)g->w->data,
                  g->bias != NULL ? (const T *)g->bias->data : (const T *)NULL, (const T *)res,
                  (T *)g->y->data, (int)g->m, (int)g->n, (int)g->k, epi);
    if (err != cudaSuccess) {
        return kiln_cuda_error(ctx, "cudaLaunchKernelEx (gemv_small_kernel)", err);
    }
    return kiln_cuda_check_launch(ctx, "gemv_small_kernel");
}

// Launches gemv_kernel<T, M, KS, FUSED> with programmatic stream serialization where the policy
// allows it (cuda.pdl; kc_launch).
template <typename T, int M, int KS, bool FUSED>
static cudaError_t gemv_start(const kiln_cuda_ctx *ctx, unsigned blocks, const T *x, const T *w,
                              const T *b, const T *res, T *y, int64_t n, int64_t k, int epi,
                              int64_t keep, const gemv_fuse<T> &fu) {
    return kc_launch(ctx, gemv_kernel<T, M, KS, FUSED>, blocks, GEMV_WARPS * 32, 0, x, w, b, res, y,
                     n, k, epi, keep, fu);
}

template <typename T, bool FUSED>
static cudaError_t gemv_launch_m(const kiln_cuda_ctx *ctx, int64_t m, bool split, unsigned blocks,
                                 const T *x, const T *w, const T *b, const T *res, T *y, int64_t n,
                                 int64_t k, int epi, int64_t keep, const gemv_fuse<T> &fu) {
#define GEMV_CASE(MM)                                                                              \
    case MM:                                                                                       \
        return split ? gemv_start<T, MM, GEMV_WARPS, FUSED>(ctx, blocks, x, w, b, res, y, n, k,    \
                                                            epi, keep, fu)                         \
                     : gemv_start<T, MM, 1, FUSED>(ctx, blocks, x, w, b, res, y, n, k, epi, keep,  \
                                                   fu)
    if constexpr (FUSED) { // one row (KILN_CUDA_GEMV_FOLD_M; gemv_launch_t checks)
        return split
                   ? gemv_start<T, 1, GEMV_WARPS, FUSED>(ctx, blocks, x, w, b, res, y, n, k, epi,
                                                         keep, fu)
                   : gemv_start<T, 1, 1, FUSED>(ctx, blocks, x, w, b, res, y, n, k, epi, keep, fu);
    } else {
        switch (m) {
            GEMV_CASE(1);
            GEMV_CASE(2);
            GEMV_CASE(3);
            GEMV_CASE(4);
            GEMV_CASE(5);
            GEMV_CASE(6);
            GEMV_CASE(7);
        default: GEMV_CASE(8);
        }
    }
#undef GEMV_CASE
}

template <typename T>
static kiln_status gemv_launch_t(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g, int epi,
                                 const void *res) {
    const bool fused = ctx->gemv_x != NULL || ctx->gemv_up_w != NULL || ctx->gemv_n_sib > 0;
    if (fused && g->m != KILN_CUDA_GEMV_FOLD_M) { // the fold pass allows only that (cuda_fold.h)
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "%s: a GEMV with folds at %lld rows (it takes %d); set the option "
                              "cuda.gemv_fold to false",
                              ctx->where ? ctx->where : "?", (long long)g->m,
                              KILN_CUDA_GEMV_FOLD_M);
    }
    const T *x = (const T *)(ctx->gemv_x != NULL ? ctx->gemv_x->data : g->x->data);
    const T *w = (const T *)g->w->data;
    const T *b = g->bias ? (const T *)g->bias->data : NULL;
    T *y = (T *)g->y->data;
    gemv_fuse<T> fu = {};
    if (ctx->gemv_x != NULL) {
        fu.norm = 1;
        fu.g = ctx->gemv_norm_w != NULL ? (const T *)ctx->gemv_norm_w->data : NULL;
        fu.eps = ctx->gemv_eps;
    }
    if (ctx->gemv_up_w != NULL) {
        fu.w2 = (const T *)ctx->gemv_up_w->data;
        fu.b2 = ctx->gemv_up_b != NULL ? (const T *)ctx->gemv_up_b->data : NULL;
        fu.act = ctx->gemv_act;
    }
    // a pair's warps see its columns twice over (gate j, up j)
    const int64_t m = g->m, n = fu.w2 != NULL ? 2 * g->n : g->n, k = g->k;
    const int64_t keep = ctx->l2_keep;
    // siblings: the layer's own linear, then the others, each on its own blocks
    int64_t n_all = n;
    if (ctx->gemv_n_sib > 0) {
        fu.nseg = 1 + ctx->gemv_n_sib;
        fu.seg[0] = {w, b, y, n, keep, 0};
        for (int i = 0; i < ctx->gemv_n_sib; i++) {
            const kiln_tensor *sw = ctx->gemv_sib_w[i], *sb = ctx->gemv_sib_b[i];
            fu.seg[i + 1] = {(const T *)sw->data,           sb != NULL ? (const T *)sb->data : NULL,
                             (T *)ctx->gemv_sib_y[i]->data, sw->dims[0],
                             ctx->gemv_sib_keep[i],         0};
            n_all += sw->dims[0];
        }
    }
    // one warp per column pair while that gives every SM a block; else the block's warps split K
    const int64_t whole = (n_all + GEMV_WARPS * GEMV_COLS - 1) / (GEMV_WARPS * GEMV_COLS);
    const bool split = whole < (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 132);
    const int64_t per_block = split ? GEMV_COLS : GEMV_WARPS * GEMV_COLS; // columns
    int64_t blocks = (n + per_block - 1) / per_block;
    for (int i = 1; i < fu.nseg; i++) {
        fu.seg[i].begin = blocks;
        blocks += (fu.seg[i].n + per_block - 1) / per_block;
    }
    cudaError_t err = fused ? gemv_launch_m<T, true>(ctx, m, split, (unsigned)blocks, x, w, b,
                                                     (const T *)res, y, n, k, epi, keep, fu)
                            : gemv_launch_m<T, false>(ctx, m, split, (unsigned)blocks, x, w, b,
                                                      (const T *)res, y, n, k, epi, keep, fu);
    if (err != cudaSuccess) return kiln_cuda_error(ctx, "cudaLaunchKernelEx (gemv_kernel)", err);
    return kiln_cuda_check_launch(ctx, "gemv_kernel");
}

extern "C" int kiln_cuda_gemv_applies(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g) {
    const uint32_t dt = g->y->dtype;
    if (!ctx->policy->gemv) return 0;
    if (g->m < 1 || g->m > GEMV_MAX_M || g->k < 1 || g->n < 1) return 0;
    if (dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) return 0;
    if (g->x->dtype != dt || g->w->dtype != dt || (g->bias != NULL && g->bias->dtype != dt))
        return 0;
    if (gemv_scalar(g)) { // the scalar kernel: small weights, no folds (cuda_fold.h needs K % 8)
        return g->n * g->k <= GEMV_SMALL_NK && ctx->gemv_x == NULL && ctx->gemv_up_w == NULL &&
               ctx->gemv_n_sib == 0;
    }
    const kiln_tensor *fused[3 + KILN_CUDA_GEMV_MAX_SIB] = {ctx->gemv_x, ctx->gemv_norm_w,
                                                            ctx->gemv_up_w};
    for (int i = 0; i < ctx->gemv_n_sib && i < KILN_CUDA_GEMV_MAX_SIB - 1; i++) {
        fused[3 + i] = ctx->gemv_sib_w[i];
    }
    for (int i = 0; i < 3 + KILN_CUDA_GEMV_MAX_SIB; i++) {
        if (fused[i] != NULL && ((uintptr_t)fused[i]->data % 16) != 0) return 0;
    }
    return (uint64_t)g->n <= (uint64_t)GEMV_COLS * 0x3fffffffu;
}

extern "C" kiln_status kiln_cuda_gemv_run(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g,
                                          int epi, const void *res) {
    if (gemv_scalar(g)) {
        if (ctx->gemv_x != NULL || ctx->gemv_up_w != NULL || ctx->gemv_n_sib > 0) {
            return kiln_cuda_fail(KILN_ERR_INTERNAL,
                                  "%s: a GEMV with folds on unaligned rows; set the option "
                                  "cuda.gemv_fold to false",
                                  ctx->where ? ctx->where : "?");
        }
        if (g->y->dtype == KILN_DTYPE_F16) return gemv_small_t<__half>(ctx, g, epi, res);
        return gemv_small_t<__nv_bfloat16>(ctx, g, epi, res);
    }
    if (g->y->dtype == KILN_DTYPE_F16) return gemv_launch_t<__half>(ctx, g, epi, res);
    return gemv_launch_t<__nv_bfloat16>(ctx, g, epi, res);
}
