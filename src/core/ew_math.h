// SPDX-License-Identifier: Apache-2.0
// Elementwise math where PyTorch's rules differ from C's, one definition for the CPU reference
// and the CUDA kernels. Division: remainder (Python's %: the result takes the divisor's sign), fmod
// (C's: the dividend's sign) and floor_divide (the quotient rounded toward minus infinity), in
// float32 (also the math of float16 and bfloat16) and in int64 (int32 too: narrowed after).
// Integers wrap like PyTorch's; a zero integer divisor, which PyTorch refuses with an exception,
// gives 0 here (a kernel cannot raise), and INT64_MIN / -1 wraps instead of trapping.
#ifndef KILN_CORE_EW_MATH_H
#define KILN_CORE_EW_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KILN_EW_MATH_FN static __device__ __noinline__ // (one copy per module: fmodf is long)
#else
#define KILN_EW_MATH_FN static inline
#endif

// maximum and minimum: a NaN on either side gives NaN (fmaxf and fminf return the other value).
KILN_EW_MATH_FN float kiln_maximum_f(float a, float b) {
    return a != a || b != b ? NAN : fmaxf(a, b);
}

KILN_EW_MATH_FN float kiln_minimum_f(float a, float b) {
    return a != a || b != b ? NAN : fminf(a, b);
}

// sign: -1, 0 or 1, and 0 for NaN and both zeros (PyTorch's CPU result).
KILN_EW_MATH_FN float kiln_sign_f(float x) { return (float)((0.0f < x) - (x < 0.0f)); }

KILN_EW_MATH_FN float kiln_fmod_f(float a, float b) { return fmodf(a, b); }

KILN_EW_MATH_FN float kiln_remainder_f(float a, float b) {
    float m = fmodf(a, b);
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m += b;
    return m;
}

// As ATen's div_floor_floating: exact where a / b is, and the quotient of a - fmod(a, b) rounded
// to the nearest integer (it is one up to rounding).
KILN_EW_MATH_FN float kiln_floor_divide_f(float a, float b) {
    if (b == 0.0f) return a / b;
    const float m = fmodf(a, b);
    float d = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
    if (d == 0.0f) return copysignf(0.0f, a / b);
    float f = floorf(d);
    if (d - f > 0.5f) f += 1.0f;
    return f;
}

KILN_EW_MATH_FN int64_t kiln_fmod_i(int64_t a, int64_t b) {
    return b == 0 || b == -1 ? 0 : a % b; // (x % -1 is 0; INT64_MIN % -1 would trap)
}

KILN_EW_MATH_FN int64_t kiln_remainder_i(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t m = a % b;
    if (m != 0 && ((b < 0) != (m < 0))) m += b;
    return m;
}

KILN_EW_MATH_FN int64_t kiln_floor_divide_i(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0u - (uint64_t)a); // wraps at INT64_MIN
    const int64_t q = a / b, r = a % b;
    return r != 0 && ((a < 0) != (b < 0)) ? q - 1 : q;
}

#undef KILN_EW_MATH_FN
#endif
