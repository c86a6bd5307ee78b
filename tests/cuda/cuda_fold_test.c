// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's attention view folding (src/cuda/cuda_fold.c, included here: plain C) on
// the CPU: built transformer layers (packed QKV as the benchmark builds it, separate q/k/v
// projections as exported BERT is), which layers run no kernel, and the strided views sdpa
// reads and writes through, element by element against the head split/merge written out by
// hand ([B, S, H, E] memory read as [B, H, S, E]).
// With engine files as arguments (`cuda_fold_test ENGINE...`, the Kiln engine bytes of a
// delegate, as bench/zoo_delegation.py --cuda-plan passes them) it runs no test: it plans each
// engine's layout and folds as the CUDA backend would at load and prints what the backend would
// launch (layers that run a kernel, layout copies, permutes that run, depthwise/grouped convs in
// NHWC); `cuda_fold_test --layers ENGINE...` first lists each head layer (its op, fused tail,
// whether it runs a kernel, whether it runs NHWC, and how many of its inputs it reads through a
// layout copy made for it).
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "cuda/cuda_fold.h"
#include "cuda/cuda_layout.h"
#include "kiln/kiln.h"
#include "runtime/load.h"
#include "runtime/plan_group.h"

// The plugin's helpers, on libkiln's allocator.
void *kiln_cuda_calloc(size_t nbytes) { return kiln_calloc(nbytes, 16); }
void kiln_cuda_free(void *ptr, size_t nbytes) { kiln_free(ptr, nbytes); }
kiln_status kiln_cuda_fail(kiln_status status, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_fail(status, "%s", msg);
}

#include "../../src/cuda/cuda_fold.c"
#include "../../src/cuda/cuda_layout.c"

#define B 2
#define S 5
#define H 2
#define E 8
#define D (H * E)

static float wbuf[128 * 64]; // the largest constant (gemv_case)

static int32_t constant(kiln_graph *g, uint32_t rank, const int64_t *dims) {
    int64_t n = 1;
    int32_t v = -1;
    for (uint32_t i = 0; i < rank; i++) n *= dims[i];
    CHECK(n <= (int64_t)(sizeof wbuf / sizeof wbuf[0]));
    if (n > (int64_t)(sizeof wbuf / sizeof wbuf[0])) return -1;
    for (int64_t i = 0; i < n; i++) wbuf[i] = (float)check_rng_uniform(-0.2, 0.2);
    CHECK(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, rank, dims, wbuf,
                                  (size_t)n * sizeof(float), &v) == KILN_OK);
    return v;
}

static int32_t node(kiln_graph *g, uint32_t op, const int32_t *ins, uint32_t n, const kiln_attr *a,
                    uint32_t na) {
    int32_t v = -1;
    CHECK(kiln_graph_add_node(g, op, ins, n, a, na, &v, 1) == KILN_OK);
    return v;
}

static int32_t linear(kiln_graph *g, int32_t x, int64_t in, int64_t out) {
    int64_t wd[2] = {out, in}, bd[1] = {out};
    int32_t ins[3] = {x, constant(g, 2, wd), constant(g, 1, bd)};
    return node(g, KILN_OP_LINEAR, ins, 3, NULL, 0);
}

static int32_t permute(kiln_graph *g, int32_t x, const int64_t *dims, uint32_t n) {
    kiln_attr a = {"dims", dims, NULL, n};
    return node(g, KILN_OP_PERMUTE, &x, 1, &a, 1);
}

static int32_t reshape(kiln_graph *g, int32_t x, const int64_t *shape, uint32_t n) {
    kiln_attr a = {"shape", shape, NULL, n};
    return node(g, KILN_OP_RESHAPE, &x, 1, &a, 1);
}

static int load(kiln_graph *g, kiln_plan *plan) {
    kiln_build_options o;
    kiln_built *b = NULL;
    const void *bytes;
    size_t n;
    kiln_build_options_init(&o);
    o.precision = KILN_PRECISION_FP16;
    int ok = kiln_build(g, &o, &b) == KILN_OK && kiln_built_engine(b, &bytes, &n) == KILN_OK &&
             kiln_load_plan(bytes, n, plan) == KILN_OK;
    if (!ok) fprintf(stderr, "build/load failed: %s\n", kiln_last_error());
    kiln_built_free(b);
    kiln_graph_free(g);
    return ok;
}

static uint32_t find_head(const kiln_plan *p, uint32_t op, uint32_t from) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if (li >= from && p->layers[li].op == op) return li;
    }
    return UINT32_MAX;
}

static uint32_t count_virtual(const kiln_plan *p, const kiln_cuda_fold *f, uint32_t op) {
    uint32_t n = 0;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        n += (f->virt[li] & KILN_CUDA_FOLD_VIRTUAL) && p->layers[li].op == op;
    }
    return n;
}

// Host "device" memory: one buffer per tensor (the views' data), so a view's element offset is
// checked against the base tensor's layout written out by hand.
static uint16_t *mem[64];

static void bind_views(const kiln_plan *p, kiln_tensor *views) {
    CHECK(p->n_tensors <= 64);
    for (uint32_t i = 0; i < p->n_tensors && i < 64; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        int64_t n = 1;
        views[i].dtype = t->dtype;
        views[i].rank = t->shape.rank;
        memcpy(views[i].dims, t->shape.max, sizeof views[i].dims);
        for (uint32_t d = 0; d < t->shape.rank; d++) n *= t->shape.max[d];
        mem[i] = kiln_calloc((size_t)(n > 0 ? n : 1), sizeof(uint16_t));
        views[i].data = mem[i];
    }
}

static void unbind(const kiln_plan *p, kiln_tensor *views) {
    for (uint32_t i = 0; i < p->n_tensors && i < 64; i++) {
        int64_t n = 1;
        for (uint32_t d = 0; d < views[i].rank; d++) n *= p->tensors[i].shape.max[d];
        kiln_free(mem[i], (size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
        mem[i] = NULL;
    }
}

// Element offset of view element [b, h, s, e] relative to tensor `base`.
static int64_t at(const kiln_cuda_strided *v, int32_t base, int64_t b, int64_t h, int64_t s,
                  int64_t e) {
    int64_t o = b * v->str[0] + h * v->str[1] + s * v->str[2] + e * v->str[3];
    return ((const uint16_t *)v->data - mem[base]) + o;
}

// Checks sdpa li's q/k/v views against bases[j] read as [B, S, width] with head h of operand j
// at column col0[j] + h * E; and its output view against W [B, L, H, E] when redirected.
static void check_views(const kiln_plan *p, const kiln_cuda_fold *f, kiln_tensor *views,
                        uint32_t li, const int32_t *bases, const int64_t *col0, int64_t width) {
    int bad = 0;
    for (uint32_t j = 0; j < 3; j++) {
        kiln_cuda_strided v;
        if (!(f->sdpa_in[li] & (1u << j))) continue;
        kiln_cuda_fold_view(p, f, views, p->ids[p->layers[li].input_begin + j], &v);
        CHECK(v.rank == 4 && v.dims[0] == B && v.dims[1] == H && v.dims[2] == S && v.dims[3] == E);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t s = 0; s < S; s++)
                    for (int64_t e = 0; e < E; e++) {
                        int64_t want = (b * S + s) * width + col0[j] + h * E + e;
                        bad += at(&v, bases[j], b, h, s, e) != want;
                    }
    }
    if (f->sdpa_out[li] >= 0) {
        kiln_cuda_strided v;
        int32_t w = f->sdpa_dst[li];
        kiln_cuda_fold_out_view(p, f, views, li, &v);
        CHECK(v.rank == 4 && v.dims[1] == H && v.dims[2] == S && v.str[3] == 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < S; l++)
                    for (int64_t e = 0; e < E; e++) {
                        bad += at(&v, w, b, h, l, e) != ((b * S + l) * H + h) * E + e;
                    }
    }
    CHECK_MSG(bad == 0, "%d view elements at the wrong offset", bad);
}

// Every folded base is not overwritten before its sdpa (checked independently of the pass's own
// walk): a base left in the arena overlaps no tensor written by a layer that runs in between; a
// base moved out of the arena is live (for the placement outside it: cuda_memory.c) from its
// producer through the sdpa.
static void check_lifetimes(const kiln_plan *p, const kiln_cuda_fold *f, uint32_t sdpa,
                            const int32_t *bases, uint32_t n_bases) {
    for (uint32_t j = 0; j < n_bases; j++) {
        const kiln_plan_tensor *x = &p->tensors[bases[j]];
        if (!(f->sdpa_in[sdpa] & (1u << j))) continue;
        if (f->reloc[bases[j]]) {
            const int32_t from = f->producer[bases[j]] < 0 ? 0 : f->producer[bases[j]];
            CHECK_MSG((int32_t)f->live_first[bases[j]] <= from && f->live_last[bases[j]] >= sdpa,
                      "relocated base %d lives over [%u, %u], read from %d to %u", bases[j],
                      f->live_first[bases[j]], f->live_last[bases[j]], from, sdpa);
            continue;
        }
        for (uint32_t li = (uint32_t)f->producer[bases[j]] + 1; li <= sdpa; li++) {
            if (f->virt[li]) continue;
            int32_t o = f->sdpa_out[li] >= 0 ? f->sdpa_dst[li] : p->ids[p->layers[li].output_begin];
            const kiln_plan_tensor *y = &p->tensors[o];
            if (o == bases[j] || y->kind != KILN_TENSOR_ACTIVATION || f->reloc[o]) continue;
            CHECK_MSG(x->offset >= y->offset + y->nbytes || y->offset >= x->offset + x->nbytes,
                      "layer %u overwrites the folded base %d before sdpa %u", li, bases[j], sdpa);
        }
    }
}

// Packed QKV, as kiln_cuda_bench builds it: linear -> reshape [B, S, 3, H, E] -> permute
// (2, 0, 3, 1, 4) -> select 0/1/2 -> sdpa -> permute (0, 2, 1, 3) -> reshape -> linear + x.
static void packed(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    int64_t dims[3] = {B, S, D}, split[5] = {B, S, 3, H, E}, perm[5] = {2, 0, 3, 1, 4};
    int64_t back[4] = {0, 2, 1, 3}, merge[3] = {B, S, D}, zero = 0;
    int32_t x = -1, parts[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    int32_t qkv = permute(g, reshape(g, linear(g, x, D, 3 * D), split, 5), perm, 5);
    for (int64_t i = 0; i < 3; i++) {
        int64_t idx = i;
        kiln_attr sa[2] = {{"dim", &zero, NULL, 1}, {"index", &idx, NULL, 1}};
        parts[i] = node(g, KILN_OP_SELECT, &qkv, 1, sa, 2);
    }
    int32_t att =
        reshape(g, permute(g, node(g, KILN_OP_SDPA, parts, 3, NULL, 0), back, 4), merge, 3);
    int32_t two[2] = {linear(g, att, D, D), x};
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_ADD, two, 2, NULL, 0), "y") == KILN_OK);
    if (!load(g, &p)) return;
    // disabled: every layer runs
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 0, 0, &f) == KILN_OK);
    CHECK(f.n_virtual == 0 && f.n_sdpa_in == 0 && f.n_sdpa_out == 0);
    kiln_cuda_fold_free(&p, &f);
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0), lin = find_head(&p, KILN_OP_LINEAR, 0);
    CHECK(sdpa != UINT32_MAX && lin != UINT32_MAX);
    if (sdpa != UINT32_MAX && lin != UINT32_MAX) {
        int32_t x3 = kiln_plan_group_output(&p, lin);
        int32_t bases[3] = {x3, x3, x3};
        int64_t col0[3] = {0, D, 2 * D};
        fprintf(stderr,
                "packed: %u virtual, sdpa operands %u, outputs %u, %u tensors moved out of the "
                "arena\n",
                f.n_virtual, f.n_sdpa_in, f.n_sdpa_out, f.n_reloc);
        // reshape, permute, 3 selects on the way in; the merge permute on the way out
        CHECK_EQ_INT(f.sdpa_in[sdpa], 7);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SELECT), 3);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_PERMUTE), 2);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_RESHAPE), 2); // split and merge
        CHECK(f.sdpa_out[sdpa] > (int32_t)sdpa);
        CHECK_EQ_INT(f.n_virtual, 7);
        CHECK(f.sdpa_dst[sdpa] >= 0 &&
              p.layers[f.producer[f.sdpa_dst[sdpa]]].op == KILN_OP_RESHAPE);
        bind_views(&p, views);
        check_views(&p, &f, views, sdpa, bases, col0, 3 * D);
        check_lifetimes(&p, &f, sdpa, bases, 1);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// torch's nn.MultiheadAttention in sequence-first form (torchvision's ViT exports it so, with
// bt batch rows): qkv = linear [S, bt, 3D] -> unflatten [S, bt, 3, D] -> unsqueeze(0) ->
// transpose(0, -2) -> squeeze(-2) -> select j -> view [S, bt H, E] -> transpose(0, 1) -> view
// [bt, H, S, E] -> sdpa -> permute (2, 0, 1, 3) -> view [S bt, D] -> linear. At bt = 1 every
// link is a view of the qkv projection (reshapes of strided views): none runs, and the sdpa
// reads head h of operand j at (s bt + b) 3D + j D + h E + e and writes [S, bt, H, E]. At bt = 2
// the view [S, bt H, E] merges bt (stride 3D) with the heads (stride E): no strides express it,
// so the operands' chains run (torch copies there too).
static void mha_seq_first(int64_t bt) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    int64_t dims[3] = {S, bt, D}, unfl[4] = {S, bt, 3, D}, unsq[5] = {1, S, bt, 3, D};
    int64_t tr[5] = {3, 1, 2, 0, 4}, sq[4] = {3, S, bt, D}, heads[3] = {S, bt * H, E};
    int64_t t01[3] = {1, 0, 2}, bhse[4] = {bt, H, S, E}, back[4] = {2, 0, 1, 3};
    int64_t merge[2] = {S * bt, D}, zero = 0;
    int32_t x = -1, parts[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    int32_t qkv = reshape(g, linear(g, x, D, 3 * D), unfl, 4);
    qkv = reshape(g, permute(g, reshape(g, qkv, unsq, 5), tr, 5), sq, 4);
    for (int64_t i = 0; i < 3; i++) {
        int64_t idx = i;
        kiln_attr sa[2] = {{"dim", &zero, NULL, 1}, {"index", &idx, NULL, 1}};
        int32_t v = node(g, KILN_OP_SELECT, &qkv, 1, sa, 2);
        parts[i] = reshape(g, permute(g, reshape(g, v, heads, 3), t01, 3), bhse, 4);
    }
    int32_t att =
        reshape(g, permute(g, node(g, KILN_OP_SDPA, parts, 3, NULL, 0), back, 4), merge, 2);
    CHECK(kiln_graph_mark_output(g, linear(g, att, D, D), "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0), lin = find_head(&p, KILN_OP_LINEAR, 0);
    CHECK(sdpa != UINT32_MAX && lin != UINT32_MAX);
    if (sdpa != UINT32_MAX && lin != UINT32_MAX) {
        const int32_t y = kiln_plan_group_output(&p, lin);
        fprintf(stderr, "mha sequence-first, batch %d: %u virtual, sdpa operands %u, outputs %u\n",
                (int)bt, f.n_virtual, f.n_sdpa_in, f.n_sdpa_out);
        if (bt == 1) CHECK_EQ_INT(f.sdpa_in[sdpa], 7);
        bind_views(&p, views);
        int bad = 0;
        int32_t bases[3] = {y, y, y};
        for (uint32_t j = 0; j < 3; j++) {
            kiln_cuda_strided v;
            if (!(f.sdpa_in[sdpa] & (1u << j))) continue;
            int32_t t = p.ids[p.layers[sdpa].input_begin + j], pl;
            kiln_cuda_fold_view(&p, &f, views, t, &v);
            CHECK(v.rank == 4 && v.dims[0] == bt && v.dims[1] == H && v.dims[2] == S &&
                  v.dims[3] == E && v.str[3] == 1);
            // the tensor the view reads: the projection, or a link of the chain that runs
            while ((pl = f.producer[t]) >= 0 && (f.virt[pl] & KILN_CUDA_FOLD_VIRTUAL) &&
                   !(f.virt[pl] & KILN_CUDA_FOLD_WRITTEN))
                t = p.ids[p.layers[pl].input_begin];
            bases[j] = t;
            const kiln_shape *bs = &p.tensors[t].shape;
            for (int64_t b = 0; b < bt; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t q = 0; q < S; q++)
                        for (int64_t e = 0; e < E; e++) {
                            int64_t want; // element (b, h, q, e) of operand j in t's layout
                            if (t == y)
                                want = (q * bt + b) * 3 * D + j * D + h * E + e;
                            else if (bs->rank == 4 && bs->max[0] == 3) // [3, S, bt, D]
                                want = ((j * S + q) * bt + b) * D + h * E + e;
                            else if (bs->max[0] == S) // [S, bt, D] or [S, bt H, E]
                                want = (q * bt + b) * D + h * E + e;
                            else // [bt H, S, E] or [bt, H, S, E]
                                want = ((b * H + h) * S + q) * E + e;
                            bad += at(&v, t, b, h, q, e) != want;
                        }
        }
        if (bt == 1) {
            kiln_cuda_strided v;
            CHECK(f.sdpa_out[sdpa] >= 0);
            if (f.sdpa_out[sdpa] >= 0) {
                kiln_cuda_fold_out_view(&p, &f, views, sdpa, &v);
                for (int64_t h = 0; h < H; h++)
                    for (int64_t q = 0; q < S; q++)
                        for (int64_t e = 0; e < E; e++)
                            bad += at(&v, f.sdpa_dst[sdpa], 0, h, q, e) != (q * H + h) * E + e;
            }
        }
        CHECK_MSG(bad == 0, "mha batch %d: %d view elements at the wrong offset", (int)bt, bad);
        check_lifetimes(&p, &f, sdpa, bases, 3);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// GPT-NeoX's packed per-head projection: linear -> reshape [B, S, H, W] -> permute (0, 2, 1, 3)
// -> q, k, v slices of the last dim (W = 3E) -> sdpa -> permute -> reshape -> linear. The
// builder slices before the permute (views rule 14); the slices and permutes then fold into
// the sdpa's views of the projection. variant 1: v at column 2E + 4 of W = 3E + 4 (an offset of
// 8 bytes: v's chain runs, q and k fold); 2: q and k through rotaries with constant tables
// (they run, reading q's and k's slices; their permutes fold, the sdpa reading the rotaries'
// outputs; v folds and its base, the reshape, aliases the projection, which moves out of the
// arena to live until the sdpa).
static void neox_packed(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    const int64_t W = variant == 1 ? 3 * E + 4 : 3 * E, v0 = variant == 1 ? 2 * E + 4 : 2 * E;
    int64_t dims[3] = {B, S, D}, split[4] = {B, S, H, W}, t0213[4] = {0, 2, 1, 3};
    int64_t merge[3] = {B, S, D}, last = -1, tab[2] = {S, E};
    int32_t x = -1, parts[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    int32_t pm = permute(g, reshape(g, linear(g, x, D, H * W), split, 4), t0213, 4);
    const int32_t cs = variant == 2 ? constant(g, 2, tab) : -1;
    const int32_t sn = variant == 2 ? constant(g, 2, tab) : -1;
    for (int64_t j = 0; j < 3; j++) {
        int64_t start = j == 2 ? v0 : j * E, end = start + E;
        kiln_attr sa[3] = {
            {"dim", &last, NULL, 1}, {"start", &start, NULL, 1}, {"end", &end, NULL, 1}};
        parts[j] = node(g, KILN_OP_SLICE, &pm, 1, sa, 3);
        if (cs >= 0 && j < 2) {
            int32_t ins[3] = {parts[j], cs, sn};
            parts[j] = node(g, KILN_OP_ROTARY, ins, 3, NULL, 0);
        }
    }
    int32_t att =
        reshape(g, permute(g, node(g, KILN_OP_SDPA, parts, 3, NULL, 0), t0213, 4), merge, 3);
    CHECK(kiln_graph_mark_output(g, linear(g, att, D, D), "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0), proj = find_head(&p, KILN_OP_LINEAR, 0);
    CHECK(sdpa != UINT32_MAX && proj != UINT32_MAX);
    if (sdpa != UINT32_MAX && proj != UINT32_MAX) {
        fprintf(stderr, "neox packed %d: %u virtual, sdpa operands %u, aliases %u, relocated %u\n",
                variant, f.n_virtual, f.n_sdpa_in, f.n_alias, f.n_reloc);
        CHECK_EQ_INT(f.sdpa_in[sdpa], variant == 1 ? 3 : 7);
        CHECK(f.sdpa_out[sdpa] >= 0);
        const int32_t y = kiln_plan_group_output(&p, proj);
        bind_views(&p, views);
        int bad = 0;
        int32_t bases[3] = {y, y, y};
        for (uint32_t j = 0; j < 3; j++) {
            kiln_cuda_strided v;
            if (!(f.sdpa_in[sdpa] & (1u << j))) continue;
            int32_t t = p.ids[p.layers[sdpa].input_begin + j], pl;
            kiln_cuda_fold_view(&p, &f, views, t, &v);
            CHECK(v.rank == 4 && v.dims[0] == B && v.dims[1] == H && v.dims[2] == S &&
                  v.dims[3] == E && v.str[3] == 1);
            while ((pl = f.producer[t]) >= 0 && (f.virt[pl] & KILN_CUDA_FOLD_VIRTUAL)) {
                t = p.ids[p.layers[pl].input_begin];
            }
            // the base: the projection, its reshape (aliasing it: checked against the
            // projection's lifetime below), or a rotary's output [B, S, H, E]
            const uint32_t op = f.producer[t] >= 0 ? p.layers[f.producer[t]].op : 0;
            const int rot = variant == 2 && j < 2;
            CHECK(rot ? op == KILN_OP_ROTARY : t == y || op == KILN_OP_RESHAPE);
            const int64_t col = rot ? 0 : j == 2 ? v0 : (int64_t)j * E, w = rot ? E : W;
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t q = 0; q < S; q++)
                        for (int64_t e = 0; e < E; e++)
                            bad += at(&v, t, b, h, q, e) != ((b * S + q) * H + h) * w + col + e;
            bases[j] = f.alias[t] >= 0 ? f.alias[t] : t;
            if (op == KILN_OP_RESHAPE) CHECK_EQ_INT(bases[j], y); // aliases the projection
        }
        CHECK_MSG(bad == 0, "neox %d: %d view elements at the wrong offset", variant, bad);
        check_lifetimes(&p, &f, sdpa, bases, 3);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// MaxViT's windowed attention: x [1, W, S, D] -> linear -> q, k, v as slices of the last dim
// (torch.chunk) -> reshape [1, W, S, H, E] -> permute (0, 1, 3, 2, 4) -> sdpa -> permute back
// -> reshape -> linear. The slices are views too: the sdpa reads q, k and v in the projection.
static void chunked(void) {
    enum { W = 2 };
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    int64_t dims[4] = {1, W, S, D}, split[5] = {1, W, S, H, E}, swap[5] = {0, 1, 3, 2, 4};
    int64_t last = -1;
    int32_t x = -1, qkv[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, dims, dims, &x) == KILN_OK);
    int32_t proj = linear(g, x, D, 3 * D);
    for (int64_t j = 0; j < 3; j++) {
        int64_t start = j * D, end = start + D;
        kiln_attr sa[3] = {
            {"dim", &last, NULL, 1}, {"start", &start, NULL, 1}, {"end", &end, NULL, 1}};
        qkv[j] = permute(g, reshape(g, node(g, KILN_OP_SLICE, &proj, 1, sa, 3), split, 5), swap, 5);
    }
    int32_t att = node(g, KILN_OP_SDPA, qkv, 3, NULL, 0);
    att = linear(g, reshape(g, permute(g, att, swap, 5), dims, 4), D, D);
    CHECK(kiln_graph_mark_output(g, att, "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0), l0 = find_head(&p, KILN_OP_LINEAR, 0);
    CHECK(sdpa != UINT32_MAX && l0 < sdpa);
    if (sdpa != UINT32_MAX && l0 < sdpa) {
        const int32_t y = kiln_plan_group_output(&p, l0);
        int32_t bases[3] = {y, y, y};
        fprintf(stderr, "chunked: %u virtual (slices %u), sdpa operands %u\n", f.n_virtual,
                count_virtual(&p, &f, KILN_OP_SLICE), f.sdpa_in[sdpa]);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SLICE), 3);
        CHECK_EQ_INT(f.sdpa_in[sdpa], 7);
        bind_views(&p, views);
        int bad = 0;
        for (uint32_t j = 0; j < 3; j++) {
            kiln_cuda_strided v;
            kiln_cuda_fold_view(&p, &f, views, p.ids[p.layers[sdpa].input_begin + j], &v);
            CHECK(v.rank == 5 && v.dims[1] == W && v.dims[2] == H && v.dims[3] == S &&
                  v.dims[4] == E && v.str[4] == 1);
            for (int64_t w = 0; w < W; w++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t q = 0; q < S; q++)
                        for (int64_t e = 0; e < E; e++) {
                            const int64_t o = w * v.str[1] + h * v.str[2] + q * v.str[3] + e;
                            bad += ((const uint16_t *)v.data - mem[y]) + o !=
                                   (w * S + q) * 3 * D + (int64_t)j * D + h * E + e;
                        }
        }
        CHECK_MSG(bad == 0, "chunked: %d view elements at the wrong offset", bad);
        check_lifetimes(&p, &f, sdpa, bases, 3);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

static int32_t scalar(kiln_graph *g, uint32_t dtype, float v) {
    uint8_t data[8];
    int64_t one = 1;
    int32_t out = -1;
    kiln_store_f32(data, dtype, 0, v);
    CHECK(kiln_graph_add_constant(g, NULL, (kiln_dtype)dtype, 1, &one, data,
                                  dtype == KILN_DTYPE_F32 ? 4 : 2, &out) == KILN_OK);
    return out;
}

static int32_t bin(kiln_graph *g, uint32_t op, int32_t a, int32_t b) {
    int32_t ins[2] = {a, b};
    return node(g, op, ins, 2, NULL, 0);
}

// An eager attention over batched matmuls (timm's LeViT, transformers' DeBERTa): x [bt, S, D] ->
// linear to H heads of (q E, k E, v E) -> reshape [bt, S, H, 3E] -> slices of the last dim -> q
// permute (0, 2, 1, 3), k permute (0, 2, 3, 1), v permute (0, 2, 1, 3) -> q @ k^T -> softmax ->
// @ v -> permute back -> reshape -> linear. At bt = 1 the slices and head permutes run no kernel
// and the matmuls read the projection through strides (q row-major, k^T column-major, one batch
// stride over the heads); at bt = 2 batch and heads do not collapse into one stride: they run.
// flat (bt = 1): DeBERTa's bmm form, q, k, v reshaped to [H, S, E] after the head permute, k^T
// a permute (0, 2, 1) of that divided by a constant, the output reshaped to [1, H, S, E] before
// the merge permute: the same views, the division as the first matmul's alpha, and the second
// matmul writes through that reshape (mm_pre).
static void eager_mm_case(int64_t bt, int flat) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    int64_t dims[3] = {bt, S, D}, split[4] = {bt, S, H, 3 * E}, merge[3] = {bt, S, D};
    int64_t p0213[4] = {0, 2, 1, 3}, p0231[4] = {0, 2, 3, 1}, last = -1;
    int64_t hse[3] = {H, S, E}, t021[3] = {0, 2, 1}, unflat[4] = {1, H, S, E};
    int32_t x = -1, part[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    int32_t proj = reshape(g, linear(g, x, D, 3 * D), split, 4);
    for (int64_t j = 0; j < 3; j++) {
        int64_t start = j * E, end = start + E;
        kiln_attr sa[3] = {
            {"dim", &last, NULL, 1}, {"start", &start, NULL, 1}, {"end", &end, NULL, 1}};
        part[j] =
            permute(g, node(g, KILN_OP_SLICE, &proj, 1, sa, 3), j == 1 && !flat ? p0231 : p0213, 4);
        if (flat) part[j] = reshape(g, part[j], hse, 3);
        if (flat && j == 1) { // k^T / 4, as DeBERTa scales it
            part[j] =
                bin(g, KILN_OP_DIV, permute(g, part[j], t021, 3), scalar(g, KILN_DTYPE_F32, 4.0f));
        }
    }
    int32_t att = node(g, KILN_OP_MATMUL, part, 2, NULL, 0);
    if (flat) { // a bias over the scores (else the builder takes the flat form as sdpa)
        int64_t bd[3] = {H, S, S};
        int32_t ab[2] = {att, constant(g, 3, bd)};
        att = node(g, KILN_OP_ADD, ab, 2, NULL, 0);
    }
    kiln_attr sm = {"dim", &last, NULL, 1};
    int32_t mm2[2] = {node(g, KILN_OP_SOFTMAX, &att, 1, &sm, 1), part[2]};
    att = node(g, KILN_OP_MATMUL, mm2, 2, NULL, 0);
    if (flat) att = reshape(g, att, unflat, 4);
    att = linear(g, reshape(g, permute(g, att, p0213, 4), merge, 3), D, D);
    CHECK(kiln_graph_mark_output(g, att, "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    const uint32_t l0 = find_head(&p, KILN_OP_LINEAR, 0), m1 = find_head(&p, KILN_OP_MATMUL, 0);
    const uint32_t m2 = m1 == UINT32_MAX ? m1 : find_head(&p, KILN_OP_MATMUL, m1 + 1);
    CHECK(l0 < m1 && m1 < m2 && m2 != UINT32_MAX);
    if (!(l0 < m1 && m1 < m2 && m2 != UINT32_MAX)) {
        kiln_cuda_fold_free(&p, &f);
        kiln_plan_release(&p);
        return;
    }
    fprintf(stderr, "eager matmuls b%lld%s: %u virtual (slices %u), matmul operands %u + %u\n",
            (long long)bt, flat ? " flat" : "", f.n_virtual, count_virtual(&p, &f, KILN_OP_SLICE),
            f.sdpa_in[m1], f.sdpa_in[m2]);
    if (bt > 1) {
        CHECK_EQ_INT(f.n_mm_in, 0);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SLICE), 0);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_PERMUTE), 0);
    } else {
        const int32_t y = kiln_plan_group_output(&p, l0);
        const int32_t bases[2] = {y, y};
        CHECK_EQ_INT(f.n_mm_in, 3);
        CHECK_EQ_INT(f.sdpa_in[m1], 3);
        CHECK_EQ_INT(f.sdpa_in[m2], 2);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SLICE), 3);
        bind_views(&p, views);
        kiln_cuda_strided q, k, v;
        kiln_cuda_mm_geom g1, g2;
        kiln_cuda_fold_view(&p, &f, views, p.ids[p.layers[m1].input_begin], &q);
        kiln_cuda_fold_view(&p, &f, views, p.ids[p.layers[m1].input_begin + 1], &k);
        kiln_cuda_fold_view(&p, &f, views, p.ids[p.layers[m2].input_begin + 1], &v);
        CHECK(kiln_cuda_mm_geom_of(&q, &k, NULL, &g1));
        // q(h, s, e) at s * H * 3E + h * 3E + e; k^T(h, e, s) at E + the same
        CHECK(g1.m == S && g1.k == E && g1.n == S && g1.batch == H);
        CHECK(g1.a_rs == H * 3 * E && g1.a_cs == 1 && g1.a_bs == 3 * E);
        CHECK(g1.b_rs == 1 && g1.b_cs == H * 3 * E && g1.b_bs == 3 * E);
        CHECK((const uint16_t *)q.data - mem[y] == 0 && (const uint16_t *)k.data - mem[y] == E);
        CHECK(kiln_cuda_mm_matrix_ok(g1.m, g1.k, g1.a_rs, g1.a_cs) &&
              kiln_cuda_mm_matrix_ok(g1.k, g1.n, g1.b_rs, g1.b_cs));
        kiln_tensor *sv = &views[p.ids[p.layers[m2].input_begin]];
        kiln_cuda_strided s2;
        kiln_cuda_fold_view(&p, &f, views, p.ids[p.layers[m2].input_begin], &s2);
        CHECK(s2.data == sv->data); // the softmax's output: dense
        CHECK(kiln_cuda_mm_geom_of(&s2, &v, NULL, &g2));
        CHECK(g2.m == S && g2.k == S && g2.n == E && g2.batch == H && g2.a_rs == S &&
              g2.a_cs == 1 && g2.a_bs == S * S);
        CHECK(g2.b_rs == H * 3 * E && g2.b_cs == 1 && g2.b_bs == 3 * E);
        CHECK((const uint16_t *)v.data - mem[y] == 2 * E);
        // the second matmul writes [bt, S, H, E] (the permute's, then the reshape's output)
        CHECK(f.sdpa_out[m2] >= 0 && f.sdpa_dst[m2] >= 0 && f.sdpa_out[m1] < 0);
        CHECK(flat ? f.mm_pre[m2] > (int32_t)m2 && p.layers[f.mm_pre[m2]].op == KILN_OP_RESHAPE
                   : f.mm_pre[m2] < 0);
        // flat: the division by 4 runs no kernel, the first matmul's product is scaled instead
        CHECK(f.mm_alpha[m1] == (flat ? 0.25f : 1.0f) && f.mm_alpha[m2] == 1.0f);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_DIV), flat ? 1 : 0);
        if (f.sdpa_out[m2] >= 0 && f.sdpa_dst[m2] >= 0) {
            kiln_cuda_strided yv;
            kiln_cuda_fold_out_view(&p, &f, views, m2, &yv);
            CHECK(kiln_cuda_mm_geom_of(&s2, &v, &yv, &g2));
            CHECK(g2.y_rs == H * E && g2.y_bs == E && yv.data == views[f.sdpa_dst[m2]].data);
            CHECK(p.layers[f.sdpa_dst[m2] >= 0 ? f.producer[f.sdpa_dst[m2]] : 0].op ==
                  KILN_OP_RESHAPE);
        }
        check_lifetimes(&p, &f, m1, bases, 2);
        check_lifetimes(&p, &f, m2, bases, 2);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// T5's float16 overflow guard (cuda_fold.h "Overflow clamps"): float16 activations, float32
// scalars, built as exported (no precision change), x read again after the clamp (as T5's
// residual is: the clamp's output then never shares x's bytes). variant 0: the twelve layers
// fold into the abs (its launch names the minimum, the where's constants kept); 1: the eq
// compares with 1, not inf: nothing folds; 2: the where's output is also an engine output:
// nothing folds.
static void clamp_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t dims[3] = {1, S, D}, f32 = KILN_DTYPE_F32, f16 = KILN_DTYPE_F16, keep = 0;
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F16, 3, dims, dims, &x) == KILN_OK);
    kiln_attr to32 = {"dtype", &f32, NULL, 1}, to16 = {"dtype", &f16, NULL, 1};
    kiln_attr sa[2] = {{"dims", NULL, NULL, 0}, {"keepdim", &keep, NULL, 1}};
    int32_t h = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    int32_t e = bin(g, KILN_OP_EQ, node(g, KILN_OP_ABS, &h, 1, NULL, 0),
                    scalar(g, KILN_DTYPE_F16, variant == 1 ? 1.0f : INFINITY));
    int32_t cnt = node(g, KILN_OP_CAST, &e, 1, &to32, 1);
    cnt = node(g, KILN_OP_SUM, &cnt, 1, sa, 2);
    cnt = node(g, KILN_OP_CAST, &cnt, 1, &to16, 1);
    int32_t any = bin(g, KILN_OP_GT, cnt, scalar(g, KILN_DTYPE_F16, 0.0f));
    int32_t w3[3] = {any, scalar(g, KILN_DTYPE_F32, 64504.0f), scalar(g, KILN_DTYPE_F32, 65504.0f)};
    int32_t c = node(g, KILN_OP_WHERE, w3, 3, NULL, 0);
    int32_t lo = node(g, KILN_OP_NEG, &c, 1, NULL, 0);
    lo = node(g, KILN_OP_CAST, &lo, 1, &to16, 1);
    int32_t y = bin(g, KILN_OP_MAXIMUM, h, lo);
    int32_t hi = node(g, KILN_OP_CAST, &c, 1, &to16, 1);
    y = bin(g, KILN_OP_ADD,
            node(g, KILN_OP_RELU, (int32_t[]){bin(g, KILN_OP_MINIMUM, y, hi)}, 1, NULL, 0), h);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (variant == 2) CHECK(kiln_graph_mark_output(g, c, "c") == KILN_OK);
    kiln_build_options o;
    kiln_built *b = NULL;
    const void *bytes;
    size_t n;
    kiln_build_options_init(&o);
    int ok = kiln_build(g, &o, &b) == KILN_OK && kiln_built_engine(b, &bytes, &n) == KILN_OK &&
             kiln_load_plan(bytes, n, &p) == KILN_OK;
    kiln_built_free(b);
    kiln_graph_free(g);
    CHECK_MSG(ok, "clamp %d: build/load failed: %s", variant, kiln_last_error());
    if (!ok) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    const uint32_t a = find_head(&p, KILN_OP_ABS, 0), mn = find_head(&p, KILN_OP_MINIMUM, 0);
    fprintf(stderr, "clamp %d: %u overflow clamps, %u layers run no kernel\n", variant, f.n_clamp,
            f.n_virtual);
    CHECK(a != UINT32_MAX && mn != UINT32_MAX);
    if (variant == 0 && a != UINT32_MAX && mn != UINT32_MAX) {
        CHECK_EQ_INT(f.n_clamp, 1);
        CHECK_EQ_INT(f.clamp_mn[a], (int)mn);
        CHECK(f.clamp_ab[2 * a] == 64504.0f && f.clamp_ab[2 * a + 1] == 65504.0f);
        int members = 0;
        for (uint32_t li = a + 1; li <= mn; li++) members += f.virt[li] == KILN_CUDA_FOLD_CLAMP;
        CHECK_EQ_INT(members, 11);
        CHECK(f.virt[a] == 0);
    } else {
        CHECK_EQ_INT(f.n_clamp, 0);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// The column-major GEMM kiln_cuda_mm_gemm_of describes (cuBLASLt's semantics: A is b's
// memory, B is a's), run on the host into y's memory.
static void gemm_emulate(const kiln_cuda_mm_gemm *c, const float *ga, const float *gb, float *gd,
                         float alpha) {
    for (int64_t bt = 0; bt < c->batch; bt++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < c->k; k++) {
                    const float a = c->trans_a ? ga[bt * c->stride_a + k + i * c->lda]
                                               : ga[bt * c->stride_a + i + k * c->lda];
                    const float b = c->trans_b ? gb[bt * c->stride_b + j + k * c->ldb]
                                               : gb[bt * c->stride_b + k + j * c->ldb];
                    acc += (double)a * b;
                }
                gd[bt * c->stride_d + i + j * c->ldd] = (float)(alpha * acc);
            }
}

// One 4-D matmul [B0, H, M, K] @ [B0, H, K, N] through views of buf (element offsets a0, b0
// and strides), written dense or through y's strides: the GEMM against the matmul computed
// through the views. want_gemm: 1 when cuBLASLt's form must exist.
static void mm_gemm_check(const char *name, const float *buf, int64_t a0, const int64_t *ad,
                          const int64_t *as, int64_t b0, const int64_t *bd, const int64_t *bs,
                          const int64_t *ys, float alpha) {
    kiln_cuda_strided va = {(void *)(buf + a0), 4, {0}, {0}},
                      vb = {(void *)(buf + b0), 4, {0}, {0}};
    memcpy(va.dims, ad, 4 * sizeof *ad);
    memcpy(va.str, as, 4 * sizeof *as);
    memcpy(vb.dims, bd, 4 * sizeof *bd);
    memcpy(vb.str, bs, 4 * sizeof *bs);
    const int64_t n0 = ad[0], nh = ad[1], nm = ad[2], nk = ad[3], nn = bd[3];
    const int64_t ny = n0 * nh * nm * nn;
    int64_t yd[4] = {n0, nh, nm, nn}, dense_s[4] = {nh * nm * nn, nm * nn, nn, 1};
    kiln_cuda_strided vy = {NULL, 4, {0}, {0}};
    memcpy(vy.dims, yd, sizeof yd);
    memcpy(vy.str, ys != NULL ? ys : dense_s, sizeof dense_s);
    float *y = kiln_calloc((size_t)ny * sizeof(float), sizeof(float));
    kiln_cuda_mm_geom g;
    kiln_cuda_mm_gemm c;
    CHECK_MSG(kiln_cuda_mm_geom_of(&va, &vb, ys != NULL ? &vy : NULL, &g) &&
                  kiln_cuda_mm_gemm_of(&g, &c),
              "%s: no GEMM form", name);
    if (y != NULL && kiln_cuda_mm_gemm_of(&g, &c)) {
        gemm_emulate(&c, (const float *)vb.data, (const float *)va.data, y, alpha);
        double worst = 0.0;
        for (int64_t bb = 0; bb < n0; bb++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < nm; i++)
                    for (int64_t j = 0; j < nn; j++) {
                        double want = 0.0;
                        for (int64_t k = 0; k < nk; k++) {
                            want += (double)((const float *)va.data)[bb * as[0] + h * as[1] +
                                                                     i * as[2] + k * as[3]] *
                                    ((const float *)
                                         vb.data)[bb * bs[0] + h * bs[1] + k * bs[2] + j * bs[3]];
                        }
                        const float got = y[bb * vy.str[0] + h * vy.str[1] + i * vy.str[2] + j];
                        worst = fmax(worst, fabs(got - alpha * want));
                    }
        fprintf(stderr, "mm gemm %s: trans %d/%d, batch %lld: worst %.3g\n", name, c.trans_a,
                c.trans_b, (long long)c.batch, worst);
        CHECK_MSG(worst < 1e-4, "%s: the GEMM differs from the matmul by %g", name, worst);
    }
    kiln_free(y, (size_t)ny * sizeof(float));
}

// LeViT's eager attention over one packed projection [1, N, H, 64] (q 16, k 16, v 32 per
// head), a transposed a, and dense operands with a batch.
static void mm_gemm_case(void) {
    enum { NT = 49, NH = 4, C3 = 64, NBUF = NT * NH * C3 + 4096 };
    static float buf[NBUF];
    for (int i = 0; i < NBUF; i++) buf[i] = (float)check_rng_uniform(-0.5, 0.5);
    const int64_t P = NH * C3;
    mm_gemm_check("q @ k^T", buf, 0, (int64_t[]){1, NH, NT, 16}, (int64_t[]){0, C3, P, 1}, 16,
                  (int64_t[]){1, NH, 16, NT}, (int64_t[]){0, C3, 1, P}, NULL, 1.0f);
    mm_gemm_check("q @ k^T * 0.25", buf, 0, (int64_t[]){1, NH, NT, 16}, (int64_t[]){0, C3, P, 1},
                  16, (int64_t[]){1, NH, 16, NT}, (int64_t[]){0, C3, 1, P}, NULL, 0.25f);
    // scores (dense, after the projection in buf) @ v, the heads merged into [1, N, H, 32]
    const int64_t sc = NT * NH * C3;
    mm_gemm_check("s @ v, merged", buf, sc - NH * NT * NT + 4096, (int64_t[]){1, NH, NT, NT},
                  (int64_t[]){0, NT * NT, NT, 1}, 32, (int64_t[]){1, NH, NT, 32},
                  (int64_t[]){0, C3, P, 1}, (int64_t[]){0, 32, NH * 32, 1}, 1.0f);
    mm_gemm_check("a column-major", buf, 0, (int64_t[]){1, NH, 48, NT}, (int64_t[]){0, C3, 1, P}, 0,
                  (int64_t[]){1, NH, NT, 48}, (int64_t[]){0, C3, P, 1}, NULL, 1.0f);
    mm_gemm_check("dense, batch 2 x 3", buf, 0, (int64_t[]){2, 3, 5, 7}, (int64_t[]){105, 35, 7, 1},
                  300, (int64_t[]){2, 3, 7, 4}, (int64_t[]){84, 28, 4, 1}, NULL, 1.0f);
}

// kiln_cuda_mm_geom_of and kiln_cuda_mm_matrix_ok on hand-made views: dense with a broadcast b,
// transposed operands, rank-1 operands, batch dims that do not collapse, mismatched batches.
static void mm_geom_case(void) {
    kiln_cuda_strided a = {NULL, 4, {2, 3, 5, 7}, {105, 35, 7, 1}};
    kiln_cuda_strided b = {NULL, 2, {7, 4}, {4, 1}};
    kiln_cuda_mm_geom g;
    CHECK(kiln_cuda_mm_geom_of(&a, &b, NULL, &g));
    CHECK(g.m == 5 && g.k == 7 && g.n == 4 && g.batch == 6 && g.a_bs == 35 && g.b_bs == 0);
    CHECK(g.a_rs == 7 && g.a_cs == 1 && g.b_rs == 4 && g.b_cs == 1);
    kiln_cuda_strided bt = {NULL, 4, {2, 3, 7, 4}, {84, 28, 1, 7}}; // b stored [.., n, k]
    CHECK(kiln_cuda_mm_geom_of(&a, &bt, NULL, &g));
    CHECK(g.batch == 6 && g.b_bs == 28 && g.b_rs == 1 && g.b_cs == 7);
    CHECK(kiln_cuda_mm_matrix_ok(g.k, g.n, g.b_rs, g.b_cs));
    CHECK(!kiln_cuda_mm_matrix_ok(7, 4, 1, 6)); // column-major with ld 6 < 7 rows
    CHECK(!kiln_cuda_mm_matrix_ok(7, 4, 8, 2)); // neither stride 1
    CHECK(kiln_cuda_mm_matrix_ok(1, 4, 99, 3)); // a row: any strides
    kiln_cuda_strided v = {NULL, 1, {7}, {1}}, u = {NULL, 1, {7}, {1}};
    CHECK(kiln_cuda_mm_geom_of(&v, &u, NULL, &g));
    CHECK(g.m == 1 && g.n == 1 && g.k == 7 && g.batch == 1 && g.a_rs == 7 && g.b_rs == 1);
    kiln_cuda_strided nc = {NULL, 4, {2, 3, 5, 7}, {500, 35, 7, 1}}; // 500 != 3 * 35
    CHECK(!kiln_cuda_mm_geom_of(&nc, &bt, NULL, &g));
    kiln_cuda_strided wrong = {NULL, 4, {2, 4, 7, 4}, {112, 28, 4, 1}}; // 4 heads against 3
    CHECK(!kiln_cuda_mm_geom_of(&a, &wrong, NULL, &g));
    kiln_cuda_strided badk = {NULL, 2, {6, 4}, {4, 1}};
    CHECK(!kiln_cuda_mm_geom_of(&a, &badk, NULL, &g));
    // y [2, 3, 5, 4] written as [2, 5, 3, 4] (permute (0, 2, 1, 3) of the output)
    kiln_cuda_strided y = {NULL, 4, {2, 3, 5, 4}, {60, 4, 12, 1}};
    CHECK(!kiln_cuda_mm_geom_of(&a, &bt, &y, &g)); // batch (2, 3) of y: 60 != 3 * 4
    kiln_cuda_strided b4 = {NULL, 4, {2, 3, 7, 4}, {84, 28, 4, 1}};
    CHECK(kiln_cuda_mm_geom_of(&a, &b4, NULL, &g) && g.b_bs == 28);
    kiln_cuda_strided y1 = {NULL, 4, {1, 3, 5, 4}, {60, 4, 12, 1}}, a1 = a, b1 = b4;
    a1.dims[0] = 1;
    b1.dims[0] = 1;
    CHECK(kiln_cuda_mm_geom_of(&a1, &b1, &y1, &g));
    CHECK(g.batch == 3 && g.y_rs == 12 && g.y_bs == 4 && g.a_bs == 35 && g.b_bs == 28);
    kiln_cuda_strided ycol = {NULL, 4, {1, 3, 5, 4}, {60, 20, 1, 5}}; // n not innermost
    CHECK(!kiln_cuda_mm_geom_of(&a1, &b1, &ycol, &g));
}

// Separate projections (exported BERT): q, k, v = linear -> reshape [B, S, H, E] -> permute
// (0, 2, 1, 3); sdpa -> permute (0, 2, 1, 3) -> reshape -> linear. Without k_out the builder
// merges the projections into the packed form; with k_out, k's permuted tensor is also an engine
// output: the head projections merge instead (pass_attention.c 6.: one linear, slices of its
// heads), q and v are read through the slices' views, and k's slice and permute run (the permute's
// output is materialized).
static void separate(int k_out) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    int64_t dims[3] = {B, S, D}, split[4] = {B, S, H, E}, swap[4] = {0, 2, 1, 3};
    int64_t merge[3] = {B, S, D};
    int32_t x = -1, qkv[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    for (int i = 0; i < 3; i++) {
        qkv[i] = permute(g, reshape(g, linear(g, x, D, D), split, 4), swap, 4);
    }
    int32_t att = node(g, KILN_OP_SDPA, qkv, 3, NULL, 0);
    att = linear(g, reshape(g, permute(g, att, swap, 4), merge, 3), D, D);
    CHECK(kiln_graph_mark_output(g, att, "y") == KILN_OK);
    if (k_out) CHECK(kiln_graph_mark_output(g, qkv[1], "k") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0), l0 = find_head(&p, KILN_OP_LINEAR, 0);
    uint32_t l1 = find_head(&p, KILN_OP_LINEAR, l0 + 1);
    uint32_t l2 = l1 == UINT32_MAX ? l1 : find_head(&p, KILN_OP_LINEAR, l1 + 1);
    if (!k_out) {
        // the builder merged the three projections (pass_attention.c): the packed form, folded
        CHECK(sdpa != UINT32_MAX && l0 < sdpa && l1 > sdpa);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SELECT), 3);
        if (sdpa != UINT32_MAX && l0 < sdpa) {
            int32_t x3 = kiln_plan_group_output(&p, l0);
            int32_t bases[3] = {x3, x3, x3};
            int64_t col0[3] = {0, D, 2 * D};
            CHECK_EQ_INT(f.sdpa_in[sdpa], 7);
            CHECK(f.sdpa_out[sdpa] > (int32_t)sdpa);
            bind_views(&p, views);
            check_views(&p, &f, views, sdpa, bases, col0, 3 * D);
            check_lifetimes(&p, &f, sdpa, bases, 1);
            unbind(&p, views);
        }
        kiln_cuda_fold_free(&p, &f);
        kiln_plan_release(&p);
        return;
    }
    CHECK(sdpa != UINT32_MAX && l0 < sdpa && l1 > sdpa && l2 == UINT32_MAX);
    if (sdpa != UINT32_MAX && l0 < sdpa) {
        // the views' base: the heads reshape of the merged projection (it runs for k's slice;
        // the memory is the projection's, aliased on the device: the same offsets)
        int32_t x3 = kiln_plan_group_output(&p, l0);
        for (uint32_t li = l0 + 1; li < sdpa; li++) {
            if (p.layers[li].op == KILN_OP_RESHAPE && p.ids[p.layers[li].input_begin] == x3) {
                x3 = p.ids[p.layers[li].output_begin];
                break;
            }
        }
        int32_t bases[3] = {x3, x3, x3};
        int64_t col0[3] = {0, D, 2 * D};
        fprintf(stderr,
                "separate (k an output): %u virtual, sdpa operands %u (mask %u), outputs %u, moved "
                "out of the arena %u\n",
                f.n_virtual, f.n_sdpa_in, f.sdpa_in[sdpa], f.n_sdpa_out, f.n_reloc);
        CHECK_EQ_INT(f.sdpa_in[sdpa], 5);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SLICE), 2);
        CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_PERMUTE), 3);
        CHECK(f.sdpa_out[sdpa] > (int32_t)sdpa);
        bind_views(&p, views);
        check_views(&p, &f, views, sdpa, bases, col0, 3 * D);
        check_lifetimes(&p, &f, sdpa, bases, 3);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// The grouped-query prefill both cases below plan: q over GH = 2 * 2 heads of E, k and v over
// 2, each linear of x [B, S, 4 E] -> head split [B, S, H_j, E] (with rot, q and k then through
// a rotary of constant tables [S, 1, E]) -> permute (0, 2, 1, 3); k and v repeated twice
// (unsqueeze, expand, reshape); causal sdpa; the head merge into a linear. 0 when it did not
// load.
static int plan_gqa(int rot, kiln_plan *p, kiln_cuda_fold *f) {
    enum { G = 2, R = 2, GH = G * R, DQ = GH * E, DK = G * E };
    kiln_graph *g = NULL;
    int64_t dims[3] = {B, S, DQ}, qsplit[4] = {B, S, GH, E}, ksplit[4] = {B, S, G, E};
    int64_t swap[4] = {0, 2, 1, 3}, merge[3] = {B, S, DQ}, two = 2, td[3] = {S, 1, E};
    int64_t ex[5] = {B, G, R, S, E}, rep[4] = {B, GH, S, E}, one = 1;
    int32_t x = -1, qkv[3], cs = -1, sn = -1;
    memset(p, 0, sizeof *p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    if (rot) {
        cs = constant(g, 3, td);
        sn = constant(g, 3, td);
    }
    for (int j = 0; j < 3; j++) {
        int32_t c = reshape(g, linear(g, x, DQ, j == 0 ? DQ : DK), j == 0 ? qsplit : ksplit, 4);
        if (rot && j < 2) {
            int32_t ri[3] = {c, cs, sn};
            c = node(g, KILN_OP_ROTARY, ri, 3, NULL, 0);
        }
        c = permute(g, c, swap, 4);
        if (j > 0) {
            kiln_attr ua = {"dim", &two, NULL, 1}, ea = {"shape", ex, NULL, 5};
            int32_t u = node(g, KILN_OP_UNSQUEEZE, &c, 1, &ua, 1);
            c = reshape(g, node(g, KILN_OP_EXPAND, &u, 1, &ea, 1), rep, 4);
        }
        qkv[j] = c;
    }
    kiln_attr ca = {"is_causal", &one, NULL, 1};
    int32_t att = node(g, KILN_OP_SDPA, qkv, 3, &ca, 1);
    att = linear(g, reshape(g, permute(g, att, swap, 4), merge, 3), DQ, DQ);
    CHECK(kiln_graph_mark_output(g, att, "y") == KILN_OK);
    if (!load(g, p)) return 0;
    CHECK(kiln_cuda_fold_plan(p, NULL, NULL, NULL, 1, 0, f) == KILN_OK);
    return 1;
}

// Grouped-query attention as a decoder's prefill exports it: q = permute(reshape(linear(x, D)),
// [B, S, GH, E]) with GH = 4 query heads, k and v over G = 2 kv heads ([B, S, G * E] projections,
// head split, permute) each repeated R = 2 times (transformers' repeat_kv: unsqueeze, expand,
// reshape), is_causal, the head merge (permute, reshape) into a linear. The builder merges the
// three projections (pass_attention.c 6.: one linear of GH + 2 G heads, a slice each) and its
// broadcast form leaves a rank-5 sdpa over q [B, G, R, S, E] and k, v [B, G, 1, S, E] whose
// result is permuted to [B, S, G, R, E]: every link is a view here (no slice, permute, reshape
// or expand runs), q reads head g R + r of the merged projection, k head GH + g and v head
// GH + G + g, and the sdpa writes [B, S, GH, E] directly.
static void gqa_case(void) {
    enum { G = 2, R = 2, GH = G * R, DQ = GH * E, DK = G * E };
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    if (!plan_gqa(0, &p, &f)) return;
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0), run = 0;
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        uint32_t op = p.layers[li].op;
        if (op == KILN_OP_PERMUTE || op == KILN_OP_EXPAND || op == KILN_OP_UNSQUEEZE ||
            op == KILN_OP_COPY || op == KILN_OP_SLICE)
            run += !(f.virt[li] & KILN_CUDA_FOLD_VIRTUAL);
        if (op == KILN_OP_RESHAPE)
            run += !(f.virt[li] & KILN_CUDA_FOLD_VIRTUAL) &&
                   f.alias[p.ids[p.layers[li].output_begin]] < 0;
    }
    fprintf(stderr, "gqa: %u virtual, sdpa operands %u, outputs %u, view layers run %u\n",
            f.n_virtual, f.n_sdpa_in, f.n_sdpa_out, run);
    CHECK_EQ_INT(run, 0);
    {
        uint32_t n_expand = 0;
        for (uint32_t li = 0; li < p.n_layers; li++) n_expand += p.layers[li].op == KILN_OP_EXPAND;
        CHECK_EQ_INT(n_expand, 0);
    }
    CHECK(sdpa != UINT32_MAX);
    if (sdpa != UINT32_MAX) {
        const kiln_plan_layer *l = &p.layers[sdpa];
        int32_t ins[3], w = f.sdpa_dst[sdpa], lin[3];
        const uint32_t l0 = find_head(&p, KILN_OP_LINEAR, 0);
        CHECK(l0 < sdpa && find_head(&p, KILN_OP_LINEAR, l0 + 1) > sdpa); // one projection
        for (int j = 0; j < 3; j++) {
            ins[j] = p.ids[l->input_begin + j];
            lin[j] = l0 == UINT32_MAX ? -1 : kiln_plan_group_output(&p, l0);
        }
        CHECK_EQ_INT(p.tensors[p.ids[l->output_begin]].shape.rank, 5);
        CHECK_EQ_INT(f.sdpa_in[sdpa], 7);
        CHECK(f.sdpa_out[sdpa] > (int32_t)sdpa && w >= 0);
        CHECK(lin[0] >= 0 && lin[1] >= 0 && lin[2] >= 0);
        if (w >= 0 && lin[0] >= 0 && lin[1] >= 0 && lin[2] >= 0) {
            int bad = 0;
            kiln_cuda_strided v[4];
            bind_views(&p, views);
            for (int j = 0; j < 3; j++) kiln_cuda_fold_view(&p, &f, views, ins[j], &v[j]);
            kiln_cuda_fold_out_view(&p, &f, views, sdpa, &v[3]);
            for (int j = 0; j < 4; j++) CHECK(v[j].rank == 5 && v[j].str[4] == 1);
            CHECK(v[1].dims[2] == 1 && v[2].dims[2] == 1 && v[0].dims[2] == R);
            int32_t base[4] = {lin[0], lin[1], lin[2], w};
            for (int64_t b = 0; b < B; b++)
                for (int64_t gi = 0; gi < G; gi++)
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t s = 0; s < S; s++)
                            for (int64_t e = 0; e < E; e++) {
                                const int64_t row = (b * S + s) * (DQ + 2 * DK);
                                int64_t hq = row + (gi * R + r) * E + e;
                                int64_t hk = row + DQ + gi * E + e;
                                int64_t ho = ((b * S + s) * GH + gi * R + r) * E + e;
                                int64_t want[4] = {hq, hk, hk + DK, ho};
                                for (int j = 0; j < 4; j++) {
                                    const kiln_cuda_strided *u = &v[j];
                                    int64_t rr = j == 1 || j == 2 ? 0 : r;
                                    int64_t o = b * u->str[0] + gi * u->str[1] + rr * u->str[2] +
                                                s * u->str[3] + e;
                                    bad +=
                                        ((const uint16_t *)u->data - mem[base[j]]) + o != want[j];
                                }
                            }
            CHECK_MSG(bad == 0, "gqa: %d view elements at the wrong offset", bad);
            unbind(&p, views);
        }
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// Grouped-query attention with rotary embeddings (transformers' Llama after the builder's view
// rules): q over GH = 4 heads, k and v over G = 2, each linear -> head split [B, S, H_j, E]; q
// and k through a rotary of constant tables [S, 1, E] -> permute (0, 2, 1, 3); k, v repeated;
// causal sdpa. The builder merges the projections (one linear of GH + 2 G heads, a slice each:
// pass_attention.c 6.); the fold reads each rotary's x through its slice's view (row (b, s) of
// the merged projection, heads from the slice's start), v's slice is a view of the sdpa, and
// no slice runs.
static void rope_heads_case(void) {
    enum { G = 2, R = 2, GH = G * R, DQ = GH * E, DK = G * E, W = DQ + 2 * DK };
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    if (!plan_gqa(1, &p, &f)) return;
    const uint32_t l0 = find_head(&p, KILN_OP_LINEAR, 0), sdpa = find_head(&p, KILN_OP_SDPA, 0);
    CHECK(l0 < sdpa && sdpa != UINT32_MAX && find_head(&p, KILN_OP_LINEAR, l0 + 1) > sdpa);
    uint32_t slices = 0, slices_run = 0, rot = 0;
    for (uint32_t li = 0; li < p.n_layers; li++) {
        if (p.layers[li].op == KILN_OP_SLICE) {
            slices++;
            slices_run += !(f.virt[li] & KILN_CUDA_FOLD_VIRTUAL);
        }
    }
    fprintf(stderr, "rope heads: %u virtual, %u slices (%u run), rotary inputs through views %u\n",
            f.n_virtual, slices, slices_run, f.n_rot_in);
    CHECK(slices == 3 && slices_run == 0);
    CHECK_EQ_INT(f.n_rot_in, 2);
    CHECK_EQ_INT(f.sdpa_in[sdpa], 7);
    if (l0 != UINT32_MAX) {
        const int32_t y = kiln_plan_group_output(&p, l0);
        int bad = 0;
        bind_views(&p, views);
        for (uint32_t li = 0; li < p.n_layers; li++) {
            if (p.layers[li].op != KILN_OP_ROTARY) continue;
            const int32_t t = p.ids[p.layers[li].input_begin];
            const int64_t heads = p.tensors[t].shape.max[2], at0 = rot == 0 ? 0 : DQ;
            kiln_cuda_strided v;
            CHECK(f.sdpa_in[li] == 1);
            kiln_cuda_fold_view(&p, &f, views, t, &v);
            CHECK(v.rank == 4 && v.str[3] == 1 && v.dims[2] == (rot == 0 ? GH : G));
            for (int64_t b = 0; b < B; b++)
                for (int64_t si = 0; si < S; si++)
                    for (int64_t h = 0; h < heads; h++)
                        for (int64_t e = 0; e < E; e++) {
                            int64_t o = b * v.str[0] + si * v.str[1] + h * v.str[2] + e;
                            int64_t want = (b * S + si) * W + at0 + h * E + e;
                            bad += ((const uint16_t *)v.data - mem[y]) + o != want;
                        }
            rot++;
        }
        CHECK_MSG(rot == 2 && bad == 0, "rope heads: %u rotaries, %d view elements wrong", rot,
                  bad);
        unbind(&p, views);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// k reaches the sdpa as permute (0, 2, 3, 1) of [1, 8, 2, 8] (S = E = 8: k^T as k): its view
// would have E not innermost, so that chain is not folded (q and v still are).
static void transposed_k(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t dims[3] = {1, 8, 16}, split[4] = {1, 8, 2, 8}, swap[4] = {0, 2, 1, 3};
    int64_t to_es[4] = {0, 2, 3, 1};
    int32_t x = -1, qkv[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    for (int i = 0; i < 3; i++) {
        int32_t h = reshape(g, linear(g, x, 16, 16), split, 4);
        qkv[i] = permute(g, h, i == 1 ? to_es : swap, 4);
    }
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_SDPA, qkv, 3, NULL, 0), "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0);
    CHECK(sdpa != UINT32_MAX);
    if (sdpa != UINT32_MAX) CHECK_EQ_INT(f.sdpa_in[sdpa], 5);
    CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_PERMUTE), 2);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// k from a state (a KV cache kept [B, S, H, E]): permute (0, 2, 1, 3) of the state, read by the
// sdpa, the state then updated from a projection (a copy layer after every other layer). The
// permute of the state's old value folds (the update comes after the sdpa), and the sdpa reads
// the state's own memory through the view.
static void state_k(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    kiln_tensor views[64];
    int64_t dims[3] = {B, S, D}, split[4] = {B, S, H, E}, swap[4] = {0, 2, 1, 3};
    int32_t x = -1, kc = -1, qkv[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, dims, dims, &x) == KILN_OK);
    CHECK(kiln_graph_add_state(g, "k", KILN_DTYPE_F32, 4, split, NULL, 0, &kc) == KILN_OK);
    qkv[0] = permute(g, reshape(g, linear(g, x, D, D), split, 4), swap, 4);
    qkv[1] = permute(g, kc, swap, 4);
    qkv[2] = permute(g, reshape(g, linear(g, x, D, D), split, 4), swap, 4);
    CHECK(kiln_graph_update_state(g, kc, reshape(g, linear(g, x, D, D), split, 4)) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_SDPA, qkv, 3, NULL, 0), "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t sdpa = find_head(&p, KILN_OP_SDPA, 0);
    int32_t state = -1;
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        if (p.tensors[i].kind == KILN_TENSOR_STATE) state = (int32_t)i;
    }
    CHECK(sdpa != UINT32_MAX && state >= 0);
    if (sdpa != UINT32_MAX && state >= 0) {
        int32_t k = p.ids[p.layers[sdpa].input_begin + 1];
        CHECK_MSG(f.sdpa_in[sdpa] & 2u, "sdpa operands %u", f.sdpa_in[sdpa]);
        CHECK(base_of(&(fold_state){.p = &p, .f = &f}, k) == state && !f.reloc[state]);
        CHECK(f.producer[state] > (int32_t)sdpa); // the update's copy, after the sdpa
        kiln_cuda_strided v;
        int bad = 0;
        bind_views(&p, views);
        kiln_cuda_fold_view(&p, &f, views, k, &v);
        CHECK(v.rank == 4 && v.dims[1] == H && v.dims[2] == S && v.str[3] == 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < S; t++)
                    for (int64_t e = 0; e < E; e++) {
                        bad += at(&v, state, b, h, t, e) != ((b * S + t) * H + h) * E + e;
                    }
        CHECK_MSG(bad == 0, "%d view elements at the wrong offset", bad);
        unbind(&p, views);
        // the same chain with the state's update moved between the permute and the sdpa (as a
        // plan could order it): the read cannot be deferred, the fold is undone
        fold_state fs = {.p = &p, .f = &f};
        const int32_t first = chain_first(&fs, k);
        CHECK(first >= 0 && first < (int32_t)sdpa);
        CHECK(base_safe(&fs, state, first, sdpa));
        f.producer[state] = first + 1;
        CHECK(!base_safe(&fs, state, first, sdpa));
        f.producer[state] = first - 1; // updated before the view reads it: the new value
        CHECK(base_safe(&fs, state, first, sdpa));
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// True when some layer that runs in (li, end] writes over tensor b's arena bytes.
static int written_between(const kiln_plan *p, const kiln_cuda_fold *f, uint32_t li, uint32_t end,
                           int32_t b) {
    const kiln_plan_tensor *bt = &p->tensors[b];
    for (uint32_t k = li + 1; k <= end && k < p->n_layers; k++) {
        if (f->virt[k] & KILN_CUDA_FOLD_ALIAS) continue;
        for (uint32_t o = 0; o < p->layers[k].n_outputs; o++) {
            const kiln_plan_tensor *t = &p->tensors[p->ids[p->layers[k].output_begin + o]];
            if (t->kind == KILN_TENSOR_ACTIVATION && t->nbytes > 0 &&
                t->offset < bt->offset + bt->nbytes && bt->offset < t->offset + t->nbytes)
                return 1;
        }
    }
    return 0;
}

static int overlap_tensors(const kiln_plan *p, int32_t a, int32_t b) {
    const kiln_plan_tensor *x = &p->tensors[a], *y = &p->tensors[b];
    return x->kind == KILN_TENSOR_ACTIVATION && y->kind == KILN_TENSOR_ACTIVATION &&
           x->offset < y->offset + y->nbytes && y->offset < x->offset + x->nbytes;
}

// Reshapes whose output takes its input's memory (aliases): a chain of two after a relu shares
// the relu's output; a reshape whose input's bytes the planner gives to a later tensor (read
// after it) keeps its kernel. Every alias is checked against the plan: nothing that runs between
// the reshape and its output's last reader writes over the base.
static void aliases_case(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t d2[2] = {64, 64}, s1[2] = {32, 128}, s2[1] = {4096};
    int32_t x = -1, x2 = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, d2, d2, &x) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x2", KILN_DTYPE_F32, 2, d2, d2, &x2) == KILN_OK);
    int32_t y = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    int32_t r = reshape(g, y, s1, 2);
    // r read right away: aliased (exp: the builder moves activations in front of a reshape)
    int32_t t = node(g, KILN_OP_EXP, &r, 1, NULL, 0);
    int32_t r2 = reshape(g, t, s2, 1);
    int32_t ex = node(g, KILN_OP_EXP, &x2, 1, NULL, 0); // may take t's bytes ...
    int32_t ins[2] = {ex, ex};
    ex = node(g, KILN_OP_MUL, ins, 2, NULL, 0);
    int32_t ex2 = reshape(g, ex, s2, 1);
    int32_t sum[2] = {r2, ex2}; // ... while r2 (t's bytes if aliased) is still to be read
    int32_t out = node(g, KILN_OP_ADD, sum, 2, NULL, 0);
    CHECK(kiln_graph_mark_output(g, out, "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t n_alias = 0, n_reshape = 0;
    for (uint32_t li = 0; li < p.n_layers; li++) {
        if (p.layers[li].op != KILN_OP_RESHAPE) continue;
        n_reshape++;
        const int32_t o = p.ids[p.layers[li].output_begin];
        if (!(f.virt[li] & KILN_CUDA_FOLD_ALIAS)) {
            CHECK(f.alias[o] < 0);
            continue;
        }
        n_alias++;
        const int32_t b = f.alias[o];
        CHECK(b >= 0 && p.tensors[b].kind == KILN_TENSOR_ACTIVATION);
        uint32_t end = 0;
        for (uint32_t k = 0; k < p.n_layers; k++) {
            for (uint32_t j = 0; j < p.layers[k].n_inputs; j++) {
                if (p.ids[p.layers[k].input_begin + j] == o && k > end) end = k;
            }
        }
        // a base in the arena is not written over while the alias is read; else it moved out
        // of the arena for that whole range
        if (f.reloc[b]) {
            CHECK(f.live_first[b] <= li && f.live_last[b] >= end);
        } else {
            CHECK_MSG(!written_between(&p, &f, li, end, b), "reshape %u aliased over a write", li);
        }
    }
    CHECK_EQ_INT(n_reshape, 3);
    CHECK_MSG(n_alias == 3, "%u of 3 reshapes aliased", n_alias);
    CHECK_EQ_INT(f.n_alias, n_alias);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

static int32_t slice(kiln_graph *g, int32_t x, int64_t dim, int64_t start, int64_t end) {
    int64_t step = 1;
    kiln_attr a[4] = {{"dim", &dim, NULL, 1},
                      {"start", &start, NULL, 1},
                      {"end", &end, NULL, 1},
                      {"step", &step, NULL, 1}};
    return node(g, KILN_OP_SLICE, &x, 1, a, 4);
}

// Slices that are contiguous runs of their input (the dims before the sliced one all 1, step 1)
// alias it at their byte offset: a [1, 24, 4, 8] fp16 tensor split into three 8-channel runs
// (offsets 0, 512 and 1024 bytes). A slice of the last dim (not contiguous) and one at a 2-byte
// offset keep their kernels.
static void slice_aliases_case(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t d4[4] = {1, 24, 4, 8}, d2[2] = {1, 6};
    int32_t x = -1, z = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, d4, d4, &x) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 2, d2, d2, &z) == KILN_OK);
    int32_t y = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    int32_t q = slice(g, y, 1, 0, 8), k = slice(g, y, 1, 8, 16), v = slice(g, y, 1, 16, 24);
    int32_t last = slice(g, y, 3, 0, 4);
    int32_t qk[2] = {q, k};
    int32_t m = node(g, KILN_OP_MUL, qk, 2, NULL, 0);
    int32_t mv[2] = {m, v};
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_ADD, mv, 2, NULL, 0), "y") == KILN_OK);
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_NEG, &last, 1, NULL, 0), "last") == KILN_OK);
    int32_t zr = node(g, KILN_OP_RELU, &z, 1, NULL, 0);
    int32_t odd = slice(g, zr, 1, 1, 3);
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_NEG, &odd, 1, NULL, 0), "odd") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    uint32_t n_slice = 0, n_alias = 0;
    int64_t offs = 0;
    for (uint32_t li = 0; li < p.n_layers; li++) {
        if (p.layers[li].op != KILN_OP_SLICE) continue;
        n_slice++;
        const int32_t o = p.ids[p.layers[li].output_begin], in = p.ids[p.layers[li].input_begin];
        kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[li]);
        const int64_t dim = kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0);
        const int64_t start = kiln_attrs_int(&a, KILN_A_SLICE_START, 0);
        const int contiguous = dim == 1 && p.tensors[in].shape.rank == 4;
        CHECK_MSG(((f.virt[li] & KILN_CUDA_FOLD_ALIAS) != 0) == contiguous,
                  "slice %u (dim %lld, start %lld): aliased %d", li, (long long)dim,
                  (long long)start, (f.virt[li] & KILN_CUDA_FOLD_ALIAS) != 0);
        if (!contiguous) {
            CHECK(f.alias[o] < 0);
            continue;
        }
        n_alias++;
        CHECK(f.alias[o] == in || f.alias[o] == f.alias[in]);
        CHECK_MSG(f.alias_off[o] == start * 4 * 8 * 2, "slice at %lld: offset %lld",
                  (long long)start, (long long)f.alias_off[o]);
        offs += f.alias_off[o];
    }
    CHECK_EQ_INT(n_slice, 5);
    CHECK_MSG(n_alias == 3 && offs == 512 + 1024, "%u slices aliased, offsets sum %lld", n_alias,
              (long long)offs);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// GEMV folds (cuda_fold.h): an RMSNorm read by four small-M linears, two of them a gated pair
// (HF's order: gate, SiLU, up, mul) and two siblings (q and k), runs inside them; a norm with
// another reader, or at more rows than the fused GEMV takes (one), stays.
static void gemv_case(int max_rows, int extra_reader) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t mins[2] = {1, 64}, maxs[2] = {max_rows, 64}, gd[1] = {64};
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, mins, maxs, &x) == KILN_OK);
    int32_t h = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    double eps = 1e-5;
    kiln_attr ea = {"eps", NULL, &eps, 1};
    int32_t nin[2] = {h, constant(g, 1, gd)};
    int32_t n = node(g, KILN_OP_RMS_NORM, nin, 2, &ea, 1);
    int32_t q = linear(g, n, 64, 64);
    int32_t kproj = linear(g, n, 64, 32); // q's sibling (both engine outputs)
    int32_t gate = linear(g, n, 64, 128);
    gate = node(g, KILN_OP_SILU, &gate, 1, NULL, 0);
    int32_t up = linear(g, n, 64, 128);
    int32_t mi[2] = {gate, up};
    int32_t a = node(g, KILN_OP_MUL, mi, 2, NULL, 0);
    int32_t y = linear(g, a, 128, 64);
    if (extra_reader) {
        int32_t s2[2] = {y, n};
        y = node(g, KILN_OP_ADD, s2, 2, NULL, 0);
    }
    int32_t s3[2] = {y, h}; // h read after the linears: the norm's input lives past them
    y = node(g, KILN_OP_ADD, s3, 2, NULL, 0);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    CHECK(kiln_graph_mark_output(g, q, "q") == KILN_OK);
    CHECK(kiln_graph_mark_output(g, kproj, "k") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    CHECK_EQ_INT(f.n_gemv_norm + f.n_gemv_pair + f.n_gemv_sib, 0); // cuda.gemv_fold off
    kiln_cuda_fold_free(&p, &f);
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 1, &f) == KILN_OK);
    const uint32_t norm = find_head(&p, KILN_OP_RMS_NORM, 0);
    CHECK(norm != UINT32_MAX);
    const int folds = max_rows == KILN_CUDA_GEMV_FOLD_M && !extra_reader;
    CHECK_EQ_INT(f.n_gemv_norm, folds ? 1 : 0);
    CHECK_EQ_INT(f.n_gemv_pair, max_rows == KILN_CUDA_GEMV_FOLD_M ? 1 : 0);
    CHECK_EQ_INT(f.virt[norm], folds ? KILN_CUDA_FOLD_GEMV : 0);
    CHECK_EQ_INT(f.n_gemv_sib, max_rows == KILN_CUDA_GEMV_FOLD_M ? 1 : 0);
    uint32_t n_readers = 0, n_gate = 0, n_up = 0, n_sib = 0, last = norm;
    const int32_t nout = p.ids[p.layers[norm].output_begin];
    for (uint32_t li = 0; li < p.n_layers; li++) {
        const kiln_plan_layer *l = &p.layers[li];
        if (l->op != KILN_OP_LINEAR || p.ids[l->input_begin] != nout) {
            CHECK(f.gemv_norm[li] < 0 && f.gemv_pair[li] < 0);
            continue;
        }
        n_readers++;
        if (li > last) last = li;
        CHECK_EQ_INT(f.gemv_norm[li], folds ? (int32_t)norm : -1);
        if (f.gemv_pair[li] >= 0) { // the gate: SiLU and the mul by the up projection fused after
            const uint32_t u = (uint32_t)f.gemv_pair[li];
            n_gate++;
            CHECK(l->n_tail >= 2 && p.layers[li + 1].op == KILN_OP_SILU &&
                  p.layers[li + 2].op == KILN_OP_MUL);
            CHECK(u < li && f.virt[u] == KILN_CUDA_FOLD_GEMV && p.layers[u].op == KILN_OP_LINEAR);
            CHECK(p.ids[p.layers[li + 2].input_begin] == p.ids[p.layers[u].output_begin] ||
                  p.ids[p.layers[li + 2].input_begin + 1] == p.ids[p.layers[u].output_begin]);
        }
        if (f.gemv_next[li] >= 0) { // q: k runs in its launch, and nothing runs between them
            const uint32_t k = (uint32_t)f.gemv_next[li];
            n_sib++;
            CHECK(k > li && f.virt[k] == KILN_CUDA_FOLD_GEMV && f.gemv_next[k] < 0);
            for (uint32_t b = li + 1; b < k; b++) CHECK(f.virt[b] != 0);
        }
        n_up += f.virt[li] == KILN_CUDA_FOLD_GEMV && f.gemv_pair[li] < 0;
    }
    CHECK_EQ_INT(n_readers, 4);
    CHECK_EQ_INT(n_gate, max_rows == KILN_CUDA_GEMV_FOLD_M ? 1 : 0);
    CHECK_EQ_INT(n_sib, n_gate);
    CHECK_EQ_INT(n_up, 2 * n_gate); // the up projection and the sibling
    if (folds) { // the norm's input is read by the linears in its place: not written over
        const int32_t in = p.ids[p.layers[norm].input_begin];
        CHECK_MSG(!written_between(&p, &f, norm, last, in), "the norm's input written before %u",
                  last);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// Siblings whose outputs are read through reshapes (an LLM's q, k and v projections before the
// head split): the planner gives a projection the bytes of the one before it (read only by its
// reshape), the aliases move those out of the arena, and the siblings' early writes must then
// find their relocated outputs live from the first sibling on.
static void gemv_siblings_relocated(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t d[2] = {1, 64}, gd[1] = {64}, heads[3] = {1, 4, 16};
    int32_t x = -1, r[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, d, d, &x) == KILN_OK);
    int32_t h = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    double eps = 1e-5;
    kiln_attr ea = {"eps", NULL, &eps, 1};
    int32_t nin[2] = {h, constant(g, 1, gd)};
    int32_t n = node(g, KILN_OP_RMS_NORM, nin, 2, &ea, 1);
    for (int i = 0; i < 3; i++) r[i] = reshape(g, linear(g, n, 64, 64), heads, 3);
    // exp, not an activation: the builder would move one in front of the reshape
    for (int i = 0; i < 3; i++) r[i] = node(g, KILN_OP_EXP, &r[i], 1, NULL, 0);
    int32_t s1[2] = {r[0], r[1]}, y = node(g, KILN_OP_ADD, s1, 2, NULL, 0);
    int32_t s2[2] = {y, r[2]};
    y = node(g, KILN_OP_ADD, s2, 2, NULL, 0);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 1, &f) == KILN_OK);
    const uint32_t first = find_head(&p, KILN_OP_LINEAR, 0);
    CHECK(first != UINT32_MAX);
    CHECK_EQ_INT(f.n_gemv_sib, 2);
    uint32_t members = 0, relocated = 0;
    for (int32_t k = (int32_t)first; k >= 0; k = f.gemv_next[k]) {
        const int32_t o = p.ids[p.layers[k].output_begin];
        members++;
        if (f.reloc[o]) { // placed by its live range (cuda_memory.c): from the first sibling
            relocated++;
            CHECK(f.live_first[o] <= first);
        }
        for (int32_t j = f.gemv_next[k]; j >= 0; j = f.gemv_next[j]) { // written together
            const int32_t u = p.ids[p.layers[j].output_begin];
            CHECK(f.reloc[o] || f.reloc[u] || !overlap_tensors(&p, o, u));
        }
    }
    CHECK_EQ_INT(members, 3);
    printf("siblings: %u of 3 outputs relocated\n", relocated);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// A norm without a weight folds too; two linears of the same x with a kernel between them are
// not siblings (the second one's output would be written before that kernel runs).
static void gemv_unweighted_and_apart(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t d[2] = {1, 64};
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, d, d, &x) == KILN_OK);
    int32_t h = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    double eps = 1e-6;
    kiln_attr ea = {"eps", NULL, &eps, 1};
    int32_t n = node(g, KILN_OP_RMS_NORM, &h, 1, &ea, 1);
    int32_t a = linear(g, n, 64, 64);
    int64_t last = -1;
    kiln_attr sa = {"dim", &last, NULL, 1};
    int32_t t = node(g, KILN_OP_SOFTMAX, &a, 1, &sa, 1); // a kernel between the two linears
    int32_t b = linear(g, n, 64, 64);
    int32_t s2[2] = {t, h};
    int32_t y = node(g, KILN_OP_ADD, s2, 2, NULL, 0);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    CHECK(kiln_graph_mark_output(g, b, "b") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 1, &f) == KILN_OK);
    const uint32_t norm = find_head(&p, KILN_OP_RMS_NORM, 0);
    CHECK(norm != UINT32_MAX && p.layers[norm].n_inputs == 1);
    CHECK_EQ_INT(f.n_gemv_norm, 1);
    CHECK_EQ_INT(f.virt[norm], KILN_CUDA_FOLD_GEMV);
    uint32_t running_between = 0, lin[2], nl = 0;
    for (uint32_t li = 0; li < p.n_layers && nl < 2; li++) {
        if (p.layers[li].op == KILN_OP_LINEAR) lin[nl++] = li;
    }
    CHECK_EQ_INT(nl, 2);
    for (uint32_t li = lin[0] + 1; nl == 2 && li < lin[1]; li++) running_between += f.virt[li] == 0;
    CHECK(p.layers[lin[0]].n_tail == 0 && p.layers[lin[1]].n_tail == 0);
    // siblings only when nothing runs between them (the builder keeps the softmax there)
    CHECK(running_between > 0);
    CHECK_EQ_INT(f.n_gemv_sib, 0);
    CHECK(f.gemv_next[lin[0]] < 0);
    printf("gemv apart: %u layers run between the two linears\n", running_between);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// Rope groups (cuda_fold.h): q and k rotated, k and v written into KV caches (states) at a
// position, as a decoder step exports. variant 0: the k rotary and both cache writes run in the
// q rotary's launch; 1: the rotated k is also an engine output (no group); 2: the key cache's
// old value is read before the write (the write is then not in place: no group); 3: q is an
// engine output and the rows just written are read back (the GPU suite's model): a group; 4:
// the tables cover half of each head (a partial rotation, which the group's kernel does not
// pass through): no group.
static void rope_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t qd[4] = {1, H, 1, E}, kd[4] = {1, H, 1, E}, td[4] = {1, 1, 1, variant == 4 ? E / 2 : E};
    int64_t cd[4] = {1, H, S, E}, pd[1] = {1}, two = 2, one = 1;
    int32_t kc = -1, vc = -1, xq = -1, xk = -1, xv = -1, cs = -1, sn = -1, pos = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_state(g, "kc", KILN_DTYPE_F32, 4, cd, NULL, 0, &kc) == KILN_OK);
    CHECK(kiln_graph_add_state(g, "vc", KILN_DTYPE_F32, 4, cd, NULL, 0, &vc) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "xq", KILN_DTYPE_F32, 4, qd, qd, &xq) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "xk", KILN_DTYPE_F32, 4, kd, kd, &xk) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "xv", KILN_DTYPE_F32, 4, kd, kd, &xv) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "cos", KILN_DTYPE_F32, 4, td, td, &cs) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "sin", KILN_DTYPE_F32, 4, td, td, &sn) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "pos", KILN_DTYPE_I64, 1, pd, pd, &pos) == KILN_OK);
    int32_t rq[3] = {xq, cs, sn}, rk[3] = {xk, cs, sn};
    int32_t q = node(g, KILN_OP_ROTARY, rq, 3, NULL, 0);
    int32_t k = node(g, KILN_OP_ROTARY, rk, 3, NULL, 0);
    kiln_attr ic[2] = {{"dim", &two, NULL, 1}, {"wrap", &one, NULL, 1}};
    if (variant == 2) {
        int64_t ax = 2;
        kiln_attr sa = {"dims", &ax, NULL, 1};
        CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_SUM, &kc, 1, &sa, 1), "old") == KILN_OK);
    }
    int32_t wk[3] = {kc, pos, k}, wv[3] = {vc, pos, xv};
    int32_t kc2 = node(g, KILN_OP_INDEX_COPY, wk, 3, ic, 2);
    int32_t vc2 = node(g, KILN_OP_INDEX_COPY, wv, 3, ic, 2);
    CHECK(kiln_graph_update_state(g, kc, kc2) == KILN_OK);
    CHECK(kiln_graph_update_state(g, vc, vc2) == KILN_OK);
    if (variant == 3) { // q an engine output, the rows just written read back (index)
        kiln_attr ia = {"dim", &two, NULL, 1};
        int32_t gk[2] = {kc2, pos}, gv[2] = {vc2, pos};
        CHECK(kiln_graph_mark_output(g, q, "q") == KILN_OK);
        CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_INDEX, gk, 2, &ia, 1), "k") == KILN_OK);
        CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_INDEX, gv, 2, &ia, 1), "v") == KILN_OK);
    } else {
        int32_t three[3] = {q, kc2, vc2};
        CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_SDPA, three, 3, NULL, 0), "y") == KILN_OK);
    }
    if (variant == 1) CHECK(kiln_graph_mark_output(g, k, "k") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    const uint32_t r1 = find_head(&p, KILN_OP_ROTARY, 0);
    const uint32_t r2 = r1 == UINT32_MAX ? r1 : find_head(&p, KILN_OP_ROTARY, r1 + 1);
    CHECK(r2 != UINT32_MAX);
    if (r2 != UINT32_MAX) {
        uint32_t n_rope = 0;
        for (uint32_t li = 0; li < p.n_layers; li++)
            n_rope += (f.virt[li] & KILN_CUDA_FOLD_ROPE) != 0;
        if (variant == 0 || variant == 3) {
            CHECK_MSG(f.n_rope == 1 && f.rope_k[r1] == (int32_t)r2, "rope groups %u", f.n_rope);
            const int32_t kcl = f.rope_kc[r1], vcl = f.rope_vc[r1];
            CHECK(kcl > (int32_t)r2 && vcl > (int32_t)r2 && kcl != vcl);
            if (kcl >= 0 && vcl >= 0) {
                CHECK(p.layers[kcl].op == KILN_OP_INDEX_COPY &&
                      p.layers[vcl].op == KILN_OP_INDEX_COPY);
                // the key cache write reads the rotated k; the value one the v input's rows
                CHECK(p.ids[p.layers[kcl].input_begin + 2] == out0(&p, r2));
                CHECK(p.tensors[in0(&p, (uint32_t)kcl)].kind == KILN_TENSOR_STATE);
                CHECK((f.virt[r2] & KILN_CUDA_FOLD_ROPE) && (f.virt[kcl] & KILN_CUDA_FOLD_ROPE) &&
                      (f.virt[vcl] & KILN_CUDA_FOLD_ROPE) && f.virt[r1] == 0);
            }
            CHECK(n_rope == 3);
        } else {
            CHECK_MSG(f.n_rope == 0 && n_rope == 0 && f.rope_k[r1] < 0, "variant %d: %u groups",
                      variant, f.n_rope);
        }
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

static int32_t conv2d(kiln_graph *g, int32_t x, int64_t ci, int64_t co, int64_t k, int64_t groups) {
    int64_t wd[4] = {co, ci / groups, k, k}, bd[1] = {co}, pad[2] = {k / 2, k / 2};
    int32_t ins[3] = {x, constant(g, 4, wd), constant(g, 1, bd)};
    kiln_attr a[2] = {{"padding", pad, NULL, 2}, {"groups", &groups, NULL, 1}};
    return node(g, KILN_OP_CONV2D, ins, 3, a, 2);
}

// Channels-last model code (ConvNeXt's blocks), fp16, with C channels: an NHWC conv, permute
// (0, 2, 3, 1), layer_norm and a linear over the channels, permute (0, 3, 1, 2) back, a depthwise
// conv, the residual add, a depthwise conv of the add's output, and permute (0, 2, 3, 1) into a
// linear. With C = 16 (cuda_layout.h) every permute is a layout permute: no kernel (an alias of
// its input's memory), the depthwise convs and the add NHWC; the only copy is the engine
// input's NHWC copy for the first conv. With C = 12 (not a multiple of 8) none is, and no
// permute is aliased.
static void layout_permutes_case(int64_t c) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    kiln_cuda_fold f;
    int64_t xd[4] = {1, c, 6, 6}, to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
    int64_t ln_dims = 1;
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t h0 = conv2d(g, x, c, c, 1, 1);
    int32_t t = permute(g, h0, to_nhwc, 4);
    {
        int64_t wd[1] = {c};
        int32_t ins[3] = {t, constant(g, 1, wd), constant(g, 1, wd)};
        kiln_attr a = {"normalized_ndim", &ln_dims, NULL, 1};
        t = node(g, KILN_OP_LAYER_NORM, ins, 3, &a, 1);
    }
    t = linear(g, t, c, c);
    int32_t b = permute(g, t, to_nchw, 4);
    b = conv2d(g, b, c, c, 3, c);
    int32_t two[2] = {b, h0};
    int32_t r = node(g, KILN_OP_ADD, two, 2, NULL, 0);
    int32_t d = conv2d(g, r, c, c, 3, c);
    t = permute(g, d, to_nhwc, 4);
    t = linear(g, t, c, c);
    CHECK(kiln_graph_mark_output(g, t, "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, KILN_CUDA_LAYOUT_NHWC, &l) == KILN_OK);
    CHECK(kiln_cuda_fold_plan(&p, l.nhwc, l.alt, l.ident, 1, 0, &f) == KILN_OK);
    const int on = c % 8 == 0;
    uint32_t n_perm = 0, n_dw = 0;
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        const kiln_plan_layer *pl = &p.layers[li];
        const int32_t xi = p.ids[pl->input_begin], o = kiln_plan_group_output(&p, li);
        if (pl->op == KILN_OP_PERMUTE) {
            n_perm++;
            CHECK_MSG(l.ident[li] == on, "C %lld: permute %u ident %d", (long long)c, li,
                      l.ident[li]);
            CHECK_MSG(((f.virt[li] & KILN_CUDA_FOLD_ALIAS) != 0) == on,
                      "C %lld: permute %u aliased %d", (long long)c, li, f.virt[li]);
            if (on) {
                CHECK(l.nhwc[xi] != l.nhwc[o]); // one side NHWC, the same bytes
                CHECK(f.alias[o] >= 0 && f.alias_off[o] == 0);
            }
        } else if (pl->op == KILN_OP_CONV2D && li != find_head(&p, KILN_OP_CONV2D, 0)) {
            n_dw++;
            CHECK_MSG(l.head_nhwc[li] == on && l.nhwc[o] == on, "C %lld: depthwise %u NHWC %d",
                      (long long)c, li, l.head_nhwc[li]);
        } else if (pl->op == KILN_OP_ADD) {
            CHECK(l.nhwc[o] == on);
        }
    }
    CHECK_EQ_INT(n_perm, 3);
    CHECK_EQ_INT(n_dw, 2);
    CHECK_EQ_INT(l.n_ident, on ? 3 : 0);
    if (on) CHECK_MSG(l.n_copies == 1, "%u layout copies", l.n_copies);
    printf("layout permutes, C %lld: %u of %u permutes layout permutes, %u aliased, %u copies\n",
           (long long)c, l.n_ident, n_perm, f.n_alias, l.n_copies);
    kiln_cuda_fold_free(&p, &f);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// Conv prologues (cuda_fold.h): an NHWC 1x1 conv (32 channels) whose tail is StarReLU (relu, pow
// 2, mul and add by one-element weights), read only by a depthwise 7x7 of stride 1: the 7x7
// applies the tail (variant 0). Nothing folds when the tail's output is also an engine output
// (1), the mul's operand is an engine input, not a weight (2), the depthwise conv is a 5x5 (3),
// the tail has five ops (4: a clamp after the add), the folds are off (5), or the pow's exponent
// is 3 (6: only squares fold). Variant 7 folds a clamp, a square and a subtraction from a weight
// (the running value on the right).
static void prologue_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    kiln_cuda_fold f;
    int64_t xd[4] = {1, 16, 12, 12}, one[1] = {1};
    double lo = -1.0, hi = 4.0;
    int32_t x = -1, sc = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    if (variant == 2)
        CHECK(kiln_graph_add_input(g, "s", KILN_DTYPE_F32, 1, one, one, &sc) == KILN_OK);
    kiln_attr cl[2] = {{"min", NULL, &lo, 1}, {"max", NULL, &hi, 1}};
    int32_t h = conv2d(g, x, 16, 32, 1, 1);
    if (variant == 7) {
        h = bin(g, KILN_OP_POW, node(g, KILN_OP_CLAMP, &h, 1, cl, 2),
                scalar(g, KILN_DTYPE_F32, 2.0f));
        h = bin(g, KILN_OP_SUB, constant(g, 1, one), h);
    } else {
        h = bin(g, KILN_OP_POW, node(g, KILN_OP_RELU, &h, 1, NULL, 0),
                scalar(g, KILN_DTYPE_F32, variant == 6 ? 3.0f : 2.0f));
        h = bin(g, KILN_OP_MUL, h, variant == 2 ? sc : constant(g, 1, one));
        h = bin(g, KILN_OP_ADD, h, constant(g, 1, one));
    }
    if (variant == 4) h = node(g, KILN_OP_CLAMP, &h, 1, cl, 2);
    const int32_t d = conv2d(g, h, 32, 32, variant == 3 ? 5 : 7, 32);
    CHECK(kiln_graph_mark_output(g, d, "y") == KILN_OK);
    if (variant == 1) CHECK(kiln_graph_mark_output(g, h, "h") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, KILN_CUDA_LAYOUT_NHWC, &l) == KILN_OK);
    CHECK(kiln_cuda_fold_plan(&p, l.nhwc, l.alt, l.ident, variant != 5, 0, &f) == KILN_OK);
    const uint32_t pc = find_head(&p, KILN_OP_CONV2D, 0);
    const uint32_t dc = pc == UINT32_MAX ? UINT32_MAX : find_head(&p, KILN_OP_CONV2D, pc + 1);
    CHECK(pc != UINT32_MAX && dc != UINT32_MAX);
    if (pc == UINT32_MAX || dc == UINT32_MAX) return;
    CHECK_EQ_INT(p.layers[pc].n_tail, variant == 4 ? 5 : variant == 7 ? 3 : 4);
    CHECK_MSG(l.head_nhwc[pc] && l.head_nhwc[dc], "conv prologue %d: NHWC %d %d", variant,
              l.head_nhwc[pc], l.head_nhwc[dc]);
    printf("conv prologue %d: %u prologues\n", variant, f.n_pre);
    if (variant == 0 || variant == 7) {
        CHECK_EQ_INT(f.n_pre, 1);
        CHECK_EQ_INT(f.pre_src[dc], (int)pc);
        CHECK_EQ_INT(f.pre_dst[pc], (int)dc);
        CHECK(f.virt[pc] == 0 && f.virt[dc] == 0);
    } else {
        CHECK_EQ_INT(f.n_pre, 0);
        CHECK_EQ_INT(f.pre_src[dc], -1);
        CHECK_EQ_INT(f.pre_dst[pc], -1);
    }
    kiln_cuda_fold_free(&p, &f);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// Conv-form attention (CoAtNet's Attention2d), fp16: x [1, 32, 4, 4] -> an NHWC 1x1 conv to
// 3 x 2 heads x 32 channels, reshape [1, 2, 96, 16] (the heads split from the channels, the
// pixels merged), q/k/v sliced along dim 2 and transposed to [1, 2, 16, 32] -> sdpa. The
// reshape reads the conv's NHWC bytes as they are (cuda_layout.h's rs_xpose), so the reshape,
// slices and transposes run no kernel: the sdpa reads each operand through a view of the
// channels-last map, element [0, h, s, e] of part j at pixel s, channel 96 h + 32 j + e. Its
// output, transposed back to [1, 2, 32, 16] and viewed as [1, 64, 4, 4] for a 1x1 conv, is the
// conv's NHWC input: the layout has the permute write channels-last with two channel dims and the
// reshape share its bytes, and the sdpa writes them itself (element [0, h, s, e] at pixel s,
// channel 32 h + e): no transpose runs. Variant 1: the folds off (everything runs).
static void conv_attention_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    kiln_cuda_fold f;
    int64_t xd[4] = {1, 32, 4, 4}, heads[4] = {1, 2, 96, 16}, tr[4] = {0, 1, 3, 2}, two = 2;
    int32_t x = -1, parts[3];
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t qkv = reshape(g, conv2d(g, x, 32, 192, 1, 1), heads, 4);
    for (int64_t i = 0; i < 3; i++) {
        int64_t start = 32 * i, end = 32 * i + 32;
        kiln_attr a[3] = {
            {"dim", &two, NULL, 1}, {"start", &start, NULL, 1}, {"end", &end, NULL, 1}};
        parts[i] = permute(g, node(g, KILN_OP_SLICE, &qkv, 1, a, 3), tr, 4);
    }
    int64_t back[4] = {1, 64, 4, 4};
    int32_t att = permute(g, node(g, KILN_OP_SDPA, parts, 3, NULL, 0), tr, 4);
    int32_t y = conv2d(g, reshape(g, att, back, 4), 64, 32, 1, 1);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, KILN_CUDA_LAYOUT_NHWC, &l) == KILN_OK);
    CHECK(kiln_cuda_fold_plan(&p, l.nhwc, l.alt, l.ident, variant != 1, 0, &f) == KILN_OK);
    const uint32_t conv = find_head(&p, KILN_OP_CONV2D, 0), sdpa = find_head(&p, KILN_OP_SDPA, 0);
    const uint32_t rs = find_head(&p, KILN_OP_RESHAPE, 0);
    const int32_t map = kiln_plan_group_output(&p, conv);
    CHECK(conv != UINT32_MAX && sdpa != UINT32_MAX && rs != UINT32_MAX);
    CHECK_MSG(l.nhwc[map] && l.rs_xpose[rs], "the conv's map NHWC %d, the reshape transposing %d",
              l.nhwc[map], l.rs_xpose[rs]);
    const int on = variant != 1;
    CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_RESHAPE), on ? 1 : 0);
    CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_SLICE), on ? 3 : 0);
    CHECK_EQ_INT(count_virtual(&p, &f, KILN_OP_PERMUTE), on ? 4 : 0);
    CHECK_EQ_INT(f.sdpa_in[sdpa], on ? 7 : 0);
    const uint32_t back_perm = find_head(&p, KILN_OP_PERMUTE, sdpa + 1);
    CHECK(back_perm != UINT32_MAX);
    const int32_t pout = kiln_plan_group_output(&p, back_perm);
    const int32_t rs_out =
        p.ids[p.layers[find_head(&p, KILN_OP_RESHAPE, back_perm + 1)].output_begin];
    CHECK_MSG(l.out_nhwc[back_perm] == 2 && l.nhwc[pout] == 2 && l.nhwc[rs_out] && !l.copy[rs_out],
              "the permute back writes channels-last k %d (its output %d), the conv's input NHWC "
              "%d, copied %d",
              l.out_nhwc[back_perm], l.nhwc[pout], l.nhwc[rs_out], l.copy[rs_out]);
    CHECK_EQ_INT(f.sdpa_out[sdpa], on ? (int32_t)back_perm : -1);
    CHECK_EQ_INT(f.base_nhwc[map], on); // the view chain's NHWC base
    if (on) {
        kiln_tensor views[64];
        memset(views, 0, sizeof views);
        bind_views(&p, views);
        int bad = 0;
        for (uint32_t j = 0; j < 3; j++) {
            kiln_cuda_strided v;
            kiln_cuda_fold_view(&p, &f, views, p.ids[p.layers[sdpa].input_begin + j], &v);
            CHECK_EQ_INT(v.rank, 4);
            for (int64_t h = 0; h < 2; h++)
                for (int64_t sq = 0; sq < 16; sq++)
                    for (int64_t e = 0; e < 32; e++)
                        bad += at(&v, map, 0, h, sq, e) != sq * 192 + 96 * h + 32 * (int64_t)j + e;
        }
        CHECK_MSG(bad == 0, "%d view elements off the channels-last map", bad);
        kiln_cuda_strided ov;
        kiln_cuda_fold_out_view(&p, &f, views, sdpa, &ov);
        CHECK_EQ_INT(ov.rank, 4);
        for (int64_t h = 0; h < 2; h++)
            for (int64_t sq = 0; sq < 16; sq++)
                for (int64_t e = 0; e < 32; e++)
                    bad += at(&ov, pout, 0, h, sq, e) != sq * 64 + 32 * h + e;
        CHECK_MSG(bad == 0, "%d output view elements off the channels-last map", bad);
        unbind(&p, views);
    }
    printf("conv attention%s: %u layers run no kernel\n", on ? "" : " (folds off)", f.n_virtual);
    kiln_cuda_fold_free(&p, &f);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// What the CUDA backend would launch for the engine in file `path` (see the top of the file).
// A global response norm (ConvNeXt-V2): g = ||h|| over H, W; r = g / (mean(g over C) + eps);
// y = h * r. The mean, the add of eps and the div run as one mean ratio (cuda_fold.h), unless:
// variant 1 the mean is also an engine output, 2 the div is eps-sum / g, 3 the mean is over H, W
// (not the last dim), 4 eps is a vector of C values, 5 the folds are off.
static void ratio_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t dims[4] = {2, 3, 3, 40}, hw[2] = {1, 2}, last = -1, keep = 1, cd[1] = {40};
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, dims, dims, &x) == KILN_OK);
    int32_t h = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    kiln_attr na[2] = {{"dims", hw, NULL, 2}, {"keepdim", &keep, NULL, 1}};
    int32_t gx = node(g, KILN_OP_VECTOR_NORM, &h, 1, na, 2);
    kiln_attr ma[2] = {{"dims", variant == 3 ? hw : &last, NULL, variant == 3 ? 2u : 1u},
                       {"keepdim", &keep, NULL, 1}};
    int32_t m = node(g, KILN_OP_MEAN, variant == 3 ? &h : &gx, 1, ma, 2);
    if (variant == 3) m = node(g, KILN_OP_MEAN, &m, 1, ma, 2); // [2, 1, 1, 40] -> [2, 1, 1, 1]
    int32_t ai[2] = {m, variant == 4 ? constant(g, 1, cd) : constant(g, 0, NULL)};
    int32_t a = node(g, KILN_OP_ADD, ai, 2, NULL, 0);
    int32_t di[2] = {variant == 2 ? a : gx, variant == 2 ? gx : a};
    int32_t r = node(g, KILN_OP_DIV, di, 2, NULL, 0);
    int32_t yi[2] = {h, r};
    int32_t y = node(g, KILN_OP_MUL, yi, 2, NULL, 0);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (variant == 1) CHECK(kiln_graph_mark_output(g, m, "m") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, variant != 5, 0, &f) == KILN_OK);
    const int folds = variant == 0;
    CHECK_EQ_INT(f.n_ratio, folds ? 1 : 0);
    const uint32_t mean = find_head(&p, KILN_OP_MEAN, 0);
    CHECK(mean != UINT32_MAX);
    uint32_t n_folded = 0;
    for (uint32_t li = 0; li < p.n_layers; li++) {
        n_folded += f.virt[li] == KILN_CUDA_FOLD_RATIO;
        if (li != mean || !folds) CHECK(f.ratio_add[li] < 0 && f.ratio_div[li] < 0);
    }
    CHECK_EQ_INT(n_folded, folds ? 2 : 0);
    if (folds) { // the add and the div, in that order, next after the mean
        const int32_t ad = f.ratio_add[mean], dv = f.ratio_div[mean];
        CHECK(ad > (int32_t)mean && dv > ad);
        CHECK(p.layers[ad].op == KILN_OP_ADD && p.layers[dv].op == KILN_OP_DIV);
        CHECK(f.virt[ad] == KILN_CUDA_FOLD_RATIO && f.virt[dv] == KILN_CUDA_FOLD_RATIO);
        for (int32_t li = (int32_t)mean + 1; li < dv; li++) CHECK(f.virt[li] != 0);
        // the div's output is written at the mean: apart from x (the norm) it divides
        const int32_t gxt = p.ids[p.layers[mean].input_begin],
                      yt = p.ids[p.layers[dv].output_begin];
        CHECK(p.ids[p.layers[dv].input_begin] == gxt);
        CHECK(!overlap_tensors(&p, yt, gxt));
    }
    printf("ratio %d: %u mean ratios\n", variant, f.n_ratio);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

// MobileViT's separable attention: x = relu(input) [1, 9, 4, 24]; q = x[:, :1] and k = x[:, 1:]
// (aliases of x); ctx = sum(k * softmax(q, -1), -1, keepdim). The softmax, the mul and the sum
// run as one softmax-weighted sum (cuda_fold.h), unless: variant 1 the softmax's output is also
// an engine output, 2 the sum is over dim 2, 3 k broadcasts over the patches (its mean over
// them, [1, 8, 4, 1]), 4 the folds are off.
static void wsum_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    int64_t xd[4] = {1, 9, 4, 24}, last = -1, two = 2, keep = 1;
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    x = node(g, KILN_OP_RELU, &x, 1, NULL, 0);
    int32_t q = slice(g, x, 1, 0, 1), k = slice(g, x, 1, 1, 9);
    kiln_attr ra[2] = {{"dims", &last, NULL, 1}, {"keepdim", &keep, NULL, 1}};
    if (variant == 3) k = node(g, KILN_OP_MEAN, &k, 1, ra, 2);
    kiln_attr sa = {"dim", &last, NULL, 1};
    int32_t sm = node(g, KILN_OP_SOFTMAX, &q, 1, &sa, 1);
    int32_t mi[2] = {k, sm};
    int32_t prod = node(g, KILN_OP_MUL, mi, 2, NULL, 0);
    kiln_attr ua[2] = {{"dims", variant == 2 ? &two : &last, NULL, 1}, {"keepdim", &keep, NULL, 1}};
    int32_t ctx = node(g, KILN_OP_SUM, &prod, 1, ua, 2);
    CHECK(kiln_graph_mark_output(g, ctx, "ctx") == KILN_OK);
    if (variant == 1) CHECK(kiln_graph_mark_output(g, sm, "sm") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, variant != 4, 0, &f) == KILN_OK);
    const int folds = variant == 0;
    CHECK_EQ_INT(f.n_wsum, folds ? 1 : 0);
    const uint32_t su = find_head(&p, KILN_OP_SUM, 0), so = find_head(&p, KILN_OP_SOFTMAX, 0);
    const uint32_t mu = find_head(&p, KILN_OP_MUL, 0);
    CHECK(su != UINT32_MAX && so != UINT32_MAX && mu != UINT32_MAX);
    if (folds && su != UINT32_MAX && so != UINT32_MAX && mu != UINT32_MAX) {
        CHECK_EQ_INT(f.wsum_sm[su], (int32_t)so);
        CHECK_EQ_INT(f.wsum_mul[su], (int32_t)mu);
        CHECK(f.virt[so] == KILN_CUDA_FOLD_WSUM && f.virt[mu] == KILN_CUDA_FOLD_WSUM);
        CHECK_EQ_INT(f.virt[su], 0);
        // the sum's output apart from the memory of the scores and k (x's), which it reads
        const int32_t out = p.ids[p.layers[su].output_begin];
        const int32_t xm = p.ids[p.layers[find_head(&p, KILN_OP_RELU, 0)].output_begin];
        CHECK(!overlap_tensors(&p, out, xm));
    }
    for (uint32_t li = 0; li < p.n_layers && !folds; li++) {
        CHECK(f.wsum_sm[li] < 0 && f.wsum_mul[li] < 0 && f.virt[li] != KILN_CUDA_FOLD_WSUM);
    }
    printf("wsum %d: %u softmax-weighted sums\n", variant, f.n_wsum);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

static int plan_counts(const char *path, int list_layers) {
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    const long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = n > 0 ? malloc((size_t)n) : NULL;
    const int read_ok = buf != NULL && fread(buf, 1, (size_t)n, fp) == (size_t)n;
    fclose(fp);
    kiln_plan p;
    memset(&p, 0, sizeof p);
    if (!read_ok || kiln_load_plan(buf, (size_t)n, &p) != KILN_OK) {
        fprintf(stderr, "%s: not a Kiln engine: %s\n", path, kiln_last_error());
        free(buf);
        return 1;
    }
    kiln_cuda_layout l;
    kiln_cuda_fold f;
    int rc = 1;
    if (kiln_cuda_layout_plan(&p, KILN_CUDA_LAYOUT_NHWC | KILN_CUDA_LAYOUT_STEM, &l) == KILN_OK) {
        if (kiln_cuda_fold_plan(&p, l.nhwc, l.alt, l.ident, 1, 0, &f) == KILN_OK) {
            uint32_t heads = 0, run = 0, perm = 0, perm_run = 0, grouped = 0, grouped_nhwc = 0;
            for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
                const int r = !f.virt[li];
                heads++;
                run += r;
                if (p.layers[li].op == KILN_OP_PERMUTE) perm++, perm_run += r;
                if (p.layers[li].op == KILN_OP_CONV2D) {
                    kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[li]);
                    if (kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0) != 1)
                        grouped++, grouped_nhwc += l.head_nhwc[li];
                }
            }
            if (list_layers)
                for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
                    printf("  %4u %-16s%s%s", li, kiln_op_name(p.layers[li].op),
                           f.virt[li] ? " (no kernel)" : "", l.head_nhwc[li] ? " nhwc" : "");
                    uint32_t xin = 0;
                    for (uint32_t t = 0; t <= p.layers[li].n_tail; t++) {
                        const kiln_plan_layer *L = &p.layers[li + t];
                        if (t > 0) printf(" +%s", kiln_op_name(L->op));
                        for (uint32_t k = 0; k < L->n_inputs; k++)
                            xin += l.xpose[L->input_begin + k];
                    }
                    if (xin) printf(" [%u layout cop%s in]", xin, xin == 1 ? "y" : "ies");
                    if (l.rs_xpose[li]) printf(" [transposes its NHWC input]");
                    if (l.out_nchw[li]) printf(" [writes NCHW]");
                    if (l.out_nhwc[li]) printf(" [writes NHWC]");
                    if (f.ratio_div[li] >= 0) printf(" [a mean ratio: runs the add and div]");
                    if (f.wsum_sm[li] >= 0) {
                        printf(" [a softmax-weighted sum: runs the softmax and mul]");
                    }
                    if (p.layers[li].op == KILN_OP_MATMUL && f.sdpa_in[li]) {
                        printf(" [reads %s through views]", f.sdpa_in[li] == 3   ? "a and b"
                                                            : f.sdpa_in[li] == 1 ? "a"
                                                                                 : "b");
                    }
                    if (p.layers[li].op == KILN_OP_ROTARY && f.sdpa_in[li]) {
                        printf(" [reads x through views]");
                    }
                    if (f.pre_dst[li] >= 0) printf(" [tail run by layer %d]", f.pre_dst[li]);
                    if (f.pre_src[li] >= 0) printf(" [applies layer %d's tail]", f.pre_src[li]);
                    printf("\n");
                }
            printf("%s: %u layers run (+%u layout copies) of %u; permutes %u (run %u); grouped "
                   "convs %u (NHWC %u); conv prologues %u\n",
                   path, run, l.n_copies, heads, perm, perm_run, grouped, grouped_nhwc, f.n_pre);
            kiln_cuda_fold_free(&p, &f);
            rc = 0;
        }
        kiln_cuda_layout_free(&p, &l);
    }
    if (rc != 0) fprintf(stderr, "%s: planning failed: %s\n", path, kiln_last_error());
    kiln_plan_release(&p);
    free(buf);
    return rc;
}

// A rope group over a prompt of L positions whose q, k and v come from [1, L, H, E] projections
// through permute (0, 2, 1, 3) (transformers' transpose(1, 2) after the head split), ReLU
// standing in for the projections (activations). variant 0: the three permutes run no kernel
// (the group reads their inputs through permuted strides); 1: the q permute's output is also an
// engine output: that permute runs, the other two fold; 2: the k permute moves the last dim:
// it runs; 3: q, k and v are slices of the heads of one [1, L, 3 H, E] projection (the
// builder's head projections): the slices run no kernel either, the group reads the projection.
static void rope_perm_case(int variant) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_fold f;
    enum { L = 3 };
    int64_t xd[4] = {1, L, H, E}, td[4] = {1, 1, L, E}, cd[4] = {1, H, S + L, E}, pd[1] = {L};
    int64_t two = 2, one = 1, hs[4] = {0, 2, 1, 3}, moved[4] = {0, 2, 3, 1};
    int32_t kc = -1, vc = -1, x[3] = {-1, -1, -1}, cs = -1, sn = -1, pos = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_state(g, "kc", KILN_DTYPE_F32, 4, cd, NULL, 0, &kc) == KILN_OK);
    CHECK(kiln_graph_add_state(g, "vc", KILN_DTYPE_F32, 4, cd, NULL, 0, &vc) == KILN_OK);
    static const char *const names[3] = {"xq", "xk", "xv"};
    int32_t hp[3]; // the heads-first views
    int32_t packed = -1;
    if (variant == 3) {
        int64_t pd3[4] = {1, L, 3 * H, E};
        CHECK(kiln_graph_add_input(g, "xqkv", KILN_DTYPE_F32, 4, pd3, pd3, &x[0]) == KILN_OK);
        packed = node(g, KILN_OP_RELU, &x[0], 1, NULL, 0);
    }
    for (int j = 0; j < 3; j++) {
        int32_t a;
        if (variant == 3) {
            int64_t dim = 2, start = j * H, end = start + H, step = 1;
            kiln_attr sa[4] = {{"dim", &dim, NULL, 1},
                               {"start", &start, NULL, 1},
                               {"end", &end, NULL, 1},
                               {"step", &step, NULL, 1}};
            a = node(g, KILN_OP_SLICE, &packed, 1, sa, 4);
        } else {
            CHECK(kiln_graph_add_input(g, names[j], KILN_DTYPE_F32, 4, xd, xd, &x[j]) == KILN_OK);
            a = node(g, KILN_OP_RELU, &x[j], 1, NULL, 0);
        }
        if (variant == 2 && j == 1) { // [1, L, H, E] -> [1, H, E, L] -> reshaped back
            int64_t back[4] = {1, H, L, E};
            kiln_attr pa = {"dims", moved, NULL, 4}, ra = {"shape", back, NULL, 4};
            a = node(g, KILN_OP_PERMUTE, &a, 1, &pa, 1);
            hp[j] = node(g, KILN_OP_RESHAPE, &a, 1, &ra, 1);
        } else {
            kiln_attr pa = {"dims", hs, NULL, 4};
            hp[j] = node(g, KILN_OP_PERMUTE, &a, 1, &pa, 1);
        }
    }
    CHECK(kiln_graph_add_input(g, "cos", KILN_DTYPE_F32, 4, td, td, &cs) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "sin", KILN_DTYPE_F32, 4, td, td, &sn) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "pos", KILN_DTYPE_I64, 1, pd, pd, &pos) == KILN_OK);
    int32_t rq[3] = {hp[0], cs, sn}, rk[3] = {hp[1], cs, sn};
    int32_t q = node(g, KILN_OP_ROTARY, rq, 3, NULL, 0);
    int32_t k = node(g, KILN_OP_ROTARY, rk, 3, NULL, 0);
    kiln_attr ic[2] = {{"dim", &two, NULL, 1}, {"wrap", &one, NULL, 1}};
    int32_t wk[3] = {kc, pos, k}, wv[3] = {vc, pos, hp[2]};
    int32_t kc2 = node(g, KILN_OP_INDEX_COPY, wk, 3, ic, 2);
    int32_t vc2 = node(g, KILN_OP_INDEX_COPY, wv, 3, ic, 2);
    CHECK(kiln_graph_update_state(g, kc, kc2) == KILN_OK);
    CHECK(kiln_graph_update_state(g, vc, vc2) == KILN_OK);
    int32_t three[3] = {q, kc2, vc2};
    CHECK(kiln_graph_mark_output(g, node(g, KILN_OP_SDPA, three, 3, NULL, 0), "y") == KILN_OK);
    if (variant == 1) CHECK(kiln_graph_mark_output(g, hp[0], "q_heads") == KILN_OK);
    if (!load(g, &p)) return;
    CHECK(kiln_cuda_fold_plan(&p, NULL, NULL, NULL, 1, 0, &f) == KILN_OK);
    const uint32_t r1 = find_head(&p, KILN_OP_ROTARY, 0);
    CHECK_MSG(r1 != UINT32_MAX && f.n_rope == 1 && f.rope_k[r1] >= 0, "variant %d: %u groups",
              variant, f.n_rope);
    uint32_t folded = 0, run = 0;
    for (uint32_t li = 0; li < p.n_layers; li++) {
        if (p.layers[li].op != KILN_OP_PERMUTE) continue;
        if (f.virt[li] & KILN_CUDA_FOLD_ROPE) {
            folded++;
            // the view: the permute's input [1, L, H, E] read as [1, H, L, E]
            const int32_t t = out0(&p, li);
            kiln_tensor views[64];
            memset(views, 0, sizeof views);
            CHECK(p.n_tensors <= 64);
            for (uint32_t i = 0; i < p.n_tensors && i < 64; i++) {
                views[i].dtype = p.tensors[i].dtype;
                views[i].rank = p.tensors[i].shape.rank;
                memcpy(views[i].dims, p.tensors[i].shape.max, sizeof views[i].dims);
                views[i].data = (void *)(uintptr_t)(4096 * (i + 1));
            }
            kiln_cuda_strided v;
            kiln_cuda_fold_rope_view(&p, &f, views, t, &v);
            if (variant == 3) { // head j * H of the projection [1, L, 3 H, E]
                const int32_t sl = f.producer[in0(&p, li)];
                CHECK(sl >= 0 && p.layers[sl].op == KILN_OP_SLICE &&
                      (f.virt[sl] & KILN_CUDA_FOLD_ROPE));
                if (sl >= 0) {
                    kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[sl]);
                    const int64_t start = kiln_attrs_int(&a, KILN_A_SLICE_START, 0);
                    const uintptr_t base = (uintptr_t)views[in0(&p, (uint32_t)sl)].data;
                    const uintptr_t es = p.tensors[t].dtype == KILN_DTYPE_F32 ? 4 : 2;
                    CHECK(v.rank == 4 && (uintptr_t)v.data == base + (uintptr_t)(start * E) * es &&
                          v.dims[1] == H && v.dims[2] == L && v.str[1] == E &&
                          v.str[2] == 3 * H * E && v.str[3] == 1);
                }
            } else {
                CHECK(v.rank == 4 && v.data == views[in0(&p, li)].data && v.dims[1] == H &&
                      v.dims[2] == L && v.str[1] == E && v.str[2] == H * E && v.str[3] == 1);
            }
        } else {
            run++;
        }
    }
    CHECK_MSG(f.n_rope_in == folded, "variant %d: n_rope_in %u, %u folded", variant, f.n_rope_in,
              folded);
    if (variant == 0 || variant == 3)
        CHECK_MSG(folded == 3 && run == 0, "%u folded, %u run", folded, run);
    if (variant == 3) {
        uint32_t slices = 0;
        for (uint32_t li = 0; li < p.n_layers; li++)
            slices += p.layers[li].op == KILN_OP_SLICE && (f.virt[li] & KILN_CUDA_FOLD_ROPE);
        CHECK_MSG(slices == 3, "variant 3: %u slices read by the group", slices);
    }
    if (variant == 1 || variant == 2)
        CHECK_MSG(folded == 2 && run == 1, "variant %d: %u folded, %u run", variant, folded, run);
    kiln_cuda_fold_free(&p, &f);
    kiln_plan_release(&p);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        int rc = 0;
        const int list = strcmp(argv[1], "--layers") == 0;
        for (int i = 1 + list; i < argc; i++) rc |= plan_counts(argv[i], list);
        return rc;
    }
    check_rng_seed();
    for (int v = 0; v <= 5; v++) ratio_case(v);
    for (int v = 0; v <= 4; v++) wsum_case(v);
    rope_case(0);
    rope_case(1);
    rope_case(2);
    rope_case(3);
    rope_case(4);
    for (int v = 0; v <= 3; v++) rope_perm_case(v);
    gemv_unweighted_and_apart();
    gemv_siblings_relocated();
    gemv_case(1, 0);
    gemv_case(4, 0); // the GEMV, but not the fused one
    gemv_case(16, 0);
    gemv_case(1, 1);
    aliases_case();
    slice_aliases_case();
    layout_permutes_case(16);
    layout_permutes_case(12);
    conv_attention_case(0);
    for (int v = 0; v <= 7; v++) prologue_case(v);
    conv_attention_case(1);
    packed();
    mha_seq_first(1);
    mha_seq_first(2);
    neox_packed(0);
    neox_packed(1);
    neox_packed(2);
    chunked();
    eager_mm_case(1, 0);
    eager_mm_case(2, 0);
    eager_mm_case(1, 1);
    mm_geom_case();
    mm_gemm_case();
    for (int v = 0; v <= 2; v++) clamp_case(v);
    separate(0);
    separate(1);
    transposed_k();
    state_k();
    gqa_case();
    rope_heads_case();
    return check_summary();
}
