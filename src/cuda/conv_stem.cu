// SPDX-License-Identifier: Apache-2.0
// Kiln's stem kernel (conv.h): conv2d with few input channels, in NHWC engines (ctx->stem,
// cuda_layout.h).
#include <string.h>

#include "cuda/conv.h"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_layout.h"
#include "cuda/mma.cuh"

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

extern "C" kiln_status kiln_cuda_stem_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                          const kiln_cuda_conv_geom *gp, uint32_t *fused) {
    const kiln_cuda_conv_geom &g = *gp;
    const int64_t groups = g.groups;
    const uint32_t dt = g.y_dt;
    *fused = 0;
    int64_t k = g.c * g.kh * g.kw;
    if (groups != 1 || g.x_dt != dt || g.w_dt != dt || (g.bias != NULL && g.bias_dt != dt) ||
        (dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) || g.o % 8 != 0 ||
        !kiln_cuda_stem_fits(g.c, g.kh, g.kw, g.h, g.w_in, g.dh, g.dw) ||
        ((uintptr_t)g.y % 16) != 0 || g.oh * g.ow > 0x7fffffff) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda conv2d: the stem kernel cannot run this layer (%s, C %lld, "
                              "O %lld, %dx%d) at %s; set the option cuda.stem_kernel to false",
                              kiln_cuda_dtype_name(dt), (long long)g.c, (long long)g.o, g.kh, g.kw,
                              ctx->where ? ctx->where : "?");
    }
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
    // patch fits, else global gathers (the policy's cuda.stem_gather caps it)
    const int want = ctx->policy->stem_gather == 1   ? STEM_HALF
                     : ctx->policy->stem_gather == 2 ? STEM_GLOBAL
                                                     : -1;
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
