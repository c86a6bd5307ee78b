// SPDX-License-Identifier: Apache-2.0
// Attention canonicalization (pass_attention.c): separate q/k/v projections merged into one
// linear + select, slice + squeeze turned into select, the cases that must be left alone, and
// that every rewritten engine computes what the unoptimized one does (CPU backend, random
// inputs, static and dynamic shapes).
#include <math.h>

#include "builder/builder_test_util.h"

#define D 32
#define H 4
#define E 8

static kiln_build_options o0, o1;

static float *rnd(int64_t n) { return tu_rand(n, -0.5f, 0.5f); }

// permute(reshape(linear(x, w, b), shape), (0, 2, 1, 3)); *lin = the linear's output
static int32_t head_split(kiln_graph *g, int32_t x, int32_t w, int32_t b, const int64_t *shape,
                          int32_t *lin) {
    int32_t y = b >= 0 ? tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w, b), TU_NO_ATTRS)
                       : tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w), TU_NO_ATTRS);
    *lin = y;
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y),
                TU_ATTRS(TU_INTS("shape", shape[0], shape[1], shape[2], shape[3])));
    return tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
}

// A BERT-style self-attention block. variant 0: the pattern; 1: k's projection also an output;
// 2: v projects another input; 3: no biases, dynamic batch and sequence (copied reshape dims);
// 4: no bias on k (Whisper, BEiT); 5: a bias on q only.
static kiln_graph *bert_block(int variant, float **blobs) {
    kiln_graph *g;
    int32_t x, x2 = -1, w[3], b[3] = {-1, -1, -1}, qkv[3], lin[3], o;
    int dyn = variant == 3;
    int64_t shape[4] = {dyn ? -2 : 2, dyn ? -3 : 5, H, E};
    CHECK_OK(kiln_graph_new(&g));
    x = dyn ? tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(1, 1, D), TU_DIMS(3, 9, D))
            : tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, 5, D), TU_DIMS(2, 5, D));
    if (variant == 2) x2 = tu_input(g, "x2", KILN_DTYPE_F32, 3, TU_DIMS(2, 5, D), TU_DIMS(2, 5, D));
    for (int j = 0; j < 3; j++) {
        static const char *wn[3] = {"wq", "wk", "wv"}, *bn[3] = {"bq", "bk", "bv"};
        blobs[2 * j] = rnd(D * D);
        blobs[2 * j + 1] = rnd(D);
        w[j] = tu_const(g, wn[j], KILN_DTYPE_F32, 2, TU_DIMS(D, D), blobs[2 * j]);
        if (variant != 3 && !(variant == 4 && j == 1) && !(variant == 5 && j > 0))
            b[j] = tu_const(g, bn[j], KILN_DTYPE_F32, 1, TU_DIMS(D), blobs[2 * j + 1]);
    }
    for (int j = 0; j < 3; j++) {
        qkv[j] = head_split(g, j == 2 && x2 >= 0 ? x2 : x, w[j], b[j], shape, &lin[j]);
    }
    o = tu_node(g, KILN_OP_SDPA, TU_IDS(qkv[0], qkv[1], qkv[2]), TU_NO_ATTRS);
    o = tu_node(g, KILN_OP_PERMUTE, TU_IDS(o), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    o = tu_node(g, KILN_OP_RESHAPE, TU_IDS(o), TU_ATTRS(TU_INTS("shape", shape[0], shape[1], D)));
    tu_output(g, o, "y");
    if (variant == 1) tu_output(g, lin[1], "k_proj"); // the key projection read twice: no merge
    return g;
}

static void test_bert(int variant, uint32_t want_linear, uint32_t want_select, const char *what) {
    float *blobs[6] = {0};
    kiln_graph *g = bert_block(variant, blobs);
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_LINEAR) == want_linear, "%s: %u linear layers, want %u",
                  what, bt_count(&p, KILN_OP_LINEAR), want_linear);
        CHECK_MSG(bt_count(&p, KILN_OP_SELECT) == want_select, "%s: %u select layers, want %u",
                  what, bt_count(&p, KILN_OP_SELECT), want_select);
        kiln_plan_release(&p);
    }
    if (variant == 3) {
        bt_shape s1[1] = {{3, {3, 9, D}}}, s2[1] = {{3, {1, 4, D}}};
        bt_compare(g, &o0, &o1, 1, s1, 0, 1e-5, 1e-5, what);
        bt_compare(g, &o0, &o1, 1, s2, 0, 1e-5, 1e-5, what);
    } else {
        bt_shape s[2] = {{3, {2, 5, D}}, {3, {2, 5, D}}};
        bt_compare(g, &o0, &o1, variant == 2 ? 2 : 1, s, 0, 1e-5, 1e-5, what);
    }
    kiln_graph_free(g);
    for (int i = 0; i < 6; i++) free(blobs[i]);
}

// Head projections (rewrite 6): q over 4 heads, k and v over 2 heads of E (grouped-query
// widths), each linear -> reshape [2, 5, H_j, E]; q and k through a rotary of constant tables
// before their permute, k and v repeated for the groups, causal sdpa. variant 0: biases on q, k,
// v; 1: a bias on k only (rows of zeros for the others); 2: no biases, and a fourth projection
// of the same x whose head split is also an output (not merged); 3: v's head size differs (v
// stays apart: q and k merge); 4: dynamic batch (nothing merged: the slices need static shapes).
static void test_head_projections(int variant, uint32_t want_linear, uint32_t want_slice,
                                  const char *what) {
    enum { HQ = 4, HK = 2, S5 = 5 };
    const int64_t ev = variant == 3 ? 2 * E : E, bmax = 2, bmin = variant == 4 ? 1 : 2;
    float *blobs[8] = {0};
    kiln_graph *g;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(bmin, S5, D), TU_DIMS(bmax, S5, D));
    blobs[6] = tu_rand(S5 * E, -1.0f, 1.0f);
    blobs[7] = tu_rand(S5 * E, -1.0f, 1.0f);
    int32_t cs = tu_const(g, "cos", KILN_DTYPE_F32, 3, TU_DIMS(S5, 1, E), blobs[6]);
    int32_t sn = tu_const(g, "sin", KILN_DTYPE_F32, 3, TU_DIMS(S5, 1, E), blobs[7]);
    int32_t part[3];
    for (int j = 0; j < 3; j++) {
        static const char *wn[3] = {"wq", "wk", "wv"}, *bn[3] = {"bq", "bk", "bv"};
        const int64_t heads = j == 0 ? HQ : HK, e = j == 2 ? ev : E, n = heads * e;
        blobs[2 * j] = rnd(n * D);
        blobs[2 * j + 1] = rnd(n);
        int32_t w = tu_const(g, wn[j], KILN_DTYPE_F32, 2, TU_DIMS(n, D), blobs[2 * j]);
        int32_t y;
        if (variant == 0 || (variant == 1 && j == 1)) {
            int32_t bb = tu_const(g, bn[j], KILN_DTYPE_F32, 1, TU_DIMS(n), blobs[2 * j + 1]);
            y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w, bb), TU_NO_ATTRS);
        } else {
            y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w), TU_NO_ATTRS);
        }
        y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -2, S5, heads, e)));
        if (j < 2) y = tu_node(g, KILN_OP_ROTARY, TU_IDS(y, cs, sn), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
        if (j > 0) {
            int32_t u = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(y), TU_ATTRS(TU_INTS("dim", 2)));
            u = tu_node(g, KILN_OP_EXPAND, TU_IDS(u),
                        TU_ATTRS(TU_INTS("shape", -2, HK, HQ / HK, S5, e)));
            y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(u), TU_ATTRS(TU_INTS("shape", -2, HQ, S5, e)));
        }
        part[j] = y;
    }
    int32_t o = -1;
    {
        int32_t ins[3] = {part[0], part[1], part[2]};
        kiln_attr at[1] = {TU_INTS("is_causal", 1)};
        CHECK_OK(kiln_graph_add_node(g, KILN_OP_SDPA, ins, 3, at, 1, &o, 1));
    }
    tu_output(g, o, "o");
    float *w4 = NULL;
    if (variant == 2) { // a fourth projection of x, its head split read by an output
        w4 = rnd(HK * E * D);
        int32_t w = tu_const(g, "w4", KILN_DTYPE_F32, 2, TU_DIMS(HK * E, D), w4);
        int32_t y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w), TU_NO_ATTRS);
        int32_t r =
            tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -2, S5, HK, E)));
        tu_output(g, y, "proj4");
        tu_output(g, r, "heads4");
    }
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_LINEAR) == want_linear, "%s: %u linear layers, want %u",
                  what, bt_count(&p, KILN_OP_LINEAR), want_linear);
        CHECK_MSG(bt_count(&p, KILN_OP_SLICE) == want_slice, "%s: %u slice layers, want %u", what,
                  bt_count(&p, KILN_OP_SLICE), want_slice);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{3, {2, S5, D}}};
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-5, 1e-5, what);
    if (variant == 4) {
        bt_shape s1[1] = {{3, {1, S5, D}}};
        bt_compare(g, &o0, &o1, 1, s1, 0, 1e-5, 1e-5, what);
    }
    kiln_graph_free(g);
    for (int i = 0; i < 8; i++) free(blobs[i]);
    free(w4);
}

// Head projections across layers: an encoder-decoder's cross-attention, n_layers decoder layers
// whose k and v all project the encoder's output x (2 * n_layers linears of one x), q its own
// layer's state. Merges take at most 64 linears: 40 layers make a merge of 64 and one of 16,
// whose linears are not merged a third time with the first merge's (its slices would read a
// slice emitted after them).
static void test_cross_attention_layers(int n_layers, uint32_t want_linear, const char *what) {
    enum { SD = 3, SE = 5, B2 = 2 };
    float **blobs = calloc((size_t)(3 * n_layers), sizeof *blobs);
    kiln_graph *g;
    CHECK(blobs != NULL);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "enc", KILN_DTYPE_F32, 3, TU_DIMS(B2, SE, D), TU_DIMS(B2, SE, D));
    int32_t d = tu_input(g, "dec", KILN_DTYPE_F32, 3, TU_DIMS(B2, SD, D), TU_DIMS(B2, SD, D));
    const int64_t sq[4] = {B2, SD, H, E}, skv[4] = {B2, SE, H, E};
    for (int l = 0; l < n_layers; l++) {
        int32_t w[3], part[3], lin;
        for (int j = 0; j < 3; j++) {
            char name[16];
            snprintf(name, sizeof name, "w%d_%d", l, j);
            blobs[3 * l + j] = rnd(D * D);
            w[j] = tu_const(g, name, KILN_DTYPE_F32, 2, TU_DIMS(D, D), blobs[3 * l + j]);
            part[j] = head_split(g, j == 0 ? d : x, w[j], -1, j == 0 ? sq : skv, &lin);
        }
        int32_t o = tu_node(g, KILN_OP_SDPA, TU_IDS(part[0], part[1], part[2]), TU_NO_ATTRS);
        o = tu_node(g, KILN_OP_PERMUTE, TU_IDS(o), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
        o = tu_node(g, KILN_OP_RESHAPE, TU_IDS(o), TU_ATTRS(TU_INTS("shape", B2, SD, D)));
        d = tu_node(g, KILN_OP_ADD, TU_IDS(d, o), TU_NO_ATTRS);
    }
    tu_output(g, d, "y");
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_LINEAR) == want_linear, "%s: %u linear layers, want %u",
                  what, bt_count(&p, KILN_OP_LINEAR), want_linear);
        kiln_plan_release(&p);
    }
    bt_shape sh[2] = {{3, {B2, SE, D}}, {3, {B2, SD, D}}};
    bt_compare(g, &o0, &o1, 2, sh, 0, 1e-4, 1e-4, what);
    kiln_graph_free(g);
    for (int i = 0; i < 3 * n_layers; i++) free(blobs[i]);
    free(blobs);
}

// Head projections with a single kv head (Gemma's multi-query attention): k and v are linears of
// E columns reshaped straight to [B, 1, L, E] (the views pass merges the head split of one
// head with its transpose), q a head split of 4 heads then permuted; sdpa broadcasts k and v
// over the heads. variant 0: the three merge (k's and v's reshapes follow their slices);
// 1: q a single head too: no member is a head split, nothing merges.
static void test_single_kv_head(int variant, uint32_t want_linear, const char *what) {
    enum { S5 = 5 };
    const int64_t hq = variant == 1 ? 1 : 4;
    float *blobs[3] = {0};
    kiln_graph *g;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, S5, D), TU_DIMS(2, S5, D));
    int32_t part[3];
    for (int j = 0; j < 3; j++) {
        static const char *wn[3] = {"wq", "wk", "wv"};
        const int64_t n = j == 0 ? hq * E : E;
        blobs[j] = rnd(n * D);
        int32_t w = tu_const(g, wn[j], KILN_DTYPE_F32, 2, TU_DIMS(n, D), blobs[j]);
        int32_t y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, w), TU_NO_ATTRS);
        if (j == 0 && variant == 0) {
            y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -2, S5, hq, E)));
            y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
        } else {
            y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", -2, 1, S5, E)));
        }
        part[j] = y;
    }
    int32_t o = tu_node(g, KILN_OP_SDPA, TU_IDS(part[0], part[1], part[2]), TU_NO_ATTRS);
    tu_output(g, o, "o");
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_LINEAR) == want_linear, "%s: %u linear layers, want %u",
                  what, bt_count(&p, KILN_OP_LINEAR), want_linear);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{3, {2, S5, D}}};
    bt_compare(g, &o0, &o1, 1, sh, 0, 1e-5, 1e-5, what);
    kiln_graph_free(g);
    for (int i = 0; i < 3; i++) free(blobs[i]);
}

// The packed projection exported through unbind(0): slice + squeeze per operand.
static void test_packed_unbind(void) {
    float *w = rnd(3 * D * D), *b = rnd(3 * D);
    kiln_graph *g;
    kiln_plan p;
    int32_t x, cw, cb, y, part[3], o;
    bt_shape s[1] = {{3, {2, 6, D}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(2, 6, D), TU_DIMS(2, 6, D));
    cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(3 * D, D), w);
    cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(3 * D), b);
    y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw, cb), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", 2, 6, 3, H, E)));
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 2, 0, 3, 1, 4)));
    for (int j = 0; j < 3; j++) {
        int32_t sl = tu_node(g, KILN_OP_SLICE, TU_IDS(y),
                             TU_ATTRS(TU_INTS("dim", 0), TU_INTS("start", j), TU_INTS("end", j + 1),
                                      TU_INTS("step", 1)));
        part[j] = tu_node(g, KILN_OP_SQUEEZE, TU_IDS(sl), TU_ATTRS(TU_INTS("dims", 0)));
    }
    o = tu_node(g, KILN_OP_SDPA, TU_IDS(part[0], part[1], part[2]),
                TU_ATTRS(TU_INTS("is_causal", 1)));
    tu_output(g, o, "y");
    if (bt_plan(g, &o1, &p)) {
        CHECK(bt_count(&p, KILN_OP_SELECT) == 3);
        CHECK(bt_count(&p, KILN_OP_SLICE) == 0 && bt_count(&p, KILN_OP_SQUEEZE) == 0);
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 1e-5, 1e-5, "packed qkv through slice + squeeze");
    kiln_graph_free(g);
    free(w);
    free(b);
}

// slice + squeeze pairs that are not a select stay as they are (and still compute the same).
static void test_not_select(void) {
    kiln_graph *g;
    kiln_plan p;
    int32_t x, a, b2, c, t;
    bt_shape s[1] = {{3, {4, 3, 5}}};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(4, 3, 5), TU_DIMS(4, 3, 5));
    // a width-2 slice, then a squeeze of another dim of size 1 (after a slice of width 1)
    a = tu_node(
        g, KILN_OP_SLICE, TU_IDS(x),
        TU_ATTRS(TU_INTS("dim", 0), TU_INTS("start", 1), TU_INTS("end", 3), TU_INTS("step", 1)));
    tu_output(g, a, "wide");
    b2 = tu_node(
        g, KILN_OP_SLICE, TU_IDS(x),
        TU_ATTRS(TU_INTS("dim", 1), TU_INTS("start", 2), TU_INTS("end", 3), TU_INTS("step", 1)));
    t = tu_node(g, KILN_OP_SQUEEZE, TU_IDS(b2), TU_ATTRS(TU_INTS("dims", 1)));
    tu_output(g, t, "picked"); // this one is a select
    c = tu_node(
        g, KILN_OP_SLICE, TU_IDS(x),
        TU_ATTRS(TU_INTS("dim", 2), TU_INTS("start", 0), TU_INTS("end", 1), TU_INTS("step", 1)));
    tu_output(g, c, "kept_slice"); // read by an output as well as the squeeze: must stay
    t = tu_node(g, KILN_OP_SQUEEZE, TU_IDS(c), TU_ATTRS(TU_INTS("dims", 2)));
    tu_output(g, t, "squeezed");
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_SELECT) == 1, "%u selects", bt_count(&p, KILN_OP_SELECT));
        kiln_plan_release(&p);
    }
    bt_compare(g, &o0, &o1, 1, s, 0, 0, 0, "slices that are not selects");
    kiln_graph_free(g);
}

// Grouped-query attention over a repeated cache: q [1, 4, L, E] (L dynamic, 1..lmax), a cache of
// 2 kv heads [1, 2, S, E] repeated twice per head (unsqueeze, expand, reshape, as transformers'
// repeat_kv), a mask [L, S] (bool) or [1, 1, L, S] (float), or a constant causal mask [lmax, S]
// (L static then); `merge`: the result's head merge (permute (0, 2, 1, 3), reshape) as the
// output. The rewrite reads the cache itself: no expand left (want_expand counts the mask's);
// a decode-length q (lmax <= 8, not causal) keeps rank-4 rows, a longer or causal one runs a
// rank-5 sdpa (want_rank); the constant causal mask becomes is_causal (want_causal). Values as
// the unoptimized engine.
enum { GQ_NONE = 0, GQ_BOOL = 2, GQ_FLOAT = 4, GQ_TRIL = 5 };
static void test_gqa(int mask, int causal, int64_t lmax, int merge, uint32_t want_expand,
                     uint32_t want_rank, int want_causal, const char *what) {
    enum { G = 2, S = 24 };
    kiln_graph *g;
    CHECK_OK(kiln_graph_new(&g));
    int64_t lmin = mask == GQ_TRIL ? lmax : 1;
    int32_t q = tu_input(g, "q", KILN_DTYPE_F32, 4, TU_DIMS(1, H, lmin, E), TU_DIMS(1, H, lmax, E));
    int32_t c = tu_input(g, "cache", KILN_DTYPE_F32, 4, TU_DIMS(1, G, S, E), TU_DIMS(1, G, S, E));
    int32_t rep[2];
    for (int j = 0; j < 2; j++) {
        int64_t r = 2, heads = G * r;
        int32_t u = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(c), TU_ATTRS(TU_INTS("dim", 2)));
        int32_t e =
            tu_node(g, KILN_OP_EXPAND, TU_IDS(u), TU_ATTRS(TU_INTS("shape", 1, G, r, S, E)));
        if (j == 1) e = tu_node(g, KILN_OP_COPY, TU_IDS(e), TU_NO_ATTRS); // as torch exports it
        rep[j] = tu_node(g, KILN_OP_RESHAPE, TU_IDS(e), TU_ATTRS(TU_INTS("shape", 1, heads, S, E)));
    }
    int32_t m = -1;
    if (mask == GQ_BOOL) {
        m = tu_input(g, "mask", KILN_DTYPE_BOOL, 2, TU_DIMS(1, S), TU_DIMS(lmax, S));
    } else if (mask == GQ_FLOAT) {
        m = tu_input(g, "mask", KILN_DTYPE_F32, 4, TU_DIMS(1, 1, 1, S), TU_DIMS(1, 1, lmax, S));
    } else if (mask == GQ_TRIL) { // [lmax, S] top-left causal, viewed as [1, 1, lmax, S]
        uint8_t *bm = malloc((size_t)(lmax * S));
        for (int64_t i = 0; i < lmax * S; i++) bm[i] = (uint8_t)(i % S <= i / S);
        CHECK_OK(kiln_graph_add_constant(g, "tril", KILN_DTYPE_BOOL, 2, TU_DIMS(lmax, S), bm,
                                         (size_t)(lmax * S), &m));
        free(bm);
        m = tu_node(g, KILN_OP_RESHAPE, TU_IDS(m), TU_ATTRS(TU_INTS("shape", 1, 1, lmax, S)));
    }
    int32_t ins[4] = {q, rep[0], rep[1], m};
    kiln_attr at[1] = {TU_INTS("is_causal", causal)};
    int32_t o = -1;
    kiln_status st = kiln_graph_add_node(g, KILN_OP_SDPA, ins, m >= 0 ? 4 : 3, at, 1, &o, 1);
    CHECK_OK(st);
    if (merge) {
        o = tu_node(g, KILN_OP_PERMUTE, TU_IDS(o), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
        o = tu_node(g, KILN_OP_RESHAPE, TU_IDS(o), TU_ATTRS(TU_INTS("shape", 1, -3, H * E)));
    }
    tu_output(g, o, "o");
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_EXPAND) == want_expand, "%s: %u expand layers, want %u",
                  what, bt_count(&p, KILN_OP_EXPAND), want_expand);
        for (uint32_t l = 0; l < p.n_layers; l++) {
            if (p.layers[l].op != KILN_OP_SDPA) continue;
            kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[l]);
            int32_t y = p.ids[p.layers[l].output_begin];
            uint32_t rank = p.tensors[y].shape.rank;
            int cz = kiln_attrs_int(&a, KILN_A_SDPA_CAUSAL, 0) != 0;
            CHECK_MSG(rank == want_rank && cz == want_causal,
                      "%s: sdpa of rank %u, causal %d; want %u, %d", what, rank, cz, want_rank,
                      want_causal);
        }
        if (merge) { // the head merge is a permute of the sdpa's result (a view on CUDA)
            CHECK_MSG(bt_count(&p, KILN_OP_PERMUTE) == 1, "%s: %u permutes", what,
                      bt_count(&p, KILN_OP_PERMUTE));
        }
        kiln_plan_release(&p);
    }
    bt_shape sl[3] = {{4, {1, H, lmax, E}}, {4, {1, G, S, E}}, {0, {0}}};
    bt_shape s1[3] = {{4, {1, H, lmin, E}}, {4, {1, G, S, E}}, {0, {0}}};
    if (mask == GQ_BOOL) {
        sl[2] = (bt_shape){2, {lmax, S}};
        s1[2] = (bt_shape){2, {lmin, S}};
    } else if (mask == GQ_FLOAT) {
        sl[2] = (bt_shape){4, {1, 1, lmax, S}};
        s1[2] = (bt_shape){4, {1, 1, lmin, S}};
    }
    uint32_t n_in = mask == GQ_BOOL || mask == GQ_FLOAT ? 3 : 2;
    bt_compare(g, &o0, &o1, n_in, sl, 1, 1e-5, 1e-5, what);
    bt_compare(g, &o0, &o1, n_in, s1, 1, 1e-5, 1e-5, what);
    kiln_graph_free(g);
}

// Multi-query attention (one kv head), as the views pass leaves Gemma's: k and v [1, S, E]
// inputs each reshaped straight to [1, 1, 1, S, E] (the head split of a single head and the
// unsqueeze merged), expanded to 4 query heads, reshaped to [1, 4, S, E]. A causal or long q
// takes the broadcast form over the [1, 1, 1, S, E] view, a decode-length one the rows form
// over the kv rows viewed as [1, 1, S, E]; no expand runs either way, values as unoptimized.
static void test_mqa(int causal, int64_t lmax, uint32_t want_rank) {
    enum { S = 11 };
    kiln_graph *g;
    CHECK_OK(kiln_graph_new(&g));
    int32_t q = tu_input(g, "q", KILN_DTYPE_F32, 4, TU_DIMS(1, H, 1, E), TU_DIMS(1, H, lmax, E));
    int32_t kv[2];
    for (int j = 0; j < 2; j++) {
        int32_t c =
            tu_input(g, j ? "v" : "k", KILN_DTYPE_F32, 3, TU_DIMS(1, S, E), TU_DIMS(1, S, E));
        int32_t u =
            tu_node(g, KILN_OP_RESHAPE, TU_IDS(c), TU_ATTRS(TU_INTS("shape", 1, 1, 1, S, E)));
        int32_t e =
            tu_node(g, KILN_OP_EXPAND, TU_IDS(u), TU_ATTRS(TU_INTS("shape", 1, 1, H, S, E)));
        kv[j] = tu_node(g, KILN_OP_RESHAPE, TU_IDS(e), TU_ATTRS(TU_INTS("shape", 1, H, S, E)));
    }
    kiln_attr at[1] = {TU_INTS("is_causal", causal)};
    int32_t ins[3] = {q, kv[0], kv[1]}, o = -1;
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SDPA, ins, 3, at, 1, &o, 1));
    tu_output(g, o, "o");
    kiln_plan p;
    const char *what = causal ? "MQA, causal" : "MQA, decode rows";
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_EXPAND) == 0, "%s: %u expand layers", what,
                  bt_count(&p, KILN_OP_EXPAND));
        for (uint32_t l = 0; l < p.n_layers; l++) {
            if (p.layers[l].op != KILN_OP_SDPA) continue;
            uint32_t rank = p.tensors[p.ids[p.layers[l].output_begin]].shape.rank;
            CHECK_MSG(rank == want_rank, "%s: sdpa of rank %u, want %u", what, rank, want_rank);
        }
        kiln_plan_release(&p);
    }
    bt_shape sl[3] = {{4, {1, H, lmax, E}}, {3, {1, S, E}}, {3, {1, S, E}}};
    bt_shape s1[3] = {{4, {1, H, 1, E}}, {3, {1, S, E}}, {3, {1, S, E}}};
    bt_compare(g, &o0, &o1, 3, sl, 1, 1e-5, 1e-5, what);
    bt_compare(g, &o0, &o1, 3, s1, 1, 1e-5, 1e-5, what);
    kiln_graph_free(g);
}

// A GPT-2 attention block: x [B, 6, D] -> linear [3 D] -> three slices of D -> head split ->
// sdpa with a constant mask [1, 1, 6, 6] -> head merge. Variants of the mask and the slices.
enum {
    G_BOOL,      // bool tril: becomes is_causal
    G_NEG_INF,   // float 0 / -inf: becomes is_causal
    G_FINFO_MIN, // float 0 / -3.4e38 (transformers' finfo.min): becomes is_causal
    G_NOT_TRIL,  // bool, one entry above the diagonal allowed: the mask stays
    G_SHIFTED,   // the slices at 0, D / 2, D: the middle one stays a slice
    G_DYN_BATCH, // B dynamic (1..3): select form with a copied batch dim
};

static void test_gpt2(int variant, uint32_t want_slice, int want_causal, const char *what) {
    enum { L = 6 };
    float *w = rnd(3 * D * D), *b = rnd(3 * D), fm[L * L];
    uint8_t bm[L * L];
    kiln_graph *g;
    kiln_plan p;
    int dyn = variant == G_DYN_BATCH;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x =
        tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(dyn ? 1 : 2, L, D), TU_DIMS(dyn ? 3 : 2, L, D));
    int32_t cw = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(3 * D, D), w);
    int32_t cb = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(3 * D), b), m, part[3], o;
    int32_t y = tu_node(g, KILN_OP_LINEAR, TU_IDS(x, cw, cb), TU_NO_ATTRS);
    for (int i = 0; i < L; i++) {
        for (int j = 0; j < L; j++) {
            int allow = j <= i || (variant == G_NOT_TRIL && i == 2 && j == 4);
            bm[i * L + j] = (uint8_t)allow;
            fm[i * L + j] = allow ? 0.0f : variant == G_NEG_INF ? -INFINITY : -3.4e38f;
        }
    }
    if (variant == G_NEG_INF || variant == G_FINFO_MIN) {
        m = tu_const(g, "mask", KILN_DTYPE_F32, 4, TU_DIMS(1, 1, L, L), fm);
    } else {
        CHECK_OK(kiln_graph_add_constant(g, "mask", KILN_DTYPE_BOOL, 4, TU_DIMS(1, 1, L, L), bm,
                                         sizeof bm, &m));
    }
    for (int j = 0; j < 3; j++) {
        int64_t start = variant == G_SHIFTED ? j * D / 2 : j * D;
        int32_t sl = tu_node(g, KILN_OP_SLICE, TU_IDS(y),
                             TU_ATTRS(TU_INTS("dim", 2), TU_INTS("start", start),
                                      TU_INTS("end", start + D), TU_INTS("step", 1)));
        sl = tu_node(g, KILN_OP_RESHAPE, TU_IDS(sl),
                     TU_ATTRS(TU_INTS("shape", dyn ? -2 : 2, L, H, E)));
        part[j] = tu_node(g, KILN_OP_PERMUTE, TU_IDS(sl), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    }
    o = tu_node(g, KILN_OP_SDPA, TU_IDS(part[0], part[1], part[2], m), TU_NO_ATTRS);
    o = tu_node(g, KILN_OP_PERMUTE, TU_IDS(o), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    o = tu_node(g, KILN_OP_RESHAPE, TU_IDS(o), TU_ATTRS(TU_INTS("shape", dyn ? -2 : 2, L, D)));
    tu_output(g, o, "y");
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_SLICE) == want_slice, "%s: %u slices, want %u", what,
                  bt_count(&p, KILN_OP_SLICE), want_slice);
        CHECK_MSG(bt_count(&p, KILN_OP_SELECT) == 3 - want_slice, "%s: %u selects", what,
                  bt_count(&p, KILN_OP_SELECT));
        for (uint32_t l = 0; l < p.n_layers; l++) {
            if (p.layers[l].op != KILN_OP_SDPA) continue;
            kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[l]);
            int causal = kiln_attrs_int(&a, KILN_A_SDPA_CAUSAL, 0) != 0;
            CHECK_MSG(causal == want_causal && p.layers[l].n_inputs == (want_causal ? 3u : 4u),
                      "%s: sdpa causal %d with %u inputs, want causal %d", what, causal,
                      p.layers[l].n_inputs, want_causal);
        }
        kiln_plan_release(&p);
    }
    bt_shape s1[1] = {{3, {2, L, D}}}, s2[1] = {{3, {3, L, D}}};
    bt_compare(g, &o0, &o1, 1, s1, 0, 1e-5, 1e-5, what);
    if (dyn) bt_compare(g, &o0, &o1, 1, s2, 0, 1e-5, 1e-5, what);
    kiln_graph_free(g);
    free(w);
    free(b);
}

// Eager attention (6.): softmax(q k^T * c + masks) v over heads of EH, in a float32 graph built
// at float16. variant 0: a multiply by c, a constant bias [1, H, L, L], the softmax between casts
// to and from float32 (BEiT); 1: a divide by c, a constant bias and an input key-padding mask
// [B, 1, 1, L] (MPNet); 2: the probabilities also an output (left alone); 3: heads of 8 (left
// alone); 4: the bias added before the scale (left alone: the scale would reach the bias); heads
// of 32: 5 without masks (SegFormer: taken), 6 with the bias (left alone); 7: heads of 12 without
// masks (left alone).
enum { EH = 64, ED = 2 * EH, EL = 7, EB = 2 };
static void test_eager(int variant, int want_sdpa, const char *what) {
    const int64_t e = variant == 3                   ? 8
                      : variant == 5 || variant == 6 ? 32
                      : variant == 7                 ? 12
                      : variant == 8                 ? 16
                                                     : EH;
    const int64_t d = 2 * e;
    const int no_bias = variant == 5 || variant == 7;
    float *w[3], *bias = rnd(2 * EL * EL), c = variant == 1 ? 8.0f : 0.125f;
    kiln_graph *g;
    kiln_plan p;
    int32_t x, mask = -1, qkv[3], lin, sc, y;
    const int64_t shape[4] = {EB, EL, 2, e};
    CHECK_OK(kiln_graph_new(&g));
    x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(EB, EL, d), TU_DIMS(EB, EL, d));
    if (variant == 1) {
        mask = tu_input(g, "mask", KILN_DTYPE_F32, 4, TU_DIMS(EB, 1, 1, EL), TU_DIMS(EB, 1, 1, EL));
    }
    for (int j = 0; j < 3; j++) {
        w[j] = tu_rand(d * d, -0.15f, 0.15f);
        int32_t cw = tu_const(g, NULL, KILN_DTYPE_F32, 2, TU_DIMS(d, d), w[j]);
        qkv[j] = head_split(g, x, cw, -1, shape, &lin);
    }
    int32_t kt = tu_node(g, KILN_OP_PERMUTE, TU_IDS(qkv[1]), TU_ATTRS(TU_INTS("dims", 0, 1, 3, 2)));
    int32_t s = tu_node(g, KILN_OP_MATMUL, TU_IDS(qkv[0], kt), TU_NO_ATTRS);
    int32_t cb = tu_const(g, NULL, KILN_DTYPE_F32, 4, TU_DIMS(1, 2, EL, EL), bias);
    sc = tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &c);
    if (variant == 4) s = tu_node(g, KILN_OP_ADD, TU_IDS(s, cb), TU_NO_ATTRS);
    s = tu_node(g, variant == 1 ? KILN_OP_DIV : KILN_OP_MUL, TU_IDS(s, sc), TU_NO_ATTRS);
    if (variant != 4 && !no_bias) s = tu_node(g, KILN_OP_ADD, TU_IDS(s, cb), TU_NO_ATTRS);
    if (mask >= 0) s = tu_node(g, KILN_OP_ADD, TU_IDS(s, mask), TU_NO_ATTRS);
    if (variant == 0) s = tu_node(g, KILN_OP_CAST, TU_IDS(s), TU_ATTRS(TU_INTS("dtype", 1)));
    int32_t pr = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(s), TU_ATTRS(TU_INTS("dim", -1)));
    if (variant == 0) pr = tu_node(g, KILN_OP_CAST, TU_IDS(pr), TU_ATTRS(TU_INTS("dtype", 1)));
    y = tu_node(g, KILN_OP_MATMUL, TU_IDS(pr, qkv[2]), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", EB, EL, d)));
    tu_output(g, y, "y");
    if (variant == 2) tu_output(g, pr, "probs");
    kiln_build_options h0 = bt_opts(0, KILN_PRECISION_FP16, 0);
    kiln_build_options h1 = bt_opts(1, KILN_PRECISION_FP16, 0);
    if (bt_plan(g, &h1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_SDPA) == (uint32_t)want_sdpa, "%s: %u sdpa, want %d", what,
                  bt_count(&p, KILN_OP_SDPA), want_sdpa);
        CHECK_MSG(bt_count(&p, KILN_OP_SOFTMAX) == (uint32_t)!want_sdpa, "%s: %u softmax", what,
                  bt_count(&p, KILN_OP_SOFTMAX));
        if (want_sdpa) CHECK_EQ_INT(bt_count(&p, KILN_OP_MATMUL), 0);
        // the sdpa made from the eager form then merges its q, k and v projections
        if (want_sdpa)
            CHECK_MSG(bt_count(&p, KILN_OP_LINEAR) == 1, "%s: %u linears", what,
                      bt_count(&p, KILN_OP_LINEAR));
        kiln_plan_release(&p);
    }
    bt_shape sh[2] = {{3, {EB, EL, d}}, {4, {EB, 1, 1, EL}}};
    // against the same float16 engine without the rewrite, and the float32 one
    bt_compare(g, &h0, &h1, variant == 1 ? 2 : 1, sh, 0, 3e-3, 1e-2, what);
    bt_compare(g, &o0, &h1, variant == 1 ? 2 : 1, sh, 0, 1e-2, 3e-2, what);
    kiln_graph_free(g);
    for (int j = 0; j < 3; j++) free(w[j]);
    free(bias);
}

// BLOOM's eager attention: heads flattened into the batch for the matmuls ([B * H, L, E]),
// baddbmm's alibi [B * H, 1, L] added at that rank, the scores viewed as [B, H, L, L] for the
// mask [1, 1, L, L], and viewed back for the P V matmul. variant 0: taken as one sdpa (the early
// mask viewed as [B, H, 1, L]), checked against the float32 engine; 1: the probabilities read
// at [B, H, L, L] by the P V matmul (no view back) stay; 2: a float16 model, as BLOOM exports
// one: q and k cast to float32 for the matmul, the float32 alibi added, the scores cast back
// to float16 before the view and the float16 mask, the softmax in float32 between casts: taken
// (the alibi read in float16).
static void test_eager_batch_split(int variant, const char *what) {
    enum { NB = EB * 2 };
    float *w[3], *alibi = rnd(NB * EL), *mask = rnd(EL * EL), c = 0.125f;
    kiln_graph *g;
    kiln_plan p;
    int32_t qkv[3], lin;
    const int64_t shape[4] = {EB, EL, 2, EH};
    const int f16 = variant == 2;
    const kiln_dtype md = f16 ? KILN_DTYPE_F16 : KILN_DTYPE_F32; // the model's dtype
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", md, 3, TU_DIMS(EB, EL, ED), TU_DIMS(EB, EL, ED));
    for (int j = 0; j < 3; j++) {
        w[j] = tu_rand(ED * ED, -0.15f, 0.15f);
        int32_t cw = tu_const(g, NULL, md, 2, TU_DIMS(ED, ED), w[j]);
        qkv[j] = head_split(g, x, cw, -1, shape, &lin); // [B, H, L, E]
        if (variant == 1 && j == 2) continue;
        qkv[j] =
            tu_node(g, KILN_OP_RESHAPE, TU_IDS(qkv[j]), TU_ATTRS(TU_INTS("shape", NB, EL, EH)));
    }
    int32_t kt = tu_node(g, KILN_OP_PERMUTE, TU_IDS(qkv[1]), TU_ATTRS(TU_INTS("dims", 0, 2, 1)));
    int32_t qm = qkv[0];
    if (f16) { // baddbmm with a float32 alibi: its operands promoted
        qm = tu_node(g, KILN_OP_CAST, TU_IDS(qm), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
        kt = tu_node(g, KILN_OP_CAST, TU_IDS(kt), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    }
    int32_t sv = tu_node(g, KILN_OP_MATMUL, TU_IDS(qm, kt), TU_NO_ATTRS);
    int32_t sc = tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &c);
    sv = tu_node(g, KILN_OP_MUL, TU_IDS(sv, sc), TU_NO_ATTRS);
    int32_t al = tu_const(g, NULL, KILN_DTYPE_F32, 3, TU_DIMS(NB, 1, EL), alibi);
    sv = tu_node(g, KILN_OP_ADD, TU_IDS(al, sv), TU_NO_ATTRS);
    if (f16) sv = tu_node(g, KILN_OP_CAST, TU_IDS(sv), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F16)));
    sv = tu_node(g, KILN_OP_RESHAPE, TU_IDS(sv), TU_ATTRS(TU_INTS("shape", EB, 2, EL, EL)));
    int32_t cm = tu_const(g, NULL, md, 4, TU_DIMS(1, 1, EL, EL), mask);
    sv = tu_node(g, KILN_OP_ADD, TU_IDS(sv, cm), TU_NO_ATTRS);
    if (f16) sv = tu_node(g, KILN_OP_CAST, TU_IDS(sv), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
    int32_t pr = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(sv), TU_ATTRS(TU_INTS("dim", -1)));
    if (f16) pr = tu_node(g, KILN_OP_CAST, TU_IDS(pr), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F16)));
    int32_t y;
    if (variant == 1) {
        y = tu_node(g, KILN_OP_MATMUL, TU_IDS(pr, qkv[2]), TU_NO_ATTRS);
    } else {
        pr = tu_node(g, KILN_OP_RESHAPE, TU_IDS(pr), TU_ATTRS(TU_INTS("shape", NB, EL, EL)));
        y = tu_node(g, KILN_OP_MATMUL, TU_IDS(pr, qkv[2]), TU_NO_ATTRS);
        y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", EB, 2, EL, EH)));
    }
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", EB, EL, ED)));
    tu_output(g, y, "y");
    kiln_build_options h0 = bt_opts(0, KILN_PRECISION_FP16, 0);
    kiln_build_options h1 = bt_opts(1, KILN_PRECISION_FP16, 0);
    if (bt_plan(g, &h1, &p)) {
        const uint32_t want = variant != 1;
        CHECK_MSG(bt_count(&p, KILN_OP_SDPA) == want && bt_count(&p, KILN_OP_SOFTMAX) == !want,
                  "%s: %u sdpa, %u softmax", what, bt_count(&p, KILN_OP_SDPA),
                  bt_count(&p, KILN_OP_SOFTMAX));
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{3, {EB, EL, ED}}};
    bt_compare(g, &h0, &h1, 1, sh, 0, 3e-3, 1e-2, what);
    bt_compare(g, &o0, &h1, 1, sh, 0, 1e-2, 3e-2, what);
    kiln_graph_free(g);
    for (int j = 0; j < 3; j++) free(w[j]);
    free(alibi);
    free(mask);
}

// Windowed attention as torchvision's and HF's Swin write it: windows in the batch, x [N, L, D]
// with N = B * NW; the heads split; the scores [N, H, L, L] plus a constant relative-position
// bias [H, L, L]; viewed as [B, NW, H, L, L] for the shifted windows' mask [1, NW, 1, L, L] and
// back; softmax; P V. variant 0: q scaled before the matmul (torchvision's Swin); 1: the scores
// multiplied by a per-head constant [H, 1, 1] (Swin-V2's logit scale); 2: as 0 without the
// windows' view (Swin's unshifted blocks); 3 (B = 1): the scores multiplied by a constant per
// window, [NW, 1, 1, 1] (one value per batch index: it multiplies q too). Variants 0-2 with
// B = 1 (the view adds a leading 1: the mask drops it) and B = 2 (q, k, v viewed as [B, NW, ..]).
static void test_eager_windows(int variant, int64_t nb, const char *what) {
    enum { NW = 3, WH = 2, WE = 32, WL = 5, WD = WH * WE };
    const int64_t n = nb * NW;
    float *w[3], *bias = rnd(WH * WL * WL), *mask = rnd(NW * WL * WL), c = 0.17f;
    float hs[NW > WH ? NW : WH];
    for (int i = 0; i < (NW > WH ? NW : WH); i++) hs[i] = 0.5f + 0.25f * (float)i;
    kiln_graph *g;
    kiln_plan p;
    int32_t qkv[3], lin;
    const int64_t shape[4] = {n, WL, WH, WE};
    char msg[160];
    snprintf(msg, sizeof msg, "%s (batch %lld)", what, (long long)nb);
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", KILN_DTYPE_F32, 3, TU_DIMS(n, WL, WD), TU_DIMS(n, WL, WD));
    for (int j = 0; j < 3; j++) {
        w[j] = tu_rand(WD * WD, -0.15f, 0.15f);
        int32_t cw = tu_const(g, NULL, KILN_DTYPE_F32, 2, TU_DIMS(WD, WD), w[j]);
        qkv[j] = head_split(g, x, cw, -1, shape, &lin); // [N, WH, WL, WE]
    }
    int32_t q = qkv[0];
    if (variant == 0 || variant == 2) {
        int32_t sc = tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &c);
        q = tu_node(g, KILN_OP_MUL, TU_IDS(q, sc), TU_NO_ATTRS);
    }
    int32_t kt = tu_node(g, KILN_OP_PERMUTE, TU_IDS(qkv[1]), TU_ATTRS(TU_INTS("dims", 0, 1, 3, 2)));
    int32_t sv = tu_node(g, KILN_OP_MATMUL, TU_IDS(q, kt), TU_NO_ATTRS);
    if (variant == 1) {
        int32_t ls = tu_const(g, NULL, KILN_DTYPE_F32, 3, TU_DIMS(WH, 1, 1), hs);
        sv = tu_node(g, KILN_OP_MUL, TU_IDS(sv, ls), TU_NO_ATTRS);
    } else if (variant == 3) {
        int32_t ls = tu_const(g, NULL, KILN_DTYPE_F32, 4, TU_DIMS(NW, 1, 1, 1), hs);
        sv = tu_node(g, KILN_OP_MUL, TU_IDS(ls, sv), TU_NO_ATTRS);
    }
    int32_t cb = tu_const(g, NULL, KILN_DTYPE_F32, 3, TU_DIMS(WH, WL, WL), bias);
    sv = tu_node(g, KILN_OP_ADD, TU_IDS(sv, cb), TU_NO_ATTRS);
    if (variant != 2) {
        sv =
            tu_node(g, KILN_OP_RESHAPE, TU_IDS(sv), TU_ATTRS(TU_INTS("shape", nb, NW, WH, WL, WL)));
        int32_t cm = tu_const(g, NULL, KILN_DTYPE_F32, 5, TU_DIMS(1, NW, 1, WL, WL), mask);
        sv = tu_node(g, KILN_OP_ADD, TU_IDS(sv, cm), TU_NO_ATTRS);
        sv = tu_node(g, KILN_OP_RESHAPE, TU_IDS(sv), TU_ATTRS(TU_INTS("shape", n, WH, WL, WL)));
    }
    int32_t pr = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(sv), TU_ATTRS(TU_INTS("dim", -1)));
    int32_t y = tu_node(g, KILN_OP_MATMUL, TU_IDS(pr, qkv[2]), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_PERMUTE, TU_IDS(y), TU_ATTRS(TU_INTS("dims", 0, 2, 1, 3)));
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", n, WL, WD)));
    tu_output(g, y, "y");
    kiln_build_options h0 = bt_opts(0, KILN_PRECISION_FP16, 0);
    kiln_build_options h1 = bt_opts(1, KILN_PRECISION_FP16, 0);
    if (bt_plan(g, &h1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_SDPA) == 1 && bt_count(&p, KILN_OP_SOFTMAX) == 0 &&
                      bt_count(&p, KILN_OP_MATMUL) == 0,
                  "%s: %u sdpa, %u softmax, %u matmul", msg, bt_count(&p, KILN_OP_SDPA),
                  bt_count(&p, KILN_OP_SOFTMAX), bt_count(&p, KILN_OP_MATMUL));
        // the scalar scale is the sdpa's (no multiply left); a per-head one multiplies q
        const uint32_t want_mul = variant == 1 || variant == 3;
        CHECK_MSG(bt_count(&p, KILN_OP_MUL) == want_mul, "%s: %u mul, want %u", msg,
                  bt_count(&p, KILN_OP_MUL), want_mul);
        kiln_plan_release(&p);
    }
    bt_shape sh[1] = {{3, {n, WL, WD, 0, 0, 0, 0, 0}}};
    bt_compare(g, &h0, &h1, 1, sh, 0, 3e-3, 1e-2, msg);
    bt_compare(g, &o0, &h1, 1, sh, 0, 1e-2, 3e-2, msg);
    kiln_graph_free(g);
    for (int j = 0; j < 3; j++) free(w[j]);
    free(bias);
    free(mask);
}

// torch.einsum attention as torchvision's MaxViT writes it and torch's export decomposes it:
// q, k, v [B, G, H, L, E] (windows or grid cells G, heads H); k * scale; "B G H I D, B G H J D
// -> B G H I J" as unsqueezes, permutes of size-1 and other dims, clones and reshapes around a
// batched matmul over [B * G * H, ..]; the scores viewed back to [B, G, H, L, L] plus a constant
// relative-position bias [1, H, L, L]; softmax; "B G H I J, B G H J D -> B G H I D" the same way.
// variant 0: as MaxViT; 1: without k's scale (the sdpa's scale 1); 2 (negative): the
// probabilities also an output. B = 1 (MaxViT's export: the size-1 dims moved last, clones) and
// B = 2 (the batch dims in front), each as torch's export writes it.
static void test_eager_einsum(int variant, int64_t nb, const char *what) {
    enum { XG = 3, XH = 2, XE = 32, XL = 5 };
    const int64_t n = nb * XG * XH;
    float *bias = rnd(XH * XL * XL), c = 0.1767767f;
    kiln_graph *g;
    kiln_plan p;
    char msg[160];
    snprintf(msg, sizeof msg, "%s (batch %lld)", what, (long long)nb);
    CHECK_OK(kiln_graph_new(&g));
    int32_t in[3];
    for (int j = 0; j < 3; j++) {
        const char *names[3] = {"q", "k", "v"};
        in[j] = tu_input(g, names[j], KILN_DTYPE_F32, 5, TU_DIMS(nb, XG, XH, XL, XE),
                         TU_DIMS(nb, XG, XH, XL, XE));
    }
    int32_t k = in[1];
    if (variant != 1) {
        int32_t sc = tu_const(g, NULL, KILN_DTYPE_F32, 0, TU_DIMS(0), &c);
        k = tu_node(g, KILN_OP_MUL, TU_IDS(k, sc), TU_NO_ATTRS);
    }
    // torch's export of the einsums: with B = 1 (MaxViT's) the size-1 dims move to the end
    // and each operand is cloned before its view; with B > 1 the batch dims stay in front
    const int one = nb == 1;
    // q: unsqueeze(5), permute(0 1 2 3 5 4), then permute(1 2 3 5 0 4) and a clone (B = 1) or
    // permute(0 1 2 3 5 4); view [N, L, E]
    int32_t q = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(in[0]), TU_ATTRS(TU_INTS("dim", 5)));
    q = tu_node(g, KILN_OP_PERMUTE, TU_IDS(q), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 3, 5, 4)));
    if (one) {
        q = tu_node(g, KILN_OP_PERMUTE, TU_IDS(q), TU_ATTRS(TU_INTS("dims", 1, 2, 3, 5, 0, 4)));
        q = tu_node(g, KILN_OP_COPY, TU_IDS(q), TU_NO_ATTRS);
    } else {
        q = tu_node(g, KILN_OP_PERMUTE, TU_IDS(q), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 3, 5, 4)));
    }
    q = tu_node(g, KILN_OP_RESHAPE, TU_IDS(q), TU_ATTRS(TU_INTS("shape", n, XL, XE)));
    // k: unsqueeze(5), permute(0 1 2 5 3 4), then permute(1 2 5 0 4 3) and a clone or
    // permute(0 1 2 5 4 3); view [N, E, L]
    k = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(k), TU_ATTRS(TU_INTS("dim", 5)));
    k = tu_node(g, KILN_OP_PERMUTE, TU_IDS(k), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 5, 3, 4)));
    if (one) {
        k = tu_node(g, KILN_OP_PERMUTE, TU_IDS(k), TU_ATTRS(TU_INTS("dims", 1, 2, 5, 0, 4, 3)));
        k = tu_node(g, KILN_OP_COPY, TU_IDS(k), TU_NO_ATTRS);
    } else {
        k = tu_node(g, KILN_OP_PERMUTE, TU_IDS(k), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 5, 4, 3)));
    }
    k = tu_node(g, KILN_OP_RESHAPE, TU_IDS(k), TU_ATTRS(TU_INTS("shape", n, XE, XL)));
    int32_t sv = tu_node(g, KILN_OP_MATMUL, TU_IDS(q, k), TU_NO_ATTRS);
    // the scores back to [B, G, H, L, L]: view [G, H, L, 1, 1, L], permute(4 0 1 2 5 3) (B = 1)
    // or view [B, G, H, L, 1, L], permute(0 1 2 3 5 4); view
    if (one) {
        sv = tu_node(g, KILN_OP_RESHAPE, TU_IDS(sv),
                     TU_ATTRS(TU_INTS("shape", XG, XH, XL, 1, 1, XL)));
        sv = tu_node(g, KILN_OP_PERMUTE, TU_IDS(sv), TU_ATTRS(TU_INTS("dims", 4, 0, 1, 2, 5, 3)));
    } else {
        sv = tu_node(g, KILN_OP_RESHAPE, TU_IDS(sv),
                     TU_ATTRS(TU_INTS("shape", nb, XG, XH, XL, 1, XL)));
        sv = tu_node(g, KILN_OP_PERMUTE, TU_IDS(sv), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 3, 5, 4)));
    }
    sv = tu_node(g, KILN_OP_RESHAPE, TU_IDS(sv), TU_ATTRS(TU_INTS("shape", nb, XG, XH, XL, XL)));
    int32_t cb = tu_const(g, NULL, KILN_DTYPE_F32, 4, TU_DIMS(1, XH, XL, XL), bias);
    sv = tu_node(g, KILN_OP_ADD, TU_IDS(sv, cb), TU_NO_ATTRS);
    int32_t pr = tu_node(g, KILN_OP_SOFTMAX, TU_IDS(sv), TU_ATTRS(TU_INTS("dim", -1)));
    if (variant == 2) tu_output(g, pr, "p");
    // P: unsqueeze(5), permute(0 1 2 3 5 4), permute(1 2 3 5 0 4) or (0 1 2 3 5 4); view [N, L, L]
    int32_t pm = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(pr), TU_ATTRS(TU_INTS("dim", 5)));
    pm = tu_node(g, KILN_OP_PERMUTE, TU_IDS(pm), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 3, 5, 4)));
    pm = one ? tu_node(g, KILN_OP_PERMUTE, TU_IDS(pm), TU_ATTRS(TU_INTS("dims", 1, 2, 3, 5, 0, 4)))
             : tu_node(g, KILN_OP_PERMUTE, TU_IDS(pm), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 3, 5, 4)));
    pm = tu_node(g, KILN_OP_RESHAPE, TU_IDS(pm), TU_ATTRS(TU_INTS("shape", n, XL, XL)));
    // v: unsqueeze(5), permute(0 1 2 5 4 3), then permute(1 2 5 0 4 3) and a clone or
    // permute(0 1 2 5 4 3); view [N, L, E]
    int32_t v = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(in[2]), TU_ATTRS(TU_INTS("dim", 5)));
    v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 5, 4, 3)));
    if (one) {
        v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 1, 2, 5, 0, 4, 3)));
        v = tu_node(g, KILN_OP_COPY, TU_IDS(v), TU_NO_ATTRS);
    } else {
        v = tu_node(g, KILN_OP_PERMUTE, TU_IDS(v), TU_ATTRS(TU_INTS("dims", 0, 1, 2, 5, 4, 3)));
    }
    v = tu_node(g, KILN_OP_RESHAPE, TU_IDS(v), TU_ATTRS(TU_INTS("shape", n, XL, XE)));
    int32_t y = tu_node(g, KILN_OP_MATMUL, TU_IDS(pm, v), TU_NO_ATTRS);
    y = tu_node(g, KILN_OP_RESHAPE, TU_IDS(y), TU_ATTRS(TU_INTS("shape", nb, XG, XH, XL, XE)));
    tu_output(g, y, "y");
    kiln_build_options h0 = bt_opts(0, KILN_PRECISION_FP16, 0);
    kiln_build_options h1 = bt_opts(1, KILN_PRECISION_FP16, 0);
    const uint32_t want = variant != 2;
    if (bt_plan(g, &h1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_SDPA) == want && bt_count(&p, KILN_OP_SOFTMAX) == !want &&
                      bt_count(&p, KILN_OP_MATMUL) == 2 * !want &&
                      bt_count(&p, KILN_OP_MUL) == (uint32_t)(!want && variant != 1),
                  "%s: %u sdpa, %u softmax, %u matmul, %u mul", msg, bt_count(&p, KILN_OP_SDPA),
                  bt_count(&p, KILN_OP_SOFTMAX), bt_count(&p, KILN_OP_MATMUL),
                  bt_count(&p, KILN_OP_MUL));
        // q, k and v read as the inputs themselves: no view left but the output's copy
        if (want) BT_EXPECT_LAYERS(&p, "cast|cast|cast|sdpa|reshape|cast");
        kiln_plan_release(&p);
    }
    bt_shape sh[3];
    for (int j = 0; j < 3; j++) {
        memset(&sh[j], 0, sizeof sh[j]);
        sh[j].rank = 5;
        const int64_t d5[5] = {nb, XG, XH, XL, XE};
        memcpy(sh[j].dims, d5, sizeof d5);
    }
    bt_compare(g, &h0, &h1, 3, sh, 0, 3e-3, 1e-2, msg);
    bt_compare(g, &o0, &h1, 3, sh, 0, 1e-2, 3e-2, msg);
    kiln_graph_free(g);
    free(bias);
}

int main(void) {
    kiln_log_set(tu_log_quiet, NULL, KILN_LOG_ERROR);
    o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    test_bert(0, 1, 3, "BERT q/k/v merged");
    test_bert(1, 2, 0, "k projection read twice: q and v merged as head projections");
    test_bert(2, 2, 0, "v from another input: q and k merged as head projections");
    test_bert(3, 1, 3, "no biases, dynamic shapes");
    test_bert(4, 1, 3, "no bias on k: a row of zeros");
    test_bert(5, 1, 3, "a bias on q only");
    test_head_projections(0, 1, 3, "head projections: q, k, v of grouped-query widths, biases");
    test_head_projections(1, 1, 3, "head projections: a bias on k only");
    test_head_projections(2, 2, 3, "head projections: no biases, a fourth read elsewhere");
    test_head_projections(3, 2, 2, "head projections: v of another head size stays apart");
    test_head_projections(4, 3, 0, "head projections: dynamic batch, none merged");
    test_cross_attention_layers(5, 5 + 1, "head projections: 5 layers' cross-attention k, v");
    test_cross_attention_layers(40, 40 + 2, "head projections: 40 layers' cross-attention k, v");
    test_single_kv_head(0, 1, "head projections: a single kv head's transposed split joins");
    test_single_kv_head(1, 3, "head projections: no head split among them, none merged");
    test_packed_unbind();
    test_not_select();
    // decode-length q: the rows form (the mask's rows repeated: one expand)
    test_gqa(GQ_BOOL, 0, 3, 0, 1, 4, 0, "GQA rows, bool mask [L, S]");
    test_gqa(GQ_FLOAT, 0, 3, 0, 1, 4, 0, "GQA rows, float mask [1, 1, L, S]");
    test_gqa(GQ_NONE, 0, 3, 0, 0, 4, 0, "GQA rows, no mask");
    test_gqa(GQ_NONE, 0, 3, 1, 0, 4, 0, "GQA rows, head merge after");
    // longer or causal q: the broadcast form (k, v as [1, G, 1, S, E]: no expand at all)
    test_gqa(GQ_NONE, 1, 3, 0, 0, 5, 1, "GQA broadcast, is_causal");
    test_gqa(GQ_BOOL, 0, 20, 0, 0, 5, 0, "GQA broadcast, bool mask [L, S]");
    test_gqa(GQ_FLOAT, 0, 20, 1, 0, 5, 0, "GQA broadcast, float mask, head merge after");
    test_gqa(GQ_TRIL, 0, 20, 1, 0, 5, 1, "GQA broadcast, constant causal mask");
    test_gqa(GQ_NONE, 1, 20, 1, 0, 5, 1, "GQA broadcast, is_causal, head merge after");
    test_mqa(1, 20, 5);
    test_mqa(0, 3, 4);
    test_gpt2(G_BOOL, 0, 1, "GPT-2 split, bool causal mask");
    test_gpt2(G_NEG_INF, 0, 1, "GPT-2 split, -inf causal mask");
    test_gpt2(G_FINFO_MIN, 0, 1, "GPT-2 split, finfo.min causal mask");
    test_gpt2(G_NOT_TRIL, 0, 0, "GPT-2 split, a mask that is not causal");
    test_gpt2(G_SHIFTED, 1, 1, "GPT-2 slices off the head boundaries");
    test_gpt2(G_DYN_BATCH, 0, 1, "GPT-2 split, dynamic batch");
    test_eager(0, 1, "eager attention: scale, bias, softmax in float32");
    test_eager(1, 1, "eager attention: divide, bias and an input mask");
    test_eager(2, 0, "eager attention: probabilities also an output");
    test_eager(3, 0, "eager attention: heads of 8");
    test_eager(5, 1, "eager attention: heads of 32 without a mask (cuDNN's geometry)");
    test_eager(6, 1, "eager attention: heads of 32 with a bias (the tensor-core kernels')");
    test_eager(8, 0, "eager attention: heads of 16 with a bias");
    test_eager(7, 0, "eager attention: heads of 12 without a mask");
    for (int64_t nb = 1; nb <= 2; nb++) {
        test_eager_windows(0, nb, "windowed attention, q scaled, the shifted windows' mask");
        test_eager_windows(1, nb, "windowed attention, a per-head logit scale, the mask");
        test_eager_windows(2, nb, "windowed attention, q scaled, no windows' view");
    }
    test_eager_windows(3, 1, "windowed attention, a per-window scale");
    for (int64_t nb = 1; nb <= 2; nb++) {
        test_eager_einsum(0, nb, "einsum attention, k scaled (MaxViT)");
        test_eager_einsum(1, nb, "einsum attention, no scale");
        test_eager_einsum(2, nb, "einsum attention, probabilities also an output");
    }
    test_eager_batch_split(0, "eager attention over heads flattened into the batch (BLOOM)");
    test_eager_batch_split(1, "eager attention, the probabilities read at [B, H, L, L]");
    test_eager_batch_split(2, "eager attention of a float16 BLOOM: float32 scores between casts");
    test_eager(4, 0, "eager attention: bias before the scale");
    return check_summary();
}
