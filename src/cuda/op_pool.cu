// SPDX-License-Identifier: Apache-2.0
// 2-D pooling over the last two dims ([.., H, W] -> [.., OH, OW], OH/OW from the output tensor):
// max_pool2d (padding counts as -inf, dilation, NaN propagates), avg_pool2d (PyTorch's divisor
// rules: count_include_pad, divisor_override, windows clipped to the padded input), and
// adaptive_avg_pool2d (bins [floor(i*H/OH), ceil((i+1)*H/OH))). One thread per output element,
// float32 accumulation. With ctx->nhwc (4-D, cuda_layout.h) x is stored NHWC (threads run
// channel-fastest) and y too, except adaptive_avg_pool2d which writes NCHW; an NHWC
// float16/bfloat16 max pool with C % 8 == 0 takes 8 channels per thread (16-byte accesses).
#include <math.h>

#include "cuda/cuda_common.cuh"

#define POOL_BLOCK 256

typedef struct pool_params {
    int64_t planes, h, w, oh, ow;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;
    int64_t divisor; // 0 = none
    int64_t c;       // nhwc_in: channels (planes = N * c)
    int nhwc_in;     // x is [N, C, H, W] stored NHWC (ctx->nhwc)
    int nhwc_out;    // y stored NHWC (max/avg pool with nhwc_in; adaptive pool writes NCHW)
    int idx32;       // every output index fits 31 bits: pool_at divides in 32-bit
} pool_params;

// Output element i (in y's storage order) -> its window origin in x, x's element stride within
// a plane, and y's storage index.
typedef struct pool_pos {
    int64_t oy, ox, xbase, xs, yi;
} pool_pos;

__device__ __forceinline__ pool_pos pool_at(const pool_params &P, int64_t i) {
    pool_pos q;
    if (P.idx32) { // the same in 32-bit arithmetic (a 64-bit division is ~100 instructions)
        const uint32_t u = (uint32_t)i, ow = (uint32_t)P.ow, oh = (uint32_t)P.oh;
        if (!P.nhwc_in) {
            const uint32_t r = u / ow;
            q.ox = u - r * ow;
            q.oy = r % oh;
            q.xbase = (int64_t)(r / oh) * P.h * P.w;
            q.xs = 1;
            q.yi = i;
        } else {
            const uint32_t c = (uint32_t)P.c, r = u / c, ch = u - r * c, r2 = r / ow;
            const uint32_t n = r2 / oh;
            q.ox = r - r2 * ow;
            q.oy = r2 - n * oh;
            q.xbase = (int64_t)n * P.h * P.w * P.c + ch;
            q.xs = P.c;
            q.yi = P.nhwc_out ? i : (((int64_t)n * P.c + ch) * P.oh + q.oy) * P.ow + q.ox;
        }
        return q;
    }
    if (!P.nhwc_in) {
        int64_t pl = i / (P.ow * P.oh);
        q.ox = i % P.ow;
        q.oy = (i / P.ow) % P.oh;
        q.xbase = pl * P.h * P.w;
        q.xs = 1;
        q.yi = i;
    } else {
        // i runs over NHWC positions: channel fastest (coalesced reads of x)
        int64_t ch = i % P.c, r = i / P.c;
        int64_t n = r / (P.ow * P.oh);
        q.ox = r % P.ow;
        q.oy = (r / P.ow) % P.oh;
        q.xbase = n * P.h * P.w * P.c + ch;
        q.xs = P.c;
        q.yi = P.nhwc_out ? i : ((n * P.c + ch) * P.oh + q.oy) * P.ow + q.ox;
    }
    return q;
}

// --- kernels

template <typename T>
static __global__ void max_pool_kernel(const T *x, T *y, const pool_params P) {
    int64_t n = P.planes * P.oh * P.ow;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        pool_pos q = pool_at(P, i);
        int64_t ox = q.ox, oy = q.oy, xs = q.xs;
        const T *xp = x + q.xbase;
        float m = -INFINITY;
        for (int a = 0; a < P.kh; a++) {
            int64_t iy = oy * P.sh - P.ph + (int64_t)a * P.dh;
            if (iy < 0 || iy >= P.h) continue;
            for (int b = 0; b < P.kw; b++) {
                int64_t ix = ox * P.sw - P.pw + (int64_t)b * P.dw;
                if (ix < 0 || ix >= P.w) continue;
                float v = kc_to_f(xp[(iy * P.w + ix) * xs]);
                if (v > m || v != v) m = v;
                if (m != m) break;
            }
        }
        y[q.yi] = kc_from_f<T>(m);
    }
}

template <typename T>
static __global__ void avg_pool_kernel(const T *x, T *y, const pool_params P) {
    int64_t n = P.planes * P.oh * P.ow;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        pool_pos q = pool_at(P, i);
        int64_t ox = q.ox, oy = q.oy, xs = q.xs;
        const T *xp = x + q.xbase;
        int64_t hs = oy * P.sh - P.ph, ws = ox * P.sw - P.pw;
        int64_t he = hs + P.kh, we = ws + P.kw;
        if (he > P.h + P.ph) he = P.h + P.ph;
        if (we > P.w + P.pw) we = P.w + P.pw;
        int64_t pool = (he - hs) * (we - ws);
        if (hs < 0) hs = 0;
        if (ws < 0) ws = 0;
        if (he > P.h) he = P.h;
        if (we > P.w) we = P.w;
        float s = 0.0f;
        for (int64_t iy = hs; iy < he; iy++) {
            for (int64_t ix = ws; ix < we; ix++) s += kc_to_f(xp[(iy * P.w + ix) * xs]);
        }
        int64_t div = P.divisor != 0        ? P.divisor
                      : P.count_include_pad ? pool
                                            : (he - hs) * (we - ws);
        y[q.yi] = kc_from_f<T>(div > 0 ? s / (float)div : 0.0f);
    }
}

template <typename T>
static __global__ void adaptive_avg_pool_kernel(const T *x, T *y, const pool_params P) {
    int64_t n = P.planes * P.oh * P.ow;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        pool_pos q = pool_at(P, i);
        int64_t ox = q.ox, oy = q.oy, xs = q.xs;
        const T *xp = x + q.xbase;
        int64_t hs = oy * P.h / P.oh, he = ((oy + 1) * P.h + P.oh - 1) / P.oh;
        int64_t ws = ox * P.w / P.ow, we = ((ox + 1) * P.w + P.ow - 1) / P.ow;
        float s = 0.0f;
        for (int64_t iy = hs; iy < he; iy++) {
            for (int64_t ix = ws; ix < we; ix++) s += kc_to_f(xp[(iy * P.w + ix) * xs]);
        }
        int64_t cnt = (he - hs) * (we - ws);
        y[q.yi] = kc_from_f<T>(cnt > 0 ? s / (float)cnt : 0.0f);
    }
}

// max_pool2d on NHWC float16/bfloat16 with C % 8 == 0 (ResNet's stem pool): one thread per
// 8 channels of an output pixel, 16-byte loads and stores, 32-bit indices (the caller checks
// that every index of x and y fits). NaN propagates as in max_pool_kernel.
template <typename T>
static __global__ void max_pool_nhwc8_kernel(const T *x, T *y, const pool_params P, uint32_t n) {
    const uint32_t cg = (uint32_t)P.c / 8, ow = (uint32_t)P.ow, oh = (uint32_t)P.oh;
    const uint32_t h = (uint32_t)P.h, w = (uint32_t)P.w, c = (uint32_t)P.c;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const uint32_t g = i % cg, r = i / cg, ox = r % ow, r2 = r / ow, oy = r2 % oh;
        const uint32_t nb = r2 / oh;
        float m[8];
#pragma unroll
        for (int e = 0; e < 8; e++) m[e] = -INFINITY;
        for (int a = 0; a < P.kh; a++) {
            const int iy = (int)oy * P.sh - P.ph + a * P.dh;
            if (iy < 0 || iy >= (int)h) continue;
            for (int b = 0; b < P.kw; b++) {
                const int ix = (int)ox * P.sw - P.pw + b * P.dw;
                if (ix < 0 || ix >= (int)w) continue;
                const uint4 u =
                    *(const uint4 *)(x + ((nb * h + (uint32_t)iy) * w + (uint32_t)ix) * c + g * 8);
                const T *hv = (const T *)&u;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float v = kc_to_f(hv[e]);
                    if (v > m[e] || v != v) m[e] = v; // a NaN stays: nothing compares above it
                }
            }
        }
        uint4 o;
        T *ho = (T *)&o;
#pragma unroll
        for (int e = 0; e < 8; e++) ho[e] = kc_from_f<T>(m[e]);
        *(uint4 *)(y + i * 8) = o;
    }
}

// --- launchers

static kiln_status pool_fail(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                             const char *what) {
    return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda %s: %s at %s", kiln_cuda_op_name(args->op),
                          what, ctx->where ? ctx->where : "?");
}

// Shapes and attributes; 0 on success.
static int pool_setup(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, pool_params *P) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    const kiln_attrs *a = &args->attrs;
    if (x->rank < 2 || y->rank != x->rank) return 1;
    P->nhwc_in = ctx->nhwc && x->rank == 4;
    P->nhwc_out = P->nhwc_in && args->op != KILN_OP_ADAPTIVE_AVG_POOL2D;
    P->c = x->rank == 4 ? x->dims[1] : 1;
    P->h = x->dims[x->rank - 2];
    P->w = x->dims[x->rank - 1];
    P->oh = y->dims[y->rank - 2];
    P->ow = y->dims[y->rank - 1];
    P->planes = 1;
    for (uint32_t d = 0; d + 2 < x->rank; d++) P->planes *= x->dims[d];
    P->kh = P->kw = 1;
    P->sh = P->sw = 1;
    P->ph = P->pw = 0;
    P->dh = P->dw = 1;
    P->count_include_pad = 1;
    P->divisor = 0;
    if (args->op == KILN_OP_MAX_POOL2D) {
        P->kh = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_KERNEL, 0);
        P->kw = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_KERNEL, 1);
        P->sh = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_STRIDE, 0);
        P->sw = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_STRIDE, 1);
        P->ph = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_PADDING, 0);
        P->pw = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_PADDING, 1);
        P->dh = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_DILATION, 0);
        P->dw = (int)kiln_attrs_int(a, KILN_A_MAXPOOL_DILATION, 1);
    } else if (args->op == KILN_OP_AVG_POOL2D) {
        P->kh = (int)kiln_attrs_int(a, KILN_A_AVGPOOL_KERNEL, 0);
        P->kw = (int)kiln_attrs_int(a, KILN_A_AVGPOOL_KERNEL, 1);
        P->sh = (int)kiln_attrs_int(a, KILN_A_AVGPOOL_STRIDE, 0);
        P->sw = (int)kiln_attrs_int(a, KILN_A_AVGPOOL_STRIDE, 1);
        P->ph = (int)kiln_attrs_int(a, KILN_A_AVGPOOL_PADDING, 0);
        P->pw = (int)kiln_attrs_int(a, KILN_A_AVGPOOL_PADDING, 1);
        P->count_include_pad = kiln_attrs_int(a, KILN_A_AVGPOOL_COUNT_PAD, 0) != 0;
        P->divisor = kiln_attrs_int(a, KILN_A_AVGPOOL_DIVISOR, 0);
    }
    if (P->kh <= 0 || P->kw <= 0 || P->sh <= 0 || P->sw <= 0 || P->dh <= 0 || P->dw <= 0) {
        return 1;
    }
    return 0;
}

template <typename T>
static kiln_status pool_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    pool_params P;
    if (pool_setup(ctx, args, &P) != 0) return pool_fail(ctx, args, "bad shape or attributes");
    int64_t n = P.planes * P.oh * P.ow;
    if (n == 0) return KILN_OK;
    P.idx32 = n < INT64_C(0x7fffffff);
    const T *x = (const T *)args->in[0]->data;
    T *y = (T *)args->out->data;
    unsigned blocks = kc_blocks(n, POOL_BLOCK);
    if constexpr (sizeof(T) == 2) {
        const int64_t xn = kc_numel(args->in[0]);
        if (args->op == KILN_OP_MAX_POOL2D && P.nhwc_in && P.nhwc_out && P.c % 8 == 0 &&
            xn < INT64_C(0x7fffffff) && n < INT64_C(0x7fffffff) && (uintptr_t)x % 16 == 0 &&
            (uintptr_t)y % 16 == 0) {
            const uint32_t nv = (uint32_t)(n / 8);
            max_pool_nhwc8_kernel<T>
                <<<kc_blocks(nv, POOL_BLOCK), POOL_BLOCK, 0, ctx->stream>>>(x, y, P, nv);
            return kiln_cuda_check_launch(ctx, "max_pool_nhwc8_kernel");
        }
    }
    switch (args->op) {
    case KILN_OP_MAX_POOL2D:
        max_pool_kernel<T><<<blocks, POOL_BLOCK, 0, ctx->stream>>>(x, y, P);
        return kiln_cuda_check_launch(ctx, "max_pool_kernel");
    case KILN_OP_AVG_POOL2D:
        avg_pool_kernel<T><<<blocks, POOL_BLOCK, 0, ctx->stream>>>(x, y, P);
        return kiln_cuda_check_launch(ctx, "avg_pool_kernel");
    default:
        if (P.h == 0 || P.w == 0) return pool_fail(ctx, args, "empty input plane");
        adaptive_avg_pool_kernel<T><<<blocks, POOL_BLOCK, 0, ctx->stream>>>(x, y, P);
        return kiln_cuda_check_launch(ctx, "adaptive_avg_pool_kernel");
    }
}

static kiln_status pool_dispatch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    if (args->in[0] == NULL || args->in[0]->dtype != args->out->dtype) {
        return pool_fail(ctx, args, "input and output dtypes differ");
    }
    switch (args->out->dtype) {
    case KILN_DTYPE_F32: return pool_launch<float>(ctx, args);
    case KILN_DTYPE_F16: return pool_launch<__half>(ctx, args);
    case KILN_DTYPE_BF16: return pool_launch<__nv_bfloat16>(ctx, args);
    default: return pool_fail(ctx, args, "unsupported dtype");
    }
}

// --- entry points

extern "C" kiln_status kiln_cuda_max_pool2d(const kiln_cuda_ctx *ctx,
                                            const kiln_kernel_args *args) {
    return pool_dispatch(ctx, args);
}

extern "C" kiln_status kiln_cuda_avg_pool2d(const kiln_cuda_ctx *ctx,
                                            const kiln_kernel_args *args) {
    return pool_dispatch(ctx, args);
}

extern "C" kiln_status kiln_cuda_adaptive_avg_pool2d(const kiln_cuda_ctx *ctx,
                                                     const kiln_kernel_args *args) {
    return pool_dispatch(ctx, args);
}
