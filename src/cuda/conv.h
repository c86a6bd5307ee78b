// SPDX-License-Identifier: Apache-2.0
// The convolution family's internals: conv2d (x[N, C, H, W], w[O, C/g, kh, kw], bias?[O]) and
// conv_transpose2d (x[N, C, H, W], w[C, O/g, kh, kw], bias?[O]). op_conv.cu plans a conv2d
// (cuDNN: dnn_conv.c; Kiln's stem kernel: conv_stem.cu; or Kiln's direct and implicit-GEMM
// kernels) and runs the plan; conv_transpose2d has no choices (Kiln's kernels).
#ifndef KILN_CUDA_CONV_H
#define KILN_CUDA_CONV_H

#include "cuda/cuda_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

// One convolution's operands and geometry (logical NCHW dims; with nhwc, x and y stored NHWC).
typedef struct kiln_cuda_conv_geom {
    const void *x, *w, *bias;
    void *y;
    uint32_t x_dt, w_dt, bias_dt, y_dt;
    int64_t n, c, h, w_in, o, oh, ow, groups;
    int64_t cg, og; // channels per group (input, output)
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int transposed;
    int nhwc;    // x and y stored NHWC (ctx->nhwc; conv2d only)
    int64_t xcs; // nhwc: x's channel stride (c, or ctx->x_cpad for a channel-padded copy)
    // w is the weight's KRSC copy (O, kh, kw, C / groups) with this channel stride (the NHWC
    // convs but the stem kernel's: ctx->w_krsc); 0: w is OIHW. A depthwise weight's KRSC copy
    // (stride 1) has the OIHW bytes.
    int64_t wcs;
} kiln_cuda_conv_geom;

// Fills *g from args; KILN_ERR_UNSUPPORTED / KILN_ERR_INVALID_ARG naming the layer when the
// operands are not a convolution the kernels take.
kiln_status kiln_cuda_conv_geom_of(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                   int transposed, kiln_cuda_conv_geom *g);

// --- Kiln's stem kernel (conv_stem.cu): conv2d of groups 1 with C % 8 != 0, NCHW in, NHWC out

// Enqueues it; *fused: the tail ops it applied (its ReLU). KILN_ERR_UNSUPPORTED naming the
// layer when the layer is outside the kernel's limits (cuda_layout.h: kiln_cuda_stem_fits).
kiln_status kiln_cuda_stem_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                               const kiln_cuda_conv_geom *g, uint32_t *fused);

// --- Kiln's pointwise kernel (conv_pw.cu): 1x1 conv2d of groups 1, no padding, in NHWC

// 1 when the kernel takes the layer: NHWC, 16-bit operands of one dtype, C, O and the strides
// multiples of 8, 16-byte aligned operands.
int kiln_cuda_pw_fits(const kiln_cuda_conv_geom *g);
// How many of the layer's tail ops the kernel applies: [an add of y's shape] then [activation].
uint32_t kiln_cuda_pw_fuses(const kiln_kernel_args *args);
// Enqueues it; *fused: the tail ops it applied.
kiln_status kiln_cuda_pw_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                             const kiln_cuda_conv_geom *g, uint32_t *fused);

// --- cuDNN (dnn_conv.c; the legacy API, loaded at run time: cuda_dnn.c)

// Sets up cuDNN's descriptors and chooses the algorithm by its heuristic within the workspace:
// 1; 2 when ctx->choice named the algorithm and it applied (no heuristic query); 0 (logged at
// DEBUG) when cuDNN cannot run the layer: then plan->descs may still hold reusable descriptors.
int kiln_cuda_dnn_conv_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g, int has_bias,
                             kiln_cuda_conv_rec *plan);
// Enqueues the planned convolution and the part of the tail cuDNN fuses (*skip ops: a residual
// add and a ReLU, through cudnnConvolutionBiasActivationForward); *done = 0 when cuDNN declined
// before enqueuing anything (the caller runs the plan's fallback).
kiln_status kiln_cuda_dnn_conv_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                   const kiln_cuda_conv_geom *g, kiln_cuda_conv_rec *plan,
                                   uint32_t *skip, int *done);
// Frees the plan's cuDNN descriptors (NULL-safe).
void kiln_cuda_dnn_conv_release(kiln_cuda_conv_rec *plan);
// "IMPLICIT_PRECOMP_GEMM, tensor-op math, NHWC" for kiln_layer_info.
void kiln_cuda_dnn_conv_describe(const kiln_cuda_conv_rec *plan, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CONV_H
