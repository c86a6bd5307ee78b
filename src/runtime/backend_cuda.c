// SPDX-License-Identifier: Apache-2.0
// The CUDA backend loader, compiled into libkiln always and linked to no CUDA library: it
// dlopen()s the plugin (libkiln_cuda.so, src/cuda/) once per process and hands the runtime the
// plugin's backend table, or NULL (with the reason logged at INFO) so that the runtime falls
// back to the CPU. The plugin is looked for at $KILN_CUDA_PLUGIN when that is set, else next
// to the library or program holding this code (dladdr), else through the loader's usual search
// (LD_LIBRARY_PATH, RUNPATH). It is never unloaded.
#define _GNU_SOURCE // dladdr
#include <dlfcn.h>
#include <pthread.h> // not C11 threads: ThreadSanitizer sees pthread_once as synchronization
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/env.h"
#include "core/plan_memory.h"
#include "core/status.h"
#include "core/tune_cache.h"
#include "runtime/backend_plugin.h"

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static const kiln_cuda_plugin *plugin;         // written once under plugin_once
static const kiln_cuda_test_hooks *test_hooks; // the same

// --- services lent to the plugin

static kiln_status svc_fail(kiln_status status, const char *message) {
    return kiln_fail(status, "%s", message ? message : "(no message)");
}
static void svc_log(kiln_log_level level, const char *message) {
    kiln_log(level, "%s", message ? message : "");
}
static kiln_log_level svc_log_level(void) { return kiln_log_get_level(); }
static void *svc_malloc(size_t nbytes, size_t align) { return kiln_malloc(nbytes, align); }
static void svc_free(void *ptr, size_t nbytes) { kiln_free(ptr, nbytes); }
static const char *svc_op_name(uint32_t op) { return kiln_op_name(op); }
static const char *svc_dtype_name(uint32_t dtype) { return kiln_dtype_name((kiln_dtype)dtype); }
static kiln_status svc_plan_memory(kiln_mem_item *items, uint32_t n, uint64_t align,
                                   uint64_t *out_nbytes) {
    return kiln_plan_memory(items, n, align, out_nbytes);
}

static const kiln_cuda_services services = {
    .struct_nbytes = (uint32_t)sizeof(kiln_cuda_services),
    .abi = KILN_CUDA_PLUGIN_ABI,
    .kiln_version = KILN_VERSION_STRING,
    .fail = svc_fail,
    .log = svc_log,
    .log_level = svc_log_level,
    .malloc = svc_malloc,
    .free = svc_free,
    .op_name = svc_op_name,
    .dtype_name = svc_dtype_name,
    .plan_memory = svc_plan_memory,
    .tune_get = kiln_tune_cache_get,
    .tune_put = kiln_tune_cache_put,
    .tune_flush = kiln_tune_cache_flush,
    .tune_stats = kiln_tune_cache_stats,
};

// --- loading

// Opens one candidate; on failure appends why to `why` and returns NULL.
static void *open_candidate(const char *path, char *why, size_t why_nbytes) {
    void *h;
    const char *err;
    size_t used = strlen(why);
    dlerror();
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) return h;
    err = dlerror();
    if (used < why_nbytes) {
        // Truncation is fine here: the message is best-effort diagnostics.
        int w = snprintf(why + used, why_nbytes - used, "%s%.400s: %.400s", used ? "; " : "", path,
                         err ? err : "dlopen failed");
        (void)w;
    }
    return NULL;
}

// The directory of the object holding this code, with a trailing '/', or "" if unknown.
static void self_dir(char *buf, size_t nbytes) {
    Dl_info info;
    const char *slash;
    buf[0] = '\0';
    if (dladdr((void *)(uintptr_t)&kiln_cuda_plugin_get, &info) == 0 || info.dli_fname == NULL) {
        return;
    }
    slash = strrchr(info.dli_fname, '/');
    if (slash == NULL) return;
    if ((size_t)(slash - info.dli_fname) + 2 > nbytes) return;
    memcpy(buf, info.dli_fname, (size_t)(slash - info.dli_fname) + 1);
    buf[slash - info.dli_fname + 1] = '\0';
}

static void load_plugin(void) {
    char why[1024] = "";
    char path[4096 + 64];
    const char *env = kiln_env(KILN_CUDA_PLUGIN_ENV);
    int explicit_path = env != NULL && env[0] != '\0';
    kiln_log_level level = explicit_path ? KILN_LOG_WARN : KILN_LOG_INFO;
    void *handle = NULL;
    void *sym;
    kiln_cuda_plugin_entry_fn entry;
    const kiln_cuda_plugin *table = NULL;
    char reason[512] = "";
    kiln_status st;

    if (explicit_path) {
        handle = open_candidate(env, why, sizeof why);
    } else {
        char dir[4096];
        self_dir(dir, sizeof dir);
        if (dir[0] != '\0') {
            snprintf(path, sizeof path, "%s%s", dir, KILN_CUDA_PLUGIN_FILE);
            handle = open_candidate(path, why, sizeof why);
        }
        if (handle == NULL) handle = open_candidate(KILN_CUDA_PLUGIN_FILE, why, sizeof why);
    }
    if (handle == NULL) {
        kiln_log(level,
                 "CUDA backend unavailable: the plugin %s could not be loaded (%s); engines run "
                 "on the CPU. Build with -DKILN_CUDA=ON, or set %s to the plugin's path",
                 KILN_CUDA_PLUGIN_FILE, why, KILN_CUDA_PLUGIN_ENV);
        return;
    }
    dlerror();
    sym = dlsym(handle, KILN_CUDA_PLUGIN_ENTRY);
    if (sym == NULL) {
        const char *err = dlerror();
        kiln_log(level, "CUDA backend unavailable: the plugin has no entry point %s (%s)",
                 KILN_CUDA_PLUGIN_ENTRY, err ? err : "not found");
        return; // keep the handle: unloading CUDA libraries is not safe
    }
    memcpy(&entry, &sym, sizeof entry); // object pointer to function pointer (POSIX)
    st = entry(&services, reason, sizeof reason, &table);
    if (st != KILN_OK || table == NULL) {
        reason[sizeof reason - 1] = '\0';
        kiln_log(level, "CUDA backend unavailable: %s; engines run on the CPU",
                 reason[0] ? reason : kiln_status_str(st));
        return;
    }
    if (table->abi != KILN_CUDA_PLUGIN_ABI || table->struct_nbytes != sizeof(kiln_cuda_plugin)) {
        kiln_log(level,
                 "CUDA backend unavailable: the plugin's ABI (%u, %u bytes) differs from "
                 "libkiln's (%u, %u bytes): install a plugin built with this libkiln",
                 table->abi, table->struct_nbytes, KILN_CUDA_PLUGIN_ABI,
                 (unsigned)sizeof(kiln_cuda_plugin));
        return;
    }
    kiln_log(KILN_LOG_INFO, "CUDA backend loaded: %s (%d device%s)", table->version(),
             table->device_count(), table->device_count() == 1 ? "" : "s");
    plugin = table;
    dlerror();
    sym = dlsym(handle, KILN_CUDA_PLUGIN_TEST_ENTRY);
    if (sym != NULL) {
        kiln_cuda_test_entry_fn hooks;
        memcpy(&hooks, &sym, sizeof hooks);
        const kiln_cuda_test_hooks *h = hooks();
        if (h != NULL && h->abi == KILN_CUDA_PLUGIN_ABI &&
            h->struct_nbytes == sizeof(kiln_cuda_test_hooks))
            test_hooks = h;
    }
}

const kiln_cuda_plugin *kiln_cuda_plugin_get(void) {
    pthread_once(&plugin_once, load_plugin);
    return plugin;
}

const kiln_cuda_test_hooks *kiln_cuda_test_hooks_get(void) {
    pthread_once(&plugin_once, load_plugin);
    return test_hooks;
}

const kiln_backend_ops *kiln_backend_cuda_get(void) {
    const kiln_cuda_plugin *p = kiln_cuda_plugin_get();
    return p ? &p->ops : NULL;
}
