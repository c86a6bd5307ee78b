// SPDX-License-Identifier: Apache-2.0
// Elementwise ops (unary activations and math with cos and sin, copy, cast, clamp, the
// broadcasting binary ops, where) and the fused elementwise tail of GEMM/conv heads, all through
// one "program" kernel: out[i] = step_n(...step_1(load(operand0, i))...), each binary step reading
// one more operand broadcast to out (numpy rules). Float outputs compute in float32, integer
// outputs in int64 (wrapping), exactly as the CPU reference (src/cpu/op_eltwise.c) classifies them.
#include <math.h>
#include <string.h>

#include "core/ew_math.h"
#include "cuda/cuda_common.cuh"

#define EW_BLOCK 256
#define EW_MAX_STEPS (KILN_MAX_TAIL + 1)
#define EW_MAX_OPERANDS (KILN_MAX_TAIL + 2)

typedef struct ew_operand {
    const void *p;
    uint32_t dtype;
    int64_t strides[KC_MAX_RANK]; // element strides over the (coalesced) output dims
} ew_operand;

typedef struct ew_step {
    uint32_t op;
    int operand;    // index into operands for binary steps, -1 for unary
    int lhs;        // binary: the running value is the left operand
    float f0, f1;   // gelu: f0 = tanh approximation; clamp: bounds (NaN: none)
    int64_t i0, i1; // clamp bounds for integer outputs
} ew_step;

typedef struct ew_params {
    int rank;
    int64_t dims[KC_MAX_RANK];
    int64_t numel;
    void *out;
    uint32_t out_dtype;
    int64_t out_strides[KC_MAX_RANK];
    int contiguous; // every operand and out are dense over the same dims: offset = index
    int n_operands;
    ew_operand operands[EW_MAX_OPERANDS];
    int n_steps;
    ew_step steps[EW_MAX_STEPS];
} ew_params;

// --- math (the CPU reference's formulas)

// Rare ops called, not inlined into every interpreter's unrolled switch (device code size).
static __device__ __noinline__ float ew_log1p(float x) { return log1pf(x); }
static __device__ __noinline__ float ew_erf(float x) { return erff(x); }
static __device__ __noinline__ float ew_powf(float a, float b) { return powf(a, b); }

// a^b; a square (StarReLU's relu(x)^2, a variance's (x - mean)^2) is one multiply, inline.
__device__ __forceinline__ float ew_pow(float a, float b) {
    return b == 2.0f ? a * a : ew_powf(a, b);
}

__device__ __forceinline__ float ew_unary(const ew_step &s, float x) {
    switch (s.op) {
    case KILN_OP_RELU: return x < 0.0f ? 0.0f : x;
    case KILN_OP_GELU: return s.f0 != 0.0f ? kc_gelu_tanh(x) : kc_gelu_erf(x);
    case KILN_OP_SILU: return x / (1.0f + expf(-x));
    case KILN_OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case KILN_OP_TANH: return tanhf(x);
    case KILN_OP_HARDSWISH: {
        float t = x + 3.0f;
        t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
        return x * t / 6.0f;
    }
    case KILN_OP_HARDSIGMOID: {
        float t = x + 3.0f;
        t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
        return t / 6.0f;
    }
    case KILN_OP_NEG: return -x;
    case KILN_OP_SQRT: return sqrtf(x);
    case KILN_OP_RSQRT: return 1.0f / sqrtf(x);
    case KILN_OP_EXP: return expf(x);
    case KILN_OP_LOG: return logf(x);
    case KILN_OP_LOG1P: return ew_log1p(x);
    case KILN_OP_ERF: return ew_erf(x);
    case KILN_OP_COS: return cosf(x);
    case KILN_OP_SIN: return sinf(x);
    case KILN_OP_ABS: return fabsf(x);
    case KILN_OP_SIGN: return kiln_sign_f(x);
    case KILN_OP_CEIL: return ceilf(x);
    case KILN_OP_FLOOR: return floorf(x);
    case KILN_OP_ROUND: return rintf(x);
    case KILN_OP_TRUNC: return truncf(x);
    case KILN_OP_CLAMP:
        if (x < s.f0) x = s.f0; // comparisons with a NaN bound are false: no bound
        if (x > s.f1) x = s.f1;
        return x;
    default: return x; // copy, cast
    }
}

// ew_unary for a program whose output is float16/bfloat16 (the vectorized kernels): SiLU and
// sigmoid divide with __fdividef (2 ulp in float32, far inside the output's rounding; an
// overflowing denominator gives 0, the limit). The IEEE division's slow-path branch per value
// costs several times the pass's memory time (conv_act.cuh); float32 outputs keep ew_unary.
template <typename T> __device__ __forceinline__ float ew_unary_out(const ew_step &s, float x) {
    if (sizeof(T) < 4) {
        if (s.op == KILN_OP_SILU) return __fdividef(x, 1.0f + __expf(-x));
        if (s.op == KILN_OP_SIGMOID) return __fdividef(1.0f, 1.0f + __expf(-x));
    }
    return ew_unary(s, x);
}

__device__ __forceinline__ float ew_binary(uint32_t op, float a, float b) {
    switch (op) {
    case KILN_OP_ADD: return a + b;
    case KILN_OP_SUB: return a - b;
    case KILN_OP_MUL: return a * b;
    case KILN_OP_DIV: return a / b;
    case KILN_OP_POW: return ew_pow(a, b);
    case KILN_OP_REMAINDER: return kiln_remainder_f(a, b);
    case KILN_OP_FMOD: return kiln_fmod_f(a, b);
    case KILN_OP_FLOOR_DIVIDE: return kiln_floor_divide_f(a, b);
    case KILN_OP_MAXIMUM: return kiln_maximum_f(a, b);
    case KILN_OP_MINIMUM: return kiln_minimum_f(a, b);
    default: return a;
    }
}

// The ops of a "lite" program: add, sub, mul, maximum, minimum, relu, clamp and copy, the steps
// of an inference batch norm (a per-channel multiply and add) with its ReLU or ReLU6, and of
// residual adds. Kernels instantiated for lite programs compile only these; the interpreter's
// switch over every op (powf, sinf, the remainders, ...), unrolled for each of a thread's 8 or 4
// values, made each program kernel's code large enough that DenseNet's concatenations with their
// batch norm and ReLU took 11 us each whatever their size, its standalone batch norms 6 us, and
// ConvFormer's StarReLU tails (s * relu(x)^2 + b) 8-16 us over 0.1-0.8 M values. A lite program
// with pow steps (StarReLU, squared ReLU) has kernels of its own (EW_LITE_POW: the pow a square
// inline or one out-of-line powf): in the lite kernels themselves the call cost every batch norm
// and residual add about 1% (EfficientNet-B0 at batch 32: 2%).
#define EW_FULL 0     // every op (the interpreter's switch)
#define EW_LITE 1     // the lite ops
#define EW_LITE_POW 2 // the lite ops and pow
static int ew_lite_op(uint32_t op) {
    return op == KILN_OP_ADD || op == KILN_OP_SUB || op == KILN_OP_MUL || op == KILN_OP_MAXIMUM ||
           op == KILN_OP_MINIMUM || op == KILN_OP_RELU || op == KILN_OP_CLAMP || op == KILN_OP_COPY;
}

__device__ __forceinline__ float ew_lite_unary(const ew_step &s, float x) {
    if (s.op == KILN_OP_RELU) return x < 0.0f ? 0.0f : x;
    if (s.op == KILN_OP_CLAMP) {
        if (x < s.f0) x = s.f0;
        if (x > s.f1) x = s.f1;
    }
    return x;
}

__device__ __forceinline__ float ew_lite_binary(uint32_t op, float a, float b) {
    switch (op) {
    case KILN_OP_ADD: return a + b;
    case KILN_OP_SUB: return a - b;
    case KILN_OP_MUL: return a * b;
    case KILN_OP_MAXIMUM: return kiln_maximum_f(a, b);
    case KILN_OP_MINIMUM: return kiln_minimum_f(a, b);
    default: return a;
    }
}

// One step's math for the float16/bfloat16/float32 vector kernels: every op (EW_FULL), the lite
// ops alone (EW_LITE), or those and pow (EW_LITE_POW).
template <typename T, int LITE>
__device__ __forceinline__ float ew_step_unary(const ew_step &s, float x) {
    return LITE != EW_FULL ? ew_lite_unary(s, x) : ew_unary_out<T>(s, x);
}

template <int LITE> __device__ __forceinline__ float ew_step_binary(uint32_t op, float a, float b) {
    if (LITE == EW_LITE_POW && op == KILN_OP_POW) return ew_pow(a, b);
    return LITE != EW_FULL ? ew_lite_binary(op, a, b) : ew_binary(op, a, b);
}

__device__ __forceinline__ int64_t ew_unary_i(const ew_step &s, int64_t x) {
    switch (s.op) {
    case KILN_OP_NEG: return (int64_t)(0ull - (uint64_t)x);
    case KILN_OP_RELU: return x < 0 ? 0 : x;
    case KILN_OP_ABS: return x < 0 ? (int64_t)(0ull - (uint64_t)x) : x;
    case KILN_OP_SIGN: return (x > 0) - (x < 0);
    case KILN_OP_CLAMP:
        if (x < s.i0) x = s.i0;
        if (x > s.i1) x = s.i1;
        return x;
    default: return x;
    }
}

__device__ __forceinline__ int64_t ew_binary_i(uint32_t op, int64_t a, int64_t b) {
    switch (op) {
    case KILN_OP_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case KILN_OP_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case KILN_OP_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case KILN_OP_REMAINDER: return kiln_remainder_i(a, b);
    case KILN_OP_FMOD: return kiln_fmod_i(a, b);
    case KILN_OP_FLOOR_DIVIDE: return kiln_floor_divide_i(a, b);
    case KILN_OP_MAXIMUM: return a > b ? a : b;
    case KILN_OP_MINIMUM: return a < b ? a : b;
    default: return a;
    }
}

// --- kernels

// Decomposes i over the output dims into idx (row-major).
__device__ __forceinline__ void ew_index(const ew_params &P, int64_t i, int64_t *idx) {
    for (int d = P.rank - 1; d >= 0; d--) {
        idx[d] = i % P.dims[d];
        i /= P.dims[d];
    }
}

__device__ __forceinline__ int64_t ew_offset(const int64_t *strides, int rank, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < rank; d++) off += idx[d] * strides[d];
    return off;
}

// The running value in float32 (float programs) or int64 (integer programs): its loads, stores
// and op math.
struct ew_float_math {
    typedef float V;
    static __device__ __forceinline__ V ld(const void *p, uint32_t dt, int64_t i) {
        return kc_ld_f(p, dt, i);
    }
    static __device__ __forceinline__ void st(void *p, uint32_t dt, int64_t i, V v) {
        kc_st_f(p, dt, i, v);
    }
    static __device__ __forceinline__ V unary(const ew_step &s, V x) { return ew_unary(s, x); }
    static __device__ __forceinline__ V binary(uint32_t op, V a, V b) {
        return ew_binary(op, a, b);
    }
};
struct ew_int_math {
    typedef int64_t V;
    static __device__ __forceinline__ V ld(const void *p, uint32_t dt, int64_t i) {
        return kc_ld_i(p, dt, i);
    }
    static __device__ __forceinline__ void st(void *p, uint32_t dt, int64_t i, V v) {
        kc_st_i(p, dt, i, v);
    }
    static __device__ __forceinline__ V unary(const ew_step &s, V x) { return ew_unary_i(s, x); }
    static __device__ __forceinline__ V binary(uint32_t op, V a, V b) {
        return ew_binary_i(op, a, b);
    }
};

// The program element by element: any dtypes, broadcast or strided operands.
template <typename Math> static __global__ void ew_kernel(const __grid_constant__ ew_params P) {
    kc_pdl_enter();
    typedef typename Math::V V;
    int64_t idx[KC_MAX_RANK];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o0 = i, oo = i;
        if (!P.contiguous) {
            ew_index(P, i, idx);
            o0 = ew_offset(P.operands[0].strides, P.rank, idx);
            oo = ew_offset(P.out_strides, P.rank, idx);
        }
        V v = Math::ld(P.operands[0].p, P.operands[0].dtype, o0);
        for (int s = 0; s < P.n_steps; s++) {
            const ew_step &st = P.steps[s];
            if (st.operand < 0) {
                v = Math::unary(st, v);
            } else {
                const ew_operand &od = P.operands[st.operand];
                int64_t ob = P.contiguous ? i : ew_offset(od.strides, P.rank, idx);
                V b = Math::ld(od.p, od.dtype, ob);
                v = st.lhs ? Math::binary(st.op, v, b) : Math::binary(st.op, b, v);
            }
        }
        Math::st(P.out, P.out_dtype, oo, v);
    }
}

// The same program over dense operands that all have the output's float dtype: 16 bytes per
// load and store (8 float16/bfloat16 or 4 float32 values per thread and step), no per-element
// index or dtype dispatch. The fused GELU tail of BERT b8's FFN ([8 x 128, 3072] float16) ran
// at a fraction of copy bandwidth through ew_kernel<ew_float_math>.
template <typename T, int LITE>
static __global__ void ew_vec_kernel(const __grid_constant__ ew_params P, int64_t nvec) {
    kc_pdl_enter();
    constexpr int N = 16 / (int)sizeof(T);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v[N];
        uint4 u = ((const uint4 *)P.operands[0].p)[i]; // may be the output itself (a tail)
        const T *h = (const T *)&u;
#pragma unroll
        for (int e = 0; e < N; e++) v[e] = kc_to_f(h[e]);
        for (int s = 0; s < P.n_steps; s++) {
            const ew_step &st = P.steps[s];
            if (st.operand < 0) {
#pragma unroll
                for (int e = 0; e < N; e++) v[e] = ew_step_unary<T, LITE>(st, v[e]);
            } else {
                uint4 ub = ((const uint4 *)P.operands[st.operand].p)[i];
                const T *hb = (const T *)&ub;
#pragma unroll
                for (int e = 0; e < N; e++) {
                    const float b = kc_to_f(hb[e]);
                    v[e] = st.lhs ? ew_step_binary<LITE>(st.op, v[e], b)
                                  : ew_step_binary<LITE>(st.op, b, v[e]);
                }
            }
        }
        uint4 o;
        T *ho = (T *)&o;
#pragma unroll
        for (int e = 0; e < N; e++) ho[e] = kc_from_f<T>(v[e]);
        ((uint4 *)P.out)[i] = o;
    }
}

// N values of operand o at output index (i0, i1, i2) (innermost stride 1 or 0).
template <typename T, int N, typename I>
__device__ __forceinline__ void ew_bvec_load(const ew_operand &o, I i0, I i1, I i2, float *v) {
    const T *p =
        (const T *)o.p + (i0 * (I)o.strides[0] + i1 * (I)o.strides[1] + i2 * (I)o.strides[2]);
    if (o.strides[2] != 0) {
        const uint4 u = *(const uint4 *)p;
        const T *h = (const T *)&u;
#pragma unroll
        for (int e = 0; e < N; e++) v[e] = kc_to_f(h[e]);
    } else {
        const float x = kc_to_f(*p);
#pragma unroll
        for (int e = 0; e < N; e++) v[e] = x;
    }
}

// The same program when some operands broadcast, over at most three (coalesced) dims, padded in
// front to three: each thread takes 16 bytes of the dense output within the innermost dim, and
// each operand either runs along it (stride 1: one 16-byte load) or repeats one value across it
// (stride 0). Squeeze-excite's [N, 1, 1, C] scale against its NHWC [N, H, W, C] input, a bias
// row against [M, N] and a per-row factor are this form; through ew_kernel the scale multiply of
// EfficientNet b32 ran at about 14x its memory time. I: the index type (int: ew_bvec_ok).
template <typename T, typename I, int LITE>
static __global__ void ew_bvec_kernel(const __grid_constant__ ew_params P, I nvec) {
    kc_pdl_enter();
    constexpr int N = 16 / (int)sizeof(T);
    const I d1 = (I)P.dims[1], d2 = (I)P.dims[2];
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < nvec;
         i += (I)(gridDim.x * blockDim.x)) {
        const I e = i * N, i2 = e % d2, r = e / d2, i1 = r % d1, i0 = r / d1;
        float v[N];
        ew_bvec_load<T, N, I>(P.operands[0], i0, i1, i2, v);
        for (int s = 0; s < P.n_steps; s++) {
            const ew_step &st = P.steps[s];
            if (st.operand < 0) {
#pragma unroll
                for (int k = 0; k < N; k++) v[k] = ew_step_unary<T, LITE>(st, v[k]);
            } else {
                float b[N];
                ew_bvec_load<T, N, I>(P.operands[st.operand], i0, i1, i2, b);
#pragma unroll
                for (int k = 0; k < N; k++) {
                    v[k] = st.lhs ? ew_step_binary<LITE>(st.op, v[k], b[k])
                                  : ew_step_binary<LITE>(st.op, b[k], v[k]);
                }
            }
        }
        uint4 o;
        T *ho = (T *)&o;
#pragma unroll
        for (int k = 0; k < N; k++) ho[k] = kc_from_f<T>(v[k]);
        ((uint4 *)P.out)[i] = o;
    }
}

// A program that is one activation over the dense running value (GELU, SiLU, sigmoid,
// hard-swish), compiled alone per activation: BERT's FFN GELU tail ([8 x 128, 3072] float16) took
// 10.9 us through ew_vec_kernel's interpreter (every op's math unrolled 8 times in one kernel),
// about 2.5x copy time. Float16 and bfloat16 outputs take ew_unary_out's fast division.

template <typename T, int OP, int TANH>
static __global__ void ew_vec_act_kernel(const T *x, T *out, int64_t nvec) {
    kc_pdl_enter();
    constexpr int N = 16 / (int)sizeof(T);
    ew_step s;
    memset(&s, 0, sizeof s);
    s.op = OP;
    s.operand = -1;
    s.f0 = TANH ? 1.0f : 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint4 u = ((const uint4 *)x)[i], o;
        const T *h = (const T *)&u;
        T *ho = (T *)&o;
#pragma unroll
        for (int e = 0; e < N; e++) {
            const float v = kc_to_f(h[e]);
            ho[e] = kc_from_f<T>(ew_unary_out<T>(s, v));
        }
        ((uint4 *)out)[i] = o;
    }
}

static void ew_vec_gelu32_launch(const kiln_cuda_ctx *ctx, const ew_params *P, int64_t nvec,
                                 unsigned blocks) {
    const float *x = (const float *)P->operands[0].p;
    float *y = (float *)P->out;
    if (P->steps[0].f0 != 0.0f)
        kc_launch(ctx, ew_vec_act_kernel<float, KILN_OP_GELU, 1>, blocks, EW_BLOCK, 0, x, y, nvec);
    else
        kc_launch(ctx, ew_vec_act_kernel<float, KILN_OP_GELU, 0>, blocks, EW_BLOCK, 0, x, y, nvec);
}

// 1 when the program is one activation ew_vec_act_kernel compiles alone (float32: GELU only,
// the others run the interpreter's same formulas; fewer kernels keep the device code small).
static int ew_vec_act_ok(const ew_params *P) {
    if (P->n_steps != 1 || P->steps[0].operand >= 0 || P->n_operands != 1) return 0;
    const uint32_t op = P->steps[0].op;
    return op == KILN_OP_GELU ||
           (P->out_dtype != KILN_DTYPE_F32 &&
            (op == KILN_OP_SILU || op == KILN_OP_SIGMOID || op == KILN_OP_HARDSWISH));
}

template <typename T>
static void ew_vec_act_launch(const kiln_cuda_ctx *ctx, const ew_params *P, int64_t nvec,
                              unsigned blocks) {
    const T *x = (const T *)P->operands[0].p;
    T *y = (T *)P->out;
    switch (P->steps[0].op) {
    case KILN_OP_GELU:
        if (P->steps[0].f0 != 0.0f)
            kc_launch(ctx, ew_vec_act_kernel<T, KILN_OP_GELU, 1>, blocks, EW_BLOCK, 0, x, y, nvec);
        else
            kc_launch(ctx, ew_vec_act_kernel<T, KILN_OP_GELU, 0>, blocks, EW_BLOCK, 0, x, y, nvec);
        break;
    case KILN_OP_SILU:
        kc_launch(ctx, ew_vec_act_kernel<T, KILN_OP_SILU, 0>, blocks, EW_BLOCK, 0, x, y, nvec);
        break;
    case KILN_OP_SIGMOID:
        kc_launch(ctx, ew_vec_act_kernel<T, KILN_OP_SIGMOID, 0>, blocks, EW_BLOCK, 0, x, y, nvec);
        break;
    default:
        kc_launch(ctx, ew_vec_act_kernel<T, KILN_OP_HARDSWISH, 0>, blocks, EW_BLOCK, 0, x, y, nvec);
        break;
    }
}

// 1 when ew_vec_kernel applies: dense (one coalesced dim of stride 1 everywhere), every operand
// of the output's float dtype, a multiple of 16 bytes, 16-byte aligned pointers.
static int ew_vec_ok(const ew_params *P) {
    const uint32_t dt = P->out_dtype;
    if (!P->contiguous || P->rank != 1 || P->out_strides[0] != 1) return 0;
    if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) return 0;
    if ((P->numel * (int64_t)kiln_cuda_dtype_size(dt)) % 16 != 0 || ((uintptr_t)P->out % 16) != 0)
        return 0;
    for (int k = 0; k < P->n_operands; k++) {
        const ew_operand &o = P->operands[k];
        if (o.dtype != dt || o.strides[0] != 1 || ((uintptr_t)o.p % 16) != 0) return 0;
    }
    return 1;
}

// where(cond, a, b): operands 0, 1, 2. Float outputs read cond as float, integer outputs as
// int64 (the CPU reference's row_f32 / row_i64).
static __global__ void ew_where_kernel(const __grid_constant__ ew_params P) {
    kc_pdl_enter();
    int64_t idx[KC_MAX_RANK];
    const int out_int = !(P.out_dtype == KILN_DTYPE_F32 || P.out_dtype == KILN_DTYPE_F16 ||
                          P.out_dtype == KILN_DTYPE_BF16);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o[3] = {i, i, i}, oo = i;
        if (!P.contiguous) {
            ew_index(P, i, idx);
            for (int k = 0; k < 3; k++) o[k] = ew_offset(P.operands[k].strides, P.rank, idx);
            oo = ew_offset(P.out_strides, P.rank, idx);
        }
        const ew_operand &c = P.operands[0];
        if (out_int) {
            int pick = kc_ld_i(c.p, c.dtype, o[0]) != 0 ? 1 : 2;
            kc_st_i(P.out, P.out_dtype, oo,
                    kc_ld_i(P.operands[pick].p, P.operands[pick].dtype, o[pick]));
        } else {
            int pick = kc_ld_f(c.p, c.dtype, o[0]) != 0.0f ? 1 : 2;
            kc_st_f(P.out, P.out_dtype, oo,
                    kc_ld_f(P.operands[pick].p, P.operands[pick].dtype, o[pick]));
        }
    }
}

// --- host set-up

// Fills dims, out strides and operand strides (operands broadcast to out), then drops size-1
// dims and merges neighbours that are contiguous for out and every operand. out_nhwc: a 4-D
// output stored NHWC (its dims logical NCHW, cuda_layout.h), walked in its stored order so that
// the stores are dense.
static void ew_setup(ew_params *P, const kiln_tensor *out, const kiln_tensor *const *ins, int n,
                     int out_nhwc) {
    int r = (int)out->rank;
    int64_t st[EW_MAX_OPERANDS + 1][KC_MAX_RANK], od[KC_MAX_RANK];
    int n_ops = n + 1; // row 0: out
    P->numel = kc_numel(out);
    P->out = out->data;
    P->out_dtype = out->dtype;
    P->n_operands = n;
    kc_strides(out, st[0]);
    for (int k = 0; k < n; k++) {
        P->operands[k].p = ins[k]->data;
        P->operands[k].dtype = ins[k]->dtype;
        kc_bcast_strides(ins[k], (uint32_t)r, st[k + 1]);
    }
    for (int d = 0; d < r; d++) od[d] = out->dims[d];
    if (out_nhwc && r == 4) { // every row in the order N, H, W, C; out's strides NHWC
        const int order[4] = {0, 2, 3, 1};
        const int64_t c = out->dims[1], w = out->dims[3], h = out->dims[2];
        const int64_t nhwc[4] = {h * w * c, 1, w * c, c}; // out's strides by logical dim
        for (int o = 0; o < n_ops; o++) {
            int64_t t[4];
            for (int d = 0; d < 4; d++) t[d] = o == 0 ? nhwc[order[d]] : st[o][order[d]];
            for (int d = 0; d < 4; d++) st[o][d] = t[d];
        }
        for (int d = 0; d < 4; d++) od[d] = out->dims[order[d]];
    }
    int nr = 0;
    int64_t dims[KC_MAX_RANK];
    int64_t ms[EW_MAX_OPERANDS + 1][KC_MAX_RANK];
    for (int d = 0; d < r; d++) {
        if (od[d] == 1) continue;
        if (nr > 0) {
            int merge = 1;
            for (int o = 0; o < n_ops; o++) {
                if (ms[o][nr - 1] != st[o][d] * od[d]) merge = 0;
            }
            if (merge) {
                dims[nr - 1] *= od[d];
                for (int o = 0; o < n_ops; o++) ms[o][nr - 1] = st[o][d];
                continue;
            }
        }
        dims[nr] = od[d];
        for (int o = 0; o < n_ops; o++) ms[o][nr] = st[o][d];
        nr++;
    }
    if (nr == 0) {
        dims[0] = 1;
        for (int o = 0; o < n_ops; o++) ms[o][0] = 1;
        nr = 1;
    }
    P->rank = nr;
    int contiguous = nr == 1;
    for (int d = 0; d < nr; d++) {
        P->dims[d] = dims[d];
        P->out_strides[d] = ms[0][d];
        for (int k = 0; k < n; k++) P->operands[k].strides[d] = ms[k + 1][d];
    }
    if (contiguous) {
        for (int o = 0; o < n_ops; o++) {
            if (ms[o][0] != 1 && dims[0] != 1) contiguous = 0;
        }
    }
    P->contiguous = contiguous;
}

static void ew_set_attrs(ew_step *s, uint32_t op, const kiln_attrs *attrs) {
    s->op = op;
    s->f0 = s->f1 = 0.0f;
    s->i0 = INT64_MIN;
    s->i1 = INT64_MAX;
    if (op == KILN_OP_GELU) {
        s->f0 = kiln_attrs_int(attrs, KILN_A_GELU_APPROXIMATE, 0) != 0 ? 1.0f : 0.0f;
    } else if (op == KILN_OP_CLAMP) {
        double lo = kiln_attrs_float(attrs, KILN_A_CLAMP_MIN, 0);
        double hi = kiln_attrs_float(attrs, KILN_A_CLAMP_MAX, 0);
        s->f0 = (float)lo;
        s->f1 = (float)hi;
        s->i0 =
            isnan(lo) || lo < -9.2e18 ? INT64_MIN : (lo > 9.2e18 ? INT64_MAX : (int64_t)ceil(lo));
        s->i1 =
            isnan(hi) || hi > 9.2e18 ? INT64_MAX : (hi < -9.2e18 ? INT64_MIN : (int64_t)floor(hi));
    }
}

static int ew_is_int(uint32_t dtype) {
    return dtype == KILN_DTYPE_I32 || dtype == KILN_DTYPE_I64 || dtype == KILN_DTYPE_BOOL;
}

// The elementwise ops and their operand counts (the one list: cuda_dispatch.c asks it too).
static int ew_n_inputs(uint32_t op) {
    switch (op) {
    case KILN_OP_WHERE: return 3;
    case KILN_OP_ADD:
    case KILN_OP_SUB:
    case KILN_OP_MUL:
    case KILN_OP_DIV:
    case KILN_OP_POW:
    case KILN_OP_REMAINDER:
    case KILN_OP_FMOD:
    case KILN_OP_FLOOR_DIVIDE:
    case KILN_OP_MAXIMUM:
    case KILN_OP_MINIMUM: return 2;
    case KILN_OP_RELU:
    case KILN_OP_GELU:
    case KILN_OP_SILU:
    case KILN_OP_SIGMOID:
    case KILN_OP_TANH:
    case KILN_OP_HARDSWISH:
    case KILN_OP_HARDSIGMOID:
    case KILN_OP_NEG:
    case KILN_OP_SQRT:
    case KILN_OP_RSQRT:
    case KILN_OP_EXP:
    case KILN_OP_LOG:
    case KILN_OP_LOG1P:
    case KILN_OP_ERF:
    case KILN_OP_COS:
    case KILN_OP_SIN:
    case KILN_OP_ABS:
    case KILN_OP_SIGN:
    case KILN_OP_CEIL:
    case KILN_OP_FLOOR:
    case KILN_OP_ROUND:
    case KILN_OP_TRUNC:
    case KILN_OP_COPY:
    case KILN_OP_CAST:
    case KILN_OP_CLAMP: return 1;
    default: return -1;
    }
}

static int ew_int_capable(uint32_t op) {
    switch (op) {
    case KILN_OP_NEG:
    case KILN_OP_RELU:
    case KILN_OP_CLAMP:
    case KILN_OP_COPY:
    case KILN_OP_CAST:
    case KILN_OP_ADD:
    case KILN_OP_SUB:
    case KILN_OP_MUL:
    case KILN_OP_REMAINDER:
    case KILN_OP_FMOD:
    case KILN_OP_FLOOR_DIVIDE:
    case KILN_OP_MAXIMUM:
    case KILN_OP_MINIMUM:
    case KILN_OP_ABS:
    case KILN_OP_SIGN:
    case KILN_OP_CEIL: // (the roundings copy ints)
    case KILN_OP_FLOOR:
    case KILN_OP_ROUND:
    case KILN_OP_TRUNC:
    case KILN_OP_WHERE: return 1;
    default: return 0;
    }
}

static int ew_supports(uint32_t op, const kiln_tensor *const *ins, int n, const kiln_tensor *out) {
    if (ew_n_inputs(op) != n || kiln_cuda_dtype_size(out->dtype) == 0) return 0;
    for (int i = 0; i < n; i++) {
        if (ins[i] == NULL || kiln_cuda_dtype_size(ins[i]->dtype) == 0) return 0;
        if (ins[i]->rank > out->rank) return 0;
        for (uint32_t d = 0; d < ins[i]->rank; d++) {
            int64_t id = ins[i]->dims[d], od = out->dims[out->rank - ins[i]->rank + d];
            if (id != 1 && id != od) return 0;
        }
    }
    if (op == KILN_OP_CAST || op == KILN_OP_COPY) return 1;
    if (ew_is_int(out->dtype)) {
        if (!ew_int_capable(op)) return 0;
        if (out->dtype == KILN_DTYPE_BOOL && op != KILN_OP_WHERE) return 0;
    }
    return 1;
}

// 1 when ew_bvec_kernel applies: at most three dims, the output dense, every operand of the
// output's float dtype with its innermost stride 1 (16-byte aligned rows) or 0, the innermost
// dim a multiple of 16 bytes.
static int ew_bvec_ok(const ew_params *P) {
    const uint32_t dt = P->out_dtype;
    if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16) return 0;
    const int64_t vec = 16 / (int64_t)kiln_cuda_dtype_size(dt), r = P->rank;
    if (r < 1 || r > 3 || P->dims[r - 1] % vec != 0 || ((uintptr_t)P->out % 16) != 0) return 0;
    if (P->numel >= INT32_MAX) return 0; // 32-bit indices (one instantiation: the wheel's size)
    int64_t dense = 1;
    for (int64_t d = r - 1; d >= 0; d--) {
        if (P->dims[d] != 1 && P->out_strides[d] != dense) return 0;
        dense *= P->dims[d];
    }
    for (int k = 0; k < P->n_operands; k++) {
        const ew_operand &o = P->operands[k];
        if (o.dtype != dt) return 0;
        if (o.strides[r - 1] == 0) continue;
        if (o.strides[r - 1] != 1 || ((uintptr_t)o.p % 16) != 0) return 0;
        for (int64_t d = 0; d < r - 1; d++) {
            if (o.strides[d] % vec != 0) return 0;
        }
    }
    return 1;
}

// *P with its dims padded in front to three (ew_bvec_kernel's form; ew_bvec_ok held).
static void ew_bvec_pad(const ew_params *P, ew_params *Q) {
    const int sh = 3 - P->rank;
    *Q = *P;
    Q->rank = 3;
    for (int d = 0; d < 3; d++) {
        const int from = d - sh;
        Q->dims[d] = from >= 0 ? P->dims[from] : 1;
        Q->out_strides[d] = from >= 0 ? P->out_strides[from] : 0;
        for (int k = 0; k < P->n_operands; k++) {
            Q->operands[k].strides[d] = from >= 0 ? P->operands[k].strides[from] : 0;
        }
    }
}

// 1 when every step of the program is a lite op (ew_lite_op).
static int ew_lite_steps(const ew_step *steps, int n) {
    for (int k = 0; k < n; k++) {
        if (!ew_lite_op(steps[k].op)) return 0;
    }
    return 1;
}

// The kernels a program takes: EW_LITE, EW_LITE_POW (lite but for pow steps) or EW_FULL.
static int ew_kind(const ew_step *steps, int n) {
    int pow = 0;
    for (int k = 0; k < n; k++) {
        if (steps[k].op == KILN_OP_POW)
            pow = 1;
        else if (!ew_lite_op(steps[k].op))
            return EW_FULL;
    }
    return pow ? EW_LITE_POW : EW_LITE;
}

template <typename T>
static void ew_bvec_launch(const kiln_cuda_ctx *ctx, const ew_params *Q, int64_t nvec,
                           unsigned blocks) {
    switch (ew_kind(Q->steps, Q->n_steps)) {
    case EW_LITE:
        kc_launch(ctx, ew_bvec_kernel<T, int, EW_LITE>, blocks, EW_BLOCK, 0, *Q, (int)nvec);
        break;
    case EW_LITE_POW:
        kc_launch(ctx, ew_bvec_kernel<T, int, EW_LITE_POW>, blocks, EW_BLOCK, 0, *Q, (int)nvec);
        break;
    default:
        kc_launch(ctx, ew_bvec_kernel<T, int, EW_FULL>, blocks, EW_BLOCK, 0, *Q, (int)nvec);
        break;
    }
}

template <typename T>
static void ew_vec_launch(const kiln_cuda_ctx *ctx, const ew_params *P, int64_t nvec,
                          unsigned blocks) {
    switch (ew_kind(P->steps, P->n_steps)) {
    case EW_LITE: kc_launch(ctx, ew_vec_kernel<T, EW_LITE>, blocks, EW_BLOCK, 0, *P, nvec); break;
    case EW_LITE_POW:
        kc_launch(ctx, ew_vec_kernel<T, EW_LITE_POW>, blocks, EW_BLOCK, 0, *P, nvec);
        break;
    default: kc_launch(ctx, ew_vec_kernel<T, EW_FULL>, blocks, EW_BLOCK, 0, *P, nvec); break;
    }
}

static kiln_status ew_launch(const kiln_cuda_ctx *ctx, const ew_params *P, int kind) {
    if (P->numel == 0) return KILN_OK;
    unsigned blocks = kc_blocks(P->numel, EW_BLOCK);
    if (kind == 0 && ew_vec_ok(P)) {
        const int64_t nvec = P->numel * (int64_t)kiln_cuda_dtype_size(P->out_dtype) / 16;
        blocks = kc_blocks(nvec, EW_BLOCK);
        if (ew_vec_act_ok(P)) {
            switch (P->out_dtype) {
            case KILN_DTYPE_F16: ew_vec_act_launch<__half>(ctx, P, nvec, blocks); break;
            case KILN_DTYPE_BF16: ew_vec_act_launch<__nv_bfloat16>(ctx, P, nvec, blocks); break;
            default: ew_vec_gelu32_launch(ctx, P, nvec, blocks); break;
            }
            return kiln_cuda_check_launch(ctx, "ew_vec_act_kernel");
        }
        switch (P->out_dtype) {
        case KILN_DTYPE_F16: ew_vec_launch<__half>(ctx, P, nvec, blocks); break;
        case KILN_DTYPE_BF16: ew_vec_launch<__nv_bfloat16>(ctx, P, nvec, blocks); break;
        default: ew_vec_launch<float>(ctx, P, nvec, blocks); break;
        }
        return kiln_cuda_check_launch(ctx, "ew_vec_kernel");
    }
    if (kind == 0 && ew_bvec_ok(P)) {
        const int64_t nvec = P->numel * (int64_t)kiln_cuda_dtype_size(P->out_dtype) / 16;
        ew_params Q; // ~1.3 KB on the stack, as P
        ew_bvec_pad(P, &Q);
        blocks = kc_blocks(nvec, EW_BLOCK);
        switch (P->out_dtype) {
        case KILN_DTYPE_F16: ew_bvec_launch<__half>(ctx, &Q, nvec, blocks); break;
        case KILN_DTYPE_BF16: ew_bvec_launch<__nv_bfloat16>(ctx, &Q, nvec, blocks); break;
        default: ew_bvec_launch<float>(ctx, &Q, nvec, blocks); break;
        }
        return kiln_cuda_check_launch(ctx, "ew_bvec_kernel");
    }
    if (kind == 0) {
        kc_launch(ctx, ew_kernel<ew_float_math>, blocks, EW_BLOCK, 0, *P);
        return kiln_cuda_check_launch(ctx, "ew_kernel (float)");
    }
    if (kind == 1) {
        kc_launch(ctx, ew_kernel<ew_int_math>, blocks, EW_BLOCK, 0, *P);
        return kiln_cuda_check_launch(ctx, "ew_kernel (int)");
    }
    kc_launch(ctx, ew_where_kernel, blocks, EW_BLOCK, 0, *P);
    return kiln_cuda_check_launch(ctx, "ew_where_kernel");
}

// Appends args' fused tail to program P (operands after the first n in ins): one kernel runs
// the head and its tail.
static int ew_add_tail(ew_params *P, const kiln_kernel_args *args, const kiln_tensor **ins, int n) {
    for (uint32_t t = 0; t < args->n_tail; t++) {
        const kiln_tail_op *tl = &args->tail[t];
        ew_step *st = &P->steps[P->n_steps++];
        ew_set_attrs(st, tl->op, &tl->attrs);
        st->operand = -1;
        if (ew_n_inputs(tl->op) == 2) {
            st->operand = n;
            st->lhs = tl->running_is_lhs != 0;
            ins[n++] = tl->operand;
        }
    }
    return n;
}

// Runs one elementwise op: out = op(ins...), then the fused tail of args when it has one (a
// float head: kiln_cuda_tail_supports held at load).
static kiln_status ew_run(const kiln_cuda_ctx *ctx, uint32_t op, const kiln_attrs *attrs,
                          const kiln_tensor *const *ins, int n, const kiln_tensor *out,
                          const kiln_kernel_args *tail) {
    if (!ew_supports(op, ins, n, out)) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda backend: elementwise op %s does not support these operands "
                              "(output %s, %d inputs) at %s",
                              kiln_cuda_op_name(op), kiln_cuda_dtype_name(out->dtype), n,
                              ctx->where ? ctx->where : "?");
    }
    if (kc_numel(out) == 0) return KILN_OK;
    const int n_tail = tail != NULL ? (int)tail->n_tail : 0;
    if ((op == KILN_OP_COPY || op == KILN_OP_CAST) && ins[0]->dtype == out->dtype && n_tail == 0 &&
        !ctx->out_nhwc) {
        int64_t ds[KC_MAX_RANK], ss[KC_MAX_RANK];
        kc_strides(out, ds);
        kc_bcast_strides(ins[0], out->rank, ss);
        return kiln_cuda_copy_strided(ctx, out->data, ins[0]->data,
                                      kiln_cuda_dtype_size(out->dtype), (int)out->rank, out->dims,
                                      ds, ss);
    }
    ew_params params; // ~1.3 KB on the stack: execute allocates nothing
    ew_params *P = &params;
    memset(P, 0, sizeof *P);
    int kind;
    if (op == KILN_OP_WHERE) {
        ew_setup(P, out, ins, n, ctx->out_nhwc);
        kind = 2;
    } else {
        const kiln_tensor *all[EW_MAX_OPERANDS];
        for (int i = 0; i < n; i++) all[i] = ins[i];
        P->n_steps = 1;
        ew_set_attrs(&P->steps[0], op, attrs);
        P->steps[0].operand = n == 2 ? 1 : -1;
        P->steps[0].lhs = 1;
        const int n_all = n_tail > 0 ? ew_add_tail(P, tail, all, n) : n;
        const int n_steps = P->n_steps;
        ew_setup(P, out, all, n_all, ctx->out_nhwc); // (keeps the steps)
        P->n_steps = n_steps;
        if (op == KILN_OP_CAST && out->dtype == KILN_DTYPE_BOOL &&
            kiln_cuda_is_float(ins[0]->dtype)) {
            kind = 0; // 0.5 -> true: compare as float, not truncated
        } else {
            kind = ew_is_int(out->dtype) ? 1 : 0;
        }
    }
    return ew_launch(ctx, P, kind);
}

// --- entry points

extern "C" int kiln_cuda_eltwise_arity(uint32_t op) { return ew_n_inputs(op); }

extern "C" int kiln_cuda_eltwise_supports(uint32_t op, const kiln_tensor *const *ins, int n,
                                          const kiln_tensor *out) {
    return ew_supports(op, ins, n, out);
}

// --- overflow clamps (cuda_fold.h): y = min(max(x, -c), c), c = a when some |x| is +inf, else b;
// -c and c rounded to x's dtype as the casts do, NaN kept (torch.maximum/minimum propagate it).
// One block: every element is read to find an inf before any is written.

#define CLAMP_BLOCK 1024

static __global__ void __launch_bounds__(CLAMP_BLOCK)
    inf_clamp_kernel(const void *x, void *y, uint32_t dt, int64_t n, float a, float b) {
    kc_pdl_enter();
    int found = 0;
    if (dt == KILN_DTYPE_F16 && n % 8 == 0 && ((uintptr_t)x & 15) == 0) {
        const uint4 *xv = (const uint4 *)x;
        for (int64_t i = threadIdx.x; i < n / 8; i += CLAMP_BLOCK) {
            const uint4 u = xv[i];
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
            for (int j = 0; j < 4; j++) { // +-inf: exponent all ones, mantissa 0
                found |= (w[j] & 0x7fffu) == 0x7c00u || (w[j] & 0x7fff0000u) == 0x7c000000u;
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < n; i += CLAMP_BLOCK) found |= isinf(kc_ld_f(x, dt, i));
    }
    const float c = __syncthreads_or(found) ? a : b;
    const float hi = kc_round_to(dt, c), lo = kc_round_to(dt, -c);
    for (int64_t i = threadIdx.x; i < n; i += CLAMP_BLOCK) {
        const float v = kc_ld_f(x, dt, i);
        kc_st_f(y, dt, i, v != v ? v : fminf(fmaxf(v, lo), hi));
    }
}

static kiln_status inf_clamp(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = ctx->clamp_y;
    const int64_t n = kc_numel(x);
    if (x == NULL || y == NULL || kc_numel(y) != n || y->dtype != x->dtype ||
        n > KILN_CUDA_CLAMP_MAX) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda overflow clamp: operands do not match the fold at %s (set "
                              "cuda.attention_fold to false to run the layers apart)",
                              ctx->where ? ctx->where : "?");
    }
    if (n == 0) return KILN_OK;
    cudaError_t err =
        kc_launch(ctx, inf_clamp_kernel, dim3(1), dim3(CLAMP_BLOCK), 0, (const void *)x->data,
                  (void *)y->data, x->dtype, n, ctx->clamp_a, ctx->clamp_b);
    if (err != cudaSuccess)
        return kiln_cuda_error(ctx, "cudaLaunchKernelEx (inf_clamp_kernel)", err);
    return kiln_cuda_check_launch(ctx, "inf_clamp_kernel");
}

extern "C" kiln_status kiln_cuda_unary(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    if (ctx->clamp_y != NULL && args->op == KILN_OP_ABS) return inf_clamp(ctx, args);
    return ew_run(ctx, args->op, &args->attrs, args->in, 1, args->out, args);
}

extern "C" kiln_status kiln_cuda_binary(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    int n = args->op == KILN_OP_WHERE ? 3 : 2;
    for (int i = 0; i < n; i++) {
        if ((uint32_t)i >= args->n_in || args->in[i] == NULL) {
            return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda %s: input %d is missing at %s",
                                  kiln_cuda_op_name(args->op), i, ctx->where ? ctx->where : "?");
        }
    }
    return ew_run(ctx, args->op, &args->attrs, args->in, n, args->out,
                  args->op == KILN_OP_WHERE ? NULL : args);
}

extern "C" int kiln_cuda_tail_supports(const kiln_kernel_args *args) {
    const kiln_tensor *out = args->out;
    if (args->n_tail > KILN_MAX_TAIL) return 0;
    if (args->n_tail > 0 && !kiln_cuda_is_float(out->dtype)) return 0;
    for (uint32_t t = 0; t < args->n_tail; t++) {
        const kiln_tail_op *tl = &args->tail[t];
        const kiln_tensor *ins[2] = {out, tl->operand};
        int n = ew_n_inputs(tl->op);
        if (tl->op == KILN_OP_CAST || tl->op == KILN_OP_WHERE) return 0;
        if (n == 2) {
            if (tl->operand == NULL) return 0;
            if (!tl->running_is_lhs) {
                ins[0] = tl->operand;
                ins[1] = out;
            }
        } else if (n != 1) {
            return 0;
        }
        if (!ew_supports(tl->op, ins, n, out)) return 0;
    }
    return 1;
}

extern "C" kiln_status kiln_cuda_tail(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                      uint32_t skip) {
    const kiln_tensor *out = args->out;
    if (skip >= args->n_tail || kc_numel(out) == 0) return KILN_OK;
    if (!kiln_cuda_tail_supports(args)) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda backend: the fused tail of %s at %s is not supported",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    const kiln_tensor *ins[EW_MAX_OPERANDS];
    int n = 0;
    ins[n++] = out; // operand 0: the running value, in place
    ew_params params;
    ew_params *P = &params;
    memset(P, 0, sizeof *P);
    int steps = 0;
    for (uint32_t t = skip; t < args->n_tail; t++) {
        const kiln_tail_op *tl = &args->tail[t];
        ew_step *s = &P->steps[steps++];
        ew_set_attrs(s, tl->op, &tl->attrs);
        s->operand = -1;
        if (ew_n_inputs(tl->op) == 2) {
            s->operand = n;
            s->lhs = tl->running_is_lhs != 0;
            ins[n++] = tl->operand;
        }
    }
    ew_setup(P, out, ins, n, 0);
    P->n_steps = steps;
    return ew_launch(ctx, P, 0);
}

// --- concatenation: one kernel for every input, with the group's tail applied as it writes

// The output viewed as [outer, R] in its stored order (R = its size along the cat dim times
// `inner`, the product of the dims after it): input k fills columns [O[k], O[k] + L[k]) of
// every row. A tail operand is one value (CAT_OP_ONE), the output's shape (CAT_OP_FULL), or a
// vector along the cat dim only (CAT_OP_CHAN: a per-channel scale or shift, at r / inner).
#define CAT_MAX KILN_MAX_INPUTS
enum { CAT_OP_ONE, CAT_OP_FULL, CAT_OP_CHAN };

typedef struct cat_params {
    int n;
    int64_t outer, R, inner; // in elements (or units of U for the copy kernel)
    void *out;
    const void *in[CAT_MAX];
    int64_t L[CAT_MAX], O[CAT_MAX];
    int n_steps, n_operands;
    ew_step steps[KILN_MAX_TAIL];
    const void *op_p[KILN_MAX_TAIL];
    uint32_t op_dtype[KILN_MAX_TAIL];
    int op_kind[KILN_MAX_TAIL];
    int op_vec[KILN_MAX_TAIL]; // lite programs: read as 16-byte vectors (FULL, or CHAN of inner 1)
} cat_params;

// The input holding column r: the last k with O[k] <= r (O ascending, O[0] = 0).
__device__ __forceinline__ int cat_find(const cat_params &P, int64_t r) {
    int lo = 0, hi = P.n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (P.O[mid] <= r) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// A plain concatenation: units of U (16, 4, 2 or 1 bytes), any dtype.
template <typename U> static __global__ void cat_copy_kernel(const __grid_constant__ cat_params P) {
    kc_pdl_enter();
    const int64_t total = P.outer * P.R;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / P.R, r = i - o * P.R;
        const int k = cat_find(P, r);
        ((U *)P.out)[i] = ((const U *)P.in[k])[o * P.L[k] + (r - P.O[k])];
    }
}

// The concatenation and the tail program: N elements of T per thread (N = 16 / sizeof(T), or 1).
// LITE (N > 1): the program's steps are lite ops (ew_lite_op) and its operands of T, read as
// 16-byte vectors where op_vec says so (DenseNet's per-channel batch norm after the
// concatenation along NHWC's C: 8 channels' scale and shift per load).
template <typename T, int N, bool LITE>
static __global__ void cat_prog_kernel(const __grid_constant__ cat_params P) {
    kc_pdl_enter();
    const int64_t rv = P.R / N, total = P.outer * rv;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / rv, r = (i - o * rv) * N;
        const int k = cat_find(P, r);
        const T *src = (const T *)P.in[k] + (o * P.L[k] + (r - P.O[k]));
        float v[N];
        if (N > 1) {
            const uint4 u = *(const uint4 *)src;
            const T *h = (const T *)&u;
#pragma unroll
            for (int e = 0; e < N; e++) v[e] = kc_to_f(h[e]);
        } else {
            v[0] = kc_to_f(src[0]);
        }
        for (int s = 0; s < P.n_steps; s++) {
            const ew_step &st = P.steps[s];
            if (st.operand < 0) {
#pragma unroll
                for (int e = 0; e < N; e++) v[e] = ew_step_unary<T, LITE>(st, v[e]);
                continue;
            }
            const int q = st.operand;
            float b[N];
            if (LITE && N > 1 && P.op_vec[q]) {
                const int64_t at = P.op_kind[q] == CAT_OP_FULL ? o * P.R + r : r;
                const uint4 u = *(const uint4 *)((const T *)P.op_p[q] + at);
                const T *h = (const T *)&u;
#pragma unroll
                for (int e = 0; e < N; e++) b[e] = kc_to_f(h[e]);
            } else {
#pragma unroll
                for (int e = 0; e < N; e++) {
                    const int64_t at = P.op_kind[q] == CAT_OP_ONE    ? 0
                                       : P.op_kind[q] == CAT_OP_FULL ? o * P.R + r + e
                                                                     : (r + e) / P.inner;
                    b[e] = LITE ? kc_to_f(((const T *)P.op_p[q])[at])
                                : kc_ld_f(P.op_p[q], P.op_dtype[q], at);
                }
            }
#pragma unroll
            for (int e = 0; e < N; e++) {
                v[e] = st.lhs ? ew_step_binary<LITE>(st.op, v[e], b[e])
                              : ew_step_binary<LITE>(st.op, b[e], v[e]);
            }
        }
        T *dst = (T *)P.out + (o * P.R + r);
        if (N > 1) {
            uint4 u;
            T *h = (T *)&u;
#pragma unroll
            for (int e = 0; e < N; e++) h[e] = kc_from_f<T>(v[e]);
            *(uint4 *)dst = u;
        } else {
            dst[0] = kc_from_f<T>(v[0]);
        }
    }
}

// How tail operand t reads against out along cat dim `dim` (-1: none of the three forms).
static int cat_operand_kind(const kiln_tensor *t, const kiln_tensor *out, int dim) {
    int64_t n = kc_numel(t);
    if (n == 1) return CAT_OP_ONE;
    if (t->rank == out->rank) {
        int full = 1, chan = 1;
        for (uint32_t d = 0; d < out->rank; d++) {
            full = full && t->dims[d] == out->dims[d];
            chan = chan && t->dims[d] == ((int)d == dim ? out->dims[d] : 1);
        }
        if (full) return CAT_OP_FULL;
        if (chan) return CAT_OP_CHAN;
    }
    return -1;
}

// Fills P for the concatenation of args' inputs along dim (inputs and output dense, of one
// dtype, at most CAT_MAX); 0 when it does not apply.
static int cat_setup(const kiln_kernel_args *args, int dim, cat_params *P) {
    const kiln_tensor *y = args->out;
    int64_t outer = 1, inner = 1, at = 0;
    for (int d = 0; d < dim; d++) outer *= y->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < y->rank; d++) inner *= y->dims[d];
    memset(P, 0, sizeof *P);
    for (uint32_t i = 0; i < args->n_in; i++) {
        const kiln_tensor *x = args->in[i];
        if (x == NULL || x->dtype != y->dtype || x->rank != y->rank) return 0;
        if (x->dims[dim] == 0) continue;
        if (P->n == CAT_MAX) return 0;
        P->in[P->n] = x->data;
        P->L[P->n] = x->dims[dim] * inner;
        P->O[P->n] = at * inner;
        P->n++;
        at += x->dims[dim];
    }
    if (at != y->dims[dim]) return 0;
    P->outer = outer;
    P->inner = inner;
    P->R = y->dims[dim] * inner;
    P->out = y->data;
    return 1;
}

// Every L, O and R in units of u bytes (es: the element size) and every pointer aligned to it.
static int cat_units(const cat_params *P, size_t es, size_t u) {
    if ((P->R * (int64_t)es) % (int64_t)u != 0 || (uintptr_t)P->out % u != 0) return 0;
    for (int k = 0; k < P->n; k++) {
        if ((P->L[k] * (int64_t)es) % (int64_t)u != 0 || (uintptr_t)P->in[k] % u != 0) return 0;
    }
    return 1;
}

static void cat_rescale(cat_params *P, size_t es, size_t u) {
    P->R = P->R * (int64_t)es / (int64_t)u;
    for (int k = 0; k < P->n; k++) {
        P->L[k] = P->L[k] * (int64_t)es / (int64_t)u;
        P->O[k] = P->O[k] * (int64_t)es / (int64_t)u;
    }
}

// 16-byte rows with a lite program take the vector form; everything else (rows not of 16-byte
// units, programs with other ops: no zoo model has one) the element form of the interpreter. A
// vector form of the interpreter (its switch over every op unrolled for 8 values) was 9k
// instructions per dtype: the runtime wheel's size limit (docs/packaging.md).
template <typename T>
static void cat_prog_launch(const kiln_cuda_ctx *ctx, const cat_params *P, int vec_lite) {
    constexpr int N = 16 / (int)sizeof(T);
    const int64_t total = P->outer * (vec_lite ? P->R / N : P->R);
    if (vec_lite) {
        kc_launch(ctx, cat_prog_kernel<T, N, true>, kc_blocks(total, EW_BLOCK), EW_BLOCK, 0, *P);
    } else {
        kc_launch(ctx, cat_prog_kernel<T, 1, false>, kc_blocks(total, EW_BLOCK), EW_BLOCK, 0, *P);
    }
}

// One kernel for the concatenation of args' inputs along dim (logical dims in the order the
// tensors are stored: ctx->nhwc views come NHWC-ordered) and, when *fused is set on return, its
// tail. Returns KILN_ERR_UNSUPPORTED without launching anything when the inputs do not fit
// (more than CAT_MAX, mixed dtypes): the caller then copies input by input.
extern "C" kiln_status kiln_cuda_cat_fused(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                           int dim, int *fused) {
    cat_params P; // ~2 KB on the stack: execute allocates nothing
    const kiln_tensor *y = args->out;
    const size_t es = kiln_cuda_dtype_size(y->dtype);
    *fused = 0;
    if (es == 0 || !cat_setup(args, dim, &P)) return KILN_ERR_UNSUPPORTED;
    if (P.outer * P.R == 0) {
        *fused = 1;
        return KILN_OK;
    }
    int prog =
        args->n_tail > 0 && args->n_tail <= KILN_MAX_TAIL &&
        (y->dtype == KILN_DTYPE_F16 || y->dtype == KILN_DTYPE_BF16 || y->dtype == KILN_DTYPE_F32);
    for (uint32_t t = 0; prog && t < args->n_tail; t++) {
        const kiln_tail_op *tl = &args->tail[t];
        ew_step *st = &P.steps[P.n_steps++];
        ew_set_attrs(st, tl->op, &tl->attrs);
        st->operand = -1;
        if (tl->op == KILN_OP_CAST || tl->op == KILN_OP_WHERE || ew_n_inputs(tl->op) < 1) {
            prog = 0;
        } else if (ew_n_inputs(tl->op) == 2) {
            const int kind = tl->operand != NULL ? cat_operand_kind(tl->operand, y, dim) : -1;
            if (kind < 0 || !kiln_cuda_is_float(tl->operand->dtype)) {
                prog = 0;
                break;
            }
            st->operand = P.n_operands;
            st->lhs = tl->running_is_lhs != 0;
            P.op_p[P.n_operands] = tl->operand->data;
            P.op_dtype[P.n_operands] = tl->operand->dtype;
            P.op_kind[P.n_operands++] = kind;
        }
    }
    if (prog) {
        const int vec = cat_units(&P, es, 16);
        int lite = vec && ew_lite_steps(P.steps, P.n_steps);
        for (int q = 0; lite && q < P.n_operands; q++) {
            lite = P.op_dtype[q] == y->dtype;
            const int runs =
                P.op_kind[q] == CAT_OP_FULL || (P.op_kind[q] == CAT_OP_CHAN && P.inner == 1);
            P.op_vec[q] = runs && (uintptr_t)P.op_p[q] % 16 == 0;
        }
        switch (y->dtype) {
        case KILN_DTYPE_F16: cat_prog_launch<__half>(ctx, &P, lite); break;
        case KILN_DTYPE_BF16: cat_prog_launch<__nv_bfloat16>(ctx, &P, lite); break;
        default: cat_prog_launch<float>(ctx, &P, lite); break;
        }
        *fused = 1;
        return kiln_cuda_check_launch(ctx, "cat_prog_kernel");
    }
    P.n_steps = P.n_operands = 0;
    size_t u = 16;
    while (u > es && !cat_units(&P, es, u)) u /= 2;
    if (u == 8) u = 4; // (no 8-byte instantiation: 4-byte units instead)
    while (u > 1 && !cat_units(&P, es, u)) u /= 2;
    cat_rescale(&P, es, u);
    const unsigned blocks = kc_blocks(P.outer * P.R, EW_BLOCK);
    switch (u) {
    case 16: kc_launch(ctx, cat_copy_kernel<uint4>, blocks, EW_BLOCK, 0, P); break;
    case 4: kc_launch(ctx, cat_copy_kernel<uint32_t>, blocks, EW_BLOCK, 0, P); break;
    case 2: kc_launch(ctx, cat_copy_kernel<uint16_t>, blocks, EW_BLOCK, 0, P); break;
    default: kc_launch(ctx, cat_copy_kernel<uint8_t>, blocks, EW_BLOCK, 0, P); break;
    }
    return kiln_cuda_check_launch(ctx, "cat_copy_kernel");
}

// --- the profiler's delay kernel (KILN_CUDA_PROFILE, cuda_backend.c)

__global__ void kc_delay_kernel(unsigned long long ns) {
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 >= ns) break;
        __nanosleep(1000);
    }
}

extern "C" kiln_status kiln_cuda_delay(cudaStream_t stream, unsigned us) {
    kc_delay_kernel<<<1, 1, 0, stream>>>((unsigned long long)us * 1000ull);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE, "CUDA error launching the profile delay kernel: %s",
                              cudaGetErrorString(err));
    }
    return KILN_OK;
}

// --- rotary: y[.., i] = x[i] cos[i] + (i < D/2 ? -x[i + D/2] : x[i - D/2]) sin[i] over the last
// dim (transformers' rotate-half form; the CPU reference is src/cpu/op_eltwise.c). cos and sin
// broadcast to x (element strides over x's dims, 0 along a broadcast dim) and are read in their
// own dtype (x's, or float32 position tables); float32 math, one rounding to y's dtype. One
// thread per (row, i < R/2) pair: it writes y[i] and y[i + R/2]. R is D, or the tables' last
// dim when they cover only the first R of x's D (kiln_rotary_dims): then one more thread per
// passed element copies it. Index math is 32-bit (a 64-bit division costs ~100 instructions, a
// few of them per pair made Llama-1B's prefill rope group of a million pairs division-bound):
// x holds fewer than 2^31 elements, and so does a rope group's work. Interleaved (the op's
// attribute), pair i is (2i, 2i + 1) instead (rotate_every_two); the formula is the same.

typedef struct rot_params {
    int nlead;                 // leading dims of x kept (size-1 dims dropped)
    int64_t lead[KC_MAX_RANK]; // their sizes, outermost first
    int64_t cstr[KC_MAX_RANK]; // cos element strides over them
    int64_t sstr[KC_MAX_RANK]; // sin element strides over them
    int64_t xstr[KC_MAX_RANK]; // x's element strides over them (a rope group may read x
                               // through a folded permute's view: cuda_fold.h)
    int64_t c_last, s_last;    // strides along the last dim (1, or 0 when broadcast)
    int64_t rows, h, d;        // rows of x, R / 2 and D (a row's length)
    int pairs;                 // interleaved: pair i is (2i, 2i + 1), else (i, i + R/2)
} rot_params;

// The element offset of row `row` (over the nlead dims lead[], outermost first) through the
// element strides str[].
__device__ __forceinline__ int64_t rot_row_offset(const int64_t *lead, const int64_t *str,
                                                  int nlead, uint32_t row) {
    int64_t o = 0;
    for (int k = nlead - 1; k >= 0; k--) {
        const uint32_t n = (uint32_t)lead[k], q = row / n;
        o += (int64_t)(row - q * n) * str[k];
        row = q;
    }
    return o;
}

// Pair i of row `row` of x rotated into yr (the row's output).
template <typename T, typename TC, typename TS>
__device__ __forceinline__ void rotary_pair(const T *__restrict__ x, const TC *__restrict__ cs,
                                            const TS *__restrict__ sn, T *__restrict__ yr,
                                            const rot_params &P, uint32_t row, uint32_t i) {
    int64_t co = 0, so = 0, xo = 0;
    uint32_t rem = row;
    for (int k = P.nlead - 1; k >= 0; k--) {
        const uint32_t n = (uint32_t)P.lead[k], q = rem / n, j = rem - q * n;
        rem = q;
        co += (int64_t)j * P.cstr[k];
        so += (int64_t)j * P.sstr[k];
        xo += (int64_t)j * P.xstr[k];
    }
    const T *xr = x + xo;
    const uint32_t a = P.pairs ? 2 * i : i, b = P.pairs ? 2 * i + 1 : i + (uint32_t)P.h;
    const float x1 = kc_to_f(xr[a]), x2 = kc_to_f(xr[b]);
    const float c1 = kc_to_f(cs[co + a * P.c_last]), c2 = kc_to_f(cs[co + b * P.c_last]);
    const float s1 = kc_to_f(sn[so + a * P.s_last]), s2 = kc_to_f(sn[so + b * P.s_last]);
    yr[a] = kc_from_f<T>(x1 * c1 - x2 * s1);
    yr[b] = kc_from_f<T>(x2 * c2 + x1 * s2);
}

template <typename T, typename TC, typename TS>
static __global__ void rotary_kernel(const T *__restrict__ x, const TC *__restrict__ cs,
                                     const TS *__restrict__ sn, T *__restrict__ y,
                                     const __grid_constant__ rot_params P) {
    kc_pdl_enter();
    const uint32_t w = (uint32_t)(P.d - P.h), h = (uint32_t)P.h; // per row: h pairs, d - 2h passed
    const int64_t n = P.rows * w;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t row = (uint32_t)idx / w, i = (uint32_t)idx - row * w;
        if (i < h) {
            rotary_pair(x, cs, sn, y + (int64_t)row * P.d, P, row, i);
        } else { // a passed element: x's row through its strides (a view, or dense)
            y[(int64_t)row * P.d + h + i] = x[rot_row_offset(P.lead, P.xstr, P.nlead, row) + h + i];
        }
    }
}

// A rope group (cuda_fold.h) in one launch: q rotated into its output, k rotated straight into
// the key cache's rows at the index, and the value rows copied into the value cache's. A cache
// write's source row r (over every dim but the last) goes to cache row (r / n) * size + idx[r %
// n] (dim = rank - 2: n source rows per size cache rows); an index out of range (after the
// wrap) writes nothing, as index_copy.
typedef struct rope_cache_params {
    int64_t n, size;    // index entries; cache rows per outer step
    int64_t v_rows, dv; // value rows and their length (0 rows: no value write)
    int v_nlead;        // the value rows' dims (all but the last, size-1 ones dropped) ...
    int64_t v_lead[KC_MAX_RANK], v_str[KC_MAX_RANK]; // ... and their element strides
    const void *idx;
    uint32_t idx_dtype;
    int kwrap, vwrap;
} rope_cache_params;

__device__ __forceinline__ int64_t rope_cache_row(const rope_cache_params &C, uint32_t r,
                                                  int wrap) {
    const uint32_t n = (uint32_t)C.n, o = r / n, j = r - o * n;
    int64_t v = kc_ld_i(C.idx, C.idx_dtype, j);
    if (v < 0 && wrap) v += C.size;
    return v < 0 || v >= C.size ? -1 : (int64_t)o * C.size + v;
}

template <typename T, typename TC, typename TS>
static __global__ void
rope_cache_kernel(const T *__restrict__ xq, T *__restrict__ yq,
                  const __grid_constant__ rot_params Pq, const T *__restrict__ xk,
                  T *__restrict__ kc, const __grid_constant__ rot_params Pk,
                  const TC *__restrict__ cs, const TS *__restrict__ sn, const T *__restrict__ vs,
                  T *__restrict__ vc, const __grid_constant__ rope_cache_params C) {
    kc_pdl_enter();
    const int64_t nq = Pq.rows * Pq.h, nk = Pk.rows * Pk.h, n = nq + nk + C.v_rows * C.dv;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        if (idx < nq) {
            const uint32_t e = (uint32_t)idx, row = e / (uint32_t)Pq.h;
            rotary_pair(xq, cs, sn, yq + (int64_t)row * Pq.d, Pq, row, e - row * (uint32_t)Pq.h);
        } else if (idx < nq + nk) {
            const uint32_t e = (uint32_t)(idx - nq), row = e / (uint32_t)Pk.h;
            const int64_t dst = rope_cache_row(C, row, C.kwrap);
            if (dst >= 0) {
                rotary_pair(xk, cs, sn, kc + dst * Pk.d, Pk, row, e - row * (uint32_t)Pk.h);
            }
        } else {
            const uint32_t e = (uint32_t)(idx - nq - nk), row = e / (uint32_t)C.dv;
            const int64_t dst = rope_cache_row(C, row, C.vwrap);
            const int64_t vo = rot_row_offset(C.v_lead, C.v_str, C.v_nlead, row);
            const uint32_t col = e - row * (uint32_t)C.dv;
            if (dst >= 0) vc[dst * C.dv + col] = vs[vo + col];
        }
    }
}

// x viewed over the dims the tables rotate (its first R of D: kiln_rotary_dims), or 0 when the
// two tables disagree on R or R is not an even number of x's dims.
static int rotated_view(const kiln_tensor *x, const kiln_tensor *c, const kiln_tensor *s,
                        kiln_tensor *xr) {
    if (x->rank < 1) return 0;
    const int64_t d = x->dims[x->rank - 1];
    const int64_t r = kiln_rotary_dims(c->rank ? c->dims[c->rank - 1] : 1, d);
    if (r != kiln_rotary_dims(s->rank ? s->dims[s->rank - 1] : 1, d) || r % 2 != 0 || r > d)
        return 0;
    *xr = *x;
    xr->dims[x->rank - 1] = r;
    return 1;
}

extern "C" int kiln_cuda_rotary_supports(const kiln_kernel_args *args) {
    int64_t str[KC_MAX_RANK];
    if (args->n_in < 3 || args->in[0] == NULL || args->in[1] == NULL || args->in[2] == NULL)
        return 0;
    const kiln_tensor *x = args->in[0], *c = args->in[1], *s = args->in[2];
    kiln_tensor xr;
    if (x->rank < 1 || x->dims[x->rank - 1] % 2 != 0 || !rotated_view(x, c, s, &xr) ||
        kc_numel(x) > INT32_MAX)
        return 0;
    for (int i = 1; i < 3; i++) {
        uint32_t dt = args->in[i]->dtype;
        if (dt != x->dtype && dt != KILN_DTYPE_F32) return 0;
    }
    return kiln_broadcast_strides(c, &xr, str) && kiln_broadcast_strides(s, &xr, str);
}

// The rotary's parameters for x (cos c and sin s broadcast to it), x read through view xv
// (NULL: stored densely); pairs: the op's interleaved attribute.
static void rot_params_of(const kiln_tensor *x, const kiln_cuda_strided *xv, const kiln_tensor *c,
                          const kiln_tensor *s, int pairs, rot_params *P) {
    int64_t cstr[KC_MAX_RANK], sstr[KC_MAX_RANK], xstr[KC_MAX_RANK];
    memset(P, 0, sizeof *P);
    kiln_tensor xr = *x;
    rotated_view(x, c, s, &xr); // checked by kiln_cuda_rotary_supports
    kiln_broadcast_strides(c, &xr, cstr);
    kiln_broadcast_strides(s, &xr, sstr);
    if (xv != NULL) {
        memcpy(xstr, xv->str, sizeof(int64_t) * x->rank);
    } else {
        kc_strides(x, xstr);
    }
    const uint32_t last = x->rank - 1;
    P->pairs = pairs;
    P->h = xr.dims[last] / 2;
    P->d = x->dims[last];
    P->rows = kc_numel(x) / (x->dims[last] > 0 ? x->dims[last] : 1);
    P->c_last = cstr[last];
    P->s_last = sstr[last];
    for (uint32_t k = 0; k < last; k++) {
        if (x->dims[k] == 1) continue;
        P->lead[P->nlead] = x->dims[k];
        P->cstr[P->nlead] = cstr[k];
        P->sstr[P->nlead] = sstr[k];
        P->xstr[P->nlead] = xstr[k];
        P->nlead++;
    }
}

// A rope group from its q rotary (ctx->rope_*: cuda_fold.h checked the members' shapes at
// engine load; the kernel's assumptions are checked again here).
template <typename T, typename TC, typename TS>
static kiln_status rope_group_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *c = args->in[1], *s = args->in[2], *y = args->out;
    const kiln_tensor *xk = ctx->rope_kx, *kc = ctx->rope_kcache, *ix = ctx->rope_idx;
    const kiln_tensor *vs = ctx->rope_vsrc, *vc = ctx->rope_vcache;
    int64_t str[KC_MAX_RANK];
    const uint32_t r = xk->rank;
    int ok =
        xk->dtype == x->dtype && kc->dtype == x->dtype && kc->rank == r && r >= 2 &&
        ix->rank == 1 && xk->dims[r - 2] == ix->dims[0] && kc->dims[r - 1] == xk->dims[r - 1] &&
        kiln_broadcast_strides(c, xk, str) && kiln_broadcast_strides(s, xk, str) &&
        (vs == NULL || (vs->dtype == x->dtype && vc->dtype == x->dtype && vs->rank == r &&
                        vc->rank == r && vs->dims[r - 2] == ix->dims[0] &&
                        vc->dims[r - 2] == kc->dims[r - 2] && vc->dims[r - 1] == vs->dims[r - 1]));
    if (!ok) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda rotary: the rope group's operands changed shape at %s; set "
                              "the option cuda.attention_fold to false",
                              ctx->where ? ctx->where : "?");
    }
    // q's x, k's x, the value rows: through a folded permute's view, or as stored
    const kiln_cuda_strided *const *in = ctx->rope_in;
    for (int j = 0; j < 3; j++) {
        const kiln_tensor *t = j == 0 ? x : j == 1 ? xk : vs;
        if (in[j] != NULL &&
            (t == NULL || in[j]->rank != t->rank || in[j]->str[t->rank - 1] != 1)) {
            return kiln_cuda_fail(KILN_ERR_INTERNAL,
                                  "cuda rotary: a rope group's folded view of input %d disagrees "
                                  "with the tensor at %s; set the option cuda.attention_fold to "
                                  "false",
                                  j, ctx->where ? ctx->where : "?");
        }
    }
    rot_params Pq, Pk;
    if (kiln_attrs_int(&args->attrs, KILN_A_ROTARY_INTERLEAVED, 0) != 0) { // cuda_fold.c: halves
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda rotary: a rope group over an interleaved rotation at %s; set "
                              "the option cuda.attention_fold to false",
                              ctx->where ? ctx->where : "?");
    }
    rot_params_of(x, in[0], c, s, 0, &Pq);
    rot_params_of(xk, in[1], c, s, 0, &Pk);
    if (Pq.d != 2 * Pq.h || Pk.d != 2 * Pk.h) { // cuda_fold.c groups full rotations only
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda rotary: a rope group over a partial rotation at %s; set the "
                              "option cuda.attention_fold to false",
                              ctx->where ? ctx->where : "?");
    }
    rope_cache_params C;
    memset(&C, 0, sizeof C);
    C.n = ix->dims[0];
    C.size = kc->dims[r - 2];
    C.idx = ix->data;
    C.idx_dtype = ix->dtype;
    C.kwrap = ctx->rope_kwrap;
    C.vwrap = ctx->rope_vwrap;
    if (vs != NULL) {
        int64_t vstr[KC_MAX_RANK];
        if (in[2] != NULL) {
            memcpy(vstr, in[2]->str, sizeof(int64_t) * r);
        } else {
            kc_strides(vs, vstr);
        }
        C.dv = vs->dims[r - 1];
        C.v_rows = C.dv > 0 ? kc_numel(vs) / C.dv : 0;
        for (uint32_t k = 0; k + 1 < r; k++) {
            if (vs->dims[k] == 1) continue;
            C.v_lead[C.v_nlead] = vs->dims[k];
            C.v_str[C.v_nlead] = vstr[k];
            C.v_nlead++;
        }
    }
    if (C.n == 0) Pk.rows = C.v_rows = 0; // nothing to write
    const int64_t n = Pq.rows * Pq.h + Pk.rows * Pk.h + C.v_rows * C.dv;
    if (n == 0) return KILN_OK;
    if (n > INT32_MAX) { // the kernel's index math is 32-bit
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda rotary: a rope group of %lld elements (over 2^31) at %s; set "
                              "the option cuda.attention_fold to false",
                              (long long)n, ctx->where ? ctx->where : "?");
    }
    const void *xq_d = in[0] != NULL ? in[0]->data : x->data;
    const void *xk_d = in[1] != NULL ? in[1]->data : xk->data;
    const void *vs_d = vs == NULL ? NULL : in[2] != NULL ? in[2]->data : vs->data;
    kc_launch(ctx, rope_cache_kernel<T, TC, TS>, kc_blocks(n, EW_BLOCK), EW_BLOCK, 0,
              (const T *)xq_d, (T *)y->data, Pq, (const T *)xk_d, (T *)kc->data, Pk,
              (const TC *)c->data, (const TS *)s->data, (const T *)vs_d,
              vc != NULL ? (T *)vc->data : NULL, C);
    return kiln_cuda_check_launch(ctx, "rope_cache_kernel");
}

template <typename T, typename TC, typename TS>
static kiln_status rotary_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *c = args->in[1], *s = args->in[2], *y = args->out;
    if (ctx->rope_kx != NULL) return rope_group_run<T, TC, TS>(ctx, args);
    // x read through the attention fold's view (a head slice of a merged projection), or dense
    const kiln_cuda_strided *xv = ctx->sdpa_io[0];
    if (xv != NULL && (xv->rank != x->rank || x->rank == 0 || xv->str[x->rank - 1] != 1)) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda rotary: the folded view of x disagrees with the tensor at %s; "
                              "set the option cuda.attention_fold to false",
                              ctx->where ? ctx->where : "?");
    }
    rot_params P;
    rot_params_of(x, xv, c, s, kiln_attrs_int(&args->attrs, KILN_A_ROTARY_INTERLEAVED, 0) != 0, &P);
    if (P.rows == 0 || P.h == 0) return KILN_OK;
    // a thread per pair and per passed element (a partial rotation passes d - 2h of each row)
    kc_launch(ctx, rotary_kernel<T, TC, TS>, kc_blocks(P.rows * (P.d - P.h), EW_BLOCK), EW_BLOCK, 0,
              (const T *)(xv != NULL ? xv->data : x->data), (const TC *)c->data,
              (const TS *)s->data, (T *)y->data, P);
    return kiln_cuda_check_launch(ctx, "rotary_kernel");
}

// cos and sin each in x's dtype or float32
template <typename T>
static kiln_status rotary_tables(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const int cf = args->in[1]->dtype == KILN_DTYPE_F32, sf = args->in[2]->dtype == KILN_DTYPE_F32;
    if (cf && sf) return rotary_run<T, float, float>(ctx, args);
    if (cf) return rotary_run<T, float, T>(ctx, args);
    if (sf) return rotary_run<T, T, float>(ctx, args);
    return rotary_run<T, T, T>(ctx, args);
}

extern "C" kiln_status kiln_cuda_rotary(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    if (!kiln_cuda_rotary_supports(args) || args->in[0]->dtype != args->out->dtype) {
        return kiln_cuda_fail(
            KILN_ERR_UNSUPPORTED, "cuda rotary: x %s, cos %s, sin %s, output %s (rank %u) at %s",
            args->n_in > 0 && args->in[0] ? kiln_cuda_dtype_name(args->in[0]->dtype) : "-",
            args->n_in > 1 && args->in[1] ? kiln_cuda_dtype_name(args->in[1]->dtype) : "-",
            args->n_in > 2 && args->in[2] ? kiln_cuda_dtype_name(args->in[2]->dtype) : "-",
            kiln_cuda_dtype_name(args->out->dtype),
            args->n_in > 0 && args->in[0] ? args->in[0]->rank : 0, ctx->where ? ctx->where : "?");
    }
    switch (args->out->dtype) {
    case KILN_DTYPE_F32: return rotary_run<float, float, float>(ctx, args);
    case KILN_DTYPE_F16: return rotary_tables<__half>(ctx, args);
    case KILN_DTYPE_BF16: return rotary_tables<__nv_bfloat16>(ctx, args);
    default:
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda rotary: dtype %s at %s",
                              kiln_cuda_dtype_name(args->out->dtype),
                              ctx->where ? ctx->where : "?");
    }
}
