// SPDX-License-Identifier: Apache-2.0
// The attention family's internals (C-callable). op_attention.cu plans an sdpa layer: Kiln's own
// kernel for its shapes (the tensor-core kernels of attn_tc.cu, or the fp32-FMA ones of
// attn_flash.cu), or cuDNN's fused SDPA (dnn_sdpa.c) where it takes the layer, timed against
// Kiln's kernel at context creation (attn_tune.c). attn_run.cu runs a plan.
#ifndef KILN_CUDA_ATTN_H
#define KILN_CUDA_ATTN_H

#include "cuda/cuda_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

// One sdpa as cuDNN sees it: q [b, hq, sq, d], k [b, hk, skv, d], v [b, hk, skv, dv],
// out [b, hq, sq, dv], each with element strides over those four dims (innermost 1).
typedef struct kiln_cuda_attn_geom {
    uint32_t dtype;
    int64_t b, hq, hk, sq, skv, d, dv;
    int64_t str[4][4]; // q, k, v, out
    float scale;
    const void *q, *k, *v;
    void *out;
} kiln_cuda_attn_geom;

// The layer's sdpa as cuDNN's geometry: 0 when cuDNN's fused SDPA cannot take it (a mask or
// causality, another dtype, head sizes, strides, the policy: a forced Kiln kernel keeps it).
int kiln_cuda_sdpa_dnn_geom(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                            kiln_cuda_attn_geom *g);

// --- cuDNN's fused SDPA (dnn_sdpa.c: the backend graph API's SDPA_FWD operation, cuDNN >= 9.13:
// O = softmax(Q K^T * scale) V, no mask, no stats)

#define KILN_CUDA_SDPA_MAX_PLANS 32 // geometries a context keeps plans for (all its sdpa layers)

kiln_cuda_sdpa_store *kiln_cuda_sdpa_store_new(void); // NULL when out of memory
void kiln_cuda_sdpa_store_free(kiln_cuda_sdpa_store *store);
// The store's entry for g's geometry (created with its operation graph and the heuristic's
// engine configurations), or -1 when cuDNN refuses it (remembered) or the store is full.
// *n_configs: the configurations that may be tried.
int kiln_cuda_dnn_sdpa_entry(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store,
                             const kiln_cuda_attn_geom *g, int *n_configs);
// Makes configuration cfg (0-based) the entry's execution plan, finalizing it the first time;
// 0 when it does not finalize within the workspace. The plans finalized stay (tuning switches
// among them) until kiln_cuda_dnn_sdpa_trim keeps the one in use alone.
int kiln_cuda_dnn_sdpa_use(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry,
                           int cfg);
void kiln_cuda_dnn_sdpa_trim(kiln_cuda_sdpa_store *store, int entry);
// The configuration an entry runs (0-based; -1: none chosen yet) and, in *n_cfg (may be NULL),
// of how many the heuristic offered: an entry is shared by the layers of its geometry, and the
// first one to plan it chooses.
int kiln_cuda_dnn_sdpa_cfg(const kiln_cuda_sdpa_store *store, int entry, int *n_cfg);
// The first configuration that finalizes (the heuristic's order); 0 when none does.
int kiln_cuda_dnn_sdpa_use_first(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry);
// Enqueues the entry's plan on g's pointers; *done = 0 when cuDNN declined before enqueuing
// anything (remembered: the entry is refused from then on).
kiln_status kiln_cuda_dnn_sdpa_run(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry,
                                   const kiln_cuda_attn_geom *g, int *done);
// "configuration 2 of 5, workspace 0" for kiln_layer_info.
void kiln_cuda_dnn_sdpa_describe(const kiln_cuda_sdpa_store *store, int entry, char *buf, size_t n);

// --- tuning (attn_tune.c): context creation only

// Applies ctx->choice (the tuning cache's record) to a planned sdpa: 1 when it checks (its
// kernel is the layer's own kernel, or a cuDNN configuration the heuristic offers now).
int kiln_cuda_sdpa_apply(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g,
                         kiln_cuda_layer_plan *plan);

// Times every cuDNN configuration for g's geometry as the engine runs it, keeps the fastest,
// then times Kiln's own kernel (plan->sdpa.own) and leaves the faster in *plan.
void kiln_cuda_sdpa_tune(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                         const kiln_cuda_attn_geom *g, kiln_cuda_layer_plan *plan);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_ATTN_H
