// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's NHWC layout pass (src/cuda/cuda_layout.c, included here: it is plain C)
// on the CPU: built engines whose layouts are derived by hand from the rules in cuda_layout.h.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/alloc.h"
#include "core/status.h"
#include "cuda/cuda_layout.h"
#include "kiln/kiln.h"
#include "runtime/load.h"

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

#include "../../src/cuda/cuda_layout.c"

static float wbuf[64 * 64];

static int32_t constant(kiln_graph *g, uint32_t rank, const int64_t *dims) {
    int64_t n = 1;
    int32_t v = -1;
    for (uint32_t i = 0; i < rank; i++) n *= dims[i];
    for (int64_t i = 0; i < n; i++) wbuf[i] = (float)check_rng_uniform(-0.2, 0.2);
    CHECK(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, rank, dims, wbuf,
                                  (size_t)n * sizeof(float), &v) == KILN_OK);
    return v;
}

static int32_t conv(kiln_graph *g, int32_t x, int64_t ci, int64_t co, int64_t k, int32_t res,
                    int relu) {
    int64_t wd[4] = {co, ci, k, k}, bd[1] = {co}, pad[2] = {k / 2, k / 2};
    int32_t ins[3] = {x, constant(g, 4, wd), constant(g, 1, bd)}, h = -1;
    kiln_attr a = {"padding", pad, NULL, 2};
    CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, ins, 3, &a, 1, &h, 1) == KILN_OK);
    if (res >= 0) {
        int32_t two[2] = {h, res};
        CHECK(kiln_graph_add_node(g, KILN_OP_ADD, two, 2, NULL, 0, &h, 1) == KILN_OK);
    }
    if (relu) CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &h, 1) == KILN_OK);
    return h;
}

static int load(kiln_graph *g, kiln_precision prec, kiln_plan *plan) {
    kiln_build_options o;
    kiln_built *b = NULL;
    const void *bytes;
    size_t n;
    kiln_build_options_init(&o);
    o.precision = prec;
    int ok = kiln_build(g, &o, &b) == KILN_OK && kiln_built_engine(b, &bytes, &n) == KILN_OK &&
             kiln_load_plan(bytes, n, plan) == KILN_OK;
    if (!ok) fprintf(stderr, "build/load failed: %s\n", kiln_last_error());
    kiln_built_free(b);
    kiln_graph_free(g);
    return ok;
}

static uint32_t count_op(const kiln_plan *p, uint32_t op) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_layers; i++) n += p->layers[i].op == op;
    return n;
}

// Layer index of the first head with op (after `from`), or UINT32_MAX.
static uint32_t find_head(const kiln_plan *p, uint32_t op, uint32_t from) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if (li >= from && p->layers[li].op == op) return li;
    }
    return UINT32_MAX;
}

// The tensor head li's group writes.
static int32_t blk_t(const kiln_plan *p, uint32_t li) {
    return li == UINT32_MAX ? 0 : kiln_plan_group_output(p, li);
}

// stem conv (C 3) -> maxpool -> [conv 16->8 relu, conv 8->32 + downsample(pool) 16->32, relu]
// -> conv 32->32 + residual relu -> avg pool -> adaptive pool -> reshape -> (output)
static void resnet_like(kiln_precision prec, int extra_output) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t mins[4] = {1, 3, 12, 12}, maxs[4] = {2, 3, 12, 12}, k2[2] = {2, 2}, o11[2] = {1, 1};
    int64_t shape[2] = {-2, 32};
    int32_t x = -1, h, pool = -1, blk;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, mins, maxs, &x) == KILN_OK);
    h = conv(g, x, 3, 16, 3, -1, 1);
    kiln_attr mp[2] = {{"kernel", k2, NULL, 2}, {"stride", k2, NULL, 2}};
    CHECK(kiln_graph_add_node(g, KILN_OP_MAX_POOL2D, &h, 1, mp, 2, &pool, 1) == KILN_OK);
    h = conv(g, pool, 16, 8, 1, -1, 1);
    int32_t ds = conv(g, pool, 16, 32, 1, -1, 0);
    blk = conv(g, h, 8, 32, 3, ds, 1);
    h = conv(g, blk, 32, 32, 1, blk, 1);
    kiln_attr ap[2] = {{"kernel", k2, NULL, 2}, {"stride", k2, NULL, 2}};
    CHECK(kiln_graph_add_node(g, KILN_OP_AVG_POOL2D, &h, 1, ap, 2, &h, 1) == KILN_OK);
    kiln_attr aa = {"output_size", o11, NULL, 2};
    CHECK(kiln_graph_add_node(g, KILN_OP_ADAPTIVE_AVG_POOL2D, &h, 1, &aa, 1, &h, 1) == KILN_OK);
    kiln_attr ra = {"shape", shape, NULL, 2};
    CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &h, 1, &ra, 1, &h, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, h, "y") == KILN_OK);
    if (extra_output) CHECK(kiln_graph_mark_output(g, blk, "blk") == KILN_OK);
    if (!load(g, prec, &p)) return;
    CHECK(count_op(&p, KILN_OP_CONV2D) == 5);
    // disabled: everything NCHW
    CHECK(kiln_cuda_layout_plan(&p, 0, &l) == KILN_OK);
    CHECK(l.n_nhwc == 0 && l.n_conv_nhwc == 0 && l.n_copies == 0 && l.n_conv == 5);
    kiln_cuda_layout_free(&p, &l);
    // NHWC alone (the stem on a channel-padded copy + cuDNN), then with the stem kernel
    for (int flags = KILN_CUDA_LAYOUT_NHWC;
         flags <= (KILN_CUDA_LAYOUT_NHWC | KILN_CUDA_LAYOUT_STEM); flags += KILN_CUDA_LAYOUT_STEM) {
        const int sk = (flags & KILN_CUDA_LAYOUT_STEM) != 0;
        CHECK(kiln_cuda_layout_plan(&p, flags, &l) == KILN_OK);
        uint32_t stem = find_head(&p, KILN_OP_CONV2D, 0),
                 mpool = find_head(&p, KILN_OP_MAX_POOL2D, 0);
        uint32_t apool = find_head(&p, KILN_OP_AVG_POOL2D, 0);
        uint32_t adapt = find_head(&p, KILN_OP_ADAPTIVE_AVG_POOL2D, 0);
        CHECK(stem != UINT32_MAX && mpool != UINT32_MAX && apool != UINT32_MAX &&
              adapt != UINT32_MAX);
        if (stem == UINT32_MAX || mpool == UINT32_MAX || apool == UINT32_MAX ||
            adapt == UINT32_MAX) {
            kiln_cuda_layout_free(&p, &l);
            kiln_plan_release(&p);
            return;
        }
        int32_t pool_t = kiln_plan_group_output(&p, mpool);
        int32_t stem_x = p.ids[p.layers[stem].input_begin],
                stem_w = p.ids[p.layers[stem].input_begin + 1];
        int half = prec == KILN_PRECISION_FP16 || prec == KILN_PRECISION_BF16;
        CHECK(!l.nhwc[kiln_plan_group_output(&p, adapt)]); // writes NCHW
        CHECK(!l.nhwc[stem_x]);                            // C = 3: never NHWC itself
        if (!half) {
            CHECK(l.n_nhwc == 0 && l.n_conv_nhwc == 0 && l.n_conv_padded == 0);
            CHECK(l.n_conv_stem == 0 && !l.stem[stem]);
            CHECK(!l.head_nhwc[stem] && !l.head_nhwc[mpool] && !l.padc[stem_x]);
        } else {
            // the stem (C = 3) writes NHWC: on the stem kernel straight from its NCHW input and
            // OIHW weight, or on a copy of its input padded to 8 channels with a KRSC weight
            // padded alike; the max pool follows it in NHWC, and so does everything after
            CHECK(l.head_nhwc[stem] && l.nhwc[kiln_plan_group_output(&p, stem)]);
            if (sk) {
                CHECK(l.stem[stem] && l.n_conv_stem == 1 && l.n_conv_padded == 0);
                CHECK(!l.copy[stem_x] && !l.padc[stem_x] && !l.krsc[stem_w] && !l.padc[stem_w]);
            } else {
                CHECK(!l.stem[stem] && l.n_conv_stem == 0 && l.n_conv_padded == 1);
                CHECK(l.copy[stem_x] && l.padc[stem_x] && l.krsc[stem_w] && l.padc[stem_w]);
            }
            for (uint32_t i = 0; i < p.n_layers; i++) {
                if (i != stem) CHECK(!l.stem[i]); // the other convs have C % 8 == 0
            }
            CHECK(l.head_nhwc[mpool] && l.nhwc[pool_t] && !l.copy[pool_t] && !l.padc[pool_t]);
            CHECK_MSG(l.n_conv_nhwc == 5, "%u NHWC convs", l.n_conv_nhwc);
            for (uint32_t i = 0; i < p.n_tensors; i++) {
                if (l.padc[i] && (int32_t)i != stem_x) CHECK((int32_t)i == stem_w);
            }
        }
        if (half && !extra_output) {
            // the stem's padded input (none for the stem kernel)
            CHECK_MSG(l.n_copies == (sk ? 0u : 1u), "%u copies", l.n_copies);
            uint32_t n_alt = 0, n_xpose = 0;
            for (uint32_t i = 0; i < p.n_ids; i++) {
                if (p.ids[i] == stem_x) n_alt += l.alt[i], n_xpose += l.xpose[i];
            }
            CHECK_MSG(n_alt == (sk ? 0u : 1u) && n_xpose == (sk ? 0u : 1u),
                      "%u reads, %u transposes", n_alt, n_xpose);
            CHECK(l.head_nhwc[apool] && l.nhwc[kiln_plan_group_output(&p, apool)]);
            CHECK(l.head_nhwc[adapt]);
            for (uint32_t i = 0; i < p.n_tensors; i++) {
                if (l.nhwc[i]) CHECK(p.tensors[i].kind == KILN_TENSOR_ACTIVATION);
                if (l.krsc[i]) CHECK(p.tensors[i].kind == KILN_TENSOR_WEIGHT);
            }
        } else if (half) {
            // blk is also an engine output: the fp16 output cast (NCHW only) reads it through an
            // NCHW copy; every conv stays NHWC (no demotion through the residuals).
            uint32_t c1 = find_head(&p, KILN_OP_CONV2D, stem + 1);
            uint32_t c2 = find_head(&p, KILN_OP_CONV2D, c1 + 1);
            uint32_t c3 = find_head(&p, KILN_OP_CONV2D, c2 + 1);
            CHECK(c3 != UINT32_MAX && l.nhwc[blk_t(&p, c3)] && l.copy[blk_t(&p, c3)]);
            // the stem's padded input (not for the stem kernel), blk (NCHW)
            CHECK_MSG(l.n_copies == (sk ? 1u : 2u), "%u copies", l.n_copies);
            CHECK(l.head_nhwc[apool] && l.head_nhwc[adapt]);
        }
        kiln_cuda_layout_free(&p, &l);
    }
    kiln_plan_release(&p);
}

// kiln_cuda_bench's conv2_x graph (and ResNet-50's structure as ExecuTorch exports it): fp16
// precision puts a cast on the engine input, read by the first conv and the first residual add;
// the last block feeds a mean over H, W (ExecuTorch's global pool), which reads it in place
// (NHWC), and with block_out the output cast too. Every conv NHWC; boundaries: one NHWC copy of
// the input cast, and with block_out one NCHW copy of the last block for the output cast.
static void bench_stage(int block_out) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t dims[4] = {1, 32, 8, 8}, hw[2] = {2, 3};
    int32_t x = -1, mean = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, dims, dims, &x) == KILN_OK);
    int32_t in = x;
    for (int blk = 0; blk < 3; blk++) {
        int32_t h = conv(g, x, 32, 8, 1, -1, 1);
        h = conv(g, h, 8, 8, 3, -1, 1);
        x = conv(g, h, 8, 32, 1, x, 1);
    }
    kiln_attr ma = {"dims", hw, NULL, 2};
    CHECK(kiln_graph_add_node(g, KILN_OP_MEAN, &x, 1, &ma, 1, &mean, 1) == KILN_OK);
    if (block_out) CHECK(kiln_graph_mark_output(g, x, "y") == KILN_OK);
    CHECK(kiln_graph_mark_output(g, mean, "pooled") == KILN_OK);
    (void)in;
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(count_op(&p, KILN_OP_CONV2D) == 9 && count_op(&p, KILN_OP_CAST) >= 2);
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    CHECK_MSG(l.n_conv == 9 && l.n_conv_nhwc == 9, "%u of %u NHWC convs", l.n_conv_nhwc, l.n_conv);
    CHECK_MSG(l.n_copies == (block_out ? 2u : 1u), "%u copies", l.n_copies);
    uint32_t first = find_head(&p, KILN_OP_CONV2D, 0), cast_in = find_head(&p, KILN_OP_CAST, 0);
    uint32_t mn = find_head(&p, KILN_OP_MEAN, 0);
    CHECK(first != UINT32_MAX && cast_in != UINT32_MAX && mn != UINT32_MAX);
    if (first != UINT32_MAX && cast_in != UINT32_MAX && mn != UINT32_MAX) {
        int32_t xin = kiln_plan_group_output(&p, cast_in);
        uint32_t slot = p.layers[first].input_begin;
        CHECK(p.ids[slot] == xin && !l.nhwc[xin] && l.copy[xin] && l.alt[slot] && l.xpose[slot]);
        // the first block's residual add reads the same copy, without a second transpose
        uint32_t n_alt = 0, n_xpose = 0;
        for (uint32_t i = 0; i < p.n_ids; i++) {
            if (p.ids[i] == xin) n_alt += l.alt[i], n_xpose += l.xpose[i];
        }
        CHECK_MSG(n_alt == 2 && n_xpose == 1, "%u reads, %u transposes", n_alt, n_xpose);
        // the mean reads the last block as it is stored (NHWC), writes NCHW
        int32_t last = p.ids[p.layers[mn].input_begin];
        CHECK(l.nhwc[last] && !l.alt[p.layers[mn].input_begin]);
        CHECK(l.head_nhwc[mn] && !l.nhwc[kiln_plan_group_output(&p, mn)]);
        CHECK(l.copy[last] == (block_out != 0)); // the output cast's NCHW copy
    }
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        if (l.nhwc[i]) CHECK(p.tensors[i].kind == KILN_TENSOR_ACTIVATION);
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// kiln_cuda_plan_gemv_l2 (max_rows 0) or kiln_cuda_plan_l2 with max_rows: linears 64 -> 32 ->
// 64 -> 48 -> 16 (weights of 2048, 2048, 3072, 768 elements) at batch `rows`; with fp16 weights
// (2 bytes) and a budget of b bytes, the smallest weights are kept first (the first of equal
// ones first), the last one kept in part.
static void gemv_l2(kiln_precision prec, int64_t rows, int64_t max_rows) {
    kiln_graph *g = NULL;
    kiln_plan p;
    int64_t dims[2] = {rows, 64}, sizes[5] = {64, 32, 64, 48, 16};
    int32_t h = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, dims, dims, &h) == KILN_OK);
    for (int i = 0; i < 4; i++) {
        int64_t wd[2] = {sizes[i + 1], sizes[i]}, bd[1] = {sizes[i + 1]};
        int32_t ins[3] = {h, constant(g, 2, wd), constant(g, 1, bd)};
        CHECK(kiln_graph_add_node(g, KILN_OP_LINEAR, ins, 3, NULL, 0, &h, 1) == KILN_OK);
        if (i < 3) CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &h, 1) == KILN_OK);
    }
    CHECK(kiln_graph_mark_output(g, h, "y") == KILN_OK);
    if (!load(g, prec, &p)) return;
    CHECK(count_op(&p, KILN_OP_LINEAR) == 4);
    int gemv = (prec == KILN_PRECISION_FP16 || prec == KILN_PRECISION_BF16) &&
               rows <= (max_rows > 0 ? max_rows : KILN_CUDA_GEMV_MAX_M);
    uint32_t lin[4], nl = 0;
    for (uint32_t li = 0; li < p.n_layers && nl < 4; li++) {
        if (p.layers[li].op == KILN_OP_LINEAR) lin[nl++] = li;
    }
    CHECK(nl == 4 && p.n_layers <= 64);
    if (nl != 4 || p.n_layers > 64) {
        kiln_plan_release(&p);
        return;
    }
    if (gemv) {
        const int64_t wb[4] = {4096, 4096, 6144, 1536};
        for (int j = 0; j < 4; j++) {
            CHECK(p.tensors[p.ids[p.layers[lin[j]].input_begin + 1]].nbytes == (uint64_t)wb[j]);
        }
    }
    // per budget: the bytes kept of each weight, in layer order
    const uint64_t budgets[5] = {0, 1537, 1536 + 4096 + 100, 1536 + 4096 + 4096, 1u << 20};
    const int64_t want_keep[5][4] = {{0, 0, 0, 0},
                                     {1, 0, 0, 1536},
                                     {4096, 100, 0, 1536},
                                     {4096, 4096, 0, 1536},
                                     {4096, 4096, 6144, 1536}};
    for (int s = 0; s < 5; s++) {
        int64_t keep[64];
        uint64_t kept = max_rows > 0 ? kiln_cuda_plan_l2(&p, budgets[s], max_rows, keep)
                                     : kiln_cuda_plan_gemv_l2(&p, budgets[s], keep),
                 want_kept = 0;
        for (uint32_t li = 0; li < p.n_layers; li++) {
            int64_t want = -1;
            for (int j = 0; j < 4 && gemv; j++) want = lin[j] == li ? want_keep[s][j] : want;
            want_kept += want > 0 ? (uint64_t)want : 0;
            CHECK_MSG(keep[li] == want, "rows %lld, budget %llu: layer %u keeps %lld, want %lld",
                      (long long)rows, (unsigned long long)budgets[s], li, (long long)keep[li],
                      (long long)want);
        }
        CHECK(kept == want_kept);
    }
    kiln_plan_release(&p);
}

// A state read and written among NHWC convs (fp16): a conv whose input is the state, a conv whose
// fused residual operand is the state, and the state's update (a copy layer) from an add of
// both. No state is NHWC or read through a layout copy (a copy made at a first read would miss
// the update between reads), every group touching one runs NCHW, and the conv on the engine
// input (touching no state) stays NHWC.
static void state_layout(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 8, 6, 6}, sd[4] = {1, 16, 6, 6}, hw[2] = {2, 3};
    int32_t x = -1, st = -1, y = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    CHECK(kiln_graph_add_state(g, "s", KILN_DTYPE_F32, 4, sd, NULL, 0, &st) == KILN_OK);
    int32_t h = conv(g, x, 8, 16, 3, -1, 1);
    int32_t r = conv(g, h, 16, 16, 1, st, 1);
    int32_t c = conv(g, st, 16, 16, 3, -1, 0);
    int32_t two[2] = {r, c}, n = -1;
    CHECK(kiln_graph_add_node(g, KILN_OP_ADD, two, 2, NULL, 0, &n, 1) == KILN_OK);
    CHECK(kiln_graph_update_state(g, st, n) == KILN_OK);
    kiln_attr ma = {"dims", hw, NULL, 2};
    CHECK(kiln_graph_add_node(g, KILN_OP_MEAN, &n, 1, &ma, 1, &y, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(count_op(&p, KILN_OP_CONV2D) == 3);
    CHECK(kiln_cuda_layout_plan(&p, KILN_CUDA_LAYOUT_NHWC | KILN_CUDA_LAYOUT_STEM, &l) == KILN_OK);
    uint32_t n_states = 0;
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        if (p.tensors[i].kind != KILN_TENSOR_STATE) continue;
        n_states++;
        CHECK_MSG(!l.nhwc[i] && !l.copy[i] && !l.padc[i], "state tensor %u: NHWC %u, copy %u", i,
                  l.nhwc[i], l.copy[i]);
    }
    CHECK_EQ_INT(n_states, 1);
    for (uint32_t i = 0; i < p.n_ids; i++) {
        if (p.ids[i] >= 0 && p.tensors[p.ids[i]].kind == KILN_TENSOR_STATE) CHECK(!l.alt[i]);
    }
    uint32_t first = find_head(&p, KILN_OP_CONV2D, 0), n_nhwc_conv = 0;
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        if (group_touches_state(&p, li)) CHECK_MSG(!l.head_nhwc[li], "layer %u runs NHWC", li);
        n_nhwc_conv += p.layers[li].op == KILN_OP_CONV2D && l.head_nhwc[li];
    }
    CHECK(first != UINT32_MAX && l.head_nhwc[first] && !group_touches_state(&p, first));
    CHECK_EQ_INT(n_nhwc_conv, 1);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A depthwise k x k conv (groups = C) with a bias.
static int32_t dwconv_k(kiln_graph *g, int32_t x, int64_t c, int64_t k) {
    int64_t wd[4] = {c, 1, k, k}, bd[1] = {c}, pad[2] = {k / 2, k / 2}, groups = c;
    int32_t ins[3] = {x, constant(g, 4, wd), constant(g, 1, bd)}, h = -1;
    kiln_attr a[2] = {{"padding", pad, NULL, 2}, {"groups", &groups, NULL, 1}};
    CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, ins, 3, a, 2, &h, 1) == KILN_OK);
    return h;
}

static int32_t dwconv(kiln_graph *g, int32_t x, int64_t c) { return dwconv_k(g, x, c, 3); }

// A depthwise k x k conv between 1x1 convs (fp16): NHWC up to 7x7 taps (Kiln's depthwise
// kernel, ConvNeXt's 7x7 included); a 9x9 stays NCHW on cuDNN (KILN_CUDA_DW_NHWC_MAX_TAPS), read
// through a copy of the first conv's NHWC output, and the last conv reads an NHWC copy of its
// output.
static void dw_taps_layout(int64_t k) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 16, 8, 8};
    int32_t x = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t d = dwconv_k(g, conv(g, x, 16, 16, 1, -1, 0), 16, k);
    CHECK(kiln_graph_mark_output(g, conv(g, d, 16, 16, 1, -1, 0), "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t dw = find_head(&p, KILN_OP_CONV2D, find_head(&p, KILN_OP_CONV2D, 0) + 1);
    const int nhwc = k <= 7;
    CHECK(dw != UINT32_MAX);
    if (dw != UINT32_MAX) {
        CHECK_MSG(l.head_nhwc[dw] == nhwc && l.nhwc[blk_t(&p, dw)] == nhwc,
                  "%lldx%lld depthwise conv NHWC %d", (long long)k, (long long)k, l.head_nhwc[dw]);
    }
    // the engine's input and output copies, and with a 9x9 one on each side of it
    CHECK_MSG(l.n_copies == (nhwc ? 2u : 4u), "%lldx%lld depthwise: %u layout copies", (long long)k,
              (long long)k, l.n_copies);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// An MBConv block (fp16): conv 1x1 16 -> 32 + relu, depthwise 3x3 + relu, squeeze-excite (mean
// over H, W; conv 1x1 32 -> 8 + relu; conv 1x1 8 -> 32 + sigmoid; the [N, 32, 1, 1] scale
// multiplied over the activation), conv 1x1 32 -> 16 + the input; then a depthwise conv whose
// input an add (x + x) writes, read by a permute (ConvNeXt's order). The first depthwise conv
// and the mul stay NHWC; the second depthwise conv (no conv writes its input) is NCHW.
static void mbconv_layout(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t dims[4] = {2, 16, 8, 8}, hw[2] = {2, 3}, keep = 1, perm[4] = {0, 2, 3, 1};
    int32_t x = -1, h, d, se, m, y, r, d2, pm;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, dims, dims, &x) == KILN_OK);
    h = conv(g, x, 16, 32, 1, -1, 1);
    d = dwconv(g, h, 32);
    CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &d, 1, NULL, 0, &d, 1) == KILN_OK);
    kiln_attr ma[2] = {{"dims", hw, NULL, 2}, {"keepdim", &keep, NULL, 1}};
    CHECK(kiln_graph_add_node(g, KILN_OP_MEAN, &d, 1, ma, 2, &se, 1) == KILN_OK);
    se = conv(g, se, 32, 8, 1, -1, 1);
    se = conv(g, se, 8, 32, 1, -1, 0);
    CHECK(kiln_graph_add_node(g, KILN_OP_SIGMOID, &se, 1, NULL, 0, &se, 1) == KILN_OK);
    int32_t two[2] = {d, se};
    CHECK(kiln_graph_add_node(g, KILN_OP_MUL, two, 2, NULL, 0, &m, 1) == KILN_OK);
    y = conv(g, m, 32, 16, 1, x, 0);
    CHECK(kiln_graph_mark_output(g, y, "block") == KILN_OK);
    int32_t xx[2] = {x, x};
    CHECK(kiln_graph_add_node(g, KILN_OP_ADD, xx, 2, NULL, 0, &r, 1) == KILN_OK);
    d2 = dwconv(g, r, 16);
    kiln_attr pa = {"dims", perm, NULL, 4};
    CHECK(kiln_graph_add_node(g, KILN_OP_PERMUTE, &d2, 1, &pa, 1, &pm, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, pm, "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    uint32_t dw1 = find_head(&p, KILN_OP_CONV2D, find_head(&p, KILN_OP_CONV2D, 0) + 1);
    uint32_t mul = find_head(&p, KILN_OP_MUL, 0), mn = find_head(&p, KILN_OP_MEAN, 0);
    uint32_t dw2 = UINT32_MAX;
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        if (p.layers[li].op != KILN_OP_CONV2D) continue;
        kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[li]);
        if (kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0) == 16) dw2 = li;
    }
    CHECK(dw1 != UINT32_MAX && mul != UINT32_MAX && mn != UINT32_MAX && dw2 != UINT32_MAX);
    if (dw1 != UINT32_MAX && mul != UINT32_MAX && mn != UINT32_MAX && dw2 != UINT32_MAX) {
        CHECK_MSG(l.head_nhwc[dw1] && l.nhwc[blk_t(&p, dw1)], "the first depthwise conv NCHW");
        CHECK_MSG(l.head_nhwc[mul] && l.nhwc[blk_t(&p, mul)], "the per-channel mul NCHW");
        CHECK_MSG(l.head_nhwc[mn] && !l.alt[p.layers[mn].input_begin],
                  "the mean does not read the depthwise output in place");
        CHECK_MSG(!l.head_nhwc[dw2] && !l.nhwc[blk_t(&p, dw2)], "the second depthwise conv NHWC");
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A one-group norm between 1x1 convs (MobileViT's GroupNorm(1, C)): it keeps the convs' NHWC (no
// copy around it, its weight and bias read as they are); with two groups it reads and writes
// NCHW: a copy of its input, and the next conv reads a copy of its output. The engine's input and
// output are NCHW either way (the first conv reads an NHWC copy of x, the last one an NCHW copy
// of its input). A GELU between the norm and the next conv (SegFormer's Mix-FFN after the
// builder moves it before the permute to tokens) follows the norm's layout like any unary op;
// after the NCHW norm it writes its output NHWC for the conv (out_nhwc: one copy fewer).
static void group_norm_layout(int64_t groups, int gelu) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 16, 6, 6}, wd[1] = {16};
    double eps = 1e-5;
    int32_t x = -1, n = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t ins[3] = {conv(g, x, 16, 16, 1, -1, 0), constant(g, 1, wd), constant(g, 1, wd)};
    kiln_attr a[2] = {{"groups", &groups, NULL, 1}, {"eps", NULL, &eps, 1}};
    CHECK(kiln_graph_add_node(g, KILN_OP_GROUP_NORM, ins, 3, a, 2, &n, 1) == KILN_OK);
    if (gelu) CHECK(kiln_graph_add_node(g, KILN_OP_GELU, &n, 1, NULL, 0, &n, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, conv(g, n, 16, 16, 1, -1, 0), "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t gn = find_head(&p, KILN_OP_GROUP_NORM, 0);
    const uint32_t ge = gelu ? find_head(&p, KILN_OP_GELU, 0) : 0;
    const int one = groups == 1;
    CHECK(gn != UINT32_MAX && ge != UINT32_MAX);
    if (gn != UINT32_MAX) {
        CHECK_MSG(l.head_nhwc[gn] == one && l.nhwc[blk_t(&p, gn)] == one,
                  "groups %lld: group norm NHWC %d", (long long)groups, l.head_nhwc[gn]);
    }
    if (gelu && ge != UINT32_MAX) { // (after the NCHW norm it writes NHWC for the conv itself)
        CHECK_MSG(l.head_nhwc[ge] == one && l.nhwc[blk_t(&p, ge)] &&
                      l.out_nhwc[ge] == (one ? 0 : 1),
                  "groups %lld: the GELU after the norm NHWC %d, writing NHWC %d",
                  (long long)groups, l.head_nhwc[ge], l.out_nhwc[ge]);
    }
    const uint32_t want = one ? 2u : gelu ? 3u : 4u;
    CHECK_MSG(l.n_copies == want, "groups %lld: %u layout copies", (long long)groups, l.n_copies);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// LeakyReLU between convs as the export writes it (maximum(h, h * slope); minimum for a slope
// above 1): the multiply and the maximum follow the NHWC conv output, so no layout copy is made
// (each read the NCHW copy of an NHWC map, and the next conv an NHWC copy of their result):
// the two copies left are the input's and the output's.
static void leaky_layout(uint32_t op) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 16, 6, 6}, one[1] = {1};
    int32_t x = -1, m = -1, y = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t h = conv(g, x, 16, 16, 3, -1, 0);
    int32_t two[2] = {h, constant(g, 1, one)};
    CHECK(kiln_graph_add_node(g, KILN_OP_MUL, two, 2, NULL, 0, &m, 1) == KILN_OK);
    int32_t hm[2] = {h, m};
    CHECK(kiln_graph_add_node(g, op, hm, 2, NULL, 0, &y, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, conv(g, y, 16, 16, 3, -1, 0), "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t mx = find_head(&p, op, 0), mu = find_head(&p, KILN_OP_MUL, 0);
    CHECK(mx != UINT32_MAX && mu != UINT32_MAX);
    if (mx != UINT32_MAX && mu != UINT32_MAX) {
        CHECK_MSG(l.head_nhwc[mu] && l.head_nhwc[mx] && l.nhwc[blk_t(&p, mx)],
                  "%s: multiply NHWC %d, %s NHWC %d", kiln_op_name(op), l.head_nhwc[mu],
                  kiln_op_name(op), l.head_nhwc[mx]);
    }
    CHECK_MSG(l.n_copies == 2, "%s: %u layout copies (the input's, the output's)", kiln_op_name(op),
              l.n_copies);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A reshape of an NHWC conv's map (MobileViT's unfold, a flatten to tokens), the map's only
// reader: it transposes the NHWC bytes into its own output (rs_xpose), no layout copy is made.
// With a second NCHW-only reader of the map (another reshape) they share one copy instead.
static void reshape_transpose_layout(int shared) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 16, 6, 6}, sd[3] = {1, 16, 36}, td[4] = {1, 16, 3, 12};
    int32_t x = -1, y = -1, z = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t h = conv(g, conv(g, x, 16, 16, 3, -1, 1), 16, 16, 1, -1, 0);
    kiln_attr ra = {"shape", sd, NULL, 3}, rb = {"shape", td, NULL, 4};
    CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &h, 1, &ra, 1, &y, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (shared) {
        CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &h, 1, &rb, 1, &z, 1) == KILN_OK);
        CHECK(kiln_graph_mark_output(g, z, "z") == KILN_OK);
    }
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    uint32_t n_rs = 0, n_xposed = 0;
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        if (p.layers[li].op != KILN_OP_RESHAPE) continue;
        n_rs++;
        n_xposed += l.rs_xpose[li];
        const int32_t in = p.ids[p.layers[li].input_begin];
        CHECK_MSG(l.nhwc[in], "a reshape reads an NCHW map");
        CHECK_MSG(l.rs_xpose[li] != l.alt[p.layers[li].input_begin],
                  "a reshape both transposes and reads a copy (or neither)");
    }
    CHECK_MSG(n_rs == (shared ? 2u : 1u) && n_xposed == (shared ? 0u : 1u) &&
                  l.n_rs_xpose == n_xposed,
              "%u of %u reshapes transpose their NHWC input", n_xposed, n_rs);
    // the engine input's NHWC copy for the first conv, and the map's NCHW copy when shared
    CHECK_MSG(l.n_copies == (shared ? 2u : 1u), "shared %d: %u layout copies", shared, l.n_copies);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A one-group norm over an NHWC conv's map whose only reader needs NCHW (a 1x1 conv of 12
// outputs, not a multiple of 8: MobileViT's qkv projection of 1 + 2C): the norm writes its output
// NCHW (out_nchw) and no copy of it is made. With a second reader that keeps NHWC (a ReLU, then
// an NHWC conv) it stays NHWC and the 12-output conv reads the copy.
static void norm_out_nchw_layout(int nhwc_reader) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 16, 6, 6}, wd[1] = {16}, one = 1;
    double eps = 1e-5;
    int32_t x = -1, n = -1, r = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    int32_t ins[3] = {conv(g, x, 16, 16, 3, -1, 1), constant(g, 1, wd), constant(g, 1, wd)};
    kiln_attr a[2] = {{"groups", &one, NULL, 1}, {"eps", NULL, &eps, 1}};
    CHECK(kiln_graph_add_node(g, KILN_OP_GROUP_NORM, ins, 3, a, 2, &n, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, conv(g, n, 16, 12, 1, -1, 0), "y") == KILN_OK);
    if (nhwc_reader) {
        CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &n, 1, NULL, 0, &r, 1) == KILN_OK);
        CHECK(kiln_graph_mark_output(g, conv(g, r, 16, 16, 1, -1, 0), "z") == KILN_OK);
    }
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t gn = find_head(&p, KILN_OP_GROUP_NORM, 0);
    CHECK(gn != UINT32_MAX);
    if (gn != UINT32_MAX) {
        const int32_t o = blk_t(&p, gn), in = p.ids[p.layers[gn].input_begin];
        CHECK_MSG(l.head_nhwc[gn] && l.nhwc[in], "the norm does not read its NHWC input");
        CHECK_MSG(l.out_nchw[gn] == !nhwc_reader && l.nhwc[o] == nhwc_reader,
                  "reader %d: out_nchw %d, output NHWC %d", nhwc_reader, l.out_nchw[gn], l.nhwc[o]);
        CHECK_MSG(l.copy[o] == nhwc_reader, "reader %d: the norm's output copy %d", nhwc_reader,
                  l.copy[o]);
        for (uint32_t i = 0; i < p.n_ids && !nhwc_reader; i++) {
            CHECK_MSG(p.ids[i] != o || !l.alt[i], "a read of the norm's output through a copy");
        }
    }
    CHECK_MSG(l.n_out_nchw == (nhwc_reader ? 0u : 1u), "%u norms write NCHW", l.n_out_nchw);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A 3x3 conv of 16 channels over an input x [1, 16, 4, 32] (a map the layout stores NHWC).
static int32_t conv_map(kiln_graph *g) {
    int64_t xd[4] = {1, 16, 4, 32};
    int32_t x = -1;
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    return conv(g, x, 16, 16, 3, -1, 0);
}

// The readers of y in the layers that write NHWC: a 1x1 conv that computes NHWC, and with
// nchw_reader a mean over C that needs NCHW.
static void nhwc_out_readers(kiln_graph *g, int32_t y, int nchw_reader) {
    int64_t c_dim = 1, keep = 1;
    int32_t m = -1;
    CHECK(kiln_graph_mark_output(g, conv(g, y, 16, 16, 1, -1, 0), "z") == KILN_OK);
    if (nchw_reader) {
        kiln_attr ma[2] = {{"dims", &c_dim, NULL, 1}, {"keepdim", &keep, NULL, 1}};
        CHECK(kiln_graph_add_node(g, KILN_OP_MEAN, &y, 1, ma, 2, &m, 1) == KILN_OK);
        CHECK(kiln_graph_mark_output(g, m, "m") == KILN_OK);
    }
}

// Layer li writing o: NHWC itself, with no copy, when only the conv reads o; else NCHW and o
// copied to NHWC for the conv.
static void check_out_nhwc(const kiln_cuda_layout *l, uint32_t li, int32_t o, int nchw_reader) {
    CHECK_MSG(l->out_nhwc[li] == !nchw_reader && l->nhwc[o] == !nchw_reader,
              "reader %d: out_nhwc %d, output NHWC %d", nchw_reader, l->out_nhwc[li], l->nhwc[o]);
    CHECK_MSG(l->copy[o] == nchw_reader, "reader %d: the output's copy %d", nchw_reader,
              l->copy[o]);
}

// MobileViT's linear attention output: t = an NHWC conv's map [1, 16, 4, 32]; ctx = sum(t over
// W, keepdim) [1, 16, 4, 1] (NCHW); y = relu(t) * ctx: its operand broadcasts over W (not one
// value per channel), so the group runs NCHW, and its only reader is a 1x1 conv that computes
// NHWC: the group writes its output NHWC (out_nhwc) and no copy of it is made. With a second
// reader that needs NCHW (a mean over C) it stays NCHW and the conv reads its NHWC copy.
static void ew_out_nhwc_layout(int nchw_reader) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t w_dim = -1, keep = 1;
    int32_t ctx = -1, r = -1, y = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    int32_t t = conv_map(g);
    kiln_attr sa[2] = {{"dims", &w_dim, NULL, 1}, {"keepdim", &keep, NULL, 1}};
    CHECK(kiln_graph_add_node(g, KILN_OP_SUM, &t, 1, sa, 2, &ctx, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &t, 1, NULL, 0, &r, 1) == KILN_OK);
    int32_t mi[2] = {r, ctx};
    CHECK(kiln_graph_add_node(g, KILN_OP_MUL, mi, 2, NULL, 0, &y, 1) == KILN_OK);
    nhwc_out_readers(g, y, nchw_reader);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t head = find_head(&p, KILN_OP_RELU, 0);
    CHECK(head != UINT32_MAX);
    if (head != UINT32_MAX) {
        const int32_t o = kiln_plan_group_output(&p, head);
        CHECK_MSG(p.layers[head].n_tail == 1 && !l.head_nhwc[head], "the group does not run NCHW");
        check_out_nhwc(&l, head, o, nchw_reader);
        for (uint32_t i = 0; i < p.n_ids && !nchw_reader; i++) {
            CHECK_MSG(p.ids[i] != o || !l.alt[i], "a read of the group's output through a copy");
        }
    }
    CHECK_MSG(l.n_out_nhwc == (nchw_reader ? 0u : 1u), "%u groups write NHWC", l.n_out_nhwc);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// MobileViT's fold of patches back into a map: t = an NHWC conv's map [1, 16, 4, 32] with H and
// W swapped by a permute (not a layout permute), read by a 1x1 conv that computes NHWC: the
// permute writes its output NHWC (out_nhwc) and no copy of it is made. With a second reader
// that needs NCHW (a mean over C) it stays NCHW and the conv reads its NHWC copy.
static void permute_out_nhwc_layout(int nchw_reader) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t swap[4] = {0, 1, 3, 2};
    int32_t y = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    int32_t t = conv_map(g);
    kiln_attr pa[1] = {{"dims", swap, NULL, 4}};
    CHECK(kiln_graph_add_node(g, KILN_OP_PERMUTE, &t, 1, pa, 1, &y, 1) == KILN_OK);
    nhwc_out_readers(g, y, nchw_reader);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t pl = find_head(&p, KILN_OP_PERMUTE, 0);
    CHECK(pl != UINT32_MAX);
    if (pl != UINT32_MAX) {
        const int32_t o = kiln_plan_group_output(&p, pl);
        CHECK_MSG(!l.ident[pl], "the permute is not a layout permute");
        check_out_nhwc(&l, pl, o, nchw_reader);
    }
    CHECK_MSG(l.n_out_nhwc == (nchw_reader ? 0u : 1u), "%u layers write NHWC", l.n_out_nhwc);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A 3x3 conv's map of an input x [1, 16, 4, 32] reshaped to `six` (6 dims), permuted by `perm`
// and reshaped to `four` (4 dims): MobileViT's fold and unfold. Returns the last reshape's
// output; *u: the first's.
static int32_t conv_map_rearranged(kiln_graph *g, const int64_t *six, const int64_t *perm,
                                   const int64_t *four, int32_t *u) {
    int32_t v = -1, y = -1;
    int32_t t = conv_map(g);
    kiln_attr ra[1] = {{"shape", six, NULL, 6}}, pa[1] = {{"dims", perm, NULL, 6}},
              ma[1] = {{"shape", four, NULL, 4}};
    CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &t, 1, ra, 1, u, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_PERMUTE, u, 1, pa, 1, &v, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &v, 1, ma, 1, &y, 1) == KILN_OK);
    return y;
}

// MobileViT's fold proper: t = an NHWC conv's map [1, 16, 4, 32] as patches [1, 16, 2, 2, 8, 4],
// permuted (0, 1, 4, 2, 5, 3) and viewed as [1, 16, 16, 8] for a 1x1 conv that computes NHWC:
// the permute writes channels-last, the reshape is a layer of the same bytes (ident) and its
// output is stored NHWC with no copy. With a second reader of the map that needs NCHW (a mean
// over C) nothing changes.
static void fold_out_nhwc_layout(int nchw_reader) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    const int64_t patches[6] = {1, 16, 2, 2, 8, 4}, fold[6] = {0, 1, 4, 2, 5, 3},
                  map[4] = {1, 16, 16, 8};
    int32_t u = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    const int32_t y = conv_map_rearranged(g, patches, fold, map, &u);
    nhwc_out_readers(g, y, nchw_reader);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t pl = find_head(&p, KILN_OP_PERMUTE, 0);
    CHECK(pl != UINT32_MAX);
    if (pl != UINT32_MAX) {
        const int32_t o = kiln_plan_group_output(&p, pl);
        uint32_t rl = UINT32_MAX;
        for (uint32_t k = pl + 1; k < p.n_layers && rl == UINT32_MAX; k++) {
            if (p.layers[k].op == KILN_OP_RESHAPE && p.ids[p.layers[k].input_begin] == o) rl = k;
        }
        CHECK(rl != UINT32_MAX);
        if (rl != UINT32_MAX) {
            const int32_t o2 = p.ids[p.layers[rl].output_begin];
            CHECK_MSG(l.out_nhwc[pl] == !nchw_reader && l.ident[rl] == !nchw_reader,
                      "reader %d: permute out_nhwc %d, reshape ident %d", nchw_reader,
                      l.out_nhwc[pl], l.ident[rl]);
            CHECK_MSG(l.nhwc[o2] == !nchw_reader && l.copy[o2] == nchw_reader,
                      "reader %d: the map NHWC %d, copied %d", nchw_reader, l.nhwc[o2], l.copy[o2]);
        }
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// ShuffleNet's channel shuffle: t = an NHWC conv's map [1, 16, 4, 32] as [1, 2, 8, 4, 32] (groups
// of channels), permuted (0, 2, 1, 3, 4) and viewed as [1, 16, 4, 32] for a 1x1 conv: the
// reshape's C is the product of the permute output's dims 1 and 2, so the permute writes
// channels-last with two channel dims (out_nhwc 2), the reshape is a layer of the same bytes
// and no copy of the map is made.
static void shuffle_out_nhwc_layout(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    const int64_t groups[5] = {1, 2, 8, 4, 32}, shuffle[5] = {0, 2, 1, 3, 4};
    const int64_t map[4] = {1, 16, 4, 32};
    int32_t u = -1, v = -1, y = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    int32_t t = conv_map(g);
    kiln_attr ra[1] = {{"shape", groups, NULL, 5}}, pa[1] = {{"dims", shuffle, NULL, 5}},
              ma[1] = {{"shape", map, NULL, 4}};
    CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &t, 1, ra, 1, &u, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_PERMUTE, &u, 1, pa, 1, &v, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_RESHAPE, &v, 1, ma, 1, &y, 1) == KILN_OK);
    nhwc_out_readers(g, y, 0);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t pl = find_head(&p, KILN_OP_PERMUTE, 0);
    CHECK(pl != UINT32_MAX);
    if (pl != UINT32_MAX) {
        const int32_t o = kiln_plan_group_output(&p, pl);
        const uint32_t rl = find_head(&p, KILN_OP_RESHAPE, pl + 1);
        CHECK(rl != UINT32_MAX);
        if (rl != UINT32_MAX) {
            const int32_t o2 = p.ids[p.layers[rl].output_begin];
            CHECK_EQ_INT(l.out_nhwc[pl], 2);
            CHECK_EQ_INT(l.nhwc[o], 2);
            CHECK_MSG(l.ident[rl] && l.nhwc[o2] && !l.copy[o2],
                      "reshape ident %d, the map NHWC %d, copied %d", l.ident[rl], l.nhwc[o2],
                      l.copy[o2]);
        }
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// MobileViT's unfold: t = an NHWC conv's map [1, 16, 4, 32] as [1, 16, 2, 2, 8, 4], permuted
// (0, 1, 3, 5, 2, 4) into patches and viewed as [1, 16, 4, 32] for a mean over the patches: the
// reshape is a layer of the map's NHWC bytes (ident, no copy of the map, no transpose) and the
// permute reads them channels-last (in_nhwc). With a second reader of the reshape's output it
// transposes the map instead (rs_xpose).
static void unfold_in_nhwc_layout(int second_reader) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    const int64_t six[6] = {1, 16, 2, 2, 8, 4}, unf[6] = {0, 1, 3, 5, 2, 4},
                  pat[4] = {1, 16, 4, 32};
    int64_t p_dim = 2, keep = 1;
    int32_t u = -1, m = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    const int32_t y = conv_map_rearranged(g, six, unf, pat, &u);
    kiln_attr mm[2] = {{"dims", &p_dim, NULL, 1}, {"keepdim", &keep, NULL, 1}};
    CHECK(kiln_graph_add_node(g, KILN_OP_MEAN, &y, 1, mm, 2, &m, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, m, "m") == KILN_OK);
    if (second_reader) CHECK(kiln_graph_mark_output(g, u, "u") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    const uint32_t pl = find_head(&p, KILN_OP_PERMUTE, 0);
    CHECK(pl != UINT32_MAX);
    if (pl != UINT32_MAX) {
        const int32_t u2 = p.ids[p.layers[pl].input_begin];
        uint32_t rs = UINT32_MAX;
        for (uint32_t k = 0; k < pl && rs == UINT32_MAX; k++) {
            if (p.layers[k].op == KILN_OP_RESHAPE && p.ids[p.layers[k].output_begin] == u2) rs = k;
        }
        CHECK(rs != UINT32_MAX);
        if (rs != UINT32_MAX) {
            CHECK_MSG(l.in_nhwc[pl] == !second_reader && l.ident[rs] == !second_reader &&
                          l.rs_xpose[rs] == second_reader,
                      "second reader %d: permute in_nhwc %d, reshape ident %d, rs_xpose %d",
                      second_reader, l.in_nhwc[pl], l.ident[rs], l.rs_xpose[rs]);
            CHECK_MSG(l.nhwc[u2] == !second_reader, "the reshape's output NHWC %d", l.nhwc[u2]);
            const int32_t map = p.ids[p.layers[rs].input_begin];
            CHECK_MSG(l.nhwc[map] && !l.copy[map], "the map: NHWC %d, copied %d", l.nhwc[map],
                      l.copy[map]);
        }
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A DenseNet block (fp16): x (16 channels, written by a conv) and two layers, each
// concatenating the features so far, batch norm (constant statistics: the builder's multiply and
// add, fused with the ReLU into the concatenation's group), a 3x3 conv adding 8 channels; then
// the last concatenation + sigmoid and a 2x2 average pool. Every concatenation and every feature
// stays NHWC: the only layout copies are at the engine's float32 input and output casts.
static void densenet_layout(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t dims[4] = {2, 8, 8, 8}, cat_dim = 1;
    int32_t x = -1, feats[3], n = 0;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, dims, dims, &x) == KILN_OK);
    feats[n++] = conv(g, x, 8, 16, 3, -1, 1);
    int64_t c = 16;
    for (int layer = 0; layer < 2; layer++) {
        int32_t h = -1, bn[5];
        kiln_attr ca = {"dim", &cat_dim, NULL, 1};
        CHECK(kiln_graph_add_node(g, KILN_OP_CAT, feats, (uint32_t)n, &ca, 1, &h, 1) == KILN_OK);
        int64_t cd[1] = {c};
        bn[0] = h;
        for (int i = 1; i < 5; i++) bn[i] = constant(g, 1, cd);
        for (int64_t i = 0; i < c; i++) wbuf[i] = 1.0f; // a positive variance
        CHECK(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, 1, cd, wbuf,
                                      (size_t)c * sizeof(float), &bn[4]) == KILN_OK);
        CHECK(kiln_graph_add_node(g, KILN_OP_BATCH_NORM, bn, 5, NULL, 0, &h, 1) == KILN_OK);
        CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &h, 1) == KILN_OK);
        feats[n++] = conv(g, h, c, 8, 3, -1, 0);
        c += 8;
    }
    int32_t y = -1;
    kiln_attr ca = {"dim", &cat_dim, NULL, 1};
    CHECK(kiln_graph_add_node(g, KILN_OP_CAT, feats, (uint32_t)n, &ca, 1, &y, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_SIGMOID, &y, 1, NULL, 0, &y, 1) == KILN_OK);
    int64_t pool[2] = {2, 2};
    kiln_attr pa[2] = {{"kernel", pool, NULL, 2}, {"stride", pool, NULL, 2}};
    CHECK(kiln_graph_add_node(g, KILN_OP_AVG_POOL2D, &y, 1, pa, 2, &y, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    uint32_t cats = 0, nhwc_cats = 0, fused = 0;
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        if (p.layers[li].op != KILN_OP_CAT) continue;
        cats++;
        nhwc_cats += l.head_nhwc[li] && l.nhwc[blk_t(&p, li)];
        fused += p.layers[li].n_tail == 3 && p.layers[li + 1].op == KILN_OP_MUL &&
                 p.layers[li + 2].op == KILN_OP_ADD && p.layers[li + 3].op == KILN_OP_RELU;
    }
    // (the first layer's concatenation of one tensor is that tensor: no layer)
    CHECK_MSG(cats == 2 && nhwc_cats == 2, "%u of %u concatenations NHWC", nhwc_cats, cats);
    CHECK_MSG(fused == 1, "%u concatenations carry the norm and ReLU (want 1: the second layer's)",
              fused);
    CHECK_MSG(count_op(&p, KILN_OP_BATCH_NORM) == 0, "a batch norm is left");
    CHECK_MSG(l.n_copies == 2,
              "%u layout copies (want 2: the engine input for the first conv, the pool's output "
              "for the cast to the float32 output)",
              l.n_copies);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// A feature pyramid (fp16): a group conv of 8 channels per group (NHWC), a 2x nearest upsample of
// a strided conv's output added to a lateral
// conv (the residual of its group), a 3x3 conv on the sum. The upsample runs NHWC, so the only
// layout copies are at the engine's float32 input and output casts.
static void fpn_layout(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t dims[4] = {1, 16, 8, 8}, size[2] = {8, 8}, s2[2] = {2, 2}, pad[2] = {1, 1};
    int32_t x = -1, c1, c2, up = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, dims, dims, &x) == KILN_OK);
    c1 = conv(g, x, 16, 16, 3, -1, 1);
    int64_t wd[4] = {16, 16, 3, 3};
    int32_t ins[2] = {c1, constant(g, 4, wd)};
    kiln_attr ca[2] = {{"stride", s2, NULL, 2}, {"padding", pad, NULL, 2}};
    CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, ins, 2, ca, 2, &c2, 1) == KILN_OK);
    { // a 3x3 group conv, 8 channels per group (RegNet's): NHWC
        int64_t gw[4] = {16, 8, 3, 3}, groups = 2;
        int32_t gi[2] = {c2, constant(g, 4, gw)};
        kiln_attr ga[2] = {{"padding", pad, NULL, 2}, {"groups", &groups, NULL, 1}};
        CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, gi, 2, ga, 2, &c2, 1) == KILN_OK);
    }
    c2 = conv(g, c2, 16, 16, 1, -1, 0);
    kiln_attr ua = {"output_size", size, NULL, 2};
    CHECK(kiln_graph_add_node(g, KILN_OP_UPSAMPLE_NEAREST2D, &c2, 1, &ua, 1, &up, 1) == KILN_OK);
    int32_t y = conv(g, conv(g, c1, 16, 16, 1, up, 0), 16, 16, 3, -1, 0);
    CHECK(kiln_graph_mark_output(g, y, "y") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    for (uint32_t li = 0; li < p.n_layers; li += 1 + p.layers[li].n_tail) {
        if (p.layers[li].op != KILN_OP_CONV2D) continue;
        kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[li]);
        if (kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0) == 2) {
            CHECK_MSG(l.head_nhwc[li] && l.nhwc[blk_t(&p, li)], "the group conv runs NCHW");
        }
    }
    uint32_t u = find_head(&p, KILN_OP_UPSAMPLE_NEAREST2D, 0);
    CHECK(u != UINT32_MAX);
    if (u != UINT32_MAX) {
        CHECK_MSG(l.head_nhwc[u] && l.nhwc[blk_t(&p, u)], "the upsample runs NCHW");
    }
    CHECK_MSG(l.n_copies == 2, "%u layout copies (want 2: the float32 input and output casts)",
              l.n_copies);
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

// krsc_only: a weight read only by NHWC convs (two of them here) needs no OIHW bytes on the
// device; one an elementwise layer reads too keeps them.
static void krsc_readers_layout(void) {
    kiln_graph *g = NULL;
    kiln_plan p;
    kiln_cuda_layout l;
    int64_t xd[4] = {1, 16, 8, 8}, wd[4] = {16, 16, 3, 3}, w2d[4] = {16, 16, 1, 1};
    int64_t pad1[2] = {1, 1};
    int32_t x = -1, z = -1, h = -1, h2 = -1, h3 = -1, sum = -1;
    memset(&p, 0, sizeof p);
    CHECK(kiln_graph_new(&g) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xd, xd, &x) == KILN_OK);
    CHECK(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 4, w2d, w2d, &z) == KILN_OK);
    const int32_t w = constant(g, 4, wd), w2 = constant(g, 4, w2d);
    kiln_attr a = {"padding", pad1, NULL, 2};
    int32_t c1[2] = {x, w};
    CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, c1, 2, &a, 1, &h, 1) == KILN_OK);
    CHECK(kiln_graph_add_node(g, KILN_OP_RELU, &h, 1, NULL, 0, &h, 1) == KILN_OK);
    int32_t c2[2] = {h, w};
    CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, c2, 2, &a, 1, &h2, 1) == KILN_OK);
    int32_t c3[2] = {h2, w2};
    CHECK(kiln_graph_add_node(g, KILN_OP_CONV2D, c3, 2, NULL, 0, &h3, 1) == KILN_OK);
    int32_t s2[2] = {w2, z};
    CHECK(kiln_graph_add_node(g, KILN_OP_ADD, s2, 2, NULL, 0, &sum, 1) == KILN_OK);
    CHECK(kiln_graph_mark_output(g, h3, "y") == KILN_OK);
    CHECK(kiln_graph_mark_output(g, sum, "s") == KILN_OK);
    if (!load(g, KILN_PRECISION_FP16, &p)) return;
    CHECK(kiln_cuda_layout_plan(&p, KILN_CUDA_LAYOUT_NHWC, &l) == KILN_OK);
    uint32_t a1 = find_head(&p, KILN_OP_CONV2D, 0);
    uint32_t a2 = a1 == UINT32_MAX ? a1 : find_head(&p, KILN_OP_CONV2D, a1 + 1);
    uint32_t a3 = a2 == UINT32_MAX ? a2 : find_head(&p, KILN_OP_CONV2D, a2 + 1);
    CHECK(a3 != UINT32_MAX);
    if (a3 != UINT32_MAX) {
        const int32_t pw = p.ids[p.layers[a1].input_begin + 1];
        const int32_t pw2 = p.ids[p.layers[a3].input_begin + 1];
        CHECK(p.ids[p.layers[a2].input_begin + 1] == pw); // one weight, two convs
        CHECK(l.head_nhwc[a1] && l.head_nhwc[a2] && l.head_nhwc[a3]);
        CHECK(l.krsc[pw] && l.krsc_only[pw]);
        CHECK_MSG(l.krsc[pw2] && !l.krsc_only[pw2], "the add reads the 1x1 weight too");
        for (uint32_t i = 0; i < p.n_tensors; i++) CHECK(!l.krsc_only[i] || l.krsc[i]);
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

int main(void) {
    check_rng_seed();
    krsc_readers_layout();
    densenet_layout();
    fpn_layout();
    mbconv_layout();
    state_layout();
    bench_stage(1);
    bench_stage(0);
    resnet_like(KILN_PRECISION_FP16, 0);
    resnet_like(KILN_PRECISION_BF16, 0);
    resnet_like(KILN_PRECISION_FP32, 0);
    resnet_like(KILN_PRECISION_FP16, 1);
    gemv_l2(KILN_PRECISION_FP16, 1, 0);
    gemv_l2(KILN_PRECISION_BF16, 8, 0);
    gemv_l2(KILN_PRECISION_FP16, 9, 0); // too many rows: cuBLASLt, no hints
    gemv_l2(KILN_PRECISION_FP32, 1, 0); // float32 weights: cuBLASLt
    // the plan over the small-M wgmma linear's rows too (sm_90): 9 and 256 rows planned, 257 not
    gemv_l2(KILN_PRECISION_FP16, 9, 256);
    gemv_l2(KILN_PRECISION_BF16, 256, 256);
    gemv_l2(KILN_PRECISION_FP16, 257, 256);
    gemv_l2(KILN_PRECISION_FP32, 64, 256);
    norm_out_nchw_layout(0);
    norm_out_nchw_layout(1);
    ew_out_nhwc_layout(0);
    ew_out_nhwc_layout(1);
    permute_out_nhwc_layout(0);
    permute_out_nhwc_layout(1);
    fold_out_nhwc_layout(0);
    fold_out_nhwc_layout(1);
    shuffle_out_nhwc_layout();
    unfold_in_nhwc_layout(0);
    unfold_in_nhwc_layout(1);
    reshape_transpose_layout(0);
    reshape_transpose_layout(1);
    for (int gelu = 0; gelu < 2; gelu++) {
        group_norm_layout(1, gelu);
        group_norm_layout(2, gelu);
    }
    leaky_layout(KILN_OP_MAXIMUM);
    leaky_layout(KILN_OP_MINIMUM);
    dw_taps_layout(3);
    dw_taps_layout(5);
    dw_taps_layout(7);
    dw_taps_layout(9);
    return check_summary();
}
