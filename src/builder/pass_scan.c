// SPDX-License-Identifier: Apache-2.0
// A selective scan unrolled over the tokens (a state space model's recurrence as a Python loop
// writes it: transformers' Mamba in its reference form, which is what exports) as one
// selective_scan node (ops.h). Matched from the cat that stacks the steps' outputs:
//   y = cat(p_0, ..., p_{L-1}, dim = last)        (nested cats of pieces included)
//   p_t = view of y_t as [B, D, 1]               (reshape or unsqueeze; or y_t itself)
//   y_t = select(m_t, last, 0) | reshape(m_t) | m_t
//   m_t = matmul(cast?(h_t), view(select(C, 1, t)) as [B, N, 1])
//   h_t = a_t * h_{t-1} + u_t,  a_t = select(A, 2, t), u_t = select(U, 2, t)   (h_{-1} = h0)
// with A, U [B, D, L, N], C [B, L, N], h0 [B, D, N]; every value of the chain read only where
// the chain reads it (h_t by m_t and step t + 1's multiply, the last h by m_{L-1} only) and none
// a graph output. The node computes the state in float32 (the loop may round it to its dtype
// each step) and gives y in the cat's dtype (a cast after it where A's differs); inputs of
// another dtype than A's are cast to it. Anything else stays as it is: the unrolled chain,
// left without readers, is removed by the dead-code elimination that follows.
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"

// The live plain node producing v (no fused tail, not in a group), or NULL.
static const kiln_bnode *producer(const kiln_bgraph *b, int32_t v) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE) return NULL;
    const kiln_bnode *n = &b->nodes[b->values[v].index];
    return n->dead || n->n_tail > 0 || n->head >= 0 ? NULL : n;
}

// Read exactly `uses` times and not a graph output.
static int read_n(const kiln_bgraph *b, int32_t v, uint32_t uses) {
    return v >= 0 && (size_t)v < b->n_use_info && b->uses[v] == uses && !b->is_output[v];
}

static uint32_t rank_of(const kiln_bgraph *b, int32_t v) { return b->values[v].desc.shape.rank; }

// v = select(src, dim, idx) (dim normalized): src, or -1.
static int32_t select_of(const kiln_bgraph *b, int32_t v, int64_t *dim, int64_t *idx) {
    const kiln_bnode *n = producer(b, v);
    if (n == NULL || n->op != KILN_OP_SELECT) return -1;
    const int32_t src = kiln_bgraph_input(b, n, 0);
    if (src < 0) return -1;
    const kiln_attrs a = kiln_bgraph_attrs(b, n);
    int64_t d = kiln_attrs_int(&a, KILN_A_SELECT_DIM, 0),
            i = kiln_attrs_int(&a, KILN_A_SELECT_INDEX, 0);
    const uint32_t r = rank_of(b, src);
    if (d < 0) d += r;
    const int64_t size = b->values[src].desc.shape.max[d >= 0 && d < (int64_t)r ? d : 0];
    if (i < 0) i += size;
    *dim = d;
    *idx = i;
    return src;
}

// Dims [lo, hi) of value v equal dims [from, ...) of value w (ranges alike).
static int same_dims(const kiln_bgraph *b, int32_t v, uint32_t lo, uint32_t hi, int32_t w,
                     uint32_t from) {
    const kiln_shape *s = &b->values[v].desc.shape, *t = &b->values[w].desc.shape;
    for (uint32_t d = lo; d < hi; d++) {
        const uint32_t e = from + d - lo;
        if (s->min[d] != t->min[e] || s->max[d] != t->max[e]) return 0;
    }
    return 1;
}

// The value v is a dense view of (reshape or unsqueeze, read once), or v itself.
static int32_t through_view(const kiln_bgraph *b, int32_t v) {
    const kiln_bnode *n = producer(b, v);
    if (n != NULL && (n->op == KILN_OP_RESHAPE || n->op == KILN_OP_UNSQUEEZE) && read_n(b, v, 1)) {
        const int32_t x = kiln_bgraph_input(b, n, 0);
        if (x >= 0) return x;
    }
    return v;
}

typedef struct scan_match {
    int32_t a, u, c, h0; // A, U [B, D, L, N], C [B, L, N], h0 [B, D, N]
    int32_t h_prev;      // while matching: the state the next step multiplies
} scan_match;

// Step t's piece p (read once, by the cat): the chain above, A, U and C set by step 0 and
// checked by the others; h_t returned (its uses checked by the caller), -1 when p is not one.
static int32_t match_step(const kiln_bgraph *b, int32_t p, int64_t t, scan_match *m) {
    int64_t dim, idx;
    int32_t y = through_view(b, p);
    int32_t mm_v = y;
    const kiln_bnode *n = producer(b, y);
    if (n != NULL && n->op == KILN_OP_SELECT && read_n(b, y, 1)) {
        mm_v = select_of(b, y, &dim, &idx);
        if (mm_v < 0 || rank_of(b, mm_v) != 3 || dim != 2 || idx != 0) return -1;
    } else if (n != NULL && n->op == KILN_OP_RESHAPE && y != p && read_n(b, y, 1)) {
        mm_v = kiln_bgraph_input(b, n, 0);
    }
    const kiln_bnode *mm = producer(b, mm_v);
    if (mm == NULL || mm->op != KILN_OP_MATMUL || !read_n(b, mm_v, 1) || rank_of(b, mm_v) != 3)
        return -1;
    int32_t h = kiln_bgraph_input(b, mm, 0), cc = kiln_bgraph_input(b, mm, 1);
    const kiln_bnode *hc = producer(b, h);
    if (hc != NULL && hc->op == KILN_OP_CAST && read_n(b, h, 1)) h = kiln_bgraph_input(b, hc, 0);
    // c_t as [B, N, 1]
    if (cc < 0 || rank_of(b, cc) != 3 || b->values[cc].desc.shape.max[2] != 1) return -1;
    const int32_t ct = through_view(b, cc);
    if (ct == cc || !read_n(b, ct, 1)) return -1;
    const int32_t csrc = select_of(b, ct, &dim, &idx);
    if (csrc < 0 || rank_of(b, csrc) != 3 || dim != 1 || idx != t) return -1;
    // h_t = a_t * h_{t-1} + u_t
    const kiln_bnode *add = producer(b, h);
    if (add == NULL || add->op != KILN_OP_ADD || add->n_inputs != 2 || h < 0 || rank_of(b, h) != 3)
        return -1;
    int32_t mul_v = -1, u_t = -1;
    for (uint32_t j = 0; j < 2; j++) {
        const int32_t x = kiln_bgraph_input(b, add, j);
        const kiln_bnode *xn = producer(b, x);
        if (xn != NULL && xn->op == KILN_OP_MUL && mul_v < 0) {
            mul_v = x;
            u_t = kiln_bgraph_input(b, add, 1 - j);
        }
    }
    if (mul_v < 0 || !read_n(b, mul_v, 1) || !read_n(b, u_t, 1)) return -1;
    const int32_t usrc = select_of(b, u_t, &dim, &idx);
    if (usrc < 0 || rank_of(b, usrc) != 4 || dim != 2 || idx != t) return -1;
    const kiln_bnode *mul = producer(b, mul_v);
    int32_t a_t = -1, hp = -1, asrc = -1;
    for (uint32_t j = 0; j < 2 && asrc < 0; j++) {
        const int32_t x = kiln_bgraph_input(b, mul, j);
        if (!read_n(b, x, 1)) continue;
        const int32_t s = select_of(b, x, &dim, &idx);
        if (s >= 0 && rank_of(b, s) == 4 && dim == 2 && idx == t) {
            asrc = s;
            a_t = x;
            hp = kiln_bgraph_input(b, mul, 1 - j);
        }
    }
    if (asrc < 0 || a_t < 0 || hp < 0 || rank_of(b, hp) != 3) return -1;
    if (t == 0) {
        m->a = asrc, m->u = usrc, m->c = csrc, m->h0 = hp;
    } else if (asrc != m->a || usrc != m->u || csrc != m->c || hp != m->h_prev) {
        return -1;
    }
    return h;
}

// The cat's pieces in order, nested cats (of the same dim, read once) flattened into *out
// (at most cap); the count, or -1 when they do not fit.
static int64_t pieces(const kiln_bgraph *b, const kiln_bnode *cat, int64_t dim, int32_t *out,
                      int64_t cap, int64_t n) {
    for (uint32_t j = 0; j < cat->n_inputs; j++) {
        const int32_t x = kiln_bgraph_input(b, cat, j);
        const kiln_bnode *xn = producer(b, x);
        int64_t d = -1;
        if (xn != NULL && xn->op == KILN_OP_CAT && read_n(b, x, 1)) {
            const kiln_attrs a = kiln_bgraph_attrs(b, xn);
            d = kiln_attrs_int(&a, KILN_A_CAT_DIM, 0);
            if (d < 0) d += rank_of(b, x);
        }
        if (d == dim) {
            n = pieces(b, xn, dim, out, cap, n);
            if (n < 0) return -1;
        } else {
            if (n >= cap) return -1;
            out[n++] = x;
        }
    }
    return n;
}

static kiln_status cast_to(kiln_bgraph *b, int32_t v, uint32_t dtype, int64_t seq, int32_t *out) {
    if (b->values[v].desc.dtype == dtype) {
        *out = v;
        return KILN_OK;
    }
    kiln_attr_ref ref = {KILN_ATTR_INTS, 1, 0};
    int64_t dt = (int64_t)dtype;
    kiln_attrs a = {&ref, 1, &dt, NULL};
    return kiln_bgraph_add_node(b, KILN_OP_CAST, &v, 1, &a, seq, out);
}

// cat node ci as a selective scan, when it is one (the file's top).
static kiln_status scan_at(kiln_bgraph *b, uint32_t ci, int *done) {
    const kiln_bnode *cat = &b->nodes[ci];
    const int32_t y = cat->output;
    *done = 0;
    if (rank_of(b, y) != 3) return KILN_OK;
    const kiln_attrs ca = kiln_bgraph_attrs(b, cat);
    int64_t dim = kiln_attrs_int(&ca, KILN_A_CAT_DIM, 0);
    if (dim < 0) dim += 3;
    const int64_t len = b->values[y].desc.shape.max[2];
    if (dim != 2 || len < 2 || b->values[y].desc.shape.min[2] != len) return KILN_OK;
    int32_t *ps = kiln_malloc((size_t)len * sizeof *ps, KILN_ALIGN);
    KILN_CHECK(ps != NULL, KILN_ERR_NO_MEMORY, "out of memory in the scan pass");
    const int64_t np = pieces(b, cat, 2, ps, len, 0);
    scan_match m;
    memset(&m, 0, sizeof m);
    int ok = np == len;
    for (int64_t t = 0; ok && t < len; t++) {
        const int32_t p = ps[t];
        ok = rank_of(b, p) == 3 && b->values[p].desc.shape.max[2] == 1 && read_n(b, p, 1);
        const int32_t h = ok ? match_step(b, p, t, &m) : -1;
        // h_t: read by its matmul (or the cast before it) and, but for the last, by step t + 1
        ok = h >= 0 && b->uses[h] == (t + 1 < len ? 2u : 1u) && !b->is_output[h];
        m.h_prev = h;
    }
    kiln_free(ps, (size_t)len * sizeof *ps);
    if (!ok) return KILN_OK;
    const kiln_shape *as = &b->values[m.a].desc.shape;
    if (as->max[2] != len || as->min[2] != len) return KILN_OK;
    // the op's shapes exactly (no broadcast state or table: those chains stay as they are)
    if (!same_dims(b, m.u, 0, 4, m.a, 0) || !same_dims(b, m.c, 0, 1, m.a, 0) ||
        !same_dims(b, m.c, 1, 3, m.a, 2) || !same_dims(b, m.h0, 0, 2, m.a, 0) ||
        !same_dims(b, m.h0, 2, 3, m.a, 3))
        return KILN_OK;
    const uint32_t dt = b->values[m.a].desc.dtype;
    const int64_t seq = cat->seq;
    int32_t ins[4] = {m.a, -1, -1, -1}, v;
    KILN_TRY(cast_to(b, m.u, dt, seq, &ins[1]));
    KILN_TRY(cast_to(b, m.c, dt, seq, &ins[2]));
    KILN_TRY(cast_to(b, m.h0, dt, seq, &ins[3]));
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SELECTIVE_SCAN, ins, 4, NULL, seq, &v));
    KILN_TRY(cast_to(b, v, b->values[y].desc.dtype, seq, &v));
    if (!kiln_desc_equal(&b->values[v].desc, &b->values[y].desc)) return KILN_OK; // left dead
    KILN_TRY(kiln_bgraph_replace_node(b, ci, v, "selective scan"));
    *done = 1;
    return KILN_OK;
}

kiln_status kiln_pass_scan(kiln_bgraph *b) {
    uint32_t found = 0;
    size_t n = b->n_nodes;
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        const kiln_bnode *nd = &b->nodes[i];
        if (nd->dead || nd->op != KILN_OP_CAT || nd->n_tail > 0 || nd->head >= 0) continue;
        KILN_TRY(scan_at(b, (uint32_t)i, &done));
        if (done) {
            found++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    b->stats.n_scan += found;
    // the scans were appended after their readers: restore index = topological order
    if (found > 0) KILN_TRY(kiln_bgraph_sort_nodes(b));
    return KILN_OK;
}
