// SPDX-License-Identifier: Apache-2.0
// Shared machinery of the CPU backend: scratch carving, dtype row conversion and the
// broadcasting row iterator (see cpu_internal.h).
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

// --- scratch

void kiln_cpu_scratch_init(kiln_cpu_scratch *s, const kiln_kernel_args *args) {
    uintptr_t p = (uintptr_t)args->scratch;
    size_t n = args->scratch ? args->scratch_nbytes : 0;
    size_t pad = (size_t)((KILN_CPU_ALIGN - (p % KILN_CPU_ALIGN)) % KILN_CPU_ALIGN);
    s->base = NULL;
    s->nbytes = 0;
    s->used = 0;
    if (p != 0 && n >= pad) {
        s->base = (uint8_t *)args->scratch + pad;
        s->nbytes = n - pad;
    }
}

void *kiln_cpu_scratch_bytes(kiln_cpu_scratch *s, size_t nbytes, const char *what) {
    static uint64_t empty; // what an empty request points at (never written)
    size_t need = (nbytes + KILN_CPU_ALIGN - 1) & ~(size_t)(KILN_CPU_ALIGN - 1);
    if (need == 0) return &empty;
    if (s->base == NULL || need > s->nbytes - s->used) {
        kiln_fail(KILN_ERR_INTERNAL,
                  "cpu backend: scratch too small for %s (need %zu more bytes, have %zu of %zu "
                  "left): the runtime must size scratch with kiln_cpu_scratch_nbytes",
                  what, need, s->base ? s->nbytes - s->used : 0, s->nbytes);
        return NULL;
    }
    void *p = s->base + s->used;
    s->used += need;
    return p;
}

float *kiln_cpu_scratch_f32(kiln_cpu_scratch *s, int64_t n, const char *what) {
    return (float *)kiln_cpu_scratch_bytes(s, kiln_cpu_f32_nbytes(n), what);
}

// --- dtype rows

// float16 <-> float32 without branches on the common path (F. Giesen's conversions); exact and
// bit-identical to kiln_f16_to_f32 / kiln_f32_to_f16 (round to nearest even), which the tests
// check exhaustively.
float kiln_cpu_f16_to_f32(uint16_t h) {
    const uint32_t shifted_exp = 0x7c00u << 13;
    uint32_t u = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t exp = shifted_exp & u;
    float f;
    u += (127u - 15u) << 23;
    if (exp == shifted_exp) {
        u += (128u - 16u) << 23; // Inf / NaN
    } else if (exp == 0) {       // zero / subnormal: renormalize through a float subtraction
        const uint32_t magic_u = 113u << 23;
        float magic;
        memcpy(&magic, &magic_u, sizeof magic);
        u += 1u << 23;
        memcpy(&f, &u, sizeof f);
        f -= magic;
        memcpy(&u, &f, sizeof u);
    }
    u |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t kiln_cpu_f32_to_f16(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    uint32_t sign = u & 0x80000000u;
    uint16_t o;
    u ^= sign;
    if (u >= ((127u + 16u) << 23)) { // >= 65536: Inf, or NaN -> quiet NaN
        o = u > (255u << 23) ? 0x7e00u : 0x7c00u;
    } else if (u < (113u << 23)) { // subnormal or zero in half
        const uint32_t dm_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
        float f, dm;
        memcpy(&f, &u, sizeof f);
        memcpy(&dm, &dm_u, sizeof dm);
        f += dm; // the FPU rounds to nearest even
        memcpy(&u, &f, sizeof u);
        o = (uint16_t)(u - dm_u);
    } else {
        uint32_t mant_odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        u += mant_odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

int64_t kiln_cpu_f32_to_i64(float v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18f) return INT64_MAX;
    if (v <= -9.2233720368547758e18f) return INT64_MIN;
    return (int64_t)v;
}

static int32_t f32_to_i32(float v) {
    if (v != v) return 0;
    if (v >= 2147483647.0f) return INT32_MAX;
    if (v <= -2147483648.0f) return INT32_MIN;
    return (int32_t)v;
}

void kiln_cpu_load_f32(const void *src, uint32_t dtype, int64_t off, int64_t stride, int64_t n,
                       float *dst) {
    switch (dtype) {
    case KILN_DTYPE_F32: {
        const float *p = (const float *)src + off;
        if (stride == 1) {
            memcpy(dst, p, (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++) dst[i] = p[i * stride];
        }
        break;
    }
    case KILN_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = kiln_cpu_f16_to_f32(p[i * stride]);
        break;
    }
    case KILN_DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_f32(p[i * stride]);
        break;
    }
    case KILN_DTYPE_I32: {
        const int32_t *p = (const int32_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)p[i * stride];
        break;
    }
    case KILN_DTYPE_I64: {
        const int64_t *p = (const int64_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)p[i * stride];
        break;
    }
    case KILN_DTYPE_BOOL: {
        const uint8_t *p = (const uint8_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = p[i * stride] ? 1.0f : 0.0f;
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = 0.0f;
        break;
    }
}

void kiln_cpu_store_f32(void *dst, uint32_t dtype, int64_t off, int64_t n, const float *src) {
    switch (dtype) {
    case KILN_DTYPE_F32: {
        float *p = (float *)dst + off;
        if (p != src) memcpy(p, src, (size_t)n * sizeof(float));
        break;
    }
    case KILN_DTYPE_F16: {
        uint16_t *p = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i] = kiln_cpu_f32_to_f16(src[i]);
        break;
    }
    case KILN_DTYPE_BF16: {
        uint16_t *p = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i] = kiln_f32_to_bf16(src[i]);
        break;
    }
    case KILN_DTYPE_I32: {
        int32_t *p = (int32_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i] = f32_to_i32(src[i]);
        break;
    }
    case KILN_DTYPE_I64: {
        int64_t *p = (int64_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i] = kiln_cpu_f32_to_i64(src[i]);
        break;
    }
    case KILN_DTYPE_BOOL: {
        uint8_t *p = (uint8_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i] = src[i] != 0.0f;
        break;
    }
    default: break;
    }
}

void kiln_cpu_load_i64(const void *src, uint32_t dtype, int64_t off, int64_t stride, int64_t n,
                       int64_t *dst) {
    switch (dtype) {
    case KILN_DTYPE_I32: {
        const int32_t *p = (const int32_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = p[i * stride];
        break;
    }
    case KILN_DTYPE_I64: {
        const int64_t *p = (const int64_t *)src + off;
        if (stride == 1) {
            memcpy(dst, p, (size_t)n * sizeof(int64_t));
        } else {
            for (int64_t i = 0; i < n; i++) dst[i] = p[i * stride];
        }
        break;
    }
    case KILN_DTYPE_BOOL: {
        const uint8_t *p = (const uint8_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = p[i * stride] != 0;
        break;
    }
    default: {
        float tmp[256];
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            kiln_cpu_load_f32(src, dtype, off + i * stride, stride, m, tmp);
            for (int64_t j = 0; j < m; j++) dst[i + j] = kiln_cpu_f32_to_i64(tmp[j]);
        }
        break;
    }
    }
}

void kiln_cpu_store_i64(void *dst, uint32_t dtype, int64_t off, int64_t n, const int64_t *src) {
    switch (dtype) {
    case KILN_DTYPE_I32: {
        int32_t *p = (int32_t *)dst + off;
        // Narrowing wraps like PyTorch (two's complement through uint32).
        for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(uint32_t)(uint64_t)src[i];
        break;
    }
    case KILN_DTYPE_I64: {
        int64_t *p = (int64_t *)dst + off;
        if (p != src) memmove(p, src, (size_t)n * sizeof(int64_t));
        break;
    }
    case KILN_DTYPE_BOOL: {
        uint8_t *p = (uint8_t *)dst + off;
        for (int64_t i = 0; i < n; i++) p[i] = src[i] != 0;
        break;
    }
    default: {
        float tmp[256];
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            for (int64_t j = 0; j < m; j++) tmp[j] = (float)src[i + j];
            kiln_cpu_store_f32(dst, dtype, off + i, m, tmp);
        }
        break;
    }
    }
}

void kiln_cpu_strides(const kiln_tensor *t, int64_t *strides) {
    int64_t s = 1;
    for (uint32_t i = t->rank; i-- > 0;) {
        strides[i] = s;
        s *= t->dims[i];
    }
}

int kiln_cpu_norm_dim(int64_t dim, uint32_t rank) {
    if (dim < 0) dim += rank;
    return dim >= 0 && dim < (int64_t)rank ? (int)dim : -1;
}

// --- broadcasting row iterator

void kiln_cpu_iter_init_strided(kiln_cpu_iter *it, int rank, const int64_t *dims, int n_ops,
                                const int64_t (*strides)[KILN_MAX_RANK]) {
    memset(it, 0, sizeof *it);
    it->n_ops = n_ops;
    // Drop size-1 dims, then merge neighbours that are contiguous for every operand.
    int nr = 0;
    for (int d = 0; d < rank; d++) {
        if (dims[d] == 1) continue;
        if (nr > 0) {
            int merge = 1;
            for (int o = 0; o < n_ops; o++) {
                if (it->strides[o][nr - 1] != strides[o][d] * dims[d]) merge = 0;
            }
            if (merge) {
                it->dims[nr - 1] *= dims[d];
                for (int o = 0; o < n_ops; o++) it->strides[o][nr - 1] = strides[o][d];
                continue;
            }
        }
        it->dims[nr] = dims[d];
        for (int o = 0; o < n_ops; o++) it->strides[o][nr] = strides[o][d];
        nr++;
    }
    if (nr == 0) {
        it->dims[0] = 1;
        for (int o = 0; o < n_ops; o++) it->strides[o][0] = 0;
        nr = 1;
    }
    it->rank = nr;
}

void kiln_cpu_iter_init(kiln_cpu_iter *it, const kiln_tensor *out, const kiln_tensor *const *ins,
                        int n_in) {
    int r = (int)out->rank;
    int64_t st[KILN_CPU_ITER_MAX][KILN_MAX_RANK];
    kiln_cpu_strides(out, st[0]);
    for (int i = 0; i < n_in; i++) {
        const kiln_tensor *t = ins[i];
        int64_t ts[KILN_MAX_RANK];
        kiln_cpu_strides(t, ts);
        int ri = (int)t->rank;
        for (int d = 0; d < r; d++) {
            int id = d - (r - ri);
            st[i + 1][d] = (id < 0 || t->dims[id] == 1) ? 0 : ts[id];
        }
    }
    kiln_cpu_iter_init_strided(it, r, out->dims, 1 + n_in, (const int64_t(*)[KILN_MAX_RANK])st);
}

void kiln_cpu_iter_run(const kiln_cpu_iter *it, kiln_cpu_row_fn row, void *ctx) {
    int r = it->rank;
    int64_t outer = 1;
    for (int d = 0; d < r; d++) {
        if (it->dims[d] == 0) return;
        if (d < r - 1) outer *= it->dims[d];
    }
    int64_t idx[KILN_MAX_RANK] = {0};
    int64_t offs[KILN_CPU_ITER_MAX] = {0};
    int64_t inner[KILN_CPU_ITER_MAX];
    for (int o = 0; o < it->n_ops; o++) inner[o] = it->strides[o][r - 1];
    for (int64_t i = 0; i < outer; i++) {
        row(ctx, offs, it->dims[r - 1], inner);
        for (int d = r - 2; d >= 0; d--) {
            idx[d]++;
            for (int o = 0; o < it->n_ops; o++) offs[o] += it->strides[o][d];
            if (idx[d] < it->dims[d]) break;
            for (int o = 0; o < it->n_ops; o++) offs[o] -= it->strides[o][d] * it->dims[d];
            idx[d] = 0;
        }
    }
}
