// SPDX-License-Identifier: Apache-2.0
// sdpa's tensor-core kernels (attn_common.cuh): float16/bfloat16 with E = Ev in {64, 128},
// pipelined (FlashAttention-2 style) or, for grids of up to one resident wave, with the keys
// split across warps; heads of 256 on the split-key kernel only, heads of 32 (Swin's and
// MaxViT's windows, SegFormer) and 80 (StableLM, Phi) on the pipelined kernel only, at 64 rows
// per CTA. Which one and its CTA shape are chosen when the
// layer is planned (kiln_cuda_sdpa_split_warps, kiln_cuda_sdpa_tc_rows) and passed to
// kiln_cuda_sdpa_tc_run.
#include "cuda/attn_common.cuh"
#include "cuda/mma.cuh"

// --- tensor-core kernels: float16/bfloat16, E = Ev in {32, 64, 80, 128, 256} (FlashAttention-2
// style)
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
             int64_t s0, int64_t ra, int64_t rb, int lane, int64_t mo, bool mask_full, float sl2,
             float (*o)[4], float &ma, float &mb, float &la, float &lb) {
    const int t4 = lane & 3;
    // No score of the tile needs a check: every key inside S, the mask absent or attending
    // everywhere with nothing to add (mask_full: the caller scanned it), and with causality
    // every key at or before the warp's first row.
    const bool plain = s0 + BK <= P.s && (P.mask == NULL || mask_full) &&
                       (!P.causal || s0 + BK - 1 <= ra - (lane >> 2));
    float sc[BK / 8][4];
    constexpr int KC = D / 16; // k-chunks of the head: odd for heads of 80
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
        sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc + 1 < KC; kc += 2) {
            uint32_t kb[4];
            kc_ldmatrix_x4(kb, ks + (nt * 8 + (lane & 7)) * LD + kc * 16 + (lane >> 3) * 8);
            kc_mma<T>::mma(sc[nt], qf[kc], kb[0], kb[1]);
            kc_mma<T>::mma(sc[nt], qf[kc + 1], kb[2], kb[3]);
        }
        if constexpr (KC % 2 == 1) { // the last chunk alone (lanes 16-31 repeat 0-15's rows)
            uint32_t kb[4];
            kc_ldmatrix_x4(kb,
                           ks + (nt * 8 + (lane & 7)) * LD + (KC - 1) * 16 + ((lane >> 3) & 1) * 8);
            kc_mma<T>::mma(sc[nt], qf[KC - 1], kb[0], kb[1]);
        }
    }
    float mxa, mxb;
    sdpa_tc_mask_max<BK / 8>(P, sc, s0, ra, rb, t4, mo, sl2, 1.4426950408889634f, plain, mxa, mxb);
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

// --- which key tiles the mask lets through
// A tile of BK keys from s0 for query rows [r0, r1) is skipped when every (row, key) is masked
// (a bool false or a float -inf) or past S: neither loaded nor computed, with the same result
// (its probabilities are all zero). It runs the plain score step when every entry attends with
// nothing to add (bool true, float 0) and every key is inside S. Masks built from positions
// (a static KV cache read up to the current position, causal masks given as tensors, padding)
// leave most tiles of one of the two kinds. SDPA_TILE_LIVE / SDPA_TILE_MIXED: bits of a scan.
#define SDPA_TILE_LIVE 1
#define SDPA_TILE_MIXED 2

// One thread's share of the scan, entries i0, i0 + step, ... of the tile in row-major order
// (consecutive threads read consecutive keys); a mask broadcast over rows is read once. A bool
// mask whose rows of the tile are 16-byte aligned is read 16 keys a load (the prefill's
// [L, S] mask over a static cache: two loads a thread for a 64 x 64 tile); otherwise one key a
// load, four loads in flight.
template <int BK>
__device__ __forceinline__ int sdpa_tile_scan(const sdpa_params &P, int64_t mo, int64_t s0,
                                              int64_t r0, int64_t r1, int i0, int step) {
    const int64_t rows = P.m_sl == 0 ? 1 : r1 - r0;
    int bits = 0;
    if (P.mask_dt == KILN_DTYPE_BOOL && P.m_ss == 1 && s0 + BK <= P.s && P.m_sl % 16 == 0 &&
        (((uintptr_t)P.mask + (uintptr_t)(mo + s0)) & 15u) == 0) {
        const uint8_t *m = (const uint8_t *)P.mask + mo + r0 * P.m_sl + s0;
        constexpr int VR = BK / 16; // loads per row
#pragma unroll 8
        for (int64_t i = i0; i < rows * VR; i += step) {
            const uint4 x = *(const uint4 *)(m + (i / VR) * P.m_sl + (i % VR) * 16);
            const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int j = 0; j < 4; j++) { // a zero byte: (w - 0x01..) & ~w & 0x80..
                bits |= (w[j] != 0u ? SDPA_TILE_LIVE : 0) |
                        (((w[j] - 0x01010101u) & ~w[j] & 0x80808080u) != 0u ? SDPA_TILE_MIXED : 0);
            }
        }
        return bits;
    }
    if (s0 + BK > P.s) bits = SDPA_TILE_MIXED;
#pragma unroll 4
    for (int64_t i = i0; i < rows * BK; i += step) {
        const int64_t s = s0 + i % BK;
        if (s >= P.s) continue;
        const int64_t mi = mo + (r0 + i / BK) * P.m_sl + s * P.m_ss;
        if (P.mask_dt == KILN_DTYPE_BOOL) {
            bits |= ((const uint8_t *)P.mask)[mi] != 0 ? SDPA_TILE_LIVE : SDPA_TILE_MIXED;
        } else {
            const float x = kc_ld_f(P.mask, P.mask_dt, mi);
            bits |= (x != -INFINITY ? SDPA_TILE_LIVE : 0) | (x != 0.0f ? SDPA_TILE_MIXED : 0);
        }
    }
    return bits;
}

// The scan by one warp of rows [r0, r1) (every lane gets the same bits).
template <int BK>
__device__ __forceinline__ int sdpa_tile_bits_warp(const sdpa_params &P, int64_t mo, int64_t s0,
                                                   int64_t r0, int64_t r1, int lane) {
    const int bits = sdpa_tile_scan<BK>(P, mo, s0, r0, r1, lane, 32);
    return (__any_sync(0xffffffffu, bits & SDPA_TILE_LIVE) ? SDPA_TILE_LIVE : 0) |
           (__any_sync(0xffffffffu, bits & SDPA_TILE_MIXED) ? SDPA_TILE_MIXED : 0);
}

// The scan by the whole CTA (rows [r0, r1)); every thread must call it (two barriers).
template <int BK>
__device__ __forceinline__ int sdpa_tile_bits_cta(const sdpa_params &P, int64_t mo, int64_t s0,
                                                  int64_t r0, int64_t r1) {
    const int bits = sdpa_tile_scan<BK>(P, mo, s0, r0, r1, threadIdx.x, blockDim.x);
    return (__syncthreads_or(bits & SDPA_TILE_LIVE) ? SDPA_TILE_LIVE : 0) |
           (__syncthreads_or(bits & SDPA_TILE_MIXED) ? SDPA_TILE_MIXED : 0);
}

// --- tensor-core kernel, pipelined (FlashAttention-2 style)
// One CTA of NW warps per (batch, block of 16 NW query rows); warp w owns rows [16 w, 16 w + 16).
// K/V tiles of SDPA_TC_BK keys go global -> shared with cp.async into two stages: tile t + 1
// is in flight while tile t is computed (sdpa_tc_tile). Rows padded by 8 elements (ldmatrix
// without bank conflicts). Shared memory: 2 stages x (K + V) tiles, dynamic (D 128: 68 KB).

#define SDPA_TC_BK 64        // keys per tile
#define SDPA_SCAN_TILES 1024 // key tiles whose mask bits a CTA keeps (64K keys)

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
    uint16_t *const sm = (uint16_t *)sdpa_tc_dyn;  // stage st: K at sm + 2 st TILE, V after it
    __shared__ uint8_t tile_bits[SDPA_SCAN_TILES]; // the mask's scan, tile by tile (below)
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
        // With a mask over four tiles or more the CTA scans the mask for its rows first: tiles
        // it masks everywhere are passed over. Up to SDPA_SCAN_TILES tiles the warps scan them
        // all at once into shared memory (one tile a warp at a time, eight loads a lane in
        // flight); beyond, the CTA scans each tile before staging it. Over fewer tiles (a
        // 128-token causal mask: two) the scan's round trip before the first load costs about
        // what passing over one tile saves. Not for heads of 32, whose registers the scan's
        // state pushes past 128 (they spill): their attentions (Swin's, MaxViT's windows;
        // SegFormer's, unmasked) span one tile anyway.
        // With a summary of the mask (P.tiles: the layer scanned it once for every CTA) the
        // CTA copies its row block's bits instead.
        const bool scan = D != 32 && P.mask != NULL && (n_tiles >= 4 || P.tiles != NULL);
        const bool prescan = scan && n_tiles <= SDPA_SCAN_TILES;
        const int64_t r_end = blk0 + BQ < P.l ? blk0 + BQ : P.l;
        if (prescan) {
            __syncthreads(); // the previous batch's reads of tile_bits are done
            if (P.tiles != NULL) {
                const uint8_t *src = P.tiles + (int64_t)blockIdx.x * P.tiles_n;
                for (int64_t u = threadIdx.x; u < n_tiles; u += blockDim.x) tile_bits[u] = src[u];
            } else {
                for (int64_t u = warp; u < n_tiles; u += NW) {
                    const int tb =
                        sdpa_tile_bits_warp<SDPA_TC_BK>(P, bo.m, u * SDPA_TC_BK, blk0, r_end, lane);
                    if (lane == 0) tile_bits[u] = (uint8_t)tb;
                }
            }
            __syncthreads();
        }
        int64_t t = 0;
        int bits = SDPA_TILE_LIVE | SDPA_TILE_MIXED;
        if (prescan) {
            while (t < n_tiles && !(tile_bits[t] & SDPA_TILE_LIVE)) t++;
            if (t < n_tiles) bits = tile_bits[t];
        } else if (scan) {
            while (t < n_tiles &&
                   !((bits = sdpa_tile_bits_cta<SDPA_TC_BK>(P, bo.m, t * SDPA_TC_BK, blk0, r_end)) &
                     SDPA_TILE_LIVE))
                t++;
        }
        if (t < n_tiles)
            sdpa_tc_stage<D, LD>(P, k + bo.k, v + bo.v, t * SDPA_TC_BK, sm, sm + SM::TILE);
        uint32_t qf[D / 16][4];
        sdpa_load_q<D>(P, q + bo.q, ra, rb, t4, qf);
        float o[D / 8][4];
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
        float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
        for (int stage = 0; t < n_tiles; stage ^= 1) {
            int64_t nt = t + 1; // the next tile that is not passed over
            int nbits = SDPA_TILE_LIVE | SDPA_TILE_MIXED;
            if (prescan) {
                while (nt < n_tiles && !(tile_bits[nt] & SDPA_TILE_LIVE)) nt++;
                if (nt < n_tiles) nbits = tile_bits[nt];
            } else if (scan) {
                while (nt < n_tiles && !((nbits = sdpa_tile_bits_cta<SDPA_TC_BK>(
                                              P, bo.m, nt * SDPA_TC_BK, blk0, r_end)) &
                                         SDPA_TILE_LIVE))
                    nt++;
            }
            if (nt < n_tiles) {
                uint16_t *nx = sm + (stage ^ 1) * 2 * SM::TILE;
                sdpa_tc_stage<D, LD>(P, k + bo.k, v + bo.v, nt * SDPA_TC_BK, nx, nx + SM::TILE);
                asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            }
            __syncthreads(); // tile t is in shared memory for every warp
            const int64_t s0 = t * SDPA_TC_BK;
            if (!(P.causal && s0 > r0 + 15)) { // else every key of the tile is masked here
                const uint16_t *cur = sm + stage * 2 * SM::TILE;
                sdpa_tc_tile<T, D, SDPA_TC_BK, LD>(P, qf, cur, cur + SM::TILE, s0, ra, rb, lane,
                                                   bo.m, !(bits & SDPA_TILE_MIXED), sl2, o, ma, mb,
                                                   la, lb);
            }
            __syncthreads(); // this stage is consumed before the tile after next is staged into it
            t = nt;
            bits = nbits;
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

// The mask's summary for the pipelined kernel: warp i of the grid scans key tile i % tiles_n for
// the rows of CTA i / tiles_n (bq rows a CTA) into bits[i]. A mask shared by every batch (the
// [L, S] mask of a prompt over a static KV cache, a causal mask given as a tensor) is scanned
// once a layer instead of once for each head's CTAs: Llama-1B's prefill of 512 tokens over a
// cache of 4224 keys, 66 tiles of 4 KB for each of 8 row blocks, scanned 32 times over.
#define SDPA_SUMMARY_WARPS 8
static __global__ void __launch_bounds__(SDPA_SUMMARY_WARPS * 32)
    sdpa_tile_summary_kernel(const __grid_constant__ sdpa_params P, uint8_t *bits, int64_t bq,
                             int64_t items) {
    const int lane = threadIdx.x & 31;
    const int64_t i = (int64_t)blockIdx.x * SDPA_SUMMARY_WARPS + (threadIdx.x >> 5);
    if (i >= items) return; // whole warps: the scan's votes stay converged
    const int64_t r0 = i / P.tiles_n * bq, r1 = r0 + bq < P.l ? r0 + bq : P.l;
    const int tb = sdpa_tile_bits_warp<SDPA_TC_BK>(P, 0, i % P.tiles_n * SDPA_TC_BK, r0, r1, lane);
    if (lane == 0) bits[i] = (uint8_t)tb;
}

// Summarizes P's mask for `blocks` CTAs of bq rows into the workspace and points P->tiles at it,
// when the mask is the same for every batch and spans SDPA_SUMMARY_MIN_TILES to SDPA_SCAN_TILES
// key tiles (below, each CTA's own scan is a round or two of loads; a mask that differs by
// batch, BERT's padding, is scanned by the CTAs of each batch). Otherwise P is left as it was.
#define SDPA_SUMMARY_MIN_TILES 8
static kiln_status sdpa_summarize(const kiln_cuda_ctx *ctx, sdpa_params *P, int64_t bq,
                                  unsigned blocks) {
    if (P->mask == NULL || P->e == 32 || ctx->workspace == NULL) return KILN_OK;
    for (int d = 0; d < P->nb; d++) {
        if (P->bdims[d] > 1 && P->m_bstr[d] != 0) return KILN_OK;
    }
    const int64_t tiles = (P->s + SDPA_TC_BK - 1) / SDPA_TC_BK, items = tiles * blocks;
    if (tiles < SDPA_SUMMARY_MIN_TILES || tiles > SDPA_SCAN_TILES ||
        items > (int64_t)ctx->workspace_nbytes)
        return KILN_OK;
    kiln_cuda_ws_note(ctx, (size_t)items);
    P->tiles = (const uint8_t *)ctx->workspace;
    P->tiles_n = tiles;
    sdpa_tile_summary_kernel<<<(unsigned)((items + SDPA_SUMMARY_WARPS - 1) / SDPA_SUMMARY_WARPS),
                               SDPA_SUMMARY_WARPS * 32, 0, ctx->stream>>>(
        *P, (uint8_t *)ctx->workspace, bq, items);
    return kiln_cuda_check_launch(ctx, "sdpa_tile_summary_kernel");
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
    kc_pdl_enter();
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
        int64_t s_beg = 0, s_end = P.s;
        if (P.causal && r0 + 16 < s_end) s_end = r0 + 16;
        if (P.chunk > 0) { // this CTA's chunk of the keys (a multiple of BK: tiles stay whole)
            s_beg = (int64_t)blockIdx.z * P.chunk;
            if (s_beg + P.chunk < s_end) s_end = s_beg + P.chunk;
        }
        __syncthreads(); // the previous batch's merge buffers are consumed
        // This lane's share of every K/V tile: 8 columns at c of rows j0, j0 + RSTEP, ... (PER
        // rows); shared addresses and row steps computed once, so each copy costs a pointer add.
        constexpr int PER = BK * (D / 8) / 32, RSTEP = 32 / (D / 8);
        const int j0 = lane / (D / 8), c = (lane % (D / 8)) * 8;
        const unsigned ks_a = (unsigned)__cvta_generic_to_shared(ks + j0 * LD + c),
                       vs_a = (unsigned)__cvta_generic_to_shared(vs + j0 * LD + c);
        const int64_t kstep = (int64_t)RSTEP * P.k_rs, vstep = (int64_t)RSTEP * P.v_rs;
        for (int64_t s0 = s_beg + (int64_t)warp * BK; s0 < s_end; s0 += NS * BK) {
            const int bits =
                P.mask != NULL
                    ? sdpa_tile_bits_warp<BK>(P, mo, s0, r0, r0 + 16 < P.l ? r0 + 16 : P.l, lane)
                    : SDPA_TILE_LIVE | SDPA_TILE_MIXED;
            if (!(bits & SDPA_TILE_LIVE)) continue; // masked everywhere: not loaded

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
            sdpa_tc_tile<T, D, BK, LD>(P, qf, ks, vs, s0, ra, rb, lane, mo,
                                       !(bits & SDPA_TILE_MIXED), sl2, o, ma, mb, la, lb);
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
            if (P.chunk > 0) { // the chunk's partial row: unnormalized output, maximum, sum
                float *pr = P.part + (((int64_t)blockIdx.z * P.batch + b) * P.l + r) * (D + 2);
                *(float2 *)(pr + col) = make_float2(a0, a1);
                if (col == 0) *(float2 *)(pr + D) = make_float2(m, l);
                continue;
            }
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            *(uint32_t *)(out + oo + r * P.o_rs + col) = kc_mma<T>::pack(a0 * inv, a1 * inv);
        }
    }
}

// The chunks' partial rows of the split-key kernel merged (flash-decoding's second step): one
// warp per output row. Lane c reads chunk c's maximum and sum (32 chunks per load round), the
// warp reduces them, and each lane then weighs and adds its D / 32 columns over the chunks,
// SDPA_MERGE_UNROLL chunks' loads in flight at a time: the merge of a decode step's 8 x 4 rows
// over 17 chunks is a few load round trips, not one per chunk. The maxima are in log2 units.
#define SDPA_MERGE_WARPS 4
#define SDPA_MERGE_UNROLL 8
template <typename T, int D>
static __global__ void __launch_bounds__(SDPA_MERGE_WARPS * 32)
    sdpa_chunk_merge_kernel(const __grid_constant__ sdpa_params P, int n_chunks) {
    kc_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * SDPA_MERGE_WARPS + (threadIdx.x >> 5);
    if (row >= P.batch * P.l) return;
    const int64_t b = row / P.l, r = row % P.l;
    const int64_t cstride = P.batch * P.l * (D + 2);
    const float *pr = P.part + row * (D + 2);
    float m = -INFINITY;
    for (int c = lane; c < n_chunks; c += 32) m = fmaxf(m, pr[c * cstride + D]);
    m = kc_warp_max(m);
    constexpr int CP = D / 64; // column pairs per lane
    float acc[CP][2], l = 0.0f;
#pragma unroll
    for (int j = 0; j < CP; j++) acc[j][0] = acc[j][1] = 0.0f;
    for (int c0 = 0; c0 < n_chunks && m != -INFINITY; c0 += 32) {
        // lane c's chunk weight, then every lane's columns over these 32 chunks
        float f = 0.0f;
        if (c0 + lane < n_chunks) {
            const float2 ml = *(const float2 *)(pr + (c0 + lane) * cstride + D);
            f = ml.x == -INFINITY ? 0.0f : sdpa_ex2(ml.x - m);
            l += ml.y * f;
        }
        const int nc = n_chunks - c0 < 32 ? n_chunks - c0 : 32;
        for (int u0 = 0; u0 < nc; u0 += SDPA_MERGE_UNROLL) {
            float2 a[SDPA_MERGE_UNROLL][CP];
#pragma unroll
            for (int u = 0; u < SDPA_MERGE_UNROLL; u++) {
                const int c = c0 + u0 + u;
#pragma unroll
                for (int j = 0; j < CP; j++) {
                    a[u][j] = u0 + u < nc ? *(const float2 *)(pr + c * cstride + 64 * j + 2 * lane)
                                          : make_float2(0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int u = 0; u < SDPA_MERGE_UNROLL; u++) {
                const float fu = __shfl_sync(0xffffffffu, f, (u0 + u) & 31);
#pragma unroll
                for (int j = 0; j < CP; j++) {
                    acc[j][0] = fmaf(a[u][j].x, fu, acc[j][0]);
                    acc[j][1] = fmaf(a[u][j].y, fu, acc[j][1]);
                }
            }
        }
    }
    l = kc_warp_sum(l);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const sdpa_offs bo = sdpa_offsets(P, b);
    uint16_t *out = (uint16_t *)P.out;
#pragma unroll
    for (int j = 0; j < CP; j++) {
        *(uint32_t *)(out + bo.o + r * P.o_rs + 64 * j + 2 * lane) =
            kc_mma<T>::pack(acc[j][0] * inv, acc[j][1] * inv);
    }
}

// The tensor-core kernel takes float16/bfloat16 with E = Ev in {32, 64, 80, 128, 256} and 16-byte
// aligned q, k, v (every row then is: E is a multiple of 8) and a 4-byte aligned output. Heads of
// 256 (Gemma's) run on the split-key kernel only (2 warps per 16-row block, 32-key tiles: its
// accumulator and query fragments fill the registers; one build instead of the pipelined
// kernel's three row counts); heads of 80 (StableLM's, Phi's) on the pipelined kernel at 64 rows
// only (one build; the split-key kernel's tile loads assume rows of a power-of-two 16-byte
// count), their fifth 16-column chunk of Q K^T an MMA of its own; heads of 32 (windowed vision
// attention: Swin's 49 or 64 rows per window and head) on the pipelined kernel at 64 rows only.
// Strided operands (folded views): every row and batch stride a multiple of 8 elements (16
// bytes), the output's even (4 bytes).
int kiln_cuda_sdpa_tc_ok(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype) {
    if (!ctx->policy->tc_attention || (dtype != KILN_DTYPE_F16 && dtype != KILN_DTYPE_BF16))
        return 0;
    if (P->e != P->ev || (P->e != 32 && P->e != 64 && P->e != 80 && P->e != 128 && P->e != 256))
        return 0;
    if (P->e == 256 && P->l > 65535 * 16) return 0;
    if (P->q_rs % 8 != 0 || P->k_rs % 8 != 0 || P->v_rs % 8 != 0 || P->o_rs % 2 != 0) return 0;
    for (int d = 0; d < P->nb; d++) {
        if (P->q_bstr[d] % 8 != 0 || P->k_bstr[d] % 8 != 0 || P->v_bstr[d] % 8 != 0 ||
            P->o_bstr[d] % 2 != 0)
            return 0;
    }
    return ((uintptr_t)P->q % 16) == 0 && ((uintptr_t)P->k % 16) == 0 &&
           ((uintptr_t)P->v % 16) == 0 && ((uintptr_t)P->out % 4) == 0;
}

// The pipelined kernel's query rows per CTA: the policy's cuda.sdpa_rows when set; else 64 (4
// warps) when
// batch x ceil(L / 64) CTAs fill the device, 32 when that grid is under one wave, 16 when even
// 32-row CTAs fill less than half a wave. Smaller CTAs re-read K/V from L2 more often; they only
// pay while SMs sit idle. (Grids under one wave of 64-row CTAs normally take the split-key
// kernel: sdpa_split_warps.)
int kiln_cuda_sdpa_tc_rows(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if (P->e == 32 || P->e == 80) return 64; // the one build for these heads
    const int forced = ctx->policy->sdpa_rows;
    if (forced == 16 || forced == 32 || forced == 64) return forced;
    int64_t n64 = P->batch * ((P->l + 63) / 64), n32 = P->batch * ((P->l + 31) / 32);
    if (ctx->sm_count <= 0 || n64 >= ctx->sm_count) return 64;
    return 2 * n32 >= ctx->sm_count ? 32 : 16;
}

template <typename T, int D, int NW>
static kiln_status sdpa_tc_launch_nw(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    int64_t by = P->batch < 65535 ? P->batch : 65535;
    dim3 grid((unsigned)((P->l + 16 * NW - 1) / (16 * NW)), (unsigned)by);
    sdpa_params C = *P;
    KILN_CUDA_TRY(sdpa_summarize(ctx, &C, 16 * NW, grid.x));
    sdpa_tc_kernel<T, D, NW><<<grid, NW * 32, sdpa_tc_smem<D>::BYTES, ctx->stream>>>(C);
    return kiln_cuda_check_launch(ctx, "sdpa_tc_kernel");
}

// Key chunks for the split-key kernel at NS warps of BK-key tiles: 1 unless the grid of 16-row
// blocks leaves most of the device's resident CTAs idle over a long key range (an LLM decode
// step: one block per KV head over the cache). Then the keys are cut into chunks of whole
// NS x BK rounds (one tile per warp at the least), as many as fill the resident CTAs, bounded by
// the partial rows the workspace holds.
template <int D, int NS, int BK>
static int64_t sdpa_chunk_keys(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    const int64_t blocks = P->batch * ((P->l + 15) / 16), round = (int64_t)NS * BK;
    const int64_t resident = (int64_t)ctx->sm_count * (sdpa_sp_min_blocks<D, NS, BK>());
    if (ctx->sm_count <= 0 || ctx->workspace == NULL || P->s < 512 || P->batch > 65535 ||
        2 * blocks > resident)
        return 0;
    int64_t n = resident / blocks;
    const int64_t rounds = (P->s + round - 1) / round;
    if (n > rounds) n = rounds;
    const int64_t row_bytes = P->batch * P->l * (D + 2) * (int64_t)sizeof(float);
    if (n * row_bytes > (int64_t)ctx->workspace_nbytes)
        n = (int64_t)ctx->workspace_nbytes / row_bytes;
    if (n < 2) return 0;
    return (rounds + n - 1) / n * round;
}

template <typename T, int D, int NS, int BK>
static kiln_status sdpa_tc_split_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    int64_t by = P->batch < 65535 ? P->batch : 65535;
    const int64_t chunk = sdpa_chunk_keys<D, NS, BK>(ctx, P);
    if (chunk > 0) {
        sdpa_params C = *P;
        C.chunk = chunk;
        C.part = (float *)ctx->workspace;
        const int n = (int)((P->s + chunk - 1) / chunk);
        kiln_cuda_ws_note(ctx,
                          (size_t)n * (size_t)P->batch * (size_t)P->l * (D + 2) * sizeof(float));
        dim3 grid((unsigned)((P->l + 15) / 16), (unsigned)P->batch, (unsigned)n);
        kc_launch(ctx, sdpa_tc_split_kernel<T, D, NS, BK>, grid, NS * 32,
                  sdpa_sp_smem<D, NS, BK>::BYTES, C);
        KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "sdpa_tc_split_kernel"));
        const int64_t rows = P->batch * P->l;
        kc_launch(ctx, sdpa_chunk_merge_kernel<T, D>,
                  (unsigned)((rows + SDPA_MERGE_WARPS - 1) / SDPA_MERGE_WARPS),
                  SDPA_MERGE_WARPS * 32, 0, C, n);
        return kiln_cuda_check_launch(ctx, "sdpa_chunk_merge_kernel");
    }
    dim3 grid((unsigned)((P->l + 15) / 16), (unsigned)by);
    kc_launch(ctx, sdpa_tc_split_kernel<T, D, NS, BK>, grid, NS * 32,
              sdpa_sp_smem<D, NS, BK>::BYTES, *P);
    return kiln_cuda_check_launch(ctx, "sdpa_tc_split_kernel");
}

// The split-key kernel's warps per 16-row block (0: the pipelined kernel), unless a row count
// (cuda.sdpa_rows: the pipelined kernel) or a split (cuda.sdpa_split) is forced.
// Grids of at least one wave of 64-row CTAs run pipelined (BERT b8: 192 CTAs, 9.5 us where the
// best split took 11.7, Nsight Compute on the H200); smaller ones split each 16-row block's keys
// over 4 warps (BERT b1 5.6 us, the encoder d1024 s256 9.4: 8 warps took 5.7 and 9.8, 2 warps
// 6.8 and 10.7), or 2 while 4 would not stay resident in one wave (sdpa_sp_min_blocks). A grid
// that leaves most SMs idle even at 8 warps, over at least 512 keys (an LLM decode step: one row
// per kv head over the cache) takes 8: Llama-1B shapes, 8 blocks over 4224 keys, 81 us per layer
// at 4 warps, the whole decode step 4.15 -> 3.65 ms at 8 (cuda.sdpa_split=8 on the H200).
// D 128: 2 warps while 3 CTAs per SM hold the grid.
int kiln_cuda_sdpa_split_warps(const kiln_cuda_ctx *ctx, const sdpa_params *P) {
    if (P->e == 256) return 2;              // the one build for these heads, whatever is forced
    if (P->e == 32 || P->e == 80) return 0; // ... and for these, the pipelined kernel at 64 rows
    if (ctx->policy->sdpa_rows != 0) return 0;
    if (P->l > 65535 * 16) return 0;
    if (ctx->policy->sdpa_split != 0) return P->e == 64 ? ctx->policy->sdpa_split : 2;
    if (ctx->sm_count <= 0) return 0;
    const int64_t blocks = P->batch * ((P->l + 15) / 16), sms = ctx->sm_count;
    if (P->batch * ((P->l + 63) / 64) >= sms) return 0;
    if (P->e != 64) return blocks <= 3 * sms ? 2 : 0;
    if (blocks * 8 <= sms && P->s >= 512) return 8; // decode: a few rows over a long cache
    if (blocks * 4 <= 16 * sms) return 4;
    if (blocks * 2 <= 12 * sms) return 2;
    return 0;
}

// Heads of 64, 128 and 256: the split-key or the pipelined kernel, as planned.
template <typename T, int D>
static kiln_status sdpa_tc_launch_any(const kiln_cuda_ctx *ctx, const sdpa_params *P, int split,
                                      int rows) {
    if constexpr (D == 64) {
        switch (split) {
        case 8:
            return P->s <= 128 ? sdpa_tc_split_launch<T, D, 8, 16>(ctx, P)
                               : sdpa_tc_split_launch<T, D, 8, 32>(ctx, P);
        case 4: return sdpa_tc_split_launch<T, D, 4, 32>(ctx, P);
        case 2: return sdpa_tc_split_launch<T, D, 2, 64>(ctx, P);
        default: break;
        }
    } else {
        if (D == 256 || split == 2) return sdpa_tc_split_launch<T, D, 2, 32>(ctx, P);
    }
    if constexpr (D == 256) {
        return KILN_OK; // not reached: every split of these heads runs above
    } else {
        switch (rows) {
        case 16: return sdpa_tc_launch_nw<T, D, 1>(ctx, P);
        case 32: return sdpa_tc_launch_nw<T, D, 2>(ctx, P);
        default: return sdpa_tc_launch_nw<T, D, 4>(ctx, P);
        }
    }
}

template <typename T, int D>
static kiln_status sdpa_tc_launch(const kiln_cuda_ctx *ctx, const sdpa_params *P, int split,
                                  int rows) {
    if constexpr (D == 32 || D == 80) {
        (void)split;
        (void)rows;
        return sdpa_tc_launch_nw<T, D, 4>(ctx, P);
    } else {
        return sdpa_tc_launch_any<T, D>(ctx, P, split, rows);
    }
}

// The key chunks the split-key kernel at `split` warps runs P in (1: none), as
// sdpa_tc_launch's choice of tile size gives them.
int kiln_cuda_sdpa_tc_chunks(const kiln_cuda_ctx *ctx, const sdpa_params *P, int split) {
    int64_t chunk = 0;
    if (P->e == 64) {
        switch (split) {
        case 8:
            chunk = P->s <= 128 ? sdpa_chunk_keys<64, 8, 16>(ctx, P)
                                : sdpa_chunk_keys<64, 8, 32>(ctx, P);
            break;
        case 4: chunk = sdpa_chunk_keys<64, 4, 32>(ctx, P); break;
        case 2: chunk = sdpa_chunk_keys<64, 2, 64>(ctx, P); break;
        default: break;
        }
    } else if (P->e == 256) {
        chunk = sdpa_chunk_keys<256, 2, 32>(ctx, P);
    } else if (split == 2) {
        chunk = sdpa_chunk_keys<128, 2, 32>(ctx, P);
    }
    return chunk > 0 ? (int)((P->s + chunk - 1) / chunk) : 1;
}

kiln_status kiln_cuda_sdpa_tc_run(const kiln_cuda_ctx *ctx, const sdpa_params *P, uint32_t dtype,
                                  int split, int rows) {
    if (dtype == KILN_DTYPE_F16) {
        if (P->e == 32) return sdpa_tc_launch<__half, 32>(ctx, P, split, rows);
        if (P->e == 256) return sdpa_tc_launch<__half, 256>(ctx, P, split, rows);
        if (P->e == 80) return sdpa_tc_launch<__half, 80>(ctx, P, split, rows);
        return P->e == 64 ? sdpa_tc_launch<__half, 64>(ctx, P, split, rows)
                          : sdpa_tc_launch<__half, 128>(ctx, P, split, rows);
    }
    if (P->e == 32) return sdpa_tc_launch<__nv_bfloat16, 32>(ctx, P, split, rows);
    if (P->e == 256) return sdpa_tc_launch<__nv_bfloat16, 256>(ctx, P, split, rows);
    if (P->e == 80) return sdpa_tc_launch<__nv_bfloat16, 80>(ctx, P, split, rows);
    return P->e == 64 ? sdpa_tc_launch<__nv_bfloat16, 64>(ctx, P, split, rows)
                      : sdpa_tc_launch<__nv_bfloat16, 128>(ctx, P, split, rows);
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

cudaError_t kiln_cuda_sdpa_tc_init(void) {
    cudaError_t e = sdpa_tc_init<__half, 64>();
    if (e == cudaSuccess) e = sdpa_tc_init<__half, 128>();
    if (e == cudaSuccess) e = sdpa_tc_init<__nv_bfloat16, 64>();
    if (e == cudaSuccess) e = sdpa_tc_init<__nv_bfloat16, 128>();
    if (e == cudaSuccess) e = sdpa_sp_init<__half, 256, 2, 32>();
    for (int i = 0; i < 2 && e == cudaSuccess; i++) { // heads of 80: the 64-row build only
        e = cudaFuncSetAttribute(i == 0 ? (const void *)sdpa_tc_kernel<__half, 80, 4>
                                        : (const void *)sdpa_tc_kernel<__nv_bfloat16, 80, 4>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 sdpa_tc_smem<80>::BYTES);
    }
    for (int i = 0; i < 2 && e == cudaSuccess; i++) { // heads of 32: the 64-row build only
        e = cudaFuncSetAttribute(i == 0 ? (const void *)sdpa_tc_kernel<__half, 32, 4>
                                        : (const void *)sdpa_tc_kernel<__nv_bfloat16, 32, 4>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 sdpa_tc_smem<32>::BYTES);
    }
    if (e == cudaSuccess) e = sdpa_sp_init<__nv_bfloat16, 256, 2, 32>();
    return e;
}
