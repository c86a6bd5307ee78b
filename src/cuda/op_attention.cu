// SPDX-License-Identifier: Apache-2.0
// sdpa: softmax(q k^T * scale + mask) v for q[.., L, E], k[.., S, E], v[.., S, Ev] (batch dims
// broadcast to the output's), an optional mask broadcast to [.., L, S] (bool: true = attend;
// float: added to the scores), is_causal (key s attends query l iff s <= l, top-left aligned
// like PyTorch), scale NaN = 1/sqrt(E). A row with every key masked gives zeros.
// float16/bfloat16 with E = Ev in {64, 128}: the tensor-core kernels (pipelined, or split-key for
// small grids; below). Otherwise E, Ev <= 256: a fused flash-style kernel (online softmax, no
// L x S scores in memory): a block of SDPA_WARPS warps, one query row per warp, walks K/V in
// tiles of 32 keys staged in shared memory; lane j scores key j of the tile, each lane
// accumulates its slice of the output row. Larger heads: a simple kernel, one block per query
// row, one key at a time. Float32 compute.
#include <math.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/mma.cuh"

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

// --- tensor-core kernels: float16/bfloat16, E = Ev in {64, 128} (FlashAttention-2 style)
// Each warp owns 16 query rows; K/V tiles are staged in shared memory (rows padded by 8
// elements: the fragment reads are bank-conflict free); S = Q K^T and O += P V are
// mma.sync.m16n8k16 with float32 accumulation; the online softmax runs on the S fragments in
// registers (a row is spread over the 4 lanes of a quad). P is rounded to the input dtype
// before P V (as FlashAttention does). The MMA helpers and fragment layouts: cuda/mma.cuh.

// Two consecutive 16-bit elements (4-byte aligned) as one register.
__device__ __forceinline__ uint32_t sdpa_ld2(const uint16_t *p) { return *(const uint32_t *)p; }

// The tensor-core kernels' score step on S fragments sc[NT][4] (C layout of m16n8k16: rows ra
// for [0..1], rb for [2..3]; key s0 + nt * 8 + 2 t4 + (i & 1)): multiply by `mult`, then keys
// past S, causal and mask to -inf (a float mask scaled by mask_mult), and the two rows' maxima
// over the quad. `plain`: no key of the tile needs a check (the caller knows).
template <int NT>
__device__ __forceinline__ void
sdpa_tc_mask_max(const sdpa_params &P, float (*sc)[4], int64_t s0, int64_t ra, int64_t rb, int t4,
                 int64_t mo, float mult, float mask_mult, bool plain, float &mxa, float &mxb) {
    mxa = -INFINITY;
    mxb = -INFINITY;
    if (plain) { // one branch per tile, none per element (the common case: no mask, full tile)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            sc[nt][0] *= mult;
            sc[nt][1] *= mult;
            sc[nt][2] *= mult;
            sc[nt][3] *= mult;
            mxa = fmaxf(mxa, fmaxf(sc[nt][0], sc[nt][1]));
            mxb = fmaxf(mxb, fmaxf(sc[nt][2], sc[nt][3]));
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float x = sc[nt][i] * mult;
                const int64_t s = s0 + nt * 8 + 2 * t4 + (i & 1);
                const int64_t row = i < 2 ? ra : rb;
                if (s >= P.s || (P.causal && s > row)) {
                    x = -INFINITY;
                } else if (P.mask != NULL && row < P.l) {
                    const int64_t mi = mo + row * P.m_sl + s * P.m_ss;
                    if (P.mask_dt == KILN_DTYPE_BOOL) {
                        if (((const uint8_t *)P.mask)[mi] == 0) x = -INFINITY;
                    } else {
                        x += kc_ld_f(P.mask, P.mask_dt, mi) * mask_mult;
                    }
                }
                sc[nt][i] = x;
                if (i < 2) {
                    mxa = fmaxf(mxa, x);
                } else {
                    mxb = fmaxf(mxb, x);
                }
            }
        }
    }
    mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
    mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
    mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
    mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
}

// --- tensor-core kernel, keys split across warps (grids of up to one resident wave)
// One CTA of NS warps per (batch, 16 query rows); warp w takes the key tiles w, w + NS, ... of
// BK keys, staged in its own shared-memory slice (no block-wide barrier in the loop), runs the
// same online softmax (sdpa_tc_tile), and the NS partial results (row maxima, sums, unnormalized
// outputs) are merged through shared memory at the end. Nsight Compute on the H200 (BERT b8,
// 64-row pipelined CTAs): 1.45 warps per scheduler, 79% of cycles with no eligible warp, ~1900
// instructions on each warp's serial path. Grids under one wave of 64-row CTAs (BERT b1, ViT,
// the encoder) therefore split each 16-row block's keys over NS warps (sdpa_split_warps picks
// NS and the tile size). Fragments come from ldmatrix (K plain, V transposed); scores are kept
// in log2 units (ex2). Tiles that need no masking skip the checks.

// 2^x with the SFU's ex2.approx (2 ulp; ex2(-inf) = +0): the split kernel's softmax, whose
// probabilities are rounded to 16 bits before P V anyway.
__device__ __forceinline__ float sdpa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Q's A fragments for rows ra, rb (rows past L are zeros, never stored) straight from global
// memory.
template <int D>
__device__ __forceinline__ void sdpa_load_q(const sdpa_params &P, const uint16_t *q, int64_t ra,
                                            int64_t rb, int t4, uint32_t (*qf)[4]) {
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const int col = kc * 16 + 2 * t4;
        qf[kc][0] = ra < P.l ? sdpa_ld2(q + ra * P.q_rs + col) : 0u;
        qf[kc][1] = rb < P.l ? sdpa_ld2(q + rb * P.q_rs + col) : 0u;
        qf[kc][2] = ra < P.l ? sdpa_ld2(q + ra * P.q_rs + col + 8) : 0u;
        qf[kc][3] = rb < P.l ? sdpa_ld2(q + rb * P.q_rs + col + 8) : 0u;
    }
}

// One warp's online-softmax step over a tile of BK keys staged in shared memory (K and V rows
// at ks / vs, LD elements apart), for its 16 query rows ra = r0 + g, rb = ra + 8: S = Q K^T
// (ldmatrix.x4 gives the B fragments of two k-chunks of one n-tile), scores in log2 units
// (sl2 = scale * log2 e), masks, running maxima ma/mb, lane-partial sums la/lb (the quad is
// reduced once at the end), O rescaled, then O += P V (ldmatrix.x4.trans gives the B fragments
// of two n-tiles of V; the S fragments of key columns [16 kk, 16 kk + 16) are P's A fragment).
template <typename T, int D, int BK, int LD>
__device__ __forceinline__ void
sdpa_tc_tile(const sdpa_params &P, const uint32_t (*qf)[4], const uint16_t *ks, const uint16_t *vs,
             int64_t s0, int64_t ra, int64_t rb, int lane, int64_t mo, float sl2, float (*o)[4],
             float &ma, float &mb, float &la, float &lb) {
    const int t4 = lane & 3;
    float sc[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
        sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc += 2) {
            uint32_t kb[4];
            kc_ldmatrix_x4(kb, ks + (nt * 8 + (lane & 7)) * LD + kc * 16 + (lane >> 3) * 8);
            kc_mma<T>::mma(sc[nt], qf[kc], kb[0], kb[1]);
            kc_mma<T>::mma(sc[nt], qf[kc + 1], kb[2], kb[3]);
        }
    }
    float mxa, mxb;
    sdpa_tc_mask_max<BK / 8>(P, sc, s0, ra, rb, t4, mo, sl2, 1.4426950408889634f,
                             !P.causal && P.mask == NULL && s0 + BK <= P.s, mxa, mxb);
    const float mna = fmaxf(ma, mxa), mnb = fmaxf(mb, mxb);
    // every key so far masked: subtract 0 (ex2(-inf) = 0 keeps p and the sums zero)
    const float ua = mna == -INFINITY ? 0.0f : mna, ub = mnb == -INFINITY ? 0.0f : mnb;
    const float ca = sdpa_ex2(ma - ua), cb = sdpa_ex2(mb - ub);
    ma = mna;
    mb = mnb;
    float suma = 0.0f, sumb = 0.0f;
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
        sc[nt][0] = sdpa_ex2(sc[nt][0] - ua);
        sc[nt][1] = sdpa_ex2(sc[nt][1] - ua);
        sc[nt][2] = sdpa_ex2(sc[nt][2] - ub);
        sc[nt][3] = sdpa_ex2(sc[nt][3] - ub);
        suma += sc[nt][0] + sc[nt][1];
        sumb += sc[nt][2] + sc[nt][3];
    }
    la = la * ca + suma;
    lb = lb * cb + sumb;
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) {
        o[dn][0] *= ca;
        o[dn][1] *= ca;
        o[dn][2] *= cb;
        o[dn][3] *= cb;
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t pa[4];
        pa[0] = kc_mma<T>::pack(sc[2 * kk][0], sc[2 * kk][1]);
        pa[1] = kc_mma<T>::pack(sc[2 * kk][2], sc[2 * kk][3]);
        pa[2] = kc_mma<T>::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        pa[3] = kc_mma<T>::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
        for (int dn = 0; dn < D / 8; dn += 2) {
            uint32_t vb[4];
            kc_ldmatrix_x4_t(vb, vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                     (dn + (lane >> 4)) * 8);
            kc_mma<T>::mma(o[dn], pa, vb[0], vb[1]);
            kc_mma<T>::mma(o[dn + 1], pa, vb[2], vb[3]);
        }
    }
}

// --- tensor-core kernel, pipelined (FlashAttention-2 style)
// One CTA of NW warps per (batch, block of 16 NW query rows); warp w owns rows [16 w, 16 w + 16).
// K/V tiles of SDPA_TC_BK keys go global -> shared with cp.async into two stages: tile t + 1
// is in flight while tile t is computed (sdpa_tc_tile). Rows padded by 8 elements (ldmatrix
// without bank conflicts). Shared memory: 2 stages x (K + V) tiles, dynamic (D 128: 68 KB).

#define SDPA_TC_BK 64 // keys per tile

template <int D> struct sdpa_tc_smem {
    static constexpr int LD = D + 8;
    static constexpr int TILE = SDPA_TC_BK * LD; // elements
    static constexpr int BYTES = 2 * 2 * TILE * 2;
};

// Tile s0's K and V rows into ks / vs with cp.async, every thread of the CTA taking a share
// (keys past S are zero-filled).
template <int D, int LD>
__device__ __forceinline__ void sdpa_tc_stage(const sdpa_params &P, const uint16_t *k,
                                              const uint16_t *v, int64_t s0, uint16_t *ks,
                                              uint16_t *vs) {
    for (int i = threadIdx.x; i < SDPA_TC_BK * (D / 8); i += blockDim.x) {
        const int j = i / (D / 8), c = (i % (D / 8)) * 8;
        const int64_t s = s0 + j;
        const bool in = s < P.s;
        kc_cp_async16(ks + j * LD + c, in ? k + s * P.k_rs + c : k, in);
        kc_cp_async16(vs + j * LD + c, in ? v + s * P.v_rs + c : v, in);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <typename T, int D, int NW>
static __global__ void __launch_bounds__(NW * 32)
    sdpa_tc_kernel(const __grid_constant__ sdpa_params P) {
    using SM = sdpa_tc_smem<D>;
    constexpr int LD = SM::LD, BQ = 16 * NW;
    extern __shared__ __align__(16) uint8_t sdpa_tc_dyn[];
    uint16_t *const sm = (uint16_t *)sdpa_tc_dyn; // stage st: K at sm + 2 st TILE, V after it
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const uint16_t *q = (const uint16_t *)P.q, *k = (const uint16_t *)P.k,
                   *v = (const uint16_t *)P.v;
    uint16_t *out = (uint16_t *)P.out;
    const float sl2 = P.scale * 1.4426950408889634f;
    for (int64_t b = blockIdx.y; b < P.batch; b += gridDim.y) {
        const sdpa_offs bo = sdpa_offsets(P, b);
        const int64_t blk0 = (int64_t)blockIdx.x * BQ;
        const int64_t r0 = blk0 + warp * 16, ra = r0 + g, rb = r0 + g + 8;
        int64_t s_end = P.s;
        if (P.causal && blk0 + BQ < s_end) s_end = blk0 + BQ;
        const int64_t n_tiles = (s_end + SDPA_TC_BK - 1) / SDPA_TC_BK;
        if (n_tiles > 0) sdpa_tc_stage<D, LD>(P, k + bo.k, v + bo.v, 0, sm, sm + SM::TILE);
        uint32_t qf[D / 16][4];
        sdpa_load_q<D>(P, q + bo.q, ra, rb, t4, qf);
        float o[D / 8][4];
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
        float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
        for (int64_t t = 0; t < n_tiles; t++) {
            if (t + 1 < n_tiles) {
                uint16_t *nx = sm + ((t + 1) & 1) * 2 * SM::TILE;
                sdpa_tc_stage<D, LD>(P, k + bo.k, v + bo.v, (t + 1) * SDPA_TC_BK, nx,
                                     nx + SM::TILE);
                asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            }
            __syncthreads(); // tile t is in shared memory for every warp
            const int64_t s0 = t * SDPA_TC_BK;
            if (!(P.causal && s0 > r0 + 15)) { // else every key of the tile is masked here
                const uint16_t *cur = sm + (t & 1) * 2 * SM::TILE;
                sdpa_tc_tile<T, D, SDPA_TC_BK, LD>(P, qf, cur, cur + SM::TILE, s0, ra, rb, lane,
                                                   bo.m, sl2, o, ma, mb, la, lb);
            }
            __syncthreads(); // tile t's stage is consumed before tile t + 2 is staged into it
        }
        la += __shfl_xor_sync(0xffffffffu, la, 1);
        la += __shfl_xor_sync(0xffffffffu, la, 2);
        lb += __shfl_xor_sync(0xffffffffu, lb, 1);
        lb += __shfl_xor_sync(0xffffffffu, lb, 2);
        const float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            const int col = dn * 8 + 2 * t4;
            if (ra < P.l) {
                *(uint32_t *)(out + bo.o + ra * P.o_rs + col) =
                    kc_mma<T>::pack(o[dn][0] * ia, o[dn][1] * ia);
            }
            if (rb < P.l) {
                *(uint32_t *)(out + bo.o + rb * P.o_rs + col) =
                    kc_mma<T>::pack(o[dn][2] * ib, o[dn][3] * ib);
            }
        }
    }
}

template <int D, int NS, int BK> struct sdpa_sp_smem {
    static constexpr int LD = D + 8;                          // padded row (elements)
    static constexpr int TILE = BK * LD;                      // one K or V tile (elements)
    static constexpr int KV_BYTES = NS * 2 * TILE * 2;        // every warp's K and V tiles
    static constexpr int MERGE_BYTES = NS * 16 * (D + 2) * 4; // o, m, l of every warp
    static constexpr int BYTES = KV_BYTES > MERGE_BYTES ? KV_BYTES : MERGE_BYTES;
};

// Resident CTAs per SM the split kernel is compiled for (its register budget): D 64 with tiles of
// up to 32 keys: 16 warps per SM (<= 128 registers); 64-key tiles: 12 warps (<= 168); D 128: 3
// CTAs.
template <int D, int NS, int BK> constexpr int sdpa_sp_min_blocks() {
    return D != 64 ? 3 : BK <= 32 ? 16 / NS : 12 / NS;
}

template <typename T, int D, int NS, int BK>
static __global__ void __launch_bounds__(NS * 32, (sdpa_sp_min_blocks<D, NS, BK>()))
    sdpa_tc_split_kernel(const __grid_constant__ sdpa_params P) {
    using SM = sdpa_sp_smem<D, NS, BK>;
    constexpr int LD = SM::LD;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint16_t *ks = (uint16_t *)smem_raw + (threadIdx.x >> 5) * 2 * SM::TILE;
    uint16_t *vs = ks + SM::TILE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const uint16_t *q = (const uint16_t *)P.q, *k = (const uint16_t *)P.k,
                   *v = (const uint16_t *)P.v;
    uint16_t *out = (uint16_t *)P.out;
    const float sl2 = P.scale * 1.4426950408889634f; // scores in log2 units
    for (int64_t b = blockIdx.y; b < P.batch; b += gridDim.y) {
        const sdpa_offs bo = sdpa_offsets(P, b);
        const int64_t qo = bo.q, ko = bo.k, vo = bo.v, mo = bo.m, oo = bo.o;
        const int64_t r0 = (int64_t)blockIdx.x * 16, ra = r0 + g, rb = r0 + g + 8;
        uint32_t qf[D / 16][4];
        sdpa_load_q<D>(P, q + qo, ra, rb, t4, qf);
        float o[D / 8][4];
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
        float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
        int64_t s_end = P.s;
        if (P.causal && r0 + 16 < s_end) s_end = r0 + 16;
        __syncthreads(); // the previous batch's merge buffers are consumed
        // This lane's share of every K/V tile: 8 columns at c of rows j0, j0 + RSTEP, ... (PER
        // rows); shared addresses and row steps computed once, so each copy costs a pointer add.
        constexpr int PER = BK * (D / 8) / 32, RSTEP = 32 / (D / 8);
        const int j0 = lane / (D / 8), c = (lane % (D / 8)) * 8;
        const unsigned ks_a = (unsigned)__cvta_generic_to_shared(ks + j0 * LD + c),
                       vs_a = (unsigned)__cvta_generic_to_shared(vs + j0 * LD + c);
        const int64_t kstep = (int64_t)RSTEP * P.k_rs, vstep = (int64_t)RSTEP * P.v_rs;
        for (int64_t s0 = (int64_t)warp * BK; s0 < s_end; s0 += NS * BK) {
            // this warp's K/V tile: cp.async 16-byte copies straight into shared memory (rows
            // past S are zero-filled)
            const uint16_t *kp = k + ko + (s0 + j0) * P.k_rs + c,
                           *vp = v + vo + (s0 + j0) * P.v_rs + c;
            const int64_t left = P.s - (s0 + j0); // this lane's rows still inside S
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const bool in = (int64_t)i * RSTEP < left;
                kc_cp_async16_s(ks_a + (unsigned)(i * RSTEP * LD * 2), in ? kp : k, in);
                kc_cp_async16_s(vs_a + (unsigned)(i * RSTEP * LD * 2), in ? vp : v, in);
                kp += kstep;
                vp += vstep;
            }
            asm volatile("cp.async.wait_all;\n" ::: "memory");
            __syncwarp();
            sdpa_tc_tile<T, D, BK, LD>(P, qf, ks, vs, s0, ra, rb, lane, mo, sl2, o, ma, mb, la, lb);
            __syncwarp(); // the tile is consumed before the next one is stored
        }
        la += __shfl_xor_sync(0xffffffffu, la, 1);
        la += __shfl_xor_sync(0xffffffffu, la, 2);
        lb += __shfl_xor_sync(0xffffffffu, lb, 1);
        lb += __shfl_xor_sync(0xffffffffu, lb, 2);
        // merge: warp w's o rows at mo_[w][row][0..D), its max and sum at [D] and [D + 1]
        __syncthreads(); // every warp is done with its K/V slice
        // (rows of D + 2 floats: every pair written or read below starts at an even index, so
        // it moves as one 8-byte float2)
        float *mg = (float *)smem_raw;
        float *mine = mg + warp * 16 * (D + 2);
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            const int col = dn * 8 + 2 * t4;
            *(float2 *)(mine + g * (D + 2) + col) = make_float2(o[dn][0], o[dn][1]);
            *(float2 *)(mine + (g + 8) * (D + 2) + col) = make_float2(o[dn][2], o[dn][3]);
        }
        if (t4 == 0) {
            *(float2 *)(mine + g * (D + 2) + D) = make_float2(ma, la);
            *(float2 *)(mine + (g + 8) * (D + 2) + D) = make_float2(mb, lb);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < 16 * (D / 2); i += NS * 32) {
            const int row = i / (D / 2), col = (i % (D / 2)) * 2;
            const int64_t r = r0 + row;
            if (r >= P.l) continue;
            float2 ml[NS]; // each warp's row maximum and sum
            float m = -INFINITY;
#pragma unroll
            for (int w = 0; w < NS; w++) {
                ml[w] = *(const float2 *)(mg + (w * 16 + row) * (D + 2) + D);
                m = fmaxf(m, ml[w].x);
            }
            float l = 0.0f, a0 = 0.0f, a1 = 0.0f;
            if (m != -INFINITY) {
#pragma unroll
                for (int w = 0; w < NS; w++) {
                    const float2 a = *(const float2 *)(mg + (w * 16 + row) * (D + 2) + col);
                    const float f = ml[w].x == -INFINITY ? 0.0f : sdpa_ex2(ml[w].x - m);
                    l += ml[w].y * f;
                    a0 += a.x * f;
                    a1 += a.y * f;
                }
            }
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            *(uint32_t *)(out + oo + r * P.o_rs + col) = kc_mma<T>::pack(a0 * inv, a1 * inv);
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

// --- launchers

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

// The tensor-core kernel takes float16/bfloat16 with E = Ev in {64, 128} and 16-byte aligned
// q, k, v (every row then is: E is a multiple of 8) and a 4-byte aligned output.
// Strided operands (folded views): every row and batch stride a multiple of 8 elements (16
// bytes), the output's even (4 bytes).
template <typename T> static int sdpa_tc_ok(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if (ctx->no_tc_attention) return 0;
    if (P->e != P->ev || (P->e != 64 && P->e != 128)) return 0;
    if (P->q_rs % 8 != 0 || P->k_rs % 8 != 0 || P->v_rs % 8 != 0 || P->o_rs % 2 != 0) return 0;
    for (int d = 0; d < P->nb; d++) {
        if (P->q_bstr[d] % 8 != 0 || P->k_bstr[d] % 8 != 0 || P->v_bstr[d] % 8 != 0 ||
            P->o_bstr[d] % 2 != 0)
            return 0;
    }
    return ((uintptr_t)P->q % 16) == 0 && ((uintptr_t)P->k % 16) == 0 &&
           ((uintptr_t)P->v % 16) == 0 && ((uintptr_t)P->out % 4) == 0;
}

// The pipelined kernel's query rows per CTA: ctx->attn_rows when set; else 64 (4 warps) when
// batch x ceil(L / 64) CTAs fill the device, 32 when that grid is under one wave, 16 when even
// 32-row CTAs fill less than half a wave. Smaller CTAs re-read K/V from L2 more often; they only
// pay while SMs sit idle. (Grids under one wave of 64-row CTAs normally take the split-key
// kernel: sdpa_split_warps.)
static int sdpa_tc_rows(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if (ctx->attn_rows == 16 || ctx->attn_rows == 32 || ctx->attn_rows == 64) return ctx->attn_rows;
    int64_t n64 = P->batch * ((P->l + 63) / 64), n32 = P->batch * ((P->l + 31) / 32);
    if (ctx->sm_count <= 0 || n64 >= ctx->sm_count) return 64;
    return 2 * n32 >= ctx->sm_count ? 32 : 16;
}

template <typename T, int D, int NW>
static kiln_status sdpa_tc_launch_nw(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    int64_t by = P->batch < 65535 ? P->batch : 65535;
    dim3 grid((unsigned)((P->l + 16 * NW - 1) / (16 * NW)), (unsigned)by);
    sdpa_tc_kernel<T, D, NW><<<grid, NW * 32, sdpa_tc_smem<D>::BYTES, ctx->stream>>>(*P);
    return kiln_cuda_check_launch(ctx, "sdpa_tc_kernel");
}

template <typename T, int D, int NS, int BK>
static kiln_status sdpa_tc_split_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    int64_t by = P->batch < 65535 ? P->batch : 65535;
    dim3 grid((unsigned)((P->l + 15) / 16), (unsigned)by);
    sdpa_tc_split_kernel<T, D, NS, BK>
        <<<grid, NS * 32, sdpa_sp_smem<D, NS, BK>::BYTES, ctx->stream>>>(*P);
    return kiln_cuda_check_launch(ctx, "sdpa_tc_split_kernel");
}

// The split-key kernel's warps per 16-row block (0: the pipelined kernel), unless a row count
// (KILN_CUDA_ATTN_ROWS: the pipelined kernel) or a split (KILN_CUDA_ATTN_SPLIT) is forced.
// Grids of at least one wave of 64-row CTAs run pipelined (BERT b8: 192 CTAs, 9.5 us where the
// best split took 11.7, Nsight Compute on the H200); smaller ones split each 16-row block's keys
// over 4 warps (BERT b1 5.6 us, the encoder d1024 s256 9.4: 8 warps took 5.7 and 9.8, 2 warps
// 6.8 and 10.7), or 2 while 4 would not stay resident in one wave (sdpa_sp_min_blocks).
// D 128: 2 warps while 3 CTAs per SM hold the grid.
static int sdpa_split_warps(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if (ctx->attn_rows == 16 || ctx->attn_rows == 32 || ctx->attn_rows == 64) return 0;
    if (P->l > 65535 * 16) return 0;
    if (ctx->attn_split != 0) return P->e == 64 ? ctx->attn_split : 2;
    if (ctx->sm_count <= 0) return 0;
    const int64_t blocks = P->batch * ((P->l + 15) / 16), sms = ctx->sm_count;
    if (P->batch * ((P->l + 63) / 64) >= sms) return 0;
    if (P->e != 64) return blocks <= 3 * sms ? 2 : 0;
    if (blocks * 4 <= 16 * sms) return 4;
    if (blocks * 2 <= 12 * sms) return 2;
    return 0;
}

template <typename T, int D>
static kiln_status sdpa_tc_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if constexpr (D == 64) {
        switch (sdpa_split_warps(ctx, P)) {
        case 8:
            return P->s <= 128 ? sdpa_tc_split_launch<T, D, 8, 16>(ctx, P)
                               : sdpa_tc_split_launch<T, D, 8, 32>(ctx, P);
        case 4: return sdpa_tc_split_launch<T, D, 4, 32>(ctx, P);
        case 2: return sdpa_tc_split_launch<T, D, 2, 64>(ctx, P);
        default: break;
        }
    } else {
        if (sdpa_split_warps(ctx, P) == 2) return sdpa_tc_split_launch<T, D, 2, 32>(ctx, P);
    }
    switch (sdpa_tc_rows(ctx, P)) {
    case 16: return sdpa_tc_launch_nw<T, D, 1>(ctx, P);
    case 32: return sdpa_tc_launch_nw<T, D, 2>(ctx, P);
    default: return sdpa_tc_launch_nw<T, D, 4>(ctx, P);
    }
}

template <typename T>
static kiln_status sdpa_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if constexpr (sizeof(T) == 2) {
        if (sdpa_tc_ok<T>(ctx, P)) {
            return P->e == 64 ? sdpa_tc_launch<T, 64>(ctx, P) : sdpa_tc_launch<T, 128>(ctx, P);
        }
    }
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

template <typename T, int D, int NS, int BK> static cudaError_t sdpa_sp_init(void) {
    return cudaFuncSetAttribute(sdpa_tc_split_kernel<T, D, NS, BK>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                sdpa_sp_smem<D, NS, BK>::BYTES);
}

template <typename T, int D> static cudaError_t sdpa_tc_init(void) {
    const int n = sdpa_tc_smem<D>::BYTES;
    cudaError_t e = cudaFuncSetAttribute(sdpa_tc_kernel<T, D, 1>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, n);
    if (e == cudaSuccess) {
        e = cudaFuncSetAttribute(sdpa_tc_kernel<T, D, 2>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, n);
    }
    if (e == cudaSuccess) {
        e = cudaFuncSetAttribute(sdpa_tc_kernel<T, D, 4>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, n);
    }
    if constexpr (D == 64) {
        if (e == cudaSuccess) e = sdpa_sp_init<T, D, 8, 16>();
        if (e == cudaSuccess) e = sdpa_sp_init<T, D, 8, 32>();
        if (e == cudaSuccess) e = sdpa_sp_init<T, D, 4, 32>();
        if (e == cudaSuccess) e = sdpa_sp_init<T, D, 2, 64>();
    } else {
        if (e == cudaSuccess) e = sdpa_sp_init<T, D, 2, 32>();
    }
    return e;
}

// Raises the dynamic shared-memory limit of the fused kernels (once per device, before any
// launch or graph capture: the plugin calls it when it starts using a device).
template <typename T> static cudaError_t sdpa_init_type(void) {
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
    if constexpr (sizeof(T) == 2) {
        if (e == cudaSuccess) e = sdpa_tc_init<T, 64>();
        if (e == cudaSuccess) e = sdpa_tc_init<T, 128>();
    }
    return e;
}

extern "C" kiln_status kiln_cuda_attention_init(void) {
    cudaError_t e = sdpa_init_type<float>();
    if (e == cudaSuccess) e = sdpa_init_type<__half>();
    if (e == cudaSuccess) e = sdpa_init_type<__nv_bfloat16>();
    if (e != cudaSuccess) {
        cudaGetLastError(); // reported here: leave nothing pending
        return kiln_cuda_error(NULL, "cudaFuncSetAttribute (sdpa)", e);
    }
    return KILN_OK;
}

// --- cuDNN's fused attention (cuda_dnn.c) for float16/bfloat16 without mask or causality

// The batch dims as cuDNN's (B, H) for one operand: the last batch dim is H, the ones before it
// merge into B when their strides chain (size-1 dims skipped). 0 when not mappable: a stride of
// 0 on a dim larger than 1 (a broadcast operand) or strides that do not chain.
static int sdpa_dnn_bh(const sdpa_params *P, const int64_t *bstr, int64_t rows, int64_t rs,
                       int64_t *b_str, int64_t *h_str) {
    int64_t hs = rows * rs, hn = 1, expect = -1;
    if (P->nb >= 1) {
        hn = P->bdims[P->nb - 1];
        if (hn > 1 && bstr[P->nb - 1] == 0) return 0;
        if (hn > 1) hs = bstr[P->nb - 1];
    }
    int64_t bs = hn * hs;
    for (int d = P->nb - 2; d >= 0; d--) {
        const int64_t n = P->bdims[d], st = bstr[d];
        if (n == 1) continue;
        if (st == 0 || (expect >= 0 && st != expect)) return 0;
        if (expect < 0) bs = st; // the innermost merged dim sets B's stride
        expect = st * n;
    }
    *b_str = bs;
    *h_str = hs;
    return 1;
}

static int sdpa_dnn_geom(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype,
                         kiln_cuda_attn_geom *g) {
    if (ctx->dnn == NULL || ctx->no_dnn_attention || ctx->no_tc_attention || ctx->attn_rows != 0 ||
        ctx->attn_split != 0)
        return 0; // a forced kernel choice (tests, debugging) keeps Kiln's kernels
    if (P->mask != NULL || P->causal || (dtype != KILN_DTYPE_F16 && dtype != KILN_DTYPE_BF16))
        return 0;
    if (P->e % 8 != 0 || P->ev % 8 != 0 || P->e > 256 || P->ev > 256) return 0;
    const void *ptr[4] = {P->q, P->k, P->v, P->out};
    const int64_t *bs[4] = {P->q_bstr, P->k_bstr, P->v_bstr, P->o_bstr};
    const int64_t rs[4] = {P->q_rs, P->k_rs, P->v_rs, P->o_rs};
    const int64_t rows[4] = {P->l, P->s, P->s, P->l};
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 4; i++) {
        if ((uintptr_t)ptr[i] % 16 != 0 || rs[i] % 8 != 0) return 0;
        if (!sdpa_dnn_bh(P, bs[i], rows[i], rs[i], &g->str[i][0], &g->str[i][1])) return 0;
        if (g->str[i][0] % 8 != 0 || g->str[i][1] % 8 != 0) return 0;
        g->str[i][2] = rs[i];
        g->str[i][3] = 1;
    }
    g->dtype = dtype;
    g->hq = P->nb >= 1 ? P->bdims[P->nb - 1] : 1;
    g->hk = g->hq; // k and v have the query's batch dims (the op's shape inference)
    g->b = g->hq > 0 ? P->batch / g->hq : 0;
    g->sq = P->l;
    g->skv = P->s;
    g->d = P->e;
    g->dv = P->ev;
    g->scale = P->scale;
    g->q = P->q;
    g->k = P->k;
    g->v = P->v;
    g->out = P->out;
    return g->b > 0 && g->sq > 0 && g->skv > 0;
}

// Kiln's own kernels for the dtype.
static kiln_status sdpa_own(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F32: return sdpa_launch<float>(ctx, P);
    case KILN_DTYPE_F16: return sdpa_launch<__half>(ctx, P);
    default: return sdpa_launch<__nv_bfloat16>(ctx, P);
    }
}

struct sdpa_own_run {
    const kiln_cuda_ctx *ctx;
    const sdpa_params *P;
    uint32_t dtype;
};

static int sdpa_own_enqueue(void *arg) {
    const sdpa_own_run *r = (const sdpa_own_run *)arg;
    return sdpa_own(r->ctx, r->P, r->dtype) == KILN_OK;
}

// Context creation, after cuDNN set up (and timed) the layer: times Kiln's own kernel the same
// way and keeps it (attn state 4) when it is at least as fast (BERT b1's 128 x 128 heads, for
// one: Kiln's split-key kernel 5.4 us against cuDNN's 7.2 plus its workspace memset, H200).
static void sdpa_pick(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype) {
    kiln_cuda_attn_cache *c = ctx->attn;
    if (c == NULL || c->state != 1 || c->dnn_us < 0.0f) return;
    sdpa_own_run r = {ctx, P, dtype};
    const float own = kiln_cuda_time_in_graph(ctx->stream, sdpa_own_enqueue, &r);
    const int keep_own = own >= 0.0f && own <= c->dnn_us;
    if (keep_own) c->state = 4;
    kiln_cuda_log(KILN_LOG_INFO, "sdpa at %s: cuDNN %.2f us, Kiln's kernel %.2f us: %s",
                  ctx->where ? ctx->where : "?", (double)c->dnn_us, (double)own,
                  keep_own ? "Kiln's kernel" : "cuDNN");
}

// --- entry points

extern "C" kiln_status kiln_cuda_sdpa(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *q = args->in[0], *k = args->in[1], *v = args->in[2];
    const kiln_tensor *mask = args->n_in > 3 ? args->in[3] : NULL;
    const kiln_tensor *y = args->out;
    sdpa_params P;
    memset(&P, 0, sizeof P);
    if (q == NULL || k == NULL || v == NULL || q->rank < 2 || k->rank < 2 || v->rank < 2 ||
        y->rank < 2 || q->dtype != y->dtype || k->dtype != y->dtype || v->dtype != y->dtype ||
        !kiln_cuda_is_float(y->dtype) ||
        (mask != NULL && !(mask->dtype == KILN_DTYPE_BOOL || kiln_cuda_is_float(mask->dtype)))) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda sdpa: q, k, v and the output must share one float dtype, the "
                              "mask bool or float, ranks >= 2 at %s",
                              ctx->where ? ctx->where : "?");
    }
    P.l = q->dims[q->rank - 2];
    P.e = q->dims[q->rank - 1];
    P.s = k->dims[k->rank - 2];
    P.ev = v->dims[v->rank - 1];
    if (k->dims[k->rank - 1] != P.e || v->dims[v->rank - 2] != P.s || y->dims[y->rank - 2] != P.l ||
        y->dims[y->rank - 1] != P.ev) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "cuda sdpa: q, k, v shapes disagree at %s",
                              ctx->where ? ctx->where : "?");
    }
    double scale = kiln_attrs_float(&args->attrs, KILN_A_SDPA_SCALE, 0);
    P.scale = isnan(scale) ? (float)(1.0 / sqrt((double)(P.e > 0 ? P.e : 1))) : (float)scale;
    P.causal = kiln_attrs_int(&args->attrs, KILN_A_SDPA_CAUSAL, 0) != 0;
    P.q = q->data;
    P.k = k->data;
    P.v = v->data;
    P.out = y->data;
    P.nb = (int)y->rank - 2;
    P.batch = 1;
    // q, k, v, out: dense, or folded strided views (cuda_fold.h: same logical dims)
    const kiln_tensor *bt[4] = {q, k, v, y};
    int64_t *bstr[4] = {P.q_bstr, P.k_bstr, P.v_bstr, P.o_bstr};
    int64_t *rstr[4] = {&P.q_rs, &P.k_rs, &P.v_rs, &P.o_rs};
    for (int i = 0; i < 4; i++) {
        const kiln_cuda_strided *sv = ctx->sdpa_io[i];
        int64_t st[KC_MAX_RANK];
        if (sv != NULL && (sv->rank != bt[i]->rank || sv->str[sv->rank - 1] != 1)) {
            return kiln_cuda_fail(KILN_ERR_INTERNAL,
                                  "cuda sdpa: a folded view of operand %d has rank %u or an "
                                  "innermost stride other than 1 at %s; set "
                                  "KILN_CUDA_NO_PERMUTE_FOLD=1",
                                  i, sv->rank, ctx->where ? ctx->where : "?");
        }
        if (sv != NULL) {
            memcpy(st, sv->str, sizeof(int64_t) * sv->rank);
            if (i == 0) P.q = sv->data;
            if (i == 1) P.k = sv->data;
            if (i == 2) P.v = sv->data;
            if (i == 3) P.out = sv->data;
        } else {
            kc_strides(bt[i], st);
        }
        int nbi = (int)bt[i]->rank - 2;
        *rstr[i] = st[bt[i]->rank - 2];
        for (int d = 0; d < P.nb; d++) {
            int id = d - (P.nb - nbi);
            bstr[i][d] = (id < 0 || (i < 3 && bt[i]->dims[id] == 1)) ? 0 : st[id];
        }
    }
    for (int d = 0; d < P.nb; d++) {
        P.bdims[d] = y->dims[d];
        P.batch *= y->dims[d];
    }
    if (mask != NULL) {
        // mask right-aligned against [batch.., L, S]
        int64_t st[KC_MAX_RANK];
        int full = P.nb + 2, mr = (int)mask->rank;
        kc_strides(mask, st);
        for (int d = 0; d < full; d++) {
            int id = d - (full - mr);
            int64_t s = (id < 0 || mask->dims[id] == 1) ? 0 : st[id];
            if (d < P.nb) {
                P.m_bstr[d] = s;
            } else if (d == P.nb) {
                P.m_sl = s;
            } else {
                P.m_ss = s;
            }
        }
        P.mask = mask->data;
        P.mask_dt = mask->dtype;
    }
    if (P.batch * P.l * P.ev == 0) return KILN_OK;
    kiln_cuda_attn_geom g;
    if (sdpa_dnn_geom(ctx, &P, y->dtype, &g)) {
        int done = 0;
        KILN_CUDA_TRY(kiln_cuda_dnn_sdpa(ctx, &g, &done));
        if (done) return KILN_OK;
        if (ctx->plan_only) {
            sdpa_pick(ctx, &P, y->dtype);
            return KILN_OK;
        }
    }
    if (ctx->plan_only) return KILN_OK;
    return sdpa_own(ctx, &P, y->dtype);
}
