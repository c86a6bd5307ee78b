// SPDX-License-Identifier: Apache-2.0
// Load-time cost of verifying external weights against their SHA-256 keys (the option
// verify_weights, docs/runtime.md "Untrusted files"): builds an engine whose weights are all
// external (a chain of linears of the given total size), then loads it on the CPU with the check
// on and off, best of a few runs each. The resolver hands out the built weights in memory, so the
// numbers isolate Kiln's own load work (validation, the CPU backend's weight copy, the check).
//
//   cc -O2 -Iinclude bench/load_cost.c -Lbuild -lkiln -Wl,-rpath,$PWD/build -o /tmp/load_cost
//   /tmp/load_cost 440 1024        # MB of fp32 weights per engine (BERT-base ~440, 1 GB)
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static kiln_status resolve(void *ud, const char *key, const void **out, size_t *n) {
    const kiln_built *b = ud;
    for (uint32_t i = 0; i < kiln_built_n_weights(b); i++) {
        const char *k;
        if (kiln_built_weight(b, i, &k, out, n) == KILN_OK && strcmp(k, key) == 0) return KILN_OK;
    }
    return KILN_ERR_MISSING_DATA;
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if ((x) != KILN_OK) {                                                                      \
            fprintf(stderr, "%s: %s\n", #x, kiln_last_error());                                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void bench(int mbytes) {
    // Linears of 768 -> 3072 -> 768 (BERT-base's MLP shape), as many pairs as fill the size.
    const int64_t d = 768, h = 3072;
    int pairs = (int)(((int64_t)mbytes << 20) / (2 * d * h * 4));
    if (pairs < 1) pairs = 1;
    kiln_graph *g;
    CHECK(kiln_graph_new(&g));
    int32_t x;
    int64_t in_dims[2] = {1, d};
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, in_dims, in_dims, &x));
    float *w = malloc((size_t)(d * h) * sizeof(float));
    uint64_t seed = 1;
    int32_t v = x;
    for (int p = 0; p < 2 * pairs; p++) {
        for (int64_t i = 0; i < d * h; i++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            w[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) / (float)(1 << 30);
        }
        int64_t wd[2] = {p % 2 ? d : h, p % 2 ? h : d};
        int32_t c;
        CHECK(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, 2, wd, w,
                                      (size_t)(d * h) * sizeof(float), &c));
        int32_t ins[2] = {v, c};
        CHECK(kiln_graph_add_node(g, KILN_OP_LINEAR, ins, 2, NULL, 0, &v, 1));
    }
    CHECK(kiln_graph_mark_output(g, v, "y"));
    kiln_build_options bo;
    kiln_build_options_init(&bo);
    bo.external_weights = 1;
    kiln_built *b;
    CHECK(kiln_build(g, &bo, &b));
    const void *bytes;
    size_t n;
    CHECK(kiln_built_engine(b, &bytes, &n));
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 3; rep++) {
        for (int verify = 0; verify < 2; verify++) {
            kiln_option_setting s[2] = {
                {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"},
                {.name = "verify_weights", .type = KILN_OPTION_BOOL, .int_value = verify}};
            kiln_load_options lo;
            kiln_load_options_init(&lo);
            lo.resolve = resolve;
            lo.resolve_user_data = b;
            lo.settings = s;
            lo.n_settings = 2;
            kiln_engine *e;
            double t = now();
            CHECK(kiln_engine_load(bytes, n, &lo, &e));
            t = now() - t;
            if (t < best[verify]) best[verify] = t;
            kiln_engine_free(e);
        }
    }
    double mb = (double)(2 * pairs) * (double)(d * h * 4) / 1e6;
    printf("%7.0f MB of weights: load %.3f s unchecked, %.3f s checked: +%.3f s (%.0f MB/s)\n", mb,
           best[0], best[1], best[1] - best[0], mb / (best[1] - best[0]));
    kiln_built_free(b);
    kiln_graph_free(g);
    free(w);
}

int main(int argc, char **argv) {
    kiln_log_set(NULL, NULL, KILN_LOG_WARN);
    for (int i = 1; i < argc; i++) bench(atoi(argv[i]));
    return 0;
}
