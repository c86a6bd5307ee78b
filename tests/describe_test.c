// SPDX-License-Identifier: Apache-2.0
// kiln_engine_describe: the JSON of a built engine names its layers, fused tails, shapes,
// dtypes and weight bytes; the size protocol (NULL buffer, too small, exact); names with
// control bytes and bytes that are not UTF-8 come out escaped (the text stays 7-bit JSON);
// malformed bytes give the loader's statuses and write nothing.
#include "test_util.h"

static char *describe(const void *bytes, size_t n) {
    size_t len = 0;
    CHECK_OK(kiln_engine_describe(bytes, n, NULL, 0, &len));
    CHECK(len > 2);
    char *text = malloc(len + 1);
    CHECK(text != NULL);
    size_t len2 = 0;
    memset(text, 'z', len + 1);
    CHECK_OK(kiln_engine_describe(bytes, n, text, len, &len2)); // too small: nothing written
    CHECK(len2 == len && text[0] == 'z');
    CHECK_OK(kiln_engine_describe(bytes, n, text, len + 1, &len2));
    CHECK(len2 == len && text[len] == '\0' && strlen(text) == len);
    CHECK(text[0] == '{' && text[len - 1] == '}');
    return text;
}

static void test_layers_and_weights(void) {
    float *w = tu_rand(8 * 4, -1, 1);
    kiln_graph *g;
    kiln_built *b = NULL;
    const void *bytes;
    size_t n;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, 4), TU_DIMS(6, 4));
    int32_t cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(8, 4), w);
    int32_t y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw, -1), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RELU, TU_IDS(y), TU_NO_ATTRS);
    tu_output(g, y, "y");
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    char *t = describe(bytes, n);
    CHECK_MSG(strstr(t, "\"op\":\"linear\",\"tail\":false,\"n_tail\":1,\"fused\":[\"relu\"],"
                        "\"weight_nbytes\":128") != NULL,
              "%s", t);
    CHECK(strstr(t, "\"name\":\"x\",\"kind\":\"input\",\"dtype\":\"float32\",\"dim_min\":[1,4],"
                    "\"dim_max\":[6,4]") != NULL);
    CHECK(strstr(t, "\"kind\":\"weight\",\"dtype\":\"float32\",\"dim_min\":[8,4],\"dim_max\":[8,"
                    "4],\"nbytes\":128,\"external\":false") != NULL);
    CHECK(strstr(t, "\"arena_nbytes\":") != NULL && strstr(t, "\"n_inline\":1") != NULL);
    free(t);
    // malformed: a flipped magic, a truncation, NULL arguments
    uint8_t *copy = malloc(n);
    memcpy(copy, bytes, n);
    size_t len = 7;
    copy[0] ^= 1;
    CHECK_STATUS(kiln_engine_describe(copy, n, NULL, 0, &len), KILN_ERR_NOT_ENGINE);
    CHECK(len == 7);
    copy[0] ^= 1;
    CHECK_STATUS(kiln_engine_describe(copy, n - 1, NULL, 0, &len), KILN_ERR_CORRUPT);
    CHECK_STATUS(kiln_engine_describe(copy, n, NULL, 0, NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_engine_describe(copy, n, NULL, 5, &len), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_engine_describe(NULL, 8, NULL, 0, &len), KILN_ERR_INVALID_ARG);
    CHECK(len == 7);
    free(copy);
    kiln_built_free(b);
    kiln_graph_free(g);
    free(w);
}

static void test_untrusted_names(void) {
    kiln_graph *g;
    kiln_built *b = NULL;
    const void *bytes;
    size_t n;
    int32_t v = -1;
    const int64_t d3[1] = {3};
    CHECK_OK(kiln_graph_new(&g));
    // names are UTF-8 text without control characters: the graph API refuses others (the loader
    // refuses them in engine bytes, so describe never meets one)
    CHECK(kiln_graph_add_input(g, "a\x1b[0m", KILN_DTYPE_F32, 1, d3, d3, &v) ==
          KILN_ERR_INVALID_ARG);
    CHECK(kiln_graph_add_input(g, "a\xff", KILN_DTYPE_F32, 1, d3, d3, &v) == KILN_ERR_INVALID_ARG);
    int32_t x = tu_input(g, "a\"b\\c\xc3\xa9", KILN_DTYPE_F32, 1, TU_DIMS(3), TU_DIMS(3));
    int32_t y = tu_node(g, KILN_OP_NEG, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "\xe2\x82\xac/out");
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    char *t = describe(bytes, n);
    // '"' and '\' escaped, UTF-8 (e acute, the euro sign) kept as it is
    CHECK_MSG(strstr(t, "\"a\\\"b\\\\c\xc3\xa9\"") != NULL, "%s", t);
    CHECK_MSG(strstr(t, "\"\xe2\x82\xac/out\"") != NULL, "%s", t);
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) {
        CHECK(*p >= 0x20 && *p != 0x7f); // no raw control byte reaches the text
    }
    free(t);
    kiln_built_free(b);
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_NONE);
    test_layers_and_weights();
    test_untrusted_names();
    return check_summary();
}
