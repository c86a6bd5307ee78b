// SPDX-License-Identifier: Apache-2.0
// Test helpers for cross-module tests: short graph construction over the public graph API,
// build + load + run in one call, dtype conversion of test data, a tolerance comparison and a
// counting allocator that can fail the Nth allocation. Include after nothing else ("check.h"
// comes with it). References in tests are written independently of src/cpu (naive loops in
// double); only the float16/bfloat16 rounding of src/core/dtype.h is shared.
#ifndef KILN_TESTS_TEST_UTIL_H
#define KILN_TESTS_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"
#include "kiln/kiln.h"

// --- literal helpers

// A list of value ids and its count: tu_node(g, KILN_OP_ADD, TU_IDS(a, b), TU_NO_ATTRS).
#define TU_IDS(...)                                                                                \
    (const int32_t[]){__VA_ARGS__}, (uint32_t)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t))
// A dims array literal (rank given separately).
#define TU_DIMS(...) ((const int64_t[]){__VA_ARGS__})
// Attributes: TU_ATTRS(TU_INTS("padding", 1, 1), TU_FLOAT("eps", 1e-5)).
#define TU_INTS(nm, ...)                                                                           \
    ((kiln_attr){.name = (nm),                                                                     \
                 .ints = (const int64_t[]){__VA_ARGS__},                                           \
                 .n = (uint32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))})
#define TU_FLOATS(nm, ...)                                                                         \
    ((kiln_attr){.name = (nm),                                                                     \
                 .floats = (const double[]){__VA_ARGS__},                                          \
                 .n = (uint32_t)(sizeof((double[]){__VA_ARGS__}) / sizeof(double))})
#define TU_ATTRS(...)                                                                              \
    (const kiln_attr[]){__VA_ARGS__},                                                              \
        (uint32_t)(sizeof((kiln_attr[]){__VA_ARGS__}) / sizeof(kiln_attr))
#define TU_NO_ATTRS NULL, 0u

// Propagates a failing status.
#define TU_TRY(expr)                                                                               \
    do {                                                                                           \
        kiln_status tu_st_ = (expr);                                                               \
        if (tu_st_ != KILN_OK) return tu_st_;                                                      \
    } while (0)

// --- data

static inline int64_t tu_numel(uint32_t rank, const int64_t *dims) {
    int64_t n = 1;
    for (uint32_t i = 0; i < rank; i++) n *= dims[i];
    return n;
}

static inline float *tu_alloc(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

// Uniform random values in [lo, hi).
static inline void tu_fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = check_rng_uniform(lo, hi);
}

static inline float *tu_rand(int64_t n, float lo, float hi) {
    float *p = tu_alloc(n);
    tu_fill(p, n, lo, hi);
    return p;
}

// Rounds a float to what `dtype` can hold (identity for float32).
static inline float tu_round(float v, kiln_dtype dtype) {
    if (dtype == KILN_DTYPE_F16) return kiln_f16_to_f32(kiln_f32_to_f16(v));
    if (dtype == KILN_DTYPE_BF16) return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
    return v;
}

// Converts n floats into a buffer of `dtype` (float32/float16/bfloat16); the buffer is malloc'd.
static inline void *tu_convert(const float *x, int64_t n, kiln_dtype dtype) {
    size_t es = kiln_dtype_size(dtype);
    uint8_t *p = calloc((size_t)(n > 0 ? n : 1), es);
    if (p == NULL) exit(2);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == KILN_DTYPE_F32) {
            memcpy(p + (size_t)i * 4, &x[i], 4);
        } else {
            uint16_t h = dtype == KILN_DTYPE_F16 ? kiln_f32_to_f16(x[i]) : kiln_f32_to_bf16(x[i]);
            memcpy(p + (size_t)i * 2, &h, 2);
        }
    }
    return p;
}

// Reads n elements of `dtype` back as floats into dst.
static inline void tu_to_f32(const void *src, int64_t n, kiln_dtype dtype, float *dst) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        if (dtype == KILN_DTYPE_F32) {
            memcpy(&dst[i], p + (size_t)i * 4, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + (size_t)i * 2, 2);
            dst[i] = dtype == KILN_DTYPE_F16 ? kiln_f16_to_f32(h) : kiln_bf16_to_f32(h);
        }
    }
}

// Compares got against ref elementwise (|g - r| <= atol + rtol |r|, NaN never matches); one
// CHECK for the whole array, printing the first few mismatches. Returns the mismatch count.
static inline int64_t tu_check_close(const char *what, const float *got, const float *ref,
                                     int64_t n, double atol, double rtol) {
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        double tol = atol + rtol * fabs((double)ref[i]);
        if (!(d <= tol)) {
            if (bad < 5) {
                fprintf(stderr, "  %s[%" PRId64 "]: got %.9g, expected %.9g (tol %.3g)\n", what, i,
                        (double)got[i], (double)ref[i], tol);
            }
            bad++;
        }
        if (d > worst) worst = d;
    }
    CHECK_MSG(bad == 0, "%s: %" PRId64 " of %" PRId64 " values differ (max abs diff %.3g)", what,
              bad, n, worst);
    if (getenv("KILN_TEST_VERBOSE") != NULL) {
        fprintf(stderr, "  %s: max abs diff %.3g over %" PRId64 " values\n", what, worst, n);
    }
    return bad;
}

// --- graph construction (failures are CHECKed and give -1)

static inline int32_t tu_input(kiln_graph *g, const char *name, kiln_dtype dtype, uint32_t rank,
                               const int64_t *dim_min, const int64_t *dim_max) {
    int32_t v = -1;
    CHECK_OK(kiln_graph_add_input(g, name, dtype, rank, dim_min, dim_max, &v));
    return v;
}

// A constant from float data, stored as `dtype`.
static inline int32_t tu_const(kiln_graph *g, const char *name, kiln_dtype dtype, uint32_t rank,
                               const int64_t *dims, const float *data) {
    int32_t v = -1;
    int64_t n = tu_numel(rank, dims);
    void *buf = tu_convert(data, n, dtype);
    CHECK_OK(kiln_graph_add_constant(g, name, dtype, rank, dims, buf,
                                     (size_t)n * kiln_dtype_size(dtype), &v));
    free(buf);
    return v;
}

static inline int32_t tu_node(kiln_graph *g, uint32_t op, const int32_t *inputs, uint32_t n_inputs,
                              const kiln_attr *attrs, uint32_t n_attrs) {
    int32_t v = -1;
    kiln_status st = kiln_graph_add_node(g, op, inputs, n_inputs, attrs, n_attrs, &v, 1);
    CHECK_MSG(st == KILN_OK, "add_node(%s): %s: %s", kiln_op_name(op), kiln_status_str(st),
              kiln_last_error());
    return v;
}

static inline void tu_output(kiln_graph *g, int32_t v, const char *name) {
    CHECK_OK(kiln_graph_mark_output(g, v, name));
}

// --- build, load, run

// Builds with the given precision; external != 0 stores every weight as a key.
static inline kiln_status tu_build(const kiln_graph *g, kiln_precision precision, int external,
                                   kiln_built **out) {
    kiln_build_options o;
    kiln_build_options_init(&o);
    o.precision = precision;
    o.external_weights = external;
    return kiln_build(g, &o, out);
}

// A resolver over the external weights of a kiln_built (user_data = the kiln_built).
static inline kiln_status tu_resolve_built(void *user_data, const char *key, const void **out_data,
                                           size_t *out_nbytes) {
    const kiln_built *b = user_data;
    for (uint32_t i = 0; i < kiln_built_n_weights(b); i++) {
        const char *k;
        const void *d;
        size_t n;
        if (kiln_built_weight(b, i, &k, &d, &n) == KILN_OK && strcmp(k, key) == 0) {
            *out_data = d;
            *out_nbytes = n;
            return KILN_OK;
        }
    }
    return KILN_ERR_MISSING_DATA;
}

// Loads a built engine (resolving external weights from the same kiln_built) on `device`
// ("cpu" unless NULL).
// Loads a built engine with these load settings (its external weights resolved from b).
static inline kiln_status tu_load_with(const kiln_built *b, const kiln_option_setting *settings,
                                       uint32_t n_settings, kiln_engine **out) {
    const void *bytes;
    size_t n;
    kiln_load_options lo;
    TU_TRY(kiln_built_engine(b, &bytes, &n));
    kiln_load_options_init(&lo);
    lo.resolve = tu_resolve_built;
    lo.resolve_user_data = (void *)(uintptr_t)b;
    lo.settings = settings;
    lo.n_settings = n_settings;
    return kiln_engine_load(bytes, n, &lo, out);
}

static inline kiln_status tu_load(const kiln_built *b, const char *device, kiln_engine **out) {
    kiln_option_setting s = {
        .name = "device", .type = KILN_OPTION_STRING, .string_value = device ? device : "cpu"};
    return tu_load_with(b, &s, 1, out);
}

// Binds float32 data for every input and output and executes: inputs[i] has rank ranks[i] and
// dims dims[i]; outputs[i] has capacity out_nbytes[i].
typedef struct tu_io {
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
    void *data;
    size_t nbytes; // outputs: capacity
} tu_io;

static inline kiln_status tu_execute(kiln_context *c, const tu_io *inputs, uint32_t n_inputs,
                                     const tu_io *outputs, uint32_t n_outputs) {
    for (uint32_t i = 0; i < n_inputs; i++) {
        TU_TRY(kiln_context_set_input(c, i, inputs[i].rank, inputs[i].dims, inputs[i].data));
    }
    for (uint32_t i = 0; i < n_outputs; i++) {
        TU_TRY(kiln_context_set_output(c, i, outputs[i].data, outputs[i].nbytes));
    }
    return kiln_context_execute(c);
}

// --- naive references (double accumulation; independent of src/cpu)

// y[m, n] = sum_k x[m, k] w[n, k] + b[n]   (b may be NULL)
static inline void ref_linear(const float *x, int64_t m, int64_t k, const float *w, int64_t n,
                              const float *b, float *y) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = b ? b[j] : 0.0;
            for (int64_t t = 0; t < k; t++) acc += (double)x[i * k + t] * (double)w[j * k + t];
            y[i * n + j] = (float)acc;
        }
    }
}

static inline void ref_relu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0.0f;
}

// gelu with erf (PyTorch approximate='none')
static inline void ref_gelu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0))));
}

static inline void ref_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

// x[N, C, H, W] * w[O, C, kh, kw] (+ bias[O]), square stride and padding, no groups.
// y[N, O, oh, ow] with oh = (H + 2 pad - kh) / stride + 1.
static inline void ref_conv2d(const float *x, int64_t n, int64_t c, int64_t h, int64_t w,
                              const float *wt, int64_t o, int64_t kh, int64_t kw, int64_t stride,
                              int64_t pad, const float *bias, float *y) {
    int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
    for (int64_t b = 0; b < n; b++)
        for (int64_t oc = 0; oc < o; oc++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = bias ? bias[oc] : 0.0;
                    for (int64_t ic = 0; ic < c; ic++)
                        for (int64_t u = 0; u < kh; u++)
                            for (int64_t v = 0; v < kw; v++) {
                                int64_t yi = i * stride - pad + u, xj = j * stride - pad + v;
                                if (yi < 0 || yi >= h || xj < 0 || xj >= w) continue;
                                acc += (double)x[((b * c + ic) * h + yi) * w + xj] *
                                       (double)wt[((oc * c + ic) * kh + u) * kw + v];
                            }
                    y[((b * o + oc) * oh + i) * ow + j] = (float)acc;
                }
}

// Inference batch norm over dim 1 of x[N, C, HW], in place.
static inline void ref_batch_norm(float *x, int64_t n, int64_t c, int64_t hw, const float *gamma,
                                  const float *beta, const float *mean, const float *var,
                                  double eps) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++) {
            double s = 1.0 / sqrt((double)var[ch] + eps);
            for (int64_t i = 0; i < hw; i++) {
                float *p = &x[(b * c + ch) * hw + i];
                *p = (float)(((double)*p - mean[ch]) * s * (gamma ? gamma[ch] : 1.0) +
                             (beta ? beta[ch] : 0.0));
            }
        }
}

// Layer norm over the last dim d of x[rows, d] into y.
static inline void ref_layer_norm(const float *x, int64_t rows, int64_t d, const float *gamma,
                                  const float *beta, double eps, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += x[r * d + i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
        var /= (double)d;
        for (int64_t i = 0; i < d; i++) {
            double v = (x[r * d + i] - mean) / sqrt(var + eps);
            y[r * d + i] = (float)(v * (gamma ? gamma[i] : 1.0) + (beta ? beta[i] : 0.0));
        }
    }
}

// Multi-head attention core over row-major activations: q, k, v are [batch, seq, heads * e]
// (head h owns columns [h e, (h + 1) e)); o gets the same layout. Scale 1/sqrt(e).
static inline void ref_mha(const float *q, const float *k, const float *v, int64_t batch,
                           int64_t seq, int64_t heads, int64_t e, int causal, float *o) {
    int64_t d = heads * e;
    double *p = malloc((size_t)seq * sizeof(double));
    if (p == NULL) exit(2);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < seq; i++) {
                double mx = -1e300, sum = 0;
                int64_t n = causal ? i + 1 : seq;
                for (int64_t j = 0; j < n; j++) {
                    double s = 0;
                    for (int64_t t = 0; t < e; t++)
                        s += (double)q[(b * seq + i) * d + h * e + t] *
                             (double)k[(b * seq + j) * d + h * e + t];
                    p[j] = s / sqrt((double)e);
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t t = 0; t < e; t++) {
                    double acc = 0;
                    for (int64_t j = 0; j < n; j++)
                        acc += p[j] * (double)v[(b * seq + j) * d + h * e + t];
                    o[(b * seq + i) * d + h * e + t] = (float)(acc / sum);
                }
            }
    free(p);
}

// --- a counting allocator that can fail the Nth allocation and tracks live bytes

typedef struct tu_alloc_state {
    long n_calls;   // allocations attempted since reset
    long fail_at;   // fail the allocation with this 1-based number (0: never)
    long fail_from; // fail this allocation and every later one (0: never)
    int fail_all;   // fail every allocation (used to prove "no allocation here")
    long n_failed;  // allocations refused
    long long live; // bytes allocated and not yet freed
    long live_blocks;
} tu_alloc_state;

static tu_alloc_state tu_alloc_state_;

static inline void *tu_counting_alloc(void *ud, size_t nbytes, size_t align) {
    tu_alloc_state *s = ud;
    size_t rounded;
    void *p;
    s->n_calls++;
    if (s->fail_all || (s->fail_at > 0 && s->n_calls == s->fail_at) ||
        (s->fail_from > 0 && s->n_calls >= s->fail_from)) {
        s->n_failed++;
        return NULL;
    }
    rounded = (nbytes + align - 1) & ~(align - 1);
    if (rounded == 0) rounded = align;
    p = aligned_alloc(align, rounded);
    if (p != NULL) {
        s->live += (long long)nbytes;
        s->live_blocks++;
    }
    return p;
}

static inline void tu_counting_free(void *ud, void *p, size_t nbytes) {
    tu_alloc_state *s = ud;
    if (p == NULL) return;
    s->live -= (long long)nbytes;
    s->live_blocks--;
    free(p);
}

// Installs the counting allocator (state reset).
static inline tu_alloc_state *tu_alloc_install(void) {
    kiln_allocator a = {&tu_alloc_state_, tu_counting_alloc, tu_counting_free};
    memset(&tu_alloc_state_, 0, sizeof tu_alloc_state_);
    kiln_set_allocator(&a);
    return &tu_alloc_state_;
}

// A log hook that drops everything (for tests that provoke many expected errors).
static inline void tu_log_quiet(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

// A log hook that records the last message (ud = char[512]).
static inline void tu_log_capture(void *ud, kiln_log_level level, const char *msg) {
    (void)level;
    snprintf((char *)ud, 512, "%s", msg);
}

#endif // KILN_TESTS_TEST_UTIL_H
