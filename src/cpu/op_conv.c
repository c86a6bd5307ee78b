// SPDX-License-Identifier: Apache-2.0
// conv2d and conv_transpose2d, NCHW (a rank-3 input is one unbatched image).
//   conv2d: per (image, group) one GEMM  y[Og, OH*OW] = w[Og, Cg*kh*kw] x im2col(x)[.., OH*OW],
//     where the im2col panels are packed straight from the image (never materialized); 1x1
//     stride-1 unpadded convs read x as a plain matrix; depthwise convs (one input channel per
//     output channel) run a direct loop.
//   conv_transpose2d: per (image, group) cols[Og*kh*kw, H*W] = w^T x, scattered (col2im) into
//     the output by the GEMM epilogue.
#include <string.h>

#include "cpu/cpu_internal.h"

typedef struct conv_geom {
    int64_t n, c, h, w; // input
    int64_t o, oh, ow;  // output channels and size
    int64_t kh, kw;     // kernel
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t groups, cg, og; // groups, input / output channels per group
} conv_geom;

static const kiln_tensor *opt_in(const kiln_kernel_args *args, uint32_t i) {
    return i < args->n_in ? args->in[i] : NULL;
}

static int64_t attr2(const kiln_attrs *a, uint32_t idx, uint32_t j, int64_t dflt) {
    return kiln_attrs_count(a, idx) > j ? kiln_attrs_int(a, idx, j) : dflt;
}

// Reads the geometry; `transposed` selects conv_transpose2d's attribute positions and weight
// layout ([C, O/g, kh, kw] instead of [O, C/g, kh, kw]).
static kiln_status conv_geometry(const kiln_kernel_args *args, int transposed, conv_geom *g) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *y = args->out;
    const char *name = kiln_op_name(args->op);
    KILN_CHECK((x->rank == 4 || x->rank == 3) && y->rank == x->rank && w->rank == 4,
               KILN_ERR_INVALID_ARG,
               "cpu %s: input must be [N, C, H, W] or [C, H, W] and weight 4-D (ranks %u, %u)",
               name, x->rank, w->rank);
    int b = x->rank == 4;
    g->n = b ? x->dims[0] : 1;
    g->c = x->dims[b];
    g->h = x->dims[b + 1];
    g->w = x->dims[b + 2];
    g->o = y->dims[b];
    g->oh = y->dims[b + 1];
    g->ow = y->dims[b + 2];
    g->kh = w->dims[2];
    g->kw = w->dims[3];
    const kiln_attrs *a = &args->attrs;
    uint32_t ist = transposed ? KILN_A_CONVT_STRIDE : KILN_A_CONV_STRIDE;
    uint32_t ipd = transposed ? KILN_A_CONVT_PADDING : KILN_A_CONV_PADDING;
    uint32_t idl = transposed ? KILN_A_CONVT_DILATION : KILN_A_CONV_DILATION;
    uint32_t igr = transposed ? KILN_A_CONVT_GROUPS : KILN_A_CONV_GROUPS;
    g->sh = attr2(a, ist, 0, 1);
    g->sw = attr2(a, ist, 1, g->sh);
    g->ph = attr2(a, ipd, 0, 0);
    g->pw = attr2(a, ipd, 1, g->ph);
    g->dh = attr2(a, idl, 0, 1);
    g->dw = attr2(a, idl, 1, g->dh);
    g->groups = attr2(a, igr, 0, 1);
    KILN_CHECK(g->sh > 0 && g->sw > 0 && g->dh > 0 && g->dw > 0 && g->ph >= 0 && g->pw >= 0 &&
                   g->groups > 0,
               KILN_ERR_INVALID_ARG,
               "cpu %s: stride and dilation must be > 0, padding >= 0, groups > 0", name);
    KILN_CHECK(g->c % g->groups == 0 && g->o % g->groups == 0, KILN_ERR_INVALID_ARG,
               "cpu %s: channels (%lld in, %lld out) must divide by groups %lld", name,
               (long long)g->c, (long long)g->o, (long long)g->groups);
    g->cg = g->c / g->groups;
    g->og = g->o / g->groups;
    if (transposed) {
        KILN_CHECK(w->dims[0] == g->c && w->dims[1] == g->og, KILN_ERR_INVALID_ARG,
                   "cpu %s: weight must be [%lld, %lld, kh, kw]", name, (long long)g->c,
                   (long long)g->og);
    } else {
        KILN_CHECK(w->dims[0] == g->o && w->dims[1] == g->cg, KILN_ERR_INVALID_ARG,
                   "cpu %s: weight must be [%lld, %lld, kh, kw]", name, (long long)g->o,
                   (long long)g->cg);
    }
    const kiln_tensor *bias = opt_in(args, 2);
    KILN_CHECK(bias == NULL || kiln_tensor_numel(bias) == g->o, KILN_ERR_INVALID_ARG,
               "cpu %s: bias must have %lld elements", name, (long long)g->o);
    return KILN_OK;
}

static float *load_bias(const kiln_kernel_args *args, kiln_cpu_scratch *s, int64_t n) {
    const kiln_tensor *b = opt_in(args, 2);
    float *bias = kiln_cpu_scratch_f32(s, n, "conv bias");
    if (bias == NULL) return NULL;
    if (b != NULL) {
        kiln_cpu_load_f32(b->data, b->dtype, 0, 1, n, bias);
    } else {
        for (int64_t i = 0; i < n; i++) bias[i] = 0.0f;
    }
    return bias;
}

// --- conv2d: implicit im2col

typedef struct im2col_ctx {
    const float *x; // one group of one image: [cg, h, w], float32
    const conv_geom *g;
} im2col_ctx;

// B[k][p] with k = (c, ki, kj) and p = (oh, ow): x[c][oh*sh - ph + ki*dh][ow*sw - pw + kj*dw].
static void pack_b_im2col(const void *vctx, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                          float *dst) {
    const im2col_ctx *ctx = (const im2col_ctx *)vctx;
    const conv_geom *g = ctx->g;
    int64_t khw = g->kh * g->kw;
    for (int64_t q = 0; q < nc; q += KILN_CPU_NR) {
        float *d = dst + q * kc;
        int64_t cols = nc - q < KILN_CPU_NR ? nc - q : KILN_CPU_NR;
        int64_t ihb[KILN_CPU_NR], iwb[KILN_CPU_NR];
        int64_t p = n0 + q, oh = p / g->ow, ow = p % g->ow;
        for (int64_t j = 0; j < cols; j++) {
            ihb[j] = oh * g->sh - g->ph;
            iwb[j] = ow * g->sw - g->pw;
            if (++ow == g->ow) {
                ow = 0;
                oh++;
            }
        }
        // A full panel inside one output row: its input pixels are evenly spaced in one row.
        int one_row = cols == KILN_CPU_NR && ihb[0] == ihb[KILN_CPU_NR - 1];
        int64_t c = k0 / khw, r = k0 % khw, ki = r / g->kw, kj = r % g->kw;
        for (int64_t kk = 0; kk < kc; kk++) {
            const float *plane = ctx->x + c * g->h * g->w;
            int64_t dy = ki * g->dh, dx = kj * g->dw;
            float *dk = d + kk * KILN_CPU_NR;
            int64_t j = 0;
            if (one_row) {
                int64_t ih = ihb[0] + dy, iw0 = iwb[0] + dx;
                int64_t iw1 = iw0 + (KILN_CPU_NR - 1) * g->sw;
                if (ih < 0 || ih >= g->h) {
                    for (; j < KILN_CPU_NR; j++) dk[j] = 0.0f;
                } else if (iw0 >= 0 && iw1 < g->w) {
                    const float *row = plane + ih * g->w + iw0;
                    if (g->sw == 1) {
                        for (; j < KILN_CPU_NR; j++) dk[j] = row[j];
                    } else {
                        for (; j < KILN_CPU_NR; j++) dk[j] = row[j * g->sw];
                    }
                }
            }
            for (; j < cols; j++) {
                int64_t ih = ihb[j] + dy, iw = iwb[j] + dx;
                dk[j] =
                    (ih >= 0 && ih < g->h && iw >= 0 && iw < g->w) ? plane[ih * g->w + iw] : 0.0f;
            }
            for (; j < KILN_CPU_NR; j++) dk[j] = 0.0f;
            if (++kj == g->kw) {
                kj = 0;
                if (++ki == g->kh) {
                    ki = 0;
                    c++;
                }
            }
        }
    }
}

static int conv_is_depthwise(const conv_geom *g) { return g->cg == 1 && g->groups > 1; }
static int conv_is_pointwise(const conv_geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

size_t kiln_cpu_conv2d_scratch(const kiln_kernel_args *args) {
    conv_geom g;
    if (conv_geometry(args, 0, &g) != KILN_OK) return 0;
    size_t n = KILN_CPU_SCRATCH_SLACK + kiln_cpu_f32_nbytes(g.o);
    if (conv_is_depthwise(&g)) {
        return n + kiln_cpu_f32_nbytes(g.h * g.w) + kiln_cpu_f32_nbytes(g.oh * g.ow) +
               kiln_cpu_f32_nbytes(g.kh * g.kw);
    }
    if (!conv_is_pointwise(&g) && args->in[0]->dtype != KILN_DTYPE_F32) {
        n += kiln_cpu_f32_nbytes(g.cg * g.h * g.w);
    }
    return n + kiln_cpu_gemm_scratch_nbytes(g.og, g.oh * g.ow, g.cg * g.kh * g.kw);
}

// Depthwise: output channel o reads input channel o / og only.
static kiln_status conv2d_depthwise(const kiln_kernel_args *args, const conv_geom *g,
                                    const float *bias, kiln_cpu_scratch *s) {
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    kiln_tensor *y = args->out;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, khw = g->kh * g->kw;
    float *xbuf = kiln_cpu_scratch_f32(s, hw, "depthwise input plane");
    float *ybuf = kiln_cpu_scratch_f32(s, ohw, "depthwise output plane");
    float *kbuf = kiln_cpu_scratch_f32(s, khw, "depthwise kernel");
    if (xbuf == NULL || ybuf == NULL || kbuf == NULL) return KILN_ERR_INTERNAL;
    for (int64_t n = 0; n < g->n; n++) {
        for (int64_t o = 0; o < g->o; o++) {
            int64_t ci = o / g->og;
            const float *xp = xbuf;
            if (x->dtype == KILN_DTYPE_F32) {
                xp = (const float *)x->data + (n * g->c + ci) * hw;
            } else {
                kiln_cpu_load_f32(x->data, x->dtype, (n * g->c + ci) * hw, 1, hw, xbuf);
            }
            int64_t yoff = (n * g->o + o) * ohw;
            float *yp = y->dtype == KILN_DTYPE_F32 ? (float *)y->data + yoff : ybuf;
            kiln_cpu_load_f32(w->data, w->dtype, o * khw, 1, khw, kbuf);
            for (int64_t i = 0; i < ohw; i++) yp[i] = bias[o];
            for (int64_t oh = 0; oh < g->oh; oh++) {
                float *yrow = yp + oh * g->ow;
                for (int64_t ki = 0; ki < g->kh; ki++) {
                    int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                    if (ih < 0 || ih >= g->h) continue;
                    const float *xrow = xp + ih * g->w;
                    for (int64_t kj = 0; kj < g->kw; kj++) {
                        float wv = kbuf[ki * g->kw + kj];
                        int64_t off = kj * g->dw - g->pw; // iw = ow * sw + off
                        int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;
                        int64_t hi = g->w - 1 - off < 0 ? 0 : (g->w - 1 - off) / g->sw + 1;
                        if (hi > g->ow) hi = g->ow;
                        if (g->sw == 1) {
                            for (int64_t ow = lo; ow < hi; ow++) yrow[ow] += wv * xrow[ow + off];
                        } else {
                            for (int64_t ow = lo; ow < hi; ow++) {
                                yrow[ow] += wv * xrow[ow * g->sw + off];
                            }
                        }
                    }
                }
            }
            if (y->dtype != KILN_DTYPE_F32) kiln_cpu_store_f32(y->data, y->dtype, yoff, ohw, ybuf);
        }
    }
    return KILN_OK;
}

kiln_status kiln_cpu_conv2d(const kiln_kernel_args *args) {
    conv_geom g;
    KILN_TRY(conv_geometry(args, 0, &g));
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    kiln_tensor *y = args->out;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *bias = load_bias(args, &s, g.o);
    if (bias == NULL) return KILN_ERR_INTERNAL;
    if (conv_is_depthwise(&g)) return conv2d_depthwise(args, &g, bias, &s);
    int pointwise = conv_is_pointwise(&g);
    int64_t hw = g.h * g.w, ohw = g.oh * g.ow, k = g.cg * g.kh * g.kw;
    float *xbuf = NULL;
    if (!pointwise && x->dtype != KILN_DTYPE_F32) {
        xbuf = kiln_cpu_scratch_f32(&s, g.cg * hw, "conv input (float32 copy)");
        if (xbuf == NULL) return KILN_ERR_INTERNAL;
    }
    size_t mark = s.used;
    for (int64_t n = 0; n < g.n; n++) {
        for (int64_t gi = 0; gi < g.groups; gi++) {
            int64_t xoff = (n * g.c + gi * g.cg) * hw;
            kiln_cpu_matrix am = {w->data, w->dtype, gi * g.og * k, k, 1};
            kiln_cpu_matrix bm = {x->data, x->dtype, xoff, hw, 1};
            im2col_ctx ic = {NULL, &g};
            kiln_cpu_store st = {y->data,          y->dtype, (n * g.o + gi * g.og) * ohw, ohw, 1.0f,
                                 bias + gi * g.og, NULL};
            kiln_cpu_gemm gm = {g.og, ohw,  k,    kiln_cpu_pack_a_matrix,
                                &am,  NULL, NULL, kiln_cpu_epilogue_store,
                                &st};
            if (pointwise) {
                gm.pack_b = kiln_cpu_pack_b_matrix;
                gm.b_ctx = &bm;
            } else {
                if (xbuf != NULL) {
                    kiln_cpu_load_f32(x->data, x->dtype, xoff, 1, g.cg * hw, xbuf);
                    ic.x = xbuf;
                } else {
                    ic.x = (const float *)x->data + xoff;
                }
                gm.pack_b = pack_b_im2col;
                gm.b_ctx = &ic;
            }
            s.used = mark;
            KILN_TRY(kiln_cpu_gemm_run(&gm, &s));
        }
    }
    return KILN_OK;
}

// --- conv_transpose2d: GEMM + col2im

typedef struct col2im_ctx {
    float *acc; // [og, oh, ow] float32 accumulator of one group of one image
    const conv_geom *g;
} col2im_ctx;

// Row m = (o, ki, kj), column p = (ih, iw): adds to acc[o][ih*sh - ph + ki*dh][iw*sw - pw + kj*dw].
static void epilogue_col2im(void *vctx, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
                            const float *tile, int64_t ld) {
    const col2im_ctx *ctx = (const col2im_ctx *)vctx;
    const conv_geom *g = ctx->g;
    int64_t khw = g->kh * g->kw;
    for (int64_t i = 0; i < mc; i++) {
        int64_t m = m0 + i, o = m / khw, r = m % khw, ki = r / g->kw, kj = r % g->kw;
        float *plane = ctx->acc + o * g->oh * g->ow;
        const float *t = tile + i * ld;
        int64_t ih = n0 / g->w, iw = n0 % g->w;
        for (int64_t j = 0; j < nc; j++) {
            int64_t oh = ih * g->sh - g->ph + ki * g->dh, ow = iw * g->sw - g->pw + kj * g->dw;
            if (oh >= 0 && oh < g->oh && ow >= 0 && ow < g->ow) plane[oh * g->ow + ow] += t[j];
            if (++iw == g->w) {
                iw = 0;
                ih++;
            }
        }
    }
}

size_t kiln_cpu_conv_transpose2d_scratch(const kiln_kernel_args *args) {
    conv_geom g;
    if (conv_geometry(args, 1, &g) != KILN_OK) return 0;
    size_t n = KILN_CPU_SCRATCH_SLACK + kiln_cpu_f32_nbytes(g.o);
    if (args->out->dtype != KILN_DTYPE_F32) n += kiln_cpu_f32_nbytes(g.og * g.oh * g.ow);
    return n + kiln_cpu_gemm_scratch_nbytes(g.og * g.kh * g.kw, g.h * g.w, g.cg);
}

kiln_status kiln_cpu_conv_transpose2d(const kiln_kernel_args *args) {
    conv_geom g;
    KILN_TRY(conv_geometry(args, 1, &g));
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    kiln_tensor *y = args->out;
    kiln_cpu_scratch s;
    kiln_cpu_scratch_init(&s, args);
    float *bias = load_bias(args, &s, g.o);
    if (bias == NULL) return KILN_ERR_INTERNAL;
    int64_t hw = g.h * g.w, ohw = g.oh * g.ow, mrows = g.og * g.kh * g.kw;
    float *abuf = NULL;
    if (y->dtype != KILN_DTYPE_F32) {
        abuf = kiln_cpu_scratch_f32(&s, g.og * ohw, "conv_transpose2d accumulator");
        if (abuf == NULL) return KILN_ERR_INTERNAL;
    }
    size_t mark = s.used;
    for (int64_t n = 0; n < g.n; n++) {
        for (int64_t gi = 0; gi < g.groups; gi++) {
            int64_t yoff = (n * g.o + gi * g.og) * ohw;
            float *acc = abuf ? abuf : (float *)y->data + yoff;
            for (int64_t o = 0; o < g.og; o++) {
                for (int64_t i = 0; i < ohw; i++) acc[o * ohw + i] = bias[gi * g.og + o];
            }
            // A[m][c] = w[gi*cg + c][m] (m = (o, ki, kj)); B[c][p] = x[n][gi*cg + c][p].
            kiln_cpu_matrix am = {w->data, w->dtype, gi * g.cg * mrows, 1, mrows};
            kiln_cpu_matrix bm = {x->data, x->dtype, (n * g.c + gi * g.cg) * hw, hw, 1};
            col2im_ctx cc = {acc, &g};
            kiln_cpu_gemm gm = {
                mrows,           hw, g.cg, kiln_cpu_pack_a_matrix, &am, kiln_cpu_pack_b_matrix, &bm,
                epilogue_col2im, &cc};
            s.used = mark;
            KILN_TRY(kiln_cpu_gemm_run(&gm, &s));
            if (abuf) kiln_cpu_store_f32(y->data, y->dtype, yoff, g.og * ohw, abuf);
        }
    }
    return KILN_OK;
}
