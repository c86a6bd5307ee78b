// SPDX-License-Identifier: Apache-2.0
// Normalizations: batch_norm (inference: per-channel statistics, channel = dim 1), layer_norm
// (over the last normalized_ndim dims, biased variance), rms_norm (over the last dim: y = x /
// sqrt(mean(x^2) + eps) * w), softmax and log_softmax over one dim.
// float32/float16/bfloat16 storage, float32 compute. Rows of up to ROW_WARP_MAX elements take one
// warp each, longer rows one block; softmax over a non-innermost dim takes one thread per
// (outer, inner) column. Formulas as src/cpu: y = (x - mean) / sqrt(var + eps) * w + b;
// softmax = exp(x - max) / sum; log_softmax = x - max - log(sum).
#include <math.h>

#include "cuda/cuda_common.cuh"

#define NORM_BLOCK 256
#define ROW_WARP_MAX 1024
#define ROWS_PER_BLOCK 4 // warp-per-row kernels: 4 warps of 32

// --- kernels

template <typename T>
static __global__ void batch_norm_kernel(const T *x, T *y, int64_t n, int64_t channels,
                                         int64_t inner, const void *w, uint32_t w_dt, const void *b,
                                         uint32_t b_dt, const void *mean, uint32_t mean_dt,
                                         const void *var, uint32_t var_dt, float eps) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = (i / inner) % channels;
        float v =
            (kc_to_f(x[i]) - kc_ld_f(mean, mean_dt, c)) / sqrtf(kc_ld_f(var, var_dt, c) + eps);
        if (w != NULL) v *= kc_ld_f(w, w_dt, c);
        if (b != NULL) v += kc_ld_f(b, b_dt, c);
        y[i] = kc_from_f<T>(v);
    }
}

// One row of layer norm by a group of `lanes` threads (a warp, or the block with `shared`).
template <typename T, bool WARP>
__device__ __forceinline__ void layer_norm_row(const T *x, T *y, int64_t d, int lane, int lanes,
                                               const void *w, uint32_t w_dt, const void *b,
                                               uint32_t b_dt, float eps, float *shared) {
    float s = 0.0f;
    for (int64_t j = lane; j < d; j += lanes) s += kc_to_f(x[j]);
    s = WARP ? kc_warp_sum(s) : kc_block_sum(s, shared);
    float mean = s / (float)d;
    float q = 0.0f;
    for (int64_t j = lane; j < d; j += lanes) {
        float t = kc_to_f(x[j]) - mean;
        q += t * t;
    }
    q = WARP ? kc_warp_sum(q) : kc_block_sum(q, shared);
    float inv = 1.0f / sqrtf(q / (float)d + eps);
    for (int64_t j = lane; j < d; j += lanes) {
        float v = (kc_to_f(x[j]) - mean) * inv;
        if (w != NULL) v *= kc_ld_f(w, w_dt, j);
        if (b != NULL) v += kc_ld_f(b, b_dt, j);
        y[j] = kc_from_f<T>(v);
    }
}

template <typename T>
static __global__ void layer_norm_warp_kernel(const T *x, T *y, int64_t rows, int64_t d,
                                              const void *w, uint32_t w_dt, const void *b,
                                              uint32_t b_dt, float eps) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return; // whole warps leave together: the shuffles stay converged
    layer_norm_row<T, true>(x + row * d, y + row * d, d, lane, 32, w, w_dt, b, b_dt, eps, NULL);
}

template <typename T>
static __global__ void layer_norm_block_kernel(const T *x, T *y, int64_t d, const void *w,
                                               uint32_t w_dt, const void *b, uint32_t b_dt,
                                               float eps) {
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    layer_norm_row<T, false>(x + row * d, y + row * d, d, threadIdx.x, blockDim.x, w, w_dt, b, b_dt,
                             eps, shared);
}

// Layer norm, fast path: one warp per row held in registers, 16-byte loads and stores. Each lane
// keeps up to NV vectors of 16 / sizeof(T) elements (vector j of the row at lane j % 32); the row
// is read once, mean and variance come from the registers (two passes, no cancellation), weight
// and bias (dtype T, or absent) are read as vectors too. Needs d a multiple of the vector width,
// 16-byte aligned x, y, w, b, and d <= 32 * NV * vector width.
template <typename T> struct ln_vec { static constexpr int N = 16 / (int)sizeof(T); };

template <typename T> __device__ __forceinline__ void ln_unpack(const uint4 &u, float *f) {
    const T *h = (const T *)&u;
#pragma unroll
    for (int i = 0; i < ln_vec<T>::N; i++) f[i] = kc_to_f(h[i]);
}

template <typename T> __device__ __forceinline__ uint4 ln_pack(const float *f) {
    uint4 u;
    T *h = (T *)&u;
#pragma unroll
    for (int i = 0; i < ln_vec<T>::N; i++) h[i] = kc_from_f<T>(f[i]);
    return u;
}

template <typename T, int NV>
static __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    layer_norm_vec_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t rows, int nvec,
                          float inv_d, const T *__restrict__ w, const T *__restrict__ b,
                          float eps) {
    constexpr int N = ln_vec<T>::N;
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const uint4 *xr = (const uint4 *)(x + row * (int64_t)nvec * N);
    float v[NV][N];
    float s = 0.0f;
    // Rows of up to 4 vectors per lane (1024 float16): weight and bias are loaded with x, not after
    // the two reductions, so their latency overlaps x's instead of adding an L2 round trip at the
    // end of the critical path (longer rows load them late: the registers would spill, as
    // bfloat16's unpacking does at 4 vectors per lane).
    constexpr bool PRE = NV <= (std::is_same<T, __nv_bfloat16>::value ? 2 : 4);
    uint4 wu[PRE ? NV : 1], bu[PRE ? NV : 1];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = lane + 32 * i;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if constexpr (PRE) wu[i] = bu[i] = u;
        if (j < nvec) {
            u = __ldg(xr + j);
            if constexpr (PRE) {
                if (w != NULL) wu[i] = __ldg((const uint4 *)w + j);
                if (b != NULL) bu[i] = __ldg((const uint4 *)b + j);
            }
        }
        ln_unpack<T>(u, v[i]);
#pragma unroll
        for (int k = 0; k < N; k++) s += v[i][k];
    }
    const float mean = kc_warp_sum(s) * inv_d;
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if (lane + 32 * i < nvec) {
#pragma unroll
            for (int k = 0; k < N; k++) {
                const float t = v[i][k] - mean;
                q += t * t;
            }
        }
    }
    const float inv = rsqrtf(kc_warp_sum(q) * inv_d + eps);
    uint4 *yr = (uint4 *)(y + row * (int64_t)nvec * N);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = lane + 32 * i;
        if (j >= nvec) continue;
        float wf[N], bf[N], o[N];
        if (w != NULL) {
            ln_unpack<T>(PRE ? wu[PRE ? i : 0] : __ldg((const uint4 *)w + j), wf);
        } else {
#pragma unroll
            for (int k = 0; k < N; k++) wf[k] = 1.0f;
        }
        if (b != NULL) {
            ln_unpack<T>(PRE ? bu[PRE ? i : 0] : __ldg((const uint4 *)b + j), bf);
        } else {
#pragma unroll
            for (int k = 0; k < N; k++) bf[k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < N; k++) o[k] = (v[i][k] - mean) * inv * wf[k] + bf[k];
        yr[j] = ln_pack<T>(o);
    }
}

// Few long rows (layer_norm or rms_norm): a block per row, tpr threads (64-1024) each holding up
// to two 16-byte vectors of it in registers (vector j at thread j % tpr); the warps' sums meet in
// shared memory. With a warp per row, 128 rows of 2560 float16 keep 128 warps on 132 SMs with ten
// loads in flight each: 10.5 us on the H100 where the bytes take about 1 us. Same needs as
// layer_norm_vec_kernel (d a multiple of the vector width, 16-byte aligned rows and params);
// layer norm's mean and variance in two passes over the registers, as there.
template <typename T, bool RMS>
static __global__ void __launch_bounds__(1024)
    norm_rows_kernel(const T *__restrict__ x, T *__restrict__ y, int nvec, float inv_d,
                     const T *__restrict__ w, const T *__restrict__ b, float eps) {
    constexpr int N = ln_vec<T>::N, NV = 2;
    __shared__ float red[32];
    const int tid = threadIdx.x, nt = blockDim.x;
    const uint4 *xr = (const uint4 *)(x + (int64_t)blockIdx.x * nvec * N);
    uint4 *yr = (uint4 *)(y + (int64_t)blockIdx.x * nvec * N);
    float v[NV][N];
    uint4 wu[NV], bu[NV];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = tid + nt * i;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        wu[i] = bu[i] = u;
        if (j < nvec) {
            u = __ldg(xr + j);
            if (w != NULL) wu[i] = __ldg((const uint4 *)w + j);
            if (!RMS && b != NULL) bu[i] = __ldg((const uint4 *)b + j);
        }
        ln_unpack<T>(u, v[i]);
#pragma unroll
        for (int k = 0; k < N; k++) s += RMS ? v[i][k] * v[i][k] : v[i][k];
    }
    float mean = 0.0f, inv;
    if (RMS) {
        inv = rsqrtf(kc_block_sum(s, red) * inv_d + eps);
    } else {
        mean = kc_block_sum(s, red) * inv_d;
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (tid + nt * i < nvec) {
#pragma unroll
                for (int k = 0; k < N; k++) {
                    const float t = v[i][k] - mean;
                    q += t * t;
                }
            }
        }
        inv = rsqrtf(kc_block_sum(q, red) * inv_d + eps);
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = tid + nt * i;
        if (j >= nvec) continue;
        float wf[N], bf[N], o[N];
        ln_unpack<T>(wu[i], wf);
        ln_unpack<T>(bu[i], bf);
#pragma unroll
        for (int k = 0; k < N; k++) {
            o[k] = (v[i][k] - mean) * inv * (w != NULL ? wf[k] : 1.0f) + (RMS ? 0.0f : bf[k]);
        }
        yr[j] = ln_pack<T>(o);
    }
}

// Threads per row for norm_rows_kernel, or 0 for the warp-per-row kernels: under 4096 rows
// (fewer warps than the device holds) of more than 64 vectors (two a lane), the fewest threads
// that hold the row at two vectors each.
static int norm_rows_threads(int64_t rows, int nvec) {
    if (nvec <= 64 || rows >= 4096) return 0;
    int t = 64;
    while (t < 1024 && 2 * t < nvec) t *= 2;
    return 2 * t >= nvec ? t : 0;
}

template <typename T, bool WARP>
__device__ __forceinline__ void softmax_row(const T *x, T *y, int64_t d, int lane, int lanes,
                                            bool log_out, float *shared) {
    float m = -INFINITY;
    for (int64_t j = lane; j < d; j += lanes) m = fmaxf(m, kc_to_f(x[j]));
    m = WARP ? kc_warp_max(m) : kc_block_max(m, shared);
    float s = 0.0f;
    for (int64_t j = lane; j < d; j += lanes) s += expf(kc_to_f(x[j]) - m);
    s = WARP ? kc_warp_sum(s) : kc_block_sum(s, shared);
    if (log_out) {
        float ls = logf(s);
        for (int64_t j = lane; j < d; j += lanes) y[j] = kc_from_f<T>(kc_to_f(x[j]) - m - ls);
    } else {
        for (int64_t j = lane; j < d; j += lanes) y[j] = kc_from_f<T>(expf(kc_to_f(x[j]) - m) / s);
    }
}

template <typename T>
static __global__ void softmax_warp_kernel(const T *x, T *y, int64_t rows, int64_t d,
                                           bool log_out) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    softmax_row<T, true>(x + row * d, y + row * d, d, threadIdx.x & 31, 32, log_out, NULL);
}

template <typename T>
static __global__ void softmax_block_kernel(const T *x, T *y, int64_t d, bool log_out) {
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    softmax_row<T, false>(x + row * d, y + row * d, d, threadIdx.x, blockDim.x, log_out, shared);
}

// Softmax over a dim with inner > 1: one thread per (outer, inner) column, stride `inner`.
template <typename T>
static __global__ void softmax_col_kernel(const T *x, T *y, int64_t outer, int64_t d, int64_t inner,
                                          bool log_out) {
    int64_t cols = outer * inner;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = c / inner, in = c % inner;
        const T *xp = x + o * d * inner + in;
        T *yp = y + o * d * inner + in;
        float m = -INFINITY;
        for (int64_t j = 0; j < d; j++) m = fmaxf(m, kc_to_f(xp[j * inner]));
        float s = 0.0f;
        for (int64_t j = 0; j < d; j++) s += expf(kc_to_f(xp[j * inner]) - m);
        if (log_out) {
            float ls = logf(s);
            for (int64_t j = 0; j < d; j++)
                yp[j * inner] = kc_from_f<T>(kc_to_f(xp[j * inner]) - m - ls);
        } else {
            for (int64_t j = 0; j < d; j++) {
                yp[j * inner] = kc_from_f<T>(expf(kc_to_f(xp[j * inner]) - m) / s);
            }
        }
    }
}

// --- launchers

static kiln_status norm_bad_dtype(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda %s: dtype %s (input %s) at %s",
                          kiln_cuda_op_name(args->op), kiln_cuda_dtype_name(args->out->dtype),
                          args->in[0] ? kiln_cuda_dtype_name(args->in[0]->dtype) : "missing",
                          ctx->where ? ctx->where : "?");
}

static const kiln_tensor *opt_in(const kiln_kernel_args *args, uint32_t i) {
    return i < args->n_in ? args->in[i] : NULL;
}

template <typename T>
static kiln_status batch_norm_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1), *b = opt_in(args, 2);
    const kiln_tensor *mean = opt_in(args, 3), *var = opt_in(args, 4);
    const kiln_tensor *y = args->out;
    int64_t n = kc_numel(y);
    if (mean == NULL || var == NULL || x->rank < 2) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG,
                              "cuda batch_norm: needs rank >= 2 and mean and var at %s",
                              ctx->where ? ctx->where : "?");
    }
    if (n == 0) return KILN_OK;
    int64_t channels = x->dims[1], inner = 1;
    for (uint32_t d = 2; d < x->rank; d++) inner *= x->dims[d];
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_BN_EPS, 0);
    batch_norm_kernel<T><<<kc_blocks(n, NORM_BLOCK), NORM_BLOCK, 0, ctx->stream>>>(
        (const T *)x->data, (T *)y->data, n, channels, inner, w ? w->data : NULL, w ? w->dtype : 0,
        b ? b->data : NULL, b ? b->dtype : 0, mean->data, mean->dtype, var->data, var->dtype, eps);
    return kiln_cuda_check_launch(ctx, "batch_norm_kernel");
}

// --- rms_norm: y = x * rsqrt(mean(x^2) + eps) * w over rows of d, float32 sums.

// One row by a group of `lanes` threads (a warp, or the block with `shared`); w of any float
// dtype or absent.
template <typename T, bool WARP>
__device__ __forceinline__ void rms_norm_row(const T *x, T *y, int64_t d, int lane, int lanes,
                                             const void *w, uint32_t w_dt, float eps,
                                             float *shared) {
    float q = 0.0f;
    for (int64_t j = lane; j < d; j += lanes) {
        const float v = kc_to_f(x[j]);
        q += v * v;
    }
    q = WARP ? kc_warp_sum(q) : kc_block_sum(q, shared);
    const float inv = rsqrtf(q / (float)d + eps);
    for (int64_t j = lane; j < d; j += lanes) {
        float v = kc_to_f(x[j]) * inv;
        if (w != NULL) v *= kc_ld_f(w, w_dt, j);
        y[j] = kc_from_f<T>(v);
    }
}

template <typename T>
static __global__ void rms_norm_warp_kernel(const T *x, T *y, int64_t rows, int64_t d,
                                            const void *w, uint32_t w_dt, float eps) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return; // whole warps leave together: the shuffles stay converged
    rms_norm_row<T, true>(x + row * d, y + row * d, d, lane, 32, w, w_dt, eps, NULL);
}

template <typename T>
static __global__ void rms_norm_block_kernel(const T *x, T *y, int64_t d, const void *w,
                                             uint32_t w_dt, float eps) {
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    rms_norm_row<T, false>(x + row * d, y + row * d, d, threadIdx.x, blockDim.x, w, w_dt, eps,
                           shared);
}

// Fast path as layer_norm_vec_kernel: one warp per row held in registers, 16-byte loads and
// stores, the weight (dtype T, or absent) loaded with x. Needs d a multiple of the vector width,
// 16-byte aligned x, y, w, and d <= 32 * NV * vector width.
template <typename T, int NV>
static __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    rms_norm_vec_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t rows, int nvec,
                        float inv_d, const T *__restrict__ w, float eps) {
    constexpr int N = ln_vec<T>::N;
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const uint4 *xr = (const uint4 *)(x + row * (int64_t)nvec * N);
    uint4 *yr = (uint4 *)(y + row * (int64_t)nvec * N);
    float v[NV][N];
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = lane + 32 * i;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (j < nvec) u = __ldg(xr + j);
        ln_unpack<T>(u, v[i]);
#pragma unroll
        for (int k = 0; k < N; k++) q += v[i][k] * v[i][k];
    }
    const float inv = rsqrtf(kc_warp_sum(q) * inv_d + eps);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = lane + 32 * i;
        if (j < nvec) {
            float o[N], wf[N];
            if (w != NULL) {
                ln_unpack<T>(__ldg((const uint4 *)w + j), wf);
            } else {
#pragma unroll
                for (int k = 0; k < N; k++) wf[k] = 1.0f;
            }
#pragma unroll
            for (int k = 0; k < N; k++) o[k] = v[i][k] * inv * wf[k];
            yr[j] = ln_pack<T>(o);
        }
    }
}

// The vectorized kernel when it applies (see layer_norm_vec_kernel); 0: use the general one.
template <typename T>
static int layer_norm_vec_launch(const kiln_cuda_ctx *ctx, const kiln_tensor *x,
                                 const kiln_tensor *y, int64_t rows, int64_t d,
                                 const kiln_tensor *w, const kiln_tensor *b, float eps) {
    constexpr int N = ln_vec<T>::N;
    if (d % N != 0 || d / N > 2048 || rows > (int64_t)ROWS_PER_BLOCK * 0x7fffffff) return 0;
    if ((w != NULL && (w->dtype != x->dtype || kc_numel(w) != d)) ||
        (b != NULL && (b->dtype != x->dtype || kc_numel(b) != d)))
        return 0;
    const void *ptrs[4] = {x->data, y->data, w ? w->data : NULL, b ? b->data : NULL};
    for (int i = 0; i < 4; i++) {
        if (((uintptr_t)ptrs[i] % 16) != 0) return 0;
    }
    const int nvec = (int)(d / N), per_lane = (nvec + 31) / 32;
    const unsigned blocks = (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    const T *wp = w ? (const T *)w->data : NULL, *bp = b ? (const T *)b->data : NULL;
    const float inv_d = 1.0f / (float)d;
    if (const int tpr = norm_rows_threads(rows, nvec)) {
        norm_rows_kernel<T, false><<<(unsigned)rows, tpr, 0, ctx->stream>>>(
            (const T *)x->data, (T *)y->data, nvec, inv_d, wp, bp, eps);
        return 1;
    }
    if (nvec > 32 * 16) return 0; // longer rows: the general kernels
#define LN_VEC(NV)                                                                                 \
    layer_norm_vec_kernel<T, NV><<<blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(                 \
        (const T *)x->data, (T *)y->data, rows, nvec, inv_d, wp, bp, eps)
    if (per_lane <= 1) {
        LN_VEC(1);
    } else if (per_lane <= 2) {
        LN_VEC(2);
    } else if (per_lane <= 4) {
        LN_VEC(4);
    } else if (per_lane <= 8) {
        LN_VEC(8);
    } else {
        LN_VEC(16);
    }
#undef LN_VEC
    return 1;
}

template <typename T>
static kiln_status layer_norm_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1), *b = opt_in(args, 2);
    const kiln_tensor *y = args->out;
    int64_t nd = kiln_attrs_int(&args->attrs, KILN_A_LN_NDIM, 0);
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_LN_EPS, 0);
    if (nd < 0 || nd > (int64_t)x->rank) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG,
                              "cuda layer_norm: normalized_ndim %lld for rank %u at %s",
                              (long long)nd, x->rank, ctx->where ? ctx->where : "?");
    }
    int64_t d = 1, n = kc_numel(x);
    for (uint32_t i = x->rank - (uint32_t)nd; i < x->rank; i++) d *= x->dims[i];
    if (n == 0 || d == 0) return KILN_OK;
    int64_t rows = n / d;
    const void *wp = w ? w->data : NULL, *bp = b ? b->data : NULL;
    uint32_t wdt = w ? w->dtype : 0, bdt = b ? b->dtype : 0;
    if (layer_norm_vec_launch<T>(ctx, x, y, rows, d, w, b, eps)) {
        return kiln_cuda_check_launch(ctx, "layer_norm_vec_kernel");
    }
    if (d <= ROW_WARP_MAX) {
        unsigned blocks = (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
        layer_norm_warp_kernel<T><<<blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            (const T *)x->data, (T *)y->data, rows, d, wp, wdt, bp, bdt, eps);
        return kiln_cuda_check_launch(ctx, "layer_norm_warp_kernel");
    }
    layer_norm_block_kernel<T><<<(unsigned)rows, NORM_BLOCK, 0, ctx->stream>>>(
        (const T *)x->data, (T *)y->data, d, wp, wdt, bp, bdt, eps);
    return kiln_cuda_check_launch(ctx, "layer_norm_block_kernel");
}

// The vectorized rms_norm kernel when it applies; 0: use the general one.
template <typename T>
static int rms_norm_vec_launch(const kiln_cuda_ctx *ctx, const kiln_tensor *x, const kiln_tensor *y,
                               int64_t rows, int64_t d, const kiln_tensor *w, float eps) {
    constexpr int N = ln_vec<T>::N;
    if (d % N != 0 || d / N > 2048 || rows > (int64_t)ROWS_PER_BLOCK * 0x7fffffff) return 0;
    if (w != NULL && (w->dtype != x->dtype || kc_numel(w) != d)) return 0;
    const void *ptrs[3] = {x->data, y->data, w ? w->data : NULL};
    for (int i = 0; i < 3; i++) {
        if (((uintptr_t)ptrs[i] % 16) != 0) return 0;
    }
    const int nvec = (int)(d / N), per_lane = (nvec + 31) / 32;
    const unsigned blocks = (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    const T *wp = w ? (const T *)w->data : NULL;
    const float inv_d = 1.0f / (float)d;
    if (const int tpr = norm_rows_threads(rows, nvec)) {
        norm_rows_kernel<T, true><<<(unsigned)rows, tpr, 0, ctx->stream>>>(
            (const T *)x->data, (T *)y->data, nvec, inv_d, wp, NULL, eps);
        return 1;
    }
    if (nvec > 32 * 16) return 0; // longer rows: the general kernels
#define RMS_VEC(NV)                                                                                \
    rms_norm_vec_kernel<T, NV><<<blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(                   \
        (const T *)x->data, (T *)y->data, rows, nvec, inv_d, wp, eps)
    if (per_lane <= 1) {
        RMS_VEC(1);
    } else if (per_lane <= 2) {
        RMS_VEC(2);
    } else if (per_lane <= 4) {
        RMS_VEC(4);
    } else if (per_lane <= 8) {
        RMS_VEC(8);
    } else {
        RMS_VEC(16);
    }
#undef RMS_VEC
    return 1;
}

template <typename T>
static kiln_status rms_norm_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = opt_in(args, 1);
    const kiln_tensor *y = args->out;
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_RMS_EPS, 0);
    if (x->rank < 1 || (w != NULL && kc_numel(w) != x->dims[x->rank - 1])) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG,
                              "cuda rms_norm: needs x of rank >= 1 and a weight of its last "
                              "dimension at %s",
                              ctx->where ? ctx->where : "?");
    }
    int64_t d = x->dims[x->rank - 1], n = kc_numel(x);
    if (n == 0 || d == 0) return KILN_OK;
    int64_t rows = n / d;
    if (rms_norm_vec_launch<T>(ctx, x, y, rows, d, w, eps)) {
        return kiln_cuda_check_launch(ctx, "rms_norm_vec_kernel");
    }
    const void *wp = w ? w->data : NULL;
    uint32_t wdt = w ? w->dtype : 0;
    if (d <= ROW_WARP_MAX) {
        unsigned blocks = (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
        rms_norm_warp_kernel<T><<<blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            (const T *)x->data, (T *)y->data, rows, d, wp, wdt, eps);
        return kiln_cuda_check_launch(ctx, "rms_norm_warp_kernel");
    }
    rms_norm_block_kernel<T><<<(unsigned)rows, NORM_BLOCK, 0, ctx->stream>>>(
        (const T *)x->data, (T *)y->data, d, wp, wdt, eps);
    return kiln_cuda_check_launch(ctx, "rms_norm_block_kernel");
}

template <typename T>
static kiln_status softmax_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    bool log_out = args->op == KILN_OP_LOG_SOFTMAX;
    int dim =
        kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_SOFTMAX_DIM, 0), x->rank > 0 ? x->rank : 1);
    if (dim < 0) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda %s: dim out of range at %s",
                              kiln_cuda_op_name(args->op), ctx->where ? ctx->where : "?");
    }
    int64_t outer = 1, d = x->rank > 0 ? x->dims[dim] : 1, inner = 1;
    for (int i = 0; i < dim; i++) outer *= x->dims[i];
    for (uint32_t i = (uint32_t)dim + 1; i < x->rank; i++) inner *= x->dims[i];
    if (outer * d * inner == 0) return KILN_OK;
    const T *xp = (const T *)x->data;
    T *yp = (T *)y->data;
    if (inner > 1) {
        int64_t cols = outer * inner;
        softmax_col_kernel<T><<<kc_blocks(cols, NORM_BLOCK), NORM_BLOCK, 0, ctx->stream>>>(
            xp, yp, outer, d, inner, log_out);
        return kiln_cuda_check_launch(ctx, "softmax_col_kernel");
    }
    if (d <= ROW_WARP_MAX) {
        unsigned blocks = (unsigned)((outer + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
        softmax_warp_kernel<T>
            <<<blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(xp, yp, outer, d, log_out);
        return kiln_cuda_check_launch(ctx, "softmax_warp_kernel");
    }
    softmax_block_kernel<T><<<(unsigned)outer, NORM_BLOCK, 0, ctx->stream>>>(xp, yp, d, log_out);
    return kiln_cuda_check_launch(ctx, "softmax_block_kernel");
}

// --- entry points

#define NORM_DISPATCH(fn)                                                                          \
    do {                                                                                           \
        if (args->in[0] == NULL || args->in[0]->dtype != args->out->dtype)                         \
            return norm_bad_dtype(ctx, args);                                                      \
        switch (args->out->dtype) {                                                                \
        case KILN_DTYPE_F32: return fn<float>(ctx, args);                                          \
        case KILN_DTYPE_F16: return fn<__half>(ctx, args);                                         \
        case KILN_DTYPE_BF16: return fn<__nv_bfloat16>(ctx, args);                                 \
        default: return norm_bad_dtype(ctx, args);                                                 \
        }                                                                                          \
    } while (0)

extern "C" kiln_status kiln_cuda_batch_norm(const kiln_cuda_ctx *ctx,
                                            const kiln_kernel_args *args) {
    NORM_DISPATCH(batch_norm_launch);
}

extern "C" kiln_status kiln_cuda_layer_norm(const kiln_cuda_ctx *ctx,
                                            const kiln_kernel_args *args) {
    NORM_DISPATCH(layer_norm_launch);
}

extern "C" kiln_status kiln_cuda_rms_norm(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    NORM_DISPATCH(rms_norm_launch);
}

extern "C" kiln_status kiln_cuda_softmax(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    NORM_DISPATCH(softmax_launch);
}

// --- group_norm: mean and biased variance over each (sample, group)'s channels and positions,
// then the affine per channel. With enough groups, one block per group (float32 sums of the
// block, two passes). With few (GroupNorm(1, C) in MobileViT and ConvNeXt-style blocks, 32 groups
// of a large map at batch 1), a block per group would leave most SMs idle: each group is split
// over several blocks, which write their slice's float32 mean and sum of squared deviations to
// the workspace; a second kernel combines a group's partials (Chan's formula, in a fixed order:
// deterministic) and normalizes its slice. Memory: two reads and one write, as the one-block
// form, but over every SM. A one-group norm may run over an NHWC map (ctx->nhwc, cuda_layout.h):
// the sample's statistics are the same, and the affine's channel is the element's index modulo C;
// with ctx->out_nchw it writes the output NCHW (element i of the sample, pixel i / C of channel
// i % C, goes to (i % C) * H W + i / C: strided stores, in place of the layout copy's strided
// transpose of the whole map).

#define GN_BLOCK 256

// Element i of a group normalized into yg: its channel is i % C over an NHWC map, else the
// group's first channel plus i / inner. 32-bit index math (a 64-bit division costs about a hundred
// instructions, several per element): a group holds fewer than 2^32 elements (group_norm_launch).
template <typename T>
__device__ __forceinline__ void gn_store(const T *xg, T *yg, uint32_t i, uint32_t c, uint32_t ch0,
                                         uint32_t inner, float mean, float rstd, const void *w,
                                         const void *b, uint32_t pdt, int nhwc, int out_nchw) {
    const uint32_t ch = nhwc ? i % c : ch0 + i / inner;
    const float sc = w ? kc_ld_f(w, pdt, ch) : 1.0f, sh = b ? kc_ld_f(b, pdt, ch) : 0.0f;
    const int64_t o = out_nchw ? (int64_t)ch * inner + i / c : (int64_t)i;
    yg[o] = kc_from_f<T>((kc_to_f(xg[i]) - mean) * rstd * sc + sh);
}

template <typename T>
static __global__ void group_norm_kernel(const T *x, T *y, int64_t c, int64_t groups, int64_t inner,
                                         const void *w, const void *b, uint32_t pdt, float eps,
                                         int nhwc, int out_nchw) {
    __shared__ float red[32];
    int64_t ng = blockIdx.x, g = ng % groups, cg = c / groups, len = cg * inner;
    const T *xg = x + ng * len; // groups of one sample are contiguous: [N, G, C/G, inner]
    T *yg = y + ng * len;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) s += kc_to_f(xg[i]);
    float mean = kc_block_sum(s, red) / (float)len;
    float q = 0.0f;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
        float d = kc_to_f(xg[i]) - mean;
        q += d * d;
    }
    float rstd = rsqrtf(kc_block_sum(q, red) / (float)len + eps);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
        gn_store(xg, yg, (uint32_t)i, (uint32_t)c, (uint32_t)(g * cg), (uint32_t)inner, mean, rstd,
                 w, b, pdt, nhwc, out_nchw);
    }
}

#define GN_SPLIT_MIN 512 // elements per block at least, in the split form (two per thread)
#define GN_MAX_SPLITS 512

// Blocks per group for the split form (1: one block per group).
static int64_t gn_splits(const kiln_cuda_ctx *ctx, int64_t ng, int64_t len) {
    int64_t sms = ctx->sm_count > 0 ? ctx->sm_count : 1, want, most;
    if (ng >= sms || ctx->workspace == NULL || ng > 65535) return 1;
    want = (2 * sms + ng - 1) / ng;
    most = len / GN_SPLIT_MIN;
    if (most > GN_MAX_SPLITS) most = GN_MAX_SPLITS;
    if (want > most) want = most;
    if (want < 2 || (uint64_t)(ng * want) * sizeof(float2) > ctx->workspace_nbytes) return 1;
    return want;
}

// Block (split s, group ng): mean and sum of squared deviations of its slice of the group (two
// passes over the slice; the second reads it from L2).
template <typename T>
static __global__ void gn_partial_kernel(const T *x, int64_t len, int64_t chunk, float2 *part) {
    __shared__ float red[32];
    int64_t ng = blockIdx.y, lo = blockIdx.x * chunk, hi = lo + chunk < len ? lo + chunk : len;
    const T *xg = x + ng * len;
    float s = 0.0f, q = 0.0f;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += kc_to_f(xg[i]);
    float mean = kc_block_sum(s, red) / (float)(hi - lo);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float d = kc_to_f(xg[i]) - mean;
        q += d * d;
    }
    q = kc_block_sum(q, red);
    if (threadIdx.x == 0) part[ng * gridDim.x + blockIdx.x] = make_float2(mean, q);
}

// Block (split s, group ng): the group's mean and rstd from its partials (Chan's combination,
// summed in split order by the first warp: the same in every block of the group), then its
// slice normalized.
template <typename T>
static __global__ void gn_apply_kernel(const T *x, T *y, int64_t c, int64_t groups, int64_t inner,
                                       int64_t chunk, const float2 *part, const void *w,
                                       const void *b, uint32_t pdt, float eps, int nhwc,
                                       int out_nchw) {
    __shared__ float stat[2];
    int64_t ng = blockIdx.y, g = ng % groups, cg = c / groups, len = cg * inner;
    int64_t lo = blockIdx.x * chunk, hi = lo + chunk < len ? lo + chunk : len;
    const T *xg = x + ng * len;
    T *yg = y + ng * len;
    const float2 *pg = part + ng * gridDim.x;
    if (threadIdx.x < 32) {
        float s = 0.0f, q = 0.0f;
        for (unsigned k = threadIdx.x; k < gridDim.x; k += 32) {
            int64_t nk = len - (int64_t)k * chunk < chunk ? len - (int64_t)k * chunk : chunk;
            s += (float)nk * pg[k].x;
        }
        float mean = kc_warp_sum(s) / (float)len;
        for (unsigned k = threadIdx.x; k < gridDim.x; k += 32) {
            int64_t nk = len - (int64_t)k * chunk < chunk ? len - (int64_t)k * chunk : chunk;
            float d = pg[k].x - mean;
            q += pg[k].y + (float)nk * d * d;
        }
        q = kc_warp_sum(q);
        if (threadIdx.x == 0) {
            stat[0] = mean;
            stat[1] = rsqrtf(q / (float)len + eps);
        }
    }
    __syncthreads();
    float mean = stat[0], rstd = stat[1];
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        gn_store(xg, yg, (uint32_t)i, (uint32_t)c, (uint32_t)(g * cg), (uint32_t)inner, mean, rstd,
                 w, b, pdt, nhwc, out_nchw);
    }
}

template <typename T>
static kiln_status group_norm_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    const kiln_tensor *w = args->n_in > 1 ? args->in[1] : NULL;
    const kiln_tensor *b = args->n_in > 2 ? args->in[2] : NULL;
    int64_t groups = kiln_attrs_int(&args->attrs, KILN_A_GN_GROUPS, 0);
    float eps = (float)kiln_attrs_float(&args->attrs, KILN_A_GN_EPS, 0);
    int64_t n = x->dims[0], c = x->dims[1], inner = 1;
    for (uint32_t d = 2; d < x->rank; d++) inner *= x->dims[d];
    if (n * c * inner == 0) return KILN_OK;
    uint32_t pdt = w ? w->dtype : (b ? b->dtype : x->dtype);
    int64_t ng = n * groups, len = c / groups * inner;
    if (len > (int64_t)UINT32_MAX) { // the kernels' index math is 32-bit within a group
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda group_norm: a group of %lld elements (2^32 or more) at %s; "
                              "run the model on the CPU backend or with more groups",
                              (long long)len, ctx->where ? ctx->where : "?");
    }
    const int nhwc = ctx->nhwc && groups == 1 && x->rank == 4;
    const int out_nchw = nhwc && ctx->out_nchw;
    int64_t splits = gn_splits(ctx, ng, len);
    if (splits > 1) {
        kiln_cuda_ws_note(ctx, (size_t)ng * (size_t)splits * sizeof(float2)); // gn_splits' bound
        int64_t chunk = (len + splits - 1) / splits;
        splits = (len + chunk - 1) / chunk; // no empty slice
        dim3 grid((unsigned)splits, (unsigned)ng);
        float2 *part = (float2 *)ctx->workspace;
        gn_partial_kernel<T>
            <<<grid, GN_BLOCK, 0, ctx->stream>>>((const T *)x->data, len, chunk, part);
        KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "gn_partial_kernel"));
        gn_apply_kernel<T><<<grid, GN_BLOCK, 0, ctx->stream>>>(
            (const T *)x->data, (T *)y->data, c, groups, inner, chunk, part, w ? w->data : NULL,
            b ? b->data : NULL, pdt, eps, nhwc, out_nchw);
        return kiln_cuda_check_launch(ctx, "gn_apply_kernel");
    }
    group_norm_kernel<T><<<(unsigned)(n * groups), GN_BLOCK, 0, ctx->stream>>>(
        (const T *)x->data, (T *)y->data, c, groups, inner, w ? w->data : NULL, b ? b->data : NULL,
        pdt, eps, nhwc, out_nchw);
    return kiln_cuda_check_launch(ctx, "group_norm_kernel");
}

extern "C" kiln_status kiln_cuda_group_norm(const kiln_cuda_ctx *ctx,
                                            const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0];
    int64_t groups = kiln_attrs_int(&args->attrs, KILN_A_GN_GROUPS, 0);
    if (ctx->nhwc && (groups != 1 || x->rank != 4)) { // the layout pass never asks for these
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda group_norm: an NHWC map takes one group only (%lld groups, "
                              "rank %u) at %s; set the option cuda.nhwc to false",
                              (long long)groups, x->rank, ctx->where ? ctx->where : "?");
    }
    if (x->rank < 2 || groups < 1 || x->dims[1] % groups != 0 || x->dtype != args->out->dtype ||
        x->dims[0] * groups > 0x7fffffff) {
        return kiln_cuda_fail(
            KILN_ERR_UNSUPPORTED,
            "cuda group_norm: needs [N, C, ...] with C a multiple of groups at %s",
            ctx->where ? ctx->where : "?");
    }
    switch (x->dtype) {
    case KILN_DTYPE_F32: return group_norm_launch<float>(ctx, args);
    case KILN_DTYPE_F16: return group_norm_launch<__half>(ctx, args);
    case KILN_DTYPE_BF16: return group_norm_launch<__nv_bfloat16>(ctx, args);
    default:
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda group_norm: dtype %s at %s",
                              kiln_cuda_dtype_name(x->dtype), ctx->where ? ctx->where : "?");
    }
}
