// SPDX-License-Identifier: Apache-2.0
// Normalizations: batch_norm (inference, over dim 1), layer_norm (over the last normalized_ndim
// dims, optional affine), rms_norm (over the last dim, optional weight) and softmax / log_softmax
// over one dim. Statistics are accumulated in
// double; rows of 16-bit tensors are converted through float32 scratch.
#include <math.h>

#include "cpu/cpu_internal.h"

#define CHUNK 256

static const kiln_tensor *opt_in(const kiln_kernel_args *args, uint32_t i) {
    return i < args->n_in ? args->in[i] : NULL;
}

// Writes n floats to dst[off + i * stride] in dtype.
static void store_strided(void *dst, uint32_t dtype, int64_t off, int64_t stride, int64_t n,
                          const float *src) {
    if (stride == 1) {
        kiln_cpu_store_f32(dst, dtype, off, n, src);
        return;
    }
    for (int64_t i = 0; i < n; i++) kiln_store_f32(dst, dtype, off + i * stride, src[i]);
}

// --- batch_norm: y = (x - mean) / sqrt(var + eps) * weight + bias, per channel (dim 1)

size_t kiln_cpu_batch_norm_scratch(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    int64_t c = x->rank >= 2 ? x->dims[1] : 1;
    return KILN_CPU_SCRATCH_SLACK + 6 * kiln_cpu_f32_nbytes(c);
}

kiln_status kiln_cpu_batch_norm(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1), *b = opt_in(args, 2);
    const kiln_tensor *mean = opt_in(args, 3), *var = opt_in(args, 4);
    kiln_tensor *y = args->out;
    KILN_CHECK(x->rank >= 2, KILN_ERR_INVALID_ARG, "cpu batch_norm: input rank %u < 2", x->rank);
    KILN_CHECK(mean != NULL && var != NULL, KILN_ERR_INVALID_ARG,
               "cpu batch_norm: running_mean and running_var are required");
    int64_t n = x->dims[0], c = x->dims[1], inner = 1;
    for (uint32_t d = 2; d < x->rank; d++) inner *= x->dims[d];
    const kiln_tensor *params[4] = {w, b, mean, var};
    for (int i = 0; i < 4; i++) {
        KILN_CHECK(params[i] == NULL || kiln_tensor_numel(params[i]) == c, KILN_ERR_INVALID_ARG,
                   "cpu batch_norm: parameter %d must have %lld elements", i + 1, (long long)c);
    }
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *p[4], *alpha = kiln_cpu_scratch_f32(&s, c, "batch_norm scale");
    float *beta = kiln_cpu_scratch_f32(&s, c, "batch_norm shift");
    if (alpha == NULL || beta == NULL) return KILN_ERR_INTERNAL;
    for (int i = 0; i < 4; i++) {
        p[i] = kiln_cpu_scratch_f32(&s, c, "batch_norm parameter");
        if (p[i] == NULL) return KILN_ERR_INTERNAL;
        if (params[i] != NULL) {
            kiln_cpu_load_f32(params[i]->data, params[i]->dtype, 0, 1, c, p[i]);
        } else {
            for (int64_t j = 0; j < c; j++) p[i][j] = i == 0 ? 1.0f : 0.0f;
        }
    }
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_BN_EPS, 0);
    for (int64_t j = 0; j < c; j++) { // as PyTorch: alpha = w / sqrt(var + eps), beta = b - m*alpha
        float invstd = 1.0f / sqrtf(p[3][j] + eps);
        alpha[j] = invstd * p[0][j];
        beta[j] = p[1][j] - p[2][j] * alpha[j];
    }
    float xb[CHUNK], yb[CHUNK];
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < c; j++) {
            int64_t base = (i * c + j) * inner;
            float a = alpha[j], bb = beta[j];
            if (x->dtype == KILN_DTYPE_F32 && y->dtype == KILN_DTYPE_F32) {
                const float *xs = (const float *)x->data + base;
                float *ys = (float *)y->data + base;
                for (int64_t k = 0; k < inner; k++) ys[k] = xs[k] * a + bb;
                continue;
            }
            for (int64_t k0 = 0; k0 < inner; k0 += CHUNK) {
                int64_t m = inner - k0 < CHUNK ? inner - k0 : CHUNK;
                kiln_cpu_load_f32(x->data, x->dtype, base + k0, 1, m, xb);
                for (int64_t k = 0; k < m; k++) yb[k] = xb[k] * a + bb;
                kiln_cpu_store_f32(y->data, y->dtype, base + k0, m, yb);
            }
        }
    }
    return KILN_OK;
}

// --- layer_norm

static int64_t ln_row_len(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    int64_t nd = kiln_attrs_int(&args->attrs, KILN_A_LN_NDIM, 0), d = 1;
    if (nd < 0 || nd > (int64_t)x->rank) return -1;
    for (uint32_t i = x->rank - (uint32_t)nd; i < x->rank; i++) d *= x->dims[i];
    return d;
}

size_t kiln_cpu_layer_norm_scratch(const kiln_kernel_args *args) {
    int64_t d = ln_row_len(args);
    return KILN_CPU_SCRATCH_SLACK + 3 * kiln_cpu_f32_nbytes(d < 0 ? 0 : d);
}

kiln_status kiln_cpu_layer_norm(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1), *b = opt_in(args, 2);
    kiln_tensor *y = args->out;
    int64_t d = ln_row_len(args);
    KILN_CHECK(d >= 0, KILN_ERR_INVALID_ARG,
               "cpu layer_norm: normalized_ndim %lld is outside [0, %u]",
               (long long)kiln_attrs_int(&args->attrs, KILN_A_LN_NDIM, 0), x->rank);
    KILN_CHECK(w == NULL || kiln_tensor_numel(w) == d, KILN_ERR_INVALID_ARG,
               "cpu layer_norm: weight must have %lld elements", (long long)d);
    KILN_CHECK(b == NULL || kiln_tensor_numel(b) == d, KILN_ERR_INVALID_ARG,
               "cpu layer_norm: bias must have %lld elements", (long long)d);
    int64_t numel = kiln_tensor_numel(x);
    if (d == 0 || numel == 0) return KILN_OK;
    int64_t rows = numel / d;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *row = kiln_cpu_scratch_f32(&s, d, "layer_norm row");
    float *wf = kiln_cpu_scratch_f32(&s, d, "layer_norm weight");
    float *bf = kiln_cpu_scratch_f32(&s, d, "layer_norm bias");
    if (row == NULL || wf == NULL || bf == NULL) return KILN_ERR_INTERNAL;
    for (int64_t i = 0; i < d; i++) {
        wf[i] = 1.0f;
        bf[i] = 0.0f;
    }
    if (w != NULL) kiln_cpu_load_f32(w->data, w->dtype, 0, 1, d, wf);
    if (b != NULL) kiln_cpu_load_f32(b->data, b->dtype, 0, 1, d, bf);
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_LN_EPS, 0);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = row;
        if (x->dtype == KILN_DTYPE_F32) {
            xr = (const float *)x->data + r * d;
        } else {
            kiln_cpu_load_f32(x->data, x->dtype, r * d, 1, d, row);
        }
        double sum = 0.0;
        for (int64_t i = 0; i < d; i++) sum += xr[i];
        float mean = (float)(sum / (double)d);
        double sq = 0.0;
        for (int64_t i = 0; i < d; i++) {
            double t = (double)xr[i] - mean;
            sq += t * t;
        }
        float rstd = (float)(1.0 / sqrt(sq / (double)d + eps));
        float *yr = y->dtype == KILN_DTYPE_F32 ? (float *)y->data + r * d : row;
        for (int64_t i = 0; i < d; i++) yr[i] = (xr[i] - mean) * rstd * wf[i] + bf[i];
        if (y->dtype != KILN_DTYPE_F32) kiln_cpu_store_f32(y->data, y->dtype, r * d, d, row);
    }
    return KILN_OK;
}

// --- rms_norm: y = x / sqrt(mean(x^2) + eps) * weight over the last dim (LlamaRMSNorm in one
// layer: the statistics in double, every element in float32, one rounding to y's dtype)

size_t kiln_cpu_rms_norm_scratch(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    int64_t d = x->rank > 0 ? x->dims[x->rank - 1] : 0;
    return KILN_CPU_SCRATCH_SLACK + 2 * kiln_cpu_f32_nbytes(d);
}

kiln_status kiln_cpu_rms_norm(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1);
    kiln_tensor *y = args->out;
    KILN_CHECK(x->rank >= 1, KILN_ERR_INVALID_ARG, "cpu rms_norm: input rank 0");
    int64_t d = x->dims[x->rank - 1], numel = kiln_tensor_numel(x);
    KILN_CHECK(w == NULL || kiln_tensor_numel(w) == d, KILN_ERR_INVALID_ARG,
               "cpu rms_norm: weight must have %lld elements", (long long)d);
    if (d == 0 || numel == 0) return KILN_OK;
    int64_t rows = numel / d;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *row = kiln_cpu_scratch_f32(&s, d, "rms_norm row");
    float *wf = kiln_cpu_scratch_f32(&s, d, "rms_norm weight");
    if (row == NULL || wf == NULL) return KILN_ERR_INTERNAL;
    for (int64_t i = 0; i < d; i++) wf[i] = 1.0f;
    if (w != NULL) kiln_cpu_load_f32(w->data, w->dtype, 0, 1, d, wf);
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_RMS_EPS, 0);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = row;
        if (x->dtype == KILN_DTYPE_F32) {
            xr = (const float *)x->data + r * d;
        } else {
            kiln_cpu_load_f32(x->data, x->dtype, r * d, 1, d, row);
        }
        double sq = 0.0;
        for (int64_t i = 0; i < d; i++) sq += (double)xr[i] * xr[i];
        float rstd = (float)(1.0 / sqrt(sq / (double)d + eps));
        float *yr = y->dtype == KILN_DTYPE_F32 ? (float *)y->data + r * d : row;
        for (int64_t i = 0; i < d; i++) yr[i] = xr[i] * rstd * wf[i];
        if (y->dtype != KILN_DTYPE_F32) kiln_cpu_store_f32(y->data, y->dtype, r * d, d, row);
    }
    return KILN_OK;
}

// --- softmax, log_softmax

size_t kiln_cpu_softmax_scratch(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    int dim = kiln_cpu_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_SOFTMAX_DIM, 0),
                                x->rank ? x->rank : 1);
    int64_t len = x->rank && dim >= 0 ? x->dims[dim] : 1;
    return KILN_CPU_SCRATCH_SLACK + kiln_cpu_f32_nbytes(len);
}

kiln_status kiln_cpu_softmax(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_SOFTMAX_DIM, 0);
    // A rank-0 tensor behaves as one element along dim 0 or -1, like PyTorch.
    int dim = kiln_cpu_norm_dim(dim_attr, x->rank ? x->rank : 1);
    KILN_CHECK(dim >= 0, KILN_ERR_INVALID_ARG, "cpu %s: dim %lld out of range for rank %u",
               kiln_op_name(args->op), (long long)dim_attr, x->rank);
    int64_t outer = 1, len = x->rank ? x->dims[dim] : 1, inner = 1;
    for (int d = 0; d < dim && d < (int)x->rank; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    if (len == 0 || outer == 0 || inner == 0) return KILN_OK;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *buf = kiln_cpu_scratch_f32(&s, len, "softmax row");
    if (buf == NULL) return KILN_ERR_INTERNAL;
    int is_log = args->op == KILN_OP_LOG_SOFTMAX;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            kiln_cpu_load_f32(x->data, x->dtype, base, inner, len, buf);
            float mx = -INFINITY;
            for (int64_t k = 0; k < len; k++) {
                if (buf[k] > mx || isnan(buf[k])) mx = buf[k];
            }
            double sum = 0.0;
            if (is_log) {
                for (int64_t k = 0; k < len; k++) sum += expf(buf[k] - mx);
                float ls = (float)log(sum);
                for (int64_t k = 0; k < len; k++) buf[k] = (buf[k] - mx) - ls;
            } else {
                for (int64_t k = 0; k < len; k++) {
                    buf[k] = expf(buf[k] - mx);
                    sum += buf[k];
                }
                float inv = (float)(1.0 / sum);
                for (int64_t k = 0; k < len; k++) buf[k] *= inv;
            }
            store_strided(y->data, y->dtype, base, inner, len, buf);
        }
    }
    return KILN_OK;
}

// --- group_norm: x [N, C, *] normalized over each group of C / groups channels (and every
// spatial position), then y = x_hat * weight[c] + bias[c]; biased variance, like PyTorch.

size_t kiln_cpu_group_norm_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_group_norm(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1), *b = opt_in(args, 2);
    kiln_tensor *y = args->out;
    int64_t groups = kiln_attrs_int(&args->attrs, KILN_A_GN_GROUPS, 0);
    double eps = kiln_attrs_float(&args->attrs, KILN_A_GN_EPS, 0);
    KILN_CHECK(x->rank >= 2 && groups > 0 && x->dims[1] % groups == 0, KILN_ERR_INVALID_ARG,
               "cpu group_norm: %lld channels are not a multiple of %lld groups",
               (long long)(x->rank >= 2 ? x->dims[1] : 0), (long long)groups);
    int64_t n = x->dims[0], c = x->dims[1], inner = 1;
    for (uint32_t d = 2; d < x->rank; d++) inner *= x->dims[d];
    int64_t cg = c / groups, len = cg * inner;
    float buf[CHUNK];
    for (int64_t ni = 0; ni < n; ni++) {
        for (int64_t g = 0; g < groups; g++) {
            int64_t base = (ni * c + g * cg) * inner;
            double sum = 0.0, sq = 0.0;
            for (int64_t i = 0; i < len; i += CHUNK) {
                int64_t m = len - i < CHUNK ? len - i : CHUNK;
                kiln_cpu_load_f32(x->data, x->dtype, base + i, 1, m, buf);
                for (int64_t j = 0; j < m; j++) sum += buf[j];
            }
            double mean = len ? sum / (double)len : 0.0;
            for (int64_t i = 0; i < len; i += CHUNK) {
                int64_t m = len - i < CHUNK ? len - i : CHUNK;
                kiln_cpu_load_f32(x->data, x->dtype, base + i, 1, m, buf);
                for (int64_t j = 0; j < m; j++) sq += (buf[j] - mean) * (buf[j] - mean);
            }
            double rstd = 1.0 / sqrt((len ? sq / (double)len : 0.0) + eps);
            for (int64_t ch = 0; ch < cg; ch++) {
                int64_t cc = g * cg + ch, off = base + ch * inner;
                double sc = w ? kiln_load_f32(w->data, w->dtype, cc) : 1.0;
                double sh = b ? kiln_load_f32(b->data, b->dtype, cc) : 0.0;
                for (int64_t i = 0; i < inner; i += CHUNK) {
                    int64_t m = inner - i < CHUNK ? inner - i : CHUNK;
                    kiln_cpu_load_f32(x->data, x->dtype, off + i, 1, m, buf);
                    for (int64_t j = 0; j < m; j++) {
                        buf[j] = (float)((buf[j] - mean) * rstd * sc + sh);
                    }
                    kiln_cpu_store_f32(y->data, y->dtype, off + i, m, buf);
                }
            }
        }
    }
    return KILN_OK;
}
