// SPDX-License-Identifier: Apache-2.0
// Runtime options: the process-wide setters and getters, the option table, error messages
// (unknown names list the valid ones, wrong types, ranges), and per-load overrides resolved on
// top of the process values (src/core/options.c), including through kiln_engine_load.
#define _POSIX_C_SOURCE 200809L // setenv, unsetenv (the environment's debug overrides)
#include <stdio.h>
#include <stdlib.h>

#include "core/options.h"
#include "runtime/backend.h"
#include "test_util.h"

static char last_log[1024];
static void capture(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    snprintf(last_log, sizeof last_log, "%s", msg);
}

static const char *get(const char *name) {
    static char buf[64];
    buf[0] = '\0';
    CHECK_OK(kiln_get_option(name, buf, sizeof buf));
    return buf;
}

static void test_table(void) {
    // The first rows as documented (their order is part of the table's contract).
    static const struct {
        const char *name;
        kiln_option_type type;
        const char *def;
        const char *scope;
    } want[] = {
        {"device", KILN_OPTION_STRING, "auto", "both"},
        {"use_cuda_graphs", KILN_OPTION_BOOL, "true", "both"},
        {"use_shared_activation_scratch", KILN_OPTION_BOOL, "false", "process"},
        {"num_threads", KILN_OPTION_INT, "1", "both"},
        {"profile", KILN_OPTION_BOOL, "false", "both"},
        {"cuda.cublaslt", KILN_OPTION_BOOL, "true", "both"},
    };
    uint32_t n = kiln_option_count();
    CHECK(n > sizeof want / sizeof want[0]);
    for (uint32_t i = 0; i < n && i < sizeof want / sizeof want[0]; i++) {
        const char *name = NULL, *def = NULL, *scope = NULL;
        kiln_option_type type = 0;
        CHECK_OK(kiln_option_info(i, &name, &type, &def, &scope));
        CHECK_MSG(name && strcmp(name, want[i].name) == 0, "option %u: %s", i, name);
        CHECK_EQ_INT(type, want[i].type);
        CHECK_MSG(def && strcmp(def, want[i].def) == 0, "%s default %s", want[i].name, def);
        CHECK_MSG(scope && strcmp(scope, want[i].scope) == 0, "%s scope %s", want[i].name, scope);
    }
    // Every option: its default reads back as its documented text, it has help and accepted
    // values, and docs/options.md has its row (name, type, default, environment variable).
    FILE *f = fopen("docs/options.md", "rb");
    static char doc[65536];
    size_t doc_n = f != NULL ? fread(doc, 1, sizeof doc - 1, f) : 0;
    if (f != NULL) fclose(f);
    doc[doc_n] = '\0';
    CHECK_MSG(doc_n > 0, "docs/options.md not readable from the test's working directory");
    for (uint32_t i = 0; i < n; i++) {
        const char *name = NULL, *def = NULL, *scope = NULL, *help = NULL;
        kiln_option_type type = 0;
        char env[64], acc[256], row[256];
        CHECK_OK(kiln_option_info(i, &name, &type, &def, &scope));
        CHECK_OK(kiln_option_describe(i, &help, env, sizeof env, acc, sizeof acc));
        CHECK_MSG(strcmp(get(name), def) == 0, "%s = %s, default %s", name, get(name), def);
        CHECK_MSG(help != NULL && strlen(help) > 10 && acc[0] != '\0', "%s: no help", name);
        CHECK_MSG(strncmp(name, "cuda.", 5) != 0 || strncmp(env, "KILN_CUDA_", 10) == 0,
                  "%s: env %s", name, env);
        snprintf(row, sizeof row, "| `%s` | %s | `%s` | %s | %s%s%s |", name,
                 type == KILN_OPTION_BOOL  ? "bool"
                 : type == KILN_OPTION_INT ? "int"
                                           : "string",
                 def, scope, env[0] ? "`" : "", env[0] ? env : "-", env[0] ? "`" : "");
        CHECK_MSG(strstr(doc, row) != NULL, "docs/options.md lacks the row: %s", row);
    }
    CHECK_STATUS(kiln_option_info(n, NULL, NULL, NULL, NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_option_describe(n, NULL, NULL, 0, NULL, 0), KILN_ERR_INVALID_ARG);
    // NULL outs are allowed.
    CHECK_OK(kiln_option_info(0, NULL, NULL, NULL, NULL));
    CHECK_OK(kiln_option_describe(0, NULL, NULL, 0, NULL, 0));
}

// The CUDA policy: typed values, enums by name or number, the config string, every source.
static void test_cuda_policy(void) {
    kiln_options o;
    kiln_option_setting s[3];
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK(o.cuda.cublaslt == 1 && o.cuda.tune == 1 && o.cuda.splitk == 0 && o.cuda.wgmma_bn == 0 &&
          o.cuda.l2_keep_pct == 50 && o.cuda.sdpa_rows == 0 && o.cuda.debug_sync == 0 &&
          o.cuda.profile_delay_us == 100 && o.profile == 0);
    CHECK_OK(kiln_set_option_string("cuda.splitk", "off"));
    CHECK(strcmp(get("cuda.splitk"), "off") == 0);
    CHECK_OK(kiln_set_option_int("cuda.splitk", 4)); // a number names a numeric choice
    CHECK(strcmp(get("cuda.splitk"), "4") == 0);
    CHECK_STATUS(kiln_set_option_int("cuda.splitk", 3), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "auto, off, 2, 4, 8") != NULL);
    CHECK(strcmp(get("cuda.splitk"), "4") == 0); // unchanged by the failed set
    CHECK_OK(kiln_set_option_string("cuda.splitk", "auto"));
    CHECK_OK(kiln_set_option_string("cuda.wgmma_config", "128,2,1"));
    CHECK(strcmp(get("cuda.wgmma_config"), "128,2,1") == 0);
    static const char *bad_cfg[] = {"128,2", "96,2,1", "128,3,1", "128,2,3", "128,2,1,", "x", ""};
    for (size_t i = 0; i < sizeof bad_cfg / sizeof bad_cfg[0]; i++) {
        CHECK_STATUS(kiln_set_option_string("cuda.wgmma_config", bad_cfg[i]), KILN_ERR_INVALID_ARG);
    }
    CHECK(strstr(kiln_last_error(), "BN,SPLIT,OCC") != NULL);
    CHECK_OK(kiln_set_option_string("cuda.wgmma_config", "auto"));
    CHECK_STATUS(kiln_set_option_int("cuda.l2_keep_pct", 101), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "0..100") != NULL);
    CHECK_STATUS(kiln_set_option_string("cuda.tune", "no"), KILN_ERR_INVALID_ARG); // bool type
    // The pointwise conv kernel: auto (timed) by default, off and on map to -1 and 1.
    CHECK_EQ_INT(o.cuda.conv_pw, 0);
    CHECK_OK(kiln_set_option_string("cuda.conv_pw", "off"));
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK_EQ_INT(o.cuda.conv_pw, -1);
    CHECK_OK(kiln_set_option_string("cuda.conv_pw", "on"));
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK_EQ_INT(o.cuda.conv_pw, 1);
    CHECK_STATUS(kiln_set_option_string("cuda.conv_pw", "always"), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "auto, off, on") != NULL);
    CHECK_OK(kiln_set_option_string("cuda.conv_pw", "auto"));
    // 1x1 convs as a cuBLASLt GEMM over the pixels: the same three values.
    CHECK_EQ_INT(o.cuda.conv_lt, 0);
    CHECK_OK(kiln_set_option_string("cuda.conv_lt", "on"));
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK_EQ_INT(o.cuda.conv_lt, 1);
    CHECK_STATUS(kiln_set_option_string("cuda.conv_lt", "yes"), KILN_ERR_INVALID_ARG);
    CHECK_OK(kiln_set_option_string("cuda.conv_lt", "auto"));
    // Per load: the settings land in the policy.
    s[0] = (kiln_option_setting){.name = "cuda.tune", .type = KILN_OPTION_BOOL, .int_value = 0};
    s[1] = (kiln_option_setting){
        .name = "cuda.wgmma_config", .type = KILN_OPTION_STRING, .string_value = "64,4,2"};
    s[2] = (kiln_option_setting){
        .name = "cuda.sdpa_rows", .type = KILN_OPTION_STRING, .string_value = "32"};
    CHECK_OK(kiln_options_resolve(s, 3, &o));
    CHECK(o.cuda.tune == 0 && o.cuda.wgmma_bn == 64 && o.cuda.wgmma_split == 4 &&
          o.cuda.wgmma_occ == 2 && o.cuda.sdpa_rows == 32);
    CHECK(strcmp(get("cuda.tune"), "true") == 0); // the process value is untouched
    // The environment overrides both, with one parsing rule; a bad value names the variable.
    setenv("KILN_CUDA_TUNE", "Yes", 1);
    setenv("KILN_CUDA_SPLITK", "8", 1);
    setenv("KILN_PROFILE", "on", 1);
    CHECK_OK(kiln_options_resolve(s, 3, &o));
    CHECK(o.cuda.tune == 1 && o.cuda.splitk == 8 && o.profile == 1);
    setenv("KILN_CUDA_TUNE", "maybe", 1);
    CHECK_STATUS(kiln_options_resolve(NULL, 0, &o), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "KILN_CUDA_TUNE='maybe'") != NULL &&
          strstr(kiln_last_error(), "cuda.tune") != NULL &&
          strstr(kiln_last_error(), "true") != NULL);
    setenv("KILN_CUDA_TUNE", "false", 1); // "false" is false (not just "0")
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK_EQ_INT(o.cuda.tune, 0);
    unsetenv("KILN_CUDA_TUNE");
    unsetenv("KILN_CUDA_SPLITK");
    unsetenv("KILN_PROFILE");
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK(o.cuda.tune == 1 && o.cuda.splitk == 0 && o.profile == 0);
}

static void test_set_get(void) {
    char small[4];
    CHECK_OK(kiln_set_option_string("device", "cpu"));
    CHECK(strcmp(get("device"), "cpu") == 0);
    CHECK_OK(kiln_set_option_string("device", "cuda:3"));
    CHECK(strcmp(get("device"), "cuda:3") == 0);
    CHECK_OK(kiln_set_option_bool("use_cuda_graphs", 0));
    CHECK(strcmp(get("use_cuda_graphs"), "false") == 0);
    CHECK_OK(kiln_set_option_bool("use_cuda_graphs", 7)); // any nonzero is true
    CHECK(strcmp(get("use_cuda_graphs"), "true") == 0);
    CHECK_OK(kiln_set_option_bool("use_shared_activation_scratch", 1));
    CHECK(strcmp(get("use_shared_activation_scratch"), "true") == 0);
    CHECK_OK(kiln_set_option_int("num_threads", 64));
    CHECK(strcmp(get("num_threads"), "64") == 0);
    CHECK_OK(kiln_set_option_int("num_threads", 1));
    CHECK(strcmp(get("num_threads"), "1") == 0);
    // Truncation to the buffer, always terminated.
    CHECK_OK(kiln_set_option_string("device", "cuda:123"));
    CHECK_OK(kiln_get_option("device", small, sizeof small));
    CHECK(strcmp(small, "cud") == 0);
    CHECK_STATUS(kiln_get_option("device", NULL, 8), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_get_option("device", small, 0), KILN_ERR_INVALID_ARG);
}

static void test_errors(void) {
    // Unknown names list every valid option with its type.
    CHECK_STATUS(kiln_set_option_bool("use_cuda_graph", 1), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "use_cuda_graph'") != NULL);
    CHECK(strstr(kiln_last_error(), "device (string)") != NULL);
    CHECK(strstr(kiln_last_error(), "use_cuda_graphs (bool)") != NULL);
    CHECK(strstr(kiln_last_error(), "use_shared_activation_scratch (bool)") != NULL);
    CHECK(strstr(kiln_last_error(), "num_threads (int)") != NULL);
    CHECK(strcmp(last_log, kiln_last_error()) == 0); // the message also went to the log hook
    CHECK_STATUS(kiln_get_option("nope", (char[8]){0}, 8), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_set_option_int(NULL, 1), KILN_ERR_INVALID_ARG);
    // Wrong types name the expected and the given type.
    CHECK_STATUS(kiln_set_option_int("device", 1), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "string") != NULL && strstr(kiln_last_error(), "int") != NULL);
    CHECK_STATUS(kiln_set_option_string("num_threads", "4"), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_set_option_bool("num_threads", 1), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_set_option_int("use_cuda_graphs", 1), KILN_ERR_INVALID_ARG);
    // Ranges and values.
    CHECK_STATUS(kiln_set_option_int("num_threads", 0), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "1..64") != NULL);
    CHECK_STATUS(kiln_set_option_int("num_threads", 65), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_set_option_int("num_threads", -1), KILN_ERR_INVALID_ARG);
    static const char *bad_devices[] = {"gpu",     "cuda",      "cuda:", "cuda:-1", "cuda:x",
                                        "cuda:1x", "cuda:1024", "CPU",   "",        " cpu"};
    for (size_t i = 0; i < sizeof bad_devices / sizeof bad_devices[0]; i++) {
        CHECK_STATUS(kiln_set_option_string("device", bad_devices[i]), KILN_ERR_INVALID_ARG);
    }
    CHECK_STATUS(kiln_set_option_string("device", NULL), KILN_ERR_INVALID_ARG);
    // A failed set leaves the value unchanged.
    CHECK_OK(kiln_set_option_int("num_threads", 3));
    CHECK_STATUS(kiln_set_option_int("num_threads", 100), KILN_ERR_INVALID_ARG);
    CHECK(strcmp(get("num_threads"), "3") == 0);
    CHECK_OK(kiln_set_option_string("device", "cpu"));
    CHECK_STATUS(kiln_set_option_string("device", "tpu"), KILN_ERR_INVALID_ARG);
    CHECK(strcmp(get("device"), "cpu") == 0);
}

static void test_per_load(void) {
    kiln_options o;
    kiln_option_setting s[3];
    CHECK_OK(kiln_set_option_string("device", "cpu"));
    CHECK_OK(kiln_set_option_bool("use_cuda_graphs", 1));
    CHECK_OK(kiln_set_option_int("num_threads", 2));
    CHECK_OK(kiln_set_option_bool("use_shared_activation_scratch", 1));
    // No settings: the process values.
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK(strcmp(o.device, "cpu") == 0 && o.use_cuda_graphs == 1 && o.num_threads == 2 &&
          o.use_shared_activation_scratch == 1);
    // Overrides apply on top, in order (the last one wins), without touching process values.
    s[0] = (kiln_option_setting){
        .name = "device", .type = KILN_OPTION_STRING, .string_value = "cuda:1"};
    s[1] = (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_INT, .int_value = 8};
    s[2] = (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_INT, .int_value = 5};
    CHECK_OK(kiln_options_resolve(s, 3, &o));
    CHECK(strcmp(o.device, "cuda:1") == 0);
    CHECK_EQ_INT(o.num_threads, 5);
    CHECK_EQ_INT(o.use_cuda_graphs, 1);
    CHECK(strcmp(get("device"), "cpu") == 0 && strcmp(get("num_threads"), "2") == 0);
    s[0] = (kiln_option_setting){.name = "use_cuda_graphs", .type = KILN_OPTION_BOOL};
    CHECK_OK(kiln_options_resolve(s, 1, &o));
    CHECK_EQ_INT(o.use_cuda_graphs, 0);
    // Errors: unknown, wrong type, out of range, process-only, NULL array.
    s[0] = (kiln_option_setting){.name = "threads", .type = KILN_OPTION_INT, .int_value = 2};
    CHECK_STATUS(kiln_options_resolve(s, 1, &o), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "num_threads (int)") != NULL);
    s[0] = (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_BOOL, .int_value = 1};
    CHECK_STATUS(kiln_options_resolve(s, 1, &o), KILN_ERR_INVALID_ARG);
    s[0] = (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_INT, .int_value = 0};
    CHECK_STATUS(kiln_options_resolve(s, 1, &o), KILN_ERR_INVALID_ARG);
    s[0] =
        (kiln_option_setting){.name = "device", .type = KILN_OPTION_STRING, .string_value = "cuda"};
    CHECK_STATUS(kiln_options_resolve(s, 1, &o), KILN_ERR_INVALID_ARG);
    s[0] = (kiln_option_setting){.name = "use_shared_activation_scratch", .type = KILN_OPTION_BOOL};
    CHECK_STATUS(kiln_options_resolve(s, 1, &o), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "process-wide") != NULL);
    CHECK_STATUS(kiln_options_resolve(NULL, 2, &o), KILN_ERR_INVALID_ARG);
    // Restore the defaults.
    CHECK_OK(kiln_set_option_string("device", "auto"));
    CHECK_OK(kiln_set_option_bool("use_cuda_graphs", 1));
    CHECK_OK(kiln_set_option_int("num_threads", 1));
    CHECK_OK(kiln_set_option_bool("use_shared_activation_scratch", 0));
}

// Per-load overrides through kiln_engine_load: the engine keeps the values it was loaded with.
static void test_engine_overrides(void) {
    kiln_graph *g = NULL;
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    const void *bytes;
    size_t n;
    kiln_load_options lo;
    kiln_option_setting s[2];
    int32_t x;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    x = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(1), TU_DIMS(4));
    tu_output(g, tu_node(g, KILN_OP_RELU, TU_IDS(x), TU_NO_ATTRS), "y");
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    kiln_load_options_init(&lo);
    CHECK_EQ_INT(lo.struct_nbytes, sizeof lo);
    CHECK(lo.resolve == NULL && lo.settings == NULL && lo.n_settings == 0);
    // Process-wide device cuda:0 (no CUDA here) overridden per load by cpu.
    if (kiln_backend_cuda_get() == NULL) {
        CHECK_OK(kiln_set_option_string("device", "cuda:0"));
        CHECK_STATUS(kiln_engine_load(bytes, n, &lo, &e), KILN_ERR_DEVICE);
        s[0] = (kiln_option_setting){
            .name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"};
        s[1] =
            (kiln_option_setting){.name = "num_threads", .type = KILN_OPTION_INT, .int_value = 2};
        lo.settings = s;
        lo.n_settings = 2;
        CHECK_OK(kiln_engine_load(bytes, n, &lo, &e));
        CHECK(e != NULL && strcmp(kiln_engine_device(e), "cpu") == 0);
        // Changing the process option later does not touch a loaded engine.
        CHECK_OK(kiln_set_option_string("device", "auto"));
        CHECK(e != NULL && strcmp(kiln_engine_device(e), "cpu") == 0);
        kiln_engine_free(e);
        e = NULL;
    }
    // Errors in the settings fail the load and name the option.
    s[0] = (kiln_option_setting){.name = "num_thread", .type = KILN_OPTION_INT, .int_value = 2};
    lo.settings = s;
    lo.n_settings = 1;
    CHECK_STATUS(kiln_engine_load(bytes, n, &lo, &e), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "num_thread'") &&
          strstr(kiln_last_error(), "num_threads (int)"));
    s[0] = (kiln_option_setting){.name = "device", .type = KILN_OPTION_BOOL, .int_value = 1};
    CHECK_STATUS(kiln_engine_load(bytes, n, &lo, &e), KILN_ERR_INVALID_ARG);
    lo.settings = NULL;
    CHECK_STATUS(kiln_engine_load(bytes, n, &lo, &e), KILN_ERR_INVALID_ARG);
    CHECK(e == NULL);
    kiln_built_free(b);
}

// A KILN_CUDA_* variable that overrides no option (a misspelling, or a removed switch) is
// reported once per process, at the first resolution, instead of being silently ignored.
static void test_env_unknown(void) {
    kiln_options o;
    setenv("KILN_CUDA_NO_CUDNN", "1", 1);
    last_log[0] = '\0';
    CHECK_OK(kiln_options_resolve(NULL, 0, &o));
    CHECK_MSG(strstr(last_log, "KILN_CUDA_NO_CUDNN is not a Kiln option") != NULL, "log: %s",
              last_log);
    CHECK_EQ_INT(o.cuda.cudnn, 1);
    unsetenv("KILN_CUDA_NO_CUDNN");
}

int main(void) {
    kiln_log_set(capture, NULL, KILN_LOG_DEBUG);
    test_env_unknown(); // first: the check runs at the process's first resolution
    test_table();
    test_cuda_policy();
    test_set_get();
    test_errors();
    test_per_load();
    test_engine_overrides();
    return check_summary();
}
