// SPDX-License-Identifier: Apache-2.0
// States (kiln_graph_add_state / kiln_graph_update_state): a model's mutable buffers that each
// context keeps from one execute to the next. Checked against references kept here: a KV-cache
// style update written in place by index_copy (wrap, refused positions that leave the cache as it
// was: past its end, or leaving a row below unwritten, as a decode before its prefill; reset,
// separate and sharing contexts, fp16, sparse writes with the check off), and an update computed by
// other ops with an initial value (inline and external), whose readers see the old value.
#include "test_util.h"

#define B 2
#define S 6
#define D 3

static void set_f32(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

// cache [B, S, D] (zeros); inputs pos [n] (int64), k [B, n, D]; the cache takes
// index_copy(cache, pos, k) at dim 1; output y = 2 * (updated cache); with attention, a second
// output sdpa(q, cache, cache) for a constant q [B, 1, D]: the state is then a KV cache.
static kiln_graph *cache_graph(int attention) {
    kiln_graph *g = NULL;
    int32_t cache, pos, k, y, two, out;
    const float two_f[1] = {2.0f};
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return NULL;
    CHECK_OK(
        kiln_graph_add_state(g, "cache", KILN_DTYPE_F32, 3, TU_DIMS(B, S, D), NULL, 0, &cache));
    pos = tu_input(g, "pos", KILN_DTYPE_I64, 1, TU_DIMS(1), TU_DIMS(4));
    k = tu_input(g, "k", KILN_DTYPE_F32, 3, TU_DIMS(B, 1, D), TU_DIMS(B, 4, D));
    y = tu_node(g, KILN_OP_INDEX_COPY, TU_IDS(cache, pos, k),
                TU_ATTRS(TU_INTS("dim", 1), TU_INTS("wrap", 1)));
    CHECK_OK(kiln_graph_update_state(g, cache, y));
    two = tu_const(g, "two", KILN_DTYPE_F32, 1, TU_DIMS(1), two_f);
    out = tu_node(g, KILN_OP_MUL, TU_IDS(y, two), TU_NO_ATTRS);
    tu_output(g, out, "y");
    if (attention) {
        float qd[B * D];
        tu_fill(qd, B * D, -1.0f, 1.0f);
        int32_t q = tu_const(g, "q", KILN_DTYPE_F32, 3, TU_DIMS(B, 1, D), qd);
        tu_output(g, tu_node(g, KILN_OP_SDPA, TU_IDS(q, y, y), TU_NO_ATTRS), "att");
    }
    return g;
}

static uint32_t cache_outputs = 1; // 2 for the graph with attention

// One step: writes k's rows at pos into ref (as the engine should), runs, compares 2 * ref.
static kiln_status cache_step(kiln_context *c, float *ref, const int64_t *pos, int64_t n,
                              double tol, const char *what) {
    float k[B * 4 * D], y[B * S * D], want[B * S * D], att[B * D];
    tu_fill(k, B * n * D, -2.0f, 2.0f);
    tu_io in[2] = {{1, {n}, (void *)pos, 0}, {3, {B, n, D}, k, 0}};
    tu_io out[2] = {{3, {B, S, D}, y, sizeof y}, {3, {B, 1, D}, att, sizeof att}};
    kiln_status st = tu_execute(c, in, 2, out, cache_outputs);
    if (st != KILN_OK) return st;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t p = pos[i] < 0 ? pos[i] + S : pos[i];
            set_f32(ref + (b * S + p) * D, k + (b * n + i) * D, D);
        }
    }
    for (int64_t i = 0; i < B * S * D; i++) want[i] = 2.0f * ref[i];
    tu_check_close(what, y, want, B * S * D, tol, tol);
    return KILN_OK;
}

static kiln_engine *load_cache(kiln_built *b, int check_rows) {
    kiln_engine *e = NULL;
    kiln_option_setting s[2] = {
        {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"},
        {.name = "check_cache_rows", .type = KILN_OPTION_BOOL, .int_value = check_rows}};
    CHECK_OK(tu_load_with(b, s, 2, &e));
    return e;
}

// A KV cache (attention reads the state): a write that would leave a row below its position
// unwritten is refused (a decode before its prefill, a skipped position), naming the position
// and the row, and nothing is written; the rows written are shared with the contexts sharing
// the state and forgotten on reset. With the option check_cache_rows off, sparse writes run as
// in eager PyTorch; positions past the cache are refused either way.
static void test_kv_cache(void) {
    kiln_graph *g = cache_graph(1);
    kiln_built *b = NULL;
    kiln_engine *e = NULL, *e_off = NULL;
    kiln_context *c1 = NULL, *c2 = NULL, *c3 = NULL;
    float ref1[B * S * D] = {0}, ref2[B * S * D] = {0}, ref3[B * S * D] = {0}, saved[B * S * D];
    const double tol = 1e-6;
    if (g == NULL) return;
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    e = load_cache(b, 1);
    e_off = load_cache(b, 0);
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c1));
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c2));
    if (e_off != NULL) CHECK_OK(kiln_context_new(e_off, &c3));
    cache_outputs = 2;
    if (c1 != NULL && c2 != NULL) {
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){0, 1}, 2, tol, "kv prefill"));
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){2}, 1, tol, "kv decode 2"));
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){-3}, 1, tol, "kv decode 3 (wrap)"));
        // A fresh context's first write at 3: a decode before its prefill.
        CHECK_STATUS(cache_step(c2, ref2, (const int64_t[]){3}, 1, tol, "decode before prefill"),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "position 3 would leave row 0 of the cache 'cache' "
                                        "unwritten") != NULL);
        CHECK(strstr(kiln_last_error(), "prefill") != NULL);
        CHECK_OK(cache_step(c2, ref2, (const int64_t[]){0, 1, 2, 3}, 4, tol, "kv second context"));
        // A skipped position is refused and writes nothing; the rows below written by earlier
        // calls or by the same call are enough.
        set_f32(saved, ref1, B * S * D);
        CHECK_STATUS(cache_step(c1, saved, (const int64_t[]){5}, 1, tol, "skipped row 4"),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "row 4") != NULL);
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){5, 4}, 2, tol, "after the refused call"));
        // Reset: no row written.
        CHECK_OK(kiln_context_reset_states(c1));
        memset(ref1, 0, sizeof ref1);
        CHECK_STATUS(cache_step(c1, ref1, (const int64_t[]){1}, 1, tol, "after reset, at 1"),
                     KILN_ERR_INVALID_ARG);
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){0}, 1, tol, "after reset"));
        // Sharing the cache shares what was written: c2 reads and writes c1's cache.
        CHECK_OK(kiln_context_share_states(c2, c1));
        CHECK_OK(cache_step(c2, ref1, (const int64_t[]){1}, 1, tol, "shared: c2 after c1's 0"));
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){2}, 1, tol, "shared: c1 after c2's 1"));
        CHECK_STATUS(cache_step(c2, ref1, (const int64_t[]){4}, 1, tol, "shared: skip 3"),
                     KILN_ERR_INVALID_ARG);
    }
    if (c3 != NULL) {
        CHECK_OK(cache_step(c3, ref3, (const int64_t[]){3}, 1, tol, "check off: 3 first"));
        CHECK_OK(cache_step(c3, ref3, (const int64_t[]){-1, 1}, 2, tol, "check off: 5 and 1"));
        CHECK_STATUS(cache_step(c3, ref3, (const int64_t[]){S}, 1, tol, "check off: past the end"),
                     KILN_ERR_INVALID_ARG);
    }
    cache_outputs = 1;
    kiln_context_free(c1);
    kiln_context_free(c2);
    kiln_context_free(c3);
    kiln_engine_free(e);
    kiln_engine_free(e_off);
    kiln_built_free(b);
}

static void test_cache(kiln_precision prec, double tol) {
    kiln_graph *g = cache_graph(0);
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    kiln_context *c1 = NULL, *c2 = NULL;
    float ref1[B * S * D] = {0}, ref2[B * S * D] = {0}, saved[B * S * D];
    CHECK_OK(tu_build(g, prec, 0, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    CHECK_OK(tu_load(b, "cpu", &e));
    if (e == NULL) {
        kiln_built_free(b);
        return;
    }
    CHECK_EQ_INT(kiln_engine_n_states(e), 1);
    // In place: index_copy writes the state and mul reads it; no copy layer.
    CHECK_EQ_INT(kiln_engine_n_layers(e), prec == KILN_PRECISION_FP32 ? 2 : 4);
    CHECK_OK(kiln_context_new(e, &c1));
    CHECK_OK(kiln_context_new(e, &c2));
    if (c1 != NULL && c2 != NULL) {
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){0, 1}, 2, tol, "cache step 1"));
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){2}, 1, tol, "cache step 2"));
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){-1, 4}, 2, tol, "cache step 3 (wrap)"));
        // Another context starts from zeros and keeps its own state (a state no attention
        // reads may be written at any position).
        CHECK_OK(cache_step(c2, ref2, (const int64_t[]){3}, 1, tol, "second context"));
        // A position past the state is refused, naming it, and the state stays as it was.
        set_f32(saved, ref1, B * S * D);
        CHECK_STATUS(cache_step(c1, saved, (const int64_t[]){1, S}, 2, tol, "refused"),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "out of range") != NULL);
        CHECK(strstr(kiln_last_error(), "index 6") != NULL);
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){5}, 1, tol, "after the refused call"));
        // Reset: back to zeros.
        CHECK_OK(kiln_context_reset_states(c1));
        memset(ref1, 0, sizeof ref1);
        CHECK_OK(cache_step(c1, ref1, (const int64_t[]){0}, 1, tol, "after reset"));
    }
    kiln_context_free(c1);
    kiln_context_free(c2);
    kiln_engine_free(e);
    kiln_built_free(b);
}

// counter [4] starting at init; input x [4]; the state takes counter + x; output 2 * counter
// (the value execute found: every reader of the old value runs before the update).
static void test_counter(int external) {
    const float init[4] = {1.0f, -2.0f, 3.0f, 0.5f}, two_f[1] = {2.0f};
    float state[4], x[4], y[4], want[4];
    kiln_graph *g = NULL;
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    int32_t cnt, xin, sum, two, out;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    CHECK_OK(
        kiln_graph_add_state(g, "counter", KILN_DTYPE_F32, 1, TU_DIMS(4), init, sizeof init, &cnt));
    xin = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    sum = tu_node(g, KILN_OP_ADD, TU_IDS(cnt, xin), TU_NO_ATTRS);
    CHECK_OK(kiln_graph_update_state(g, cnt, sum));
    two = tu_const(g, "two", KILN_DTYPE_F32, 1, TU_DIMS(1), two_f);
    out = tu_node(g, KILN_OP_MUL, TU_IDS(cnt, two), TU_NO_ATTRS);
    tu_output(g, out, "y");
    {
        kiln_build_options o;
        kiln_build_options_init(&o);
        o.external_weights = external;
        o.min_external_nbytes = 1;
        CHECK_OK(kiln_build(g, &o, &b));
    }
    kiln_graph_free(g);
    if (b == NULL) return;
    CHECK_EQ_INT(kiln_built_n_weights(b), external ? 2u : 0u); // the initial value and "two"
    CHECK_OK(tu_load(b, "cpu", &e));
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c));
    if (c != NULL) {
        set_f32(state, init, 4);
        for (int step = 0; step < 3; step++) {
            tu_fill(x, 4, -1.0f, 1.0f);
            tu_io in[1] = {{1, {4}, x, 0}};
            tu_io o[1] = {{1, {4}, y, sizeof y}};
            CHECK_OK(tu_execute(c, in, 1, o, 1));
            for (int i = 0; i < 4; i++) want[i] = 2.0f * state[i];
            tu_check_close(external ? "counter (external initial value)" : "counter", y, want, 4,
                           1e-6, 1e-6);
            for (int i = 0; i < 4; i++) state[i] += x[i];
        }
        CHECK_OK(kiln_context_reset_states(c));
        tu_io in[1] = {{1, {4}, x, 0}};
        tu_io o[1] = {{1, {4}, y, sizeof y}};
        CHECK_OK(tu_execute(c, in, 1, o, 1));
        for (int i = 0; i < 4; i++) want[i] = 2.0f * init[i];
        tu_check_close("counter after reset", y, want, 4, 1e-6, 1e-6);
    }
    kiln_context_free(c);
    kiln_engine_free(e);
    kiln_built_free(b);
}

// A counter whose update add(x, counter) is its last reader: the add writes the state in place
// (no copy layer); a reader before it sees the old value (y0 = 3 * counter), the update's
// readers the new one from the state (y = 2 * (counter + x)).
static void test_counter_in_place(void) {
    const float init[4] = {0.5f, -1.0f, 2.0f, 4.0f}, two_f[1] = {2.0f};
    const float three_f[1] = {3.0f};
    float state[4], x[4], y[4], y0[4], want[4], want0[4];
    kiln_graph *g = NULL;
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    int32_t cnt, xin, sum, two, three;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    CHECK_OK(
        kiln_graph_add_state(g, "counter", KILN_DTYPE_F32, 1, TU_DIMS(4), init, sizeof init, &cnt));
    xin = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    three = tu_const(g, "three", KILN_DTYPE_F32, 1, TU_DIMS(1), three_f);
    tu_output(g, tu_node(g, KILN_OP_MUL, TU_IDS(cnt, three), TU_NO_ATTRS), "y0");
    sum = tu_node(g, KILN_OP_ADD, TU_IDS(xin, cnt), TU_NO_ATTRS);
    CHECK_OK(kiln_graph_update_state(g, cnt, sum));
    two = tu_const(g, "two", KILN_DTYPE_F32, 1, TU_DIMS(1), two_f);
    tu_output(g, tu_node(g, KILN_OP_MUL, TU_IDS(sum, two), TU_NO_ATTRS), "y");
    kiln_build_options o;
    kiln_build_options_init(&o);
    CHECK_OK(kiln_build(g, &o, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    CHECK_OK(tu_load(b, "cpu", &e));
    if (e != NULL) {
        CHECK_EQ_INT(kiln_engine_n_layers(e), 3); // mul, add (into the state), mul: no copy
        CHECK_OK(kiln_context_new(e, &c));
    }
    if (c != NULL) {
        set_f32(state, init, 4);
        for (int step = 0; step < 4; step++) {
            tu_fill(x, 4, -1.0f, 1.0f);
            tu_io in[1] = {{1, {4}, x, 0}};
            tu_io out[2] = {{1, {4}, y0, sizeof y0}, {1, {4}, y, sizeof y}};
            CHECK_OK(tu_execute(c, in, 1, out, 2));
            for (int i = 0; i < 4; i++) {
                want0[i] = 3.0f * state[i];
                state[i] += x[i];
                want[i] = 2.0f * state[i];
            }
            tu_check_close("counter in place: the old value", y0, want0, 4, 1e-6, 1e-6);
            tu_check_close("counter in place", y, want, 4, 1e-6, 1e-6);
        }
    }
    kiln_context_free(c);
    kiln_engine_free(e);
    kiln_built_free(b);
}

// A state set without reading it (s = 2 * x, as transformers' cache counter is set from the
// positions): the mul writes the state directly (one layer more than the output's, no copy),
// and a second engine sharing the state reads what it wrote.
static void test_set_without_reading(void) {
    const float two_f[1] = {2.0f}, one_f[1] = {1.0f};
    float x[4], y[4], z[4], want[4];
    kiln_graph *gw = NULL, *gr = NULL;
    kiln_built *bw = NULL, *br = NULL;
    kiln_engine *ew = NULL, *er = NULL;
    kiln_context *cw = NULL, *cr = NULL;
    int32_t s, xin;
    CHECK_OK(kiln_graph_new(&gw));
    CHECK_OK(kiln_graph_new(&gr));
    if (gw == NULL || gr == NULL) return;
    CHECK_OK(kiln_graph_add_state(gw, "s", KILN_DTYPE_F32, 1, TU_DIMS(4), NULL, 0, &s));
    xin = tu_input(gw, "x", KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    int32_t two = tu_const(gw, "two", KILN_DTYPE_F32, 1, TU_DIMS(1), two_f);
    CHECK_OK(
        kiln_graph_update_state(gw, s, tu_node(gw, KILN_OP_MUL, TU_IDS(xin, two), TU_NO_ATTRS)));
    tu_output(gw, tu_node(gw, KILN_OP_NEG, TU_IDS(xin), TU_NO_ATTRS), "y");
    CHECK_OK(kiln_graph_add_state(gr, "s", KILN_DTYPE_F32, 1, TU_DIMS(4), NULL, 0, &s));
    int32_t one = tu_const(gr, "one", KILN_DTYPE_F32, 1, TU_DIMS(1), one_f);
    tu_output(gr, tu_node(gr, KILN_OP_MUL, TU_IDS(s, one), TU_NO_ATTRS), "z");
    CHECK_OK(tu_build(gw, KILN_PRECISION_FP32, 0, &bw));
    CHECK_OK(tu_build(gr, KILN_PRECISION_FP32, 0, &br));
    kiln_graph_free(gw);
    kiln_graph_free(gr);
    if (bw != NULL) CHECK_OK(tu_load(bw, "cpu", &ew));
    if (br != NULL) CHECK_OK(tu_load(br, "cpu", &er));
    if (ew != NULL && er != NULL) {
        CHECK_EQ_INT(kiln_engine_n_layers(ew), 2); // mul (into the state), neg: no copy layer
        CHECK_OK(kiln_context_new(ew, &cw));
        CHECK_OK(kiln_context_new(er, &cr));
    }
    if (cw != NULL && cr != NULL) {
        CHECK_OK(kiln_context_share_states(cr, cw));
        for (int step = 0; step < 2; step++) {
            tu_fill(x, 4, -1.0f, 1.0f);
            tu_io in[1] = {{1, {4}, x, 0}};
            tu_io out[1] = {{1, {4}, y, sizeof y}};
            CHECK_OK(tu_execute(cw, in, 1, out, 1));
            tu_io outz[1] = {{1, {4}, z, sizeof z}};
            CHECK_OK(tu_execute(cr, NULL, 0, outz, 1));
            for (int i = 0; i < 4; i++) want[i] = 2.0f * x[i];
            tu_check_close("a state set without reading it", z, want, 4, 1e-6, 1e-6);
        }
    }
    kiln_context_free(cr);
    kiln_context_free(cw);
    kiln_engine_free(er);
    kiln_engine_free(ew);
    kiln_built_free(br);
    kiln_built_free(bw);
}

// Two engines (two methods of one program) over one cache: kiln_context_share_states.
static void test_share(void) {
    kiln_graph *g = cache_graph(0);
    kiln_built *b = NULL;
    kiln_engine *e1 = NULL, *e2 = NULL;
    kiln_context *a = NULL, *c = NULL, *solo = NULL;
    float ref[B * S * D] = {0};
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    CHECK_OK(tu_load(b, "cpu", &e1));
    CHECK_OK(tu_load(b, "cpu", &e2));
    if (e1 != NULL && e2 != NULL) {
        CHECK_OK(kiln_context_new(e1, &a));
        CHECK_OK(kiln_context_new(e2, &c));
        CHECK_OK(kiln_context_new(e2, &solo));
    }
    if (a != NULL && c != NULL && solo != NULL) {
        CHECK_STATUS(kiln_context_share_states(c, c), KILN_ERR_INVALID_ARG);
        CHECK_OK(kiln_context_share_states(c, a));
        CHECK_OK(cache_step(a, ref, (const int64_t[]){0, 1, 2}, 3, 1e-6, "shared: owner"));
        CHECK_OK(cache_step(c, ref, (const int64_t[]){3}, 1, 1e-6, "shared: sharer"));
        CHECK_OK(cache_step(a, ref, (const int64_t[]){4}, 1, 1e-6, "shared: owner again"));
        // The owner may go first: the states live on with the sharer.
        kiln_context_free(a);
        a = NULL;
        CHECK_OK(cache_step(c, ref, (const int64_t[]){5}, 1, 1e-6, "shared: owner freed"));
        // States of another shape or name are refused, naming the state.
        {
            kiln_graph *h = NULL;
            kiln_built *hb = NULL;
            kiln_engine *he = NULL;
            kiln_context *hc = NULL;
            int32_t st1, st2;
            CHECK_OK(kiln_graph_new(&h));
            CHECK_OK(kiln_graph_add_state(h, "cache", KILN_DTYPE_F32, 3, TU_DIMS(B, S + 1, D), NULL,
                                          0, &st1));
            CHECK_OK(
                kiln_graph_add_state(h, "other", KILN_DTYPE_F32, 1, TU_DIMS(2), NULL, 0, &st2));
            tu_output(h, tu_node(h, KILN_OP_RELU, TU_IDS(st1), TU_NO_ATTRS), "y");
            tu_output(h, tu_node(h, KILN_OP_RELU, TU_IDS(st2), TU_NO_ATTRS), "z");
            CHECK_OK(tu_build(h, KILN_PRECISION_FP32, 0, &hb));
            if (hb != NULL) CHECK_OK(tu_load(hb, "cpu", &he));
            if (he != NULL) CHECK_OK(kiln_context_new(he, &hc));
            if (hc != NULL) {
                CHECK_STATUS(kiln_context_share_states(hc, c), KILN_ERR_SHAPE);
                CHECK(strstr(kiln_last_error(), "'cache'") != NULL &&
                      strstr(kiln_last_error(), "one dtype and shape") != NULL);
            }
            kiln_context_free(hc);
            kiln_engine_free(he);
            kiln_built_free(hb);
            kiln_graph_free(h);
        }
        // A context that shares nothing keeps its own zeros.
        float zero[B * S * D] = {0};
        CHECK_OK(cache_step(solo, zero, (const int64_t[]){0}, 1, 1e-6, "not shared"));
    }
    kiln_context_free(a);
    kiln_context_free(c);
    kiln_context_free(solo);
    kiln_engine_free(e1);
    kiln_engine_free(e2);
    kiln_built_free(b);
}

// An engine over the states named in `names` (each 4 floats, initial value init + i for the i-th
// name): one input x; state i is updated to s_i + (i + 1) * scale_i * x and output as is.
static kiln_context *partial_ctx(const char *const *names, int n, const float *scale,
                                 kiln_built **b, kiln_engine **e) {
    kiln_graph *g = NULL;
    kiln_context *c = NULL;
    int32_t st[4], xin;
    *b = NULL;
    *e = NULL;
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return NULL;
    xin = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(4), TU_DIMS(4));
    for (int i = 0; i < n; i++) {
        float init[4], f[1] = {scale[i]};
        for (int j = 0; j < 4; j++) init[j] = 0.25f * (float)j + (float)i;
        CHECK_OK(kiln_graph_add_state(g, names[i], KILN_DTYPE_F32, 1, TU_DIMS(4), init, sizeof init,
                                      &st[i]));
        int32_t k = tu_const(g, NULL, KILN_DTYPE_F32, 1, TU_DIMS(1), f);
        int32_t kx = tu_node(g, KILN_OP_MUL, TU_IDS(xin, k), TU_NO_ATTRS);
        int32_t nv = tu_node(g, KILN_OP_ADD, TU_IDS(st[i], kx), TU_NO_ATTRS);
        CHECK_OK(kiln_graph_update_state(g, st[i], nv));
        char out[16];
        snprintf(out, sizeof out, "y%d", i);
        tu_output(g, nv, out);
    }
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, b));
    kiln_graph_free(g);
    if (*b != NULL) CHECK_OK(tu_load(*b, "cpu", e));
    if (*e != NULL) CHECK_OK(kiln_context_new(*e, &c));
    return c;
}

// One step of a partial_ctx context: x random, each named state's reference (refs, by name
// index into all[]) updated as the engine's graph does, the outputs checked against it.
static void partial_step(kiln_context *c, const char *const *names, int n, const float *scale,
                         const char *const *all, float (*refs)[4], const char *what) {
    float x[4], y[4][4];
    tu_fill(x, 4, -1.0f, 1.0f);
    tu_io in[1] = {{1, {4}, x, 0}};
    tu_io out[4];
    for (int i = 0; i < n; i++) out[i] = (tu_io){1, {4}, y[i], sizeof y[i]};
    CHECK_OK(tu_execute(c, in, 1, out, (uint32_t)n));
    for (int i = 0; i < n; i++) {
        int r = 0;
        while (strcmp(all[r], names[i]) != 0) r++;
        for (int j = 0; j < 4; j++) refs[r][j] += scale[i] * x[j];
        char msg[96];
        snprintf(msg, sizeof msg, "%s: state '%s'", what, names[i]);
        tu_check_close(msg, y[i], refs[r], 4, 1e-6, 1e-6);
    }
}

// Methods with different sets of states: each shares the states it has in common with an
// earlier one and keeps the rest; a state shared from a context that shares it from a third one
// stays one copy after the first two are freed; reset; no state in common is refused.
static void test_share_partial(void) {
    static const char *const all[4] = {"k", "a", "b", "z"};
    static const char *const na[2] = {"k", "a"}, *const nb[2] = {"k", "b"};
    static const char *const nd[2] = {"b", "k"}, *const nz[1] = {"z"};
    static const float sa[2] = {1.0f, 2.0f}, sb[2] = {-1.0f, 3.0f}, sd[2] = {0.5f, 4.0f};
    static const float sz[1] = {1.0f};
    kiln_built *ba, *bb, *bd, *bz;
    kiln_engine *ea, *eb, *ed, *ez;
    kiln_context *a = partial_ctx(na, 2, sa, &ba, &ea);
    kiln_context *b = partial_ctx(nb, 2, sb, &bb, &eb);
    kiln_context *d = partial_ctx(nd, 2, sd, &bd, &ed);
    kiln_context *z = partial_ctx(nz, 1, sz, &bz, &ez);
    float refs[4][4], own_b[4][4];
    for (int r = 0; r < 4; r++) {
        for (int j = 0; j < 4; j++) refs[r][j] = own_b[r][j] = 0.25f * (float)j;
    }
    // initial values: k and z are the first state of their engines (+0), a and b the second (+1)
    for (int j = 0; j < 4; j++) refs[1][j] += 1.0f, refs[2][j] += 1.0f, own_b[2][j] += 1.0f;
    if (a != NULL && b != NULL && d != NULL && z != NULL) {
        CHECK_STATUS(kiln_context_share_states(z, a), KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "no state") != NULL);
        CHECK_OK(kiln_context_share_states(b, a)); // k shared, b its own
        partial_step(a, na, 2, sa, all, refs, "partial: a");
        partial_step(b, nb, 2, sb, all, refs, "partial: b (k from a)");
        partial_step(a, na, 2, sa, all, refs, "partial: a after b");
        // d: b from b's own block, k from a's through b; visited latest first as the delegate does
        CHECK_OK(kiln_context_share_states(d, b));
        CHECK_OK(kiln_context_share_states(d, a));
        partial_step(d, nd, 2, sd, all, refs, "partial: d");
        partial_step(b, nb, 2, sb, all, refs, "partial: b after d");
        // reset through b: k and b back to b's engine's initial values (k +0, b +1), a kept
        CHECK_OK(kiln_context_reset_states(b));
        for (int j = 0; j < 4; j++) refs[0][j] = 0.25f * (float)j, refs[2][j] = own_b[2][j];
        partial_step(d, nd, 2, sd, all, refs, "partial: d after b's reset");
        kiln_context_free(a);
        a = NULL;
        kiln_context_free(b);
        b = NULL;
        partial_step(d, nd, 2, sd, all, refs, "partial: d after a and b were freed");
        partial_step(z, nz, 1, sz, all, refs, "partial: z (its own)");
    }
    kiln_context_free(a);
    kiln_context_free(b);
    kiln_context_free(d);
    kiln_context_free(z);
    kiln_engine_free(ea);
    kiln_engine_free(eb);
    kiln_engine_free(ed);
    kiln_engine_free(ez);
    kiln_built_free(ba);
    kiln_built_free(bb);
    kiln_built_free(bd);
    kiln_built_free(bz);
}

static void test_api_errors(void) {
    kiln_graph *g = NULL;
    int32_t s, x, v;
    float data[4] = {0};
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    // Initial data of the wrong size, a duplicate name, a dynamic update, a second update.
    CHECK_STATUS(kiln_graph_add_state(g, "s", KILN_DTYPE_F32, 1, TU_DIMS(4), data, 8, &s),
                 KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "needs 16 bytes") != NULL);
    CHECK_OK(kiln_graph_add_state(g, "s", KILN_DTYPE_F32, 1, TU_DIMS(4), NULL, 0, &s));
    CHECK_STATUS(kiln_graph_add_state(g, "s", KILN_DTYPE_F32, 1, TU_DIMS(4), NULL, 0, &v),
                 KILN_ERR_INVALID_ARG);
    x = tu_input(g, "x", KILN_DTYPE_F32, 1, TU_DIMS(1), TU_DIMS(4));
    CHECK_STATUS(kiln_graph_update_state(g, s, x), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "static shape") != NULL);
    CHECK_STATUS(kiln_graph_update_state(g, x, s), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "not a state") != NULL);
    v = tu_node(g, KILN_OP_RELU, TU_IDS(s), TU_NO_ATTRS);
    CHECK_OK(kiln_graph_update_state(g, s, v));
    CHECK_STATUS(kiln_graph_update_state(g, s, v), KILN_ERR_INVALID_ARG);
    kiln_graph_free(g);
}

int main(void) {
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    test_api_errors();
    test_set_without_reading();
    test_counter_in_place();
    test_cache(KILN_PRECISION_FP32, 1e-6);
    test_cache(KILN_PRECISION_FP16, 4e-3);
    test_kv_cache();
    test_counter(0);
    test_counter(1);
    test_share();
    test_share_partial();
    return check_summary();
}
