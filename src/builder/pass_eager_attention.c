// SPDX-License-Identifier: Apache-2.0
// Eager attention as sdpa: model code that writes
//     matmul(softmax(s + m_1 + ... + m_j, dim = -1), v),  s = matmul(q, permute(k, swap)) [* c]
// (the permute swapping the last two dims, the softmax possibly in float32 between two casts, as
// BEiT's, MPNet's, DeBERTa's and Swin's attention layers are exported) becomes
// sdpa(q, k, v, m_1 + ... + m_j, scale): the kernels read the head split as views and never
// store the [.., L, S] scores or probabilities. The scale:
//  - c a constant scalar the scores are multiplied or divided by, or one q or k is multiplied
//    by before the matmul (torchvision's Swin: q * head_dim ** -0.5; MaxViT: k * scale, then the
//    einsum's view of k);
//  - c a constant that varies only over the batch dims ([H, 1, 1]: Swin-V2's per-head logit
//    scale of its cosine attention), multiplied into q instead (q c k^T = (q k^T) c per head).
// Every link read only by the next and not an output (attention weights returned to the caller
// keep the eager form); the masks of the scores' dtype, broadcasting to them without widening
// them.
//
// The scores may be viewed once with their leading dim split in two or more, [N, ..] -> [B, n,
// ..], between the adds, and back after the softmax:
//  - BLOOM flattens the heads into the batch for its baddbmm over [B * H, L, E] (its alibi
//    added there) and views the scores as [B, H, L, S] for the causal mask;
//  - Swin's shifted windows view [B * nW, H, L, S] as [B, nW, H, L, S] to add the window mask
//    [1, nW, 1, L, S];
//  - torch.einsum ("B G H I D, B G H J D -> B G H I J", MaxViT's attention) flattens the batch
//    dims for its batched matmuls and views the scores as [B, G, H, L, S] for the bias.
// With B = 1 the view only adds a leading 1: the masks added in it drop that dim and the sdpa
// keeps q, k and v as they are. Otherwise the sdpa reads q, k, v (and the masks added before the
// view, [N or 1, ..]) viewed as [B, n, ..], and its result is viewed back as the P V matmul's
// (views of views, which the second view pass collapses: an einsum's q, k, v are read as the
// tensors the model split its heads into).
//
// A 16-bit model that upcasts the scores (q and k cast to float32 for the matmul, the scores
// possibly cast back to q's dtype between the adds, the softmax between casts) is taken too: the
// sdpa reads the 16-bit q, k, v and the masks cast to q's dtype.
//
// Only where the engine computes attention in 16 bits (a float16/bfloat16 graph, or a float32
// one built at such a precision) over heads the tensor-core kernels take (E = Ev in {32, 64, 80,
// 128, 256}), or without masks over heads cuDNN's fused attention takes (E = Ev a multiple of 8
// up to 256): elsewhere the matmuls' GEMMs are the faster form on the GPU. Fully masked rows
// give zeros where softmax gave NaN (PyTorch's sdpa does the same).
//
// The sdpa takes the emission key (seq) of the P V matmul it replaces; masks computed from
// constants alone fold into one constant (pass_fold.c), and the replaced nodes are removed
// (dead-code elimination) before pass_attention's rewrites, which need q, k and v each
// read once (the QKV merge of MPNet's and BEiT's projections).
#include <math.h>
#include <string.h>

#include "builder/builder.h"
#include "core/dtype.h"
#include "core/status.h"

// A constant scalar (one element, float) c: *out = its value.
static int const_scalar(const kiln_bgraph *b, int32_t v, double *out) {
    if (!kiln_bgraph_is_const(b, v)) return 0;
    const kiln_bvalue *c = &b->values[v];
    const kiln_shape *s = &c->desc.shape;
    for (uint32_t i = 0; i < s->rank; i++) {
        if (s->max[i] != 1) return 0;
    }
    if (!kiln_dtype_is_float((kiln_dtype)c->desc.dtype) || c->data == NULL) return 0;
    *out = kiln_load_f32(c->data, c->desc.dtype, 0);
    return isfinite(*out) && *out != 0.0;
}

// k when kt = permute(k, dims swapping the last two, identity elsewhere), else -1.
static int32_t untransposed(const kiln_bgraph *b, int32_t kt) {
    if (kt < 0 || b->values[kt].kind != KILN_IR_NODE) return -1;
    const kiln_bnode *p = &b->nodes[b->values[kt].index];
    if (p->dead || p->op != KILN_OP_PERMUTE || p->n_tail > 0 || p->head >= 0) return -1;
    kiln_attrs a = kiln_bgraph_attrs(b, p);
    uint32_t n = 0;
    const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &n);
    if (n < 2) return -1;
    for (uint32_t i = 0; i + 2 < n; i++) {
        if (d[i] != (int64_t)i) return -1;
    }
    return d[n - 2] == (int64_t)n - 1 && d[n - 1] == (int64_t)n - 2 ? kiln_bgraph_input(b, p, 0)
                                                                    : -1;
}

#define EAGER_MAX_MASKS 4

// The 16-bit tensor a cast to float32 reads when v is one (a live cast, no tail), else -1.
static int32_t upcast_source(const kiln_bgraph *b, int32_t v) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE || b->values[v].desc.dtype != KILN_DTYPE_F32)
        return -1;
    const kiln_bnode *c = &b->nodes[b->values[v].index];
    if (c->dead || c->op != KILN_OP_CAST || c->n_tail > 0 || c->head >= 0) return -1;
    const int32_t x = kiln_bgraph_input(b, c, 0);
    const uint32_t xd = x >= 0 ? b->values[x].desc.dtype : 0;
    return xd == KILN_DTYPE_F16 || xd == KILN_DTYPE_BF16 ? x : -1;
}

// Node n reshapes the scores x [N, d1, .., dk] (N static) to [B_1, .., B_j, d1, .., dk] with
// j >= 2 static dims whose product is N: *out = that shape, *nb = j.
static int batch_split(const kiln_bgraph *b, int32_t n, kiln_shape *out, uint32_t *nb) {
    const kiln_bnode *nd = &b->nodes[n];
    if (nd->dead || nd->n_tail > 0 || nd->head >= 0 || kiln_bgraph_input(b, nd, 1) >= 0) return 0;
    const kiln_shape *x = &b->values[kiln_bgraph_input(b, nd, 0)].desc.shape;
    const kiln_shape *y = &b->values[nd->output].desc.shape;
    if (x->rank < 3 || y->rank < x->rank + 1 || x->min[0] != x->max[0]) return 0;
    const uint32_t j = y->rank - x->rank + 1;
    int64_t prod = 1;
    for (uint32_t i = 0; i < j; i++) {
        if (y->min[i] != y->max[i]) return 0;
        prod *= y->max[i];
    }
    if (prod != x->max[0]) return 0;
    for (uint32_t i = 1; i < x->rank; i++) {
        if (!kiln_shape_same_dim(x, i, y, i + j - 1)) return 0;
    }
    *out = *y;
    *nb = j;
    return 1;
}

// A reshape of x [N, d1, .., dk] (N the product of bh's nb dims, or 1 for bh all 1) to
// [bh..., d1, .., dk], the d's copied from x.
static kiln_status split_batch(kiln_bgraph *b, int32_t x, const int64_t *bh, uint32_t nb,
                               int64_t seq, int32_t *out) {
    const uint32_t r = b->values[x].desc.shape.rank;
    int64_t codes[KILN_MAX_RANK];
    if (r < 1 || r + nb - 1 > KILN_MAX_RANK) return KILN_ERR_INTERNAL;
    for (uint32_t i = 0; i < nb; i++) codes[i] = bh[i];
    for (uint32_t i = 1; i < r; i++) codes[i + nb - 1] = -(int64_t)i - 2; // dim i of x
    kiln_attr_ref ref = {KILN_ATTR_INTS, r + nb - 1, 0};
    kiln_attrs a = {&ref, 1, codes, NULL};
    return kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &a, seq, out);
}

// A reshape of x [1, d1, .., dk] to [d1, .., dk].
static kiln_status drop_leading_one(kiln_bgraph *b, int32_t x, int64_t seq, int32_t *out) {
    const uint32_t r = b->values[x].desc.shape.rank;
    int64_t codes[KILN_MAX_RANK];
    if (r < 2) return KILN_ERR_INTERNAL;
    for (uint32_t i = 1; i < r; i++) codes[i - 1] = -(int64_t)i - 2; // dim i of x
    kiln_attr_ref ref = {KILN_ATTR_INTS, r - 1, 0};
    kiln_attrs a = {&ref, 1, codes, NULL};
    return kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &a, seq, out);
}

// A constant c that multiplies the scores s [.., L, S] per batch index only: float, rank at most
// s's, its last two dims (right-aligned) 1 and every other dim 1 or s's (static).
static int batch_scale(const kiln_bgraph *b, int32_t c, const kiln_shape *s) {
    if (!kiln_bgraph_is_const(b, c)) return 0;
    const kiln_shape *cs = &b->values[c].desc.shape;
    if (!kiln_dtype_is_float((kiln_dtype)b->values[c].desc.dtype) || cs->rank > s->rank) return 0;
    for (uint32_t i = 0; i < cs->rank; i++) {
        const uint32_t si = s->rank - cs->rank + i;
        if (cs->max[i] == 1) continue;
        if (si + 2 >= s->rank || s->min[si] != s->max[si] || cs->max[i] != s->max[si]) return 0;
    }
    return 1;
}

// The other input of binary node n than v (-1 when v is both or neither).
static int32_t other_input(const kiln_bgraph *b, const kiln_bnode *n, int32_t v) {
    const int32_t x = kiln_bgraph_input(b, n, 0), y = kiln_bgraph_input(b, n, 1);
    if (x == v && y != v) return y;
    if (y == v && x != v) return x;
    return -1;
}

// q x when q = x * c, c a constant scalar (a scale applied to q before the matmul), read only
// by the matmul: *c = its value; else -1.
static int32_t prescaled(const kiln_bgraph *b, int32_t q, double *c) {
    if (q < 0 || b->values[q].kind != KILN_IR_NODE || kiln_bgraph_only_reader(b, q) < 0) return -1;
    const kiln_bnode *m = &b->nodes[b->values[q].index];
    if (m->dead || m->op != KILN_OP_MUL || m->n_tail > 0 || m->head >= 0) return -1;
    const int32_t x = kiln_bgraph_input(b, m, 0), y = kiln_bgraph_input(b, m, 1);
    if (const_scalar(b, y, c) && x != y && kiln_desc_equal(&b->values[x].desc, &b->values[q].desc))
        return x;
    if (const_scalar(b, x, c) && x != y && kiln_desc_equal(&b->values[y].desc, &b->values[q].desc))
        return y;
    return -1;
}

// k's pre-scaled form: x when k = x * c as prescaled() takes it, or k = reshape(x * c) with the
// mul read only by the reshape (an einsum's view of k, scaled before it: MaxViT's); *c its
// value, *view the reshape (-1 without one). Else -1.
static int32_t prescaled_k(const kiln_bgraph *b, int32_t k, double *c, int32_t *view) {
    *view = -1;
    const int32_t x = prescaled(b, k, c);
    if (x >= 0 || k < 0 || b->values[k].kind != KILN_IR_NODE || kiln_bgraph_only_reader(b, k) < 0)
        return x;
    const int32_t r = (int32_t)b->values[k].index;
    const kiln_bnode *rn = &b->nodes[r];
    if (rn->dead || rn->op != KILN_OP_RESHAPE || rn->n_tail > 0 || rn->head >= 0 ||
        kiln_bgraph_input(b, rn, 1) >= 0)
        return -1;
    const int32_t y = prescaled(b, kiln_bgraph_input(b, rn, 0), c);
    if (y >= 0) *view = r;
    return y;
}

// Walks forward from the Q K^T matmul qk (see the top of the file); on a match replaces the P V
// matmul by the sdpa.
static kiln_status eager_attention(kiln_bgraph *b, uint32_t qk, int *done) {
    *done = 0;
    const kiln_bnode *qn = &b->nodes[qk];
    if (qn->n_tail > 0 || qn->head >= 0) return KILN_OK;
    // a 16-bit model that computes the scores in float32 (BLOOM's baddbmm with its float32
    // alibi) reads q and k through casts: the sdpa reads the 16-bit tensors (its products
    // accumulate in float32) and the float32 masks
    int32_t q = kiln_bgraph_input(b, qn, 0), kt = kiln_bgraph_input(b, qn, 1);
    const int32_t q16 = upcast_source(b, q), kt16 = upcast_source(b, kt);
    const int upcast = q16 >= 0;
    if (upcast) {
        q = q16;
        kt = kt16 >= 0 ? kt16 : kt;
    }
    int32_t k = untransposed(b, kt);
    if (upcast && kt16 < 0 && k >= 0) k = upcast_source(b, k); // permute(cast(k))
    // BLOOM transposes k per head and then flattens the heads: reshape(permute(k4, swap), [B *
    // H, E, S]), k4 [B, H, S, E]; the sdpa reads k4 itself (only with the batch split below)
    int32_t k4 = -1;
    if (k < 0) {
        if (kt >= 0 && b->values[kt].kind == KILN_IR_NODE) {
            const kiln_bnode *rn = &b->nodes[b->values[kt].index];
            if (!rn->dead && rn->op == KILN_OP_RESHAPE && rn->n_tail == 0 && rn->head < 0 &&
                kiln_bgraph_input(b, rn, 1) < 0)
                k4 = untransposed(b, kiln_bgraph_input(b, rn, 0));
        }
        if (k4 >= 0 && b->values[k4].desc.shape.rank != 4) k4 = -1;
    }
    int32_t s = qn->output;
    const uint32_t dt = b->values[s].desc.dtype;
    const kiln_shape scores3 = b->values[s].desc.shape; // the matmuls' scores
    kiln_shape scores = scores3;                        // after the batch split, if any
    const uint32_t rq = scores3.rank;                   // q's, k's and v's rank
    uint32_t r = rq;
    if (q < 0 || (k < 0 && k4 < 0) || r < 3 || r + 1 > KILN_MAX_RANK) return KILN_OK;
    int32_t split = -1;               // the reshape [N, ..] -> [B_1, .., B_j, ..], if any
    uint32_t nb = 0;                  // its j
    uint32_t n_pre = 0;               // masks added before it
    int merged = 0;                   // the scores viewed back to [N, ..] before the softmax
    kiln_shape split_shape = scores3; // [B_1, .., B_j, ..]
    double scale = 1.0, c = 0.0;
    int32_t q_scale = -1; // a per-batch-index constant the scores are multiplied by
    const int32_t q0 = upcast ? -1 : prescaled(b, q, &c);
    if (q0 >= 0) {
        scale = c;
        q = q0;
    }
    // k scaled before its transpose (MaxViT's `k * scale`, then the einsum's view of it): the
    // sdpa reads k unscaled (its view of the unscaled k, made at the rewrite)
    int32_t k_unscaled = -1, k_view = -1;
    if (!upcast && k >= 0) {
        k_unscaled = prescaled_k(b, k, &c, &k_view);
        if (k_unscaled >= 0) scale *= c;
    }
    int32_t masks[EAGER_MAX_MASKS];
    uint32_t n_masks = 0;
    int32_t u = kiln_bgraph_only_reader(b, s);
    if (u >= 0 && (b->nodes[u].op == KILN_OP_MUL || b->nodes[u].op == KILN_OP_DIV)) {
        const kiln_bnode *m = &b->nodes[u];
        const int32_t o = other_input(b, m, s);
        if (o < 0) return KILN_OK;
        if (const_scalar(b, o, &c)) {
            if (m->op == KILN_OP_DIV && kiln_bgraph_input(b, m, 0) != s) return KILN_OK; // c / s
            scale *= m->op == KILN_OP_MUL ? c : 1.0 / c;
        } else if (m->op == KILN_OP_MUL && !upcast && b->values[o].desc.dtype == dt &&
                   batch_scale(b, o, &scores3)) {
            q_scale = o;
        } else {
            return KILN_OK;
        }
        s = m->output;
        u = kiln_bgraph_only_reader(b, s);
    }
    // q's dtype, which the sdpa reads and writes
    const uint32_t io_dt = upcast ? b->values[q].desc.dtype : dt;
    uint32_t cur_dt = dt; // the scores' dtype (an upcast's float32 scores may return to io_dt)
    for (; u >= 0; u = kiln_bgraph_only_reader(b, s)) {
        if (b->nodes[u].op == KILN_OP_RESHAPE && split < 0 && batch_split(b, u, &scores, &nb)) {
            split = u;
            split_shape = scores;
            n_pre = n_masks;
            r = rq + nb - 1;
            s = b->nodes[u].output;
            continue;
        }
        if (b->nodes[u].op == KILN_OP_RESHAPE && split >= 0 && !merged &&
            kiln_bgraph_input(b, &b->nodes[u], 1) < 0 &&
            kiln_shape_same(&b->values[b->nodes[u].output].desc.shape, &scores3)) {
            merged = 1; // viewed back before the softmax (Swin)
            r = rq;
            scores = scores3;
            s = b->nodes[u].output;
            continue;
        }
        if (merged) break; // no mask after the view back
        if (b->nodes[u].op == KILN_OP_CAST && upcast && cur_dt == KILN_DTYPE_F32 &&
            b->values[b->nodes[u].output].desc.dtype == io_dt && b->nodes[u].n_tail == 0) {
            cur_dt = io_dt; // BLOOM: baddbmm's float32 result back to the model's dtype
            s = b->nodes[u].output;
            continue;
        }
        if (b->nodes[u].op != KILN_OP_ADD) break;
        const kiln_bnode *a = &b->nodes[u];
        const int32_t m = other_input(b, a, s);
        if (m < 0 || n_masks == EAGER_MAX_MASKS || b->values[m].desc.dtype != cur_dt ||
            b->values[m].desc.shape.rank > r ||
            !kiln_shape_same(&b->values[a->output].desc.shape, &scores))
            return KILN_OK;
        masks[n_masks++] = m;
        s = a->output;
    }
    if (u >= 0 && b->nodes[u].op == KILN_OP_CAST) { // the softmax in float32
        if (b->values[b->nodes[u].output].desc.dtype != KILN_DTYPE_F32) return KILN_OK;
        s = b->nodes[u].output;
        u = kiln_bgraph_only_reader(b, s);
    }
    if (u < 0 || b->nodes[u].op != KILN_OP_SOFTMAX) return KILN_OK;
    {
        kiln_attrs sa = kiln_bgraph_attrs(b, &b->nodes[u]);
        const int64_t dim = kiln_attrs_int(&sa, KILN_A_SOFTMAX_DIM, 0);
        if (dim != -1 && dim != (int64_t)r - 1) return KILN_OK;
    }
    s = b->nodes[u].output;
    u = kiln_bgraph_only_reader(b, s);
    // ... and back to q's dtype (a cast that a float32 graph may keep as a no-op)
    if (u >= 0 && b->nodes[u].op == KILN_OP_CAST && b->nodes[u].n_tail == 0 &&
        b->values[b->nodes[u].output].desc.dtype == io_dt) {
        s = b->nodes[u].output;
        u = kiln_bgraph_only_reader(b, s);
    } else if (b->values[s].desc.dtype != io_dt) {
        return KILN_OK;
    }
    if (split >= 0 && !merged) { // ... and the batch merged back for the P V matmul
        if (u < 0 || b->nodes[u].op != KILN_OP_RESHAPE ||
            kiln_bgraph_input(b, &b->nodes[u], 1) >= 0 ||
            !kiln_shape_same(&b->values[b->nodes[u].output].desc.shape, &scores3))
            return KILN_OK;
        s = b->nodes[u].output;
        u = kiln_bgraph_only_reader(b, s);
    }
    if (u < 0 || b->nodes[u].op != KILN_OP_MATMUL || kiln_bgraph_input(b, &b->nodes[u], 0) != s ||
        kiln_bgraph_input(b, &b->nodes[u], 1) == s)
        return KILN_OK;
    const uint32_t pv = (uint32_t)u;
    const int32_t v = kiln_bgraph_input(b, &b->nodes[pv], 1);
    // a split of a leading 1 ([N, ..] -> [1, N, ..]: Swin's shifted windows at batch 1) adds
    // nothing: the masks added in the split view drop their leading dim instead
    // (BLOOM's k transposed per head is read in the split view, whatever its batch)
    const int unsqueeze = split >= 0 && nb == 2 && split_shape.max[0] == 1 && k4 < 0;
    if (k4 >= 0 && (split < 0 || rq != 3 || nb != 2)) return KILN_OK;
    kiln_value_desc k3; // k4 viewed as [B * H, S, E], for the checks below
    if (k4 >= 0) {
        const kiln_shape *s4 = &b->values[k4].desc.shape;
        if (s4->min[0] != s4->max[0] || s4->min[1] != s4->max[1] ||
            s4->max[0] != split_shape.max[0] || s4->max[1] != split_shape.max[1])
            return KILN_OK;
        memset(&k3, 0, sizeof k3);
        k3.dtype = b->values[k4].desc.dtype;
        k3.shape.rank = 3;
        k3.shape.min[0] = k3.shape.max[0] = s4->max[0] * s4->max[1];
        for (uint32_t i = 1; i < 3; i++) {
            k3.shape.min[i] = s4->min[i + 1];
            k3.shape.max[i] = s4->max[i + 1];
        }
    }
    const kiln_value_desc *qd = &b->values[q].desc, *kd = k4 >= 0 ? &k3 : &b->values[k].desc,
                          *vd = &b->values[v].desc;
    const int half = io_dt == KILN_DTYPE_F16 || io_dt == KILN_DTYPE_BF16 ||
                     (io_dt == KILN_DTYPE_F32 && (b->opts.precision == KILN_PRECISION_FP16 ||
                                                  b->opts.precision == KILN_PRECISION_BF16));
    if (!half || qd->dtype != io_dt || kd->dtype != io_dt || vd->dtype != io_dt ||
        (upcast && dt != KILN_DTYPE_F32) || qd->shape.rank != rq || kd->shape.rank != rq ||
        vd->shape.rank != rq)
        return KILN_OK;
    for (uint32_t i = 0; i + 2 < rq; i++) { // one batch shape (no broadcast between operands)
        if (!kiln_shape_same_dim(&qd->shape, i, &kd->shape, i) ||
            !kiln_shape_same_dim(&qd->shape, i, &vd->shape, i))
            return KILN_OK;
    }
    const int64_t e = qd->shape.max[rq - 1];
    if (qd->shape.min[rq - 1] != e ||
        !kiln_shape_same_dim(&qd->shape, rq - 1, &kd->shape, rq - 1) ||
        !kiln_shape_same_dim(&vd->shape, rq - 1, &qd->shape, rq - 1) ||
        !kiln_shape_same_dim(&kd->shape, rq - 2, &vd->shape, rq - 2))
        return KILN_OK;
    // with a batch split, the masks added before it are [N, ..] with N = B * n or 1 (or of a lower
    // rank, which broadcasts the same way over [B, n, ..]); with a leading 1 split off, the masks
    // added after it have a leading 1 when they have that rank
    for (uint32_t j = 0; split >= 0 && j < n_masks; j++) {
        const kiln_shape *ms = &b->values[masks[j]].desc.shape;
        if (j < n_pre && !unsqueeze && ms->rank == rq && ms->max[0] != 1 &&
            !kiln_shape_same_dim(ms, 0, &scores3, 0))
            return KILN_OK;
        if (j >= n_pre && unsqueeze && ms->rank == rq + 1 && ms->max[0] != 1) return KILN_OK;
    }
    // heads the tensor-core kernels take, or, without a mask, the fused geometry cuDNN's flash
    // attention takes (a multiple of 8 up to 256: SegFormer's heads of 32)
    if (e != 32 && e != 64 && e != 80 && e != 128 && e != 256 &&
        (n_masks > 0 || e % 8 != 0 || e > 256))
        return KILN_OK;
    // the masks' sum, in the order the model added them, then the sdpa in place of P V (adding
    // nodes may move the values array: qd, kd, vd are not read past this point)
    const int64_t seq = b->nodes[pv].seq, ev = vd->shape.max[rq - 1];
    int32_t ins[4] = {q, k, v, -1};
    uint32_t n_in = 3;
    if (q_scale >= 0) {
        int32_t two[2] = {q, q_scale};
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_MUL, two, 2, NULL, seq, &ins[0]));
    }
    if (k_unscaled >= 0 && k_view < 0) {
        ins[1] = k_unscaled;
    } else if (k_unscaled >= 0) { // the einsum's view of k, over the unscaled k
        kiln_attrs va = kiln_bgraph_attrs(b, &b->nodes[k_view]);
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &k_unscaled, 1, &va, seq, &ins[1]));
    }
    if (unsqueeze) {
        for (uint32_t j = n_pre; j < n_masks; j++) {
            if (b->values[masks[j]].desc.shape.rank == rq + 1)
                KILN_TRY(drop_leading_one(b, masks[j], seq, &masks[j]));
        }
    } else if (split >= 0) { // q, k, v and the early masks viewed as [B_1, .., B_j, ..]
        int64_t bh[KILN_MAX_RANK], one[KILN_MAX_RANK];
        for (uint32_t i = 0; i < nb; i++) {
            bh[i] = split_shape.max[i];
            one[i] = 1;
        }
        if (k4 >= 0) ins[1] = k4;
        for (int j = 0; j < 3; j++) {
            if (j != 1 || k4 < 0) KILN_TRY(split_batch(b, ins[j], bh, nb, seq, &ins[j]));
        }
        for (uint32_t j = 0; j < n_pre; j++) {
            if (b->values[masks[j]].desc.shape.rank != rq) continue;
            const int wide = b->values[masks[j]].desc.shape.max[0] != 1;
            KILN_TRY(split_batch(b, masks[j], wide ? bh : one, nb, seq, &masks[j]));
        }
    }
    if (n_masks > 0) {
        // masks added to upcast float32 scores are read in q's dtype, as the sdpa reads masks
        // (BLOOM rounds the scores with its alibi to that dtype itself)
        for (uint32_t j = 0; j < n_masks; j++) {
            if (b->values[masks[j]].desc.dtype == io_dt) continue;
            int64_t to = io_dt;
            kiln_attr_ref ref = {KILN_ATTR_INTS, 1, 0};
            kiln_attrs ca = {&ref, 1, &to, NULL};
            KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_CAST, &masks[j], 1, &ca, seq, &masks[j]));
        }
        int32_t m = masks[0];
        for (uint32_t j = 1; j < n_masks; j++) {
            int32_t two[2] = {m, masks[j]};
            KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_ADD, two, 2, NULL, seq, &m));
        }
        ins[3] = m;
        n_in = 4;
    }
    int64_t zero = 0;
    kiln_attr_ref refs[2] = {{KILN_ATTR_INTS, 1, 0}, {KILN_ATTR_FLOATS, 1, 0}};
    kiln_attrs na = {refs, 2, &zero, &scale};
    int32_t y;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SDPA, ins, n_in, &na, seq, &y));
    if (split >= 0 && !unsqueeze) { // [B_1, .., B_j, .., Ev] -> the P V matmul's [N, .., Ev]
        int64_t codes[KILN_MAX_RANK];
        codes[0] = scores3.max[0];
        for (uint32_t i = 1; i + 1 < rq; i++) codes[i] = -(int64_t)(i + nb - 1) - 2; // y's dim
        codes[rq - 1] = ev;
        kiln_attr_ref ref = {KILN_ATTR_INTS, rq, 0};
        kiln_attrs ra = {&ref, 1, codes, NULL};
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &y, 1, &ra, seq, &y));
    }
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[pv].output].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, pv, y, "eager attention"));
    *done = 1;
    return KILN_OK;
}

kiln_status kiln_pass_eager_attention(kiln_bgraph *b) {
    uint32_t n_eager = 0;
    // the views the view pass replaced (an einsum's chains of views of the scores) still read
    // their inputs until they are removed: each link must have one reader
    KILN_TRY(kiln_pass_dce(b));
    KILN_TRY(kiln_bgraph_count_uses(b));
    const size_t n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_MATMUL) continue;
        KILN_TRY(eager_attention(b, (uint32_t)i, &done));
        n_eager += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    b->stats.n_eager_attention += n_eager;
    if (n_eager == 0) return KILN_OK;
    // masks of constants (a relative-position bias and a shifted-window mask) summed into one
    // constant; then the replaced matmuls and softmax, which still read q, k and v, removed, so
    // that the QKV merge of pass_attention sees each projection read once (MPNet's, BEiT's)
    KILN_TRY(kiln_bgraph_sort_nodes(b));
    KILN_TRY(kiln_pass_fold(b));
    return kiln_pass_dce(b);
}
