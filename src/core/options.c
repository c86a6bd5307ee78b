// SPDX-License-Identifier: Apache-2.0
// The runtime-option table and its process-wide values.
#include <inttypes.h>
#include <pthread.h> // not C11 threads: ThreadSanitizer sees pthread mutexes as synchronization
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "core/status.h"

typedef struct option_def {
    const char *name;
    kiln_option_type type;
    const char *default_text;
    const char *scope; // "process", "load" or "both"
    const char *help;
} option_def;

static const option_def defs[] = {
    {"device", KILN_OPTION_STRING, "auto", "both",
     "where engines run: auto (the GPU when one is present), cpu, or cuda:N"},
    {"use_cuda_graphs", KILN_OPTION_BOOL, "true", "both",
     "record each engine's work in a CUDA graph on the second execute and replay it after"},
    {"use_shared_activation_scratch", KILN_OPTION_BOOL, "false", "process",
     "engines on one device and stream share one activation arena, sized to the largest"},
    {"num_threads", KILN_OPTION_INT, "1", "both", "CPU backend worker threads (1..64)"},
};
#define N_DEFS (sizeof defs / sizeof defs[0])

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static kiln_options process = {"auto", 1, 0, 1};

static const char *type_name(kiln_option_type t) {
    return t == KILN_OPTION_BOOL ? "bool" : t == KILN_OPTION_INT ? "int" : "string";
}

static void valid_names(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_DEFS && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s (%s)", i ? ", " : "", defs[i].name,
                         type_name(defs[i].type));
        if (w < 0) break;
        used += (size_t)w;
    }
}

static kiln_status find(const char *name, const option_def **out) {
    char names[512];
    KILN_CHECK(name != NULL, KILN_ERR_INVALID_ARG, "option name is NULL");
    for (size_t i = 0; i < N_DEFS; i++) {
        if (strcmp(defs[i].name, name) == 0) {
            *out = &defs[i];
            return KILN_OK;
        }
    }
    valid_names(names, sizeof names);
    return kiln_fail(KILN_ERR_INVALID_ARG, "unknown Kiln option '%s'; valid options: %s", name,
                     names);
}

static kiln_status check_device(const char *v) {
    if (strcmp(v, "auto") == 0 || strcmp(v, "cpu") == 0) return KILN_OK;
    if (strncmp(v, "cuda:", 5) == 0 && v[5] >= '0' && v[5] <= '9') {
        char *end;
        long n = strtol(v + 5, &end, 10);
        if (*end == '\0' && n >= 0 && n < 1024) return KILN_OK;
    }
    return kiln_fail(KILN_ERR_INVALID_ARG,
                     "option 'device' = '%s' is not valid; use auto, cpu or cuda:N", v);
}

// Applies one typed value to an options struct.
static kiln_status apply(kiln_options *o, const char *name, kiln_option_type type, int64_t ival,
                         const char *sval) {
    const option_def *d;
    KILN_TRY(find(name, &d));
    KILN_CHECK(type == d->type, KILN_ERR_INVALID_ARG, "option '%s' takes a %s value, got a %s",
               name, type_name(d->type), type_name(type));
    if (strcmp(name, "device") == 0) {
        KILN_CHECK(sval != NULL, KILN_ERR_INVALID_ARG, "option 'device' value is NULL");
        KILN_TRY(check_device(sval));
        snprintf(o->device, sizeof o->device, "%s", sval);
    } else if (strcmp(name, "use_cuda_graphs") == 0) {
        o->use_cuda_graphs = ival != 0;
    } else if (strcmp(name, "use_shared_activation_scratch") == 0) {
        o->use_shared_activation_scratch = ival != 0;
    } else if (strcmp(name, "num_threads") == 0) {
        KILN_CHECK(ival >= 1 && ival <= 64, KILN_ERR_INVALID_ARG,
                   "option 'num_threads' = %" PRId64 " is out of range 1..64", ival);
        o->num_threads = ival;
    }
    return KILN_OK;
}

static kiln_status set_process(const char *name, kiln_option_type type, int64_t ival,
                               const char *sval) {
    kiln_status st;
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
    const option_def *d;
    kiln_options o;
    KILN_TRY(find(name, &d));
    KILN_CHECK(buf != NULL && buf_nbytes > 0, KILN_ERR_INVALID_ARG,
               "kiln_get_option: buffer is NULL or empty");
    pthread_mutex_lock(&lock);
    o = process;
    pthread_mutex_unlock(&lock);
    if (strcmp(name, "device") == 0) {
        snprintf(buf, buf_nbytes, "%s", o.device);
    } else if (strcmp(name, "use_cuda_graphs") == 0) {
        snprintf(buf, buf_nbytes, "%s", o.use_cuda_graphs ? "true" : "false");
    } else if (strcmp(name, "use_shared_activation_scratch") == 0) {
        snprintf(buf, buf_nbytes, "%s", o.use_shared_activation_scratch ? "true" : "false");
    } else {
        snprintf(buf, buf_nbytes, "%" PRId64, o.num_threads);
    }
    return KILN_OK;
}

uint32_t kiln_option_count(void) { return (uint32_t)N_DEFS; }

kiln_status kiln_option_info(uint32_t index, const char **out_name, kiln_option_type *out_type,
                             const char **out_default, const char **out_scope) {
    KILN_CHECK(index < N_DEFS, KILN_ERR_INVALID_ARG, "option index %u out of range (%u options)",
               index, (unsigned)N_DEFS);
    if (out_name) *out_name = defs[index].name;
    if (out_type) *out_type = defs[index].type;
    if (out_default) *out_default = defs[index].default_text;
    if (out_scope) *out_scope = defs[index].scope;
    return KILN_OK;
}

kiln_status kiln_options_resolve(const kiln_option_setting *settings, uint32_t n_settings,
                                 kiln_options *out) {
    kiln_options o;
    pthread_mutex_lock(&lock);
    o = process;
    pthread_mutex_unlock(&lock);
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
    *out = o;
    return KILN_OK;
}
