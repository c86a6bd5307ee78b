// SPDX-License-Identifier: Apache-2.0
// The CPU backend's entry points: a dispatch table by op id, the dtype/rank support check, the
// scratch query, and the fused tail applied after every op that carries one.
#include <stdio.h>

#include "cpu/cpu_internal.h"

typedef struct cpu_op_entry {
    kiln_status (*run)(const kiln_kernel_args *args);
    size_t (*scratch)(const kiln_kernel_args *args);
} cpu_op_entry;

#define E_(fn)                                                                                     \
    { kiln_cpu_##fn, kiln_cpu_##fn##_scratch }

static const cpu_op_entry table[KILN_OP_MAX_ID + 1] = {
    [KILN_OP_LINEAR] = E_(linear),
    [KILN_OP_MATMUL] = E_(matmul),
    [KILN_OP_GATHER_MATMUL] = E_(gather_matmul),
    [KILN_OP_SELECTIVE_SCAN] = E_(selective_scan),
    [KILN_OP_CONV2D] = E_(conv2d),
    [KILN_OP_CONV_TRANSPOSE2D] = E_(conv_transpose2d),
    [KILN_OP_BATCH_NORM] = E_(batch_norm),
    [KILN_OP_RELU] = E_(unary),
    [KILN_OP_GELU] = E_(unary),
    [KILN_OP_SILU] = E_(unary),
    [KILN_OP_SIGMOID] = E_(unary),
    [KILN_OP_TANH] = E_(unary),
    [KILN_OP_HARDSWISH] = E_(unary),
    [KILN_OP_HARDSIGMOID] = E_(unary),
    [KILN_OP_NEG] = E_(unary),
    [KILN_OP_SQRT] = E_(unary),
    [KILN_OP_RSQRT] = E_(unary),
    [KILN_OP_EXP] = E_(unary),
    [KILN_OP_LOG] = E_(unary),
    [KILN_OP_LOG1P] = E_(unary),
    [KILN_OP_ERF] = E_(unary),
    [KILN_OP_COPY] = E_(unary),
    [KILN_OP_CAST] = E_(unary),
    [KILN_OP_CLAMP] = E_(unary),
    [KILN_OP_ABS] = E_(unary),
    [KILN_OP_SIGN] = E_(unary),
    [KILN_OP_CEIL] = E_(unary),
    [KILN_OP_FLOOR] = E_(unary),
    [KILN_OP_ROUND] = E_(unary),
    [KILN_OP_TRUNC] = E_(unary),
    [KILN_OP_ADD] = E_(binary),
    [KILN_OP_SUB] = E_(binary),
    [KILN_OP_MUL] = E_(binary),
    [KILN_OP_DIV] = E_(binary),
    [KILN_OP_POW] = E_(binary),
    [KILN_OP_REMAINDER] = E_(binary),
    [KILN_OP_FMOD] = E_(binary),
    [KILN_OP_FLOOR_DIVIDE] = E_(binary),
    [KILN_OP_MAXIMUM] = E_(binary),
    [KILN_OP_MINIMUM] = E_(binary),
    [KILN_OP_WHERE] = E_(binary),
    [KILN_OP_SOFTMAX] = E_(softmax),
    [KILN_OP_LOG_SOFTMAX] = E_(softmax),
    [KILN_OP_LAYER_NORM] = E_(layer_norm),
    [KILN_OP_RMS_NORM] = E_(rms_norm),
    [KILN_OP_ROTARY] = E_(rotary),
    [KILN_OP_MAX_POOL2D] = E_(max_pool2d),
    [KILN_OP_AVG_POOL2D] = E_(avg_pool2d),
    [KILN_OP_ADAPTIVE_AVG_POOL2D] = E_(adaptive_avg_pool2d),
    [KILN_OP_MEAN] = E_(reduce),
    [KILN_OP_SUM] = E_(reduce),
    [KILN_OP_VECTOR_NORM] = E_(reduce),
    [KILN_OP_RESHAPE] = E_(reshape),
    [KILN_OP_PERMUTE] = E_(permute),
    [KILN_OP_EXPAND] = E_(expand),
    [KILN_OP_CAT] = E_(cat),
    [KILN_OP_SLICE] = E_(slice),
    [KILN_OP_SELECT] = E_(select),
    [KILN_OP_SQUEEZE] = E_(reshape),
    [KILN_OP_UNSQUEEZE] = E_(reshape),
    [KILN_OP_EMBEDDING] = E_(embedding),
    [KILN_OP_SDPA] = E_(sdpa),
    [KILN_OP_COS] = E_(unary),
    [KILN_OP_SIN] = E_(unary),
    [KILN_OP_GROUP_NORM] = E_(group_norm),
    [KILN_OP_UPSAMPLE_NEAREST2D] = E_(upsample),
    [KILN_OP_UPSAMPLE_BILINEAR2D] = E_(upsample),
    [KILN_OP_GRID_SAMPLE] = E_(grid_sample),
    [KILN_OP_CUMSUM] = E_(cumsum),
    [KILN_OP_ARGMAX] = E_(argmax),
    [KILN_OP_TOPK] = E_(topk),
    [KILN_OP_PAD] = E_(pad),
    [KILN_OP_ARANGE] = E_(arange),
    [KILN_OP_INDEX] = E_(index),
    [KILN_OP_GATHER] = E_(gather),
    [KILN_OP_INDEX_COPY] = E_(index_copy),
    [KILN_OP_EQ] = E_(compare),
    [KILN_OP_NE] = E_(compare),
    [KILN_OP_LT] = E_(compare),
    [KILN_OP_LE] = E_(compare),
    [KILN_OP_GT] = E_(compare),
    [KILN_OP_GE] = E_(compare),
    [KILN_OP_BITWISE_AND] = E_(bitwise),
    [KILN_OP_BITWISE_OR] = E_(bitwise),
    [KILN_OP_BITWISE_XOR] = E_(bitwise),
    [KILN_OP_BITWISE_NOT] = E_(bitwise),
};

static const cpu_op_entry *entry_of(uint32_t op) {
    if (op > KILN_OP_MAX_ID || table[op].run == NULL) return NULL;
    return &table[op];
}

static int is_float(const kiln_tensor *t) { return t != NULL && kiln_dtype_is_float(t->dtype); }

// Why a layer is not supported, or NULL when it is. buf receives formatted detail.
static const char *unsupported_reason(const kiln_kernel_args *args, char *buf, size_t n) {
    const kiln_op_def *def = kiln_op_def_get(args->op);
    const kiln_tensor *y = args->out;
    if (def == NULL || entry_of(args->op) == NULL) return "op not implemented";
    if (y == NULL || !kiln_dtype_valid(y->dtype) || y->rank > KILN_MAX_RANK) return "bad output";
    if (args->n_in < def->min_inputs || args->n_in > def->max_inputs ||
        args->n_in > KILN_MAX_INPUTS) {
        return "wrong number of inputs";
    }
    for (uint32_t i = 0; i < args->n_in; i++) {
        const kiln_tensor *t = args->in[i];
        if (t == NULL) {
            if (i >= 32 || !(def->optional_mask & (1u << i))) return "a required input is missing";
            continue;
        }
        if (!kiln_dtype_valid(t->dtype) || t->rank > KILN_MAX_RANK) return "bad input tensor";
    }
    if (args->op != KILN_OP_CAST && !(def->dtype_mask & KILN_DTYPE_BIT(y->dtype))) {
        snprintf(buf, n, "output dtype %s not in the op's dtypes",
                 kiln_dtype_name((kiln_dtype)y->dtype));
        return buf;
    }
    const kiln_tensor *x = args->in[0];
    switch (args->op) {
    case KILN_OP_LINEAR:
        if (!is_float(x) || !is_float(args->in[1]) || args->in[1]->rank != 2 || x->rank < 1)
            return "linear needs float x of rank >= 1 and a float [N, K] weight";
        if (args->n_in > 2 && args->in[2] && !is_float(args->in[2])) return "bias must be float";
        break;
    case KILN_OP_MATMUL:
        if (!is_float(x) || !is_float(args->in[1]) || x->rank < 1 || args->in[1]->rank < 1)
            return "matmul needs float operands of rank >= 1";
        break;
    case KILN_OP_SELECTIVE_SCAN:
        for (uint32_t i = 0; i < 4; i++) {
            if (args->in[i] == NULL || args->in[i]->dtype != y->dtype || !is_float(args->in[i]))
                return "selective_scan needs a, u, c and h0 of the output's float dtype";
        }
        break;
    case KILN_OP_GATHER_MATMUL:
        if (!is_float(x) || x->rank != 3 || args->in[2]->dtype != x->dtype ||
            args->in[2]->rank != 3 || y->dtype != x->dtype ||
            (args->in[1]->dtype != KILN_DTYPE_I32 && args->in[1]->dtype != KILN_DTYPE_I64))
            return "gather_matmul needs float w [E, M, K] and x [B, K, N] of one dtype and an "
                   "int32/int64 idx [B]";
        break;
    case KILN_OP_CONV2D:
    case KILN_OP_CONV_TRANSPOSE2D:
        if (!is_float(x) || !is_float(args->in[1]) || (x->rank != 3 && x->rank != 4) ||
            args->in[1]->rank != 4 || y->rank != x->rank)
            return "conv needs float [N, C, H, W] (or [C, H, W]) input and a 4-D weight";
        if (args->n_in > 2 && args->in[2] && !is_float(args->in[2])) return "bias must be float";
        break;
    case KILN_OP_BATCH_NORM:
        if (x->rank < 2) return "batch_norm needs rank >= 2";
        for (uint32_t i = 0; i < args->n_in; i++) {
            if (args->in[i] && !is_float(args->in[i])) return "batch_norm inputs must be float";
        }
        break;
    case KILN_OP_MAX_POOL2D:
    case KILN_OP_AVG_POOL2D:
    case KILN_OP_ADAPTIVE_AVG_POOL2D:
        if (!is_float(x) || (x->rank != 3 && x->rank != 4) || y->rank != x->rank)
            return "pooling needs a float rank-3 or rank-4 input";
        break;
    case KILN_OP_EMBEDDING:
        if (!is_float(x) || x->rank != 2) return "embedding weight must be a float [V, D]";
        if (args->in[1]->dtype != KILN_DTYPE_I32 && args->in[1]->dtype != KILN_DTYPE_I64)
            return "embedding indices must be int32 or int64";
        break;
    case KILN_OP_SDPA:
        for (uint32_t i = 0; i < 3; i++) {
            if (!is_float(args->in[i]) || args->in[i]->rank < 2 || args->in[i]->rank > y->rank)
                return "sdpa q, k, v must be float of rank >= 2";
        }
        if (y->rank < 2) return "sdpa output rank < 2";
        if (args->n_in > 3 && args->in[3] && !is_float(args->in[3]) &&
            args->in[3]->dtype != KILN_DTYPE_BOOL)
            return "sdpa mask must be bool or float";
        break;
    case KILN_OP_EQ:
    case KILN_OP_NE:
    case KILN_OP_LT:
    case KILN_OP_LE:
    case KILN_OP_GT:
    case KILN_OP_GE:
    case KILN_OP_BITWISE_AND:
    case KILN_OP_BITWISE_OR:
    case KILN_OP_BITWISE_XOR:
    case KILN_OP_BITWISE_NOT:
        if (!kiln_cpu_logic_supports(args))
            return "operands of one dtype must broadcast to the output (bool for comparisons, "
                   "the inputs' int or bool dtype for bitwise ops)";
        break;
    case KILN_OP_UPSAMPLE_NEAREST2D:
    case KILN_OP_UPSAMPLE_BILINEAR2D:
        if (!is_float(x) || x->rank != 4 || y->rank != 4)
            return "resize needs a float [N, C, H, W]";
        break;
    case KILN_OP_GRID_SAMPLE:
        if (!is_float(x) || x->dtype != y->dtype || args->n_in < 2 || !is_float(args->in[1]))
            return "grid_sample needs a float x, a float grid and x's dtype out";
        break;
    case KILN_OP_CUMSUM:
        if (kiln_cpu_is_int(y->dtype) != kiln_cpu_is_int(x->dtype) || y->dtype == KILN_DTYPE_BOOL)
            return "cumsum keeps its input's float or integer dtype";
        break;
    case KILN_OP_ARGMAX:
        if (y->dtype != KILN_DTYPE_I64 || x->dtype == KILN_DTYPE_BOOL)
            return "argmax takes a float or integer x and gives int64";
        break;
    case KILN_OP_TOPK:
        if (y->dtype != KILN_DTYPE_I64 || x->dtype == KILN_DTYPE_BOOL)
            return "topk takes a float or integer x and gives int64";
        break;
    case KILN_OP_PAD:
        if (x->dtype != y->dtype) return "input and output dtypes differ";
        break;
    case KILN_OP_ARANGE:
        if (y->rank != 1 || y->dtype == KILN_DTYPE_BOOL) return "arange gives a numeric 1-D tensor";
        break;
    case KILN_OP_INDEX_COPY:
        if (args->in[2]->dtype != x->dtype || x->dtype != y->dtype)
            return "x, src and output dtypes differ";
        if (args->in[1]->dtype != KILN_DTYPE_I32 && args->in[1]->dtype != KILN_DTYPE_I64)
            return "the index must be int32 or int64";
        break;
    case KILN_OP_INDEX:
    case KILN_OP_GATHER:
        if (x->dtype != y->dtype) return "input and output dtypes differ";
        for (uint32_t i = 1; i < args->n_in; i++) {
            if (args->in[i]->dtype != KILN_DTYPE_I32 && args->in[i]->dtype != KILN_DTYPE_I64)
                return "indices must be int32 or int64";
        }
        break;
    case KILN_OP_GROUP_NORM:
    case KILN_OP_SOFTMAX:
    case KILN_OP_LOG_SOFTMAX:
    case KILN_OP_LAYER_NORM:
    case KILN_OP_MEAN:
        for (uint32_t i = 0; i < args->n_in; i++) {
            if (args->in[i] && !is_float(args->in[i])) return "inputs must be float";
        }
        break;
    case KILN_OP_RMS_NORM:
        if (!is_float(x) || x->rank < 1 || x->dtype != y->dtype ||
            (args->n_in > 1 && args->in[1] != NULL && !is_float(args->in[1])))
            return "rms_norm needs a float x of rank >= 1, the output in its dtype";
        break;
    case KILN_OP_ROTARY:
        if (!is_float(x) || !is_float(args->in[1]) || !is_float(args->in[2]) || x->rank < 1 ||
            x->dtype != y->dtype || x->dims[x->rank - 1] % 2 != 0 || args->in[1]->rank > x->rank ||
            args->in[2]->rank > x->rank)
            return "rotary needs float x[..., even D] and float cos, sin of rank <= x's";
        break;
    case KILN_OP_VECTOR_NORM:
        if (!is_float(x)) return "vector_norm needs a float input";
        break;
    case KILN_OP_SUM:
        if (kiln_cpu_is_int(y->dtype) && !kiln_cpu_is_int(x->dtype))
            return "an integer sum needs an integer input";
        break;
    case KILN_OP_RESHAPE:
    case KILN_OP_EXPAND:
    case KILN_OP_PERMUTE:
    case KILN_OP_SLICE:
    case KILN_OP_SELECT:
    case KILN_OP_SQUEEZE:
    case KILN_OP_UNSQUEEZE:
        if (x->dtype != y->dtype) return "input and output dtypes differ";
        if (args->op == KILN_OP_EXPAND && !kiln_cpu_eltwise_supports(KILN_OP_COPY, args->in, 1, y))
            return "input does not broadcast to the output shape";
        break;
    case KILN_OP_CAT:
        for (uint32_t i = 0; i < args->n_in; i++) {
            if (args->in[i]->dtype != y->dtype) return "input and output dtypes differ";
        }
        break;
    default: { // elementwise
        int n_el = args->op == KILN_OP_WHERE ? 3 : (def->flags & KILN_OPF_BINARY) ? 2 : 1;
        if (!kiln_cpu_eltwise_supports(args->op, args->in, n_el, y))
            return "operands do not broadcast to the output, or the dtypes are not supported";
        if (args->op != KILN_OP_CAST && kiln_cpu_is_int(y->dtype)) {
            for (int i = args->op == KILN_OP_WHERE ? 1 : 0; i < n_el; i++) {
                if (!kiln_cpu_is_int(args->in[i]->dtype))
                    return "integer outputs need integer inputs";
            }
        }
        break;
    }
    }
    if (args->n_tail > 0 && (args->tail == NULL || !kiln_cpu_tail_supports(args)))
        return "the fused tail is not supported (unknown op, operand shape or dtype)";
    return NULL;
}

int kiln_cpu_supports(const kiln_kernel_args *args) {
    char buf[128];
    return args != NULL && unsupported_reason(args, buf, sizeof buf) == NULL;
}

size_t kiln_cpu_scratch_nbytes(const kiln_kernel_args *args) {
    if (!kiln_cpu_supports(args)) return 0;
    return entry_of(args->op)->scratch(args);
}

kiln_status kiln_cpu_run(const kiln_kernel_args *args) {
    KILN_CHECK(args != NULL && args->out != NULL, KILN_ERR_INVALID_ARG,
               "kiln_cpu_run: args and args->out must not be NULL");
    char buf[128];
    const char *why = unsupported_reason(args, buf, sizeof buf);
    KILN_CHECK(why == NULL, KILN_ERR_UNSUPPORTED, "cpu backend: op %u (%s) with output %s: %s",
               args->op, kiln_op_name(args->op), kiln_dtype_name((kiln_dtype)args->out->dtype),
               why);
    KILN_TRY(entry_of(args->op)->run(args));
    if (args->n_tail > 0) KILN_TRY(kiln_cpu_tail_apply(args));
    return KILN_OK;
}
