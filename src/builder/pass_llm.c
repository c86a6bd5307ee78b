// SPDX-License-Identifier: Apache-2.0
// Norm and rotary patterns: RMSNorm and rotary position embeddings, which an exported transformers
// decoder (Llama, Qwen2, Mistral, Gemma) spells as chains of 7-8 small elementwise ops, become
// one layer each (docs/builder.md):
//
// 1. rms_norm: LlamaRMSNorm `w * (x.f32 * rsqrt(mean(x.f32^2, -1, keepdim) + eps)).to(dtype)`,
//        [cast] -> pow(X, 2) -> mean(dims [-1], keepdim) -> add(., eps) -> rsqrt -> mul(X, .)
//        -> [cast] -> [mul(., W)]
//    is rms_norm(x, W?, eps). The casts are optional (absent, or no-ops in a float32 graph);
//    the first one is fused when its output is read only by the pow and the mul and its input
//    has the result's dtype. T5LayerNorm squares `x.f32` but multiplies x itself (a float16 x
//    times a float32 rsqrt: the lowering casts x again): the pow's and the mul's operands may be
//    two casts of one x to one dtype, each read only there. W is a constant of D elements (Gemma's
//    1 + w after folding) or absent; eps a scalar constant; the operands of the adds and muls in
//    either order. When the dtypes do not allow the whole chain, a shorter one ending before the
//    weight or the second cast is fused.
// 2. rotary: transformers' apply_rotary_pos_emb, `x * cos + rotate_half(x) * sin` with
//        rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2], -1),
//    that is add(mul(x, cos), mul(cat(neg(slice(x, -1, D/2, D)), slice(x, -1, 0, D/2)), sin)),
//    is rotary(x, cos, sin) when D is static and even, the slices are exactly the two halves,
//    the cat is on the last dim in that order and cos, sin broadcast to x (the output has x's
//    shape). x and cos/sin may have other readers (q and k share the tables). The partial
//    form (GPT-NeoX's, StableLM's and Phi's rotary_pct), cat(rotary(slice(x, -1, 0, R), cos,
//    sin), slice(x, -1, R, D), -1) with tables over R dims, is rotary(x, cos, sin): the op
//    rotates the first R dims when its tables cover R (kiln_rotary_dims) and copies the rest.
//    The interleaved form (GPT-J's, CodeGen's, Cohere's, RoFormer's and EVA-02's
//    rotate_every_two, `stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`), exported as
//    reshape(cat(unsqueeze(neg(slice(x, -1, 1, D, 2))), unsqueeze(slice(x, -1, 0, D, 2)), -1))
//    with each unsqueeze a reshape appending a dim of 1 (the neg before or after it), is
//    rotary(x, cos, sin) with the attribute interleaved = 1: the pairs (2i, 2i + 1). Its partial
//    form too.
// 3. L2 normalization: F.normalize(x, dim=-1) and x / x.norm(dim=-1, keepdim=True), exported as
//        div(x, [expand](clamp(pow(sum(pow(x, 2), dims [-1], keepdim), 0.5) | sqrt(...), min eps)))
//    (the clamp optional, min eps >= 0 and no max; for a 16-bit x the norm may be computed in
//    float32 between a cast of x up and a cast of the norm back, as a half() model exports it),
//    is rms_norm(x, w, eps^2 / D) with w a new
//    constant of D elements 1/sqrt(D) in x's dtype (Swin-V2's cosine attention normalizes q and
//    k so). The same values wherever |x| > eps; a row with |x| <= eps is divided by
//    sqrt(|x|^2 + eps^2) instead of eps (within a factor of sqrt(2); a zero row gives zeros in
//    both). A squared eps below float32's smallest normal keeps the chain.
// 4. the 2-norm: sqrt(sum(pow(x, 2) | x * x, dims, keepdim)), the root sqrt or pow(., 0.5), over
//    any dims (torch.norm and linalg.vector_norm as exported; ConvNeXt-V2's global response norm
//    over H and W) is vector_norm(x, dims, keepdim), every value in x's dtype. After 3.
// Every intermediate value fused away has exactly one reader and is not a graph output; a
// chain that differs in any way stays as it is. The fused node takes the emission key of the
// node it replaces; the nodes are re-sorted at the end, and the old chains, left without
// readers, are removed by the dead-code elimination that follows.
#include <math.h>
#include <string.h>

#include "builder/builder.h"
#include "core/dtype.h"
#include "core/status.h"

// The live node producing v with op `op` whose output is read once and is not an output, or -1.
static int32_t sole_producer(const kiln_bgraph *b, int32_t v, uint32_t op) {
    if (v < 0 || (size_t)v >= b->n_use_info || b->values[v].kind != KILN_IR_NODE) return -1;
    if (b->uses[v] != 1 || b->is_output[v]) return -1;
    const kiln_bnode *n = &b->nodes[b->values[v].index];
    if (n->dead || n->op != op || n->n_tail > 0 || n->head >= 0) return -1;
    return (int32_t)b->values[v].index;
}

// The only reader of v (a live node with op `op`, v read once and not an output), or -1.
static int32_t sole_reader(const kiln_bgraph *b, int32_t v, uint32_t op) {
    if (v < 0 || (size_t)v >= b->n_use_info || b->uses[v] != 1 || b->is_output[v]) return -1;
    int32_t r = b->user[v];
    if (r < 0) return -1;
    const kiln_bnode *n = &b->nodes[r];
    if (n->dead || n->op != op || n->n_tail > 0 || n->head >= 0) return -1;
    return r;
}

// The value of a float constant with one element (any rank), or 0 when v is not one.
static int scalar_const(const kiln_bgraph *b, int32_t v, double *out) {
    uint64_t numel;
    if (!kiln_bgraph_is_const(b, v)) return 0;
    const kiln_bvalue *c = &b->values[v];
    if (!kiln_dtype_is_float((kiln_dtype)c->desc.dtype) ||
        !kiln_shape_max_numel(&c->desc.shape, &numel) || numel != 1 ||
        c->nbytes != kiln_dtype_size((kiln_dtype)c->desc.dtype)) {
        return 0;
    }
    *out = (double)kiln_load_f32(c->data, c->desc.dtype, 0);
    return 1;
}

// The other input of a binary node than `v` (the second one when both are v), or -1.
static int32_t other_input(const kiln_bgraph *b, uint32_t node, int32_t v) {
    int32_t a = kiln_bgraph_input(b, &b->nodes[node], 0),
            c = kiln_bgraph_input(b, &b->nodes[node], 1);
    if (a == v) return c;
    if (c == v) return a;
    return -1;
}

// Whether attribute list `dims` (of a node over rank r) is exactly the last dim.
static int is_last_dim(int64_t d, uint32_t r) { return r > 0 && (d == -1 || d == (int64_t)r - 1); }

// Adds node op(ins) with `attrs` at the emission key of node `old` and lets it take over old's
// output; leaves the graph as it was (the new node dead) when the results would differ.
static kiln_status fuse_into(kiln_bgraph *b, uint32_t old, uint32_t op, const int32_t *ins,
                             uint32_t n_ins, const kiln_attrs *attrs, const char *what, int *done) {
    int32_t y;
    KILN_TRY(kiln_bgraph_add_node(b, op, ins, n_ins, attrs, b->nodes[old].seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[old].output].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, old, y, what));
    *done = 1;
    return KILN_OK;
}

// --- 1. rms_norm, matched from its rsqrt

// The float input of the live cast (no fused tail, not in a group) that produces v, or -1.
static int32_t cast_source(const kiln_bgraph *b, int32_t v) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE || (size_t)v >= b->n_use_info) return -1;
    const kiln_bnode *cn = &b->nodes[b->values[v].index];
    if (cn->dead || cn->op != KILN_OP_CAST || cn->n_tail != 0 || cn->head >= 0) return -1;
    int32_t src = kiln_bgraph_input(b, cn, 0);
    return src >= 0 && kiln_dtype_is_float((kiln_dtype)b->values[src].desc.dtype) ? src : -1;
}

static kiln_status rms_norm(kiln_bgraph *b, uint32_t rs_node, int *done) {
    double eps = 0.0, two = 0.0;
    *done = 0;
    int32_t add = sole_producer(b, kiln_bgraph_input(b, &b->nodes[rs_node], 0), KILN_OP_ADD);
    if (add < 0) return KILN_OK;
    int32_t a0 = kiln_bgraph_input(b, &b->nodes[add], 0);
    int32_t a1 = kiln_bgraph_input(b, &b->nodes[add], 1), mv;
    if (scalar_const(b, a1, &eps)) {
        mv = a0;
    } else if (scalar_const(b, a0, &eps)) {
        mv = a1;
    } else {
        return KILN_OK;
    }
    if (!isfinite(eps) || eps < 0.0) return KILN_OK;
    int32_t mean = sole_producer(b, mv, KILN_OP_MEAN);
    if (mean < 0) return KILN_OK;
    int32_t pw = sole_producer(b, kiln_bgraph_input(b, &b->nodes[mean], 0), KILN_OP_POW);
    if (pw < 0) return KILN_OK;
    int32_t x = kiln_bgraph_input(b, &b->nodes[pw], 0);
    if (!scalar_const(b, kiln_bgraph_input(b, &b->nodes[pw], 1), &two) || two != 2.0) {
        return KILN_OK;
    }
    const kiln_shape *xs = &b->values[x].desc.shape;
    uint32_t r = xs->rank;
    {
        kiln_attrs ma = kiln_bgraph_attrs(b, &b->nodes[mean]);
        uint32_t nd = 0;
        const int64_t *dims = kiln_attrs_ints(&ma, KILN_A_REDUCE_DIMS, &nd);
        if (r == 0 || nd != 1 || !is_last_dim(dims[0], r) ||
            kiln_attrs_int(&ma, KILN_A_REDUCE_KEEPDIM, 0) != 1) {
            return KILN_OK;
        }
    }
    // h = mul(x, rsqrt(...)): the rsqrt's only reader, the other operand x itself or (T5) a
    // cast of x's own cast source; then that source is the norm's input (x0 below)
    int32_t hm = sole_reader(b, b->nodes[rs_node].output, KILN_OP_MUL);
    if (hm < 0) return KILN_OK;
    int32_t xm = other_input(b, (uint32_t)hm, b->nodes[rs_node].output), x0 = -1;
    if (xm != x) {
        int32_t s0 = cast_source(b, x), s1 = cast_source(b, xm);
        if (s0 < 0 || s0 != s1 || b->values[x].desc.dtype != b->values[xm].desc.dtype ||
            b->uses[x] != 1 || b->uses[xm] != 1 || b->is_output[x] || b->is_output[xm]) {
            return KILN_OK;
        }
        x0 = s0;
    }
    int32_t h = b->nodes[hm].output;
    if (!kiln_shape_same(&b->values[h].desc.shape, xs) ||
        !kiln_dtype_is_float((kiln_dtype)b->values[x].desc.dtype)) {
        return KILN_OK;
    }
    // The candidate ends: h, then cast(h), then mul(., W); the longest whose dtypes work wins.
    int32_t ends[3] = {hm, -1, -1}, weight = -1;
    int32_t cur = h;
    int32_t co = sole_reader(b, cur, KILN_OP_CAST);
    if (co >= 0) {
        ends[1] = co;
        cur = b->nodes[co].output;
    }
    int32_t wm = sole_reader(b, cur, KILN_OP_MUL);
    if (wm >= 0 && xs->min[r - 1] == xs->max[r - 1]) {
        int32_t w = other_input(b, (uint32_t)wm, cur);
        const kiln_value_desc *wd = w >= 0 ? &b->values[w].desc : NULL;
        uint64_t numel = 0;
        // a constant of D elements along the last dim ([D], [1, D], ...), the product x's shape
        if (w >= 0 && w != cur && kiln_bgraph_is_const(b, w) && wd->shape.rank <= r &&
            wd->shape.rank >= 1 && kiln_shape_max_numel(&wd->shape, &numel) &&
            numel == (uint64_t)xs->max[r - 1] &&
            wd->shape.max[wd->shape.rank - 1] == xs->max[r - 1] &&
            kiln_shape_same(&b->values[b->nodes[wm].output].desc.shape, xs)) {
            ends[2] = wm;
            weight = w;
        }
    }
    // The first cast: fused when its output feeds only the pow and the mul.
    if (x0 < 0 && (size_t)x < b->n_use_info && b->uses[x] == 2 && !b->is_output[x]) {
        x0 = cast_source(b, x);
    }
    for (int e = 2; e >= 0; e--) {
        if (ends[e] < 0) continue;
        uint32_t t = b->values[b->nodes[ends[e]].output].desc.dtype;
        int32_t in = -1;
        if (x0 >= 0 && b->values[x0].desc.dtype == t) {
            in = x0;
        } else if (b->values[x].desc.dtype == t) {
            in = x;
        } else {
            continue;
        }
        int32_t ins[2] = {in, -1};
        uint32_t n_ins = 1;
        if (e == 2) {
            int32_t w = weight;
            const kiln_bvalue *wv = &b->values[w];
            if (wv->desc.dtype != t) continue;
            if (wv->desc.shape.rank != 1) { // the same bytes viewed as [D]
                kiln_shape s;
                memset(&s, 0, sizeof s);
                s.rank = 1;
                s.min[0] = s.max[0] = xs->max[r - 1];
                KILN_TRY(kiln_bgraph_add_const(b, t, &s, wv->data, wv->nbytes, &w));
            }
            ins[1] = w;
            n_ins = 2;
        }
        kiln_attr_ref ref = {KILN_ATTR_FLOATS, 1, 0};
        kiln_attrs a = {&ref, 1, NULL, &eps};
        KILN_TRY(fuse_into(b, (uint32_t)ends[e], KILN_OP_RMS_NORM, ins, n_ins, &a,
                           "rms_norm fusion", done));
        return KILN_OK;
    }
    return KILN_OK;
}

// --- 2. rotary, matched from its add

// Python's slice clamping of [start, end) over a dim of size n.
static void slice_range(int64_t start, int64_t end, int64_t n, int64_t *lo, int64_t *hi) {
    if (start < 0) start = start + n < 0 ? 0 : start + n;
    if (end < 0) end = end + n < 0 ? 0 : end + n;
    *lo = start > n ? n : start;
    *hi = end > n ? n : end;
}

// Whether node sl slices x over its last dim (static size n) to exactly [lo, hi) with `step`.
static int is_strided(const kiln_bgraph *b, int32_t sl, int32_t x, int64_t n, int64_t lo,
                      int64_t hi, int64_t step) {
    const kiln_bnode *s = &b->nodes[sl];
    kiln_attrs a = kiln_bgraph_attrs(b, s);
    int64_t l, h;
    if (kiln_bgraph_input(b, s, 0) != x) return 0;
    if (!is_last_dim(kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0), b->values[x].desc.shape.rank) ||
        kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0) != step) {
        return 0;
    }
    slice_range(kiln_attrs_int(&a, KILN_A_SLICE_START, 0), kiln_attrs_int(&a, KILN_A_SLICE_END, 0),
                n, &l, &h);
    return l == lo && h == hi;
}

static int is_half(const kiln_bgraph *b, int32_t sl, int32_t x, int64_t n, int64_t lo, int64_t hi) {
    return is_strided(b, sl, x, n, lo, hi, 1);
}

// The live reshape or unsqueeze producing v (read once, not an output) that appends a dim of 1
// to its input's shape, or -1.
static int32_t unsqueeze_last(const kiln_bgraph *b, int32_t v) {
    int32_t u = sole_producer(b, v, KILN_OP_RESHAPE);
    if (u < 0) u = sole_producer(b, v, KILN_OP_UNSQUEEZE);
    if (u < 0) return -1;
    const kiln_shape *in = &b->values[kiln_bgraph_input(b, &b->nodes[u], 0)].desc.shape;
    const kiln_shape *out = &b->values[v].desc.shape;
    if (out->rank != in->rank + 1 || out->min[in->rank] != 1 || out->max[in->rank] != 1) return -1;
    for (uint32_t i = 0; i < in->rank; i++) {
        if (out->min[i] != in->min[i] || out->max[i] != in->max[i]) return -1;
    }
    return u;
}

// The x whose interleaved rotation rot is (rotate_every_two: rot = reshape(cat(unsqueeze(neg(
// slice(x, -1, 1, D, 2))), unsqueeze(slice(x, -1, 0, D, 2)), -1)) to x's shape, the neg before or
// after its unsqueeze), or -1.
static int32_t pairs_source(const kiln_bgraph *b, int32_t rot) {
    const int32_t fl = sole_producer(b, rot, KILN_OP_RESHAPE);
    if (fl < 0) return -1;
    const int32_t cat = sole_producer(b, kiln_bgraph_input(b, &b->nodes[fl], 0), KILN_OP_CAT);
    if (cat < 0 || b->nodes[cat].n_inputs != 2) return -1;
    const int32_t v0 = kiln_bgraph_input(b, &b->nodes[cat], 0);
    int32_t s2 = -1, u0 = unsqueeze_last(b, v0), neg = -1;
    if (u0 >= 0) { // unsqueeze(neg(slice))
        neg = sole_producer(b, kiln_bgraph_input(b, &b->nodes[u0], 0), KILN_OP_NEG);
        if (neg >= 0) s2 = sole_producer(b, kiln_bgraph_input(b, &b->nodes[neg], 0), KILN_OP_SLICE);
    } else if ((neg = sole_producer(b, v0, KILN_OP_NEG)) >= 0) { // neg(unsqueeze(slice))
        u0 = unsqueeze_last(b, kiln_bgraph_input(b, &b->nodes[neg], 0));
        if (u0 >= 0) s2 = sole_producer(b, kiln_bgraph_input(b, &b->nodes[u0], 0), KILN_OP_SLICE);
    }
    const int32_t u1 = unsqueeze_last(b, kiln_bgraph_input(b, &b->nodes[cat], 1));
    const int32_t s1 =
        u1 >= 0 ? sole_producer(b, kiln_bgraph_input(b, &b->nodes[u1], 0), KILN_OP_SLICE) : -1;
    if (s1 < 0 || s2 < 0) return -1;
    const int32_t x = kiln_bgraph_input(b, &b->nodes[s1], 0);
    const kiln_shape *xs = &b->values[x].desc.shape;
    const uint32_t r = xs->rank;
    if (r == 0 || xs->min[r - 1] != xs->max[r - 1] || xs->max[r - 1] % 2 != 0 ||
        xs->max[r - 1] == 0 || !kiln_shape_same(&b->values[rot].desc.shape, xs))
        return -1;
    const int64_t d = xs->max[r - 1];
    kiln_attrs ca = kiln_bgraph_attrs(b, &b->nodes[cat]);
    if (!is_last_dim(kiln_attrs_int(&ca, KILN_A_CAT_DIM, 0), r + 1) ||
        !is_strided(b, s1, x, d, 0, d, 2) || !is_strided(b, s2, x, d, 1, d, 2))
        return -1;
    return x;
}

// Whether add(a1, a2) is the rotary pattern with a1 = mul(x, cos) and a2 = mul(rot, sin) (each
// mul in either order), rot rotate_half(x) or (*inter = 1) rotate_every_two(x); writes x, cos and
// sin.
static int rotary_match(const kiln_bgraph *b, int32_t a1, int32_t a2, int32_t *ox, int32_t *ocos,
                        int32_t *osin, int *inter) {
    int32_t m2 = sole_producer(b, a2, KILN_OP_MUL), m1 = sole_producer(b, a1, KILN_OP_MUL);
    if (m1 < 0 || m2 < 0) return 0;
    for (int order = 0; order < 2; order++) {
        int32_t cv = kiln_bgraph_input(b, &b->nodes[m2], (uint32_t)order);
        int32_t sin = kiln_bgraph_input(b, &b->nodes[m2], (uint32_t)(1 - order));
        const int32_t px = pairs_source(b, cv);
        if (px >= 0) {
            const int32_t cos = other_input(b, (uint32_t)m1, px);
            if (cos < 0 || sin < 0 || sin == cv ||
                !kiln_shape_same(&b->values[a1].desc.shape, &b->values[px].desc.shape) ||
                !kiln_shape_same(&b->values[a2].desc.shape, &b->values[px].desc.shape))
                continue;
            *ox = px;
            *ocos = cos;
            *osin = sin;
            *inter = 1;
            return 1;
        }
        int32_t cat = sole_producer(b, cv, KILN_OP_CAT);
        if (cat < 0 || b->nodes[cat].n_inputs != 2) continue;
        int32_t neg = sole_producer(b, kiln_bgraph_input(b, &b->nodes[cat], 0), KILN_OP_NEG);
        int32_t s1 = sole_producer(b, kiln_bgraph_input(b, &b->nodes[cat], 1), KILN_OP_SLICE);
        if (neg < 0 || s1 < 0) continue;
        int32_t s2 = sole_producer(b, kiln_bgraph_input(b, &b->nodes[neg], 0), KILN_OP_SLICE);
        if (s2 < 0) continue;
        int32_t x = kiln_bgraph_input(b, &b->nodes[s1], 0);
        const kiln_shape *xs = &b->values[x].desc.shape;
        uint32_t r = xs->rank;
        if (r == 0 || xs->min[r - 1] != xs->max[r - 1] || xs->max[r - 1] % 2 != 0 ||
            xs->max[r - 1] == 0) {
            continue;
        }
        int64_t d = xs->max[r - 1];
        kiln_attrs ca = kiln_bgraph_attrs(b, &b->nodes[cat]);
        if (!is_last_dim(kiln_attrs_int(&ca, KILN_A_CAT_DIM, 0), r) ||
            !is_half(b, s1, x, d, 0, d / 2) || !is_half(b, s2, x, d, d / 2, d)) {
            continue;
        }
        int32_t cos = other_input(b, (uint32_t)m1, x);
        if (cos < 0 || sin < 0 || sin == cv) continue;
        // the products have x's shape: cos and sin broadcast to x without enlarging it
        if (!kiln_shape_same(&b->values[a1].desc.shape, xs) ||
            !kiln_shape_same(&b->values[a2].desc.shape, xs)) {
            continue;
        }
        *ox = x;
        *ocos = cos;
        *osin = sin;
        *inter = 0;
        return 1;
    }
    return 0;
}

// The partial form: cat(rotary(slice(x, -1, 0, R), cos, sin), slice(x, -1, R, D), -1) with
// tables over R dims is rotary(x, cos, sin) (kiln_rotary_dims: the first R rotated, the rest
// passed), the rotary's and the rest's slice read only by the cat.
static kiln_status partial_rotary(kiln_bgraph *b, uint32_t cat, int *done) {
    *done = 0;
    const kiln_bnode *cn = &b->nodes[cat];
    if (cn->n_inputs != 2) return KILN_OK;
    const int32_t rot = sole_producer(b, kiln_bgraph_input(b, cn, 0), KILN_OP_ROTARY);
    const int32_t pass = sole_producer(b, kiln_bgraph_input(b, cn, 1), KILN_OP_SLICE);
    if (rot < 0 || pass < 0) return KILN_OK;
    // the rotated slice is still read by the rotate-half chain the rotary replaced (dead code
    // until the next dce): any live slice node
    const int32_t hv = kiln_bgraph_input(b, &b->nodes[rot], 0);
    if (hv < 0 || b->values[hv].kind != KILN_IR_NODE) return KILN_OK;
    const int32_t head = (int32_t)b->values[hv].index;
    if (b->nodes[head].dead || b->nodes[head].op != KILN_OP_SLICE || b->nodes[head].n_tail > 0 ||
        b->nodes[head].head >= 0)
        return KILN_OK;
    const int32_t x = kiln_bgraph_input(b, &b->nodes[head], 0);
    const int32_t cos = kiln_bgraph_input(b, &b->nodes[rot], 1);
    const int32_t sin = kiln_bgraph_input(b, &b->nodes[rot], 2);
    const kiln_shape *xs = &b->values[x].desc.shape;
    const uint32_t r = xs->rank;
    if (r == 0 || xs->min[r - 1] != xs->max[r - 1] || kiln_bgraph_input(b, &b->nodes[pass], 0) != x)
        return KILN_OK;
    const int64_t d = xs->max[r - 1];
    const kiln_shape *hs = &b->values[b->nodes[head].output].desc.shape;
    const int64_t rd = hs->max[r - 1];
    kiln_attrs ca = kiln_bgraph_attrs(b, cn);
    if (!is_last_dim(kiln_attrs_int(&ca, KILN_A_CAT_DIM, 0), r) || rd < 2 || rd >= d ||
        rd % 2 != 0 || !is_half(b, head, x, d, 0, rd) || !is_half(b, pass, x, d, rd, d))
        return KILN_OK;
    for (int i = 0; i < 2; i++) { // tables over exactly the R rotated dims
        const kiln_shape *ts = &b->values[i ? sin : cos].desc.shape;
        if (ts->rank == 0 || ts->min[ts->rank - 1] != rd || ts->max[ts->rank - 1] != rd)
            return KILN_OK;
    }
    int32_t ins[3] = {x, cos, sin};
    kiln_attrs ra = kiln_bgraph_attrs(b, &b->nodes[rot]); // halves or pairs, as the rotary's
    return fuse_into(b, cat, KILN_OP_ROTARY, ins, 3, &ra, "partial rotary fusion", done);
}

static kiln_status rotary(kiln_bgraph *b, uint32_t add, int *done) {
    *done = 0;
    for (int order = 0; order < 2; order++) {
        int32_t a1 = kiln_bgraph_input(b, &b->nodes[add], (uint32_t)order);
        int32_t a2 = kiln_bgraph_input(b, &b->nodes[add], (uint32_t)(1 - order));
        int32_t ins[3];
        int inter = 0;
        if (a1 == a2 || !rotary_match(b, a1, a2, &ins[0], &ins[1], &ins[2], &inter)) continue;
        const int64_t iv = inter;
        kiln_attr_ref ref = {KILN_ATTR_INTS, 1, 0};
        kiln_attrs a = {&ref, 1, &iv, NULL};
        return fuse_into(b, add, KILN_OP_ROTARY, ins, 3, &a,
                         inter ? "interleaved rotary fusion" : "rotary fusion", done);
    }
    return KILN_OK;
}

// --- 3. L2 normalization, matched from its div

// The sum over the last dim (keepdim) of pow(x, 2) that produces v, or -1; *x = that x.
static int32_t sum_of_squares(const kiln_bgraph *b, int32_t v, int32_t *x) {
    double two = 0.0;
    int32_t sum = sole_producer(b, v, KILN_OP_SUM);
    if (sum < 0) return -1;
    int32_t pw = sole_producer(b, kiln_bgraph_input(b, &b->nodes[sum], 0), KILN_OP_POW);
    if (pw < 0 || !scalar_const(b, kiln_bgraph_input(b, &b->nodes[pw], 1), &two) || two != 2.0)
        return -1;
    *x = kiln_bgraph_input(b, &b->nodes[pw], 0);
    kiln_attrs sa = kiln_bgraph_attrs(b, &b->nodes[sum]);
    uint32_t nd = 0;
    const int64_t *dims = kiln_attrs_ints(&sa, KILN_A_REDUCE_DIMS, &nd);
    if (nd != 1 || !is_last_dim(dims[0], b->values[*x].desc.shape.rank) ||
        kiln_attrs_int(&sa, KILN_A_REDUCE_KEEPDIM, 0) != 1)
        return -1;
    return sum;
}

static kiln_status l2_normalize(kiln_bgraph *b, uint32_t div, int *done) {
    *done = 0;
    const int32_t x = kiln_bgraph_input(b, &b->nodes[div], 0);
    int32_t v = kiln_bgraph_input(b, &b->nodes[div], 1), n;
    double eps = 0.0, half = 0.0;
    if (x < 0 || v < 0 || x == v) return KILN_OK;
    if ((n = sole_producer(b, v, KILN_OP_EXPAND)) >= 0) v = kiln_bgraph_input(b, &b->nodes[n], 0);
    if ((n = sole_producer(b, v, KILN_OP_CLAMP)) >= 0) { // clamp_min(norm, eps)
        kiln_attrs ca = kiln_bgraph_attrs(b, &b->nodes[n]);
        const double lo = kiln_attrs_float(&ca, KILN_A_CLAMP_MIN, 0);
        const double hi = kiln_attrs_float(&ca, KILN_A_CLAMP_MAX, 0);
        if (!isfinite(lo) || lo < 0.0 || !(isnan(hi) || (isinf(hi) && hi > 0))) return KILN_OK;
        eps = lo;
        v = kiln_bgraph_input(b, &b->nodes[n], 0);
    }
    // a float16/bfloat16 x's norm computed in float32 (the export's decomposition of
    // linalg.vector_norm for a 16-bit model): x cast up, the norm, the norm cast back
    const int32_t down = sole_producer(b, v, KILN_OP_CAST);
    if (down >= 0) {
        v = kiln_bgraph_input(b, &b->nodes[down], 0);
        if (v < 0 || b->values[v].desc.dtype != KILN_DTYPE_F32 ||
            b->values[b->nodes[down].output].desc.dtype != b->values[x].desc.dtype)
            return KILN_OK;
    }
    if ((n = sole_producer(b, v, KILN_OP_SQRT)) < 0) { // the norm: sqrt, or pow(., 0.5)
        n = sole_producer(b, v, KILN_OP_POW);
        if (n < 0 || !scalar_const(b, kiln_bgraph_input(b, &b->nodes[n], 1), &half) || half != 0.5)
            return KILN_OK;
    }
    int32_t xs_ = -1, up;
    if (sum_of_squares(b, kiln_bgraph_input(b, &b->nodes[n], 0), &xs_) < 0) return KILN_OK;
    if (down >= 0 && (up = sole_producer(b, xs_, KILN_OP_CAST)) >= 0)
        xs_ = kiln_bgraph_input(b, &b->nodes[up], 0); // the up-cast: x's only other reader
    if (xs_ != x) return KILN_OK;
    const kiln_value_desc *xd = &b->values[x].desc;
    const uint32_t r = xd->shape.rank;
    if (!kiln_dtype_is_float((kiln_dtype)xd->dtype) ||
        xd->shape.min[r - 1] != xd->shape.max[r - 1] || xd->shape.max[r - 1] < 1 ||
        !kiln_shape_same(&b->values[b->nodes[div].output].desc.shape, &xd->shape))
        return KILN_OK;
    // x / max(|x|, eps) = x * rsqrt(mean(x^2) + eps^2 / D) / sqrt(D) wherever |x| > eps; a
    // squared eps that float32 cannot hold keeps the chain (a zero row would give NaN)
    const int64_t d = xd->shape.max[r - 1];
    double eps2 = eps * eps / (double)d;
    if (eps > 0.0 && eps2 < 1.1754943508222875e-38) return KILN_OK;
    kiln_shape ws;
    memset(&ws, 0, sizeof ws);
    ws.rank = 1;
    ws.min[0] = ws.max[0] = d;
    const size_t es = kiln_dtype_size((kiln_dtype)xd->dtype);
    void *wp;
    int32_t w;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)d * es, &wp));
    for (int64_t i = 0; i < d; i++)
        kiln_store_f32(wp, xd->dtype, i, (float)(1.0 / sqrt((double)d)));
    KILN_TRY(kiln_bgraph_add_const(b, xd->dtype, &ws, wp, (uint64_t)d * es, &w));
    int32_t ins[2] = {x, w};
    kiln_attr_ref ref = {KILN_ATTR_FLOATS, 1, 0};
    kiln_attrs a = {&ref, 1, NULL, &eps2};
    return fuse_into(b, div, KILN_OP_RMS_NORM, ins, 2, &a, "l2 normalize", done);
}

// --- 4. the 2-norm, matched from its root

// sqrt(sum(pow(x, 2) or x * x, dims, keepdim)) (torch.norm and linalg.vector_norm as the export
// decomposes them, e.g. ConvNeXt-V2's global response norm over H and W) is vector_norm(x): one
// pass over x instead of a square written out, its sum and the root. The root is sqrt or
// pow(., 0.5); the square and the sum are read only by the next step; every dtype is x's (a sum
// in another dtype keeps the chain). Runs after the L2 normalization above, which takes the
// last-dim norms under a division.
static kiln_status vector_norm(kiln_bgraph *b, uint32_t root, int *done) {
    *done = 0;
    const kiln_bnode *rn = &b->nodes[root];
    double half = 0.0;
    if (rn->op == KILN_OP_POW &&
        (!scalar_const(b, kiln_bgraph_input(b, rn, 1), &half) || half != 0.5))
        return KILN_OK;
    const int32_t sum = sole_producer(b, kiln_bgraph_input(b, rn, 0), KILN_OP_SUM);
    if (sum < 0) return KILN_OK;
    const int32_t sq_v = kiln_bgraph_input(b, &b->nodes[sum], 0);
    int32_t sq = sole_producer(b, sq_v, KILN_OP_POW), x = -1;
    double two = 0.0;
    if (sq >= 0) {
        if (!scalar_const(b, kiln_bgraph_input(b, &b->nodes[sq], 1), &two) || two != 2.0)
            return KILN_OK;
        x = kiln_bgraph_input(b, &b->nodes[sq], 0);
    } else if ((sq = sole_producer(b, sq_v, KILN_OP_MUL)) >= 0) {
        x = kiln_bgraph_input(b, &b->nodes[sq], 0);
        if (x != kiln_bgraph_input(b, &b->nodes[sq], 1)) return KILN_OK;
    }
    if (x < 0) return KILN_OK;
    const uint32_t dt = b->values[x].desc.dtype;
    if (!kiln_dtype_is_float((kiln_dtype)dt) || b->values[sq_v].desc.dtype != dt ||
        b->values[b->nodes[sum].output].desc.dtype != dt || b->values[rn->output].desc.dtype != dt)
        return KILN_OK;
    kiln_attrs sa = kiln_bgraph_attrs(b, &b->nodes[sum]);
    int32_t ins[1] = {x};
    return fuse_into(b, root, KILN_OP_VECTOR_NORM, ins, 1, &sa, "vector norm", done);
}

kiln_status kiln_pass_llm(kiln_bgraph *b) {
    uint32_t before =
        b->stats.n_rms_norm + b->stats.n_rotary + b->stats.n_l2_normalize + b->stats.n_vector_norm;
    uint32_t n_partial = 0;
    size_t n = b->n_nodes;
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_RSQRT) continue;
        KILN_TRY(rms_norm(b, (uint32_t)i, &done));
        b->stats.n_rms_norm += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_DIV || b->nodes[i].n_tail > 0 ||
            b->nodes[i].head >= 0)
            continue;
        KILN_TRY(l2_normalize(b, (uint32_t)i, &done));
        b->stats.n_l2_normalize += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        const uint32_t op = b->nodes[i].op;
        if (b->nodes[i].dead || (op != KILN_OP_SQRT && op != KILN_OP_POW) ||
            b->nodes[i].n_tail > 0 || b->nodes[i].head >= 0)
            continue;
        KILN_TRY(vector_norm(b, (uint32_t)i, &done));
        b->stats.n_vector_norm += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_ADD || b->nodes[i].n_tail > 0 ||
            b->nodes[i].head >= 0) {
            continue;
        }
        KILN_TRY(rotary(b, (uint32_t)i, &done));
        b->stats.n_rotary += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    // then the partial ones, around the rotaries just made (a rotary counted once)
    n = b->n_nodes;
    for (size_t i = 0; i < n; i++) {
        int done = 0;
        if (b->nodes[i].dead || b->nodes[i].op != KILN_OP_CAT || b->nodes[i].n_tail > 0 ||
            b->nodes[i].head >= 0)
            continue;
        KILN_TRY(partial_rotary(b, (uint32_t)i, &done));
        n_partial += (uint32_t)done;
        if (done) KILN_TRY(kiln_bgraph_count_uses(b));
    }
    // the fused nodes were appended after their readers: restore index = topological order
    if (b->stats.n_rms_norm + b->stats.n_rotary + b->stats.n_l2_normalize + b->stats.n_vector_norm +
            n_partial >
        before)
        KILN_TRY(kiln_bgraph_sort_nodes(b));
    return KILN_OK;
}
