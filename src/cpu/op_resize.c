// SPDX-License-Identifier: Apache-2.0
// Spatial resizing of [N, C, H, W]: upsample_nearest2d (PyTorch's "nearest": source index
// floor(dst * scale), clamped) and upsample_bilinear2d (align_corners or half-pixel centres),
// with PyTorch's scale rules: scale = 1 / scales[i] when given, else in / out (align_corners:
// (in - 1) / (out - 1)). Index math in float32, as PyTorch's CPU kernels do it for float
// tensors; interpolation in float32, rounded once to the output dtype.
#include <math.h>

#include "cpu/cpu_internal.h"

// in / out, or 1 / scales when the scale was given (PyTorch's compute_scales_value).
static float scale_of(double given, int64_t in, int64_t out) {
    return !isnan(given) ? (float)(1.0 / given) : (float)in / (float)out;
}

int64_t kiln_cpu_nearest_index(int64_t dst, int64_t in, int64_t out, double given) {
    if (out == in) return dst;
    if (out == 2 * in && isnan(given)) return dst >> 1;
    float s = scale_of(given, in, out);
    int64_t src = (int64_t)floorf((float)dst * s);
    return src < in - 1 ? src : in - 1;
}

// The two source indices and the weight of the second one, for output index dst.
void kiln_cpu_linear_index(int64_t dst, int64_t in, int64_t out, double given, int align,
                           int64_t *i0, int64_t *i1, float *w1) {
    float s, src;
    if (align) {
        s = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
        src = s * (float)dst;
    } else {
        s = scale_of(given, in, out);
        src = s * ((float)dst + 0.5f) - 0.5f;
        if (src < 0.0f) src = 0.0f;
    }
    int64_t a = (int64_t)src;
    if (a > in - 1) a = in - 1;
    *i0 = a;
    *i1 = a + (a < in - 1 ? 1 : 0);
    *w1 = src - (float)a;
}

// --- grid_sample (PyTorch's grid_sampler_2d): x [N, C, H, W] read at grid [N, Ho, Wo, 2] ((x, y)
// normalized to [-1, 1]) -> [N, C, Ho, Wo]. Source positions unnormalized in float32, as PyTorch
// does: ((g + 1) * size - 1) / 2, or (g + 1) / 2 * (size - 1) with align_corners; border padding
// clamps them into [0, size - 1]. Bilinear: the four corners of floor(), each weighted by the
// opposite corner's distances, a corner outside the map skipped (zeros padding); nearest: the
// pixel at rint() (half to even), 0 outside. Float32 sums, one rounding.

static float grid_source(float g, int64_t size, int align, int border) {
    float s =
        align ? (g + 1.0f) / 2.0f * (float)(size - 1) : ((g + 1.0f) * (float)size - 1.0f) / 2.0f;
    if (border) s = fminf((float)(size - 1), fmaxf(s, 0.0f));
    return s;
}

static float grid_at(const kiln_tensor *x, int64_t base, int64_t h, int64_t w, float r, float q) {
    if (!(r >= 0.0f && r <= (float)(h - 1) && q >= 0.0f && q <= (float)(w - 1))) return 0.0f;
    return kiln_load_f32(x->data, x->dtype, base + (int64_t)r * w + (int64_t)q);
}

size_t kiln_cpu_grid_sample_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_grid_sample(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *g = args->in[1];
    kiln_tensor *y = args->out;
    KILN_CHECK(x->rank == 4 && g->rank == 4 && y->rank == 4 && g->dims[3] == 2 &&
                   g->dims[0] == x->dims[0] && y->dims[0] == x->dims[0] &&
                   y->dims[1] == x->dims[1] && y->dims[2] == g->dims[1] && y->dims[3] == g->dims[2],
               KILN_ERR_INVALID_ARG,
               "cpu grid_sample: needs x [N, C, H, W], grid [N, Ho, Wo, 2], output [N, C, Ho, Wo]");
    const int nearest = kiln_attrs_int(&args->attrs, KILN_A_GRID_MODE, 0) == 1;
    const int border = kiln_attrs_int(&args->attrs, KILN_A_GRID_PADDING, 0) == 1;
    const int align = kiln_attrs_int(&args->attrs, KILN_A_GRID_ALIGN, 0) != 0;
    const int64_t nb = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3];
    const int64_t ho = y->dims[2], wo = y->dims[3];
    for (int64_t n = 0; n < nb; n++) {
        for (int64_t p = 0; p < ho * wo; p++) {
            const int64_t gi = (n * ho * wo + p) * 2;
            const float ix = grid_source(kiln_load_f32(g->data, g->dtype, gi), w, align, border);
            const float iy =
                grid_source(kiln_load_f32(g->data, g->dtype, gi + 1), h, align, border);
            for (int64_t ch = 0; ch < c; ch++) {
                const int64_t base = (n * c + ch) * h * w;
                float v;
                if (nearest) {
                    v = grid_at(x, base, h, w, rintf(iy), rintf(ix));
                } else {
                    const float x0 = floorf(ix), y0 = floorf(iy), x1 = x0 + 1.0f, y1 = y0 + 1.0f;
                    v = grid_at(x, base, h, w, y0, x0) * ((x1 - ix) * (y1 - iy));
                    v += grid_at(x, base, h, w, y0, x1) * ((ix - x0) * (y1 - iy));
                    v += grid_at(x, base, h, w, y1, x0) * ((x1 - ix) * (iy - y0));
                    v += grid_at(x, base, h, w, y1, x1) * ((ix - x0) * (iy - y0));
                }
                kiln_store_f32(y->data, y->dtype, (n * c + ch) * ho * wo + p, v);
            }
        }
    }
    return KILN_OK;
}

size_t kiln_cpu_upsample_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_upsample(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    const kiln_attrs *a = &args->attrs;
    KILN_CHECK(x->rank == 4 && y->rank == 4 && x->dims[0] == y->dims[0] &&
                   x->dims[1] == y->dims[1] && x->dims[2] > 0 && x->dims[3] > 0,
               KILN_ERR_INVALID_ARG, "cpu %s: needs [N, C, H, W] input and output",
               kiln_op_name(args->op));
    int bilinear = args->op == KILN_OP_UPSAMPLE_BILINEAR2D;
    int align = bilinear ? (int)kiln_attrs_int(a, KILN_A_UPSAMPLE_ALIGN, 0) : 0;
    double sh = kiln_attrs_float(a, KILN_A_UPSAMPLE_SCALES, 0);
    double sw = kiln_attrs_float(a, KILN_A_UPSAMPLE_SCALES, 1);
    int64_t nc = x->dims[0] * x->dims[1], h = x->dims[2], w = x->dims[3];
    int64_t oh = y->dims[2], ow = y->dims[3];
    for (int64_t p = 0; p < nc; p++) {
        int64_t xb = p * h * w, yb = p * oh * ow;
        for (int64_t r = 0; r < oh; r++) {
            for (int64_t q = 0; q < ow; q++) {
                float v;
                if (!bilinear) {
                    int64_t sr = kiln_cpu_nearest_index(r, h, oh, sh);
                    int64_t sc = kiln_cpu_nearest_index(q, w, ow, sw);
                    v = kiln_load_f32(x->data, x->dtype, xb + sr * w + sc);
                } else {
                    int64_t r0, r1, c0, c1;
                    float wr, wc;
                    kiln_cpu_linear_index(r, h, oh, sh, align, &r0, &r1, &wr);
                    kiln_cpu_linear_index(q, w, ow, sw, align, &c0, &c1, &wc);
                    float v00 = kiln_load_f32(x->data, x->dtype, xb + r0 * w + c0);
                    float v01 = kiln_load_f32(x->data, x->dtype, xb + r0 * w + c1);
                    float v10 = kiln_load_f32(x->data, x->dtype, xb + r1 * w + c0);
                    float v11 = kiln_load_f32(x->data, x->dtype, xb + r1 * w + c1);
                    v = (1.0f - wr) * ((1.0f - wc) * v00 + wc * v01) +
                        wr * ((1.0f - wc) * v10 + wc * v11);
                }
                kiln_store_f32(y->data, y->dtype, yb + r * ow + q, v);
            }
        }
    }
    return KILN_OK;
}
