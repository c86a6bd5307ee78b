// SPDX-License-Identifier: Apache-2.0
// Library warm-up in the background (cuda_backend.h). cuBLASLt's first heuristic or algorithm
// check in a process costs about 120 ms on the H200 (it loads its kernel tables; later queries of
// the same types cost under a millisecond): a process cost that a context creation would
// otherwise pay in line. The runtime calls the
// backend's warm_up as soon as it knows an engine will load on the GPU (before it resolves and
// checks the weights and uploads them), so this thread runs beside that work; the first context
// creation (or an engine free) waits for it. Once per process; the device is the engine's. The
// thread never logs (the caller's log hook may take a lock the caller holds while it waits, as
// Python's does with the GIL).
#include <pthread.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda/cuda_backend.h"

static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t warm_thread;
static int warm_state; // 0: not started, 1: running (joinable), 2: joined or never needed

typedef struct warm_args {
    int device;
    int lt_dtype; // KILN_DTYPE_*: the linears' dtype (0: no cuBLASLt warm-up)
} warm_args;
static warm_args warm;

// One heuristic query for the engine's linears' dtype, on a small problem: the first query of
// a process loads cuBLASLt's tables (a query per type pair more costs as much again, so only the
// type the engine uses is asked).
static void warm_lt(cudaDataType_t t) {
    cublasLtHandle_t h = NULL;
    cublasLtMatmulDescOpaque_t d;
    cublasLtMatrixLayoutOpaque_t a, b, c;
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t r[1];
    const cublasOperation_t tr = CUBLAS_OP_T;
    int found = 0;
    if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return;
    if (cublasLtMatmulDescInit(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(&d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutInit(&a, t, 64, 64, 64) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutInit(&b, t, 64, 64, 64) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutInit(&c, t, 64, 64, 64) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceInit(&pref) == CUBLAS_STATUS_SUCCESS) {
        (void)cublasLtMatmulAlgoGetHeuristic(h, &d, &a, &b, &c, &c, &pref, 1, r, &found);
    }
    cublasLtDestroy(h);
}

static void *warm_main(void *arg) {
    const warm_args *w = arg;
    kiln_cuda_quiet_thread();
    if (cudaSetDevice(w->device) != cudaSuccess) return NULL; // (this thread's device only)
    if (w->lt_dtype != 0) {
        warm_lt(w->lt_dtype == KILN_DTYPE_F16    ? CUDA_R_16F
                : w->lt_dtype == KILN_DTYPE_BF16 ? CUDA_R_16BF
                                                 : CUDA_R_32F);
    }
    (void)cudaGetLastError(); // nothing of this thread's may be seen as pending later
    return NULL;
}

void kiln_cuda_warm_up_start(int device, uint32_t lt_dtype) {
    pthread_mutex_lock(&warm_lock);
    if (warm_state == 0 && lt_dtype != 0) {
        warm.device = device;
        warm.lt_dtype = (int)lt_dtype;
        warm_state = pthread_create(&warm_thread, NULL, warm_main, &warm) == 0 ? 1 : 2;
    }
    pthread_mutex_unlock(&warm_lock);
}

void kiln_cuda_warm_up_wait(void) {
    pthread_mutex_lock(&warm_lock);
    if (warm_state == 1) {
        pthread_join(warm_thread, NULL);
        warm_state = 2;
    }
    pthread_mutex_unlock(&warm_lock);
}
