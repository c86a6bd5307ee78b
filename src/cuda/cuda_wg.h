// SPDX-License-Identifier: Apache-2.0
// Kiln's small-M linear for Hopper (op_linear_wg.cu, sm_90a: TMA + warpgroup MMAs, K split over
// a thread-block cluster reduced through distributed shared memory). C-callable: op_gemm.cu
// decides per layer, by timing at context creation, whether it or cuBLASLt runs a linear.
#ifndef KILN_CUDA_CUDA_WG_H
#define KILN_CUDA_CUDA_WG_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Rows it takes: more than the GEMV's (KILN_CUDA_GEMV_MAX_M), at most this many.
#define KILN_CUDA_WG_MAX_M 256

// The epilogue op fused after the bias (the GEMV's set).
enum {
    KILN_CUDA_WG_EPI_NONE = 0,
    KILN_CUDA_WG_EPI_RELU,
    KILN_CUDA_WG_EPI_GELU_ERF,
    KILN_CUDA_WG_EPI_GELU_TANH,
    KILN_CUDA_WG_EPI_RESIDUAL
};

// One configuration: BN output columns per CTA (64 or 128), K split over `split` CTAs (1, 2, 4
// or 8: the cluster), occ CTAs per SM (1: a ring of stages of 192 KiB; 2: half of it each).
typedef struct kiln_cuda_wg_cfg {
    int bn, split, occ;
} kiln_cuda_wg_cfg;

// y[m, n] = epi(x[m, k] w[n, k]^T + bias[n]) (res: the residual, of y's shape), one float16 or
// bfloat16 dtype, x and w 16-byte aligned, k % 8 == 0, rows dense. keep: the bytes at the start
// of w the engine's L2 plan keeps in L2 (loaded evict-last, the rest evict-first; cuda_layout.h),
// -1: no cache hints.
typedef struct kiln_cuda_wg_problem {
    uint32_t dtype;
    int64_t m, n, k;
    const void *x, *w, *bias, *res;
    void *y;
    int epi;
    int64_t keep;
} kiln_cuda_wg_problem;

// The TMA descriptors (CUtensorMap, 128 bytes each) of a layer's weight and input, re-encoded
// only when the pointer, sizes or the weight's box (bn) change.
typedef struct kiln_cuda_wg_maps_t {
    unsigned char wmap[128], xmap[128];
    const void *w, *x;
    int64_t n, k, m, xk;
    uint32_t dtype, xdtype;
    int bn;
} kiln_cuda_wg_maps_t;

// 1 when the kernels can run on `device` (compute capability 9.0, the driver's tensor-map
// encoder found, shared-memory limits raised); call before any launch or capture on it.
int kiln_cuda_wg_init(int device);
// The configurations worth timing for m x n x k on sm_count SMs (at most max), best guess first.
int kiln_cuda_wg_configs(int64_t m, int64_t n, int64_t k, int sm_count, kiln_cuda_wg_cfg *out,
                         int max);
// Encodes maps for p under cfg as needed; 0 when the driver refuses (then cuBLASLt).
int kiln_cuda_wg_maps(kiln_cuda_wg_maps_t *maps, const kiln_cuda_wg_problem *p,
                      kiln_cuda_wg_cfg cfg);
// Enqueues the kernel (pdl: programmatic dependent launch).
cudaError_t kiln_cuda_wg_launch(cudaStream_t stream, const kiln_cuda_wg_maps_t *maps,
                                const kiln_cuda_wg_problem *p, kiln_cuda_wg_cfg cfg, int pdl);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_WG_H
