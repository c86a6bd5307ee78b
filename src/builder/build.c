// SPDX-License-Identifier: Apache-2.0
// kiln_build (include/kiln/kiln_graph.h): copies the caller's graph into a working graph, runs
// the passes (src/builder/builder.h lists them in order), lays out the plan and serializes it.
// The caller's graph is never modified. Deterministic: the output depends only on the graph's
// contents and the options.
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "builder/builder.h"
#include "builder/serialize.h"
#include "core/alloc.h"
#include "core/sha256.h"
#include "core/status.h"
#include "runtime/load.h"

typedef struct built_weight {
    char key[80]; // "kiln-t-<64 hex>"
    void *data;   // owned copy
    size_t nbytes;
} built_weight;

struct kiln_built {
    uint8_t *engine;
    size_t engine_nbytes;
    built_weight *weights;
    uint32_t n_weights;
};

void kiln_build_options_init(kiln_build_options *o) {
    if (o == NULL) return;
    memset(o, 0, sizeof *o);
    o->struct_nbytes = (uint32_t)sizeof *o;
    o->precision = KILN_PRECISION_FP32;
    o->external_weights = 0;
    o->optimize = 1;
    o->min_external_nbytes = 0;
    o->progress = NULL;
    o->progress_user_data = NULL;
}

_Static_assert(offsetof(kiln_build_options, progress) == KILN_BUILD_OPTIONS_V1_NBYTES,
               "KILN_BUILD_OPTIONS_V1_NBYTES must be where the progress fields start");

static kiln_status resolve_options(const kiln_build_options *o, kiln_build_options *out) {
    if (o == NULL) {
        kiln_build_options_init(out);
        return KILN_OK;
    }
    KILN_CHECK(o->struct_nbytes == sizeof *o || o->struct_nbytes == KILN_BUILD_OPTIONS_V1_NBYTES,
               KILN_ERR_INVALID_ARG,
               "kiln_build_options.struct_nbytes = %u, expected %u (or %u, the options without "
               "a progress callback): initialize the options with kiln_build_options_init",
               o->struct_nbytes, (unsigned)sizeof *o, KILN_BUILD_OPTIONS_V1_NBYTES);
    KILN_CHECK((unsigned)o->precision <= KILN_PRECISION_BF16, KILN_ERR_INVALID_ARG,
               "kiln_build_options.precision = %d; use KILN_PRECISION_FP32, _FP16 or _BF16",
               (int)o->precision);
    // A caller built against the earlier header passed fewer bytes: read only those.
    kiln_build_options_init(out);
    memcpy(out, o, o->struct_nbytes);
    out->struct_nbytes = (uint32_t)sizeof *out;
    return KILN_OK;
}

static kiln_status pass_check(kiln_bgraph *b) { return kiln_pass_check(b); }

// The passes in order; `optimizing` ones run only with options.optimize.
typedef struct build_pass {
    const char *name;
    kiln_status (*run)(kiln_bgraph *b);
    int optimizing;
} build_pass;

static const build_pass passes[] = {
    {"verify", kiln_pass_verify, 0},
    {"dce", kiln_pass_dce, 1},
    {"fold", kiln_pass_fold, 1},
    {"bn_fold", kiln_pass_bn_fold, 1},
    {"matmul_to_linear", kiln_pass_matmul_to_linear, 1},
    {"patchify", kiln_pass_patchify, 1},
    {"views", kiln_pass_views, 1}, // linears over 3-d inputs, for the attention patterns
    {"eager_attention", kiln_pass_eager_attention, 1},
    {"attention", kiln_pass_attention, 1},
    {"llm", kiln_pass_llm, 1},   // before fuse (which would take the muls and adds as tails)
    {"scan", kiln_pass_scan, 1}, // before fuse, for the same reason
    {"act", kiln_pass_act, 1},
    {"views", kiln_pass_views, 1},
    {"bn_fold", kiln_pass_bn_fold, 1}, // scales the views moved onto a linear (layer scale)
    {"cse", kiln_pass_cse, 1},
    {"dce", kiln_pass_dce, 1}, // last pass before nodes are inserted (see pass_dce.c)
    {"fuse", kiln_pass_fuse, 1},
    {"precision", kiln_pass_precision, 0},
    {"fuse_ew", kiln_pass_fuse_ew, 1}, // after precision: no cast lands inside a group
    {"lower_io", kiln_pass_lower_io, 0},
    {"check", pass_check, 0},
};
#define N_PASSES (sizeof passes / sizeof passes[0])

static kiln_status run_passes(kiln_bgraph *b) {
    uint32_t n = 0, done = 0;
    for (size_t i = 0; i < N_PASSES; i++) n += !passes[i].optimizing || b->opts.optimize;
    for (size_t i = 0; i < N_PASSES; i++) {
        if (passes[i].optimizing && !b->opts.optimize) continue;
        KILN_TRY(passes[i].run(b));
        KILN_TRY(kiln_build_report(&b->opts, KILN_BUILD_PHASE_PASS, passes[i].name, ++done, n));
    }
    return KILN_OK;
}

static void log_stats(const kiln_plan *p, const kiln_build_stats *s) {
    kiln_log(
        KILN_LOG_INFO,
        "kiln_build: %u layers, %u tensors, arena %" PRIu64 " bytes, inline weights %" PRIu64
        " bytes; removed %u dead, folded %u, batch norms folded %u, batch norms split %u, "
        "matmul->linear %u, gather_matmul %u, selective scans %u, bias fused %u, tails fused %u, "
        "elementwise heads %u, "
        "casts %u, copies "
        "%u, selects %u, qkv merged %u, head projections merged %u, "
        "patchify convs %u, pools first %u, rms norms %u, l2 normalizations %u, vector norms %u, "
        "rotary %u, "
        "activations %u, causal "
        "masks %u, eager "
        "attention %u, views %u, common subexpressions %u",
        p->n_layers, p->n_tensors, p->arena_nbytes, p->weights_nbytes, s->n_dead, s->n_folded,
        s->n_bn_folded, s->n_bn_split, s->n_linear, s->n_gather_matmul, s->n_scan, s->n_bias_fused,
        s->n_tail_fused, s->n_ew_heads, s->n_casts, s->n_copies, s->n_select, s->n_qkv_merged,
        s->n_heads_merged, s->n_patchify, s->n_pool_first, s->n_rms_norm, s->n_l2_normalize,
        s->n_vector_norm, s->n_rotary, s->n_act, s->n_causal, s->n_eager_attention, s->n_views,
        s->n_cse);
}

// The pipeline up to the plan; *b must be released by the caller.
static kiln_status build_plan(const kiln_graph *g, const kiln_build_options *o, kiln_bgraph *b,
                              kiln_plan *plan, kiln_ext_weight **ext, uint32_t *n_ext) {
    kiln_build_options opts;
    KILN_CHECK(g != NULL, KILN_ERR_INVALID_ARG, "kiln_build: graph is NULL");
    KILN_TRY(resolve_options(o, &opts));
    KILN_TRY(kiln_bgraph_init(b, g, &opts));
    KILN_TRY(run_passes(b));
    KILN_TRY(kiln_bgraph_emit(b, plan, ext, n_ext));
    log_stats(plan, &b->stats);
    return KILN_OK;
}

kiln_status kiln_build_plan(const kiln_graph *g, const kiln_build_options *o, kiln_plan *out,
                            kiln_build_stats *out_stats) {
    kiln_bgraph b;
    kiln_plan p;
    kiln_ext_weight *ext = NULL;
    uint32_t n_ext = 0;
    kiln_status st;
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_build_plan: out is NULL");
    memset(&b, 0, sizeof b);
    memset(&p, 0, sizeof p);
    st = build_plan(g, o, &b, &p, &ext, &n_ext);
    kiln_free(ext, (size_t)n_ext * sizeof *ext);
    if (st == KILN_OK) {
        if (out_stats != NULL) *out_stats = b.stats;
        *out = p;
    }
    kiln_bgraph_release(&b);
    return st;
}

void kiln_built_free(kiln_built *built) {
    if (built == NULL) return;
    kiln_free(built->engine, built->engine_nbytes);
    for (uint32_t i = 0; i < built->n_weights; i++) {
        kiln_free(built->weights[i].data, built->weights[i].nbytes);
    }
    kiln_free(built->weights, (size_t)built->n_weights * sizeof *built->weights);
    kiln_free(built, sizeof *built);
}

static kiln_status copy_weights(kiln_built *bt, const kiln_plan *p, const kiln_ext_weight *ext,
                                uint32_t n_ext) {
    if (n_ext == 0) return KILN_OK;
    bt->weights = kiln_calloc((size_t)n_ext * sizeof *bt->weights, KILN_ALIGN);
    KILN_CHECK(bt->weights != NULL, KILN_ERR_NO_MEMORY, "out of memory listing %u weights", n_ext);
    bt->n_weights = n_ext;
    for (uint32_t i = 0; i < n_ext; i++) {
        built_weight *w = &bt->weights[i];
        snprintf(w->key, sizeof w->key, "%s", kiln_plan_string(p, ext[i].key));
        w->nbytes = (size_t)ext[i].nbytes;
        w->data = kiln_malloc(w->nbytes, KILN_DATA_ALIGN);
        KILN_CHECK(w->data != NULL, KILN_ERR_NO_MEMORY,
                   "out of memory copying external weight %s (%zu bytes)", w->key, w->nbytes);
        if (w->nbytes > 0) memcpy(w->data, ext[i].data, w->nbytes);
    }
    return KILN_OK;
}

// Runs the loader's validation over the bytes just written: the builder never emits an engine
// that the runtime would reject (a failure here is a Kiln bug, reported as internal).
static kiln_status self_check(const uint8_t *bytes, size_t nbytes) {
    kiln_plan check;
    kiln_status st = kiln_load_plan(bytes, nbytes, &check);
    if (st == KILN_ERR_NO_MEMORY) return st;
    if (st != KILN_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_last_error()); // kiln_fail rewrites that buffer
        return kiln_fail(KILN_ERR_INTERNAL,
                         "kiln_build produced an engine the loader rejects (%s): %s; please report "
                         "this Kiln bug with the model",
                         kiln_status_str(st), why);
    }
    kiln_plan_release(&check);
    return KILN_OK;
}

kiln_status kiln_build(const kiln_graph *g, const kiln_build_options *o, kiln_built **out) {
    kiln_bgraph b;
    kiln_plan p;
    kiln_ext_weight *ext = NULL;
    uint32_t n_ext = 0;
    kiln_built *bt = NULL;
    kiln_status st;
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_build: out is NULL");
    memset(&b, 0, sizeof b);
    memset(&p, 0, sizeof p);
    st = build_plan(g, o, &b, &p, &ext, &n_ext);
    if (st == KILN_OK) {
        bt = kiln_calloc(sizeof *bt, KILN_ALIGN);
        if (bt == NULL) st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory in kiln_build");
    }
    if (st == KILN_OK)
        st = kiln_build_report(&b.opts, KILN_BUILD_PHASE_OUTPUT, "memory plan", 1, 3);
    if (st == KILN_OK) st = kiln_serialize(&p, &bt->engine, &bt->engine_nbytes);
    if (st == KILN_OK) st = kiln_build_report(&b.opts, KILN_BUILD_PHASE_OUTPUT, "serialize", 2, 3);
    if (st == KILN_OK) st = self_check(bt->engine, bt->engine_nbytes);
    if (st == KILN_OK) st = kiln_build_report(&b.opts, KILN_BUILD_PHASE_OUTPUT, "self-check", 3, 3);
    if (st == KILN_OK) st = copy_weights(bt, &p, ext, n_ext);
    kiln_free(ext, (size_t)n_ext * sizeof *ext);
    kiln_plan_release(&p);
    kiln_bgraph_release(&b);
    if (st != KILN_OK) {
        kiln_built_free(bt);
        return st;
    }
    *out = bt;
    return KILN_OK;
}

kiln_status kiln_built_engine(const kiln_built *built, const void **out_data, size_t *out_nbytes) {
    KILN_CHECK(built != NULL && out_data != NULL && out_nbytes != NULL, KILN_ERR_INVALID_ARG,
               "kiln_built_engine: built, out_data and out_nbytes must not be NULL");
    *out_data = built->engine;
    *out_nbytes = built->engine_nbytes;
    return KILN_OK;
}

uint32_t kiln_built_n_weights(const kiln_built *built) {
    return built != NULL ? built->n_weights : 0;
}

kiln_status kiln_built_weight(const kiln_built *built, uint32_t index, const char **out_key,
                              const void **out_data, size_t *out_nbytes) {
    KILN_CHECK(built != NULL && out_key != NULL && out_data != NULL && out_nbytes != NULL,
               KILN_ERR_INVALID_ARG,
               "kiln_built_weight: built, out_key, out_data and out_nbytes must not be NULL");
    KILN_CHECK(index < built->n_weights, KILN_ERR_INVALID_ARG,
               "kiln_built_weight: index %u is out of range (%u external weights)", index,
               built->n_weights);
    *out_key = built->weights[index].key;
    *out_data = built->weights[index].data;
    *out_nbytes = built->weights[index].nbytes;
    return KILN_OK;
}
