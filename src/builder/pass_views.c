// SPDX-License-Identifier: Apache-2.0
// View simplification: every reshape, permute, squeeze and unsqueeze is a layer that copies its
// input (the plan has no aliases), and exported models chain them: a head split
// [B, L, H * E] -> [B, L, H, E] -> [B, H, L, E] at L = 1 (a decode step), the head merge after
// attention as reshape, reshape, permute, reshape, unsqueezes of one table in every layer. These
// rewrites leave the values the same:
//  1. a permute that moves only dims of static size 1 (the other dims keep their order), and
//     every squeeze and unsqueeze, is a reshape (the same bytes in the same order);
//  2. a reshape of a reshape reads the inner one's input (its shape codes rewritten to refer to
//     that input; the inner one dies when nothing else reads it);
//  3. a reshape whose output is its input (the same dims, dynamic ones copied from the same
//     position), a copy (clone), a cat of one tensor, a pad of nothing (every padding 0) and an
//     elementwise identity (x * 1, x / 1, x + 0, x - 0 with a constant that does not widen x:
//     a rotary embedding's default attention scaling of 1) are removed: their readers read the
//     input.
//  4. a linear over reshape(x, [M, K]) (x [.., K]: leading dims flattened) whose output is read
//     only by a reshape to x's leading dims and N is a linear over x itself: torch's export
//     spells a linear over a 3-d input as view -> addmm -> view, and with the views in between
//     no elementwise op after the linear (its activation, a residual add) could join it as a
//     tail. At most one leading dim of x may be dynamic (the result's ranges must then be the
//     reshape's).
//  5. an activation (relu, gelu, silu, sigmoid, tanh, hard-swish, hard-sigmoid, clamp) of a
//     reshape or permute that only it reads is the view of the activation of the view's input:
//     the activation then fuses as a tail of the layer before the views (squeeze-excite's
//     linear, reshape to [N, C, 1, 1], sigmoid; SegFormer's Mix-FFN: depthwise conv, flatten,
//     transpose, GELU).
//  6. an expand read only by broadcasting binary elementwise ops, each of which gives the same
//     output from the expand's input (its other operand has the expanded dims), is removed:
//     those ops read the input and broadcast it themselves (MobileViTv2's linear attention
//     multiplies by `context.expand_as(v)`; a materialized mask broadcast).
//  7. a chain of permutes and reshapes of static shapes, each link read only by the next, that
//     leaves every element where it was (a channels-first map flattened and transposed back to
//     the tokens it came from: SegFormer's reduced keys; an einsum's views of its operand) is a
//     reshape of its input, the chain taken from its farthest start that does. It runs between
//     2 and 3.
//  9. with 7, such a chain of three or more ending in a reshape that transposes the last two
//     dims of a view is permute(reshape(input), swap) (torch.einsum's k^T for a batched matmul,
//     the form eager attention reads).
// 10. with 7, such a chain from a tensor that is not a view, ending where the values are not
//     viewed again, that turns tokens into a channels-first map (its strides those of
//     permute(dense [N, H, W, C], (0, 3, 1, 2))) is reshape(input, [N, H, W, C]) then that
//     permute; one that turns a 4-d map [N, C, H, W] into any view of permute(map, (0, 2, 3, 1))
//     (`flatten(2).transpose(1, 2)`, SegFormer's and the ViTs' tokens from a conv) is that
//     permute then a reshape: the forms the CUDA backend runs as layout permutes (no copy when
//     the map is NHWC).
// 11. a cat over the last dim of S * S strided slices of one tensor x [.., H, W, C] (static
//     shape), each slice(slice(x, H's dim, a, step S), W's dim, b, step S) (either order) to
//     the end, with every offset pair (a, b) once in the order a + S * b or S * a + b (Swin's
//     patch merging: x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], ... concatenated; a
//     space-to-depth) is reshape(permute(reshape(x, [.., H/S, S, W/S, S, C]), ..), [.., H/S, W/S,
//     S * S * C]): one transpose instead of the slices (S + S * S after common-subexpression
//     elimination) and the cat. It runs after 7.
// 12. a last-dim op of a permute that keeps the last dim last, the permute read only by it,
//     runs before the permute: norm(permute(x, P)) is permute(norm(x), P) for rms_norm and a
//     layer_norm over the last dim, op(permute(x, P), c) for a binary elementwise op with a
//     constant c is permute(op(x, c'), P), c' the same bytes at P's inverse (when that keeps
//     the order of c's dims above 1), and so is a rotary embedding with constant cos and sin
//     tables, unless its output is written into a cache by index_copy or the permute moves
//     only dims of size 1 (Swin-V2's cosine attention: q and k normalized after the head
//     split, q scaled per head; the rotary of q and k after the head split in transformers'
//     Llama-family models at static shapes; the head split then feeds sdpa directly, which
//     backends read as a strided view instead of running the permute). It runs after 3, in
//     the pass's second run (after the attention, norm and rotary patterns, which match the
//     head split's first form).
// 13. in the second run, a chain of views, permutes, slices and index ops with constant indices
//     (each link read only by the next, static shapes) that keeps the last dim C whole and last,
//     with an index among its links and at least two links that copy, is one index over x's
//     rows: reshape(x, [T, C]), index(dim 0, a constant table of the T' source rows, computed
//     here by running the chain over row numbers), reshape to the chain's output (Swin's
//     shifted windows: torch.roll over H and W as two index ops and the window partition's
//     permute; the window reverse's permute and the roll back: one row gather each instead of
//     three copies).
// 14. in the second run, before 12, slices over the last dim of a permute that keeps the last
//     dim last, every reader of the permute such a slice: each slice reads the permute's input
//     and is permuted on its own (permute(x, P)[..., a:b] is permute(x[..., a:b], P)), when
//     each slice feeds attention through views once permuted: read only as sdpa's q, k or v,
//     or through one last-dim op that 12 then moves in front of its permute (a rotary with
//     constant tables, a norm over the last dim) read only so (GPT-NeoX's packed per-head
//     projection, viewed [B, L, H, 3E], transposed, then chunked into q, k and v: the permutes
//     then feed sdpa, which backends read as strided views, instead of one transpose of all).
// 15. in the second run, after 13, a chain of reshapes and permutes (static shapes, each link
//     read only by the next) with at least two permutes that copy, whose output's last dim C
//     (at least 8) is made of whole rows of its input viewed as [T, C], in order, and that no
//     sdpa reads, is one row gather as in 13 (the table computed by running the chain over
//     every element; MaxViT's move from window tokens through a channels-first map to grid
//     tokens: three transposes become one gather).
// 17. in the second run, after 15, a chain of reshapes and permutes (static shapes, each link
//     read only by the next) with at least two permutes that copy, ending where the values are
//     not viewed again and not read by sdpa, whose result up to its last permute is a
//     transpose of its input (that view's dims above 1, by stride, tile the input densely) is
//     reshape(input, those dims in stride order), one permute, reshape: one copy instead of
//     several (SegFormer's spatial
//     reduction over tokens, transposed to a map, split into patches and transposed again;
//     ConvNeXt's downsampling patchify after the permute to channels-first).
// 16. in the second run, before 7, an add, sub, mul or div of a permute of a linear's, matmul's
//     or convolution's output (directly or through the tails its fusion takes; the permute
//     read only there) and a constant (its dims above 1 in order after the inverse permute) or
//     a tensor of the permute's shape (written before the head) runs before the permute, over
//     the head's output and the inverse permute of that operand: ConvNeXt's layer scale and
//     residual add after the permute back to channels-first become the linear's tails (the
//     scale then folds into its weight, bn_fold's second run), x's inverse permute is the view
//     the CUDA layout already stores, and the permute back meets the next block's permute, which
//     7 merges.
//  8. a constant operand of a binary elementwise op (add, sub, mul, div) of a lower rank than the
//     op's 4-d output gets the output's rank (leading dims of 1: the same bytes, the same
//     broadcast), so that backends see ConvNeXt's per-channel layer scale [C, 1, 1] as the
//     [1, C, 1, 1] they take in either activation layout.
// Reshapes with a `like` input are left alone. A node whose output is a graph output or a
// state's update keeps a layer (rewrites 1 and 2 still apply to it): I/O lowering relies on
// those copies.
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/view.h"

static int is_static(const kiln_shape *s, uint32_t i) { return s->min[i] == s->max[i]; }

// A constant whose every element is `one` (1 or 0), of at most 4096 elements.
static int const_all(const kiln_bgraph *b, int32_t v, int one) {
    if (v < 0 || !kiln_bgraph_is_const(b, v) || b->values[v].data == NULL) return 0;
    const kiln_value_desc *d = &b->values[v].desc;
    int64_t n = 1;
    for (uint32_t i = 0; i < d->shape.rank; i++) n *= d->shape.max[i];
    if (n < 1 || n > 4096) return 0;
    for (int64_t i = 0; i < n; i++) {
        if (kiln_dtype_is_float((kiln_dtype)d->dtype)
                ? kiln_load_f32(b->values[v].data, d->dtype, i) != (float)one
                : kiln_load_i64(b->values[v].data, d->dtype, i) != one)
            return 0;
    }
    return 1;
}

// The operand x of n when n is x * 1, 1 * x, x / 1, x + 0, 0 + x or x - 0 (a constant of ones or
// zeros that does not widen x: the output is x's dtype and shape), else -1. Rotary embeddings'
// `cos * attention_scaling` with the default scaling of 1 multiplies so.
static int32_t identity_operand(const kiln_bgraph *b, const kiln_bnode *n) {
    if (n->n_inputs != 2 || n->head >= 0 || n->n_tail > 0) return -1;
    const int32_t x = kiln_bgraph_input(b, n, 0), y = kiln_bgraph_input(b, n, 1);
    if (x < 0 || y < 0) return -1;
    int32_t keep = -1;
    switch (n->op) {
    case KILN_OP_MUL: keep = const_all(b, y, 1) ? x : const_all(b, x, 1) ? y : -1; break;
    case KILN_OP_DIV: keep = const_all(b, y, 1) ? x : -1; break;
    case KILN_OP_ADD: keep = const_all(b, y, 0) ? x : const_all(b, x, 0) ? y : -1; break;
    case KILN_OP_SUB: keep = const_all(b, y, 0) ? x : -1; break;
    default: return -1;
    }
    if (keep < 0 || !kiln_desc_equal(&b->values[keep].desc, &b->values[n->output].desc)) return -1;
    return keep;
}

// A pad node whose every padding is 0.
static int zero_pad(const kiln_bgraph *b, const kiln_bnode *n) {
    if (n->op != KILN_OP_PAD) return 0;
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    uint32_t np = 0;
    const int64_t *p = kiln_attrs_ints(&a, KILN_A_PAD_PADS, &np);
    for (uint32_t i = 0; i < np; i++) {
        if (p[i] != 0) return 0;
    }
    return 1;
}

// Reshape codes for output y of a view whose output dim i is input x's dim src[i] (-1: a new
// size-1 dim): static dims literal, dynamic ones copied from x. 0 when a dynamic dim has no
// source of the same range.
static int codes_from_map(const kiln_shape *x, const kiln_shape *y, const int32_t *src,
                          int64_t *codes) {
    for (uint32_t i = 0; i < y->rank; i++) {
        if (is_static(y, i)) {
            codes[i] = y->max[i];
            continue;
        }
        const int32_t j = src[i];
        if (j < 0 || (uint32_t)j >= x->rank || x->min[j] != y->min[i] || x->max[j] != y->max[i])
            return 0;
        codes[i] = -(int64_t)j - 2;
    }
    return 1;
}

// Rewrite 1 for node n: the reshape codes that replace it, or 0.
static int view_as_reshape(const kiln_bgraph *b, const kiln_bnode *n, int64_t *codes) {
    const int32_t xv = kiln_bgraph_input(b, n, 0);
    if (xv < 0) return 0;
    const kiln_shape *x = &b->values[xv].desc.shape, *y = &b->values[n->output].desc.shape;
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int32_t src[KILN_MAX_RANK];
    uint32_t na = 0;
    if (y->rank > KILN_MAX_RANK || x->rank > KILN_MAX_RANK) return 0;
    if (n->op == KILN_OP_PERMUTE) {
        const int64_t *perm = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &na);
        if (na != x->rank || na != y->rank) return 0;
        int64_t last = -1;
        for (uint32_t i = 0; i < na; i++) {
            int64_t p = perm[i] < 0 ? perm[i] + (int64_t)na : perm[i];
            if (p < 0 || p >= (int64_t)na) return 0;
            src[i] = (int32_t)p;
            if (x->min[p] == 1 && x->max[p] == 1) continue; // a size-1 dim may move
            if (p < last) return 0;                         // a real transpose
            last = p;
        }
        return codes_from_map(x, y, src, codes);
    }
    if (n->op == KILN_OP_UNSQUEEZE) {
        if (y->rank != x->rank + 1) return 0;
        int64_t d = kiln_attrs_int(&a, KILN_A_UNSQUEEZE_DIM, 0);
        if (d < 0) d += (int64_t)y->rank;
        if (d < 0 || d >= (int64_t)y->rank) return 0;
        for (uint32_t i = 0, j = 0; i < y->rank; i++) src[i] = (int64_t)i == d ? -1 : (int32_t)j++;
        return codes_from_map(x, y, src, codes);
    }
    if (n->op == KILN_OP_SQUEEZE) {
        const int64_t *dims = kiln_attrs_ints(&a, KILN_A_SQUEEZE_DIMS, &na);
        uint8_t drop[KILN_MAX_RANK] = {0};
        for (uint32_t k = 0; k < na; k++) {
            int64_t d = dims[k] < 0 ? dims[k] + (int64_t)x->rank : dims[k];
            if (d < 0 || d >= (int64_t)x->rank) return 0;
            drop[d] = 1;
        }
        uint32_t i = 0;
        for (uint32_t j = 0; j < x->rank; j++) {
            if (drop[j]) continue;
            if (i >= y->rank) return 0;
            src[i++] = (int32_t)j;
        }
        if (i != y->rank) return 0;
        return codes_from_map(x, y, src, codes);
    }
    return 0;
}

static int plain_reshape(const kiln_bgraph *b, const kiln_bnode *n) {
    return n->op == KILN_OP_RESHAPE && !n->dead && kiln_bgraph_input(b, n, 1) < 0 && n->head < 0 &&
           n->n_tail == 0;
}

// A copy (clone) of one tensor, nothing fused: the same values in the same order.
static int plain_copy(const kiln_bgraph *b, const kiln_bnode *n) {
    return n->op == KILN_OP_COPY && !n->dead && n->n_inputs == 1 && n->head < 0 && n->n_tail == 0 &&
           kiln_desc_equal(&b->values[kiln_bgraph_input(b, n, 0)].desc, &b->values[n->output].desc);
}

// Rewrite 2: the codes of outer (a reshape of inner's output) in terms of inner's input, or 0.
static int compose(const kiln_bgraph *b, const kiln_bnode *outer, const kiln_bnode *inner,
                   int64_t *codes, uint32_t *n_codes) {
    kiln_attrs ao = kiln_bgraph_attrs(b, outer), ai = kiln_bgraph_attrs(b, inner);
    uint32_t no = 0, ni = 0;
    const int64_t *co = kiln_attrs_ints(&ao, KILN_A_RESHAPE_SHAPE, &no);
    const int64_t *ci = kiln_attrs_ints(&ai, KILN_A_RESHAPE_SHAPE, &ni);
    const kiln_shape *mid = &b->values[inner->output].desc.shape;
    if (no > KILN_MAX_RANK || ni != mid->rank) return 0;
    for (uint32_t i = 0; i < no; i++) {
        const int64_t c = co[i];
        if (c >= -1) {
            codes[i] = c;
            continue;
        }
        const int64_t j = -c - 2; // the inner output's dim j
        if (j >= (int64_t)mid->rank) return 0;
        if (is_static(mid, (uint32_t)j)) {
            codes[i] = mid->max[j];
        } else if (ci[j] <= -2) {
            codes[i] = ci[j]; // a dim of the inner input
        } else {
            return 0;
        }
    }
    *n_codes = no;
    return 1;
}

// Rewrite 3: reshape n gives its input unchanged.
static int identity_reshape(const kiln_bgraph *b, const kiln_bnode *n) {
    const int32_t xv = kiln_bgraph_input(b, n, 0);
    const kiln_value_desc *x = &b->values[xv].desc, *y = &b->values[n->output].desc;
    if (!kiln_desc_equal(x, y)) return 0;
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    uint32_t nc = 0, n_dyn = 0;
    const int64_t *c = kiln_attrs_ints(&a, KILN_A_RESHAPE_SHAPE, &nc);
    if (nc != y->shape.rank) return 0;
    for (uint32_t i = 0; i < nc; i++) n_dyn += !is_static(&y->shape, i);
    for (uint32_t i = 0; i < nc; i++) {
        if (is_static(&y->shape, i)) continue;
        if (c[i] == -(int64_t)i - 2) continue;
        if (c[i] == -1 && n_dyn == 1) continue; // the one dynamic dim, from the element count
        return 0;
    }
    return 1;
}

// Makes node k a reshape of x with the given codes, in place (its position among nodes of the
// same emission key stays: a node appended after them would sort after its readers). The codes
// go to the attribute pools through a scratch node, which dies.
static kiln_status make_reshape(kiln_bgraph *b, uint32_t k, int32_t x, const int64_t *codes,
                                uint32_t n_codes) {
    kiln_attr_ref ref = {KILN_ATTR_INTS, n_codes, 0};
    kiln_attrs a = {&ref, 1, codes, NULL};
    int32_t r;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &a, b->nodes[k].seq, &r));
    kiln_bnode *scratch = &b->nodes[b->values[r].index], *n = &b->nodes[k];
    kiln_value_desc want = b->values[n->output].desc;
    if (!kiln_desc_equal(&want, &b->values[r].desc)) {
        scratch->dead = 1;
        b->values[r].kind = KILN_BV_DEAD;
        return kiln_fail(KILN_ERR_INTERNAL, "view simplification changed the output of node %u", k);
    }
    b->attr_refs[n->attr_begin] = b->attr_refs[scratch->attr_begin];
    b->ids[n->input_begin] = x;
    n->op = KILN_OP_RESHAPE;
    scratch->dead = 1;
    b->values[r].kind = KILN_BV_DEAD;
    return KILN_OK;
}

// --- 7. permute/reshape chains that keep the element order

#define VIEW_CHAIN_MAX 8

// The view that nodes chain[s], chain[s - 1], .., chain[0] (a reshape or permute each, static
// shapes) make of the dense input of chain[s]: sz and st (its sizes and element strides) and
// *rank; 0 when a reshape in it would copy (the chain is not one view).
static int chain_view(const kiln_bgraph *b, const uint32_t *chain, int s, int64_t *sz, int64_t *st,
                      int *rank) {
    const int32_t x = kiln_bgraph_input(b, &b->nodes[chain[s]], 0);
    const kiln_shape *xs = &b->values[x].desc.shape;
    int r = (int)xs->rank;
    if (r > KILN_MAX_RANK) return 0;
    for (int i = r - 1; i >= 0; i--) {
        if (!is_static(xs, (uint32_t)i) || xs->max[i] <= 0) return 0;
        sz[i] = xs->max[i];
        st[i] = i == r - 1 ? 1 : st[i + 1] * sz[i + 1];
    }
    for (int c = s; c >= 0; c--) {
        const kiln_bnode *nd = &b->nodes[chain[c]];
        const kiln_shape *ys = &b->values[nd->output].desc.shape;
        int64_t nsz[KILN_MAX_RANK], nst[KILN_MAX_RANK];
        const int m = (int)ys->rank;
        for (int i = 0; i < m; i++) nsz[i] = ys->max[i];
        if (nd->op == KILN_OP_COPY) continue; // the same view
        if (nd->op == KILN_OP_PERMUTE) {
            kiln_attrs a = kiln_bgraph_attrs(b, nd);
            uint32_t np = 0;
            const int64_t *perm = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &np);
            if ((int)np != r || m != r) return 0;
            for (int i = 0; i < m; i++) {
                const int64_t p = perm[i] < 0 ? perm[i] + r : perm[i];
                if (p < 0 || p >= r || sz[p] != nsz[i]) return 0;
                nst[i] = st[p];
            }
        } else if (!kiln_view_strides(sz, st, r, nsz, m, nst)) {
            return 0;
        }
        memcpy(sz, nsz, sizeof(int64_t) * (size_t)m);
        memcpy(st, nst, sizeof(int64_t) * (size_t)m);
        r = m;
    }
    *rank = r;
    return 1;
}

// The strides st of sizes sz (rank r) are dense (size-1 dims' strides do not matter).
static int dense_strides(const int64_t *sz, const int64_t *st, int r) {
    int64_t dense = 1;
    for (int i = r - 1; i >= 0; i--) {
        if (sz[i] != 1 && st[i] != dense) return 0;
        dense *= sz[i];
    }
    return 1;
}

// The strides st of sizes sz (rank r >= 3) are those of a dense [.., sz[r - 1], sz[r - 2]] with
// its last two dims swapped.
static int swapped_strides(const int64_t *sz, const int64_t *st, int r) {
    if (r < 3 || sz[r - 1] == 1 || sz[r - 2] == 1 || st[r - 2] != 1 || st[r - 1] != sz[r - 2])
        return 0;
    int64_t dense = sz[r - 1] * sz[r - 2];
    for (int i = r - 3; i >= 0; i--) {
        if (sz[i] != 1 && st[i] != dense) return 0;
        dense *= sz[i];
    }
    return 1;
}

// Ops whose output is a view of their input's elements.
static int view_op(uint32_t op) {
    return op == KILN_OP_PERMUTE || op == KILN_OP_RESHAPE || op == KILN_OP_COPY ||
           op == KILN_OP_SELECT || op == KILN_OP_SLICE || op == KILN_OP_EXPAND ||
           op == KILN_OP_SQUEEZE || op == KILN_OP_UNSQUEEZE;
}

// The strides st of sizes sz [N, C, H, W] are those of permute(dense [N, H, W, C], (0, 3, 1, 2)).
static int nchw_of_nhwc(const int64_t *sz, const int64_t *st) {
    const int64_t want[4] = {sz[1] * sz[2] * sz[3], 1, sz[3] * sz[1], sz[1]};
    for (int i = 0; i < 4; i++) {
        if (sz[i] != 1 && st[i] != want[i]) return 0;
    }
    return 1;
}

// The two-node chain chain[1], chain[0] is already `first` then the other view, the permute
// being perm (4-d): the form rewrite 10 would make.
static int chain_is(const kiln_bgraph *b, const uint32_t *chain, uint32_t first,
                    const int64_t *perm) {
    const kiln_bnode *a = &b->nodes[chain[1]], *z = &b->nodes[chain[0]];
    const kiln_bnode *pn = first == KILN_OP_PERMUTE ? a : z;
    if (a->op != first || z->op == first || pn->op != KILN_OP_PERMUTE) return 0;
    kiln_attrs pa = kiln_bgraph_attrs(b, pn);
    uint32_t np = 0;
    const int64_t *d = kiln_attrs_ints(&pa, KILN_A_PERMUTE_DIMS, &np);
    if (np != 4) return 0;
    for (uint32_t i = 0; i < 4; i++) {
        if (d[i] != perm[i]) return 0;
    }
    return 1;
}

// Node k becomes reshape(x, codes) then permute(., perm) (reshape_first), or permute(x, perm)
// then reshape(., codes): *done = 2 (nodes appended, the caller sorts).
static kiln_status view_pair(kiln_bgraph *b, uint32_t k, int32_t x, int reshape_first,
                             const int64_t *codes, const int64_t *perm, uint32_t n_codes,
                             uint32_t n_perm, int *done) {
    kiln_attr_ref rref = {KILN_ATTR_INTS, n_codes, 0}, pref = {KILN_ATTR_INTS, n_perm, 0};
    kiln_attrs ra = {&rref, 1, codes, NULL}, pa = {&pref, 1, perm, NULL};
    const int64_t seq = b->nodes[k].seq;
    int32_t mid, y;
    KILN_TRY(kiln_bgraph_add_node(b, reshape_first ? KILN_OP_RESHAPE : KILN_OP_PERMUTE, &x, 1,
                                  reshape_first ? &ra : &pa, seq, &mid));
    KILN_TRY(kiln_bgraph_add_node(b, reshape_first ? KILN_OP_PERMUTE : KILN_OP_RESHAPE, &mid, 1,
                                  reshape_first ? &pa : &ra, seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[k].output].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        b->nodes[b->values[mid].index].dead = 1;
        return kiln_fail(KILN_ERR_INTERNAL, "view simplification changed node %u", k);
    }
    KILN_TRY(kiln_bgraph_replace_node(b, k, y, "view pair"));
    *done = 2;
    return KILN_OK;
}

// Node k (a reshape or permute) and the chain of plain reshapes, permutes and copies (an
// einsum's clone) behind it, each read only by the next and not an output, all of static shapes
// (rewrite 3, which removes the copies, runs later), tried from its farthest start
// to its nearest (at least two nodes, a permute among them):
//  - 7: when the chain keeps every element in place (the strides it ends with are the dense
//    strides of k's shape, as in x.reshape(B, H, W, C).permute(0, 3, 1, 2).reshape(B, C, H * W)
//    .permute(0, 2, 1), or an einsum's unsqueezes and permutes of v after the head split),
//    node k becomes a reshape of the chain's input;
//  - 9: else, when k is a reshape ending a chain of three or more that transposes the last two
//    dims of a view (torch.einsum's `B G H J D` operand k transposed for a batched matmul:
//    unsqueeze, permutes of size-1 and other dims, a reshape to [B G H, D, J]), it becomes
//    permute(reshape(input, [.., J, D]), swap): the form eager attention reads k^T in.
static kiln_status order_keeping_chain(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    uint32_t chain[VIEW_CHAIN_MAX];
    int n = 0, first_perm = -1;
    for (uint32_t at = k;;) {
        const kiln_bnode *nd = &b->nodes[at];
        if (nd->dead || nd->head >= 0 || nd->n_tail > 0) break;
        if (nd->op != KILN_OP_PERMUTE && !plain_reshape(b, nd) && !plain_copy(b, nd)) break;
        const kiln_shape *ys = &b->values[nd->output].desc.shape;
        int stat = ys->rank <= KILN_MAX_RANK;
        for (uint32_t i = 0; stat && i < ys->rank; i++) stat = is_static(ys, i) && ys->max[i] > 0;
        if (!stat) break;
        if (nd->op == KILN_OP_PERMUTE && first_perm < 0) first_perm = n;
        chain[n++] = at;
        if (n == VIEW_CHAIN_MAX) break;
        const int32_t x = kiln_bgraph_input(b, nd, 0);
        if (x < 0 || b->values[x].kind != KILN_IR_NODE || b->uses[x] != 1 || b->is_output[x]) break;
        at = b->values[x].index;
    }
    if (n < 2 || first_perm < 0) return KILN_OK;
    int64_t sz[KILN_MAX_RANK], st[KILN_MAX_RANK];
    int r = 0;
    // rewrites 9 and 10 only where the chain ends (k's result is not viewed again): a pair made
    // in the middle of a chain would hide the chain's own form from its end
    const int32_t ky = b->nodes[k].output;
    const int32_t kr = b->uses[ky] == 1 && !b->is_output[ky] ? b->user[ky] : -1;
    const int chain_end =
        kr < 0 || !(b->nodes[kr].op == KILN_OP_PERMUTE || plain_reshape(b, &b->nodes[kr]) ||
                    plain_copy(b, &b->nodes[kr]));
    const int swap_ok = chain_end && plain_reshape(b, &b->nodes[k]);
    for (int s = n - 1; s >= 1 && s >= first_perm; s--) {
        if (!chain_view(b, chain, s, sz, st, &r)) continue;
        const int32_t x = kiln_bgraph_input(b, &b->nodes[chain[s]], 0);
        int64_t codes[KILN_MAX_RANK];
        if (dense_strides(sz, st, r)) {
            memcpy(codes, sz, sizeof(int64_t) * (size_t)r);
            KILN_TRY(make_reshape(b, k, x, codes, (uint32_t)r));
            *done = 1;
            return KILN_OK;
        }
        if (swap_ok && s >= 2 && swapped_strides(sz, st, r)) { // 9
            memcpy(codes, sz, sizeof(int64_t) * (size_t)r);
            codes[r - 2] = sz[r - 1];
            codes[r - 1] = sz[r - 2];
            int64_t perm[KILN_MAX_RANK];
            for (int i = 0; i < r; i++) perm[i] = i;
            perm[r - 2] = r - 1;
            perm[r - 1] = r - 2;
            return view_pair(b, k, x, 1, codes, perm, (uint32_t)r, (uint32_t)r, done);
        }
        // 10: tokens [N, H W, C] to a channels-first map [N, C, H, W], and back
        static const int64_t to_nchw[4] = {0, 3, 1, 2}, to_nhwc[4] = {0, 2, 3, 1};
        // ... from a tensor that is not itself a view (a linear's tokens, a conv's map): a head
        // split [B, L, H, E] (a view or a select of a fused projection) transposed for attention
        // is not an image
        if (!chain_end ||
            (b->values[x].kind == KILN_IR_NODE && view_op(b->nodes[b->values[x].index].op)))
            continue;
        const int canon_to = s == 1 && chain_is(b, chain, KILN_OP_RESHAPE, to_nchw);
        if (r == 4 && !canon_to && nchw_of_nhwc(sz, st)) {
            const int64_t nhwc[4] = {sz[0], sz[2], sz[3], sz[1]};
            return view_pair(b, k, x, 1, nhwc, to_nchw, 4, 4, done);
        }
        const kiln_shape *xs = &b->values[x].desc.shape;
        const int canon_from = s == 1 && chain_is(b, chain, KILN_OP_PERMUTE, to_nhwc);
        if (xs->rank == 4 && !canon_from) {
            const int64_t n_ = xs->max[0], c_ = xs->max[1], h_ = xs->max[2], w_ = xs->max[3];
            const int64_t psz[4] = {n_, h_, w_, c_}, pst[4] = {c_ * h_ * w_, w_, 1, h_ * w_};
            int64_t vst[KILN_MAX_RANK];
            int same = kiln_view_strides(psz, pst, 4, sz, r, vst);
            for (int i = 0; same && i < r; i++) same = sz[i] == 1 || vst[i] == st[i];
            if (same) {
                memcpy(codes, sz, sizeof(int64_t) * (size_t)r);
                return view_pair(b, k, x, 0, codes, to_nhwc, (uint32_t)r, 4, done);
            }
        }
    }
    return KILN_OK;
}

// A constant bias of n features (shape [n], dtype dt) for a linear without one, or -1.
static int32_t bias_of(const kiln_bgraph *b, uint32_t add, int32_t y, int64_t n, uint32_t dt) {
    const kiln_bnode *a = &b->nodes[add];
    int32_t a0 = kiln_bgraph_input(b, a, 0), a1 = kiln_bgraph_input(b, a, 1);
    int32_t c = a0 == y ? a1 : a0;
    if ((a0 == y) == (a1 == y) || !kiln_bgraph_is_const(b, c)) return -1;
    const kiln_value_desc *d = &b->values[c].desc;
    if (d->dtype != dt || d->shape.rank != 1 || d->shape.max[0] != n || d->shape.min[0] != n)
        return -1;
    return c;
}

// Rewrite 4: a reshape r2 of linear(reshape(x)) (or of add(linear(reshape(x)), bias) with the
// linear biasless and the bias a constant [N]: an addmm) as linear(x); *done when rewritten.
static kiln_status linear_through(kiln_bgraph *b, uint32_t r2, int *done) {
    *done = 0;
    int32_t lv = kiln_bgraph_input(b, &b->nodes[r2], 0), bias = -1;
    const size_t first_new = b->n_nodes;
    uint32_t dead[2], n_dead = 0;
    if (b->values[lv].kind != KILN_IR_NODE || b->uses[lv] != 1 || b->is_output[lv]) return KILN_OK;
    uint32_t li = b->values[lv].index;
    const kiln_bnode *l = &b->nodes[li];
    if (l->dead || l->head >= 0 || l->n_tail > 0) return KILN_OK;
    if (l->op == KILN_OP_ADD) { // the add of an addmm: find its linear
        const kiln_value_desc *yd = &b->values[lv].desc;
        dead[n_dead++] = li;
        for (uint32_t i = 0; i < 2 && bias < 0; i++) {
            int32_t v = kiln_bgraph_input(b, l, i);
            if (v < 0 || b->values[v].kind != KILN_IR_NODE || b->uses[v] != 1 || b->is_output[v])
                continue;
            const kiln_bnode *m = &b->nodes[b->values[v].index];
            if (m->dead || m->op != KILN_OP_LINEAR || m->head >= 0 || m->n_tail > 0 ||
                kiln_bgraph_input(b, m, 2) >= 0 || yd->shape.rank != 2) {
                continue;
            }
            bias = bias_of(b, li, v, yd->shape.max[1], yd->dtype);
            if (bias >= 0) lv = v;
        }
        if (bias < 0) return KILN_OK;
        li = b->values[lv].index;
        l = &b->nodes[li];
    }
    if (l->op != KILN_OP_LINEAR) return KILN_OK;
    dead[n_dead++] = li;
    const int32_t r1v = kiln_bgraph_input(b, l, 0);
    if (r1v < 0 || b->values[r1v].kind != KILN_IR_NODE) return KILN_OK;
    const kiln_bnode *r1 = &b->nodes[b->values[r1v].index];
    if (!plain_reshape(b, r1)) return KILN_OK;
    int32_t x = kiln_bgraph_input(b, r1, 0);
    const kiln_shape *xs = &b->values[x].desc.shape, *ms = &b->values[r1v].desc.shape;
    const kiln_shape *os = &b->values[b->nodes[r2].output].desc.shape;
    if (ms->rank != 2 || !is_static(ms, 1) || os->rank < 2) return KILN_OK;
    if (xs->rank < 2 || !is_static(xs, xs->rank - 1) || xs->max[xs->rank - 1] != ms->max[1]) {
        // x is not [.., K] (a head merge [B, L, H, E] -> [B * L, H * E]): when the result's
        // shape is static and keeps the linear's N last, the linear reads x reshaped to the
        // result's leading dims and K
        int64_t c[KILN_MAX_RANK];
        if (os->max[os->rank - 1] != b->values[lv].desc.shape.max[1]) return KILN_OK;
        for (uint32_t i = 0; i < os->rank; i++) {
            if (!is_static(os, i)) return KILN_OK;
            c[i] = i + 1 < os->rank ? os->max[i] : ms->max[1];
        }
        kiln_attr_ref ref = {KILN_ATTR_INTS, os->rank, 0};
        kiln_attrs ra = {&ref, 1, c, NULL};
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &ra, b->nodes[r2].seq, &x));
        l = &b->nodes[li];
        xs = &b->values[x].desc.shape;
    }
    uint32_t n_dyn = 0;
    for (uint32_t i = 0; i + 1 < xs->rank; i++) n_dyn += !is_static(xs, i);
    if (n_dyn > 1) return KILN_OK;
    int32_t ins[3] = {x, kiln_bgraph_input(b, l, 1), bias >= 0 ? bias : kiln_bgraph_input(b, l, 2)};
    uint32_t n_ins = ins[2] >= 0 ? 3 : 2;
    kiln_attrs a = kiln_bgraph_attrs(b, l);
    int32_t y;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_LINEAR, ins, n_ins, &a, b->nodes[r2].seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[r2].output].desc)) {
        for (size_t k = first_new; k < b->n_nodes; k++) {
            b->nodes[k].dead = 1; // left as it was
            b->values[b->nodes[k].output].kind = KILN_BV_DEAD;
        }
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, r2, y, "linear over its input's leading dims"));
    for (uint32_t i = 0; i < n_dead; i++) b->nodes[dead[i]].dead = 1; // read only by r2's chain
    *done = 1;
    return KILN_OK;
}

// The activations rewrite 5 moves in front of a reshape (elementwise, one input, the dtype kept).
static int movable_unary(uint32_t op) {
    switch (op) {
    case KILN_OP_RELU:
    case KILN_OP_GELU:
    case KILN_OP_SILU:
    case KILN_OP_SIGMOID:
    case KILN_OP_TANH:
    case KILN_OP_HARDSWISH:
    case KILN_OP_HARDSIGMOID:
    case KILN_OP_CLAMP: return 1;
    default: return 0;
    }
}

// Rewrite 5: node k, an activation of a reshape or permute (node ri) that only it reads, as the
// view of the activation of the view's input, in place: node ri becomes the activation (its
// output value takes the input's shape) and node k the view, each taking the other's op and
// attributes (the attribute slots follow the op's schema), so the node order stays topological.
// *done when rewritten.
static void unary_before_reshape(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    kiln_bnode *n = &b->nodes[k];
    if (n->dead || n->head >= 0 || n->n_tail > 0 || !movable_unary(n->op) || n->n_inputs != 1)
        return;
    const int32_t rv = kiln_bgraph_input(b, n, 0);
    if (rv < 0 || b->values[rv].kind != KILN_IR_NODE || b->uses[rv] != 1 || b->is_output[rv])
        return;
    kiln_bnode *r = &b->nodes[b->values[rv].index];
    const int permute = r->op == KILN_OP_PERMUTE && !r->dead && r->head < 0 && r->n_tail == 0;
    if (!plain_reshape(b, r) && !permute) return;
    const int32_t x = kiln_bgraph_input(b, r, 0);
    if (b->values[x].desc.dtype != b->values[n->output].desc.dtype) return;
    const uint32_t act = n->op, act_attrs = n->attr_begin, view = r->op;
    n->op = view;
    n->attr_begin = r->attr_begin;
    r->op = act;
    r->attr_begin = act_attrs;
    b->values[rv].desc = b->values[x].desc;
    *done = 1;
}

// Rewrite 6 for node k: *done when the expand was removed.
static kiln_status expand_into_readers(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const kiln_bnode *e = &b->nodes[k];
    if (e->dead || e->op != KILN_OP_EXPAND || e->head >= 0 || e->n_tail > 0 ||
        b->is_output[e->output])
        return KILN_OK;
    const int32_t ev = e->output, x = kiln_bgraph_input(b, e, 0);
    if (x < 0 || b->values[x].desc.dtype != b->values[ev].desc.dtype || b->uses[ev] == 0)
        return KILN_OK;
    for (int pass = 0; pass < 2; pass++) { // 0: every reader qualifies; 1: rewrite them
        for (size_t r = 0; r < b->n_nodes; r++) {
            kiln_bnode *n = &b->nodes[r];
            if (n->dead || r == k) continue;
            int32_t *in = b->ids + n->input_begin;
            int slot = -1, reads = 0;
            for (uint32_t j = 0; j < n->n_inputs; j++) {
                if (in[j] == ev) {
                    slot = (int)j;
                    reads++;
                }
            }
            if (reads == 0) continue;
            if (pass == 1) {
                in[slot] = x;
                continue;
            }
            kiln_op_info info;
            if (reads != 1 || n->head >= 0 || n->n_tail > 0 ||
                kiln_op_get_info(n->op, &info) != KILN_OK || !(info.flags & KILN_OPF_BINARY))
                return KILN_OK;
            kiln_value_desc d;
            in[slot] = x;
            kiln_status st = kiln_bgraph_infer(b, (uint32_t)r, &d);
            in[slot] = ev;
            if (st != KILN_OK) {
                kiln_clear_error();
                return KILN_OK;
            }
            if (!kiln_desc_equal(&d, &b->values[n->output].desc)) return KILN_OK;
        }
    }
    b->nodes[k].dead = 1;
    *done = 1;
    return KILN_OK;
}

// 8: node k (add, sub, mul or div) reads a constant of a lower rank than its output: it reads the
// same data as a constant of the output's rank instead.
static kiln_status rank_align_const(kiln_bgraph *b, uint32_t k) {
    const kiln_bnode *n = &b->nodes[k];
    if (n->dead || n->n_inputs != 2 ||
        (n->op != KILN_OP_ADD && n->op != KILN_OP_SUB && n->op != KILN_OP_MUL &&
         n->op != KILN_OP_DIV))
        return KILN_OK;
    // (4-d outputs: the activation layouts of convolutional maps are what it is for)
    const uint32_t r = b->values[n->output].desc.shape.rank;
    if (r != 4) return KILN_OK;
    for (uint32_t i = 0; i < 2; i++) {
        const int32_t c = kiln_bgraph_input(b, &b->nodes[k], i);
        if (!kiln_bgraph_is_const(b, c) || b->values[c].data == NULL) continue;
        const kiln_value_desc d = b->values[c].desc;
        if (d.shape.rank == 0 || d.shape.rank >= r) continue;
        kiln_shape s;
        memset(&s, 0, sizeof s);
        s.rank = r;
        const uint32_t pad = r - d.shape.rank;
        for (uint32_t j = 0; j < r; j++) {
            s.min[j] = j < pad ? 1 : d.shape.min[j - pad];
            s.max[j] = j < pad ? 1 : d.shape.max[j - pad];
        }
        int32_t nc, ins[2];
        KILN_TRY(
            kiln_bgraph_add_const(b, d.dtype, &s, b->values[c].data, b->values[c].nbytes, &nc));
        b->values[nc].name = b->values[c].name; // the same weight
        ins[0] = kiln_bgraph_input(b, &b->nodes[k], 0);
        ins[1] = kiln_bgraph_input(b, &b->nodes[k], 1);
        ins[i] = nc;
        KILN_TRY(kiln_bgraph_set_inputs(b, k, ins, 2));
        b->stats.n_views++;
    }
    return KILN_OK;
}

// --- 11. strided slices concatenated over the channels: a space-to-depth

// The slice node producing v with its dim (made non-negative), start and step, when it runs to
// the end of that dim with a positive step; -1 otherwise.
static int32_t slice_of(const kiln_bgraph *b, int32_t v, int64_t *dim, int64_t *start,
                        int64_t *step) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE || b->is_output[v]) return -1;
    const uint32_t k = b->values[v].index;
    const kiln_bnode *n = &b->nodes[k];
    if (n->dead || n->op != KILN_OP_SLICE || n->head >= 0 || n->n_tail > 0) return -1;
    const int32_t x = kiln_bgraph_input(b, n, 0);
    if (x < 0) return -1;
    const kiln_shape *xs = &b->values[x].desc.shape;
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int64_t d = kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0);
    if (d < 0) d += xs->rank;
    if (d < 0 || d >= (int64_t)xs->rank || !is_static(xs, (uint32_t)d)) return -1;
    int64_t st = kiln_attrs_int(&a, KILN_A_SLICE_START, 0);
    const int64_t end = kiln_attrs_int(&a, KILN_A_SLICE_END, 0);
    const int64_t size = xs->max[d], stp = kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0);
    if (st < 0) st += size;
    if (st < 0 || st >= size || end < size || stp < 1) return -1;
    *dim = d;
    *start = st;
    *step = stp;
    return (int32_t)k;
}

// Rewrite 11 for node k (a cat): *done = 2 when it became the space-to-depth views.
static kiln_status space_to_depth(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const kiln_bnode *c = &b->nodes[k];
    if (c->dead || c->op != KILN_OP_CAT || c->head >= 0 || c->n_tail > 0 || c->n_inputs < 4 ||
        c->n_inputs > 64)
        return KILN_OK;
    const kiln_shape *ys = &b->values[c->output].desc.shape;
    const uint32_t r = ys->rank;
    kiln_attrs ca = kiln_bgraph_attrs(b, c);
    int64_t cd = kiln_attrs_int(&ca, KILN_A_CAT_DIM, 0);
    if (cd < 0) cd += r;
    if (r < 3 || r + 2 > KILN_MAX_RANK || cd != (int64_t)r - 1) return KILN_OK;
    int32_t x = -1;
    int64_t S = 0, order = -1; // order 0: i = a + S b; 1: i = S a + b
    for (uint32_t i = 0; i < c->n_inputs; i++) {
        int64_t d0 = 0, a0 = 0, s0 = 0, d1 = 0, a1 = 0, s1 = 0;
        const int32_t outer = slice_of(b, kiln_bgraph_input(b, c, i), &d0, &a0, &s0);
        if (outer < 0) return KILN_OK;
        const int32_t inner = slice_of(b, kiln_bgraph_input(b, &b->nodes[outer], 0), &d1, &a1, &s1);
        if (inner < 0 || s0 != s1 || d0 == d1 || s0 < 2) return KILN_OK;
        const int32_t xi = kiln_bgraph_input(b, &b->nodes[inner], 0);
        if ((x >= 0 && xi != x) || (S > 0 && s0 != S)) return KILN_OK;
        x = xi;
        S = s0;
        const int64_t h = (int64_t)r - 3, w = (int64_t)r - 2; // x's H and W dims
        const int64_t ah = d0 == h ? a0 : a1, aw = d0 == w ? a0 : a1;
        if (!((d0 == h && d1 == w) || (d0 == w && d1 == h))) return KILN_OK;
        if ((int64_t)c->n_inputs != S * S) return KILN_OK;
        const int64_t want0 = ah + S * aw, want1 = S * ah + aw;
        if (order < 0 && want0 == (int64_t)i && want1 != (int64_t)i) order = 0;
        if (order < 0 && want1 == (int64_t)i && want0 != (int64_t)i) order = 1;
        if ((order == 0 && want0 != (int64_t)i) || (order == 1 && want1 != (int64_t)i) ||
            (order < 0 && want0 != (int64_t)i))
            return KILN_OK;
    }
    const kiln_shape *xs = &b->values[x].desc.shape;
    if (order < 0 || xs->rank != r) return KILN_OK;
    for (uint32_t d = 0; d < r; d++) {
        if (!is_static(xs, d)) return KILN_OK;
    }
    const int64_t H = xs->max[r - 3], W = xs->max[r - 2], C = xs->max[r - 1];
    if (H % S != 0 || W % S != 0 || b->values[c->output].desc.dtype != b->values[x].desc.dtype)
        return KILN_OK;
    // [.., H/S, S(a), W/S, S(b), C] -> [.., H/S, W/S, S(b), S(a), C] (order 0) or
    // [.., H/S, W/S, S(a), S(b), C] (order 1) -> [.., H/S, W/S, S * S * C]
    int64_t split[KILN_MAX_RANK], perm[KILN_MAX_RANK], out[KILN_MAX_RANK];
    const uint32_t lead = r - 3;
    for (uint32_t d = 0; d < lead; d++) split[d] = xs->max[d], perm[d] = d, out[d] = xs->max[d];
    split[lead] = H / S, split[lead + 1] = S, split[lead + 2] = W / S, split[lead + 3] = S;
    split[lead + 4] = C;
    perm[lead] = lead, perm[lead + 1] = lead + 2;
    perm[lead + 2] = order == 0 ? lead + 3 : lead + 1;
    perm[lead + 3] = order == 0 ? lead + 1 : lead + 3;
    perm[lead + 4] = lead + 4;
    out[lead] = H / S, out[lead + 1] = W / S, out[lead + 2] = S * S * C;
    kiln_attr_ref sref = {KILN_ATTR_INTS, r + 2, 0}, pref = {KILN_ATTR_INTS, r + 2, 0},
                  oref = {KILN_ATTR_INTS, r, 0};
    kiln_attrs sa = {&sref, 1, split, NULL}, pa = {&pref, 1, perm, NULL},
               oa = {&oref, 1, out, NULL};
    const int64_t seq = b->nodes[k].seq;
    int32_t v1, v2, y;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &sa, seq, &v1));
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_PERMUTE, &v1, 1, &pa, seq, &v2));
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &v2, 1, &oa, seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[k].output].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        b->nodes[b->values[v2].index].dead = 1;
        b->nodes[b->values[v1].index].dead = 1;
        return kiln_fail(KILN_ERR_INTERNAL, "view simplification changed node %u", k);
    }
    KILN_TRY(kiln_bgraph_replace_node(b, k, y, "space to depth"));
    *done = 2;
    return KILN_OK;
}

// --- 12. last-dim ops in front of a permute that keeps the last dim

// The permute node writing v (read only by its one reader, not an output) when it keeps the last
// dim last; its dims in perm. -1 otherwise.
static int32_t last_keeping_permute(const kiln_bgraph *b, int32_t v, int64_t *perm, uint32_t *n) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE || b->uses[v] != 1 || b->is_output[v]) return -1;
    const uint32_t k = b->values[v].index;
    const kiln_bnode *pn = &b->nodes[k];
    if (pn->dead || pn->op != KILN_OP_PERMUTE || pn->head >= 0 || pn->n_tail > 0) return -1;
    kiln_attrs a = kiln_bgraph_attrs(b, pn);
    const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, n);
    const uint32_t r = b->values[v].desc.shape.rank;
    if (d == NULL || *n != r || r < 2 || r > KILN_MAX_RANK) return -1;
    for (uint32_t i = 0; i < r; i++) perm[i] = d[i] < 0 ? d[i] + r : d[i];
    return perm[r - 1] == (int64_t)r - 1 ? (int32_t)k : -1;
}

// c's static dims aligned to rank r (leading 1s) in al, when moving them to P's inverse keeps
// the order of those above 1 (the same bytes); 0 otherwise.
static int const_keeps_order(const kiln_value_desc *d, const int64_t *perm, uint32_t r,
                             int64_t *al) {
    int64_t last_big = -1;
    if (d->shape.rank > r) return 0;
    for (uint32_t i = 0; i < r; i++) {
        const int32_t j = (int32_t)i - (int32_t)(r - d->shape.rank);
        al[i] = j < 0 ? 1 : d->shape.max[j];
        if (j >= 0 && d->shape.min[j] != d->shape.max[j]) return 0;
        if (al[i] > 1) {
            if (perm[i] < last_big) return 0; // two dims above 1 would swap
            last_big = perm[i];
        }
    }
    return 1;
}

// A constant of the shape c' for rewrite 12 (c's bytes, its dims aligned to rank r and moved
// to P's inverse), or -1 when that would reorder c's dims above 1 (the bytes would move).
static kiln_status inverse_permuted_const(kiln_bgraph *b, int32_t c, const int64_t *perm,
                                          uint32_t r, int32_t *out) {
    *out = -1;
    const kiln_value_desc d = b->values[c].desc; // a copy: adding a value may move them
    int64_t al[KILN_MAX_RANK];
    if (!const_keeps_order(&d, perm, r, al)) return KILN_OK;
    kiln_shape s;
    memset(&s, 0, sizeof s);
    s.rank = r;
    for (uint32_t i = 0; i < r; i++) s.min[(size_t)perm[i]] = s.max[(size_t)perm[i]] = al[i];
    return kiln_bgraph_add_const(b, d.dtype, &s, b->values[c].data, b->values[c].nbytes, out);
}

// Whether value v is read by a live node of op `op`.
static int read_by(const kiln_bgraph *b, int32_t v, uint32_t op) {
    for (size_t k = 0; k < b->n_nodes; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (n->dead || n->op != op) continue;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            if (kiln_bgraph_input(b, n, i) == v) return 1;
        }
    }
    return 0;
}

// Whether value v is read by an index_copy (a cache write: the CUDA backend runs a rotary
// feeding one inside the q rotary's launch, cuda_fold.h, which needs the rotary's output there).
static int read_by_index_copy(const kiln_bgraph *b, int32_t v) {
    return read_by(b, v, KILN_OP_INDEX_COPY);
}

// Whether permute perm of x only moves dims of size 1 (a view: the bytes keep their order).
static int permute_is_view(const kiln_shape *xs, const int64_t *perm, uint32_t r) {
    int64_t last = -1;
    for (uint32_t i = 0; i < r; i++) {
        if (xs->max[perm[i]] == 1) continue;
        if (perm[i] < last) return 0;
        last = perm[i];
    }
    return 1;
}

// Rewrite 12 for node k: *done when it became the permute (of the op, now in the permute's
// node, over the permute's input).
static kiln_status op_before_permute(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const kiln_bnode *n = &b->nodes[k];
    if (n->dead || n->head >= 0 || n->n_tail > 0 || n->n_inputs < 1) return KILN_OK;
    int64_t perm[KILN_MAX_RANK];
    uint32_t np = 0, slot = 0;
    int32_t ins[3] = {-1, -1, -1};
    if (n->op == KILN_OP_RMS_NORM || n->op == KILN_OP_LAYER_NORM) {
        if (n->op == KILN_OP_LAYER_NORM) {
            kiln_attrs a = kiln_bgraph_attrs(b, n);
            if (kiln_attrs_int(&a, KILN_A_LN_NDIM, 0) != 1) return KILN_OK;
        }
        if (n->n_inputs > 3) return KILN_OK;
        for (uint32_t i = 0; i < n->n_inputs; i++) ins[i] = kiln_bgraph_input(b, n, i);
    } else if (n->op == KILN_OP_ADD || n->op == KILN_OP_SUB || n->op == KILN_OP_MUL ||
               n->op == KILN_OP_DIV) {
        if (n->n_inputs != 2) return KILN_OK;
        ins[0] = kiln_bgraph_input(b, n, 0);
        ins[1] = kiln_bgraph_input(b, n, 1);
        slot = kiln_bgraph_is_const(b, ins[0]) ? 1 : 0;
        if (!kiln_bgraph_is_const(b, ins[1 - slot]) || b->values[ins[1 - slot]].data == NULL)
            return KILN_OK;
    } else if (n->op == KILN_OP_ROTARY) {
        if (n->n_inputs != 3) return KILN_OK;
        for (uint32_t i = 0; i < 3; i++) ins[i] = kiln_bgraph_input(b, n, i);
        for (uint32_t i = 1; i < 3; i++) {
            if (!kiln_bgraph_is_const(b, ins[i]) || b->values[ins[i]].data == NULL) return KILN_OK;
        }
        if (read_by_index_copy(b, n->output)) return KILN_OK;
    } else {
        return KILN_OK;
    }
    const int32_t pk = last_keeping_permute(b, ins[slot], perm, &np);
    if (pk < 0) return KILN_OK;
    const int32_t x = kiln_bgraph_input(b, &b->nodes[pk], 0);
    const uint32_t r = np;
    if (x < 0 || !kiln_shape_same(&b->values[b->nodes[k].output].desc.shape,
                                  &b->values[ins[slot]].desc.shape))
        return KILN_OK;
    if (n->op == KILN_OP_ROTARY) {
        // a permute of size-1 dims is already no copy (a decode step's head split); otherwise
        // the tables move to x's dim order and the permute, read by sdpa, becomes a view there
        if (permute_is_view(&b->values[x].desc.shape, perm, r) ||
            !kiln_shape_same(&b->values[ins[1]].desc.shape, &b->values[ins[2]].desc.shape))
            return KILN_OK;
        int32_t c2[2]; // cos and sin of one shape: both move or neither
        for (uint32_t i = 0; i < 2; i++) {
            KILN_TRY(inverse_permuted_const(b, ins[1 + i], perm, r, &c2[i]));
            if (c2[i] < 0) return KILN_OK;
        }
        ins[1] = c2[0];
        ins[2] = c2[1];
    } else if (n->op != KILN_OP_RMS_NORM && n->op != KILN_OP_LAYER_NORM) {
        int32_t c2;
        KILN_TRY(inverse_permuted_const(b, ins[1 - slot], perm, r, &c2));
        if (c2 < 0) return KILN_OK;
        ins[1 - slot] = c2;
    }
    ins[slot] = x;
    // in place, as rewrite 5 does (the node order stays topological): node pk becomes the op
    // over x, writing pk's value at x's shape, and node k the permute of it, writing k's value
    kiln_bnode *on = &b->nodes[k], *pn = &b->nodes[pk];
    const uint32_t op = on->op, op_attrs = on->attr_begin, n_in = on->n_inputs;
    const int32_t pv = pn->output;
    const kiln_value_desc want = b->values[on->output].desc, pv_desc = b->values[pv].desc;
    on->op = KILN_OP_PERMUTE;
    on->attr_begin = pn->attr_begin;
    pn->op = op;
    pn->attr_begin = op_attrs;
    KILN_TRY(kiln_bgraph_set_inputs(b, (uint32_t)pk, ins, n_in));
    KILN_TRY(kiln_bgraph_set_inputs(b, k, &pv, 1));
    kiln_value_desc d0, d1;
    kiln_status st = kiln_bgraph_infer(b, (uint32_t)pk, &d0);
    if (st == KILN_OK) {
        b->values[pv].desc = d0;
        st = kiln_bgraph_infer(b, k, &d1);
    }
    if (st != KILN_OK || !kiln_desc_equal(&d1, &want)) {
        b->values[pv].desc = pv_desc;
        return kiln_fail(KILN_ERR_INTERNAL, "view simplification changed node %u", k);
    }
    *done = 1;
    return KILN_OK;
}

// The linear, matmul or convolution node writing value v, directly or through elementwise tail
// ops (each its input's only reader) that its fusion would take; -1 when there is none.
static int32_t head_of(const kiln_bgraph *b, int32_t v) {
    for (int depth = 0; depth < KILN_MAX_TAIL + 1; depth++) {
        if (v < 0 || b->values[v].kind != KILN_IR_NODE) return -1;
        const uint32_t k = b->values[v].index;
        const kiln_bnode *n = &b->nodes[k];
        const kiln_op_def *d = kiln_op_def_get(n->op);
        if (n->dead || d == NULL || n->head >= 0 || n->n_tail > 0) return -1;
        if (d->flags & KILN_OPF_FUSE_HEAD) return (int32_t)k;
        if (!(d->flags & KILN_OPF_TAIL)) return -1;
        int32_t next = -1;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            const int32_t in = kiln_bgraph_input(b, n, i);
            if (in >= 0 && kiln_bgraph_only_reader(b, in) == (int32_t)k &&
                kiln_desc_equal(&b->values[in].desc, &b->values[n->output].desc)) {
                next = in;
            }
        }
        v = next;
    }
    return -1;
}

// Rewrite 16 for node k (the second run): add, sub, mul or div of a permute of a head's output
// (the permute read only here) and a constant (its dims above 1 in the same order after the
// inverse permute: the same bytes) or a tensor of the permute's shape, as the permute of the op
// over the head's output and the inverse permute of the other operand. The op then fuses as the
// head's tail: a channels-last block's residual add after its permute back (ConvNeXt's
// `linear -> permute(0, 3, 1, 2) -> + x`, the layer scale before it) becomes the linear's
// epilogue, and the inverse permute of x is a view wherever x is stored channels-last (the CUDA
// layout). *done (2: nodes appended) when rewritten.
static kiln_status binary_before_head_permute(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const kiln_bnode *n = &b->nodes[k];
    if (n->dead || n->head >= 0 || n->n_tail > 0 || n->n_inputs != 2 ||
        (n->op != KILN_OP_ADD && n->op != KILN_OP_SUB && n->op != KILN_OP_MUL &&
         n->op != KILN_OP_DIV) ||
        !kiln_dtype_is_float((kiln_dtype)b->values[n->output].desc.dtype))
        return KILN_OK;
    int32_t ins[2] = {kiln_bgraph_input(b, n, 0), kiln_bgraph_input(b, n, 1)};
    uint32_t slot = 2;
    for (uint32_t i = 0; i < 2 && slot == 2; i++) {
        const int32_t v = ins[i];
        if (v < 0 || b->values[v].kind != KILN_IR_NODE || b->uses[v] != 1 || b->is_output[v])
            continue;
        const kiln_bnode *pn = &b->nodes[b->values[v].index];
        if (pn->dead || pn->op != KILN_OP_PERMUTE || pn->head >= 0 || pn->n_tail > 0) continue;
        if (kiln_desc_equal(&b->values[v].desc, &b->values[n->output].desc)) slot = i;
    }
    if (slot == 2) return KILN_OK; // (add(v, v) reads v twice: no slot)
    const uint32_t pk = b->values[ins[slot]].index;
    const int32_t x = kiln_bgraph_input(b, &b->nodes[pk], 0), other = ins[1 - slot];
    const int32_t head = head_of(b, x);
    if (head < 0) return KILN_OK;
    kiln_attrs pa = kiln_bgraph_attrs(b, &b->nodes[pk]);
    uint32_t r = 0;
    const int64_t *d = kiln_attrs_ints(&pa, KILN_A_PERMUTE_DIMS, &r);
    if (d == NULL || r != b->values[ins[slot]].desc.shape.rank || r < 2 || r > KILN_MAX_RANK)
        return KILN_OK;
    int64_t perm[KILN_MAX_RANK], inv[KILN_MAX_RANK];
    for (uint32_t i = 0; i < r; i++) perm[i] = d[i] < 0 ? d[i] + r : d[i];
    for (uint32_t i = 0; i < r; i++) inv[perm[i]] = i;
    if (perm[r - 1] == (int64_t)r - 1) return KILN_OK; // rewrite 12's (constants only)
    int32_t o2 = -1;
    const int64_t seq_k = n->seq;
    const uint32_t op = n->op;
    kiln_attr_ref ref = {KILN_ATTR_INTS, r, 0};
    kiln_attrs ia = {&ref, 1, inv, NULL}, fa = {&ref, 1, perm, NULL};
    if (kiln_bgraph_is_const(b, other)) {
        if (b->values[other].data == NULL) return KILN_OK;
        KILN_TRY(inverse_permuted_const(b, other, perm, r, &o2));
        if (o2 < 0) return KILN_OK;
    } else if (kiln_desc_equal(&b->values[other].desc, &b->values[ins[slot]].desc)) {
        // the fused group runs at its head: the permuted operand must be written before it, so
        // it is emitted right after the operand's producer (an input's: before every node)
        const uint32_t kind = b->values[other].kind;
        if (kind != KILN_IR_NODE && kind != KILN_IR_INPUT) return KILN_OK;
        const int64_t seq_o =
            kind == KILN_IR_NODE ? b->nodes[b->values[other].index].seq : KILN_SEQ_NODE - 1;
        if (seq_o >= b->nodes[head].seq) return KILN_OK;
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_PERMUTE, &other, 1, &ia, seq_o, &o2));
    } else {
        return KILN_OK;
    }
    int32_t ops[2], y, z;
    ops[slot] = x;
    ops[1 - slot] = o2;
    KILN_TRY(kiln_bgraph_add_node(b, op, ops, 2, NULL, seq_k, &y));
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_PERMUTE, &y, 1, &fa, seq_k, &z));
    KILN_TRY(kiln_bgraph_replace_node(b, k, z, "binary op before a permute"));
    b->nodes[pk].dead = 1; // the old permute: no longer read
    b->values[b->nodes[pk].output].kind = KILN_BV_DEAD;
    *done = 2;
    return KILN_OK;
}

// --- 14. slices of the last dim in front of a permute that keeps it

// Whether value v is read only as the q, k or v of sdpa nodes (at least one; not an output).
static int read_only_by_sdpa(const kiln_bgraph *b, int32_t v) {
    uint32_t seen = 0;
    if (b->uses[v] == 0 || b->is_output[v]) return 0;
    for (size_t k = 0; k < b->n_nodes; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (n->dead) continue;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            if (kiln_bgraph_input(b, n, i) != v) continue;
            if (n->op != KILN_OP_SDPA || i >= 3 || n->head >= 0) return 0;
            seen++;
        }
    }
    return seen == b->uses[v];
}

// The one live node reading value v (read once, not an output), or -1.
static int32_t sole_reader(const kiln_bgraph *b, int32_t v) {
    if (b->uses[v] != 1 || b->is_output[v]) return -1;
    for (size_t k = 0; k < b->n_nodes; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (n->dead) continue;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            if (kiln_bgraph_input(b, n, i) == v) return (int32_t)k;
        }
    }
    return -1;
}

// Whether slice output s, once permuted by perm (rank r) on its own, feeds attention through
// views: read only by sdpa, or by one last-dim op that rewrite 12 then moves in front of the
// permute (a norm over the last dim; a rotary with constant tables of one shape whose dims keep
// their order under the move) read only by sdpa.
static int slice_feeds_sdpa(const kiln_bgraph *b, int32_t s, const int64_t *perm, uint32_t r) {
    if (read_only_by_sdpa(b, s)) return 1;
    const int32_t k = sole_reader(b, s);
    if (k < 0) return 0;
    const kiln_bnode *n = &b->nodes[k];
    if (n->head >= 0 || n->n_tail > 0 || kiln_bgraph_input(b, n, 0) != s) return 0;
    if (n->op == KILN_OP_LAYER_NORM) {
        kiln_attrs a = kiln_bgraph_attrs(b, n);
        if (kiln_attrs_int(&a, KILN_A_LN_NDIM, 0) != 1) return 0;
    } else if (n->op == KILN_OP_ROTARY) {
        int64_t al[KILN_MAX_RANK];
        for (uint32_t i = 1; i < 3; i++) {
            const int32_t c = kiln_bgraph_input(b, n, i);
            if (!kiln_bgraph_is_const(b, c) || b->values[c].data == NULL ||
                !const_keeps_order(&b->values[c].desc, perm, r, al))
                return 0;
        }
        if (!kiln_shape_same(&b->values[kiln_bgraph_input(b, n, 1)].desc.shape,
                             &b->values[kiln_bgraph_input(b, n, 2)].desc.shape) ||
            read_by_index_copy(b, n->output))
            return 0;
    } else if (n->op != KILN_OP_RMS_NORM) {
        return 0;
    }
    return read_only_by_sdpa(b, n->output);
}

// Rewrite 14 for permute node pk: each slice reading it becomes permute(slice(x)). *done when
// it did (nodes appended: the caller sorts).
static kiln_status slices_before_permute(kiln_bgraph *b, uint32_t pk, int *done) {
    enum { MAX_SLICES = 8 };
    int32_t sl[MAX_SLICES];
    uint32_t ns = 0, np = 0;
    int64_t perm[KILN_MAX_RANK];
    *done = 0;
    const kiln_bnode *pn = &b->nodes[pk];
    if (pn->dead || pn->op != KILN_OP_PERMUTE || pn->head >= 0 || pn->n_tail > 0) return KILN_OK;
    const int32_t v = pn->output, x = kiln_bgraph_input(b, pn, 0);
    if (x < 0 || b->uses[v] < 1 || b->uses[v] > MAX_SLICES || b->is_output[v]) return KILN_OK;
    kiln_attrs pa = kiln_bgraph_attrs(b, pn);
    const int64_t *d = kiln_attrs_ints(&pa, KILN_A_PERMUTE_DIMS, &np);
    const uint32_t r = b->values[v].desc.shape.rank;
    if (d == NULL || np != r || r < 2 || r > KILN_MAX_RANK) return KILN_OK;
    for (uint32_t i = 0; i < r; i++) perm[i] = d[i] < 0 ? d[i] + r : d[i];
    if (perm[r - 1] != (int64_t)r - 1 || permute_is_view(&b->values[x].desc.shape, perm, r))
        return KILN_OK;
    for (size_t k = 0; k < b->n_nodes; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (n->dead) continue;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            if (kiln_bgraph_input(b, n, i) != v) continue;
            if (n->op != KILN_OP_SLICE || i != 0 || n->head >= 0 || n->n_tail > 0 ||
                ns == MAX_SLICES)
                return KILN_OK;
            kiln_attrs a = kiln_bgraph_attrs(b, n);
            const int64_t dim = kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0);
            if ((dim < 0 ? dim + r : dim) != (int64_t)r - 1 ||
                !slice_feeds_sdpa(b, n->output, perm, r))
                return KILN_OK;
            sl[ns++] = (int32_t)k;
        }
    }
    if (ns != b->uses[v]) return KILN_OK;
    kiln_battrs_copy pc, sc;
    if (!kiln_bgraph_copy_attrs(b, pn, &pc)) return KILN_OK;
    for (uint32_t j = 0; j < ns; j++) {
        int32_t sv, out;
        if (!kiln_bgraph_copy_attrs(b, &b->nodes[sl[j]], &sc)) return KILN_OK;
        const int64_t seq = b->nodes[sl[j]].seq;
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_SLICE, &x, 1, &sc.a, seq, &sv));
        KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_PERMUTE, &sv, 1, &pc.a, seq, &out));
        KILN_TRY(kiln_bgraph_replace_node(b, (uint32_t)sl[j], out, "slice before permute"));
    }
    *done = 1; // the permute is left unread (dead-code elimination)
    return KILN_OK;
}

// --- 13. row-gather chains

#define GATHER_CHAIN_MAX 16
#define GATHER_MAX_ROWS ((int64_t)1 << 22)

// Whether node n is a link of rewrite 13: its input and output static, both with the last dim
// of size c, and the op keeping that dim whole and last. *copies: whether it runs a kernel.
static int gather_link(const kiln_bgraph *b, const kiln_bnode *n, int64_t c, int *copies) {
    if (n->dead || n->head >= 0 || n->n_tail > 0 || n->n_inputs < 1) return 0;
    const int32_t x = kiln_bgraph_input(b, n, 0);
    if (x < 0 || b->values[x].desc.dtype != b->values[n->output].desc.dtype) return 0;
    const kiln_shape *xs = &b->values[x].desc.shape, *ys = &b->values[n->output].desc.shape;
    if (xs->rank < 2 || ys->rank < 2 || xs->max[xs->rank - 1] != c || ys->max[ys->rank - 1] != c)
        return 0;
    for (uint32_t i = 0; i < xs->rank; i++) {
        if (!is_static(xs, i)) return 0;
    }
    for (uint32_t i = 0; i < ys->rank; i++) {
        if (!is_static(ys, i)) return 0;
    }
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int64_t dim;
    *copies = 1;
    switch (n->op) {
    case KILN_OP_RESHAPE: *copies = 0; return plain_reshape(b, n);
    case KILN_OP_PERMUTE: {
        uint32_t np = 0;
        const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &np);
        if (d == NULL || np != xs->rank) return 0;
        return d[np - 1] == (int64_t)np - 1 || d[np - 1] == -1;
    }
    case KILN_OP_SLICE: // a step of 1 may be an alias (a contiguous slice): not counted
        dim = kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0);
        if (dim < 0) dim += xs->rank;
        *copies = kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0) > 1;
        return dim >= 0 && dim < (int64_t)xs->rank - 1 &&
               kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0) >= 1;
    case KILN_OP_INDEX: {
        if (n->n_inputs != 2) return 0;
        const int32_t iv = kiln_bgraph_input(b, n, 1);
        dim = kiln_attrs_int(&a, KILN_A_INDEX_DIM, 0);
        if (dim < 0) dim += xs->rank;
        if (iv < 0 || !kiln_bgraph_is_const(b, iv) || b->values[iv].data == NULL ||
            b->values[iv].desc.shape.rank != 1 || dim < 0 || dim >= (int64_t)xs->rank - 1)
            return 0;
        const uint32_t dt = b->values[iv].desc.dtype;
        return dt == KILN_DTYPE_I32 || dt == KILN_DTYPE_I64;
    }
    default: return 0;
    }
}

// dst = src (leading shape sh, rank r) with dim d's positions taken from sel[0 .. m); sh[d]
// becomes m.
static void take_dim(const int64_t *src, int64_t *sh, uint32_t r, uint32_t d, const int64_t *sel,
                     int64_t m, int64_t *dst) {
    int64_t outer = 1, inner = 1;
    for (uint32_t i = 0; i < d; i++) outer *= sh[i];
    for (uint32_t i = d + 1; i < r; i++) inner *= sh[i];
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < m; j++) {
            memcpy(dst + (o * m + j) * inner, src + (o * sh[d] + sel[j]) * inner,
                   (size_t)inner * sizeof *dst);
        }
    }
    sh[d] = m;
}

// dst = src (leading shape sh, rank r) permuted by p (p[i]: the source dim of output dim i).
static void permute_rows(const int64_t *src, int64_t *sh, uint32_t r, const int64_t *p,
                         int64_t *dst) {
    int64_t st[KILN_MAX_RANK], osh[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0}, n = 1;
    for (uint32_t i = r; i-- > 0;) st[i] = n, n *= sh[i];
    for (uint32_t i = 0; i < r; i++) osh[i] = sh[p[i]];
    for (int64_t o = 0; o < n; o++) {
        int64_t s = 0;
        for (uint32_t i = 0; i < r; i++) s += idx[i] * st[p[i]];
        dst[o] = src[s];
        for (uint32_t i = r; i-- > 0;) {
            if (++idx[i] < osh[i]) break;
            idx[i] = 0;
        }
    }
    memcpy(sh, osh, r * sizeof *sh);
}

// Runs link n over the row numbers in *cur (leading shape sh, rank *r; the other buffer is
// scratch, swapped in). 0 when an index is out of range.
static int run_link(const kiln_bgraph *b, const kiln_bnode *n, int64_t **cur, int64_t **tmp,
                    int64_t *sh, uint32_t *r, int64_t *sel) {
    const kiln_shape *ys = &b->values[n->output].desc.shape;
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    int64_t *t;
    if (n->op == KILN_OP_RESHAPE) {
        *r = ys->rank - 1;
        for (uint32_t i = 0; i < *r; i++) sh[i] = ys->max[i];
        return 1;
    }
    if (n->op == KILN_OP_PERMUTE) {
        uint32_t np = 0;
        const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &np);
        int64_t p[KILN_MAX_RANK];
        for (uint32_t i = 0; i < *r; i++) p[i] = d[i] < 0 ? d[i] + np : d[i];
        for (uint32_t i = 0; i < *r; i++) {
            if (p[i] < 0 || p[i] >= (int64_t)*r) return 0;
        }
        permute_rows(*cur, sh, *r, p, *tmp);
    } else {
        const int slice = n->op == KILN_OP_SLICE;
        int64_t d = kiln_attrs_int(&a, slice ? KILN_A_SLICE_DIM : KILN_A_INDEX_DIM, 0);
        if (d < 0) d += *r + 1;
        const int64_t size = sh[d];
        int64_t m = 0;
        if (slice) {
            int64_t st = kiln_attrs_int(&a, KILN_A_SLICE_START, 0);
            int64_t en = kiln_attrs_int(&a, KILN_A_SLICE_END, 0);
            const int64_t step = kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0);
            if (st < 0) st = st + size < 0 ? 0 : st + size;
            if (en < 0) en = en + size < 0 ? 0 : en + size;
            if (st > size) st = size;
            if (en > size) en = size;
            for (int64_t i = st; i < en; i += step) sel[m++] = i;
        } else {
            const int32_t iv = kiln_bgraph_input(b, n, 1);
            const int wrap = kiln_attrs_int(&a, KILN_A_INDEX_WRAP, 0) != 0;
            m = b->values[iv].desc.shape.max[0];
            for (int64_t i = 0; i < m; i++) {
                int64_t v = kiln_load_i64(b->values[iv].data, b->values[iv].desc.dtype, i);
                if (v < 0 && wrap) v += size;
                if (v < 0 || v >= size) return 0;
                sel[i] = v;
            }
        }
        if (m != ys->max[d]) return 0;
        take_dim(*cur, sh, *r, (uint32_t)d, sel, m, *tmp);
    }
    t = *cur, *cur = *tmp, *tmp = t;
    return 1;
}

// Node k's output as one row gather of x: reshape(x, [rows, c]), index(dim 0, table), reshape to
// k's output (table[o] = the source row of output row o, out_rows of them). *done = 2 when k
// became it.
static kiln_status emit_row_gather(kiln_bgraph *b, uint32_t k, int32_t x, int64_t rows, int64_t c,
                                   const int64_t *table, int64_t out_rows, int *done) {
    kiln_status st = KILN_OK;
    const uint32_t dt = rows <= INT32_MAX ? KILN_DTYPE_I32 : KILN_DTYPE_I64;
    const size_t es = dt == KILN_DTYPE_I32 ? 4 : 8;
    void *tp;
    int32_t tv, v1, v2, y;
    kiln_shape ts;
    memset(&ts, 0, sizeof ts);
    ts.rank = 1;
    ts.min[0] = ts.max[0] = out_rows;
    st = kiln_bgraph_blob(b, (size_t)out_rows * es, &tp);
    if (st == KILN_OK) {
        for (int64_t i = 0; i < out_rows; i++) {
            if (dt == KILN_DTYPE_I32)
                ((int32_t *)tp)[i] = (int32_t)table[i];
            else
                ((int64_t *)tp)[i] = table[i];
        }
        st = kiln_bgraph_add_const(b, dt, &ts, tp, (uint64_t)out_rows * es, &tv);
    }
    int64_t two[2] = {rows, c}, outs[KILN_MAX_RANK];
    const uint32_t yr = b->values[b->nodes[k].output].desc.shape.rank;
    for (uint32_t i = 0; i < yr; i++) outs[i] = b->values[b->nodes[k].output].desc.shape.max[i];
    kiln_attr_ref rref = {KILN_ATTR_INTS, 2, 0}, oref = {KILN_ATTR_INTS, yr, 0};
    kiln_attr_ref iref[2] = {{KILN_ATTR_INTS, 1, 0}, {KILN_ATTR_INTS, 1, 1}};
    int64_t iattr[2] = {0, 0};
    kiln_attrs ra = {&rref, 1, two, NULL}, oa = {&oref, 1, outs, NULL}, ia = {iref, 2, iattr, NULL};
    const int64_t seq = b->nodes[k].seq;
    if (st == KILN_OK) st = kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &ra, seq, &v1);
    int32_t gi[2] = {v1, tv};
    if (st == KILN_OK) st = kiln_bgraph_add_node(b, KILN_OP_INDEX, gi, 2, &ia, seq, &v2);
    if (st == KILN_OK) st = kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &v2, 1, &oa, seq, &y);
    if (st == KILN_OK) {
        if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[k].output].desc)) {
            b->nodes[b->values[y].index].dead = 1;
            b->nodes[b->values[v2].index].dead = 1;
            b->nodes[b->values[v1].index].dead = 1;
            st = kiln_fail(KILN_ERR_INTERNAL, "view simplification changed node %u", k);
        } else {
            st = kiln_bgraph_replace_node(b, k, y, "row gather");
            if (st == KILN_OK) *done = 2;
        }
    }
    return st;
}

// Rewrite 13 for node k, the last link of a chain: *done = 2 when it became the row gather.
static kiln_status row_gather(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const kiln_bnode *n = &b->nodes[k];
    if (n->dead || n->n_inputs < 1) return KILN_OK;
    const kiln_shape *ys = &b->values[n->output].desc.shape;
    if (ys->rank < 2) return KILN_OK;
    const int64_t c = ys->max[ys->rank - 1];
    int copies = 0, cp = 0, indexes = 0;
    if (!gather_link(b, n, c, &cp)) return KILN_OK;
    // the chain's end: its output is not read by one more link alone
    const int32_t out = n->output;
    if (!b->is_output[out] && b->uses[out] == 1 && b->user[out] >= 0) {
        int cq = 0;
        if (gather_link(b, &b->nodes[b->user[out]], c, &cq)) return KILN_OK;
    }
    uint32_t chain[GATHER_CHAIN_MAX], len = 0;
    int32_t x = -1;
    for (uint32_t at = k; len < GATHER_CHAIN_MAX;) {
        chain[len++] = at;
        copies += cp;
        indexes += b->nodes[at].op == KILN_OP_INDEX;
        x = kiln_bgraph_input(b, &b->nodes[at], 0);
        if (b->values[x].kind != KILN_IR_NODE || b->uses[x] != 1 || b->is_output[x]) break;
        const uint32_t prev = b->values[x].index;
        if (!gather_link(b, &b->nodes[prev], c, &cp)) break;
        at = prev;
    }
    // an index among them: a permute alone may be one a backend reads as a view (a head split
    // before sdpa), so a chain of views and permutes stays as it is
    if (copies < 2 || indexes == 0) return KILN_OK;
    const kiln_shape xs = b->values[x].desc.shape;
    int64_t rows = 1, sh[KILN_MAX_RANK];
    uint32_t r = xs.rank - 1;
    for (uint32_t i = 0; i < r; i++) sh[i] = xs.max[i], rows *= xs.max[i];
    int64_t out_rows = 1;
    for (uint32_t i = 0; i + 1 < ys->rank; i++) out_rows *= ys->max[i];
    int64_t most = rows;
    for (uint32_t i = 0; i < len; i++) {
        const kiln_shape *s = &b->values[b->nodes[chain[i]].output].desc.shape;
        int64_t m = 1;
        for (uint32_t j = 0; j + 1 < s->rank; j++) m *= s->max[j];
        if (m > most) most = m;
        for (uint32_t j = 0; j < s->rank; j++) {
            if (s->max[j] > most) most = s->max[j];
        }
    }
    if (most > GATHER_MAX_ROWS) return KILN_OK;
    const size_t nb = (size_t)most * sizeof(int64_t);
    int64_t *bufa = kiln_malloc(nb, KILN_ALIGN), *bufb = kiln_malloc(nb, KILN_ALIGN),
            *sel = kiln_malloc(nb, KILN_ALIGN);
    kiln_status st = KILN_OK;
    int ok = bufa != NULL && bufb != NULL && sel != NULL;
    if (!ok) st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory in view simplification");
    int64_t *cur = bufa, *tmp = bufb;
    for (int64_t i = 0; ok && i < rows; i++) cur[i] = i;
    for (uint32_t i = len; ok && i-- > 0;)
        ok = run_link(b, &b->nodes[chain[i]], &cur, &tmp, sh, &r, sel);
    if (ok) {
        int64_t m = 1;
        for (uint32_t i = 0; i < r; i++) m *= sh[i];
        ok = m == out_rows;
    }
    if (ok) st = emit_row_gather(b, k, x, rows, c, cur, out_rows, done);
    kiln_free(bufa, nb);
    kiln_free(bufb, nb);
    kiln_free(sel, nb);
    return st;
}

// --- 15. reshape and permute chains that move whole rows

#define MOVE_MAX_ELEMS ((int64_t)1 << 22)

// Whether node n is a link of rewrite 15: a plain reshape or a permute, its input and output
// static and of one dtype. *copies: a permute that moves bytes.
static int move_link(const kiln_bgraph *b, const kiln_bnode *n, int *copies) {
    if (n->dead || n->head >= 0 || n->n_tail > 0 || n->n_inputs < 1) return 0;
    const int32_t x = kiln_bgraph_input(b, n, 0);
    if (x < 0 || b->values[x].desc.dtype != b->values[n->output].desc.dtype) return 0;
    const kiln_shape *xs = &b->values[x].desc.shape, *ys = &b->values[n->output].desc.shape;
    for (uint32_t i = 0; i < xs->rank; i++) {
        if (!is_static(xs, i)) return 0;
    }
    for (uint32_t i = 0; i < ys->rank; i++) {
        if (!is_static(ys, i)) return 0;
    }
    *copies = 0;
    if (n->op == KILN_OP_RESHAPE) return plain_reshape(b, n);
    if (n->op != KILN_OP_PERMUTE) return 0;
    kiln_attrs a = kiln_bgraph_attrs(b, n);
    uint32_t np = 0;
    const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &np);
    int64_t perm[KILN_MAX_RANK];
    if (d == NULL || np != xs->rank || np > KILN_MAX_RANK) return 0;
    for (uint32_t i = 0; i < np; i++) {
        perm[i] = d[i] < 0 ? d[i] + np : d[i];
        if (perm[i] < 0 || perm[i] >= (int64_t)np) return 0;
    }
    *copies = !permute_is_view(xs, perm, np);
    return 1;
}

// The chain of links (move_link) that node k ends, nearest first, into chain[0 .. *len) (at most
// max) and its input into *x; returns the links among them that copy, or -1 when k is not a
// chain's end: not a link, its output read by one more link alone, or read by an sdpa (which
// backends may read through the permutes as views).
static int move_chain(const kiln_bgraph *b, uint32_t k, uint32_t *chain, uint32_t max,
                      uint32_t *len, int32_t *x) {
    int cp = 0, copies = 0;
    const kiln_bnode *n = &b->nodes[k];
    if (!move_link(b, n, &cp)) return -1;
    const int32_t out = n->output;
    if (!b->is_output[out] && b->uses[out] == 1 && b->user[out] >= 0) {
        int cq = 0;
        if (move_link(b, &b->nodes[b->user[out]], &cq)) return -1;
    }
    if (read_by(b, out, KILN_OP_SDPA)) return -1;
    *len = 0;
    for (uint32_t at = k; *len < max;) {
        chain[(*len)++] = at;
        copies += cp;
        *x = kiln_bgraph_input(b, &b->nodes[at], 0);
        if (b->values[*x].kind != KILN_IR_NODE || b->uses[*x] != 1 || b->is_output[*x]) break;
        const uint32_t prev = b->values[*x].index;
        if (!move_link(b, &b->nodes[prev], &cp)) break;
        at = prev;
    }
    return copies;
}

// Rewrite 15 for node k, the last link of a chain: *done = 2 when it became the row gather.
static kiln_status move_gather(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const kiln_shape ys = b->values[b->nodes[k].output].desc.shape;
    if (ys.rank < 2 || ys.max[ys.rank - 1] < 8) return KILN_OK;
    const int64_t c = ys.max[ys.rank - 1];
    uint32_t chain[GATHER_CHAIN_MAX], len = 0;
    int32_t x = -1;
    if (move_chain(b, k, chain, GATHER_CHAIN_MAX, &len, &x) < 2) return KILN_OK;
    const kiln_shape xs = b->values[x].desc.shape;
    int64_t numel = 1, sh[KILN_MAX_RANK];
    uint32_t r = xs.rank;
    for (uint32_t i = 0; i < r; i++) sh[i] = xs.max[i], numel *= xs.max[i];
    if (numel > MOVE_MAX_ELEMS || numel % c != 0) return KILN_OK;
    const size_t nb = (size_t)(numel > 0 ? numel : 1) * sizeof(int64_t);
    int64_t *bufa = kiln_malloc(nb, KILN_ALIGN), *bufb = kiln_malloc(nb, KILN_ALIGN);
    kiln_status st = KILN_OK;
    int ok = bufa != NULL && bufb != NULL;
    if (!ok) st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory in view simplification");
    int64_t *cur = bufa, *tmp = bufb;
    for (int64_t i = 0; ok && i < numel; i++) cur[i] = i;
    // every element's source, link by link (a reshape keeps the order: only the shape changes)
    for (uint32_t i = len; ok && i-- > 0;) {
        const kiln_bnode *l = &b->nodes[chain[i]];
        const kiln_shape *ls = &b->values[l->output].desc.shape;
        if (l->op == KILN_OP_PERMUTE) {
            kiln_attrs a = kiln_bgraph_attrs(b, l);
            uint32_t np = 0;
            const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &np);
            int64_t p[KILN_MAX_RANK];
            for (uint32_t j = 0; j < np; j++) p[j] = d[j] < 0 ? d[j] + np : d[j];
            permute_rows(cur, sh, r, p, tmp);
            int64_t *t = cur;
            cur = tmp, tmp = t;
        }
        r = ls->rank;
        for (uint32_t j = 0; j < r; j++) sh[j] = ls->max[j];
    }
    // whole rows of c elements, in order, from rows of x viewed as [numel / c, c]
    const int64_t out_rows = numel / c;
    for (int64_t o = 0; ok && o < out_rows; o++) {
        const int64_t base = cur[o * c];
        ok = base % c == 0;
        for (int64_t j = 1; ok && j < c; j++) ok = cur[o * c + j] == base + j;
        tmp[o] = base / c;
    }
    if (ok) st = emit_row_gather(b, k, x, out_rows, c, tmp, out_rows, done);
    kiln_free(bufa, nb);
    kiln_free(bufb, nb);
    return st;
}

// Rewrite 17 for node k, the last link of a chain: *done = 2 when the chain became reshape,
// permute, reshape.
static kiln_status one_transpose(kiln_bgraph *b, uint32_t k, int *done) {
    *done = 0;
    const int32_t out = b->nodes[k].output;
    uint32_t chain[VIEW_CHAIN_MAX], ulen = 0;
    int32_t x = -1;
    const int copies = move_chain(b, k, chain, VIEW_CHAIN_MAX, &ulen, &x);
    const int len = (int)ulen;
    // the view up to the last permute (the reshapes after it reshape its result, which the
    // new permute writes densely)
    int last = 0;
    while (last < len && b->nodes[chain[last]].op != KILN_OP_PERMUTE) last++;
    int64_t sz[KILN_MAX_RANK], st[KILN_MAX_RANK];
    int r = 0;
    if (copies < 2 || last >= len || !chain_view(b, chain + last, len - 1 - last, sz, st, &r))
        return KILN_OK;
    // the dims above 1 by stride, largest first, must tile x densely
    int order[KILN_MAX_RANK], m = 0;
    for (int i = 0; i < r; i++) {
        if (sz[i] == 1) continue;
        int j = m++;
        for (; j > 0 && st[order[j - 1]] < st[i]; j--) order[j] = order[j - 1];
        order[j] = i;
    }
    int64_t dense = 1, factors[KILN_MAX_RANK], perm[KILN_MAX_RANK];
    for (int j = m - 1; j >= 0; j--) {
        if (st[order[j]] != dense) return KILN_OK;
        dense *= sz[order[j]];
        factors[j] = sz[order[j]];
    }
    int identity = 1;
    for (int i = 0, t = 0; i < r; i++) { // output dim i above 1 is factor j
        if (sz[i] == 1) continue;
        for (int j = 0; j < m; j++) {
            if (order[j] == i) perm[t] = j;
        }
        identity &= perm[t] == t;
        t++;
    }
    if (m < 2 || identity) return KILN_OK; // (rewrite 7's case)
    const kiln_shape *ys = &b->values[out].desc.shape;
    int64_t codes[KILN_MAX_RANK];
    for (uint32_t i = 0; i < ys->rank; i++) codes[i] = ys->max[i];
    // the new nodes take the place of the chain's first link (its readers may share k's place)
    const int64_t seq = b->nodes[chain[len - 1]].seq;
    kiln_attr_ref fref = {KILN_ATTR_INTS, (uint32_t)m, 0}, pref = {KILN_ATTR_INTS, (uint32_t)m, 0};
    kiln_attr_ref rref = {KILN_ATTR_INTS, ys->rank, 0};
    kiln_attrs fa = {&fref, 1, factors, NULL}, pa = {&pref, 1, perm, NULL};
    kiln_attrs ra = {&rref, 1, codes, NULL};
    int32_t split, moved, y;
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &x, 1, &fa, seq, &split));
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_PERMUTE, &split, 1, &pa, seq, &moved));
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_RESHAPE, &moved, 1, &ra, seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[out].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        b->nodes[b->values[moved].index].dead = 1;
        b->nodes[b->values[split].index].dead = 1;
        return kiln_fail(KILN_ERR_INTERNAL, "view simplification changed node %u", k);
    }
    KILN_TRY(kiln_bgraph_replace_node(b, k, y, "one transpose"));
    *done = 2;
    return KILN_OK;
}

kiln_status kiln_pass_views(kiln_bgraph *b) {
    int64_t codes[KILN_MAX_RANK];
    // 1: permutes of size-1 dims, squeezes and unsqueezes become reshapes
    const size_t n0 = b->n_nodes;
    for (size_t k = 0; k < n0; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (n->dead || n->head >= 0 || n->n_tail > 0) continue;
        if (n->op != KILN_OP_PERMUTE && n->op != KILN_OP_SQUEEZE && n->op != KILN_OP_UNSQUEEZE)
            continue;
        if (!view_as_reshape(b, n, codes)) continue;
        const uint32_t rank = b->values[n->output].desc.shape.rank;
        KILN_TRY(make_reshape(b, (uint32_t)k, kiln_bgraph_input(b, n, 0), codes, rank));
        b->stats.n_views++;
    }
    // 4: linears through the reshapes around them (before 2 folds their second reshape into
    // the head split that follows)
    KILN_TRY(kiln_bgraph_count_uses(b));
    int n_moved = 0;
    const size_t n2 = b->n_nodes;
    for (size_t k = 0; k < n2; k++) {
        int done = 0;
        if (b->nodes[k].dead || b->is_output[b->nodes[k].output] || !plain_reshape(b, &b->nodes[k]))
            continue;
        KILN_TRY(linear_through(b, (uint32_t)k, &done));
        n_moved += done;
        b->stats.n_views += (uint32_t)done;
    }
    // 5: activations after a reshape or permute move in front of it
    KILN_TRY(kiln_bgraph_count_uses(b));
    const size_t n5 = b->n_nodes;
    for (size_t k = 0; k < n5; k++) {
        // through a chain of views: the activation moved to the view's node, try again there
        uint32_t at = (uint32_t)k;
        for (int done = 1; done;) {
            const int32_t in =
                b->nodes[at].n_inputs == 1 ? kiln_bgraph_input(b, &b->nodes[at], 0) : -1;
            unary_before_reshape(b, at, &done);
            b->stats.n_views += (uint32_t)done;
            if (done) at = b->values[in].index;
        }
    }
    if (n_moved > 0) KILN_TRY(kiln_bgraph_sort_nodes(b));
    // 2: reshape chains (in topological order, so an inner reshape is already collapsed)
    const size_t n1 = b->n_nodes;
    for (size_t k = 0; k < n1; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (!plain_reshape(b, n)) continue;
        const int32_t xv = kiln_bgraph_input(b, n, 0);
        if (b->values[xv].kind != KILN_IR_NODE) continue;
        const kiln_bnode *in = &b->nodes[b->values[xv].index];
        uint32_t nc = 0;
        if (!plain_reshape(b, in) || !compose(b, n, in, codes, &nc)) continue;
        KILN_TRY(make_reshape(b, (uint32_t)k, kiln_bgraph_input(b, in, 0), codes, nc));
        b->stats.n_views++;
    }
    // 16: binary ops before the permute of a head's output (the second run; before 7, which
    // then merges the permute with the views that follow it)
    int moved16 = 0;
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t k = 0, n16 = b->n_nodes; b->n_views_runs > 0 && k < n16; k++) {
        int done = 0;
        KILN_TRY(binary_before_head_permute(b, (uint32_t)k, &done));
        if (done) {
            moved16 = 1;
            b->stats.n_views++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    if (moved16) KILN_TRY(kiln_bgraph_sort_nodes(b));
    // 7: permute/reshape chains that keep the element order
    KILN_TRY(kiln_bgraph_count_uses(b));
    const size_t n7 = b->n_nodes;
    int appended = 0;
    for (size_t k = 0; k < n7; k++) {
        int done = 0;
        KILN_TRY(order_keeping_chain(b, (uint32_t)k, &done));
        b->stats.n_views += done != 0;
        appended |= done == 2;
    }
    // 11: strided slices concatenated over the channels
    const size_t n11 = b->n_nodes;
    for (size_t k = 0; k < n11; k++) {
        int done = 0;
        KILN_TRY(space_to_depth(b, (uint32_t)k, &done));
        b->stats.n_views += done != 0;
        appended |= done == 2;
    }
    if (appended) KILN_TRY(kiln_bgraph_sort_nodes(b));
    // 3: identity reshapes: their readers read the input
    KILN_TRY(kiln_bgraph_count_uses(b));
    const size_t nv = b->n_values;
    int32_t *rename = kiln_malloc(nv * sizeof *rename, KILN_ALIGN);
    KILN_CHECK(rename != NULL, KILN_ERR_NO_MEMORY, "out of memory in view simplification");
    for (size_t v = 0; v < nv; v++) rename[v] = (int32_t)v;
    for (size_t k = 0; k < b->n_nodes; k++) {
        kiln_bnode *n = &b->nodes[k];
        if (n->dead) continue;
        int32_t *in = b->ids + n->input_begin;
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            if (in[i] >= 0 && (size_t)in[i] < nv) in[i] = rename[in[i]];
        }
        if (b->is_output[n->output]) continue;
        // a copy, or a cat of one tensor (DenseNet's first layer of a block), gives its input
        // and so does a pad of nothing (Swin's windows pad to a multiple of the window size)
        const int copy = (n->op == KILN_OP_COPY || n->op == KILN_OP_CAT || zero_pad(b, n)) &&
                         n->head < 0 && n->n_tail == 0 && n->n_inputs == 1 && in[0] >= 0 &&
                         kiln_desc_equal(&b->values[in[0]].desc, &b->values[n->output].desc);
        // ... and x * 1, x + 0 and the like give x
        const int32_t same = copy ? in[0] : identity_operand(b, n);
        if (same < 0 && (!plain_reshape(b, n) || !identity_reshape(b, n))) continue;
        rename[n->output] = same >= 0 ? same : in[0];
        n->dead = 1;
        b->stats.n_views++;
    }
    kiln_free(rename, nv * sizeof *rename);
    // 12: last-dim ops in front of a permute that keeps the last dim (norms first, then the
    // elementwise ops after them: each rewrite recounts the uses the next one checks); only in
    // the run after the attention and norm patterns, which read the head split's other forms
    if (b->n_views_runs > 0) KILN_TRY(kiln_pass_dce(b)); // the chains the patterns replaced
    // 14 (before 12, which then moves the norms and rotaries of the slices): slices of the last
    // dim of a permute that keeps it, each then permuted on its own
    KILN_TRY(kiln_bgraph_count_uses(b));
    int sliced = 0;
    for (size_t k = 0, n14 = b->n_nodes; b->n_views_runs > 0 && k < n14; k++) {
        int done = 0;
        KILN_TRY(slices_before_permute(b, (uint32_t)k, &done));
        if (done) {
            sliced = 1;
            b->stats.n_views++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    if (sliced) {
        KILN_TRY(kiln_bgraph_sort_nodes(b));
        KILN_TRY(kiln_pass_dce(b)); // the permutes the slices no longer read
    }
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t k = 0; b->n_views_runs > 0 && k < b->n_nodes; k++) {
        int done = 0;
        KILN_TRY(op_before_permute(b, (uint32_t)k, &done)); // in place: no node appended
        if (done) {
            b->stats.n_views++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    // 13: row-gather chains (the second run: the attention patterns have read the head splits)
    for (size_t k = 0, n13 = b->n_nodes; b->n_views_runs > 0 && k < n13; k++) {
        int done = 0;
        KILN_TRY(row_gather(b, (uint32_t)k, &done));
        if (done) {
            appended = 1;
            b->stats.n_views++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    // 15: reshape and permute chains that move whole rows (the second run, after 13)
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t k = 0, n15 = b->n_nodes; b->n_views_runs > 0 && k < n15; k++) {
        int done = 0;
        KILN_TRY(move_gather(b, (uint32_t)k, &done));
        if (done) {
            appended = 1;
            b->stats.n_views++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    // 17: chains of several transposes as one (the second run, after 15)
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t k = 0, n17 = b->n_nodes; b->n_views_runs > 0 && k < n17; k++) {
        int done = 0;
        KILN_TRY(one_transpose(b, (uint32_t)k, &done));
        if (done) {
            appended = 1;
            b->stats.n_views++;
            KILN_TRY(kiln_bgraph_count_uses(b));
        }
    }
    if (appended) KILN_TRY(kiln_bgraph_sort_nodes(b));
    b->n_views_runs++;
    // 6: expands that their broadcasting readers do not need
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t k = 0; k < b->n_nodes; k++) {
        int done = 0;
        KILN_TRY(expand_into_readers(b, (uint32_t)k, &done));
        b->stats.n_views += (uint32_t)done;
    }
    // 8: constant operands of binary ops at the output's rank
    for (size_t k = 0; k < b->n_nodes; k++) KILN_TRY(rank_align_const(b, (uint32_t)k));
    return kiln_bgraph_count_uses(b);
}
