// SPDX-License-Identifier: Apache-2.0
// Kiln's own tiled GEMM core, shared by the GEMM fallback (op_gemm.cu) and the implicit-GEMM
// convolutions (op_conv.cu): C[i][j] = sum_k A(i, k) B(k, j) over a 64 x 64 block tile, 16 deep,
// 256 threads each owning a 4 x 4 strided micro-tile (rows ty + 16a, columns tx + 16b), float32
// accumulation. Operands come through a loader (A(i, k) and B(k, j) as float, any layout:
// im2col gathers included); out-of-range elements read as zero. Correctness first: no tensor
// cores, no double buffering.
#ifndef KILN_CUDA_TILED_GEMM_CUH
#define KILN_CUDA_TILED_GEMM_CUH

#include "cuda/cuda_common.cuh"

#define TG_BM 64
#define TG_BN 64
#define TG_BK 16
#define TG_THREADS 256

// Loader requirements:
//   __device__ float a(int64_t batch, int64_t i, int64_t k) const;   // i < M, k < K
//   __device__ float b(int64_t batch, int64_t k, int64_t j) const;   // k < K, j < N
//   static constexpr bool b_k_fast;  // B is contiguous along k (load it k-fastest)
//   __device__ void store(int64_t batch, int64_t i, int64_t j, float acc) const;
template <typename L>
static __global__ void __launch_bounds__(TG_THREADS)
    tiled_gemm_kernel(const L ld, int64_t m, int64_t n, int64_t k, int64_t batch) {
    __shared__ float as[TG_BK][TG_BM + 1];
    __shared__ float bs[TG_BK][TG_BN + 1];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    for (int64_t bt = blockIdx.z; bt < batch; bt += gridDim.z) {
        for (int64_t m0 = (int64_t)blockIdx.y * TG_BM; m0 < m; m0 += (int64_t)gridDim.y * TG_BM) {
            for (int64_t n0 = (int64_t)blockIdx.x * TG_BN; n0 < n;
                 n0 += (int64_t)gridDim.x * TG_BN) {
                float acc[4][4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
#pragma unroll
                    for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
                }
                for (int64_t k0 = 0; k0 < k; k0 += TG_BK) {
                    // A tile: k fastest across threads.
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int kk = t % TG_BK, ii = t / TG_BK + 16 * r;
                        int64_t gi = m0 + ii, gk = k0 + kk;
                        as[kk][ii] = (gi < m && gk < k) ? ld.a(bt, gi, gk) : 0.0f;
                    }
                    // B tile.
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int kk, jj;
                        if (L::b_k_fast) {
                            kk = t % TG_BK;
                            jj = t / TG_BK + 16 * r;
                        } else {
                            jj = t % TG_BN;
                            kk = t / TG_BN + 4 * r;
                        }
                        int64_t gk = k0 + kk, gj = n0 + jj;
                        bs[kk][jj] = (gk < k && gj < n) ? ld.b(bt, gk, gj) : 0.0f;
                    }
                    __syncthreads();
#pragma unroll
                    for (int kk = 0; kk < TG_BK; kk++) {
                        float av[4], bv[4];
#pragma unroll
                        for (int a = 0; a < 4; a++) av[a] = as[kk][ty + 16 * a];
#pragma unroll
                        for (int b = 0; b < 4; b++) bv[b] = bs[kk][tx + 16 * b];
#pragma unroll
                        for (int a = 0; a < 4; a++) {
#pragma unroll
                            for (int b = 0; b < 4; b++) acc[a][b] = fmaf(av[a], bv[b], acc[a][b]);
                        }
                    }
                    __syncthreads();
                }
#pragma unroll
                for (int a = 0; a < 4; a++) {
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        int64_t gi = m0 + ty + 16 * a, gj = n0 + tx + 16 * b;
                        if (gi < m && gj < n) ld.store(bt, gi, gj, acc[a][b]);
                    }
                }
            }
        }
    }
}

// Grid for an m x n x batch problem (each dimension capped; the kernel loops over the rest).
static inline dim3 tg_grid(int64_t m, int64_t n, int64_t batch) {
    int64_t gx = (n + TG_BN - 1) / TG_BN, gy = (m + TG_BM - 1) / TG_BM;
    if (gx > 1048576) gx = 1048576;
    if (gy > 65535) gy = 65535;
    if (batch > 65535) batch = 65535;
    return dim3((unsigned)gx, (unsigned)gy, (unsigned)batch);
}

#endif // KILN_CUDA_TILED_GEMM_CUH
