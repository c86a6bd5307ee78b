// SPDX-License-Identifier: Apache-2.0
// conv2d through cuDNN's legacy API (conv.h). Layout: NCHW, or NHWC (x, y, bias and residual;
// the filter in KRSC order, a copy made at upload) when the layout pass (cuda_layout.h) keeps the
// layer's activations NHWC: cuDNN's NCHW fp16 engines measured on the H200 ran FMA implicit
// GEMMs for 1x1 convs. Math: fp16 and bf16 with float compute (tensor-core math), float32 with
// CUDNN_FMA_MATH (no TF32, like the GEMMs). A plan holds the layer's descriptors and the
// algorithm chosen by cudnnGetConvolutionForwardAlgorithm_v7 within the context's workspace
// (timing the candidates with cudnnFind picked slower algorithms on the H200: the heuristic
// stays; docs/benchmarks.md).
//
// The fused tail: bias plus [add(residual)] plus [relu] become one
// cudnnConvolutionBiasActivationForward (y = act(conv(x, w) + z + bias)); otherwise
// cudnnConvolutionForward, then cudnnAddTensor for the bias, then Kiln's tail kernel. A refusal
// (status not SUCCESS, returned before any work is enqueued) is remembered in the plan.
#include <stdio.h>
#include <string.h>

#include "cuda/conv.h"
#include "cuda/cuda_dnn.h"

#if KILN_CUDA_HAVE_CUDNN

#define api kiln_cuda_dnn_fn

// The descriptors of one plan (behind kiln_cuda_conv_rec.descs).
typedef struct conv_descs {
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnActivationDescriptor_t relu, ident;
} conv_descs;

void kiln_cuda_dnn_conv_release(kiln_cuda_conv_rec *plan) {
    conv_descs *d = plan != NULL ? plan->descs : NULL;
    if (d == NULL) return;
    if (d->x) api.cudnnDestroyTensorDescriptor(d->x);
    if (d->y) api.cudnnDestroyTensorDescriptor(d->y);
    if (d->b) api.cudnnDestroyTensorDescriptor(d->b);
    if (d->w) api.cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) api.cudnnDestroyConvolutionDescriptor(d->conv);
    if (d->relu) api.cudnnDestroyActivationDescriptor(d->relu);
    if (d->ident) api.cudnnDestroyActivationDescriptor(d->ident);
    kiln_cuda_free(d, sizeof *d);
    plan->descs = NULL;
}

static cudnnDataType_t dnn_type(uint32_t dtype) {
    return dtype == KILN_DTYPE_F16    ? CUDNN_DATA_HALF
           : dtype == KILN_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16
                                      : CUDNN_DATA_FLOAT;
}

static int descs_create(kiln_cuda_conv_rec *plan) {
    conv_descs *d = kiln_cuda_calloc(sizeof *d);
    if (d == NULL) return 0;
    plan->descs = d;
    if (api.cudnnCreateTensorDescriptor(&d->x) != CUDNN_STATUS_SUCCESS ||
        api.cudnnCreateTensorDescriptor(&d->y) != CUDNN_STATUS_SUCCESS ||
        api.cudnnCreateTensorDescriptor(&d->b) != CUDNN_STATUS_SUCCESS ||
        api.cudnnCreateFilterDescriptor(&d->w) != CUDNN_STATUS_SUCCESS ||
        api.cudnnCreateConvolutionDescriptor(&d->conv) != CUDNN_STATUS_SUCCESS ||
        api.cudnnCreateActivationDescriptor(&d->relu) != CUDNN_STATUS_SUCCESS ||
        api.cudnnSetActivationDescriptor(d->relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN,
                                         0.0) != CUDNN_STATUS_SUCCESS ||
        api.cudnnCreateActivationDescriptor(&d->ident) != CUDNN_STATUS_SUCCESS ||
        api.cudnnSetActivationDescriptor(d->ident, CUDNN_ACTIVATION_IDENTITY, CUDNN_PROPAGATE_NAN,
                                         0.0) != CUDNN_STATUS_SUCCESS) {
        kiln_cuda_dnn_conv_release(plan);
        return 0;
    }
    return 1;
}

static const char *algo_name(int a) {
    static const char *names[] = {
        "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
        "WINOGRAD",      "WINOGRAD_NONFUSED"};
    return a >= 0 && a < (int)(sizeof names / sizeof names[0]) ? names[a] : "?";
}

static int fits_int(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

int kiln_cuda_dnn_conv_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *p, int has_bias,
                             kiln_cuda_conv_rec *plan) {
    cudnnDataType_t t = dnn_type(p->y_dt);
    cudnnTensorFormat_t fmt = p->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int n_perf = 0, found = -1;
    cudnnStatus_t s;
    (void)has_bias;
    if (ctx->dnn == NULL || !fits_int(p->n) || !fits_int(p->c) || !fits_int(p->h) ||
        !fits_int(p->w_in) || !fits_int(p->o) || !fits_int(p->oh) || !fits_int(p->ow) ||
        !fits_int(p->groups)) {
        return 0;
    }
    if (plan->descs == NULL && !descs_create(plan)) return 0;
    conv_descs *d = plan->descs;
    s = api.cudnnSetTensor4dDescriptor(d->x, fmt, t, (int)p->n, (int)p->c, (int)p->h, (int)p->w_in);
    if (s == CUDNN_STATUS_SUCCESS) {
        s = api.cudnnSetTensor4dDescriptor(d->y, fmt, t, (int)p->n, (int)p->o, (int)p->oh,
                                           (int)p->ow);
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        s = api.cudnnSetTensor4dDescriptor(d->b, fmt, t, 1, (int)p->o, 1, 1);
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        s = api.cudnnSetFilter4dDescriptor(d->w, t, fmt, (int)p->o, (int)(p->c / p->groups), p->kh,
                                           p->kw);
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        s = api.cudnnSetConvolution2dDescriptor(d->conv, p->ph, p->pw, p->sh, p->sw, p->dh, p->dw,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    }
    if (s == CUDNN_STATUS_SUCCESS) s = api.cudnnSetConvolutionGroupCount(d->conv, (int)p->groups);
    if (s == CUDNN_STATUS_SUCCESS) {
        s = api.cudnnSetConvolutionMathType(
            d->conv, p->y_dt == KILN_DTYPE_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
    }
    // The tuning cache's record (or an identical layer's choice): the algorithm and math type
    // without the heuristic query (several milliseconds per convolution), if cuDNN still sizes
    // its workspace within the context's.
    const kiln_cuda_choice *ch = ctx->choice;
    if (s == CUDNN_STATUS_SUCCESS && ch != NULL && ch->kernel == KILN_CUDA_K_CUDNN &&
        ch->conv_algo >= 0 && ch->conv_algo <= CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED &&
        (p->y_dt != KILN_DTYPE_F32 || ch->conv_math == CUDNN_FMA_MATH ||
         ch->conv_math == CUDNN_DEFAULT_MATH)) {
        size_t ws = 0;
        cudnnStatus_t a = api.cudnnSetConvolutionMathType(d->conv, (cudnnMathType_t)ch->conv_math);
        if (a == CUDNN_STATUS_SUCCESS) {
            a = api.cudnnGetConvolutionForwardWorkspaceSize(
                ctx->dnn->h, d->x, d->w, d->conv, d->y, (cudnnConvolutionFwdAlgo_t)ch->conv_algo,
                &ws);
        }
        kiln_cuda_consume();
        if (a == CUDNN_STATUS_SUCCESS && ws <= ctx->workspace_nbytes) {
            plan->algo = ch->conv_algo;
            plan->math = ch->conv_math;
            plan->ws_nbytes = ws;
            return 2;
        }
        s = api.cudnnSetConvolutionMathType(
            d->conv, p->y_dt == KILN_DTYPE_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        s = api.cudnnGetConvolutionForwardAlgorithm_v7(ctx->dnn->h, d->x, d->w, d->conv, d->y, 8,
                                                       &n_perf, perf);
    }
    for (int i = 0; s == CUDNN_STATUS_SUCCESS && i < n_perf && found < 0; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > ctx->workspace_nbytes)
            continue;
        // float32: no TF32 or tensor-core conversion (the parity tolerance is float's)
        if (p->y_dt == KILN_DTYPE_F32 && perf[i].mathType != CUDNN_FMA_MATH &&
            perf[i].mathType != CUDNN_DEFAULT_MATH)
            continue;
        found = i;
    }
    if (found >= 0) {
        s = api.cudnnSetConvolutionMathType(d->conv, perf[found].mathType);
        if (s == CUDNN_STATUS_SUCCESS) {
            plan->algo = (int)perf[found].algo;
            plan->math = (int)perf[found].mathType;
            plan->ws_nbytes = perf[found].memory;
        }
    }
    kiln_cuda_consume(); // host-side queries only; nothing of theirs may stay pending
    if (s != CUDNN_STATUS_SUCCESS || found < 0) {
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cuDNN declined conv2d %lldx%lldx%lldx%lld -> %lld (%s, status %s) at %s: "
                      "Kiln's kernel",
                      (long long)p->n, (long long)p->c, (long long)p->h, (long long)p->w_in,
                      (long long)p->o, kiln_cuda_dtype_name(p->y_dt), api.cudnnGetErrorString(s),
                      ctx->where ? ctx->where : "?");
        return 0;
    }
    return 1;
}

kiln_status kiln_cuda_dnn_conv_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                   const kiln_cuda_conv_geom *g, kiln_cuda_conv_rec *plan,
                                   uint32_t *skip, int *done) {
    const kiln_tensor *y = args->out;
    conv_descs *d = plan->descs;
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t s;
    kiln_status st;
    *done = 0;
    *skip = 0;
    if (ctx->dnn == NULL || d == NULL) return KILN_OK;
    if (plan->ws_nbytes > 0 && (ctx->workspace == NULL || plan->ws_nbytes > ctx->workspace_nbytes))
        return KILN_OK; // (planned within a larger workspace: Kiln's kernel)
    kiln_cuda_ws_note(ctx, plan->ws_nbytes);
    api.cudnnSetStream(ctx->dnn->h, ctx->stream);
    // The tail cuDNN can take: [add(z of y's shape and dtype)] then [relu].
    uint32_t next = 0;
    const void *z = NULL;
    if (args->n_tail > 0 && args->tail[0].op == KILN_OP_ADD && args->tail[0].operand != NULL) {
        const kiln_tensor *r = args->tail[0].operand;
        if (r->dtype == y->dtype && r->rank == 4 &&
            memcmp(r->dims, y->dims, 4 * sizeof(int64_t)) == 0) {
            z = r->data;
            next = 1;
        }
    }
    int relu = args->n_tail > next && args->tail[next].op == KILN_OP_RELU;
    // Without a ReLU the same call with the identity activation, which cuDNN allows with
    // IMPLICIT_PRECOMP_GEMM only (the heuristic's choice for ResNet's convs): the bias (and the
    // residual) in the convolution's epilogue instead of a cudnnAddTensor pass over y.
    int *fused = relu ? &plan->fused : &plan->fused_identity;
    if (g->bias != NULL && *fused >= 0 &&
        (relu || plan->algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)) {
        const float alpha2 = z != NULL ? 1.0f : 0.0f;
        s = api.cudnnConvolutionBiasActivationForward(
            ctx->dnn->h, &one, d->x, g->x, d->w, g->w, d->conv,
            (cudnnConvolutionFwdAlgo_t)plan->algo, ctx->workspace, plan->ws_nbytes, &alpha2, d->y,
            z != NULL ? z : g->y, d->b, g->bias, relu ? d->relu : d->ident, d->y, g->y);
        if (s == CUDNN_STATUS_SUCCESS) {
            st = kiln_cuda_check_launch(ctx, "cudnnConvolutionBiasActivationForward");
            *skip = next + (relu ? 1 : 0);
            *done = st == KILN_OK;
            return st;
        }
        kiln_cuda_consume();
        *fused = -1; // declined before any work: remembered, unfused below from now on
        kiln_cuda_log(
            KILN_LOG_DEBUG, "cuDNN declined the fused conv + bias%s (%s) at %s: unfused instead",
            relu ? " + relu" : "", api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?");
    }
    s = api.cudnnConvolutionForward(ctx->dnn->h, &one, d->x, g->x, d->w, g->w, d->conv,
                                    (cudnnConvolutionFwdAlgo_t)plan->algo, ctx->workspace,
                                    plan->ws_nbytes, &zero, d->y, g->y);
    if (s != CUDNN_STATUS_SUCCESS) {
        kiln_cuda_consume();
        kiln_cuda_log(KILN_LOG_DEBUG, "cuDNN declined conv2d (%s) at %s: Kiln's kernel",
                      api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?");
        return KILN_OK;
    }
    if (g->bias != NULL) {
        s = api.cudnnAddTensor(ctx->dnn->h, &one, d->b, g->bias, &one, d->y, g->y);
        if (s != CUDNN_STATUS_SUCCESS) {
            // The convolution is enqueued already: Kiln's kernel recomputes y from scratch.
            kiln_cuda_consume();
            kiln_cuda_log(KILN_LOG_DEBUG, "cudnnAddTensor declined (%s) at %s: Kiln's kernel",
                          api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?");
            return KILN_OK;
        }
    }
    st = kiln_cuda_check_launch(ctx, "cudnnConvolutionForward");
    *done = st == KILN_OK;
    return st;
}

void kiln_cuda_dnn_conv_describe(const kiln_cuda_conv_rec *plan, char *buf, size_t n) {
    snprintf(buf, n, "cuDNN %s, %s math, workspace %zu%s", algo_name(plan->algo),
             plan->math == CUDNN_TENSOR_OP_MATH                    ? "tensor-op"
             : plan->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor-op-conv"
                                                                   : "fma",
             plan->ws_nbytes,
             plan->fused < 0 || plan->fused_identity < 0 ? ", the fused call declined" : "");
}

#else // no cudnn.h at build time: never planned

int kiln_cuda_dnn_conv_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_geom *g, int has_bias,
                             kiln_cuda_conv_rec *plan) {
    (void)ctx;
    (void)g;
    (void)has_bias;
    (void)plan;
    return 0;
}

kiln_status kiln_cuda_dnn_conv_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                   const kiln_cuda_conv_geom *g, kiln_cuda_conv_rec *plan,
                                   uint32_t *skip, int *done) {
    (void)ctx;
    (void)args;
    (void)g;
    (void)plan;
    *skip = 0;
    *done = 0;
    return KILN_OK;
}

void kiln_cuda_dnn_conv_release(kiln_cuda_conv_rec *plan) { (void)plan; }

void kiln_cuda_dnn_conv_describe(const kiln_cuda_conv_rec *plan, char *buf, size_t n) {
    (void)plan;
    snprintf(buf, n, "cuDNN");
}

#endif
