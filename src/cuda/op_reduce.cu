// SPDX-License-Identifier: Apache-2.0
// mean, sum and vector_norm (the square root of the sum of squares) over a set of dims (empty =
// all; keepdim only changes the output's shape, not its element order). Float outputs accumulate
// in float64 (like the CPU reference), integer sums in int64 (wrapping).
// A 4-D input the layout pass stored NHWC (ctx->nhwc, cuda_layout.h) is walked through the
// strides of that layout; the output is written in logical order (NCHW), as cuda_layout.c
// expects of a reduction head.
// A reduction over H and W of an NHWC fp16/bf16 input with C % 8 == 0 (squeeze-excite's and
// the classifier's global pool) runs its own kernels, 16-byte loads, partial sums combined in a
// fixed order: for few images, a thread-block cluster per tile of channels splitting the pixels;
// for small maps a block per image and tile of channels; else one block per image and 8 channels
// (float64 sums).
// Runs of adjacent kept or reduced dims that are contiguous in memory are coalesced; when the
// dim of stride 1 is reduced and the reduction is long, one block reduces each output
// (coalesced reads), otherwise one thread per output walks its elements (coalesced across
// neighbouring outputs). Few outputs of long reductions (a whole tensor to one value: T5's
// float16 overflow guard, `isinf(x).any()`) would leave all but a few SMs idle with one block
// each (333 us for 98 K elements on the H200): each output's elements are then cut into slices,
// a block per slice writes its partial sum to the workspace, and a second kernel adds an
// output's partials in slice order (deterministic; the same accumulator types).
#include <cooperative_groups.h>
#include <math.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_fold.h"

#define RED_BLOCK 256
#define RED_ROW_BLOCK 128
#define RED_ROW_MIN 64 // reductions at least this long over the innermost dim take a block each

typedef struct red_params {
    int n_kept, n_red;
    int64_t kept_dims[KC_MAX_RANK], kept_strides[KC_MAX_RANK];
    int64_t red_dims[KC_MAX_RANK], red_strides[KC_MAX_RANK];
    int64_t n_out, n_red_elems;
    const void *x;
    uint32_t x_dtype;
    void *y;
    uint32_t y_dtype;
    int mode; // RED_SUM, RED_MEAN or RED_NORM
} red_params;

enum { RED_SUM = 0, RED_MEAN = 1, RED_NORM = 2 };

// --- kernels

__device__ __forceinline__ int64_t red_decompose(int64_t i, int n, const int64_t *dims,
                                                 const int64_t *strides) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += (i % dims[d]) * strides[d];
        i /= dims[d];
    }
    return off;
}

// The offset of reduced element r from its output's base: one multiply for a single (coalesced)
// reduced dim, the common case, instead of a 64-bit division per element.
__device__ __forceinline__ int64_t red_offset(const red_params &P, int64_t r) {
    return P.n_red == 1 ? r * P.red_strides[0]
                        : red_decompose(r, P.n_red, P.red_dims, P.red_strides);
}

template <typename Acc> __device__ __forceinline__ Acc red_load(const red_params &P, int64_t off);
template <> __device__ __forceinline__ double red_load<double>(const red_params &P, int64_t off) {
    const double v = (double)kc_ld_f(P.x, P.x_dtype, off);
    return P.mode == RED_NORM ? v * v : v;
}
template <> __device__ __forceinline__ int64_t red_load<int64_t>(const red_params &P, int64_t off) {
    return kc_ld_i(P.x, P.x_dtype, off);
}

// The mean's division or the norm's root, in the accumulator's precision.
__device__ __forceinline__ double red_finish(int mode, double s, int64_t n) {
    return mode == RED_MEAN ? s / (double)n : mode == RED_NORM ? sqrt(s) : s;
}
__device__ __forceinline__ float red_finish(int mode, float s, int64_t n) {
    return mode == RED_MEAN ? s / (float)n : mode == RED_NORM ? sqrtf(s) : s;
}
__device__ __forceinline__ void red_store(const red_params &P, int64_t o, double s) {
    kc_st_f(P.y, P.y_dtype, o, (float)red_finish(P.mode, s, P.n_red_elems));
}
__device__ __forceinline__ void red_store(const red_params &P, int64_t o, int64_t s) {
    kc_st_i(P.y, P.y_dtype, o, s);
}

__device__ __forceinline__ int64_t red_add(int64_t a, int64_t b) {
    return (int64_t)((uint64_t)a + (uint64_t)b);
}
__device__ __forceinline__ double red_add(double a, double b) { return a + b; }

template <typename Acc>
static __global__ void reduce_thread_kernel(const __grid_constant__ red_params P) {
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < P.n_out;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t base = red_decompose(o, P.n_kept, P.kept_dims, P.kept_strides);
        Acc s = 0;
        for (int64_t r = 0; r < P.n_red_elems; r++)
            s = red_add(s, red_load<Acc>(P, base + red_offset(P, r)));
        red_store(P, o, s);
    }
}

// The sum of elements [r0, r1) of output o over the block (thread 0 has it; `shared` holds a
// value per warp and is free again on return).
template <typename Acc>
__device__ __forceinline__ Acc red_block_range(const red_params &P, int64_t o, int64_t r0,
                                               int64_t r1, Acc *shared) {
    const int64_t base = red_decompose(o, P.n_kept, P.kept_dims, P.kept_strides);
    Acc s = 0, t = 0;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
        s = red_add(s, red_load<Acc>(P, base + red_offset(P, r)));
    }
    for (int k = 16; k > 0; k >>= 1) s = red_add(s, __shfl_xor_sync(0xffffffffu, s, k));
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 0; w < RED_ROW_BLOCK / 32; w++) t = red_add(t, shared[w]);
    }
    __syncthreads();
    return t;
}

template <typename Acc>
static __global__ void reduce_block_kernel(const __grid_constant__ red_params P) {
    __shared__ Acc shared[RED_ROW_BLOCK / 32];
    for (int64_t o = blockIdx.x; o < P.n_out; o += gridDim.x) {
        const Acc t = red_block_range<Acc>(P, o, 0, P.n_red_elems, shared);
        if (threadIdx.x == 0) red_store(P, o, t);
    }
}

// The sliced form above: block (g, o) sums elements [g * slice, (g + 1) * slice) of output o into
// part[o * gridDim.x + g]; then one warp per output adds its n_slices partials in a fixed order.
template <typename Acc>
static __global__ void reduce_slice_kernel(const __grid_constant__ red_params P, int64_t slice,
                                           Acc *part) {
    __shared__ Acc shared[RED_ROW_BLOCK / 32];
    const int64_t o = blockIdx.y, r0 = (int64_t)blockIdx.x * slice;
    const int64_t r1 = r0 + slice < P.n_red_elems ? r0 + slice : P.n_red_elems;
    const Acc t = red_block_range<Acc>(P, o, r0, r1, shared);
    if (threadIdx.x == 0) part[o * gridDim.x + blockIdx.x] = t;
}

template <typename Acc>
static __global__ void reduce_slices_done_kernel(const __grid_constant__ red_params P, int n_slices,
                                                 const Acc *part) {
    const int64_t o = blockIdx.x;
    Acc t = 0; // lane l: partials l, l + 32, ...; then the lanes in a fixed tree
    for (int g = (int)threadIdx.x; g < n_slices; g += 32) t = red_add(t, part[o * n_slices + g]);
    for (int k = 16; k > 0; k >>= 1) t = red_add(t, __shfl_xor_sync(0xffffffffu, t, k));
    if (threadIdx.x == 0) red_store(P, o, t);
}

#define RED_SLICE_MIN 1024 // elements per slice of the sliced form (8 per thread)

// Columns: a dense [O, R, C] input reduced over R (the kept dim of stride 1 is C: a sum over the
// pixels of a channels-last map, as ConvNeXt-V2's global response norm takes over [1, 56, 56,
// 384], or over the rows of a matrix). One thread per output walking R (the thread kernel) left
// most SMs idle and each thread thousands of loads deep (1.4 ms for that sum on the H200). Here a
// block's 32 x RED_COL_ROWS threads take 32 neighbouring columns (coalesced rows) and split the
// rows of slice z of R among them; the block adds its rows' sums in a fixed order and writes the
// output (one slice) or the slice's partial (several: reduce_cols_done_kernel adds them in slice
// order). Deterministic, with the accumulators of the other kernels.
#define RED_COL_ROWS 8
template <typename Acc>
static __global__ void __launch_bounds__(32 * RED_COL_ROWS)
    reduce_cols_kernel(const __grid_constant__ red_params P, int64_t c_n, int64_t r_n,
                       int64_t slice, Acc *part) {
    __shared__ Acc sums[RED_COL_ROWS][32];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x, o = blockIdx.y;
    const int64_t r0 = (int64_t)blockIdx.z * slice;
    const int64_t r1 = r0 + slice < r_n ? r0 + slice : r_n;
    Acc s = 0;
    if (c < c_n) {
        const int64_t base = o * r_n * c_n + c;
        for (int64_t r = r0 + threadIdx.y; r < r1; r += RED_COL_ROWS) {
            s = red_add(s, red_load<Acc>(P, base + r * c_n));
        }
    }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= c_n) return;
    Acc t = 0;
    for (int k = 0; k < RED_COL_ROWS; k++) t = red_add(t, sums[k][threadIdx.x]);
    if (gridDim.z == 1) {
        red_store(P, o * c_n + c, t);
    } else {
        part[((int64_t)blockIdx.z * gridDim.y + o) * c_n + c] = t;
    }
}

template <typename Acc>
static __global__ void reduce_cols_done_kernel(const __grid_constant__ red_params P, int n_slices,
                                               const Acc *part) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; // o * C + c
    if (i >= P.n_out) return;
    Acc t = 0;
    for (int z = 0; z < n_slices; z++) t = red_add(t, part[z * P.n_out + i]);
    red_store(P, i, t);
}

#define RED_HW_BLOCK 512

template <typename T>
static __global__ void __launch_bounds__(RED_HW_BLOCK)
    reduce_hw_nhwc_kernel(const T *x, int64_t hw, int64_t c, void *y, uint32_t ydt, int mode) {
    __shared__ double part[8][RED_HW_BLOCK / 32];
    const int64_t cv = c / 8, n = blockIdx.x / cv, v = blockIdx.x % cv;
    const T *base = x + n * hw * c + v * 8;
    double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
#pragma unroll 4
    for (int64_t r = threadIdx.x; r < hw; r += RED_HW_BLOCK) {
        const uint4 raw = __ldg((const uint4 *)(base + r * c));
        const T *e = (const T *)&raw;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const double v = (double)kc_to_f(e[k]);
            acc[k] += mode == RED_NORM ? v * v : v;
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        for (int o = 16; o > 0; o >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
    }
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < 8; k++) part[k][threadIdx.x >> 5] = acc[k];
    }
    __syncthreads();
    if (threadIdx.x < 8) {
        double t = 0.0;
        for (int w = 0; w < RED_HW_BLOCK / 32; w++) t += part[threadIdx.x][w];
        kc_st_f(y, ydt, n * c + v * 8 + threadIdx.x, (float)red_finish(mode, t, hw));
    }
}

// The same pool for small images or many (image, channel) pairs: a block covers bx channel
// vectors (8 channels each) of one image across threads.x and by pixel rows across threads.y,
// so that a warp reads whole pixel rows and no thread idles on a 7x7 map (the kernel above
// gives a 512-thread block to 8 channels: EfficientNet b32's 7x7x1152 pools took 35 us each
// for 3.6 MB). Float accumulation (at most 1024 pixels per thread column here).
#define RED_TILE_MAX_HW 1024
template <typename T>
static __global__ void __launch_bounds__(RED_HW_BLOCK)
    reduce_hw_tile_kernel(const T *x, int hw, int c, void *y, uint32_t ydt, int mode, int tiles) {
    extern __shared__ float red_tile[]; // [by][bx][8]
    const int n = (int)blockIdx.x / tiles, tile = (int)blockIdx.x % tiles;
    const int c0 = (tile * (int)blockDim.x + (int)threadIdx.x) * 8;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (c0 < c) {
        const T *base = x + (int64_t)n * hw * c + c0;
        for (int r = (int)threadIdx.y; r < hw; r += (int)blockDim.y) {
            const uint4 raw = __ldg((const uint4 *)(base + (int64_t)r * c));
            const T *e = (const T *)&raw;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float v = kc_to_f(e[k]);
                acc[k] += mode == RED_NORM ? v * v : v;
            }
        }
    }
    float *mine = red_tile + (threadIdx.y * blockDim.x + threadIdx.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; k++) mine[k] = acc[k];
    __syncthreads();
    if (threadIdx.y != 0 || c0 >= c) return;
    for (unsigned r = 1; r < blockDim.y; r++) {
        const float *other = red_tile + (r * blockDim.x + threadIdx.x) * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += other[k];
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        kc_st_f(y, ydt, (int64_t)n * c + c0 + k, red_finish(mode, acc[k], (int64_t)hw));
    }
}

// The same tiles for few images (a batch-1 squeeze-excite pool: one block of the kernel above
// walked 28 x 28 x 240 in 27 us): a thread-block cluster of S blocks shares each tile's pixel
// rows (block r of the cluster takes rows r, r + S, ... of its thread rows), each block sums its
// rows in shared memory, and block 0 adds the others' sums through distributed shared memory.
// grid (S, images x tiles), cluster (S, 1, 1).
#define RED_CLUSTER_MAX 8 // the largest portable cluster
template <typename T>
static __global__ void __launch_bounds__(RED_HW_BLOCK)
    reduce_hw_cluster_kernel(const T *x, int hw, int c, void *y, uint32_t ydt, int mode,
                             int tiles) {
    namespace cg = cooperative_groups;
    extern __shared__ float red_tile[]; // [by][bx][8]
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank(), nrank = (int)cl.num_blocks();
    const int n = (int)blockIdx.y / tiles, tile = (int)blockIdx.y % tiles;
    const int c0 = (tile * (int)blockDim.x + (int)threadIdx.x) * 8;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (c0 < c) {
        const T *base = x + (int64_t)n * hw * c + c0;
        const int step = (int)blockDim.y * nrank;
        for (int r = rank * (int)blockDim.y + (int)threadIdx.y; r < hw; r += step) {
            const uint4 raw = __ldg((const uint4 *)(base + (int64_t)r * c));
            const T *e = (const T *)&raw;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float v = kc_to_f(e[k]);
                acc[k] += mode == RED_NORM ? v * v : v;
            }
        }
    }
    float *mine = red_tile + (threadIdx.y * blockDim.x + threadIdx.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; k++) mine[k] = acc[k];
    __syncthreads();
    if (threadIdx.y == 0) { // this block's sums in row 0
        for (unsigned r = 1; r < blockDim.y; r++) {
            const float *other = red_tile + (r * blockDim.x + threadIdx.x) * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += other[k];
        }
#pragma unroll
        for (int k = 0; k < 8; k++) mine[k] = acc[k];
    }
    cl.sync(); // every block's row 0 written
    if (rank == 0 && threadIdx.y == 0 && c0 < c) {
        for (int q = 1; q < nrank; q++) {
            const float *other = cl.map_shared_rank(red_tile, q) + threadIdx.x * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += other[k];
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            kc_st_f(y, ydt, (int64_t)n * c + c0 + k, red_finish(mode, acc[k], (int64_t)hw));
        }
    }
    cl.sync(); // the peers' shared memory stays until block 0 has read it
}

template <typename T>
static cudaError_t reduce_hw_cluster(const kiln_cuda_ctx *ctx, unsigned s, unsigned groups,
                                     dim3 block, size_t smem, const T *x, int hw, int c, void *y,
                                     uint32_t ydt, int mode, int tiles) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = dim3(s, groups);
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = s;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, reduce_hw_cluster_kernel<T>, x, hw, c, y, ydt, mode, tiles);
}

// The NHWC global pool above, when it takes the layer (*done).
static kiln_status reduce_hw_nhwc(const kiln_cuda_ctx *ctx, const kiln_tensor *x,
                                  const kiln_tensor *y, const int *reduced, int mode, int *done) {
    *done = 0;
    if (!ctx->nhwc || x->rank != 4 || reduced[0] || reduced[1] || !reduced[2] || !reduced[3] ||
        (x->dtype != KILN_DTYPE_F16 && x->dtype != KILN_DTYPE_BF16) ||
        !kiln_cuda_is_float(y->dtype) || x->dims[1] % 8 != 0 || kiln_cuda_align_of(x->data) < 16) {
        return KILN_OK;
    }
    const int64_t n = x->dims[0], c = x->dims[1], hw = x->dims[2] * x->dims[3];
    *done = 1;
    if (n * c == 0) return KILN_OK;
    const int64_t cv = c / 8;
    unsigned bx = cv < 32 ? (unsigned)cv : 32, by = RED_HW_BLOCK / 2 / bx;
    const int64_t tiles = (cv + bx - 1) / bx;
    // a cluster per tile while the tiles are too few to fill the GPU, and at most 1024 pixels
    // per thread row (float sums), with at least two thread rows' pixels for each block
    const int64_t sms = ctx->sm_count > 0 ? ctx->sm_count : 132;
    int64_t s = n * tiles < sms ? (2 * sms + n * tiles - 1) / (n * tiles) : 1;
    if (s > RED_CLUSTER_MAX) s = RED_CLUSTER_MAX;
    while (s > 1 && hw < 2 * (int64_t)by * s) s--;
    if (s > 1 && hw <= RED_TILE_MAX_HW * by * s && hw * c < INT32_MAX) {
        const dim3 block(bx, by);
        const size_t smem = (size_t)bx * by * 8 * sizeof(float);
        cudaError_t err =
            x->dtype == KILN_DTYPE_F16
                ? reduce_hw_cluster<__half>(ctx, (unsigned)s, (unsigned)(n * tiles), block, smem,
                                            (const __half *)x->data, (int)hw, (int)c, y->data,
                                            y->dtype, mode, (int)tiles)
                : reduce_hw_cluster<__nv_bfloat16>(ctx, (unsigned)s, (unsigned)(n * tiles), block,
                                                   smem, (const __nv_bfloat16 *)x->data, (int)hw,
                                                   (int)c, y->data, y->dtype, mode, (int)tiles);
        if (err != cudaSuccess) {
            return kiln_cuda_error(ctx, "cudaLaunchKernelEx (reduce_hw_cluster_kernel)", err);
        }
        return kiln_cuda_check_launch(ctx, "reduce_hw_cluster_kernel");
    }
    if (hw <= RED_TILE_MAX_HW && n * tiles < INT32_MAX && hw * c < INT32_MAX) {
        const dim3 block(bx, by);
        const size_t smem = (size_t)bx * by * 8 * sizeof(float);
        if (x->dtype == KILN_DTYPE_F16) {
            reduce_hw_tile_kernel<__half><<<(unsigned)(n * tiles), block, smem, ctx->stream>>>(
                (const __half *)x->data, (int)hw, (int)c, y->data, y->dtype, mode, (int)tiles);
        } else {
            reduce_hw_tile_kernel<__nv_bfloat16>
                <<<(unsigned)(n * tiles), block, smem, ctx->stream>>>(
                    (const __nv_bfloat16 *)x->data, (int)hw, (int)c, y->data, y->dtype, mode,
                    (int)tiles);
        }
        return kiln_cuda_check_launch(ctx, "reduce_hw_tile_kernel");
    }
    const unsigned blocks = (unsigned)(n * cv);
    if (x->dtype == KILN_DTYPE_F16) {
        reduce_hw_nhwc_kernel<__half><<<blocks, RED_HW_BLOCK, 0, ctx->stream>>>(
            (const __half *)x->data, hw, c, y->data, y->dtype, mode);
    } else {
        reduce_hw_nhwc_kernel<__nv_bfloat16><<<blocks, RED_HW_BLOCK, 0, ctx->stream>>>(
            (const __nv_bfloat16 *)x->data, hw, c, y->data, y->dtype, mode);
    }
    return kiln_cuda_check_launch(ctx, "reduce_hw_nhwc_kernel");
}

// --- mean ratios (cuda_fold.h): y = x / (mean(x over its last dim) + eps), a block per row of
// c values. The row's sum in float64 (the reduction kernels' accumulator), the mean rounded to
// the MEAN layer's dtype, the sum with eps to the ADD's, each quotient to y's: the three layers'
// values. Launched with PDL like the elementwise kernels it replaces.

#define RED_RATIO_BLOCK 256
static __global__ void __launch_bounds__(RED_RATIO_BLOCK)
    reduce_ratio_kernel(const void *x, uint32_t xdt, void *y, uint32_t ydt, const void *eps,
                        uint32_t edt, uint32_t mdt, uint32_t adt, int64_t c) {
    __shared__ double part[RED_RATIO_BLOCK / 32];
    __shared__ float den;
    kc_pdl_enter();
    const int64_t base = (int64_t)blockIdx.x * c;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < c; i += RED_RATIO_BLOCK)
        s += (double)kc_ld_f(x, xdt, base + i);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < RED_RATIO_BLOCK / 32; w++) t += part[w];
        const float mean = kc_round_to(mdt, (float)(t / (double)c));
        den = kc_round_to(adt, mean + kc_ld_f(eps, edt, 0));
    }
    __syncthreads();
    const float d = den;
    for (int64_t i = threadIdx.x; i < c; i += RED_RATIO_BLOCK) {
        kc_st_f(y, ydt, base + i, kc_ld_f(x, xdt, base + i) / d);
    }
}

static kiln_status reduce_ratio(const kiln_cuda_ctx *ctx, const kiln_tensor *x) {
    const kiln_tensor *y = ctx->ratio_y, *e = ctx->ratio_eps;
    const int64_t n = kc_numel(x), c = x->rank > 0 ? x->dims[x->rank - 1] : 1;
    if (kc_numel(y) != n || y->dtype != x->dtype || e == NULL || kc_numel(e) != 1 || c < 1 ||
        c > KILN_CUDA_RATIO_MAX) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda mean ratio: operands do not match the fold at %s (set "
                              "cuda.attention_fold to false to run the layers apart)",
                              ctx->where ? ctx->where : "?");
    }
    const int64_t rows = n / c;
    if (rows == 0) return KILN_OK;
    if (rows > 0x7fffffff) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda mean ratio: %lld rows at %s",
                              (long long)rows, ctx->where ? ctx->where : "?");
    }
    cudaError_t err =
        kc_launch(ctx, reduce_ratio_kernel, dim3((unsigned)rows), dim3(RED_RATIO_BLOCK), 0,
                  (const void *)x->data, x->dtype, (void *)y->data, y->dtype, (const void *)e->data,
                  e->dtype, ctx->ratio_mean_dtype, ctx->ratio_add_dtype, c);
    if (err != cudaSuccess) {
        return kiln_cuda_error(ctx, "cudaLaunchKernelEx (reduce_ratio_kernel)", err);
    }
    return kiln_cuda_check_launch(ctx, "reduce_ratio_kernel");
}

// --- softmax-weighted sums (cuda_fold.h): r[row] = sum_n x[row, n] * softmax(s[srow, :])[n], a
// warp per output row (srow: the row's scores, s broadcast over x's leading dims). The softmax
// as its kernel computes it (float32 max and sum of exp over the lanes, each value rounded to
// its dtype), each product rounded to the mul's dtype, summed in float64 like the sum's kernels.

#define WSUM_WARPS 4
typedef struct wsum_params {
    int rank; // x's dims but the last (at least 1)
    int64_t dims[KC_MAX_RANK], s_strides[KC_MAX_RANK];
    int64_t rows, n;
    const void *s, *x;
    void *r;
    uint32_t sdt, xdt, rdt, smdt, mdt;
} wsum_params;

static __global__ void __launch_bounds__(32 * WSUM_WARPS)
    wsum_kernel(const __grid_constant__ wsum_params P) {
    kc_pdl_enter();
    const int64_t row = (int64_t)blockIdx.x * WSUM_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= P.rows) return;
    int64_t rest = row, soff = 0;
    for (int d = P.rank - 1; d >= 0; d--) {
        soff += (rest % P.dims[d]) * P.s_strides[d];
        rest /= P.dims[d];
    }
    float m = -INFINITY;
    for (int64_t j = lane; j < P.n; j += 32) m = fmaxf(m, kc_ld_f(P.s, P.sdt, soff + j));
    m = kc_warp_max(m);
    float e = 0.0f;
    for (int64_t j = lane; j < P.n; j += 32) e += expf(kc_ld_f(P.s, P.sdt, soff + j) - m);
    e = kc_warp_sum(e);
    double acc = 0.0;
    for (int64_t j = lane; j < P.n; j += 32) {
        const float w = kc_round_to(P.smdt, expf(kc_ld_f(P.s, P.sdt, soff + j) - m) / e);
        acc += (double)kc_round_to(P.mdt, kc_ld_f(P.x, P.xdt, row * P.n + j) * w);
    }
    for (int k = 16; k > 0; k >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, k);
    if (lane == 0) kc_st_f(P.r, P.rdt, row, (float)acc);
}

static kiln_status reduce_wsum(const kiln_cuda_ctx *ctx, const kiln_tensor *y) {
    const kiln_tensor *s = ctx->wsum_s, *x = ctx->wsum_x;
    wsum_params P;
    memset(&P, 0, sizeof P);
    const uint32_t r = x->rank;
    int ok = r >= 1 && s->rank == r && s->dims[r - 1] == x->dims[r - 1] &&
             kc_numel(y) * x->dims[r - 1] == kc_numel(x);
    int64_t ss[KC_MAX_RANK];
    kc_strides(s, ss);
    P.rank = r > 1 ? (int)r - 1 : 1;
    P.dims[0] = 1;
    P.s_strides[0] = 0;
    for (uint32_t d = 0; d + 1 < r && ok; d++) {
        ok = s->dims[d] == 1 || s->dims[d] == x->dims[d];
        P.dims[d] = x->dims[d];
        P.s_strides[d] = s->dims[d] == 1 ? 0 : ss[d];
    }
    if (!ok) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda softmax-weighted sum: operands do not match the fold at %s "
                              "(set cuda.attention_fold to false to run the layers apart)",
                              ctx->where ? ctx->where : "?");
    }
    P.n = x->dims[r - 1];
    P.rows = kc_numel(y);
    if (P.rows == 0) return KILN_OK;
    P.s = s->data;
    P.x = x->data;
    P.r = y->data;
    P.sdt = s->dtype;
    P.xdt = x->dtype;
    P.rdt = y->dtype;
    P.smdt = ctx->wsum_sm_dtype;
    P.mdt = ctx->wsum_mul_dtype;
    const int64_t blocks = (P.rows + WSUM_WARPS - 1) / WSUM_WARPS;
    if (blocks > 0x7fffffff) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda softmax-weighted sum: %lld rows at %s",
                              (long long)P.rows, ctx->where ? ctx->where : "?");
    }
    cudaError_t err =
        kc_launch(ctx, wsum_kernel, dim3((unsigned)blocks), dim3(32 * WSUM_WARPS), 0, P);
    if (err != cudaSuccess) return kiln_cuda_error(ctx, "cudaLaunchKernelEx (wsum_kernel)", err);
    return kiln_cuda_check_launch(ctx, "wsum_kernel");
}

// --- launchers

// The column form (reduce_cols_kernel) when P is a dense [O, R, C] reduced over R: *done.
template <typename Acc>
static kiln_status reduce_cols(const kiln_cuda_ctx *ctx, const red_params *P, int *done) {
    *done = 0;
    if (P->n_red != 1 || P->n_kept < 1 || P->n_kept > 2) return KILN_OK;
    const int64_t c_n = P->kept_dims[P->n_kept - 1], r_n = P->red_dims[0];
    const int64_t o_n = P->n_kept == 2 ? P->kept_dims[0] : 1;
    if (P->kept_strides[P->n_kept - 1] != 1 || P->red_strides[0] != c_n || r_n < 32 ||
        (P->n_kept == 2 && P->kept_strides[0] != r_n * c_n) || o_n > 65535)
        return KILN_OK;
    const int64_t cblocks = (c_n + 31) / 32,
                  want = 2 * (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 132);
    int64_t n = want / (cblocks * o_n); // slices of R, each at least 4 rows per thread
    const int64_t most = r_n / (4 * RED_COL_ROWS);
    if (n > most) n = most;
    if (n > 1024) n = 1024;
    if (n < 1) n = 1;
    const size_t nbytes = (size_t)n * (size_t)P->n_out * sizeof(Acc);
    if (n > 1 && (ctx->workspace == NULL || nbytes > ctx->workspace_nbytes)) n = 1;
    if (cblocks > 0x7fffffff) return KILN_OK;
    const int64_t slice = (r_n + n - 1) / n;
    const int slices = (int)((r_n + slice - 1) / slice);
    Acc *part = slices > 1 ? (Acc *)ctx->workspace : NULL;
    if (slices > 1) kiln_cuda_ws_note(ctx, (size_t)slices * (size_t)P->n_out * sizeof(Acc));
    reduce_cols_kernel<Acc><<<dim3((unsigned)cblocks, (unsigned)o_n, (unsigned)slices),
                              dim3(32, RED_COL_ROWS), 0, ctx->stream>>>(*P, c_n, r_n, slice, part);
    KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "reduce_cols_kernel"));
    if (slices > 1) {
        reduce_cols_done_kernel<Acc>
            <<<kc_blocks(P->n_out, RED_BLOCK), RED_BLOCK, 0, ctx->stream>>>(*P, slices, part);
        KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "reduce_cols_done_kernel"));
    }
    *done = 1;
    return KILN_OK;
}

template <typename Acc>
static kiln_status reduce_launch(const kiln_cuda_ctx *ctx, const red_params *P, int by_block) {
    if (!by_block) {
        int done = 0;
        KILN_CUDA_TRY(reduce_cols<Acc>(ctx, P, &done));
        if (done) return KILN_OK;
    }
    if (by_block && ctx->sm_count > 0 && 2 * P->n_out <= ctx->sm_count &&
        P->n_red_elems >= 2 * RED_SLICE_MIN) {
        int64_t n = (P->n_red_elems + RED_SLICE_MIN - 1) / RED_SLICE_MIN;
        const int64_t cap = 2 * (int64_t)ctx->sm_count / P->n_out;
        if (n > cap) n = cap;
        if (n > 1024) n = 1024;
        const size_t nbytes = (size_t)(n * P->n_out) * sizeof(Acc);
        if (n >= 2 && ctx->workspace != NULL && nbytes <= ctx->workspace_nbytes) {
            const int64_t slice = (P->n_red_elems + n - 1) / n;
            const int slices = (int)((P->n_red_elems + slice - 1) / slice);
            Acc *part = (Acc *)ctx->workspace;
            kiln_cuda_ws_note(ctx, nbytes);
            reduce_slice_kernel<Acc>
                <<<dim3((unsigned)slices, (unsigned)P->n_out), RED_ROW_BLOCK, 0, ctx->stream>>>(
                    *P, slice, part);
            KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "reduce_slice_kernel"));
            reduce_slices_done_kernel<Acc>
                <<<(unsigned)P->n_out, 32, 0, ctx->stream>>>(*P, slices, part);
            return kiln_cuda_check_launch(ctx, "reduce_slices_done_kernel");
        }
    }
    if (by_block) {
        unsigned blocks = (unsigned)(P->n_out < 65536 ? P->n_out : 65536);
        reduce_block_kernel<Acc><<<blocks, RED_ROW_BLOCK, 0, ctx->stream>>>(*P);
        return kiln_cuda_check_launch(ctx, "reduce_block_kernel");
    }
    reduce_thread_kernel<Acc><<<kc_blocks(P->n_out, RED_BLOCK), RED_BLOCK, 0, ctx->stream>>>(*P);
    return kiln_cuda_check_launch(ctx, "reduce_thread_kernel");
}

extern "C" kiln_status kiln_cuda_reduce(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    if (ctx->wsum_s != NULL && ctx->wsum_x != NULL && args->op == KILN_OP_SUM) {
        return reduce_wsum(ctx, y);
    }
    int reduced[KC_MAX_RANK] = {0};
    int64_t xs[KC_MAX_RANK];
    uint32_t n_dims = 0;
    const int64_t *dims = kiln_attrs_ints(&args->attrs, KILN_A_REDUCE_DIMS, &n_dims);
    const int mode = args->op == KILN_OP_MEAN          ? RED_MEAN
                     : args->op == KILN_OP_VECTOR_NORM ? RED_NORM
                                                       : RED_SUM;
    red_params P;
    memset(&P, 0, sizeof P);
    if (ctx->ratio_y != NULL && mode == RED_MEAN && x != NULL) return reduce_ratio(ctx, x);
    if (x == NULL || kiln_cuda_dtype_size(x->dtype) == 0 || kiln_cuda_dtype_size(y->dtype) == 0 ||
        (mode != RED_SUM && (!kiln_cuda_is_float(y->dtype) || !kiln_cuda_is_float(x->dtype)))) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda %s: dtype %s at %s",
                              kiln_cuda_op_name(args->op), kiln_cuda_dtype_name(y->dtype),
                              ctx->where ? ctx->where : "?");
    }
    for (uint32_t i = 0; i < n_dims; i++) {
        int d = kc_norm_dim(dims[i], x->rank);
        if (d < 0) {
            return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda %s: dim %lld out of range at %s",
                                  kiln_cuda_op_name(args->op), (long long)dims[i],
                                  ctx->where ? ctx->where : "?");
        }
        reduced[d] = 1;
    }
    if (n_dims == 0) {
        for (uint32_t d = 0; d < x->rank; d++) reduced[d] = 1;
    }
    {
        int done = 0;
        KILN_CUDA_TRY(reduce_hw_nhwc(ctx, x, y, reduced, mode, &done));
        if (done) return KILN_OK;
    }
    kc_strides(x, xs);
    if (ctx->nhwc && x->rank == 4) { // stored [N, H, W, C]
        xs[1] = 1;
        xs[3] = x->dims[1];
        xs[2] = x->dims[3] * xs[3];
        xs[0] = x->dims[2] * xs[2];
    }
    P.n_out = 1;
    P.n_red_elems = 1;
    int prev = -1;         // class of the previous non-1 dim: 0 kept, 1 reduced
    int64_t prev_xs = 0;   // its stride
    int inner_reduced = 0; // the dim of stride 1 is reduced
    for (uint32_t d = 0; d < x->rank; d++) {
        int64_t n = x->dims[d];
        if (reduced[d]) {
            P.n_red_elems *= n;
        } else {
            P.n_out *= n;
        }
        if (n == 1) continue;
        if (xs[d] == 1 && reduced[d]) inner_reduced = 1;
        const int contiguous = prev_xs == xs[d] * n; // merges with the previous dim
        prev_xs = xs[d];
        if (reduced[d]) {
            if (prev == 1 && contiguous) {
                P.red_dims[P.n_red - 1] *= n;
                P.red_strides[P.n_red - 1] = xs[d];
            } else {
                P.red_dims[P.n_red] = n;
                P.red_strides[P.n_red++] = xs[d];
            }
            prev = 1;
        } else {
            if (prev == 0 && contiguous) {
                P.kept_dims[P.n_kept - 1] *= n;
                P.kept_strides[P.n_kept - 1] = xs[d];
            } else {
                P.kept_dims[P.n_kept] = n;
                P.kept_strides[P.n_kept++] = xs[d];
            }
            prev = 0;
        }
    }
    if (P.n_out != kc_numel(y)) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "cuda %s: %lld outputs expected, tensor has %lld at %s",
                              kiln_cuda_op_name(args->op), (long long)P.n_out,
                              (long long)kc_numel(y), ctx->where ? ctx->where : "?");
    }
    if (P.n_out == 0) return KILN_OK;
    P.x = x->data;
    P.x_dtype = x->dtype;
    P.y = y->data;
    P.y_dtype = y->dtype;
    P.mode = mode;
    int by_block = (inner_reduced || P.n_kept == 0) && P.n_red_elems >= RED_ROW_MIN;
    if (kiln_cuda_is_float(y->dtype)) return reduce_launch<double>(ctx, &P, by_block);
    return reduce_launch<int64_t>(ctx, &P, by_block);
}

// --- cumsum: one thread per (outer, inner) line walks it in order, accumulating in double for
// float outputs and exactly in int64 for integer ones (the CPU reference's accumulators).

#define CUMSUM_BLOCK 256

static __global__ void cumsum_kernel(const void *x, uint32_t xdt, void *y, uint32_t ydt,
                                     int64_t outer, int64_t len, int64_t inner, int is_int) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t / inner, i = t % inner, base = o * len * inner + i;
        double acc = 0.0;
        uint64_t iacc = 0;
        for (int64_t l = 0; l < len; l++) {
            int64_t off = base + l * inner;
            if (is_int) {
                iacc += (uint64_t)kc_ld_i(x, xdt, off);
                kc_st_i(y, ydt, off, (int64_t)iacc);
            } else {
                acc += (double)kc_ld_f(x, xdt, off);
                kc_st_f(y, ydt, off, (float)acc);
            }
        }
    }
}

extern "C" kiln_status kiln_cuda_cumsum(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_CUMSUM_DIM, 0), x->rank);
    if (dim < 0 || kc_numel(x) != kc_numel(y)) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda cumsum: dim out of range at %s",
                              ctx->where ? ctx->where : "?");
    }
    int64_t outer = 1, len = x->dims[dim], inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    if (outer * len * inner == 0) return KILN_OK;
    int is_int = !kiln_cuda_is_float(y->dtype);
    cumsum_kernel<<<kc_blocks(outer * inner, CUMSUM_BLOCK), CUMSUM_BLOCK, 0, ctx->stream>>>(
        x->data, x->dtype, y->data, y->dtype, outer, len, inner, is_int);
    return kiln_cuda_check_launch(ctx, "cumsum_kernel");
}

// --- argmax: the first maximum along one dim as int64 (NaN counts as the maximum: the first
// NaN wins, as in PyTorch). A contiguous dim (inner 1: a logits row) takes one block per row,
// each thread scanning a strided share and the block reducing (value, index) pairs; other dims
// take one thread per (outer, inner) line.

#define ARGMAX_BLOCK 512

// True when candidate (v, i) beats the running best (m, b): larger, or NaN, or equal and earlier.
template <typename V>
__device__ __forceinline__ bool argmax_better(V v, int64_t i, V m, int64_t b) {
    if constexpr (sizeof(V) == 4) {
        const bool vn = v != v, mn = m != m;
        if (vn || mn) return vn && (!mn || i < b);
    }
    return v > m || (v == m && i < b);
}

template <typename V>
__device__ __forceinline__ V argmax_load(const void *x, uint32_t dt, int64_t off);
template <>
__device__ __forceinline__ float argmax_load<float>(const void *x, uint32_t dt, int64_t off) {
    return kc_ld_f(x, dt, off);
}
template <>
__device__ __forceinline__ int64_t argmax_load<int64_t>(const void *x, uint32_t dt, int64_t off) {
    return kc_ld_i(x, dt, off);
}

template <typename V>
static __global__ void __launch_bounds__(ARGMAX_BLOCK)
    argmax_row_kernel(const void *x, uint32_t xdt, int64_t *y, int64_t len) {
    __shared__ V sv[ARGMAX_BLOCK / 32];
    __shared__ int64_t si[ARGMAX_BLOCK / 32];
    const int64_t base = (int64_t)blockIdx.x * len;
    V m = argmax_load<V>(x, xdt, base);
    int64_t b = 0;
    for (int64_t l = threadIdx.x; l < len; l += blockDim.x) {
        const V v = argmax_load<V>(x, xdt, base + l);
        if (argmax_better(v, l, m, b)) m = v, b = l;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const V v = __shfl_xor_sync(0xffffffffu, m, o);
        const int64_t i = __shfl_xor_sync(0xffffffffu, b, o);
        if (argmax_better(v, i, m, b)) m = v, b = i;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[warp] = m, si[warp] = b;
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? sv[lane] : sv[0];
        b = lane < (int)(blockDim.x >> 5) ? si[lane] : si[0];
        for (int o = 16; o > 0; o >>= 1) {
            const V v = __shfl_xor_sync(0xffffffffu, m, o);
            const int64_t i = __shfl_xor_sync(0xffffffffu, b, o);
            if (argmax_better(v, i, m, b)) m = v, b = i;
        }
        if (lane == 0) y[blockIdx.x] = b;
    }
}

template <typename V>
static __global__ void argmax_line_kernel(const void *x, uint32_t xdt, int64_t *y, int64_t outer,
                                          int64_t len, int64_t inner) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / inner, i = t % inner, base = o * len * inner + i;
        V m = argmax_load<V>(x, xdt, base);
        int64_t b = 0;
        for (int64_t l = 1; l < len; l++) {
            const V v = argmax_load<V>(x, xdt, base + l * inner);
            if (argmax_better(v, l, m, b)) m = v, b = l;
        }
        y[t] = b;
    }
}

extern "C" kiln_status kiln_cuda_argmax(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_ARGMAX_DIM, 0), x->rank);
    if (dim < 0 || y->dtype != KILN_DTYPE_I64) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda argmax: dim out of range or a non-int64 output at %s",
                              ctx->where ? ctx->where : "?");
    }
    int64_t outer = 1, len = x->dims[dim], inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    if (outer * inner == 0) return KILN_OK;
    if (len == 0) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda argmax: dimension %d is empty at %s", dim,
                              ctx->where ? ctx->where : "?");
    }
    const int is_float = kiln_cuda_is_float(x->dtype);
    int64_t *out = (int64_t *)y->data;
    if (inner == 1 && outer <= 0x7fffffff && len >= 256) {
        if (is_float) {
            argmax_row_kernel<float>
                <<<(unsigned)outer, ARGMAX_BLOCK, 0, ctx->stream>>>(x->data, x->dtype, out, len);
        } else {
            argmax_row_kernel<int64_t>
                <<<(unsigned)outer, ARGMAX_BLOCK, 0, ctx->stream>>>(x->data, x->dtype, out, len);
        }
        return kiln_cuda_check_launch(ctx, "argmax_row_kernel");
    }
    if (is_float) {
        argmax_line_kernel<float>
            <<<kc_blocks(outer * inner, CUMSUM_BLOCK), CUMSUM_BLOCK, 0, ctx->stream>>>(
                x->data, x->dtype, out, outer, len, inner);
    } else {
        argmax_line_kernel<int64_t>
            <<<kc_blocks(outer * inner, CUMSUM_BLOCK), CUMSUM_BLOCK, 0, ctx->stream>>>(
                x->data, x->dtype, out, outer, len, inner);
    }
    return kiln_cuda_check_launch(ctx, "argmax_line_kernel");
}

// --- topk: int64 indices of the k best along one dim (op_reduce.c's rule: k passes, pass j
// taking the best element that ranks after pass j - 1's pick in the order (value, then index);
// NaN above every number when largest, below when not). One thread per (outer, inner) line: the
// MoE routers it serves pick 1-8 of 4-256 experts per token.

template <typename V>
__device__ __forceinline__ bool topk_before(V v, int64_t i, V m, int64_t b, int largest) {
    if constexpr (sizeof(V) == 4) {
        const bool vn = v != v, mn = m != m;
        if (vn != mn) return largest ? vn : mn;
        if (vn) return i < b;
    }
    if (v != m) return largest ? v > m : v < m;
    return i < b;
}

template <typename V>
static __global__ void topk_line_kernel(const void *x, uint32_t xdt, int64_t *y, int64_t outer,
                                        int64_t len, int64_t inner, int64_t k, int largest) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / inner, i = t % inner, base = o * len * inner + i;
        V pv = 0;
        int64_t pb = -1;
        for (int64_t j = 0; j < k; j++) {
            V m = 0;
            int64_t b = -1;
            for (int64_t l = 0; l < len; l++) {
                const V v = argmax_load<V>(x, xdt, base + l * inner);
                if (pb >= 0 && !topk_before(pv, pb, v, l, largest)) continue;
                if (b < 0 || topk_before(v, l, m, b, largest)) m = v, b = l;
            }
            y[(o * k + j) * inner + i] = b;
            pv = m, pb = b;
        }
    }
}

extern "C" kiln_status kiln_cuda_topk(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    const int dim = kc_norm_dim(kiln_attrs_int(&args->attrs, KILN_A_TOPK_DIM, 0), x->rank);
    const int64_t k = kiln_attrs_int(&args->attrs, KILN_A_TOPK_K, 0);
    const int largest = kiln_attrs_int(&args->attrs, KILN_A_TOPK_LARGEST, 0) != 0;
    if (dim < 0 || y->dtype != KILN_DTYPE_I64 || x->dtype == KILN_DTYPE_BOOL || k < 0 ||
        k > x->dims[dim]) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda topk: dim out of range, k above the dimension, a bool x or a "
                              "non-int64 output at %s",
                              ctx->where ? ctx->where : "?");
    }
    int64_t outer = 1, len = x->dims[dim], inner = 1;
    for (int d = 0; d < dim; d++) outer *= x->dims[d];
    for (uint32_t d = (uint32_t)dim + 1; d < x->rank; d++) inner *= x->dims[d];
    if (outer * inner == 0 || k == 0) return KILN_OK;
    if (kiln_cuda_is_float(x->dtype)) {
        topk_line_kernel<float>
            <<<kc_blocks(outer * inner, CUMSUM_BLOCK), CUMSUM_BLOCK, 0, ctx->stream>>>(
                x->data, x->dtype, (int64_t *)y->data, outer, len, inner, k, largest);
    } else {
        topk_line_kernel<int64_t>
            <<<kc_blocks(outer * inner, CUMSUM_BLOCK), CUMSUM_BLOCK, 0, ctx->stream>>>(
                x->data, x->dtype, (int64_t *)y->data, outer, len, inner, k, largest);
    }
    return kiln_cuda_check_launch(ctx, "topk_line_kernel");
}

// --- selective_scan (ops.h): a warp per (b, d) row walks the L steps in order, each lane holding
// up to SCAN_PER_LANE of the N state values in float32; y_t is the warp's sum. The next step's
// a, u and c are loaded before this step's sum, so the loads overlap the shuffles.

#define SCAN_WARPS 4
#define SCAN_PER_LANE 4 // N up to 128

typedef struct scan_params {
    const void *a, *u, *c, *h0;
    void *y;
    int64_t b, d, l, n;
    uint32_t dt;
} scan_params;

// Step t's a, u and c of this lane's state values (0 past N), in a call: one copy of the
// dtype-dispatching loads (the plugin's size).
struct scan_vals {
    float a[SCAN_PER_LANE], u[SCAN_PER_LANE], c[SCAN_PER_LANE];
};
static __device__ __noinline__ scan_vals scan_load(const scan_params &P, int64_t arow, int64_t crow,
                                                   int64_t t, int lane) {
    scan_vals s;
    for (int v = 0; v < SCAN_PER_LANE; v++) {
        const int64_t n = lane + 32 * v;
        const bool in = n < P.n;
        s.a[v] = in ? kc_ld_f(P.a, P.dt, arow + t * P.n + n) : 0.0f;
        s.u[v] = in ? kc_ld_f(P.u, P.dt, arow + t * P.n + n) : 0.0f;
        s.c[v] = in ? kc_ld_f(P.c, P.dt, crow + t * P.n + n) : 0.0f;
    }
    return s;
}

static __global__ void __launch_bounds__(SCAN_WARPS * 32)
    selective_scan_kernel(const scan_params P) {
    const int lane = (int)threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * SCAN_WARPS + ((int)threadIdx.x >> 5);
    if (row >= P.b * P.d) return;
    const int64_t bi = row / P.d, arow = row * P.l * P.n, crow = bi * P.l * P.n;
    float h[SCAN_PER_LANE];
    for (int v = 0; v < SCAN_PER_LANE; v++) {
        const int64_t n = lane + 32 * v;
        h[v] = n < P.n ? kc_ld_f(P.h0, P.dt, row * P.n + n) : 0.0f;
    }
    scan_vals cur = scan_load(P, arow, crow, 0, lane);
    for (int64_t t = 0; t < P.l; t++) {
        float acc = 0.0f;
#pragma unroll
        for (int v = 0; v < SCAN_PER_LANE; v++) {
            h[v] = fmaf(cur.a[v], h[v], cur.u[v]);
            acc = fmaf(h[v], cur.c[v], acc);
        }
        // the next step's operands, in flight during the sum
        if (t + 1 < P.l) cur = scan_load(P, arow, crow, t + 1, lane);
        acc = kc_warp_sum(acc);
        if (lane == 0) kc_st_f(P.y, P.dt, row * P.l + t, acc);
    }
}

extern "C" kiln_status kiln_cuda_selective_scan(const kiln_cuda_ctx *ctx,
                                                const kiln_kernel_args *args) {
    const kiln_tensor *a = args->in[0], *u = args->in[1], *c = args->in[2], *h0 = args->in[3];
    const kiln_tensor *y = args->out;
    int ok = a->rank == 4 && u->rank == 4 && c->rank == 3 && h0->rank == 3 && y->rank == 3 &&
             a->dims[3] <= 32 * SCAN_PER_LANE;
    for (uint32_t i = 0; ok && i < 4; i++) ok = u->dims[i] == a->dims[i];
    ok = ok && c->dims[0] == a->dims[0] && c->dims[1] == a->dims[2] && c->dims[2] == a->dims[3] &&
         h0->dims[0] == a->dims[0] && h0->dims[1] == a->dims[1] && h0->dims[2] == a->dims[3] &&
         y->dims[0] == a->dims[0] && y->dims[1] == a->dims[1] && y->dims[2] == a->dims[2];
    if (!ok) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda selective_scan: bad operands at %s",
                              ctx->where ? ctx->where : "?");
    }
    scan_params P;
    memset(&P, 0, sizeof P);
    P.a = a->data, P.u = u->data, P.c = c->data, P.h0 = h0->data, P.y = y->data;
    P.b = a->dims[0], P.d = a->dims[1], P.l = a->dims[2], P.n = a->dims[3];
    P.dt = y->dtype;
    if (P.b * P.d * P.l == 0) return KILN_OK;
    const int64_t rows = P.b * P.d;
    selective_scan_kernel<<<(unsigned)((rows + SCAN_WARPS - 1) / SCAN_WARPS), SCAN_WARPS * 32, 0,
                            ctx->stream>>>(P);
    return kiln_cuda_check_launch(ctx, "selective_scan_kernel");
}
