// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's op switch (cuda_plan.h): whether the backend implements a layer at all
// (kiln_cuda_supports, checked for every layer at engine load so that an unsupported engine
// fails there with a message instead of at execute), how the planned ops are planned, and what
// runs a layer (kiln_cuda_run).
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_plan.h"

static int is_unary(uint32_t op) { return kiln_cuda_eltwise_arity(op) == 1; }
static int is_binary(uint32_t op) { return kiln_cuda_eltwise_arity(op) >= 2; }
static int is_logic(uint32_t op) { return op >= KILN_OP_EQ && op <= KILN_OP_BITWISE_NOT; }

// Heads that apply their own tail (part of it may ride in a kernel's epilogue); any other op's
// tail runs after it here.
static int applies_own_tail(uint32_t op) {
    return op == KILN_OP_LINEAR || op == KILN_OP_MATMUL || op == KILN_OP_CONV2D ||
           op == KILN_OP_CONV_TRANSPOSE2D || op == KILN_OP_CAT ||
           (!is_logic(op) && op != KILN_OP_WHERE && kiln_cuda_eltwise_arity(op) > 0);
}

int kiln_cuda_op_planned(uint32_t op) {
    return op == KILN_OP_LINEAR || op == KILN_OP_MATMUL || op == KILN_OP_CONV2D ||
           op == KILN_OP_SDPA;
}

static kiln_status run_launcher(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    switch (args->op) {
    case KILN_OP_CONV_TRANSPOSE2D: return kiln_cuda_conv_transpose2d(ctx, args);
    case KILN_OP_BATCH_NORM: return kiln_cuda_batch_norm(ctx, args);
    case KILN_OP_SOFTMAX:
    case KILN_OP_LOG_SOFTMAX: return kiln_cuda_softmax(ctx, args);
    case KILN_OP_LAYER_NORM: return kiln_cuda_layer_norm(ctx, args);
    case KILN_OP_RMS_NORM: return kiln_cuda_rms_norm(ctx, args);
    case KILN_OP_ROTARY: return kiln_cuda_rotary(ctx, args);
    case KILN_OP_MAX_POOL2D: return kiln_cuda_max_pool2d(ctx, args);
    case KILN_OP_AVG_POOL2D: return kiln_cuda_avg_pool2d(ctx, args);
    case KILN_OP_ADAPTIVE_AVG_POOL2D: return kiln_cuda_adaptive_avg_pool2d(ctx, args);
    case KILN_OP_MEAN:
    case KILN_OP_SUM:
    case KILN_OP_VECTOR_NORM: return kiln_cuda_reduce(ctx, args);
    case KILN_OP_RESHAPE:
    case KILN_OP_SQUEEZE:
    case KILN_OP_UNSQUEEZE: return kiln_cuda_reshape(ctx, args);
    case KILN_OP_PERMUTE: return kiln_cuda_permute(ctx, args);
    case KILN_OP_EXPAND: return kiln_cuda_expand(ctx, args);
    case KILN_OP_CAT: return kiln_cuda_cat(ctx, args);
    case KILN_OP_SLICE: return kiln_cuda_slice(ctx, args);
    case KILN_OP_SELECT: return kiln_cuda_select(ctx, args);
    case KILN_OP_EMBEDDING: return kiln_cuda_embedding(ctx, args);
    case KILN_OP_INDEX: return kiln_cuda_index(ctx, args);
    case KILN_OP_GATHER: return kiln_cuda_gather(ctx, args);
    case KILN_OP_INDEX_COPY: return kiln_cuda_index_copy(ctx, args);
    case KILN_OP_GATHER_MATMUL: return kiln_cuda_gather_matmul(ctx, args);
    case KILN_OP_SELECTIVE_SCAN: return kiln_cuda_selective_scan(ctx, args);
    case KILN_OP_UPSAMPLE_NEAREST2D:
    case KILN_OP_UPSAMPLE_BILINEAR2D: return kiln_cuda_upsample(ctx, args);
    case KILN_OP_GRID_SAMPLE: return kiln_cuda_grid_sample(ctx, args);
    case KILN_OP_GROUP_NORM: return kiln_cuda_group_norm(ctx, args);
    case KILN_OP_CUMSUM: return kiln_cuda_cumsum(ctx, args);
    case KILN_OP_ARGMAX: return kiln_cuda_argmax(ctx, args);
    case KILN_OP_TOPK: return kiln_cuda_topk(ctx, args);
    case KILN_OP_PAD: return kiln_cuda_pad(ctx, args);
    case KILN_OP_ARANGE: return kiln_cuda_arange(ctx, args);
    default:
        if (is_logic(args->op)) return kiln_cuda_logic(ctx, args);
        if (is_unary(args->op)) return kiln_cuda_unary(ctx, args);
        if (is_binary(args->op)) return kiln_cuda_binary(ctx, args);
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda backend: op %u (%s) is not implemented at %s", args->op,
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
}

void kiln_cuda_plan_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t *key) {
    switch (args->op) {
    case KILN_OP_LINEAR: kiln_cuda_linear_key(ctx, args, key); return;
    case KILN_OP_MATMUL: kiln_cuda_matmul_key(ctx, args, key); return;
    case KILN_OP_CONV2D: kiln_cuda_conv2d_key(ctx, args, key); return;
    case KILN_OP_SDPA: kiln_cuda_sdpa_key(ctx, args, key); return;
    default: memset(key, 0, KILN_CUDA_PLAN_KEY * sizeof *key); return;
    }
}

int kiln_cuda_plan_current(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                           const kiln_cuda_layer_plan *plan) {
    int64_t key[KILN_CUDA_PLAN_KEY];
    if (plan->kernel == KILN_CUDA_K_NONE) return 0;
    kiln_cuda_plan_key(ctx, args, key);
    return key[0] >= 0 && memcmp(key, plan->key, sizeof key) == 0;
}

void kiln_cuda_plan_release(kiln_cuda_layer_plan *plan) {
    if (plan == NULL) return;
    kiln_cuda_conv_plan_release(&plan->conv);
    memset(plan, 0, sizeof *plan);
}

kiln_status kiln_cuda_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int tune,
                           kiln_cuda_layer_plan *plan) {
    kiln_status st;
    kiln_cuda_plan_release(plan);
    kiln_cuda_plan_key(ctx, args, plan->key);
    switch (args->op) {
    case KILN_OP_LINEAR: st = kiln_cuda_linear_plan(ctx, args, tune, plan); break;
    case KILN_OP_MATMUL: st = kiln_cuda_matmul_plan(ctx, args, tune, plan); break;
    case KILN_OP_CONV2D: st = kiln_cuda_conv2d_plan(ctx, args, tune, plan); break;
    case KILN_OP_SDPA: st = kiln_cuda_sdpa_plan(ctx, args, tune, plan); break;
    default:
        return kiln_cuda_fail(KILN_ERR_INTERNAL, "cuda backend: op %s has no plan (at %s)",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    if (st != KILN_OK) kiln_cuda_plan_release(plan); // not planned: NONE
    return st;
}

kiln_status kiln_cuda_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                          kiln_cuda_layer_plan *plan) {
    kiln_status st;
    switch (args->op) {
    case KILN_OP_LINEAR:
    case KILN_OP_MATMUL: return kiln_cuda_gemm_run(ctx, args, plan);
    case KILN_OP_CONV2D: return kiln_cuda_conv2d_run(ctx, args, plan);
    case KILN_OP_SDPA: st = kiln_cuda_sdpa_run(ctx, args, plan); break;
    default: st = run_launcher(ctx, args); break;
    }
    if (st == KILN_OK && args->n_tail > 0 && !applies_own_tail(args->op)) {
        st = kiln_cuda_tail(ctx, args, 0);
    }
    return st;
}

const char *kiln_cuda_kernel_name(kiln_cuda_kernel k) {
    switch (k) {
    case KILN_CUDA_K_EMPTY: return "none";
    case KILN_CUDA_K_TILED: return "tiled";
    case KILN_CUDA_K_CUBLASLT: return "cublaslt";
    case KILN_CUDA_K_GEMV: return "gemv";
    case KILN_CUDA_K_WGMMA: return "wgmma";
    case KILN_CUDA_K_SPLITK: return "splitk";
    case KILN_CUDA_K_CUDNN: return "cudnn";
    case KILN_CUDA_K_STEM: return "stem";
    case KILN_CUDA_K_CONV_DIRECT: return "conv_direct";
    case KILN_CUDA_K_CONV_GEMM: return "conv_gemm";
    case KILN_CUDA_K_SDPA_TC: return "sdpa_tc";
    case KILN_CUDA_K_SDPA_TC_SPLIT: return "sdpa_tc_split";
    case KILN_CUDA_K_SDPA_FLASH: return "sdpa_flash";
    case KILN_CUDA_K_SDPA_SIMPLE: return "sdpa_simple";
    case KILN_CUDA_K_CONV_DW: return "conv_dw";
    case KILN_CUDA_K_CONV_PW: return "conv_pw";
    case KILN_CUDA_K_CONV_LT: return "conv_lt";
    default: return "unplanned";
    }
}

void kiln_cuda_plan_describe(const kiln_cuda_layer_plan *plan, uint32_t op, kiln_layer_info *out) {
    if (plan == NULL || !kiln_cuda_op_planned(op)) {
        snprintf(out->kernel, sizeof out->kernel, "kiln");
        snprintf(out->detail, sizeof out->detail, "%s kernel", kiln_cuda_op_name(op));
        return;
    }
    snprintf(out->kernel, sizeof out->kernel, "%s", kiln_cuda_kernel_name(plan->kernel));
    if (plan->kernel == KILN_CUDA_K_NONE) {
        snprintf(out->detail, sizeof out->detail, "not planned yet (planned at its first execute)");
        return;
    }
    if (plan->timed) out->flags |= KILN_LAYER_INFO_TIMED;
    if (plan->fell_back) out->flags |= KILN_LAYER_INFO_FELL_BACK;
    switch (op) {
    case KILN_OP_LINEAR:
    case KILN_OP_MATMUL:
        kiln_cuda_gemm_describe(plan, out->detail, sizeof out->detail);
        out->workspace_nbytes =
            plan->kernel == KILN_CUDA_K_CUBLASLT || plan->kernel == KILN_CUDA_K_SPLITK
                ? plan->gemm.lt.ws_nbytes
                : 0;
        break;
    case KILN_OP_CONV2D:
        kiln_cuda_conv_describe(plan, out->detail, sizeof out->detail);
        out->workspace_nbytes = plan->kernel == KILN_CUDA_K_CUDNN     ? plan->conv.ws_nbytes
                                : plan->kernel == KILN_CUDA_K_CONV_LT ? plan->gemm.lt.ws_nbytes
                                                                      : 0;
        break;
    default: kiln_cuda_sdpa_describe(plan, out->detail, sizeof out->detail); break;
    }
}

static int why_not(char *why, size_t n, const kiln_kernel_args *args, const char *what) {
    if (why != NULL && n > 0) {
        snprintf(why, n, "op %s (output %s): %s", kiln_cuda_op_name(args->op),
                 args->out ? kiln_cuda_dtype_name(args->out->dtype) : "none", what);
    }
    return 0;
}

static int all_float(const kiln_kernel_args *args) {
    for (uint32_t i = 0; i < args->n_in; i++) {
        if (args->in[i] != NULL && !kiln_cuda_is_float(args->in[i]->dtype)) return 0;
    }
    return kiln_cuda_is_float(args->out->dtype);
}

static int same_dtype_as_out(const kiln_kernel_args *args) {
    for (uint32_t i = 0; i < args->n_in; i++) {
        if (args->in[i] != NULL && args->in[i]->dtype != args->out->dtype) return 0;
    }
    return kiln_cuda_dtype_size(args->out->dtype) != 0;
}

int kiln_cuda_supports(const kiln_kernel_args *args, char *why, size_t why_nbytes) {
    uint32_t op = args->op;
    if (args->out == NULL || args->n_in == 0 || args->in[0] == NULL) {
        return why_not(why, why_nbytes, args, "missing input or output");
    }
    if (args->n_tail > 0 && !kiln_cuda_tail_supports(args)) {
        return why_not(why, why_nbytes, args, "its fused elementwise tail is not supported");
    }
    if (is_unary(op)) {
        if (!kiln_cuda_eltwise_supports(op, args->in, 1, args->out)) {
            return why_not(why, why_nbytes, args, "these dtypes or shapes are not supported");
        }
        return 1;
    }
    if (is_binary(op)) {
        int n = kiln_cuda_eltwise_arity(op);
        if (args->n_in < (uint32_t)n || !kiln_cuda_eltwise_supports(op, args->in, n, args->out)) {
            return why_not(why, why_nbytes, args, "these dtypes or shapes are not supported");
        }
        return 1;
    }
    if (is_logic(op)) {
        int n = op == KILN_OP_BITWISE_NOT ? 1 : 2;
        if (args->n_in != (uint32_t)n) return why_not(why, why_nbytes, args, "wrong inputs");
        for (int i = 0; i < n; i++) {
            const kiln_tensor *t = args->in[i];
            if (t == NULL || t->dtype != args->in[0]->dtype || t->rank > args->out->rank ||
                kiln_cuda_dtype_size(t->dtype) == 0) {
                return why_not(why, why_nbytes, args, "inputs of one dtype must broadcast");
            }
        }
        if (op <= KILN_OP_GE
                ? args->out->dtype != KILN_DTYPE_BOOL
                : args->out->dtype != args->in[0]->dtype || kiln_cuda_is_float(args->out->dtype)) {
            return why_not(why, why_nbytes, args, "comparisons give bool; bitwise ops keep int");
        }
        return 1;
    }
    switch (op) {
    case KILN_OP_SELECTIVE_SCAN:
        for (uint32_t i = 0; i < 4; i++) {
            if (i >= args->n_in || args->in[i] == NULL || args->in[i]->dtype != args->out->dtype ||
                !kiln_dtype_is_float((kiln_dtype)args->out->dtype)) {
                return why_not(why, why_nbytes, args,
                               "selective_scan takes a, u, c and h0 of the output's float dtype");
            }
        }
        if (args->in[0]->rank != 4 || args->in[0]->dims[3] > 128) {
            return why_not(why, why_nbytes, args, "selective_scan holds at most 128 state values");
        }
        return 1;
    case KILN_OP_GATHER_MATMUL:
        if (args->n_in != 3 || args->in[1] == NULL || args->in[2] == NULL ||
            args->in[0]->dtype != args->out->dtype || args->in[2]->dtype != args->out->dtype ||
            kiln_cuda_dtype_size(args->out->dtype) == 0 ||
            (args->in[1]->dtype != KILN_DTYPE_I32 && args->in[1]->dtype != KILN_DTYPE_I64)) {
            return why_not(why, why_nbytes, args,
                           "gather_matmul takes w and x of the output's dtype and an int32/int64 "
                           "index");
        }
        return 1;
    case KILN_OP_INDEX:
    case KILN_OP_GATHER:
        if (args->n_in < 2 || args->in[0]->dtype != args->out->dtype ||
            kiln_cuda_dtype_size(args->out->dtype) == 0) {
            return why_not(why, why_nbytes, args, "x and output dtypes differ");
        }
        for (uint32_t i = 1; i < args->n_in; i++) {
            if (args->in[i] == NULL ||
                (args->in[i]->dtype != KILN_DTYPE_I32 && args->in[i]->dtype != KILN_DTYPE_I64)) {
                return why_not(why, why_nbytes, args, "indices must be int32 or int64");
            }
        }
        return 1;
    case KILN_OP_INDEX_COPY:
        if (args->n_in < 3 || args->in[1] == NULL || args->in[2] == NULL ||
            args->in[0]->dtype != args->out->dtype || args->in[2]->dtype != args->out->dtype ||
            kiln_cuda_dtype_size(args->out->dtype) == 0) {
            return why_not(why, why_nbytes, args, "x, src and output dtypes differ");
        }
        if (args->in[1]->dtype != KILN_DTYPE_I32 && args->in[1]->dtype != KILN_DTYPE_I64) {
            return why_not(why, why_nbytes, args, "the index must be int32 or int64");
        }
        return 1;
    case KILN_OP_GRID_SAMPLE:
        if (args->n_in < 2 || args->in[1] == NULL || args->in[1]->rank != 4 ||
            args->in[0]->rank != 4 ||
            (args->in[1]->dtype != args->in[0]->dtype && args->in[1]->dtype != KILN_DTYPE_F32)) {
            return why_not(why, why_nbytes, args,
                           "needs a 4-D x and a 4-D grid of x's dtype "
                           "or float32");
        }
        if (kiln_tensor_numel(args->in[0]) >= (1 << 30) ||
            kiln_tensor_numel(args->in[1]) >= (1 << 30) ||
            kiln_tensor_numel(args->out) >= (1 << 30)) {
            return why_not(why, why_nbytes, args, "more than 2^30 elements");
        }
        /* fall through */
    case KILN_OP_UPSAMPLE_NEAREST2D:
    case KILN_OP_UPSAMPLE_BILINEAR2D:
    case KILN_OP_GROUP_NORM:
        if (!all_float(args) || args->in[0]->dtype != args->out->dtype) {
            return why_not(why, why_nbytes, args, "needs one float dtype for input and output");
        }
        return 1;
    case KILN_OP_ARANGE:
        if (args->out->rank != 1 || args->out->dtype == KILN_DTYPE_BOOL ||
            kiln_cuda_dtype_size(args->out->dtype) == 0) {
            return why_not(why, why_nbytes, args, "arange gives a numeric 1-D tensor");
        }
        return 1;
    case KILN_OP_ARGMAX:
        if (args->out->dtype != KILN_DTYPE_I64 || args->in[0]->dtype == KILN_DTYPE_BOOL ||
            kiln_cuda_dtype_size(args->in[0]->dtype) == 0) {
            return why_not(why, why_nbytes, args, "argmax takes float or integer x, gives int64");
        }
        return 1;
    case KILN_OP_TOPK:
        if (args->out->dtype != KILN_DTYPE_I64 || args->in[0]->dtype == KILN_DTYPE_BOOL ||
            kiln_cuda_dtype_size(args->in[0]->dtype) == 0) {
            return why_not(why, why_nbytes, args, "topk takes float or integer x, gives int64");
        }
        return 1;
    case KILN_OP_CUMSUM:
    case KILN_OP_PAD:
        if (args->in[0]->dtype != args->out->dtype || kiln_cuda_dtype_size(args->out->dtype) == 0) {
            return why_not(why, why_nbytes, args, "input and output dtypes differ");
        }
        return 1;
    case KILN_OP_LINEAR:
    case KILN_OP_MATMUL:
    case KILN_OP_CONV2D:
    case KILN_OP_CONV_TRANSPOSE2D:
        if (args->n_in < 2 || args->in[1] == NULL || !all_float(args)) {
            return why_not(why, why_nbytes, args, "needs float32/float16/bfloat16 operands");
        }
        return 1;
    case KILN_OP_ROTARY:
        if (args->n_in < 3 || !all_float(args) || args->in[0]->dtype != args->out->dtype ||
            !kiln_cuda_rotary_supports(args)) {
            return why_not(why, why_nbytes, args,
                           "needs float x[..., even D] of the output's dtype (under 2^31 "
                           "elements) and float cos, sin that broadcast to x");
        }
        return 1;
    case KILN_OP_BATCH_NORM:
    case KILN_OP_LAYER_NORM:
    case KILN_OP_RMS_NORM:
    case KILN_OP_SOFTMAX:
    case KILN_OP_LOG_SOFTMAX:
    case KILN_OP_MAX_POOL2D:
    case KILN_OP_AVG_POOL2D:
    case KILN_OP_ADAPTIVE_AVG_POOL2D:
        if (!all_float(args) || args->in[0]->dtype != args->out->dtype) {
            return why_not(why, why_nbytes, args, "needs one float dtype for input and output");
        }
        return 1;
    case KILN_OP_MEAN:
        if (!kiln_cuda_is_float(args->out->dtype)) {
            return why_not(why, why_nbytes, args, "mean needs a float output");
        }
        return 1;
    case KILN_OP_VECTOR_NORM:
        if (!kiln_cuda_is_float(args->out->dtype) || !kiln_cuda_is_float(args->in[0]->dtype)) {
            return why_not(why, why_nbytes, args, "vector_norm needs a float input and output");
        }
        return 1;
    case KILN_OP_SUM:
        if (kiln_cuda_dtype_size(args->out->dtype) == 0) {
            return why_not(why, why_nbytes, args, "unknown dtype");
        }
        return 1;
    case KILN_OP_RESHAPE:
    case KILN_OP_SQUEEZE:
    case KILN_OP_UNSQUEEZE:
    case KILN_OP_PERMUTE:
    case KILN_OP_EXPAND:
    case KILN_OP_SLICE:
    case KILN_OP_SELECT:
        if (args->in[0]->dtype != args->out->dtype || kiln_cuda_dtype_size(args->out->dtype) == 0) {
            return why_not(why, why_nbytes, args, "input and output dtypes differ");
        }
        return 1;
    case KILN_OP_CAT:
        if (!same_dtype_as_out(args)) {
            return why_not(why, why_nbytes, args, "inputs and output dtypes differ");
        }
        return 1;
    case KILN_OP_EMBEDDING:
        if (args->n_in < 2 || args->in[1] == NULL || args->in[0]->dtype != args->out->dtype ||
            !kiln_cuda_is_float(args->out->dtype) ||
            !(args->in[1]->dtype == KILN_DTYPE_I32 || args->in[1]->dtype == KILN_DTYPE_I64 ||
              args->in[1]->dtype == KILN_DTYPE_BOOL)) {
            return why_not(why, why_nbytes, args,
                           "needs a float weight of the output dtype and integer indices");
        }
        return 1;
    case KILN_OP_SDPA:
        if (args->n_in < 3 || args->in[1] == NULL || args->in[2] == NULL ||
            args->in[0]->dtype != args->out->dtype || args->in[1]->dtype != args->out->dtype ||
            args->in[2]->dtype != args->out->dtype || !kiln_cuda_is_float(args->out->dtype)) {
            return why_not(why, why_nbytes, args, "q, k, v and output must share a float dtype");
        }
        if (args->n_in > 3 && args->in[3] != NULL && args->in[3]->dtype != KILN_DTYPE_BOOL &&
            !kiln_cuda_is_float(args->in[3]->dtype)) {
            return why_not(why, why_nbytes, args, "the mask must be bool or float");
        }
        return 1;
    default: return why_not(why, why_nbytes, args, "not implemented by the CUDA backend");
    }
}
