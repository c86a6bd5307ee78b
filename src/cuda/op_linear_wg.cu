// SPDX-License-Identifier: Apache-2.0
// Small-M linear on Hopper (sm_90a): y[m, n] = x[m, k] w[n, k]^T (+ bias, + one fused epilogue
// op) for float16/bfloat16 at 8 < M <= 256, where cuBLASLt's tiles leave most SMs idle or split
// K through a second kernel. The weight is streamed once by the Tensor Memory Accelerator (TMA,
// cp.async.bulk.tensor) into a ring of shared-memory stages; one warpgroup multiplies each stage
// with warpgroup MMAs (wgmma m64nBNk16, operands read from shared memory in the 128-byte swizzle
// TMA writes, float32 accumulators in registers).
//
// Work split: a CTA owns a 64-row x BN-column output tile (BN 64 or 128) and a 1/S share of K.
// The S CTAs of one tile form a thread-block cluster: after the main loop each writes its
// partial tile to its own shared memory, and each then finishes 64/S rows of the tile by
// reading its peers' partial sums through distributed shared memory, adding the bias, applying
// the epilogue (ReLU, GELU erf or tanh, or a residual of the output's shape) in float32 and
// storing the result once. No second kernel, no global workspace, no atomics.
//
// Programmatic dependent launch: the first stages' weight tiles (constant for the engine's life)
// are requested before griddepcontrol.wait, so the weight stream starts while the previous
// kernel finishes; x (written by that kernel) is loaded only after the wait.
//
// The host side (kiln_cuda_wg_*, cuda_wg.h) lists the (BN, S) configurations that fit one wave,
// encodes the tensor maps (cuTensorMapEncodeTiled, reached through the runtime's driver entry
// point: the plugin links no libcuda) and launches with the cluster and PDL attributes. Which
// configuration runs a layer, or cuBLASLt instead, is decided by timing at context creation
// (op_gemm.cu). This file is compiled for sm_90a only (cmake/kiln_cuda.cmake); the compute_90
// PTX carries an empty kernel, and the host never chooses this path on another architecture.
#include <cooperative_groups.h>
#include <cuda.h>
#include <string.h>

#include <type_traits>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_wg.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_DEVICE 1
#else
#define WG_DEVICE 0
#endif

#define WG_BM 64         // output rows per CTA: one warpgroup MMA's height
#define WG_BK 64         // K per stage: 128 bytes per row, the 128-byte swizzle's width
#define WG_CONSUMERS 128 // warps 0-3: the warpgroup that runs the MMAs
#define WG_PRODUCER 32   // + warp 4: the producer that issues the TMA copies
#define WG_MAX_SPLIT 8   // K shares of one tile: the largest portable cluster

// OCC: CTAs per SM. 1: the deepest ring that fits (192 KiB); 2: half of it each, so that
// clusters of 4 or 8 CTAs find room on GPCs whose SM count is not a multiple of the cluster's.
template <int BN, int OCC> struct wg_shape {
    static constexpr int STAGES = (BN == 128 ? 8 : 12) / OCC;
    static constexpr int X_BYTES = WG_BM * WG_BK * 2;
    static constexpr int W_BYTES = BN * WG_BK * 2;
    static constexpr int STAGE_BYTES = X_BYTES + W_BYTES;
    static constexpr int LDR = BN + 4; // row stride (floats) of the partial tile
    static constexpr int RED_BYTES = WG_BM * LDR * 4;
    static constexpr int RING = STAGES * STAGE_BYTES;
    // + 1024: the dynamic shared memory is aligned up to the swizzle's 1024-byte period
    static constexpr int SMEM = (RING > RED_BYTES ? RING : RED_BYTES) + 1024;
    // + helper warps that wait through the main loop and share the epilogue: after the main
    // loop the CTA is latency-bound (float32 sums from the peers, the erf, the stores), and
    // more warps per SM hide it (H200, the MLP b64's layers: 0.1-2.2 us per configuration,
    // docs/benchmarks.md round 18; two extra warpgroups at two CTAs per SM exceed the register
    // file)
    static constexpr int THREADS = WG_CONSUMERS + WG_PRODUCER + (OCC == 1 ? 256 : 128);
};

// --- PTX helpers (sm_90a)

#if WG_DEVICE
__device__ __forceinline__ uint32_t wg_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void wg_bar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(wg_smem(bar)));
}

__device__ __forceinline__ void wg_bar_expect(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(wg_smem(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void wg_bar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(done)
                     : "r"(wg_smem(bar)), "r"(parity)
                     : "memory");
    }
}

// One arrival on bar (the stage's consumers release it).
__device__ __forceinline__ void wg_bar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(wg_smem(bar)) : "memory");
}

__device__ __forceinline__ void wg_bar_init_n(uint64_t *bar, uint32_t n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(wg_smem(bar)), "r"(n));
}

// One box of a 2-D tensor map (coordinates: element column c0, row r0) into shared memory,
// completing on bar.
__device__ __forceinline__ void wg_tma(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                       int r0) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(wg_smem(dst)),
                 "l"((uint64_t)(uintptr_t)map), "r"(c0), "r"(r0), "r"(wg_smem(bar))
                 : "memory");
}

// The same under L2 cache policy cp.
__device__ __forceinline__ void wg_tma_hint(void *dst, const CUtensorMap *map, uint64_t *bar,
                                            int c0, int r0, uint64_t cp) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(wg_smem(dst)),
                 "l"((uint64_t)(uintptr_t)map), "r"(c0), "r"(r0), "r"(wg_smem(bar)), "l"(cp)
                 : "memory");
}

// A weight tile's load: plain (keep_rows < 0), or evict-last for the weight rows the engine's L2
// plan keeps (rows below keep_rows: cached from one execute to the next) and evict-first for the
// rest (streamed once, pushing out neither the kept rows nor the activations).
__device__ __forceinline__ void wg_tma_w(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                         int r0, int keep_rows) {
    if (keep_rows < 0) {
        wg_tma(dst, map, bar, c0, r0);
        return;
    }
    uint64_t cp;
    if (r0 < keep_rows) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(cp));
    } else {
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(cp));
    }
    wg_tma_hint(dst, map, bar, c0, r0, cp);
}

// The wgmma descriptor of a K-major tile in shared memory written by TMA with the 128-byte
// swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart (stride byte offset), the leading
// byte offset unused (1), layout type 1 (128B swizzle) in bits 62-63. The tile base is
// 1024-byte aligned; a 16-element K step inside the 64-element row adds 32 bytes (2 units).
__device__ __forceinline__ uint64_t wg_desc(const void *tile) {
    return (uint64_t)((wg_smem(tile) & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_wait0(void) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void wg_wait1(void) {
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}

// The warpgroup MMAs: d (the thread's BN / 2 float32 accumulators) += A (64 x 16, descriptor
// da) * B (16 x BN, descriptor db), both K-major in shared memory (no transpose), scale 1.
#define WG_ACC4(i) "+f"(d[i]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define WG_ACC16(i) WG_ACC4(i), WG_ACC4((i) + 4), WG_ACC4((i) + 8), WG_ACC4((i) + 12)
#define WG_ACC32 WG_ACC16(0), WG_ACC16(16)
#define WG_ACC64 WG_ACC32, WG_ACC16(32), WG_ACC16(48)
#define WG_REGS32                                                                                  \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "   \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64                                                                                  \
    WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
              "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_MMA(name, n, ty, regs, descs, acc)                                                      \
    __device__ __forceinline__ void name(float *d, uint64_t da, uint64_t db) {                     \
        asm volatile("{\n"                                                                         \
                     "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." ty "." ty " {" regs         \
                     "}, " descs ", 1, 1, 1, 0, 0;\n"                                              \
                     "}\n"                                                                         \
                     : acc                                                                         \
                     : "l"(da), "l"(db));                                                          \
    }
WG_MMA(wg_mma_n64_f16, 64, "f16", WG_REGS32, "%32, %33", WG_ACC32)
WG_MMA(wg_mma_n64_bf16, 64, "bf16", WG_REGS32, "%32, %33", WG_ACC32)
WG_MMA(wg_mma_n128_f16, 128, "f16", WG_REGS64, "%64, %65", WG_ACC64)
WG_MMA(wg_mma_n128_bf16, 128, "bf16", WG_REGS64, "%64, %65", WG_ACC64)

// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
template <int N> __device__ __forceinline__ void wg_fence_acc(float *acc) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(acc[i])::"memory");
}

// The MMA of a stage's 16-wide K step for dtype T and BN columns.
template <typename T, int BN>
__device__ __forceinline__ void wg_mma(float *d, uint64_t a, uint64_t b) {
    constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
    if constexpr (BN == 128) {
        bf ? wg_mma_n128_bf16(d, a, b) : wg_mma_n128_f16(d, a, b);
    } else {
        bf ? wg_mma_n64_bf16(d, a, b) : wg_mma_n64_f16(d, a, b);
    }
}
#endif // WG_DEVICE

// grid (S, ceil(n / BN), ceil(m / 64)), cluster (S, 1, 1), wg_shape<BN, OCC>::THREADS threads,
// wg_shape<BN, OCC>::SMEM bytes of dynamic shared memory. ksteps = ceil(k / 64), per = ceil(ksteps
// / S): this CTA's K steps are [S_rank * per, min(+per, ksteps)). TMA fills what lies outside x or
// w (rows past m or n, K past k) with zeros. Warp specialization: warp 4's lane 0 keeps the ring
// full (a stage is refilled once its `empty` barrier has the four consumer warps' arrivals); warps
// 0-3 wait on each stage's `full` barrier, issue its four MMAs and, keeping one MMA group in flight
// (wait_group 1), release the stage before it. No CTA-wide barrier inside the main loop. The
// helper warps (5 and up) wait at the barrier after it and share the epilogue.
template <typename T, int BN, int OCC>
static __global__ void __launch_bounds__(wg_shape<BN, OCC>::THREADS, OCC)
    wg_linear_kernel(const __grid_constant__ CUtensorMap wmap,
                     const __grid_constant__ CUtensorMap xmap, const T *__restrict__ bias,
                     const T *__restrict__ res, T *__restrict__ y, int m, int n, int ksteps,
                     int per, int epi, int keep_rows) {
#if WG_DEVICE
    typedef wg_shape<BN, OCC> S;
    namespace cg = cooperative_groups;
    extern __shared__ uint8_t wg_raw[];
    __shared__ __align__(8) uint64_t full[S::STAGES], empty[S::STAGES];
    uint8_t *base = (uint8_t *)(((uintptr_t)wg_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x;
    const int split = blockIdx.x, nsplit = gridDim.x;
    const int n0 = blockIdx.y * BN, m0 = blockIdx.z * WG_BM;
    const int kb = split * per;
    const int ke = kb + per < ksteps ? kb + per : ksteps;
    const int steps = ke > kb ? ke - kb : 0;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < S::STAGES; s++) {
            wg_bar_init(&full[s]);
            wg_bar_init_n(&empty[s], WG_CONSUMERS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    if (tid == WG_CONSUMERS) {
        // the producer; the weight is constant: the first stages' weight tiles are requested
        // before the previous kernel ends, x (its output) only after griddepcontrol.wait
        const int pro = steps < S::STAGES ? steps : S::STAGES;
        for (int s = 0; s < pro; s++) {
            wg_bar_expect(&full[s], S::STAGE_BYTES);
            wg_tma_w(base + s * S::STAGE_BYTES + S::X_BYTES, &wmap, &full[s], (kb + s) * WG_BK, n0,
                     keep_rows);
        }
        asm volatile("griddepcontrol.wait;" ::: "memory");
        for (int s = 0; s < pro; s++)
            wg_tma(base + s * S::STAGE_BYTES, &xmap, &full[s], (kb + s) * WG_BK, m0);
        for (int i = S::STAGES; i < steps; i++) {
            const int s = i % S::STAGES;
            wg_bar_wait(&empty[s], (uint32_t)(i / S::STAGES - 1) & 1u);
            uint8_t *sx = base + s * S::STAGE_BYTES;
            const int kc = (kb + i) * WG_BK;
            wg_bar_expect(&full[s], S::STAGE_BYTES);
            wg_tma_w(sx + S::X_BYTES, &wmap, &full[s], kc, n0, keep_rows);
            wg_tma(sx, &xmap, &full[s], kc, m0);
        }
    } else if (tid < WG_CONSUMERS) {
        asm volatile("griddepcontrol.wait;" ::: "memory"); // (the residual is read below)
        for (int i = 0; i < steps; i++) {
            const int s = i % S::STAGES;
            wg_bar_wait(&full[s], (uint32_t)(i / S::STAGES) & 1u);
            uint8_t *sx = base + s * S::STAGE_BYTES, *sw = sx + S::X_BYTES;
            const uint64_t da = wg_desc(sx), db = wg_desc(sw);
            wg_fence_acc<BN / 2>(acc);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; kk++) wg_mma<T, BN>(acc, da + 2 * kk, db + 2 * kk);
            wg_commit();
            wg_wait1(); // step i - 1's MMAs are done: its stage can be refilled
            wg_fence_acc<BN / 2>(acc);
            if (i > 0 && (tid & 31) == 0) wg_bar_arrive(&empty[(i - 1) % S::STAGES]);
        }
        wg_wait0();
        wg_fence_acc<BN / 2>(acc);
    } else {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    __syncthreads(); // the ring is drained: every copy has landed and every MMA has read it
    asm volatile("griddepcontrol.launch_dependents;");
    // Each CTA's partial tile, row-major with stride LDR over its own (drained) ring, read by
    // the cluster's peers through distributed shared memory. Thread layout of the m64nBN
    // accumulators: warp w, lane l holds rows 16w + l/4 (+8) and columns 8j + 2(l%4) (+1).
    float *red = (float *)base;
    constexpr int ld = S::LDR;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (tid < WG_CONSUMERS) {
        const int warp = tid >> 5, lane = tid & 31;
        const int r = warp * 16 + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            *(float2 *)&red[r * ld + 8 * j + c] = make_float2(acc[4 * j], acc[4 * j + 1]);
            *(float2 *)&red[(r + 8) * ld + 8 * j + c] = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
        }
    }
    cg::cluster_group cluster = cg::this_cluster();
    if (nsplit > 1) {
        cluster.sync();
    } else {
        __syncthreads();
    }
    // This CTA finishes rows [split * rows, +rows) of the tile from every peer's partial sums.
    const int rows = WG_BM / nsplit;
    const float *peer[WG_MAX_SPLIT];
#pragma unroll
    for (int q = 0; q < WG_MAX_SPLIT; q++) {
        peer[q] = q < nsplit && nsplit > 1 ? cluster.map_shared_rank(red, q) : red;
    }
    constexpr int V = BN / 4; // float4 per row
    const bool vec = (n & 3) == 0;
    for (int e = tid; e < rows * V; e += S::THREADS) { // (the producer and helper warps help)
        const int r = split * rows + e / V, c = (e % V) * 4;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int q = 0; q < WG_MAX_SPLIT; q++) {
            if (q < nsplit) {
                const float4 v = *(const float4 *)&peer[q][r * ld + c];
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
        }
        const int row = m0 + r, col = n0 + c;
        if (row >= m || col >= n) continue;
        float o[4] = {sum.x, sum.y, sum.z, sum.w};
        const int64_t at = (int64_t)row * n + col;
        if (vec) { // col + 3 < n: n and col are multiples of 4
            T out[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float v = o[j] + (bias != NULL ? kc_to_f(bias[col + j]) : 0.0f);
                out[j] = kc_from_f<T>(kc_linear_epilogue<T>(v, epi, res, at + j));
            }
            *(uint2 *)&y[at] = *(const uint2 *)out;
        } else {
            for (int j = 0; j < 4 && col + j < n; j++) {
                float v = o[j] + (bias != NULL ? kc_to_f(bias[col + j]) : 0.0f);
                y[at + j] = kc_from_f<T>(kc_linear_epilogue<T>(v, epi, res, at + j));
            }
        }
    }
    if (nsplit > 1) cluster.sync(); // the peers may still be reading this CTA's partial sums
#else
    (void)wmap;
    (void)xmap;
    (void)bias;
    (void)res;
    (void)y;
    (void)m;
    (void)n;
    (void)ksteps;
    (void)per;
    (void)epi;
    (void)keep_rows;
#endif
}

// --- host side

typedef CUresult (*wg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                 const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                 const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static wg_encode_fn wg_encoder(void) {
    static wg_encode_fn fn = [] {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            p = NULL;
        }
        return (wg_encode_fn)p;
    }();
    return fn;
}

template <typename T, int BN, int OCC> static cudaError_t wg_attr(void) {
    cudaError_t e =
        cudaFuncSetAttribute(wg_linear_kernel<T, BN, OCC>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, wg_shape<BN, OCC>::SMEM);
    if (e == cudaSuccess) {
        e = cudaFuncSetAttribute(wg_linear_kernel<T, BN, OCC>,
                                 cudaFuncAttributeNonPortableClusterSizeAllowed, 0);
    }
    return e;
}

template <typename T> static cudaError_t wg_attrs(void) {
    cudaError_t e = wg_attr<T, 64, 1>();
    if (e == cudaSuccess) e = wg_attr<T, 64, 2>();
    if (e == cudaSuccess) e = wg_attr<T, 128, 1>();
    if (e == cudaSuccess) e = wg_attr<T, 128, 2>();
    return e;
}

extern "C" int kiln_cuda_wg_init(int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (major != 9 || minor != 0 || wg_encoder() == NULL) return 0; // sm_90a code only
    cudaError_t e = wg_attrs<__half>();
    if (e == cudaSuccess) e = wg_attrs<__nv_bfloat16>();
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return 1;
}

// The launch of kernel<T, BN, OCC> for cfg (grid, block, shared memory, cluster and PDL
// attributes; at holds 2).
template <int BN, int OCC>
static void wg_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, int64_t m, int64_t n,
                      int split, int pdl) {
    unsigned na = 0;
    *cfg = cudaLaunchConfig_t{};
    at[0] = cudaLaunchAttribute{};
    at[1] = cudaLaunchAttribute{};
    cfg->gridDim =
        dim3((unsigned)split, (unsigned)((n + BN - 1) / BN), (unsigned)((m + WG_BM - 1) / WG_BM));
    cfg->blockDim = dim3(wg_shape<BN, OCC>::THREADS);
    cfg->dynamicSmemBytes = wg_shape<BN, OCC>::SMEM;
    if (split > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = (unsigned)split;
        at[na].val.clusterDim.y = 1;
        at[na].val.clusterDim.z = 1;
        na++;
    }
    if (pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg->attrs = at;
    cfg->numAttrs = na;
}

// How many clusters of `split` CTAs fit on the device at once (one wave), or -1 when the query
// fails.
template <int BN, int OCC> static int wg_max_clusters(int split) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    int num = -1;
    wg_config<BN, OCC>(&cfg, at, WG_BM, BN, split, 0);
    if (cudaOccupancyMaxActiveClusters(&num, wg_linear_kernel<__half, BN, OCC>, &cfg) !=
        cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return num;
}

static int wg_max_clusters_of(kiln_cuda_wg_cfg c) {
    if (c.bn == 128)
        return c.occ == 2 ? wg_max_clusters<128, 2>(c.split) : wg_max_clusters<128, 1>(c.split);
    return c.occ == 2 ? wg_max_clusters<64, 2>(c.split) : wg_max_clusters<64, 1>(c.split);
}

extern "C" int kiln_cuda_wg_configs(int64_t m, int64_t n, int64_t k, int sm_count,
                                    kiln_cuda_wg_cfg *out, int max) {
    static const int bns[2] = {128, 64};
    static const int splits[4] = {1, 2, 4, 8};
    const int64_t ksteps = (k + WG_BK - 1) / WG_BK, mt = (m + WG_BM - 1) / WG_BM;
    const int64_t sms = sm_count > 0 ? sm_count : 132;
    int got = 0;
    for (int occ = 1; occ <= 2; occ++) {
        for (int b = 0; b < 2; b++) {
            const int64_t tiles = mt * ((n + bns[b] - 1) / bns[b]);
            for (int s = 0; s < 4 && got < max; s++) {
                const int sp = splits[s];
                kiln_cuda_wg_cfg c = {bns[b], sp, occ};
                if (sp > 1 && (sp > ksteps || tiles * sp > sms * occ)) continue;
                // K shares that leave the last CTA empty waste a cluster slot
                const int64_t per = (ksteps + sp - 1) / sp;
                if (sp > 1 && per * (sp - 1) >= ksteps) continue;
                if (sp == 1 && (tiles > 4 * sms || (occ == 2 && tiles <= sms))) continue;
                // every cluster resident at once (GPCs of uneven size hold fewer than sms / sp)
                if (sp > 1 && tiles > wg_max_clusters_of(c)) continue;
                out[got++] = c;
            }
        }
    }
    return got;
}

// A 2-D row-major [rows, k] tensor's map with a [box_rows, 64] box and the 128-byte swizzle.
static int wg_encode(unsigned char *map, const void *p, uint32_t dtype, int64_t rows, int64_t k,
                     int box_rows) {
    wg_encode_fn enc = wg_encoder();
    if (enc == NULL) return 0;
    alignas(64) CUtensorMap tm;
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {WG_BK, (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = enc(&tm,
                     dtype == KILN_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                     2, (void *)p, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return 0;
    memcpy(map, &tm, sizeof tm);
    return 1;
}

extern "C" int kiln_cuda_wg_maps(kiln_cuda_wg_maps_t *maps, const kiln_cuda_wg_problem *p,
                                 kiln_cuda_wg_cfg cfg) {
    if (maps->w != p->w || maps->bn != cfg.bn || maps->n != p->n || maps->k != p->k ||
        maps->dtype != p->dtype) {
        maps->w = NULL;
        if (!wg_encode(maps->wmap, p->w, p->dtype, p->n, p->k, cfg.bn)) return 0;
        maps->w = p->w;
        maps->bn = cfg.bn;
        maps->n = p->n;
        maps->k = p->k;
        maps->dtype = p->dtype;
    }
    if (maps->x != p->x || maps->m != p->m || maps->xk != p->k || maps->xdtype != p->dtype) {
        maps->x = NULL;
        if (!wg_encode(maps->xmap, p->x, p->dtype, p->m, p->k, WG_BM)) return 0;
        maps->x = p->x;
        maps->m = p->m;
        maps->xk = p->k;
        maps->xdtype = p->dtype;
    }
    return 1;
}

template <typename T, int BN, int OCC>
static cudaError_t wg_start(cudaStream_t stream, const kiln_cuda_wg_maps_t *maps,
                            const kiln_cuda_wg_problem *p, int split, int pdl) {
    alignas(64) CUtensorMap wm, xm;
    memcpy(&wm, maps->wmap, sizeof wm);
    memcpy(&xm, maps->xmap, sizeof xm);
    const int ksteps = (int)((p->k + WG_BK - 1) / WG_BK);
    const int per = (ksteps + split - 1) / split;
    const int keep_rows =
        p->keep < 0 ? -1 : (int)(p->keep / (p->k * 2) < p->n ? p->keep / (p->k * 2) : p->n);
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    wg_config<BN, OCC>(&cfg, at, p->m, p->n, split, pdl);
    cfg.stream = stream;
    return cudaLaunchKernelEx(&cfg, wg_linear_kernel<T, BN, OCC>, wm, xm, (const T *)p->bias,
                              (const T *)p->res, (T *)p->y, (int)p->m, (int)p->n, ksteps, per,
                              p->epi, keep_rows);
}

template <typename T>
static cudaError_t wg_start_t(cudaStream_t stream, const kiln_cuda_wg_maps_t *maps,
                              const kiln_cuda_wg_problem *p, kiln_cuda_wg_cfg c, int pdl) {
    if (c.bn == 128) {
        return c.occ == 2 ? wg_start<T, 128, 2>(stream, maps, p, c.split, pdl)
                          : wg_start<T, 128, 1>(stream, maps, p, c.split, pdl);
    }
    return c.occ == 2 ? wg_start<T, 64, 2>(stream, maps, p, c.split, pdl)
                      : wg_start<T, 64, 1>(stream, maps, p, c.split, pdl);
}

extern "C" cudaError_t kiln_cuda_wg_launch(cudaStream_t stream, const kiln_cuda_wg_maps_t *maps,
                                           const kiln_cuda_wg_problem *p, kiln_cuda_wg_cfg cfg,
                                           int pdl) {
    if (p->dtype == KILN_DTYPE_BF16) return wg_start_t<__nv_bfloat16>(stream, maps, p, cfg, pdl);
    return wg_start_t<__half>(stream, maps, p, cfg, pdl);
}
