// SPDX-License-Identifier: Apache-2.0
// Batch-norm folding: batch_norm(conv2d(x, w, b)) with constant w, b and constant statistics,
// where the conv's output feeds only the batch norm, becomes conv2d(x, w', b') with
//   s[c] = gamma[c] / sqrt(var[c] + eps),  w'[c, ...] = w[c, ...] s[c],
//   b'[c] = (b[c] - mean[c]) s[c] + beta[c]      (gamma = 1, beta = 0, b = 0 when absent).
// The same holds for linear with a 2-D output ([N, C]: the channel is the last dim), and for a
// linear whose [.., C] output reaches a [M, C] norm through reshapes only, each read once
// (LeViT's linear, flatten(0, 1), BatchNorm1d): the last reshape then gives the norm's value.
// Computed in double, stored in the weights' dtype.
//
// A constant per-channel scale or shift on such a conv2d / linear (torchvision's
// FrozenBatchNorm2d in detection backbones is x * scale + shift, the chain folded to two
// constants): conv(x, w, b) * s + t becomes conv(x, w * s, b * s + t), one op at a time (mul,
// div by, add, sub of a constant of one value per output channel, or of one value).
//
// A batch norm with constant parameters that no head takes (DenseNet's pre-activation norm
// reads a concatenation) becomes x * s + t with s and t per-channel constants of x's dtype
// shaped [1, C, 1, ...] (rank of x): two elementwise ops that the fusion after precision runs
// with the activation after them as one kernel, in either memory layout.
#include <math.h>
#include <string.h>

#include "builder/builder.h"
#include "core/dtype.h"
#include "core/status.h"

static double param(const kiln_bgraph *b, int32_t v, int64_t i, double absent) {
    if (v < 0) return absent;
    return (double)kiln_load_f32(b->values[v].data, b->values[v].desc.dtype, i);
}

static kiln_status fold_one(kiln_bgraph *b, uint32_t bn_node, int *done) {
    kiln_bnode *bn = &b->nodes[bn_node];
    int32_t x = kiln_bgraph_input(b, bn, 0), gamma = kiln_bgraph_input(b, bn, 1);
    int32_t beta = kiln_bgraph_input(b, bn, 2), mean = kiln_bgraph_input(b, bn, 3);
    int32_t var = kiln_bgraph_input(b, bn, 4), w, bias, new_w, new_b, ins[3];
    double eps;
    uint32_t h_node, dtype;
    int64_t c_out, per;
    kiln_shape bshape, wshape;
    void *wdata, *bdata;
    kiln_value_desc check;
    *done = 0;
    if ((size_t)x >= b->n_use_info || b->values[x].kind != KILN_IR_NODE || b->uses[x] != 1 ||
        b->is_output[x])
        return KILN_OK;
    h_node = b->values[x].index;
    // a linear's [.., C] output reshaped to the norm's [M, C] (LeViT's linear, flatten(0, 1),
    // BatchNorm1d): reshapes keep every element's flat index, so its channel (index mod C)
    const int32_t bn_in = x;
    for (int hops = 0; hops < 4 && b->nodes[h_node].op == KILN_OP_RESHAPE; hops++) {
        const kiln_bnode *r = &b->nodes[h_node];
        const int32_t rx = kiln_bgraph_input(b, r, 0);
        if (r->dead || r->head >= 0 || r->n_tail > 0 || kiln_bgraph_input(b, r, 1) >= 0 || rx < 0 ||
            b->values[rx].kind != KILN_IR_NODE || b->uses[rx] != 1 || b->is_output[rx])
            return KILN_OK;
        x = rx;
        h_node = b->values[x].index;
    }
    {
        const kiln_bnode *h = &b->nodes[h_node];
        if (h->dead || h->n_tail > 0 || (h->op != KILN_OP_CONV2D && h->op != KILN_OP_LINEAR)) {
            return KILN_OK;
        }
        if (x != bn_in) {
            const kiln_shape *ls = &b->values[x].desc.shape, *ns = &b->values[bn_in].desc.shape;
            if (h->op != KILN_OP_LINEAR || ns->rank != 2 || ns->min[1] != ns->max[1] ||
                ls->min[ls->rank - 1] != ls->max[ls->rank - 1] ||
                ls->max[ls->rank - 1] != ns->max[1])
                return KILN_OK;
        } else if (h->op == KILN_OP_LINEAR && b->values[x].desc.shape.rank != 2) {
            return KILN_OK;
        }
        w = kiln_bgraph_input(b, h, 1);
        bias = kiln_bgraph_input(b, h, 2);
        ins[0] = kiln_bgraph_input(b, h, 0);
    }
    if (!kiln_bgraph_is_const(b, w) || (bias >= 0 && !kiln_bgraph_is_const(b, bias))) {
        return KILN_OK;
    }
    if (!kiln_bgraph_is_const(b, mean) || !kiln_bgraph_is_const(b, var) ||
        (gamma >= 0 && !kiln_bgraph_is_const(b, gamma)) ||
        (beta >= 0 && !kiln_bgraph_is_const(b, beta))) {
        return KILN_OK;
    }
    {
        kiln_attrs a = kiln_bgraph_attrs(b, bn);
        eps = kiln_attrs_float(&a, KILN_A_BN_EPS, 0);
    }
    dtype = b->values[w].desc.dtype;
    c_out = b->values[w].desc.shape.max[0];
    per =
        c_out > 0 ? (int64_t)(b->values[w].nbytes / kiln_dtype_size((kiln_dtype)dtype)) / c_out : 0;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)b->values[w].nbytes, &wdata));
    KILN_TRY(kiln_bgraph_blob(b, (size_t)c_out * kiln_dtype_size((kiln_dtype)dtype), &bdata));
    for (int64_t c = 0; c < c_out; c++) {
        double s = param(b, gamma, c, 1.0) / sqrt(param(b, var, c, 0.0) + eps);
        double nb = (param(b, bias, c, 0.0) - param(b, mean, c, 0.0)) * s + param(b, beta, c, 0.0);
        for (int64_t k = 0; k < per; k++) {
            double v = (double)kiln_load_f32(b->values[w].data, dtype, c * per + k) * s;
            kiln_store_f32(wdata, dtype, c * per + k, (float)v);
        }
        kiln_store_f32(bdata, dtype, c, (float)nb);
    }
    wshape = b->values[w].desc.shape; // add_const may move the values array
    KILN_TRY(kiln_bgraph_add_const(b, dtype, &wshape, wdata, b->values[w].nbytes, &new_w));
    memset(&bshape, 0, sizeof bshape);
    bshape.rank = 1;
    bshape.min[0] = bshape.max[0] = c_out;
    KILN_TRY(kiln_bgraph_add_const(b, dtype, &bshape, bdata,
                                   (uint64_t)c_out * kiln_dtype_size((kiln_dtype)dtype), &new_b));
    ins[1] = new_w;
    ins[2] = new_b;
    KILN_TRY(kiln_bgraph_set_inputs(b, h_node, ins, 3));
    // The head (or the last reshape after it) now produces the batch norm's output value; its
    // old output is orphaned.
    bn = &b->nodes[bn_node];
    const uint32_t last = b->values[bn_in].index;
    b->values[bn_in].kind = KILN_BV_DEAD;
    b->nodes[last].output = bn->output;
    b->values[bn->output].index = last;
    bn->dead = 1;
    KILN_TRY(kiln_bgraph_infer(b, last, &check));
    KILN_CHECK(kiln_desc_equal(&check, &b->values[bn->output].desc), KILN_ERR_INTERNAL,
               "batch-norm folding changed the output of node %u", last);
    *done = 1;
    return KILN_OK;
}

// Constant c (a value read by node n beside y, head h's output) as one value per output channel
// of h: its values are c[i * *step] for channel i (step 0: one value). 0 when c has another
// shape.
static int per_out_channel(const kiln_bgraph *b, uint32_t h_op, const kiln_value_desc *y, int32_t c,
                           int64_t *step) {
    const kiln_value_desc *cd = &b->values[c].desc;
    uint32_t ch = h_op == KILN_OP_LINEAR ? y->shape.rank - 1 : 1, r = cd->shape.rank;
    int64_t n = 1;
    if (!kiln_dtype_is_float(cd->dtype) || r > y->shape.rank) return 0;
    for (uint32_t i = 0; i < r; i++) n *= cd->shape.max[i];
    if (n == 1) {
        *step = 0;
        return 1;
    }
    for (uint32_t i = 0; i < r; i++) {
        uint32_t yd = y->shape.rank - r + i;
        int64_t want = yd == ch ? y->shape.max[yd] : 1;
        if (cd->shape.max[i] != want || cd->shape.min[i] != want) return 0;
    }
    if (y->shape.rank - r > ch) return 0; // c does not reach the channel dim
    *step = 1;
    return 1;
}

// One fold of the constant mul/div/add/sub that alone reads head h's output into h's weight and
// bias; *done = 1 when it did.
static kiln_status fold_affine_one(kiln_bgraph *b, uint32_t h_node, int *done) {
    const kiln_bnode *h = &b->nodes[h_node];
    int32_t y = h->output, w = kiln_bgraph_input(b, h, 1), bias = kiln_bgraph_input(b, h, 2);
    int32_t ins[3], new_w = -1, new_b = -1;
    int64_t step;
    *done = 0;
    if (h->dead || h->n_tail > 0 || (h->op != KILN_OP_CONV2D && h->op != KILN_OP_LINEAR)) {
        return KILN_OK;
    }
    if (!kiln_bgraph_is_const(b, w) || (bias >= 0 && !kiln_bgraph_is_const(b, bias))) {
        return KILN_OK;
    }
    if ((size_t)y >= b->n_use_info || b->uses[y] != 1 || b->is_output[y] || b->user[y] < 0) {
        return KILN_OK;
    }
    uint32_t m_node = (uint32_t)b->user[y];
    const kiln_bnode *m = &b->nodes[m_node];
    uint32_t op = m->op;
    if (m->dead || m->head >= 0 || m->n_inputs != 2 ||
        (op != KILN_OP_MUL && op != KILN_OP_DIV && op != KILN_OP_ADD && op != KILN_OP_SUB)) {
        return KILN_OK;
    }
    int32_t a0 = kiln_bgraph_input(b, m, 0), a1 = kiln_bgraph_input(b, m, 1);
    int lhs = a0 == y;
    int32_t c = lhs ? a1 : a0;
    if ((a0 == y) == (a1 == y) || !kiln_bgraph_is_const(b, c)) return KILN_OK;
    if ((op == KILN_OP_DIV || op == KILN_OP_SUB) && !lhs) return KILN_OK; // c / y, c - y
    if (!kiln_desc_equal(&b->values[m->output].desc, &b->values[y].desc)) return KILN_OK;
    if (!per_out_channel(b, h->op, &b->values[y].desc, c, &step)) return KILN_OK;
    const uint32_t dtype = b->values[w].desc.dtype;
    const int64_t c_out = b->values[w].desc.shape.max[0];
    const size_t es = kiln_dtype_size((kiln_dtype)dtype);
    const int64_t per = c_out > 0 ? (int64_t)(b->values[w].nbytes / es) / c_out : 0;
    const int scale = op == KILN_OP_MUL || op == KILN_OP_DIV;
    if (c_out !=
        b->values[y]
            .desc.shape.max[h->op == KILN_OP_LINEAR ? b->values[y].desc.shape.rank - 1 : 1]) {
        return KILN_OK;
    }
    if (scale) {
        void *wdata;
        kiln_shape wshape = b->values[w].desc.shape;
        KILN_TRY(kiln_bgraph_blob(b, (size_t)b->values[w].nbytes, &wdata));
        for (int64_t o = 0; o < c_out; o++) {
            double k = param(b, c, o * step, 1.0);
            if (op == KILN_OP_DIV) k = 1.0 / k;
            for (int64_t i = 0; i < per; i++) {
                double v = (double)kiln_load_f32(b->values[w].data, dtype, o * per + i) * k;
                kiln_store_f32(wdata, dtype, o * per + i, (float)v);
            }
        }
        KILN_TRY(kiln_bgraph_add_const(b, dtype, &wshape, wdata, b->values[w].nbytes, &new_w));
    }
    if (bias >= 0 || !scale) {
        void *bdata;
        kiln_shape bshape;
        uint32_t bdt = bias >= 0 ? b->values[bias].desc.dtype : dtype;
        KILN_TRY(kiln_bgraph_blob(b, (size_t)c_out * kiln_dtype_size((kiln_dtype)bdt), &bdata));
        for (int64_t o = 0; o < c_out; o++) {
            double v = param(b, bias, o, 0.0), k = param(b, c, o * step, 0.0);
            v = op == KILN_OP_MUL   ? v * k
                : op == KILN_OP_DIV ? v / k
                : op == KILN_OP_ADD ? v + k
                                    : v - k;
            kiln_store_f32(bdata, bdt, o, (float)v);
        }
        memset(&bshape, 0, sizeof bshape);
        bshape.rank = 1;
        bshape.min[0] = bshape.max[0] = c_out;
        KILN_TRY(kiln_bgraph_add_const(b, bdt, &bshape, bdata,
                                       (uint64_t)c_out * kiln_dtype_size((kiln_dtype)bdt), &new_b));
    }
    h = &b->nodes[h_node];
    ins[0] = kiln_bgraph_input(b, h, 0);
    ins[1] = new_w >= 0 ? new_w : w;
    ins[2] = new_b >= 0 ? new_b : bias;
    KILN_TRY(kiln_bgraph_set_inputs(b, h_node, ins, ins[2] >= 0 ? 3 : 2));
    // The head now produces the mul's (add's ...) output; its old output is orphaned.
    m = &b->nodes[m_node];
    b->values[y].kind = KILN_BV_DEAD;
    b->nodes[h_node].output = m->output;
    b->values[m->output].index = h_node;
    b->nodes[m_node].dead = 1;
    kiln_value_desc check;
    KILN_TRY(kiln_bgraph_infer(b, h_node, &check));
    KILN_CHECK(kiln_desc_equal(&check, &b->values[b->nodes[h_node].output].desc), KILN_ERR_INTERNAL,
               "scale/shift folding changed the output of node %u", h_node);
    *done = 1;
    return KILN_OK;
}

// A per-channel constant [1, C, 1, ...] (rank r) of dtype dt: scale (which = 0) or shift.
static kiln_status affine_const(kiln_bgraph *b, uint32_t bn_node, int which, uint32_t dt,
                                uint32_t r, int64_t c_n, int32_t *out) {
    const kiln_bnode *bn = &b->nodes[bn_node];
    int32_t gamma = kiln_bgraph_input(b, bn, 1), beta = kiln_bgraph_input(b, bn, 2);
    int32_t mean = kiln_bgraph_input(b, bn, 3), var = kiln_bgraph_input(b, bn, 4);
    kiln_attrs a = kiln_bgraph_attrs(b, bn);
    double eps = kiln_attrs_float(&a, KILN_A_BN_EPS, 0);
    size_t es = kiln_dtype_size((kiln_dtype)dt);
    void *data;
    kiln_shape s;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)c_n * es, &data));
    for (int64_t c = 0; c < c_n; c++) {
        double k = param(b, gamma, c, 1.0) / sqrt(param(b, var, c, 0.0) + eps);
        double v = which == 0 ? k : param(b, beta, c, 0.0) - param(b, mean, c, 0.0) * k;
        kiln_store_f32(data, dt, c, (float)v);
    }
    memset(&s, 0, sizeof s);
    s.rank = r;
    for (uint32_t d = 0; d < r; d++) s.min[d] = s.max[d] = d == 1 ? c_n : 1;
    return kiln_bgraph_add_const(b, dt, &s, data, (uint64_t)c_n * es, out);
}

static kiln_status split_one(kiln_bgraph *b, uint32_t bn_node, int *done) {
    const kiln_bnode *bn = &b->nodes[bn_node];
    int32_t x = kiln_bgraph_input(b, bn, 0), ins[2], sv, tv, y;
    *done = 0;
    for (uint32_t i = 1; i < 5; i++) {
        int32_t v = kiln_bgraph_input(b, bn, i);
        if (v >= 0 && !kiln_bgraph_is_const(b, v)) return KILN_OK;
        if (v < 0 && i >= 3) return KILN_OK;
    }
    const kiln_value_desc *xd = &b->values[x].desc;
    uint32_t dt = xd->dtype, r = xd->shape.rank;
    if (r < 2 || xd->shape.min[1] != xd->shape.max[1] || !kiln_dtype_is_float((kiln_dtype)dt)) {
        return KILN_OK;
    }
    int64_t c_n = xd->shape.max[1];
    int64_t seq = bn->seq;
    KILN_TRY(affine_const(b, bn_node, 0, dt, r, c_n, &sv));
    KILN_TRY(affine_const(b, bn_node, 1, dt, r, c_n, &tv));
    ins[0] = x;
    ins[1] = sv;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_MUL, ins, 2, NULL, seq, &y));
    ins[0] = y;
    ins[1] = tv;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_ADD, ins, 2, NULL, seq, &y));
    KILN_TRY(kiln_bgraph_replace_node(b, bn_node, y, "batch norm as a per-channel affine"));
    *done = 1;
    return KILN_OK;
}

kiln_status kiln_pass_bn_fold(kiln_bgraph *b) {
    int split = 0;
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < b->n_nodes; i++) {
        int done;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_BATCH_NORM) continue;
        KILN_TRY(fold_one(b, (uint32_t)i, &done));
        b->stats.n_bn_folded += (uint32_t)done;
    }
    for (size_t i = 0; i < b->n_nodes; i++) {
        int done = b->nodes[i].op == KILN_OP_CONV2D || b->nodes[i].op == KILN_OP_LINEAR;
        while (done) {
            KILN_TRY(kiln_bgraph_count_uses(b));
            KILN_TRY(fold_affine_one(b, (uint32_t)i, &done));
            b->stats.n_bn_folded += (uint32_t)done;
        }
    }
    KILN_TRY(kiln_bgraph_count_uses(b));
    const size_t n = b->n_nodes; // split_one appends nodes
    for (size_t i = 0; i < n; i++) {
        int done;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_BATCH_NORM) continue;
        KILN_TRY(split_one(b, (uint32_t)i, &done));
        b->stats.n_bn_split += (uint32_t)done;
        split |= done;
    }
    return split ? kiln_bgraph_sort_nodes(b) : KILN_OK;
}
