// SPDX-License-Identifier: Apache-2.0
// sdpa's kernel parameters and the device helpers its kernel groups share: the fp32-FMA kernels
// (attn_flash.cu) and the tensor-core kernels (attn_tc.cu), planned and run by op_attention.cu.
// softmax(q k^T * scale + mask) v for q[.., L, E], k[.., S, E], v[.., S, Ev] (batch dims
// broadcast to the output's), an optional mask broadcast to [.., L, S] (bool: true = attend;
// float: added to the scores), is_causal (key s attends query l iff s <= l, top-left aligned
// like PyTorch). A row with every key masked gives zeros. Float32 compute.
#ifndef KILN_CUDA_ATTN_COMMON_CUH
#define KILN_CUDA_ATTN_COMMON_CUH

#include <math.h>

#include "cuda/cuda_common.cuh"

#define SDPA_WARPS 4
#define SDPA_TK 32        // keys per tile (one per lane)
#define SDPA_MAX_HEAD 256 // E and Ev limit of the fused kernel
#define SDPA_SIMPLE_BLOCK 128

typedef struct sdpa_params {
    const void *q, *k, *v, *mask;
    void *out;
    uint32_t mask_dt;
    int causal;
    float scale;
    int64_t l, s, e, ev;
    int nb;
    int64_t batch;
    int64_t bdims[KC_MAX_RANK];
    int64_t q_bstr[KC_MAX_RANK], k_bstr[KC_MAX_RANK], v_bstr[KC_MAX_RANK], m_bstr[KC_MAX_RANK];
    int64_t o_bstr[KC_MAX_RANK];    // output batch strides (dense: the flat layout)
    int64_t q_rs, k_rs, v_rs, o_rs; // row strides (elements; dense: E or Ev); innermost stride 1
    int64_t m_sl, m_ss;             // mask strides along L and S (0: broadcast)
    // The split-key kernel's key chunks (flash-decoding): chunk > 0 makes CTA z of the grid take
    // keys [z chunk, (z + 1) chunk) and write its rows' partial results (unnormalized output,
    // row maximum and sum, D + 2 floats a row) to part, which kiln_cuda_sdpa_tc_run then merges.
    float *part;
    int64_t chunk;
    // The pipelined kernel's mask summary (sdpa_tile_summary_kernel, attn_tc.cu): the
    // SDPA_TILE_* bits of each block of the CTA's rows and each key tile, tiles_n tiles a block;
    // NULL: a CTA scans the mask itself.
    const uint8_t *tiles;
    int64_t tiles_n;
} sdpa_params;

__device__ __forceinline__ int64_t sdpa_boff(const sdpa_params &P, int64_t b, const int64_t *str) {
    int64_t o = 0;
    for (int d = P.nb - 1; d >= 0; d--) {
        o += (b % P.bdims[d]) * str[d];
        b /= P.bdims[d];
    }
    return o;
}

// The batch offsets of q, k, v, mask and out for flat batch b: the index is decomposed once,
// in 32-bit arithmetic when the batch count allows (a 64-bit division is ~100 instructions;
// five operands x two dims of them cost as much as a 32-key tile of the tensor-core kernels).
struct sdpa_offs {
    int64_t q, k, v, m, o;
};
__device__ __forceinline__ sdpa_offs sdpa_offsets(const sdpa_params &P, int64_t b) {
    sdpa_offs r = {0, 0, 0, 0, 0};
    if (P.batch <= 0x7fffffff) {
        uint32_t rem = (uint32_t)b;
        for (int d = P.nb - 1; d >= 0; d--) {
            const uint32_t n = (uint32_t)P.bdims[d], i = rem % n;
            rem /= n;
            r.q += (int64_t)i * P.q_bstr[d];
            r.k += (int64_t)i * P.k_bstr[d];
            r.v += (int64_t)i * P.v_bstr[d];
            r.m += (int64_t)i * P.m_bstr[d];
            r.o += (int64_t)i * P.o_bstr[d];
        }
        return r;
    }
    r.q = sdpa_boff(P, b, P.q_bstr);
    r.k = sdpa_boff(P, b, P.k_bstr);
    r.v = sdpa_boff(P, b, P.v_bstr);
    r.m = sdpa_boff(P, b, P.m_bstr);
    r.o = sdpa_boff(P, b, P.o_bstr);
    return r;
}

// The score of (query row l, key s) from its raw dot product: scale, causal, mask.
__device__ __forceinline__ float sdpa_score(const sdpa_params &P, int64_t moff, int64_t l,
                                            int64_t s, float dot) {
    float sc = dot * P.scale;
    if (P.causal && s > l) return -INFINITY;
    if (P.mask != NULL) {
        int64_t mi = moff + l * P.m_sl + s * P.m_ss;
        if (P.mask_dt == KILN_DTYPE_BOOL) {
            if (((const uint8_t *)P.mask)[mi] == 0) return -INFINITY;
        } else {
            sc += kc_ld_f(P.mask, P.mask_dt, mi);
        }
    }
    return sc;
}

// --- the kernel groups' entry points

// The kernel parameters of sdpa layer args (attn_run.cu); KILN_ERR_UNSUPPORTED / INVALID_ARG
// naming the layer when its operands are not an sdpa the kernels take.
kiln_status kiln_cuda_sdpa_params_of(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                     sdpa_params *out);

// The fp32-FMA kernels (attn_flash.cu): the flash-style kernel for E, Ev <= SDPA_MAX_HEAD (1
// query row per warp, online softmax over tiles of 32 keys), else one block per query row.
kiln_status kiln_cuda_sdpa_fma(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype);
cudaError_t kiln_cuda_sdpa_fma_init(void);

// The tensor-core kernels (attn_tc.cu): float16/bfloat16, E = Ev in {64, 80, 128, 256}.
// 1 when they take P (policy cuda.tc_attention, head sizes, alignments, strides).
int kiln_cuda_sdpa_tc_ok(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype);
// The split-key kernel's warps per 16-row block for P (0: the pipelined kernel) and the
// pipelined kernel's query rows per CTA: by residency and occupancy, or as the policy forces.
int kiln_cuda_sdpa_split_warps(const kiln_cuda_ctx *ctx, const sdpa_params *P);
int kiln_cuda_sdpa_tc_rows(const kiln_cuda_ctx *ctx, const sdpa_params *P);
// The key chunks (flash-decoding) the split-key kernel at `split` warps runs P in (1: none): a
// grid that leaves most resident CTAs idle over 512 or more keys (an LLM decode step) cuts the
// keys into chunks over CTAs and merges their partial rows in a second kernel, through the
// context's workspace. (Both tensor-core kernels pass over key tiles that the mask excludes for
// every row of a block: attn_tc.cu.)
int kiln_cuda_sdpa_tc_chunks(const kiln_cuda_ctx *ctx, const sdpa_params *P, int split);
// Enqueues the split-key kernel with `split` warps, or (split 0) the pipelined one with `rows`.
kiln_status kiln_cuda_sdpa_tc_run(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype,
                                  int split, int rows);
cudaError_t kiln_cuda_sdpa_tc_init(void);

#endif // KILN_CUDA_ATTN_COMMON_CUH
