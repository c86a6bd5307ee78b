// SPDX-License-Identifier: Apache-2.0
// Attention canonicalization: puts the head split in front of sdpa into the packed form that
// backends read without copies (the CUDA backend folds it into strided views, cuda_fold.h).
//
// 1. select: squeeze(slice(x, dim d, start i, end i + 1, step 1), dims [d]) is select(x, d, i)
//    (torch's unbind(0) of a packed QKV exports as exactly this), when the slice's output is
//    read only by the squeeze; so is a reshape that drops exactly dim d (the squeeze as the
//    view pass before this one leaves it).
// 2. QKV merge: an sdpa whose q, k and v are each
//        permute(reshape(linear(x, W_j, b_j), [a0, a1, H, E]), (0, 2, 1, 3))
//    over the same x (HF BERT's separate query/key/value projections), every link read only by
//    the next, constant weights [H * E, K] of one dtype and constant biases [H * E] of that dtype
//    where present, becomes one linear over the rows [W_q; W_k; W_v] (and [b_q; b_k; b_v], zeros
//    for a projection without one: Whisper's and BEiT's keys have no bias) and
//        select(permute(reshape(y, [a0, a1, 3, H, E]), (2, 0, 3, 1, 4)), 0, j)
//    the same values: one GEMM instead of three. The old chains lose their last reader and dead-
//    code elimination removes them (this pass runs before the second dce).
// 3. Grouped-query attention: an sdpa whose k and v are each the repeat of a cache
//        reshape(expand(unsqueeze(c, 2), [B, G, R, S, E]), [B, G * R, S, E])
//    (transformers' repeat_kv, ExecuTorch's Llama, the lowering of enable_gqa: every kv head
//    serves R query heads; a copy between the expand and the reshape is torch's reshape of the
//    expanded view), with the same R for both, reads c directly, in one of two forms:
//    - rows (a decode step: q of at most GQA_ROWS_MAX rows, no causal flag): q [B, G * R, L, E]
//      is viewed as [B, G, R * L, E] (a query head's rows follow its group's), the mask's rows
//      are repeated R times to match, and the result is viewed back as [B, G * R, L, Ev]: each
//      kv head is read once for its R query heads;
//    - broadcast (longer q, or a causal sdpa): q as [B, G, R, L, E], k and v as [B, G, 1, S, E]
//      (sdpa broadcasts batch dims), a mask [.., 1, L, S] as [.., 1, 1, L, S], the result
//      [B, G, R, L, Ev] viewed back; where the result's one reader is the head merge
//      permute (0, 2, 1, 3), that permute becomes (0, 3, 1, 2, 4) on the 5-d result, viewed as
//      [B, L, G * R, Ev]. Every link is a strided view of q's projection and the merge's
//      output, so the CUDA backend runs neither (cuda_fold.h), and the causal rewrite (5.)
//      still sees the mask.
//    No repeat is materialized.
// 4. Split QKV: an sdpa operand
//        permute(reshape(slice(y, -1, j * D, (j + 1) * D), [B, L, H, E]), (0, 2, 1, 3))
//    with y [B, L, c * D] and D = H * E (GPT-2's qkv.split(D, dim=2) and other fused
//    projections split by slicing), each link read once, becomes the packed form of 2.:
//        select(permute(reshape(y, [B, L, c, H, E]), (2, 0, 3, 1, 4)), 0, j)
//    the same values, which the backends read as strided views of y with no copy (the
//    reshapes of q, k and v are one node after common-subexpression elimination).
// 5. Causal masks: an sdpa whose mask is a constant [.., L, S] (every leading dim 1; or a
//    reshape chain of one, as the broadcast form of 3. leaves it) that allows
//    exactly j <= i (bool: true there and false elsewhere; float: 0 there and -inf or below
//    -1e4 elsewhere, as transformers builds it from finfo.min), with q of L rows and k of S,
//    becomes the same sdpa with is_causal = 1 and no mask: the kernels skip the masked blocks
//    and read no mask. An sdpa that the grouped-query rows form gave a repeated mask keeps it.
// 6. Head projections: linears of the same x, each a constant weight [N_j, K] (one dtype and K)
//    with an optional constant bias, whose output [a0, a1, N_j] is read only by a reshape to
//    [a0, a1, H_j, E] (one E for all; static shapes), N_j = H_j * E, or beside such a split to
//    any shape ending in E (a single kv head's split already transposed or viewed for
//    grouped-query attention: Gemma's; then that reshape follows the slice): the projections
//    of q, k and v where they differ in width (grouped-query attention: Llama, Qwen2, Mistral,
//    Gemma) or where a rotary or a bmm comes between the head split and sdpa (StableLM,
//    DeBERTa), which 2. does not take. They become one linear over the stacked rows (biases
//    stacked, zeros for a projection without one), reshape(y, [a0, a1, sum H_j, E]), and per
//    projection slice(., 2, h_j, h_j + H_j): one GEMM of the summed width instead of several
//    narrow ones (a prompt's k and v projections of 512 columns fill few SMs), and slices the
//    CUDA backend reads as strided views (cuda_fold.h). Runs after 2. and 4. (and a dead-code
//    sweep of the chains they replaced), so the packed forms stay theirs.
// Eager attention (matmul, softmax, matmul in model code) becomes sdpa in the pass before this
// one (pass_eager_attention.c), so that these rewrites see the sdpa it makes.
// New nodes take the emission key (seq) of the node they replace (the squeeze; the last of the
// three linears), and the nodes are re-sorted by key at the end, so index order stays
// topological.
#include <string.h>

#include "builder/builder.h"
#include "core/dtype.h"
#include "core/status.h"

// The live node producing v with op `op` whose output is read once and is not an output, or -1.
static int32_t single_use_producer(const kiln_bgraph *b, int32_t v, uint32_t op) {
    if (v < 0 || (size_t)v >= b->n_use_info || b->values[v].kind != KILN_IR_NODE) return -1;
    if (b->uses[v] != 1 || b->is_output[v]) return -1;
    const kiln_bnode *n = &b->nodes[b->values[v].index];
    if (n->dead || n->op != op || n->n_tail > 0 || n->head >= 0) return -1;
    return (int32_t)b->values[v].index;
}

static kiln_status add_select(kiln_bgraph *b, int32_t x, int64_t dim, int64_t index, int64_t seq,
                              int32_t *out) {
    int64_t ints[2] = {dim, index};
    kiln_attr_ref refs[2] = {{KILN_ATTR_INTS, 1, 0}, {KILN_ATTR_INTS, 1, 1}};
    kiln_attrs a = {refs, 2, ints, NULL};
    return kiln_bgraph_add_node(b, KILN_OP_SELECT, &x, 1, &a, seq, out);
}

// Rewires input slot `slot` of node `node` to value v.
static kiln_status rewire(kiln_bgraph *b, uint32_t node, uint32_t slot, int32_t v) {
    int32_t ins[KILN_MAX_INPUTS];
    const kiln_bnode *n = &b->nodes[node];
    uint32_t k = n->n_inputs;
    memcpy(ins, b->ids + n->input_begin, k * sizeof *ins);
    ins[slot] = v;
    return kiln_bgraph_set_inputs(b, node, ins, k);
}

// --- 1. slice + squeeze -> select

static kiln_status slice_squeeze(kiln_bgraph *b, uint32_t sq_node, int *done) {
    const kiln_bnode *sq = &b->nodes[sq_node];
    kiln_attrs sa = kiln_bgraph_attrs(b, sq), la;
    uint32_t n_dims = 0;
    const int64_t *dims = NULL;
    int32_t sl = single_use_producer(b, kiln_bgraph_input(b, sq, 0), KILN_OP_SLICE), x, sel;
    uint32_t rank;
    int64_t d, start, end, step, sq_dim;
    *done = 0;
    if (sl < 0) return KILN_OK;
    if (sq->op == KILN_OP_SQUEEZE) {
        dims = kiln_attrs_ints(&sa, KILN_A_SQUEEZE_DIMS, &n_dims);
        if (n_dims != 1) return KILN_OK;
    } else if (kiln_bgraph_input(b, sq, 1) >= 0) {
        return KILN_OK; // a reshape with a `like` input
    }
    la = kiln_bgraph_attrs(b, &b->nodes[sl]);
    x = kiln_bgraph_input(b, &b->nodes[sl], 0);
    rank = b->values[x].desc.shape.rank;
    d = kiln_attrs_int(&la, KILN_A_SLICE_DIM, 0);
    start = kiln_attrs_int(&la, KILN_A_SLICE_START, 0);
    end = kiln_attrs_int(&la, KILN_A_SLICE_END, 0);
    step = kiln_attrs_int(&la, KILN_A_SLICE_STEP, 0);
    if (rank == 0) return KILN_OK;
    if (d < 0) d += rank;
    if (dims != NULL) {
        sq_dim = dims[0];
        if (sq_dim < 0) sq_dim += rank;
    } else { // a reshape that drops exactly the sliced dim (the view pass's form of a squeeze)
        const kiln_shape *ss = &b->values[b->nodes[sl].output].desc.shape;
        const kiln_shape *os = &b->values[sq->output].desc.shape;
        sq_dim = d;
        if (d < 0 || d >= (int64_t)rank || os->rank + 1 != rank) return KILN_OK;
        for (uint32_t i = 0, j = 0; i < rank; i++) {
            if ((int64_t)i == d) continue;
            if (ss->min[i] != os->min[j] || ss->max[i] != os->max[j]) return KILN_OK;
            j++;
        }
    }
    if (d < 0 || d >= (int64_t)rank || sq_dim != d || step != 1 || start < 0 || end != start + 1) {
        return KILN_OK;
    }
    // the dim must be static so that the index is in range at every shape
    if (b->values[x].desc.shape.min[d] != b->values[x].desc.shape.max[d] ||
        start >= b->values[x].desc.shape.min[d]) {
        return KILN_OK;
    }
    KILN_TRY(add_select(b, x, d, start, b->nodes[sq_node].seq, &sel));
    // the squeeze's readers now read the select: it takes over the squeeze's output value
    KILN_TRY(kiln_bgraph_replace_node(b, sq_node, sel, "select canonicalization"));
    *done = 1;
    return KILN_OK;
}

// --- 2. QKV merge

typedef struct qkv_chain {
    int32_t perm, resh, lin; // node indices
    int32_t x, w, bias;      // values
} qkv_chain;

// The chain behind sdpa input v, or 0.
static int match_chain(const kiln_bgraph *b, int32_t v, qkv_chain *c, int64_t shape[4]) {
    uint32_t n = 0;
    const int64_t *p, *s;
    kiln_attrs a;
    c->perm = single_use_producer(b, v, KILN_OP_PERMUTE);
    if (c->perm < 0) return 0;
    a = kiln_bgraph_attrs(b, &b->nodes[c->perm]);
    p = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &n);
    if (n != 4 || p[0] != 0 || p[1] != 2 || p[2] != 1 || p[3] != 3) return 0;
    c->resh = single_use_producer(b, kiln_bgraph_input(b, &b->nodes[c->perm], 0), KILN_OP_RESHAPE);
    if (c->resh < 0 || kiln_bgraph_input(b, &b->nodes[c->resh], 1) >= 0) return 0; // no `like`
    a = kiln_bgraph_attrs(b, &b->nodes[c->resh]);
    s = kiln_attrs_ints(&a, KILN_A_RESHAPE_SHAPE, &n);
    if (n != 4 || s[0] < -3 || s[1] < -3) return 0; // dims 0, 1 copied at most
    memcpy(shape, s, 4 * sizeof *shape);
    for (uint32_t i = 2; i < 4; i++) { // H and E static (a -1 among them read off the result)
        const kiln_shape *rs = &b->values[b->nodes[c->resh].output].desc.shape;
        if (s[i] == -1 && rs->min[i] == rs->max[i]) shape[i] = rs->max[i];
        if (shape[i] <= 0) return 0;
    }
    c->lin = single_use_producer(b, kiln_bgraph_input(b, &b->nodes[c->resh], 0), KILN_OP_LINEAR);
    if (c->lin < 0) return 0;
    c->x = kiln_bgraph_input(b, &b->nodes[c->lin], 0);
    c->w = kiln_bgraph_input(b, &b->nodes[c->lin], 1);
    c->bias = kiln_bgraph_input(b, &b->nodes[c->lin], 2);
    if (!kiln_bgraph_is_const(b, c->w) || b->values[c->w].desc.shape.rank != 2) return 0;
    if (c->bias >= 0 && !kiln_bgraph_is_const(b, c->bias)) return 0;
    // the linear's output [.., a1, N]: rank 3 and N = H * E
    if (b->values[b->nodes[c->lin].output].desc.shape.rank != 3 ||
        b->values[c->w].desc.shape.max[0] != shape[2] * shape[3]) {
        return 0;
    }
    return 1;
}

// The rows (dim 0) of the n constants v[] of one dtype, one after another, as one new constant.
static kiln_status stack_rows(kiln_bgraph *b, const int32_t *v, int n, int32_t *out) {
    const uint32_t dtype = b->values[v[0]].desc.dtype;
    kiln_shape s = b->values[v[0]].desc.shape; // a copy: adding may move the values
    uint64_t total = 0, at = 0;
    int64_t rows = 0;
    void *p;
    for (int j = 0; j < n; j++) {
        total += b->values[v[j]].nbytes;
        rows += b->values[v[j]].desc.shape.max[0];
    }
    KILN_TRY(kiln_bgraph_blob(b, (size_t)total, &p));
    for (int j = 0; j < n; j++) {
        memcpy((uint8_t *)p + at, b->values[v[j]].data, b->values[v[j]].nbytes);
        at += b->values[v[j]].nbytes;
    }
    s.min[0] = s.max[0] = rows;
    return kiln_bgraph_add_const(b, dtype, &s, p, total, out);
}

static kiln_status stack3(kiln_bgraph *b, const int32_t v[3], int32_t *out) {
    return stack_rows(b, v, 3, out);
}

// A new constant of v's dtype and shape, all zeros.
static kiln_status zeros_like(kiln_bgraph *b, int32_t v, int32_t *out) {
    const uint64_t n = b->values[v].nbytes;
    const kiln_shape shape = b->values[v].desc.shape; // a copy: adding may move the values
    void *p;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)n, &p));
    memset(p, 0, (size_t)n);
    return kiln_bgraph_add_const(b, b->values[v].desc.dtype, &shape, p, n, out);
}

static kiln_status qkv_merge(kiln_bgraph *b, uint32_t sdpa, int *done) {
    qkv_chain c[3];
    int64_t shape[3][4];
    int32_t w[3], bias[3], wc, bc = -1, ins[3], y, r, pm;
    int64_t seq = 0, bias_dt = -1;
    *done = 0;
    for (int j = 0; j < 3; j++) {
        if (!match_chain(b, kiln_bgraph_input(b, &b->nodes[sdpa], (uint32_t)j), &c[j], shape[j]))
            return KILN_OK;
    }
    for (int j = 0; j < 3; j++) {
        const kiln_value_desc *wd = &b->values[c[j].w].desc, *w0 = &b->values[c[0].w].desc;
        if (c[j].x != c[0].x || memcmp(shape[j], shape[0], sizeof shape[0]) != 0 ||
            !kiln_desc_equal(wd, w0)) {
            return KILN_OK;
        }
        if (c[j].bias >= 0) { // [H * E], one dtype for all (the form a row of zeros joins)
            const kiln_value_desc *bd = &b->values[c[j].bias].desc;
            if (bd->shape.rank != 1 || bd->shape.min[0] != w0->shape.max[0] ||
                bd->shape.max[0] != w0->shape.max[0] || (bias_dt >= 0 && bd->dtype != bias_dt))
                return KILN_OK;
            bias_dt = (int64_t)bd->dtype;
        }
        if (j > 0 && (c[j].lin == c[0].lin || c[j].lin == c[j - 1].lin)) return KILN_OK;
        w[j] = c[j].w;
        bias[j] = c[j].bias;
        if (b->nodes[c[j].lin].seq > seq) seq = b->nodes[c[j].lin].seq;
    }
    if (b->values[c[0].w].desc.shape.min[0] != b->values[c[0].w].desc.shape.max[0]) return KILN_OK;
    KILN_TRY(stack3(b, w, &wc));
    if (bias[0] >= 0 || bias[1] >= 0 || bias[2] >= 0) {
        int32_t zero = -1;
        for (int j = 0; j < 3; j++) {
            if (bias[j] >= 0) continue;
            if (zero < 0)
                KILN_TRY(zeros_like(b, bias[bias[0] >= 0 ? 0 : bias[1] >= 0 ? 1 : 2], &zero));
            bias[j] = zero;
        }
        KILN_TRY(stack3(b, bias, &bc));
    }
    ins[0] = c[0].x;
    ins[1] = wc;
    ins[2] = bc;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_LINEAR, ins, bc >= 0 ? 3 : 2, NULL, seq, &y));
    {
        int64_t rs[5] = {shape[0][0], shape[0][1], 3, shape[0][2], shape[0][3]};
        kiln_attr_ref ref = {KILN_ATTR_INTS, 5, 0};
        kiln_attrs a = {&ref, 1, rs, NULL};
        int32_t rin[2] = {y, -1};
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, rin, 1, &a, seq, &r));
    }
    {
        int64_t pd[5] = {2, 0, 3, 1, 4};
        kiln_attr_ref ref = {KILN_ATTR_INTS, 5, 0};
        kiln_attrs a = {&ref, 1, pd, NULL};
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_PERMUTE, &r, 1, &a, seq, &pm));
    }
    for (int j = 0; j < 3; j++) {
        int32_t sel, old = kiln_bgraph_input(b, &b->nodes[sdpa], (uint32_t)j);
        kiln_value_desc check;
        KILN_TRY(add_select(b, pm, 0, j, seq, &sel));
        KILN_TRY(kiln_bgraph_infer(b, b->values[sel].index, &check));
        KILN_CHECK(kiln_desc_equal(&check, &b->values[old].desc), KILN_ERR_INTERNAL,
                   "QKV merge changed operand %d of node %u", j, sdpa);
        KILN_TRY(rewire(b, sdpa, (uint32_t)j, sel));
    }
    *done = 1;
    return KILN_OK;
}

// --- 3. grouped-query attention

// The rows form keeps query rows of a group together where they are few (a decode step: the
// group's R rows share every key and value load); longer queries take the broadcast form.
#define GQA_ROWS_MAX 8

static kiln_status add_view(kiln_bgraph *b, uint32_t op, int32_t x, const int64_t *codes,
                            uint32_t n, int64_t seq, int32_t *out) {
    kiln_attr_ref ref = {KILN_ATTR_INTS, n, 0};
    kiln_attrs a = {&ref, 1, codes, NULL};
    return kiln_bgraph_add_node(b, op, &x, 1, &a, seq, out);
}

// The repeated cache as u = unsqueeze(c, 2) [B, G, 1, S, E] and R when v is
// reshape(expand(u, [B, G, R, S, E]), [B, G * R, S, E]) as above (each link read once; u may be
// any reshape to that shape: the views pass merges the head split of a single kv head into it);
// -1 otherwise.
static int32_t repeated_cache(const kiln_bgraph *b, int32_t v, int64_t *rep) {
    int32_t r = single_use_producer(b, v, KILN_OP_RESHAPE), e, u;
    if (r < 0) return -1;
    int32_t x = kiln_bgraph_input(b, &b->nodes[r], 0);
    int32_t cp = single_use_producer(b, x, KILN_OP_COPY); // torch's reshape of the expanded view
    if (cp >= 0) x = kiln_bgraph_input(b, &b->nodes[cp], 0);
    e = single_use_producer(b, x, KILN_OP_EXPAND);
    if (e < 0) return -1;
    u = kiln_bgraph_input(b, &b->nodes[e], 0);
    if (u < 0 || b->uses[u] != 1 || b->is_output[u]) return -1;
    const kiln_shape *us = &b->values[u].desc.shape;
    const kiln_shape *es = &b->values[b->nodes[e].output].desc.shape;
    const kiln_shape *vs = &b->values[v].desc.shape;
    if (us->rank != 5 || es->rank != 5 || vs->rank != 4) return -1;
    // u = [B, G, 1, S, E], e = [B, G, R, S, E], v = [B, G * R, S, E]
    if (us->min[2] != 1 || us->max[2] != 1 || us->min[1] != us->max[1]) return -1;
    if (es->min[2] != es->max[2] || es->min[2] < 2 || !kiln_shape_same_dim(es, 0, us, 0) ||
        !kiln_shape_same_dim(es, 1, us, 1) || !kiln_shape_same_dim(es, 3, us, 3) ||
        !kiln_shape_same_dim(es, 4, us, 4)) {
        return -1;
    }
    if (vs->min[1] != us->min[1] * es->min[2] || vs->max[1] != vs->min[1] ||
        !kiln_shape_same_dim(vs, 0, us, 0) || !kiln_shape_same_dim(vs, 2, us, 3) ||
        !kiln_shape_same_dim(vs, 3, us, 4)) {
        return -1;
    }
    *rep = es->min[2];
    return u;
}

// The cache [B, G, S, E] of a repeat's u = [B, G, 1, S, E]: the input of u's unsqueeze or
// reshape where it has that shape, else a new view of u.
static kiln_status cache_of(kiln_bgraph *b, int32_t u, int64_t seq, int32_t *out) {
    const kiln_bnode *n = b->values[u].kind == KILN_IR_NODE ? &b->nodes[b->values[u].index] : NULL;
    if (n != NULL && (n->op == KILN_OP_UNSQUEEZE || n->op == KILN_OP_RESHAPE)) {
        int32_t c = kiln_bgraph_input(b, n, 0);
        const kiln_shape *cs = &b->values[c].desc.shape, *us = &b->values[u].desc.shape;
        if (cs->rank == 4 && kiln_shape_same_dim(cs, 0, us, 0) &&
            kiln_shape_same_dim(cs, 1, us, 1) && kiln_shape_same_dim(cs, 2, us, 3) &&
            kiln_shape_same_dim(cs, 3, us, 4)) {
            *out = c;
            return KILN_OK;
        }
    }
    int64_t codes[4] = {-2, -3, -5, -6};
    return add_view(b, KILN_OP_RESHAPE, u, codes, 4, seq, out);
}

// The broadcast form of rewrite 3 (q [B, H, L, E] with H = G * R; k5, v5 [B, G, 1, S, E]).
static kiln_status gqa_broadcast(kiln_bgraph *b, uint32_t node, int32_t k5, int32_t v5, int64_t g,
                                 int64_t rk, int *done) {
    const kiln_bnode *n = &b->nodes[node];
    int64_t seq = n->seq, h = g * rk;
    int32_t q = kiln_bgraph_input(b, n, 0), m = kiln_bgraph_input(b, n, 3), out = n->output;
    size_t first_new = b->n_nodes;
    int32_t q5, m5 = -1, o5, o;
    int64_t qc[5] = {-2, g, rk, -4, -5};
    KILN_TRY(add_view(b, KILN_OP_RESHAPE, q, qc, 5, seq, &q5));
    if (m >= 0) {
        uint32_t r = b->values[m].desc.shape.rank;
        m5 = m;
        if (r >= 3) { // [.., 1, L, S] -> [.., 1, 1, L, S]
            int64_t dim = (int64_t)r - 2;
            KILN_TRY(add_view(b, KILN_OP_UNSQUEEZE, m, &dim, 1, seq, &m5));
        }
    }
    {
        kiln_battrs_copy ac;
        if (!kiln_bgraph_copy_attrs(b, &b->nodes[node], &ac)) goto undo;
        int32_t ins[4] = {q5, k5, v5, m5};
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SDPA, ins, m5 >= 0 ? 4 : 3, &ac.a, seq, &o5));
    }
    // the head merge [B, H, L, Ev] -> [B, L, H, Ev] as a permute of the 5-d result
    int32_t pm = kiln_bgraph_only_reader(b, out);
    if (pm >= 0) {
        const kiln_bnode *p = &b->nodes[pm];
        kiln_attrs pa = kiln_bgraph_attrs(b, p);
        uint32_t np = 0;
        const int64_t *d = kiln_attrs_ints(&pa, KILN_A_PERMUTE_DIMS, &np);
        static const int64_t merge[4] = {0, 2, 1, 3};
        if (p->op == KILN_OP_PERMUTE && np == 4 && memcmp(d, merge, sizeof merge) == 0) {
            int64_t p5[5] = {0, 3, 1, 2, 4}, mc[4] = {-2, -3, h, -6};
            int32_t t, w;
            int64_t pseq = p->seq; // after the sdpa, whichever node later replaces it
            KILN_TRY(add_view(b, KILN_OP_PERMUTE, o5, p5, 5, pseq, &t));
            KILN_TRY(add_view(b, KILN_OP_RESHAPE, t, mc, 4, pseq, &w));
            if (!kiln_desc_equal(&b->values[w].desc, &b->values[b->nodes[pm].output].desc)) {
                goto undo;
            }
            KILN_TRY(kiln_bgraph_replace_node(b, (uint32_t)pm, w, "grouped-query head merge"));
            b->nodes[node].dead = 1; // the merge was its one reader
            *done = 1;
            return KILN_OK;
        }
    }
    int64_t oc[4] = {-2, h, -5, -6};
    KILN_TRY(add_view(b, KILN_OP_RESHAPE, o5, oc, 4, seq, &o));
    if (!kiln_desc_equal(&b->values[o].desc, &b->values[out].desc)) goto undo;
    KILN_TRY(kiln_bgraph_replace_node(b, node, o, "grouped-query attention"));
    *done = 1;
    return KILN_OK;
undo:
    for (size_t k = first_new; k < b->n_nodes; k++) b->nodes[k].dead = 1; // left as it was
    return KILN_OK;
}

static kiln_status gqa(kiln_bgraph *b, uint32_t node, int *done) {
    const kiln_bnode *n = &b->nodes[node];
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int64_t rk = 0, rv = 0, seq = n->seq;
    int32_t q = kiln_bgraph_input(b, n, 0), m = kiln_bgraph_input(b, n, 3);
    int32_t ku = repeated_cache(b, kiln_bgraph_input(b, n, 1), &rk);
    int32_t vu = repeated_cache(b, kiln_bgraph_input(b, n, 2), &rv);
    int causal = kiln_attrs_int(&a, KILN_A_SDPA_CAUSAL, 0) != 0;
    *done = 0;
    if (ku < 0 || vu < 0 || rk != rv) return KILN_OK;
    const kiln_shape *qs = &b->values[q].desc.shape, *ks = &b->values[ku].desc.shape;
    const kiln_shape *os = &b->values[n->output].desc.shape;
    int64_t g = ks->min[1], h = g * rk;
    if (qs->rank != 4 || qs->min[1] != h || qs->max[1] != h || qs->min[3] != qs->max[3] ||
        os->rank != 4 || os->min[3] != os->max[3]) {
        return KILN_OK;
    }
    if (m >= 0) { // rows [.., L, S] with no per-head rows
        const kiln_shape *ms = &b->values[m].desc.shape;
        if (ms->rank < 2 || (ms->rank >= 3 && ms->max[ms->rank - 3] != 1)) return KILN_OK;
    }
    if (causal || qs->max[2] > GQA_ROWS_MAX) return gqa_broadcast(b, node, ku, vu, g, rk, done);
    if (m >= 0 && b->values[m].desc.shape.rank + 1 > KILN_MAX_RANK) return KILN_OK;
    // q [B, H, L, E] -> [B, G, R * L, E]
    size_t first_new = b->n_nodes;
    int64_t qc[4] = {-2, g, -1, qs->min[3]};
    int32_t q2, m2 = -1, o2, o, kc, vc;
    KILN_TRY(cache_of(b, ku, seq, &kc));
    KILN_TRY(cache_of(b, vu, seq, &vc));
    KILN_TRY(add_view(b, KILN_OP_RESHAPE, q, qc, 4, seq, &q2));
    if (m >= 0) { // [.., L, S] -> [.., 1, L, S] -> [.., R, L, S] -> [.., R * L, S]
        uint32_t r = b->values[m].desc.shape.rank;
        int64_t dim = (int64_t)r - 2, ec[KILN_MAX_RANK], rc[KILN_MAX_RANK];
        int32_t mu, me;
        KILN_TRY(add_view(b, KILN_OP_UNSQUEEZE, m, &dim, 1, seq, &mu));
        for (uint32_t j = 0; j <= r; j++) ec[j] = j == r - 2 ? rk : -1;
        KILN_TRY(add_view(b, KILN_OP_EXPAND, mu, ec, r + 1, seq, &me));
        for (uint32_t j = 0; j < r; j++) {
            rc[j] = j < r - 2 ? -(int64_t)j - 2 : (j == r - 2 ? -1 : -(int64_t)r - 2);
        }
        KILN_TRY(add_view(b, KILN_OP_RESHAPE, me, rc, r, seq, &m2));
    }
    {
        int32_t ins[4] = {q2, kc, vc, m2};
        n = &b->nodes[node];
        a = kiln_bgraph_attrs(b, n);
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SDPA, ins, m2 >= 0 ? 4 : 3, &a, seq, &o2));
    }
    int64_t oc[4] = {-2, h, -1, b->values[o2].desc.shape.min[3]};
    KILN_TRY(add_view(b, KILN_OP_RESHAPE, o2, oc, 4, seq, &o));
    if (!kiln_desc_equal(&b->values[o].desc, &b->values[b->nodes[node].output].desc)) {
        for (size_t k = first_new; k < b->n_nodes; k++) b->nodes[k].dead = 1; // left as it was
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, node, o, "grouped-query attention"));
    *done = 1;
    return KILN_OK;
}

// Rewrite 4 on input slot `slot` of sdpa `node`.
static kiln_status split_qkv(kiln_bgraph *b, uint32_t node, uint32_t slot, int *done) {
    *done = 0;
    int32_t pm =
        single_use_producer(b, kiln_bgraph_input(b, &b->nodes[node], slot), KILN_OP_PERMUTE);
    if (pm < 0) return KILN_OK;
    int32_t rs = single_use_producer(b, kiln_bgraph_input(b, &b->nodes[pm], 0), KILN_OP_RESHAPE);
    if (rs < 0 || kiln_bgraph_input(b, &b->nodes[rs], 1) >= 0) return KILN_OK;
    int32_t sl = single_use_producer(b, kiln_bgraph_input(b, &b->nodes[rs], 0), KILN_OP_SLICE);
    if (sl < 0) return KILN_OK;
    {
        kiln_attrs pa = kiln_bgraph_attrs(b, &b->nodes[pm]);
        uint32_t np = 0;
        const int64_t *perm = kiln_attrs_ints(&pa, KILN_A_PERMUTE_DIMS, &np);
        if (np != 4 || perm[0] != 0 || perm[1] != 2 || perm[2] != 1 || perm[3] != 3) return KILN_OK;
    }
    int32_t y = kiln_bgraph_input(b, &b->nodes[sl], 0);
    const kiln_shape *ys = &b->values[y].desc.shape;
    const kiln_shape *ss = &b->values[b->nodes[sl].output].desc.shape;
    const kiln_shape *rsh = &b->values[b->nodes[rs].output].desc.shape;
    if (ys->rank != 3 || ss->rank != 3 || rsh->rank != 4 || ys->min[2] != ys->max[2]) {
        return KILN_OK;
    }
    if (rsh->min[2] != rsh->max[2] || rsh->min[3] != rsh->max[3] ||
        !kiln_shape_same_dim(rsh, 0, ys, 0) || !kiln_shape_same_dim(rsh, 1, ys, 1) ||
        !kiln_shape_same_dim(ss, 0, ys, 0) || !kiln_shape_same_dim(ss, 1, ys, 1)) {
        return KILN_OK;
    }
    int64_t h = rsh->max[2], e = rsh->max[3], d = h * e, w = ys->max[2];
    kiln_attrs sa = kiln_bgraph_attrs(b, &b->nodes[sl]);
    int64_t dim = kiln_attrs_int(&sa, KILN_A_SLICE_DIM, 0);
    int64_t start = kiln_attrs_int(&sa, KILN_A_SLICE_START, 0);
    int64_t step = kiln_attrs_int(&sa, KILN_A_SLICE_STEP, 0);
    if ((dim != -1 && dim != 2) || step != 1 || d <= 0 || w % d != 0 || ss->min[2] != d ||
        ss->max[2] != d) {
        return KILN_OK;
    }
    if (start < 0) start += w;
    if (start < 0 || start % d != 0 || start + d > w) return KILN_OK;
    int64_t seq = b->nodes[pm].seq;
    int64_t codes[5] = {ys->min[0] == ys->max[0] ? ys->max[0] : -2,
                        ys->min[1] == ys->max[1] ? ys->max[1] : -3, w / d, h, e};
    int64_t perm5[5] = {2, 0, 3, 1, 4};
    int32_t r5, p5, sel;
    size_t first_new = b->n_nodes;
    KILN_TRY(add_view(b, KILN_OP_RESHAPE, y, codes, 5, seq, &r5));
    KILN_TRY(add_view(b, KILN_OP_PERMUTE, r5, perm5, 5, seq, &p5));
    KILN_TRY(add_select(b, p5, 0, start / d, seq, &sel));
    if (!kiln_desc_equal(&b->values[sel].desc, &b->values[b->nodes[pm].output].desc)) {
        for (size_t k = first_new; k < b->n_nodes; k++) b->nodes[k].dead = 1; // left as it was
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, (uint32_t)pm, sel, "split qkv"));
    *done = 1;
    return KILN_OK;
}

// The constant that m is a reshape, unsqueeze or squeeze chain of (the same elements in the same
// order), or -1.
static int32_t const_through_views(const kiln_bgraph *b, int32_t m) {
    while (m >= 0 && !kiln_bgraph_is_const(b, m)) {
        if (b->values[m].kind != KILN_IR_NODE) return -1;
        const kiln_bnode *n = &b->nodes[b->values[m].index];
        if (n->dead || n->n_tail > 0 || n->head >= 0 ||
            (n->op != KILN_OP_RESHAPE && n->op != KILN_OP_UNSQUEEZE && n->op != KILN_OP_SQUEEZE))
            return -1;
        m = kiln_bgraph_input(b, n, 0);
    }
    return m;
}

// Whether m (a constant, or a view chain of one) is the causal mask of L query rows and S keys
// (see 5. above).
static int is_causal_mask(const kiln_bgraph *b, int32_t m, int64_t l, int64_t sk) {
    int32_t cv = const_through_views(b, m);
    if (cv < 0) return 0;
    const kiln_bvalue *c = &b->values[cv];
    const kiln_shape *ms = &b->values[m].desc.shape;
    uint32_t r = ms->rank, dt = c->desc.dtype;
    uint64_t esz = kiln_dtype_size((kiln_dtype)dt);
    if (r < 2 || ms->min[r - 2] != l || ms->max[r - 2] != l || ms->min[r - 1] != sk ||
        ms->max[r - 1] != sk) {
        return 0;
    }
    for (uint32_t i = 0; i + 2 < r; i++) {
        if (ms->max[i] != 1) return 0;
    }
    if (esz == 0 || c->data == NULL || c->nbytes != (uint64_t)l * (uint64_t)sk * esz) return 0;
    if (dt != KILN_DTYPE_BOOL && !kiln_dtype_is_float((kiln_dtype)dt)) return 0;
    for (int64_t i = 0; i < l; i++) {
        for (int64_t j = 0; j < sk; j++) {
            int64_t at = i * sk + j;
            if (dt == KILN_DTYPE_BOOL) {
                if ((((const uint8_t *)c->data)[at] != 0) != (j <= i)) return 0;
                continue;
            }
            float v = kiln_load_f32(c->data, dt, at);
            if (j <= i ? v != 0.0f : !(v <= -1e4f)) return 0;
        }
    }
    return 1;
}

static kiln_status causal(kiln_bgraph *b, uint32_t node, int *done) {
    const kiln_bnode *n = &b->nodes[node];
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int32_t q = kiln_bgraph_input(b, n, 0), k = kiln_bgraph_input(b, n, 1);
    int32_t m = kiln_bgraph_input(b, n, 3);
    *done = 0;
    if (m < 0 || const_through_views(b, m) < 0 || kiln_attrs_int(&a, KILN_A_SDPA_CAUSAL, 0) != 0) {
        return KILN_OK;
    }
    const kiln_shape *qs = &b->values[q].desc.shape, *ks = &b->values[k].desc.shape;
    if (qs->rank < 2 || ks->rank < 2) return KILN_OK;
    int64_t l = qs->max[qs->rank - 2], sk = ks->max[ks->rank - 2];
    if (qs->min[qs->rank - 2] != l || ks->min[ks->rank - 2] != sk) return KILN_OK;
    if (!is_causal_mask(b, m, l, sk)) return KILN_OK;
    int64_t one = 1;
    double scale = kiln_attrs_float(&a, KILN_A_SDPA_SCALE, 0);
    kiln_attr_ref refs[2] = {{KILN_ATTR_INTS, 1, 0}, {KILN_ATTR_FLOATS, 1, 0}};
    kiln_attrs na = {refs, 2, &one, &scale};
    int32_t ins[3] = {q, k, kiln_bgraph_input(b, n, 2)}, y;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SDPA, ins, 3, &na, n->seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[node].output].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, node, y, "causal attention"));
    *done = 1;
    return KILN_OK;
}

// --- 6. head projections

#define HEADS_MAX 64 // linears one merge takes (an encoder-decoder's cross-attention k and v)

typedef struct head_proj {
    int32_t lin, resh; // node indices
    int32_t w, bias;   // values
    int64_t heads;     // H_j
    int split;         // 1: the reshape is the head split [a0, a1, H_j, E] itself
} head_proj;

// Linear node li as a head projection: a linear (no tail) of a constant weight [N, K] and an
// optional constant bias [N], its output [a0, a1, N] static and read only by a reshape (static)
// to [a0, a1, H, E] with N = H * E (split), or to any shape whose last dim E divides N (a single
// kv head's split already transposed, [a0, 1, a1, E], or viewed for grouped-query attention:
// Gemma's; taken only beside a split of the same E). 0 when it is not one; else *e = E.
static int head_projection(const kiln_bgraph *b, uint32_t li, head_proj *h, int64_t *e) {
    const kiln_bnode *n = &b->nodes[li];
    if (n->dead || n->op != KILN_OP_LINEAR || n->n_tail > 0 || n->head >= 0) return 0;
    h->lin = (int32_t)li;
    h->w = kiln_bgraph_input(b, n, 1);
    h->bias = kiln_bgraph_input(b, n, 2);
    if (!kiln_bgraph_is_const(b, h->w) || (h->bias >= 0 && !kiln_bgraph_is_const(b, h->bias)))
        return 0;
    const kiln_shape *ws = &b->values[h->w].desc.shape, *ys = &b->values[n->output].desc.shape;
    if (ws->rank != 2 || ws->min[0] != ws->max[0] || ws->min[1] != ws->max[1] || ys->rank != 3)
        return 0;
    if (h->bias >= 0) {
        const kiln_shape *bs = &b->values[h->bias].desc.shape;
        if (bs->rank != 1 || bs->min[0] != ws->max[0] || bs->max[0] != ws->max[0]) return 0;
    }
    for (uint32_t i = 0; i < 3; i++) {
        if (ys->min[i] != ys->max[i]) return 0; // static shapes (cuda_fold.h: slices as views)
    }
    h->resh = kiln_bgraph_only_reader(b, n->output);
    if (h->resh < 0) return 0;
    const kiln_bnode *r = &b->nodes[h->resh];
    if (r->op != KILN_OP_RESHAPE || kiln_bgraph_input(b, r, 1) >= 0) return 0; // no `like`
    const kiln_shape *rs = &b->values[r->output].desc.shape;
    if (rs->rank < 2) return 0;
    for (uint32_t i = 0; i < rs->rank; i++) {
        if (rs->min[i] != rs->max[i]) return 0;
    }
    *e = rs->max[rs->rank - 1];
    if (*e <= 0 || ws->max[0] % *e != 0) return 0;
    h->heads = ws->max[0] / *e;
    h->split = rs->rank == 4 && rs->max[0] == ys->max[0] && rs->max[1] == ys->max[1] &&
               rs->max[2] == h->heads;
    if (!h->split) { // its shape codes read the merged slice [a0, a1, H, E] the same way
        kiln_attrs ra = kiln_bgraph_attrs(b, r);
        uint32_t nr = 0;
        const int64_t *codes = kiln_attrs_ints(&ra, KILN_A_RESHAPE_SHAPE, &nr);
        if (nr == 0 || nr > KILN_MAX_RANK) return 0;
        for (uint32_t i = 0; i < nr; i++) {
            if (codes[i] < -3) return 0; // a copy of the input's dim 2 or later
        }
    }
    return 1;
}

// A constant of `rows` zeros of dtype, rank 1.
static kiln_status zeros_rows(kiln_bgraph *b, uint32_t dtype, int64_t rows, int32_t *out) {
    kiln_shape s;
    void *p;
    const uint64_t n = (uint64_t)rows * kiln_dtype_size((kiln_dtype)dtype);
    memset(&s, 0, sizeof s);
    s.rank = 1;
    s.min[0] = s.max[0] = rows;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)n, &p));
    memset(p, 0, (size_t)n);
    return kiln_bgraph_add_const(b, dtype, &s, p, n, out);
}

// Rewrite 6 for the head projections of the same x as linear node li (li the first of them),
// among the nodes before `end`: a linear this rewrite made is not merged again (its slices,
// appended with the seq of its first member, would then read a slice appended after them).
static kiln_status head_projections(kiln_bgraph *b, uint32_t li, size_t end, int *done) {
    head_proj h[HEADS_MAX];
    int64_t e = 0, ej = 0, heads = 0, seq;
    int n = 0, any_bias = 0;
    *done = 0;
    if (!head_projection(b, li, &h[0], &e)) return KILN_OK;
    const int32_t x = kiln_bgraph_input(b, &b->nodes[li], 0);
    const kiln_value_desc *w0 = &b->values[h[0].w].desc;
    n = 1;
    for (size_t k = li + 1; k < end && n < HEADS_MAX; k++) {
        if (b->nodes[k].op != KILN_OP_LINEAR || kiln_bgraph_input(b, &b->nodes[k], 0) != x)
            continue;
        if (!head_projection(b, (uint32_t)k, &h[n], &ej) || ej != e) continue;
        const kiln_value_desc *wd = &b->values[h[n].w].desc;
        if (wd->dtype != w0->dtype || wd->shape.max[1] != w0->shape.max[1]) continue;
        n++;
    }
    int n_split = 0;
    for (int j = 0; j < n; j++) n_split += h[j].split && h[j].heads > 1;
    if (n < 2 || n_split == 0) return KILN_OK; // one real head split at least
    uint32_t bias_dt = 0;
    for (int j = 0; j < n; j++) {
        if (h[j].bias < 0) continue;
        if (any_bias && b->values[h[j].bias].desc.dtype != bias_dt) return KILN_OK;
        bias_dt = b->values[h[j].bias].desc.dtype;
        any_bias = 1;
    }
    seq = b->nodes[h[0].lin].seq;
    int32_t w[HEADS_MAX], bias[HEADS_MAX], wc, bc = -1, ins[3], y, r;
    for (int j = 0; j < n; j++) {
        w[j] = h[j].w;
        bias[j] = h[j].bias;
        if (b->nodes[h[j].lin].seq < seq) seq = b->nodes[h[j].lin].seq;
        heads += h[j].heads;
    }
    KILN_TRY(stack_rows(b, w, n, &wc));
    if (any_bias) {
        for (int j = 0; j < n; j++) {
            if (bias[j] < 0) KILN_TRY(zeros_rows(b, bias_dt, h[j].heads * e, &bias[j]));
        }
        KILN_TRY(stack_rows(b, bias, n, &bc));
    }
    ins[0] = x;
    ins[1] = wc;
    ins[2] = bc;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_LINEAR, ins, bc >= 0 ? 3 : 2, NULL, seq, &y));
    {
        const kiln_shape *ys = &b->values[y].desc.shape;
        int64_t rs[4] = {ys->max[0], ys->max[1], heads, e};
        KILN_TRY(add_view(b, KILN_OP_RESHAPE, y, rs, 4, seq, &r));
    }
    int64_t at = 0;
    for (int j = 0; j < n; j++) {
        int64_t ints[4] = {2, at, at + h[j].heads, 1};
        kiln_attr_ref refs[4] = {{KILN_ATTR_INTS, 1, 0},
                                 {KILN_ATTR_INTS, 1, 1},
                                 {KILN_ATTR_INTS, 1, 2},
                                 {KILN_ATTR_INTS, 1, 3}};
        kiln_attrs a = {refs, 4, ints, NULL};
        int32_t sl;
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SLICE, &r, 1, &a, seq, &sl));
        if (!h[j].split) { // then the member's own reshape of its heads (the same elements)
            kiln_attrs ra = kiln_bgraph_attrs(b, &b->nodes[h[j].resh]);
            uint32_t nr = 0;
            const int64_t *shape = kiln_attrs_ints(&ra, KILN_A_RESHAPE_SHAPE, &nr);
            int64_t codes[KILN_MAX_RANK]; // checked by head_projection: 1..KILN_MAX_RANK
            memcpy(codes, shape, nr * sizeof *codes); // a copy: adding nodes may move the pool
            KILN_TRY(add_view(b, KILN_OP_RESHAPE, sl, codes, nr, seq, &sl));
        }
        KILN_TRY(kiln_bgraph_replace_node(b, (uint32_t)h[j].resh, sl, "head projections merge"));
        b->nodes[h[j].lin].dead = 1; // its reshape was its one reader
        at += h[j].heads;
    }
    *done = n;
    return KILN_OK;
}

kiln_status kiln_pass_attention(kiln_bgraph *b) {
    size_t n = b->n_nodes;
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead) continue;
        if (b->nodes[i].op != KILN_OP_SQUEEZE && b->nodes[i].op != KILN_OP_RESHAPE) continue;
        KILN_TRY(slice_squeeze(b, (uint32_t)i, &done));
        b->stats.n_select += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_SDPA) continue;
        KILN_TRY(qkv_merge(b, (uint32_t)i, &done));
        b->stats.n_qkv_merged += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_SDPA) continue;
        for (uint32_t slot = 0; slot < 3; slot++) {
            int done = 0;
            KILN_TRY(split_qkv(b, (uint32_t)i, slot, &done));
            b->stats.n_select += (uint32_t)done;
            if (done) KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    // the chains 2. and 4. left without readers die first: they must not join a merge
    KILN_TRY(kiln_pass_dce(b));
    KILN_TRY(kiln_bgraph_count_uses(b));
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_LINEAR) continue;
        KILN_TRY(head_projections(b, (uint32_t)i, n, &done));
        b->stats.n_heads_merged += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_SDPA) continue;
        KILN_TRY(gqa(b, (uint32_t)i, &done));
        b->stats.n_gqa += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_SDPA) continue;
        KILN_TRY(causal(b, (uint32_t)i, &done));
        b->stats.n_causal += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    // the new nodes were appended after the sdpa that reads them: restore index = topological order
    if (b->stats.n_select + b->stats.n_qkv_merged + b->stats.n_heads_merged + b->stats.n_gqa +
            b->stats.n_causal >
        0) {
        KILN_TRY(kiln_bgraph_sort_nodes(b));
    }
    return KILN_OK;
}
