// SPDX-License-Identifier: Apache-2.0
// Helpers for the CPU kernel tests (src/cpu/*_test.c): attribute lists with schema defaults,
// test tensors in any dtype, a runner that sizes scratch exactly as kiln_cpu_scratch_nbytes
// asks (poisoned, so ASan and NaN checks catch over-use and uninitialized reads), and a
// tolerance comparison against a double-precision reference.
#ifndef KILN_CPU_TEST_UTIL_H
#define KILN_CPU_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "cpu/cpu.h"

// --- attributes

typedef struct tattrs {
    kiln_attr_ref refs[KILN_MAX_ATTRS];
    int64_t ints[256];
    double floats[64];
    uint32_t n_ints, n_floats;
    kiln_attrs view;
} tattrs;

static inline void tattrs_sync(tattrs *a, uint32_t n_attrs) {
    a->view.refs = a->refs;
    a->view.n_attrs = n_attrs;
    a->view.ints = a->ints;
    a->view.floats = a->floats;
}

// Every attribute of `op` at its schema default (required ones empty until set).
static inline void tattrs_init(tattrs *a, uint32_t op) {
    memset(a, 0, sizeof *a);
    const kiln_op_def *d = kiln_op_def_get(op);
    uint32_t n = d ? d->n_attrs : 0;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_attr_info *ai = &d->attrs[i];
        a->refs[i].kind = ai->kind;
        a->refs[i].n = ai->n_default;
        if (ai->kind == KILN_ATTR_INTS) {
            a->refs[i].begin = a->n_ints;
            for (uint32_t j = 0; j < ai->n_default; j++) a->ints[a->n_ints++] = ai->default_ints[j];
        } else {
            a->refs[i].begin = a->n_floats;
            for (uint32_t j = 0; j < ai->n_default; j++) {
                a->floats[a->n_floats++] = ai->default_floats[j];
            }
        }
    }
    tattrs_sync(a, n);
}

static inline void tattrs_ints(tattrs *a, uint32_t idx, uint32_t n, const int64_t *v) {
    a->refs[idx].kind = KILN_ATTR_INTS;
    a->refs[idx].n = n;
    a->refs[idx].begin = a->n_ints;
    for (uint32_t j = 0; j < n; j++) a->ints[a->n_ints++] = v[j];
}
static inline void tattrs_int(tattrs *a, uint32_t idx, int64_t v) { tattrs_ints(a, idx, 1, &v); }
static inline void tattrs_int2(tattrs *a, uint32_t idx, int64_t v0, int64_t v1) {
    int64_t v[2] = {v0, v1};
    tattrs_ints(a, idx, 2, v);
}
static inline void tattrs_float(tattrs *a, uint32_t idx, double v) {
    a->refs[idx].kind = KILN_ATTR_FLOATS;
    a->refs[idx].n = 1;
    a->refs[idx].begin = a->n_floats;
    a->floats[a->n_floats++] = v;
}

// --- tensors (test memory: plain malloc)

static inline kiln_tensor *tt_new(uint32_t dtype, uint32_t rank, const int64_t *dims) {
    kiln_tensor *t = (kiln_tensor *)calloc(1, sizeof *t);
    t->dtype = dtype;
    t->rank = rank;
    for (uint32_t i = 0; i < rank; i++) t->dims[i] = dims[i];
    size_t n = (size_t)kiln_tensor_numel(t) * kiln_dtype_size((kiln_dtype)dtype);
    t->data = malloc(n ? n : 1);
    memset(t->data, 0xA5, n ? n : 1); // garbage: a kernel must write every element
    return t;
}
static inline kiln_tensor *tt_new1(uint32_t dtype, int64_t d0) { return tt_new(dtype, 1, &d0); }
static inline kiln_tensor *tt_new2(uint32_t dtype, int64_t d0, int64_t d1) {
    int64_t d[2] = {d0, d1};
    return tt_new(dtype, 2, d);
}
static inline kiln_tensor *tt_new3(uint32_t dtype, int64_t d0, int64_t d1, int64_t d2) {
    int64_t d[3] = {d0, d1, d2};
    return tt_new(dtype, 3, d);
}
static inline kiln_tensor *tt_new4(uint32_t dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t d[4] = {d0, d1, d2, d3};
    return tt_new(dtype, 4, d);
}
static inline void tt_free(kiln_tensor *t) {
    if (t == NULL) return;
    free(t->data);
    free(t);
}
static inline int64_t tt_numel(const kiln_tensor *t) { return kiln_tensor_numel(t); }

static inline double tt_get(const kiln_tensor *t, int64_t i) {
    if (t->dtype == KILN_DTYPE_I64) return (double)((const int64_t *)t->data)[i];
    return (double)kiln_load_f32(t->data, t->dtype, i);
}
static inline void tt_set(kiln_tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case KILN_DTYPE_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case KILN_DTYPE_I64: ((int64_t *)t->data)[i] = (int64_t)v; break;
    case KILN_DTYPE_BOOL: ((uint8_t *)t->data)[i] = v != 0.0; break;
    default: kiln_store_f32(t->data, t->dtype, i, (float)v); break;
    }
}
// Uniform random values in [lo, hi) (integers in [lo, hi] for integer dtypes).
static inline void tt_rand(kiln_tensor *t, double lo, double hi) {
    for (int64_t i = 0; i < tt_numel(t); i++) {
        if (t->dtype == KILN_DTYPE_BOOL) {
            tt_set(t, i, (double)(check_rng_u64() & 1));
        } else if (t->dtype == KILN_DTYPE_I32 || t->dtype == KILN_DTYPE_I64) {
            tt_set(t, i, (double)check_rng_int((int64_t)lo, (int64_t)hi));
        } else {
            tt_set(t, i, check_rng_uniform((float)lo, (float)hi));
        }
    }
}
static inline void tt_set_all(kiln_tensor *t, const double *v) {
    for (int64_t i = 0; i < tt_numel(t); i++) tt_set(t, i, v[i]);
}

// --- running

static inline kiln_kernel_args targs(uint32_t op, const tattrs *a, kiln_tensor *const *ins,
                                     uint32_t n_in, kiln_tensor *out) {
    kiln_kernel_args args;
    memset(&args, 0, sizeof args);
    args.op = op;
    if (a) args.attrs = a->view;
    for (uint32_t i = 0; i < n_in; i++) args.in[i] = ins[i];
    args.n_in = n_in;
    args.out = out;
    return args;
}

// Runs with exactly the scratch the backend asks for (poisoned with 0xFF = NaN floats), placed
// at an odd 16-byte offset so that alignment handling is exercised.
static inline kiln_status trun_args(kiln_kernel_args *args) {
    size_t n = kiln_cpu_scratch_nbytes(args);
    unsigned char *buf = (unsigned char *)malloc(n + 16);
    memset(buf, 0xFF, n + 16);
    args->scratch = n ? buf + 16 : NULL;
    args->scratch_nbytes = n;
    kiln_status st = kiln_cpu_run(args);
    free(buf);
    return st;
}
static inline kiln_status trun(uint32_t op, const tattrs *a, kiln_tensor *const *ins, uint32_t n_in,
                               kiln_tensor *out) {
    kiln_kernel_args args = targs(op, a, ins, n_in, out);
    return trun_args(&args);
}

// --- comparing

// Tolerance for storing a value in dtype (one rounding) on top of a float32 computation.
static inline double tt_rtol(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F16: return 2e-3;
    case KILN_DTYPE_BF16: return 1.6e-2;
    case KILN_DTYPE_F32: return 1e-5;
    default: return 0.0;
    }
}

// Compares got against ref (double) with |got - ref| <= atol + rtol * |ref| (NaN matches NaN,
// infinities must match exactly). One CHECK per call; prints the first mismatches.
static inline int tt_close(const kiln_tensor *got, const double *ref, double atol, double rtol,
                           const char *what) {
    int64_t bad = 0, n = tt_numel(got);
    for (int64_t i = 0; i < n; i++) {
        double g = tt_get(got, i), r = ref[i];
        int ok;
        if (isnan(r)) {
            ok = isnan(g);
        } else if (isinf(r)) {
            ok = g == r;
        } else {
            ok = fabs(g - r) <= atol + rtol * fabs(r);
        }
        if (!ok) {
            if (bad < 5) {
                fprintf(stderr, "  %s [%s]: element %lld: got %.9g, expected %.9g\n", what,
                        kiln_dtype_name((kiln_dtype)got->dtype), (long long)i, g, r);
            }
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s [%s]: %lld of %lld elements differ", what,
              kiln_dtype_name((kiln_dtype)got->dtype), (long long)bad, (long long)n);
    return bad == 0;
}

// The float dtypes, i < 3: float32, float16, bfloat16.
static inline uint32_t tt_float_dtype(int i) {
    return i == 0 ? KILN_DTYPE_F32 : (i == 1 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16);
}

#endif // KILN_CPU_TEST_UTIL_H
