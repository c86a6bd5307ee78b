// SPDX-License-Identifier: Apache-2.0
// sdpa's fp32-FMA kernels (attn_common.cuh), for every float dtype and head size: a fused
// flash-style kernel (online softmax, no L x S scores in memory) for E, Ev <= 256: a block of
// SDPA_WARPS warps, one query row per warp, walks K/V in tiles of 32 keys staged in shared
// memory; lane j scores key j of the tile, each lane accumulates its slice of the output row.
// Larger heads: a simple kernel, one block per query row, one key at a time.
#include "cuda/attn_common.cuh"

// --- fused kernel: EVT = values of the output row per lane (Ev <= 32 * EVT)

template <typename T, int EVT>
static __global__ void __launch_bounds__(SDPA_WARPS * 32)
    sdpa_flash_kernel(const __grid_constant__ sdpa_params P) {
    extern __shared__ float smem[];
    const int64_t ep = (P.e % 2 == 1) ? P.e : P.e + 1; // odd row stride: conflict-free scoring
    float *ks = smem;                                  // [SDPA_TK][ep]
    float *vs = ks + SDPA_TK * ep;                     // [SDPA_TK][ev]
    float *qs = vs + SDPA_TK * P.ev;                   // [SDPA_WARPS][e]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const T *q = (const T *)P.q, *k = (const T *)P.k, *v = (const T *)P.v;
    T *out = (T *)P.out;
    for (int64_t b = blockIdx.y; b < P.batch; b += gridDim.y) {
        const sdpa_offs bo = sdpa_offsets(P, b);
        const int64_t qo = bo.q, ko = bo.k, vo = bo.v, mo = bo.m, oo = bo.o;
        const int64_t row0 = (int64_t)blockIdx.x * SDPA_WARPS, row = row0 + warp;
        const bool active = row < P.l;
        __syncthreads(); // qs of the previous batch is no longer read
        if (active) {
            for (int64_t e = lane; e < P.e; e += 32) {
                qs[warp * P.e + e] = kc_to_f(q[qo + row * P.q_rs + e]);
            }
        }
        float acc[EVT];
#pragma unroll
        for (int t = 0; t < EVT; t++) acc[t] = 0.0f;
        float m = -INFINITY, lsum = 0.0f;
        int64_t s_end = P.s;
        if (P.causal) {
            int64_t last = row0 + SDPA_WARPS - 1; // keys past the block's last row are masked
            if (last + 1 < s_end) s_end = last + 1;
        }
        for (int64_t s0 = 0; s0 < s_end; s0 += SDPA_TK) {
            __syncthreads(); // the previous tile is consumed
            for (int64_t i = threadIdx.x; i < SDPA_TK * P.e; i += blockDim.x) {
                int64_t j = i / P.e, e = i % P.e, s = s0 + j;
                ks[j * ep + e] = s < P.s ? kc_to_f(k[ko + s * P.k_rs + e]) : 0.0f;
            }
            for (int64_t i = threadIdx.x; i < SDPA_TK * P.ev; i += blockDim.x) {
                int64_t j = i / P.ev, e = i % P.ev, s = s0 + j;
                vs[j * P.ev + e] = s < P.s ? kc_to_f(v[vo + s * P.v_rs + e]) : 0.0f;
            }
            __syncthreads();
            if (!active) continue;
            const int64_t s = s0 + lane;
            float score = -INFINITY;
            if (s < P.s) {
                float dot = 0.0f;
                const float *kr = ks + lane * ep, *qr = qs + warp * P.e;
                for (int64_t e = 0; e < P.e; e++) dot = fmaf(qr[e], kr[e], dot);
                score = sdpa_score(P, mo, row, s, dot);
            }
            float m_new = fmaxf(m, kc_warp_max(score));
            if (m_new == -INFINITY) continue; // every key so far masked (uniform in the warp)
            float p = expf(score - m_new);    // masked: exp(-inf) = 0
            float corr = expf(m - m_new);     // first live tile: exp(-inf) = 0
            lsum = lsum * corr + kc_warp_sum(p);
#pragma unroll
            for (int t = 0; t < EVT; t++) acc[t] *= corr;
            for (int j = 0; j < SDPA_TK; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                if (pj == 0.0f) continue; // uniform across the warp
                const float *vr = vs + j * P.ev;
#pragma unroll
                for (int t = 0; t < EVT; t++) {
                    int64_t d = lane + 32 * t;
                    if (d < P.ev) acc[t] = fmaf(pj, vr[d], acc[t]);
                }
            }
            m = m_new;
        }
        if (active) {
            float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
#pragma unroll
            for (int t = 0; t < EVT; t++) {
                int64_t d = lane + 32 * t;
                if (d < P.ev) out[oo + row * P.o_rs + d] = kc_from_f<T>(acc[t] * inv);
            }
        }
    }
}

// --- simple kernel: one block per (batch, query row), one key at a time

template <typename T>
static __global__ void sdpa_simple_kernel(const __grid_constant__ sdpa_params P) {
    extern __shared__ float smem[];
    __shared__ float red[32];
    float *qs = smem;        // [e]
    float *acc = smem + P.e; // [ev]
    const T *q = (const T *)P.q, *k = (const T *)P.k, *v = (const T *)P.v;
    T *out = (T *)P.out;
    for (int64_t r = blockIdx.x; r < P.batch * P.l; r += gridDim.x) {
        int64_t b = r / P.l, row = r % P.l;
        const int64_t qo = sdpa_boff(P, b, P.q_bstr), ko = sdpa_boff(P, b, P.k_bstr),
                      vo = sdpa_boff(P, b, P.v_bstr);
        const int64_t mo = P.mask ? sdpa_boff(P, b, P.m_bstr) : 0;
        __syncthreads();
        for (int64_t e = threadIdx.x; e < P.e; e += blockDim.x)
            qs[e] = kc_to_f(q[qo + row * P.q_rs + e]);
        for (int64_t d = threadIdx.x; d < P.ev; d += blockDim.x) acc[d] = 0.0f;
        __syncthreads();
        float m = -INFINITY, lsum = 0.0f;
        for (int64_t s = 0; s < P.s; s++) {
            float part = 0.0f;
            for (int64_t e = threadIdx.x; e < P.e; e += blockDim.x) {
                part = fmaf(qs[e], kc_to_f(k[ko + s * P.k_rs + e]), part);
            }
            float score = sdpa_score(P, mo, row, s, kc_block_sum(part, red));
            if (score == -INFINITY) continue;
            float m_new = fmaxf(m, score);
            float p = expf(score - m_new), corr = expf(m - m_new);
            lsum = lsum * corr + p;
            for (int64_t d = threadIdx.x; d < P.ev; d += blockDim.x) {
                acc[d] = acc[d] * corr + p * kc_to_f(v[vo + s * P.v_rs + d]);
            }
            m = m_new;
        }
        float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        for (int64_t d = threadIdx.x; d < P.ev; d += blockDim.x) {
            out[sdpa_boff(P, b, P.o_bstr) + row * P.o_rs + d] = kc_from_f<T>(acc[d] * inv);
        }
    }
}

static size_t sdpa_flash_smem(int64_t e, int64_t ev) {
    int64_t ep = (e % 2 == 1) ? e : e + 1;
    return (size_t)(SDPA_TK * ep + SDPA_TK * ev + SDPA_WARPS * e) * sizeof(float);
}

template <typename T, int EVT>
static kiln_status sdpa_flash_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    size_t smem = sdpa_flash_smem(P->e, P->ev);
    int64_t by = P->batch < 65535 ? P->batch : 65535;
    dim3 grid((unsigned)((P->l + SDPA_WARPS - 1) / SDPA_WARPS), (unsigned)by);
    sdpa_flash_kernel<T, EVT><<<grid, SDPA_WARPS * 32, smem, ctx->stream>>>(*P);
    return kiln_cuda_check_launch(ctx, "sdpa_flash_kernel");
}

template <typename T>
static kiln_status sdpa_fma_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if (P->e <= SDPA_MAX_HEAD && P->ev <= SDPA_MAX_HEAD && P->e > 0) {
        if (P->ev <= 64) return sdpa_flash_launch<T, 2>(ctx, P);
        if (P->ev <= 128) return sdpa_flash_launch<T, 4>(ctx, P);
        return sdpa_flash_launch<T, 8>(ctx, P);
    }
    size_t smem = (size_t)(P->e + P->ev) * sizeof(float);
    if (smem > 48 * 1024) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda sdpa: head sizes E = %lld, Ev = %lld are too large (E + Ev "
                              "must be at most 12288) at %s",
                              (long long)P->e, (long long)P->ev, ctx->where ? ctx->where : "?");
    }
    int64_t rows = P->batch * P->l;
    unsigned blocks = (unsigned)(rows < 1048576 ? rows : 1048576);
    sdpa_simple_kernel<T><<<blocks, SDPA_SIMPLE_BLOCK, smem, ctx->stream>>>(*P);
    return kiln_cuda_check_launch(ctx, "sdpa_simple_kernel");
}

kiln_status kiln_cuda_sdpa_fma(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F32: return sdpa_fma_launch<float>(ctx, P);
    case KILN_DTYPE_F16: return sdpa_fma_launch<__half>(ctx, P);
    default: return sdpa_fma_launch<__nv_bfloat16>(ctx, P);
    }
}

template <typename T> static cudaError_t sdpa_fma_init_type(void) {
    int max = (int)sdpa_flash_smem(SDPA_MAX_HEAD, SDPA_MAX_HEAD);
    cudaError_t e = cudaFuncSetAttribute(sdpa_flash_kernel<T, 2>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, max);
    if (e == cudaSuccess) {
        e = cudaFuncSetAttribute(sdpa_flash_kernel<T, 4>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, max);
    }
    if (e == cudaSuccess) {
        e = cudaFuncSetAttribute(sdpa_flash_kernel<T, 8>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, max);
    }
    return e;
}

cudaError_t kiln_cuda_sdpa_fma_init(void) {
    cudaError_t e = sdpa_fma_init_type<float>();
    if (e == cudaSuccess) e = sdpa_fma_init_type<__half>();
    if (e == cudaSuccess) e = sdpa_fma_init_type<__nv_bfloat16>();
    return e;
}
