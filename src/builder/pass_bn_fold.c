// SPDX-License-Identifier: Apache-2.0
// Batch-norm folding: batch_norm(conv2d(x, w, b)) with constant w, b and constant statistics,
// where the conv's output feeds only the batch norm, becomes conv2d(x, w', b') with
//   s[c] = gamma[c] / sqrt(var[c] + eps),  w'[c, ...] = w[c, ...] s[c],
//   b'[c] = (b[c] - mean[c]) s[c] + beta[c]      (gamma = 1, beta = 0, b = 0 when absent).
// The same holds for linear with a 2-D output ([N, C]: the channel is the last dim). Computed
// in double, stored in the weights' dtype.
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
    {
        const kiln_bnode *h = &b->nodes[h_node];
        if (h->dead || h->n_tail > 0 || (h->op != KILN_OP_CONV2D && h->op != KILN_OP_LINEAR)) {
            return KILN_OK;
        }
        if (h->op == KILN_OP_LINEAR && b->values[x].desc.shape.rank != 2) return KILN_OK;
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
    // The head now produces the batch norm's output value; its old output is orphaned.
    bn = &b->nodes[bn_node];
    b->values[x].kind = KILN_BV_DEAD;
    b->nodes[h_node].output = bn->output;
    b->values[bn->output].index = h_node;
    bn->dead = 1;
    KILN_TRY(kiln_bgraph_infer(b, h_node, &check));
    KILN_CHECK(kiln_desc_equal(&check, &b->values[bn->output].desc), KILN_ERR_INTERNAL,
               "batch-norm folding changed the output of node %u", h_node);
    *done = 1;
    return KILN_OK;
}

kiln_status kiln_pass_bn_fold(kiln_bgraph *b) {
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < b->n_nodes; i++) {
        int done;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_BATCH_NORM) continue;
        KILN_TRY(fold_one(b, (uint32_t)i, &done));
        b->stats.n_bn_folded += (uint32_t)done;
    }
    return KILN_OK;
}
