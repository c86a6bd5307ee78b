// SPDX-License-Identifier: Apache-2.0
// The op table: one entry per op id with arity, optional inputs, supported data dtypes, flags and
// the attribute schema. This is the single source the builder, the loader, the backends and the
// Python partitioner (through kiln_op_get_info) read.
#include <math.h>
#include <string.h>

#include "core/ops.h"
#include "core/status.h"

#define F_                                                                                         \
    (KILN_DTYPE_BIT(KILN_DTYPE_F32) | KILN_DTYPE_BIT(KILN_DTYPE_F16) |                             \
     KILN_DTYPE_BIT(KILN_DTYPE_BF16))
#define I_ (KILN_DTYPE_BIT(KILN_DTYPE_I32) | KILN_DTYPE_BIT(KILN_DTYPE_I64))
#define ALL_ (F_ | I_ | KILN_DTYPE_BIT(KILN_DTYPE_BOOL))

// Attribute schema helpers: INTS(name, count) required; INTS_D(name, count, defaults...).
#define A_INTS(nm, cnt)                                                                            \
    { .name = nm, .kind = KILN_ATTR_INTS, .count = cnt, .n_default = 0 }
#define A_INTS_D(nm, cnt, nd, ...)                                                                 \
    {                                                                                              \
        .name = nm, .kind = KILN_ATTR_INTS, .count = cnt, .n_default = nd, .default_ints = {       \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }
#define A_FLOATS_D2(nm, v0, v1)                                                                    \
    {                                                                                              \
        .name = nm, .kind = KILN_ATTR_FLOATS, .count = 2, .n_default = 2, .default_floats = {      \
            v0,                                                                                    \
            v1                                                                                     \
        }                                                                                          \
    }
#define A_FLOAT_D(nm, v)                                                                           \
    {                                                                                              \
        .name = nm, .kind = KILN_ATTR_FLOATS, .count = 1, .n_default = 1, .default_floats = { v }  \
    }

#define UNARY(ID, NAME, MASK, FLAGS)                                                               \
    {                                                                                              \
        .id = KILN_OP_##ID, .name = NAME, .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,        \
        .dtype_mask = MASK, .flags = KILN_OPF_UNARY | (FLAGS)                                      \
    }
#define B_ (KILN_DTYPE_BIT(KILN_DTYPE_BOOL))
#define BINARY(ID, NAME, MASK, FLAGS)                                                              \
    {                                                                                              \
        .id = KILN_OP_##ID, .name = NAME, .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,        \
        .dtype_mask = MASK, .flags = KILN_OPF_BINARY | (FLAGS)                                     \
    }

static const kiln_op_def ops[] = {
    {.id = KILN_OP_LINEAR,
     .name = "linear",
     .min_inputs = 2,
     .max_inputs = 3,
     .optional_mask = 1u << 2,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_FUSE_HEAD | KILN_OPF_HEAVY},
    {.id = KILN_OP_MATMUL,
     .name = "matmul",
     .min_inputs = 2,
     .max_inputs = 2,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_FUSE_HEAD | KILN_OPF_HEAVY},
    {.id = KILN_OP_GATHER_MATMUL,
     .name = "gather_matmul",
     .min_inputs = 3,
     .max_inputs = 3,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_HEAVY},
    {.id = KILN_OP_SELECTIVE_SCAN,
     .name = "selective_scan",
     .min_inputs = 4,
     .max_inputs = 4,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_HEAVY},
    {.id = KILN_OP_CONV2D,
     .name = "conv2d",
     .min_inputs = 2,
     .max_inputs = 3,
     .optional_mask = 1u << 2,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_FUSE_HEAD | KILN_OPF_HEAVY,
     .n_attrs = 4,
     .attrs = {A_INTS_D("stride", 2, 2, 1, 1), A_INTS_D("padding", 2, 2, 0, 0),
               A_INTS_D("dilation", 2, 2, 1, 1), A_INTS_D("groups", 1, 1, 1)}},
    {.id = KILN_OP_CONV_TRANSPOSE2D,
     .name = "conv_transpose2d",
     .min_inputs = 2,
     .max_inputs = 3,
     .optional_mask = 1u << 2,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_FUSE_HEAD | KILN_OPF_HEAVY,
     .n_attrs = 5,
     .attrs = {A_INTS_D("stride", 2, 2, 1, 1), A_INTS_D("padding", 2, 2, 0, 0),
               A_INTS_D("output_padding", 2, 2, 0, 0), A_INTS_D("dilation", 2, 2, 1, 1),
               A_INTS_D("groups", 1, 1, 1)}},
    {.id = KILN_OP_BATCH_NORM,
     .name = "batch_norm",
     .min_inputs = 5,
     .max_inputs = 5,
     .optional_mask = (1u << 1) | (1u << 2),
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 1,
     .attrs = {A_FLOAT_D("eps", 1e-5)}},

    UNARY(RELU, "relu", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    {.id = KILN_OP_GELU,
     .name = "gelu",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_UNARY | KILN_OPF_TAIL | KILN_OPF_EW_HEAD,
     .n_attrs = 1,
     .attrs = {A_INTS_D("approximate", 1, 1, 0)}},
    UNARY(SILU, "silu", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    UNARY(SIGMOID, "sigmoid", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    UNARY(TANH, "tanh", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    UNARY(HARDSWISH, "hardswish", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    UNARY(HARDSIGMOID, "hardsigmoid", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    UNARY(NEG, "neg", F_ | I_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    UNARY(SQRT, "sqrt", F_, 0),
    UNARY(RSQRT, "rsqrt", F_, 0),
    UNARY(EXP, "exp", F_, 0),
    UNARY(LOG, "log", F_, 0),
    UNARY(LOG1P, "log1p", F_, 0),
    UNARY(ERF, "erf", F_, 0),
    UNARY(COPY, "copy", ALL_, KILN_OPF_VIEW),
    {.id = KILN_OP_CAST,
     .name = "cast",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_UNARY,
     .n_attrs = 1,
     .attrs = {A_INTS("dtype", 1)}},
    {.id = KILN_OP_CLAMP,
     .name = "clamp",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_ | I_,
     .flags = KILN_OPF_UNARY | KILN_OPF_TAIL | KILN_OPF_EW_HEAD,
     .n_attrs = 2,
     .attrs = {A_FLOAT_D("min", NAN), A_FLOAT_D("max", NAN)}},
    UNARY(COS, "cos", F_, 0),
    UNARY(SIN, "sin", F_, 0),
    UNARY(ABS, "abs", F_ | I_, 0),
    // sign and rounding (on ints: sign as usual, the roundings copy)
    UNARY(SIGN, "sign", F_ | I_, 0),
    UNARY(CEIL, "ceil", F_ | I_, 0),
    UNARY(FLOOR, "floor", F_ | I_, 0),
    UNARY(ROUND, "round", F_ | I_, 0),
    UNARY(TRUNC, "trunc", F_ | I_, 0),
    // rotary: x, cos, sin (cos and sin each of x's dtype or float32, broadcasting to x); the
    // pairs rotated: halves (0) or neighbours (1)
    {.id = KILN_OP_ROTARY,
     .name = "rotary",
     .min_inputs = 3,
     .max_inputs = 3,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 1,
     .attrs = {A_INTS_D("interleaved", 1, 1, 0)}},

    BINARY(ADD, "add", F_ | I_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    BINARY(SUB, "sub", F_ | I_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    BINARY(MUL, "mul", F_ | I_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    BINARY(DIV, "div", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    BINARY(POW, "pow", F_, KILN_OPF_TAIL | KILN_OPF_EW_HEAD),
    BINARY(REMAINDER, "remainder", F_ | I_, 0),
    BINARY(FMOD, "fmod", F_ | I_, 0),
    BINARY(FLOOR_DIVIDE, "floor_divide", F_ | I_, 0),
    BINARY(MAXIMUM, "maximum", F_ | I_, 0),
    BINARY(MINIMUM, "minimum", F_ | I_, 0),
    {.id = KILN_OP_WHERE,
     .name = "where",
     .min_inputs = 3,
     .max_inputs = 3,
     .n_outputs = 1,
     .dtype_mask = ALL_},

    {.id = KILN_OP_SOFTMAX,
     .name = "softmax",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 1,
     .attrs = {A_INTS("dim", 1)}},
    {.id = KILN_OP_LOG_SOFTMAX,
     .name = "log_softmax",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 1,
     .attrs = {A_INTS("dim", 1)}},
    {.id = KILN_OP_LAYER_NORM,
     .name = "layer_norm",
     .min_inputs = 1,
     .max_inputs = 3,
     .optional_mask = (1u << 1) | (1u << 2),
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 2,
     .attrs = {A_INTS("normalized_ndim", 1), A_FLOAT_D("eps", 1e-5)}},
    {.id = KILN_OP_GROUP_NORM,
     .name = "group_norm",
     .min_inputs = 1,
     .max_inputs = 3,
     .optional_mask = (1u << 1) | (1u << 2),
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 2,
     .attrs = {A_INTS("groups", 1), A_FLOAT_D("eps", 1e-5)}},
    {.id = KILN_OP_RMS_NORM,
     .name = "rms_norm",
     .min_inputs = 1,
     .max_inputs = 2,
     .optional_mask = 1u << 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 1,
     .attrs = {A_FLOAT_D("eps", 1e-6)}},

    {.id = KILN_OP_MAX_POOL2D,
     .name = "max_pool2d",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 5,
     .attrs = {A_INTS("kernel", 2), A_INTS("stride", 2), A_INTS_D("padding", 2, 2, 0, 0),
               A_INTS_D("dilation", 2, 2, 1, 1), A_INTS_D("ceil_mode", 1, 1, 0)}},
    {.id = KILN_OP_AVG_POOL2D,
     .name = "avg_pool2d",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 6,
     .attrs = {A_INTS("kernel", 2), A_INTS("stride", 2), A_INTS_D("padding", 2, 2, 0, 0),
               A_INTS_D("ceil_mode", 1, 1, 0), A_INTS_D("count_include_pad", 1, 1, 1),
               A_INTS_D("divisor_override", 1, 1, 0)}},
    {.id = KILN_OP_ADAPTIVE_AVG_POOL2D,
     .name = "adaptive_avg_pool2d",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 1,
     .attrs = {A_INTS("output_size", 2)}},
    {.id = KILN_OP_UPSAMPLE_NEAREST2D,
     .name = "upsample_nearest2d",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 2,
     .attrs = {A_INTS("output_size", 2), A_FLOATS_D2("scales", NAN, NAN)}},
    {.id = KILN_OP_UPSAMPLE_BILINEAR2D,
     .name = "upsample_bilinear2d",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 3,
     .attrs = {A_INTS("output_size", 2), A_FLOATS_D2("scales", NAN, NAN),
               A_INTS_D("align_corners", 1, 1, 0)}},
    {.id = KILN_OP_GRID_SAMPLE,
     .name = "grid_sample",
     .min_inputs = 2,
     .max_inputs = 2,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 3,
     .attrs = {A_INTS_D("mode", 1, 1, 0), A_INTS_D("padding_mode", 1, 1, 0),
               A_INTS_D("align_corners", 1, 1, 0)}},

    {.id = KILN_OP_MEAN,
     .name = "mean",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 2,
     .attrs = {A_INTS("dims", -1), A_INTS_D("keepdim", 1, 1, 0)}},
    {.id = KILN_OP_SUM,
     .name = "sum",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_ | I_,
     .n_attrs = 2,
     .attrs = {A_INTS("dims", -1), A_INTS_D("keepdim", 1, 1, 0)}},
    {.id = KILN_OP_VECTOR_NORM,
     .name = "vector_norm",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_,
     .n_attrs = 2,
     .attrs = {A_INTS("dims", -1), A_INTS_D("keepdim", 1, 1, 0)}},
    {.id = KILN_OP_CUMSUM,
     .name = "cumsum",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_ | I_,
     .n_attrs = 1,
     .attrs = {A_INTS("dim", 1)}},
    {.id = KILN_OP_ARGMAX,
     .name = "argmax",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_ | I_,
     .n_attrs = 2,
     .attrs = {A_INTS("dim", 1), A_INTS_D("keepdim", 1, 1, 0)}},
    {.id = KILN_OP_TOPK,
     .name = "topk",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = F_ | I_,
     .n_attrs = 3,
     .attrs = {A_INTS("dim", 1), A_INTS("k", 1), A_INTS_D("largest", 1, 1, 1)}},

    {.id = KILN_OP_RESHAPE,
     .name = "reshape",
     .min_inputs = 1,
     .max_inputs = 2,
     .optional_mask = 1u << 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 1,
     .attrs = {A_INTS("shape", -1)}},
    {.id = KILN_OP_PERMUTE,
     .name = "permute",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 1,
     .attrs = {A_INTS("dims", -1)}},
    {.id = KILN_OP_EXPAND,
     .name = "expand",
     .min_inputs = 1,
     .max_inputs = 2,
     .optional_mask = 1u << 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 1,
     .attrs = {A_INTS("shape", -1)}},
    {.id = KILN_OP_CAT,
     .name = "cat",
     .min_inputs = 1,
     .max_inputs = KILN_MAX_INPUTS,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW | KILN_OPF_EW_HEAD,
     .n_attrs = 1,
     .attrs = {A_INTS("dim", 1)}},
    {.id = KILN_OP_SLICE,
     .name = "slice",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 4,
     .attrs = {A_INTS("dim", 1), A_INTS_D("start", 1, 1, 0), A_INTS_D("end", 1, 1, INT64_MAX),
               A_INTS_D("step", 1, 1, 1)}},
    {.id = KILN_OP_SELECT,
     .name = "select",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 2,
     .attrs = {A_INTS("dim", 1), A_INTS("index", 1)}},
    {.id = KILN_OP_SQUEEZE,
     .name = "squeeze",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 1,
     .attrs = {A_INTS("dims", -1)}},
    {.id = KILN_OP_UNSQUEEZE,
     .name = "unsqueeze",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .flags = KILN_OPF_VIEW,
     .n_attrs = 1,
     .attrs = {A_INTS("dim", 1)}},
    {.id = KILN_OP_PAD,
     .name = "pad",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .n_attrs = 2,
     .attrs = {A_INTS("pads", -1), A_FLOAT_D("value", 0.0)}},
    {.id = KILN_OP_ARANGE,
     .name = "arange",
     .min_inputs = 1,
     .max_inputs = 1,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .n_attrs = 4,
     .attrs = {A_INTS("dim", 1), A_FLOAT_D("start", 0.0), A_FLOAT_D("step", 1.0),
               A_INTS("dtype", 1)}},

    {.id = KILN_OP_EMBEDDING,
     .name = "embedding",
     .min_inputs = 2,
     .max_inputs = 2,
     .n_outputs = 1,
     .dtype_mask = F_},
    {.id = KILN_OP_INDEX,
     .name = "index",
     .min_inputs = 2,
     .max_inputs = 1 + KILN_MAX_RANK,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .n_attrs = 2,
     .attrs = {A_INTS_D("dim", 1, 1, 0), A_INTS_D("wrap", 1, 1, 1)}},
    {.id = KILN_OP_GATHER,
     .name = "gather",
     .min_inputs = 2,
     .max_inputs = 2,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .n_attrs = 1,
     .attrs = {A_INTS("dim", 1)}},
    {.id = KILN_OP_INDEX_COPY,
     .name = "index_copy",
     .min_inputs = 3,
     .max_inputs = 3,
     .n_outputs = 1,
     .dtype_mask = ALL_,
     .n_attrs = 2,
     .attrs = {A_INTS("dim", 1), A_INTS_D("wrap", 1, 1, 0)}},
    {.id = KILN_OP_SDPA,
     .name = "sdpa",
     .min_inputs = 3,
     .max_inputs = 4,
     .optional_mask = 1u << 3,
     .n_outputs = 1,
     .dtype_mask = F_,
     .flags = KILN_OPF_HEAVY,
     .n_attrs = 2,
     .attrs = {A_INTS_D("is_causal", 1, 1, 0), A_FLOAT_D("scale", NAN)}},

    // comparisons: inputs of one dtype (any), bool output; bitwise ops: bool (logical) or int
    BINARY(EQ, "eq", ALL_, 0),
    BINARY(NE, "ne", ALL_, 0),
    BINARY(LT, "lt", ALL_, 0),
    BINARY(LE, "le", ALL_, 0),
    BINARY(GT, "gt", ALL_, 0),
    BINARY(GE, "ge", ALL_, 0),
    BINARY(BITWISE_AND, "bitwise_and", I_ | B_, 0),
    BINARY(BITWISE_OR, "bitwise_or", I_ | B_, 0),
    BINARY(BITWISE_XOR, "bitwise_xor", I_ | B_, 0),
    UNARY(BITWISE_NOT, "bitwise_not", I_ | B_, 0),
};

#define N_OPS (sizeof ops / sizeof ops[0])

// Every id of KILN_OP_LIST has an entry (checked once, in kiln_op_count's test).
static const kiln_op_def *by_id[KILN_OP_MAX_ID + 1];
static int by_id_ready;

static void index_ops(void) {
    // Idempotent and race-benign: every thread writes the same values.
    if (by_id_ready) return;
    for (size_t i = 0; i < N_OPS; i++) by_id[ops[i].id] = &ops[i];
    by_id_ready = 1;
}

const kiln_op_def *kiln_op_def_get(uint32_t op) {
    index_ops();
    return op <= KILN_OP_MAX_ID ? by_id[op] : NULL;
}

uint32_t kiln_op_count(void) { return (uint32_t)N_OPS; }

uint32_t kiln_op_id_at(uint32_t index) { return index < N_OPS ? ops[index].id : 0; }

kiln_status kiln_op_get_info(uint32_t op, kiln_op_info *out) {
    const kiln_op_def *d = kiln_op_def_get(op);
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_op_get_info: out is NULL");
    KILN_CHECK(d != NULL, KILN_ERR_INVALID_ARG, "unknown op id %u", op);
    out->id = d->id;
    out->name = d->name;
    out->min_inputs = d->min_inputs;
    out->max_inputs = d->max_inputs;
    out->optional_mask = d->optional_mask;
    out->n_outputs = d->n_outputs;
    out->n_attrs = d->n_attrs;
    out->dtype_mask = d->dtype_mask;
    out->flags = d->flags;
    return KILN_OK;
}

kiln_status kiln_op_get_attr_info(uint32_t op, uint32_t attr_index, kiln_attr_info *out) {
    const kiln_op_def *d = kiln_op_def_get(op);
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_op_get_attr_info: out is NULL");
    KILN_CHECK(d != NULL, KILN_ERR_INVALID_ARG, "unknown op id %u", op);
    KILN_CHECK(attr_index < d->n_attrs, KILN_ERR_INVALID_ARG,
               "op %s has %u attributes; index %u is out of range", d->name, d->n_attrs,
               attr_index);
    *out = d->attrs[attr_index];
    return KILN_OK;
}

kiln_status kiln_op_lookup(const char *name, uint32_t *out_op) {
    KILN_CHECK(name != NULL && out_op != NULL, KILN_ERR_INVALID_ARG,
               "kiln_op_lookup: name and out_op must not be NULL");
    for (size_t i = 0; i < N_OPS; i++) {
        if (strcmp(ops[i].name, name) == 0) {
            *out_op = ops[i].id;
            return KILN_OK;
        }
    }
    return kiln_fail(KILN_ERR_INVALID_ARG, "unknown op name '%s'", name);
}

const char *kiln_op_name(uint32_t op) {
    const kiln_op_def *d = kiln_op_def_get(op);
    return d ? d->name : "invalid";
}
