// SPDX-License-Identifier: Apache-2.0
// Data-movement ops on any dtype: reshape / squeeze / unsqueeze (a plain copy), permute, expand,
// cat, slice, select. All are one strided copy (kiln_cuda_copy_strided): dims coalesced on the
// host, a dense copy becomes cudaMemcpyAsync, anything else one gather kernel over
// 1/2/4/8-byte elements. Semantics as src/cpu (negative dims and indices count from the end).
#include <string.h>

#include "cuda/cuda_common.cuh"

#define COPY_BLOCK 256

typedef struct copy_params {
    int rank;
    int64_t numel;
    int64_t dims[KC_MAX_RANK];
    int64_t dst_strides[KC_MAX_RANK];
    int64_t src_strides[KC_MAX_RANK];
} copy_params;

// --- kernels

// I: the index type (int32_t when every element index and offset fits: cheaper division).
template <typename E, typename I>
static __global__ void copy_strided_kernel(E *dst, const E *src, const copy_params P) {
    kc_pdl_enter();
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)P.numel;
         i += (I)gridDim.x * blockDim.x) {
        I rest = i, so = 0, dof = 0;
        for (int d = P.rank - 1; d >= 0; d--) {
            I k = rest % (I)P.dims[d];
            rest /= (I)P.dims[d];
            so += k * (I)P.src_strides[d];
            dof += k * (I)P.dst_strides[d];
        }
        dst[dof] = src[so];
    }
}

// --- launchers

template <typename E>
static kiln_status copy_launch(const kiln_cuda_ctx *ctx, void *dst, const void *src,
                               const copy_params *P) {
    int64_t reach = P->numel, dreach = 0, sreach = 0; // largest index and offsets + 1
    for (int d = 0; d < P->rank; d++) {
        dreach += (P->dims[d] - 1) * P->dst_strides[d];
        sreach += (P->dims[d] - 1) * P->src_strides[d];
    }
    if (dreach + 1 > reach) reach = dreach + 1;
    if (sreach + 1 > reach) reach = sreach + 1;
    unsigned blocks = kc_blocks(P->numel, COPY_BLOCK);
    if (reach + (int64_t)blocks * COPY_BLOCK < INT32_MAX) {
        kc_launch(ctx, copy_strided_kernel<E, int32_t>, blocks, COPY_BLOCK, 0, (E *)dst,
                  (const E *)src, *P);
    } else {
        kc_launch(ctx, copy_strided_kernel<E, int64_t>, blocks, COPY_BLOCK, 0, (E *)dst,
                  (const E *)src, *P);
    }
    return kiln_cuda_check_launch(ctx, "copy_strided_kernel");
}

extern "C" kiln_status kiln_cuda_copy_strided(const kiln_cuda_ctx *ctx, void *dst, const void *src,
                                              size_t esize, int rank, const int64_t *dims,
                                              const int64_t *dst_strides,
                                              const int64_t *src_strides) {
    copy_params P;
    memset(&P, 0, sizeof P);
    P.numel = 1;
    for (int d = 0; d < rank; d++) P.numel *= dims[d];
    if (P.numel == 0) return KILN_OK;
    // Drop size-1 dims; merge a dim into the previous one when both sides are contiguous there.
    int nr = 0;
    for (int d = 0; d < rank; d++) {
        if (dims[d] == 1) continue;
        if (nr > 0 && P.dst_strides[nr - 1] == dst_strides[d] * dims[d] &&
            P.src_strides[nr - 1] == src_strides[d] * dims[d]) {
            P.dims[nr - 1] *= dims[d];
            P.dst_strides[nr - 1] = dst_strides[d];
            P.src_strides[nr - 1] = src_strides[d];
            continue;
        }
        P.dims[nr] = dims[d];
        P.dst_strides[nr] = dst_strides[d];
        P.src_strides[nr] = src_strides[d];
        nr++;
    }
    if (nr == 0) {
        P.dims[0] = 1;
        P.dst_strides[0] = P.src_strides[0] = 1;
        nr = 1;
    }
    P.rank = nr;
    if (nr == 1 && P.dst_strides[0] == 1 && P.src_strides[0] == 1) {
        if (dst == src) return KILN_OK;
        cudaError_t err = cudaMemcpyAsync(dst, src, (size_t)P.numel * esize,
                                          cudaMemcpyDeviceToDevice, ctx->stream);
        return err == cudaSuccess ? KILN_OK : kiln_cuda_error(ctx, "cudaMemcpyAsync (copy)", err);
    }
    // Widen: move w-byte units (up to 16) when the innermost dim is contiguous on both sides and
    // the pointers, the innermost run and every other stride are multiples of w (permutes of
    // [.., S, H, E] heads: 128-byte runs become 8 uint4 moves instead of 64 2-byte ones).
    size_t w = esize;
    if (P.dst_strides[nr - 1] == 1 && P.src_strides[nr - 1] == 1) {
        for (size_t cand = 16; cand > esize; cand /= 2) {
            int64_t f = (int64_t)(cand / esize);
            int ok =
                (uintptr_t)dst % cand == 0 && (uintptr_t)src % cand == 0 && P.dims[nr - 1] % f == 0;
            for (int d = 0; d < nr - 1 && ok; d++) {
                ok = P.dst_strides[d] % f == 0 && P.src_strides[d] % f == 0;
            }
            if (!ok) continue;
            P.dims[nr - 1] /= f;
            P.numel /= f;
            for (int d = 0; d < nr - 1; d++) {
                P.dst_strides[d] /= f;
                P.src_strides[d] /= f;
            }
            w = cand;
            break;
        }
    }
    switch (w) {
    case 16: return copy_launch<uint4>(ctx, dst, src, &P);
    case 1: return copy_launch<uint8_t>(ctx, dst, src, &P);
    case 2: return copy_launch<uint16_t>(ctx, dst, src, &P);
    case 4: return copy_launch<uint32_t>(ctx, dst, src, &P);
    case 8: return copy_launch<uint64_t>(ctx, dst, src, &P);
    default:
        return kiln_cuda_fail(KILN_ERR_INTERNAL, "cuda copy: element size %zu at %s", esize,
                              ctx->where ? ctx->where : "?");
    }
}

static kiln_status shape_check_dtype(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    if (x == NULL || x->dtype != y->dtype || kiln_cuda_dtype_size(y->dtype) == 0) {
        return kiln_cuda_fail(
            KILN_ERR_UNSUPPORTED, "cuda %s: input and output dtypes must match (%s vs %s) at %s",
            kiln_cuda_op_name(args->op), x ? kiln_cuda_dtype_name(x->dtype) : "missing",
            kiln_cuda_dtype_name(y->dtype), ctx->where ? ctx->where : "?");
    }
    return KILN_OK;
}

// --- entry points

// reshape, squeeze, unsqueeze: the same bytes under another shape.
extern "C" kiln_status kiln_cuda_reshape(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    KILN_CUDA_TRY(shape_check_dtype(ctx, args));
    int64_t n = kc_numel(y);
    if (kc_numel(x) != n) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL, "cuda %s: %lld elements in, %lld out at %s",
                              kiln_cuda_op_name(args->op), (long long)kc_numel(x), (long long)n,
                              ctx->where ? ctx->where : "?");
    }
    int64_t one = 1;
    return kiln_cuda_copy_strided(ctx, y->data, x->data, kiln_cuda_dtype_size(y->dtype), 1, &n,
                                  &one, &one);
}

// The strides of t stored channels-last with k channel dims (cuda_layout.h): dims 1..k innermost
// (in order), then the dims after them in order, then dim 0 (NHWC for a 4-D [N, C, H, W], k 1).
static void channels_last_strides(const kiln_tensor *t, int64_t *st, int k) {
    int64_t step = 1;
    if (k < 1 || k + 1 >= (int)t->rank) k = 1;
    for (int d = k; d >= 1; d--) {
        st[d] = step;
        step *= t->dims[d];
    }
    for (int d = (int)t->rank - 1; d > k; d--) {
        st[d] = step;
        step *= t->dims[d];
    }
    st[0] = step;
}

extern "C" kiln_status kiln_cuda_permute(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int64_t xs[KC_MAX_RANK], ys[KC_MAX_RANK], ss[KC_MAX_RANK];
    uint32_t n = 0;
    const int64_t *perm = kiln_attrs_ints(&args->attrs, KILN_A_PERMUTE_DIMS, &n);
    KILN_CUDA_TRY(shape_check_dtype(ctx, args));
    if (n != y->rank || x->rank != y->rank) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda permute: %u dims for rank %u at %s", n,
                              y->rank, ctx->where ? ctx->where : "?");
    }
    kc_strides(x, xs);
    kc_strides(y, ys);
    if (ctx->in_nhwc && x->rank >= 3) channels_last_strides(x, xs, 1); // (cuda_layout.h)
    if (ctx->out_nhwc && y->rank >= 3) channels_last_strides(y, ys, ctx->out_nhwc); // NHWC at 4
    for (uint32_t d = 0; d < n; d++) {
        int p = kc_norm_dim(perm[d], x->rank);
        if (p < 0) {
            return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda permute: dim %lld out of range at %s",
                                  (long long)perm[d], ctx->where ? ctx->where : "?");
        }
        ss[d] = xs[p];
    }
    return kiln_cuda_copy_strided(ctx, y->data, x->data, kiln_cuda_dtype_size(y->dtype),
                                  (int)y->rank, y->dims, ys, ss);
}

extern "C" kiln_status kiln_cuda_expand(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int64_t ys[KC_MAX_RANK], ss[KC_MAX_RANK];
    KILN_CUDA_TRY(shape_check_dtype(ctx, args));
    kc_strides(y, ys);
    kc_bcast_strides(x, y->rank, ss);
    return kiln_cuda_copy_strided(ctx, y->data, x->data, kiln_cuda_dtype_size(y->dtype),
                                  (int)y->rank, y->dims, ys, ss);
}

// cat and its fused tail: one kernel (kiln_cuda_cat_fused, op_eltwise.cu), else a copy per input
// and the tail after them. A layer run NHWC gets NHWC-ordered views (cuda_layers.c): its dim
// moves with them.
extern "C" kiln_status kiln_cuda_cat(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *y = args->out;
    size_t es = kiln_cuda_dtype_size(y->dtype);
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_CAT_DIM, 0), y->rank);
    int64_t ys[KC_MAX_RANK];
    int64_t at = 0;
    int fused = 0;
    if (dim < 0 || es == 0) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda cat: bad dim or dtype at %s",
                              ctx->where ? ctx->where : "?");
    }
    if (ctx->nhwc && y->rank == 4) {
        static const int nhwc_pos[4] = {0, 3, 1, 2};
        dim = nhwc_pos[dim];
    }
    kiln_status st = kiln_cuda_cat_fused(ctx, args, dim, &fused);
    if (st != KILN_ERR_UNSUPPORTED) {
        return st == KILN_OK && !fused ? kiln_cuda_tail(ctx, args, 0) : st;
    }
    kc_strides(y, ys);
    for (uint32_t i = 0; i < args->n_in; i++) {
        const kiln_tensor *x = args->in[i];
        int64_t xs[KC_MAX_RANK];
        if (x == NULL) continue;
        if (x->dtype != y->dtype || x->rank != y->rank) {
            return kiln_cuda_fail(
                KILN_ERR_UNSUPPORTED, "cuda cat: input %u is %s rank %u, output %s rank %u at %s",
                i, kiln_cuda_dtype_name(x->dtype), x->rank, kiln_cuda_dtype_name(y->dtype), y->rank,
                ctx->where ? ctx->where : "?");
        }
        kc_strides(x, xs);
        if (kc_numel(x) > 0) {
            uint8_t *dst = (uint8_t *)y->data + (size_t)(at * ys[dim]) * es;
            KILN_CUDA_TRY(
                kiln_cuda_copy_strided(ctx, dst, x->data, es, (int)x->rank, x->dims, ys, xs));
        }
        at += x->dims[dim];
    }
    return kiln_cuda_tail(ctx, args, 0);
}

extern "C" kiln_status kiln_cuda_slice(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int64_t xs[KC_MAX_RANK], ys[KC_MAX_RANK];
    KILN_CUDA_TRY(shape_check_dtype(ctx, args));
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_SLICE_DIM, 0), x->rank);
    int64_t start = kiln_attrs_int(&args->attrs, KILN_A_SLICE_START, 0);
    int64_t step = kiln_attrs_int(&args->attrs, KILN_A_SLICE_STEP, 0);
    if (dim < 0 || step <= 0 || x->rank != y->rank) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda slice: bad dim or step at %s",
                              ctx->where ? ctx->where : "?");
    }
    int64_t size = x->dims[dim];
    if (start < 0) start += size;
    if (start < 0) start = 0;
    if (start > size) start = size;
    kc_strides(x, xs);
    kc_strides(y, ys);
    size_t es = kiln_cuda_dtype_size(y->dtype);
    const uint8_t *src = (const uint8_t *)x->data + (size_t)(start * xs[dim]) * es;
    xs[dim] *= step;
    return kiln_cuda_copy_strided(ctx, y->data, src, es, (int)y->rank, y->dims, ys, xs);
}

extern "C" kiln_status kiln_cuda_select(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int64_t xs[KC_MAX_RANK], ys[KC_MAX_RANK], ss[KC_MAX_RANK];
    KILN_CUDA_TRY(shape_check_dtype(ctx, args));
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_SELECT_DIM, 0), x->rank);
    int64_t index = kiln_attrs_int(&args->attrs, KILN_A_SELECT_INDEX, 0);
    if (dim < 0 || y->rank + 1 != x->rank) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda select: bad dim at %s",
                              ctx->where ? ctx->where : "?");
    }
    if (index < 0) index += x->dims[dim];
    if (index < 0 || index >= x->dims[dim]) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda select: index out of range at %s",
                              ctx->where ? ctx->where : "?");
    }
    kc_strides(x, xs);
    kc_strides(y, ys);
    for (uint32_t d = 0, k = 0; d < x->rank; d++) {
        if ((int)d != dim) ss[k++] = xs[d];
    }
    size_t es = kiln_cuda_dtype_size(y->dtype);
    const uint8_t *src = (const uint8_t *)x->data + (size_t)(index * xs[dim]) * es;
    return kiln_cuda_copy_strided(ctx, y->data, src, es, (int)y->rank, y->dims, ys, ss);
}

// --- pad: constant padding (negative pads crop); every output element reads its source or
// takes the fill value, stored in the output dtype.

typedef struct pad_params {
    int rank;
    int64_t numel;
    int64_t ydims[KC_MAX_RANK], xdims[KC_MAX_RANK], xs[KC_MAX_RANK], before[KC_MAX_RANK];
} pad_params;

template <typename E>
static __global__ void pad_kernel(E *y, const E *x, const __grid_constant__ pad_params P, E fill) {
    kc_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i, off = 0;
        int inside = 1;
        for (int d = P.rank - 1; d >= 0; d--) {
            int64_t c = rem % P.ydims[d] - P.before[d];
            rem /= P.ydims[d];
            if (c < 0 || c >= P.xdims[d]) inside = 0;
            off += c * P.xs[d];
        }
        y[i] = inside ? x[off] : fill;
    }
}

template <typename E>
static kiln_status pad_launch(const kiln_cuda_ctx *ctx, const pad_params &P, void *y, const void *x,
                              const uint8_t *fill) {
    E f;
    memcpy(&f, fill, sizeof f);
    kc_launch(ctx, pad_kernel<E>, kc_blocks(P.numel, COPY_BLOCK), COPY_BLOCK, 0, (E *)y,
              (const E *)x, P, f);
    return kiln_cuda_check_launch(ctx, "pad_kernel");
}

extern "C" kiln_status kiln_cuda_pad(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    uint32_t np = 0;
    const int64_t *pads = kiln_attrs_ints(&args->attrs, KILN_A_PAD_PADS, &np);
    double value = kiln_attrs_float(&args->attrs, KILN_A_PAD_VALUE, 0);
    if (np % 2 != 0 || np / 2 > x->rank || y->rank != x->rank || x->dtype != y->dtype) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda pad: bad pads or dtypes at %s",
                              ctx->where ? ctx->where : "?");
    }
    pad_params P;
    memset(&P, 0, sizeof P);
    P.rank = (int)x->rank;
    kc_strides(x, P.xs);
    for (uint32_t d = 0; d < x->rank; d++) {
        uint32_t j = x->rank - 1 - d;
        P.xdims[d] = x->dims[d];
        P.ydims[d] = y->dims[d];
        P.before[d] = j < np / 2 ? pads[2 * j] : 0;
    }
    P.numel = kc_numel(y);
    if (P.numel == 0) return KILN_OK;
    uint8_t fill[8] = {0};
    switch (y->dtype) {
    case KILN_DTYPE_F32: {
        float v = (float)value;
        memcpy(fill, &v, 4);
        break;
    }
    case KILN_DTYPE_F16: {
        __half v = __float2half_rn((float)value);
        memcpy(fill, &v, 2);
        break;
    }
    case KILN_DTYPE_BF16: {
        __nv_bfloat16 v = __float2bfloat16_rn((float)value);
        memcpy(fill, &v, 2);
        break;
    }
    case KILN_DTYPE_I32: {
        int32_t v = (int32_t)(int64_t)value;
        memcpy(fill, &v, 4);
        break;
    }
    case KILN_DTYPE_I64: {
        int64_t v = (int64_t)value;
        memcpy(fill, &v, 8);
        break;
    }
    default: fill[0] = value != 0.0; break;
    }
    switch (kiln_cuda_dtype_size(y->dtype)) {
    case 1: return pad_launch<uint8_t>(ctx, P, y->data, x->data, fill);
    case 2: return pad_launch<uint16_t>(ctx, P, y->data, x->data, fill);
    case 4: return pad_launch<uint32_t>(ctx, P, y->data, x->data, fill);
    default: return pad_launch<uint64_t>(ctx, P, y->data, x->data, fill);
    }
}

// --- arange: y[i] = start + i * step, computed in double and stored in the output dtype (the
// CPU reference's rule); the length is the output's.

static __global__ void arange_kernel(void *y, uint32_t dt, int64_t n, double start, double step,
                                     int is_int) {
    kc_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        double v = start + (double)i * step;
        if (is_int) {
            kc_st_i(y, dt, i, (int64_t)v);
        } else {
            kc_st_f(y, dt, i, (float)v);
        }
    }
}

extern "C" kiln_status kiln_cuda_arange(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *y = args->out;
    if (y->rank != 1 || y->dtype == KILN_DTYPE_BOOL || kiln_cuda_dtype_size(y->dtype) == 0) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda arange: needs a numeric 1-D output at %s",
                              ctx->where ? ctx->where : "?");
    }
    int64_t n = y->dims[0];
    if (n == 0) return KILN_OK;
    double start = kiln_attrs_float(&args->attrs, KILN_A_ARANGE_START, 0);
    double step = kiln_attrs_float(&args->attrs, KILN_A_ARANGE_STEP, 0);
    kc_launch(ctx, arange_kernel, kc_blocks(n, COPY_BLOCK), COPY_BLOCK, 0, y->data, y->dtype, n,
              start, step, !kiln_cuda_is_float(y->dtype));
    return kiln_cuda_check_launch(ctx, "arange_kernel");
}
