// SPDX-License-Identifier: Apache-2.0
// Library warm-up in the background (cuda_backend.h). A process pays once for each library piece
// an engine uses, on the H200 (benchmarks.md "Start-up", bench/startup_probe.c): cuBLASLt's first
// heuristic query or algorithm of a type pair 95-140 ms (its kernel tables for those types load;
// rebuilding an algorithm from its configuration costs the same), each further type pair 45-70 ms
// (the K split's fp16 in, fp32 out batched product is one), cudnnCreate about 95 ms. The runtime
// calls the backend's warm_up as soon as it knows an engine will load on the GPU (before it
// resolves and checks the weights and uploads them), and each piece the engine will need starts
// on its own thread beside that work; context creation (or an engine free) waits for them. Each
// piece once per process; the device is the first engine's that needs it. The threads never log
// (the caller's log hook may take a lock the caller holds while it waits, as Python's does with
// the GIL).
#include <pthread.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_dnn.h"

enum {
    PIECE_LT_F32,
    PIECE_LT_F16,
    PIECE_LT_BF16,
    PIECE_SK_F16,
    PIECE_SK_BF16,
    PIECE_DNN,
    N_PIECES
};

static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t warm_thread[N_PIECES];
static int warm_state[N_PIECES]; // 0: not started, 1: running (joinable), 2: joined or never
static int warm_device[N_PIECES];
static kiln_cuda_dnn *warm_dnn; // PIECE_DNN's handle, for the first context on its device

// One heuristic query on a small problem: a, b of type t, the output of type out (a batch of
// `batch`).
static void warm_lt(cudaDataType_t t, cudaDataType_t out, int32_t batch) {
    cublasLtHandle_t h = NULL;
    cublasLtMatmulDescOpaque_t d;
    cublasLtMatrixLayoutOpaque_t a, b, c;
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t r[1];
    const cublasOperation_t tr = CUBLAS_OP_T;
    const int64_t stride = 64 * 64;
    int found = 0;
    if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return;
    cublasStatus_t s = cublasLtMatmulDescInit(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr);
    }
    cublasLtMatrixLayoutOpaque_t *ls[3] = {&a, &b, &c};
    for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; i++) {
        s = cublasLtMatrixLayoutInit(ls[i], i < 2 ? t : out, 64, 64, 64);
        if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
            s = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                 sizeof batch);
        }
        if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
            s = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                 &stride, sizeof stride);
        }
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceInit(&pref);
    if (s == CUBLAS_STATUS_SUCCESS) {
        (void)cublasLtMatmulAlgoGetHeuristic(h, &d, &a, &b, &c, &c, &pref, 1, r, &found);
    }
    cublasLtDestroy(h);
}

static void *warm_main(void *arg) {
    const int piece = (int)(intptr_t)arg;
    kiln_cuda_quiet_thread();
    if (cudaSetDevice(warm_device[piece]) != cudaSuccess) return NULL; // (this thread's only)
    switch (piece) {
    case PIECE_LT_F32: warm_lt(CUDA_R_32F, CUDA_R_32F, 1); break;
    case PIECE_LT_F16: warm_lt(CUDA_R_16F, CUDA_R_16F, 1); break;
    case PIECE_LT_BF16: warm_lt(CUDA_R_16BF, CUDA_R_16BF, 1); break;
    case PIECE_SK_F16: warm_lt(CUDA_R_16F, CUDA_R_32F, 4); break;
    case PIECE_SK_BF16: warm_lt(CUDA_R_16BF, CUDA_R_32F, 4); break;
    case PIECE_DNN:
        // (a library that does not load is not tried here: the context logs why)
        if (kiln_cuda_dnn_version() != 0) warm_dnn = kiln_cuda_dnn_create();
        break;
    default: break;
    }
    (void)cudaGetLastError(); // nothing of this thread's may be seen as pending later
    return NULL;
}

static void start(int piece, int device) {
    if (warm_state[piece] != 0) return;
    warm_device[piece] = device;
    warm_state[piece] =
        pthread_create(&warm_thread[piece], NULL, warm_main, (void *)(intptr_t)piece) == 0 ? 1 : 2;
}

void kiln_cuda_warm_up_start(int device, const kiln_cuda_warm_needs *needs) {
    pthread_mutex_lock(&warm_lock);
    if (needs->lt_dtype == KILN_DTYPE_F32) start(PIECE_LT_F32, device);
    if (needs->lt_dtype == KILN_DTYPE_F16) start(PIECE_LT_F16, device);
    if (needs->lt_dtype == KILN_DTYPE_BF16) start(PIECE_LT_BF16, device);
    if (needs->splitk && needs->lt_dtype == KILN_DTYPE_F16) start(PIECE_SK_F16, device);
    if (needs->splitk && needs->lt_dtype == KILN_DTYPE_BF16) start(PIECE_SK_BF16, device);
    if (needs->dnn) start(PIECE_DNN, device);
    pthread_mutex_unlock(&warm_lock);
}

void kiln_cuda_warm_up_wait(void) {
    pthread_mutex_lock(&warm_lock);
    for (int k = 0; k < N_PIECES; k++) {
        if (warm_state[k] == 1) {
            pthread_join(warm_thread[k], NULL);
            warm_state[k] = 2;
        }
    }
    pthread_mutex_unlock(&warm_lock);
}

kiln_cuda_dnn *kiln_cuda_warm_take_dnn(int device) {
    kiln_cuda_dnn *d = NULL;
    pthread_mutex_lock(&warm_lock);
    if (warm_state[PIECE_DNN] == 2 && warm_device[PIECE_DNN] == device) {
        d = warm_dnn;
        warm_dnn = NULL;
    }
    pthread_mutex_unlock(&warm_lock);
    return d;
}
