// SPDX-License-Identifier: Apache-2.0
// index (advanced indexing: k index tensors broadcast together at dims dim .. dim + k - 1),
// gather (torch.gather) and index_copy (torch.index_copy: rows of src scattered into a copy of
// x, or into x itself when the output is x's storage, a state's update), by the CPU reference's
// rules (src/cpu/op_index.c). An index out of range cannot fail a launched kernel: index and
// gather write its element as zeros, index_copy skips its row (it never writes outside the
// output); the CPU reference rejects it, inputs are expected to be in range. index_copy with
// duplicate indices writes one of their rows (which one is unspecified, as in PyTorch on CUDA).
#include "cuda/cuda_common.cuh"

#define INDEX_BLOCK 256

typedef struct index_params {
    int64_t numel; // output elements
    int64_t outer, nb, inner;
    int rb, k, wrap;
    int64_t bdims[KC_MAX_RANK];
    int64_t ist[KC_MAX_RANK][KC_MAX_RANK]; // index j's strides over the broadcast dims
    const void *idx[KC_MAX_RANK];
    uint32_t idx_dtype[KC_MAX_RANK];
    int64_t size[KC_MAX_RANK];    // x's sizes of the indexed dims
    int64_t xstride[KC_MAX_RANK]; // x's element strides of the indexed dims
    int64_t xblock;               // x's elements per outer step
} index_params;

typedef struct gather_params {
    int64_t numel;
    int rank, dim;
    int64_t idims[KC_MAX_RANK];
    int64_t xs[KC_MAX_RANK];
    int64_t size;
    const void *idx;
    uint32_t idx_dtype;
} gather_params;

// index_copy moves whole rows (x's elements after dim) in units of 1 to 16 bytes: the widest
// that divides the row and aligns every pointer.
typedef struct index_copy_params {
    int64_t units;     // src's units: outer * n rows of row_units
    int64_t row_units; // units per row
    int64_t n;         // index entries (src's rows per outer step)
    int64_t size;      // x's size at dim (the output's rows per outer step)
    const void *idx;
    uint32_t idx_dtype;
    int wrap;
} index_copy_params;

// --- kernels

template <typename T>
static __global__ void index_kernel(const __grid_constant__ index_params P, const T *x, T *y) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t in = i % P.inner, b = (i / P.inner) % P.nb, o = i / (P.inner * P.nb);
        int64_t rem = b, off = 0;
        int ok = 1;
        int64_t coord[KC_MAX_RANK];
        for (int d = P.rb - 1; d >= 0; d--) {
            coord[d] = rem % P.bdims[d];
            rem /= P.bdims[d];
        }
        for (int j = 0; j < P.k; j++) {
            int64_t io = 0;
            for (int d = 0; d < P.rb; d++) io += coord[d] * P.ist[j][d];
            int64_t v = kc_ld_i(P.idx[j], P.idx_dtype[j], io);
            if (v < 0 && P.wrap) v += P.size[j];
            if (v < 0 || v >= P.size[j]) ok = 0;
            off += v * P.xstride[j];
        }
        y[i] = ok ? x[o * P.xblock + off + in] : T(0);
    }
}

template <typename T>
static __global__ void gather_kernel(const __grid_constant__ gather_params P, const T *x, T *y) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i, off = 0;
        int64_t v = kc_ld_i(P.idx, P.idx_dtype, i);
        for (int d = P.rank - 1; d >= 0; d--) {
            int64_t c = rem % P.idims[d];
            rem /= P.idims[d];
            off += (d == P.dim ? v : c) * P.xs[d];
        }
        y[i] = (v >= 0 && v < P.size) ? x[off] : T(0);
    }
}

// One thread per unit of src, consecutive threads along a row (coalesced on both sides); a row
// whose index is out of range is skipped.
template <typename U>
static __global__ void index_copy_kernel(const __grid_constant__ index_copy_params P, const U *src,
                                         U *y) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.units;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / P.row_units, k = i - r * P.row_units;
        int64_t o = r / P.n, j = r - o * P.n;
        int64_t v = kc_ld_i(P.idx, P.idx_dtype, j);
        if (v < 0 && P.wrap) v += P.size;
        if (v < 0 || v >= P.size) continue;
        y[(o * P.size + v) * P.row_units + k] = src[i];
    }
}

// --- launchers

// Element types by size: indexing moves bytes.
template <typename P, typename K>
static kiln_status by_size(const kiln_cuda_ctx *ctx, size_t es, const P &params, const void *x,
                           void *y, K launch, const char *what) {
    switch (es) {
    case 1: launch(params, (const uint8_t *)x, (uint8_t *)y); break;
    case 2: launch(params, (const uint16_t *)x, (uint16_t *)y); break;
    case 4: launch(params, (const uint32_t *)x, (uint32_t *)y); break;
    case 8: launch(params, (const uint64_t *)x, (uint64_t *)y); break;
    default:
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda %s: element size %zu at %s", what, es,
                              ctx->where ? ctx->where : "?");
    }
    return kiln_cuda_check_launch(ctx, what);
}

struct index_launch {
    cudaStream_t s;
    unsigned blocks;
    template <typename T> void operator()(const index_params &P, const T *x, T *y) const {
        index_kernel<T><<<blocks, INDEX_BLOCK, 0, s>>>(P, x, y);
    }
};

struct gather_launch {
    cudaStream_t s;
    unsigned blocks;
    template <typename T> void operator()(const gather_params &P, const T *x, T *y) const {
        gather_kernel<T><<<blocks, INDEX_BLOCK, 0, s>>>(P, x, y);
    }
};

struct index_copy_launch {
    cudaStream_t s;
    unsigned blocks;
    template <typename U> void operator()(const index_copy_params &P, const U *src, U *y) const {
        index_copy_kernel<U><<<blocks, INDEX_BLOCK, 0, s>>>(P, src, y);
    }
};

static int is_index_dtype(uint32_t dt) { return dt == KILN_DTYPE_I32 || dt == KILN_DTYPE_I64; }

static kiln_status index_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int64_t dim = kiln_attrs_int(&args->attrs, KILN_A_INDEX_DIM, 0);
    int k = (int)args->n_in - 1;
    if (k < 1 || dim < 0 || dim + k > (int64_t)x->rank || x->dtype != y->dtype) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda index: bad operands at %s",
                              ctx->where ? ctx->where : "?");
    }
    index_params P;
    memset(&P, 0, sizeof P);
    int64_t xs[KC_MAX_RANK];
    kc_strides(x, xs);
    P.k = k;
    P.wrap = kiln_attrs_int(&args->attrs, KILN_A_INDEX_WRAP, 0) != 0;
    P.rb = (int)y->rank - ((int)x->rank - k);
    P.nb = 1;
    P.outer = 1;
    P.inner = 1;
    for (int d = 0; d < P.rb; d++) {
        P.bdims[d] = y->dims[dim + d];
        P.nb *= P.bdims[d];
    }
    for (int64_t d = 0; d < dim; d++) P.outer *= x->dims[d];
    for (uint32_t d = (uint32_t)(dim + k); d < x->rank; d++) P.inner *= x->dims[d];
    P.xblock = dim > 0 ? xs[dim - 1] : kc_numel(x);
    for (int j = 0; j < k; j++) {
        const kiln_tensor *t = args->in[1 + j];
        if (t == NULL || !is_index_dtype(t->dtype) || (int)t->rank > P.rb) {
            return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                                  "cuda index: index %d is not an "
                                  "int32/int64 tensor broadcasting to the index shape at %s",
                                  j, ctx->where ? ctx->where : "?");
        }
        int64_t st[KC_MAX_RANK];
        kc_bcast_strides(t, (uint32_t)P.rb, st);
        for (int d = 0; d < P.rb; d++) P.ist[j][d] = st[d];
        P.idx[j] = t->data;
        P.idx_dtype[j] = t->dtype;
        P.size[j] = x->dims[dim + j];
        P.xstride[j] = xs[dim + j];
    }
    P.numel = kc_numel(y);
    if (P.numel == 0) return KILN_OK;
    index_launch L = {ctx->stream, kc_blocks(P.numel, INDEX_BLOCK)};
    return by_size(ctx, kiln_cuda_dtype_size(y->dtype), P, x->data, y->data, L, "index_kernel");
}

static kiln_status gather_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *ix = args->n_in > 1 ? args->in[1] : NULL;
    const kiln_tensor *y = args->out;
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_GATHER_DIM, 0), x->rank);
    if (ix == NULL || dim < 0 || ix->rank != x->rank || !is_index_dtype(ix->dtype) ||
        x->dtype != y->dtype) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda gather: bad operands at %s",
                              ctx->where ? ctx->where : "?");
    }
    gather_params P;
    memset(&P, 0, sizeof P);
    P.rank = (int)x->rank;
    P.dim = dim;
    for (uint32_t d = 0; d < ix->rank; d++) P.idims[d] = ix->dims[d];
    kc_strides(x, P.xs);
    P.size = x->dims[dim];
    P.idx = ix->data;
    P.idx_dtype = ix->dtype;
    P.numel = kc_numel(ix);
    if (P.numel == 0) return KILN_OK;
    gather_launch L = {ctx->stream, kc_blocks(P.numel, INDEX_BLOCK)};
    return by_size(ctx, kiln_cuda_dtype_size(y->dtype), P, x->data, y->data, L, "gather_kernel");
}

// The widest unit (16, 8, 4, 2 or 1 bytes) dividing row_bytes and aligning every pointer.
static size_t copy_unit(size_t row_bytes, const void *a, const void *b) {
    const uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)row_bytes;
    size_t u = 16;
    while (u > 1 && (bits & (u - 1)) != 0) u /= 2;
    return u;
}

static kiln_status index_copy_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *ix = args->n_in > 1 ? args->in[1] : NULL;
    const kiln_tensor *src = args->n_in > 2 ? args->in[2] : NULL, *y = args->out;
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_INDEX_COPY_DIM, 0), x->rank);
    int ok = ix != NULL && src != NULL && dim >= 0 && ix->rank == 1 && is_index_dtype(ix->dtype) &&
             src->rank == x->rank && y->rank == x->rank && src->dtype == x->dtype &&
             y->dtype == x->dtype && kiln_cuda_dtype_size(x->dtype) != 0;
    for (uint32_t d = 0; ok && d < x->rank; d++) {
        ok = y->dims[d] == x->dims[d] && src->dims[d] == ((int)d == dim ? ix->dims[0] : x->dims[d]);
    }
    if (!ok) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda index_copy: needs x, src and output of one dtype, src of x's "
                              "shape with the index's length at dim, and a 1-D int32/int64 index "
                              "at %s",
                              ctx->where ? ctx->where : "?");
    }
    const size_t es = kiln_cuda_dtype_size(x->dtype);
    // Out of place: y = x first, on the stream (a state updated in place skips it).
    const int64_t x_numel = kc_numel(x);
    if (y->data != x->data && x_numel > 0) {
        cudaError_t err = cudaMemcpyAsync(y->data, x->data, (size_t)x_numel * es,
                                          cudaMemcpyDeviceToDevice, ctx->stream);
        if (err != cudaSuccess) return kiln_cuda_error(ctx, "cudaMemcpyAsync (index_copy)", err);
    }
    index_copy_params P;
    memset(&P, 0, sizeof P);
    int64_t inner = 1;
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    P.n = ix->dims[0];
    P.size = x->dims[dim];
    P.idx = ix->data;
    P.idx_dtype = ix->dtype;
    P.wrap = kiln_attrs_int(&args->attrs, KILN_A_INDEX_COPY_WRAP, 0) != 0;
    const int64_t src_numel = kc_numel(src);
    if (src_numel == 0 || inner == 0 || x_numel == 0) return KILN_OK;
    const size_t row_bytes = (size_t)inner * es;
    const size_t u = copy_unit(row_bytes, y->data, src->data);
    P.row_units = (int64_t)(row_bytes / u);
    P.units = src_numel / inner * P.row_units;
    index_copy_launch L = {ctx->stream, kc_blocks(P.units, INDEX_BLOCK)};
    switch (u) {
    case 16: L(P, (const uint4 *)src->data, (uint4 *)y->data); break;
    case 8: L(P, (const uint2 *)src->data, (uint2 *)y->data); break;
    case 4: L(P, (const uint32_t *)src->data, (uint32_t *)y->data); break;
    case 2: L(P, (const uint16_t *)src->data, (uint16_t *)y->data); break;
    default: L(P, (const uint8_t *)src->data, (uint8_t *)y->data); break;
    }
    return kiln_cuda_check_launch(ctx, "index_copy_kernel");
}

// --- gather_matmul (ops.h): y[b] = w[idx[b]] @ x[b], the chosen matrix read in place. A warp
// per (batch, row of W): float32 sums, 8 elements a 16-byte load where the rows allow it (16-bit
// operands, K % 8 == 0, aligned, N == 1: a mixture of experts' token vectors); an index out of
// range writes zeros (the CPU reference rejects it).

#define GMM_WARPS 8 // warps per block
#define GMM_ROWS 4  // rows of W per warp

typedef struct gmm_params {
    const void *w, *idx, *x;
    void *y;
    int64_t e, m, k, b, n;
    uint32_t dt, idx_dt;
    int vec;
} gmm_params;

static __device__ __noinline__ float gmm_dot8(uint4 a, uint4 b, uint32_t dt) {
    const uint16_t *p = (const uint16_t *)&a, *q = (const uint16_t *)&b;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        s += dt == KILN_DTYPE_F16
                 ? __half2float(__ushort_as_half(p[i])) * __half2float(__ushort_as_half(q[i]))
                 : __bfloat162float(__ushort_as_bfloat16(p[i])) *
                       __bfloat162float(__ushort_as_bfloat16(q[i]));
    }
    return s;
}

static __global__ void __launch_bounds__(GMM_WARPS * 32) gather_mm_kernel(const gmm_params P) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int64_t m0 = ((int64_t)blockIdx.x * GMM_WARPS + warp) * GMM_ROWS;
    for (int64_t b = blockIdx.y; b < P.b; b += gridDim.y) {
        int64_t e = kc_ld_i(P.idx, P.idx_dt, b);
        if (e < 0) e += P.e; // torch's indexing: negative from the end
        const bool ok = e >= 0 && e < P.e;
        for (int r = 0; r < GMM_ROWS; r++) {
            const int64_t m = m0 + r;
            if (m >= P.m) break;
            const int64_t wrow = (e * P.m + m) * P.k, xb = b * P.k * P.n;
            for (int64_t n = 0; n < P.n; n++) {
                float acc = 0.0f;
                if (ok && P.vec) {
                    const uint4 *wv = (const uint4 *)((const uint16_t *)P.w + wrow);
                    const uint4 *xv = (const uint4 *)((const uint16_t *)P.x + xb);
                    for (int64_t j = lane; j < P.k / 8; j += 32)
                        acc += gmm_dot8(__ldg(wv + j), __ldg(xv + j), P.dt);
                } else if (ok) {
                    for (int64_t j = lane; j < P.k; j += 32)
                        acc += kc_ld_f(P.w, P.dt, wrow + j) * kc_ld_f(P.x, P.dt, xb + j * P.n + n);
                }
                acc = kc_warp_sum(acc);
                if (lane == 0) kc_st_f(P.y, P.dt, (b * P.m + m) * P.n + n, acc);
            }
        }
    }
}

static kiln_status gather_matmul_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *w = args->in[0], *ix = args->in[1], *x = args->in[2], *y = args->out;
    if (w->rank != 3 || ix->rank != 1 || x->rank != 3 || y->rank != 3 ||
        !is_index_dtype(ix->dtype) || x->dtype != w->dtype || y->dtype != w->dtype ||
        ix->dims[0] != x->dims[0] || x->dims[1] != w->dims[2] || y->dims[0] != x->dims[0] ||
        y->dims[1] != w->dims[1] || y->dims[2] != x->dims[2]) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda gather_matmul: bad operands at %s",
                              ctx->where ? ctx->where : "?");
    }
    gmm_params P;
    memset(&P, 0, sizeof P);
    P.w = w->data, P.idx = ix->data, P.x = x->data, P.y = y->data;
    P.e = w->dims[0], P.m = w->dims[1], P.k = w->dims[2], P.b = x->dims[0], P.n = x->dims[2];
    P.dt = w->dtype, P.idx_dt = ix->dtype;
    P.vec = (P.dt == KILN_DTYPE_F16 || P.dt == KILN_DTYPE_BF16) && P.n == 1 && P.k % 8 == 0 &&
            kiln_cuda_align_of(w->data) >= 16 && kiln_cuda_align_of(x->data) >= 16;
    if (P.b * P.m * P.n == 0) return KILN_OK;
    const int64_t per_block = (int64_t)GMM_WARPS * GMM_ROWS;
    const dim3 grid((unsigned)((P.m + per_block - 1) / per_block),
                    (unsigned)(P.b < 65535 ? P.b : 65535));
    gather_mm_kernel<<<grid, GMM_WARPS * 32, 0, ctx->stream>>>(P);
    return kiln_cuda_check_launch(ctx, "gather_mm_kernel");
}

// --- entry points

extern "C" kiln_status kiln_cuda_index(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    return index_run(ctx, args);
}

extern "C" kiln_status kiln_cuda_gather(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    return gather_run(ctx, args);
}

extern "C" kiln_status kiln_cuda_gather_matmul(const kiln_cuda_ctx *ctx,
                                               const kiln_kernel_args *args) {
    return gather_matmul_run(ctx, args);
}

extern "C" kiln_status kiln_cuda_index_copy(const kiln_cuda_ctx *ctx,
                                            const kiln_kernel_args *args) {
    return index_copy_run(ctx, args);
}
