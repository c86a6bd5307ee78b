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

static float wbuf[32 * 32 * 9];

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
    CHECK(kiln_cuda_layout_plan(&p, 1, &l) == KILN_OK);
    uint32_t stem = find_head(&p, KILN_OP_CONV2D, 0), mpool = find_head(&p, KILN_OP_MAX_POOL2D, 0);
    uint32_t apool = find_head(&p, KILN_OP_AVG_POOL2D, 0);
    uint32_t adapt = find_head(&p, KILN_OP_ADAPTIVE_AVG_POOL2D, 0);
    CHECK(stem != UINT32_MAX && mpool != UINT32_MAX && apool != UINT32_MAX && adapt != UINT32_MAX);
    if (stem == UINT32_MAX || mpool == UINT32_MAX || apool == UINT32_MAX || adapt == UINT32_MAX) {
        kiln_cuda_layout_free(&p, &l);
        kiln_plan_release(&p);
        return;
    }
    int32_t pool_t = kiln_cuda_group_output(&p, mpool);
    int half = prec == KILN_PRECISION_FP16 || prec == KILN_PRECISION_BF16;
    CHECK(!l.head_nhwc[stem] && !l.nhwc[kiln_cuda_group_output(&p, stem)]); // C = 3
    CHECK(!l.head_nhwc[mpool] && !l.nhwc[pool_t]);                          // its input is NCHW
    CHECK(!l.nhwc[kiln_cuda_group_output(&p, adapt)]);                      // writes NCHW
    if (!half) {
        CHECK(l.n_nhwc == 0 && l.n_conv_nhwc == 0);
    } else if (!extra_output) {
        CHECK_MSG(l.n_conv_nhwc == 4, "%u NHWC convs", l.n_conv_nhwc);
        CHECK(l.copy[pool_t] && l.n_copies == 1); // one copy for two consumers
        uint32_t first = find_head(&p, KILN_OP_CONV2D, stem + 1);
        uint32_t second = find_head(&p, KILN_OP_CONV2D, first + 1);
        CHECK(first != UINT32_MAX && l.xpose[first] && second != UINT32_MAX && !l.xpose[second]);
        CHECK(l.head_nhwc[apool] && l.nhwc[kiln_cuda_group_output(&p, apool)]);
        CHECK(l.head_nhwc[adapt]);
        for (uint32_t i = 0; i < p.n_tensors; i++) {
            if (l.nhwc[i]) CHECK(p.tensors[i].kind == KILN_TENSOR_ACTIVATION);
            if (l.krsc[i]) CHECK(p.tensors[i].kind == KILN_TENSOR_WEIGHT);
        }
    } else {
        // blk is an engine output (NCHW): its producer conv goes NCHW, that conv's input (the
        // relu'd 16->8 conv) and its residual (the downsample) follow; the last conv reads blk
        // as input and residual, so it is NCHW too, and so are the pools after it.
        CHECK_MSG(l.n_conv_nhwc == 0, "%u NHWC convs", l.n_conv_nhwc);
        CHECK(l.n_nhwc == 0 && l.n_copies == 0);
        CHECK(!l.head_nhwc[apool] && !l.head_nhwc[adapt]);
    }
    kiln_cuda_layout_free(&p, &l);
    kiln_plan_release(&p);
}

int main(void) {
    check_rng_seed();
    resnet_like(KILN_PRECISION_FP16, 0);
    resnet_like(KILN_PRECISION_BF16, 0);
    resnet_like(KILN_PRECISION_FP32, 0);
    resnet_like(KILN_PRECISION_FP16, 1);
    return check_summary();
}
