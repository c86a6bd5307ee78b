// SPDX-License-Identifier: Apache-2.0
// View folding into attention (cuda_fold.h): which permute/select/reshape layers around sdpa
// run no kernel, decided once per engine; the strided views sdpa reads and writes through.
#include <math.h>
#include <string.h>

#include "core/view.h"
#include "cuda/cuda_fold.h"
#include "cuda/cuda_layout.h"
#include "cuda/cuda_util.h"
#include "runtime/plan.h"
#include "runtime/plan_group.h"

#define VIRT KILN_CUDA_FOLD_VIRTUAL
#define WRIT KILN_CUDA_FOLD_WRITTEN

static size_t elem_size(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F16:
    case KILN_DTYPE_BF16: return 2;
    case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_BOOL: return 1;
    default: return 4;
    }
}

static int static_shape(const kiln_plan_tensor *t) {
    return memcmp(t->shape.min, t->shape.max, t->shape.rank * sizeof *t->shape.min) == 0;
}

static int view_op(uint32_t op) {
    return op == KILN_OP_PERMUTE || op == KILN_OP_SELECT || op == KILN_OP_RESHAPE ||
           op == KILN_OP_SLICE;
}

static int32_t in0(const kiln_plan *p, uint32_t li) {
    return p->layers[li].n_inputs > 0 ? p->ids[p->layers[li].input_begin] : -1;
}

static int32_t out0(const kiln_plan *p, uint32_t li) {
    return p->layers[li].n_outputs > 0 ? p->ids[p->layers[li].output_begin] : -1;
}

// The permutation of permute layer li (normalized), for an input of `rank` dims.
static int perm_of(const kiln_plan *p, uint32_t li, uint32_t rank, uint32_t *perm) {
    kiln_attrs a = kiln_plan_layer_attrs(p, &p->layers[li]);
    uint32_t n = 0;
    const int64_t *d = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &n);
    if (n != rank || rank == 0 || rank > KILN_MAX_RANK) return 0;
    for (uint32_t j = 0; j < rank; j++) {
        int64_t v = d[j] < 0 ? d[j] + (int64_t)rank : d[j];
        if (v < 0 || v >= (int64_t)rank) return 0;
        perm[j] = (uint32_t)v;
    }
    return 1;
}

static void dense(const kiln_tensor *v, void *data, kiln_cuda_strided *out) {
    int64_t s = 1;
    out->data = data;
    out->rank = v->rank;
    memcpy(out->dims, v->dims, sizeof out->dims);
    for (uint32_t d = v->rank; d-- > 0;) {
        out->str[d] = s;
        s *= v->dims[d];
    }
}

// The strides of a reshape of strided view `in` to dims d (rank r) without moving bytes (torch's
// view rule, core/view.h); 0 when none exist. An empty tensor takes dense strides.
static int reshape_strides(const kiln_cuda_strided *in, uint32_t r, const int64_t *d,
                           int64_t *str) {
    int64_t numel = 1, out_numel = 1;
    for (uint32_t j = 0; j < in->rank; j++) numel *= in->dims[j];
    for (uint32_t j = 0; j < r; j++) out_numel *= d[j];
    if (numel != out_numel) return 0;
    if (numel == 0) {
        int64_t acc = 1;
        for (uint32_t j = r; j-- > 0;) {
            str[j] = acc;
            acc *= d[j] > 0 ? d[j] : 1;
        }
        return 1;
    }
    return kiln_view_strides(in->dims, in->str, (int)in->rank, d, (int)r, str);
}

// The view of `id` given the view `in` of its virtual producer's input (dims of the output: d).
// A reshape that no strides express gives rank 0 (the fold pass then runs the chain).
static void apply(const kiln_plan *p, uint32_t li, const kiln_cuda_strided *in, uint32_t rank,
                  const int64_t *d, size_t es, kiln_cuda_strided *out) {
    uint32_t perm[KILN_MAX_RANK];
    kiln_attrs a = kiln_plan_layer_attrs(p, &p->layers[li]);
    memset(out, 0, sizeof *out);
    if (in->rank == 0) return; // the input's view failed (or a scalar: not folded)
    out->data = in->data;
    out->rank = rank;
    memcpy(out->dims, d, sizeof out->dims);
    switch (p->layers[li].op) {
    case KILN_OP_PERMUTE:
        if (perm_of(p, li, in->rank, perm)) {
            for (uint32_t j = 0; j < rank; j++) out->str[j] = in->str[perm[j]];
        }
        break;
    case KILN_OP_SELECT: {
        int64_t dim = kiln_attrs_int(&a, KILN_A_SELECT_DIM, 0);
        int64_t idx = kiln_attrs_int(&a, KILN_A_SELECT_INDEX, 0);
        if (dim < 0) dim += in->rank;
        if (dim < 0 || dim >= (int64_t)in->rank) break;
        if (idx < 0) idx += in->dims[dim];
        if (in->data != NULL) out->data = (uint8_t *)in->data + (size_t)(idx * in->str[dim]) * es;
        for (uint32_t j = 0, k = 0; j < in->rank && k < rank; j++) {
            if ((int64_t)j != dim) out->str[k++] = in->str[j];
        }
        break;
    }
    case KILN_OP_SLICE: { // start, step along dim; the output's dims from the plan's shapes
        int64_t dim = kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0);
        int64_t start = kiln_attrs_int(&a, KILN_A_SLICE_START, 0);
        const int64_t step = kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0);
        if (dim < 0) dim += in->rank;
        if (dim < 0 || dim >= (int64_t)in->rank || rank != in->rank || step < 1) {
            out->rank = 0;
            break;
        }
        if (start < 0) start += in->dims[dim];
        if (start < 0) start = 0;
        if (start > in->dims[dim]) start = in->dims[dim];
        memcpy(out->str, in->str, sizeof out->str);
        out->str[dim] = in->str[dim] * step;
        // as an address offset even over no memory (a plan-time view: the offset's alignment)
        out->data = (void *)((uintptr_t)in->data + (uintptr_t)(start * in->str[dim]) * es);
        break;
    }
    default: // RESHAPE: of a dense input, or of a view whose strides allow it
        if (!reshape_strides(in, rank, d, out->str)) out->rank = 0;
        break;
    }
}

static int scalar_const(const kiln_plan *p, int32_t t, float *v);

// The factor a DIV or MUL layer li scales its first input by when its second is a one-element
// inline constant of the output's dtype and shape takes nothing from it (x / c, x * c); 0 when
// it is not such a layer.
static float scale_of(const kiln_plan *p, uint32_t li) {
    const kiln_plan_layer *l = &p->layers[li];
    float c = 0.0f;
    if ((l->op != KILN_OP_DIV && l->op != KILN_OP_MUL) || (l->flags & KILN_LAYER_TAIL) ||
        l->n_tail != 0 || l->n_inputs != 2 || l->n_outputs != 1)
        return 0.0f;
    const int32_t x = p->ids[l->input_begin], y = p->ids[l->output_begin];
    if (x < 0 || y < 0 || p->tensors[x].dtype != p->tensors[y].dtype ||
        p->tensors[x].shape.rank != p->tensors[y].shape.rank ||
        memcmp(p->tensors[x].shape.max, p->tensors[y].shape.max,
               p->tensors[x].shape.rank * sizeof(int64_t)) != 0 ||
        !scalar_const(p, p->ids[l->input_begin + 1], &c) || !isfinite(c) || c == 0.0f)
        return 0.0f;
    const float f = l->op == KILN_OP_DIV ? 1.0f / c : c;
    return isfinite(f) && f != 0.0f ? f : 0.0f;
}

static int is_virtual_read(const kiln_cuda_fold *f, int32_t pl) {
    return pl >= 0 && (f->virt[pl] & VIRT) && !(f->virt[pl] & WRIT);
}

// The view of a 4-D [N, C, H, W] tensor stored NHWC: its logical dims over channels-last bytes.
static void nhwc_strided(const kiln_tensor *v, kiln_cuda_strided *out) {
    dense(v, v->data, out);
    if (v->rank != 4) return;
    out->str[1] = 1;
    out->str[3] = v->dims[1];
    out->str[2] = v->dims[3] * v->dims[1];
    out->str[0] = v->dims[2] * out->str[2];
}

void kiln_cuda_fold_view(const kiln_plan *p, const kiln_cuda_fold *f, const kiln_tensor *views,
                         int32_t id, kiln_cuda_strided *out) {
    int32_t pl = f->producer[id];
    const kiln_tensor *v = &views[id];
    kiln_cuda_strided in;
    if (!is_virtual_read(f, pl)) {
        dense(v, v->data, out);
        return;
    }
    const int32_t x = in0(p, (uint32_t)pl);
    if (f->base_nhwc != NULL && f->base_nhwc[x] && !is_virtual_read(f, f->producer[x])) {
        nhwc_strided(&views[x], &in); // an NHWC base under a virtual reshape
    } else {
        kiln_cuda_fold_view(p, f, views, x, &in);
    }
    apply(p, (uint32_t)pl, &in, v->rank, v->dims, elem_size(v->dtype), out);
}

// The view of tensor v stored channels-last with k channel dims (cuda_layout.h: dims 1..k
// innermost, then the others in order, then dim 0).
static void channels_last_view(const kiln_tensor *v, uint32_t k, kiln_cuda_strided *out) {
    dense(v, v->data, out);
    if (k < 1 || k + 1 >= v->rank) return;
    int64_t step = 1;
    for (uint32_t d = k; d >= 1; d--) {
        out->str[d] = step;
        step *= v->dims[d];
    }
    for (uint32_t d = v->rank - 1; d > k; d--) {
        out->str[d] = step;
        step *= v->dims[d];
    }
    out->str[0] = step;
}

// The view through which the input o of permute pl is written into dst (the permute's output,
// or the dense reshape of it: the same bytes; a permute output stored channels-last with k
// channel dims, k > 0, through those strides).
static void permuted_out_view(const kiln_plan *p, const kiln_tensor *views, uint32_t pl,
                              const kiln_tensor *o, void *dst, uint32_t k, kiln_cuda_strided *out) {
    uint32_t perm[KILN_MAX_RANK];
    const kiln_tensor *w = &views[out0(p, pl)];
    kiln_cuda_strided wd;
    if (k > 0) {
        channels_last_view(w, k, &wd);
    } else {
        dense(w, w->data, &wd);
    }
    memset(out, 0, sizeof *out);
    out->data = dst;
    out->rank = o->rank;
    memcpy(out->dims, o->dims, sizeof out->dims);
    if (!perm_of(p, pl, o->rank, perm)) return;
    for (uint32_t j = 0; j < o->rank; j++) out->str[perm[j]] = wd.str[j]; // w dim j = o dim perm[j]
}

void kiln_cuda_fold_out_view(const kiln_plan *p, const kiln_cuda_fold *f, const kiln_tensor *views,
                             uint32_t li, kiln_cuda_strided *out) {
    const uint32_t pl = (uint32_t)f->sdpa_out[li];
    const kiln_tensor *o = &views[out0(p, li)];
    void *dst = views[f->sdpa_dst[li]].data;
    if (f->mm_pre[li] < 0) {
        permuted_out_view(p, views, pl, o, dst, f->cl_dims[out0(p, pl)], out);
        return;
    }
    // the permute reads a reshape of the output: its view, reshaped back to the output's dims
    kiln_cuda_strided r;
    permuted_out_view(p, views, pl, &views[out0(p, (uint32_t)f->mm_pre[li])], dst, 0, &r);
    memset(out, 0, sizeof *out);
    out->data = dst;
    out->rank = o->rank;
    memcpy(out->dims, o->dims, sizeof out->dims);
    if (!reshape_strides(&r, o->rank, o->dims, out->str)) out->rank = 0;
}

// --- matmuls over strided operands

// The matrix x(i, j) at i * rs + j * cs (rows x cols) as cuBLASLt stores one, column-major:
// transposed (*trans = 1: rows x cols with ld cs) or not (cols x rows with ld rs, its transpose);
// 0 when neither reads it. A dim of size 1 takes any stride.
static int matrix_ld(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans, int64_t *ld) {
    if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) { // row-major
        *trans = 0;
        *ld = rows == 1 ? cols : rs;
        return 1;
    }
    if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) { // column-major
        *trans = 1;
        *ld = cols == 1 ? rows : cs;
        return 1;
    }
    return 0;
}

int kiln_cuda_mm_matrix_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
    int trans;
    int64_t ld;
    return matrix_ld(rows, cols, rs, cs, &trans, &ld);
}

int kiln_cuda_mm_geom_of(const kiln_cuda_strided *a, const kiln_cuda_strided *b,
                         const kiln_cuda_strided *y, kiln_cuda_mm_geom *g) {
    const int ar = (int)a->rank, br = (int)b->rank;
    memset(g, 0, sizeof *g);
    if (ar < 1 || br < 1 || ar > KILN_MAX_RANK || br > KILN_MAX_RANK) return 0;
    g->k = a->dims[ar - 1];
    g->m = ar >= 2 ? a->dims[ar - 2] : 1;
    g->n = br >= 2 ? b->dims[br - 1] : 1;
    if ((br >= 2 ? b->dims[br - 2] : b->dims[0]) != g->k) return 0;
    g->a_cs = a->str[ar - 1];
    g->a_rs = ar >= 2 ? a->str[ar - 2] : g->k * g->a_cs; // one row: as if dense
    g->b_rs = br >= 2 ? b->str[br - 2] : b->str[0];
    g->b_cs = br >= 2 ? b->str[br - 1] : 1; // one column
    const int nab = ar >= 2 ? ar - 2 : 0, nbb = br >= 2 ? br - 2 : 0;
    const int nb = nab > nbb ? nab : nbb;
    int64_t a_next = -1, b_next = -1; // the stride the next (outer) batch dim must have
    g->batch = 1;
    for (int d = nb; d-- > 0;) { // innermost batch dim first
        const int ia = d - (nb - nab), ib = d - (nb - nbb);
        const int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        const int64_t bd = da == 0 || db == 0 ? 0 : da > db ? da : db;
        if ((da != 1 && da != bd) || (db != 1 && db != bd)) return 0;
        if (bd == 1) continue;
        const int64_t sa = da == 1 ? 0 : a->str[ia], sb = db == 1 ? 0 : b->str[ib];
        if (a_next < 0) {
            g->a_bs = sa;
            g->b_bs = sb;
        } else if (sa != a_next || sb != b_next) {
            return 0;
        }
        a_next = sa * bd;
        b_next = sb * bd;
        g->batch *= bd;
    }
    g->y_rs = g->n;
    g->y_bs = g->m * g->n;
    if (y == NULL) return 1;
    // y [.., m, n] through strides: rank nb + 2, n innermost, its batch dims one stride
    const int yr = (int)y->rank;
    if (ar < 2 || br < 2 || yr != nb + 2 || y->dims[yr - 2] != g->m || y->dims[yr - 1] != g->n ||
        (g->n > 1 && y->str[yr - 1] != 1)) {
        return 0;
    }
    g->y_rs = y->str[yr - 2];
    int64_t y_next = -1;
    for (int d = nb; d-- > 0;) {
        if (y->dims[d] == 1) continue;
        if (y_next < 0) {
            g->y_bs = y->str[d];
        } else if (y->str[d] != y_next) {
            return 0;
        }
        y_next = y->str[d] * y->dims[d];
    }
    return 1;
}

int kiln_cuda_mm_gemm_of(const kiln_cuda_mm_geom *g, kiln_cuda_mm_gemm *c) {
    memset(c, 0, sizeof *c);
    if (g->k <= 0 || g->y_rs < g->n) return 0;
    // cuBLASLt's A is b (k x n), its B is a (m x k); each transposed where stored column-major
    if (!matrix_ld(g->k, g->n, g->b_rs, g->b_cs, &c->trans_a, &c->lda) ||
        !matrix_ld(g->m, g->k, g->a_rs, g->a_cs, &c->trans_b, &c->ldb)) {
        return 0;
    }
    c->m = g->n;
    c->n = g->m;
    c->k = g->k;
    c->ldd = g->y_rs;
    c->batch = 1;
    if (g->batch > 1 && g->b_bs == 0) { // one b: a's batch folds into its rows
        if (c->trans_b || g->a_bs != g->m * c->ldb || g->y_bs != g->m * g->y_rs) return 0;
        c->n = g->m * g->batch;
    } else if (g->batch > 1) {
        if (g->a_bs == 0) return 0; // one a, many b: not one strided batch
        c->batch = g->batch;
        c->stride_a = g->b_bs;
        c->stride_b = g->a_bs;
        c->stride_d = g->y_bs;
    }
    return 1;
}

// 1 when matmul layer li can read its operands' views (plan-time shapes; each operand's fold
// view or the dense tensor), and with with_out write its output's (when redirected): cuBLASLt
// matrices, one batch stride each, a broadcast b only with a's batch folding into its rows,
// 16-byte aligned.
static int mm_views_ok(const kiln_plan *p, const kiln_cuda_fold *f, const kiln_tensor *shapes,
                       uint32_t li, int with_out) {
    const kiln_plan_layer *l = &p->layers[li];
    kiln_cuda_strided v[2];
    kiln_cuda_mm_geom g;
    if (l->n_inputs < 2) return 0;
    for (uint32_t j = 0; j < 2; j++) {
        const int32_t t = p->ids[l->input_begin + j];
        if (t < 0) return 0;
        kiln_cuda_fold_view(p, f, shapes, t, &v[j]);
        if (v[j].rank != p->tensors[t].shape.rank || (uintptr_t)v[j].data % 16 != 0) return 0;
    }
    kiln_cuda_strided yv;
    with_out = with_out && f->sdpa_out[li] >= 0;
    if (with_out) kiln_cuda_fold_out_view(p, f, shapes, li, &yv);
    if (!kiln_cuda_mm_geom_of(&v[0], &v[1], with_out ? &yv : NULL, &g) ||
        !kiln_cuda_mm_matrix_ok(g.m, g.k, g.a_rs, g.a_cs) ||
        !kiln_cuda_mm_matrix_ok(g.k, g.n, g.b_rs, g.b_cs) || g.y_rs < g.n) {
        return 0;
    }
    if (with_out && (uintptr_t)yv.data % 16 != 0) return 0;
    if (g.batch > 1 && g.a_bs == 0) return 0;
    if (g.batch > 1 && g.b_bs == 0) {
        return (g.a_cs == 1 || g.k == 1) && g.a_bs == g.m * g.a_rs && g.y_bs == g.m * g.y_rs;
    }
    return 1;
}

// 1 when matmul head li's tail ops (if any) are unary (no operand): they may run over the bytes
// of a redirected output in any order.
static int unary_tails(const kiln_plan *p, uint32_t li) {
    for (uint32_t t = 1; t <= p->layers[li].n_tail && li + t < p->n_layers; t++) {
        if (p->layers[li + t].n_inputs != 1) return 0;
    }
    return 1;
}

// --- the pass

typedef struct fold_state {
    const kiln_plan *p;
    kiln_cuda_fold *f;
    uint32_t *rbeg;      // n_tensors + 1: readers of tensor t are rl[rbeg[t] .. rbeg[t + 1])
    uint32_t *rl;        // reader layer
    uint32_t *rj;        // reader's input position
    uint8_t *cand;       // n_layers: may be virtual
    uint8_t *cache_tab;  // n_tensors: cos/sin tables of a rotary that writes a KV cache
    kiln_tensor *shapes; // n_tensors: the largest shapes, no data (views at plan time)
} fold_state;

static int overlap(const fold_state *s, int32_t a, int32_t b) {
    const kiln_plan *p = s->p;
    const kiln_plan_tensor *x = &p->tensors[a], *y = &p->tensors[b];
    if (a == b) return 1;
    if (x->kind != KILN_TENSOR_ACTIVATION || y->kind != KILN_TENSOR_ACTIVATION) return 0;
    if (s->f->reloc[a] || s->f->reloc[b]) return 0; // outside the arena (cuda_memory.c)
    if (x->nbytes == 0 || y->nbytes == 0) return 0;
    return x->offset < y->offset + y->nbytes && y->offset < x->offset + x->nbytes;
}

// The materialized tensor a read of t reads (through virtual layers).
static int32_t base_of(const fold_state *s, int32_t t) {
    while (is_virtual_read(s->f, s->f->producer[t])) t = in0(s->p, (uint32_t)s->f->producer[t]);
    return t;
}

// 1 when the group of head li (running) writes memory overlapping tensor x.
static int group_writes(const fold_state *s, uint32_t li, int32_t x) {
    const kiln_plan *p = s->p;
    const kiln_plan_layer *l = &p->layers[li];
    if (s->f->virt[li] & VIRT) return 0;
    if (s->f->sdpa_out[li] >= 0) {
        return overlap(s, s->f->sdpa_dst[li], x);
    }
    for (uint32_t t = 0; t <= l->n_tail && li + t < p->n_layers; t++) {
        const kiln_plan_layer *g = &p->layers[li + t];
        for (uint32_t k = 0; k < g->n_outputs; k++) {
            int32_t o = p->ids[g->output_begin + k];
            if (o >= 0 && overlap(s, o, x)) return 1;
        }
    }
    return 0;
}

// The first layer of the chain of virtual layers through which a read of t reads its base.
static int32_t chain_first(const fold_state *s, int32_t t) {
    int32_t first = -1, pl;
    while (is_virtual_read(s->f, pl = s->f->producer[t])) {
        first = pl;
        t = in0(s->p, (uint32_t)pl);
    }
    return first;
}

// 1 when base x, read at sdpa layer si through views whose first layer is v, holds there what
// it held at v: an activation not overwritten between its producer and si; a state (written at
// most once per execute, by its producer, in place or by the copy of its update) not written
// between v and si.
static int base_safe(const fold_state *s, int32_t x, int32_t v, uint32_t si) {
    const kiln_plan *p = s->p;
    int32_t from = s->f->producer[x];
    if (p->tensors[x].kind == KILN_TENSOR_STATE) return from < 0 || from < v || (int32_t)si < from;
    if (p->tensors[x].kind != KILN_TENSOR_ACTIVATION) return 1;
    for (uint32_t li = 0; li <= si && li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if ((int32_t)li <= from) continue;
        if (group_writes(s, li, x)) return 0;
    }
    return 1;
}

// Makes the layers writing read t (through virtual layers) real again.
static void unfold_chain(fold_state *s, int32_t t) {
    int32_t pl;
    while (is_virtual_read(s->f, pl = s->f->producer[t])) {
        s->f->virt[pl] = 0;
        t = in0(s->p, (uint32_t)pl);
    }
}

// A ROTARY layer li that reads its x through a view: no tail, and not a rotary of a decoder's
// KV cache (tables shared with a rotary whose output an INDEX_COPY writes into a state): those
// are rope groups' members, which read their inputs as rope_groups() decides.
static int rotary_reader(const fold_state *s, uint32_t li) {
    const kiln_plan *p = s->p;
    const kiln_plan_layer *l = &p->layers[li];
    if (l->op != KILN_OP_ROTARY || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
        l->n_inputs != 3)
        return 0;
    const int32_t c = p->ids[l->input_begin + 1], sn = p->ids[l->input_begin + 2];
    return c >= 0 && sn >= 0 && !s->cache_tab[c] && !s->cache_tab[sn];
}

// Marks the tables of the rotaries whose output an in-place INDEX_COPY writes into a state.
static void cache_tables(fold_state *s) {
    const kiln_plan *p = s->p;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        if (l->op != KILN_OP_INDEX_COPY || l->n_inputs < 3) continue;
        const int32_t c = p->ids[l->input_begin], src = p->ids[l->input_begin + 2];
        if (c < 0 || src < 0 || p->tensors[c].kind != KILN_TENSOR_STATE) continue;
        const int32_t r = s->f->producer[src];
        if (r < 0 || p->layers[r].op != KILN_OP_ROTARY || p->layers[r].n_inputs != 3) continue;
        for (uint32_t j = 1; j < 3; j++) {
            const int32_t t = p->ids[p->layers[r].input_begin + j];
            if (t >= 0) s->cache_tab[t] = 1;
        }
    }
}

static int readers_ok(const fold_state *s, int32_t t) {
    const kiln_plan *p = s->p;
    if (s->rbeg[t] == s->rbeg[t + 1]) return 0; // nobody reads it: nothing to gain
    for (uint32_t r = s->rbeg[t]; r < s->rbeg[t + 1]; r++) {
        uint32_t li = s->rl[r];
        const kiln_plan_layer *l = &p->layers[li];
        if (s->f->virt[li] & VIRT) continue;
        if (l->op == KILN_OP_SDPA && !(l->flags & KILN_LAYER_TAIL) && s->rj[r] < 3) continue;
        if (l->op == KILN_OP_MATMUL && !(l->flags & KILN_LAYER_TAIL) && s->rj[r] < 2) continue;
        if (s->rj[r] == 0 && rotary_reader(s, li)) continue;
        return 0;
    }
    return 1;
}

static void decide(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    cache_tables(s);
    // candidates
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        int32_t x = in0(p, li), y = out0(p, li);
        uint32_t perm[KILN_MAX_RANK];
        // a matmul operand scaled by a constant (DeBERTa's k^T / sqrt(d)): the matmul scales its
        // product instead (its alpha), reading the scaled tensor's input through the views
        if (scale_of(p, li) != 0.0f && p->tensors[y].kind == KILN_TENSOR_ACTIVATION &&
            s->rbeg[y + 1] > s->rbeg[y] && !(nhwc != NULL && (nhwc[x] || nhwc[y])) &&
            !(alt != NULL && alt[l->input_begin])) {
            int ok = 1;
            for (uint32_t r = s->rbeg[y]; r < s->rbeg[y + 1] && ok; r++) {
                const kiln_plan_layer *rl = &p->layers[s->rl[r]];
                ok = rl->op == KILN_OP_MATMUL && !(rl->flags & KILN_LAYER_TAIL) && s->rj[r] < 2;
            }
            s->cand[li] = (uint8_t)ok;
            continue;
        }
        if (!view_op(l->op) || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
            l->n_outputs != 1 || x < 0 || y < 0)
            continue;
        if (p->tensors[y].kind != KILN_TENSOR_ACTIVATION ||
            p->tensors[x].dtype != p->tensors[y].dtype)
            continue;
        if ((nhwc != NULL && nhwc[y]) || (alt != NULL && alt[l->input_begin])) continue;
        // an NHWC input only for a RESHAPE that reads it as it is (cuda_layout.h's rs_xpose: a
        // conv's map split into heads, CoAtNet's and other conv-form attentions): a view of the
        // map's channels-last bytes (base_nhwc)
        if (nhwc != NULL && nhwc[x]) {
            if (l->op != KILN_OP_RESHAPE || p->tensors[x].shape.rank != 4 ||
                !static_shape(&p->tensors[x]) || !static_shape(&p->tensors[y]) ||
                f->producer[x] < 0 || view_op(p->layers[f->producer[x]].op))
                continue;
            f->base_nhwc[x] = 1;
        }
        if (l->op == KILN_OP_PERMUTE && !perm_of(p, li, p->tensors[x].shape.rank, perm)) continue;
        // a reshape of another view's output: at static shapes only (the pass checks below,
        // with the plan's shapes, that strides express it; they are then the execute's)
        if (l->op == KILN_OP_RESHAPE && f->producer[x] >= 0 &&
            view_op(p->layers[f->producer[x]].op) &&
            !(static_shape(&p->tensors[x]) && static_shape(&p->tensors[y])))
            continue;
        // a slice at static shapes only: its offset, checked here for alignment, is then the
        // execute's
        if (l->op == KILN_OP_SLICE &&
            !(static_shape(&p->tensors[x]) && static_shape(&p->tensors[y])))
            continue;
        s->cand[li] = 1;
    }
    // reads: in reverse, a candidate is virtual when every reader is virtual or an sdpa q/k/v
    for (uint32_t li = p->n_layers; li-- > 0;) {
        if (s->cand[li] && readers_ok(s, out0(p, li))) f->virt[li] = VIRT;
    }
    // writes: sdpa, or a matmul (unary tails only), -> (only reader) permute keeping the
    // innermost dim
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        const int mm = l->op == KILN_OP_MATMUL;
        int32_t o = mm ? kiln_plan_group_output(p, li) : out0(p, li);
        uint32_t perm[KILN_MAX_RANK];
        if ((l->op != KILN_OP_SDPA && !mm) || (l->flags & KILN_LAYER_TAIL) || o < 0) continue;
        if (mm ? !unary_tails(p, li) || p->tensors[o].shape.rank < 2 : l->n_tail != 0) continue;
        if (p->tensors[o].kind != KILN_TENSOR_ACTIVATION) continue;
        // its one reader outside the group (tails read and write the running value in place)
        uint32_t n_readers = 0, pl = 0, rank = p->tensors[o].shape.rank;
        for (uint32_t r = s->rbeg[o]; r < s->rbeg[o + 1]; r++) {
            if (s->rl[r] > li && s->rl[r] <= li + l->n_tail) continue;
            pl = s->rl[r];
            n_readers++;
        }
        if (n_readers != 1) continue;
        const kiln_plan_layer *pp = &p->layers[pl];
        int32_t w = out0(p, pl);
        // a matmul over heads flattened into its batch ([B * H, L, E]: DeBERTa's bmm) may reach
        // the permute through the reshape that splits them again (static shapes, strides
        // express it: checked with the view)
        int32_t pre = -1;
        if (mm && pp->op == KILN_OP_RESHAPE && !(pp->flags & KILN_LAYER_TAIL) && pp->n_tail == 0 &&
            !(f->virt[pl] & VIRT) && pp->n_outputs == 1 && w >= 0 && pl > li &&
            p->tensors[w].kind == KILN_TENSOR_ACTIVATION &&
            p->tensors[w].dtype == p->tensors[o].dtype && static_shape(&p->tensors[o]) &&
            static_shape(&p->tensors[w]) && s->rbeg[w + 1] - s->rbeg[w] == 1 &&
            !(nhwc != NULL && (nhwc[o] || nhwc[w])) && !(alt != NULL && alt[pp->input_begin])) {
            pre = (int32_t)pl;
            pl = s->rl[s->rbeg[w]];
            rank = p->tensors[w].shape.rank;
            pp = &p->layers[pl];
            w = out0(p, pl);
        }
        if (pp->op != KILN_OP_PERMUTE || (pp->flags & KILN_LAYER_TAIL) || pp->n_tail != 0 ||
            (f->virt[pl] & VIRT) || pp->n_outputs != 1 || w < 0 || pl <= li)
            continue;
        if (alt != NULL && alt[pp->input_begin]) continue;
        if (p->tensors[w].kind == KILN_TENSOR_STATE) continue; // a state is written by its layer
        if (!perm_of(p, pl, rank, perm)) continue;
        // w stored channels-last (the layout's permute into a conv's map, k channel dims: an
        // sdpa over [B, heads, pixels, E] into [B, heads, E, pixels] viewed as [B, C, H, W]):
        // written through those strides where E stays innermost; else w dense, the permute
        // keeping the innermost dim
        const uint32_t k = nhwc != NULL ? nhwc[w] : 0;
        if (k > 0) {
            kiln_cuda_strided wv, ov;
            if (mm || pre >= 0 || p->tensors[w].shape.rank < 3 || !static_shape(&p->tensors[w]))
                continue;
            channels_last_view(&s->shapes[w], k, &wv);
            for (uint32_t j = 0; j < rank; j++) ov.str[perm[j]] = wv.str[j];
            if (ov.str[rank - 1] != 1) continue;
        } else if (perm[rank - 1] != rank - 1) {
            continue;
        }
        f->cl_dims[w] = (uint8_t)k;
        f->sdpa_out[li] = (int32_t)pl;
        f->sdpa_dst[li] = w;
        f->virt[pl] = VIRT | WRIT;
        if (pre >= 0) {
            f->mm_pre[li] = pre;
            f->virt[pre] = VIRT | WRIT;
        }
        // ... and when w is read only by a RESHAPE (dense: the same bytes), the reshape's output
        if (p->tensors[w].kind != KILN_TENSOR_ACTIVATION || s->rbeg[w + 1] - s->rbeg[w] != 1)
            continue;
        uint32_t rl = s->rl[s->rbeg[w]];
        const kiln_plan_layer *rp = &p->layers[rl];
        int32_t r = out0(p, rl);
        if (rp->op != KILN_OP_RESHAPE || (rp->flags & KILN_LAYER_TAIL) || rp->n_tail != 0 ||
            (f->virt[rl] & VIRT) || rp->n_outputs != 1 || r < 0 || rl <= pl ||
            p->tensors[r].dtype != p->tensors[w].dtype)
            continue;
        if ((nhwc != NULL && nhwc[r]) || (alt != NULL && alt[rp->input_begin])) continue;
        if (p->tensors[r].kind == KILN_TENSOR_STATE) continue;
        f->sdpa_dst[li] = r;
        f->virt[rl] = VIRT | WRIT;
    }
    // lifetimes, to a fixed point (folds only ever undone)
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
            const kiln_plan_layer *l = &p->layers[li];
            const int mm = l->op == KILN_OP_MATMUL, rot = rotary_reader(s, li);
            if ((l->op != KILN_OP_SDPA && !mm && !rot) || (f->virt[li] & VIRT)) continue;
            for (uint32_t j = 0; j < (mm ? 2u : rot ? 1u : 3u) && j < l->n_inputs; j++) {
                int32_t t = p->ids[l->input_begin + j];
                if (t < 0 || !is_virtual_read(f, f->producer[t])) continue;
                int32_t x = base_of(s, t);
                kiln_cuda_strided v;
                kiln_cuda_fold_view(p, f, s->shapes, t, &v);
                // sdpa needs E innermost; a slice's offset keeps its vector loads aligned; a
                // matmul needs matrices cuBLASLt reads (mm_views_ok); a rotary reads rows with
                // their last dim innermost (element loads)
                const int fits =
                    mm    ? mm_views_ok(p, f, s->shapes, li, 0)
                    : rot ? v.rank >= 1 && v.str[v.rank - 1] == 1
                          : v.rank >= 2 && v.str[v.rank - 1] == 1 && (uintptr_t)v.data % 16 == 0;
                if (!fits) {
                    unfold_chain(s, t);
                    changed = 1;
                } else if (!base_safe(s, x, chain_first(s, t), li)) {
                    // the arena slot is reused before the sdpa reads it: the base moves out of
                    // the arena, to memory only its producer writes while it lives (a state
                    // updated in between: the views run)
                    if (p->tensors[x].kind == KILN_TENSOR_ACTIVATION && !f->reloc[x]) {
                        f->reloc[x] = 1;
                    } else {
                        unfold_chain(s, t);
                    }
                    changed = 1;
                }
            }
            if (f->sdpa_out[li] < 0) continue;
            uint32_t pl = (uint32_t)f->sdpa_out[li];
            int32_t w = f->sdpa_dst[li];
            uint32_t last = (uint32_t)f->producer[w]; // the permute, or the reshape after it
            int ok = !mm || mm_views_ok(p, f, s->shapes, li, 1);
            for (uint32_t k = li + 1 + l->n_tail; k < last && ok; k++) {
                ok = (f->virt[k] & VIRT) != 0;
            }
            for (uint32_t j = 0; j < l->n_inputs && ok; j++) {
                int32_t t = p->ids[l->input_begin + j];
                if (t < 0 || !overlap(s, base_of(s, t), w)) continue;
                const int32_t x = base_of(s, t);
                if (mm && p->tensors[x].kind == KILN_TENSOR_ACTIVATION && !f->reloc[x]) {
                    // the planner gave w the bytes of an operand the matmul still reads: the
                    // operand moves out of the arena (live from its producer to its last read)
                    f->reloc[x] = 1;
                    changed = 1;
                } else {
                    ok = 0;
                }
            }
            if (!ok) {
                f->sdpa_out[li] = -1;
                f->sdpa_dst[li] = -1;
                f->virt[pl] = 0;
                f->virt[last] = 0;
                if (f->mm_pre[li] >= 0) f->virt[f->mm_pre[li]] = 0;
                f->mm_pre[li] = -1;
                changed = 1;
            }
        }
        // a virtual layer read by a layer that runs again runs too (defensive: unfold_chain
        // undoes whole chains)
        for (uint32_t li = p->n_layers; li-- > 0;) {
            if (is_virtual_read(f, (int32_t)li) && !readers_ok(s, out0(p, li))) {
                unfold_chain(s, out0(p, li));
                changed = 1;
            }
        }
    }
}

// The last layer reading tensor t, directly or through virtual layers.
static uint32_t last_read(const fold_state *s, int32_t t) {
    uint32_t end = 0;
    for (uint32_t r = s->rbeg[t]; r < s->rbeg[t + 1]; r++) {
        uint32_t li = s->rl[r], e = li;
        if (is_virtual_read(s->f, (int32_t)li)) e = last_read(s, out0(s->p, li));
        if (e > end) end = e;
    }
    return end;
}

// The byte offset of slice layer li's output in its input's memory when the output is a
// contiguous run of it (cuda_fold.h), else -1.
static int64_t slice_offset(const kiln_plan *p, uint32_t li, int32_t x) {
    const kiln_shape *xs = &p->tensors[x].shape;
    kiln_attrs a = kiln_plan_layer_attrs(p, &p->layers[li]);
    int64_t d = kiln_attrs_int(&a, KILN_A_SLICE_DIM, 0);
    int64_t start = kiln_attrs_int(&a, KILN_A_SLICE_START, 0);
    if (kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0) != 1) return -1;
    if (d < 0) d += xs->rank;
    if (d < 0 || d >= (int64_t)xs->rank) return -1;
    int64_t inner = 1;
    for (uint32_t i = 0; i < xs->rank; i++) {
        if (xs->min[i] != xs->max[i]) return -1;
        if ((int64_t)i < d && xs->max[i] != 1) return -1;
        if ((int64_t)i > d) inner *= xs->max[i];
    }
    const int64_t size = xs->max[d];
    if (start < 0) start += size;
    if (start < 0) start = 0;
    if (start > size) start = size;
    const int64_t esz = (int64_t)elem_size(p->tensors[x].dtype), off = start * inner * esz;
    return esz > 0 && off % 16 == 0 ? off : -1;
}

// Aliases (cuda_fold.h): in layer order, a dense reshape's, contiguous slice's or layout
// permute's output takes its input's memory when nothing that runs between it and the output's last
// read (through folded views too) writes over that memory.
static void aliases(fold_state *s, const uint8_t *nhwc, const uint8_t *alt, const uint8_t *ident) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        const int32_t x = in0(p, li), y = out0(p, li);
        // a layout permute, or a reshape of a permute's channels-last output (cuda_layout.h):
        // its output is its input's bytes, stored NHWC or channels-last
        const int same_bytes =
            ident != NULL && ident[li] && (l->op == KILN_OP_PERMUTE || l->op == KILN_OP_RESHAPE);
        if ((l->op != KILN_OP_RESHAPE && l->op != KILN_OP_SLICE && !same_bytes) ||
            (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 || l->n_outputs != 1 ||
            f->virt[li] != 0 || x < 0 || y < 0)
            continue;
        const int64_t off = l->op == KILN_OP_SLICE ? slice_offset(p, li, x) : 0;
        if (off < 0) continue;
        if (p->tensors[x].kind != KILN_TENSOR_ACTIVATION ||
            p->tensors[y].kind != KILN_TENSOR_ACTIVATION ||
            p->tensors[x].dtype != p->tensors[y].dtype)
            continue;
        if ((!same_bytes && nhwc != NULL && (nhwc[x] || nhwc[y])) ||
            (alt != NULL && alt[l->input_begin]))
            continue;
        if (s->rbeg[y] == s->rbeg[y + 1]) continue;
        const int32_t b = f->alias[x] >= 0 ? f->alias[x] : x;
        const uint32_t end = last_read(s, y);
        if (f->reloc[y]) { // a fold's base, moved out of the arena: its base moves instead
            if (f->producer[b] < 0 || p->tensors[b].kind != KILN_TENSOR_ACTIVATION) continue;
            f->reloc[y] = 0;
            f->n_reloc--;
            const uint32_t own = last_read(s, b); // b's own readers keep it too
            if (!f->reloc[b]) {
                f->reloc[b] = 1;
                f->live_first[b] = (uint32_t)f->producer[b];
                f->live_last[b] = end > own ? end : own;
                f->n_reloc++;
            } else if (end > f->live_last[b]) {
                f->live_last[b] = end;
            }
        } else if (f->reloc[b]) { // outside the arena: its live range grows to the last read
            if (end > f->live_last[b]) f->live_last[b] = end;
        } else {
            int ok = 1;
            for (uint32_t k = li + 1; k <= end && k < p->n_layers && ok; k++) {
                const kiln_plan_layer *g = &p->layers[k];
                if (f->virt[k] & KILN_CUDA_FOLD_ALIAS) continue; // writes nothing
                if (f->sdpa_out[k] >= 0 && overlap(s, f->sdpa_dst[k], b)) ok = 0;
                for (uint32_t o = 0; o < g->n_outputs && ok; o++) {
                    const int32_t t = p->ids[g->output_begin + o];
                    if (t >= 0 && t != y && overlap(s, t, b)) ok = 0;
                }
            }
            if (!ok) { // the planner reuses the base's bytes while the alias is read: the base
                       // moves out of the arena, live from its producer to the last read
                if (f->producer[b] < 0) continue;
                f->reloc[b] = 1;
                f->live_first[b] = (uint32_t)f->producer[b];
                f->live_last[b] = end;
                f->n_reloc++;
            }
        }
        f->virt[li] = KILN_CUDA_FOLD_ALIAS;
        f->alias[y] = b;
        f->alias_off[y] = (f->alias[x] >= 0 ? f->alias_off[x] : 0) + off;
        f->n_alias++;
    }
}

// --- GEMV folds (cuda_fold.h)

// The memory a read of activation t reads (an aliased reshape's base).
static int32_t mem_of(const fold_state *s, int32_t t) {
    return s->f->alias[t] >= 0 ? s->f->alias[t] : t;
}

// 1 when a layer that runs in (from, to] writes memory overlapping tensor t's (t an activation
// or a state).
static int written_in(const fold_state *s, uint32_t from, uint32_t to, int32_t t) {
    const kiln_plan *p = s->p;
    const kiln_cuda_fold *f = s->f;
    if (p->tensors[t].kind == KILN_TENSOR_STATE) {
        return f->producer[t] > (int32_t)from && f->producer[t] <= (int32_t)to;
    }
    const int32_t m = mem_of(s, t);
    for (uint32_t li = from + 1; li <= to && li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        if (f->virt[li] & (VIRT | KILN_CUDA_FOLD_ALIAS | KILN_CUDA_FOLD_GEMV)) {
            if ((f->virt[li] & WRIT) == 0) continue; // writes nothing
        }
        if (f->sdpa_out[li] >= 0 && overlap(s, f->sdpa_dst[li], m)) return 1;
        for (uint32_t o = 0; o < l->n_outputs; o++) {
            const int32_t u = p->ids[l->output_begin + o];
            if (u >= 0 && mem_of(s, u) != u) continue; // an alias: no bytes of its own
            if (u >= 0 && overlap(s, u, m)) return 1;
        }
    }
    return 0;
}

static int half_dtype(uint32_t dt) { return dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16; }

// An activation or state the GEMV can read as x (stored densely, 16-byte aligned).
static int gemv_readable(const fold_state *s, int32_t t, const uint8_t *nhwc) {
    const kiln_plan_tensor *x = &s->p->tensors[t];
    if (x->kind == KILN_TENSOR_STATE) return 1; // own allocations
    if (x->kind != KILN_TENSOR_ACTIVATION || (nhwc != NULL && nhwc[t])) return 0;
    if (s->f->reloc[mem_of(s, t)]) return 0;
    return s->p->tensors[mem_of(s, t)].offset % 16 == 0;
}

// 1 when the fused GEMV runs linear head li at every shape (cuda_fold.h), reading x at slot 0.
static int gemv_linear(const fold_state *s, uint32_t li, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    const kiln_plan_layer *l = &p->layers[li];
    if (l->op != KILN_OP_LINEAR || (l->flags & KILN_LAYER_TAIL) || l->n_inputs < 2 ||
        l->n_outputs != 1 || s->f->virt[li] != 0)
        return 0;
    if (alt != NULL && alt[l->input_begin]) return 0;
    const int32_t xi = p->ids[l->input_begin], wi = p->ids[l->input_begin + 1];
    const int32_t bi = l->n_inputs > 2 ? p->ids[l->input_begin + 2] : -1;
    if (xi < 0 || wi < 0) return 0;
    const kiln_plan_tensor *x = &p->tensors[xi], *w = &p->tensors[wi];
    if (!half_dtype(x->dtype) || w->dtype != x->dtype || w->kind != KILN_TENSOR_WEIGHT ||
        w->shape.rank != 2 || w->offset % 16 != 0 || x->shape.rank < 1)
        return 0;
    if (bi >= 0 && (p->tensors[bi].dtype != x->dtype || p->tensors[bi].kind != KILN_TENSOR_WEIGHT))
        return 0;
    const int64_t k = x->shape.max[x->shape.rank - 1];
    int64_t rows = 1;
    for (uint32_t d = 0; d + 1 < x->shape.rank; d++) rows *= x->shape.max[d];
    return x->shape.min[x->shape.rank - 1] == k && k >= 8 && k % 8 == 0 && w->shape.max[1] == k &&
           rows == KILN_CUDA_GEMV_FOLD_M;
}

// Norms read only by GEMV linears (cuda_fold.h).
static void gemv_norms(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        if (l->op != KILN_OP_RMS_NORM || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
            l->n_outputs != 1 || f->virt[li] != 0)
            continue;
        const int32_t x = in0(p, li), y = out0(p, li);
        const int32_t wn = l->n_inputs > 1 ? p->ids[l->input_begin + 1] : -1;
        if (x < 0 || y < 0 || p->tensors[y].kind != KILN_TENSOR_ACTIVATION || f->reloc[y] ||
            p->tensors[y].dtype != p->tensors[x].dtype || !gemv_readable(s, x, nhwc))
            continue;
        if (wn >= 0 && (p->tensors[wn].kind != KILN_TENSOR_WEIGHT ||
                        p->tensors[wn].dtype != p->tensors[x].dtype || p->tensors[wn].offset % 16))
            continue;
        if (s->rbeg[y] == s->rbeg[y + 1]) continue;
        int ok = 1;
        uint32_t last = li;
        for (uint32_t r = s->rbeg[y]; r < s->rbeg[y + 1] && ok; r++) {
            ok = s->rj[r] == 0 && gemv_linear(s, s->rl[r], alt) && f->gemv_norm[s->rl[r]] < 0;
            if (s->rl[r] > last) last = s->rl[r];
        }
        if (!ok || written_in(s, li, last, x)) continue;
        f->virt[li] = KILN_CUDA_FOLD_GEMV;
        for (uint32_t r = s->rbeg[y]; r < s->rbeg[y + 1]; r++) f->gemv_norm[s->rl[r]] = (int32_t)li;
        f->n_gemv_norm++;
    }
}

// Gated pairs: G (activation, then mul by U's output, fused after it) and U (cuda_fold.h).
static void gemv_pairs(fold_state *s, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t g = 0; g < p->n_layers; g++) {
        const kiln_plan_layer *l = &p->layers[g];
        if (l->n_tail < 2 || !gemv_linear(s, g, alt) || g + 2 >= p->n_layers) continue;
        const kiln_plan_layer *act = &p->layers[g + 1], *mul = &p->layers[g + 2];
        if (act->op != KILN_OP_SILU && act->op != KILN_OP_RELU && act->op != KILN_OP_GELU) continue;
        if (mul->op != KILN_OP_MUL || mul->n_inputs != 2) continue;
        const int32_t a = out0(p, g + 1), m0 = p->ids[mul->input_begin];
        const int32_t m1 = p->ids[mul->input_begin + 1];
        const int32_t u = m0 == a ? m1 : m1 == a ? m0 : -1;
        if (u < 0 || u == a || f->producer[u] < 0) continue;
        const uint32_t ul = (uint32_t)f->producer[u];
        const kiln_plan_layer *U = &p->layers[ul];
        if (ul >= g || U->n_tail != 0 || !gemv_linear(s, ul, alt) ||
            p->tensors[u].kind != KILN_TENSOR_ACTIVATION || s->rbeg[u + 1] - s->rbeg[u] != 1)
            continue;
        if (f->gemv_norm[ul] != f->gemv_norm[g] || in0(p, ul) != in0(p, g)) continue;
        const int32_t wg = p->ids[l->input_begin + 1], wu = p->ids[U->input_begin + 1];
        const int32_t bg = l->n_inputs > 2 ? p->ids[l->input_begin + 2] : -1;
        const int32_t bu = U->n_inputs > 2 ? p->ids[U->input_begin + 2] : -1;
        if (p->tensors[wg].shape.max[0] != p->tensors[wu].shape.max[0] || (bg >= 0) != (bu >= 0))
            continue;
        f->virt[ul] = KILN_CUDA_FOLD_GEMV;
        f->gemv_pair[g] = (int32_t)ul;
        f->n_gemv_pair++;
    }
}

// Siblings (cuda_fold.h): from each GEMV linear, the next ones in running order of the same x.
static void gemv_siblings(fold_state *s, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        if (l->n_tail != 0 || f->gemv_pair[li] >= 0 || !gemv_linear(s, li, alt)) continue;
        const int32_t x = in0(p, li);
        int32_t raw = -1; // the folded norm's input, read in x's place
        if (f->gemv_norm[li] >= 0) raw = in0(p, (uint32_t)f->gemv_norm[li]);
        uint32_t members[KILN_CUDA_GEMV_MAX_SIB], n = 1;
        members[0] = li;
        for (uint32_t k = li + 1; k < p->n_layers && n < KILN_CUDA_GEMV_MAX_SIB; k++) {
            if (f->virt[k] != 0) continue; // runs no kernel
            const kiln_plan_layer *c = &p->layers[k];
            if (c->n_tail != 0 || f->gemv_pair[k] >= 0 || !gemv_linear(s, k, alt) ||
                in0(p, k) != x || f->gemv_norm[k] != f->gemv_norm[li])
                break;
            const int32_t y = out0(p, k);
            const uint32_t kind = p->tensors[y].kind;
            int ok = kind == KILN_TENSOR_ACTIVATION || kind == KILN_TENSOR_OUTPUT;
            ok = ok && !overlap(s, y, mem_of(s, x)) && (raw < 0 || !overlap(s, y, mem_of(s, raw)));
            for (uint32_t j = 0; j < n && ok; j++) ok = !overlap(s, y, out0(p, members[j]));
            if (!ok) break;
            members[n++] = k;
        }
        for (uint32_t j = 1; j < n; j++) {
            const int32_t y = out0(p, members[j]);
            if (f->reloc[y] && f->live_first[y] > li) f->live_first[y] = li; // written from li
            f->virt[members[j]] = KILN_CUDA_FOLD_GEMV;
            f->gemv_next[members[j - 1]] = (int32_t)members[j];
            f->n_gemv_sib++;
        }
    }
}

// --- rope groups (cuda_fold.h)

// An activation a rope group's kernel reads densely (not NHWC, not read through a layout copy:
// checked by the caller for its slot, not relocated out of the arena's layout rules).
static int rope_dense(const fold_state *s, int32_t t, const uint8_t *nhwc) {
    const kiln_plan_tensor *x = &s->p->tensors[t];
    return x->kind == KILN_TENSOR_ACTIVATION && (nhwc == NULL || !nhwc[t]) && static_shape(x);
}

// In-place index_copy layer li into a state, dim = rank - 2, static shapes, src of the state's
// dtype and shape but for dim: 1, with *src and *idx set.
static int rope_cache_write(const fold_state *s, uint32_t li, const uint8_t *nhwc,
                            const uint8_t *alt, int32_t *src, int32_t *idx) {
    const kiln_plan *p = s->p;
    const kiln_plan_layer *l = &p->layers[li];
    if (l->op != KILN_OP_INDEX_COPY || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
        l->n_inputs != 3 || l->n_outputs != 1 || s->f->virt[li] != 0)
        return 0;
    const int32_t x = in0(p, li), y = out0(p, li);
    *idx = p->ids[l->input_begin + 1];
    *src = p->ids[l->input_begin + 2];
    if (x < 0 || x != y || *idx < 0 || *src < 0 || p->tensors[x].kind != KILN_TENSOR_STATE)
        return 0;
    if (alt != NULL && (alt[l->input_begin + 1] || alt[l->input_begin + 2])) return 0;
    const kiln_plan_tensor *c = &p->tensors[x], *r = &p->tensors[*src], *ix = &p->tensors[*idx];
    kiln_attrs a = kiln_plan_layer_attrs(p, l);
    int64_t dim = kiln_attrs_int(&a, KILN_A_INDEX_COPY_DIM, 0);
    if (dim < 0) dim += c->shape.rank;
    if (c->shape.rank < 2 || dim != (int64_t)c->shape.rank - 2 || r->dtype != c->dtype ||
        r->shape.rank != c->shape.rank || !static_shape(c) || !rope_dense(s, *src, nhwc) ||
        (ix->dtype != KILN_DTYPE_I32 && ix->dtype != KILN_DTYPE_I64) || !static_shape(ix) ||
        ix->shape.rank != 1 || ix->shape.max[0] != r->shape.max[dim])
        return 0;
    for (uint32_t d = 0; d < c->shape.rank; d++) {
        if ((int64_t)d != dim && r->shape.max[d] != c->shape.max[d]) return 0;
    }
    return 1;
}

// A rotary head (no tail) over a dense activation of static shape, writing a dense activation or
// engine output, that rotates all of x's last dim (the group's kernel passes nothing through) by
// halves (an interleaved rotary runs alone).
static int rope_rotary(const fold_state *s, uint32_t li, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    const kiln_plan_layer *l = &p->layers[li];
    if (l->op != KILN_OP_ROTARY || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
        l->n_inputs != 3 || l->n_outputs != 1 || s->f->virt[li] != 0)
        return 0;
    kiln_attrs ra = kiln_plan_layer_attrs(p, l);
    if (kiln_attrs_int(&ra, KILN_A_ROTARY_INTERLEAVED, 0) != 0) return 0;
    for (uint32_t j = 0; j < 3; j++) {
        if (p->ids[l->input_begin + j] < 0 || (alt != NULL && alt[l->input_begin + j])) return 0;
    }
    const int32_t x = in0(p, li), y = out0(p, li);
    for (uint32_t j = 1; j < 3; j++) { // a full rotation: tables over all of x's last dim
        const kiln_shape *ts = &p->tensors[p->ids[l->input_begin + j]].shape;
        const kiln_shape *xs = &p->tensors[x].shape;
        const int64_t tl = ts->rank ? ts->max[ts->rank - 1] : 1;
        if (xs->rank == 0 || kiln_rotary_dims(tl, xs->max[xs->rank - 1]) != xs->max[xs->rank - 1])
            return 0;
    }
    return rope_dense(s, x, nhwc) && y >= 0 &&
           (p->tensors[y].kind == KILN_TENSOR_ACTIVATION ||
            p->tensors[y].kind == KILN_TENSOR_OUTPUT) &&
           p->tensors[y].dtype == p->tensors[x].dtype && static_shape(&p->tensors[y]) &&
           (nhwc == NULL || !nhwc[y]);
}

// 1 when tensor t is written before layer q runs (an input, weight or state written by no
// layer in [q, last], or an activation whose producer comes before q) and no layer in (q,
// last] but the group's writes its memory.
static int rope_ready(const fold_state *s, uint32_t q, uint32_t last, int32_t t) {
    const int32_t pr = s->f->producer[t];
    if (s->p->tensors[t].kind == KILN_TENSOR_STATE) {
        return pr < 0 || pr < (int32_t)q || pr > (int32_t)last;
    }
    return pr < (int32_t)q && !written_in(s, q, last, t);
}

// The last layer reading b's memory: b's readers and those of every alias in it.
static uint32_t mem_last_read(const fold_state *s, int32_t b) {
    uint32_t end = last_read(s, b);
    for (uint32_t t = 0; t < s->p->n_tensors; t++) {
        if (s->f->alias[t] != b) continue;
        const uint32_t e = last_read(s, (int32_t)t);
        if (e > end) end = e;
    }
    return end;
}

// A SLICE layer (no tail, step 1, running a kernel) producing t, read only by the permute that
// a rope group folds, over an activation of t's dtype at static shapes (not NHWC, not read
// through a layout copy): the group reads the slice's input through the slice's view too (the
// heads of a merged q/k/v projection, builder.md); else -1.
static int32_t rope_slice(const fold_state *s, int32_t t, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    const int32_t sl = t >= 0 ? s->f->producer[t] : -1;
    if (sl < 0 || s->f->virt[sl] != 0 || s->rbeg[t + 1] - s->rbeg[t] != 1) return -1;
    const kiln_plan_layer *l = &p->layers[sl];
    const int32_t x = in0(p, (uint32_t)sl);
    if (l->op != KILN_OP_SLICE || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
        l->n_outputs != 1 || x < 0)
        return -1;
    kiln_attrs a = kiln_plan_layer_attrs(p, l);
    const kiln_plan_tensor *xt = &p->tensors[x];
    if (kiln_attrs_int(&a, KILN_A_SLICE_STEP, 0) != 1 || xt->kind != KILN_TENSOR_ACTIVATION ||
        xt->dtype != p->tensors[t].dtype || !static_shape(xt) || !static_shape(&p->tensors[t]) ||
        xt->shape.rank != p->tensors[t].shape.rank || (nhwc != NULL && (nhwc[x] || nhwc[t])) ||
        (alt != NULL && alt[l->input_begin]))
        return -1;
    return sl;
}

// A rope group input t (read at the group's launch q) produced by a PERMUTE (no tail) that keeps
// the last dim innermost, whose output only the group reads: the permute runs no kernel and the
// group reads the permute's input through the permuted strides (a prompt's projections, [B, L,
// H, E] read as [B, H, L, E]). The input's memory must hold until q: a base the planner reuses
// before then moves out of the arena, live to q. Not for a base a GEMV sibling launch writes
// (written earlier than planned: its live range is the siblings'). A SLICE before the permute
// (rope_slice) folds with it.
static void rope_fold_input(fold_state *s, int32_t t, uint32_t q, const uint8_t *nhwc,
                            const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    uint32_t perm[KILN_MAX_RANK];
    const int32_t pl = t >= 0 ? f->producer[t] : -1;
    if (pl < 0 || (uint32_t)pl >= q || f->virt[pl] != 0) return;
    const kiln_plan_layer *l = &p->layers[pl];
    int32_t x = in0(p, (uint32_t)pl);
    if (l->op != KILN_OP_PERMUTE || (l->flags & KILN_LAYER_TAIL) || l->n_tail != 0 ||
        l->n_outputs != 1 || x < 0 || s->rbeg[t + 1] - s->rbeg[t] != 1)
        return;
    const kiln_plan_tensor *xt = &p->tensors[x];
    const uint32_t r = xt->shape.rank;
    if (xt->kind != KILN_TENSOR_ACTIVATION || xt->dtype != p->tensors[t].dtype ||
        !static_shape(xt) || (nhwc != NULL && nhwc[x]) || (alt != NULL && alt[l->input_begin]) ||
        r < 1 || !perm_of(p, (uint32_t)pl, r, perm) || perm[r - 1] != r - 1)
        return;
    // a slice before the permute folds with it: the group reads the slice's input
    const int32_t sl = rope_slice(s, x, nhwc, alt);
    uint32_t from = (uint32_t)pl;
    if (sl >= 0) {
        x = in0(p, (uint32_t)sl);
        from = (uint32_t)sl;
    }
    const int32_t b = mem_of(s, x), bp = f->producer[b];
    if (p->tensors[b].kind != KILN_TENSOR_ACTIVATION || bp < 0 ||
        (f->virt[bp] & KILN_CUDA_FOLD_GEMV) || f->gemv_next[bp] >= 0)
        return;
    if (f->reloc[b]) {
        if (q > f->live_last[b]) f->live_last[b] = q;
    } else if (written_in(s, from, q, x)) {
        const uint32_t end = mem_last_read(s, b);
        f->reloc[b] = 1;
        f->live_first[b] = (uint32_t)bp;
        f->live_last[b] = end > q ? end : q;
        f->n_reloc++;
    }
    f->virt[pl] = KILN_CUDA_FOLD_ROPE;
    if (sl >= 0) f->virt[sl] = KILN_CUDA_FOLD_ROPE;
    f->n_rope_in++;
}

static void rope_groups(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t kc = 0; kc < p->n_layers; kc++) {
        int32_t src = -1, idx = -1;
        if (!rope_cache_write(s, kc, nhwc, alt, &src, &idx)) continue;
        const int32_t kl = f->producer[src];
        if (kl < 0 || (uint32_t)kl >= kc || !rope_rotary(s, (uint32_t)kl, nhwc, alt) ||
            s->rbeg[src + 1] - s->rbeg[src] != 1 || f->reloc[src])
            continue;
        const kiln_plan_layer *K = &p->layers[kl];
        const int32_t cos = p->ids[K->input_begin + 1], sin = p->ids[K->input_begin + 2];
        // Q: the nearest rotary before K of the same tables, only layers that run no kernel
        // between them
        int32_t q = -1;
        for (int32_t li = kl - 1; li >= 0; li--) {
            if (f->virt[li] != 0) continue;
            const kiln_plan_layer *l = &p->layers[li];
            if (rope_rotary(s, (uint32_t)li, nhwc, alt) && p->ids[l->input_begin + 1] == cos &&
                p->ids[l->input_begin + 2] == sin &&
                p->tensors[in0(p, (uint32_t)li)].dtype == p->tensors[src].dtype)
                q = li;
            break;
        }
        if (q < 0 || f->rope_k[q] >= 0) continue;
        // VC: the next cache write after K of the same index (within a few layers)
        int32_t vc = -1, vsrc = -1;
        for (uint32_t li = (uint32_t)kl + 1; li < p->n_layers && li <= kc + 4; li++) {
            int32_t s2 = -1, i2 = -1;
            if (li != kc && rope_cache_write(s, li, nhwc, alt, &s2, &i2) && i2 == idx &&
                in0(p, li) != in0(p, kc) && p->tensors[s2].dtype == p->tensors[src].dtype) {
                vc = (int32_t)li;
                vsrc = s2;
                break;
            }
        }
        const uint32_t last = vc > (int32_t)kc ? (uint32_t)vc : kc;
        const int32_t kcache = in0(p, kc), vcache = vc >= 0 ? in0(p, (uint32_t)vc) : -1;
        int ok = rope_ready(s, (uint32_t)q, last, in0(p, (uint32_t)kl)) &&
                 rope_ready(s, (uint32_t)q, last, idx) && rope_ready(s, (uint32_t)q, last, cos) &&
                 rope_ready(s, (uint32_t)q, last, sin) &&
                 (vsrc < 0 || rope_ready(s, (uint32_t)q, last, vsrc));
        // no other layer in (q, last] reads or writes a cache
        for (uint32_t li = (uint32_t)q + 1; li <= last && ok; li++) {
            if (li == kc || (int32_t)li == vc) continue;
            const kiln_plan_layer *l = &p->layers[li];
            for (uint32_t j = 0; j < l->n_inputs + l->n_outputs && ok; j++) {
                const int32_t t = j < l->n_inputs ? p->ids[l->input_begin + j]
                                                  : p->ids[l->output_begin + j - l->n_inputs];
                ok = t < 0 || (t != kcache && t != vcache);
            }
        }
        if (!ok) continue;
        f->rope_k[q] = kl;
        f->rope_kc[q] = (int32_t)kc;
        f->rope_vc[q] = vc;
        f->virt[kl] = f->virt[kc] = KILN_CUDA_FOLD_ROPE;
        if (vc >= 0) f->virt[vc] = KILN_CUDA_FOLD_ROPE;
        f->n_rope++;
        rope_fold_input(s, in0(p, (uint32_t)q), (uint32_t)q, nhwc, alt);
        rope_fold_input(s, in0(p, (uint32_t)kl), (uint32_t)q, nhwc, alt);
        rope_fold_input(s, vsrc, (uint32_t)q, nhwc, alt);
    }
}

void kiln_cuda_fold_rope_view(const kiln_plan *p, const kiln_cuda_fold *f, const kiln_tensor *views,
                              int32_t t, kiln_cuda_strided *out) {
    const int32_t pl = t >= 0 ? f->producer[t] : -1;
    memset(out, 0, sizeof *out);
    if (pl < 0 || !(f->virt[pl] & KILN_CUDA_FOLD_ROPE) || p->layers[pl].op != KILN_OP_PERMUTE)
        return;
    const int32_t x = in0(p, (uint32_t)pl), sl = f->producer[x];
    kiln_cuda_strided in;
    if (sl >= 0 && (f->virt[sl] & KILN_CUDA_FOLD_ROPE) && p->layers[sl].op == KILN_OP_SLICE) {
        const int32_t xx = in0(p, (uint32_t)sl); // the slice's input, then the slice's view
        kiln_cuda_strided base;
        dense(&views[xx], views[xx].data, &base);
        apply(p, (uint32_t)sl, &base, views[x].rank, views[x].dims, elem_size(views[x].dtype), &in);
    } else {
        dense(&views[x], views[x].data, &in);
    }
    apply(p, (uint32_t)pl, &in, views[t].rank, views[t].dims, elem_size(views[t].dtype), out);
}

// --- mean ratios (cuda_fold.h)

// The next layer after li that runs a kernel (heads only), or n_layers.
static uint32_t next_running(const fold_state *s, uint32_t li) {
    const kiln_plan *p = s->p;
    uint32_t k = li + 1 + p->layers[li].n_tail;
    while (k < p->n_layers && s->f->virt[k] != 0) k += 1 + p->layers[k].n_tail;
    return k;
}

// A plain head of op `op` (no tail, not folded) with n inputs and one output.
static int plain_layer(const fold_state *s, uint32_t li, uint32_t op, uint32_t n) {
    const kiln_plan_layer *l = &s->p->layers[li];
    return li < s->p->n_layers && l->op == op && !(l->flags & KILN_LAYER_TAIL) && l->n_tail == 0 &&
           l->n_inputs == n && l->n_outputs == 1 && s->f->virt[li] == 0;
}

// An activation read by exactly one layer, `reader`.
static int sole_read_by(const fold_state *s, int32_t t, uint32_t reader) {
    return t >= 0 && s->p->tensors[t].kind == KILN_TENSOR_ACTIVATION &&
           s->rbeg[t + 1] - s->rbeg[t] == 1 && s->rl[s->rbeg[t]] == reader;
}

static void mean_ratios(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t m = 0; m < p->n_layers; m++) {
        if (!plain_layer(s, m, KILN_OP_MEAN, 1)) continue;
        const kiln_plan_layer *M = &p->layers[m];
        const int32_t x = in0(p, m), mo = out0(p, m);
        if (x < 0 || mo < 0 || (alt != NULL && alt[M->input_begin])) continue;
        const kiln_plan_tensor *xt = &p->tensors[x];
        const uint32_t r = xt->shape.rank;
        if (xt->kind != KILN_TENSOR_ACTIVATION || !static_shape(xt) || r == 0 ||
            (nhwc != NULL && nhwc[x]) || xt->shape.max[r - 1] > KILN_CUDA_RATIO_MAX ||
            xt->shape.max[r - 1] < 1 || (xt->dtype != KILN_DTYPE_F32 && !half_dtype(xt->dtype)))
            continue;
        kiln_attrs ma = kiln_plan_layer_attrs(p, M);
        uint32_t nd = 0;
        const int64_t *dims = kiln_attrs_ints(&ma, KILN_A_REDUCE_DIMS, &nd);
        const int64_t last = nd == 1 ? (dims[0] < 0 ? dims[0] + (int64_t)r : dims[0]) : -1;
        if (last != (int64_t)r - 1 && !(nd == 0 && r == 1)) continue;
        // A: the add of a one-element weight, running next and the mean's only reader
        const uint32_t a = next_running(s, m);
        if (!sole_read_by(s, mo, a) || !plain_layer(s, a, KILN_OP_ADD, 2)) continue;
        const kiln_plan_layer *A = &p->layers[a];
        const int32_t a0 = p->ids[A->input_begin], a1 = p->ids[A->input_begin + 1];
        const int32_t eps = a0 == mo ? a1 : a0, ao = out0(p, a);
        if ((a0 == mo) == (a1 == mo) || eps < 0 || ao < 0) continue;
        const kiln_plan_tensor *et = &p->tensors[eps];
        if (et->kind != KILN_TENSOR_WEIGHT || et->dtype != p->tensors[mo].dtype ||
            et->nbytes != elem_size(et->dtype) || p->tensors[ao].dtype != p->tensors[mo].dtype)
            continue;
        // D: x divided by it, running next and the add's only reader
        const uint32_t d = next_running(s, a);
        if (!sole_read_by(s, ao, d) || !plain_layer(s, d, KILN_OP_DIV, 2)) continue;
        const kiln_plan_layer *Dl = &p->layers[d];
        const int32_t y = out0(p, d);
        if (p->ids[Dl->input_begin] != x || p->ids[Dl->input_begin + 1] != ao || y < 0 ||
            (alt != NULL && (alt[Dl->input_begin] || alt[Dl->input_begin + 1])))
            continue;
        const kiln_plan_tensor *yt = &p->tensors[y];
        if ((yt->kind != KILN_TENSOR_ACTIVATION && yt->kind != KILN_TENSOR_OUTPUT) ||
            yt->dtype != xt->dtype || yt->shape.rank != r || !static_shape(yt) ||
            memcmp(yt->shape.max, xt->shape.max, r * sizeof *yt->shape.max) != 0 ||
            (nhwc != NULL && nhwc[y]) || overlap(s, y, mem_of(s, x)))
            continue;
        if (f->reloc[y] && f->live_first[y] > m) f->live_first[y] = m; // written from m
        f->virt[a] = f->virt[d] = KILN_CUDA_FOLD_RATIO;
        f->ratio_add[m] = (int32_t)a;
        f->ratio_div[m] = (int32_t)d;
        f->n_ratio++;
    }
}

// --- softmax-weighted sums (cuda_fold.h)

// A dense float activation (or engine input) of static shape, not NHWC.
static int wsum_dense(const fold_state *s, int32_t t, const uint8_t *nhwc) {
    const kiln_plan_tensor *x = &s->p->tensors[t];
    return (x->kind == KILN_TENSOR_ACTIVATION || x->kind == KILN_TENSOR_INPUT) && static_shape(x) &&
           (nhwc == NULL || !nhwc[t]) && x->shape.rank >= 1 &&
           (x->dtype == KILN_DTYPE_F32 || half_dtype(x->dtype));
}

// The reduce or softmax dim of layer li is its input's last dim.
static int last_dim_only(const kiln_plan *p, uint32_t li, uint32_t rank) {
    kiln_attrs a = kiln_plan_layer_attrs(p, &p->layers[li]);
    if (p->layers[li].op == KILN_OP_SOFTMAX) {
        const int64_t d = kiln_attrs_int(&a, KILN_A_SOFTMAX_DIM, 0);
        return (d < 0 ? d + (int64_t)rank : d) == (int64_t)rank - 1;
    }
    uint32_t nd = 0;
    const int64_t *dims = kiln_attrs_ints(&a, KILN_A_REDUCE_DIMS, &nd);
    return nd == 1 && (dims[0] < 0 ? dims[0] + (int64_t)rank : dims[0]) == (int64_t)rank - 1;
}

static void softmax_sums(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t u = 0; u < p->n_layers; u++) {
        if (!plain_layer(s, u, KILN_OP_SUM, 1)) continue;
        const int32_t mo = in0(p, u), r = out0(p, u);
        if (mo < 0 || r < 0 || (alt != NULL && alt[p->layers[u].input_begin])) continue;
        const int32_t mu = f->producer[mo];
        if (mu < 0 || (uint32_t)mu >= u || !plain_layer(s, (uint32_t)mu, KILN_OP_MUL, 2) ||
            next_running(s, (uint32_t)mu) != u || !sole_read_by(s, mo, u))
            continue;
        const kiln_plan_tensor *mt = &p->tensors[mo], *rt = &p->tensors[r];
        const uint32_t rank = mt->shape.rank;
        if (!wsum_dense(s, mo, nhwc) || !last_dim_only(p, u, rank)) continue;
        if ((rt->kind != KILN_TENSOR_ACTIVATION && rt->kind != KILN_TENSOR_OUTPUT) ||
            !static_shape(rt) || (nhwc != NULL && nhwc[r]) ||
            (rt->dtype != KILN_DTYPE_F32 && !half_dtype(rt->dtype)))
            continue;
        // the mul's operands: the softmax's output (running just before it, read only by it)
        // and x of the product's shape
        const kiln_plan_layer *Mu = &p->layers[mu];
        int32_t sm = -1, x = -1;
        for (uint32_t j = 0; j < 2; j++) {
            const int32_t t = p->ids[Mu->input_begin + j], pr = t >= 0 ? f->producer[t] : -1;
            if (pr >= 0 && plain_layer(s, (uint32_t)pr, KILN_OP_SOFTMAX, 1) && sm < 0 &&
                sole_read_by(s, t, (uint32_t)mu)) {
                sm = pr;
            } else {
                x = t;
            }
        }
        if (sm < 0 || x < 0 || next_running(s, (uint32_t)sm) != (uint32_t)mu) continue;
        if (alt != NULL &&
            (alt[Mu->input_begin] || alt[Mu->input_begin + 1] || alt[p->layers[sm].input_begin]))
            continue;
        const int32_t sx = in0(p, (uint32_t)sm), so = out0(p, (uint32_t)sm);
        if (sx < 0 || !wsum_dense(s, sx, nhwc) || !wsum_dense(s, x, nhwc) ||
            !last_dim_only(p, (uint32_t)sm, p->tensors[sx].shape.rank))
            continue;
        const kiln_plan_tensor *xt = &p->tensors[x], *st = &p->tensors[so];
        int ok = xt->shape.rank == rank && st->shape.rank == rank &&
                 memcmp(xt->shape.max, mt->shape.max, rank * sizeof *xt->shape.max) == 0 &&
                 st->shape.max[rank - 1] == mt->shape.max[rank - 1];
        for (uint32_t d = 0; d + 1 < rank && ok; d++) {
            ok = st->shape.max[d] == 1 || st->shape.max[d] == mt->shape.max[d];
        }
        if (!ok || overlap(s, r, mem_of(s, sx)) || overlap(s, r, mem_of(s, x))) continue;
        f->virt[sm] = f->virt[mu] = KILN_CUDA_FOLD_WSUM;
        f->wsum_sm[u] = sm;
        f->wsum_mul[u] = mu;
        f->n_wsum++;
    }
}

// --- overflow clamps (cuda_fold.h)

static float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13); // inf, NaN
    } else if (e != 0) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        bits = sign;
    } else { // subnormal: normalize
        uint32_t ee = 113, mm = m;
        while (!(mm & 0x400)) {
            mm <<= 1;
            ee--;
        }
        bits = sign | (ee << 23) | ((mm & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// The value of a one-element inline float weight t, as a float (exact for its dtype); 0 when t
// is not one.
static int scalar_const(const kiln_plan *p, int32_t t, float *v) {
    if (t < 0 || (uint32_t)t >= p->n_tensors) return 0;
    const kiln_plan_tensor *w = &p->tensors[t];
    if (w->kind != KILN_TENSOR_WEIGHT || w->key != KILN_NO_KEY || p->weights == NULL ||
        w->nbytes != elem_size(w->dtype) || w->offset > p->weights_nbytes ||
        p->weights_nbytes - w->offset < w->nbytes) {
        return 0;
    }
    const uint8_t *d = p->weights + w->offset;
    uint16_t h;
    uint32_t bits;
    switch (w->dtype) {
    case KILN_DTYPE_F32: memcpy(v, d, sizeof *v); return 1;
    case KILN_DTYPE_F16:
        memcpy(&h, d, sizeof h);
        *v = half_bits_to_float(h);
        return 1;
    case KILN_DTYPE_BF16:
        memcpy(&h, d, sizeof h);
        bits = (uint32_t)h << 16;
        memcpy(v, &bits, sizeof bits);
        return 1;
    default: return 0;
    }
}

static int float_dtype(uint32_t dt) { return dt == KILN_DTYPE_F32 || half_dtype(dt); }

// The input of binary layer li other than t (-1 when t is not exactly one of them).
static int32_t other_input(const kiln_plan *p, uint32_t li, int32_t t) {
    const kiln_plan_layer *l = &p->layers[li];
    const int32_t a = p->ids[l->input_begin], b = p->ids[l->input_begin + 1];
    if ((a == t) == (b == t)) return -1;
    return a == t ? b : a;
}

static int64_t numel_max(const kiln_plan_tensor *t) {
    int64_t n = 1;
    for (uint32_t d = 0; d < t->shape.rank; d++) n *= t->shape.max[d];
    return n;
}

// 1 when activations a and b are exactly the same arena bytes (the launch then runs in place:
// each element is read and written by one thread, after every element was read once).
static int same_memory(const fold_state *s, int32_t a, int32_t b) {
    const kiln_plan_tensor *x = &s->p->tensors[mem_of(s, a)], *y = &s->p->tensors[mem_of(s, b)];
    return x->kind == KILN_TENSOR_ACTIVATION && y->kind == KILN_TENSOR_ACTIVATION &&
           !s->f->reloc[mem_of(s, a)] && !s->f->reloc[mem_of(s, b)] &&
           s->f->alias_off[a] == s->f->alias_off[b] && x->offset == y->offset &&
           x->nbytes == y->nbytes;
}

static void inf_clamps(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t a = 0; a < p->n_layers; a++) {
        if (!plain_layer(s, a, KILN_OP_ABS, 1)) continue;
        const int32_t x = in0(p, a), ao = out0(p, a);
        if (x < 0 || ao < 0 || (alt != NULL && alt[p->layers[a].input_begin])) continue;
        const kiln_plan_tensor *xt = &p->tensors[x];
        if ((xt->kind != KILN_TENSOR_ACTIVATION && xt->kind != KILN_TENSOR_INPUT) ||
            !static_shape(xt) || !float_dtype(xt->dtype) || (nhwc != NULL && nhwc[x]) ||
            numel_max(xt) < 1 || numel_max(xt) > KILN_CUDA_CLAMP_MAX)
            continue;
        float k = 0.0f, z = 1.0f, va = 0.0f, vb = 0.0f;
        // |x| == +inf, counted as floats over every element, > 0
        const uint32_t e = next_running(s, a);
        if (!sole_read_by(s, ao, e) || !plain_layer(s, e, KILN_OP_EQ, 2) ||
            !scalar_const(p, other_input(p, e, ao), &k) || !(k > 0.0f && isinf(k)))
            continue;
        const uint32_t c1 = next_running(s, e);
        if (!sole_read_by(s, out0(p, e), c1) || !plain_layer(s, c1, KILN_OP_CAST, 1) ||
            !float_dtype(p->tensors[out0(p, c1)].dtype))
            continue;
        const uint32_t su = next_running(s, c1);
        if (!sole_read_by(s, out0(p, c1), su) || !plain_layer(s, su, KILN_OP_SUM, 1) ||
            numel_max(&p->tensors[out0(p, su)]) != 1)
            continue;
        const uint32_t c2 = next_running(s, su);
        if (!sole_read_by(s, out0(p, su), c2) || !plain_layer(s, c2, KILN_OP_CAST, 1) ||
            !float_dtype(p->tensors[out0(p, c2)].dtype))
            continue;
        const uint32_t g = next_running(s, c2);
        const int32_t c2o = out0(p, c2);
        if (!sole_read_by(s, c2o, g) || !plain_layer(s, g, KILN_OP_GT, 2) ||
            p->ids[p->layers[g].input_begin] != c2o ||
            !scalar_const(p, p->ids[p->layers[g].input_begin + 1], &z) || z != 0.0f)
            continue;
        const uint32_t w = next_running(s, g);
        const int32_t go = out0(p, g), wo = w < p->n_layers ? out0(p, w) : -1;
        if (!sole_read_by(s, go, w) || !plain_layer(s, w, KILN_OP_WHERE, 3) ||
            p->ids[p->layers[w].input_begin] != go ||
            !scalar_const(p, p->ids[p->layers[w].input_begin + 1], &va) ||
            !scalar_const(p, p->ids[p->layers[w].input_begin + 2], &vb) || !isfinite(va) ||
            !isfinite(vb) || wo < 0 || !float_dtype(p->tensors[wo].dtype) ||
            p->tensors[wo].kind != KILN_TENSOR_ACTIVATION || s->rbeg[wo + 1] - s->rbeg[wo] != 2)
            continue;
        // the next five running layers: NEG N -> CAST C3 (-c) and CAST C4 (c), the MAXIMUM of x
        // and -c, then the MINIMUM of that and c, in an order their reads allow
        uint32_t L[5], k5 = w, n = UINT32_MAX, c3 = UINT32_MAX, c4 = UINT32_MAX;
        uint32_t mx = UINT32_MAX, mn = UINT32_MAX;
        int ok = 1;
        for (int i = 0; i < 5 && ok; i++) {
            L[i] = k5 = next_running(s, k5);
            ok = k5 < p->n_layers;
        }
        for (int i = 0; i < 5 && ok; i++) {
            const uint32_t li = L[i];
            if (plain_layer(s, li, KILN_OP_NEG, 1) && in0(p, li) == wo && n == UINT32_MAX) {
                n = li;
            } else if (plain_layer(s, li, KILN_OP_CAST, 1) && in0(p, li) == wo &&
                       c4 == UINT32_MAX) {
                c4 = li;
            } else if (plain_layer(s, li, KILN_OP_CAST, 1) && n != UINT32_MAX &&
                       in0(p, li) == out0(p, n) && c3 == UINT32_MAX) {
                c3 = li;
            } else if (plain_layer(s, li, KILN_OP_MAXIMUM, 2) && c3 != UINT32_MAX &&
                       other_input(p, li, out0(p, c3)) == x && mx == UINT32_MAX) {
                mx = li;
            } else if (plain_layer(s, li, KILN_OP_MINIMUM, 2) && i == 4 && mx != UINT32_MAX &&
                       c4 != UINT32_MAX && other_input(p, li, out0(p, mx)) == out0(p, c4)) {
                mn = li;
            } else {
                ok = 0;
            }
        }
        if (!ok || mn == UINT32_MAX || !sole_read_by(s, out0(p, n), c3) ||
            !sole_read_by(s, out0(p, c3), mx) || !sole_read_by(s, out0(p, c4), mn) ||
            !sole_read_by(s, out0(p, mx), mn) || p->tensors[out0(p, c3)].dtype != xt->dtype ||
            p->tensors[out0(p, c4)].dtype != xt->dtype ||
            p->tensors[out0(p, mx)].dtype != xt->dtype)
            continue;
        const int32_t y = out0(p, mn);
        const kiln_plan_tensor *yt = &p->tensors[y];
        if (y < 0 || (yt->kind != KILN_TENSOR_ACTIVATION && yt->kind != KILN_TENSOR_OUTPUT) ||
            yt->dtype != xt->dtype || yt->shape.rank != xt->shape.rank || !static_shape(yt) ||
            memcmp(yt->shape.max, xt->shape.max, xt->shape.rank * sizeof *yt->shape.max) != 0 ||
            (nhwc != NULL && nhwc[y]) || (overlap(s, y, mem_of(s, x)) && !same_memory(s, y, x)))
            continue;
        const uint32_t members[11] = {e, c1, su, c2, g, w, n, c3, mx, c4, mn};
        for (int i = 0; i < 11; i++) f->virt[members[i]] = KILN_CUDA_FOLD_CLAMP;
        if (f->reloc[y] && f->live_first[y] > a) f->live_first[y] = a; // written from a
        f->clamp_mn[a] = (int32_t)mn;
        f->clamp_ab[2 * a] = va;
        f->clamp_ab[2 * a + 1] = vb;
        f->n_clamp++;
    }
}

// A tail op a conv prologue takes (cuda_fold.h): relu, clamp, add, sub, mul, maximum or minimum
// of the running value and a one-element float weight, or the running value squared (pow by an
// inline 2).
static int pre_op(const kiln_plan *p, uint32_t li, int32_t running) {
    const kiln_plan_layer *l = &p->layers[li];
    float e = 0.0f;
    if (l->n_outputs != 1) return 0;
    if (l->n_inputs == 1) return l->op == KILN_OP_RELU || l->op == KILN_OP_CLAMP;
    if (l->n_inputs != 2 ||
        (l->op != KILN_OP_ADD && l->op != KILN_OP_SUB && l->op != KILN_OP_MUL &&
         l->op != KILN_OP_MAXIMUM && l->op != KILN_OP_MINIMUM && l->op != KILN_OP_POW))
        return 0;
    const int32_t k = other_input(p, li, running);
    if (l->op == KILN_OP_POW) {
        return k >= 0 && p->ids[l->input_begin] == running && scalar_const(p, k, &e) && e == 2.0f;
    }
    return k >= 0 && p->tensors[k].kind == KILN_TENSOR_WEIGHT && numel_max(&p->tensors[k]) == 1 &&
           float_dtype(p->tensors[k].dtype);
}

// A depthwise 7x7 conv of stride 1 and dilation 1 over 16-bit x of its weight's dtype, channels a
// multiple of 8 (no channel padding: the NHWC bytes are the tensor's).
static int pre_dw_conv(const kiln_plan *p, uint32_t li, int32_t x) {
    const kiln_plan_layer *l = &p->layers[li];
    if (l->op != KILN_OP_CONV2D || (l->flags & KILN_LAYER_TAIL) || l->n_inputs < 2 ||
        p->ids[l->input_begin] != x)
        return 0;
    const int32_t w = p->ids[l->input_begin + 1];
    const kiln_plan_tensor *xt = &p->tensors[x], *wt = &p->tensors[w];
    if (w < 0 || xt->shape.rank != 4 || wt->shape.rank != 4 || !half_dtype(xt->dtype) ||
        wt->dtype != xt->dtype)
        return 0;
    kiln_attrs a = kiln_plan_layer_attrs(p, l);
    const int64_t c = xt->shape.max[1];
    return c % 8 == 0 && kiln_attrs_int(&a, KILN_A_CONV_GROUPS, 0) == c && wt->shape.max[0] == c &&
           wt->shape.max[1] == 1 && wt->shape.max[2] == 7 && wt->shape.max[3] == 7 &&
           kiln_attrs_int(&a, KILN_A_CONV_STRIDE, 0) == 1 &&
           kiln_attrs_int(&a, KILN_A_CONV_STRIDE, 1) == 1 &&
           kiln_attrs_int(&a, KILN_A_CONV_DILATION, 0) == 1 &&
           kiln_attrs_int(&a, KILN_A_CONV_DILATION, 1) == 1;
}

static void conv_prologues(fold_state *s, const uint8_t *nhwc, const uint8_t *alt) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t pl = 0; pl < p->n_layers; pl += 1 + p->layers[pl].n_tail) {
        const kiln_plan_layer *P = &p->layers[pl];
        if (P->op != KILN_OP_CONV2D || (P->flags & KILN_LAYER_TAIL) || P->n_tail == 0 ||
            P->n_tail > KILN_CUDA_PRE_MAX || P->n_outputs != 1 || f->virt[pl] != 0 ||
            pl + P->n_tail >= p->n_layers)
            continue;
        int32_t running = out0(p, pl);
        int ok = running >= 0;
        for (uint32_t t = 1; ok && t <= P->n_tail; t++) {
            ok = pre_op(p, pl + t, running);
            running = out0(p, pl + t);
        }
        // the group's tails write in place: y's readers past them must be D alone, as its x
        const int32_t y = running;
        if (!ok || y < 0 || nhwc == NULL || !nhwc[y] ||
            p->tensors[y].kind != KILN_TENSOR_ACTIVATION ||
            p->tensors[y].dtype != p->tensors[out0(p, pl)].dtype)
            continue;
        int64_t d = -1;
        for (uint32_t r = s->rbeg[y]; ok && r < s->rbeg[y + 1]; r++) {
            if (s->rl[r] > pl && s->rl[r] <= pl + P->n_tail) continue;
            ok = d < 0 && s->rj[r] == 0;
            d = s->rl[r];
        }
        if (!ok || d < 0 || f->virt[d] != 0 || !pre_dw_conv(p, (uint32_t)d, y) ||
            (alt != NULL && alt[p->layers[d].input_begin]))
            continue;
        f->pre_src[d] = (int32_t)pl;
        f->pre_dst[pl] = (int32_t)d;
        f->n_pre++;
    }
}

// The relocated bases' live ranges (producer .. last read through the views).
static void live_ranges(fold_state *s) {
    const kiln_plan *p = s->p;
    kiln_cuda_fold *f = s->f;
    for (uint32_t t = 0; t < p->n_tensors; t++) {
        if (!f->reloc[t]) continue;
        f->live_first[t] = f->producer[t] < 0 ? 0 : (uint32_t)f->producer[t];
        f->live_last[t] = last_read(s, (int32_t)t);
        f->n_reloc++;
    }
}

kiln_status kiln_cuda_fold_plan(const kiln_plan *p, const uint8_t *nhwc, const uint8_t *alt,
                                const uint8_t *ident, int enable, int gemv, kiln_cuda_fold *out) {
    kiln_cuda_fold f;
    fold_state s;
    size_t nl = p->n_layers, nt = p->n_tensors;
    kiln_status st = KILN_OK;
    memset(&f, 0, sizeof f);
    memset(&s, 0, sizeof s);
    f.virt = kiln_cuda_calloc(nl + 1);
    f.sdpa_in = kiln_cuda_calloc(nl + 1);
    f.sdpa_out = kiln_cuda_calloc((nl + 1) * sizeof *f.sdpa_out);
    f.sdpa_dst = kiln_cuda_calloc((nl + 1) * sizeof *f.sdpa_dst);
    f.producer = kiln_cuda_calloc((nt + 1) * sizeof *f.producer);
    f.base_nhwc = kiln_cuda_calloc(nt + 1);
    f.cl_dims = kiln_cuda_calloc(nt + 1);
    f.reloc = kiln_cuda_calloc(nt + 1);
    f.live_first = kiln_cuda_calloc((nt + 1) * sizeof *f.live_first);
    f.live_last = kiln_cuda_calloc((nt + 1) * sizeof *f.live_last);
    f.alias = kiln_cuda_calloc((nt + 1) * sizeof *f.alias);
    f.alias_off = kiln_cuda_calloc((nt + 1) * sizeof *f.alias_off);
    f.gemv_norm = kiln_cuda_calloc((nl + 1) * sizeof *f.gemv_norm);
    f.gemv_pair = kiln_cuda_calloc((nl + 1) * sizeof *f.gemv_pair);
    f.gemv_next = kiln_cuda_calloc((nl + 1) * sizeof *f.gemv_next);
    f.rope_k = kiln_cuda_calloc((nl + 1) * sizeof *f.rope_k);
    f.rope_kc = kiln_cuda_calloc((nl + 1) * sizeof *f.rope_kc);
    f.rope_vc = kiln_cuda_calloc((nl + 1) * sizeof *f.rope_vc);
    f.ratio_add = kiln_cuda_calloc((nl + 1) * sizeof *f.ratio_add);
    f.wsum_sm = kiln_cuda_calloc((nl + 1) * sizeof *f.wsum_sm);
    f.wsum_mul = kiln_cuda_calloc((nl + 1) * sizeof *f.wsum_mul);
    f.ratio_div = kiln_cuda_calloc((nl + 1) * sizeof *f.ratio_div);
    f.mm_pre = kiln_cuda_calloc((nl + 1) * sizeof *f.mm_pre);
    f.clamp_mn = kiln_cuda_calloc((nl + 1) * sizeof *f.clamp_mn);
    f.mm_alpha = kiln_cuda_calloc((nl + 1) * sizeof *f.mm_alpha);
    f.pre_src = kiln_cuda_calloc((nl + 1) * sizeof *f.pre_src);
    f.pre_dst = kiln_cuda_calloc((nl + 1) * sizeof *f.pre_dst);
    f.clamp_ab = kiln_cuda_calloc((2 * nl + 2) * sizeof *f.clamp_ab);
    s.rbeg = kiln_cuda_calloc((nt + 2) * sizeof *s.rbeg);
    s.rl = kiln_cuda_calloc(((size_t)p->n_ids + 1) * sizeof *s.rl);
    s.rj = kiln_cuda_calloc(((size_t)p->n_ids + 1) * sizeof *s.rj);
    s.cand = kiln_cuda_calloc(nl + 1);
    s.cache_tab = kiln_cuda_calloc(nt + 1);
    s.shapes = kiln_cuda_calloc((nt + 1) * sizeof *s.shapes);
    if (f.virt == NULL || f.sdpa_in == NULL || f.sdpa_out == NULL || f.sdpa_dst == NULL ||
        f.producer == NULL || f.base_nhwc == NULL || f.cl_dims == NULL || f.reloc == NULL ||
        f.live_first == NULL || f.live_last == NULL || f.alias == NULL || f.alias_off == NULL ||
        f.gemv_norm == NULL || f.gemv_pair == NULL || f.gemv_next == NULL || f.rope_k == NULL ||
        f.rope_kc == NULL || f.rope_vc == NULL || f.ratio_add == NULL || f.ratio_div == NULL ||
        f.wsum_sm == NULL || f.wsum_mul == NULL || f.mm_pre == NULL || f.clamp_mn == NULL ||
        f.clamp_ab == NULL || f.mm_alpha == NULL || f.pre_src == NULL || f.pre_dst == NULL ||
        s.rbeg == NULL || s.rl == NULL || s.rj == NULL || s.cand == NULL || s.cache_tab == NULL ||
        s.shapes == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA attention fold tables)");
        kiln_cuda_fold_free(p, &f);
        goto done;
    }
    for (size_t i = 0; i < nl; i++) {
        f.sdpa_out[i] = f.sdpa_dst[i] = f.gemv_norm[i] = f.gemv_pair[i] = f.gemv_next[i] = -1;
        f.rope_k[i] = f.rope_kc[i] = f.rope_vc[i] = f.ratio_add[i] = f.ratio_div[i] = -1;
        f.wsum_sm[i] = f.wsum_mul[i] = f.mm_pre[i] = f.clamp_mn[i] = -1;
        f.pre_src[i] = f.pre_dst[i] = -1;
        f.mm_alpha[i] = 1.0f;
    }
    for (size_t i = 0; i < nt; i++) {
        f.producer[i] = f.alias[i] = -1;
        s.shapes[i].dtype = p->tensors[i].dtype;
        s.shapes[i].rank = p->tensors[i].shape.rank;
        memcpy(s.shapes[i].dims, p->tensors[i].shape.max, sizeof s.shapes[i].dims);
    }
    // producers (a group's tensors belong to its head) and readers
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        for (uint32_t t = 0; t <= p->layers[li].n_tail && li + t < p->n_layers; t++) {
            const kiln_plan_layer *g = &p->layers[li + t];
            for (uint32_t k = 0; k < g->n_outputs; k++) {
                int32_t o = p->ids[g->output_begin + k];
                if (o >= 0 && (uint32_t)o < nt) f.producer[o] = (int32_t)li;
            }
        }
    }
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        for (uint32_t j = 0; j < l->n_inputs; j++) {
            int32_t t = p->ids[l->input_begin + j];
            if (t >= 0 && (uint32_t)t < nt) s.rbeg[t + 1]++;
        }
    }
    for (size_t t = 0; t < nt; t++) s.rbeg[t + 1] += s.rbeg[t];
    s.rbeg[nt + 1] = s.rbeg[nt];
    {
        // a cursor per tensor (rbeg stays the CSR start)
        uint32_t *cur = kiln_cuda_calloc((nt + 1) * sizeof *cur);
        if (cur == NULL) {
            st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA attention fold tables)");
            kiln_cuda_fold_free(p, &f);
            goto done;
        }
        memcpy(cur, s.rbeg, nt * sizeof *cur);
        for (uint32_t li = 0; li < p->n_layers; li++) {
            const kiln_plan_layer *l = &p->layers[li];
            for (uint32_t j = 0; j < l->n_inputs; j++) {
                int32_t t = p->ids[l->input_begin + j];
                if (t < 0 || (uint32_t)t >= nt) continue;
                s.rl[cur[t]] = li;
                s.rj[cur[t]++] = j;
            }
        }
        kiln_cuda_free(cur, (nt + 1) * sizeof *cur);
    }
    s.p = p;
    s.f = &f;
    if (enable) {
        decide(&s, nhwc, alt);
        live_ranges(&s);
        aliases(&s, nhwc, alt, ident);
    }
    if (gemv) {
        gemv_norms(&s, nhwc, alt);
        gemv_pairs(&s, alt);
        gemv_siblings(&s, alt);
    }
    if (enable) {
        rope_groups(&s, nhwc, alt);
        mean_ratios(&s, nhwc, alt);
        softmax_sums(&s, nhwc, alt);
        inf_clamps(&s, nhwc, alt);
        conv_prologues(&s, nhwc, alt);
    }
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        if (f.virt[li] & VIRT) f.n_virtual++;
        if (f.sdpa_out[li] >= 0) f.n_sdpa_out++;
        const int mm = l->op == KILN_OP_MATMUL, rot = enable && rotary_reader(&s, li);
        if ((l->op != KILN_OP_SDPA && !mm && !rot) || (l->flags & KILN_LAYER_TAIL)) continue;
        for (uint32_t j = 0; j < (mm ? 2u : rot ? 1u : 3u) && j < l->n_inputs; j++) {
            int32_t t = p->ids[l->input_begin + j];
            // the constant scales folded on the way to the base: the matmul's alpha
            for (int32_t u = t, pl; mm && u >= 0 && is_virtual_read(&f, pl = f.producer[u]);
                 u = in0(p, (uint32_t)pl)) {
                if (!view_op(p->layers[pl].op)) f.mm_alpha[li] *= scale_of(p, (uint32_t)pl);
            }
            if (t >= 0 && is_virtual_read(&f, f.producer[t])) {
                f.sdpa_in[li] |= (uint8_t)(1u << j);
                if (mm) {
                    f.n_mm_in++;
                } else if (rot) {
                    f.n_rot_in++;
                } else {
                    f.n_sdpa_in++;
                }
            }
        }
    }
    *out = f;
done:
    kiln_cuda_free(s.rbeg, (nt + 2) * sizeof *s.rbeg);
    kiln_cuda_free(s.rl, ((size_t)p->n_ids + 1) * sizeof *s.rl);
    kiln_cuda_free(s.rj, ((size_t)p->n_ids + 1) * sizeof *s.rj);
    kiln_cuda_free(s.cand, nl + 1);
    kiln_cuda_free(s.cache_tab, nt + 1);
    kiln_cuda_free(s.shapes, (nt + 1) * sizeof *s.shapes);
    return st;
}

void kiln_cuda_fold_free(const kiln_plan *p, kiln_cuda_fold *f) {
    size_t nl = p->n_layers, nt = p->n_tensors;
    if (f == NULL) return;
    kiln_cuda_free(f->virt, nl + 1);
    kiln_cuda_free(f->sdpa_in, nl + 1);
    kiln_cuda_free(f->sdpa_out, (nl + 1) * sizeof *f->sdpa_out);
    kiln_cuda_free(f->sdpa_dst, (nl + 1) * sizeof *f->sdpa_dst);
    kiln_cuda_free(f->producer, (nt + 1) * sizeof *f->producer);
    kiln_cuda_free(f->base_nhwc, nt + 1);
    kiln_cuda_free(f->cl_dims, nt + 1);
    kiln_cuda_free(f->reloc, nt + 1);
    kiln_cuda_free(f->live_first, (nt + 1) * sizeof *f->live_first);
    kiln_cuda_free(f->live_last, (nt + 1) * sizeof *f->live_last);
    kiln_cuda_free(f->alias, (nt + 1) * sizeof *f->alias);
    kiln_cuda_free(f->alias_off, (nt + 1) * sizeof *f->alias_off);
    kiln_cuda_free(f->gemv_norm, (nl + 1) * sizeof *f->gemv_norm);
    kiln_cuda_free(f->gemv_pair, (nl + 1) * sizeof *f->gemv_pair);
    kiln_cuda_free(f->gemv_next, (nl + 1) * sizeof *f->gemv_next);
    kiln_cuda_free(f->rope_k, (nl + 1) * sizeof *f->rope_k);
    kiln_cuda_free(f->rope_kc, (nl + 1) * sizeof *f->rope_kc);
    kiln_cuda_free(f->rope_vc, (nl + 1) * sizeof *f->rope_vc);
    kiln_cuda_free(f->ratio_add, (nl + 1) * sizeof *f->ratio_add);
    kiln_cuda_free(f->ratio_div, (nl + 1) * sizeof *f->ratio_div);
    kiln_cuda_free(f->wsum_sm, (nl + 1) * sizeof *f->wsum_sm);
    kiln_cuda_free(f->wsum_mul, (nl + 1) * sizeof *f->wsum_mul);
    kiln_cuda_free(f->mm_pre, (nl + 1) * sizeof *f->mm_pre);
    kiln_cuda_free(f->clamp_mn, (nl + 1) * sizeof *f->clamp_mn);
    kiln_cuda_free(f->mm_alpha, (nl + 1) * sizeof *f->mm_alpha);
    kiln_cuda_free(f->pre_src, (nl + 1) * sizeof *f->pre_src);
    kiln_cuda_free(f->pre_dst, (nl + 1) * sizeof *f->pre_dst);
    kiln_cuda_free(f->clamp_ab, (2 * nl + 2) * sizeof *f->clamp_ab);
    memset(f, 0, sizeof *f);
}
