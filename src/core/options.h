// SPDX-License-Identifier: Apache-2.0
// Runtime options: one table (name, type, default, scope, help, where the value lives),
// process-wide values, per-load overrides and, for the debug options, an override from the
// environment, all resolved into a kiln_options snapshot when an engine loads (kiln_engine_load).
// docs/options.md lists the table; options_test checks that it matches.
#ifndef KILN_CORE_OPTIONS_H
#define KILN_CORE_OPTIONS_H

#include <stdint.h>

#include "kiln/kiln.h"

// The CUDA backend's policy: every kernel and library choice a user or a test may force, the
// options "cuda.<name>" (docs/options.md). The CUDA plugin reads only this struct: it never
// looks at the environment. Values are already validated.
typedef struct kiln_cuda_policy {
    int cublaslt;         // bool: GEMMs through cuBLASLt (else Kiln's tiled kernel)
    int cudnn;            // bool: convolutions and attention may use cuDNN
    int cudnn_sdpa;       // bool: attention may use cuDNN's fused SDPA
    int tune;             // bool: candidates are timed at context creation (else heuristics)
    int gemv;             // bool: Kiln's GEMV for linears of at most 8 rows
    int gemv_fold;        // bool: RMSNorm and gated pairs run inside the GEMV
    int wgmma;            // bool: Kiln's small-M TMA + wgmma linear (sm_90)
    int wgmma_bn;         // wgmma_config: 0 (auto) or 64 / 128 columns per CTA, untimed
    int wgmma_split;      // ... K split over 1, 2, 4 or 8 CTAs
    int wgmma_occ;        // ... 1 or 2 CTAs per SM
    int splitk;           // 0: timed where it may pay; -1: never; 2, 4, 8: forced, untimed
    int pdl;              // bool: small-M linears and small kernels launch with PDL
    int nhwc;             // bool: 4-D fp16/bf16 activations of convolutions kept NHWC
    int stem_kernel;      // bool: Kiln's stem conv for C % 8 != 0 convs (with nhwc)
    int stem_gather;      // the stem kernel's gather mode: 0 auto, 1 half, 2 global
    int attention_fold;   // bool: head split/merge views folded into sdpa
    int tc_attention;     // bool: the tensor-core sdpa kernels (else the fp32-FMA ones)
    int sdpa_rows;        // 0 (by occupancy) or 16 / 32 / 64 query rows per CTA
    int sdpa_split;       // 0 (by residency) or 2 / 4 / 8 warps of the split-key kernel
    int l2_keep_pct;      // percent of L2 the small-M weights may keep (0..100)
    int flag_wait;        // bool: a replay ends by waiting on its last node's flag
    int debug_sync;       // bool: graphs off, synchronize and check after every layer
    int profile_delay_us; // with the option profile: the delay kernel ahead of each layer (us)
    int dw_rows;          // depthwise convs, pixels per thread: 0 by size, -1 one, 1 a row of 4
    int conv_pw;          // 1x1 NHWC convs on the pointwise kernel: 0 timed, -1 never, 1 always
    int conv_lt;          // 1x1 NHWC convs as a cuBLASLt GEMM: 0 timed, -1 never, 1 always
} kiln_cuda_policy;

typedef struct kiln_options {
    char device[32];                   // "auto" | "cpu" | "cuda:N"
    int use_cuda_graphs;               // bool
    int use_shared_activation_scratch; // bool
    int64_t num_threads;               // CPU backend threads (1..64)
    int profile;                       // bool: time every layer (kiln_context_layer_info)
    int verify_weights;                // bool: external weights checked against their keys
    char tuning_cache[1024];           // "auto" | "off" | a file path (the CUDA tuning cache)
    int link_delegates;                // bool: ExecuTorch delegate links (the adapter reads it)
    int check_cache_rows;              // bool: unwritten cache rows below a position refused
    kiln_cuda_policy cuda;             // the options cuda.*
} kiln_options;

// The process-wide options with per-load settings applied on top, then the environment's debug
// overrides (validated: unknown names, wrong types and bad values are KILN_ERR_INVALID_ARG
// naming the option or variable and the accepted values).
kiln_status kiln_options_resolve(const kiln_option_setting *settings, uint32_t n_settings,
                                 kiln_options *out);

// The value of option `name` in o as text, as kiln_get_option writes it (KILN_ERR_INVALID_ARG
// for an unknown name, listing the valid ones).
kiln_status kiln_options_get(const kiln_options *o, const char *name, char *buf, size_t buf_nbytes);

#endif // KILN_CORE_OPTIONS_H
