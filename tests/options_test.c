// SPDX-License-Identifier: Apache-2.0
// Runtime options: the process-wide setters and getters, the option table, error messages
// (unknown names list the valid ones, wrong types, ranges), and per-load overrides resolved on
// top of the process values (src/core/options.c), including through kiln_engine_load.
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
    // The table as documented in docs/runtime.md and docs/options.md.
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
    };
    uint32_t n = kiln_option_count();
    CHECK_EQ_INT(n, sizeof want / sizeof want[0]);
    for (uint32_t i = 0; i < n && i < sizeof want / sizeof want[0]; i++) {
        const char *name = NULL, *def = NULL, *scope = NULL;
        kiln_option_type type = 0;
        CHECK_OK(kiln_option_info(i, &name, &type, &def, &scope));
        CHECK_MSG(name && strcmp(name, want[i].name) == 0, "option %u: %s", i, name);
        CHECK_EQ_INT(type, want[i].type);
        CHECK_MSG(def && strcmp(def, want[i].def) == 0, "%s default %s", want[i].name, def);
        CHECK_MSG(scope && strcmp(scope, want[i].scope) == 0, "%s scope %s", want[i].name, scope);
        // Defaults read back as their documented text.
        CHECK_MSG(strcmp(get(want[i].name), want[i].def) == 0, "%s = %s", want[i].name,
                  get(want[i].name));
    }
    CHECK_STATUS(kiln_option_info(n, NULL, NULL, NULL, NULL), KILN_ERR_INVALID_ARG);
    // NULL outs are allowed.
    CHECK_OK(kiln_option_info(0, NULL, NULL, NULL, NULL));
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

int main(void) {
    kiln_log_set(capture, NULL, KILN_LOG_DEBUG);
    test_table();
    test_set_get();
    test_errors();
    test_per_load();
    test_engine_overrides();
    return check_summary();
}
