// SPDX-License-Identifier: Apache-2.0
// cuDNN inside the CUDA plugin (cuda_dnn.c): libcudnn.so.9 is dlopen()ed once per process (the
// plugin's RUNPATH: the nvidia wheels' cudnn/lib, then the toolkit), so that the plugin still
// loads and runs, on Kiln's own kernels, where cuDNN is absent. The resolved entry points
// (kiln_cuda_dnn_api) serve the convolutions (dnn_conv.c, the legacy API) and attention
// (dnn_sdpa.c, the backend graph API's fused SDPA, cuDNN >= 9.13).
#ifndef KILN_CUDA_CUDA_DNN_H
#define KILN_CUDA_CUDA_DNN_H

#include "cuda/cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

// A handle per context, or NULL when cuDNN cannot be loaded (logged once at INFO; not an error).
kiln_cuda_dnn *kiln_cuda_dnn_create(void);
void kiln_cuda_dnn_destroy(kiln_cuda_dnn *dnn);
// cudnnGetVersion() (e.g. 91900), loading it on first call; 0 when it cannot be loaded.
size_t kiln_cuda_dnn_version(void);

#if KILN_CUDA_HAVE_CUDNN
#include <cudnn.h>

struct kiln_cuda_dnn {
    cudnnHandle_t h;
};

#define DNN_FN(name) __typeof__(&name) name
typedef struct kiln_cuda_dnn_api {
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
    DNN_FN(cudnnGetConvolutionForwardWorkspaceSize);
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
} kiln_cuda_dnn_api;

// The entry points, resolved once (valid when kiln_cuda_dnn_version() > 0); the backend graph
// API ones are NULL where kiln_cuda_dnn_graph_ok() is 0.
extern kiln_cuda_dnn_api kiln_cuda_dnn_fn;
// 1 when the backend graph API with the SDPA_FWD operation is there (cuDNN >= 9.13).
int kiln_cuda_dnn_graph_ok(void);
#endif

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_DNN_H
