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
