// SPDX-License-Identifier: Apache-2.0
// Patchify convolutions as a linear: conv2d(x[N, C, H, W], w[O, C, kh, kw], b) with stride equal
// to the kernel, no padding, dilation 1, one group, H and W static multiples of the kernel, and a
// constant weight (ViT's patch embedding: 16x16 patches, stride 16) reads every input element
// once: it is a GEMM over non-overlapping patches. It becomes
//     p = permute(reshape(x, [N, C, H/kh, kh, W/kw, kw]), (0, 2, 4, 1, 3, 5))
//     y = linear(reshape(p, [N, H/kh * W/kw, C * kh * kw]), w.reshape(O, C * kh * kw), b)
//     out = permute(reshape(y, [N, H/kh, W/kw, O]), (0, 3, 1, 2))
// the same values (each output sums the same products). Backends then run one gather, one GEMM
// and one transpose instead of a convolution whose input has 3 channels (a shape the GPU's
// convolution libraries serve poorly: 113 us for ViT-B/16's patch embedding on the H200, a few
// us as a GEMM). N may be dynamic (the reshapes copy it from their input).
// A 1x1 convolution of a one-pixel image (squeeze-excite's reduce and expand convs after a global
// pool) is the same with one patch: y = reshape(linear(reshape(x, [N, C]), w as [O, C], b),
// [N, O, 1, 1]), a small-M GEMM instead of a convolution library call on a 1x1 image.
//
// A pointwise convolution read only by an average pool that shrinks the image (DenseNet's
// transition: conv 1x1, then a 2x2 average pool of stride 2) pools first:
//     avg_pool2d(conv2d(x, w, b)) == conv2d(avg_pool2d(x), w, b)
// because the conv is the same affine map at every pixel and, without padding, each pooled
// value is a mean of pixels (weights summing to one, so the bias passes through). The conv then
// runs over the pooled pixels (a quarter of them for 2x2/2); the pool reads the conv's input
// channels instead of its output channels.
#include <string.h>

#include "builder/builder.h"
#include "core/status.h"

static kiln_status add_shaped(kiln_bgraph *b, uint32_t op, int32_t x, const int64_t *v, uint32_t n,
                              int64_t seq, int32_t *out) {
    kiln_attr_ref ref = {KILN_ATTR_INTS, n, 0};
    kiln_attrs a = {&ref, 1, v, NULL};
    int32_t ins[2] = {x, -1};
    return kiln_bgraph_add_node(b, op, ins, 1, &a, seq, out);
}

static kiln_status patchify_one(kiln_bgraph *b, uint32_t ci, int *done) {
    const kiln_bnode *cv = &b->nodes[ci];
    kiln_attrs a = kiln_bgraph_attrs(b, cv);
    int32_t x = kiln_bgraph_input(b, cv, 0), w = kiln_bgraph_input(b, cv, 1);
    int32_t bias = kiln_bgraph_input(b, cv, 2), v, wl, ins[3];
    const kiln_shape *xs, *ws;
    int64_t seq = cv->seq, kh, kw, c, h, wd, o, nb;
    *done = 0;
    if (x < 0 || !kiln_bgraph_is_const(b, w) || (bias >= 0 && !kiln_bgraph_is_const(b, bias)))
        return KILN_OK;
    xs = &b->values[x].desc.shape;
    ws = &b->values[w].desc.shape;
    if (xs->rank != 4 || ws->rank != 4) return KILN_OK;
    kh = ws->max[2];
    kw = ws->max[3];
    for (uint32_t d = 1; d < 4; d++) {
        if (xs->min[d] != xs->max[d]) return KILN_OK; // C, H, W static
    }
    c = xs->max[1];
    h = xs->max[2];
    wd = xs->max[3];
    o = ws->max[0];
    // one pixel (h = wd = 1, padding 0: the kernel is 1x1 and the output one pixel, whatever the
    // stride) is one patch
    int pixel = h == 1 && wd == 1 && kh == 1 && kw == 1;
    if (kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0) != 1 ||
        (!pixel && (kiln_attrs_int(&a, KILN_A_CONV_STRIDE, 0) != kh ||
                    kiln_attrs_int(&a, KILN_A_CONV_STRIDE, 1) != kw)) ||
        kiln_attrs_int(&a, KILN_A_CONV_PADDING, 0) != 0 ||
        kiln_attrs_int(&a, KILN_A_CONV_PADDING, 1) != 0 ||
        kiln_attrs_int(&a, KILN_A_CONV_DILATION, 0) != 1 ||
        kiln_attrs_int(&a, KILN_A_CONV_DILATION, 1) != 1) {
        return KILN_OK;
    }
    if (ws->max[1] != c || (!pixel && (kh < 2 || kw < 2 || h % kh != 0 || wd % kw != 0))) {
        return KILN_OK;
    }
    nb = xs->min[0] == xs->max[0] ? xs->max[0] : -2; // -2: copy dim 0 of the input
    if (pixel) {
        const int64_t rows[2] = {nb, c};
        KILN_TRY(add_shaped(b, KILN_OP_RESHAPE, x, rows, 2, seq, &v));
    } else {
        const int64_t split[6] = {nb, c, h / kh, kh, wd / kw, kw};
        const int64_t perm[6] = {0, 2, 4, 1, 3, 5};
        const int64_t rows[3] = {nb, (h / kh) * (wd / kw), c * kh * kw};
        KILN_TRY(add_shaped(b, KILN_OP_RESHAPE, x, split, 6, seq, &v));
        KILN_TRY(add_shaped(b, KILN_OP_PERMUTE, v, perm, 6, seq, &v));
        KILN_TRY(add_shaped(b, KILN_OP_RESHAPE, v, rows, 3, seq, &v));
    }
    {
        // the weight as [O, C * kh * kw]: the same bytes
        kiln_shape s2;
        memset(&s2, 0, sizeof s2);
        s2.rank = 2;
        s2.min[0] = s2.max[0] = o;
        s2.min[1] = s2.max[1] = c * kh * kw;
        KILN_TRY(kiln_bgraph_add_const(b, b->values[w].desc.dtype, &s2, b->values[w].data,
                                       b->values[w].nbytes, &wl));
    }
    ins[0] = v;
    ins[1] = wl;
    ins[2] = bias;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_LINEAR, ins, bias >= 0 ? 3 : 2, NULL, seq, &v));
    if (pixel) {
        const int64_t img[4] = {nb, o, 1, 1};
        KILN_TRY(add_shaped(b, KILN_OP_RESHAPE, v, img, 4, seq, &v));
    } else {
        const int64_t grid[4] = {nb, h / kh, wd / kw, o};
        const int64_t back[4] = {0, 3, 1, 2};
        KILN_TRY(add_shaped(b, KILN_OP_RESHAPE, v, grid, 4, seq, &v));
        KILN_TRY(add_shaped(b, KILN_OP_PERMUTE, v, back, 4, seq, &v));
    }
    // the last node takes over the conv's output value
    KILN_TRY(kiln_bgraph_replace_node(b, ci, v, "patchify"));
    *done = 1;
    return KILN_OK;
}

static kiln_status pool_first_one(kiln_bgraph *b, uint32_t pi, int *done) {
    const kiln_bnode *pn = &b->nodes[pi];
    int32_t y = kiln_bgraph_input(b, pn, 0), v, ins[3];
    kiln_battrs_copy pa, ca;
    *done = 0;
    if (y < 0 || b->values[y].kind != KILN_IR_NODE || b->uses[y] != 1 || b->is_output[y]) {
        return KILN_OK;
    }
    const uint32_t ci = b->values[y].index;
    const kiln_bnode *cv = &b->nodes[ci];
    if (cv->dead || cv->op != KILN_OP_CONV2D || cv->n_tail != 0 || cv->head >= 0) return KILN_OK;
    kiln_attrs a = kiln_bgraph_attrs(b, pn), c = kiln_bgraph_attrs(b, cv);
    int32_t x = kiln_bgraph_input(b, cv, 0), w = kiln_bgraph_input(b, cv, 1);
    int32_t bias = kiln_bgraph_input(b, cv, 2);
    if (x < 0 || w < 0 || b->values[w].desc.shape.rank != 4 ||
        b->values[w].desc.shape.max[2] != 1 || b->values[w].desc.shape.max[3] != 1)
        return KILN_OK;
    for (uint32_t d = 0; d < 2; d++) {
        if (kiln_attrs_int(&c, KILN_A_CONV_STRIDE, d) != 1 ||
            kiln_attrs_int(&c, KILN_A_CONV_PADDING, d) != 0 ||
            kiln_attrs_int(&a, KILN_A_AVGPOOL_PADDING, d) != 0)
            return KILN_OK;
    }
    if (kiln_attrs_int(&a, KILN_A_AVGPOOL_CEIL, 0) != 0 ||
        kiln_attrs_int(&a, KILN_A_AVGPOOL_DIVISOR, 0) != 0)
        return KILN_OK;
    // fewer pixels after the pool, at the largest shapes (else the conv saves nothing)
    const kiln_shape *ys = &b->values[y].desc.shape, *ps = &b->values[pn->output].desc.shape;
    if (ys->rank != 4 || ps->max[2] * ps->max[3] >= ys->max[2] * ys->max[3]) return KILN_OK;
    if (!kiln_bgraph_copy_attrs(b, pn, &pa) || !kiln_bgraph_copy_attrs(b, cv, &ca)) return KILN_OK;
    const int64_t seq = pn->seq;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_AVG_POOL2D, &x, 1, &pa.a, seq, &v));
    ins[0] = v;
    ins[1] = w;
    ins[2] = bias;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_CONV2D, ins, bias >= 0 ? 3 : 2, &ca.a, seq, &v));
    // the new conv takes over the pool's output value; the old conv is left unread (dce)
    KILN_TRY(kiln_bgraph_replace_node(b, pi, v, "pool first"));
    *done = 1;
    return KILN_OK;
}

kiln_status kiln_pass_patchify(kiln_bgraph *b) {
    size_t n = b->n_nodes;
    uint32_t before = b->stats.n_patchify;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_CONV2D) continue;
        KILN_TRY(patchify_one(b, (uint32_t)i, &done));
        b->stats.n_patchify += (uint32_t)done;
    }
    uint32_t pooled = 0;
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_AVG_POOL2D) continue;
        KILN_TRY(pool_first_one(b, (uint32_t)i, &done));
        pooled += (uint32_t)done;
    }
    b->stats.n_pool_first += pooled;
    // the new nodes come after the conv's readers: restore index = topological order
    if (b->stats.n_patchify != before || pooled > 0) KILN_TRY(kiln_bgraph_sort_nodes(b));
    return KILN_OK;
}
