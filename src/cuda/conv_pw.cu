// SPDX-License-Identifier: Apache-2.0
// Kiln's pointwise kernel (conv.h): a 1x1 conv2d of groups 1 and no padding in an NHWC engine is
// a GEMM over the output pixels, y[p][o] = sum_c x[pixel(p)][c] w[o][c], whose operand rows are
// the activation's own channel vectors and the weight's KRSC rows. The inverted-residual blocks
// of MobileNet, EfficientNet, RegNet and MobileViT expand a few channels into many with a 1x1
// conv followed by SiLU or hard-swish: cuDNN fuses only ReLU into its convolution, so the
// activation was a second pass over the largest tensor of the block (EfficientNet-B0 at batch
// 32: 32 x 96 x 112 x 112, the conv and its SiLU 134 us against about 24 us of memory time).
//
// Tensor cores (mma.sync m16n8k16, float32 accumulation): a CTA of four warps computes a tile of
// PW_BM pixels x PW_BN output channels, each warp 32 pixels (two m16 fragments) x PW_BN (eight
// n8 fragments), over the depth in PW_BK slices through a PW_ST-stage cp.async pipeline (zeros
// past the depth or the tile's edge: C % 8 == 0, so a 16-byte chunk is whole or absent). The
// epilogue adds the bias, then the residual when the first tail op adds one of the output's
// shape, then the activation when the next tail op is one (conv_act.cuh), in float32 before
// the one rounding (ReLU, clamp, SiLU, hard-swish, sigmoid; GELU runs in the tail kernel after);
// the tile is staged per warp in shared memory and stored with 16-byte writes (O % 8 == 0). A
// stride other than 1 reads every sh-th row and sw-th column (ResNet's 1x1/2 downsample).
#include <string.h>

#include "cuda/conv.h"
#include "cuda/conv_act.cuh"
#include "cuda/mma.cuh"

#define PW_BM 128                  // output pixels per CTA tile (32 per warp)
#define PW_BN 64                   // output channels per CTA tile (eight n8 fragments)
#define PW_BK 32                   // depth per pipeline stage (two k16 steps)
#define PW_ST 3                    // pipeline stages
#define PW_WARPS 4                 // warps per CTA
#define PW_THREADS (PW_WARPS * 32) // threads per CTA
#define PW_LD                                                                                      \
    (PW_BK + 8)                               // shared row stride (elements; 80 bytes: ldmatrix's 8
                                              // rows on distinct banks)
#define PW_OS (PW_BN + 4)                     // float32 staging row stride
#define PW_SA (PW_BM * PW_LD)                 // one stage of the pixel tile (elements)
#define PW_SB (PW_BN * PW_LD)                 // one stage of the weight tile (elements)
#define PW_SMEM (PW_ST * (PW_SA + PW_SB) * 2) // 46080 bytes: no opt-in above 48 KB needed

typedef struct pw_geom {
    const uint16_t *x, *w, *bias, *res; // 16-bit elements of one dtype; bias, res may be NULL
    uint16_t *y;
    int64_t pixels;   // n * oh * ow
    int64_t xcs, wcs; // channel strides of x's pixels and of w's rows
    int c, o, ohw, ow, h, w_in, sh, sw;
    int dense;   // pixel p's input row is x + p * xcs (stride 1)
    int tiles_n; // output channel tiles: ceil(o / PW_BN)
    int act;     // KC_ACT_*
    float lo, hi;
} pw_geom;

static_assert(PW_WARPS * 32 * PW_OS * 4 <= PW_SMEM, "the staging fits in the pipeline's memory");

// The input row (channel vector) that output pixel p reads.
__device__ __forceinline__ const uint16_t *pw_row(const pw_geom &g, int64_t p) {
    if (g.dense) return g.x + p * g.xcs;
    const int64_t b = p / g.ohw;
    const int r = (int)(p - b * g.ohw), oy = r / g.ow, ox = r - oy * g.ow;
    return g.x + ((b * g.h + (int64_t)oy * g.sh) * g.w_in + (int64_t)ox * g.sw) * g.xcs;
}

// ACT: the activation (KC_ACT_*) as a template argument: a switch per element made the unrolled
// epilogue about 10 thousand instructions (every activation inlined 64 times per thread), and the
// kernel ran at a fifth of its speed out of the instruction cache.
template <typename T, int ACT>
static __global__ void __launch_bounds__(PW_THREADS) conv_pw_kernel(pw_geom g) {
    extern __shared__ __align__(16) uint16_t pw_smem[];
    uint16_t *as = pw_smem, *bs = pw_smem + PW_ST * PW_SA;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nt = (int)(blockIdx.x % (unsigned)g.tiles_n);
    const int64_t p0 = (int64_t)(blockIdx.x / (unsigned)g.tiles_n) * PW_BM;
    const int o0 = nt * PW_BN;
    // Loads: thread t copies 16-byte chunk t % 4 of pixel rows t / 4 + 32 i (i < 4) and of weight
    // rows t / 4 + 32 i (i < 2).
    const int lrow = tid >> 2, lk = (tid & 3) * 8;
    const uint16_t *arow[4], *brow[2];
    bool aok[4], bok[2];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t p = p0 + lrow + 32 * i;
        aok[i] = p < g.pixels;
        arow[i] = aok[i] ? pw_row(g, p) : g.x;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int oc = o0 + lrow + 32 * i;
        bok[i] = oc < g.o;
        brow[i] = bok[i] ? g.w + (int64_t)oc * g.wcs : g.w;
    }
    const int kt_n = (g.c + PW_BK - 1) / PW_BK;
    auto load = [&](int kt, int s) {
        const int k = kt * PW_BK + lk;
        const bool kok = k < g.c;
        uint16_t *a = as + s * PW_SA + lrow * PW_LD + lk;
        uint16_t *b = bs + s * PW_SB + lrow * PW_LD + lk;
#pragma unroll
        for (int i = 0; i < 4; i++)
            kc_cp_async16(a + 32 * i * PW_LD, arow[i] + (kok ? k : 0), aok[i] && kok);
#pragma unroll
        for (int i = 0; i < 2; i++)
            kc_cp_async16(b + 32 * i * PW_LD, brow[i] + (kok ? k : 0), bok[i] && kok);
    };
#pragma unroll
    for (int s = 0; s < PW_ST - 1; s++) {
        if (s < kt_n) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
#pragma unroll
        for (int ni = 0; ni < 8; ni++) {
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
        }
    }
    for (int kt = 0; kt < kt_n; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(PW_ST - 2) : "memory");
        __syncthreads(); // stage kt landed for every thread; stage kt - 1 is free again
        if (kt + PW_ST - 1 < kt_n) load(kt + PW_ST - 1, (kt + PW_ST - 1) % PW_ST);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        const uint16_t *a = as + (kt % PW_ST) * PW_SA + warp * 32 * PW_LD;
        const uint16_t *b = bs + (kt % PW_ST) * PW_SB;
#pragma unroll
        for (int kk = 0; kk < PW_BK; kk += 16) {
            if (kt * PW_BK + kk >= g.c) break; // the rest of the slice is zeros
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                kc_ldmatrix_x4(af[mi], a + (mi * 16 + (lane & 15)) * PW_LD + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < 4; nj++) { // n8 fragments 2 nj and 2 nj + 1
                if (o0 + nj * 16 >= g.o) break;
                uint32_t bf[4];
                kc_ldmatrix_x4(bf, b + (nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * PW_LD + kk +
                                       ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    kc_mma<T>::mma(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
                    kc_mma<T>::mma(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads(); // every warp is done with the pipeline's memory: it becomes the staging
    // Accumulators (+ bias) to the warp's float32 staging rows: fragment rows g, g + 8 of each
    // m16, columns 2t, 2t + 1 of each n8.
    float *st = (float *)pw_smem + warp * 32 * PW_OS;
    const int gq = lane >> 2, tq = lane & 3;
    const T *bias = (const T *)g.bias;
#pragma unroll
    for (int ni = 0; ni < 8; ni++) {
        const int col = ni * 8 + 2 * tq;
        float b0 = 0.0f, b1 = 0.0f;
        if (bias != NULL && o0 + col < g.o) { // o % 8 == 0: col + 1 is inside too
            b0 = kc_to_f<T>(bias[o0 + col]);
            b1 = kc_to_f<T>(bias[o0 + col + 1]);
        }
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int r = mi * 16 + gq;
            *(float2 *)(st + r * PW_OS + col) =
                make_float2(acc[mi][ni][0] + b0, acc[mi][ni][1] + b1);
            *(float2 *)(st + (r + 8) * PW_OS + col) =
                make_float2(acc[mi][ni][2] + b0, acc[mi][ni][3] + b1);
        }
    }
    __syncwarp();
    // Stores: lane takes 8-channel chunk lane % 8 of rows lane / 8 + 4 j: each row's 128 bytes
    // by 8 lanes.
    const int ch = (lane & 7) * 8, oc = o0 + ch;
    if (oc >= g.o) return;
    const T *res = (const T *)g.res;
#pragma unroll 2
    for (int j = 0; j < 8; j++) {
        const int r = (lane >> 3) + 4 * j;
        const int64_t p = p0 + warp * 32 + r;
        if (p >= g.pixels) break;
        const float4 v0 = *(const float4 *)(st + r * PW_OS + ch);
        const float4 v1 = *(const float4 *)(st + r * PW_OS + ch + 4);
        float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const int64_t off = p * g.o + oc;
        if (res != NULL) {
            const uint4 rv = *(const uint4 *)(res + off);
            const T *re = (const T *)&rv;
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] += kc_to_f<T>(re[e]);
        }
        uint4 out;
        T *oe = (T *)&out;
#pragma unroll
        for (int e = 0; e < 8; e++) oe[e] = kc_from_f<T>(kc_conv_act(v[e], ACT, g.lo, g.hi));
        *(uint4 *)((T *)g.y + off) = out;
    }
}

// One kernel per activation, ReLU as a clamp at 0 (both give 0 for NaN); GELU is left to the
// tail kernel (rare after a 1x1 conv): fewer kernels keep the plugin's device code small.
template <typename T> static void pw_launch(pw_geom g, unsigned tiles, cudaStream_t st) {
    switch (g.act) {
#define PW_CASE(A)                                                                                 \
    case A: conv_pw_kernel<T, A><<<tiles, PW_THREADS, PW_SMEM, st>>>(g); break;
        PW_CASE(KC_ACT_CLAMP)
        PW_CASE(KC_ACT_SILU)
        PW_CASE(KC_ACT_HARDSWISH)
        PW_CASE(KC_ACT_SIGMOID)
#undef PW_CASE
    case KC_ACT_RELU:
        g.lo = 0.0f;
        g.hi = INFINITY;
        conv_pw_kernel<T, KC_ACT_CLAMP><<<tiles, PW_THREADS, PW_SMEM, st>>>(g);
        break;
    default: conv_pw_kernel<T, KC_ACT_NONE><<<tiles, PW_THREADS, PW_SMEM, st>>>(g); break;
    }
}

extern "C" int kiln_cuda_pw_fits(const kiln_cuda_conv_geom *g) {
    return g->nhwc && !g->transposed && g->groups == 1 && g->kh == 1 && g->kw == 1 && g->ph == 0 &&
           g->pw == 0 && g->wcs > 0 && g->c % 8 == 0 && g->o % 8 == 0 && g->xcs % 8 == 0 &&
           g->wcs % 8 == 0 && g->c <= INT32_MAX && g->o <= INT32_MAX &&
           (g->x_dt == KILN_DTYPE_F16 || g->x_dt == KILN_DTYPE_BF16) && g->w_dt == g->x_dt &&
           g->y_dt == g->x_dt && (g->bias == NULL || g->bias_dt == g->x_dt) &&
           g->oh * g->ow < INT32_MAX && kiln_cuda_align_of(g->x) >= 16 &&
           kiln_cuda_align_of(g->w) >= 16 && kiln_cuda_align_of(g->y) >= 16 &&
           (g->n * g->oh * g->ow + PW_BM - 1) / PW_BM * ((g->o + PW_BN - 1) / PW_BN) < INT32_MAX;
}

// The tail ops the kernel applies: [add of a tensor of y's shape and dtype] then [activation].
static uint32_t pw_tail(const kiln_kernel_args *args, pw_geom *pg) {
    const kiln_tensor *y = args->out;
    uint32_t next = 0;
    pg->res = NULL;
    pg->act = KC_ACT_NONE;
    if (args->n_tail > 0 && args->tail[0].op == KILN_OP_ADD && args->tail[0].operand != NULL) {
        const kiln_tensor *r = args->tail[0].operand;
        if (r->dtype == y->dtype && r->rank == 4 &&
            memcmp(r->dims, y->dims, 4 * sizeof(int64_t)) == 0 &&
            kiln_cuda_align_of(r->data) >= 16) {
            pg->res = (const uint16_t *)r->data;
            next = 1;
        }
    }
    if (args->n_tail > next) {
        pg->act = kc_conv_act_of(&args->tail[next], &pg->lo, &pg->hi);
        if (pg->act == KC_ACT_GELU_ERF || pg->act == KC_ACT_GELU_TANH) pg->act = KC_ACT_NONE;
        if (pg->act != KC_ACT_NONE) next++;
    }
    return next;
}

extern "C" uint32_t kiln_cuda_pw_fuses(const kiln_kernel_args *args) {
    pw_geom pg;
    return pw_tail(args, &pg);
}

extern "C" kiln_status kiln_cuda_pw_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                        const kiln_cuda_conv_geom *g, uint32_t *fused) {
    pw_geom pg;
    memset(&pg, 0, sizeof pg);
    *fused = pw_tail(args, &pg);
    pg.x = (const uint16_t *)g->x;
    pg.w = (const uint16_t *)g->w;
    pg.bias = (const uint16_t *)g->bias;
    pg.y = (uint16_t *)g->y;
    pg.pixels = g->n * g->oh * g->ow;
    pg.xcs = g->xcs;
    pg.wcs = g->wcs;
    pg.c = (int)g->c;
    pg.o = (int)g->o;
    pg.ohw = (int)(g->oh * g->ow);
    pg.ow = (int)g->ow;
    pg.h = (int)g->h;
    pg.w_in = (int)g->w_in;
    pg.sh = g->sh;
    pg.sw = g->sw;
    pg.dense = g->sh == 1 && g->sw == 1 && g->oh == g->h && g->ow == g->w_in;
    pg.tiles_n = (pg.o + PW_BN - 1) / PW_BN;
    const int64_t tiles = (pg.pixels + PW_BM - 1) / PW_BM * pg.tiles_n;
    if (g->x_dt == KILN_DTYPE_F16)
        pw_launch<__half>(pg, (unsigned)tiles, ctx->stream);
    else
        pw_launch<__nv_bfloat16>(pg, (unsigned)tiles, ctx->stream);
    return kiln_cuda_check_launch(ctx, "conv_pw_kernel");
}
