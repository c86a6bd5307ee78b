// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin loader (backend_cuda.c) on a machine where the plugin cannot load: with
// KILN_CUDA_PLUGIN naming a missing file, every caller (four threads racing for the first load)
// gets NULL, the reason is logged once at WARN naming the path and the variable, later calls
// neither retry nor log, and an engine asking for cuda:0 fails with KILN_ERR_DEVICE while "auto"
// falls back to the CPU.
#define _POSIX_C_SOURCE 200112L // setenv
#include <pthread.h>            // not C11 threads: ThreadSanitizer only follows pthread_create
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/backend_plugin.h"

#define MISSING "/nonexistent-kiln-dir/libkiln_cuda.so"

static atomic_int n_warn, n_info;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char first_warn[1024];

static void hook(void *user_data, kiln_log_level level, const char *message) {
    (void)user_data;
    if (level == KILN_LOG_WARN) {
        pthread_mutex_lock(&lock);
        if (atomic_fetch_add(&n_warn, 1) == 0) {
            snprintf(first_warn, sizeof first_warn, "%s", message);
        }
        pthread_mutex_unlock(&lock);
    } else if (level == KILN_LOG_INFO) {
        atomic_fetch_add(&n_info, 1);
    }
}

static atomic_int n_nonnull;

static void *racer(void *arg) {
    (void)arg;
    if (kiln_backend_cuda_get() != NULL) atomic_fetch_add(&n_nonnull, 1);
    return NULL;
}

// A one-layer engine (relu over x[2, 3]) to load with a device setting.
static kiln_status build(const void **data, size_t *n, kiln_built **out) {
    kiln_graph *g = NULL;
    kiln_build_options o;
    int64_t dims[2] = {2, 3};
    int32_t x, y;
    kiln_status st = kiln_graph_new(&g);
    if (st == KILN_OK) st = kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, dims, dims, &x);
    if (st == KILN_OK) st = kiln_graph_add_node(g, KILN_OP_RELU, &x, 1, NULL, 0, &y, 1);
    if (st == KILN_OK) st = kiln_graph_mark_output(g, y, "y");
    if (st == KILN_OK) {
        kiln_build_options_init(&o);
        st = kiln_build(g, &o, out);
    }
    if (st == KILN_OK) st = kiln_built_engine(*out, data, n);
    kiln_graph_free(g);
    return st;
}

static kiln_status load(const void *data, size_t n, const char *device, kiln_engine **e) {
    kiln_option_setting s = {"device", KILN_OPTION_STRING, 0, device};
    kiln_load_options o;
    kiln_load_options_init(&o);
    o.settings = &s;
    o.n_settings = 1;
    return kiln_engine_load(data, n, &o, e);
}

int main(void) {
    pthread_t t[4];
    kiln_built *built = NULL;
    const void *data = NULL;
    size_t n = 0;
    kiln_engine *e = NULL;

    setenv(KILN_CUDA_PLUGIN_ENV, MISSING, 1);
    kiln_log_set(hook, NULL, KILN_LOG_DEBUG);
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, racer, NULL) == 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    CHECK_EQ_INT(atomic_load(&n_nonnull), 0);
    CHECK_EQ_INT(atomic_load(&n_warn), 1);
    CHECK_MSG(strstr(first_warn, MISSING) != NULL && strstr(first_warn, "KILN_CUDA_PLUGIN") != NULL,
              "warning: %s", first_warn);
    CHECK(kiln_cuda_plugin_get() == NULL);
    CHECK(kiln_backend_cuda_get() == NULL);
    CHECK_EQ_INT(atomic_load(&n_warn), 1); // loaded (and logged) once

    CHECK_OK(build(&data, &n, &built));
    if (data != NULL) {
        CHECK_STATUS(load(data, n, "cuda:0", &e), KILN_ERR_DEVICE);
        CHECK(strstr(kiln_last_error(), "cuda:0") != NULL);
        e = NULL;
        CHECK_OK(load(data, n, "auto", &e));
        CHECK(e != NULL && strcmp(kiln_engine_device(e), "cpu") == 0);
        kiln_engine_free(e);
    }
    kiln_built_free(built);
    CHECK_EQ_INT(atomic_load(&n_warn), 1);
    kiln_log_set(NULL, NULL, KILN_LOG_WARN);
    return check_summary();
}
