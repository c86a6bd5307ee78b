// SPDX-License-Identifier: Apache-2.0
// conv2d and conv_transpose2d (conv.h) with stride, padding, dilation, groups (and output_padding,
// which only shapes the output). A conv2d is planned onto cuDNN (dnn_conv.c) where it takes the
// layer, onto Kiln's stem kernel where the layout pass chose it (conv_stem.cu), else onto Kiln's
// own kernels like every conv_transpose2d: each group an implicit GEMM on the tiled core
// (tiled_gemm.cuh: rows = output channels of the group, columns = N*OH*OW output pixels, depth =
// C/g*kh*kw, the input gathered on the fly), or for groups of fewer than DIRECT_MAX_OG output
// channels (depthwise) a direct kernel, one thread per output. Float32 accumulation; the fused
// tail runs after in one elementwise kernel unless cuDNN or the stem kernel fuse part of it.
// A depthwise conv2d (one channel per group) in an NHWC engine runs Kiln's depthwise kernel: one
// thread per output pixel and 8 channels (16-byte loads and stores along C), the taps' weights
// read from the OIHW weight (L1-resident), float32 accumulation, the bias and the first tail op
// when it is an activation (ReLU, clamp, SiLU, hard-swish, sigmoid, GELU) applied before the one
// rounding; cuDNN's grouped NHWC convolutions, and its NCHW ones with the layout copies around
// them, ran EfficientNet-B0's at a tenth of the memory bandwidth.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/conv.h"
#include "cuda/conv_act.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/gemm.h"
#include "cuda/tiled_gemm.cuh"

#define DIRECT_MAX_OG 8
#define DIRECT_BLOCK 256

// Input element feeding output pixel (n, oy, ox) through kernel tap (a, b) of input channel ci,
// or 0 when it falls in the padding (or, transposed, between strides).
__device__ __forceinline__ float conv_tap(const kiln_cuda_conv_geom &g, int64_t n, int64_t ci,
                                          int64_t oy, int64_t ox, int a, int b) {
    int64_t iy, ix;
    if (!g.transposed) {
        iy = oy * g.sh - g.ph + (int64_t)a * g.dh;
        ix = ox * g.sw - g.pw + (int64_t)b * g.dw;
    } else {
        int64_t ty = oy + g.ph - (int64_t)a * g.dh, tx = ox + g.pw - (int64_t)b * g.dw;
        if (ty < 0 || tx < 0 || ty % g.sh != 0 || tx % g.sw != 0) return 0.0f;
        iy = ty / g.sh;
        ix = tx / g.sw;
    }
    if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w_in) return 0.0f;
    return kc_ld_f(g.x, g.x_dt,
                   g.nhwc ? ((n * g.h + iy) * g.w_in + ix) * g.xcs + ci
                          : ((n * g.c + ci) * g.h + iy) * g.w_in + ix);
}

// Weight of (group gr, output channel i of the group, input channel c of the group, tap a, b).
__device__ __forceinline__ float conv_weight(const kiln_cuda_conv_geom &g, int64_t gr, int64_t i,
                                             int64_t c, int a, int b) {
    int64_t taps = (int64_t)g.kh * g.kw, t = (int64_t)a * g.kw + b;
    int64_t idx = g.wcs > 0       ? ((gr * g.og + i) * taps + t) * g.wcs + c
                  : !g.transposed ? ((gr * g.og + i) * g.cg + c) * taps + t
                                  : ((gr * g.cg + c) * g.og + i) * taps + t;
    return kc_ld_f(g.w, g.w_dt, idx);
}

__device__ __forceinline__ void conv_store(const kiln_cuda_conv_geom &g, int64_t oc, int64_t j,
                                           float acc) {
    int64_t hw = g.oh * g.ow, n = j / hw, p = j % hw;
    if (g.bias != NULL) acc += kc_ld_f(g.bias, g.bias_dt, oc);
    kc_st_f(g.y, g.y_dt, g.nhwc ? j * g.o + oc : (n * g.o + oc) * hw + p, acc);
}

// --- implicit GEMM loader: batch = group, A(i, k) = weights, B(k, j) = gathered input

struct conv_loader {
    kiln_cuda_conv_geom g;
    static constexpr bool b_k_fast = false;
    __device__ __forceinline__ float a(int64_t gr, int64_t i, int64_t k) const {
        int taps = g.kh * g.kw;
        int64_t c = k / taps;
        int t = (int)(k % taps);
        return conv_weight(g, gr, i, c, t / g.kw, t % g.kw);
    }
    __device__ __forceinline__ float b(int64_t gr, int64_t k, int64_t j) const {
        int taps = g.kh * g.kw;
        int64_t c = k / taps;
        int t = (int)(k % taps);
        int64_t hw = g.oh * g.ow, n = j / hw, p = j % hw;
        return conv_tap(g, n, gr * g.cg + c, p / g.ow, p % g.ow, t / g.kw, t % g.kw);
    }
    __device__ __forceinline__ void store(int64_t gr, int64_t i, int64_t j, float acc) const {
        conv_store(g, gr * g.og + i, j, acc);
    }
};

// --- direct kernel: one thread per output element

static __global__ void conv_direct_kernel(const kiln_cuda_conv_geom g) {
    int64_t hw = g.oh * g.ow, total = g.n * g.o * hw;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t p = i % hw, oc = (i / hw) % g.o, n = i / (hw * g.o);
        int64_t gr = oc / g.og, oi = oc % g.og, oy = p / g.ow, ox = p % g.ow;
        float acc = 0.0f;
        for (int64_t c = 0; c < g.cg; c++) {
            for (int a = 0; a < g.kh; a++) {
                for (int b = 0; b < g.kw; b++) {
                    float xv = conv_tap(g, n, gr * g.cg + c, oy, ox, a, b);
                    acc = fmaf(xv, conv_weight(g, gr, oi, c, a, b), acc);
                }
            }
        }
        conv_store(g, oc, n * hw + p, acc);
    }
}

// --- depthwise NHWC kernel

#define DW_VEC 8
#define DW_BLOCK 256
#define DW_MAX_BX 32
#define DW_PX 1        // output pixels per thread (4: no faster at batch 32, slower at batch 1)
#define DW_GRID 1056   // blocks per launch: 8 per SM of a 132-SM H100 / H200
#define DW_MAX_TAPS 96 // taps x 256 channels x 2 bytes of shared memory stay under 48 KB
// The block's filter taps in shared memory as [tap][channel] (ct channels from cbase, copied from
// the OIHW [channel][tap] weight with coalesced reads; channels past C are 0), so that a tap's
// weights for 8 channels are one 16-byte load.
template <typename T>
__device__ __forceinline__ void dw_stage_taps(T *ws, const kiln_cuda_conv_geom &g, int taps, int ct,
                                              int cbase) {
    const int c = (int)g.c, nthreads = (int)(blockDim.x * blockDim.y);
    const T *w = (const T *)g.w + (int64_t)cbase * taps;
    const int nw = (c - cbase < ct ? c - cbase : ct) * taps;
    for (int i = (int)(threadIdx.y * blockDim.x + threadIdx.x); i < ct * taps; i += nthreads) {
        ws[(i % taps) * ct + i / taps] = i < nw ? w[i] : kc_from_f<T>(0.0f);
    }
    __syncthreads();
}

// The same for a kernel of TAPS taps known at compile time: the block's slice of the weight,
// ct * TAPS contiguous elements from channel cbase (16-byte aligned: cbase is a multiple of 8),
// read as 16-byte vectors, four in flight per thread before they are scattered, so that staging
// costs a few load round trips instead of one per element (a 7x7 block of 192 channels stages
// 9408 elements). (Consecutive threads reading vectors K apart, so that a warp's 2-byte stores
// fall in different banks, measured no faster for 7x7 and slower for 3x3 and 5x5: the reads
// are then uncoalesced.) The elements move as 16-bit words (fp16 and bf16 alike), in a call, not
// inlined: one copy of this code per kernel size, not per kernel (the plugin's size).
template <int TAPS>
static __device__ __noinline__ void dw_stage_taps_vec(uint16_t *ws, const void *wt, int c, int ct,
                                                      int cbase) {
    constexpr int U = 4;
    const int nthreads = (int)(blockDim.x * blockDim.y);
    const int tid = (int)(threadIdx.y * blockDim.x + threadIdx.x);
    const uint4 *w = (const uint4 *)((const uint16_t *)wt + (int64_t)cbase * TAPS);
    const int nv = ct / DW_VEC * TAPS;
    const int nvalid = (c - cbase < ct ? c - cbase : ct) / DW_VEC * TAPS;
    for (int v0 = tid; v0 < nv; v0 += U * nthreads) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int v = v0 + u * nthreads;
            raw[u] = v < nvalid ? __ldg(w + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int v = v0 + u * nthreads;
            if (v >= nv) break;
            const uint16_t *e = (const uint16_t *)&raw[u];
#pragma unroll
            for (int k = 0; k < DW_VEC; k++) {
                const int i = v * DW_VEC + k;
                ws[(i % TAPS) * ct + i / TAPS] = e[k];
            }
        }
    }
    __syncthreads();
}

// Channels c0 .. c0 + 7 of the bias (0 without one).
template <typename T>
__device__ __forceinline__ void dw_bias(const kiln_cuda_conv_geom &g, int c0, float *b0) {
    const T *bias = (const T *)g.bias;
#pragma unroll
    for (int k = 0; k < DW_VEC; k++) b0[k] = bias != NULL ? kc_to_f(bias[c0 + k]) : 0.0f;
}

// P pixels' accumulators for 8 channels, each starting at the bias.
template <int P>
__device__ __forceinline__ void dw_acc_init(float (&acc)[P][DW_VEC], const float *b0) {
#pragma unroll
    for (int p = 0; p < P; p++) {
#pragma unroll
        for (int k = 0; k < DW_VEC; k++) acc[p][k] = b0[k];
    }
}

// One pixel's 8 channels through the activation: a call, not inlined, so that the kernels share
// one copy of the seven activations' code (inlined into every kernel, over up to 32 values each,
// they were a quarter of op_conv.cu's compressed device code and took the runtime wheel over its
// 3 MB).
struct dw_f8 {
    float v[DW_VEC];
};
static __device__ __noinline__ dw_f8 dw_act8(dw_f8 x, int act, float lo, float hi) {
    kc_conv_act_all<DW_VEC>(x.v, act, lo, hi);
    return x;
}

// P output pixels of row oy from ox0 (those inside the row), 8 channels from c0: the activation
// applied before the one rounding, one 16-byte store each.
template <typename T, int P>
__device__ __forceinline__ void dw_store(const kiln_cuda_conv_geom &g, int n, int oy, int ox0,
                                         int c0, float (&acc)[P][DW_VEC], int act, float lo,
                                         float hi) {
    const int ow = (int)g.ow;
    T *yrow = (T *)g.y + (((int64_t)n * g.oh + oy) * ow) * g.c + c0;
#pragma unroll
    for (int p = 0; p < P; p++) {
        if (ox0 + p >= ow) break;
        if (act != KC_ACT_NONE) {
            dw_f8 t;
#pragma unroll
            for (int k = 0; k < DW_VEC; k++) t.v[k] = acc[p][k];
            t = dw_act8(t, act, lo, hi);
#pragma unroll
            for (int k = 0; k < DW_VEC; k++) acc[p][k] = t.v[k];
        }
        uint4 outv;
        T *ov = (T *)&outv;
#pragma unroll
        for (int k = 0; k < DW_VEC; k++) ov[k] = kc_from_f<T>(acc[p][k]);
        *(uint4 *)(yrow + (int64_t)(ox0 + p) * g.c) = outv;
    }
}

// A thread computes DW_PX consecutive output pixels of one row for 8 channels; a block covers
// bx channel vectors of by such strips at a time and walks the strips of its grid row. The
// filter taps sit in shared memory as [tap][channel] (copied from the OIHW [channel][tap] weight
// with coalesced reads), so a tap's weights for 8 channels are one 16-byte load, used for the
// strip's DW_PX pixels. K: the kernel size, unrolled (3 and 5: MobileNet's and EfficientNet's);
// 0 reads it from g. Indices are
// 32-bit (dw_fits bounds the sizes).
template <typename T, int K>
static __global__ void __launch_bounds__(DW_BLOCK)
    conv_dw_nhwc_kernel(const kiln_cuda_conv_geom g, int act, float lo, float hi) {
    extern __shared__ uint4 dw_smem[];
    T *ws = (T *)dw_smem;
    const int kh = K > 0 ? K : g.kh, kw = K > 0 ? K : g.kw, taps = kh * kw;
    const int ct = (int)blockDim.x * DW_VEC, cbase = (int)blockIdx.x * ct, c = (int)g.c;
    const T *x = (const T *)g.x;
    if constexpr (K > 0) {
        dw_stage_taps_vec<K * K>((uint16_t *)ws, g.w, c, ct, cbase);
    } else {
        dw_stage_taps<T>(ws, g, taps, ct, cbase);
    }
    const int c0 = cbase + (int)threadIdx.x * DW_VEC;
    if (c0 >= c) return;
    float b0[DW_VEC];
    dw_bias<T>(g, c0, b0);
    const T *wt = ws + threadIdx.x * DW_VEC;
    const int oh = (int)g.oh, ow = (int)g.ow, ih = (int)g.h, iw = (int)g.w_in;
    const int strips = (ow + DW_PX - 1) / DW_PX, total = (int)g.n * oh * strips;
    for (int q = (int)(blockIdx.y * blockDim.y + threadIdx.y); q < total;
         q += (int)(gridDim.y * blockDim.y)) {
        const int ox0 = (q % strips) * DW_PX, t = q / strips, oy = t % oh, n = t / oh;
        const T *xn = x + ((int64_t)n * ih * iw) * c + c0;
        float acc[DW_PX][DW_VEC];
        dw_acc_init<DW_PX>(acc, b0);
#pragma unroll
        for (int a = 0; a < kh; a++) {
            const int iy = oy * g.sh - g.ph + a * g.dh;
            if (iy < 0 || iy >= ih) continue;
            const T *row = xn + (int64_t)iy * iw * c;
#pragma unroll
            for (int b = 0; b < kw; b++) {
                const uint4 wraw = *(const uint4 *)(wt + (a * kw + b) * ct);
                const T *wv = (const T *)&wraw;
                float wf[DW_VEC];
#pragma unroll
                for (int k = 0; k < DW_VEC; k++) wf[k] = kc_to_f(wv[k]);
#pragma unroll
                for (int p = 0; p < DW_PX; p++) {
                    const int ix = (ox0 + p) * g.sw - g.pw + b * g.dw;
                    if (ox0 + p >= ow || ix < 0 || ix >= iw) continue;
                    const uint4 raw = __ldg((const uint4 *)(row + (int64_t)ix * c));
                    const T *xv = (const T *)&raw;
#pragma unroll
                    for (int k = 0; k < DW_VEC; k++) {
                        acc[p][k] = fmaf(kc_to_f(xv[k]), wf[k], acc[p][k]);
                    }
                }
            }
        }
        dw_store<T, DW_PX>(g, n, oy, ox0, c0, acc, act, lo, hi);
    }
}

// The same layer with each thread computing P consecutive output pixels of one row (8 channels)
// from one pass over the input columns they share: a row of taps loads (P - 1) * S + K columns
// once into registers (each converted once) instead of P * K, so a stride-1 3x3 issues half the
// loads and conversions, a 5x5 a third. Taken for K 3 and 5, stride S 1 or 2, dilation 1, when
// the layer has enough pixels to fill the device with P-pixel threads, and for K 7, stride 1
// (dw_rows_pays); columns outside the input read as zero, which adds nothing.
template <typename T, int K, int S, int P>
static __global__ void __launch_bounds__(DW_BLOCK)
    conv_dw_rows_kernel(const kiln_cuda_conv_geom g, int act, float lo, float hi) {
    constexpr int NC = (P - 1) * S + K; // input columns per row of taps
    extern __shared__ uint4 dw_smem[];
    T *ws = (T *)dw_smem;
    const int ct = (int)blockDim.x * DW_VEC, cbase = (int)blockIdx.x * ct, c = (int)g.c;
    const T *x = (const T *)g.x;
    dw_stage_taps_vec<K * K>((uint16_t *)ws, g.w, c, ct, cbase);
    const int c0 = cbase + (int)threadIdx.x * DW_VEC;
    if (c0 >= c) return;
    float b0[DW_VEC];
    dw_bias<T>(g, c0, b0);
    const T *wt = ws + threadIdx.x * DW_VEC;
    const int oh = (int)g.oh, ow = (int)g.ow, ih = (int)g.h, iw = (int)g.w_in;
    const int strips = (ow + P - 1) / P, total = (int)g.n * oh * strips;
    for (int q = (int)(blockIdx.y * blockDim.y + threadIdx.y); q < total;
         q += (int)(gridDim.y * blockDim.y)) {
        const int ox0 = (q % strips) * P, t = q / strips, oy = t % oh, n = t / oh;
        const int ix0 = ox0 * S - g.pw;
        const T *xn = x + ((int64_t)n * ih * iw) * c + c0;
        float acc[P][DW_VEC];
        dw_acc_init<P>(acc, b0);
#pragma unroll
        for (int a = 0; a < K; a++) {
            const int iy = oy * S - g.ph + a;
            if (iy < 0 || iy >= ih) continue;
            const T *row = xn + (int64_t)iy * iw * c;
            uint4 xr[NC];
#pragma unroll
            for (int j = 0; j < NC; j++) {
                const int ix = ix0 + j;
                xr[j] = ix >= 0 && ix < iw ? __ldg((const uint4 *)(row + (int64_t)ix * c))
                                           : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int b = 0; b < K; b++) {
                const uint4 wraw = *(const uint4 *)(wt + (a * K + b) * ct);
                const T *wv = (const T *)&wraw;
                float wf[DW_VEC];
#pragma unroll
                for (int k = 0; k < DW_VEC; k++) wf[k] = kc_to_f(wv[k]);
#pragma unroll
                for (int p = 0; p < P; p++) {
                    const T *xv = (const T *)&xr[p * S + b];
#pragma unroll
                    for (int k = 0; k < DW_VEC; k++) {
                        acc[p][k] = fmaf(kc_to_f(xv[k]), wf[k], acc[p][k]);
                    }
                }
            }
        }
        dw_store<T, P>(g, n, oy, ox0, c0, acc, act, lo, hi);
    }
}

// A 7x7 of stride 1 through shared memory: a block takes 8 channels (one 16-byte vector a pixel)
// of TH output rows of one image, loads the rows' input tile (TH + 6 rows x OW + 6 columns, zeros
// outside the input) and the 49 taps of those channels with every load in flight at once, then
// each thread computes P consecutive output pixels of a row from the tile. The row kernel's
// threads walk the seven input rows one load round trip after another, after staging the block's
// taps of all its channels: at batch 1 on ConvFormer's and ConvNeXt's maps (56x56 down to 7x7)
// that chain, not the bytes, set the time (15-17 us a layer whatever its size).
#define DW_TILE_K 7
#define DW_TILE_P 2         // output pixels of a row per thread
#define DW_TILE_THREADS 256 // most threads a block runs (TH is chosen to fit)
#define DW_TILE_SMEM 40960  // bytes of input tile a block may stage

// A conv prologue (cuda_fold.h) as the tile kernel applies it: the ops, whether the running value
// is the left operand, each binary op's one-element operand, a clamp's bounds.
typedef struct dw_pre {
    int n; // 0: none
    uint32_t op[KILN_CUDA_PRE_MAX];
    int lhs[KILN_CUDA_PRE_MAX];
    const void *k[KILN_CUDA_PRE_MAX]; // NULL for relu and clamp
    uint32_t k_dt[KILN_CUDA_PRE_MAX];
    float lo[KILN_CUDA_PRE_MAX], hi[KILN_CUDA_PRE_MAX];
} dw_pre;

// The prologue of ctx (its producer's tail ops) in that form; 0 when the kernel cannot take one
// of them (the caller then runs them as a pass over the input first).
static int dw_pre_of(const kiln_cuda_ctx *ctx, dw_pre *pre) {
    memset(pre, 0, sizeof *pre);
    if (ctx->n_pre > KILN_CUDA_PRE_MAX) return 0;
    for (uint32_t s = 0; s < ctx->n_pre; s++) {
        const kiln_tail_op *t = &ctx->pre[s];
        pre->op[s] = t->op;
        pre->lhs[s] = t->running_is_lhs != 0;
        if (t->operand == NULL) {
            if (t->op != KILN_OP_RELU && t->op != KILN_OP_CLAMP) return 0;
            (void)kc_conv_act_of(t, &pre->lo[s], &pre->hi[s]);
            continue;
        }
        // (a pow is the running value squared: the fold took no other)
        if (kc_numel(t->operand) != 1 || !kiln_cuda_is_float(t->operand->dtype) ||
            (t->op != KILN_OP_ADD && t->op != KILN_OP_SUB && t->op != KILN_OP_MUL &&
             t->op != KILN_OP_MAXIMUM && t->op != KILN_OP_MINIMUM &&
             (t->op != KILN_OP_POW || !t->running_is_lhs)))
            return 0;
        pre->k[s] = t->operand->data;
        pre->k_dt[s] = t->operand->dtype;
    }
    pre->n = (int)ctx->n_pre;
    return 1;
}

__device__ __forceinline__ float dw_pre_scalar(const void *p, uint32_t dt) {
    if (dt == KILN_DTYPE_F16) return __half2float(*(const __half *)p);
    if (dt == KILN_DTYPE_BF16) return __bfloat162float(*(const __nv_bfloat16 *)p);
    return *(const float *)p;
}

// The prologue's step s as the block stages it in shared memory: the op (bit 31: the running value
// is the right operand), its operand's value, a clamp's bounds.
typedef struct dw_pre_step {
    uint32_t op;
    float k, lo, hi;
} dw_pre_step;
#define DW_PRE_RHS 0x80000000u

// The n steps over one 16-byte vector of input values, the result rounded to T (the value the
// producer's tail pass would have stored), as op_eltwise.cu's lite kernels compute them (a pow
// is a square: the fold takes no other exponent). One copy of each op's code: the steps come
// from shared memory, the values stay in registers.
template <typename T>
__device__ __forceinline__ uint4 dw_pre_apply(const dw_pre_step *st, int n, uint4 u) {
    T *h = (T *)&u;
    float v[DW_VEC];
#pragma unroll
    for (int e = 0; e < DW_VEC; e++) v[e] = kc_to_f(h[e]);
    for (int s = 0; s < n; s++) {
        const dw_pre_step q = st[s];
        const int rhs = (q.op & DW_PRE_RHS) != 0;
        switch (q.op & ~DW_PRE_RHS) {
#define DW_PRE_CASE(OP, EXPR)                                                                      \
    case OP:                                                                                       \
        _Pragma("unroll") for (int e = 0; e < DW_VEC; e++) {                                       \
            const float x = v[e];                                                                  \
            v[e] = (EXPR);                                                                         \
        }                                                                                          \
        break;
            DW_PRE_CASE(KILN_OP_RELU, x < 0.0f ? 0.0f : x)
            DW_PRE_CASE(KILN_OP_CLAMP, x < q.lo ? q.lo : x > q.hi ? q.hi : x)
            DW_PRE_CASE(KILN_OP_POW, x * x)
            DW_PRE_CASE(KILN_OP_ADD, x + q.k)
            DW_PRE_CASE(KILN_OP_SUB, rhs ? q.k - x : x - q.k)
            DW_PRE_CASE(KILN_OP_MUL, x * q.k)
            DW_PRE_CASE(KILN_OP_MAXIMUM, x != x || q.k != q.k ? NAN : fmaxf(x, q.k))
            DW_PRE_CASE(KILN_OP_MINIMUM, x != x || q.k != q.k ? NAN : fminf(x, q.k))
#undef DW_PRE_CASE
        default: break;
        }
    }
#pragma unroll
    for (int e = 0; e < DW_VEC; e++) h[e] = kc_from_f<T>(v[e]);
    return u;
}

template <typename T>
static __global__ void __launch_bounds__(DW_TILE_THREADS)
    conv_dw_tile_kernel(const kiln_cuda_conv_geom g, int th, int act, float lo, float hi,
                        const dw_pre pre) {
    constexpr int K = DW_TILE_K, P = DW_TILE_P, NC = P - 1 + K;
    extern __shared__ uint4 dw_smem[];
    const int c = (int)g.c, ih = (int)g.h, iw = (int)g.w_in, oh = (int)g.oh, ow = (int)g.ow;
    const int tw = ow + K - 1, tiles = (oh + th - 1) / th;
    const int c0 = (int)blockIdx.x * DW_VEC, n = (int)blockIdx.y / tiles;
    const int oy0 = ((int)blockIdx.y - n * tiles) * th, rows = min(th, oh - oy0) + K - 1;
    const int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    uint4 *tile = dw_smem, *taps = dw_smem + rows * tw;
    // the taps: element i of the block's [8 channels][49] slice of the OIHW weight (contiguous)
    // to [tap][channel]
    const uint16_t *w = (const uint16_t *)g.w + (int64_t)c0 * K * K;
    for (int i = tid; i < DW_VEC * K * K; i += nt) {
        ((uint16_t *)taps)[(i % (K * K)) * DW_VEC + i / (K * K)] = __ldg(w + i);
    }
    const T *xn = (const T *)g.x + (int64_t)n * ih * iw * c + c0;
    constexpr int U = 8; // loads in flight per thread before their stores
    for (int j0 = tid; j0 < rows * tw; j0 += U * nt) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * nt, r = j / tw, iy = oy0 - (int)g.ph + r;
            const int ix = j - r * tw - (int)g.pw;
            v[u] = j < rows * tw && iy >= 0 && iy < ih && ix >= 0 && ix < iw
                       ? __ldg((const uint4 *)(xn + ((int64_t)iy * iw + ix) * c))
                       : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (j0 + u * nt < rows * tw) tile[j0 + u * nt] = v[u];
        }
    }
    __shared__ dw_pre_step pre_st[KILN_CUDA_PRE_MAX];
#pragma unroll
    for (int s = 0; s < KILN_CUDA_PRE_MAX; s++) { // static indices: the parameters stay in place
        if (tid == s && s < pre.n) {
            pre_st[s].op = pre.op[s] | (pre.lhs[s] ? 0u : DW_PRE_RHS);
            pre_st[s].k = pre.k[s] != NULL ? dw_pre_scalar(pre.k[s], pre.k_dt[s]) : 0.0f;
            pre_st[s].lo = pre.lo[s];
            pre_st[s].hi = pre.hi[s];
        }
    }
    float b0[DW_VEC];
    dw_bias<T>(g, c0, b0);
    __syncthreads();
    if (pre.n > 0) { // the producer's tail over the staged values; the zero padding stays zero
#pragma unroll 1
        for (int j = tid; j < rows * tw; j += nt) {
            const int r = j / tw, iy = oy0 - (int)g.ph + r, ix = j - r * tw - (int)g.pw;
            if (iy >= 0 && iy < ih && ix >= 0 && ix < iw)
                tile[j] = dw_pre_apply<T>(pre_st, pre.n, tile[j]);
        }
        __syncthreads();
    }
    const int strips = (ow + P - 1) / P;
    for (int q = tid; q < (rows - K + 1) * strips; q += nt) {
        const int r = q / strips, ox0 = (q - r * strips) * P;
        float acc[P][DW_VEC];
        dw_acc_init<P>(acc, b0);
#pragma unroll
        for (int a = 0; a < K; a++) {
            const uint4 *row = tile + (r + a) * tw + ox0;
            float xf[NC][DW_VEC];
#pragma unroll
            for (int j = 0; j < NC; j++) {
                // the last strip of an odd row reads one column past the tile's width: its
                // pixel is not stored
                const uint4 u = ox0 + j < tw ? row[j] : make_uint4(0u, 0u, 0u, 0u);
                const T *h = (const T *)&u;
#pragma unroll
                for (int k = 0; k < DW_VEC; k++) xf[j][k] = kc_to_f(h[k]);
            }
#pragma unroll
            for (int b = 0; b < K; b++) {
                const uint4 wu = taps[a * K + b];
                const T *wv = (const T *)&wu;
#pragma unroll
                for (int k = 0; k < DW_VEC; k++) {
                    const float wf = kc_to_f(wv[k]);
#pragma unroll
                    for (int p = 0; p < P; p++) acc[p][k] = fmaf(xf[p + b][k], wf, acc[p][k]);
                }
            }
        }
        dw_store<T, P>(g, n, oy0 + r, ox0, c0, acc, act, lo, hi);
    }
}

// Output rows per block of the tile kernel (0: the layer does not take it): about 128 threads of
// P pixels, fewer rows while the launch would leave SMs without two blocks, within the tile's
// shared memory.
static int dw_tile_rows(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g) {
    if (g->kh != DW_TILE_K || g->kw != DW_TILE_K || g->sh != 1 || g->sw != 1 || g->dh != 1 ||
        g->dw != 1)
        return 0;
    const int64_t strips = (g->ow + DW_TILE_P - 1) / DW_TILE_P, tw = g->ow + DW_TILE_K - 1;
    if (strips > DW_TILE_THREADS || DW_TILE_K * tw * 16 > DW_TILE_SMEM) return 0;
    int64_t th = 128 / strips;
    if (th < 1) th = 1;
    if (th > g->oh) th = g->oh;
    while (th > 1 && (th + DW_TILE_K - 1) * tw * 16 > DW_TILE_SMEM) th--;
    while (th > 1 && ctx->sm_count > 0 &&
           g->c / DW_VEC * g->n * ((g->oh + th - 1) / th) < 2 * (int64_t)ctx->sm_count)
        th = (th + 1) / 2;
    const int64_t tiles = (g->oh + th - 1) / th;
    if (g->n * tiles > 65535) return 0;        // grid y
    return (int)((g->oh + tiles - 1) / tiles); // tiles of even height
}

#define DW_ROW_PX 4 // output pixels per thread of the row kernel

// Whether the row kernel takes the layer: its unrolled shapes and (cuda.dw_rows auto) enough
// 4-pixel threads to keep the SMs busy. A 5x5 saves 45-60% of the loads and conversions and pays
// from 14 warps per SM; a 3x3 saves 25-50% and pays only with the SMs full (64 warps each).
// Measured per layer on EfficientNet-B0 (H200, docs/benchmarks.md): at batch 32 its 5x5 layers
// of 64-188 thousand such threads ran 2-19% faster and its 3x3 layers of a full wave 9-12%;
// its 5x5 layer of 38 thousand and two 3x3 layers under a full wave 9-21% slower; at batch 1
// every layer was slower (none is taken).
static int dw_rows_pays(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g) {
    if (g->kh != g->kw || (g->kh != 3 && g->kh != 5) || (g->sh != 1 && g->sh != 2) ||
        g->sw != g->sh || g->dh != 1 || g->dw != 1 || ctx->policy->dw_rows < 0)
        return 0;
    if (ctx->policy->dw_rows > 0) return 1;
    if (ctx->sm_count <= 0) return 0;
    const int64_t threads = g->n * g->oh * ((g->ow + DW_ROW_PX - 1) / DW_ROW_PX) * (g->c / DW_VEC);
    return threads >= (int64_t)ctx->sm_count * (g->kh == 5 ? 14 : 64) * 32;
}

// The block's shape for C channels: bx channel vectors (the largest divisor of C / 8 up to 32,
// so that no thread idles at the channel edge), by = DW_BLOCK / bx strips of pixels.
static void dw_block(int64_t c, unsigned *bx, unsigned *by) {
    const int64_t cv = c / DW_VEC;
    unsigned b = cv < DW_MAX_BX ? (unsigned)cv : DW_MAX_BX;
    while (b > 1 && cv % b != 0) b--;
    if (b < DW_MAX_BX / 2 && cv > DW_MAX_BX) b = DW_MAX_BX; // no good divisor: a ragged edge
    *bx = b;
    *by = DW_BLOCK / b;
}

// Whether the depthwise kernel takes the layer: NHWC, one channel per group, 16-bit operands of
// one dtype, C % 8 == 0 without channel padding, 16-byte aligned input and output.
static int dw_fits(const kiln_cuda_conv_geom *g) {
    return g->nhwc && !g->transposed && g->groups == g->c && g->o == g->c && g->cg == 1 &&
           g->og == 1 && g->c % DW_VEC == 0 && g->xcs == g->c && g->wcs <= 1 &&
           (g->x_dt == KILN_DTYPE_F16 || g->x_dt == KILN_DTYPE_BF16) && g->w_dt == g->x_dt &&
           g->y_dt == g->x_dt && (g->bias == NULL || g->bias_dt == g->x_dt) &&
           g->kh * g->kw <= DW_MAX_TAPS && g->n * g->oh * g->ow < INT32_MAX &&
           g->h * g->w_in < INT32_MAX && kiln_cuda_align_of(g->x) >= 16 &&
           kiln_cuda_align_of(g->y) >= 16 && kiln_cuda_align_of(g->w) >= 16;
}

template <typename T>
static void dw_launch(int k, int rows, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                      const kiln_cuda_conv_geom *g, int act, float lo, float hi) {
    if (rows) {
        const int s = g->sh;
        if (k == 3 && s == 1)
            conv_dw_rows_kernel<T, 3, 1, DW_ROW_PX><<<grid, block, smem, st>>>(*g, act, lo, hi);
        else if (k == 3)
            conv_dw_rows_kernel<T, 3, 2, DW_ROW_PX><<<grid, block, smem, st>>>(*g, act, lo, hi);
        else if (s == 1)
            conv_dw_rows_kernel<T, 5, 1, DW_ROW_PX><<<grid, block, smem, st>>>(*g, act, lo, hi);
        else
            conv_dw_rows_kernel<T, 5, 2, DW_ROW_PX><<<grid, block, smem, st>>>(*g, act, lo, hi);
        return;
    }
    switch (k) {
    case 3: conv_dw_nhwc_kernel<T, 3><<<grid, block, smem, st>>>(*g, act, lo, hi); break;
    case 5: conv_dw_nhwc_kernel<T, 5><<<grid, block, smem, st>>>(*g, act, lo, hi); break;
    default: conv_dw_nhwc_kernel<T, 0><<<grid, block, smem, st>>>(*g, act, lo, hi); break;
    }
}

static kiln_status conv_dw(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                           const kiln_cuda_conv_geom *g, const dw_pre &pre, uint32_t *fused) {
    float lo = 0.0f, hi = 0.0f;
    int act = args->n_tail > 0 && args->tail[0].operand == NULL
                  ? kc_conv_act_of(&args->tail[0], &lo, &hi)
                  : KC_ACT_NONE;
    *fused = act != KC_ACT_NONE;
    const int th = dw_tile_rows(ctx, g);
    if (th > 0) {
        const int64_t strips = (g->ow + DW_TILE_P - 1) / DW_TILE_P, tw = g->ow + DW_TILE_K - 1;
        int64_t nt = (th * strips + 31) / 32 * 32;
        if (nt > DW_TILE_THREADS) nt = DW_TILE_THREADS;
        const dim3 grid((unsigned)(g->c / DW_VEC), (unsigned)(g->n * ((g->oh + th - 1) / th)));
        const size_t smem = (size_t)((th + DW_TILE_K - 1) * tw + DW_TILE_K * DW_TILE_K) * 16;
        if (g->x_dt == KILN_DTYPE_F16)
            conv_dw_tile_kernel<__half>
                <<<grid, (unsigned)nt, smem, ctx->stream>>>(*g, th, act, lo, hi, pre);
        else
            conv_dw_tile_kernel<__nv_bfloat16>
                <<<grid, (unsigned)nt, smem, ctx->stream>>>(*g, th, act, lo, hi, pre);
        return kiln_cuda_check_launch(ctx, "conv_dw_tile_kernel");
    }
    unsigned bx, by;
    dw_block(g->c, &bx, &by);
    const int rows = dw_rows_pays(ctx, g);
    const int px = rows ? DW_ROW_PX : DW_PX;
    const int64_t strips = g->n * g->oh * ((g->ow + px - 1) / px);
    const unsigned gx = (unsigned)((g->c / DW_VEC + bx - 1) / bx);
    // about eight blocks per SM of a large GPU: each block stages its taps once and walks
    // several strips
    int64_t gy = (strips + by - 1) / by, cap = (DW_GRID + gx - 1) / gx;
    // a small map (batch 1, 14x14 or 7x7) would leave most SMs idle with full blocks: fewer
    // strips per block (down to two warps) until there are two blocks per SM
    while (ctx->sm_count > 0 && gx * gy < 2 * (int64_t)ctx->sm_count && by > 1 &&
           bx * ((by + 1) / 2) >= 64) {
        by = (by + 1) / 2;
        gy = (strips + by - 1) / by;
    }
    if (gy > cap) gy = cap;
    const dim3 grid(gx, (unsigned)(gy > 0 ? gy : 1)), block(bx, by);
    const size_t smem = (size_t)g->kh * g->kw * bx * DW_VEC * kiln_cuda_dtype_size(g->x_dt);
    // (a 7x7 of stride 1 runs in tiles above; other 7x7s take the generic form, taps not
    // unrolled)
    const int k = g->kh == g->kw && (g->kh == 3 || g->kh == 5) ? g->kh : 0;
    if (g->x_dt == KILN_DTYPE_F16) {
        dw_launch<__half>(k, rows, grid, block, smem, ctx->stream, g, act, lo, hi);
    } else {
        dw_launch<__nv_bfloat16>(k, rows, grid, block, smem, ctx->stream, g, act, lo, hi);
    }
    return kiln_cuda_check_launch(ctx, "conv_dw_nhwc_kernel");
}

extern "C" kiln_status kiln_cuda_conv_geom_of(const kiln_cuda_ctx *ctx,
                                              const kiln_kernel_args *args, int transposed,
                                              kiln_cuda_conv_geom *g) {
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    const kiln_tensor *bias = args->n_in > 2 ? args->in[2] : NULL;
    const kiln_tensor *y = args->out;
    const kiln_attrs *at = &args->attrs;
    memset(g, 0, sizeof *g);
    if (x == NULL || w == NULL || x->rank != 4 || w->rank != 4 || y->rank != 4 ||
        !kiln_cuda_is_float(x->dtype) || !kiln_cuda_is_float(w->dtype) ||
        !kiln_cuda_is_float(y->dtype) || (bias != NULL && !kiln_cuda_is_float(bias->dtype))) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda %s: needs 4-D float input, weight and output at %s",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    uint32_t ai_stride = transposed ? KILN_A_CONVT_STRIDE : KILN_A_CONV_STRIDE;
    uint32_t ai_pad = transposed ? KILN_A_CONVT_PADDING : KILN_A_CONV_PADDING;
    uint32_t ai_dil = transposed ? KILN_A_CONVT_DILATION : KILN_A_CONV_DILATION;
    g->groups = kiln_attrs_int(at, transposed ? KILN_A_CONVT_GROUPS : KILN_A_CONV_GROUPS, 0);
    g->x = x->data;
    g->w = w->data;
    g->bias = bias ? bias->data : NULL;
    g->y = y->data;
    g->x_dt = x->dtype;
    g->w_dt = w->dtype;
    g->bias_dt = bias ? bias->dtype : 0;
    g->y_dt = y->dtype;
    g->n = x->dims[0];
    g->c = x->dims[1];
    g->h = x->dims[2];
    g->w_in = x->dims[3];
    g->o = y->dims[1];
    g->oh = y->dims[2];
    g->ow = y->dims[3];
    g->kh = (int)w->dims[2];
    g->kw = (int)w->dims[3];
    g->sh = (int)kiln_attrs_int(at, ai_stride, 0);
    g->sw = (int)kiln_attrs_int(at, ai_stride, 1);
    g->ph = (int)kiln_attrs_int(at, ai_pad, 0);
    g->pw = (int)kiln_attrs_int(at, ai_pad, 1);
    g->dh = (int)kiln_attrs_int(at, ai_dil, 0);
    g->dw = (int)kiln_attrs_int(at, ai_dil, 1);
    g->transposed = transposed;
    g->nhwc = !transposed && ctx->nhwc;
    g->xcs = g->nhwc && ctx->x_cpad > x->dims[1] ? ctx->x_cpad : x->dims[1];
    if (g->nhwc && ctx->w_krsc != NULL) {
        g->w = ctx->w_krsc;
        g->wcs = ctx->w_krsc_cs;
    }
    if (g->groups <= 0 || g->c % g->groups != 0 || g->o % g->groups != 0 || g->sh <= 0 ||
        g->sw <= 0 || g->dh <= 0 || g->dw <= 0 || y->dims[0] != g->n) {
        return kiln_cuda_fail(
            KILN_ERR_INVALID_ARG, "cuda %s: bad groups %lld, strides or dilations at %s",
            kiln_cuda_op_name(args->op), (long long)g->groups, ctx->where ? ctx->where : "?");
    }
    g->cg = g->c / g->groups;
    g->og = g->o / g->groups;
    int64_t wo = transposed ? w->dims[1] * g->groups : w->dims[0];
    int64_t wc = transposed ? w->dims[0] : w->dims[1] * g->groups;
    if (wo != g->o || wc != g->c || (bias != NULL && kc_numel(bias) != g->o)) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda %s: weight or bias shape mismatch at %s",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    return KILN_OK;
}

// Kiln's own kernels (direct for few output channels per group, else the implicit GEMM).
static kiln_status conv_own(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g) {
    const int64_t cols = g->n * g->oh * g->ow;
    if (g->og < DIRECT_MAX_OG) {
        int64_t total = cols * g->o;
        conv_direct_kernel<<<kc_blocks(total, DIRECT_BLOCK), DIRECT_BLOCK, 0, ctx->stream>>>(*g);
        return kiln_cuda_check_launch(ctx, "conv_direct_kernel");
    }
    conv_loader ld = {*g};
    int64_t depth = g->cg * g->kh * g->kw;
    tiled_gemm_kernel<conv_loader><<<tg_grid(g->og, cols, g->groups), TG_THREADS, 0, ctx->stream>>>(
        ld, g->og, cols, depth, g->groups);
    return kiln_cuda_check_launch(ctx, "tiled_gemm_kernel (conv)");
}

static kiln_cuda_kernel own_kernel(const kiln_cuda_conv_geom *g) {
    return g->og < DIRECT_MAX_OG ? KILN_CUDA_K_CONV_DIRECT : KILN_CUDA_K_CONV_GEMM;
}

// The channel-padded view of the input cuDNN sees (the zero channels, and zero filters).
static kiln_cuda_conv_geom dnn_geom(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g) {
    kiln_cuda_conv_geom d = *g;
    d.c = g->xcs;
    (void)ctx; // (NHWC: w is the KRSC copy already)
    return d;
}

extern "C" void kiln_cuda_conv2d_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                     int64_t *key) {
    kiln_cuda_conv_geom g;
    memset(key, 0, KILN_CUDA_PLAN_KEY * sizeof *key);
    key[0] = KILN_OP_CONV2D;
    if (kiln_cuda_conv_geom_of(ctx, args, 0, &g) != KILN_OK) {
        kiln_cuda_consume();
        key[0] = -1; // never current: planning reports the error
        return;
    }
    const int64_t v[] = {
        g.n,
        g.c,
        g.h,
        g.w_in,
        g.o,
        g.oh,
        g.ow,
        g.groups,
        g.kh,
        g.kw,
        g.sh,
        g.sw,
        g.ph,
        g.pw,
        g.dh,
        g.dw,
        g.xcs,
        g.nhwc,
        ctx->stem,
        ctx->w_krsc != NULL,
        (int64_t)g.x_dt | ((int64_t)g.w_dt << 8) | ((int64_t)g.y_dt << 16) |
            ((int64_t)(g.bias_dt + 1) << 24) * (g.bias != NULL),
        kiln_cuda_align_of(g.x),
        kiln_cuda_align_of(g.y),
        args->n_tail > 0 ? args->tail[0].op : 0,
        args->n_tail > 1 ? args->tail[1].op : 0,
        args->n_tail > 0 && args->tail[0].operand != NULL ? args->tail[0].operand->rank : 0};
    memcpy(key + 1, v, sizeof v);
}

// Whether the pointwise kernel is a candidate for the layer (cuda.conv_pw not off).
static int pw_wanted(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g) {
    return ctx->policy->conv_pw >= 0 && kiln_cuda_pw_fits(g);
}

// Whether Kiln's own implicit GEMM is timed against cuDNN: a 16-bit 1x1 conv of groups 1 over an
// NCHW tensor (channels that are no multiple of 8, which no NHWC kernel takes: ShuffleNetV2's 58
// and 116, ReXNet's). cuDNN runs those on a channel-padded copy with FMA implicit GEMMs.
static int own_wanted(const kiln_cuda_conv_geom *g) {
    return !g->nhwc && !g->transposed && g->groups == 1 && g->kh == 1 && g->kw == 1 &&
           (g->x_dt == KILN_DTYPE_F16 || g->x_dt == KILN_DTYPE_BF16) && g->og >= DIRECT_MAX_OG;
}

// Such a conv (stride 1, no padding, one dtype) as a cuBLASLt GEMM per image: column-major
// D (H*W x O, the image's NCHW output planes) = X (H*W x C, its input planes) * W^T (C x O, the
// OIHW weight as stored), the images a strided batch sharing the weight (stride 0). The bias,
// per output channel (a column of D, which cuBLASLt's bias epilogue does not take), and the
// tail run after in one elementwise pass. 0 when the layer is not of that form.
static int conv_lt_problem(const kiln_cuda_conv_geom *g, const kiln_kernel_args *args,
                           kiln_cuda_lt_problem *p);

// An NHWC 1x1 conv of stride 1 (the pointwise kernel's layers that read every pixel) as a linear
// over the pixels: column-major D (O x P, the NHWC output) = W (its KRSC rows, stored C x O,
// transposed) * X (C x P, the pixels' channel vectors), the bias per output channel and a first
// tail ReLU, tanh GELU or residual add in cuBLASLt's epilogue (MetaFormer's and ConvNeXt-style
// MLPs written as linears over channels-last maps, an inverted residual's projection with its
// skip). 0 when the layer is not of that form.
static int conv_lt_nhwc_problem(const kiln_cuda_conv_geom *g, const kiln_kernel_args *args,
                                kiln_cuda_lt_problem *p) {
    const int64_t pixels = g->n * g->oh * g->ow;
    if (args == NULL || !kiln_cuda_pw_fits(g) || g->sh != 1 || g->sw != 1 || g->oh != g->h ||
        g->ow != g->w_in || pixels < 1 || pixels > INT32_MAX)
        return 0;
    memset(p, 0, sizeof *p);
    p->dtype = g->y_dt;
    p->trans_a = 1;
    p->m = g->o;
    p->n = pixels;
    p->k = g->c;
    p->lda = g->wcs;
    p->ldb = g->xcs;
    p->ldd = g->o;
    p->batch = 1;
    p->a = g->w;
    p->b = g->x;
    p->bias = g->bias;
    p->d = g->y;
    p->relu = kiln_cuda_tail_relu_first(args);
    p->gelu = kiln_cuda_tail_gelu_tanh_first(args);
    p->c = p->relu || p->gelu ? NULL : kiln_cuda_tail_residual_first(args);
    return 1;
}

static int conv_lt_problem(const kiln_cuda_conv_geom *g, const kiln_kernel_args *args,
                           kiln_cuda_lt_problem *p) {
    if (g->nhwc) return conv_lt_nhwc_problem(g, args, p);
    if (!own_wanted(g) || g->sh != 1 || g->sw != 1 || g->ph != 0 || g->pw != 0 || g->wcs != 0 ||
        g->w_dt != g->x_dt || g->y_dt != g->x_dt || (g->bias != NULL && g->bias_dt != g->y_dt) ||
        g->oh != g->h || g->ow != g->w_in || g->n < 1 || g->n > INT32_MAX)
        return 0;
    const int64_t hw = g->oh * g->ow;
    memset(p, 0, sizeof *p);
    p->dtype = g->y_dt;
    p->m = hw;
    p->n = g->o;
    p->k = g->c;
    p->lda = hw;
    p->ldb = g->c;
    p->ldd = hw;
    p->batch = g->n;
    p->stride_a = g->c * hw;
    p->stride_b = 0;
    p->stride_d = g->o * hw;
    p->a = g->x;
    p->b = g->w;
    p->d = g->y;
    return hw > 0 && g->c > 0;
}

// Sets up the layer's cuBLASLt GEMM (the heuristic's first algorithm) in plan->gemm.lt: 1 when
// cuBLASLt takes it.
static int conv_lt_setup(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                         const kiln_cuda_conv_geom *g, kiln_cuda_layer_plan *plan) {
    kiln_cuda_lt_problem lp;
    cublasLtMatmulAlgo_t algo;
    size_t algo_ws = 0;
    int n_algo = 0;
    plan->conv.lt_nhwc = g->nhwc;
    return conv_lt_problem(g, args, &lp) &&
           kiln_cuda_lt_setup(ctx, &lp, 1, &algo, &algo_ws, &n_algo, &plan->gemm.lt) && n_algo > 0;
}

// The tail ops the NHWC form's epilogue applies (0 or 1; the NCHW form applies none).
static uint32_t conv_lt_fuses(const kiln_cuda_conv_geom *g, const kiln_kernel_args *args) {
    kiln_cuda_lt_problem p;
    return g->nhwc && conv_lt_nhwc_problem(g, args, &p) && (p.relu || p.gelu || p.c != NULL);
}

// The GEMM, then bias + tail in one elementwise pass (in place on y); *done = 0 when cuBLASLt
// refused before any work was enqueued.
static kiln_status conv_lt_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                               const kiln_cuda_conv_geom *g, kiln_cuda_layer_plan *plan,
                               int *done) {
    kiln_cuda_lt_problem p;
    *done = 0;
    if (!conv_lt_problem(g, args, &p)) return KILN_OK;
    if (kiln_cuda_lt_exec(ctx, &p, &plan->gemm.lt, NULL) != CUBLAS_STATUS_SUCCESS) return KILN_OK;
    *done = 1;
    if (g->nhwc) return kiln_cuda_tail(ctx, args, p.relu || p.gelu || p.c != NULL);
    if (g->bias == NULL) return kiln_cuda_tail(ctx, args, 0);
    kiln_tensor bias4 = *args->in[2]; // [O] viewed as [1, O, 1, 1]
    bias4.rank = 4;
    bias4.dims[0] = 1, bias4.dims[1] = g->o, bias4.dims[2] = 1, bias4.dims[3] = 1;
    kiln_kernel_args ba = *args;
    ba.op = KILN_OP_ADD;
    memset(&ba.attrs, 0, sizeof ba.attrs);
    ba.in[0] = args->out;
    ba.in[1] = &bias4;
    ba.n_in = 2;
    return kiln_cuda_binary(ctx, &ba);
}

// The tail ops cuDNN's fused call can take (dnn_conv.c): [an add of y's shape] then [ReLU].
static uint32_t dnn_fuses(const kiln_kernel_args *args) {
    uint32_t next = 0;
    const kiln_tensor *y = args->out;
    if (args->n_tail > 0 && args->tail[0].op == KILN_OP_ADD && args->tail[0].operand != NULL &&
        args->tail[0].operand->dtype == y->dtype && args->tail[0].operand->rank == 4 &&
        memcmp(args->tail[0].operand->dims, y->dims, 4 * sizeof(int64_t)) == 0)
        next = 1;
    return next + (args->n_tail > next && args->tail[next].op == KILN_OP_RELU);
}

typedef struct timed_conv {
    const kiln_cuda_ctx *ctx;
    const kiln_kernel_args *args;
    kiln_cuda_layer_plan *plan;
} timed_conv;

static int conv_enqueue(void *arg) {
    const timed_conv *t = (const timed_conv *)arg;
    return kiln_cuda_conv2d_run(t->ctx, t->args, t->plan) == KILN_OK;
}

// The layer run as cuBLASLt's GEMM (conv_lt_setup: the heuristic's first algorithm), timed as
// the engine runs it; -1 when cuBLASLt does not take the layer or refuses it at run. *g: the
// layer's geometry.
static float lt_time(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                     kiln_cuda_layer_plan *plan, timed_conv *t, kiln_cuda_conv_geom *g) {
    if (kiln_cuda_conv_geom_of(ctx, args, 0, g) != KILN_OK || !conv_lt_setup(ctx, args, g, plan))
        return -1.0f;
    *t->plan = *plan;
    t->plan->kernel = KILN_CUDA_K_CONV_LT;
    const float us = kiln_cuda_time_in_graph(ctx->stream, conv_enqueue, t);
    return t->plan->kernel == KILN_CUDA_K_CONV_LT ? us : -1.0f; // (refused at run: fell back)
}

// A 1x1 conv that cuDNN takes, at context creation: cuDNN's algorithm and the pointwise kernel
// each timed as the engine runs them (inside a CUDA graph, with the tail ops each leaves to the
// tail kernel), the faster kept.
static void pw_tune(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                    kiln_cuda_layer_plan *plan) {
    kiln_cuda_layer_plan cand = *plan; // shares cuDNN's descriptors: never released
    timed_conv t = {ctx, args, &cand};
    const float dnn_us = kiln_cuda_time_in_graph(ctx->stream, conv_enqueue, &t);
    const int dnn_ran = cand.kernel == KILN_CUDA_K_CUDNN; // (a decline fell back to Kiln's)
    plan->conv.fused = cand.conv.fused;                   // a declined fused call stays declined
    plan->conv.fused_identity = cand.conv.fused_identity;
    cand = *plan;
    cand.kernel = KILN_CUDA_K_CONV_PW;
    const float pw_us = kiln_cuda_time_in_graph(ctx->stream, conv_enqueue, &t);
    // cuBLASLt's GEMM over the pixels, when it takes the layer
    kiln_cuda_conv_geom g;
    const float lt_us = ctx->policy->conv_lt >= 0 ? lt_time(ctx, args, plan, &t, &g) : -1.0f;
    kiln_cuda_consume();
    plan->timed = 1;
    plan->conv.dnn_us = dnn_ran ? dnn_us : -1.0f;
    float kiln_us = pw_us;
    kiln_cuda_kernel kiln_k = KILN_CUDA_K_CONV_PW;
    if (lt_us >= 0.0f && (kiln_us < 0.0f || lt_us < kiln_us)) {
        kiln_us = lt_us;
        kiln_k = KILN_CUDA_K_CONV_LT;
    }
    plan->conv.pw_us = kiln_us;
    if (kiln_us >= 0.0f && (plan->conv.dnn_us < 0.0f || kiln_us < plan->conv.dnn_us)) {
        plan->kernel = kiln_k;
        plan->fused =
            kiln_k == KILN_CUDA_K_CONV_PW ? kiln_cuda_pw_fuses(args) : conv_lt_fuses(&g, args);
    }
    kiln_cuda_log(
        KILN_LOG_DEBUG, "1x1 conv at %s: cuDNN %.2f us, pointwise kernel %.2f us, cuBLASLt %.2f us",
        ctx->where ? ctx->where : "?", (double)plan->conv.dnn_us, (double)pw_us, (double)lt_us);
}

// An NCHW 1x1 conv that cuDNN takes (own_wanted), at context creation: cuDNN's algorithm, Kiln's
// implicit GEMM and cuBLASLt's GEMM each timed as the engine runs them, the fastest kept (pw_us
// holds the faster of Kiln's two).
static void own_tune(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                     kiln_cuda_layer_plan *plan) {
    kiln_cuda_layer_plan cand = *plan; // shares cuDNN's descriptors: never released
    timed_conv t = {ctx, args, &cand};
    const float dnn_us = kiln_cuda_time_in_graph(ctx->stream, conv_enqueue, &t);
    const int dnn_ran = cand.kernel == KILN_CUDA_K_CUDNN;
    plan->conv.fused = cand.conv.fused;
    plan->conv.fused_identity = cand.conv.fused_identity;
    cand = *plan;
    cand.kernel = plan->conv.fallback;
    const float own_us = kiln_cuda_time_in_graph(ctx->stream, conv_enqueue, &t);
    // cuBLASLt's GEMM per image, when it takes the problem
    kiln_cuda_conv_geom g;
    const float lt_us = lt_time(ctx, args, plan, &t, &g);
    kiln_cuda_consume();
    plan->timed = 1;
    plan->conv.dnn_us = dnn_ran ? dnn_us : -1.0f;
    float best = plan->conv.dnn_us, kiln_us = own_us;
    kiln_cuda_kernel kiln_k = plan->conv.fallback;
    if (lt_us >= 0.0f && (kiln_us < 0.0f || lt_us < kiln_us)) {
        kiln_us = lt_us;
        kiln_k = KILN_CUDA_K_CONV_LT;
    }
    plan->conv.pw_us = kiln_us;
    if (kiln_us >= 0.0f && (best < 0.0f || kiln_us < best)) {
        plan->kernel = kiln_k;
        plan->fused = 0;
    }
    kiln_cuda_log(
        KILN_LOG_DEBUG, "1x1 NCHW conv at %s: cuDNN %.2f us, Kiln's GEMM %.2f us, cuBLASLt %.2f us",
        ctx->where ? ctx->where : "?", (double)plan->conv.dnn_us, (double)own_us, (double)lt_us);
}

// The kernel choice, with cuDNN's algorithm from the heuristic or from ctx->choice (the tuning
// cache's record or an identical layer's: plan->cached when it applied).
static void conv2d_choose(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                          const kiln_cuda_conv_geom &g, kiln_cuda_layer_plan *plan, int *applied) {
    plan->fused = 0;
    if (g.n * g.oh * g.ow == 0 || g.o == 0) {
        plan->kernel = KILN_CUDA_K_EMPTY;
        return;
    }
    if (ctx->stem) {
        plan->kernel = KILN_CUDA_K_STEM; // the layout pass checked its limits
        plan->fused = args->n_tail > 0 && args->tail[0].op == KILN_OP_RELU;
        return;
    }
    plan->conv.fallback = own_kernel(&g);
    plan->kernel = plan->conv.fallback;
    if (dw_fits(&g)) {
        float lo, hi;
        plan->kernel = KILN_CUDA_K_CONV_DW;
        plan->conv.dw_rows = dw_rows_pays(ctx, &g) ? DW_ROW_PX : 0;
        plan->conv.dw_tile = dw_tile_rows(ctx, &g);
        plan->fused = args->n_tail > 0 && args->tail[0].operand == NULL &&
                      kc_conv_act_of(&args->tail[0], &lo, &hi) != KC_ACT_NONE;
        return;
    }
    if (pw_wanted(ctx, &g)) {
        const kiln_cuda_choice *ch = ctx->choice;
        if (ctx->policy->conv_pw <= 0 && ctx->policy->conv_lt >= 0 &&
            (ctx->policy->conv_lt > 0 ||
             (ch != NULL && ch->kernel == (int32_t)KILN_CUDA_K_CONV_LT)) &&
            conv_lt_setup(ctx, args, &g, plan)) {
            plan->kernel = KILN_CUDA_K_CONV_LT; // forced, or recorded as the fastest
            plan->fused = conv_lt_fuses(&g, args);
            if (ch != NULL) {
                plan->conv.dnn_us = ch->dnn_us;
                plan->conv.pw_us = ch->own_us;
            }
            return;
        }
        if (ctx->policy->conv_pw > 0 || ctx->dnn == NULL ||
            (ch != NULL && ch->kernel == (int32_t)KILN_CUDA_K_CONV_PW)) {
            plan->kernel = KILN_CUDA_K_CONV_PW; // forced, the only fast kernel, or recorded
            plan->fused = kiln_cuda_pw_fuses(args);
            if (ch != NULL) {
                plan->conv.dnn_us = ch->dnn_us;
                plan->conv.pw_us = ch->own_us;
            }
            return;
        }
    }
    if (own_wanted(&g) && ctx->choice != NULL &&
        (ctx->choice->kernel == (int32_t)plan->kernel ||
         ctx->choice->kernel == (int32_t)KILN_CUDA_K_CONV_LT)) {
        // recorded: Kiln's GEMM or cuBLASLt's was the faster
        if (ctx->choice->kernel == (int32_t)KILN_CUDA_K_CONV_LT &&
            conv_lt_setup(ctx, args, &g, plan))
            plan->kernel = KILN_CUDA_K_CONV_LT;
        if (plan->kernel == KILN_CUDA_K_CONV_LT || ctx->choice->kernel == (int32_t)plan->kernel) {
            plan->conv.dnn_us = ctx->choice->dnn_us;
            plan->conv.pw_us = ctx->choice->own_us;
            return;
        }
    }
    if (ctx->dnn != NULL && (!ctx->nhwc || ctx->w_krsc != NULL) && g.x_dt == g.y_dt &&
        g.w_dt == g.y_dt && (g.bias == NULL || g.bias_dt == g.y_dt)) {
        kiln_cuda_conv_geom d = dnn_geom(ctx, &g);
        const int got = kiln_cuda_dnn_conv_setup(ctx, &d, g.bias != NULL, &plan->conv);
        if (got) plan->kernel = KILN_CUDA_K_CUDNN;
        *applied = got == 2;
    }
}

extern "C" kiln_status kiln_cuda_conv2d_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                             int tune, kiln_cuda_layer_plan *plan) {
    kiln_cuda_conv_geom g;
    int applied = 0;
    KILN_CUDA_TRY(kiln_cuda_conv_geom_of(ctx, args, 0, &g));
    plan->conv.dnn_us = plan->conv.pw_us = -1.0f;
    conv2d_choose(ctx, args, g, plan, &applied);
    if (plan->kernel != KILN_CUDA_K_CONV_PW && plan->kernel != KILN_CUDA_K_CONV_LT &&
        pw_wanted(ctx, &g)) {
        if (plan->kernel == plan->conv.fallback) { // cuDNN refused: Kiln's generic kernels
            plan->kernel = KILN_CUDA_K_CONV_PW;
            plan->fused = kiln_cuda_pw_fuses(args);
        } else if (ctx->choice == NULL && tune) {
            pw_tune(ctx, args, plan);
        } else if (ctx->choice == NULL && kiln_cuda_pw_fuses(args) > dnn_fuses(args)) {
            // untimed: the kernel that leaves no pass over the output to the tail kernel
            plan->kernel = KILN_CUDA_K_CONV_PW;
            plan->fused = kiln_cuda_pw_fuses(args);
        } else if (ctx->choice != NULL) {
            plan->conv.dnn_us = ctx->choice->dnn_us;
            plan->conv.pw_us = ctx->choice->own_us;
        }
    }
    if (plan->kernel == KILN_CUDA_K_CUDNN && own_wanted(&g) && ctx->choice == NULL && tune)
        own_tune(ctx, args, plan);
    // A record matches when it names the kernel chosen (and, for cuDNN, its algorithm applied).
    plan->cached = ctx->choice != NULL && ctx->choice->kernel == (int32_t)plan->kernel &&
                   (plan->kernel != KILN_CUDA_K_CUDNN || applied);
    return KILN_OK;
}

// A conv prologue (cuda_fold.h) the tile kernel does not take: the ops as one elementwise pass
// over the input, in place (the conv is its only reader).
static kiln_status conv_pre_pass(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    kiln_kernel_args a;
    memset(&a, 0, sizeof a);
    a.op = args->op;
    a.out = (kiln_tensor *)args->in[0];
    a.tail = ctx->pre;
    a.n_tail = ctx->n_pre;
    return kiln_cuda_tail(ctx, &a, 0);
}

extern "C" kiln_status kiln_cuda_conv2d_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                            kiln_cuda_layer_plan *plan) {
    kiln_cuda_conv_geom g;
    uint32_t skip = 0;
    dw_pre pre;
    KILN_CUDA_TRY(kiln_cuda_conv_geom_of(ctx, args, 0, &g));
    pre.n = 0;
    if (ctx->n_pre > 0 && !(plan->kernel == KILN_CUDA_K_CONV_DW && dw_fits(&g) &&
                            dw_tile_rows(ctx, &g) > 0 && dw_pre_of(ctx, &pre))) {
        KILN_CUDA_TRY(conv_pre_pass(ctx, args)); // (dw_pre_of left pre.n 0 on refusal)
    }
    switch (plan->kernel) {
    case KILN_CUDA_K_EMPTY: return KILN_OK;
    case KILN_CUDA_K_STEM:
        KILN_CUDA_TRY(kiln_cuda_stem_run(ctx, args, &g, &skip));
        return kiln_cuda_tail(ctx, args, skip);
    case KILN_CUDA_K_CONV_DW:
        if (!dw_fits(&g)) break; // the shapes or pointers changed: Kiln's generic kernels
        KILN_CUDA_TRY(conv_dw(ctx, args, &g, pre, &skip));
        return kiln_cuda_tail(ctx, args, skip);
    case KILN_CUDA_K_CONV_PW:
        if (!kiln_cuda_pw_fits(&g)) break; // as above
        KILN_CUDA_TRY(kiln_cuda_pw_run(ctx, args, &g, &skip));
        return kiln_cuda_tail(ctx, args, skip);
    case KILN_CUDA_K_CUDNN: {
        kiln_cuda_conv_geom d = dnn_geom(ctx, &g);
        int done = 0;
        KILN_CUDA_TRY(kiln_cuda_dnn_conv_run(ctx, args, &d, &plan->conv, &skip, &done));
        if (done) return kiln_cuda_tail(ctx, args, skip);
        plan->kernel = plan->conv.fallback; // cuDNN declined these shapes (logged at DEBUG)
        plan->fell_back = 1;
        break;
    }
    case KILN_CUDA_K_CONV_LT: {
        int done = 0;
        KILN_CUDA_TRY(conv_lt_run(ctx, args, &g, plan, &done));
        if (done) return KILN_OK;
        plan->kernel = plan->conv.fallback; // cuBLASLt refused these shapes
        plan->fell_back = 1;
        break;
    }
    default: break;
    }
    KILN_CUDA_TRY(conv_own(ctx, &g));
    return kiln_cuda_tail(ctx, args, 0);
}

extern "C" void kiln_cuda_conv_plan_release(kiln_cuda_conv_rec *plan) {
    kiln_cuda_dnn_conv_release(plan);
}

extern "C" void kiln_cuda_conv_describe(const kiln_cuda_layer_plan *plan, char *buf, size_t n) {
    switch (plan->kernel) {
    case KILN_CUDA_K_CUDNN: {
        kiln_cuda_dnn_conv_describe(&plan->conv, buf, n);
        const size_t used = strlen(buf);
        if (plan->conv.pw_us >= 0.0f && used < n)
            snprintf(buf + used, n - used, " (%.2f us; Kiln's kernel %.2f us)",
                     (double)plan->conv.dnn_us, (double)plan->conv.pw_us);
        break;
    }
    case KILN_CUDA_K_CONV_PW:
        if (plan->conv.pw_us >= 0.0f)
            snprintf(buf, n,
                     "pointwise, NHWC, tensor-core GEMM over pixels, %u tail ops fused (%.2f us; "
                     "cuDNN %.2f us)",
                     plan->fused, (double)plan->conv.pw_us, (double)plan->conv.dnn_us);
        else
            snprintf(buf, n, "pointwise, NHWC, tensor-core GEMM over pixels, %u tail ops fused",
                     plan->fused);
        break;
    case KILN_CUDA_K_STEM:
        snprintf(buf, n, "tensor-core implicit GEMM, NCHW input read in place, NHWC output");
        break;
    case KILN_CUDA_K_CONV_DIRECT:
        snprintf(buf, n, "one thread per output (few channels per group)");
        break;
    case KILN_CUDA_K_CONV_LT:
        if (plan->conv.lt_nhwc)
            snprintf(buf, n,
                     "cuBLASLt GEMM over the NHWC pixels, bias and %u tail op fused (%.2f us; "
                     "cuDNN %.2f us)",
                     plan->fused, (double)plan->conv.pw_us, (double)plan->conv.dnn_us);
        else
            snprintf(buf, n,
                     "cuBLASLt GEMM over the NCHW planes, bias and tail after (%.2f us; cuDNN "
                     "%.2f us)",
                     (double)plan->conv.pw_us, (double)plan->conv.dnn_us);
        break;
    case KILN_CUDA_K_CONV_GEMM:
        if (plan->conv.pw_us >= 0.0f)
            snprintf(buf, n, "implicit GEMM on the tiled kernel (%.2f us; cuDNN %.2f us)",
                     (double)plan->conv.pw_us, (double)plan->conv.dnn_us);
        else
            snprintf(buf, n, "implicit GEMM on the tiled kernel");
        break;
    case KILN_CUDA_K_CONV_DW:
        if (plan->conv.dw_tile > 0)
            snprintf(buf, n,
                     "depthwise 7x7, NHWC, tiles of %d output rows x 8 channels through shared "
                     "memory, bias and activation fused",
                     plan->conv.dw_tile);
        else if (plan->conv.dw_rows > 0)
            snprintf(buf, n,
                     "depthwise, NHWC, 8 channels x %d output pixels of a row per thread, bias "
                     "and activation fused",
                     plan->conv.dw_rows);
        else
            snprintf(buf, n,
                     "depthwise, NHWC, 8 channels x 1 output pixel per thread, bias and "
                     "activation fused");
        break;
    default: snprintf(buf, n, "no elements"); break;
    }
}

extern "C" kiln_status kiln_cuda_conv_transpose2d(const kiln_cuda_ctx *ctx,
                                                  const kiln_kernel_args *args) {
    kiln_cuda_conv_geom g;
    KILN_CUDA_TRY(kiln_cuda_conv_geom_of(ctx, args, 1, &g));
    if (g.n * g.oh * g.ow == 0 || g.o == 0) return KILN_OK;
    KILN_CUDA_TRY(conv_own(ctx, &g));
    return kiln_cuda_tail(ctx, args, 0);
}
