// SPDX-License-Identifier: Apache-2.0
// conv2d through cuDNN (legacy API), loaded at run time: libcudnn.so.9 is dlopen()ed once per
// process (the plugin's RUNPATH: the nvidia wheels' cudnn/lib, then the toolkit), so the plugin
// still loads and runs, on Kiln's own conv kernels, where cuDNN is absent
// (KILN_CUDA_NO_CUDNN=1 forces that too).
//
// Layout: NCHW, or NHWC (x, y, bias and residual; the filter in KRSC order from ctx->w_krsc)
// when the layout pass (cuda_layout.h) keeps the layer's activations NHWC (ctx->nhwc): cuDNN's
// NCHW fp16 engines measured on the H200 ran FMA implicit GEMMs for 1x1 convs. Math: fp16 and
// bf16 with float compute (tensor-core math), float32 with CUDNN_FMA_MATH (no TF32, like the
// GEMMs). Per layer a cache (kiln_cuda_conv_cache) holds the descriptors (created at context
// creation, from kiln_cuda_gemm_prepare's pass over the layers) and the algorithm chosen by
// cudnnGetConvolutionForwardAlgorithm_v7 within the context's workspace; shapes that change
// only re-set the descriptors and re-query (host-only calls, no allocation).
//
// The fused tail: bias plus [add(residual)] plus [relu] become one
// cudnnConvolutionBiasActivationForward (y = relu(conv(x, w) + z + bias)); otherwise
// cudnnConvolutionForward, then cudnnAddTensor for the bias, then Kiln's tail kernel. Anything
// cuDNN declines (status not SUCCESS, returned before any work is enqueued) is remembered per
// layer and runs on Kiln's kernel instead.
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"

#if KILN_CUDA_HAVE_CUDNN
#include <cudnn.h>

#define DNN_FN(name) __typeof__(&name) name
static struct {
    DNN_FN(cudnnGetVersion);
    DNN_FN(cudnnGetErrorString);
    DNN_FN(cudnnCreate);
    DNN_FN(cudnnDestroy);
    DNN_FN(cudnnSetStream);
    DNN_FN(cudnnCreateTensorDescriptor);
    DNN_FN(cudnnSetTensor4dDescriptor);
    DNN_FN(cudnnDestroyTensorDescriptor);
    DNN_FN(cudnnCreateFilterDescriptor);
    DNN_FN(cudnnSetFilter4dDescriptor);
    DNN_FN(cudnnDestroyFilterDescriptor);
    DNN_FN(cudnnCreateConvolutionDescriptor);
    DNN_FN(cudnnSetConvolution2dDescriptor);
    DNN_FN(cudnnSetConvolutionGroupCount);
    DNN_FN(cudnnSetConvolutionMathType);
    DNN_FN(cudnnDestroyConvolutionDescriptor);
    DNN_FN(cudnnCreateActivationDescriptor);
    DNN_FN(cudnnSetActivationDescriptor);
    DNN_FN(cudnnDestroyActivationDescriptor);
    DNN_FN(cudnnGetConvolutionForwardAlgorithm_v7);
    DNN_FN(cudnnFindConvolutionForwardAlgorithmEx); // optional (NULL: heuristics only)
    DNN_FN(cudnnConvolutionForward);
    DNN_FN(cudnnConvolutionBiasActivationForward);
    DNN_FN(cudnnAddTensor);
    // the backend graph API (sdpa): optional, NULL when absent
    DNN_FN(cudnnBackendCreateDescriptor);
    DNN_FN(cudnnBackendDestroyDescriptor);
    DNN_FN(cudnnBackendSetAttribute);
    DNN_FN(cudnnBackendGetAttribute);
    DNN_FN(cudnnBackendFinalize);
    DNN_FN(cudnnBackendExecute);
    DNN_FN(cudnnGetLastErrorString);
} api;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int api_ok;
static int api_graph_ok; // the backend API with the SDPA_FWD operation (cuDNN >= 9.13)
static char api_reason[256];

static int resolve(void *lib, const char *name, void *slot, size_t nbytes) {
    void *f = dlsym(lib, name);
    if (f == NULL) return 0;
    memcpy(slot, &f, nbytes); // object to function pointer (POSIX guarantees it works)
    return 1;
}

#define RESOLVE(name) ok = ok && resolve(lib, #name, &api.name, sizeof api.name)

static void load_api(void) {
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    int ok = lib != NULL;
    if (!ok) {
        const char *e = dlerror();
        snprintf(api_reason, sizeof api_reason, "%s", e ? e : "dlopen failed");
        return;
    }
    RESOLVE(cudnnGetVersion);
    RESOLVE(cudnnGetErrorString);
    RESOLVE(cudnnCreate);
    RESOLVE(cudnnDestroy);
    RESOLVE(cudnnSetStream);
    RESOLVE(cudnnCreateTensorDescriptor);
    RESOLVE(cudnnSetTensor4dDescriptor);
    RESOLVE(cudnnDestroyTensorDescriptor);
    RESOLVE(cudnnCreateFilterDescriptor);
    RESOLVE(cudnnSetFilter4dDescriptor);
    RESOLVE(cudnnDestroyFilterDescriptor);
    RESOLVE(cudnnCreateConvolutionDescriptor);
    RESOLVE(cudnnSetConvolution2dDescriptor);
    RESOLVE(cudnnSetConvolutionGroupCount);
    RESOLVE(cudnnSetConvolutionMathType);
    RESOLVE(cudnnDestroyConvolutionDescriptor);
    RESOLVE(cudnnCreateActivationDescriptor);
    RESOLVE(cudnnSetActivationDescriptor);
    RESOLVE(cudnnDestroyActivationDescriptor);
    RESOLVE(cudnnGetConvolutionForwardAlgorithm_v7);
    RESOLVE(cudnnConvolutionForward);
    RESOLVE(cudnnConvolutionBiasActivationForward);
    RESOLVE(cudnnAddTensor);
    (void)resolve(lib, "cudnnFindConvolutionForwardAlgorithmEx",
                  &api.cudnnFindConvolutionForwardAlgorithmEx,
                  sizeof api.cudnnFindConvolutionForwardAlgorithmEx);
    int graph_ok = 1;
#define RESOLVE_GRAPH(name) graph_ok = graph_ok && resolve(lib, #name, &api.name, sizeof api.name)
    RESOLVE_GRAPH(cudnnBackendCreateDescriptor);
    RESOLVE_GRAPH(cudnnBackendDestroyDescriptor);
    RESOLVE_GRAPH(cudnnBackendSetAttribute);
    RESOLVE_GRAPH(cudnnBackendGetAttribute);
    RESOLVE_GRAPH(cudnnBackendFinalize);
    RESOLVE_GRAPH(cudnnBackendExecute);
    RESOLVE_GRAPH(cudnnGetLastErrorString);
#undef RESOLVE_GRAPH
    if (!ok) {
        snprintf(api_reason, sizeof api_reason, "libcudnn.so.9 lacks a legacy API symbol");
        return; // the library stays loaded (never unloaded, like the plugin)
    }
    api_ok = 1;
    // The fused SDPA operation exists from cuDNN 9.13 on.
    api_graph_ok = graph_ok && api.cudnnGetVersion() >= 91300;
}

struct kiln_cuda_dnn {
    cudnnHandle_t h;
};

// The per-layer descriptors (hidden behind the cache's opaque pointer).
typedef struct conv_descs {
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnActivationDescriptor_t relu, ident;
} conv_descs;

kiln_cuda_dnn *kiln_cuda_dnn_create(void) {
    static int logged;
    kiln_cuda_dnn *d;
    const char *off = getenv("KILN_CUDA_NO_CUDNN");
    if (off != NULL && off[0] != '\0' && strcmp(off, "0") != 0) return NULL;
    pthread_once(&load_once, load_api);
    if (!api_ok) {
        if (!logged) {
            logged = 1; // benign race: at worst one more INFO line
            kiln_cuda_log(KILN_LOG_INFO,
                          "cuDNN not available (%s): convolutions and attention run on "
                          "Kiln's own kernels",
                          api_reason);
        }
        return NULL;
    }
    d = kiln_cuda_calloc(sizeof *d);
    if (d == NULL) return NULL;
    if (api.cudnnCreate(&d->h) != CUDNN_STATUS_SUCCESS) {
        cudaGetLastError(); // cuDNN's failed set-up must not leave a CUDA error pending
        kiln_cuda_log(KILN_LOG_INFO,
                      "cudnnCreate failed: convolutions and attention run on Kiln's kernels");
        kiln_cuda_free(d, sizeof *d);
        return NULL;
    }
    return d;
}

void kiln_cuda_dnn_destroy(kiln_cuda_dnn *d) {
    if (d == NULL) return;
    api.cudnnDestroy(d->h);
    kiln_cuda_free(d, sizeof *d);
}

size_t kiln_cuda_dnn_version(void) {
    pthread_once(&load_once, load_api);
    return api_ok ? api.cudnnGetVersion() : 0;
}

void kiln_cuda_conv_cache_free(kiln_cuda_conv_cache *c) {
    conv_descs *d = c ? c->descs : NULL;
    if (d == NULL) return;
    if (d->x) api.cudnnDestroyTensorDescriptor(d->x);
    if (d->y) api.cudnnDestroyTensorDescriptor(d->y);
    if (d->b) api.cudnnDestroyTensorDescriptor(d->b);
    if (d->w) api.cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) api.cudnnDestroyConvolutionDescriptor(d->conv);
    if (d->relu) api.cudnnDestroyActivationDescriptor(d->relu);
    if (d->ident) api.cudnnDestroyActivationDescriptor(d->ident);
    kiln_cuda_free(d, sizeof *d);
    c->descs = NULL;
}

static cudnnDataType_t dnn_type(uint32_t dtype) {
    return dtype == KILN_DTYPE_F16    ? CUDNN_DATA_HALF
           : dtype == KILN_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16
                                      : CUDNN_DATA_FLOAT;
}

static int descs_create(kiln_cuda_conv_cache *c) {
    conv_descs *d = kiln_cuda_calloc(sizeof *d);
    if (d == NULL) return 0;
    c->descs = d;
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
        kiln_cuda_conv_cache_free(c);
        return 0;
    }
    return 1;
}

static void key_of(const kiln_cuda_conv_params *p, uint32_t dtype, int has_bias, int nhwc,
                   int64_t *key) {
    memset(key, 0, KILN_CUDA_CONV_KEY * sizeof *key);
    key[0] = dtype;
    key[1] = p->n;
    key[2] = p->c;
    key[3] = p->h;
    key[4] = p->w;
    key[5] = p->o;
    key[6] = p->oh;
    key[7] = p->ow;
    key[8] = p->kh;
    key[9] = p->kw;
    key[10] = ((int64_t)p->sh << 32) | (uint32_t)p->sw;
    key[11] = ((int64_t)p->ph << 32) | (uint32_t)p->pw;
    key[12] = ((int64_t)p->dh << 32) | (uint32_t)p->dw;
    key[13] = p->groups;
    key[14] = has_bias | (nhwc << 1);
    key[15] = 2; // key format
}

// Timing with cudnnFindConvolutionForwardAlgorithmEx only on request (KILN_CUDA_CONV_FIND=1):
// on the H200 (gpu3) it picked slower algorithms than the heuristic at b1.
// KILN_CUDA_CONV_HEURISTIC=1 still forces the heuristic.
static int heuristic_only(void) {
    const char *v = getenv("KILN_CUDA_CONV_HEURISTIC");
    const char *f = getenv("KILN_CUDA_CONV_FIND");
    if (v != NULL && v[0] != '\0' && strcmp(v, "0") != 0) return 1;
    return f == NULL || f[0] == '\0' || strcmp(f, "0") == 0;
}

static int fits_int(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

// Sets the descriptors for these shapes and chooses the algorithm; 0 when cuDNN cannot run it.
// At context creation (ctx->plan_only) the candidates are timed on the layer's own buffers with
// cudnnFindConvolutionForwardAlgorithmEx (sorted fastest first; the output buffer is
// overwritten, harmless before the first execute); at execute (possibly inside a caller's stream
// capture, where nothing may synchronize) the heuristic query only. KILN_CUDA_CONV_HEURISTIC=1
// forces the heuristic everywhere (A/B measurements).
static const char *algo_name(int a) {
    static const char *names[] = {
        "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
        "WINOGRAD",      "WINOGRAD_NONFUSED"};
    return a >= 0 && a < (int)(sizeof names / sizeof names[0]) ? names[a] : "?";
}

static int conv_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_conv_params *p, uint32_t dtype,
                      int has_bias, kiln_cuda_conv_cache *c, const void *xd, const void *wd,
                      void *yd) {
    int timed = 0;
    conv_descs *d = c->descs;
    cudnnDataType_t t = dnn_type(dtype);
    cudnnTensorFormat_t fmt = ctx->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int n_perf = 0, found = -1;
    cudnnStatus_t s;
    if (!fits_int(p->n) || !fits_int(p->c) || !fits_int(p->h) || !fits_int(p->w) ||
        !fits_int(p->o) || !fits_int(p->oh) || !fits_int(p->ow) || !fits_int(p->groups)) {
        return 0;
    }
    s = api.cudnnSetTensor4dDescriptor(d->x, fmt, t, (int)p->n, (int)p->c, (int)p->h, (int)p->w);
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
            d->conv, dtype == KILN_DTYPE_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
    }
    if (s == CUDNN_STATUS_SUCCESS && ctx->plan_only && xd != NULL && wd != NULL && yd != NULL &&
        api.cudnnFindConvolutionForwardAlgorithmEx != NULL && !heuristic_only()) {
        api.cudnnSetStream(ctx->dnn->h, ctx->stream);
        cudnnStatus_t fs = api.cudnnFindConvolutionForwardAlgorithmEx(
            ctx->dnn->h, d->x, xd, d->w, wd, d->conv, d->y, yd, 8, &n_perf, perf, ctx->workspace,
            ctx->workspace_nbytes);
        timed = fs == CUDNN_STATUS_SUCCESS && n_perf > 0;
        if (!timed) cudaGetLastError(); // fall back to the heuristic
    }
    if (s == CUDNN_STATUS_SUCCESS && !timed) {
        s = api.cudnnGetConvolutionForwardAlgorithm_v7(ctx->dnn->h, d->x, d->w, d->conv, d->y, 8,
                                                       &n_perf, perf);
    }
    for (int i = 0; s == CUDNN_STATUS_SUCCESS && i < n_perf && found < 0; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > ctx->workspace_nbytes)
            continue;
        // float32: no TF32 or tensor-core conversion (the parity tolerance is float's)
        if (dtype == KILN_DTYPE_F32 && perf[i].mathType != CUDNN_FMA_MATH &&
            perf[i].mathType != CUDNN_DEFAULT_MATH)
            continue;
        found = i;
    }
    if (found >= 0) {
        s = api.cudnnSetConvolutionMathType(d->conv, perf[found].mathType);
        if (s == CUDNN_STATUS_SUCCESS) {
            c->algo = (int)perf[found].algo;
            c->ws_nbytes = perf[found].memory;
        }
    }
    cudaGetLastError(); // host-side queries only; nothing of theirs may stay pending
    if (s != CUDNN_STATUS_SUCCESS || found < 0) {
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cuDNN declined conv2d %lldx%lldx%lldx%lld -> %lld (%s, status %s) at %s: "
                      "using Kiln's kernel",
                      (long long)p->n, (long long)p->c, (long long)p->h, (long long)p->w,
                      (long long)p->o, kiln_cuda_dtype_name(dtype), api.cudnnGetErrorString(s),
                      ctx->where ? ctx->where : "?");
        return 0;
    }
    kiln_cuda_log(ctx->plan_only ? KILN_LOG_INFO : KILN_LOG_DEBUG,
                  "conv2d %lldx%lldx%lldx%lld -> %lld k%dx%d s%d (%s, %s) at %s: cuDNN %s, %s "
                  "math, %s %.4f ms, workspace %zu",
                  (long long)p->n, (long long)p->c, (long long)p->h, (long long)p->w,
                  (long long)p->o, p->kh, p->kw, p->sh, kiln_cuda_dtype_name(dtype),
                  ctx->nhwc ? "NHWC" : "NCHW", ctx->where ? ctx->where : "?", algo_name(c->algo),
                  perf[found].mathType == CUDNN_TENSOR_OP_MATH                    ? "tensor-op"
                  : perf[found].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor-op-conv"
                                                                                  : "fma",
                  timed ? "timed" : "heuristic estimate", (double)perf[found].time,
                  perf[found].memory);
    (void)has_bias;
    return 1;
}

kiln_status kiln_cuda_dnn_conv2d(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                 const kiln_cuda_conv_params *p, uint32_t *skip, int *done) {
    kiln_cuda_conv_cache local, *c = ctx->conv != NULL ? ctx->conv : &local;
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    const kiln_tensor *bias = args->n_in > 2 ? args->in[2] : NULL;
    kiln_tensor *y = args->out;
    const void *wdata = ctx->nhwc ? ctx->w_krsc : w->data; // NHWC: the KRSC copy
    int64_t key[KILN_CUDA_CONV_KEY];
    kiln_status st = KILN_OK;
    *done = 0;
    *skip = 0;
    if (ctx->dnn == NULL || (ctx->nhwc && ctx->w_krsc == NULL) || x->dtype != y->dtype ||
        w->dtype != y->dtype || (bias != NULL && bias->dtype != y->dtype)) {
        return KILN_OK;
    }
    if (c == &local) memset(&local, 0, sizeof local);
    if (c->descs == NULL) {
        if (c->state == 2 || !descs_create(c)) {
            c->state = 2;
            return KILN_OK;
        }
    }
    key_of(p, y->dtype, bias != NULL, ctx->nhwc != 0, key);
    if (c->state == 0 || memcmp(c->key, key, sizeof key) != 0) {
        c->state = conv_setup(ctx, p, y->dtype, bias != NULL, c, x->data, wdata, y->data)
                       ? 1
                       : 3;              // 3: not these shapes
        memcpy(c->key, key, sizeof key); // c->fused (-1: declined) stays across shapes
    }
    if (c->state != 1 || ctx->plan_only) goto out;

    conv_descs *d = c->descs;
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t s;
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
    int *fused = relu ? &c->fused : &c->fused_identity;
    if (bias != NULL && *fused >= 0 &&
        (relu || c->algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)) {
        const float alpha2 = z != NULL ? 1.0f : 0.0f;
        s = api.cudnnConvolutionBiasActivationForward(
            ctx->dnn->h, &one, d->x, x->data, d->w, wdata, d->conv,
            (cudnnConvolutionFwdAlgo_t)c->algo, ctx->workspace, c->ws_nbytes, &alpha2, d->y,
            z != NULL ? z : y->data, d->b, bias->data, relu ? d->relu : d->ident, d->y, y->data);
        if (s == CUDNN_STATUS_SUCCESS) {
            st = kiln_cuda_check_launch(ctx, "cudnnConvolutionBiasActivationForward");
            *skip = next + (relu ? 1 : 0);
            *done = st == KILN_OK;
            goto out;
        }
        cudaGetLastError();
        *fused = -1; // declined before any work: remember, run unfused below
        kiln_cuda_log(
            KILN_LOG_DEBUG, "cuDNN declined the fused conv + bias%s (%s) at %s: unfused instead",
            relu ? " + relu" : "", api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?");
    }
    s = api.cudnnConvolutionForward(ctx->dnn->h, &one, d->x, x->data, d->w, wdata, d->conv,
                                    (cudnnConvolutionFwdAlgo_t)c->algo, ctx->workspace,
                                    c->ws_nbytes, &zero, d->y, y->data);
    if (s != CUDNN_STATUS_SUCCESS) {
        cudaGetLastError();
        c->state = 3;
        kiln_cuda_log(KILN_LOG_DEBUG, "cuDNN declined conv2d (%s) at %s: using Kiln's kernel",
                      api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?");
        goto out;
    }
    if (bias != NULL) {
        s = api.cudnnAddTensor(ctx->dnn->h, &one, d->b, bias->data, &one, d->y, y->data);
        if (s != CUDNN_STATUS_SUCCESS) {
            // The convolution is enqueued already: Kiln's kernel recomputes y from scratch.
            cudaGetLastError();
            c->state = 3;
            kiln_cuda_log(KILN_LOG_DEBUG, "cudnnAddTensor declined (%s) at %s: Kiln's kernel",
                          api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?");
            goto out;
        }
    }
    st = kiln_cuda_check_launch(ctx, "cudnnConvolutionForward");
    *done = st == KILN_OK;
out:
    if (c == &local) kiln_cuda_conv_cache_free(&local);
    return st;
}

#if CUDNN_VERSION >= 91300 // the header declares the SDPA_FWD operation

// --- sdpa: cuDNN's fused attention through the backend graph API
//
// One CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (cuDNN >= 9.13: O = softmax(Q K^T * scale) V,
// no mask, no stats) in an operation graph. At context creation (ctx->plan_only) every engine
// configuration of the heuristic that finalizes within the workspace is timed as the engine
// runs it (kiln_cuda_time_in_graph: cuDNN's own workspace memset included) and the fastest is
// kept; a set-up at execute (a new shape) takes the heuristic's first. Each layer keeps up to
// ATTN_MAX_PLANS plans, one per geometry, for the life of the context: a CUDA graph recorded
// with a plan's kernel may still be described or replayed after the shapes changed, and cuDNN
// releases a plan's kernels with it. Geometries beyond that, and any refusal (the operation, the
// graph, no engine, the workspace), run on Kiln's kernel.

#define ATTN_MAX_CFG 8
#define ATTN_MAX_PLANS 8
enum { ATTN_UID_Q = 1, ATTN_UID_K, ATTN_UID_V, ATTN_UID_O, ATTN_UID_SCALE };

typedef struct attn_descs {
    int state; // 1: plan ready; 3: cuDNN refused this geometry
    int64_t key[KILN_CUDA_ATTN_KEY];
    cudnnBackendDescriptor_t t[5], op, graph, heur, cfg[ATTN_MAX_CFG], plan, vpack;
    int64_t ws_nbytes;
    const void *vp_ptrs[4]; // the pointers vpack binds (q, k, v, out)
    void *vp_ws;
    float scale; // the by-value scale tensor's host value (read at execute and capture)
} attn_descs;

typedef struct attn_store {
    int n;
    attn_descs e[ATTN_MAX_PLANS];
} attn_store;

static void destroy_desc(cudnnBackendDescriptor_t *d) {
    if (*d != NULL) api.cudnnBackendDestroyDescriptor(*d);
    *d = NULL;
}

static void attn_descs_clear(attn_descs *d) {
    for (int i = 0; i < 5; i++) destroy_desc(&d->t[i]);
    for (int i = 0; i < ATTN_MAX_CFG; i++) destroy_desc(&d->cfg[i]);
    destroy_desc(&d->op);
    destroy_desc(&d->graph);
    destroy_desc(&d->heur);
    destroy_desc(&d->plan);
    destroy_desc(&d->vpack);
}

void kiln_cuda_attn_cache_free(kiln_cuda_attn_cache *c) {
    attn_store *st = c ? c->descs : NULL;
    if (st == NULL) return;
    for (int i = 0; i < st->n; i++) attn_descs_clear(&st->e[i]);
    kiln_cuda_free(st, sizeof *st);
    c->descs = NULL;
}

static int bset(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    return api.cudnnBackendSetAttribute(d, a, t, n, v) == CUDNN_STATUS_SUCCESS;
}

static cudnnBackendDescriptor_t bnew(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = NULL;
    if (api.cudnnBackendCreateDescriptor(t, &d) != CUDNN_STATUS_SUCCESS) return NULL;
    return d;
}

static cudnnBackendDescriptor_t attn_tensor(int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                            const int64_t *str, int by_value) {
    cudnnBackendDescriptor_t t = bnew(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    const bool bv = by_value != 0;
    if (t == NULL) return NULL;
    if (!bset(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
        !bset(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims) ||
        !bset(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str) ||
        !bset(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ||
        !bset(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align) ||
        (bv && !bset(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv)) ||
        api.cudnnBackendFinalize(t) != CUDNN_STATUS_SUCCESS) {
        api.cudnnBackendDestroyDescriptor(t);
        return NULL;
    }
    return t;
}

// Why cuDNN refused (its last error message), for the DEBUG log.
static const char *attn_why(char *buf, size_t n) {
    buf[0] = '\0';
    api.cudnnGetLastErrorString(buf, n);
    return buf[0] != '\0' ? buf : "no message";
}

// (Re)binds the variant pack to g's pointers; 0 when cuDNN refuses it.
static int attn_bind(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, attn_descs *d) {
    const void *now[4] = {g->q, g->k, g->v, g->out};
    void *ws = d->ws_nbytes > 0 ? ctx->workspace : NULL;
    if (d->vpack != NULL && memcmp(now, d->vp_ptrs, sizeof now) == 0 && ws == d->vp_ws) return 1;
    destroy_desc(&d->vpack);
    d->vpack = bnew(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    void *ptrs[5] = {(void *)g->q, (void *)g->k, (void *)g->v, g->out, &d->scale};
    const int64_t uids[5] = {ATTN_UID_Q, ATTN_UID_K, ATTN_UID_V, ATTN_UID_O, ATTN_UID_SCALE};
    if (d->vpack == NULL ||
        !bset(d->vpack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 5, ptrs) ||
        !bset(d->vpack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 5, uids) ||
        !bset(d->vpack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws) ||
        api.cudnnBackendFinalize(d->vpack) != CUDNN_STATUS_SUCCESS) {
        destroy_desc(&d->vpack);
        return 0;
    }
    memcpy(d->vp_ptrs, now, sizeof now);
    d->vp_ws = ws;
    return 1;
}

typedef struct attn_run {
    cudnnHandle_t h;
    cudnnBackendDescriptor_t plan, vpack;
} attn_run;

static int attn_enqueue(void *arg) {
    const attn_run *r = arg;
    return api.cudnnBackendExecute(r->h, r->plan, r->vpack) == CUDNN_STATUS_SUCCESS;
}

// A finalized execution plan for engine configuration cfg within the workspace, or NULL.
static cudnnBackendDescriptor_t attn_plan(const kiln_cuda_ctx *ctx, cudnnBackendDescriptor_t cfg,
                                          int64_t *ws) {
    cudnnHandle_t h = ctx->dnn->h;
    int64_t cnt = 0;
    cudnnBackendDescriptor_t plan = bnew(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (plan == NULL) return NULL;
    *ws = 0;
    if (bset(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) &&
        bset(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &cfg) &&
        api.cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
        api.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &cnt, ws) == CUDNN_STATUS_SUCCESS &&
        *ws >= 0 && (size_t)*ws <= ctx->workspace_nbytes) {
        return plan;
    }
    api.cudnnBackendDestroyDescriptor(plan);
    return NULL;
}

// Builds the plan for g into d (tuned when `tune`); *best_us gets the kept plan's time when
// timed. 0 with a DEBUG log when cuDNN refuses at any step.
static int attn_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, attn_descs *d,
                      int tune, float *best_us) {
    const cudnnDataType_t dt = g->dtype == KILN_DTYPE_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    const int64_t dims[4][4] = {{g->b, g->hq, g->sq, g->d},
                                {g->b, g->hk, g->skv, g->d},
                                {g->b, g->hk, g->skv, g->dv},
                                {g->b, g->hq, g->sq, g->dv}};
    const int64_t one[4] = {1, 1, 1, 1};
    const cudnnBackendAttributeName_t io[4] = {
        CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
        CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC};
    const char *step = "tensor descriptors";
    char why[256];
    cudnnHandle_t h = ctx->dnn->h;
    int64_t n = 0, got = 0;
    int timed = 0, pick = -1;
    attn_descs_clear(d);
    *best_us = -1.0f;
    for (int i = 0; i < 4; i++) {
        d->t[i] = attn_tensor(ATTN_UID_Q + i, dt, dims[i], g->str[i], 0);
        if (d->t[i] == NULL) goto refused;
    }
    d->t[4] = attn_tensor(ATTN_UID_SCALE, CUDNN_DATA_FLOAT, one, one, 1);
    if (d->t[4] == NULL) goto refused;
    step = "the SDPA_FWD operation";
    d->op = bnew(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    if (d->op == NULL) goto refused;
    for (int i = 0; i < 4; i++) {
        if (!bset(d->op, io[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d->t[i])) goto refused;
    }
    if (!bset(d->op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
              &d->t[4]) ||
        api.cudnnBackendFinalize(d->op) != CUDNN_STATUS_SUCCESS)
        goto refused;
    step = "the operation graph";
    d->graph = bnew(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (d->graph == NULL ||
        !bset(d->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ||
        !bset(d->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d->op) ||
        api.cudnnBackendFinalize(d->graph) != CUDNN_STATUS_SUCCESS)
        goto refused;
    step = "the engine heuristic";
    for (int pass = 0; pass < 2 && n == 0; pass++) {
        const cudnnBackendHeurMode_t mode =
            pass == 0 ? CUDNN_HEUR_MODE_A : CUDNN_HEUR_MODE_FALLBACK;
        destroy_desc(&d->heur);
        d->heur = bnew(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        if (d->heur == NULL ||
            !bset(d->heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &d->graph) ||
            !bset(d->heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ||
            api.cudnnBackendFinalize(d->heur) != CUDNN_STATUS_SUCCESS ||
            api.cudnnBackendGetAttribute(d->heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                         NULL) != CUDNN_STATUS_SUCCESS)
            n = 0;
    }
    if (n <= 0) goto refused;
    if (n > ATTN_MAX_CFG) n = ATTN_MAX_CFG;
    for (int64_t i = 0; i < n; i++) {
        d->cfg[i] = bnew(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (d->cfg[i] == NULL) goto refused;
    }
    if (api.cudnnBackendGetAttribute(d->heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                     d->cfg) != CUDNN_STATUS_SUCCESS)
        goto refused;
    step = "an execution plan";
    d->scale = g->scale;
    for (int64_t i = 0; i < got && i < n; i++) {
        int64_t ws = 0;
        cudnnBackendDescriptor_t plan = attn_plan(ctx, d->cfg[i], &ws);
        if (plan == NULL) continue;
        if (!tune) {
            d->plan = plan;
            d->ws_nbytes = ws;
            pick = (int)i;
            break;
        }
        d->ws_nbytes = ws; // the candidate's variant pack
        float us = -1.0f;
        if (attn_bind(ctx, g, d)) {
            attn_run r = {h, plan, d->vpack};
            api.cudnnSetStream(h, ctx->stream);
            us = kiln_cuda_time_in_graph(ctx->stream, attn_enqueue, &r);
            timed++;
        }
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cuDNN sdpa candidate %lld of %lld at %s: workspace %lld bytes, %.2f us",
                      (long long)i + 1, (long long)got, ctx->where ? ctx->where : "?",
                      (long long)ws, (double)us);
        if (us >= 0.0f && (d->plan == NULL || us < *best_us)) {
            int64_t keep_ws = ws;
            destroy_desc(&d->plan);
            d->plan = plan;
            *best_us = us;
            pick = (int)i;
            d->ws_nbytes = keep_ws;
        } else {
            api.cudnnBackendDestroyDescriptor(plan);
        }
        destroy_desc(&d->vpack); // rebuilt for the kept plan's workspace
    }
    if (d->plan == NULL) goto refused;
    if (tune) { // the kept plan's workspace size (the loop left the last candidate's)
        int64_t cnt = 0;
        api.cudnnBackendGetAttribute(d->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &cnt, &d->ws_nbytes);
    }
    kiln_cuda_log(KILN_LOG_DEBUG,
                  "cuDNN sdpa plan [%lld, %lld/%lld, %lld x %lld, %lld/%lld] ready at %s: engine "
                  "configuration %d of %lld%s%.2f us, workspace %lld bytes",
                  (long long)g->b, (long long)g->hq, (long long)g->hk, (long long)g->sq,
                  (long long)g->skv, (long long)g->d, (long long)g->dv,
                  ctx->where ? ctx->where : "?", pick + 1, (long long)got,
                  timed > 0 ? ", the fastest of the timed: " : " (heuristic's first), ",
                  timed > 0 ? (double)*best_us : 0.0, (long long)d->ws_nbytes);
    cudaGetLastError();
    return 1;
refused:
    kiln_cuda_log(KILN_LOG_DEBUG,
                  "cuDNN declined sdpa [%lld, %lld/%lld, %lld x %lld, %lld/%lld] at %s (%s: %s): "
                  "Kiln's kernel",
                  (long long)g->b, (long long)g->hq, (long long)g->hk, (long long)g->sq,
                  (long long)g->skv, (long long)g->d, (long long)g->dv,
                  ctx->where ? ctx->where : "?", step, attn_why(why, sizeof why));
    attn_descs_clear(d);
    cudaGetLastError(); // a refusal must not leave a CUDA error pending
    return 0;
}

static int attn_tune_enabled(void) {
    const char *v = getenv("KILN_CUDA_ATTN_TUNE");
    return v == NULL || strcmp(v, "0") != 0;
}

kiln_status kiln_cuda_dnn_sdpa(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, int *done) {
    kiln_cuda_attn_cache *c = ctx->attn;
    int64_t key[KILN_CUDA_ATTN_KEY];
    kiln_status st = KILN_OK;
    attn_descs *d = NULL;
    char why[256];
    *done = 0;
    // Without a cache (a caller that keeps none) Kiln's kernel runs: a plan must outlive the
    // work and any CUDA graph that recorded it.
    if (c == NULL || ctx->dnn == NULL || !api_graph_ok || ctx->no_dnn_attention) return KILN_OK;
    if (c->state == 2 || c->state == 4) return KILN_OK; // never / Kiln's kernel was faster
    if (c->descs == NULL) {
        c->descs = kiln_cuda_calloc(sizeof(attn_store));
        if (c->descs == NULL) {
            c->state = 2;
            return KILN_OK;
        }
    }
    attn_store *store = c->descs;
    memset(key, 0, sizeof key);
    union {
        float f;
        uint32_t u;
    } sc = {.f = g->scale};
    const int64_t head[9] = {g->dtype, g->b, g->hq, g->hk, g->sq, g->skv, g->d, g->dv, sc.u};
    memcpy(key, head, sizeof head);
    memcpy(key + 9, g->str, sizeof g->str);
    for (int i = 0; i < store->n && d == NULL; i++) {
        if (memcmp(store->e[i].key, key, sizeof key) == 0) d = &store->e[i];
    }
    if (d == NULL) {
        if (store->n == ATTN_MAX_PLANS) goto out; // a geometry beyond the kept plans
        d = &store->e[store->n++];
        memcpy(d->key, key, sizeof key);
        float us = -1.0f;
        d->state = attn_setup(ctx, g, d, ctx->plan_only && attn_tune_enabled(), &us) ? 1 : 3;
        if (d->state == 1) {
            c->state = 1;
            c->dnn_us = us;
        }
    }
    if (d->state != 1 || ctx->plan_only) goto out;
    if (!attn_bind(ctx, g, d)) {
        kiln_cuda_log(KILN_LOG_DEBUG, "cuDNN sdpa variant pack refused at %s (%s): Kiln's kernel",
                      ctx->where ? ctx->where : "?", attn_why(why, sizeof why));
        cudaGetLastError();
        goto out;
    }
    api.cudnnSetStream(ctx->dnn->h, ctx->stream);
    cudnnStatus_t s = api.cudnnBackendExecute(ctx->dnn->h, d->plan, d->vpack);
    if (s != CUDNN_STATUS_SUCCESS) {
        // Refused before any work was enqueued: Kiln's kernel from now on at this geometry.
        cudaGetLastError();
        d->state = 3;
        kiln_cuda_log(KILN_LOG_DEBUG, "cudnnBackendExecute declined sdpa (%s) at %s: %s",
                      api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?",
                      attn_why(why, sizeof why));
        goto out;
    }
    st = kiln_cuda_check_launch(ctx, "cudnnBackendExecute (sdpa)");
    *done = st == KILN_OK;
out:
    return st;
}

#else // cudnn.h older than 9.13: attention on Kiln's kernels

void kiln_cuda_attn_cache_free(kiln_cuda_attn_cache *c) { (void)c; }
kiln_status kiln_cuda_dnn_sdpa(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, int *done) {
    (void)ctx;
    (void)g;
    (void)api_graph_ok;
    *done = 0;
    return KILN_OK;
}

#endif

#else // no cudnn.h at build time: Kiln's kernels only

kiln_cuda_dnn *kiln_cuda_dnn_create(void) { return NULL; }
void kiln_cuda_dnn_destroy(kiln_cuda_dnn *d) { (void)d; }
size_t kiln_cuda_dnn_version(void) { return 0; }
void kiln_cuda_conv_cache_free(kiln_cuda_conv_cache *c) { (void)c; }
void kiln_cuda_attn_cache_free(kiln_cuda_attn_cache *c) { (void)c; }
kiln_status kiln_cuda_dnn_sdpa(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, int *done) {
    (void)ctx;
    (void)g;
    *done = 0;
    return KILN_OK;
}
kiln_status kiln_cuda_dnn_conv2d(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                 const kiln_cuda_conv_params *p, uint32_t *skip, int *done) {
    (void)ctx;
    (void)args;
    (void)p;
    *skip = 0;
    *done = 0;
    return KILN_OK;
}

#endif
