// SPDX-License-Identifier: Apache-2.0
// Small graphs described through the public graph API and built with kiln_build, for the format
// tests (round trip, malformed battery) and the corpus generator: an MLP (fusable linear + relu,
// a broadcast add, softmax), a dynamic-size conv net (conv, batch norm, relu, pooling, reshape),
// an attention block (layer norm, linears, permutes, sdpa) and an embedding lookup. Each can be
// built in fp32/fp16 and with external weights.
#ifndef KILN_TESTS_FORMAT_BUILT_H
#define KILN_TESTS_FORMAT_BUILT_H

#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define FB_TRY(expr)                                                                               \
    do {                                                                                           \
        kiln_status fb_st_ = (expr);                                                               \
        if (fb_st_ != KILN_OK) return fb_st_;                                                      \
    } while (0)

static inline kiln_status fb_const(kiln_graph *g, const char *name, uint32_t rank,
                                   const int64_t *dims, uint32_t salt, int32_t *out) {
    size_t n = 1;
    for (uint32_t i = 0; i < rank; i++) n *= (size_t)dims[i];
    float *d = malloc(n * sizeof *d + 1);
    for (size_t i = 0; i < n; i++) d[i] = 0.05f * (float)((i * 13 + salt * 7) % 17) - 0.4f;
    kiln_status st =
        kiln_graph_add_constant(g, name, KILN_DTYPE_F32, rank, dims, d, n * sizeof *d, out);
    free(d);
    return st;
}

static inline kiln_status fb_node(kiln_graph *g, uint32_t op, const int32_t *in, uint32_t n_in,
                                  const kiln_attr *attrs, uint32_t n_attrs, int32_t *out) {
    return kiln_graph_add_node(g, op, in, n_in, attrs, n_attrs, out, 1);
}

// x[1..8, 16] -> linear(32) -> relu -> linear(8) -> + c[8] -> softmax(-1) -> y
static inline kiln_status fb_mlp(kiln_graph *g) {
    int64_t mn[] = {1, 16}, mx[] = {8, 16}, w1d[] = {32, 16}, b1d[] = {32}, w2d[] = {8, 32},
            cd[] = {8};
    int32_t x, w1, b1, w2, c, h, y;
    FB_TRY(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, mn, mx, &x));
    FB_TRY(fb_const(g, "fc1.weight", 2, w1d, 1, &w1));
    FB_TRY(fb_const(g, "fc1.bias", 1, b1d, 2, &b1));
    FB_TRY(fb_const(g, "fc2.weight", 2, w2d, 3, &w2));
    FB_TRY(fb_const(g, "shift", 1, cd, 4, &c));
    int32_t i0[] = {x, w1, b1};
    FB_TRY(fb_node(g, KILN_OP_LINEAR, i0, 3, NULL, 0, &h));
    FB_TRY(fb_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &h));
    int32_t i2[] = {h, w2, -1};
    FB_TRY(fb_node(g, KILN_OP_LINEAR, i2, 3, NULL, 0, &h));
    int32_t i3[] = {h, c};
    FB_TRY(fb_node(g, KILN_OP_ADD, i3, 2, NULL, 0, &h));
    int64_t dim = -1;
    kiln_attr a = {.name = "dim", .ints = &dim, .n = 1};
    FB_TRY(fb_node(g, KILN_OP_SOFTMAX, &h, 1, &a, 1, &y));
    return kiln_graph_mark_output(g, y, "probs");
}

// x[1..2, 3, 8..16, 8..16] -> conv(8, 3x3, pad 1) -> batch_norm -> relu -> max_pool(2)
// -> adaptive_avg_pool(1) -> reshape([n, 8]) -> y; also a second output: the relu map.
static inline kiln_status fb_conv(kiln_graph *g) {
    int64_t mn[] = {1, 3, 8, 8}, mx[] = {2, 3, 16, 16}, wd[] = {8, 3, 3, 3}, cd[] = {8};
    int32_t x, w, bias, gamma, beta, mean, var, h, r, y;
    FB_TRY(kiln_graph_add_input(g, "image", KILN_DTYPE_F32, 4, mn, mx, &x));
    FB_TRY(fb_const(g, "conv.weight", 4, wd, 5, &w));
    FB_TRY(fb_const(g, "conv.bias", 1, cd, 6, &bias));
    FB_TRY(fb_const(g, "bn.weight", 1, cd, 7, &gamma));
    FB_TRY(fb_const(g, "bn.bias", 1, cd, 8, &beta));
    FB_TRY(fb_const(g, "bn.mean", 1, cd, 9, &mean));
    float ones[8] = {1, 1.5f, 2, 0.5f, 1, 1, 3, 0.25f};
    FB_TRY(kiln_graph_add_constant(g, "bn.var", KILN_DTYPE_F32, 1, cd, ones, sizeof ones, &var));
    int64_t one2[] = {1, 1}, two2[] = {2, 2};
    kiln_attr ca[] = {{.name = "padding", .ints = one2, .n = 2}};
    int32_t i0[] = {x, w, bias};
    FB_TRY(fb_node(g, KILN_OP_CONV2D, i0, 3, ca, 1, &h));
    int32_t i1[] = {h, gamma, beta, mean, var};
    FB_TRY(fb_node(g, KILN_OP_BATCH_NORM, i1, 5, NULL, 0, &h));
    FB_TRY(fb_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &r));
    kiln_attr pa[] = {{.name = "kernel", .ints = two2, .n = 2},
                      {.name = "stride", .ints = two2, .n = 2}};
    FB_TRY(fb_node(g, KILN_OP_MAX_POOL2D, &r, 1, pa, 2, &h));
    kiln_attr aa[] = {{.name = "output_size", .ints = one2, .n = 2}};
    FB_TRY(fb_node(g, KILN_OP_ADAPTIVE_AVG_POOL2D, &h, 1, aa, 1, &h));
    int64_t shape[] = {-2, 8};
    kiln_attr ra[] = {{.name = "shape", .ints = shape, .n = 2}};
    FB_TRY(fb_node(g, KILN_OP_RESHAPE, &h, 1, ra, 1, &y));
    FB_TRY(kiln_graph_mark_output(g, y, "features"));
    return kiln_graph_mark_output(g, r, "activation_map");
}

// x[1, 2..8, 16] -> layer_norm -> q, k, v linears -> sdpa(causal) -> linear -> y
static inline kiln_status fb_attention(kiln_graph *g) {
    int64_t mn[] = {1, 2, 16}, mx[] = {1, 8, 16}, wd[] = {16, 16}, nd[] = {16};
    int32_t x, lw, lb, wq, wk, wv, wo, h, q, k, v, a, y;
    FB_TRY(kiln_graph_add_input(g, "tokens", KILN_DTYPE_F32, 3, mn, mx, &x));
    FB_TRY(fb_const(g, "ln.weight", 1, nd, 10, &lw));
    FB_TRY(fb_const(g, "ln.bias", 1, nd, 11, &lb));
    FB_TRY(fb_const(g, "wq", 2, wd, 12, &wq));
    FB_TRY(fb_const(g, "wk", 2, wd, 13, &wk));
    FB_TRY(fb_const(g, "wv", 2, wd, 14, &wv));
    FB_TRY(fb_const(g, "wo", 2, wd, 15, &wo));
    int64_t one = 1, causal = 1;
    kiln_attr la[] = {{.name = "normalized_ndim", .ints = &one, .n = 1}};
    int32_t i0[] = {x, lw, lb};
    FB_TRY(fb_node(g, KILN_OP_LAYER_NORM, i0, 3, la, 1, &h));
    int32_t iq[] = {h, wq}, ik[] = {h, wk}, iv[] = {h, wv};
    FB_TRY(fb_node(g, KILN_OP_LINEAR, iq, 2, NULL, 0, &q));
    FB_TRY(fb_node(g, KILN_OP_LINEAR, ik, 2, NULL, 0, &k));
    FB_TRY(fb_node(g, KILN_OP_LINEAR, iv, 2, NULL, 0, &v));
    kiln_attr sa[] = {{.name = "is_causal", .ints = &causal, .n = 1}};
    int32_t is[] = {q, k, v};
    FB_TRY(fb_node(g, KILN_OP_SDPA, is, 3, sa, 1, &a));
    int32_t io[] = {a, wo};
    FB_TRY(fb_node(g, KILN_OP_LINEAR, io, 2, NULL, 0, &y));
    FB_TRY(fb_node(g, KILN_OP_GELU, &y, 1, NULL, 0, &y));
    return kiln_graph_mark_output(g, y, "hidden");
}

// ids[1..4] (int64) -> embedding(table[10, 6]) -> mean(dim 0, keepdim) -> y
static inline kiln_status fb_embedding(kiln_graph *g) {
    int64_t mn[] = {1}, mx[] = {4}, td[] = {10, 6};
    int32_t ids, table, e, y;
    FB_TRY(kiln_graph_add_input(g, "ids", KILN_DTYPE_I64, 1, mn, mx, &ids));
    FB_TRY(fb_const(g, "table", 2, td, 16, &table));
    int32_t i0[] = {table, ids};
    FB_TRY(fb_node(g, KILN_OP_EMBEDDING, i0, 2, NULL, 0, &e));
    int64_t dims = 0, keep = 1;
    kiln_attr ma[] = {{.name = "dims", .ints = &dims, .n = 1},
                      {.name = "keepdim", .ints = &keep, .n = 1}};
    FB_TRY(fb_node(g, KILN_OP_MEAN, &e, 1, ma, 2, &y));
    return kiln_graph_mark_output(g, y, "pooled");
}

#define FB_N_GRAPHS 4
#define FB_N_VARIANTS 3 // fp32, fp16, fp32 + external weights

static inline const char *fb_name(int i) {
    static const char *const names[] = {"api-mlp", "api-conv", "api-attention", "api-embedding"};
    return names[i];
}
static inline const char *fb_variant(int v) {
    static const char *const names[] = {"fp32", "fp16", "external"};
    return names[v];
}

// Describes graph i into a new graph (caller frees).
static inline kiln_status fb_graph(int i, kiln_graph **out) {
    kiln_graph *g;
    FB_TRY(kiln_graph_new(&g));
    kiln_status st = i == 0   ? fb_mlp(g)
                     : i == 1 ? fb_conv(g)
                     : i == 2 ? fb_attention(g)
                              : fb_embedding(g);
    if (st != KILN_OK) {
        kiln_graph_free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

static inline void fb_options(int variant, kiln_build_options *o) {
    kiln_build_options_init(o);
    if (variant == 1) o->precision = KILN_PRECISION_FP16;
    if (variant == 2) o->external_weights = 1;
}

// Builds graph i in a variant (caller frees *out with kiln_built_free).
static inline kiln_status fb_build(int i, int variant, kiln_built **out) {
    kiln_graph *g;
    FB_TRY(fb_graph(i, &g));
    kiln_build_options o;
    fb_options(variant, &o);
    kiln_status st = kiln_build(g, &o, out);
    kiln_graph_free(g);
    return st;
}

#endif // KILN_TESTS_FORMAT_BUILT_H
