// SPDX-License-Identifier: Apache-2.0
// Context creation's planning (cuda_backend.h). Every planned layer (linear, matmul, conv2d,
// sdpa) is planned once at the largest shapes, with the I/O in the staging buffers, so that a
// first execute at those shapes finds its plan current (and creates no descriptor); with the
// option cuda.tune its candidates are timed on its own buffers (gemm_tune.cu, attn_tune.c).
//
// Then the choice of the wgmma kernel on the whole engine. The per-layer choice times each
// linear alone, its weight hot in L2 from the repeats. In the engine a weight comes from HBM
// unless the L2 plan keeps it (only the small-M kernels' loads carry the plan's hints), the erf
// GELU the wgmma kernel fuses saves a kernel, and with PDL a layer's weight stream starts under
// the previous layer's end: a chain of linears can run faster on it even where each layer alone
// is slower (the MLP b64 about 2 us faster with every layer on it). So the linears left on
// cuBLASLt whose fastest wgmma configuration timed within WG_ENGINE_RATIO of their time move to
// it together; the whole layer loop is timed both ways inside a CUDA graph, and the move stays
// only when the engine runs at WG_ENGINE_GAIN of its time or better.
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_backend.h"

#define WG_ENGINE_RATIO 1.3f
#define WG_ENGINE_GAIN 0.98f

static void plan_layers(cuda_context *c) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    cuda_bound b;
    kiln_cuda_bound_init(c, c->stream, &b);
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        uint32_t op = p->layers[li].op;
        if (!kiln_cuda_op_planned(op) || e->fold.virt[li]) continue;
        if (kiln_cuda_layer_bind(c, li, &b, 0) != KILN_OK) continue;
        kiln_cuda_layer_plan *plan = &c->layers[li].tuned;
        // a failure is reported by the execute that meets it; here the layer stays unplanned
        if (kiln_cuda_plan(&b.ctx, &b.args, e->policy.tune, plan) != KILN_OK) continue;
        if (kiln_cuda_log_enabled(KILN_LOG_INFO)) {
            kiln_layer_info info;
            memset(&info, 0, sizeof info);
            kiln_cuda_plan_describe(plan, op, &info);
            kiln_cuda_log(KILN_LOG_INFO, "%s: %s, %s", b.where, info.kernel, info.detail);
        }
    }
}

// A linear the whole-engine choice may move to the wgmma kernel.
static int wg_candidate(const kiln_cuda_layer_plan *plan) {
    return (plan->kernel == KILN_CUDA_K_CUBLASLT || plan->kernel == KILN_CUDA_K_SPLITK) &&
           plan->gemm.wg_alt_us > 0.0f && plan->gemm.us > 0.0f &&
           plan->gemm.wg_alt_us <= WG_ENGINE_RATIO * plan->gemm.us;
}

static void wg_engine_choice(cuda_context *c) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    uint32_t moved = 0;
    if (c->lt == NULL || !e->policy.tune || e->profile || e->policy.debug_sync) return;
    for (uint32_t li = 0; li < p->n_layers; li++) moved += wg_candidate(&c->layers[li].tuned);
    if (moved == 0) return;
    // the moved layers' kernel and fused tail count before the move (kernel NONE: not moved)
    typedef struct {
        kiln_cuda_kernel kernel;
        uint32_t fused;
    } before;
    const size_t nbytes = (size_t)p->n_layers * sizeof(before);
    before *was = kiln_cuda_malloc(nbytes);
    if (was == NULL) return; // (an optimization only)
    const float per_layer = kiln_cuda_time_in_graph(c->stream, kiln_cuda_layers_enqueue, c);
    for (uint32_t li = 0; li < p->n_layers; li++) {
        kiln_cuda_layer_plan *plan = &c->layers[li].tuned;
        was[li].kernel = KILN_CUDA_K_NONE;
        if (!wg_candidate(plan)) continue;
        was[li].kernel = plan->kernel;
        was[li].fused = plan->fused;
        plan->kernel = KILN_CUDA_K_WGMMA; // the layer loop runs it with wg
        plan->gemm.wg = plan->gemm.wg_alt;
        plan->fused = plan->gemm.epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0;
    }
    const float together = kiln_cuda_time_in_graph(c->stream, kiln_cuda_layers_enqueue, c);
    const int keep = per_layer > 0.0f && together > 0.0f && together <= WG_ENGINE_GAIN * per_layer;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        kiln_cuda_layer_plan *plan = &c->layers[li].tuned;
        if (was[li].kernel == KILN_CUDA_K_NONE) continue;
        if (keep) {
            plan->gemm.us = plan->gemm.wg_alt_us;
            snprintf(plan->gemm.why, sizeof plan->gemm.why,
                     "moved with %u linear%s: the engine %.2f us against %.2f us", moved,
                     moved == 1 ? "" : "s", (double)together, (double)per_layer);
        } else {
            plan->kernel = was[li].kernel;
            plan->fused = was[li].fused;
        }
    }
    kiln_cuda_free(was, nbytes);
    kiln_cuda_log(KILN_LOG_INFO,
                  "engine: %u linear%s left on cuBLASLt within %.1fx of the wgmma kernel, moved "
                  "to it together: %.2f us per run against %.2f us as chosen per layer: %s",
                  moved, moved == 1 ? "" : "s", (double)WG_ENGINE_RATIO, (double)together,
                  (double)per_layer, keep ? "kept" : "undone");
}

void kiln_cuda_tune_context(cuda_context *c) {
    plan_layers(c);
    wg_engine_choice(c);
}
