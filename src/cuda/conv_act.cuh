// SPDX-License-Identifier: Apache-2.0
// The activations a convolution kernel of Kiln's own applies before its one rounding (the
// depthwise kernel in op_conv.cu, the pointwise kernel in conv_pw.cu): the code of a tail op the
// kernels can take, and its value.
#ifndef KILN_CUDA_CONV_ACT_CUH
#define KILN_CUDA_CONV_ACT_CUH

#include <math.h>

#include "cuda/cuda_common.cuh"

enum {
    KC_ACT_NONE,
    KC_ACT_RELU,
    KC_ACT_CLAMP,
    KC_ACT_SILU,
    KC_ACT_HARDSWISH,
    KC_ACT_SIGMOID,
    KC_ACT_GELU_ERF,
    KC_ACT_GELU_TANH
};

// SiLU and sigmoid divide with __fdividef (a reciprocal and a multiply; 2 ulp in float32, far
// inside a 16-bit output's rounding): the IEEE division carries a slow-path branch per value,
// which made the pointwise kernel's SiLU epilogue 4x its time without an activation. A
// denominator that overflows to inf gives 0, as the limit does.
__device__ __forceinline__ float kc_conv_act(float v, int act, float lo, float hi) {
    switch (act) {
    case KC_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case KC_ACT_CLAMP: return fminf(fmaxf(v, lo), hi); // an absent bound is -inf / inf
    case KC_ACT_SILU: return __fdividef(v, 1.0f + __expf(-v));
    case KC_ACT_HARDSWISH: return v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
    case KC_ACT_SIGMOID: return __fdividef(1.0f, 1.0f + __expf(-v));
    case KC_ACT_GELU_ERF: return kc_gelu_erf(v);
    case KC_ACT_GELU_TANH: return kc_gelu_tanh(v);
    default: return v;
    }
}

// kc_conv_act over n values, the switch taken once: each case is its own unrolled loop, so a
// kernel's epilogue runs one compact block instead of a switch per value (the pointwise
// kernel's epilogue with a switch per value ran at half its speed).
template <int N>
__device__ __forceinline__ void kc_conv_act_all(float *v, int act, float lo, float hi) {
    switch (act) {
#define KC_ACT_ALL(A)                                                                              \
    case A:                                                                                        \
        _Pragma("unroll") for (int i = 0; i < N; i++) v[i] = kc_conv_act(v[i], A, lo, hi);         \
        break;
        KC_ACT_ALL(KC_ACT_RELU)
        KC_ACT_ALL(KC_ACT_CLAMP)
        KC_ACT_ALL(KC_ACT_SILU)
        KC_ACT_ALL(KC_ACT_HARDSWISH)
        KC_ACT_ALL(KC_ACT_SIGMOID)
        KC_ACT_ALL(KC_ACT_GELU_ERF)
        KC_ACT_ALL(KC_ACT_GELU_TANH)
#undef KC_ACT_ALL
    default: break;
    }
}

// The activation code of tail op t (KC_ACT_NONE when the kernels cannot apply it: an op with an
// operand, or another op); *lo, *hi: a clamp's bounds.
static inline int kc_conv_act_of(const kiln_tail_op *t, float *lo, float *hi) {
    *lo = -INFINITY;
    *hi = INFINITY;
    if (t->operand != NULL) return KC_ACT_NONE;
    switch (t->op) {
    case KILN_OP_RELU: return KC_ACT_RELU;
    case KILN_OP_SILU: return KC_ACT_SILU;
    case KILN_OP_HARDSWISH: return KC_ACT_HARDSWISH;
    case KILN_OP_SIGMOID: return KC_ACT_SIGMOID;
    case KILN_OP_GELU:
        return kiln_attrs_int(&t->attrs, KILN_A_GELU_APPROXIMATE, 0) ? KC_ACT_GELU_TANH
                                                                     : KC_ACT_GELU_ERF;
    case KILN_OP_CLAMP: {
        double a = kiln_attrs_float(&t->attrs, KILN_A_CLAMP_MIN, 0);
        double b = kiln_attrs_float(&t->attrs, KILN_A_CLAMP_MAX, 0);
        if (a == a) *lo = (float)a;
        if (b == b) *hi = (float)b;
        return KC_ACT_CLAMP;
    }
    default: return KC_ACT_NONE;
    }
}

#endif // KILN_CUDA_CONV_ACT_CUH
