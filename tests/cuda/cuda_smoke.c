// SPDX-License-Identifier: Apache-2.0
// CUDA smoke test through the shared libkiln, as an installed program sees it: no
// KILN_CUDA_PLUGIN, so the plugin must be found beside libkiln.so (dladdr). A tiny graph
// (linear + relu + softmax) is loaded with device "auto": with a GPU it must land on cuda:0 and
// match the CPU engine; without one the log must show that the plugin itself was found (the
// reason is the missing driver or device, never "could not be loaded") and the test is skipped
// (exit 77). KILN_SMOKE_REQUIRE_GPU=1 turns the skip into a failure.
#define _POSIX_C_SOURCE 200112L // setenv, unsetenv
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kiln/kiln.h"

#define KILN_TRY_SMOKE(expr)                                                                       \
    do {                                                                                           \
        kiln_status s_st_ = (expr);                                                                \
        if (s_st_ != KILN_OK) return s_st_;                                                        \
    } while (0)

static char log_text[8192];

static void hook(void *user_data, kiln_log_level level, const char *message) {
    size_t used = strlen(log_text);
    (void)user_data;
    fprintf(stderr, "kiln[%d]: %s\n", (int)level, message);
    if (used + 1 < sizeof log_text)
        snprintf(log_text + used, sizeof log_text - used, "%s\n", message);
}

static kiln_status build(void **out_bytes, size_t *out_n) {
    kiln_graph *g = NULL;
    kiln_build_options o;
    kiln_built *b = NULL;
    int64_t mins[2] = {1, 8}, maxs[2] = {4, 8}, wd[2] = {5, 8}, bd[1] = {5}, dim = -1;
    float w[40], bias[5];
    int32_t x, wv, bv, h, y;
    const void *data;
    kiln_status st;
    for (int i = 0; i < 40; i++) w[i] = check_rng_uniform(-0.5f, 0.5f);
    for (int i = 0; i < 5; i++) bias[i] = check_rng_uniform(-0.5f, 0.5f);
    KILN_TRY_SMOKE(kiln_graph_new(&g));
    st = kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, mins, maxs, &x);
    if (st == KILN_OK)
        st = kiln_graph_add_constant(g, "w", KILN_DTYPE_F32, 2, wd, w, sizeof w, &wv);
    if (st == KILN_OK)
        st = kiln_graph_add_constant(g, "b", KILN_DTYPE_F32, 1, bd, bias, sizeof bias, &bv);
    if (st == KILN_OK) {
        int32_t ins[3] = {x, wv, bv};
        st = kiln_graph_add_node(g, KILN_OP_LINEAR, ins, 3, NULL, 0, &h, 1);
    }
    if (st == KILN_OK) st = kiln_graph_add_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &h, 1);
    if (st == KILN_OK) {
        kiln_attr a = {"dim", &dim, NULL, 1};
        st = kiln_graph_add_node(g, KILN_OP_SOFTMAX, &h, 1, &a, 1, &y, 1);
    }
    if (st == KILN_OK) st = kiln_graph_mark_output(g, y, "y");
    if (st == KILN_OK) {
        kiln_build_options_init(&o);
        st = kiln_build(g, &o, &b);
    }
    if (st == KILN_OK) st = kiln_built_engine(b, &data, out_n);
    if (st == KILN_OK) {
        *out_bytes = malloc(*out_n);
        if (*out_bytes == NULL)
            st = KILN_ERR_NO_MEMORY;
        else
            memcpy(*out_bytes, data, *out_n);
    }
    kiln_built_free(b);
    kiln_graph_free(g);
    return st;
}

static kiln_status run(kiln_engine *e, const float *x, int64_t rows, float *y) {
    kiln_context *c = NULL;
    int64_t dims[2] = {rows, 8};
    kiln_status st = kiln_context_new(e, &c);
    if (st == KILN_OK) st = kiln_context_set_input(c, 0, 2, dims, x);
    if (st == KILN_OK) st = kiln_context_set_output(c, 0, y, 4 * 5 * sizeof(float));
    for (int r = 0; r < 3 && st == KILN_OK; r++) st = kiln_context_execute(c);
    kiln_context_free(c);
    return st;
}

int main(void) {
    void *bytes = NULL;
    size_t n = 0;
    kiln_engine *gpu = NULL, *cpu = NULL;
    kiln_option_setting cpu_setting = {"device", KILN_OPTION_STRING, 0, "cpu"};
    kiln_load_options cpu_opts;
    float x[32], yg[20], yc[20];
    const char *require = getenv("KILN_SMOKE_REQUIRE_GPU");
    unsetenv("KILN_CUDA_PLUGIN");
    kiln_log_set(hook, NULL, KILN_LOG_INFO);
    CHECK_OK(build(&bytes, &n));
    if (bytes == NULL) return check_summary();
    CHECK_OK(kiln_engine_load(bytes, n, NULL, &gpu)); // device "auto"
    CHECK_MSG(strstr(log_text, "could not be loaded") == NULL,
              "the plugin was not found beside libkiln: %s", log_text);
    if (gpu != NULL && strcmp(kiln_engine_device(gpu), "cpu") == 0) {
        kiln_engine_free(gpu);
        free(bytes);
        if (require != NULL && require[0] == '1') {
            CHECK_MSG(0, "KILN_SMOKE_REQUIRE_GPU=1 but device 'auto' chose the CPU");
            return check_summary();
        }
        printf("SKIP: no usable GPU (device 'auto' chose the CPU)\n");
        return check_failed_ ? check_summary() : 77;
    }
    CHECK(gpu != NULL && strcmp(kiln_engine_device(gpu), "cuda:0") == 0);
    kiln_load_options_init(&cpu_opts);
    cpu_opts.settings = &cpu_setting;
    cpu_opts.n_settings = 1;
    CHECK_OK(kiln_engine_load(bytes, n, &cpu_opts, &cpu));
    for (int i = 0; i < 32; i++) x[i] = check_rng_uniform(-2.0f, 2.0f);
    for (int64_t rows = 1; rows <= 4; rows += 3) {
        memset(yg, 0, sizeof yg);
        memset(yc, 0, sizeof yc);
        CHECK_OK(run(gpu, x, rows, yg));
        CHECK_OK(run(cpu, x, rows, yc));
        for (int i = 0; i < rows * 5; i++) CHECK_NEAR(yg[i], yc[i], 1e-5, 1e-4);
    }
    printf("device: %s\n", kiln_engine_device(gpu));
    kiln_engine_free(gpu);
    kiln_engine_free(cpu);
    free(bytes);
    return check_summary();
}
