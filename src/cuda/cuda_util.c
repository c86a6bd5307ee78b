// SPDX-License-Identifier: Apache-2.0
// The plugin's error, log and allocation helpers: thin wrappers over the services libkiln lent
// at init (runtime/backend_plugin.h), so that messages reach libkiln's log hook and kiln_last_error
// and host memory comes from libkiln's allocator hook. Before init (never in practice) they fall
// back to stderr-free no-ops and plain failures.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_ops.h"

static const kiln_cuda_services *svc; // set once by the entry point, before any other call
static _Thread_local char last_message[1024];

const char *kiln_cuda_last_message(void) { return last_message; }

static _Thread_local int quiet; // this thread reaches neither the log hook nor the last error

void kiln_cuda_services_set(const kiln_cuda_services *services) { svc = services; }

void kiln_cuda_quiet_thread(void) { quiet = 1; }

kiln_status kiln_cuda_fail(kiln_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return svc && !quiet ? svc->fail(status, last_message) : status;
}

void kiln_cuda_log(kiln_log_level level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    if (svc == NULL || quiet || level < svc->log_level()) return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc->log(level, msg);
}

int kiln_cuda_log_enabled(kiln_log_level level) { return svc != NULL && level >= svc->log_level(); }

void *kiln_cuda_malloc(size_t nbytes) { return svc ? svc->malloc(nbytes, 64) : NULL; }

void *kiln_cuda_calloc(size_t nbytes) {
    void *p = kiln_cuda_malloc(nbytes);
    if (p != NULL) memset(p, 0, nbytes);
    return p;
}

void kiln_cuda_free(void *ptr, size_t nbytes) {
    if (ptr != NULL && svc != NULL) svc->free(ptr, nbytes);
}

const char *kiln_cuda_op_name(uint32_t op) { return svc ? svc->op_name(op) : "?"; }

kiln_status kiln_cuda_plan_memory(kiln_mem_item *items, uint32_t n, uint64_t align,
                                  uint64_t *out_nbytes) {
    if (svc == NULL) return KILN_ERR_INTERNAL;
    return svc->plan_memory(items, n, align, out_nbytes);
}
const char *kiln_cuda_dtype_name(uint32_t dtype) { return svc ? svc->dtype_name(dtype) : "?"; }

int kiln_cuda_tune_get(const char *where, const void *key, size_t key_nbytes, void *val,
                       size_t val_cap, size_t *val_nbytes) {
    return svc != NULL && svc->tune_get(where, key, key_nbytes, val, val_cap, val_nbytes);
}
void kiln_cuda_tune_put(const char *where, const void *key, size_t key_nbytes, const void *val,
                        size_t val_nbytes) {
    if (svc != NULL) svc->tune_put(where, key, key_nbytes, val, val_nbytes);
}
void kiln_cuda_tune_flush(const char *where) {
    if (svc != NULL) svc->tune_flush(where);
}
void kiln_cuda_tune_stats(const char *where, const void *prefix, size_t prefix_nbytes,
                          uint32_t *n_records, uint32_t *n_prefix) {
    *n_records = *n_prefix = 0;
    if (svc != NULL) svc->tune_stats(where, prefix, prefix_nbytes, n_records, n_prefix);
}

kiln_status kiln_cuda_error(const kiln_cuda_ctx *ctx, const char *what, cudaError_t err) {
    return kiln_cuda_fail(KILN_ERR_DEVICE, "CUDA error in %s at %s: %s (%s)", what,
                          ctx && ctx->where ? ctx->where : "(no layer)", cudaGetErrorName(err),
                          cudaGetErrorString(err));
}

kiln_status kiln_cuda_call_failed(const char *what, cudaError_t err) {
    kiln_status st = err == cudaErrorMemoryAllocation ? KILN_ERR_NO_MEMORY : KILN_ERR_DEVICE;
    return kiln_cuda_fail(st, "CUDA error in %s: %s (%s)", what, cudaGetErrorName(err),
                          cudaGetErrorString(err));
}

void kiln_cuda_consume(void) { (void)cudaGetLastError(); }

kiln_status kiln_cuda_check_launch(const kiln_cuda_ctx *ctx, const char *kernel) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) return KILN_OK;
    return kiln_cuda_error(ctx, kernel, err);
}

size_t kiln_cuda_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F32: return 4;
    case KILN_DTYPE_F16: return 2;
    case KILN_DTYPE_BF16: return 2;
    case KILN_DTYPE_I32: return 4;
    case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

float kiln_cuda_time_in_graph(cudaStream_t stream, int (*enqueue)(void *arg), void *arg) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    float ms = -1.0f;
    int ok = 1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess ||
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        ok = 0;
    } else {
        for (int rep = 0; rep < KILN_CUDA_TIME_REPS && ok; rep++) ok = enqueue(arg);
        // the capture always ends, whatever failed inside it
        ok = cudaStreamEndCapture(stream, &g) == cudaSuccess && ok;
    }
    ok = ok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
         cudaGraphLaunch(ge, stream) == cudaSuccess && kiln_cuda_delay(stream, 100) == KILN_OK &&
         cudaEventRecord(e0, stream) == cudaSuccess && cudaGraphLaunch(ge, stream) == cudaSuccess &&
         cudaGraphLaunch(ge, stream) == cudaSuccess && cudaEventRecord(e1, stream) == cudaSuccess &&
         cudaEventSynchronize(e1) == cudaSuccess &&
         cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
    cudaStreamSynchronize(stream);
    kiln_cuda_consume(); // a candidate that cannot run is not an error of the engine
    if (ge != NULL) cudaGraphExecDestroy(ge);
    if (g != NULL) cudaGraphDestroy(g);
    if (e0 != NULL) cudaEventDestroy(e0);
    if (e1 != NULL) cudaEventDestroy(e1);
    return ok ? ms * 1000.0f / (2 * KILN_CUDA_TIME_REPS) : -1.0f;
}
