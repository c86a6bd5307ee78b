// SPDX-License-Identifier: Apache-2.0
// kiln_build end to end: argument and option errors, I/O lowering, external weights (content
// keys, deduplication, the inline threshold, loading through a resolver), determinism (byte-
// identical engines from the same graph and from a second graph made with the same calls),
// dynamic shapes, an allocation-failure sweep, and random graphs whose optimized, unoptimized
// and half-precision engines must agree.
#include "builder/builder_test_util.h"
#include "core/sha256.h"

static void test_errors(void) {
    kiln_graph *g;
    kiln_built *b = NULL;
    kiln_build_options o;
    int32_t x, y;
    const void *data;
    const char *key;
    size_t n;
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    CHECK_STATUS(kiln_build(g, NULL, &b), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "no outputs") != NULL);
    y = tu_node(g, KILN_OP_RELU, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "y");
    CHECK_STATUS(kiln_build(NULL, NULL, &b), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_build(g, NULL, NULL), KILN_ERR_INVALID_ARG);
    kiln_build_options_init(&o);
    o.struct_nbytes = 3;
    CHECK_STATUS(kiln_build(g, &o, &b), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "kiln_build_options_init") != NULL);
    kiln_build_options_init(&o);
    o.precision = (kiln_precision)7;
    CHECK_STATUS(kiln_build(g, &o, &b), KILN_ERR_INVALID_ARG);
    CHECK(b == NULL);
    kiln_build_options_init(NULL);
    kiln_build_options_init(&o);
    CHECK(o.optimize == 1 && o.precision == KILN_PRECISION_FP32 && o.external_weights == 0 &&
          o.min_external_nbytes == 0 && o.struct_nbytes == sizeof o);
    CHECK_OK(kiln_build(g, NULL, &b)); // NULL options: defaults
    CHECK_STATUS(kiln_built_engine(NULL, &data, &n), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_built_engine(b, NULL, &n), KILN_ERR_INVALID_ARG);
    CHECK(kiln_built_n_weights(b) == 0 && kiln_built_n_weights(NULL) == 0);
    CHECK_STATUS(kiln_built_weight(b, 0, &key, &data, &n), KILN_ERR_INVALID_ARG);
    CHECK_OK(kiln_built_engine(b, &data, &n));
    CHECK(n > 8 && memcmp(data, KILN_FORMAT_MAGIC, KILN_FORMAT_MAGIC_NBYTES) == 0);
    kiln_built_free(b);
    kiln_built_free(NULL);
    {
        // the in-memory plan equals what the loader reads back from the bytes
        kiln_plan direct, loaded;
        kiln_build_stats stats;
        kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
        CHECK_STATUS(kiln_build_plan(g, NULL, NULL, NULL), KILN_ERR_INVALID_ARG);
        CHECK_OK(kiln_build_plan(g, &o1, &direct, &stats));
        if (bt_plan(g, &o1, &loaded)) {
            CHECK(direct.n_layers == loaded.n_layers && direct.n_tensors == loaded.n_tensors);
            CHECK(memcmp(direct.tensors, loaded.tensors,
                         direct.n_tensors * sizeof *direct.tensors) == 0);
            CHECK(memcmp(direct.layers, loaded.layers, direct.n_layers * sizeof *direct.layers) ==
                  0);
            kiln_plan_release(&loaded);
        }
        CHECK(stats.n_dead == 0 && stats.n_copies == 0);
        kiln_plan_release(&direct);
    }
    kiln_graph_free(g);
}

// Outputs that are inputs, constants, or repeated values get copies.
static void test_io_lowering(void) {
    float c[3] = {1.5f, -2, 4};
    kiln_graph *g;
    kiln_plan p;
    kiln_built *b = NULL;
    int32_t x, cc, y;
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(1), TU_DIMS(3));
    cc = tu_const(g, "c", KILN_DTYPE_F32, 1, TU_DIMS(3), c);
    y = tu_node(g, KILN_OP_NEG, TU_IDS(x), TU_NO_ATTRS);
    tu_output(g, y, "y");
    tu_output(g, x, "x_out");
    tu_output(g, cc, "c_out");
    tu_output(g, y, "y_again");
    if (bt_plan(g, &o1, &p)) {
        BT_EXPECT_LAYERS(&p, "neg|copy|copy|copy");
        CHECK(p.n_outputs == 4 && bt_count_kind(&p, KILN_TENSOR_OUTPUT) == 4);
        CHECK(strcmp(kiln_plan_string(&p, p.tensors[p.outputs[3]].name), "y_again") == 0);
        kiln_plan_release(&p);
    }
    CHECK_OK(kiln_build(g, &o1, &b));
    if (b != NULL) {
        float xin[2] = {3, -5};
        void *in[1] = {xin};
        bt_shape s[1] = {{1, {2}}};
        bt_outputs r;
        if (bt_run(b, 1, s, in, &r)) {
            CHECK(r.numel[0] == 2 && r.data[0][0] == -3 && r.data[0][1] == 5);
            CHECK(r.numel[1] == 2 && r.data[1][0] == 3 && r.data[1][1] == -5);
            CHECK(r.numel[2] == 3 && r.data[2][0] == 1.5f && r.data[2][2] == 4);
            CHECK(r.numel[3] == 2 && r.data[3][0] == -3 && r.data[3][1] == 5);
            bt_outputs_free(&r);
        }
        kiln_built_free(b);
    }
    kiln_graph_free(g);
}

static kiln_status missing_resolver(void *ud, const char *key, const void **d, size_t *n) {
    (void)ud;
    (void)key;
    (void)d;
    (void)n;
    return KILN_ERR_MISSING_DATA;
}

static void test_external_weights(void) {
    float *w = tu_rand(8 * 16, -1, 1), small[2] = {0.25f, 0.5f};
    uint8_t abc[3] = {'a', 'b', 'c'};
    kiln_graph *g;
    kiln_plan p;
    kiln_built *bi = NULL, *be = NULL;
    int32_t x, cw1, cw2, cs, cabc, m, y, z;
    kiln_build_options oe = bt_opts(1, KILN_PRECISION_FP32, 1);
    kiln_build_options oi = bt_opts(1, KILN_PRECISION_FP32, 0);
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, 16), TU_DIMS(4, 16));
    m = tu_input(g, "m", KILN_DTYPE_BOOL, 1, TU_DIMS(3), TU_DIMS(3));
    cw1 = tu_const(g, "w1", KILN_DTYPE_F32, 2, TU_DIMS(8, 16), w);
    cw2 = tu_const(g, "w2", KILN_DTYPE_F32, 2, TU_DIMS(8, 16), w); // same bytes
    cs = tu_const(g, "s", KILN_DTYPE_F32, 1, TU_DIMS(2), small);
    CHECK_OK(kiln_graph_add_constant(g, "abc", KILN_DTYPE_BOOL, 1, TU_DIMS(3), abc, 3, &cabc));
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw1), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw2), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SUB, TU_IDS(y, z), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -2, 4, 2)));
    z = tu_node(g, KILN_OP_MUL, TU_IDS(z, cs), TU_NO_ATTRS);
    tu_output(g, z, "z");
    m = tu_node(g, KILN_OP_WHERE, TU_IDS(m, cabc, m), TU_NO_ATTRS);
    tu_output(g, m, "mask");
    CHECK_OK(kiln_build(g, &oe, &be));
    CHECK_OK(kiln_build(g, &oi, &bi));
    if (be != NULL && bi != NULL) {
        const char *key;
        const void *data;
        size_t n;
        uint8_t d[32];
        char want[80];
        CHECK_EQ_INT(kiln_built_n_weights(be), 3); // w (once), s, abc
        CHECK_OK(kiln_built_weight(be, 0, &key, &data, &n));
        kiln_sha256_tree(w, 8 * 16 * 4, d);
        memcpy(want, "kiln-t-", 7);
        kiln_sha256_hex(d, want + 7);
        CHECK(strcmp(key, want) == 0 && n == 8 * 16 * 4 && memcmp(data, w, n) == 0);
        // the key of "abc" is its tree digest (computed by Python's hashlib from the definition)
        CHECK_OK(kiln_built_weight(be, 2, &key, &data, &n));
        CHECK(strcmp(key,
                     "kiln-t-80a67215aff0c585b6c055e38aa04b76d4b208e2d0c3eb31bfd02822ae62e1c0") ==
              0);
        CHECK(n == 3 && memcmp(data, abc, 3) == 0);
        {
            const void *bytes;
            size_t nb;
            kiln_engine *e = NULL;
            kiln_load_options lo;
            CHECK_OK(kiln_built_engine(be, &bytes, &nb));
            if (kiln_load_plan(bytes, nb, &p) == KILN_OK) {
                uint32_t keyed = 0;
                for (uint32_t i = 0; i < p.n_tensors; i++) {
                    keyed +=
                        p.tensors[i].kind == KILN_TENSOR_WEIGHT && p.tensors[i].key != KILN_NO_KEY;
                }
                // w1 and w2 (the same bytes) are one tensor after common-subexpression
                // elimination: w, s and abc
                CHECK(keyed == 3 && p.weights_nbytes == 0);
                kiln_plan_release(&p);
            }
            kiln_load_options_init(&lo);
            CHECK_STATUS(kiln_engine_load(bytes, nb, &lo, &e), KILN_ERR_MISSING_DATA);
            lo.resolve = missing_resolver;
            CHECK_STATUS(kiln_engine_load(bytes, nb, &lo, &e), KILN_ERR_MISSING_DATA);
        }
        {
            float xin[2 * 16];
            uint8_t min[3] = {1, 0, 1};
            void *in[2] = {xin, min};
            bt_shape s[2] = {{2, {2, 16}}, {1, {3}}};
            bt_outputs ri, re;
            tu_fill(xin, 32, -1, 1);
            if (bt_run(bi, 2, s, in, &ri)) {
                if (bt_run(be, 2, s, in, &re)) {
                    CHECK(ri.numel[0] == re.numel[0] &&
                          memcmp(ri.data[0], re.data[0], (size_t)ri.numel[0] * 4) == 0);
                    CHECK(re.data[1][0] == 1 && re.data[1][1] == 0 && re.data[1][2] == 1);
                    bt_outputs_free(&re);
                }
                bt_outputs_free(&ri);
            }
        }
    }
    kiln_built_free(be);
    be = NULL;
    // the threshold keeps small constants inline
    oe.min_external_nbytes = 16;
    CHECK_OK(kiln_build(g, &oe, &be));
    CHECK_EQ_INT(kiln_built_n_weights(be), 1);
    kiln_built_free(be);
    kiln_built_free(bi);
    kiln_graph_free(g);
    free(w);
}

// --- determinism

static kiln_graph *det_graph(const float *w, const float *c) {
    kiln_graph *g = NULL;
    int32_t x, cw, cc, y, z;
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 4, TU_DIMS(1, 3, 4, 4), TU_DIMS(2, 3, 16, 16));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 4, TU_DIMS(6, 3, 3, 3), w);
    cc = tu_const(g, "c", KILN_DTYPE_F32, 3, TU_DIMS(6, 1, 1), c);
    y = tu_node(g, KILN_OP_CONV2D, TU_IDS(x, cw), TU_ATTRS(TU_INTS("padding", 1, 1)));
    y = tu_node(g, KILN_OP_ADD, TU_IDS(y, cc), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_SILU, TU_IDS(y), TU_NO_ATTRS);
    z = tu_node(g, KILN_OP_MAX_POOL2D, TU_IDS(y),
                TU_ATTRS(TU_INTS("kernel", 2, 2), TU_INTS("stride", 2, 2)));
    z = tu_node(g, KILN_OP_MEAN, TU_IDS(z), TU_ATTRS(TU_INTS("dims", 2, 3)));
    y = tu_node(g, KILN_OP_AVG_POOL2D, TU_IDS(y),
                TU_ATTRS(TU_INTS("kernel", 3, 3), TU_INTS("stride", 1, 1)));
    tu_output(g, z, "pooled");
    tu_output(g, y, "features");
    return g;
}

static int same_engine(const kiln_built *a, const kiln_built *b) {
    const void *pa, *pb;
    size_t na, nb;
    if (a == NULL || b == NULL) return 0;
    if (kiln_built_engine(a, &pa, &na) != KILN_OK || kiln_built_engine(b, &pb, &nb) != KILN_OK) {
        return 0;
    }
    if (na != nb || memcmp(pa, pb, na) != 0) return 0;
    if (kiln_built_n_weights(a) != kiln_built_n_weights(b)) return 0;
    for (uint32_t i = 0; i < kiln_built_n_weights(a); i++) {
        const char *ka, *kb;
        const void *da, *db;
        size_t sa, sb;
        kiln_built_weight(a, i, &ka, &da, &sa);
        kiln_built_weight(b, i, &kb, &db, &sb);
        if (strcmp(ka, kb) != 0 || sa != sb || memcmp(da, db, sa) != 0) return 0;
    }
    return 1;
}

static void test_determinism(void) {
    float *w = tu_rand(6 * 27, -1, 1), *c = tu_rand(6, -1, 1);
    kiln_graph *g1 = det_graph(w, c), *g2 = det_graph(w, c);
    for (int opt = 0; opt < 2; opt++) {
        for (int prec = 0; prec < 3; prec++) {
            for (int ext = 0; ext < 2; ext++) {
                kiln_build_options o = bt_opts(opt, (kiln_precision)prec, ext);
                kiln_built *a = NULL, *b = NULL, *d = NULL;
                CHECK_OK(kiln_build(g1, &o, &a));
                CHECK_OK(kiln_build(g1, &o, &b));
                CHECK_OK(kiln_build(g2, &o, &d));
                CHECK_MSG(same_engine(a, b) && same_engine(a, d),
                          "opt %d precision %d external %d: engines differ", opt, prec, ext);
                kiln_built_free(a);
                kiln_built_free(b);
                kiln_built_free(d);
            }
        }
    }
    {
        // sanity: the options do change the bytes
        kiln_build_options o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
        kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
        kiln_built *a = NULL, *b = NULL;
        CHECK_OK(kiln_build(g1, &o0, &a));
        CHECK_OK(kiln_build(g1, &o1, &b));
        CHECK(a != NULL && b != NULL && !same_engine(a, b));
        kiln_built_free(a);
        kiln_built_free(b);
    }
    {
        // dynamic shapes: the fused engine equals the plain one at several sizes
        kiln_build_options o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
        kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
        bt_shape s[1] = {{4, {2, 3, 16, 16}}};
        bt_compare(g1, &o0, &o1, 1, s, 0, 1e-5, 1e-5, "dynamic 16x16");
        s[0] = (bt_shape){4, {1, 3, 5, 9}};
        bt_compare(g1, &o0, &o1, 1, s, 0, 1e-5, 1e-5, "dynamic 5x9");
        s[0] = (bt_shape){4, {1, 3, 4, 4}};
        bt_compare(g1, &o0, &o1, 1, s, 0, 1e-5, 1e-5, "dynamic 4x4");
    }
    kiln_graph_free(g1);
    kiln_graph_free(g2);
    free(w);
    free(c);
}

// --- the progress callback: every phase reported in order with consistent counts, the same
// bytes with and without it, a nonzero return stops the build, and the options of callers built
// before the callback existed (KILN_BUILD_OPTIONS_V1_NBYTES) still work.

#define MAX_EVENTS 256

typedef struct progress_log {
    int n;
    kiln_build_phase phase[MAX_EVENTS];
    uint32_t step[MAX_EVENTS], n_steps[MAX_EVENTS];
    char name[MAX_EVENTS][32];
    int stop_at; // event index at which to return nonzero (-1: never)
} progress_log;

static int record_progress(void *ud, const kiln_build_progress *p) {
    progress_log *log = ud;
    CHECK(p->struct_nbytes == sizeof *p && p->name != NULL);
    if (log->n < MAX_EVENTS) {
        log->phase[log->n] = p->phase;
        log->step[log->n] = p->step;
        log->n_steps[log->n] = p->n_steps;
        snprintf(log->name[log->n], sizeof log->name[0], "%s", p->name);
    }
    return log->n++ == log->stop_at ? 7 : 0;
}

// The passes an optimizing build reports (build.c's list).
#define N_OPT_PASSES 21

static void check_progress(const progress_log *log, int optimize, uint32_t n_head_layers) {
    static const char *const all[] = {"verify",
                                      "dce",
                                      "fold",
                                      "bn_fold",
                                      "matmul_to_linear",
                                      "patchify",
                                      "views",
                                      "eager_attention",
                                      "attention",
                                      "llm",
                                      "scan",
                                      "act",
                                      "views",
                                      "bn_fold",
                                      "cse",
                                      "dce",
                                      "fuse",
                                      "precision",
                                      "fuse_ew",
                                      "lower_io",
                                      "check"};
    static const char *const plain[] = {"verify", "precision", "lower_io", "check"};
    const char *const *names = optimize ? all : plain;
    uint32_t n_pass = optimize ? N_OPT_PASSES : 4;
    int i = 0;
    for (uint32_t k = 0; k < n_pass; k++, i++) {
        CHECK_MSG(i < log->n && log->phase[i] == KILN_BUILD_PHASE_PASS && log->step[i] == k + 1 &&
                      log->n_steps[i] == n_pass && strcmp(log->name[i], names[k]) == 0,
                  "optimize %d: event %d is %s %u/%u, expected pass %s %u/%u", optimize, i,
                  i < log->n ? log->name[i] : "(none)", i < log->n ? log->step[i] : 0,
                  i < log->n ? log->n_steps[i] : 0, names[k], k + 1, n_pass);
    }
    for (uint32_t k = 0; k < n_head_layers; k++, i++) {
        CHECK_MSG(i < log->n && log->phase[i] == KILN_BUILD_PHASE_LAYER && log->step[i] == k + 1 &&
                      log->n_steps[i] == n_head_layers,
                  "optimize %d: event %d is not layer %u/%u", optimize, i, k + 1, n_head_layers);
    }
    static const char *const out[] = {"memory plan", "serialize", "self-check"};
    for (uint32_t k = 0; k < 3; k++, i++) {
        CHECK_MSG(i < log->n && log->phase[i] == KILN_BUILD_PHASE_OUTPUT && log->step[i] == k + 1 &&
                      log->n_steps[i] == 3 && strcmp(log->name[i], out[k]) == 0,
                  "optimize %d: event %d is not output %s", optimize, i, out[k]);
    }
    CHECK_MSG(log->n == i, "optimize %d: %d events, expected %d", optimize, log->n, i);
}

static void test_progress(void) {
    float *w = tu_rand(6 * 27, -1, 1), *c = tu_rand(6, -1, 1);
    kiln_graph *g = det_graph(w, c);
    for (int opt = 0; opt < 2; opt++) {
        kiln_build_options o = bt_opts(opt, KILN_PRECISION_FP16, 1);
        kiln_built *plain = NULL, *reported = NULL, *old = NULL;
        kiln_plan p;
        progress_log log;
        memset(&log, 0, sizeof log);
        log.stop_at = -1;
        CHECK_OK(kiln_build(g, &o, &plain));
        CHECK_OK(kiln_build_plan(g, &o, &p, NULL));
        uint32_t heads = 0;
        for (uint32_t l = 0; l < p.n_layers; l++) heads += !(p.layers[l].flags & KILN_LAYER_TAIL);
        o.progress = record_progress;
        o.progress_user_data = &log;
        CHECK_OK(kiln_build(g, &o, &reported));
        check_progress(&log, opt, heads);
        // layer events name the plan's head layers' ops, in execution order
        for (uint32_t l = 0, k = opt ? N_OPT_PASSES : 4; l < p.n_layers; l++) {
            if (p.layers[l].flags & KILN_LAYER_TAIL) continue;
            CHECK_MSG(strcmp(log.name[k], kiln_op_name(p.layers[l].op)) == 0,
                      "layer %u: reported %s, plan has %s", l, log.name[k],
                      kiln_op_name(p.layers[l].op));
            k++;
        }
        CHECK(heads >= 4 && heads < p.n_layers + (opt ? 0u : 1u));
        kiln_plan_release(&p);
        CHECK_MSG(same_engine(plain, reported), "optimize %d: the callback changed the engine",
                  opt);
        // an options struct from before the callback: its trailing bytes are not read
        kiln_build_options v1 = o;
        v1.struct_nbytes = KILN_BUILD_OPTIONS_V1_NBYTES;
        log.n = 0;
        CHECK_OK(kiln_build(g, &v1, &old));
        CHECK(log.n == 0 && same_engine(plain, old));
        kiln_built_free(plain);
        kiln_built_free(reported);
        kiln_built_free(old);
    }
    // a nonzero return stops the build: each phase's first step, and the very last step
    int stops[] = {0, N_OPT_PASSES, N_OPT_PASSES + 3};
    for (size_t k = 0; k < sizeof stops / sizeof stops[0]; k++) {
        kiln_build_options o = bt_opts(1, KILN_PRECISION_FP32, 0);
        kiln_built *b = NULL;
        progress_log log;
        memset(&log, 0, sizeof log);
        log.stop_at = stops[k];
        o.progress = record_progress;
        o.progress_user_data = &log;
        kiln_status st = kiln_build(g, &o, &b);
        if (k + 1 == sizeof stops / sizeof stops[0]) {
            // the last event's index depends on the layer count: stop at the final one instead
            log.n = 0;
            log.stop_at = -1;
            CHECK_OK(kiln_build(g, &o, &b));
            kiln_built_free(b);
            b = NULL;
            log.stop_at = log.n - 1;
            log.n = 0;
            st = kiln_build(g, &o, &b);
        }
        CHECK_STATUS(st, KILN_ERR_INVALID_STATE);
        CHECK(b == NULL);
        CHECK_MSG(strstr(kiln_last_error(), "stopped by the progress callback (it returned 7)") !=
                      NULL,
                  "message: %s", kiln_last_error());
        CHECK(log.n == log.stop_at + 1); // nothing reported after the stop
    }
    CHECK(strstr(kiln_last_error(), "output 3 of 3 ('self-check')") != NULL);
    kiln_graph_free(g);
    free(w);
    free(c);
}

// --- allocation failures: every failing allocation inside kiln_build is reported as
// KILN_ERR_NO_MEMORY and leaks nothing; the eventual success gives the reference bytes.

static void test_alloc_failures(void) {
    float *w = tu_rand(6 * 27, -1, 1), *c = tu_rand(6, -1, 1);
    kiln_graph *g = det_graph(w, c);
    for (int variant = 0; variant < 2; variant++) {
        kiln_build_options o =
            bt_opts(1, variant ? KILN_PRECISION_FP16 : KILN_PRECISION_FP32, variant);
        kiln_built *ref = NULL;
        tu_alloc_state *s;
        long failures = 0, fail_at;
        CHECK_OK(kiln_build(g, &o, &ref));
        s = tu_alloc_install();
        for (fail_at = 1; fail_at < 100000; fail_at++) {
            kiln_built *b = NULL;
            kiln_status st;
            s->n_calls = 0;
            s->fail_at = fail_at;
            st = kiln_build(g, &o, &b);
            if (st == KILN_OK) {
                CHECK(same_engine(ref, b));
                kiln_built_free(b);
                CHECK(s->live_blocks == 0);
                break;
            }
            CHECK_MSG(st == KILN_ERR_NO_MEMORY, "fail_at %ld: %s: %s", fail_at, kiln_status_str(st),
                      kiln_last_error());
            CHECK_MSG(b == NULL && s->live_blocks == 0, "fail_at %ld: %ld blocks leaked", fail_at,
                      s->live_blocks);
            failures++;
        }
        kiln_set_allocator(NULL);
        CHECK(failures > 20);
        kiln_built_free(ref);
    }
    kiln_graph_free(g);
    free(w);
    free(c);
}

// --- random graphs

#define D 8

typedef struct rgraph {
    kiln_graph *g;
    int32_t pool[64];
    int n;
} rgraph;

static int32_t pick(const rgraph *r) { return r->pool[check_rng_int(0, r->n - 1)]; }

// Random constant; matrices scaled by 1/sqrt(D) so that values stay of order 1.
static int32_t rconst(rgraph *r, uint32_t rank, const int64_t *dims) {
    int64_t n = tu_numel(rank, dims);
    float lim = rank == 2 && dims[0] == D ? 0.35f : 1.0f;
    float *data = tu_rand(n, -lim, lim);
    int32_t v = tu_const(r->g, NULL, KILN_DTYPE_F32, rank, dims, data);
    free(data);
    return v;
}

static void random_graph(rgraph *r) {
    int n_ops = (int)check_rng_int(1, 14);
    memset(r, 0, sizeof *r);
    CHECK_OK(kiln_graph_new(&r->g));
    r->pool[r->n++] = tu_input(r->g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, D), TU_DIMS(4, D));
    r->pool[r->n++] = tu_input(r->g, "x2", KILN_DTYPE_F32, 2, TU_DIMS(1, D), TU_DIMS(4, D));
    for (int i = 0; i < n_ops; i++) {
        int32_t a = pick(r), v;
        switch (check_rng_int(0, 9)) {
        case 0: {
            int32_t w = rconst(r, 2, TU_DIMS(D, D));
            int32_t b = check_rng_int(0, 1) ? rconst(r, 1, TU_DIMS(D)) : -1;
            v = tu_node(r->g, KILN_OP_LINEAR, TU_IDS(a, w, b), TU_NO_ATTRS);
            break;
        }
        case 1: {
            int32_t w = rconst(r, 2, TU_DIMS(D, D));
            if (check_rng_int(0, 1))
                w = tu_node(r->g, KILN_OP_PERMUTE, TU_IDS(w), TU_ATTRS(TU_INTS("dims", 1, 0)));
            v = tu_node(r->g, KILN_OP_MATMUL, TU_IDS(a, w), TU_NO_ATTRS);
            break;
        }
        case 2: {
            static const uint32_t un[] = {KILN_OP_RELU,       KILN_OP_GELU,    KILN_OP_SILU,
                                          KILN_OP_TANH,       KILN_OP_SIGMOID, KILN_OP_NEG,
                                          KILN_OP_HARDSIGMOID};
            v = tu_node(r->g, un[check_rng_int(0, 6)], TU_IDS(a), TU_NO_ATTRS);
            break;
        }
        case 3:
        case 4: {
            static const uint32_t bin[] = {KILN_OP_ADD, KILN_OP_SUB, KILN_OP_MUL};
            int32_t bv;
            switch (check_rng_int(0, 3)) {
            case 0: bv = rconst(r, 1, TU_DIMS(D)); break;
            case 1: bv = rconst(r, 0, TU_DIMS(0)); break;
            case 2: bv = rconst(r, 2, TU_DIMS(1, D)); break;
            default: bv = pick(r); break;
            }
            v = check_rng_int(0, 1)
                    ? tu_node(r->g, bin[check_rng_int(0, 2)], TU_IDS(a, bv), TU_NO_ATTRS)
                    : tu_node(r->g, bin[check_rng_int(0, 2)], TU_IDS(bv, a), TU_NO_ATTRS);
            break;
        }
        case 5: v = tu_node(r->g, KILN_OP_SOFTMAX, TU_IDS(a), TU_ATTRS(TU_INTS("dim", -1))); break;
        case 6: {
            int32_t lw = rconst(r, 1, TU_DIMS(D));
            v = tu_node(r->g, KILN_OP_LAYER_NORM, TU_IDS(a, lw, -1),
                        TU_ATTRS(TU_INTS("normalized_ndim", 1)));
            break;
        }
        case 7:
            v = tu_node(r->g, KILN_OP_RESHAPE, TU_IDS(a), TU_ATTRS(TU_INTS("shape", -2, 2, D / 2)));
            v = tu_node(r->g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", -2, -1)));
            break;
        case 8: {
            // a constant-only computation joined to the activations (folds)
            int32_t c1 = rconst(r, 1, TU_DIMS(D)), c2 = rconst(r, 1, TU_DIMS(D));
            c1 = tu_node(r->g, KILN_OP_MUL, TU_IDS(c1, c2), TU_NO_ATTRS);
            v = tu_node(r->g, KILN_OP_ADD, TU_IDS(a, c1), TU_NO_ATTRS);
            break;
        }
        default: {
            double lo = -0.5, hi = 0.5;
            kiln_attr at[2] = {{"min", NULL, &lo, 1}, {"max", NULL, &hi, 1}};
            v = tu_node(r->g, KILN_OP_CLAMP, TU_IDS(a), at, 2);
            break;
        }
        }
        if (r->n < 64) r->pool[r->n++] = v;
    }
    tu_output(r->g, r->pool[r->n - 1], "out");
    for (int k = (int)check_rng_int(0, 2); k > 0; k--) {
        char name[16];
        snprintf(name, sizeof name, "extra%d", k);
        tu_output(r->g, pick(r), name);
    }
}

// x @ W.T with a weight too large to fold (Falcon's linears): one linear over W as stored, no
// permute left and no transposed copy of the weight; the values those of permute + matmul.
static void test_transposed_weight(void) {
    enum { K = 2048, N = 2112 }; // 17.3 MB of float32: over the fold pass's cap
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    const int64_t xmin[2] = {1, K}, xmax[2] = {3, K}, wd[2] = {N, K};
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 2, xmin, xmax);
    float *wdata = tu_rand((int64_t)N * K, -0.05f, 0.05f);
    int32_t w = tu_const(g, "w", KILN_DTYPE_F32, 2, wd, wdata);
    free(wdata);
    int32_t wt = tu_node(g, KILN_OP_PERMUTE, TU_IDS(w), TU_ATTRS(TU_INTS("dims", 1, 0)));
    tu_output(g, tu_node(g, KILN_OP_MATMUL, TU_IDS(x, wt), TU_NO_ATTRS), "y");
    kiln_build_options o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        uint64_t wbytes = 0;
        for (uint32_t i = 0; i < p.n_tensors; i++) {
            if (p.tensors[i].kind == KILN_TENSOR_WEIGHT) wbytes += p.tensors[i].nbytes;
        }
        CHECK_EQ_INT(bt_count(&p, KILN_OP_LINEAR), 1);
        CHECK_EQ_INT(bt_count(&p, KILN_OP_PERMUTE), 0);
        CHECK_EQ_INT(bt_count(&p, KILN_OP_MATMUL), 0);
        CHECK_MSG(wbytes == (uint64_t)N * K * 4, "weights %llu bytes, want %llu (one copy)",
                  (unsigned long long)wbytes, (unsigned long long)N * K * 4);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{2, {3, K}}};
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-4, 1e-4, "x @ W.T");
    kiln_graph_free(g);
}

// A mixture of experts as transformers' batched_mm experts export it: each token's expert (a
// router's top 1) picks a matrix of W [E, M, K] by index(W, idx), then a batched matmul with
// the token's vector: one gather_matmul reading W in place (no index, no matmul left), the
// values those of index + matmul. With the index also an output, nothing fuses.
static void test_gather_matmul(void) {
    enum { E = 4, M = 24, K = 16 };
    for (int shared = 0; shared < 2; shared++) {
        kiln_graph *g = NULL;
        CHECK_OK(kiln_graph_new(&g));
        const int64_t xmin[2] = {1, K}, xmax[2] = {6, K}, rmin[2] = {1, E}, rmax[2] = {6, E};
        const int64_t wd[3] = {E, M, K};
        int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 2, xmin, xmax);
        int32_t r = tu_input(g, "router", KILN_DTYPE_F32, 2, rmin, rmax);
        float *wdata = tu_rand((int64_t)E * M * K, -0.5f, 0.5f);
        int32_t w = tu_const(g, "w", KILN_DTYPE_F32, 3, wd, wdata);
        free(wdata);
        int32_t top = tu_node(g, KILN_OP_TOPK, TU_IDS(r),
                              TU_ATTRS(TU_INTS("dim", 1), TU_INTS("k", 1), TU_INTS("largest", 1)));
        int32_t idx = tu_node(g, KILN_OP_RESHAPE, TU_IDS(top), TU_ATTRS(TU_INTS("shape", -1)));
        int32_t a = tu_node(g, KILN_OP_INDEX, TU_IDS(w, idx),
                            TU_ATTRS(TU_INTS("dim", 0), TU_INTS("wrap", 1)));
        int32_t xv = tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", -2, K, 1)));
        tu_output(g, tu_node(g, KILN_OP_MATMUL, TU_IDS(a, xv), TU_NO_ATTRS), "y");
        if (shared) tu_output(g, a, "gathered");
        kiln_build_options o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
        kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
        kiln_plan p;
        if (bt_plan(g, &o1, &p)) {
            CHECK_EQ_INT(bt_count(&p, KILN_OP_GATHER_MATMUL), shared ? 0 : 1);
            CHECK_EQ_INT(bt_count(&p, KILN_OP_INDEX), shared ? 1 : 0);
            CHECK_EQ_INT(bt_count(&p, KILN_OP_MATMUL), shared ? 1 : 0);
            kiln_plan_release(&p);
        }
        bt_shape s[2] = {{2, {5, K}}, {2, {5, E}}};
        bt_compare(g, &o0, &o1, 2, s, 0, 1e-4, 1e-4, "gathered matrices @ x");
        kiln_graph_free(g);
    }
}

// A selective scan unrolled over L = 6 tokens as transformers' Mamba writes it: h_t =
// select(A, 2, t) * h_{t-1} + select(U, 2, t) from h0, y_t = select(matmul(h_t,
// unsqueeze(select(C, 1, t), -1)), 2, 0), y = cat of unsqueeze(y_t, -1): one selective_scan
// (no select, mul or matmul left), the values those of the unrolled graph. With h_2 also an
// output (a state read elsewhere), or h0 of batch 1 broadcast over the batch, nothing fuses.
static void test_selective_scan(void) {
    enum { SB = 2, SD = 3, SL = 6, SN = 4 };
    for (int variant = 0; variant < 3; variant++) {
        const int shared = variant > 0; // 1: h_2 an output; 2: h0 broadcast over the batch
        kiln_graph *g = NULL;
        CHECK_OK(kiln_graph_new(&g));
        const int64_t ad[4] = {SB, SD, SL, SN}, cd[3] = {SB, SL, SN};
        const int64_t hd[3] = {variant == 2 ? 1 : SB, SD, SN};
        int32_t a = tu_input(g, "a", KILN_DTYPE_F32, 4, ad, ad);
        int32_t u = tu_input(g, "u", KILN_DTYPE_F32, 4, ad, ad);
        int32_t c = tu_input(g, "c", KILN_DTYPE_F32, 3, cd, cd);
        int32_t h = tu_input(g, "h0", KILN_DTYPE_F32, 3, hd, hd);
        int32_t ys[SL];
        for (int64_t t = 0; t < SL; t++) {
            int32_t at = tu_node(g, KILN_OP_SELECT, TU_IDS(a),
                                 TU_ATTRS(TU_INTS("dim", 2), TU_INTS("index", t)));
            int32_t ut = tu_node(g, KILN_OP_SELECT, TU_IDS(u),
                                 TU_ATTRS(TU_INTS("dim", 2), TU_INTS("index", t)));
            h = tu_node(g, KILN_OP_ADD,
                        TU_IDS(tu_node(g, KILN_OP_MUL, TU_IDS(at, h), TU_NO_ATTRS), ut),
                        TU_NO_ATTRS);
            if (variant == 1 && t == 2) tu_output(g, h, "h2");
            int32_t ct = tu_node(g, KILN_OP_SELECT, TU_IDS(c),
                                 TU_ATTRS(TU_INTS("dim", 1), TU_INTS("index", t)));
            ct = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(ct), TU_ATTRS(TU_INTS("dim", -1)));
            int32_t m = tu_node(g, KILN_OP_MATMUL, TU_IDS(h, ct), TU_NO_ATTRS);
            int32_t yt = tu_node(g, KILN_OP_SELECT, TU_IDS(m),
                                 TU_ATTRS(TU_INTS("dim", 2), TU_INTS("index", 0)));
            ys[t] = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(yt), TU_ATTRS(TU_INTS("dim", -1)));
        }
        tu_output(g,
                  tu_node(g, KILN_OP_CAT, TU_IDS(ys[0], ys[1], ys[2], ys[3], ys[4], ys[5]),
                          TU_ATTRS(TU_INTS("dim", -1))),
                  "y");
        kiln_build_options o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
        kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
        kiln_plan p;
        if (bt_plan(g, &o1, &p)) {
            CHECK_EQ_INT(bt_count(&p, KILN_OP_SELECTIVE_SCAN), shared ? 0 : 1);
            CHECK_EQ_INT(bt_count(&p, KILN_OP_MATMUL), shared ? SL : 0);
            CHECK_EQ_INT(bt_count(&p, KILN_OP_SELECT), shared ? 3 * SL + SL : 0);
            kiln_plan_release(&p);
        }
        bt_shape s[4] = {
            {4, {SB, SD, SL, SN}}, {4, {SB, SD, SL, SN}}, {3, {SB, SL, SN}}, {3, {hd[0], SD, SN}}};
        bt_compare(g, &o0, &o1, 4, s, 0, 1e-4, 1e-4, "unrolled selective scan");
        kiln_graph_free(g);
    }
}

static void test_random_graphs(void) {
    kiln_build_options o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    kiln_build_options o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    kiln_build_options oh = bt_opts(1, KILN_PRECISION_FP16, 1);
    for (int iter = 0; iter < 60; iter++) {
        rgraph r;
        bt_shape s[2];
        int64_t batch = check_rng_int(1, 4);
        s[0] = (bt_shape){2, {batch, D}};
        s[1] = s[0];
        random_graph(&r);
        bt_compare(r.g, &o0, &o1, 2, s, 0, 1e-4, 1e-4, "random graph");
        // float16: loose, but catches wrong wiring (values of order 1)
        bt_compare(r.g, &o1, &oh, 2, s, 0, 0.15, 0.05, "random graph fp16");
        kiln_graph_free(r.g);
    }
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    test_errors();
    test_io_lowering();
    test_external_weights();
    test_determinism();
    test_progress();
    test_alloc_failures();
    test_random_graphs();
    test_transposed_weight();
    test_gather_matmul();
    test_selective_scan();
    return check_summary();
}
