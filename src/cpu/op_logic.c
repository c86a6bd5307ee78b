// SPDX-License-Identifier: Apache-2.0
// Comparisons (eq, ne, lt, le, gt, ge: any input dtype, bool output) and bitwise ops
// (bitwise_and/or/xor/not: logical on bool, two's complement bitwise on int32/int64), with numpy
// broadcasting. Float inputs compare as float32 (NaN compares unequal to everything, so only ne
// is true), integer and bool inputs exactly as int64.
#include <string.h>

#include "cpu/cpu_internal.h"

#define CHUNK 256

typedef struct logic_ctx {
    uint32_t op;
    int as_float; // comparisons of float inputs
    int n_in;
    const void *src[2];
    uint32_t sdt[2];
    void *dst;
    uint32_t ddt;
} logic_ctx;

// The comparisons: one body for float and for integer operands.
#define DEFINE_CMP(name, T)                                                                        \
    static int name(uint32_t op, T a, T b) {                                                       \
        switch (op) {                                                                              \
        case KILN_OP_EQ: return a == b;                                                            \
        case KILN_OP_NE: return a != b;                                                            \
        case KILN_OP_LT: return a < b;                                                             \
        case KILN_OP_LE: return a <= b;                                                            \
        case KILN_OP_GT: return a > b;                                                             \
        default: return a >= b;                                                                    \
        }                                                                                          \
    }
DEFINE_CMP(cmp_f, float)
DEFINE_CMP(cmp_i, int64_t)
#undef DEFINE_CMP

static int64_t bit_i(uint32_t op, int64_t a, int64_t b) {
    switch (op) {
    case KILN_OP_BITWISE_AND: return a & b;
    case KILN_OP_BITWISE_OR: return a | b;
    case KILN_OP_BITWISE_XOR: return a ^ b;
    default: return ~a;
    }
}

static void row_logic(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const logic_ctx *c = (const logic_ctx *)vctx;
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        int64_t y[CHUNK];
        if (c->as_float) {
            float a[CHUNK], b[CHUNK];
            kiln_cpu_load_f32(c->src[0], c->sdt[0], offs[1] + i0 * inner[1], inner[1], m, a);
            kiln_cpu_load_f32(c->src[1], c->sdt[1], offs[2] + i0 * inner[2], inner[2], m, b);
            for (int64_t i = 0; i < m; i++) y[i] = cmp_f(c->op, a[i], b[i]);
        } else {
            int64_t a[CHUNK], b[CHUNK];
            kiln_cpu_load_i64(c->src[0], c->sdt[0], offs[1] + i0 * inner[1], inner[1], m, a);
            if (c->n_in == 2) {
                kiln_cpu_load_i64(c->src[1], c->sdt[1], offs[2] + i0 * inner[2], inner[2], m, b);
            } else {
                memset(b, 0, sizeof b);
            }
            if (c->op >= KILN_OP_BITWISE_AND) {
                for (int64_t i = 0; i < m; i++) y[i] = bit_i(c->op, a[i], b[i]);
                if (c->ddt == KILN_DTYPE_BOOL) {
                    for (int64_t i = 0; i < m; i++) y[i] &= 1; // logical on 0/1 values
                }
            } else {
                for (int64_t i = 0; i < m; i++) y[i] = cmp_i(c->op, a[i], b[i]);
            }
        }
        kiln_cpu_store_i64(c->dst, c->ddt, offs[0] + i0, m, y);
    }
}

int kiln_cpu_logic_supports(const kiln_kernel_args *args) {
    uint32_t op = args->op;
    int cmp = op >= KILN_OP_EQ && op <= KILN_OP_GE;
    int n = op == KILN_OP_BITWISE_NOT ? 1 : 2;
    const kiln_tensor *y = args->out;
    if (!cmp && !(op >= KILN_OP_BITWISE_AND && op <= KILN_OP_BITWISE_NOT)) return 0;
    if (args->n_in != (uint32_t)n) return 0;
    for (int i = 0; i < n; i++) {
        const kiln_tensor *t = args->in[i];
        if (t == NULL || t->rank > y->rank || t->dtype != args->in[0]->dtype) return 0;
        for (uint32_t d = 0; d < t->rank; d++) {
            int64_t id = t->dims[d], od = y->dims[y->rank - t->rank + d];
            if (id != 1 && id != od) return 0;
        }
    }
    if (cmp) return y->dtype == KILN_DTYPE_BOOL;
    return y->dtype == args->in[0]->dtype && kiln_cpu_is_int(y->dtype);
}

static kiln_status run_logic(const kiln_kernel_args *args) {
    KILN_CHECK(kiln_cpu_logic_supports(args), KILN_ERR_UNSUPPORTED,
               "cpu %s: operands do not broadcast to the output, or the dtypes are not supported",
               kiln_op_name(args->op));
    logic_ctx c;
    memset(&c, 0, sizeof c);
    c.op = args->op;
    c.n_in = (int)args->n_in;
    for (int i = 0; i < c.n_in; i++) {
        c.src[i] = args->in[i]->data;
        c.sdt[i] = args->in[i]->dtype;
    }
    c.as_float = kiln_dtype_is_float((kiln_dtype)args->in[0]->dtype);
    c.dst = args->out->data;
    c.ddt = args->out->dtype;
    kiln_cpu_iter it;
    kiln_cpu_iter_init(&it, args->out, args->in, c.n_in);
    kiln_cpu_iter_run(&it, row_logic, &c);
    return KILN_OK;
}

kiln_status kiln_cpu_compare(const kiln_kernel_args *args) { return run_logic(args); }
size_t kiln_cpu_compare_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_bitwise(const kiln_kernel_args *args) { return run_logic(args); }
size_t kiln_cpu_bitwise_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}
