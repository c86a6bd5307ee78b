// SPDX-License-Identifier: Apache-2.0
// The test hooks (runtime/backend_plugin.h: kiln_cuda_test_hooks): one layer on device tensors,
// planned untimed under the caller's policy and run, with what ran reported as kiln_layer_info.
// The parity program (tests/cuda/cuda_parity.c) drives every op and kernel through it.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/attn.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_dnn.h"
#include "cuda/cuda_ops.h"

// One cuDNN handle per device, created on first use and kept (the test programs run hundreds of
// cases; creating a handle costs far more than a case).
#define RUN_OP_MAX_DEVICES 64
static pthread_mutex_t run_op_mtx = PTHREAD_MUTEX_INITIALIZER;
static kiln_cuda_dnn *run_op_handles[RUN_OP_MAX_DEVICES];
static uint8_t run_op_tried[RUN_OP_MAX_DEVICES];

static kiln_cuda_dnn *run_op_dnn(int device) {
    kiln_cuda_dnn *d = NULL;
    if (device < 0 || device >= RUN_OP_MAX_DEVICES) return NULL;
    pthread_mutex_lock(&run_op_mtx);
    if (!run_op_tried[device]) {
        run_op_tried[device] = 1;
        run_op_handles[device] = kiln_cuda_dnn_create();
    }
    d = run_op_handles[device];
    pthread_mutex_unlock(&run_op_mtx);
    return d;
}

static kiln_status run_op(const kiln_kernel_args *args, int device, void *stream,
                          const kiln_cuda_policy *policy, kiln_layer_info *info) {
    kiln_cuda_ctx ctx;
    kiln_cuda_layer_plan plan;
    cudaStream_t own = NULL;
    int prev = -1, entered = 0;
    char where[96], why[256];
    kiln_status st = KILN_OK;
    cudaError_t err;
    memset(&ctx, 0, sizeof ctx);
    memset(&plan, 0, sizeof plan);
    if (policy == NULL) return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "run_op: no policy");
    if (!kiln_cuda_supports(args, why, sizeof why)) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "run_op: %s", why);
    }
    KILN_CUDA_TRY(kiln_cuda_device_enter(device, &prev));
    entered = 1;
    st = kiln_cuda_attention_init();
    if (st != KILN_OK) goto done;
    if (stream == NULL) {
        err = cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
        if (err != cudaSuccess) {
            st = kiln_cuda_call_failed("cudaStreamCreate", err);
            goto done;
        }
        stream = own;
    }
    ctx.stream = (cudaStream_t)stream;
    ctx.policy = policy;
    ctx.l2_keep = -1;
    ctx.wg_ok = policy->wgmma && kiln_cuda_wg_init(device);
    if (cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, device) !=
        cudaSuccess) {
        kiln_cuda_consume(); // the sdpa occupancy rule then keeps 64-row blocks
        ctx.sm_count = 0;
    }
    if (policy->cublaslt && cublasLtCreate(&ctx.lt) != CUBLAS_STATUS_SUCCESS) {
        ctx.lt = NULL;
        st = kiln_cuda_fail(KILN_ERR_DEVICE, "run_op: cublasLtCreate failed");
        goto done;
    }
    if (policy->cudnn &&
        (args->op == KILN_OP_CONV2D || (args->op == KILN_OP_SDPA && policy->cudnn_sdpa))) {
        ctx.dnn = run_op_dnn(device); // kept for the process: cudnnCreate is slow
    }
    if (args->op == KILN_OP_SDPA && ctx.dnn != NULL) ctx.sdpa_store = kiln_cuda_sdpa_store_new();
    if (ctx.lt != NULL || ctx.dnn != NULL) {
        ctx.workspace_nbytes = KILN_CUDA_WORKSPACE_NBYTES;
        err = cudaMalloc(&ctx.workspace, ctx.workspace_nbytes);
        if (err != cudaSuccess) {
            ctx.workspace = NULL;
            st = kiln_cuda_call_failed("cudaMalloc (workspace)", err);
            goto done;
        }
    }
    snprintf(where, sizeof where, "run_op (%s)", kiln_cuda_op_name(args->op));
    ctx.where = where;
    if (kiln_cuda_op_planned(args->op)) {
        st = kiln_cuda_plan(&ctx, args, 0, &plan);
        if (st != KILN_OK) goto done;
    }
    st = kiln_cuda_run(&ctx, args, kiln_cuda_op_planned(args->op) ? &plan : NULL);
    if (st == KILN_OK) {
        err = cudaStreamSynchronize(ctx.stream);
        if (err != cudaSuccess) st = kiln_cuda_error(&ctx, "cudaStreamSynchronize (run_op)", err);
    }
    if (st == KILN_OK && info != NULL) {
        memset(info, 0, sizeof *info);
        info->op = args->op;
        info->n_fused = args->n_tail;
        info->l2_keep_nbytes = -1;
        info->device_us = info->host_us = -1.0;
        kiln_cuda_plan_describe(kiln_cuda_op_planned(args->op) ? &plan : NULL, args->op, info);
    }

done:
    if (ctx.stream != NULL) cudaStreamSynchronize(ctx.stream);
    if (st != KILN_OK) kiln_cuda_consume(); // reported: leave nothing pending
    kiln_cuda_plan_release(&plan);
    kiln_cuda_sdpa_store_free(ctx.sdpa_store);
    cudaFree(ctx.workspace);
    if (ctx.lt != NULL) cublasLtDestroy(ctx.lt);
    if (own != NULL) cudaStreamDestroy(own);
    if (entered) kiln_cuda_device_leave(device, prev);
    return st;
}

static const kiln_cuda_test_hooks hooks = {
    .struct_nbytes = (uint32_t)sizeof(kiln_cuda_test_hooks),
    .abi = KILN_CUDA_PLUGIN_ABI,
    .run_op = run_op,
    .dnn_version = kiln_cuda_dnn_version,
};

#if defined(__GNUC__)
__attribute__((visibility("default")))
#endif
const kiln_cuda_test_hooks *
kiln_cuda_plugin_test_hooks_v2(void) {
    return &hooks;
}
