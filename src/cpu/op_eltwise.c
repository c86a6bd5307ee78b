// SPDX-License-Identifier: Apache-2.0
// Elementwise ops: unary activations and math (cos and sin included), copy, cast, clamp, the
// broadcasting binary ops, where, rotary embeddings, and the fused tail of GEMM/conv heads. Rows of
// the broadcast iterator are processed in chunks: float32 operands are read in place, other dtypes
// converted through float32 (or int64, for integer outputs) chunk buffers.
#include <math.h>
#include <string.h>

#include "core/ew_math.h"
#include "cpu/cpu_internal.h"

#define CHUNK 256

typedef struct ew_ctx {
    uint32_t op;
    float lo, hi;     // clamp bounds (NaN: none)
    int64_t ilo, ihi; // clamp bounds for integer outputs
    int gelu_tanh;
    int n_in;
    const void *src[3];
    uint32_t sdt[3];
    void *dst;
    uint32_t ddt;
} ew_ctx;

// --- float32 math over contiguous chunks (x may alias y)

static void unary_f32(const ew_ctx *c, const float *x, float *y, int64_t n) {
    switch (c->op) {
    case KILN_OP_RELU:
        for (int64_t i = 0; i < n; i++) { // branch-free; NaN stays NaN, -x * 0 + 0 is +0
            float v = x[i];
            y[i] = v * (float)!(v < 0.0f) + 0.0f;
        }
        break;
    case KILN_OP_GELU:
        if (c->gelu_tanh) {
            const float k = 0.7978845608028654f; // sqrt(2 / pi)
            for (int64_t i = 0; i < n; i++) {
                float v = x[i];
                y[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                float v = x[i];
                y[i] = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
            }
        }
        break;
    case KILN_OP_SILU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
        break;
    case KILN_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case KILN_OP_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
        break;
    case KILN_OP_HARDSWISH:
        for (int64_t i = 0; i < n; i++) {
            float t = x[i] + 3.0f;
            t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
            y[i] = x[i] * t / 6.0f;
        }
        break;
    case KILN_OP_HARDSIGMOID:
        for (int64_t i = 0; i < n; i++) {
            float t = x[i] + 3.0f;
            t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
            y[i] = t / 6.0f;
        }
        break;
    case KILN_OP_NEG:
        for (int64_t i = 0; i < n; i++) y[i] = -x[i];
        break;
    case KILN_OP_SQRT:
        for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
        break;
    case KILN_OP_RSQRT:
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]);
        break;
    case KILN_OP_EXP:
        for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
        break;
    case KILN_OP_LOG:
        for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]);
        break;
    case KILN_OP_LOG1P:
        for (int64_t i = 0; i < n; i++) y[i] = log1pf(x[i]);
        break;
    case KILN_OP_ERF:
        for (int64_t i = 0; i < n; i++) y[i] = erff(x[i]);
        break;
    case KILN_OP_COS:
        for (int64_t i = 0; i < n; i++) y[i] = cosf(x[i]);
        break;
    case KILN_OP_SIN:
        for (int64_t i = 0; i < n; i++) y[i] = sinf(x[i]);
        break;
    case KILN_OP_ABS:
        for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]);
        break;
    case KILN_OP_SIGN:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_sign_f(x[i]);
        break;
    case KILN_OP_CEIL:
        for (int64_t i = 0; i < n; i++) y[i] = ceilf(x[i]);
        break;
    case KILN_OP_FLOOR:
        for (int64_t i = 0; i < n; i++) y[i] = floorf(x[i]);
        break;
    case KILN_OP_ROUND: // half to even in the default rounding mode, like torch.round
        for (int64_t i = 0; i < n; i++) y[i] = nearbyintf(x[i]);
        break;
    case KILN_OP_TRUNC:
        for (int64_t i = 0; i < n; i++) y[i] = truncf(x[i]);
        break;
    case KILN_OP_CLAMP:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (v < c->lo) v = c->lo; // comparisons with a NaN bound are false: no bound
            if (v > c->hi) v = c->hi;
            y[i] = v;
        }
        break;
    default: // copy, cast
        if (y != x) memmove(y, x, (size_t)n * sizeof(float));
        break;
    }
}

static void binary_f32(const ew_ctx *c, const float *a, const float *b, float *y, int64_t n) {
    switch (c->op) {
    case KILN_OP_ADD:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
        break;
    case KILN_OP_SUB:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i];
        break;
    case KILN_OP_MUL:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
        break;
    case KILN_OP_DIV:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i];
        break;
    case KILN_OP_POW:
        for (int64_t i = 0; i < n; i++) y[i] = powf(a[i], b[i]);
        break;
    case KILN_OP_REMAINDER:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_remainder_f(a[i], b[i]);
        break;
    case KILN_OP_FMOD:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_fmod_f(a[i], b[i]);
        break;
    case KILN_OP_FLOOR_DIVIDE:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_floor_divide_f(a[i], b[i]);
        break;
    case KILN_OP_MAXIMUM:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_maximum_f(a[i], b[i]);
        break;
    case KILN_OP_MINIMUM:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_minimum_f(a[i], b[i]);
        break;
    default: break;
    }
}

// --- int64 math (wrapping, like PyTorch's integer tensors)

static void unary_i64(const ew_ctx *c, const int64_t *x, int64_t *y, int64_t n) {
    switch (c->op) {
    case KILN_OP_NEG:
        for (int64_t i = 0; i < n; i++) y[i] = (int64_t)(0u - (uint64_t)x[i]);
        break;
    case KILN_OP_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? 0 : x[i];
        break;
    case KILN_OP_ABS: // wraps at INT64_MIN, like PyTorch
        for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? (int64_t)(0u - (uint64_t)x[i]) : x[i];
        break;
    case KILN_OP_SIGN:
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] > 0) - (x[i] < 0);
        break;
    case KILN_OP_CLAMP:
        for (int64_t i = 0; i < n; i++) {
            int64_t v = x[i];
            if (v < c->ilo) v = c->ilo;
            if (v > c->ihi) v = c->ihi;
            y[i] = v;
        }
        break;
    default:
        if (y != x) memmove(y, x, (size_t)n * sizeof(int64_t));
        break;
    }
}

static void binary_i64(const ew_ctx *c, const int64_t *a, const int64_t *b, int64_t *y, int64_t n) {
    switch (c->op) {
    case KILN_OP_ADD:
        for (int64_t i = 0; i < n; i++) y[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
        break;
    case KILN_OP_SUB:
        for (int64_t i = 0; i < n; i++) y[i] = (int64_t)((uint64_t)a[i] - (uint64_t)b[i]);
        break;
    case KILN_OP_MUL:
        for (int64_t i = 0; i < n; i++) y[i] = (int64_t)((uint64_t)a[i] * (uint64_t)b[i]);
        break;
    case KILN_OP_REMAINDER:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_remainder_i(a[i], b[i]);
        break;
    case KILN_OP_FMOD:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_fmod_i(a[i], b[i]);
        break;
    case KILN_OP_FLOOR_DIVIDE:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_floor_divide_i(a[i], b[i]);
        break;
    case KILN_OP_MAXIMUM:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] > b[i] ? a[i] : b[i];
        break;
    case KILN_OP_MINIMUM:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] < b[i] ? a[i] : b[i];
        break;
    default: break;
    }
}

// --- rows

static void row_f32(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const ew_ctx *c = (const ew_ctx *)vctx;
    float buf[4][CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        const float *x[3] = {NULL, NULL, NULL};
        for (int k = 0; k < c->n_in; k++) {
            int64_t off = offs[k + 1] + i0 * inner[k + 1];
            if (c->sdt[k] == KILN_DTYPE_F32 && inner[k + 1] == 1) {
                x[k] = (const float *)c->src[k] + off;
            } else {
                kiln_cpu_load_f32(c->src[k], c->sdt[k], off, inner[k + 1], m, buf[k]);
                x[k] = buf[k];
            }
        }
        float *y = c->ddt == KILN_DTYPE_F32 ? (float *)c->dst + offs[0] + i0 : buf[3];
        if (c->op == KILN_OP_WHERE) {
            for (int64_t i = 0; i < m; i++) y[i] = x[0][i] != 0.0f ? x[1][i] : x[2][i];
        } else if (c->n_in == 2) {
            binary_f32(c, x[0], x[1], y, m);
        } else {
            unary_f32(c, x[0], y, m);
        }
        if (c->ddt != KILN_DTYPE_F32) kiln_cpu_store_f32(c->dst, c->ddt, offs[0] + i0, m, y);
    }
}

static void row_i64(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const ew_ctx *c = (const ew_ctx *)vctx;
    int64_t buf[4][CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (int k = 0; k < c->n_in; k++) {
            kiln_cpu_load_i64(c->src[k], c->sdt[k], offs[k + 1] + i0 * inner[k + 1], inner[k + 1],
                              m, buf[k]);
        }
        int64_t *y = buf[3];
        if (c->op == KILN_OP_WHERE) {
            for (int64_t i = 0; i < m; i++) y[i] = buf[0][i] != 0 ? buf[1][i] : buf[2][i];
        } else if (c->n_in == 2) {
            binary_i64(c, buf[0], buf[1], y, m);
        } else {
            unary_i64(c, buf[0], y, m);
        }
        kiln_cpu_store_i64(c->dst, c->ddt, offs[0] + i0, m, y);
    }
}

// Same-dtype elementwise copies move bytes (exact for every dtype, NaN payloads included).
static void row_bytes(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const ew_ctx *c = (const ew_ctx *)vctx;
    size_t es = kiln_dtype_size((kiln_dtype)c->ddt);
    const uint8_t *s = (const uint8_t *)c->src[0] + (size_t)offs[1] * es;
    uint8_t *d = (uint8_t *)c->dst + (size_t)offs[0] * es;
    if (inner[1] == 1) {
        if (d != s) memmove(d, s, (size_t)n * es);
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * es, s + (size_t)(i * inner[1]) * es, es);
}

static int n_inputs_of(uint32_t op) {
    const kiln_op_def *d = kiln_op_def_get(op);
    if (d == NULL) return -1;
    if (op == KILN_OP_WHERE) return 3;
    if (d->flags & KILN_OPF_UNARY) return 1;
    if (d->flags & KILN_OPF_BINARY) return 2;
    return -1;
}

// Elementwise ops defined on integer tensors: those whose table entry (core/ops.c) admits int32
// and int64 (PyTorch's integer rules in core/ew_math.h).
static int int_capable(uint32_t op) {
    const kiln_op_def *d = kiln_op_def_get(op);
    return d != NULL && (d->dtype_mask & KILN_DTYPE_BIT(KILN_DTYPE_I64)) != 0;
}

int kiln_cpu_eltwise_supports(uint32_t op, const kiln_tensor *const *ins, int n_in,
                              const kiln_tensor *out) {
    if (n_inputs_of(op) != n_in || n_in > 3) return 0;
    if (!kiln_dtype_valid(out->dtype)) return 0;
    for (int i = 0; i < n_in; i++) {
        if (ins[i] == NULL || !kiln_dtype_valid(ins[i]->dtype)) return 0;
        if (ins[i]->rank > out->rank) return 0;
        // Broadcasting: each input dim is 1 or equal to the output's.
        for (uint32_t d = 0; d < ins[i]->rank; d++) {
            int64_t id = ins[i]->dims[d], od = out->dims[out->rank - ins[i]->rank + d];
            if (id != 1 && id != od) return 0;
        }
    }
    if (op == KILN_OP_CAST || op == KILN_OP_COPY) return 1;
    if (kiln_cpu_is_int(out->dtype)) {
        if (!int_capable(op)) return 0;
        if (out->dtype == KILN_DTYPE_BOOL && op != KILN_OP_WHERE) return 0;
    }
    return 1;
}

kiln_status kiln_cpu_eltwise(uint32_t op, const kiln_attrs *attrs, const kiln_tensor *const *ins,
                             int n_in, const kiln_tensor *out) {
    KILN_CHECK(kiln_cpu_eltwise_supports(op, ins, n_in, out), KILN_ERR_UNSUPPORTED,
               "cpu backend: elementwise op %s does not support these operands (output %s, "
               "%d inputs)",
               kiln_op_name(op), kiln_dtype_name((kiln_dtype)out->dtype), n_in);
    ew_ctx c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.n_in = n_in;
    c.dst = out->data;
    c.ddt = out->dtype;
    for (int i = 0; i < n_in; i++) {
        c.src[i] = ins[i]->data;
        c.sdt[i] = ins[i]->dtype;
    }
    if (op == KILN_OP_GELU) c.gelu_tanh = kiln_attrs_int(attrs, KILN_A_GELU_APPROXIMATE, 0) != 0;
    if (op == KILN_OP_CLAMP) {
        double lo = kiln_attrs_float(attrs, KILN_A_CLAMP_MIN, 0);
        double hi = kiln_attrs_float(attrs, KILN_A_CLAMP_MAX, 0);
        c.lo = (float)lo;
        c.hi = (float)hi;
        // Integer outputs: the smallest integer >= min and the largest <= max.
        c.ilo =
            isnan(lo) || lo < -9.2e18 ? INT64_MIN : (lo > 9.2e18 ? INT64_MAX : (int64_t)ceil(lo));
        c.ihi =
            isnan(hi) || hi > 9.2e18 ? INT64_MAX : (hi < -9.2e18 ? INT64_MIN : (int64_t)floor(hi));
    }
    kiln_cpu_iter it;
    kiln_cpu_iter_init(&it, out, ins, n_in);
    int out_int = kiln_cpu_is_int(out->dtype);
    if ((op == KILN_OP_COPY || op == KILN_OP_CAST) && ins[0]->dtype == out->dtype) {
        kiln_cpu_iter_run(&it, row_bytes, &c);
    } else if (op == KILN_OP_CAST && out->dtype == KILN_DTYPE_BOOL &&
               kiln_dtype_is_float(ins[0]->dtype)) {
        kiln_cpu_iter_run(&it, row_f32, &c); // 0.5 -> true: compare as float, not truncated
    } else if (out_int) {
        kiln_cpu_iter_run(&it, row_i64, &c);
    } else {
        kiln_cpu_iter_run(&it, row_f32, &c);
    }
    return KILN_OK;
}

// --- entry points

kiln_status kiln_cpu_unary(const kiln_kernel_args *args) {
    KILN_CHECK(args->n_in >= 1 && args->in[0] != NULL, KILN_ERR_INVALID_ARG,
               "cpu %s: missing input 0", kiln_op_name(args->op));
    return kiln_cpu_eltwise(args->op, &args->attrs, args->in, 1, args->out);
}
size_t kiln_cpu_unary_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_binary(const kiln_kernel_args *args) {
    int n = args->op == KILN_OP_WHERE ? 3 : 2;
    KILN_CHECK(args->n_in >= (uint32_t)n, KILN_ERR_INVALID_ARG, "cpu %s: needs %d inputs, got %u",
               kiln_op_name(args->op), n, args->n_in);
    for (int i = 0; i < n; i++) {
        KILN_CHECK(args->in[i] != NULL, KILN_ERR_INVALID_ARG, "cpu %s: input %d is missing",
                   kiln_op_name(args->op), i);
    }
    return kiln_cpu_eltwise(args->op, &args->attrs, args->in, n, args->out);
}
size_t kiln_cpu_binary_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

// --- fused tail

int kiln_cpu_tail_supports(const kiln_kernel_args *args) {
    for (uint32_t t = 0; t < args->n_tail; t++) {
        const kiln_tail_op *tl = &args->tail[t];
        const kiln_tensor *ins[2] = {args->out, tl->operand};
        int n = n_inputs_of(tl->op);
        if (n == 2) {
            if (tl->operand == NULL) return 0;
            if (!tl->running_is_lhs) {
                ins[0] = tl->operand;
                ins[1] = args->out;
            }
        } else if (n != 1) {
            return 0;
        }
        if (!kiln_cpu_eltwise_supports(tl->op, ins, n, args->out)) return 0;
        if (tl->op == KILN_OP_CAST) return 0; // a tail keeps the head's dtype
    }
    return 1;
}

kiln_status kiln_cpu_tail_apply(const kiln_kernel_args *args) {
    for (uint32_t t = 0; t < args->n_tail; t++) {
        const kiln_tail_op *tl = &args->tail[t];
        const kiln_tensor *ins[2] = {args->out, tl->operand};
        int n = n_inputs_of(tl->op);
        KILN_CHECK(n == 1 || (n == 2 && tl->operand != NULL), KILN_ERR_UNSUPPORTED,
                   "cpu backend: tail op %u (%s) of %s is not a unary or binary elementwise op "
                   "with its operand",
                   t, kiln_op_name(tl->op), kiln_op_name(args->op));
        if (n == 2 && !tl->running_is_lhs) {
            ins[0] = tl->operand;
            ins[1] = args->out;
        }
        KILN_TRY(kiln_cpu_eltwise(tl->op, &tl->attrs, ins, n, args->out));
    }
    return KILN_OK;
}

// --- rotary: y[.., i] = x[i] cos[i] + (i < D/2 ? -x[i + D/2] : x[i - D/2]) sin[i] over the last
// dim (transformers' q * cos + rotate_half(q) * sin), cos and sin broadcast to x (x's dtype or
// float32), float32 math, one rounding to y's dtype. Tables over R < D dims rotate x's first R
// that way (R in place of D) and copy the rest (kiln_rotary_dims). Interleaved (attribute 1),
// the pair of element 2i is 2i + 1 (rotate_every_two: y[2i] = x[2i] cos[2i] - x[2i+1] sin[2i],
// y[2i+1] = x[2i+1] cos[2i+1] + x[2i] sin[2i+1]).

size_t kiln_cpu_rotary_scratch(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    int64_t d = x->rank > 0 ? x->dims[x->rank - 1] : 0;
    return KILN_CPU_SCRATCH_SLACK + 4 * kiln_cpu_f32_nbytes(d);
}

kiln_status kiln_cpu_rotary(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *cs = args->in[1], *sn = args->in[2];
    kiln_tensor *y = args->out;
    KILN_CHECK(x->rank >= 1 && x->dims[x->rank - 1] % 2 == 0 && cs->rank <= x->rank &&
                   sn->rank <= x->rank,
               KILN_ERR_INVALID_ARG,
               "cpu rotary: needs x[..., D] with D even, cos/sin of rank "
               "at most x's");
    const int64_t d = x->dims[x->rank - 1], numel = kiln_tensor_numel(x);
    const int inter = kiln_attrs_int(&args->attrs, KILN_A_ROTARY_INTERLEAVED, 0) != 0;
    const int64_t rd = kiln_rotary_dims(cs->rank ? cs->dims[cs->rank - 1] : 1, d), h = rd / 2;
    int64_t cstr[KILN_MAX_RANK], sstr[KILN_MAX_RANK];
    kiln_tensor xr_shape = *x; // the rotated part, which the tables broadcast to
    xr_shape.dims[x->rank - 1] = rd;
    KILN_CHECK(rd % 2 == 0 && rd <= d &&
                   kiln_rotary_dims(sn->rank ? sn->dims[sn->rank - 1] : 1, d) == rd &&
                   kiln_broadcast_strides(cs, &xr_shape, cstr) &&
                   kiln_broadcast_strides(sn, &xr_shape, sstr),
               KILN_ERR_INVALID_ARG,
               "cpu rotary: cos and sin must broadcast to x, or both to its first R (even) dims");
    if (d == 0 || numel == 0) return KILN_OK;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *xr = kiln_cpu_scratch_f32(&s, d, "rotary x");
    float *cr = kiln_cpu_scratch_f32(&s, d, "rotary cos");
    float *sr = kiln_cpu_scratch_f32(&s, d, "rotary sin");
    float *yr = kiln_cpu_scratch_f32(&s, d, "rotary y");
    if (xr == NULL || cr == NULL || sr == NULL || yr == NULL) return KILN_ERR_INTERNAL;
    for (int64_t r = 0; r < numel / d; r++) {
        // offsets of this row in cos and sin: r decomposed over x's leading dims
        int64_t co = 0, so = 0, rem = r;
        for (uint32_t k = x->rank - 1; k-- > 0;) {
            int64_t i = rem % x->dims[k];
            rem /= x->dims[k];
            co += i * cstr[k];
            so += i * sstr[k];
        }
        kiln_cpu_load_f32(x->data, x->dtype, r * d, 1, d, xr);
        kiln_cpu_load_f32(cs->data, cs->dtype, co, cstr[x->rank - 1], rd, cr);
        kiln_cpu_load_f32(sn->data, sn->dtype, so, sstr[x->rank - 1], rd, sr);
        for (int64_t i = 0; i < h; i++) {
            const int64_t p = inter ? 2 * i : i, q = inter ? 2 * i + 1 : i + h;
            yr[p] = xr[p] * cr[p] - xr[q] * sr[p];
            yr[q] = xr[q] * cr[q] + xr[p] * sr[q];
        }
        for (int64_t i = rd; i < d; i++) yr[i] = xr[i];
        kiln_cpu_store_f32(y->data, y->dtype, r * d, d, yr);
    }
    return KILN_OK;
}
