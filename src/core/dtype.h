// SPDX-License-Identifier: Apache-2.0
// dtype traits and element conversions. Kernels compute in float32 and convert at load/store:
// float16 and bfloat16 are converted with round-to-nearest-even, like PyTorch.
#ifndef KILN_CORE_DTYPE_H
#define KILN_CORE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kiln/kiln.h"

static inline bool kiln_dtype_valid(uint32_t dtype) {
    return dtype > KILN_DTYPE_INVALID && dtype < KILN_DTYPE_COUNT;
}
static inline bool kiln_dtype_is_float(uint32_t dtype) {
    return dtype == KILN_DTYPE_F32 || dtype == KILN_DTYPE_F16 || dtype == KILN_DTYPE_BF16;
}

float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);

static inline float kiln_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even
    return (uint16_t)(u >> 16);
}

// Reads element i of a buffer of `dtype` as float (bool -> 0/1, ints converted).
static inline float kiln_load_f32(const void *p, uint32_t dtype, int64_t i) {
    switch (dtype) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_I32: return (float)((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return (float)((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

// Writes element i of a buffer of `dtype` from float (ints truncate toward zero, bool = != 0).
static inline void kiln_store_f32(void *p, uint32_t dtype, int64_t i, float v) {
    switch (dtype) {
    case KILN_DTYPE_F32: ((float *)p)[i] = v; break;
    case KILN_DTYPE_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16(v); break;
    case KILN_DTYPE_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16(v); break;
    case KILN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0.0f; break;
    default: break;
    }
}

// Integer element access (exact for int64) used by index-consuming ops (embedding, ...).
static inline int64_t kiln_load_i64(const void *p, uint32_t dtype, int64_t i) {
    switch (dtype) {
    case KILN_DTYPE_I32: return ((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return (int64_t)kiln_load_f32(p, dtype, i);
    }
}

#endif // KILN_CORE_DTYPE_H
