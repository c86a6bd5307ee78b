// SPDX-License-Identifier: Apache-2.0
// conv2d (x[N, C, H, W], w[O, C/g, kh, kw], bias?[O]) and conv_transpose2d (x[N, C, H, W],
// w[C, O/g, kh, kw], bias?[O]) with stride, padding, dilation, groups (and output_padding, which
// only shapes the output). Each group is an implicit GEMM on Kiln's tiled core
// (tiled_gemm.cuh): rows = output channels of the group, columns = N*OH*OW output pixels, depth
// = C/g*kh*kw, the input gathered on the fly (im2col without the buffer). Groups with fewer than
// DIRECT_MAX_OG output channels (depthwise) take a direct kernel, one thread per output. Float32
// accumulation; the fused tail runs after in one elementwise kernel.
#include <string.h>

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
