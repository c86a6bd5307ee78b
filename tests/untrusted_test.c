// SPDX-License-Identifier: Apache-2.0
// Untrusted inputs at the engine API (issue: untrusted files end to end): external weights are
// checked against the SHA-256 their keys name (every bit flip spread over them is refused, with
// the weight and the remedy named; the option verify_weights skips it), messages and the log hook
// carry only UTF-8 text (bytes quoted from a file are escaped, long messages are cut at a
// character), status names, and the graph API's limits (a shape whose byte size overflows, names
// that are not UTF-8 text).
#include "core/sha256.h"
#include "core/status.h"
#include "core/utf8.h"
#include "runtime/engine_internal.h"
#include "runtime/load.h"
#include "test_util.h"

static int is_text(const char *s) { return kiln_utf8_check(s, strlen(s)) == strlen(s); }

// --- the log hook: every message it receives is UTF-8 text

static int n_logged, n_logged_bad;
static void text_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    n_logged++;
    if (!is_text(msg)) n_logged_bad++;
}

// --- a small MLP with every weight external

typedef struct mutable_weights {
    const kiln_built *b;
    uint8_t *copy[8]; // per weight: a private, mutable copy of its bytes
    size_t nbytes[8];
    const char *keys[8];
    uint32_t n;
    int calls;
} mutable_weights;

static kiln_status resolve_copy(void *ud, const char *key, const void **out, size_t *n) {
    mutable_weights *m = ud;
    m->calls++;
    for (uint32_t i = 0; i < m->n; i++) {
        if (strcmp(m->keys[i], key) == 0) {
            *out = m->copy[i];
            *n = m->nbytes[i];
            return KILN_OK;
        }
    }
    return KILN_ERR_MISSING_DATA;
}

static kiln_built *build_mlp(int external) {
    kiln_graph *g = NULL;
    kiln_built *b = NULL;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, 16), TU_DIMS(4, 16));
    float *w1 = tu_rand(32 * 16, -1, 1), *b1 = tu_rand(32, -1, 1);
    float *w2 = tu_rand(8 * 32, -1, 1), *b2 = tu_rand(8, -1, 1);
    int32_t cw1 = tu_const(g, "fc1.weight", KILN_DTYPE_F32, 2, TU_DIMS(32, 16), w1);
    int32_t cb1 = tu_const(g, "fc1.bias", KILN_DTYPE_F32, 1, TU_DIMS(32), b1);
    int32_t cw2 = tu_const(g, "fc2.weight", KILN_DTYPE_F32, 2, TU_DIMS(8, 32), w2);
    int32_t cb2 = tu_const(g, "fc2.bias", KILN_DTYPE_F32, 1, TU_DIMS(8), b2);
    int32_t h = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw1, cb1), TU_NO_ATTRS);
    h = tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS);
    int32_t y = tu_node(g, KILN_OP_LINEAR, TU_IDS(h, cw2, cb2), TU_NO_ATTRS);
    tu_output(g, y, "y");
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, external, &b));
    free(w1), free(b1), free(w2), free(b2);
    kiln_graph_free(g);
    return b;
}

// Load options on the CPU with m's weights resolved (the process-wide verify_weights applies).
static const kiln_option_setting cpu_device = {
    .name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"};
static void cpu_load_options(kiln_load_options *lo, mutable_weights *m) {
    kiln_load_options_init(lo);
    lo->resolve = resolve_copy;
    lo->resolve_user_data = m;
    lo->settings = &cpu_device;
    lo->n_settings = 1;
}

static kiln_status load_verify(const kiln_built *b, mutable_weights *m, int verify,
                               kiln_engine **out) {
    const void *bytes;
    size_t n;
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    kiln_option_setting s[2] = {
        {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"},
        {.name = "verify_weights", .type = KILN_OPTION_BOOL, .int_value = verify},
    };
    kiln_load_options lo;
    kiln_load_options_init(&lo);
    lo.resolve = resolve_copy;
    lo.resolve_user_data = m;
    lo.settings = s;
    lo.n_settings = 2;
    kiln_clear_error();
    return kiln_engine_load(bytes, n, &lo, out);
}

// Runs the engine on x and writes y[4 * 8].
static void run(kiln_engine *e, const float *x, float *y) {
    kiln_context *c = NULL;
    CHECK_OK(kiln_context_new(e, &c));
    tu_io in = {2, {4, 16}, (void *)(uintptr_t)x, 0}, out = {0, {0}, y, 4 * 8 * sizeof(float)};
    CHECK_OK(tu_execute(c, &in, 1, &out, 1));
    kiln_context_free(c);
}

static void test_weight_verification(void) {
    kiln_built *b = build_mlp(1);
    mutable_weights m = {.b = b};
    m.n = kiln_built_n_weights(b);
    CHECK_EQ_INT(m.n, 4);
    for (uint32_t i = 0; i < m.n; i++) {
        const void *d;
        CHECK_OK(kiln_built_weight(b, i, &m.keys[i], &d, &m.nbytes[i]));
        m.copy[i] = malloc(m.nbytes[i]);
        memcpy(m.copy[i], d, m.nbytes[i]);
    }
    float *x = tu_rand(4 * 16, -1, 1), y0[32], y1[32];
    kiln_engine *e = NULL;
    CHECK_OK(load_verify(b, &m, 1, &e));
    run(e, x, y0);
    kiln_engine_free(e);

    // Bit flips spread over every weight: each one is refused, naming the weight and the remedy.
    int n_cases = 0;
    for (uint32_t w = 0; w < m.n; w++) {
        for (size_t bit = 0; bit < 8 * m.nbytes[w]; bit += 1 + (bit % 97)) {
            m.copy[w][bit / 8] ^= (uint8_t)(1u << (bit % 8));
            e = NULL;
            kiln_status st = load_verify(b, &m, 1, &e);
            CHECK_MSG(st == KILN_ERR_CORRUPT, "weight %u bit %zu: %s", w, bit, kiln_status_str(st));
            const char *msg = kiln_last_error();
            CHECK_MSG(strstr(msg, m.keys[w]) != NULL && strstr(msg, "does not match the SHA-256") &&
                          strstr(msg, "re-export, or the file was damaged in transit") &&
                          strstr(msg, "verify_weights"),
                      "weight %u bit %zu: %s", w, bit, msg);
            CHECK(e == NULL);
            n_cases++;
            m.copy[w][bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
    }
    CHECK(n_cases > 100);

    // Names the tensor's name, dtype and shape. (The top exponent bit of every float of every
    // weight: whatever ReLU hides, the outputs change.)
    for (uint32_t w = 0; w < m.n; w++) {
        for (size_t i = 3; i < m.nbytes[w]; i += 4) m.copy[w][i] ^= 0x40;
    }
    CHECK_STATUS(load_verify(b, &m, 1, &e), KILN_ERR_CORRUPT);
    CHECK_MSG(strstr(kiln_last_error(), "float32") != NULL, "%s", kiln_last_error());

    // verify_weights = false: the damaged bytes load (the trusted-file mode) and change the
    // outputs, which is exactly what the check exists to prevent.
    e = NULL;
    CHECK_OK(load_verify(b, &m, 0, &e));
    run(e, x, y1);
    kiln_engine_free(e);
    for (uint32_t w = 0; w < m.n; w++) {
        for (size_t i = 3; i < m.nbytes[w]; i += 4) m.copy[w][i] ^= 0x40;
    }
    CHECK_MSG(memcmp(y0, y1, sizeof y0) != 0, "a flipped weight bit left the outputs unchanged");

    // The process-wide option works too, and restores.
    CHECK_OK(kiln_set_option_bool("verify_weights", 0));
    kiln_load_options lo;
    cpu_load_options(&lo, &m);
    const void *bytes;
    size_t n;
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    m.copy[1][3] ^= 0x10;
    CHECK_OK(kiln_engine_load(bytes, n, &lo, &e));
    kiln_engine_free(e);
    CHECK_OK(kiln_set_option_bool("verify_weights", 1));
    CHECK_STATUS(kiln_engine_load(bytes, n, &lo, &e), KILN_ERR_CORRUPT);
    m.copy[1][3] ^= 0x10;

    // Undamaged again: loads and computes the first result bit for bit.
    CHECK_OK(load_verify(b, &m, 1, &e));
    run(e, x, y1);
    kiln_engine_free(e);
    CHECK(memcmp(y0, y1, sizeof y0) == 0);

    // Data of the right size from another export (another weight of the same size, here a copy
    // with different values) is refused too.
    uint8_t *other = malloc(m.nbytes[0]);
    for (size_t i = 0; i < m.nbytes[0]; i++) other[i] = (uint8_t)(m.copy[0][i] + 1);
    uint8_t *saved = m.copy[0];
    m.copy[0] = other;
    CHECK_STATUS(load_verify(b, &m, 1, &e), KILN_ERR_CORRUPT);
    m.copy[0] = saved;
    free(other);

    for (uint32_t i = 0; i < m.n; i++) free(m.copy[i]);
    free(x);
    kiln_built_free(b);
}

// Over 64 MiB of weights the check runs on several threads: a pristine engine loads, and with
// two damaged weights the message names the one of the lower tensor index, every time.
static void test_parallel_verification(void) {
    enum { N = 4, ROWS = 2560, COLS = 2048 }; // 4 x 20 MiB of float32
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    int32_t v = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, COLS), TU_DIMS(1, COLS));
    float *w = malloc((size_t)ROWS * COLS * sizeof(float));
    for (int i = 0; i < N; i++) {
        tu_fill(w, (int64_t)ROWS * COLS, -0.01f, 0.01f);
        int rows = i % 2 == 0 ? ROWS : COLS, cols = i % 2 == 0 ? COLS : ROWS;
        int32_t c = tu_const(g, NULL, KILN_DTYPE_F32, 2, TU_DIMS(rows, cols), w);
        v = tu_node(g, KILN_OP_LINEAR, TU_IDS(v, c), TU_NO_ATTRS);
    }
    tu_output(g, v, "y");
    free(w);
    kiln_built *b = NULL;
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 1, &b));
    kiln_graph_free(g);
    mutable_weights m = {.b = b};
    m.n = kiln_built_n_weights(b);
    CHECK_EQ_INT(m.n, N);
    for (uint32_t i = 0; i < m.n; i++) {
        const void *d;
        CHECK_OK(kiln_built_weight(b, i, &m.keys[i], &d, &m.nbytes[i]));
        m.copy[i] = malloc(m.nbytes[i]);
        memcpy(m.copy[i], d, m.nbytes[i]);
    }
    kiln_engine *e = NULL;
    CHECK_OK(load_verify(b, &m, 1, &e));
    kiln_engine_free(e);
    // Damage the last two weights (in the order kiln_built lists them: the engine's order).
    m.copy[2][m.nbytes[2] / 2] ^= 0x01;
    m.copy[3][m.nbytes[3] - 1] ^= 0x80;
    for (int rep = 0; rep < 4; rep++) {
        CHECK_STATUS(load_verify(b, &m, 1, &e), KILN_ERR_CORRUPT);
        CHECK_MSG(strstr(kiln_last_error(), m.keys[2]) != NULL, "rep %d: %s", rep,
                  kiln_last_error());
    }
    m.copy[2][m.nbytes[2] / 2] ^= 0x01;
    CHECK_STATUS(load_verify(b, &m, 1, &e), KILN_ERR_CORRUPT);
    CHECK(strstr(kiln_last_error(), m.keys[3]) != NULL);
    m.copy[3][m.nbytes[3] - 1] ^= 0x80;
    CHECK_OK(load_verify(b, &m, 1, &e));
    kiln_engine_free(e);
    for (uint32_t i = 0; i < m.n; i++) free(m.copy[i]);
    kiln_built_free(b);
}

// Engines written before the tree digest name their external weights "kiln-w-<plain SHA-256>":
// still checked the same way (the built engine's keys rewritten in its plan, same length).
static void test_plain_digest_keys(void) {
    kiln_built *b = build_mlp(1);
    mutable_weights m = {.b = b};
    m.n = kiln_built_n_weights(b);
    char keys[8][80];
    const char *tree_keys[8];
    for (uint32_t i = 0; i < m.n; i++) {
        const void *d;
        uint8_t dg[KILN_SHA256_NBYTES];
        CHECK_OK(kiln_built_weight(b, i, &m.keys[i], &d, &m.nbytes[i]));
        CHECK(strncmp(m.keys[i], "kiln-t-", 7) == 0);
        tree_keys[i] = m.keys[i];
        m.copy[i] = malloc(m.nbytes[i]);
        memcpy(m.copy[i], d, m.nbytes[i]);
        kiln_sha256(d, m.nbytes[i], dg);
        memcpy(keys[i], "kiln-w-", 7);
        kiln_sha256_hex(dg, keys[i] + 7);
    }
    const void *bytes;
    size_t nb;
    CHECK_OK(kiln_built_engine(b, &bytes, &nb));
    float *x = tu_rand(4 * 16, -1, 1), y0[32], y1[32];
    for (int damaged = 0; damaged < 2; damaged++) {
        kiln_plan plan;
        CHECK_OK(kiln_load_plan(bytes, nb, &plan));
        int rewritten = 0;
        for (uint32_t t = 0; t < plan.n_tensors; t++) {
            if (plan.tensors[t].key == KILN_NO_KEY) continue;
            char *k = plan.strings + plan.tensors[t].key;
            for (uint32_t i = 0; i < m.n; i++) {
                if (strcmp(k, tree_keys[i]) == 0) {
                    memcpy(k, keys[i], strlen(keys[i]));
                    rewritten++;
                }
            }
        }
        CHECK(rewritten == (int)m.n);
        for (uint32_t i = 0; i < m.n; i++) m.keys[i] = keys[i]; // the resolver's names now
        if (damaged) m.copy[1][5] ^= 0x04;
        kiln_load_options lo;
        cpu_load_options(&lo, &m);
        kiln_engine *e = NULL;
        kiln_status st = kiln_engine_from_plan(&plan, &lo, &e);
        if (!damaged) {
            CHECK_OK(st);
            if (e != NULL) run(e, x, y0);
            kiln_engine_free(e);
        } else {
            CHECK_STATUS(st, KILN_ERR_CORRUPT);
            CHECK_MSG(strstr(kiln_last_error(), keys[1]) != NULL, "%s", kiln_last_error());
            m.copy[1][5] ^= 0x04;
        }
    }
    // the same results as the engine with tree keys
    {
        for (uint32_t i = 0; i < m.n; i++) {
            const void *d;
            size_t n;
            CHECK_OK(kiln_built_weight(b, i, &m.keys[i], &d, &n));
        }
        kiln_engine *e = NULL;
        CHECK_OK(load_verify(b, &m, 1, &e));
        if (e != NULL) run(e, x, y1);
        kiln_engine_free(e);
        CHECK(memcmp(y0, y1, sizeof y0) == 0);
    }
    for (uint32_t i = 0; i < m.n; i++) free(m.copy[i]);
    free(x);
    kiln_built_free(b);
}

// The accelerated digest (libcrypto, when the system has one) equals the portable one.
static void test_sha256_fast(void) {
    size_t lens[] = {0, 1, 63, 64, 4095, 4096, 4097, 65536 + 13, (size_t)3 << 20};
    uint8_t *buf = malloc(lens[8]);
    for (size_t i = 0; i < lens[8]; i++) buf[i] = (uint8_t)check_rng_int(0, 255);
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        uint8_t a[32], b[32];
        kiln_sha256(buf, lens[k], a);
        kiln_sha256_fast(buf, lens[k], b);
        CHECK_MSG(memcmp(a, b, 32) == 0, "sha256 of %zu bytes: fast and portable differ", lens[k]);
    }
    printf("sha256: libcrypto %s\n", kiln_sha256_accelerated() ? "used" : "not found");
    free(buf);
}

// --- messages

static void test_messages(void) {
    // Bytes that are not UTF-8 text, quoted into a message, come out escaped.
    n_logged = n_logged_bad = 0;
    kiln_log_set(text_log, NULL, KILN_LOG_DEBUG);
    kiln_status st =
        kiln_fail(KILN_ERR_CORRUPT, "name '%s' key '%s'", "a\xff\x1b[2Jb", "\xc2\x85z");
    CHECK_EQ_INT(st, KILN_ERR_CORRUPT);
    CHECK_MSG(strcmp(kiln_last_error(), "name 'a\\xff\\x1b[2Jb' key '\\xc2\\x85z'") == 0, "%s",
              kiln_last_error());
    kiln_log(KILN_LOG_WARN, "raw \xfe\xed\xa0\x80 and valid \xc3\xa9");
    CHECK_EQ_INT(n_logged, 2);
    CHECK_EQ_INT(n_logged_bad, 0);

    // A message longer than the buffer is cut at a character boundary and ends with "...".
    char *big = malloc(10000);
    for (int i = 0; i < 9999; i += 2) memcpy(big + i, "\xc3\xa9", 2);
    big[9998] = '\0';
    kiln_fail(KILN_ERR_INVALID_ARG, "x%s", big);
    const char *m = kiln_last_error();
    size_t len = strlen(m);
    CHECK(len < 4096 && len > 4000);
    CHECK(is_text(m));
    CHECK(len >= 3 && strcmp(m + len - 3, "...") == 0);
    // ... also when the cut falls inside an escape or a 3-byte character.
    for (int shift = 0; shift < 4; shift++) {
        memset(big, 'a', (size_t)shift);
        for (int i = shift; i + 3 < 9999; i += 3) memcpy(big + i, "\xe2\x82\xac", 3);
        big[9990] = '\xff';
        big[9991] = '\0';
        kiln_fail(KILN_ERR_INVALID_ARG, "%s", big);
        CHECK_MSG(is_text(kiln_last_error()), "shift %d", shift);
    }
    free(big);
    CHECK_EQ_INT(n_logged_bad, 0);
    kiln_log_set(NULL, NULL, KILN_LOG_WARN);

    CHECK(strcmp(kiln_status_name(KILN_ERR_CORRUPT), "KILN_ERR_CORRUPT") == 0);
    CHECK(strcmp(kiln_status_name(KILN_OK), "KILN_OK") == 0);
    CHECK(strcmp(kiln_status_name(KILN_ERR_INTERNAL), "KILN_ERR_INTERNAL") == 0);
    CHECK(strcmp(kiln_status_name((kiln_status)999), "KILN_ERR_UNKNOWN") == 0);
    for (int s = 0; s < KILN_STATUS_COUNT; s++) {
        CHECK(strncmp(kiln_status_name((kiln_status)s), "KILN_", 5) == 0);
    }
}

// --- the graph API's limits

static void test_graph_limits(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    int32_t v;
    // 2^31 x 2^31 float32 elements: 2^64 bytes, which overflows 64 bits.
    int64_t big[2] = {INT64_C(1) << 31, INT64_C(1) << 31};
    CHECK_STATUS(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, big, big, &v),
                 KILN_ERR_INVALID_ARG);
    CHECK_MSG(strstr(kiln_last_error(), "2^62 bytes") && strstr(kiln_last_error(), "'x'"), "%s",
              kiln_last_error());
    // Only the maximum counts: [1, 2^40] x [1, 2^40] x int64 is refused, [1, 2^28] x 2^31 x 4
    // bytes = 2^61 is accepted.
    int64_t lo[3] = {1, 1, 1}, hi[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 1};
    CHECK_STATUS(kiln_graph_add_input(g, "y", KILN_DTYPE_I64, 3, lo, hi, &v), KILN_ERR_INVALID_ARG);
    int64_t ok_hi[2] = {INT64_C(1) << 28, INT64_C(1) << 31};
    CHECK_OK(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 2, lo, ok_hi, &v));
    // Exactly 2^62 bytes is the limit itself: accepted; one element more is not.
    int64_t at[2] = {INT64_C(1) << 30, INT64_C(1) << 30};
    CHECK_OK(kiln_graph_add_input(g, "at_limit", KILN_DTYPE_F32, 2, at, at, &v));
    int64_t past[3] = {INT64_C(1) << 30, INT64_C(1) << 30, 2};
    CHECK_STATUS(kiln_graph_add_input(g, "past", KILN_DTYPE_F32, 3, past, past, &v),
                 KILN_ERR_INVALID_ARG);

    // Names must be UTF-8 text: the loader refuses anything else.
    static const char *bad[] = {"a\xff", "tab\there", "\x1b[2J", "c1\xc2\x85", "\xed\xa0\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(kiln_graph_add_input(g, bad[i], KILN_DTYPE_F32, 1, lo, lo, &v),
                     KILN_ERR_INVALID_ARG);
        CHECK_MSG(strstr(kiln_last_error(), "not UTF-8 text") && is_text(kiln_last_error()), "%s",
                  kiln_last_error());
        float one = 1;
        CHECK_STATUS(kiln_graph_add_constant(g, bad[i], KILN_DTYPE_F32, 1, lo, &one, 4, &v),
                     KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_mark_output(g, 0, bad[i]), KILN_ERR_INVALID_ARG);
    }
    CHECK_OK(kiln_graph_add_input(g, "caf\xc3\xa9 \xe2\x82\xac", KILN_DTYPE_F32, 1, lo, lo, &v));
    kiln_graph_free(g);

    // A UTF-8 name goes through build and load and reads back unchanged.
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g,
                         "entr\xc3\xa9"
                         "e",
                         KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    int32_t y = tu_node(g, KILN_OP_RELU, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "sortie \xe2\x86\x92");
    kiln_built *b = NULL;
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    kiln_engine *e = NULL;
    CHECK_OK(tu_load(b, "cpu", &e));
    kiln_binding_info info;
    CHECK_OK(kiln_engine_binding(e, 1, 0, &info));
    CHECK(strcmp(info.name, "entr\xc3\xa9"
                            "e") == 0);
    CHECK_OK(kiln_engine_binding(e, 0, 0, &info));
    CHECK(strcmp(info.name, "sortie \xe2\x86\x92") == 0);
    kiln_engine_free(e);
    kiln_built_free(b);
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(NULL, NULL, KILN_LOG_WARN);
    test_weight_verification();
    test_parallel_verification();
    test_sha256_fast();
    test_plain_digest_keys();
    test_messages();
    test_graph_limits();
    return check_summary();
}
