// SPDX-License-Identifier: Apache-2.0
// Indexing by integer tensors: index (PyTorch advanced indexing x[..., i0, ..., ik-1, ...] with
// k index tensors broadcast together, placed at dims dim .. dim + k - 1) and gather
// (torch.gather). Indices are data: every one is checked against its dimension before anything
// is written (negative ones count from the end where PyTorch allows it: index with wrap, as
// x[i]; index_select and gather take [0, size) only); one out of range fails execute with
// KILN_ERR_INVALID_ARG naming it, never a read out of bounds. Bytes move as-is.
#include <string.h>

#include "cpu/cpu_internal.h"

static size_t esize_of(const kiln_tensor *t) { return kiln_dtype_size((kiln_dtype)t->dtype); }

// Index j of tensor t broadcast to a `rank`-dim shape, at the position given by coordinates.
static int64_t bcast_load(const kiln_tensor *t, const int64_t *strides, uint32_t rank,
                          const int64_t *coord) {
    int64_t off = 0;
    for (uint32_t d = 0; d < rank; d++) off += coord[d] * strides[d];
    return kiln_load_i64(t->data, t->dtype, off);
}

static void coords_of(int64_t i, uint32_t rank, const int64_t *dims, int64_t *coord) {
    for (uint32_t d = rank; d-- > 0;) {
        coord[d] = dims[d] ? i % dims[d] : 0;
        i = dims[d] ? i / dims[d] : 0;
    }
}

static int index_ok(uint32_t dtype) { return dtype == KILN_DTYPE_I32 || dtype == KILN_DTYPE_I64; }

// --- index

size_t kiln_cpu_index_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_index(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    kiln_tensor *y = args->out;
    int64_t dim = kiln_attrs_int(&args->attrs, KILN_A_INDEX_DIM, 0);
    int wrap = kiln_attrs_int(&args->attrs, KILN_A_INDEX_WRAP, 0) != 0;
    uint32_t k = args->n_in - 1;
    KILN_CHECK(x->dtype == y->dtype, KILN_ERR_INVALID_ARG, "cpu index: x and output dtypes differ");
    KILN_CHECK(k >= 1 && dim >= 0 && (uint64_t)dim + k <= x->rank, KILN_ERR_INVALID_ARG,
               "cpu index: %u index tensors from dim %lld do not fit rank %u", k, (long long)dim,
               x->rank);
    // The broadcast index shape B sits at output dims dim .. dim + rb - 1.
    uint32_t rb = y->rank - (x->rank - k);
    const int64_t *bdims = y->dims + dim;
    int64_t nb = 1, outer = 1, inner = 1, xs[KILN_MAX_RANK];
    int64_t ist[KILN_MAX_RANK][KILN_MAX_RANK];
    for (uint32_t d = 0; d < rb; d++) nb *= bdims[d];
    for (int64_t d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + k; d < x->rank; d++) inner *= x->dims[d];
    kiln_cpu_strides(x, xs);
    for (uint32_t j = 0; j < k; j++) {
        const kiln_tensor *t = args->in[1 + j];
        KILN_CHECK(t != NULL && index_ok(t->dtype) && t->rank <= rb, KILN_ERR_INVALID_ARG,
                   "cpu index: index %u must be an int32/int64 tensor broadcasting to the index "
                   "shape",
                   j);
        int64_t ts[KILN_MAX_RANK];
        kiln_cpu_strides(t, ts);
        for (uint32_t d = 0; d < rb; d++) {
            int td = (int)d - (int)(rb - t->rank);
            ist[j][d] = (td < 0 || t->dims[td] == 1) ? 0 : ts[td];
        }
    }
    int64_t coord[KILN_MAX_RANK];
    for (int64_t b = 0; b < nb; b++) { // every index in range, before anything is written
        coords_of(b, rb, bdims, coord);
        for (uint32_t j = 0; j < k; j++) {
            int64_t size = x->dims[dim + j], v = bcast_load(args->in[1 + j], ist[j], rb, coord);
            KILN_CHECK(v >= (wrap ? -size : 0) && v < size, KILN_ERR_INVALID_ARG,
                       "index: index %lld (index tensor %u, position %lld) is out of range for "
                       "dimension %lld of size %lld",
                       (long long)v, j, (long long)b, (long long)(dim + j), (long long)size);
        }
    }
    size_t es = esize_of(x), row = (size_t)inner * es;
    if (row == 0 || nb == 0 || outer == 0) return KILN_OK;
    int64_t xblock = dim > 0 ? xs[dim - 1] : kiln_tensor_numel(x); // elements per outer step
    for (int64_t b = 0; b < nb; b++) {
        int64_t off = 0;
        coords_of(b, rb, bdims, coord);
        for (uint32_t j = 0; j < k; j++) {
            int64_t size = x->dims[dim + j], v = bcast_load(args->in[1 + j], ist[j], rb, coord);
            off += (v < 0 ? v + size : v) * xs[dim + j];
        }
        for (int64_t o = 0; o < outer; o++) {
            memcpy((uint8_t *)y->data + (size_t)((o * nb + b) * inner) * es,
                   (const uint8_t *)x->data + (size_t)(o * xblock + off) * es, row);
        }
    }
    return KILN_OK;
}

// --- gather: y[.., i, ..] = x[.., index[.., i, ..], ..] along dim

size_t kiln_cpu_gather_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

kiln_status kiln_cpu_gather(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *ix = args->in[1];
    kiln_tensor *y = args->out;
    int64_t dim_attr = kiln_attrs_int(&args->attrs, KILN_A_GATHER_DIM, 0);
    int dim = kiln_cpu_norm_dim(dim_attr, x->rank);
    KILN_CHECK(dim >= 0 && ix->rank == x->rank && y->rank == x->rank && index_ok(ix->dtype) &&
                   x->dtype == y->dtype,
               KILN_ERR_INVALID_ARG,
               "cpu gather: needs x and an int32/int64 index of one rank, dim %lld in range",
               (long long)dim_attr);
    int64_t n = kiln_tensor_numel(ix), size = x->dims[dim], xs[KILN_MAX_RANK];
    for (uint32_t d = 0; d < x->rank; d++) {
        KILN_CHECK((int)d == dim || ix->dims[d] <= x->dims[d], KILN_ERR_INVALID_ARG,
                   "gather: index dimension %u (%lld) is larger than x's (%lld)", d,
                   (long long)ix->dims[d], (long long)x->dims[d]);
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = kiln_load_i64(ix->data, ix->dtype, i);
        KILN_CHECK(v >= 0 && v < size, KILN_ERR_INVALID_ARG,
                   "gather: index %lld at position %lld is out of range for dimension %d of size "
                   "%lld",
                   (long long)v, (long long)i, dim, (long long)size);
    }
    kiln_cpu_strides(x, xs);
    size_t es = esize_of(x);
    int64_t coord[KILN_MAX_RANK];
    for (int64_t i = 0; i < n; i++) {
        int64_t v = kiln_load_i64(ix->data, ix->dtype, i), off = 0;
        coords_of(i, ix->rank, ix->dims, coord);
        coord[dim] = v;
        for (uint32_t d = 0; d < x->rank; d++) off += coord[d] * xs[d];
        memcpy((uint8_t *)y->data + (size_t)i * es, (const uint8_t *)x->data + (size_t)off * es,
               es);
    }
    return KILN_OK;
}

// --- index_copy

size_t kiln_cpu_index_copy_scratch(const kiln_kernel_args *args) {
    (void)args;
    return 0;
}

// y = x with y.select(dim, index[i]) = src.select(dim, i). Every index is checked before
// anything is written, so a refused call leaves y (a state updated in place) as it was. When y
// is x's own storage (a state's in-place update) only the rows move.
kiln_status kiln_cpu_index_copy(const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *ix = args->in[1], *src = args->in[2];
    kiln_tensor *y = args->out;
    int64_t dim = kiln_attrs_int(&args->attrs, KILN_A_INDEX_COPY_DIM, 0);
    int wrap = kiln_attrs_int(&args->attrs, KILN_A_INDEX_COPY_WRAP, 0) != 0;
    KILN_CHECK(x->dtype == y->dtype && src->dtype == x->dtype && index_ok(ix->dtype) &&
                   ix->rank == 1 && src->rank == x->rank,
               KILN_ERR_INVALID_ARG,
               "cpu index_copy: needs x, src and the output of one dtype and a 1-D int32/int64 "
               "index");
    if (dim < 0) dim += x->rank;
    KILN_CHECK(dim >= 0 && (uint64_t)dim < x->rank, KILN_ERR_INVALID_ARG,
               "cpu index_copy: dim out of range");
    int64_t n = ix->dims[0], size = x->dims[dim], outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    KILN_CHECK(src->dims[dim] == n, KILN_ERR_INVALID_ARG,
               "cpu index_copy: src has %lld rows at dim %lld but the index has %lld",
               (long long)src->dims[dim], (long long)dim, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = kiln_load_i64(ix->data, ix->dtype, i);
        KILN_CHECK(v >= (wrap ? -size : 0) && v < size, KILN_ERR_INVALID_ARG,
                   "index_copy: index %lld at position %lld is out of range for dimension %lld "
                   "of size %lld (a position past the end of a cache: the cache holds %lld)",
                   (long long)v, (long long)i, (long long)dim, (long long)size, (long long)size);
    }
    size_t es = esize_of(x), row = (size_t)inner * es;
    if (y->data != x->data) memcpy(y->data, x->data, (size_t)(outer * size) * row);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t v = kiln_load_i64(ix->data, ix->dtype, i);
            if (v < 0) v += size;
            memcpy((uint8_t *)y->data + ((size_t)(o * size + v)) * row,
                   (const uint8_t *)src->data + ((size_t)(o * n + i)) * row, row);
        }
    }
    return KILN_OK;
}
