// SPDX-License-Identifier: Apache-2.0
// 2-D pooling over the last two dims of a rank-3 or rank-4 tensor (every leading index is one
// plane): max_pool2d (padding counts as -inf, NaN propagates), avg_pool2d (PyTorch's divisor
// rules: count_include_pad, divisor_override, windows clipped at the padded border) and
// adaptive_avg_pool2d (windows [floor(i*in/out), ceil((i+1)*in/out))). The output size is the
// one the runtime inferred (ceil_mode decided it); planes of 16-bit tensors go through float32.
#include <math.h>

#include "cpu/cpu_internal.h"

typedef struct pool_geom {
    int64_t planes, h, w, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} pool_geom;

static int64_t attr_or(const kiln_attrs *a, uint32_t idx, uint32_t j, int64_t dflt) {
    uint32_t n = kiln_attrs_count(a, idx);
    if (n == 0) return dflt;
    return kiln_attrs_int(a, idx, j < n ? j : n - 1);
}

static kiln_status pool_geometry(const kiln_kernel_args *args, pool_geom *g) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    KILN_CHECK((x->rank == 3 || x->rank == 4) && y->rank == x->rank, KILN_ERR_INVALID_ARG,
               "cpu %s: input must be [N, C, H, W] or [C, H, W] (rank %u)", kiln_op_name(args->op),
               x->rank);
    g->planes = 1;
    for (uint32_t d = 0; d + 2 < x->rank; d++) {
        KILN_CHECK(x->dims[d] == y->dims[d], KILN_ERR_INVALID_ARG,
                   "cpu %s: leading dim %u differs between input and output",
                   kiln_op_name(args->op), d);
        g->planes *= x->dims[d];
    }
    g->h = x->dims[x->rank - 2];
    g->w = x->dims[x->rank - 1];
    g->oh = y->dims[y->rank - 2];
    g->ow = y->dims[y->rank - 1];
    g->kh = g->kw = 1;
    g->sh = g->sw = g->dh = g->dw = 1;
    g->ph = g->pw = 0;
    const kiln_attrs *a = &args->attrs;
    if (args->op == KILN_OP_MAX_POOL2D || args->op == KILN_OP_AVG_POOL2D) {
        int mx = args->op == KILN_OP_MAX_POOL2D;
        uint32_t ik = mx ? KILN_A_MAXPOOL_KERNEL : KILN_A_AVGPOOL_KERNEL;
        uint32_t is = mx ? KILN_A_MAXPOOL_STRIDE : KILN_A_AVGPOOL_STRIDE;
        uint32_t ip = mx ? KILN_A_MAXPOOL_PADDING : KILN_A_AVGPOOL_PADDING;
        g->kh = attr_or(a, ik, 0, 1);
        g->kw = attr_or(a, ik, 1, 1);
        g->sh = attr_or(a, is, 0, g->kh); // an empty stride means the kernel size (PyTorch)
        g->sw = attr_or(a, is, 1, g->kw);
        g->ph = attr_or(a, ip, 0, 0);
        g->pw = attr_or(a, ip, 1, 0);
        if (mx) {
            g->dh = attr_or(a, KILN_A_MAXPOOL_DILATION, 0, 1);
            g->dw = attr_or(a, KILN_A_MAXPOOL_DILATION, 1, 1);
        }
        KILN_CHECK(g->kh > 0 && g->kw > 0 && g->sh > 0 && g->sw > 0 && g->dh > 0 && g->dw > 0 &&
                       g->ph >= 0 && g->pw >= 0,
                   KILN_ERR_INVALID_ARG,
                   "cpu %s: kernel, stride and dilation must be > 0 and padding >= 0",
                   kiln_op_name(args->op));
    }
    return KILN_OK;
}

static size_t pool_scratch(const kiln_kernel_args *args) {
    pool_geom g = {0};
    if (pool_geometry(args, &g) != KILN_OK) return 0;
    return KILN_CPU_SCRATCH_SLACK + kiln_cpu_f32_nbytes(g.h * g.w) +
           kiln_cpu_f32_nbytes(g.oh * g.ow);
}

size_t kiln_cpu_max_pool2d_scratch(const kiln_kernel_args *args) { return pool_scratch(args); }
size_t kiln_cpu_avg_pool2d_scratch(const kiln_kernel_args *args) { return pool_scratch(args); }
size_t kiln_cpu_adaptive_avg_pool2d_scratch(const kiln_kernel_args *args) {
    return pool_scratch(args);
}

typedef void (*plane_fn)(const kiln_kernel_args *args, const pool_geom *g, const float *x,
                         float *y);

// Kernel taps t in [*lo, *hi) with 0 <= base + t * step < size.
static void tap_range(int64_t base, int64_t step, int64_t taps, int64_t size, int64_t *lo,
                      int64_t *hi) {
    *lo = base >= 0 ? 0 : (-base + step - 1) / step;
    *hi = size - 1 - base < 0 ? 0 : (size - 1 - base) / step + 1;
    if (*hi > taps) *hi = taps;
    if (*lo > *hi) *lo = *hi;
}

static void max_plane(const kiln_kernel_args *args, const pool_geom *g, const float *x, float *y) {
    (void)args;
    for (int64_t oh = 0; oh < g->oh; oh++) {
        int64_t h0 = oh * g->sh - g->ph, ki_lo, ki_hi;
        tap_range(h0, g->dh, g->kh, g->h, &ki_lo, &ki_hi);
        for (int64_t ow = 0; ow < g->ow; ow++) {
            int64_t w0 = ow * g->sw - g->pw, kj_lo, kj_hi;
            tap_range(w0, g->dw, g->kw, g->w, &kj_lo, &kj_hi);
            float m = -INFINITY;
            int nan = 0;
            for (int64_t ki = ki_lo; ki < ki_hi; ki++) {
                const float *row = x + (h0 + ki * g->dh) * g->w + w0;
                for (int64_t kj = kj_lo; kj < kj_hi; kj++) {
                    float v = row[kj * g->dw];
                    m = v > m ? v : m; // branch-free max; NaN tracked apart
                    nan |= v != v;
                }
            }
            y[oh * g->ow + ow] = nan ? NAN : m;
        }
    }
}

static void avg_plane(const kiln_kernel_args *args, const pool_geom *g, const float *x, float *y) {
    int64_t count_pad = attr_or(&args->attrs, KILN_A_AVGPOOL_COUNT_PAD, 0, 1);
    int64_t divisor = attr_or(&args->attrs, KILN_A_AVGPOOL_DIVISOR, 0, 0);
    for (int64_t oh = 0; oh < g->oh; oh++) {
        for (int64_t ow = 0; ow < g->ow; ow++) {
            int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
            int64_t he = hs + g->kh, we = ws + g->kw;
            if (he > g->h + g->ph) he = g->h + g->ph;
            if (we > g->w + g->pw) we = g->w + g->pw;
            int64_t pool_size = (he - hs) * (we - ws);
            if (hs < 0) hs = 0;
            if (ws < 0) ws = 0;
            if (he > g->h) he = g->h;
            if (we > g->w) we = g->w;
            if (hs >= he || ws >= we) {
                y[oh * g->ow + ow] = 0.0f;
                continue;
            }
            float sum = 0.0f;
            for (int64_t ih = hs; ih < he; ih++) {
                for (int64_t iw = ws; iw < we; iw++) sum += x[ih * g->w + iw];
            }
            int64_t div = divisor != 0 ? divisor : (count_pad ? pool_size : (he - hs) * (we - ws));
            y[oh * g->ow + ow] = sum / (float)div;
        }
    }
}

static void adaptive_plane(const kiln_kernel_args *args, const pool_geom *g, const float *x,
                           float *y) {
    (void)args;
    for (int64_t oh = 0; oh < g->oh; oh++) {
        int64_t hs = oh * g->h / g->oh, he = ((oh + 1) * g->h + g->oh - 1) / g->oh;
        for (int64_t ow = 0; ow < g->ow; ow++) {
            int64_t ws = ow * g->w / g->ow, we = ((ow + 1) * g->w + g->ow - 1) / g->ow;
            float sum = 0.0f;
            for (int64_t ih = hs; ih < he; ih++) {
                for (int64_t iw = ws; iw < we; iw++) sum += x[ih * g->w + iw];
            }
            y[oh * g->ow + ow] = sum / (float)((he - hs) * (we - ws));
        }
    }
}

static kiln_status pool_run(const kiln_kernel_args *args, plane_fn fn) {
    pool_geom g = {0};
    KILN_TRY(pool_geometry(args, &g));
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    int64_t hw = g.h * g.w, ohw = g.oh * g.ow;
    if (ohw == 0 || g.planes == 0) return KILN_OK;
    if (args->op == KILN_OP_ADAPTIVE_AVG_POOL2D) {
        KILN_CHECK(hw > 0, KILN_ERR_INVALID_ARG,
                   "cpu adaptive_avg_pool2d: empty input plane %lldx%lld", (long long)g.h,
                   (long long)g.w);
    }
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *xbuf = kiln_cpu_scratch_f32(&s, hw, "pool input plane");
    float *ybuf = kiln_cpu_scratch_f32(&s, ohw, "pool output plane");
    if (xbuf == NULL || ybuf == NULL) return KILN_ERR_INTERNAL;
    for (int64_t p = 0; p < g.planes; p++) {
        const float *xp = xbuf;
        if (x->dtype == KILN_DTYPE_F32) {
            xp = (const float *)x->data + p * hw;
        } else {
            kiln_cpu_load_f32(x->data, x->dtype, p * hw, 1, hw, xbuf);
        }
        float *yp = y->dtype == KILN_DTYPE_F32 ? (float *)y->data + p * ohw : ybuf;
        fn(args, &g, xp, yp);
        if (y->dtype != KILN_DTYPE_F32) kiln_cpu_store_f32(y->data, y->dtype, p * ohw, ohw, yp);
    }
    return KILN_OK;
}

kiln_status kiln_cpu_max_pool2d(const kiln_kernel_args *args) { return pool_run(args, max_plane); }
kiln_status kiln_cpu_avg_pool2d(const kiln_kernel_args *args) { return pool_run(args, avg_plane); }
kiln_status kiln_cpu_adaptive_avg_pool2d(const kiln_kernel_args *args) {
    return pool_run(args, adaptive_plane);
}
