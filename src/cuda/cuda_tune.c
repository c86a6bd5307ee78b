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
// Every timed choice is kept in the tuning cache (option tuning_cache: src/core/tune_cache.h,
// through libkiln's services) under a key of what it depends on: the engine's prefix (Kiln's
// version, the GPU, the driver and library versions, the policy) and the layer's plan key (its
// problem: shapes, dtypes, alignments, fused epilogue), or for the whole-engine choice a hash of
// its layers' keys and choices. A later context with the same key applies the record instead of
// timing (the families' *_apply, which check it against what the heuristics return now; one that
// does not check is timed again). Within a context, a layer whose key an earlier layer had takes
// that layer's choice (BERT's twelve identical blocks are timed once), with the cache off too.
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda/attn.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_dnn.h"

#define WG_ENGINE_RATIO 1.3f
#define WG_ENGINE_GAIN 0.98f

#define CHOICE_VERSION 2u
typedef struct stored_choice { // a record's value: a version, then the choice
    uint32_t version;
    uint32_t op;
    kiln_cuda_choice c;
} stored_choice;

typedef struct stored_engine_choice {
    uint32_t version;
    uint32_t keep; // the linears moved to the wgmma kernel together
    float per_layer_us, together_us;
} stored_engine_choice;

static void put_bytes(unsigned char *buf, size_t cap, size_t *n, const void *p, size_t len) {
    if (*n <= cap && len <= cap - *n) memcpy(buf + *n, p, len); // (no wrap-around)
    *n += len;
}

void kiln_cuda_tune_engine_init(cuda_engine *e, const struct cudaDeviceProp *prop,
                                const char *where) {
    char head[320];
    int driver = 0, runtime = 0;
    size_t n = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) kiln_cuda_consume();
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) kiln_cuda_consume();
    snprintf(e->tune_where, sizeof e->tune_where, "%s", where != NULL ? where : "off");
    const int w = snprintf(head, sizeof head,
                           "kiln %s|%.100s|cc %d.%d|%d SMs|%zu MiB|driver %d|cudart %d|cublasLt "
                           "%zu|cudnn %zu|",
                           KILN_VERSION_STRING, prop->name, prop->major, prop->minor,
                           prop->multiProcessorCount, (size_t)(prop->totalGlobalMem >> 20), driver,
                           runtime, (size_t)cublasLtGetVersion(), kiln_cuda_dnn_version());
    put_bytes(e->tune_prefix, sizeof e->tune_prefix, &n, head,
              w > 0 && (size_t)w < sizeof head ? (size_t)w : 0);
    put_bytes(e->tune_prefix, sizeof e->tune_prefix, &n, &e->policy, sizeof e->policy);
    e->tune_prefix_nbytes = n <= sizeof e->tune_prefix ? n : 0; // 0: no cache (cannot happen)
}

// The record key of a layer (kind 'L', op, plan key) or of the engine choice (kind 'E', hash).
static size_t record_key(const cuda_engine *e, char kind, uint32_t op, const int64_t *key,
                         size_t key_words, unsigned char *out, size_t cap) {
    size_t n = 0;
    if (e->tune_prefix_nbytes == 0) return 0;
    put_bytes(out, cap, &n, e->tune_prefix, e->tune_prefix_nbytes);
    put_bytes(out, cap, &n, &kind, 1);
    put_bytes(out, cap, &n, &op, sizeof op);
    while (key_words > 0 && key[key_words - 1] == 0) key_words--; // trailing zeros say nothing
    put_bytes(out, cap, &n, key, key_words * sizeof *key);
    return n <= cap ? n : 0;
}

static int cache_get(const cuda_engine *e, uint32_t op, const int64_t *key, kiln_cuda_choice *c) {
    unsigned char k[1024];
    stored_choice v;
    size_t vn = 0;
    const size_t kn = record_key(e, 'L', op, key, KILN_CUDA_PLAN_KEY, k, sizeof k);
    if (kn == 0 || !kiln_cuda_tune_get(e->tune_where, k, kn, &v, sizeof v, &vn)) return 0;
    if (vn != sizeof v || v.version != CHOICE_VERSION || v.op != op) return 0;
    *c = v.c;
    return 1;
}

static void cache_put(const cuda_engine *e, uint32_t op, const int64_t *key,
                      const kiln_cuda_choice *c) {
    unsigned char k[1024];
    stored_choice v;
    memset(&v, 0, sizeof v);
    v.version = CHOICE_VERSION;
    v.op = op;
    v.c = *c;
    const size_t kn = record_key(e, 'L', op, key, KILN_CUDA_PLAN_KEY, k, sizeof k);
    if (kn > 0) kiln_cuda_tune_put(e->tune_where, k, kn, &v, sizeof v);
}

// What tuning chose for a timed plan, as a record.
// (Convolutions are chosen by cuDNN's heuristic, not timed, but its query costs milliseconds per
// layer at context creation: their choices are kept the same way.)
static void choice_of(const cuda_context *c, uint32_t op, const kiln_cuda_layer_plan *plan,
                      kiln_cuda_choice *ch) {
    memset(ch, 0, sizeof *ch);
    ch->kernel = (int32_t)plan->kernel;
    ch->lt_candidate = plan->gemm.lt.candidate;
    ch->lt_n = plan->gemm.lt.n_candidates;
    ch->splitk = plan->gemm.splitk;
    if (plan->kernel == KILN_CUDA_K_WGMMA) {
        ch->wg[0] = plan->gemm.wg.bn, ch->wg[1] = plan->gemm.wg.split,
        ch->wg[2] = plan->gemm.wg.occ;
    }
    if (plan->gemm.wg_alt_us > 0.0f) {
        ch->wg_alt[0] = plan->gemm.wg_alt.bn, ch->wg_alt[1] = plan->gemm.wg_alt.split;
        ch->wg_alt[2] = plan->gemm.wg_alt.occ;
    }
    ch->us = plan->gemm.us;
    ch->wg_alt_us = plan->gemm.wg_alt_us;
    ch->dnn_cfg = -1;
    if (plan->kernel == KILN_CUDA_K_CUDNN) {
        int n = 0;
        ch->dnn_cfg = kiln_cuda_dnn_sdpa_cfg(c->sdpa_store, plan->sdpa.dnn, &n);
        ch->dnn_n = n;
    }
    ch->dnn_us = plan->sdpa.dnn_us;
    ch->own_us = plan->sdpa.own_us;
    ch->conv_algo = -1;
    if (plan->kernel == KILN_CUDA_K_CUDNN && op == KILN_OP_CONV2D) {
        ch->conv_algo = plan->conv.algo;
        ch->conv_math = plan->conv.math;
    }
    if (op == KILN_OP_CONV2D) { // a 1x1 conv timed on cuDNN and on the pointwise kernel
        ch->dnn_us = plan->conv.dnn_us;
        ch->own_us = plan->conv.pw_us;
    }
}

typedef struct tune_counts {
    uint32_t timed, cached, shared, retimed, stored;
} tune_counts;

// The first layer of the context with this key and a choice (-1: none).
static int64_t same_key(const cuda_context *c, uint32_t upto, uint32_t op, const int64_t *key) {
    const kiln_plan *p = c->engine->plan;
    for (uint32_t li = 0; li < upto; li++) {
        const kiln_cuda_layer_plan *q = &c->layers[li].tuned;
        if (p->layers[li].op == op && (q->timed || op == KILN_OP_CONV2D) &&
            q->kernel != KILN_CUDA_K_NONE && memcmp(q->key, key, sizeof q->key) == 0)
            return li;
    }
    return -1;
}

static void plan_layers(cuda_context *c, tune_counts *n) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    const int tune = e->policy.tune;
    cuda_bound b;
    kiln_cuda_bound_init(c, c->stream, &b);
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        uint32_t op = p->layers[li].op;
        if (!kiln_cuda_op_planned(op) || e->fold.virt[li]) continue;
        if (kiln_cuda_layer_bind(c, li, &b, 0) != KILN_OK) continue;
        kiln_cuda_layer_plan *plan = &c->layers[li].tuned;
        int64_t key[KILN_CUDA_PLAN_KEY];
        kiln_cuda_choice ch;
        int from = 0; // 1: an earlier layer of this context, 2: the tuning cache
        if (tune) {
            kiln_cuda_plan_key(&b.ctx, &b.args, key);
            const int64_t twin = key[0] >= 0 ? same_key(c, li, op, key) : -1;
            if (twin >= 0) {
                choice_of(c, op, &c->layers[twin].tuned, &ch);
                from = 1;
            } else if (key[0] >= 0 && cache_get(e, op, key, &ch)) {
                from = 2;
            }
        }
        b.ctx.choice = from ? &ch : NULL;
        // a failure is reported by the execute that meets it; here the layer stays unplanned
        kiln_status st = kiln_cuda_plan(&b.ctx, &b.args, tune, plan);
        if (st == KILN_OK && from && !plan->cached) {
            kiln_cuda_log(KILN_LOG_INFO,
                          "%s: the %s choice does not match what the libraries offer now: timed "
                          "again",
                          b.where, from == 1 ? "shared" : "tuning cache's");
            n->retimed++;
            b.ctx.choice = NULL;
            st = kiln_cuda_plan(&b.ctx, &b.args, tune, plan);
            from = 0;
        }
        b.ctx.choice = NULL;
        if (st != KILN_OK) continue;
        if (from == 1) n->shared++;
        if (from == 2) n->cached++;
        if (!from && (plan->timed || (tune && op == KILN_OP_CONV2D && key[0] >= 0))) {
            n->timed += plan->timed != 0;
            choice_of(c, op, plan, &ch);
            cache_put(e, op, plan->key, &ch);
            n->stored++;
        }
        if (kiln_cuda_log_enabled(KILN_LOG_INFO)) {
            kiln_layer_info info;
            memset(&info, 0, sizeof info);
            kiln_cuda_plan_describe(plan, op, &info);
            const int says = strstr(info.detail, "tuning cache") != NULL;
            kiln_cuda_log(KILN_LOG_INFO, "%s: %s, %s%s", b.where, info.kernel, info.detail,
                          from == 1            ? " (as an identical layer before it)"
                          : from == 2 && !says ? " (from the tuning cache)"
                                               : "");
        }
    }
}

// A linear the whole-engine choice may move to the wgmma kernel.
static int wg_candidate(const kiln_cuda_layer_plan *plan) {
    return (plan->kernel == KILN_CUDA_K_CUBLASLT || plan->kernel == KILN_CUDA_K_SPLITK) &&
           plan->gemm.wg_alt_us > 0.0f && plan->gemm.us > 0.0f &&
           plan->gemm.wg_alt_us <= WG_ENGINE_RATIO * plan->gemm.us;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void wg_engine_choice(cuda_context *c, tune_counts *counts) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    uint32_t moved = 0;
    if (c->lt == NULL || !e->policy.tune || e->profile || e->policy.debug_sync) return;
    // the record's key: the candidates, their problems and fastest configurations, hashed
    uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_cuda_layer_plan *plan = &c->layers[li].tuned;
        if (!wg_candidate(plan)) continue;
        moved++;
        for (int j = 0; j < 2; j++) {
            h[j] = fnv(h[j], &li, sizeof li);
            h[j] = fnv(h[j], plan->key, sizeof plan->key);
            h[j] = fnv(h[j], &plan->kernel, sizeof plan->kernel);
            h[j] = fnv(h[j], &plan->gemm.wg_alt, sizeof plan->gemm.wg_alt);
        }
    }
    if (moved == 0) return;
    const int64_t key[3] = {(int64_t)h[0], (int64_t)h[1], moved};
    unsigned char k[1024];
    const size_t kn = record_key(e, 'E', 0, key, 3, k, sizeof k);
    stored_engine_choice rec;
    size_t vn = 0;
    const int have = kn > 0 && kiln_cuda_tune_get(e->tune_where, k, kn, &rec, sizeof rec, &vn) &&
                     vn == sizeof rec && rec.version == CHOICE_VERSION && rec.keep <= 1;
    // the moved layers' kernel and fused tail count before the move (kernel NONE: not moved)
    typedef struct {
        kiln_cuda_kernel kernel;
        uint32_t fused;
    } before;
    const size_t nbytes = (size_t)p->n_layers * sizeof(before);
    before *was = kiln_cuda_malloc(nbytes);
    if (was == NULL) return; // (an optimization only)
    const float per_layer =
        have ? rec.per_layer_us : kiln_cuda_time_in_graph(c->stream, kiln_cuda_layers_enqueue, c);
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
    const float together =
        have ? rec.together_us : kiln_cuda_time_in_graph(c->stream, kiln_cuda_layers_enqueue, c);
    const int keep =
        have ? (int)rec.keep
             : per_layer > 0.0f && together > 0.0f && together <= WG_ENGINE_GAIN * per_layer;
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
    if (!have && kn > 0 && per_layer > 0.0f && together > 0.0f) {
        memset(&rec, 0, sizeof rec);
        rec.version = CHOICE_VERSION;
        rec.keep = (uint32_t)keep;
        rec.per_layer_us = per_layer;
        rec.together_us = together;
        kiln_cuda_tune_put(e->tune_where, k, kn, &rec, sizeof rec);
        counts->stored++;
    }
    kiln_cuda_log(KILN_LOG_INFO,
                  "engine: %u linear%s left on cuBLASLt within %.1fx of the wgmma kernel, moved "
                  "to it together: %.2f us per run against %.2f us as chosen per layer: %s%s",
                  moved, moved == 1 ? "" : "s", (double)WG_ENGINE_RATIO, (double)together,
                  (double)per_layer, keep ? "kept" : "undone",
                  have ? " (from the tuning cache)" : "");
}

int kiln_cuda_tune_context(cuda_context *c) {
    const cuda_engine *e = c->engine;
    tune_counts n;
    memset(&n, 0, sizeof n);
    plan_layers(c, &n);
    wg_engine_choice(c, &n);
    if (n.stored > 0) kiln_cuda_tune_flush(e->tune_where);
    // One run of the layer loop on the staging buffers: the kernels load (CUDA loads a kernel at
    // its first launch) and the libraries set up their plans here, not in the first execute. A
    // failure is left to the execute that meets it.
    // (Not with the option profile: every run there is a profiled one.) It also measures the
    // workspace the layers use (workspace_used).
    int warm = !e->profile;
    c->workspace_used = 0;
    if (warm && (kiln_cuda_layers_run(c, c->stream) != KILN_OK ||
                 cudaStreamSynchronize(c->stream) != cudaSuccess)) {
        kiln_cuda_log(KILN_LOG_DEBUG, "context creation's warm-up run failed: %s",
                      kiln_cuda_last_message());
        warm = 0;
    }
    kiln_cuda_consume();
    if (e->policy.tune && n.timed > 0 && e->tune_prefix_nbytes > 0) {
        // Say why the cache did not serve these layers: records made elsewhere are ignored.
        uint32_t total = 0, here = 0;
        kiln_cuda_tune_stats(e->tune_where, e->tune_prefix, e->tune_prefix_nbytes, &total, &here);
        if (total > here) {
            kiln_cuda_log(KILN_LOG_INFO,
                          "tuning cache %s: %u of its %u records were made for another GPU, "
                          "driver, CUDA library or Kiln version or another cuda.* policy: ignored",
                          e->tune_where, total - here, total);
        }
    }
    if (e->policy.tune && (n.timed || n.cached || n.shared)) {
        kiln_cuda_log(KILN_LOG_INFO,
                      "tuning: %u layer%s timed, %u from the tuning cache (%s), %u as an "
                      "identical layer before them, %u timed again",
                      n.timed, n.timed == 1 ? "" : "s", n.cached, e->tune_where, n.shared,
                      n.retimed);
    }
    return warm;
}
