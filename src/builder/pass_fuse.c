// SPDX-License-Identifier: Apache-2.0
// Fusion of elementwise tails into a head (linear, matmul, conv2d, conv_transpose2d):
//  1. bias: head(x, w) + c, with c a constant of the head's dtype that broadcasts only along
//     the output features (linear: [N] or [1, .., N]; conv: [O, 1, 1] or [1, O, 1, 1]),
//     becomes head(x, w, c) when the head has no bias (linear and the convs);
//  2. tails: then up to KILN_MAX_TAIL ops flagged KILN_OPF_TAIL, each reading the running value
//     once: unary activations, and add/sub/mul/div with an operand that broadcasts to the
//     running value's shape (a residual, a per-channel scale, a 0-d constant ...).
// Every value fused away (the head's output and each intermediate) must have exactly one
// reader and not be a graph output; the last value may be an output. Tails do not change the
// running value's dtype or shape: the group computes in place in the head's output tensor.
//
// kiln_pass_fuse_ew runs after precision conversion (so that no cast is inserted inside a
// group) and gives the same kind of tail to the float elementwise ops and concatenations that no
// head took (ops flagged KILN_OPF_EW_HEAD): a batch norm split into its multiply and add and the
// ReLU after it, the chains of a squeeze-excite scale, a concatenation and the norm reading it.
// Backends run such a group as one program (cuda) or the head then its tail (cpu). Groups that
// read or write a state are left alone (I/O lowering writes state updates in place).
#include <string.h>

#include "builder/builder.h"
#include "core/dtype.h"
#include "core/status.h"

// The single live reader of v when it has exactly one and v is not an output; else -1.
static int32_t sole_reader(const kiln_bgraph *b, int32_t v) {
    if (v < 0 || (size_t)v >= b->n_use_info || b->uses[v] != 1 || b->is_output[v]) return -1;
    return b->user[v];
}

// True when constant c, added to the head's output y, is a per-feature bias.
static int bias_like(const kiln_bgraph *b, uint32_t head_op, const kiln_value_desc *y, int32_t c,
                     int64_t *features) {
    const kiln_value_desc *cd = &b->values[c].desc;
    uint32_t feat_dim = head_op == KILN_OP_LINEAR ? y->shape.rank - 1 : 1; // in y
    uint32_t r = cd->shape.rank, yr = y->shape.rank;
    if (cd->dtype != y->dtype || r == 0 || r > yr) return 0;
    if (yr - r > feat_dim) return 0; // c does not reach the feature dim
    for (uint32_t i = 0; i < r; i++) {
        uint32_t yd = yr - r + i;
        int64_t want = yd == feat_dim ? y->shape.max[yd] : 1;
        if (cd->shape.max[i] != want) return 0;
        if (yd == feat_dim && y->shape.min[yd] != y->shape.max[yd]) return 0;
    }
    *features = y->shape.max[feat_dim];
    return 1;
}

static kiln_status fuse_bias(kiln_bgraph *b, uint32_t h, int32_t *cur) {
    kiln_bnode *hn = &b->nodes[h];
    int32_t add, a0, a1, c, biasv, ins[3];
    int64_t features;
    kiln_shape s;
    kiln_value_desc d;
    if (hn->op == KILN_OP_MATMUL || kiln_bgraph_input(b, hn, 2) >= 0) return KILN_OK;
    add = sole_reader(b, *cur);
    if (add < 0 || b->nodes[add].op != KILN_OP_ADD || b->nodes[add].dead) return KILN_OK;
    a0 = kiln_bgraph_input(b, &b->nodes[add], 0);
    a1 = kiln_bgraph_input(b, &b->nodes[add], 1);
    c = a0 == *cur ? a1 : a0;
    if ((a0 == *cur) == (a1 == *cur) || !kiln_bgraph_is_const(b, c)) return KILN_OK;
    if (!bias_like(b, hn->op, &b->values[*cur].desc, c, &features)) return KILN_OK;
    if (!kiln_desc_equal(&b->values[b->nodes[add].output].desc, &b->values[*cur].desc)) {
        return KILN_OK;
    }
    // The bias is the same bytes viewed as [features].
    memset(&s, 0, sizeof s);
    s.rank = 1;
    s.min[0] = s.max[0] = features;
    KILN_TRY(kiln_bgraph_add_const(b, b->values[c].desc.dtype, &s, b->values[c].data,
                                   b->values[c].nbytes, &biasv));
    b->values[biasv].name = b->values[c].name;
    ins[0] = kiln_bgraph_input(b, &b->nodes[h], 0);
    ins[1] = kiln_bgraph_input(b, &b->nodes[h], 1);
    ins[2] = biasv;
    KILN_TRY(kiln_bgraph_set_inputs(b, h, ins, 3));
    b->values[*cur].kind = KILN_BV_DEAD;
    b->nodes[h].output = b->nodes[add].output;
    b->values[b->nodes[add].output].index = h;
    b->nodes[add].dead = 1;
    *cur = b->nodes[h].output;
    KILN_TRY(kiln_bgraph_infer(b, h, &d));
    KILN_CHECK(kiln_desc_equal(&d, &b->values[*cur].desc), KILN_ERR_INTERNAL,
               "bias fusion changed the output of node %u", h);
    b->stats.n_bias_fused++;
    return KILN_OK;
}

// The next tail after running value cur, or -1.
static int32_t next_tail(const kiln_bgraph *b, int32_t cur) {
    int32_t t = sole_reader(b, cur);
    const kiln_bnode *tn;
    const kiln_op_def *d;
    if (t < 0) return -1;
    tn = &b->nodes[t];
    d = kiln_op_def_get(tn->op);
    if (tn->dead || tn->head >= 0 || tn->n_tail > 0 || d == NULL || !(d->flags & KILN_OPF_TAIL)) {
        return -1;
    }
    if (d->flags & KILN_OPF_BINARY) {
        int32_t a0 = kiln_bgraph_input(b, tn, 0), a1 = kiln_bgraph_input(b, tn, 1);
        if ((a0 == cur) == (a1 == cur)) return -1; // reads the running value exactly once
    } else if (!(d->flags & KILN_OPF_UNARY) || kiln_bgraph_input(b, tn, 0) != cur) {
        return -1;
    }
    // In place: the result has the running value's dtype and shape.
    if (!kiln_desc_equal(&b->values[tn->output].desc, &b->values[cur].desc)) return -1;
    return t;
}

kiln_status kiln_pass_fuse(kiln_bgraph *b) {
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < b->n_nodes; i++) {
        const kiln_op_def *d = kiln_op_def_get(b->nodes[i].op);
        int32_t cur, t;
        if (b->nodes[i].dead || d == NULL || !(d->flags & KILN_OPF_FUSE_HEAD) ||
            b->nodes[i].head >= 0) {
            continue;
        }
        cur = b->nodes[i].output;
        KILN_TRY(fuse_bias(b, (uint32_t)i, &cur));
        while (b->nodes[i].n_tail < KILN_MAX_TAIL && (t = next_tail(b, cur)) >= 0) {
            kiln_bnode *h = &b->nodes[i];
            h->tails[h->n_tail++] = t;
            b->nodes[t].head = (int32_t)i;
            cur = b->nodes[t].output;
            b->stats.n_tail_fused++;
        }
    }
    return KILN_OK;
}

// True when node n reads a state or produces a state's update.
static int touches_state(const kiln_bgraph *b, const kiln_bnode *n) {
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        int32_t v = kiln_bgraph_input(b, n, i);
        if (v >= 0 && b->values[v].kind == KILN_IR_STATE) return 1;
    }
    for (size_t s = 0; s < b->n_states; s++) {
        if (b->states[s].update == n->output) return 1;
    }
    return 0;
}

static int ew_head(const kiln_bgraph *b, const kiln_bnode *n) {
    const kiln_op_def *d = kiln_op_def_get(n->op);
    if (n->dead || n->head >= 0 || n->n_tail > 0 || d == NULL || !(d->flags & KILN_OPF_EW_HEAD)) {
        return 0;
    }
    if (n->op == KILN_OP_CAST || n->op == KILN_OP_COPY) return 0;
    return kiln_dtype_is_float(b->values[n->output].desc.dtype) && !touches_state(b, n);
}

kiln_status kiln_pass_fuse_ew(kiln_bgraph *b) {
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < b->n_nodes; i++) {
        int32_t cur, t;
        if (!ew_head(b, &b->nodes[i])) continue;
        cur = b->nodes[i].output;
        while (b->nodes[i].n_tail < KILN_MAX_TAIL && (t = next_tail(b, cur)) >= 0 &&
               !touches_state(b, &b->nodes[t])) {
            kiln_bnode *h = &b->nodes[i];
            h->tails[h->n_tail++] = t;
            b->nodes[t].head = (int32_t)i;
            cur = b->nodes[t].output;
            b->stats.n_tail_fused++;
        }
        b->stats.n_ew_heads += b->nodes[i].n_tail > 0;
    }
    return KILN_OK;
}
