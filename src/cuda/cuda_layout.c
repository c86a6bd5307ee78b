// SPDX-License-Identifier: Apache-2.0
// The NHWC layout pass (see cuda_layout.h).
// Plain C without CUDA headers: tests/cuda/cuda_layout_test.c includes this file on the CPU.
#include "cuda/cuda_layout.h"

#include <string.h>

#include "runtime/plan_group.h"

static int64_t max_numel(const kiln_plan_tensor *t) {
    int64_t n = 1;
    for (uint32_t d = 0; d < t->shape.rank; d++) n *= t->shape.max[d];
    return n;
}

static int same_shape(const kiln_plan_tensor *a, const kiln_plan_tensor *b) {
    if (a->shape.rank != b->shape.rank) return 0;
    for (uint32_t d = 0; d < a->shape.rank; d++) {
        if (a->shape.min[d] != b->shape.min[d] || a->shape.max[d] != b->shape.max[d]) return 0;
    }
    return 1;
}

static int half_4d(const kiln_plan_tensor *t) {
    return t->shape.rank == 4 && (t->dtype == KILN_DTYPE_F16 || t->dtype == KILN_DTYPE_BF16);
}

enum { K_OTHER, K_CONV, K_FOLLOW, K_ADAPTIVE, K_TO_NHWC, K_FROM_NHWC };

// 1 when layer l is a PERMUTE with dims (a, b, c, d) over a 4-D input.
static int permute_is(const kiln_plan *p, const kiln_plan_layer *l, int a, int b, int c, int d) {
    if (l->op != KILN_OP_PERMUTE) return 0;
    kiln_attrs at = kiln_plan_layer_attrs(p, l);
    uint32_t n = 0;
    const int64_t *dims = kiln_attrs_ints(&at, KILN_A_PERMUTE_DIMS, &n);
    const int want[4] = {a, b, c, d};
    if (n != 4 || dims == NULL) return 0;
    for (uint32_t i = 0; i < 4; i++) {
        if ((dims[i] < 0 ? dims[i] + 4 : dims[i]) != want[i]) return 0;
    }
    return 1;
}

// Unary activations (elementwise over the stored bytes: layout-blind).
static int follow_unary(uint32_t op) {
    return op == KILN_OP_RELU || op == KILN_OP_CLAMP || op == KILN_OP_SILU ||
           op == KILN_OP_HARDSWISH || op == KILN_OP_SIGMOID || op == KILN_OP_TANH ||
           op == KILN_OP_GELU || op == KILN_OP_HARDSIGMOID;
}

// Binary elementwise ops (LeakyReLU is exported as maximum(x, x * slope)).
static int follow_binary(uint32_t op) {
    return op == KILN_OP_ADD || op == KILN_OP_SUB || op == KILN_OP_MUL || op == KILN_OP_MAXIMUM ||
           op == KILN_OP_MINIMUM;
}

// t is [N or 1, C, 1, 1] against o [N, C, H, W] (squeeze-excite's scale): its bytes are the same
// in either layout, and the layer reads it through NHWC-ordered views (cuda_layers.c).
static int per_channel(const kiln_plan_tensor *t, const kiln_plan_tensor *o) {
    const kiln_shape *s = &t->shape, *os = &o->shape;
    return s->rank == 4 && os->rank == 4 && s->max[2] == 1 && s->max[3] == 1 &&
           s->min[1] == os->min[1] && s->max[1] == os->max[1] &&
           ((s->min[0] == 1 && s->max[0] == 1) ||
            (s->min[0] == os->min[0] && s->max[0] == os->max[0]));
}

static int32_t in_id(const kiln_plan *p, const kiln_plan_layer *l, uint32_t j) {
    return j < l->n_inputs ? p->ids[l->input_begin + j] : -1;
}

// group_norm of one group (GroupNorm(1, C): MobileViT's norm over C, H and W): its statistics
// are over the whole sample in either layout, and its kernel indexes the per-channel weight and
// bias by the stored layout (op_norm.cu). x and its output keep one layout; the weight and bias
// ([C] constants) are read as they are.
static int one_group_norm(const kiln_plan *p, const kiln_plan_layer *l) {
    if (l->op != KILN_OP_GROUP_NORM) return 0;
    kiln_attrs a = kiln_plan_layer_attrs(p, l);
    return kiln_attrs_int(&a, KILN_A_GN_GROUPS, 0) == 1;
}

// Elementwise heads and cat: their kernels take NHWC-ordered views (cuda_layers.c), so a
// per-channel operand of their tail reads right in either layout.
static int views_head(uint32_t op) {
    return op == KILN_OP_CAT || follow_unary(op) || follow_binary(op) || op == KILN_OP_DIV;
}

// The fused tail of head li (whose group writes o): elementwise ops whose operands have one
// element or o's shape (or, after a views_head, one value per channel) and whose outputs keep
// o's dtype (layout-blind in either layout).
static int tail_ok(const kiln_plan *p, uint32_t li, const kiln_plan_tensor *o) {
    const kiln_plan_layer *l = &p->layers[li];
    int32_t running = p->ids[l->output_begin];
    for (uint32_t t = 0; t < l->n_tail; t++) {
        const kiln_plan_layer *tl = &p->layers[li + 1 + t];
        for (uint32_t j = 0; j < tl->n_inputs; j++) {
            int32_t r = in_id(p, tl, j);
            if (r < 0 || r == running) continue;
            if (max_numel(&p->tensors[r]) != 1 && !same_shape(&p->tensors[r], o) &&
                !(views_head(l->op) && per_channel(&p->tensors[r], o)))
                return 0;
        }
        if (p->tensors[p->ids[tl->output_begin]].dtype != o->dtype) return 0;
        running = p->ids[tl->output_begin];
    }
    return 1;
}

// Heads that read a 4-D input in either layout and write NCHW: adaptive_avg_pool2d, and mean,
// sum or vector_norm over any dims (ExecuTorch's global average pool is a mean over H and W;
// op_reduce.cu walks the input through the strides of its stored layout and writes in logical
// order).
static int reads_either(const kiln_plan *p, const kiln_plan_layer *l, int32_t x) {
    if (x < 0) return 0;
    if (l->op == KILN_OP_ADAPTIVE_AVG_POOL2D) return 1;
    return (l->op == KILN_OP_MEAN || l->op == KILN_OP_SUM || l->op == KILN_OP_VECTOR_NORM) &&
           p->tensors[x].shape.rank == 4;
}

// 1 when the group of head li reads or writes a STATE tensor (plan.h). Such a group keeps
// everything NCHW, so that no state is ever stored NHWC or read through a layout copy: a copy is
// made at the first read in layer order and shared by later reads, which would miss the state's
// update between them (a state is written in the middle of an execute).
static int group_touches_state(const kiln_plan *p, uint32_t li) {
    const kiln_plan_layer *l = &p->layers[li];
    for (uint32_t t = 0; t <= l->n_tail && li + t < p->n_layers; t++) {
        const kiln_plan_layer *g = &p->layers[li + t];
        for (uint32_t j = 0; j < g->n_inputs; j++) {
            int32_t r = in_id(p, g, j);
            if (r >= 0 && p->tensors[r].kind == KILN_TENSOR_STATE) return 1;
        }
        for (uint32_t k = 0; k < g->n_outputs; k++) {
            int32_t o = p->ids[g->output_begin + k];
            if (o >= 0 && p->tensors[o].kind == KILN_TENSOR_STATE) return 1;
        }
    }
    return 0;
}

// 1 when tensor x is written by the group of a conv2d head, or by a permute (0, 3, 1, 2) (a
// layout permute when it qualifies: its output is then NHWC too).
static int conv_writes(const kiln_plan *p, int32_t x) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if (kiln_plan_group_output(p, li) == x) {
            return p->layers[li].op == KILN_OP_CONV2D || permute_is(p, &p->layers[li], 0, 3, 1, 2);
        }
    }
    return 0;
}

// A depthwise or grouped conv head li whose input x no conv or layout permute writes (an
// elementwise head does: ConvNeXt's residual add): it stays NHWC only while x does. (One that a
// conv writes stays NHWC, reading a copy if that conv's output is demoted: MobileNet's expand.)
static int grouped_input(const kiln_plan *p, uint32_t li) {
    const kiln_plan_layer *l = &p->layers[li];
    if (l->op != KILN_OP_CONV2D) return 0;
    kiln_attrs a = kiln_plan_layer_attrs(p, l);
    return kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0) != 1 && !conv_writes(p, in_id(p, l, 0));
}

// What head layer li is to the pass.
static int head_kind(const kiln_plan *p, uint32_t li, int32_t out) {
    const kiln_plan_layer *l = &p->layers[li];
    const kiln_plan_tensor *o = &p->tensors[out];
    int32_t x = in_id(p, l, 0);
    if (reads_either(p, l, x)) return K_ADAPTIVE; // (a state is NCHW: read as it is)
    if (x < 0 || !half_4d(o) || group_touches_state(p, li)) return K_OTHER;
    const kiln_plan_tensor *xt = &p->tensors[x];
    if (l->op == KILN_OP_PERMUTE) { // layout permutes (cuda_layout.h)
        if (l->n_tail != 0 || xt->kind != KILN_TENSOR_ACTIVATION ||
            o->kind != KILN_TENSOR_ACTIVATION || xt->dtype != o->dtype || !half_4d(xt))
            return K_OTHER;
        if (permute_is(p, l, 0, 3, 1, 2) && o->shape.min[1] == o->shape.max[1] &&
            o->shape.max[1] % 8 == 0)
            return K_TO_NHWC;
        return permute_is(p, l, 0, 2, 3, 1) ? K_FROM_NHWC : K_OTHER;
    }
    if (l->op == KILN_OP_CONV2D) {
        kiln_attrs a = kiln_plan_layer_attrs(p, l);
        int32_t w = in_id(p, l, 1);
        if (w < 0 || p->tensors[w].kind != KILN_TENSOR_WEIGHT || p->tensors[w].shape.rank != 4 ||
            p->tensors[w].dtype != o->dtype || xt->dtype != o->dtype || xt->shape.rank != 4 ||
            xt->shape.min[1] != xt->shape.max[1] || o->shape.max[1] % 8 != 0) {
            return K_OTHER;
        }
        int64_t groups = kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0);
        // groups 1, or depthwise (one channel per group: Kiln's NHWC depthwise kernel), or
        // grouped with multiples of 8 channels per group in and out (RegNet's and ResNeXt's 3x3
        // group convs, cuDNN NHWC on tensor cores): those two only where their input is NHWC
        // (see grouped_input below): between NCHW layers they would only add two transposes
        const int64_t cg = p->tensors[w].shape.max[1],
                      og = groups > 0 ? o->shape.max[1] / groups : 0;
        const int depthwise = groups == xt->shape.max[1] && groups == o->shape.max[1] && cg == 1;
        const int grouped =
            groups > 1 && cg % 8 == 0 && og % 8 == 0 && og * groups == o->shape.max[1];
        if (groups != 1 && !depthwise && !grouped) return K_OTHER;
        // (a depthwise conv of more than 7x7 taps stays NCHW: cuda_layout.h)
        const int64_t taps = p->tensors[w].shape.max[2] * p->tensors[w].shape.max[3];
        if (depthwise && taps > KILN_CUDA_DW_NHWC_MAX_TAPS) return K_OTHER;
        return tail_ok(p, li, o) ? K_CONV : K_OTHER;
    }
    // Every NHWC tensor has C % 8 == 0 (conv outputs, and what follows them): a conv with
    // C % 8 != 0 therefore always reads an NCHW tensor, through a channel-padded copy.
    if (xt->dtype != o->dtype || o->shape.max[1] % 8 != 0 || !tail_ok(p, li, o)) return K_OTHER;
    if ((follow_unary(l->op) && l->n_inputs >= 1) || l->op == KILN_OP_MAX_POOL2D ||
        l->op == KILN_OP_AVG_POOL2D || l->op == KILN_OP_UPSAMPLE_NEAREST2D ||
        l->op == KILN_OP_UPSAMPLE_BILINEAR2D) {
        return K_FOLLOW;
    }
    if (one_group_norm(p, l) && same_shape(xt, o)) return K_FOLLOW;
    if (l->op == KILN_OP_CAT) { // every input 4-D of o's dtype with a static C % 8 == 0
        for (uint32_t j = 0; j < l->n_inputs; j++) {
            int32_t r = in_id(p, l, j);
            if (r < 0 || !half_4d(&p->tensors[r]) || p->tensors[r].dtype != o->dtype ||
                p->tensors[r].shape.min[1] != p->tensors[r].shape.max[1] ||
                p->tensors[r].shape.max[1] % 8 != 0)
                return K_OTHER;
        }
        return K_FOLLOW;
    }
    if (follow_binary(l->op) && l->n_inputs == 2) {
        for (uint32_t j = 0; j < 2; j++) {
            int32_t r = in_id(p, l, j);
            if (r < 0 || (max_numel(&p->tensors[r]) != 1 && !same_shape(&p->tensors[r], o) &&
                          !per_channel(&p->tensors[r], o)))
                return K_OTHER;
        }
        return K_FOLLOW;
    }
    return K_OTHER;
}

void kiln_cuda_layout_free(const kiln_plan *p, kiln_cuda_layout *l) {
    size_t nt = p->n_tensors > 0 ? p->n_tensors : 1, nl = p->n_layers > 0 ? p->n_layers : 1;
    size_t ni = p->n_ids > 0 ? p->n_ids : 1;
    if (l == NULL) return;
    kiln_cuda_free(l->nhwc, nt);
    kiln_cuda_free(l->copy, nt);
    kiln_cuda_free(l->krsc, nt);
    kiln_cuda_free(l->krsc_only, nt);
    kiln_cuda_free(l->padc, nt);
    kiln_cuda_free(l->stem, nl);
    kiln_cuda_free(l->ident, nl);
    kiln_cuda_free(l->rs_xpose, nl);
    kiln_cuda_free(l->out_nchw, nl);
    kiln_cuda_free(l->out_nhwc, nl);
    kiln_cuda_free(l->in_nhwc, nl);
    kiln_cuda_free(l->head_nhwc, nl);
    kiln_cuda_free(l->xpose, ni);
    kiln_cuda_free(l->alt, ni);
    memset(l, 0, sizeof *l);
}

// Demotes whichever of a, b is NHWC when their layouts differ (one-element tensors match any).
static int unify(const kiln_plan *p, uint8_t *nhwc, int32_t a, int32_t b) {
    if (a < 0 || b < 0 || nhwc[a] == nhwc[b]) return 0;
    if (max_numel(&p->tensors[a]) == 1 || max_numel(&p->tensors[b]) == 1) return 0;
    nhwc[a] = nhwc[b] = 0;
    return 1;
}

// Marks the read at ids slot `slot` of tensor r as one of r's copy in the other layout; the first
// such read in layer order makes the copy (a transpose).
static void read_copy(kiln_cuda_layout *l, uint32_t slot, int32_t r) {
    if (!l->copy[r]) l->xpose[slot] = 1, l->n_copies++;
    l->copy[r] = 1;
    l->alt[slot] = 1;
}

// krsc_only: a krsc weight every read of which is the weight slot of an NHWC conv head that is
// not on the stem kernel (the layers that read the KRSC copy: cuda_layers.c). The weight's reads
// are marked in krsc_only (1: only such reads so far, 2: another read).
static void krsc_readers(const kiln_plan *p, const uint8_t *kind, kiln_cuda_layout *l) {
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *pl = &p->layers[li];
        const int head = !(pl->flags & KILN_LAYER_TAIL);
        for (uint32_t j = 0; j < pl->n_inputs; j++) {
            int32_t r = in_id(p, pl, j);
            if (r < 0 || !l->krsc[r]) continue;
            const int via_krsc =
                head && kind[li] == K_CONV && l->head_nhwc[li] && !l->stem[li] && j == 1;
            if (!via_krsc) {
                l->krsc_only[r] = 2;
            } else if (l->krsc_only[r] == 0) {
                l->krsc_only[r] = 1;
            }
        }
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) l->krsc_only[i] = l->krsc_only[i] == 1;
}

// The input slots (of heads and tails) that read tensor t; *via_copy: those through its copy.
static uint32_t reads_of(const kiln_plan *p, const kiln_cuda_layout *l, int32_t t,
                         uint32_t *via_copy) {
    uint32_t n = 0;
    *via_copy = 0;
    for (uint32_t k = 0; k < p->n_layers; k++) {
        const kiln_plan_layer *g = &p->layers[k];
        for (uint32_t j = 0; j < g->n_inputs; j++) {
            if (p->ids[g->input_begin + j] != t) continue;
            n++;
            *via_copy += l->alt[g->input_begin + j];
        }
    }
    return n;
}

// The layer that reads tensor t when it is read once; UINT32_MAX otherwise.
static uint32_t only_reader(const kiln_plan *p, int32_t t) {
    uint32_t rl = UINT32_MAX, n = 0;
    for (uint32_t k = 0; k < p->n_layers; k++) {
        const kiln_plan_layer *g = &p->layers[k];
        for (uint32_t j = 0; j < g->n_inputs; j++) {
            if (p->ids[g->input_begin + j] != t) continue;
            n++;
            rl = k;
        }
    }
    return n == 1 ? rl : UINT32_MAX;
}

// The one permute (a head with no tail, not a layout permute) that reads tensor t, which no
// other layer reads; UINT32_MAX when there is none.
static uint32_t only_permute_reader(const kiln_plan *p, const kiln_cuda_layout *l, int32_t t) {
    const uint32_t rl = only_reader(p, t);
    if (rl == UINT32_MAX) return UINT32_MAX;
    const kiln_plan_layer *g = &p->layers[rl];
    return g->op == KILN_OP_PERMUTE && !(g->flags & KILN_LAYER_TAIL) && g->n_tail == 0 &&
                   g->n_outputs == 1 && !l->ident[rl]
               ? rl
               : UINT32_MAX;
}

// rs_xpose (cuda_layout.h): a RESHAPE head (no tail) whose input, a 4-D NHWC activation, it reads
// through the NCHW copy that no other slot reads transposes the NHWC bytes into its own output
// (the copy's bytes, in the reshape's dims): the copy is not made. When the reshape keeps the
// map's first two dims and only a permute reads its output, the reshape is a layer of the same
// bytes instead (its output the map's NHWC bytes, channels-last) and the permute reads them so
// (in_nhwc): one kernel fewer.
static void reshapes_transpose(const kiln_plan *p, kiln_cuda_layout *l) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *hl = &p->layers[li];
        const int32_t x = in_id(p, hl, 0);
        if (hl->op != KILN_OP_RESHAPE || hl->n_tail != 0 || hl->n_outputs != 1 || x < 0 ||
            !l->alt[hl->input_begin] || !l->nhwc[x] || p->tensors[x].shape.rank != 4 || l->padc[x])
            continue;
        int32_t y = p->ids[hl->output_begin];
        if (y < 0 || l->nhwc[y] || p->tensors[y].dtype != p->tensors[x].dtype) continue;
        uint32_t via_copy = 0;
        (void)reads_of(p, l, x, &via_copy);
        if (via_copy != 1) continue; // another reader shares the copy
        l->alt[hl->input_begin] = l->xpose[hl->input_begin] = 0;
        l->copy[x] = 0;
        l->n_copies--;
        const kiln_plan_tensor *xt = &p->tensors[x], *yt = &p->tensors[y];
        const uint32_t pl = only_permute_reader(p, l, y);
        if (pl != UINT32_MAX && yt->kind == KILN_TENSOR_ACTIVATION && yt->shape.rank >= 3 &&
            xt->shape.min[1] == xt->shape.max[1] && yt->shape.min[1] == xt->shape.max[1] &&
            yt->shape.max[1] == xt->shape.max[1] && yt->shape.min[0] == xt->shape.min[0] &&
            yt->shape.max[0] == xt->shape.max[0]) {
            l->nhwc[y] = 1; // channels-last bytes at any rank, never copied
            l->ident[li] = 1;
            l->n_ident++;
            l->in_nhwc[pl] = 1;
            l->n_in_nhwc++;
            continue;
        }
        l->rs_xpose[li] = 1;
        l->n_rs_xpose++;
    }
}

// Tensor o, every read of which read its copy, is stored in the other layout instead (nhwc: the
// new layout): its readers read it as it is and the copy is not made.
static void store_as_read(const kiln_plan *p, kiln_cuda_layout *l, int32_t o, uint8_t nhwc) {
    for (uint32_t i = 0; i < p->n_ids; i++) {
        if (p->ids[i] == o) l->alt[i] = l->xpose[i] = 0;
    }
    l->nhwc[o] = nhwc;
    l->copy[o] = 0;
    l->n_copies--;
}

// out_nchw (cuda_layout.h): a one-group norm run NHWC whose output, an activation, every reader
// reads through its NCHW copy writes the output NCHW itself: the output is stored NCHW, its
// readers read it as it is, and the copy is not made.
static void norms_out_nchw(const kiln_plan *p, kiln_cuda_layout *l) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *hl = &p->layers[li];
        if (!one_group_norm(p, hl) || hl->n_tail != 0 || hl->n_outputs != 1 || !l->head_nhwc[li])
            continue;
        const int32_t o = p->ids[hl->output_begin];
        if (o < 0 || !l->nhwc[o] || !l->copy[o] || p->tensors[o].kind != KILN_TENSOR_ACTIVATION)
            continue;
        uint32_t via_copy = 0;
        const uint32_t reads = reads_of(p, l, o, &via_copy);
        if (reads == 0 || via_copy != reads) continue;
        store_as_read(p, l, o, 0);
        l->out_nchw[li] = 1;
        l->n_out_nchw++;
    }
}

// out_nhwc (cuda_layout.h): an elementwise group run NCHW (a unary or binary head and its tail)
// or a permute whose output, a 4-D float16/bfloat16 activation with a static C % 8 == 0, every
// reader reads through its NHWC copy writes the output NHWC itself: its output is then stored
// NHWC, its readers read it as it is, and the copy is not made.
static void out_nhwc(const kiln_plan *p, kiln_cuda_layout *l) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *hl = &p->layers[li];
        const int permute = hl->op == KILN_OP_PERMUTE && hl->n_tail == 0 && hl->n_outputs == 1;
        if (!(follow_unary(hl->op) || follow_binary(hl->op) || hl->op == KILN_OP_DIV || permute) ||
            l->head_nhwc[li] || l->ident[li] || group_touches_state(p, li))
            continue;
        const int32_t o = kiln_plan_group_output(p, li);
        if (o < 0 || l->nhwc[o] || !l->copy[o] || l->padc[o] || !half_4d(&p->tensors[o]) ||
            p->tensors[o].kind != KILN_TENSOR_ACTIVATION ||
            p->tensors[o].shape.min[1] != p->tensors[o].shape.max[1] ||
            p->tensors[o].shape.max[1] % 8 != 0)
            continue;
        uint32_t via_copy = 0, own = 0; // own: the group's tails reading their running value
        const uint32_t reads = reads_of(p, l, o, &via_copy);
        for (uint32_t t = 1; t <= hl->n_tail; t++) {
            const kiln_plan_layer *tl = &p->layers[li + t];
            for (uint32_t j = 0; j < tl->n_inputs; j++) own += p->ids[tl->input_begin + j] == o;
        }
        if (reads == own || via_copy != reads - own) continue;
        store_as_read(p, l, o, 1);
        l->out_nhwc[li] = 1;
        l->n_out_nhwc++;
    }
}

// out_nhwc through a reshape (cuda_layout.h): a permute whose output is read only by a reshape
// to a 4-D [N, C, H, W] that keeps the permute output's dim 0 and whose C is the product of its
// static dims 1..k, where every reader of the reshape's output reads it through the NHWC copy
// (MobileViT's fold of patches back into a map: [B, C, nh, ph, nw, pw] viewed as [B, C, H, W],
// k = 1; a conv-form attention's heads merged back, [B, heads, E, H * W] as [B, heads * E, H,
// W], k = 2). The permute writes its output channels-last (dims 1..k innermost, the others in
// order), which are the reshape's NHWC bytes: the reshape is a layer of the same bytes (ident)
// and the copy is not made.
static void permute_reshape_nhwc(const kiln_plan *p, kiln_cuda_layout *l) {
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *hl = &p->layers[li];
        if (hl->op != KILN_OP_PERMUTE || hl->n_tail != 0 || hl->n_outputs != 1 || l->ident[li] ||
            l->out_nhwc[li] || group_touches_state(p, li))
            continue;
        const int32_t o = p->ids[hl->output_begin];
        if (o < 0 || l->nhwc[o] || l->copy[o] || p->tensors[o].kind != KILN_TENSOR_ACTIVATION ||
            p->tensors[o].shape.rank < 3)
            continue;
        const uint32_t rl = only_reader(p, o);
        if (rl == UINT32_MAX) continue;
        const kiln_plan_layer *r = &p->layers[rl];
        if (r->op != KILN_OP_RESHAPE || (r->flags & KILN_LAYER_TAIL) || r->n_tail != 0 ||
            r->n_outputs != 1)
            continue;
        const int32_t o2 = p->ids[r->output_begin];
        if (o2 < 0) continue;
        const kiln_plan_tensor *pt = &p->tensors[o], *t2 = &p->tensors[o2];
        if (l->nhwc[o2] || !l->copy[o2] || l->padc[o2] || !half_4d(t2) ||
            t2->kind != KILN_TENSOR_ACTIVATION || t2->dtype != pt->dtype ||
            t2->shape.min[1] != t2->shape.max[1] || t2->shape.max[1] % 8 != 0 ||
            pt->shape.min[0] != t2->shape.min[0] || pt->shape.max[0] != t2->shape.max[0])
            continue;
        // the permute output's channel dims: 1..k, static, their product the reshape's C
        uint32_t k = 0;
        int64_t prod = 1;
        while (k + 1 < pt->shape.rank && prod < t2->shape.max[1] &&
               pt->shape.min[k + 1] == pt->shape.max[k + 1] && pt->shape.max[k + 1] > 0) {
            prod *= pt->shape.max[++k];
        }
        if (k == 0 || k + 1 >= pt->shape.rank || prod != t2->shape.max[1]) continue;
        uint32_t via_copy = 0;
        const uint32_t reads = reads_of(p, l, o2, &via_copy);
        if (reads == 0 || via_copy != reads) continue;
        store_as_read(p, l, o2, 1);
        l->nhwc[o] = (uint8_t)k; // channels-last bytes at any rank, never copied
        l->ident[rl] = 1;
        l->n_ident++;
        l->out_nhwc[li] = (uint8_t)k;
        l->n_out_nhwc++;
    }
}

// Head li (a K_CONV head, x with C % 8 != 0) fits the stem kernel (cuda_layout.h).
static int stem_conv(const kiln_plan *p, uint32_t li) {
    const kiln_plan_layer *l = &p->layers[li];
    const kiln_plan_tensor *x = &p->tensors[in_id(p, l, 0)], *w = &p->tensors[in_id(p, l, 1)];
    kiln_attrs a = kiln_plan_layer_attrs(p, l);
    return w->shape.max[1] == x->shape.max[1] &&
           kiln_cuda_stem_fits(x->shape.max[1], w->shape.max[2], w->shape.max[3], x->shape.max[2],
                               x->shape.max[3], kiln_attrs_int(&a, KILN_A_CONV_DILATION, 0),
                               kiln_attrs_int(&a, KILN_A_CONV_DILATION, 1));
}

kiln_status kiln_cuda_layout_plan(const kiln_plan *p, int flags, kiln_cuda_layout *out) {
    const int enable = (flags & KILN_CUDA_LAYOUT_NHWC) != 0;
    kiln_cuda_layout l;
    uint8_t *kind = NULL;
    memset(&l, 0, sizeof l);
    size_t nt = p->n_tensors > 0 ? p->n_tensors : 1, nl = p->n_layers > 0 ? p->n_layers : 1;
    size_t ni = p->n_ids > 0 ? p->n_ids : 1;
    l.nhwc = kiln_cuda_calloc(nt);
    l.copy = kiln_cuda_calloc(nt);
    l.krsc = kiln_cuda_calloc(nt);
    l.krsc_only = kiln_cuda_calloc(nt);
    l.padc = kiln_cuda_calloc(nt);
    l.stem = kiln_cuda_calloc(nl);
    l.ident = kiln_cuda_calloc(nl);
    l.rs_xpose = kiln_cuda_calloc(nl);
    l.out_nchw = kiln_cuda_calloc(nl);
    l.out_nhwc = kiln_cuda_calloc(nl);
    l.in_nhwc = kiln_cuda_calloc(nl);
    l.head_nhwc = kiln_cuda_calloc(nl);
    l.xpose = kiln_cuda_calloc(ni);
    l.alt = kiln_cuda_calloc(ni);
    kind = kiln_cuda_calloc(nl);
    if (l.nhwc == NULL || l.copy == NULL || l.krsc == NULL || l.krsc_only == NULL ||
        l.padc == NULL || l.stem == NULL || l.ident == NULL || l.rs_xpose == NULL ||
        l.out_nchw == NULL || l.out_nhwc == NULL || l.in_nhwc == NULL || l.head_nhwc == NULL ||
        l.xpose == NULL || l.alt == NULL || kind == NULL) {
        kiln_cuda_free(l.nhwc, nt);
        kiln_cuda_free(l.copy, nt);
        kiln_cuda_free(l.krsc, nt);
        kiln_cuda_free(l.krsc_only, nt);
        kiln_cuda_free(l.padc, nt);
        kiln_cuda_free(l.stem, nl);
        kiln_cuda_free(l.ident, nl);
        kiln_cuda_free(l.rs_xpose, nl);
        kiln_cuda_free(l.out_nchw, nl);
        kiln_cuda_free(l.out_nhwc, nl);
        kiln_cuda_free(l.in_nhwc, nl);
        kiln_cuda_free(l.head_nhwc, nl);
        kiln_cuda_free(l.xpose, ni);
        kiln_cuda_free(l.alt, ni);
        kiln_cuda_free(kind, nl);
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA layout pass)");
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        int32_t o = kiln_plan_group_output(p, li);
        kind[li] = (uint8_t)head_kind(p, li, o);
        if (p->layers[li].op == KILN_OP_CONV2D) l.n_conv++;
        if (enable && (kind[li] == K_CONV || kind[li] == K_FOLLOW || kind[li] == K_TO_NHWC) &&
            p->tensors[o].kind == KILN_TENSOR_ACTIVATION) {
            l.nhwc[o] = 1;
        }
    }
    // Only unary/binary heads and pools tie layouts together (input(s) and output in one
    // layout), with a layout permute's output (NHWC only over an input as the plan says) and a
    // depthwise or grouped conv's (NHWC only over an NHWC input, unless a conv or a layout
    // permute writes it): demote to a fixed point over them (each round only clears flags: it
    // terminates).
    // Every other mismatch (an NCHW-only consumer of an NHWC tensor, a conv reading a tensor in
    // the other layout, a fused tail's operand) reads a copy instead, so that a boundary costs
    // one transpose rather than NCHW for the whole residual chain behind it.
    for (int changed = enable; changed;) {
        changed = 0;
        for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
            const kiln_plan_layer *hl = &p->layers[li];
            int32_t o = kiln_plan_group_output(p, li);
            if (kind[li] == K_TO_NHWC) { // the same bytes only from an input as the plan says
                const int32_t x = in_id(p, hl, 0);
                if (l.nhwc[o] && l.nhwc[x]) l.nhwc[o] = 0, changed = 1;
                continue;
            }
            if (kind[li] == K_CONV && l.nhwc[o] && grouped_input(p, li) &&
                !l.nhwc[in_id(p, hl, 0)]) {
                l.nhwc[o] = 0;
                changed = 1;
                continue;
            }
            if (kind[li] != K_FOLLOW) continue;
            // a one-group norm ties x to its output only (its weight and bias are per channel)
            const uint32_t n_tied = one_group_norm(p, hl) ? 1 : hl->n_inputs;
            for (uint32_t j = 0; j < n_tied; j++) {
                int32_t r = in_id(p, hl, j);
                // a per-channel operand has the same bytes in either layout (whatever writes it:
                // a conv, or a linear and a reshape after a global pool)
                if (r >= 0 && !same_shape(&p->tensors[r], &p->tensors[o]) &&
                    per_channel(&p->tensors[r], &p->tensors[o]))
                    continue;
                changed |= unify(p, l.nhwc, r, o);
            }
        }
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *hl = &p->layers[li];
        int32_t o = kiln_plan_group_output(p, li), x = in_id(p, hl, 0);
        if (kind[li] == K_CONV || kind[li] == K_FOLLOW) {
            l.head_nhwc[li] = l.nhwc[o];
        } else if (kind[li] == K_ADAPTIVE) {
            l.head_nhwc[li] = x >= 0 && l.nhwc[x];
        } else if ((kind[li] == K_TO_NHWC && l.nhwc[o]) || (kind[li] == K_FROM_NHWC && l.nhwc[x])) {
            l.ident[li] = 1; // no kernel: its output is its input's bytes
            l.n_ident++;
        }
        uint8_t group = kind[li] == K_ADAPTIVE ? 0 : l.head_nhwc[li]; // the tails' layout
        if (kind[li] == K_CONV && l.head_nhwc[li]) {
            l.n_conv_nhwc++;
            if (p->tensors[x].shape.max[1] % 8 == 0) {
                l.krsc[in_id(p, hl, 1)] = 1;
            } else if ((flags & KILN_CUDA_LAYOUT_STEM) && stem_conv(p, li)) {
                l.stem[li] = 1; // reads x (NCHW) and the OIHW weight as they are
                l.n_conv_stem++;
            } else { // x is NCHW (see head_kind): a channel-padded NHWC copy
                l.krsc[in_id(p, hl, 1)] = 1;
                l.padc[x] = l.padc[in_id(p, hl, 1)] = 1;
                l.n_conv_padded++;
            }
        }
        if (enable) {
            for (uint32_t j = 0; j < hl->n_inputs; j++) {
                int32_t r = in_id(p, hl, j);
                if (r < 0 || max_numel(&p->tensors[r]) == 1) continue;
                uint8_t want = kind[li] == K_CONV && j == 0 && !l.stem[li] ? l.head_nhwc[li] : 0;
                if (kind[li] == K_FOLLOW || (kind[li] == K_ADAPTIVE && j == 0)) want = l.nhwc[r];
                if (kind[li] == K_FOLLOW && j > 0 && one_group_norm(p, hl)) continue; // [C]
                if (l.ident[li]) want = l.nhwc[r]; // read as it is
                if (l.nhwc[r] != want) read_copy(&l, hl->input_begin + j, r);
            }
            int32_t running = p->ids[hl->output_begin];
            for (uint32_t t = 0; t < hl->n_tail; t++) {
                const kiln_plan_layer *tl = &p->layers[li + 1 + t];
                for (uint32_t j = 0; j < tl->n_inputs; j++) {
                    int32_t r = in_id(p, tl, j);
                    if (r < 0 || r == running || max_numel(&p->tensors[r]) == 1) continue;
                    if (group && views_head(hl->op) &&
                        per_channel(&p->tensors[r], &p->tensors[kiln_plan_group_output(p, li)]))
                        continue; // the same bytes in either layout
                    if (l.nhwc[r] != group) read_copy(&l, tl->input_begin + j, r);
                }
                running = p->ids[tl->output_begin];
            }
        }
    }
    if (enable) {
        norms_out_nchw(p, &l);
        reshapes_transpose(p, &l);
        out_nhwc(p, &l);
        permute_reshape_nhwc(p, &l);
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) l.n_nhwc += l.nhwc[i];
    krsc_readers(p, kind, &l);
    kiln_cuda_free(kind, nl);
    *out = l;
    return KILN_OK;
}

uint64_t kiln_cuda_plan_gemv_l2(const kiln_plan *p, uint64_t budget, int64_t *keep) {
    return kiln_cuda_plan_l2(p, budget, KILN_CUDA_GEMV_MAX_M, keep);
}

uint64_t kiln_cuda_plan_l2(const kiln_plan *p, uint64_t budget, int64_t max_rows, int64_t *keep) {
    uint64_t kept = 0;
    for (uint32_t li = 0; li < p->n_layers; li++) keep[li] = -1;
    for (;;) { // repeatedly the smallest undecided candidate (a few layers: quadratic is fine)
        uint32_t best = UINT32_MAX;
        uint64_t best_n = 0;
        for (uint32_t li = 0; li < p->n_layers; li++) {
            const kiln_plan_layer *l = &p->layers[li];
            if (l->op != KILN_OP_LINEAR || l->n_inputs < 2 || keep[li] >= 0) continue;
            int32_t xi = p->ids[l->input_begin], wi = p->ids[l->input_begin + 1];
            if (xi < 0 || wi < 0) continue;
            const kiln_plan_tensor *x = &p->tensors[xi], *w = &p->tensors[wi];
            int64_t rows = 1;
            for (uint32_t d = 0; d + 1 < x->shape.rank; d++) rows *= x->shape.max[d];
            if (w->kind != KILN_TENSOR_WEIGHT || rows > max_rows ||
                (w->dtype != KILN_DTYPE_F16 && w->dtype != KILN_DTYPE_BF16))
                continue;
            if (best == UINT32_MAX || w->nbytes < best_n) best = li, best_n = w->nbytes;
        }
        if (best == UINT32_MAX) return kept;
        uint64_t k = budget - kept < best_n ? budget - kept : best_n;
        keep[best] = (int64_t)k;
        kept += k;
    }
}
