// SPDX-License-Identifier: Apache-2.0
// Overflow-checked size arithmetic. Every offset and size computed from untrusted bytes goes
// through these: they return 0 on overflow and never write *out then.
#ifndef KILN_CORE_CHECKED_H
#define KILN_CORE_CHECKED_H

#include <stdbool.h>
#include <stdint.h>

static inline bool kiln_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a > UINT64_MAX - b) return false;
    *out = a + b;
    return true;
}

static inline bool kiln_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}

// True when [off, off + len) lies inside [0, size): written so that it cannot wrap.
static inline bool kiln_range_ok(uint64_t off, uint64_t len, uint64_t size) {
    return off <= size && len <= size - off;
}

// Rounds up to a multiple of align (a power of two); false on overflow.
static inline bool kiln_align_up_u64(uint64_t v, uint64_t align, uint64_t *out) {
    uint64_t t;
    if (!kiln_add_u64(v, align - 1, &t)) return false;
    *out = t & ~(align - 1);
    return true;
}

#endif // KILN_CORE_CHECKED_H
