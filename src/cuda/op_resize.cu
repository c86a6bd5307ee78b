// SPDX-License-Identifier: Apache-2.0
// upsample_nearest2d and upsample_bilinear2d over [N, C, H, W], stored NCHW or (ctx->nhwc: the
// layout pass keeps input and output in one layout, cuda_layout.h) NHWC, with the CPU
// reference's index rules (src/cpu/op_resize.c, PyTorch's): source index floor(dst * scale) for
// nearest, half-pixel centres or align_corners for bilinear; scale = 1 / scales[i] when given,
// else in / out. Index math and interpolation in float32.
#include <math.h>

#include "cuda/cuda_common.cuh"

#define RESIZE_BLOCK 256

typedef struct resize_params {
    int64_t nc, h, w, oh, ow;
    int64_t c;    // NHWC: the channels (innermost); 0 for NCHW
    float sh, sw; // source step per output index (in / out, 1 / scale, or align_corners')
    int bilinear, align, given_h, given_w;
} resize_params;

// --- kernels

__device__ __forceinline__ int64_t rs_nearest(int64_t dst, int64_t in, int64_t out, float s,
                                              int given) {
    if (out == in) return dst;
    if (out == 2 * in && !given) return dst >> 1;
    int64_t src = (int64_t)floorf((float)dst * s);
    return src < in - 1 ? src : in - 1;
}

__device__ __forceinline__ void rs_linear(int64_t dst, int64_t in, float s, int align, int64_t *i0,
                                          int64_t *i1, float *w1) {
    float src = align ? s * (float)dst : s * ((float)dst + 0.5f) - 0.5f;
    if (!align && src < 0.0f) src = 0.0f;
    int64_t a = (int64_t)src;
    if (a > in - 1) a = in - 1;
    *i0 = a;
    *i1 = a + (a < in - 1 ? 1 : 0);
    *w1 = src - (float)a;
}

// One output element per thread. I: the index type, uint32_t where every element index fits (a
// 64-bit division costs about a hundred instructions, five per element here: SegFormer's four
// bilinear upsamples to [1, 256, 128, 128] took 49 us each on the H100).
template <typename T, typename I>
static __global__ void resize_kernel(const __grid_constant__ resize_params P, const T *x, T *y) {
    const I n = (I)(P.nc * P.oh * P.ow * (P.c > 0 ? P.c : 1));
    const I c = (I)P.c, oh = (I)P.oh, ow = (I)P.ow;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        // NCHW: i = (p, r, q) with p = n * C + c; NHWC: i = ((n, r, q), c), element stride C
        I j = i, ch = 0, es = 1;
        if (c > 0) {
            j = i / c;
            ch = i - j * c;
            es = c;
        }
        const I jr = j / ow, q = j - jr * ow, p = jr / oh, r = jr - p * oh;
        const T *xb = x + (int64_t)p * P.h * P.w * es + ch;
        float v;
        if (!P.bilinear) {
            int64_t sr = rs_nearest(r, P.h, P.oh, P.sh, P.given_h);
            int64_t sc = rs_nearest(q, P.w, P.ow, P.sw, P.given_w);
            v = kc_to_f(xb[(sr * P.w + sc) * es]);
        } else {
            int64_t r0, r1, c0, c1;
            float wr, wc;
            rs_linear(r, P.h, P.sh, P.align, &r0, &r1, &wr);
            rs_linear(q, P.w, P.sw, P.align, &c0, &c1, &wc);
            float v00 = kc_to_f(xb[(r0 * P.w + c0) * es]), v01 = kc_to_f(xb[(r0 * P.w + c1) * es]);
            float v10 = kc_to_f(xb[(r1 * P.w + c0) * es]), v11 = kc_to_f(xb[(r1 * P.w + c1) * es]);
            v = (1.0f - wr) * ((1.0f - wc) * v00 + wc * v01) + wr * ((1.0f - wc) * v10 + wc * v11);
        }
        y[i] = kc_from_f<T>(v);
    }
}

// NHWC with whole 16-byte vectors of channels (C a multiple of 16 / sizeof(T), aligned maps):
// a thread per output pixel and vector, 16-byte loads of the source pixels and one store.
template <typename T>
static __global__ void resize_nhwc_vec_kernel(const __grid_constant__ resize_params P, const T *x,
                                              T *y) {
    constexpr int V = 16 / (int)sizeof(T);
    const uint32_t cv = (uint32_t)P.c / V, oh = (uint32_t)P.oh, ow = (uint32_t)P.ow;
    const uint32_t n = (uint32_t)(P.nc * P.oh * P.ow) * cv;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const uint32_t j = i / cv, k = i - j * cv, jr = j / ow, q = j - jr * ow, p = jr / oh,
                       r = jr - p * oh;
        const uint4 *xb = (const uint4 *)(x + (int64_t)p * P.h * P.w * P.c) + k;
        float v[V];
        if (!P.bilinear) {
            const int64_t sr = rs_nearest(r, P.h, P.oh, P.sh, P.given_h);
            const int64_t sc = rs_nearest(q, P.w, P.ow, P.sw, P.given_w);
            const uint4 u = __ldg(xb + (sr * P.w + sc) * cv);
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = kc_to_f(((const T *)&u)[e]);
        } else {
            int64_t r0, r1, c0, c1;
            float wr, wc;
            rs_linear(r, P.h, P.sh, P.align, &r0, &r1, &wr);
            rs_linear(q, P.w, P.sw, P.align, &c0, &c1, &wc);
            const uint4 u00 = __ldg(xb + (r0 * P.w + c0) * cv),
                        u01 = __ldg(xb + (r0 * P.w + c1) * cv);
            const uint4 u10 = __ldg(xb + (r1 * P.w + c0) * cv),
                        u11 = __ldg(xb + (r1 * P.w + c1) * cv);
#pragma unroll
            for (int e = 0; e < V; e++) {
                const float v00 = kc_to_f(((const T *)&u00)[e]),
                            v01 = kc_to_f(((const T *)&u01)[e]);
                const float v10 = kc_to_f(((const T *)&u10)[e]),
                            v11 = kc_to_f(((const T *)&u11)[e]);
                v[e] = (1.0f - wr) * ((1.0f - wc) * v00 + wc * v01) +
                       wr * ((1.0f - wc) * v10 + wc * v11);
            }
        }
        uint4 o;
#pragma unroll
        for (int e = 0; e < V; e++) ((T *)&o)[e] = kc_from_f<T>(v[e]);
        ((uint4 *)y)[i] = o;
    }
}

// --- launchers

static float rs_step(double given, int64_t in, int64_t out, int bilinear, int align) {
    if (bilinear && align) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    return !isnan(given) ? (float)(1.0 / given) : (float)in / (float)out;
}

template <typename T>
static kiln_status resize_launch(const kiln_cuda_ctx *ctx, const resize_params &P, const void *x,
                                 void *y) {
    int64_t n = P.nc * P.oh * P.ow * (P.c > 0 ? P.c : 1);
    if (n == 0) return KILN_OK;
    const unsigned blocks = kc_blocks(n, RESIZE_BLOCK);
    // 32-bit indices while every element index, and the grid-stride loop's last step, fit
    const int i32 = n + (int64_t)blocks * RESIZE_BLOCK < INT32_MAX;
    constexpr int V = 16 / (int)sizeof(T);
    if (i32 && P.c > 0 && P.c % V == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)y % 16 == 0) {
        resize_nhwc_vec_kernel<T><<<kc_blocks(n / V, RESIZE_BLOCK), RESIZE_BLOCK, 0, ctx->stream>>>(
            P, (const T *)x, (T *)y);
        return kiln_cuda_check_launch(ctx, "resize_nhwc_vec_kernel");
    }
    if (i32) {
        resize_kernel<T, uint32_t>
            <<<blocks, RESIZE_BLOCK, 0, ctx->stream>>>(P, (const T *)x, (T *)y);
    } else {
        resize_kernel<T, int64_t>
            <<<blocks, RESIZE_BLOCK, 0, ctx->stream>>>(P, (const T *)x, (T *)y);
    }
    return kiln_cuda_check_launch(ctx, "resize_kernel");
}

// --- grid_sample (the CPU reference's rules, src/cpu/op_resize.c: PyTorch's grid_sampler_2d):
// x [N, C, H, W] NCHW at grid [N, Ho, Wo, 2] (x's dtype, or float32) -> [N, C, Ho, Wo], one
// output element a thread, the source position unnormalized in float32 and the corners'
// weighted sum in float32 (deformable attention's and RAFT's lookups: one launch for what was a
// chain of some fifty elementwise, gather and reshape layers).

typedef struct grid_params {
    uint32_t n, c, h, w, ho, wo;
    int nearest, border, align;
    int xt, gt; // element kinds of x (and y) and of the grid: 0 float32, 1 float16, 2 bfloat16
} grid_params;

// One kernel for every dtype, the element kind a run-time switch (a template per dtype cost the
// runtime wheel 10 kB: docs/packaging.md).
__device__ __forceinline__ float gs_load(const void *p, uint32_t i, int kind) {
    const uint16_t *h = (const uint16_t *)p;
    switch (kind) {
    case 1: return __half2float(__ushort_as_half(h[i]));
    case 2: return __uint_as_float((uint32_t)h[i] << 16);
    default: return ((const float *)p)[i];
    }
}

// Each step rounded as the CPU reference rounds it (no fused multiply-add): nearest mode's
// rint() and bilinear's floor() then pick the same pixel.
__device__ __forceinline__ float gs_source(float g, uint32_t size, int align, int border) {
    const float g1 = __fadd_rn(g, 1.0f);
    float s = align ? __fmul_rn(__fmul_rn(g1, 0.5f), (float)(size - 1))
                    : __fmul_rn(__fsub_rn(__fmul_rn(g1, (float)size), 1.0f), 0.5f);
    return border ? fminf((float)(size - 1), fmaxf(s, 0.0f)) : s;
}

__device__ __forceinline__ float gs_at(const void *x, uint32_t base, const grid_params &P, float r,
                                       float q) {
    if (!(r >= 0.0f && r <= (float)(P.h - 1) && q >= 0.0f && q <= (float)(P.w - 1))) return 0.0f;
    return gs_load(x, base + (uint32_t)r * P.w + (uint32_t)q, P.xt);
}

static __global__ void grid_sample_kernel(const __grid_constant__ grid_params P, const void *x,
                                          const void *grid, void *y) {
    const uint32_t pix = P.ho * P.wo, total = P.n * P.c * pix;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        const uint32_t p = i % pix, nc = i / pix, gi = (nc / P.c * pix + p) * 2;
        const float ix = gs_source(gs_load(grid, gi, P.gt), P.w, P.align, P.border);
        const float iy = gs_source(gs_load(grid, gi + 1, P.gt), P.h, P.align, P.border);
        const uint32_t base = nc * P.h * P.w;
        // the corners in PyTorch's order (nw, ne, sw, se), each weighted by the opposite
        // corner's distances; nearest: the one pixel at rint(), weight 1. A loop, not unrolled
        // (device code size, as above).
        const float x0 = floorf(ix), y0 = floorf(iy), x1 = x0 + 1.0f, y1 = y0 + 1.0f;
        float v = 0.0f;
#pragma unroll 1
        for (int k = 0; k < (P.nearest ? 1 : 4); k++) {
            const float r = P.nearest ? rintf(iy) : (k & 2 ? y1 : y0);
            const float q = P.nearest ? rintf(ix) : (k & 1 ? x1 : x0);
            const float t = P.nearest ? gs_at(x, base, P, r, q)
                                      : gs_at(x, base, P, r, q) * ((k & 1 ? ix - x0 : x1 - ix) *
                                                                   (k & 2 ? iy - y0 : y1 - iy));
            v = k == 0 ? t : v + t;
        }
        switch (P.xt) {
        case 1: ((__half *)y)[i] = __float2half_rn(v); break;
        case 2: ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(v); break;
        default: ((float *)y)[i] = v;
        }
    }
}

static int gs_kind(uint32_t dt) {
    return dt == KILN_DTYPE_F16 ? 1 : dt == KILN_DTYPE_BF16 ? 2 : dt == KILN_DTYPE_F32 ? 0 : -1;
}

extern "C" kiln_status kiln_cuda_grid_sample(const kiln_cuda_ctx *ctx,
                                             const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *g = args->in[1], *y = args->out;
    // 32-bit indices: every element index of x, the grid and y, and the last grid-stride step
    const int64_t big = (int64_t)1 << 30;
    if (x->rank != 4 || g == NULL || g->rank != 4 || y->rank != 4 || x->dtype != y->dtype ||
        (g->dtype != x->dtype && g->dtype != KILN_DTYPE_F32) || kc_numel(x) >= big ||
        kc_numel(g) >= big || kc_numel(y) >= big) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda grid_sample: needs [N, C, H, W] of one float dtype, a grid of "
                              "it or float32 and fewer than 2^30 elements each, at %s",
                              ctx->where ? ctx->where : "?");
    }
    grid_params P;
    memset(&P, 0, sizeof P);
    P.n = (uint32_t)x->dims[0];
    P.c = (uint32_t)x->dims[1];
    P.h = (uint32_t)x->dims[2];
    P.w = (uint32_t)x->dims[3];
    P.ho = (uint32_t)y->dims[2];
    P.wo = (uint32_t)y->dims[3];
    P.nearest = kiln_attrs_int(&args->attrs, KILN_A_GRID_MODE, 0) == 1;
    P.border = kiln_attrs_int(&args->attrs, KILN_A_GRID_PADDING, 0) == 1;
    P.align = kiln_attrs_int(&args->attrs, KILN_A_GRID_ALIGN, 0) != 0;
    P.xt = gs_kind(y->dtype);
    P.gt = gs_kind(g->dtype);
    if (P.xt < 0 || P.gt < 0) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda grid_sample: dtype %s at %s",
                              kiln_cuda_dtype_name(y->dtype), ctx->where ? ctx->where : "?");
    }
    const uint64_t n = (uint64_t)P.n * P.c * P.ho * P.wo;
    if (n == 0) return KILN_OK;
    grid_sample_kernel<<<kc_blocks((int64_t)n, RESIZE_BLOCK), RESIZE_BLOCK, 0, ctx->stream>>>(
        P, x->data, g->data, args->out->data);
    return kiln_cuda_check_launch(ctx, "grid_sample_kernel");
}

// --- entry points

extern "C" kiln_status kiln_cuda_upsample(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    if (x->rank != 4 || y->rank != 4 || x->dtype != y->dtype || x->dims[2] < 1 || x->dims[3] < 1) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda upsample: needs [N, C, H, W] of one float dtype at %s",
                              ctx->where ? ctx->where : "?");
    }
    resize_params P;
    memset(&P, 0, sizeof P);
    P.bilinear = args->op == KILN_OP_UPSAMPLE_BILINEAR2D;
    P.align = P.bilinear ? (int)kiln_attrs_int(&args->attrs, KILN_A_UPSAMPLE_ALIGN, 0) : 0;
    double gh = kiln_attrs_float(&args->attrs, KILN_A_UPSAMPLE_SCALES, 0);
    double gw = kiln_attrs_float(&args->attrs, KILN_A_UPSAMPLE_SCALES, 1);
    P.nc = x->dims[0] * x->dims[1];
    if (ctx->nhwc) { // one output element per thread, the channels innermost (coalesced)
        P.nc = x->dims[0];
        P.c = x->dims[1];
    }
    P.h = x->dims[2];
    P.w = x->dims[3];
    P.oh = y->dims[2];
    P.ow = y->dims[3];
    P.given_h = !isnan(gh);
    P.given_w = !isnan(gw);
    P.sh = rs_step(gh, P.h, P.oh, P.bilinear, P.align);
    P.sw = rs_step(gw, P.w, P.ow, P.bilinear, P.align);
    switch (y->dtype) {
    case KILN_DTYPE_F32: return resize_launch<float>(ctx, P, x->data, y->data);
    case KILN_DTYPE_F16: return resize_launch<__half>(ctx, P, x->data, y->data);
    case KILN_DTYPE_BF16: return resize_launch<__nv_bfloat16>(ctx, P, x->data, y->data);
    default:
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda upsample: dtype %s at %s",
                              kiln_cuda_dtype_name(y->dtype), ctx->where ? ctx->where : "?");
    }
}
