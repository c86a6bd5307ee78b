// SPDX-License-Identifier: Apache-2.0
// mean, sum and vector_norm (the 2-norm: the square root of the sum of squares) over a set of
// dims (empty = every dim), keepdim or not. The input is walked once in row order with the
// broadcasting iterator, adding into a double (float outputs) or int64 (integer outputs)
// accumulator per output element held in scratch.
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "cpu/cpu_internal.h"

#define CHUNK 256

// Marks the reduced dims of x; returns the number of output elements, or -1 for a bad dim.
static int64_t reduce_mask(const kiln_kernel_args *args, int *reduced) {
    const kiln_tensor *x = args->in[0];
    uint32_t n = 0;
    const int64_t *dims = kiln_attrs_ints(&args->attrs, KILN_A_REDUCE_DIMS, &n);
    for (uint32_t d = 0; d < KILN_MAX_RANK; d++) reduced[d] = n == 0;
    for (uint32_t i = 0; i < n; i++) {
        int d = kiln_cpu_norm_dim(dims[i], x->rank ? x->rank : 1);
        if (d < 0) return -1;
        reduced[d] = 1;
    }
    int64_t out = 1;
    for (uint32_t d = 0; d < x->rank; d++) {
        if (!reduced[d]) out *= x->dims[d];
    }
    return out;
}

size_t kiln_cpu_reduce_scratch(const kiln_kernel_args *args) {
    int reduced[KILN_MAX_RANK];
    int64_t n = reduce_mask(args, reduced);
    return KILN_CPU_SCRATCH_SLACK + (n > 0 ? (size_t)n : 1) * sizeof(double) + KILN_CPU_ALIGN;
}

typedef struct red_ctx {
    const kiln_tensor *x;
    double *facc;
    int64_t *iacc;
    int square; // vector_norm: add each element's square
} red_ctx;

static void row_f(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const red_ctx *c = (const red_ctx *)vctx;
    float buf[CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        const float *v = buf;
        if (c->x->dtype == KILN_DTYPE_F32 && inner[0] == 1) {
            v = (const float *)c->x->data + offs[0] + i0;
        } else {
            kiln_cpu_load_f32(c->x->data, c->x->dtype, offs[0] + i0 * inner[0], inner[0], m, buf);
        }
        if (inner[1] == 0) {
            double s = 0.0;
            if (c->square) {
                for (int64_t i = 0; i < m; i++) s += (double)v[i] * v[i];
            } else {
                for (int64_t i = 0; i < m; i++) s += v[i];
            }
            c->facc[offs[1]] += s;
        } else {
            double *a = c->facc + offs[1] + i0 * inner[1];
            if (c->square) {
                for (int64_t i = 0; i < m; i++) a[i * inner[1]] += (double)v[i] * v[i];
            } else {
                for (int64_t i = 0; i < m; i++) a[i * inner[1]] += v[i];
            }
        }
    }
}

static void row_i(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const red_ctx *c = (const red_ctx *)vctx;
    int64_t buf[CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        kiln_cpu_load_i64(c->x->data, c->x->dtype, offs[0] + i0 * inner[0], inner[0], m, buf);
        int64_t *a = c->iacc + offs[1] + i0 * inner[1];
        for (int64_t i = 0; i < m; i++) {
            int64_t *t = a + i * inner[1];
            *t = (int64_t)((uint64_t)*t + (uint64_t)buf[i]); // wraps like PyTorch
        }
    }
}

kiln_status kiln_cpu_reduce(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    int reduced[KILN_MAX_RANK];
    int64_t n_out = reduce_mask(args, reduced);
    KILN_CHECK(n_out >= 0, KILN_ERR_INVALID_ARG,
               "cpu %s: a reduction dim is out of range for "
               "rank %u",
               kiln_op_name(args->op), x->rank);
    KILN_CHECK(kiln_tensor_numel(y) == n_out, KILN_ERR_INVALID_ARG,
               "cpu %s: output has %lld elements, expected %lld", kiln_op_name(args->op),
               (long long)kiln_tensor_numel(y), (long long)n_out);
    if (n_out == 0) return KILN_OK;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    void *acc = kiln_cpu_scratch_bytes(&s, (size_t)n_out * sizeof(double), "reduce accumulator");
    if (acc == NULL) return KILN_ERR_INTERNAL;
    memset(acc, 0, (size_t)n_out * sizeof(double));
    // Iterate over x; the accumulator is x's shape with the reduced dims collapsed to 1.
    kiln_tensor xt = *x, at = *x;
    for (uint32_t d = 0; d < x->rank; d++) {
        if (reduced[d]) at.dims[d] = 1;
    }
    const kiln_tensor *ins[1] = {&at};
    kiln_cpu_iter it;
    kiln_cpu_iter_init(&it, &xt, ins, 1);
    red_ctx c = {x, (double *)acc, (int64_t *)acc, args->op == KILN_OP_VECTOR_NORM};
    int64_t count = n_out > 0 ? kiln_tensor_numel(x) / n_out : 0;
    if (kiln_cpu_is_int(y->dtype)) {
        kiln_cpu_iter_run(&it, row_i, &c);
        kiln_cpu_store_i64(y->data, y->dtype, 0, n_out, c.iacc);
        return KILN_OK;
    }
    kiln_cpu_iter_run(&it, row_f, &c);
    float buf[CHUNK];
    int mean = args->op == KILN_OP_MEAN;
    for (int64_t i0 = 0; i0 < n_out; i0 += CHUNK) {
        int64_t m = n_out - i0 < CHUNK ? n_out - i0 : CHUNK;
        for (int64_t i = 0; i < m; i++) {
            double v = c.facc[i0 + i];
            buf[i] = (float)(mean ? (count > 0 ? v / (double)count : NAN) : c.square ? sqrt(v) : v);
        }
        kiln_cpu_store_f32(y->data, y->dtype, i0, m, buf);
    }
    return KILN_OK;
}

// --- cumsum: running sums along one dim, in double for float outputs (PyTorch's CPU
// accumulator) and exactly in int64 for integer ones (wrapping on store like a cast).

size_t kiln_cpu_cumsum_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_cumsum(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_CUMSUM_DIM, 0);
    int dim = kiln_cpu_norm_dim(dim_attr, x->rank);
    KILN_CHECK(dim >= 0 && kiln_tensor_numel(x) == kiln_tensor_numel(y), KILN_ERR_INVALID_ARG,
               "cpu cumsum: dim %lld out of range for rank %u", (long long)dim_attr, x->rank);
    int64_t outer = 1, len = x->dims[dim], inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    int is_int = kiln_cpu_is_int(y->dtype);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            double acc = 0.0;
            uint64_t iacc = 0;
            for (int64_t l = 0; l < len; l++) {
                int64_t off = (o * len + l) * inner + i;
                if (is_int) {
                    iacc += (uint64_t)kiln_load_i64(x->data, x->dtype, off);
                    int64_t v = (int64_t)iacc;
                    kiln_cpu_store_i64(y->data, y->dtype, off, 1, &v);
                } else {
                    acc += kiln_load_f32(x->data, x->dtype, off);
                    float v = (float)acc;
                    kiln_cpu_store_f32(y->data, y->dtype, off, 1, &v);
                }
            }
        }
    }
    return KILN_OK;
}

// --- argmax: the index of the first maximum along one dim (int64), NaN counting as larger than
// any number (PyTorch's rule: the first NaN wins). Integers compare exactly, in int64.

// --- topk: k passes over each line, pass j taking the best element that ranks after pass j - 1's
// pick in the total order (value, then index): no marks, the order of equal values by index.
// NaN ranks above every number (largest) or below (smallest), as PyTorch sorts it.

// 1 when (v, i) ranks before (m, b); integers compare as int64 (iv, im), floats as float.
static int topk_before(float v, int64_t iv, int64_t i, float m, int64_t im, int64_t b, int largest,
                       int is_int) {
    if (is_int) {
        if (iv != im) return largest ? iv > im : iv < im;
        return i < b;
    }
    const int vn = isnan(v), mn = isnan(m);
    if (vn != mn) return largest ? vn : mn;
    if (!vn && v != m) return largest ? v > m : v < m;
    return i < b;
}

size_t kiln_cpu_topk_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_topk(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    const int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_TOPK_DIM, 0);
    const int64_t k = kiln_attrs_int(&args->attrs, KILN_A_TOPK_K, 0);
    const int largest = kiln_attrs_int(&args->attrs, KILN_A_TOPK_LARGEST, 0) != 0;
    const int dim = kiln_cpu_norm_dim(dim_attr, x->rank);
    KILN_CHECK(
        dim >= 0 && y->dtype == KILN_DTYPE_I64 && k >= 0 && k <= x->dims[dim], KILN_ERR_INVALID_ARG,
        "cpu topk: dim %lld of rank %u, k %lld of a dimension of %lld, or a non-int64 "
        "output",
        (long long)dim_attr, x->rank, (long long)k, (long long)(dim >= 0 ? x->dims[dim] : -1));
    int64_t outer = 1, len = x->dims[dim], inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    const int is_int = kiln_cpu_is_int(x->dtype);
    int64_t *out = (int64_t *)y->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            const int64_t base = o * len * inner + i;
            float pv = 0.0f;
            int64_t piv = 0, pb = -1; // the previous pick (none yet)
            for (int64_t j = 0; j < k; j++) {
                float m = 0.0f;
                int64_t im = 0, b = -1;
                for (int64_t l = 0; l < len; l++) {
                    const int64_t off = base + l * inner;
                    const float v = is_int ? 0.0f : kiln_load_f32(x->data, x->dtype, off);
                    const int64_t iv = is_int ? kiln_load_i64(x->data, x->dtype, off) : 0;
                    if (pb >= 0 && !topk_before(pv, piv, pb, v, iv, l, largest, is_int))
                        continue; // taken by an earlier pass
                    if (b < 0 || topk_before(v, iv, l, m, im, b, largest, is_int))
                        m = v, im = iv, b = l;
                }
                out[(o * k + j) * inner + i] = b;
                pv = m, piv = im, pb = b;
            }
        }
    }
    return KILN_OK;
}

size_t kiln_cpu_argmax_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_argmax(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_ARGMAX_DIM, 0);
    int dim = kiln_cpu_norm_dim(dim_attr, x->rank);
    KILN_CHECK(dim >= 0 && y->dtype == KILN_DTYPE_I64, KILN_ERR_INVALID_ARG,
               "cpu argmax: dim %lld out of range for rank %u, or a non-int64 output",
               (long long)dim_attr, x->rank);
    int64_t outer = 1, len = x->dims[dim], inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    KILN_CHECK(len > 0 || outer * inner == 0, KILN_ERR_INVALID_ARG,
               "cpu argmax: dimension %d of x is empty", dim);
    const int is_int = kiln_cpu_is_int(x->dtype);
    int64_t *out = (int64_t *)y->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t best = 0, base = o * len * inner + i;
            if (is_int) {
                int64_t m = kiln_load_i64(x->data, x->dtype, base);
                for (int64_t l = 1; l < len; l++) {
                    int64_t v = kiln_load_i64(x->data, x->dtype, base + l * inner);
                    if (v > m) m = v, best = l;
                }
            } else {
                float m = kiln_load_f32(x->data, x->dtype, base);
                for (int64_t l = 1; l < len && !isnan(m); l++) {
                    float v = kiln_load_f32(x->data, x->dtype, base + l * inner);
                    if (v > m || isnan(v)) m = v, best = l;
                }
            }
            out[o * inner + i] = best;
        }
    }
    return KILN_OK;
}

// --- selective_scan (ops.h): the state in float32, y rounded once per element

size_t kiln_cpu_selective_scan_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_selective_scan(const kiln_kernel_args *args) {
    const kiln_tensor *a = args->in[0], *u = args->in[1], *c = args->in[2], *h0 = args->in[3];
    kiln_tensor *y = args->out;
    KILN_CHECK(a->rank == 4 && u->rank == 4 && c->rank == 3 && h0->rank == 3 && y->rank == 3,
               KILN_ERR_INVALID_ARG,
               "cpu selective_scan: a, u [B, D, L, N], c [B, L, N], h0 [B, D, N] expected");
    const int64_t nb = a->dims[0], nd = a->dims[1], nl = a->dims[2], nn = a->dims[3];
    for (uint32_t i = 0; i < 4; i++) {
        KILN_CHECK(u->dims[i] == a->dims[i], KILN_ERR_INVALID_ARG,
                   "cpu selective_scan: u's shape differs from a's");
    }
    KILN_CHECK(c->dims[0] == nb && c->dims[1] == nl && c->dims[2] == nn && h0->dims[0] == nb &&
                   h0->dims[1] == nd && h0->dims[2] == nn && y->dims[0] == nb && y->dims[1] == nd &&
                   y->dims[2] == nl,
               KILN_ERR_INVALID_ARG, "cpu selective_scan: operand shapes disagree");
    // the state of one (b, d) row as N floats: a stack buffer for Mamba's 16, else one heap block
    float stack_h[64];
    float *h = nn <= 64 ? stack_h : (float *)kiln_malloc((size_t)nn * sizeof(float), 16);
    KILN_CHECK(h != NULL, KILN_ERR_NO_MEMORY, "cpu selective_scan: out of memory");
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t d = 0; d < nd; d++) {
            for (int64_t n = 0; n < nn; n++)
                h[n] = kiln_load_f32(h0->data, h0->dtype, (b * nd + d) * nn + n);
            const int64_t ad = (b * nd + d) * nl * nn;
            for (int64_t t = 0; t < nl; t++) {
                float acc = 0.0f;
                for (int64_t n = 0; n < nn; n++) {
                    const int64_t i = ad + t * nn + n;
                    h[n] = kiln_load_f32(a->data, a->dtype, i) * h[n] +
                           kiln_load_f32(u->data, u->dtype, i);
                    acc += h[n] * kiln_load_f32(c->data, c->dtype, (b * nl + t) * nn + n);
                }
                kiln_store_f32(y->data, y->dtype, (b * nd + d) * nl + t, acc);
            }
        }
    }
    if (h != stack_h) kiln_free(h, (size_t)nn * sizeof(float));
    return KILN_OK;
}
