// SPDX-License-Identifier: Apache-2.0
// dtype table and float16 conversion (round to nearest even, subnormals and infinities kept).
#include "core/dtype.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_INVALID] = {"invalid", 0}, [KILN_DTYPE_F32] = {"float32", 4},
    [KILN_DTYPE_F16] = {"float16", 2},     [KILN_DTYPE_BF16] = {"bfloat16", 2},
    [KILN_DTYPE_I32] = {"int32", 4},       [KILN_DTYPE_I64] = {"int64", 8},
    [KILN_DTYPE_BOOL] = {"bool", 1},
};

size_t kiln_dtype_size(kiln_dtype dtype) {
    return kiln_dtype_valid((uint32_t)dtype) ? dtypes[dtype].size : 0;
}

const char *kiln_dtype_name(kiln_dtype dtype) {
    return kiln_dtype_valid((uint32_t)dtype) ? dtypes[dtype].name : "invalid";
}

float kiln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { // subnormal: normalize
            exp = 127 - 15 + 1;
            while ((man & 0x400u) == 0) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t kiln_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  // NaN
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); // overflow (rounds to inf)
    if (abs < 0x38800000u) {                                   // subnormal or zero in half
        if (abs < 0x33000000u) return (uint16_t)sign;          // rounds to zero
        uint32_t exp = abs >> 23;
        uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        // value = man * 2^(exp - 150) and the half subnormal unit is 2^-24, so the result is
        // man >> (126 - exp), rounded to nearest even (shift is 14..24 here).
        uint32_t shift = 126 - exp;
        uint32_t q = man >> (shift);
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = (abs >> 13) - ((127u - 15u) << 10);
    uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}
