// SPDX-License-Identifier: Apache-2.0
// conv2d (x[N, C, H, W], w[O, C/g, kh, kw], bias?[O]) and conv_transpose2d (x[N, C, H, W],
// w[C, O/g, kh, kw], bias?[O]) with stride, padding, dilation, groups (and output_padding, which
// only shapes the output). Each group is an implicit GEMM on Kiln's tiled core
// (tiled_gemm.cuh): rows = output channels of the group, columns = N*OH*OW output pixels, depth
// = C/g*kh*kw, the input gathered on the fly (im2col without the buffer). Groups with fewer than
// DIRECT_MAX_OG output channels (depthwise) take a direct kernel, one thread per output. Float32
// accumulation; the fused tail runs after in one elementwise kernel.
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_layout.h"
#include "cuda/mma.cuh"
#include "cuda/tiled_gemm.cuh"

#define DIRECT_MAX_OG 8
#define DIRECT_BLOCK 256

typedef struct conv_geom {
    const void *x, *w, *bias;
    void *y;
    uint32_t x_dt, w_dt, bias_dt, y_dt;
    int64_t n, c, h, w_in, o, oh, ow;
    int64_t cg, og; // channels per group (input, output)
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int transposed;
    int nhwc;    // x and y stored NHWC (ctx->nhwc; conv2d only); w stays OIHW
    int64_t xcs; // nhwc: x's channel stride (c, or ctx->x_cpad for a channel-padded copy)
} conv_geom;

// Input element feeding output pixel (n, oy, ox) through kernel tap (a, b) of input channel ci,
// or 0 when it falls in the padding (or, transposed, between strides).
__device__ __forceinline__ float conv_tap(const conv_geom &g, int64_t n, int64_t ci, int64_t oy,
                                          int64_t ox, int a, int b) {
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
__device__ __forceinline__ float conv_weight(const conv_geom &g, int64_t gr, int64_t i, int64_t c,
                                             int a, int b) {
    int64_t taps = (int64_t)g.kh * g.kw, t = (int64_t)a * g.kw + b;
    int64_t idx = !g.transposed ? ((gr * g.og + i) * g.cg + c) * taps + t
                                : ((gr * g.cg + c) * g.og + i) * taps + t;
    return kc_ld_f(g.w, g.w_dt, idx);
}

__device__ __forceinline__ void conv_store(const conv_geom &g, int64_t oc, int64_t j, float acc) {
    int64_t hw = g.oh * g.ow, n = j / hw, p = j % hw;
    if (g.bias != NULL) acc += kc_ld_f(g.bias, g.bias_dt, oc);
    kc_st_f(g.y, g.y_dt, g.nhwc ? j * g.o + oc : (n * g.o + oc) * hw + p, acc);
}

// --- implicit GEMM loader: batch = group, A(i, k) = weights, B(k, j) = gathered input

struct conv_loader {
    conv_geom g;
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

static __global__ void conv_direct_kernel(const conv_geom g) {
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

// --- stem kernel: conv2d with few input channels (ctx->stem, cuda_layout.h)
// ResNet's 3-channel 7x7/2 stem has a depth of 147: cuDNN ran it on a channel-padded NHWC copy
// in 236 us at batch 32 (16 TFLOP/s). Here it is an implicit GEMM on tensor cores (mma.sync
// m16n8k16, float32 accumulation) that reads the NCHW input as it is and writes NHWC: rows =
// output pixels, columns = output channels (STEM_BN per CTA, blockIdx.y), depth k = (c, ky, kx),
// the OIHW weight's own order, zero-padded to a multiple of 16. The CTA keeps its weight block in
// shared memory and walks pixel tiles (persistent CTAs); each warp owns STEM_PIX pixels (two m16
// fragments) and builds its A fragments by a gather through a per-k offset table:
//   * patch mode (STEM_TR x STEM_TC output pixels of one image per tile, when the input patch
//     they read fits STEM_PATCH_MAX): the CTA copies the patch (C x PH x PW, zeros where it falls
//     in the padding, then a zero plane that the padded k columns point into) to shared memory
//     with coalesced loads; each A element is then one shared load at pixel offset + k offset,
//     with no bounds test;
//   * global mode (any geometry): pixels (n, oy, ox) flattened, each A element read from global
//     memory (cached: the input is small) when per-pixel row/column tap masks say it is inside.
// Padded k columns read zeros in both modes, so NaN or Inf inputs cannot leak through their zero
// weights. Epilogue: bias, then relu when the first tail op is relu (the rest of the tail after),
// one rounding, staged per warp in shared memory and stored with 16-byte writes.

#define STEM_WARPS 4
#define STEM_PIX 32           // pixels per warp: two m16 fragments
#define STEM_BN 64            // output channels per CTA: eight n8 fragments
#define STEM_OS (STEM_BN + 8) // staging row stride (elements; 144 bytes: 16-byte aligned rows)
#define STEM_TR 8             // patch mode: output rows per tile (two per warp)
#define STEM_TC 16            // ... and columns (one m16 fragment per row)
#define STEM_PATCH_MAX 8192   // patch mode: most elements of the patch plus its zero plane
#define STEM_PW_CHUNKS 4      // patch mode: patch_w <= 32 * STEM_PW_CHUNKS
#define STEM_KP_MAX 256       // most depth in shared memory (pair mode doubles a 1-wide kernel's)

struct stem_geom {
    const uint16_t *x, *w; // raw 16-bit elements (float16 or bfloat16)
    const void *bias;
    void *y;
    int64_t pixels; // n * oh * ow
    int n, c, h, w_in, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
    int k, kp; // depth c * kh * kw, and the shared-memory depth rounded up to 16
    int kwp;   // taps per weight row in shared memory: kw, or kw rounded up to even (pair mode)
    int relu;
    int patch_h, patch_w; // patch mode: the patch's rows and columns (0: global mode)
    int tiles_y, tiles_x; // patch mode: tiles per image
};

// Dynamic shared memory: weights [STEM_BN][kp + 8], the k table [kp], staging per warp, and in
// patch mode the patch and its zero plane.
static size_t stem_smem(const stem_geom &g) {
    size_t patch = g.patch_h > 0 ? (size_t)(g.c + 1) * g.patch_h * g.patch_w * 2 : 0;
    return (size_t)STEM_BN * (g.kp + 8) * 2 + (size_t)g.kp * sizeof(int2) +
           (size_t)STEM_WARPS * STEM_PIX * STEM_OS * 2 + (patch + 15) / 16 * 16;
}

// Bit i set when 0 <= base + i * step < limit, for i < taps.
__device__ __forceinline__ uint32_t stem_mask(int base, int step, int taps, int limit) {
    uint32_t m = 0;
    for (int i = 0; i < taps; i++) {
        int v = base + i * step;
        if (v >= 0 && v < limit) m |= 1u << i;
    }
    return m;
}

enum { STEM_GLOBAL = 0, STEM_HALF = 1, STEM_PAIR = 2 }; // gather modes

template <typename T, int MODE>
static __global__ void __launch_bounds__(STEM_WARPS * 32, 4) stem_kernel(const stem_geom g) {
    constexpr bool PATCH = MODE != STEM_GLOBAL;
    extern __shared__ __align__(16) uint8_t stem_sm[];
    const int ws = g.kp + 8; // weight row stride: conflict-free B fragment loads
    uint16_t *sw = (uint16_t *)stem_sm;
    int2 *tab = (int2 *)(sw + STEM_BN * ws);
    uint16_t *stage = (uint16_t *)(tab + g.kp);
    uint16_t *patch = stage + STEM_WARPS * STEM_PIX * STEM_OS; // patch mode
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t4 = lane & 3;
    const int o0 = blockIdx.y * STEM_BN;
    const int nb = g.o - o0 < STEM_BN ? g.o - o0 : STEM_BN; // a multiple of 8
    const int nj = nb / 8;
    // weights: row r, depth k = (c, ky, kx) with g.kwp taps per (c, ky) row (kx >= kw: zero)
    // (each depth's source column first, in the staging area: one division per depth)
    const int kd = g.k / g.kw * g.kwp;
    int *wsrc = (int *)stage;
    for (int k = tid; k < g.kp; k += blockDim.x) {
        const int kx = k % g.kwp;
        wsrc[k] = k < kd && kx < g.kw ? k / g.kwp * g.kw + kx : -1;
    }
    __syncthreads();
    // rows by warp, four at a time, every load of the four issued before the first store (a
    // load-store loop would wait out one memory latency per element)
    for (int r0 = warp; r0 < STEM_BN; r0 += 4 * STEM_WARPS) {
        uint16_t v[4][STEM_KP_MAX / 32];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + i * STEM_WARPS;
            const uint16_t *wr = g.w + (int64_t)(o0 + r) * g.k;
#pragma unroll
            for (int u = 0; u < STEM_KP_MAX / 32; u++) {
                const int k = lane + 32 * u, src = k < g.kp ? wsrc[k] : -1;
                v[i][u] = r < nb && src >= 0 ? wr[src] : (uint16_t)0;
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int u = 0; u < STEM_KP_MAX / 32; u++) {
                const int k = lane + 32 * u;
                if (k < g.kp) sw[(r0 + i * STEM_WARPS) * ws + k] = v[i][u];
            }
        }
    }
    // this thread's bias pairs (channels 8j + 2t, +1), for every tile
    float bias2[8][2];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int oc = o0 + 8 * j + 2 * t4;
        const bool has = g.bias != NULL && 8 * j < nb;
        bias2[j][0] = has ? kc_to_f(((const T *)g.bias)[oc]) : 0.0f;
        bias2[j][1] = has ? kc_to_f(((const T *)g.bias)[oc + 1]) : 0.0f;
    }
    const int taps = g.kh * g.kw, plane = g.patch_h * g.patch_w;
    for (int k = tid; MODE == STEM_PAIR && k < g.kp / 2; k += blockDim.x) {
        // pair mode: depth columns 2k, 2k + 1 (kx even, kx + 1): (patch offset, mask of the
        // taps that exist: the pad tap kx + 1 == kw and the padded depth read as zero)
        const int c = 2 * k / (g.kh * g.kwp), t = 2 * k % (g.kh * g.kwp), ky = t / g.kwp,
                  kx = t % g.kwp;
        int2 e = make_int2(0, 0);
        if (2 * k < kd) {
            e.x = (c * g.patch_h + ky * g.dh) * g.patch_w + kx;
            e.y = kx + 1 < g.kw ? -1 : 0xffff;
        }
        tab[k] = e;
    }
    for (int k = tid; MODE != STEM_PAIR && k < g.kp; k += blockDim.x) {
        // global mode: (offset in the image, ky | kx << 8), padded k: tap 31 is never valid;
        // patch mode: (offset in the patch, 0), padded k: the zero plane
        int2 e = PATCH ? make_int2(g.c * plane, 0) : make_int2(0, 31 | (31 << 8));
        if (k < g.k) {
            const int c = k / taps, t = k % taps, ky = t / g.kw, kx = t % g.kw;
            if (PATCH) {
                e.x = (c * g.patch_h + ky * g.dh) * g.patch_w + kx * g.dw;
            } else {
                e.x = (c * g.h + ky * g.dh) * g.w_in + kx * g.dw;
                e.y = ky | (kx << 8);
            }
        }
        tab[k] = e;
    }
    if (PATCH) { // the zero plane (never overwritten)
        for (int i = tid; i < plane; i += blockDim.x) patch[g.c * plane + i] = 0;
    }
    __syncthreads();
    const int ohw = g.oh * g.ow;
    const int64_t chw = (int64_t)g.c * g.h * g.w_in;
    const int64_t tiles = PATCH ? (int64_t)g.n * g.tiles_y * g.tiles_x
                                : (g.pixels + STEM_WARPS * STEM_PIX - 1) / (STEM_WARPS * STEM_PIX);
    uint16_t *mine = stage + warp * STEM_PIX * STEM_OS;
    // patch mode: this thread's pixels q (A rows g, g+8 of fragments 0, 1) are tile row
    // 2 * warp + q / 2, column gq + 8 * (q % 2): fixed offsets into every tile's patch
    int poff[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        poff[q] = (2 * warp + q / 2) * g.sh * g.patch_w + (gq + 8 * (q % 2)) * g.sw;
    }
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int64_t p0 = 0, base[4] = {0, 0, 0, 0};
        int n = 0, oy0 = 0, ox0 = 0;
        uint32_t ym[4] = {0, 0, 0, 0}, xm[4] = {0, 0, 0, 0};
        if (PATCH) { // (tiles < 2^31: stem_run)
            const int per = g.tiles_y * g.tiles_x, t = (int)tile;
            n = t / per;
            const int r = t - n * per, ty = r / g.tiles_x;
            oy0 = ty * STEM_TR;
            ox0 = (r - ty * g.tiles_x) * STEM_TC;
            const int iy0 = oy0 * g.sh - g.ph, ix0 = ox0 * g.sw - g.pw;
            const uint16_t *xn = g.x + (int64_t)n * chw;
            __syncthreads(); // the previous tile's reads of the patch are done
            // (c, py) rows by warp, four at a time (every load of the four before the first
            // store), columns by lane (patch_w <= 32 * STEM_PW_CHUNKS); STEM_WARPS <= STEM_TR <=
            // patch_h, so py wraps at most once per step
            const int rows = g.c * g.patch_h;
            for (int row0 = warp, c = 0, py = warp; row0 < rows; row0 += 4 * STEM_WARPS) {
                uint16_t v[4][STEM_PW_CHUNKS];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int iy = iy0 + py;
                    const bool yin = row0 + i * STEM_WARPS < rows && iy >= 0 && iy < g.h;
                    const uint16_t *src = xn + ((int64_t)c * g.h + (yin ? iy : 0)) * g.w_in;
#pragma unroll
                    for (int u = 0; u < STEM_PW_CHUNKS; u++) {
                        v[i][u] = 0;
                        if (32 * u >= g.patch_w) break; // (block-uniform)
                        const int px = lane + 32 * u, ix = ix0 + px;
                        v[i][u] = yin && px < g.patch_w && ix >= 0 && ix < g.w_in ? __ldg(src + ix)
                                                                                  : (uint16_t)0;
                    }
                    py += STEM_WARPS;
                    if (py >= g.patch_h) py -= g.patch_h, c++;
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int row = row0 + i * STEM_WARPS;
#pragma unroll
                    for (int u = 0; u < STEM_PW_CHUNKS; u++) {
                        if (32 * u >= g.patch_w) break;
                        const int px = lane + 32 * u;
                        if (row < rows && px < g.patch_w) patch[row * g.patch_w + px] = v[i][u];
                    }
                }
            }
            __syncthreads();
        } else {
            p0 = (tile * STEM_WARPS + warp) * STEM_PIX;
            if (p0 >= g.pixels) break; // warp-uniform, and later tiles start further on
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int64_t p = p0 + gq + 8 * q;
                if (p < g.pixels) {
                    const int64_t pn = p / ohw;
                    const int r = (int)(p % ohw), oy = r / g.ow, ox = r % g.ow;
                    const int iy = oy * g.sh - g.ph, ix = ox * g.sw - g.pw;
                    base[q] = pn * chw + (int64_t)iy * g.w_in + ix;
                    ym[q] = stem_mask(iy, g.dh, g.kh, g.h);
                    xm[q] = stem_mask(ix, g.dw, g.kw, g.w_in);
                }
            }
        }
        float acc[2][8][4];
#pragma unroll
        for (int f = 0; f < 2; f++) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                acc[f][j][0] = acc[f][j][1] = acc[f][j][2] = acc[f][j][3] = 0.0f;
            }
        }
        for (int k0 = 0; k0 < g.kp; k0 += 16) {
            uint32_t a[2][4];
            if (MODE == STEM_PAIR) { // depth pairs k0 + 2t, +1 and k0 + 2t + 8, +9: 32-bit loads
                const int2 e0 = tab[k0 / 2 + t4], e1 = tab[k0 / 2 + t4 + 4];
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    const uint16_t *p0r = patch + poff[2 * f], *p1r = patch + poff[2 * f + 1];
                    a[f][0] = *(const uint32_t *)(p0r + e0.x) & (uint32_t)e0.y;
                    a[f][1] = *(const uint32_t *)(p1r + e0.x) & (uint32_t)e0.y;
                    a[f][2] = *(const uint32_t *)(p0r + e1.x) & (uint32_t)e1.y;
                    a[f][3] = *(const uint32_t *)(p1r + e1.x) & (uint32_t)e1.y;
                }
            } else {
                // this thread's depth columns: k0 + 2t, +1, +8, +9
                int2 e[4] = {tab[k0 + 2 * t4], tab[k0 + 2 * t4 + 1], tab[k0 + 2 * t4 + 8],
                             tab[k0 + 2 * t4 + 9]};
                uint32_t v[4][4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        if (PATCH) {
                            v[q][i] = patch[poff[q] + e[i].x];
                        } else {
                            const int ky = e[i].y & 255, kx = e[i].y >> 8;
                            const bool ok = ((ym[q] >> ky) & (xm[q] >> kx) & 1u) != 0;
                            v[q][i] = ok ? (uint32_t)__ldg(g.x + base[q] + e[i].x) : 0u;
                        }
                    }
                }
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    a[f][0] = v[2 * f][0] | (v[2 * f][1] << 16);
                    a[f][1] = v[2 * f + 1][0] | (v[2 * f + 1][1] << 16);
                    a[f][2] = v[2 * f][2] | (v[2 * f][3] << 16);
                    a[f][3] = v[2 * f + 1][2] | (v[2 * f + 1][3] << 16);
                }
            }
            // B fragments of n-tiles j, j + 1 by one ldmatrix.x4: lane l addresses row
            // 8 (j + l / 16) + l % 8, depth k0 + 8 ((l / 8) % 2) (rows past nb are zeros)
            // All four loads first, then the 16 MMAs, without branches: n-tiles past nj
            // multiply zero weights into accumulators that are never stored.
            const uint16_t *brow =
                sw + (8 * (lane >> 4) + (lane & 7)) * ws + k0 + ((lane >> 3) & 1) * 8;
            uint32_t b[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) kc_ldmatrix_x4(b[j], brow + 16 * j * ws);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                kc_mma<T>::mma(acc[0][2 * j], a[0], b[j][0], b[j][1]);
                kc_mma<T>::mma(acc[1][2 * j], a[1], b[j][0], b[j][1]);
                kc_mma<T>::mma(acc[0][2 * j + 1], a[0], b[j][2], b[j][3]);
                kc_mma<T>::mma(acc[1][2 * j + 1], a[1], b[j][2], b[j][3]);
            }
        }
        // epilogue: C fragment (row g / g+8, columns 2t, 2t+1) -> staging row f*16 + g (+8)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= nj) break;
            const int oc = 8 * j + 2 * t4;
            const float b0 = bias2[j][0], b1 = bias2[j][1];
#pragma unroll
            for (int f = 0; f < 2; f++) {
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    float lo = acc[f][j][2 * hh] + b0, hi = acc[f][j][2 * hh + 1] + b1;
                    if (g.relu) {
                        lo = lo < 0.0f ? 0.0f : lo;
                        hi = hi < 0.0f ? 0.0f : hi;
                    }
                    const int row = f * 16 + hh * 8 + gq;
                    *(uint32_t *)(mine + row * STEM_OS + oc) = kc_mma<T>::pack(lo, hi);
                }
            }
        }
        __syncwarp();
        // staging row r: pixel p0 + r (global mode), or tile row 2 * warp + r / 16, column r % 16
        const int part = lane & 7; // 16 bytes: channels 8 part .. 8 part + 7
        if (PATCH) {               // staging row f * 16 + col: tile row 2 * warp + f, column col
#pragma unroll
            for (int f = 0; f < 2; f++) {
                const int oy = oy0 + 2 * warp + f;
                if (oy >= g.oh || part >= nj) continue;
                uint16_t *yr =
                    (uint16_t *)g.y + (((int64_t)n * g.oh + oy) * g.ow + ox0) * g.o + o0 + part * 8;
                for (int col = lane >> 3; col < 16 && ox0 + col < g.ow; col += 4) {
                    *(uint4 *)(yr + (int64_t)col * g.o) =
                        *(const uint4 *)(mine + (f * 16 + col) * STEM_OS + part * 8);
                }
            }
        } else { // staging row r: pixel p0 + r
            for (int row = lane >> 3; row < STEM_PIX && part < nj && p0 + row < g.pixels;
                 row += 4) {
                *(uint4 *)((uint16_t *)g.y + (p0 + row) * g.o + o0 + part * 8) =
                    *(const uint4 *)(mine + row * STEM_OS + part * 8);
            }
        }
        __syncwarp();
    }
}

// KILN_CUDA_STEM_GATHER=global|half caps the stem kernel's gather mode (tests, A/B); -1 when
// unset (the best that applies).
static int stem_gather_env(void) {
    static int v = -2; // benign race: every thread computes the same value
    if (v == -2) {
        const char *e = getenv("KILN_CUDA_STEM_GATHER");
        v = e == NULL                  ? -1
            : strcmp(e, "global") == 0 ? STEM_GLOBAL
            : strcmp(e, "half") == 0   ? STEM_HALF
                                       : -1;
    }
    return v;
}

// Runs conv2d `args` (geometry g, groups 1) on the stem kernel; *fused: tail ops applied.
static kiln_status stem_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                            const conv_geom &g, int64_t groups, uint32_t *fused) {
    const uint32_t dt = g.y_dt;
    *fused = 0;
    int64_t k = g.c * g.kh * g.kw;
    if (groups != 1 || g.x_dt != dt || g.w_dt != dt || (g.bias != NULL && g.bias_dt != dt) ||
        (dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) || g.o % 8 != 0 ||
        !kiln_cuda_stem_fits(g.c, g.kh, g.kw, g.h, g.w_in, g.dh, g.dw) ||
        ((uintptr_t)g.y % 16) != 0 || g.oh * g.ow > 0x7fffffff) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda conv2d: the stem kernel cannot run this layer (%s, C %lld, "
                              "O %lld, %dx%d) at %s; set KILN_CUDA_NO_STEM=1",
                              kiln_cuda_dtype_name(dt), (long long)g.c, (long long)g.o, g.kh, g.kw,
                              ctx->where ? ctx->where : "?");
    }
    if (ctx->plan_only) return KILN_OK;
    stem_geom s;
    s.x = (const uint16_t *)g.x;
    s.w = (const uint16_t *)g.w;
    s.bias = g.bias;
    s.y = g.y;
    s.pixels = g.n * g.oh * g.ow;
    s.c = (int)g.c;
    s.h = (int)g.h;
    s.w_in = (int)g.w_in;
    s.o = (int)g.o;
    s.oh = (int)g.oh;
    s.ow = (int)g.ow;
    s.kh = g.kh;
    s.kw = g.kw;
    s.sh = g.sh;
    s.sw = g.sw;
    s.ph = g.ph;
    s.pw = g.pw;
    s.dh = g.dh;
    s.dw = g.dw;
    s.k = (int)k;
    s.relu = args->n_tail > 0 && args->tail[0].op == KILN_OP_RELU;
    s.n = (int)g.n;
    s.tiles_y = (int)((g.oh + STEM_TR - 1) / STEM_TR);
    s.tiles_x = (int)((g.ow + STEM_TC - 1) / STEM_TC);
    // gather mode: pairs when every pixel offset and depth pair is 32-bit aligned (an even
    // column stride, no column dilation, an even patch width), else 16-bit patch loads when the
    // patch fits, else global gathers (KILN_CUDA_STEM_GATHER caps it)
    const int want = stem_gather_env();
    int mode = STEM_GLOBAL;
    s.kwp = g.kw;
    s.patch_h = s.patch_w = 0;
    for (int m = want >= 0 ? want : STEM_PAIR; m > STEM_GLOBAL && mode == STEM_GLOBAL; m--) {
        const int kwp = m == STEM_PAIR ? g.kw + (g.kw & 1) : g.kw;
        const int ph = (STEM_TR - 1) * g.sh + (g.kh - 1) * g.dh + 1;
        const int pw = ((STEM_TC - 1) * g.sw + (kwp - 1) * g.dw + 2) / 2 * 2;
        if (m == STEM_PAIR && (g.sw % 2 != 0 || g.dw != 1)) continue;
        const int64_t kp = ((int64_t)g.c * g.kh * kwp + 15) / 16 * 16;
        if ((int64_t)(g.c + 1) * ph * pw > STEM_PATCH_MAX || pw > 32 * STEM_PW_CHUNKS ||
            kp > STEM_KP_MAX || g.n * s.tiles_y * s.tiles_x > 0x7fffffff)
            continue;
        mode = m;
        s.kwp = kwp;
        s.patch_h = ph;
        s.patch_w = pw;
    }
    s.kp = (int)(((int64_t)g.c * g.kh * s.kwp + 15) / 16 * 16);
    const bool patch = mode != STEM_GLOBAL;
    const int64_t tiles = patch ? g.n * s.tiles_y * s.tiles_x
                                : (s.pixels + STEM_WARPS * STEM_PIX - 1) / (STEM_WARPS * STEM_PIX);
    const unsigned yb = (unsigned)((g.o + STEM_BN - 1) / STEM_BN);
    const int64_t resident = (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 132) * 4 / yb;
    const unsigned xb = (unsigned)(tiles < resident ? tiles : resident > 0 ? resident : 1);
    const size_t smem = stem_smem(s);
    void (*kern)(stem_geom) = dt == KILN_DTYPE_F16
                                  ? (mode == STEM_PAIR   ? stem_kernel<__half, STEM_PAIR>
                                     : mode == STEM_HALF ? stem_kernel<__half, STEM_HALF>
                                                         : stem_kernel<__half, STEM_GLOBAL>)
                                  : (mode == STEM_PAIR   ? stem_kernel<__nv_bfloat16, STEM_PAIR>
                                     : mode == STEM_HALF ? stem_kernel<__nv_bfloat16, STEM_HALF>
                                                         : stem_kernel<__nv_bfloat16, STEM_GLOBAL>);
    if (smem > 48 * 1024) {
        cudaError_t e =
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return kiln_cuda_error(ctx, "cudaFuncSetAttribute (stem_kernel)", e);
    }
    kern<<<dim3(xb, yb), STEM_WARPS * 32, smem, ctx->stream>>>(s);
    KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "stem_kernel"));
    *fused = (uint32_t)s.relu;
    return KILN_OK;
}

// --- launchers

static kiln_status conv_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                            int transposed) {
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    const kiln_tensor *bias = args->n_in > 2 ? args->in[2] : NULL;
    const kiln_tensor *y = args->out;
    const kiln_attrs *at = &args->attrs;
    conv_geom g;
    memset(&g, 0, sizeof g);
    if (x == NULL || w == NULL || x->rank != 4 || w->rank != 4 || y->rank != 4 ||
        !kiln_cuda_is_float(x->dtype) || !kiln_cuda_is_float(w->dtype) ||
        !kiln_cuda_is_float(y->dtype) || (bias != NULL && !kiln_cuda_is_float(bias->dtype))) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda %s: needs 4-D float input, weight and output at %s",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    int64_t groups = kiln_attrs_int(at, transposed ? KILN_A_CONVT_GROUPS : KILN_A_CONV_GROUPS, 0);
    uint32_t ai_stride = transposed ? KILN_A_CONVT_STRIDE : KILN_A_CONV_STRIDE;
    uint32_t ai_pad = transposed ? KILN_A_CONVT_PADDING : KILN_A_CONV_PADDING;
    uint32_t ai_dil = transposed ? KILN_A_CONVT_DILATION : KILN_A_CONV_DILATION;
    g.x = x->data;
    g.w = w->data;
    g.bias = bias ? bias->data : NULL;
    g.y = y->data;
    g.x_dt = x->dtype;
    g.w_dt = w->dtype;
    g.bias_dt = bias ? bias->dtype : 0;
    g.y_dt = y->dtype;
    g.n = x->dims[0];
    g.c = x->dims[1];
    g.h = x->dims[2];
    g.w_in = x->dims[3];
    g.o = y->dims[1];
    g.oh = y->dims[2];
    g.ow = y->dims[3];
    g.kh = (int)w->dims[2];
    g.kw = (int)w->dims[3];
    g.sh = (int)kiln_attrs_int(at, ai_stride, 0);
    g.sw = (int)kiln_attrs_int(at, ai_stride, 1);
    g.ph = (int)kiln_attrs_int(at, ai_pad, 0);
    g.pw = (int)kiln_attrs_int(at, ai_pad, 1);
    g.dh = (int)kiln_attrs_int(at, ai_dil, 0);
    g.dw = (int)kiln_attrs_int(at, ai_dil, 1);
    g.transposed = transposed;
    g.nhwc = !transposed && ctx->nhwc;
    g.xcs = g.nhwc && ctx->x_cpad > x->dims[1] ? ctx->x_cpad : x->dims[1];
    if (groups <= 0 || g.c % groups != 0 || g.o % groups != 0 || g.sh <= 0 || g.sw <= 0 ||
        g.dh <= 0 || g.dw <= 0 || y->dims[0] != g.n) {
        return kiln_cuda_fail(
            KILN_ERR_INVALID_ARG, "cuda %s: bad groups %lld, strides or dilations at %s",
            kiln_cuda_op_name(args->op), (long long)groups, ctx->where ? ctx->where : "?");
    }
    g.cg = g.c / groups;
    g.og = g.o / groups;
    int64_t wo = transposed ? w->dims[1] * groups : w->dims[0];
    int64_t wc = transposed ? w->dims[0] : w->dims[1] * groups;
    if (wo != g.o || wc != g.c || (bias != NULL && kc_numel(bias) != g.o)) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda %s: weight or bias shape mismatch at %s",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    int64_t cols = g.n * g.oh * g.ow;
    if (cols == 0 || g.o == 0) return KILN_OK;
    if (!transposed && ctx->stem) {
        uint32_t fused = 0;
        KILN_CUDA_TRY(stem_run(ctx, args, g, groups, &fused));
        return ctx->plan_only ? KILN_OK : kiln_cuda_tail(ctx, args, fused);
    }
    if (!transposed) {
        kiln_cuda_conv_params cp;
        uint32_t skip = 0;
        int done = 0;
        cp.n = g.n;
        cp.c = g.xcs; // a channel-padded NHWC copy: cuDNN sees the zero channels (and filters)
        cp.h = g.h;
        cp.w = g.w_in;
        cp.o = g.o;
        cp.oh = g.oh;
        cp.ow = g.ow;
        cp.groups = groups;
        cp.kh = g.kh;
        cp.kw = g.kw;
        cp.sh = g.sh;
        cp.sw = g.sw;
        cp.ph = g.ph;
        cp.pw = g.pw;
        cp.dh = g.dh;
        cp.dw = g.dw;
        KILN_CUDA_TRY(kiln_cuda_dnn_conv2d(ctx, args, &cp, &skip, &done));
        if (done) return kiln_cuda_tail(ctx, args, skip);
    }
    if (ctx->plan_only) return KILN_OK;
    if (g.og < DIRECT_MAX_OG) {
        int64_t total = cols * g.o;
        conv_direct_kernel<<<kc_blocks(total, DIRECT_BLOCK), DIRECT_BLOCK, 0, ctx->stream>>>(g);
        KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "conv_direct_kernel"));
    } else {
        conv_loader ld = {g};
        int64_t depth = g.cg * g.kh * g.kw;
        tiled_gemm_kernel<conv_loader><<<tg_grid(g.og, cols, groups), TG_THREADS, 0, ctx->stream>>>(
            ld, g.og, cols, depth, groups);
        KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "tiled_gemm_kernel (conv)"));
    }
    return kiln_cuda_tail(ctx, args, 0);
}

// --- entry points

extern "C" kiln_status kiln_cuda_conv2d(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    return conv_run(ctx, args, 0);
}

extern "C" kiln_status kiln_cuda_conv_transpose2d(const kiln_cuda_ctx *ctx,
                                                  const kiln_kernel_args *args) {
    return conv_run(ctx, args, 1);
}
