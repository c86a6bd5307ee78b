// SPDX-License-Identifier: Apache-2.0
// Tuning an sdpa layer at context creation (attn.h): every engine configuration cuDNN's
// heuristic offers for its geometry is timed as the engine runs it (inside a CUDA graph:
// kiln_cuda_time_in_graph, cuDNN's own workspace memset included) and the fastest kept; then
// Kiln's own kernel for the layer is timed the same way and runs it when at least as fast (BERT
// b1's 128 x 128 heads, for one: Kiln's split-key kernel 5.4 us against cuDNN's 7.2 plus its
// workspace memset, H200).
#include <string.h>

#include "cuda/attn.h"

typedef struct timed_dnn {
    const kiln_cuda_ctx *ctx;
    int entry;
    const kiln_cuda_attn_geom *g;
} timed_dnn;

static int dnn_enqueue(void *arg) {
    const timed_dnn *t = arg;
    int done = 0;
    return kiln_cuda_dnn_sdpa_run(t->ctx, t->ctx->sdpa_store, t->entry, t->g, &done) == KILN_OK &&
           done;
}

typedef struct timed_own {
    const kiln_cuda_ctx *ctx;
    const kiln_kernel_args *args;
    kiln_cuda_layer_plan *plan;
} timed_own;

static int own_enqueue(void *arg) {
    const timed_own *t = arg;
    return kiln_cuda_sdpa_run(t->ctx, t->args, t->plan) == KILN_OK;
}

void kiln_cuda_sdpa_tune(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                         const kiln_cuda_attn_geom *g, kiln_cuda_layer_plan *plan) {
    int n = 0, best = -1;
    float best_us = -1.0f;
    const int entry = kiln_cuda_dnn_sdpa_entry(ctx, ctx->sdpa_store, g, &n);
    if (entry < 0) return; // cuDNN refuses the geometry: Kiln's kernel, as planned
    // Another layer of this geometry chose already: its configuration is the only one kept (a
    // configuration's plan is finalized once), so it is the one timed against Kiln's kernel.
    const int chosen = kiln_cuda_dnn_sdpa_cfg(ctx->sdpa_store, entry, NULL);
    for (int i = chosen >= 0 ? chosen : 0; i < (chosen >= 0 ? chosen + 1 : n); i++) {
        if (!kiln_cuda_dnn_sdpa_use(ctx, ctx->sdpa_store, entry, i)) continue;
        timed_dnn t = {ctx, entry, g};
        const float us = kiln_cuda_time_in_graph(ctx->stream, dnn_enqueue, &t);
        kiln_cuda_log(KILN_LOG_DEBUG, "cuDNN sdpa configuration %d of %d at %s: %.2f us", i + 1, n,
                      ctx->where ? ctx->where : "?", (double)us);
        if (us >= 0.0f && (best < 0 || us < best_us)) {
            best = i;
            best_us = us;
        }
    }
    if (best < 0 || !kiln_cuda_dnn_sdpa_use(ctx, ctx->sdpa_store, entry, best)) {
        kiln_cuda_log(KILN_LOG_INFO, "sdpa at %s: no cuDNN configuration ran: Kiln's kernel",
                      ctx->where ? ctx->where : "?");
        kiln_cuda_dnn_sdpa_trim(ctx->sdpa_store, entry);
        kiln_cuda_consume();
        return;
    }
    kiln_cuda_dnn_sdpa_trim(ctx->sdpa_store, entry); // the fastest configuration's plan alone
    kiln_cuda_layer_plan own;
    memset(&own, 0, sizeof own);
    own.kernel = plan->sdpa.own;
    own.sdpa = plan->sdpa;
    timed_own t = {ctx, args, &own};
    const float own_us = kiln_cuda_time_in_graph(ctx->stream, own_enqueue, &t);
    kiln_cuda_consume();
    plan->timed = 1;
    plan->sdpa.dnn = entry;
    plan->sdpa.dnn_us = best_us;
    plan->sdpa.own_us = own_us;
    const int keep_own = own_us >= 0.0f && own_us <= best_us;
    plan->kernel = keep_own ? plan->sdpa.own : KILN_CUDA_K_CUDNN;
    kiln_cuda_log(KILN_LOG_INFO, "sdpa at %s: cuDNN %.2f us, Kiln's kernel %.2f us: %s",
                  ctx->where ? ctx->where : "?", (double)best_us, (double)own_us,
                  keep_own ? "Kiln's kernel" : "cuDNN");
}

int kiln_cuda_sdpa_apply(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g,
                         kiln_cuda_layer_plan *plan) {
    const kiln_cuda_choice *ch = ctx->choice;
    int n = 0;
    if (ch->kernel == (int32_t)plan->sdpa.own) {
        plan->kernel = plan->sdpa.own; // cuDNN is not touched at all
    } else {
        if (ch->kernel != KILN_CUDA_K_CUDNN) return 0;
        const int entry = kiln_cuda_dnn_sdpa_entry(ctx, ctx->sdpa_store, g, &n);
        const int chosen = entry >= 0 ? kiln_cuda_dnn_sdpa_cfg(ctx->sdpa_store, entry, NULL) : -1;
        if (entry < 0 || n != ch->dnn_n || (chosen >= 0 && chosen != ch->dnn_cfg) ||
            !kiln_cuda_dnn_sdpa_use(ctx, ctx->sdpa_store, entry, ch->dnn_cfg))
            return 0;
        if (chosen < 0) kiln_cuda_dnn_sdpa_trim(ctx->sdpa_store, entry);
        plan->kernel = KILN_CUDA_K_CUDNN;
        plan->sdpa.dnn = entry;
    }
    plan->sdpa.dnn_us = ch->dnn_us;
    plan->sdpa.own_us = ch->own_us;
    plan->timed = 1;
    return 1;
}
