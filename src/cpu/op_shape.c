// SPDX-License-Identifier: Apache-2.0
// Data-movement ops: reshape / squeeze / unsqueeze (a plain copy: the output shape was already
// inferred), expand (broadcast copy), permute (strided copy), cat, slice and select. Bytes are
// moved as-is, so every dtype is exact.
#include <string.h>

#include "cpu/cpu_internal.h"

static size_t esize_of(const kiln_tensor *t) { return kiln_dtype_size((kiln_dtype)t->dtype); }

static kiln_status same_dtype(const kiln_kernel_args *args, const kiln_tensor *x) {
    KILN_CHECK(x->dtype == args->out->dtype, KILN_ERR_INVALID_ARG,
               "cpu %s: input dtype %s differs from output dtype %s", kiln_op_name(args->op),
               kiln_dtype_name((kiln_dtype)x->dtype),
               kiln_dtype_name((kiln_dtype)args->out->dtype));
    return KILN_OK;
}

static size_t no_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

// --- reshape, squeeze, unsqueeze

size_t kiln_cpu_reshape_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_reshape(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    KILN_TRY(same_dtype(args, x));
    int64_t n = kiln_tensor_numel(x);
    KILN_CHECK(n == kiln_tensor_numel(y), KILN_ERR_INVALID_ARG,
               "cpu %s: input has %lld elements but the output %lld", kiln_op_name(args->op),
               (long long)n, (long long)kiln_tensor_numel(y));
    if (n > 0 && y->data != x->data) memmove(y->data, x->data, (size_t)n * esize_of(x));
    return KILN_OK;
}

// --- expand: broadcast copy (x right-aligned against the output shape)

size_t kiln_cpu_expand_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_expand(const kiln_kernel_args *args) {
    KILN_TRY(same_dtype(args, args->in[0]));
    return kiln_cpu_eltwise(KILN_OP_COPY, &args->attrs, args->in, 1, args->out);
}

// --- permute

typedef struct copy_ctx {
    const uint8_t *src;
    uint8_t *dst;
    size_t es;
} copy_ctx;

// dst[offs[0] + i] = src[offs[1] + i * inner[1]] (elements of es bytes).
static void row_copy(void *vctx, const int64_t *offs, int64_t n, const int64_t *inner) {
    const copy_ctx *c = (const copy_ctx *)vctx;
    int64_t st = inner[1];
    uint8_t *d = c->dst + (size_t)offs[0] * c->es;
    const uint8_t *s = c->src + (size_t)offs[1] * c->es;
    if (st == 1) {
        memcpy(d, s, (size_t)n * c->es);
        return;
    }
    switch (c->es) {
    case 1:
        for (int64_t i = 0; i < n; i++) d[i] = s[i * st];
        break;
    case 2: {
        uint16_t *dd = (uint16_t *)(void *)d;
        const uint16_t *ss = (const uint16_t *)(const void *)s;
        for (int64_t i = 0; i < n; i++) dd[i] = ss[i * st];
        break;
    }
    case 4: {
        uint32_t *dd = (uint32_t *)(void *)d;
        const uint32_t *ss = (const uint32_t *)(const void *)s;
        for (int64_t i = 0; i < n; i++) dd[i] = ss[i * st];
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) {
            memcpy(d + (size_t)i * c->es, s + (size_t)(i * st) * c->es, c->es);
        }
        break;
    }
}

size_t kiln_cpu_permute_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_permute(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    KILN_TRY(same_dtype(args, x));
    uint32_t n = 0;
    const int64_t *perm = kiln_attrs_ints(&args->attrs, KILN_A_PERMUTE_DIMS, &n);
    KILN_CHECK(n == x->rank && y->rank == x->rank, KILN_ERR_INVALID_ARG,
               "cpu permute: dims has %u entries for an input of rank %u", n, x->rank);
    int64_t xs[KILN_MAX_RANK], st[2][KILN_MAX_RANK];
    kiln_cpu_strides(x, xs);
    kiln_cpu_strides(y, st[0]);
    unsigned seen = 0;
    for (uint32_t d = 0; d < n; d++) {
        int p = kiln_cpu_norm_dim(perm[d], x->rank);
        KILN_CHECK(p >= 0 && !(seen & (1u << p)) && y->dims[d] == x->dims[p], KILN_ERR_INVALID_ARG,
                   "cpu permute: dims entry %u (%lld) is not a valid "
                   "permutation of the input dims",
                   d, (long long)perm[d]);
        seen |= 1u << p;
        st[1][d] = xs[p];
    }
    if (kiln_tensor_numel(y) == 0) return KILN_OK;
    kiln_cpu_iter it;
    kiln_cpu_iter_init_strided(&it, (int)y->rank, y->dims, 2, (const int64_t(*)[KILN_MAX_RANK])st);
    copy_ctx c = {(const uint8_t *)x->data, (uint8_t *)y->data, esize_of(x)};
    kiln_cpu_iter_run(&it, row_copy, &c);
    return KILN_OK;
}

// --- cat

size_t kiln_cpu_cat_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_cat(const kiln_kernel_args *args) {
    kiln_tensor *y = args->out;
    int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_CAT_DIM, 0);
    int dim = kiln_cpu_norm_dim(dim_attr, y->rank);
    KILN_CHECK(dim >= 0, KILN_ERR_INVALID_ARG, "cpu cat: dim %lld out of range for rank %u",
               (long long)dim_attr, y->rank);
    int64_t outer = 1, inner = 1, total = 0;
    for (int d = 0; d < dim; d++) outer *= y->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < y->rank; d++) inner *= y->dims[d];
    size_t es = esize_of(y);
    for (uint32_t i = 0; i < args->n_in; i++) {
        const kiln_tensor *x = args->in[i];
        KILN_CHECK(x != NULL, KILN_ERR_INVALID_ARG, "cpu cat: input %u is missing", i);
        KILN_TRY(same_dtype(args, x));
        if (x->rank != y->rank && kiln_tensor_numel(x) == 0) continue; // legacy empty input
        KILN_CHECK(x->rank == y->rank, KILN_ERR_INVALID_ARG,
                   "cpu cat: input %u has rank %u, output %u", i, x->rank, y->rank);
        for (uint32_t d = 0; d < y->rank; d++) {
            KILN_CHECK((int)d == dim || x->dims[d] == y->dims[d], KILN_ERR_INVALID_ARG,
                       "cpu cat: input %u dim %u is %lld, output %lld", i, d, (long long)x->dims[d],
                       (long long)y->dims[d]);
        }
        total += x->dims[dim];
    }
    KILN_CHECK(total == y->dims[dim], KILN_ERR_INVALID_ARG,
               "cpu cat: inputs add up to %lld along dim %d, output has %lld", (long long)total,
               dim, (long long)y->dims[dim]);
    int64_t pos = 0;
    for (uint32_t i = 0; i < args->n_in; i++) {
        const kiln_tensor *x = args->in[i];
        if (x->rank != y->rank) continue;
        size_t chunk = (size_t)(x->dims[dim] * inner) * es;
        if (chunk > 0) {
            for (int64_t o = 0; o < outer; o++) {
                memcpy((uint8_t *)y->data + (size_t)((o * y->dims[dim] + pos) * inner) * es,
                       (const uint8_t *)x->data + (size_t)o * chunk, chunk);
            }
        }
        pos += x->dims[dim];
    }
    return KILN_OK;
}

// --- slice (Python clamping; step > 0)

size_t kiln_cpu_slice_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_slice(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    KILN_TRY(same_dtype(args, x));
    const kiln_attrs *a = &args->attrs;
    int64_t dim_attr = kiln_attrs_int(a, KILN_A_SLICE_DIM, 0);
    int dim = kiln_cpu_norm_dim(dim_attr, x->rank);
    KILN_CHECK(dim >= 0 && y->rank == x->rank, KILN_ERR_INVALID_ARG,
               "cpu slice: dim %lld out of range for rank %u", (long long)dim_attr, x->rank);
    int64_t size = x->dims[dim];
    int64_t start =
        kiln_attrs_count(a, KILN_A_SLICE_START) ? kiln_attrs_int(a, KILN_A_SLICE_START, 0) : 0;
    int64_t end =
        kiln_attrs_count(a, KILN_A_SLICE_END) ? kiln_attrs_int(a, KILN_A_SLICE_END, 0) : INT64_MAX;
    int64_t step =
        kiln_attrs_count(a, KILN_A_SLICE_STEP) ? kiln_attrs_int(a, KILN_A_SLICE_STEP, 0) : 1;
    KILN_CHECK(step > 0, KILN_ERR_INVALID_ARG, "cpu slice: step %lld must be > 0", (long long)step);
    if (start < 0) start = start < -size ? 0 : start + size;
    if (end < 0) end = end < -size ? 0 : end + size;
    if (start > size) start = size;
    if (end > size) end = size;
    int64_t count = end > start ? (end - start - 1) / step + 1 : 0;
    KILN_CHECK(count == y->dims[dim], KILN_ERR_INVALID_ARG,
               "cpu slice: selects %lld elements along dim %d but the output has %lld",
               (long long)count, dim, (long long)y->dims[dim]);
    for (int d = 0; d < (int)x->rank; d++) {
        KILN_CHECK(d == dim || x->dims[d] == y->dims[d], KILN_ERR_INVALID_ARG,
                   "cpu slice: dim %d differs between input and output", d);
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    size_t es = esize_of(x), row = (size_t)inner * es;
    if (row == 0 || count == 0) return KILN_OK;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < count; i++) {
            memcpy((uint8_t *)y->data + (size_t)(o * count + i) * row,
                   (const uint8_t *)x->data + (size_t)(o * size + start + i * step) * row, row);
        }
    }
    return KILN_OK;
}

// --- select (removes dim; negative index counts from the end)

size_t kiln_cpu_select_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_select(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    KILN_TRY(same_dtype(args, x));
    int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_SELECT_DIM, 0);
    int dim = kiln_cpu_norm_dim(dim_attr, x->rank);
    KILN_CHECK(dim >= 0, KILN_ERR_INVALID_ARG, "cpu select: dim %lld out of range for rank %u",
               (long long)dim_attr, x->rank);
    int64_t size = x->dims[dim], index = kiln_attrs_int(&args->attrs, KILN_A_SELECT_INDEX, 0);
    int64_t idx = index < 0 ? index + size : index;
    KILN_CHECK(idx >= 0 && idx < size, KILN_ERR_INVALID_ARG,
               "cpu select: index %lld out of range for dim %d of size %lld", (long long)index, dim,
               (long long)size);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    KILN_CHECK(kiln_tensor_numel(y) == outer * inner, KILN_ERR_INVALID_ARG,
               "cpu select: output has %lld elements, expected %lld",
               (long long)kiln_tensor_numel(y), (long long)(outer * inner));
    size_t row = (size_t)inner * esize_of(x);
    if (row == 0) return KILN_OK;
    for (int64_t o = 0; o < outer; o++) {
        memcpy((uint8_t *)y->data + (size_t)o * row,
               (const uint8_t *)x->data + (size_t)(o * size + idx) * row, row);
    }
    return KILN_OK;
}

// --- pad: constant padding; pads are (before, after) pairs from the last dim backwards, a
// negative entry crops. Output elements outside the input take `value` (in the output dtype).

size_t kiln_cpu_pad_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

typedef struct pad_ctx {
    const uint8_t *src;
    uint8_t *dst;
    size_t es;
    uint32_t rank;
    int64_t xdims[KILN_MAX_RANK], xs[KILN_MAX_RANK], before[KILN_MAX_RANK];
    const int64_t *ydims;
    uint8_t fill[8];
} pad_ctx;

kiln_status kiln_cpu_pad(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    KILN_TRY(same_dtype(args, x));
    uint32_t np = 0;
    const int64_t *pads = kiln_attrs_ints(&args->attrs, KILN_A_PAD_PADS, &np);
    double value = kiln_attrs_float(&args->attrs, KILN_A_PAD_VALUE, 0);
    KILN_CHECK(np % 2 == 0 && np / 2 <= x->rank && y->rank == x->rank, KILN_ERR_INVALID_ARG,
               "cpu pad: %u pad entries for rank %u", np, x->rank);
    pad_ctx c;
    memset(&c, 0, sizeof c);
    c.src = (const uint8_t *)x->data;
    c.dst = (uint8_t *)y->data;
    c.es = esize_of(x);
    c.rank = x->rank;
    kiln_cpu_strides(x, c.xs);
    for (uint32_t d = 0; d < x->rank; d++) {
        c.xdims[d] = x->dims[d];
        int64_t b = 0, e = 0;
        uint32_t j = x->rank - 1 - d;
        if (j < np / 2) {
            b = pads[2 * j];
            e = pads[2 * j + 1];
        }
        c.before[d] = b;
        KILN_CHECK(x->dims[d] + b + e == y->dims[d], KILN_ERR_INVALID_ARG,
                   "cpu pad: dimension %u: %lld + %lld + %lld != output %lld", d,
                   (long long)x->dims[d], (long long)b, (long long)e, (long long)y->dims[d]);
    }
    if (kiln_cpu_is_int(y->dtype)) {
        int64_t v = (int64_t)value;
        kiln_cpu_store_i64(c.fill, y->dtype, 0, 1, &v);
    } else {
        float v = (float)value;
        kiln_cpu_store_f32(c.fill, y->dtype, 0, 1, &v);
    }
    int64_t n = kiln_tensor_numel(y), coord[KILN_MAX_RANK];
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i, off = 0;
        int inside = 1;
        for (uint32_t d = y->rank; d-- > 0;) {
            coord[d] = r % y->dims[d];
            r /= y->dims[d];
        }
        for (uint32_t d = 0; d < y->rank; d++) {
            int64_t xc = coord[d] - c.before[d];
            if (xc < 0 || xc >= c.xdims[d]) {
                inside = 0;
                break;
            }
            off += xc * c.xs[d];
        }
        memcpy(c.dst + (size_t)i * c.es, inside ? c.src + (size_t)off * c.es : c.fill, c.es);
    }
    return KILN_OK;
}

// --- arange: y[i] = start + i * step (computed in double, stored in the output dtype); the
// length is the output's, taken from the like input by shape inference.

size_t kiln_cpu_arange_scratch(const kiln_kernel_args *args) { return no_scratch(args); }

kiln_status kiln_cpu_arange(const kiln_kernel_args *args) {
    kiln_tensor *y = args->out;
    double start = kiln_attrs_float(&args->attrs, KILN_A_ARANGE_START, 0);
    double step = kiln_attrs_float(&args->attrs, KILN_A_ARANGE_STEP, 0);
    KILN_CHECK(y->rank == 1, KILN_ERR_INVALID_ARG, "cpu arange: output rank %u != 1", y->rank);
    for (int64_t i = 0; i < y->dims[0]; i++) {
        double v = start + (double)i * step;
        if (kiln_cpu_is_int(y->dtype)) {
            int64_t iv = (int64_t)v;
            kiln_cpu_store_i64(y->data, y->dtype, i, 1, &iv);
        } else {
            float fv = (float)v;
            kiln_cpu_store_f32(y->data, y->dtype, i, 1, &fv);
        }
    }
    return KILN_OK;
}
