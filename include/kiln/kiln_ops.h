// SPDX-License-Identifier: Apache-2.0
// Kiln op table: op ids (file-format ABI: never renumber or reuse), and the query API that lets
// the Python partitioner read names, arities, attribute schemas and supported dtypes from the
// library instead of keeping a copy. The schemas themselves live in src/core/ops.c; the
// semantics of every op are documented in docs/ops.md.
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

// X(NAME, id, "name")
#define KILN_OP_LIST(X)                                                                            \
    X(LINEAR, 1, "linear")                     /* x[..,K], w[N,K], bias?[N] -> x w^T + b      */   \
    X(MATMUL, 2, "matmul")                     /* a[..,M,K], b[..,K,N] (batch broadcast)      */   \
    X(CONV2D, 3, "conv2d")                     /* x[N,C,H,W], w[O,C/g,kh,kw], bias?[O]        */   \
    X(CONV_TRANSPOSE2D, 4, "conv_transpose2d") /* x[N,C,H,W], w[C,O/g,kh,kw], bias?[O]        */   \
    X(BATCH_NORM, 5, "batch_norm")             /* x, weight?, bias?, mean, var (inference)    */   \
    X(RELU, 10, "relu")                                                                            \
    X(GELU, 11, "gelu")                                                                            \
    X(SILU, 12, "silu")                                                                            \
    X(SIGMOID, 13, "sigmoid")                                                                      \
    X(TANH, 14, "tanh")                                                                            \
    X(HARDSWISH, 15, "hardswish")                                                                  \
    X(HARDSIGMOID, 16, "hardsigmoid")                                                              \
    X(NEG, 17, "neg")                                                                              \
    X(SQRT, 18, "sqrt")                                                                            \
    X(RSQRT, 19, "rsqrt")                                                                          \
    X(EXP, 20, "exp")                                                                              \
    X(LOG, 21, "log")                                                                              \
    X(COPY, 22, "copy")   /* clone / identity                             */                       \
    X(CAST, 23, "cast")   /* dtype conversion                             */                       \
    X(CLAMP, 24, "clamp") /* clamp/hardtanh/relu6 (min/max NaN = none)    */                       \
    X(COS, 25, "cos")                                                                              \
    X(SIN, 26, "sin")                                                                              \
    X(ABS, 28, "abs")                                                                              \
    X(ROTARY, 27, "rotary") /* x[..,D], cos, sin: x*cos + rotate(x)*sin (halves/pairs) */          \
    X(ADD, 30, "add")       /* broadcasting binary ops                      */                     \
    X(SUB, 31, "sub")                                                                              \
    X(MUL, 32, "mul")                                                                              \
    X(DIV, 33, "div")                                                                              \
    X(POW, 34, "pow")                                                                              \
    X(WHERE, 35, "where")               /* cond(bool), a, b (broadcasting)              */         \
    X(REMAINDER, 36, "remainder")       /* a - floor(a / b) * b (sign of b, Python %)  */          \
    X(FMOD, 37, "fmod")                 /* C fmod (sign of a)                           */         \
    X(FLOOR_DIVIDE, 38, "floor_divide") /* floor(a / b)                                 */         \
    X(SOFTMAX, 40, "softmax")                                                                      \
    X(LOG_SOFTMAX, 41, "log_softmax")                                                              \
    X(LAYER_NORM, 42, "layer_norm") /* x, weight?, bias?                            */             \
    X(GROUP_NORM, 43, "group_norm") /* x[N,C,..], weight?[C], bias?[C]              */             \
    X(RMS_NORM, 44, "rms_norm")     /* x[..,D], weight?[D] (over the last dim)      */             \
    X(MAX_POOL2D, 50, "max_pool2d")                                                                \
    X(AVG_POOL2D, 51, "avg_pool2d")                                                                \
    X(ADAPTIVE_AVG_POOL2D, 52, "adaptive_avg_pool2d")                                              \
    X(UPSAMPLE_NEAREST2D, 53, "upsample_nearest2d")                                                \
    X(UPSAMPLE_BILINEAR2D, 54, "upsample_bilinear2d")                                              \
    X(MEAN, 60, "mean")                                                                            \
    X(SUM, 61, "sum")                                                                              \
    X(CUMSUM, 62, "cumsum")                                                                        \
    X(VECTOR_NORM, 64, "vector_norm") /* sqrt(sum(x^2)) over dims (the 2-norm)   */                \
    X(ARGMAX, 63, "argmax")           /* x, dim -> int64 index of the first maximum   */           \
    X(RESHAPE, 70, "reshape")                                                                      \
    X(PERMUTE, 71, "permute")                                                                      \
    X(EXPAND, 72, "expand")                                                                        \
    X(CAT, 73, "cat")                                                                              \
    X(SLICE, 74, "slice")                                                                          \
    X(SELECT, 75, "select")                                                                        \
    X(SQUEEZE, 76, "squeeze")                                                                      \
    X(UNSQUEEZE, 77, "unsqueeze")                                                                  \
    X(PAD, 78, "pad")               /* constant padding (negative: crop)            */             \
    X(ARANGE, 79, "arange")         /* like -> [like.dims[dim]]: start + i * step    */            \
    X(EMBEDDING, 80, "embedding")   /* weight[V,D], indices(int) -> [..,D]          */             \
    X(INDEX, 81, "index")           /* x[.., idx0, .., idxk-1, ..] (advanced)        */            \
    X(GATHER, 82, "gather")         /* torch.gather(x, dim, index)                  */             \
    X(INDEX_COPY, 83, "index_copy") /* x, index[n], src: x with rows index[i] = src's i */         \
    X(SDPA, 90, "sdpa")             /* q[..,L,E], k[..,S,E], v[..,S,Ev], mask?      */             \
    X(EQ, 100, "eq")                /* comparisons: bool output                     */             \
    X(NE, 101, "ne")                                                                               \
    X(LT, 102, "lt")                                                                               \
    X(LE, 103, "le")                                                                               \
    X(GT, 104, "gt")                                                                               \
    X(GE, 105, "ge")                                                                               \
    X(BITWISE_AND, 106, "bitwise_and") /* bool: logical; int: bitwise            */                \
    X(BITWISE_OR, 107, "bitwise_or")                                                               \
    X(BITWISE_XOR, 108, "bitwise_xor")                                                             \
    X(BITWISE_NOT, 109, "bitwise_not")                                                             \
    X(MAXIMUM, 110, "maximum") /* elementwise max of a and b (NaN propagates)   */                 \
    X(MINIMUM, 111, "minimum") /* elementwise min of a and b (NaN propagates)   */                 \
    X(SIGN, 112, "sign")       /* -1, 0 or 1 (NaN gives 0, as PyTorch on the CPU) */               \
    X(CEIL, 113, "ceil")                                                                           \
    X(FLOOR, 114, "floor")                                                                         \
    X(ROUND, 115, "round") /* half to even */                                                      \
    X(TRUNC, 116, "trunc")                                                                         \
    X(LOG1P, 117, "log1p") /* log(1 + x), exact near 0 (softplus as exported: Mamba) */            \
    X(TOPK, 118, "topk")   /* int64 indices of the k best along dim, best first  */                \
    X(GATHER_MATMUL, 119, "gather_matmul")   /* y[b] = w[idx[b]] @ x[b]: experts' weights */       \
    X(SELECTIVE_SCAN, 120, "selective_scan") /* h = a_t h + u_t, y_t = h . c_t: Mamba's scan */    \
    X(ERF, 121, "erf") /* the error function (GELU written as x/2 (1 + erf(x/sqrt 2)): ESM) */     \
    X(GRID_SAMPLE, 122, "grid_sample") /* x[N,C,H,W] at grid[N,Ho,Wo,2] -> [N,C,Ho,Wo] */

typedef enum kiln_op {
    KILN_OP_INVALID = 0,
#define KILN_OP_ENUM_(name, id, str) KILN_OP_##name = id,
    KILN_OP_LIST(KILN_OP_ENUM_)
#undef KILN_OP_ENUM_
        KILN_OP_MAX_ID = 127, // ids are < 128
} kiln_op;

// Attribute kinds. Every attribute is a list: scalars are lists of length 1.
typedef enum kiln_attr_kind {
    KILN_ATTR_INTS = 1,   // int64 values
    KILN_ATTR_FLOATS = 2, // float64 values
} kiln_attr_kind;

// Op flags (kiln_op_info.flags).
#define KILN_OPF_UNARY 0x1u     // elementwise, one input
#define KILN_OPF_BINARY 0x2u    // elementwise with broadcasting, two inputs
#define KILN_OPF_TAIL 0x4u      // may be fused as an elementwise tail after a GEMM/conv
#define KILN_OPF_FUSE_HEAD 0x8u // may carry a fused elementwise tail (linear, matmul, conv)
#define KILN_OPF_HEAVY 0x10u    // compute-heavy: runs in the build precision (fp16/bf16)
#define KILN_OPF_VIEW 0x20u     // only moves or reinterprets data (reshape, permute, ...)
#define KILN_OPF_EW_HEAD 0x40u  // may carry a fused elementwise tail as an elementwise op or cat

typedef struct kiln_op_info {
    uint32_t id;
    const char *name;
    uint32_t min_inputs;
    uint32_t max_inputs;    // variadic ops (cat) have a large max
    uint32_t optional_mask; // bit i set: input i may be -1 (absent)
    uint32_t n_outputs;
    uint32_t n_attrs;
    uint32_t dtype_mask; // bit (1 << kiln_dtype) for each supported data dtype
    uint32_t flags;      // KILN_OPF_*
} kiln_op_info;

typedef struct kiln_attr_info {
    const char *name;
    kiln_attr_kind kind;
    int32_t count;      // required number of values, or -1 for any number (>= 0)
    uint32_t n_default; // number of default values; 0 means the attribute is required
    int64_t default_ints[KILN_MAX_RANK];
    double default_floats[KILN_MAX_RANK];
} kiln_attr_info;

// Number of op ids in use, and the i-th of them in increasing order (i < kiln_op_count()).
KILN_API uint32_t kiln_op_count(void);
KILN_API uint32_t kiln_op_id_at(uint32_t index);
// Describes an op; KILN_ERR_INVALID_ARG for an unknown id.
KILN_API kiln_status kiln_op_get_info(uint32_t op, kiln_op_info *out);
// Describes attribute attr_index (< info.n_attrs) of an op.
KILN_API kiln_status kiln_op_get_attr_info(uint32_t op, uint32_t attr_index, kiln_attr_info *out);
// Finds an op by name ("linear"); KILN_ERR_INVALID_ARG if unknown.
KILN_API kiln_status kiln_op_lookup(const char *name, uint32_t *out_op);
// Name of an op id, or "invalid".
KILN_API const char *kiln_op_name(uint32_t op);

#ifdef __cplusplus
}
#endif

#endif // KILN_OPS_H
