// SPDX-License-Identifier: Apache-2.0
// Loading cuDNN at run time and its per-context handle (cuda_dnn.h).
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_dnn.h"

#if KILN_CUDA_HAVE_CUDNN

kiln_cuda_dnn_api kiln_cuda_dnn_fn;
#define api kiln_cuda_dnn_fn

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
    RESOLVE(cudnnGetConvolutionForwardWorkspaceSize);
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

int kiln_cuda_dnn_graph_ok(void) {
    pthread_once(&load_once, load_api);
    return api_graph_ok;
}

kiln_cuda_dnn *kiln_cuda_dnn_create(void) {
    static atomic_int logged;
    kiln_cuda_dnn *d;
    pthread_once(&load_once, load_api);
    if (!api_ok) {
        if (atomic_exchange(&logged, 1) == 0) {
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
        kiln_cuda_consume(); // cuDNN's failed set-up must not leave a CUDA error pending
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

#else // no cudnn.h at build time: Kiln's kernels only

kiln_cuda_dnn *kiln_cuda_dnn_create(void) { return NULL; }
void kiln_cuda_dnn_destroy(kiln_cuda_dnn *d) { (void)d; }
size_t kiln_cuda_dnn_version(void) { return 0; }

#endif
