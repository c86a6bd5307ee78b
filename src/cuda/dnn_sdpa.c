// SPDX-License-Identifier: Apache-2.0
// sdpa through cuDNN's fused attention (attn.h): one CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR
// (cuDNN >= 9.13: O = softmax(Q K^T * scale) V, no mask, no stats) in an operation graph, per
// geometry an entry of the layer's store: the graph, the heuristic's engine configurations, and
// one execution plan. A layer keeps up to KILN_CUDA_SDPA_MAX_PLANS entries for the life of the
// context: a CUDA graph recorded with a plan's kernel may still be described or replayed after
// the shapes changed, and cuDNN releases a plan's kernels with it. Geometries beyond that, and
// any refusal (the operation, the graph, no engine, the workspace), run on Kiln's kernel.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cuda/attn.h"
#include "cuda/cuda_dnn.h"

#if KILN_CUDA_HAVE_CUDNN && CUDNN_VERSION >= 91300 // the header declares the SDPA_FWD operation

#define api kiln_cuda_dnn_fn
#define ATTN_MAX_CFG 8
#define ATTN_KEY 25
enum { ATTN_UID_Q = 1, ATTN_UID_K, ATTN_UID_V, ATTN_UID_O, ATTN_UID_SCALE };

typedef struct attn_entry {
    int state; // 1: graph ready; 3: cuDNN refused this geometry
    int64_t key[ATTN_KEY];
    cudnnBackendDescriptor_t t[5], op, graph, heur, cfg[ATTN_MAX_CFG], vpack;
    // the execution plans finalized so far, one per configuration: tuning times several and
    // keeps them until kiln_cuda_dnn_sdpa_trim: a configuration's plan is finalized once (a
    // second finalize of the fastest one, after the later candidates', failed on the H200 for
    // BERT b8's heads, and each finalize compiles kernels)
    cudnnBackendDescriptor_t plans[ATTN_MAX_CFG];
    int64_t plan_ws[ATTN_MAX_CFG];
    cudnnBackendDescriptor_t plan; // plans[cfg_used], the one that runs (NULL: none yet)
    int n_cfg;                     // configurations the heuristic returned (at most ATTN_MAX_CFG)
    int cfg_used;                  // the configuration `plan` runs (-1: none yet)
    int64_t ws_nbytes;
    const void *vp_ptrs[4]; // the pointers vpack binds (q, k, v, out)
    void *vp_ws;
    float scale; // the by-value scale tensor's host value (read at execute and capture)
} attn_entry;

struct kiln_cuda_sdpa_store {
    int n;
    attn_entry e[KILN_CUDA_SDPA_MAX_PLANS];
};

static void destroy_desc(cudnnBackendDescriptor_t *d) {
    if (*d != NULL) api.cudnnBackendDestroyDescriptor(*d);
    *d = NULL;
}

static void entry_clear(attn_entry *d) {
    for (int i = 0; i < 5; i++) destroy_desc(&d->t[i]);
    for (int i = 0; i < ATTN_MAX_CFG; i++) destroy_desc(&d->plans[i]);
    for (int i = 0; i < ATTN_MAX_CFG; i++) destroy_desc(&d->cfg[i]);
    destroy_desc(&d->op);
    destroy_desc(&d->graph);
    destroy_desc(&d->heur);
    destroy_desc(&d->vpack);
    d->plan = NULL;
    d->n_cfg = 0;
    d->cfg_used = -1;
}

kiln_cuda_sdpa_store *kiln_cuda_sdpa_store_new(void) {
    return kiln_cuda_calloc(sizeof(kiln_cuda_sdpa_store));
}

void kiln_cuda_sdpa_store_free(kiln_cuda_sdpa_store *store) {
    if (store == NULL) return;
    for (int i = 0; i < store->n; i++) entry_clear(&store->e[i]);
    kiln_cuda_free(store, sizeof *store);
}

static int bset(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    return api.cudnnBackendSetAttribute(d, a, t, n, v) == CUDNN_STATUS_SUCCESS;
}

static cudnnBackendDescriptor_t bnew(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = NULL;
    if (api.cudnnBackendCreateDescriptor(t, &d) != CUDNN_STATUS_SUCCESS) return NULL;
    return d;
}

static cudnnBackendDescriptor_t attn_tensor(int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                            const int64_t *str, int by_value) {
    cudnnBackendDescriptor_t t = bnew(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    const bool bv = by_value != 0;
    if (t == NULL) return NULL;
    if (!bset(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
        !bset(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims) ||
        !bset(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str) ||
        !bset(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ||
        !bset(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align) ||
        (bv && !bset(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv)) ||
        api.cudnnBackendFinalize(t) != CUDNN_STATUS_SUCCESS) {
        api.cudnnBackendDestroyDescriptor(t);
        return NULL;
    }
    return t;
}

// Why cuDNN refused (its last error message), for the DEBUG log.
static const char *attn_why(char *buf, size_t n) {
    buf[0] = '\0';
    api.cudnnGetLastErrorString(buf, n);
    return buf[0] != '\0' ? buf : "no message";
}

static void key_of(const kiln_cuda_attn_geom *g, int64_t *key) {
    union {
        float f;
        uint32_t u;
    } sc = {.f = g->scale};
    const int64_t head[9] = {g->dtype, g->b, g->hq, g->hk, g->sq, g->skv, g->d, g->dv, sc.u};
    memset(key, 0, ATTN_KEY * sizeof *key);
    memcpy(key, head, sizeof head);
    memcpy(key + 9, g->str, sizeof g->str);
}

// Builds the operation graph and the heuristic's configurations for g into d; 0 (DEBUG log) when
// cuDNN refuses at any step.
static int entry_build(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, attn_entry *d) {
    const cudnnDataType_t dt = g->dtype == KILN_DTYPE_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    const int64_t dims[4][4] = {{g->b, g->hq, g->sq, g->d},
                                {g->b, g->hk, g->skv, g->d},
                                {g->b, g->hk, g->skv, g->dv},
                                {g->b, g->hq, g->sq, g->dv}};
    const int64_t one[4] = {1, 1, 1, 1};
    const cudnnBackendAttributeName_t io[4] = {
        CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
        CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC};
    const char *step = "tensor descriptors";
    char why[256];
    cudnnHandle_t h = ctx->dnn->h;
    int64_t n = 0, got = 0;
    entry_clear(d);
    for (int i = 0; i < 4; i++) {
        d->t[i] = attn_tensor(ATTN_UID_Q + i, dt, dims[i], g->str[i], 0);
        if (d->t[i] == NULL) goto refused;
    }
    d->t[4] = attn_tensor(ATTN_UID_SCALE, CUDNN_DATA_FLOAT, one, one, 1);
    if (d->t[4] == NULL) goto refused;
    step = "the SDPA_FWD operation";
    d->op = bnew(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    if (d->op == NULL) goto refused;
    for (int i = 0; i < 4; i++) {
        if (!bset(d->op, io[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d->t[i])) goto refused;
    }
    if (!bset(d->op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
              &d->t[4]) ||
        api.cudnnBackendFinalize(d->op) != CUDNN_STATUS_SUCCESS)
        goto refused;
    step = "the operation graph";
    d->graph = bnew(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (d->graph == NULL ||
        !bset(d->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ||
        !bset(d->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d->op) ||
        api.cudnnBackendFinalize(d->graph) != CUDNN_STATUS_SUCCESS)
        goto refused;
    step = "the engine heuristic";
    for (int pass = 0; pass < 2 && n == 0; pass++) {
        const cudnnBackendHeurMode_t mode =
            pass == 0 ? CUDNN_HEUR_MODE_A : CUDNN_HEUR_MODE_FALLBACK;
        destroy_desc(&d->heur);
        d->heur = bnew(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        if (d->heur == NULL ||
            !bset(d->heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &d->graph) ||
            !bset(d->heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ||
            api.cudnnBackendFinalize(d->heur) != CUDNN_STATUS_SUCCESS ||
            api.cudnnBackendGetAttribute(d->heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                         NULL) != CUDNN_STATUS_SUCCESS)
            n = 0;
    }
    if (n <= 0) goto refused;
    if (n > ATTN_MAX_CFG) n = ATTN_MAX_CFG;
    for (int64_t i = 0; i < n; i++) {
        d->cfg[i] = bnew(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (d->cfg[i] == NULL) goto refused;
    }
    if (api.cudnnBackendGetAttribute(d->heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                     d->cfg) != CUDNN_STATUS_SUCCESS ||
        got <= 0)
        goto refused;
    d->n_cfg = (int)(got < n ? got : n);
    d->scale = g->scale;
    kiln_cuda_consume();
    return 1;
refused:
    kiln_cuda_log(KILN_LOG_DEBUG,
                  "cuDNN declined sdpa [%lld, %lld/%lld, %lld x %lld, %lld/%lld] at %s (%s: %s): "
                  "Kiln's kernel",
                  (long long)g->b, (long long)g->hq, (long long)g->hk, (long long)g->sq,
                  (long long)g->skv, (long long)g->d, (long long)g->dv,
                  ctx->where ? ctx->where : "?", step, attn_why(why, sizeof why));
    entry_clear(d);
    kiln_cuda_consume(); // a refusal must not leave a CUDA error pending
    return 0;
}

int kiln_cuda_dnn_sdpa_entry(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store,
                             const kiln_cuda_attn_geom *g, int *n_configs) {
    int64_t key[ATTN_KEY];
    *n_configs = 0;
    if (store == NULL || ctx->dnn == NULL || !kiln_cuda_dnn_graph_ok()) return -1;
    key_of(g, key);
    for (int i = 0; i < store->n; i++) {
        attn_entry *d = &store->e[i];
        if (memcmp(d->key, key, sizeof key) != 0) continue;
        if (d->state != 1) return -1;
        *n_configs = d->n_cfg;
        return i;
    }
    if (store->n == KILN_CUDA_SDPA_MAX_PLANS) return -1; // a geometry beyond the kept plans
    attn_entry *d = &store->e[store->n++];
    memset(d, 0, sizeof *d);
    memcpy(d->key, key, sizeof key);
    d->cfg_used = -1;
    d->state = entry_build(ctx, g, d) ? 1 : 3;
    if (d->state != 1) return -1;
    *n_configs = d->n_cfg;
    return store->n - 1;
}

int kiln_cuda_dnn_sdpa_use(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry,
                           int cfg) {
    attn_entry *d = &store->e[entry];
    cudnnHandle_t h = ctx->dnn->h;
    int64_t cnt = 0, ws = 0;
    char why[256];
    if (d->state != 1 || cfg < 0 || cfg >= d->n_cfg) return 0;
    if (d->plans[cfg] == NULL) {
        cudnnBackendDescriptor_t plan = bnew(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        if (plan == NULL) return 0;
        if (!bset(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ||
            !bset(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &d->cfg[cfg]) ||
            api.cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS ||
            api.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &cnt, &ws) != CUDNN_STATUS_SUCCESS ||
            ws < 0 || (size_t)ws > ctx->workspace_nbytes) {
            kiln_cuda_log(KILN_LOG_DEBUG,
                          "cuDNN sdpa configuration %d at %s: no execution plan within the %zu "
                          "bytes of workspace (%s)",
                          cfg + 1, ctx->where ? ctx->where : "?", ctx->workspace_nbytes,
                          attn_why(why, sizeof why));
            api.cudnnBackendDestroyDescriptor(plan);
            kiln_cuda_consume();
            return 0;
        }
        d->plans[cfg] = plan;
        d->plan_ws[cfg] = ws;
    }
    if (d->cfg_used != cfg) destroy_desc(&d->vpack); // rebuilt for the plan's workspace
    d->plan = d->plans[cfg];
    d->ws_nbytes = d->plan_ws[cfg];
    d->cfg_used = cfg;
    return 1;
}

int kiln_cuda_dnn_sdpa_cfg(const kiln_cuda_sdpa_store *store, int entry, int *n_cfg) {
    if (n_cfg != NULL) *n_cfg = 0;
    if (store == NULL || entry < 0 || entry >= store->n || store->e[entry].plan == NULL) return -1;
    if (n_cfg != NULL) *n_cfg = store->e[entry].n_cfg;
    return store->e[entry].cfg_used;
}

void kiln_cuda_dnn_sdpa_trim(kiln_cuda_sdpa_store *store, int entry) {
    attn_entry *d = &store->e[entry];
    for (int i = 0; i < ATTN_MAX_CFG; i++) {
        if (i != d->cfg_used) destroy_desc(&d->plans[i]);
    }
}

int kiln_cuda_dnn_sdpa_use_first(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry) {
    attn_entry *d = &store->e[entry];
    if (d->plan != NULL) return 1; // planned already (for another record of the same geometry)
    for (int i = 0; i < d->n_cfg; i++) {
        if (kiln_cuda_dnn_sdpa_use(ctx, store, entry, i)) return 1;
    }
    return 0;
}

// (Re)binds the variant pack to g's pointers; 0 when cuDNN refuses it.
static int attn_bind(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, attn_entry *d) {
    const void *now[4] = {g->q, g->k, g->v, g->out};
    void *ws = d->ws_nbytes > 0 ? ctx->workspace : NULL;
    if (d->vpack != NULL && memcmp(now, d->vp_ptrs, sizeof now) == 0 && ws == d->vp_ws) return 1;
    destroy_desc(&d->vpack);
    d->vpack = bnew(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    void *ptrs[5] = {(void *)g->q, (void *)g->k, (void *)g->v, g->out, &d->scale};
    const int64_t uids[5] = {ATTN_UID_Q, ATTN_UID_K, ATTN_UID_V, ATTN_UID_O, ATTN_UID_SCALE};
    if (d->vpack == NULL ||
        !bset(d->vpack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 5, ptrs) ||
        !bset(d->vpack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 5, uids) ||
        !bset(d->vpack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws) ||
        api.cudnnBackendFinalize(d->vpack) != CUDNN_STATUS_SUCCESS) {
        destroy_desc(&d->vpack);
        return 0;
    }
    memcpy(d->vp_ptrs, now, sizeof now);
    d->vp_ws = ws;
    return 1;
}

kiln_status kiln_cuda_dnn_sdpa_run(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry,
                                   const kiln_cuda_attn_geom *g, int *done) {
    attn_entry *d = &store->e[entry];
    char why[256];
    *done = 0;
    if (d->state != 1 || d->plan == NULL) return KILN_OK;
    if (!attn_bind(ctx, g, d)) {
        kiln_cuda_log(KILN_LOG_DEBUG, "cuDNN sdpa variant pack refused at %s (%s): Kiln's kernel",
                      ctx->where ? ctx->where : "?", attn_why(why, sizeof why));
        kiln_cuda_consume();
        return KILN_OK;
    }
    if (d->ws_nbytes > 0 &&
        (ctx->workspace == NULL || (size_t)d->ws_nbytes > ctx->workspace_nbytes)) {
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cuDNN sdpa at %s needs %lld bytes of workspace, %zu here: "
                      "Kiln's kernel",
                      ctx->where ? ctx->where : "?", (long long)d->ws_nbytes,
                      ctx->workspace_nbytes);
        return KILN_OK;
    }
    kiln_cuda_ws_note(ctx, (size_t)d->ws_nbytes);
    api.cudnnSetStream(ctx->dnn->h, ctx->stream);
    cudnnStatus_t s = api.cudnnBackendExecute(ctx->dnn->h, d->plan, d->vpack);
    if (s != CUDNN_STATUS_SUCCESS) {
        // Refused before any work was enqueued: Kiln's kernel from now on at this geometry.
        kiln_cuda_consume();
        d->state = 3;
        kiln_cuda_log(KILN_LOG_DEBUG, "cudnnBackendExecute declined sdpa (%s) at %s: %s",
                      api.cudnnGetErrorString(s), ctx->where ? ctx->where : "?",
                      attn_why(why, sizeof why));
        return KILN_OK;
    }
    kiln_status st = kiln_cuda_check_launch(ctx, "cudnnBackendExecute (sdpa)");
    *done = st == KILN_OK;
    return st;
}

void kiln_cuda_dnn_sdpa_describe(const kiln_cuda_sdpa_store *store, int entry, char *buf,
                                 size_t n) {
    const attn_entry *d = store != NULL && entry >= 0 && entry < store->n ? &store->e[entry] : NULL;
    if (d == NULL) {
        snprintf(buf, n, "cuDNN fused SDPA");
        return;
    }
    snprintf(buf, n, "cuDNN fused SDPA, engine configuration %d of %d, workspace %lld",
             d->cfg_used + 1, d->n_cfg, (long long)d->ws_nbytes);
}

#else // cuDNN absent at build time, or its header older than 9.13: attention on Kiln's kernels

kiln_cuda_sdpa_store *kiln_cuda_sdpa_store_new(void) { return NULL; }
void kiln_cuda_sdpa_store_free(kiln_cuda_sdpa_store *store) { (void)store; }
int kiln_cuda_dnn_sdpa_entry(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store,
                             const kiln_cuda_attn_geom *g, int *n_configs) {
    (void)ctx;
    (void)store;
    (void)g;
    *n_configs = 0;
    return -1;
}
int kiln_cuda_dnn_sdpa_use(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry,
                           int cfg) {
    (void)ctx;
    (void)store;
    (void)entry;
    (void)cfg;
    return 0;
}
int kiln_cuda_dnn_sdpa_cfg(const kiln_cuda_sdpa_store *store, int entry, int *n_cfg) {
    (void)store;
    (void)entry;
    if (n_cfg != NULL) *n_cfg = 0;
    return -1;
}

void kiln_cuda_dnn_sdpa_trim(kiln_cuda_sdpa_store *store, int entry) {
    (void)store;
    (void)entry;
}
int kiln_cuda_dnn_sdpa_use_first(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry) {
    (void)ctx;
    (void)store;
    (void)entry;
    return 0;
}
kiln_status kiln_cuda_dnn_sdpa_run(const kiln_cuda_ctx *ctx, kiln_cuda_sdpa_store *store, int entry,
                                   const kiln_cuda_attn_geom *g, int *done) {
    (void)ctx;
    (void)store;
    (void)entry;
    (void)g;
    *done = 0;
    return KILN_OK;
}
void kiln_cuda_dnn_sdpa_describe(const kiln_cuda_sdpa_store *store, int entry, char *buf,
                                 size_t n) {
    (void)store;
    (void)entry;
    snprintf(buf, n, "cuDNN fused SDPA");
}

#endif
