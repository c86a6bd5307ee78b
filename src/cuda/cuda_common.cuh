// SPDX-License-Identifier: Apache-2.0
// Device helpers shared by the op_<family>.cu files: dtype loads and stores with the CPU
// reference's conversion rules (float16/bfloat16 round to nearest even; float to integer
// truncates toward zero, saturates, NaN -> 0; int64 to int32 wraps; bool is != 0), grid sizing,
// and host-side shape helpers (contiguous and broadcast strides).
#ifndef KILN_CUDA_CUDA_COMMON_CUH
#define KILN_CUDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuda_ops.h"

#define KC_MAX_RANK KILN_MAX_RANK

// --- typed element conversion (float compute)

template <typename T> struct kc_elem;
template <> struct kc_elem<float> {
    static __device__ __forceinline__ float to_f(float v) { return v; }
    static __device__ __forceinline__ float from_f(float v) { return v; }
};
template <> struct kc_elem<__half> {
    static __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
};
template <> struct kc_elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float v) {
        return __float2bfloat16_rn(v);
    }
};

template <typename T> __device__ __forceinline__ float kc_to_f(T v) { return kc_elem<T>::to_f(v); }
template <typename T> __device__ __forceinline__ T kc_from_f(float v) {
    return kc_elem<T>::from_f(v);
}

// --- saturating float -> integer (the CPU reference's rules)

__device__ __forceinline__ int64_t kc_f2i64(float v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18f) return INT64_MAX;
    if (v <= -9.2233720368547758e18f) return INT64_MIN;
    return (int64_t)v;
}

__device__ __forceinline__ int32_t kc_f2i32(float v) {
    if (v != v) return 0;
    if (v >= 2147483647.0f) return INT32_MAX;
    if (v <= -2147483648.0f) return INT32_MIN;
    return (int32_t)v;
}

// --- runtime-dtype loads and stores (element index i)

__device__ __forceinline__ float kc_ld_f(const void *p, uint32_t dtype, int64_t i) {
    switch (dtype) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    case KILN_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case KILN_DTYPE_I32: return (float)((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return (float)((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

__device__ __forceinline__ void kc_st_f(void *p, uint32_t dtype, int64_t i, float v) {
    switch (dtype) {
    case KILN_DTYPE_F32: ((float *)p)[i] = v; break;
    case KILN_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case KILN_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case KILN_DTYPE_I32: ((int32_t *)p)[i] = kc_f2i32(v); break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = kc_f2i64(v); break;
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0.0f; break;
    default: break;
    }
}

// v rounded to dtype's precision (a layer's output of that dtype), as a float.
__device__ __forceinline__ float kc_round_to(uint32_t dtype, float v) {
    switch (dtype) {
    case KILN_DTYPE_F16: return __half2float(__float2half_rn(v));
    case KILN_DTYPE_BF16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return v;
    }
}

__device__ __forceinline__ int64_t kc_ld_i(const void *p, uint32_t dtype, int64_t i) {
    switch (dtype) {
    case KILN_DTYPE_I32: return ((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return kc_f2i64(kc_ld_f(p, dtype, i));
    }
}

__device__ __forceinline__ void kc_st_i(void *p, uint32_t dtype, int64_t i, int64_t v) {
    switch (dtype) {
    case KILN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: kc_st_f(p, dtype, i, (float)v); break;
    }
}

// --- GELU, the CPU reference's two forms (exact erf; tanh approximation)

__device__ __forceinline__ float kc_gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

__device__ __forceinline__ float kc_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// The op a small-M linear kernel (the GEMV, the wgmma linear) fuses after the bias: v through
// epilogue epi (KILN_CUDA_WG_EPI_*, cuda_wg.h); res: the residual, of the output's shape, read at
// element i.
template <typename T>
__device__ __forceinline__ float kc_linear_epilogue(float v, int epi, const T *res, int64_t i) {
    switch (epi) {
    case KILN_CUDA_WG_EPI_RELU: return v < 0.0f ? 0.0f : v;
    case KILN_CUDA_WG_EPI_GELU_ERF: return kc_gelu_erf(v);
    case KILN_CUDA_WG_EPI_GELU_TANH: return kc_gelu_tanh(v);
    case KILN_CUDA_WG_EPI_RESIDUAL: return v + kc_to_f(res[i]);
    default: return v;
    }
}

// --- warp and block reductions (blockDim.x a multiple of 32, at most 1024)

__device__ __forceinline__ float kc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the result. `shared` holds 32 floats; the call ends
// with a barrier so that `shared` may be reused right after.
__device__ __forceinline__ float kc_block_sum(float v, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = kc_warp_sum(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : 0.0f;
    v = kc_warp_sum(v);
    __syncthreads();
    return v;
}

__device__ __forceinline__ float kc_block_max(float v, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = kc_warp_max(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : -INFINITY;
    v = kc_warp_max(v);
    __syncthreads();
    return v;
}

// --- programmatic dependent launch (sm_90)

// The chains of small kernels (elementwise ops, a decode step's rotary, attention and merge)
// cost a launch and ramp each. A kernel launched through kc_launch may start while the kernel
// before it on the stream still runs (programmatic stream serialization, with cuda.pdl): it must
// call kc_pdl_enter() before it touches global memory; that waits until the previous grid has
// finished and its writes are visible (griddepcontrol.wait), then lets the next kernel launch
// early. Without the launch attribute both instructions return at once.
__device__ __forceinline__ void kc_pdl_enter() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
}

// kernel<<<grid, block, smem, ctx->stream>>>(args...) with programmatic stream serialization
// where the policy allows it; the launch's error is left for kiln_cuda_check_launch.
template <typename... KArgs, typename... Args>
static inline cudaError_t kc_launch(const kiln_cuda_ctx *ctx, void (*kernel)(KArgs...), dim3 grid,
                                    dim3 block, size_t smem, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = ctx->policy->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

// --- host helpers

// Blocks for a grid-stride loop over n items (n > 0).
static inline unsigned kc_blocks(int64_t n, int block) {
    int64_t b = (n + block - 1) / block;
    const int64_t cap = 65536; // enough to fill the device; the loop covers the rest
    return (unsigned)(b < cap ? b : cap);
}

static inline int64_t kc_numel(const kiln_tensor *t) {
    int64_t n = 1;
    for (uint32_t i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

// Row-major element strides of t.
static inline void kc_strides(const kiln_tensor *t, int64_t *strides) {
    int64_t s = 1;
    for (uint32_t i = t->rank; i-- > 0;) {
        strides[i] = s;
        s *= t->dims[i];
    }
}

// Strides of t broadcast (numpy rules, right-aligned) to an `rank`-dim shape: a missing or
// size-1 dimension gets stride 0.
static inline void kc_bcast_strides(const kiln_tensor *t, uint32_t rank, int64_t *strides) {
    int64_t ts[KC_MAX_RANK];
    kc_strides(t, ts);
    for (uint32_t d = 0; d < rank; d++) {
        int id = (int)d - (int)(rank - t->rank);
        strides[d] = (id < 0 || t->dims[id] == 1) ? 0 : ts[id];
    }
}

// Normalizes a possibly negative dim; -1 when out of range.
static inline int kc_norm_dim(int64_t dim, uint32_t rank) {
    if (dim < 0) dim += rank;
    return dim >= 0 && dim < (int64_t)rank ? (int)dim : -1;
}

#endif // KILN_CUDA_CUDA_COMMON_CUH
