// SPDX-License-Identifier: Apache-2.0
// The runtime-option table, its process-wide values, per-load overrides and the environment's
// debug overrides. One row per option: where its value lives in kiln_options, how its text is
// parsed (the same rule for every source), its default and its documentation line.
#include <inttypes.h>
#include <pthread.h> // not C11 threads: ThreadSanitizer sees pthread mutexes as synchronization
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/env.h"
#include "core/options.h"
#include "core/status.h"
#include "core/utf8.h"

typedef enum value_kind {
    V_BOOL,   // true/false (text: 1/true/yes/on, 0/false/no/off, any case)
    V_INT,    // an int field in [min, max]
    V_INT64,  // an int64_t field in [min, max]
    V_ENUM,   // text, one of choices[] (stored as values[]); an int whose text is a choice too
    V_DEVICE, // "auto", "cpu" or "cuda:N"
    V_WGCFG,  // "auto" or "BN,SPLIT,OCC" (cuda.wgmma_config: three int fields)
    V_CACHE,  // "auto", "off" or a file path (tuning_cache: kiln_options.tuning_cache)
} value_kind;

typedef struct option_def {
    const char *name;
    value_kind kind;
    const char *default_text;
    const char *scope; // "process", "load" or "both"
    int env;           // 1: KILN_<NAME> (upper case, '.' as '_') overrides it, for debugging
    size_t offset;     // of the value in kiln_options
    int64_t min, max;  // V_INT, V_INT64
    const char *const *choices; // V_ENUM: NULL-terminated names ...
    const int *values;          // ... and the values they store
    const char *help;
} option_def;

#define AT(field) offsetof(kiln_options, field)
#define CUDA(field) offsetof(kiln_options, cuda.field)
#define OPT(name, kind, def, scope, env, at, help)                                                 \
    { name, kind, def, scope, env, at, 0, 0, NULL, NULL, help }
#define OPT_INT(name, kind, def, scope, env, at, lo, hi, help)                                     \
    { name, kind, def, scope, env, at, lo, hi, NULL, NULL, help }
#define OPT_ENUM(name, def, at, names, values, help)                                               \
    { name, V_ENUM, def, "both", 1, at, 0, 0, names, values, help }
#define CUDA_BOOL(name, def, field, help)                                                          \
    OPT("cuda." name, V_BOOL, def, "both", 1, CUDA(field), help)

static const char *const splitk_names[] = {"auto", "off", "2", "4", "8", NULL};
static const int splitk_values[] = {0, -1, 2, 4, 8};
static const char *const gather_names[] = {"auto", "half", "global", NULL};
static const int gather_values[] = {0, 1, 2};
static const char *const rows_names[] = {"auto", "16", "32", "64", NULL};
static const int rows_values[] = {0, 16, 32, 64};
static const char *const auto_off_on_names[] = {"auto", "off", "on", NULL};
static const int auto_off_on_values[] = {0, -1, 1};
static const char *const split_names[] = {"auto", "2", "4", "8", NULL};
static const int split_values[] = {0, 2, 4, 8};

static const option_def defs[] = {
    OPT("device", V_DEVICE, "auto", "both", 0, AT(device),
        "where engines run: auto (the GPU when the CUDA plugin loads and a device is present, "
        "else the CPU), cpu, or cuda:N"),
    OPT("use_cuda_graphs", V_BOOL, "true", "both", 0, AT(use_cuda_graphs),
        "CUDA: record each engine's layers in a CUDA graph on the second execute and replay it "
        "after; a new input shape or bound pointer re-records"),
    OPT("use_shared_activation_scratch", V_BOOL, "false", "process", 0,
        AT(use_shared_activation_scratch),
        "CUDA: the contexts of engines loaded with it share one activation arena per device and "
        "run one at a time"),
    OPT_INT("num_threads", V_INT64, "1", "both", 0, AT(num_threads), 1, 64,
            "CPU backend worker threads (accepted; the CPU backend runs on the calling thread)"),
    OPT("profile", V_BOOL, "false", "both", 1, AT(profile),
        "time every layer of every execute (CUDA: graphs off, each layer behind a delay "
        "kernel); kiln_context_layer_info reports the means"),
    // The CUDA backend's policy (kiln_cuda_policy).
    CUDA_BOOL("cublaslt", "true", cublaslt,
              "GEMMs through cuBLASLt; false: Kiln's tiled kernel (debugging)"),
    CUDA_BOOL("cudnn", "true", cudnn,
              "convolutions and attention may run on cuDNN; false: Kiln's own kernels"),
    CUDA_BOOL("cudnn_sdpa", "true", cudnn_sdpa,
              "attention may run on cuDNN's fused SDPA (timed against Kiln's kernel)"),
    CUDA_BOOL("tune", "true", tune,
              "time candidate algorithms and kernels at context creation; false: every choice by "
              "heuristic (cuDNN runs every sdpa it takes; no wgmma kernel or K split unless "
              "forced)"),
    CUDA_BOOL("gemv", "true", gemv,
              "Kiln's GEMV runs fp16/bf16 linears of at most 8 rows; false: cuBLASLt"),
    CUDA_BOOL("gemv_fold", "true", gemv_fold,
              "with the GEMV: an RMSNorm read only by GEMV linears runs inside them, and a gated "
              "pair act(x W_g) * (x W_u) runs as one GEMV (no norm, up-projection or gate kernel)"),
    CUDA_BOOL("wgmma", "true", wgmma,
              "Kiln's small-M TMA + wgmma linear (sm_90) is timed against cuBLASLt for 9-256 rows"),
    OPT("cuda.wgmma_config", V_WGCFG, "auto", "both", 1, CUDA(wgmma_bn),
        "BN,SPLIT,OCC (BN 64 or 128, SPLIT 1, 2, 4 or 8, OCC 1 or 2): every linear the wgmma "
        "kernel takes runs on it with that configuration, untimed"),
    OPT_ENUM("cuda.splitk", "auto", CUDA(splitk), splitk_names, splitk_values,
             "K split of fp16/bf16 linears over a batched cuBLASLt GEMM: auto (timed where it may "
             "pay), off, or 2/4/8 slices on every linear it can take, untimed"),
    CUDA_BOOL("pdl", "true", pdl,
              "the small-M linears and the small kernels between them (elementwise, shape, "
              "rotary, split-key sdpa) use programmatic dependent launch"),
    CUDA_BOOL("nhwc", "true", nhwc,
              "4-D fp16/bf16 activations around convolutions are kept NHWC (with cuDNN)"),
    CUDA_BOOL("stem_kernel", "true", stem_kernel,
              "Kiln's stem kernel runs NHWC convs with C % 8 != 0; false: cuDNN on a padded copy"),
    OPT_ENUM("cuda.stem_gather", "auto", CUDA(stem_gather), gather_names, gather_values,
             "the stem kernel's input gather: auto (the best that applies), half (16-bit patch "
             "loads) or global (gathers from global memory)"),
    CUDA_BOOL("attention_fold", "true", attention_fold,
              "the head split/merge permutes around sdpa run no kernel (sdpa reads strided "
              "views), reshapes between dense activations are aliases (no kernel), and rope "
              "groups, mean ratios and softmax-weighted sums run as one launch each"),
    CUDA_BOOL("tc_attention", "true", tc_attention,
              "fp16/bf16 sdpa may run on Kiln's tensor-core kernels; false: the fp32-FMA kernels"),
    OPT_ENUM("cuda.sdpa_rows", "auto", CUDA(sdpa_rows), rows_names, rows_values,
             "query rows per CTA of the tensor-core sdpa (forcing it keeps Kiln's kernel): auto "
             "(by occupancy), 16, 32 or 64"),
    OPT_ENUM("cuda.sdpa_split", "auto", CUDA(sdpa_split), split_names, split_values,
             "warps per 16-row block of the split-key sdpa (forcing it keeps Kiln's kernel): auto "
             "(by residency), 2, 4 or 8"),
    OPT_INT("cuda.l2_keep_pct", V_INT, "50", "both", 1, CUDA(l2_keep_pct), 0, 100,
            "percent of the device's L2 the small-M linears' weights may keep between executes"),
    CUDA_BOOL("flag_wait", "true", flag_wait,
              "a CUDA graph replay ends by waiting on a flag its last node clears instead of "
              "cudaStreamSynchronize"),
    CUDA_BOOL("debug_sync", "false", debug_sync,
              "graphs off; synchronize after every layer so that a fault names its layer"),
    OPT_INT("cuda.profile_delay_us", V_INT, "100", "both", 1, CUDA(profile_delay_us), 1, 1000000,
            "with profile: microseconds of the delay kernel queued ahead of each layer, so that "
            "the events around a layer time GPU work only"),
    // Rows added later go last: an option's index is part of the table's contract.
    OPT("verify_weights", V_BOOL, "true", "both", 0, AT(verify_weights),
        "check every weight read from a .pte's named data or a .ptd against the SHA-256 its key "
        "names; false skips it for trusted files (faster loads)"),
    OPT("tuning_cache", V_CACHE, "auto", "both", 0, AT(tuning_cache),
        "CUDA: where the choices timed at context creation are kept and reused: auto (a file in "
        "the user's cache directory: $XDG_CACHE_HOME/kiln or ~/.cache/kiln), off (time at "
        "every context creation), or a file path"),
    OPT("link_delegates", V_BOOL, "true", "both", 1, AT(link_delegates),
        "ExecuTorch: a tensor that one Kiln delegate passes straight to another stays in the "
        "producing engine's memory on its device (no copy through host memory; the export "
        "records these edges); false: every delegate output goes through its ExecuTorch buffer"),
    OPT_ENUM("cuda.dw_rows", "auto", CUDA(dw_rows), auto_off_on_names, auto_off_on_values,
             "NHWC depthwise 3x3 and 5x5 convs (stride 1 or 2): each thread computes 4 output "
             "pixels of a row from one load of their input columns: auto (when the layer fills "
             "the GPU with such threads), off (one pixel per thread) or on (every such layer); "
             "a 7x7 of stride 1 runs in tiles through shared memory either way"),
    OPT("check_cache_rows", V_BOOL, "true", "both", 0, AT(check_cache_rows),
        "a KV cache written at positions the caller passes (in host memory) refuses a call that "
        "would leave a row below its highest position unwritten (a decode before its prefill, a "
        "skipped position); false allows sparse writes, whose unwritten rows read as the "
        "cache's initial zeros"),
    OPT_ENUM("cuda.conv_pw", "auto", CUDA(conv_pw), auto_off_on_names, auto_off_on_values,
             "NHWC 1x1 convs (groups 1, no padding, 16-bit, channels multiples of 8) on Kiln's "
             "pointwise kernel, a tensor-core GEMM over pixels with the bias, a residual add and "
             "an activation (SiLU, hard-swish, GELU, ReLU, clamp, sigmoid) fused: auto (timed "
             "against cuDNN at context creation; untimed, where it fuses more of the tail), off "
             "(cuDNN) or on (every such layer)"),
    OPT_ENUM("cuda.conv_lt", "auto", CUDA(conv_lt), auto_off_on_names, auto_off_on_values,
             "NHWC 1x1 convs of stride 1 (as cuda.conv_pw takes them) as one cuBLASLt GEMM over "
             "the pixels, the bias and a first ReLU, tanh GELU or residual add in its epilogue: "
             "auto (timed against cuDNN and the pointwise kernel at context creation), off "
             "(never) or on (every such layer; cuda.conv_pw on takes precedence)"),
};
#define N_DEFS (sizeof defs / sizeof defs[0])

_Static_assert(offsetof(kiln_cuda_policy, wgmma_split) ==
                       offsetof(kiln_cuda_policy, wgmma_bn) + sizeof(int) &&
                   offsetof(kiln_cuda_policy, wgmma_occ) ==
                       offsetof(kiln_cuda_policy, wgmma_bn) + 2 * sizeof(int),
               "cuda.wgmma_config writes three ints in a row");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;
static kiln_options process; // guarded by lock; the defaults until set

// --- values

static const char *kind_name(value_kind k) {
    switch (k) {
    case V_BOOL: return "bool";
    case V_INT:
    case V_INT64: return "int";
    default: return "string";
    }
}

static kiln_option_type public_type(value_kind k) {
    return k == V_BOOL                  ? KILN_OPTION_BOOL
           : k == V_INT || k == V_INT64 ? KILN_OPTION_INT
                                        : KILN_OPTION_STRING;
}

static int *int_at(kiln_options *o, const option_def *d) { return (int *)((char *)o + d->offset); }
static const int *cint_at(const kiln_options *o, const option_def *d) {
    return (const int *)((const char *)o + d->offset);
}

// "bool", "int in 0..100", "one of auto, off, 2, 4, 8", ...: for messages.
static void accepted(const option_def *d, char *buf, size_t n) {
    size_t used = 0;
    switch (d->kind) {
    case V_BOOL: snprintf(buf, n, "1, true, yes, on, 0, false, no or off"); return;
    case V_INT:
    case V_INT64: snprintf(buf, n, "an integer in %" PRId64 "..%" PRId64, d->min, d->max); return;
    case V_DEVICE: snprintf(buf, n, "auto, cpu or cuda:N"); return;
    case V_CACHE:
        snprintf(buf, n, "auto, off or a file path (text, at most %zu bytes)",
                 sizeof(((kiln_options *)0)->tuning_cache) - 1);
        return;
    case V_WGCFG:
        snprintf(buf, n, "auto or BN,SPLIT,OCC with BN 64 or 128, SPLIT 1, 2, 4 or 8, OCC 1 or 2");
        return;
    case V_ENUM:
        buf[0] = '\0';
        for (int i = 0; d->choices[i] != NULL && used < n; i++) {
            int w = snprintf(buf + used, n - used, "%s%s", i == 0 ? "" : ", ", d->choices[i]);
            if (w < 0) break;
            used += (size_t)w;
        }
        return;
    }
}

static int parse_bool(const char *t, int *out) {
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no",
                                                                                "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(t, yes[i]) == 0) return *out = 1, 1;
        if (strcasecmp(t, no[i]) == 0) return *out = 0, 1;
    }
    return 0;
}

static int parse_int(const char *t, int64_t min, int64_t max, int64_t *out) {
    char *end = NULL;
    long long v;
    if (t[0] == '\0') return 0;
    v = strtoll(t, &end, 10);
    if (end == NULL || *end != '\0' || v < min || v > max) return 0;
    *out = v;
    return 1;
}

static int parse_device(const char *v) {
    if (strcmp(v, "auto") == 0 || strcmp(v, "cpu") == 0) return 1;
    if (strncmp(v, "cuda:", 5) == 0 && v[5] >= '0' && v[5] <= '9') {
        char *end;
        long n = strtol(v + 5, &end, 10);
        return *end == '\0' && n >= 0 && n < 1024;
    }
    return 0;
}

// A path: non-empty UTF-8 text without control characters that fits the field.
static int parse_cache(const char *t, size_t cap) {
    size_t n = strlen(t);
    if (n == 0 || n >= cap || kiln_utf8_check(t, n) != n) return 0;
    return 1;
}

static int parse_wgcfg(const char *t, int out[3]) {
    int bn = 0, split = 0, occ = 0, n = 0;
    if (strcmp(t, "auto") == 0) return out[0] = out[1] = out[2] = 0, 1;
    if (sscanf(t, "%d,%d,%d%n", &bn, &split, &occ, &n) != 3 || t[n] != '\0') return 0;
    if ((bn != 64 && bn != 128) || (split != 1 && split != 2 && split != 4 && split != 8) ||
        (occ != 1 && occ != 2))
        return 0;
    out[0] = bn, out[1] = split, out[2] = occ;
    return 1;
}

// Parses text for d into o (one rule for every source: API strings, the environment).
static int apply_text(kiln_options *o, const option_def *d, const char *t) {
    int b, cfg[3];
    int64_t v;
    switch (d->kind) {
    case V_BOOL:
        if (!parse_bool(t, &b)) return 0;
        *int_at(o, d) = b;
        return 1;
    case V_INT:
        if (!parse_int(t, d->min, d->max, &v)) return 0;
        *int_at(o, d) = (int)v;
        return 1;
    case V_INT64:
        if (!parse_int(t, d->min, d->max, &v)) return 0;
        *(int64_t *)((char *)o + d->offset) = v;
        return 1;
    case V_ENUM:
        for (int i = 0; d->choices[i] != NULL; i++) {
            if (strcmp(t, d->choices[i]) == 0) return *int_at(o, d) = d->values[i], 1;
        }
        return 0;
    case V_DEVICE:
        if (!parse_device(t) || strlen(t) >= sizeof o->device) return 0;
        snprintf(o->device, sizeof o->device, "%s", t);
        return 1;
    case V_WGCFG:
        if (!parse_wgcfg(t, cfg)) return 0;
        memcpy(int_at(o, d), cfg, sizeof cfg); // wgmma_bn, wgmma_split, wgmma_occ in a row
        return 1;
    case V_CACHE:
        if (!parse_cache(t, sizeof o->tuning_cache)) return 0;
        snprintf(o->tuning_cache, sizeof o->tuning_cache, "%s", t);
        return 1;
    }
    return 0;
}

static void value_text(const kiln_options *o, const option_def *d, char *buf, size_t n) {
    const int *p = cint_at(o, d);
    switch (d->kind) {
    case V_BOOL: snprintf(buf, n, "%s", *p ? "true" : "false"); return;
    case V_INT: snprintf(buf, n, "%d", *p); return;
    case V_INT64:
        snprintf(buf, n, "%" PRId64, *(const int64_t *)((const char *)o + d->offset));
        return;
    case V_DEVICE: snprintf(buf, n, "%s", o->device); return;
    case V_CACHE: snprintf(buf, n, "%s", o->tuning_cache); return;
    case V_WGCFG:
        if (p[0] == 0) {
            snprintf(buf, n, "auto");
        } else {
            snprintf(buf, n, "%d,%d,%d", p[0], p[1], p[2]);
        }
        return;
    case V_ENUM:
        for (int i = 0; d->choices[i] != NULL; i++) {
            if (d->values[i] == *p) {
                snprintf(buf, n, "%s", d->choices[i]);
                return;
            }
        }
        snprintf(buf, n, "?");
        return;
    }
}

static void set_defaults(void) {
    memset(&process, 0, sizeof process);
    for (size_t i = 0; i < N_DEFS; i++) {
        int ok = apply_text(&process, &defs[i], defs[i].default_text);
        (void)ok; // every default parses (options_test checks each one reads back)
    }
}

static kiln_options snapshot(void) {
    kiln_options o;
    pthread_once(&defaults_once, set_defaults);
    pthread_mutex_lock(&lock);
    o = process;
    pthread_mutex_unlock(&lock);
    return o;
}

// --- lookup and typed setting

static void valid_names(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_DEFS && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s (%s)", i ? ", " : "", defs[i].name,
                         kind_name(defs[i].kind));
        if (w < 0) break;
        used += (size_t)w;
    }
}

static kiln_status find(const char *name, const option_def **out) {
    char names[900];
    KILN_CHECK(name != NULL, KILN_ERR_INVALID_ARG, "option name is NULL");
    for (size_t i = 0; i < N_DEFS; i++) {
        if (strcmp(defs[i].name, name) == 0) {
            *out = &defs[i];
            return KILN_OK;
        }
    }
    valid_names(names, sizeof names);
    return kiln_fail(KILN_ERR_INVALID_ARG, "unknown Kiln option '%.64s'; valid options: %s", name,
                     names);
}

// Applies one typed value (from the C API, a per-load setting or ExecuTorch) to o.
static kiln_status apply(kiln_options *o, const char *name, kiln_option_type type, int64_t ival,
                         const char *sval) {
    const option_def *d;
    char want[160], text[32];
    KILN_TRY(find(name, &d));
    accepted(d, want, sizeof want);
    if (type == KILN_OPTION_BOOL && d->kind == V_BOOL) {
        *int_at(o, d) = ival != 0;
        return KILN_OK;
    }
    if (type == KILN_OPTION_INT && (d->kind == V_INT || d->kind == V_INT64 || d->kind == V_ENUM)) {
        // an int is also accepted for an enum whose choices are numbers (cuda.splitk = 4)
        snprintf(text, sizeof text, "%" PRId64, ival);
        KILN_CHECK(apply_text(o, d, text), KILN_ERR_INVALID_ARG,
                   "option '%s' = %" PRId64 " is not valid; accepted: %s", name, ival, want);
        return KILN_OK;
    }
    if (type == KILN_OPTION_STRING && public_type(d->kind) == KILN_OPTION_STRING) {
        KILN_CHECK(sval != NULL, KILN_ERR_INVALID_ARG, "option '%s' value is NULL", name);
        KILN_CHECK(apply_text(o, d, sval), KILN_ERR_INVALID_ARG,
                   "option '%s' = '%.64s' is not valid; accepted: %s", name, sval, want);
        return KILN_OK;
    }
    return kiln_fail(KILN_ERR_INVALID_ARG, "option '%s' takes a %s value (%s), got a %s", name,
                     kind_name(d->kind), want,
                     type == KILN_OPTION_BOOL  ? "bool"
                     : type == KILN_OPTION_INT ? "int"
                                               : "string");
}

static kiln_status set_process(const char *name, kiln_option_type type, int64_t ival,
                               const char *sval) {
    kiln_status st;
    pthread_once(&defaults_once, set_defaults);
    pthread_mutex_lock(&lock);
    kiln_options next = process;
    st = apply(&next, name, type, ival, sval);
    if (st == KILN_OK) process = next;
    pthread_mutex_unlock(&lock);
    return st;
}

kiln_status kiln_set_option_bool(const char *name, int value) {
    return set_process(name, KILN_OPTION_BOOL, value != 0, NULL);
}
kiln_status kiln_set_option_int(const char *name, int64_t value) {
    return set_process(name, KILN_OPTION_INT, value, NULL);
}
kiln_status kiln_set_option_string(const char *name, const char *value) {
    return set_process(name, KILN_OPTION_STRING, 0, value);
}

kiln_status kiln_get_option(const char *name, char *buf, size_t buf_nbytes) {
    kiln_options o = snapshot();
    return kiln_options_get(&o, name, buf, buf_nbytes);
}

kiln_status kiln_options_get(const kiln_options *o, const char *name, char *buf,
                             size_t buf_nbytes) {
    const option_def *d;
    KILN_TRY(find(name, &d));
    KILN_CHECK(buf != NULL && buf_nbytes > 0, KILN_ERR_INVALID_ARG,
               "kiln_get_option: buffer is NULL or empty");
    value_text(o, d, buf, buf_nbytes);
    return KILN_OK;
}

uint32_t kiln_option_count(void) { return (uint32_t)N_DEFS; }

kiln_status kiln_option_info(uint32_t index, const char **out_name, kiln_option_type *out_type,
                             const char **out_default, const char **out_scope) {
    KILN_CHECK(index < N_DEFS, KILN_ERR_INVALID_ARG, "option index %u out of range (%u options)",
               index, (unsigned)N_DEFS);
    if (out_name) *out_name = defs[index].name;
    if (out_type) *out_type = public_type(defs[index].kind);
    if (out_default) *out_default = defs[index].default_text;
    if (out_scope) *out_scope = defs[index].scope;
    return KILN_OK;
}

// The environment variable overriding option d: KILN_ + its name in upper case, '.' as '_'.
static void env_name(const option_def *d, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "KILN_");
    for (const char *s = d->name; *s != '\0' && k + 1 < n; s++, k++) {
        buf[k] = *s == '.' ? '_' : (*s >= 'a' && *s <= 'z') ? (char)(*s - 'a' + 'A') : *s;
    }
    buf[k < n ? k : n - 1] = '\0';
}

kiln_status kiln_option_describe(uint32_t index, const char **out_help, char *env_buf,
                                 size_t env_nbytes, char *accepted_buf, size_t accepted_nbytes) {
    KILN_CHECK(index < N_DEFS, KILN_ERR_INVALID_ARG, "option index %u out of range (%u options)",
               index, (unsigned)N_DEFS);
    if (out_help) *out_help = defs[index].help;
    if (env_buf != NULL && env_nbytes > 0) {
        env_buf[0] = '\0';
        if (defs[index].env) env_name(&defs[index], env_buf, env_nbytes);
    }
    if (accepted_buf != NULL && accepted_nbytes > 0) {
        accepted(&defs[index], accepted_buf, accepted_nbytes);
    }
    return KILN_OK;
}

// --- resolution at engine load

// Logs each distinct environment override once per process (INFO).
static atomic_int env_logged[N_DEFS];

// A KILN_CUDA_* variable that overrides no option (a misspelling, or a switch that no longer
// exists) is reported once per process instead of being silently ignored.
static void warn_if_unknown(const char *var, size_t n, void *user_data) {
    int known = n == strlen("KILN_CUDA_PLUGIN") && strncmp(var, "KILN_CUDA_PLUGIN", n) == 0;
    (void)user_data;
    for (size_t i = 0; i < N_DEFS && !known; i++) {
        char name[64];
        if (!defs[i].env) continue;
        env_name(&defs[i], name, sizeof name);
        known = strlen(name) == n && strncmp(name, var, n) == 0;
    }
    if (!known) {
        kiln_log(KILN_LOG_WARN,
                 "environment variable %.*s is not a Kiln option and is ignored; the CUDA options "
                 "and their variables are listed in docs/options.md",
                 (int)(n < 64 ? n : 64), var);
    }
}

static void warn_unknown_env(void) { kiln_env_each("KILN_CUDA_", warn_if_unknown, NULL); }
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static kiln_status apply_env(kiln_options *o) {
    pthread_once(&env_once, warn_unknown_env);
    for (size_t i = 0; i < N_DEFS; i++) {
        const option_def *d = &defs[i];
        char name[64], want[160];
        const char *v;
        if (!d->env) continue;
        env_name(d, name, sizeof name);
        v = kiln_env(name);
        if (v == NULL || v[0] == '\0') continue;
        if (!apply_text(o, d, v)) {
            accepted(d, want, sizeof want);
            return kiln_fail(KILN_ERR_INVALID_ARG,
                             "environment variable %s='%.64s' is not a valid value for option "
                             "'%s'; accepted: %s (or unset it)",
                             name, v, d->name, want);
        }
        if (atomic_exchange(&env_logged[i], 1) == 0) {
            kiln_log(KILN_LOG_INFO,
                     "%s=%s overrides option '%s' (a debug override from the "
                     "environment)",
                     name, v, d->name);
        }
    }
    return KILN_OK;
}

kiln_status kiln_options_resolve(const kiln_option_setting *settings, uint32_t n_settings,
                                 kiln_options *out) {
    kiln_options o = snapshot();
    KILN_CHECK(n_settings == 0 || settings != NULL, KILN_ERR_INVALID_ARG,
               "load options: %u settings but the array is NULL", n_settings);
    for (uint32_t i = 0; i < n_settings; i++) {
        const option_def *d;
        KILN_TRY(find(settings[i].name, &d));
        KILN_CHECK(strcmp(d->scope, "process") != 0, KILN_ERR_INVALID_ARG,
                   "option '%s' is process-wide; set it with kiln_set_option_* instead of per load",
                   d->name);
        KILN_TRY(apply(&o, settings[i].name, settings[i].type, settings[i].int_value,
                       settings[i].string_value));
    }
    KILN_TRY(apply_env(&o));
    *out = o;
    return KILN_OK;
}
