// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's layer loop (cuda_backend.h). For each head layer that runs a kernel (a
// layer the attention fold made a view runs none): its kernel arguments over the context's
// tensor views, its layout (NHWC flags; reads of a tensor in the layout it is not stored in go
// through the tensor's copy, made at the first such read in layer order: cuda_layout.h), its
// folded sdpa views (cuda_fold.h), its plan (planned again, untimed, when the plan made at
// context creation is not current for the shapes and pointers bound now), and kiln_cuda_run.
// Nothing here allocates or synchronizes, except cuda.debug_sync's synchronize after each layer.
#define _POSIX_C_SOURCE 200809L // clock_gettime (the option profile's host times)
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.h"
#include "runtime/plan_group.h"

static int64_t pad8(int64_t c) { return (c + 7) / 8 * 8; }

uint32_t kiln_cuda_binding_tensor(const kiln_plan *p, uint32_t b) {
    return b < p->n_inputs ? p->inputs[b] : p->outputs[b - p->n_inputs];
}

void kiln_cuda_bind_arena_views(cuda_context *c) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind == KILN_TENSOR_ACTIVATION && !e->fold.reloc[i]) {
            c->views[i].data = (uint8_t *)c->arena + t->offset;
        }
    }
    // an aliased reshape's or slice's output is in its base's memory (cuda_fold.h)
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (e->fold.alias[i] >= 0) {
            c->views[i].data = (uint8_t *)c->views[e->fold.alias[i]].data + e->fold.alias_off[i];
        }
    }
}

void kiln_cuda_bound_init(const cuda_context *c, cudaStream_t stream, cuda_bound *b) {
    const cuda_engine *e = c->engine;
    kiln_cuda_ctx *ctx = &b->ctx;
    memset(b, 0, sizeof *b);
    ctx->where = b->where;
    ctx->stream = stream;
    ctx->policy = &e->policy;
    ctx->lt = c->lt;
    ctx->dnn = c->dnn;
    ctx->workspace = c->workspace;
    ctx->workspace_nbytes = c->workspace != NULL ? c->workspace_nbytes : 0;
    ctx->workspace_used = (size_t *)&c->workspace_used;
    ctx->sm_count = e->sm_count;
    ctx->wg_ok = e->wg_ok;
    ctx->l2_keep = -1;
}

static int same_dims_or_one(const kiln_tensor *t, const kiln_tensor *out) {
    return t == NULL || kiln_tensor_numel(t) == 1 ||
           (t->rank == out->rank && memcmp(t->dims, out->dims, t->rank * sizeof(int64_t)) == 0);
}

// Writes the 4-D tensor src (a view: logical N, C, H, W) in the other layout at dst, dense: NCHW
// when src is stored NHWC (`back`), else NHWC with a channel stride cs (>= C: padded copies).
static kiln_status transpose_layout(const kiln_cuda_ctx *ctx, void *dst, const kiln_tensor *src,
                                    int back, int64_t cs) {
    const int64_t *d = src->dims;
    // iterate in the destination's order (dense destination strides)
    int64_t to_nhwc_dims[4] = {d[0], d[2], d[3], d[1]};
    int64_t to_nhwc_dst[4] = {d[2] * d[3] * cs, d[3] * cs, cs, 1};
    int64_t to_nhwc_src[4] = {d[1] * d[2] * d[3], d[3], 1, d[2] * d[3]};
    int64_t to_nchw_dst[4] = {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
    int64_t to_nchw_src[4] = {d[2] * d[3] * d[1], 1, d[3] * d[1], d[1]};
    return kiln_cuda_copy_strided(ctx, dst, src->data, kiln_cuda_dtype_size(src->dtype), 4,
                                  back ? d : to_nhwc_dims, back ? to_nchw_dst : to_nhwc_dst,
                                  back ? to_nchw_src : to_nhwc_src);
}

// A reshape of an NHWC tensor (rs_xpose, cuda_layout.h): its output is the input's NCHW bytes.
static kiln_status reshape_transpose(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    if (x == NULL || x->rank != 4 || kiln_tensor_numel(y) != kiln_tensor_numel(x) ||
        x->dtype != y->dtype) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "%s: a reshape of an NHWC map whose input is not a 4-D map of its "
                              "size and dtype; set the option cuda.nhwc to false",
                              ctx->where ? ctx->where : "?");
    }
    return kiln_tensor_numel(y) > 0 ? transpose_layout(ctx, y->data, x, 1, x->dims[1]) : KILN_OK;
}

// Points a read at ids slot `slot` of tensor src (a view) at the tensor's copy in the other
// layout in *view; with `run`, the first such read in layer order makes the copy (a transpose:
// NCHW -> NHWC when the tensor is stored NCHW, NHWC -> NCHW otherwise).
static kiln_status read_copy(const cuda_context *c, const kiln_cuda_ctx *ctx, uint32_t slot,
                             int32_t id, const kiln_tensor *src, kiln_tensor *view, int run) {
    const cuda_engine *e = c->engine;
    const kiln_cuda_layout *L = &e->layout;
    *view = *src;
    view->data = (uint8_t *)c->extras + e->extras.copy_off[id];
    if (run && L->xpose[slot] && kiln_tensor_numel(src) > 0) {
        KILN_CUDA_TRY(transpose_layout(ctx, view->data, src, L->nhwc[id],
                                       L->padc[id] ? pad8(src->dims[1]) : src->dims[1]));
    }
    return KILN_OK;
}

// Head layer li's layout fields in ctx, its reads of copies pointed at views[] (cuda_layout.h).
// An NHWC group's elementwise operands must have the output's shape (or one element) at these
// shapes too.
// t [N or 1, C, 1, 1] against out [N, C, H, W] (cuda_layout.c: per_channel).
static int per_channel(const kiln_tensor *t, const kiln_tensor *out) {
    return t != NULL && t->rank == 4 && out->rank == 4 && t->dims[2] == 1 && t->dims[3] == 1 &&
           t->dims[1] == out->dims[1] && (t->dims[0] == 1 || t->dims[0] == out->dims[0]);
}

// *dst = t with its dims in NHWC order ([N, C, H, W] stored NHWC is [N, H, W, C] contiguous; a
// [N, C, 1, 1] or one-element tensor is the same bytes either way).
static const kiln_tensor *nhwc_order(const kiln_tensor *t, kiln_tensor *dst) {
    if (t == NULL || t->rank != 4) return t;
    *dst = *t;
    dst->dims[1] = t->dims[2];
    dst->dims[2] = t->dims[3];
    dst->dims[3] = t->dims[1];
    return dst;
}

static kiln_status layer_layout(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx,
                                kiln_kernel_args *args, kiln_tail_op *tails, kiln_tensor *views,
                                kiln_tensor *nhwc, int run) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    const kiln_cuda_layout *L = &e->layout;
    const kiln_plan_layer *l = &p->layers[li];
    uint32_t nv = 0;
    ctx->nhwc = L->head_nhwc[li];
    ctx->out_nchw = L->out_nchw[li];
    ctx->out_nhwc = L->out_nhwc[li];
    ctx->in_nhwc = L->in_nhwc[li];
    for (uint32_t j = 0; j < l->n_inputs && j < KILN_MAX_INPUTS; j++) {
        uint32_t slot = l->input_begin + j;
        if (!L->alt[slot] || args->in[j] == NULL) continue;
        KILN_CUDA_TRY(read_copy(c, ctx, slot, p->ids[slot], args->in[j], &views[nv], run));
        args->in[j] = &views[nv++];
    }
    int32_t running = p->ids[l->output_begin];
    for (uint32_t t = 0; t < l->n_tail && t < KILN_MAX_TAIL; t++) {
        const kiln_plan_layer *tl = &p->layers[li + 1 + t];
        for (uint32_t j = 0; j < tl->n_inputs && tails[t].operand != NULL; j++) {
            uint32_t slot = tl->input_begin + j;
            if (p->ids[slot] == running || !L->alt[slot]) continue;
            KILN_CUDA_TRY(read_copy(c, ctx, slot, p->ids[slot], tails[t].operand, &views[nv], run));
            tails[t].operand = &views[nv++];
        }
        running = p->ids[tl->output_begin];
    }
    if (!ctx->nhwc) return KILN_OK;
    if (args->op == KILN_OP_CONV2D && L->stem[li]) {
        ctx->stem = 1; // x NCHW, the OIHW weight: nothing to point at
    } else if (args->op == KILN_OP_CONV2D) {
        int32_t w = p->ids[l->input_begin + 1], x = p->ids[l->input_begin];
        ctx->w_krsc = (const uint8_t *)e->weights + e->krsc_offsets[w];
        ctx->w_krsc_cs = L->padc[w] ? pad8(p->tensors[w].shape.max[1]) : p->tensors[w].shape.max[1];
        if (L->padc[x] && L->alt[l->input_begin] && args->in[0] != NULL) {
            ctx->x_cpad = pad8(args->in[0]->dims[1]);
        }
    }
    int ok = 1, chan = 0;
    const int ew =
        args->op != KILN_OP_CONV2D && args->n_in <= 2 && kiln_cuda_eltwise_arity(args->op) > 0;
    if (args->op == KILN_OP_CAT) { // every input and operand NHWC-ordered (kiln_cuda_cat)
        uint32_t k = 0;
        for (uint32_t j = 0; j < args->n_in && k < KILN_MAX_INPUTS; j++) {
            args->in[j] = nhwc_order(args->in[j], &nhwc[k++]);
        }
        for (uint32_t t = 0; t < args->n_tail; t++) {
            const kiln_tensor *o = args->tail[t].operand;
            if (o != NULL && !same_dims_or_one(o, args->out) && !per_channel(o, args->out)) {
                return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                                      "%s: a tail operand's shape differs from the output's in an "
                                      "NHWC layer; set the option cuda.nhwc to false",
                                      ctx->where ? ctx->where : "?");
            }
            tails[t].operand = nhwc_order(o, &nhwc[KILN_MAX_INPUTS + t]);
        }
        args->out = (kiln_tensor *)nhwc_order(args->out, &nhwc[KILN_MAX_INPUTS + KILN_MAX_TAIL]);
        return KILN_OK;
    }
    if (ew && args->n_in == 2) {
        for (uint32_t j = 0; j < 2; j++) {
            int pc =
                !same_dims_or_one(args->in[j], args->out) && per_channel(args->in[j], args->out);
            chan |= pc;
            ok = ok && (pc || same_dims_or_one(args->in[j], args->out));
        }
    }
    if (ew) { // a per-channel tail operand (a batch norm's shift after its scale)
        for (uint32_t t = 0; t < args->n_tail; t++) {
            const kiln_tensor *o = args->tail[t].operand;
            chan |= o != NULL && !same_dims_or_one(o, args->out) && per_channel(o, args->out);
        }
    }
    if (ok && chan) { // a per-channel operand: the layer sees every tensor in NHWC order
        uint32_t k = 0;
        for (uint32_t t = 0; t < args->n_tail; t++) {
            ok = ok && (same_dims_or_one(args->tail[t].operand, args->out) ||
                        per_channel(args->tail[t].operand, args->out));
        }
        if (!ok) {
            return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                                  "%s: an operand's shape differs from the output's in an NHWC "
                                  "layer; set the option cuda.nhwc to false",
                                  ctx->where ? ctx->where : "?");
        }
        for (uint32_t j = 0; j < args->n_in; j++) args->in[j] = nhwc_order(args->in[j], &nhwc[k++]);
        for (uint32_t t = 0; t < args->n_tail; t++) {
            tails[t].operand = nhwc_order(tails[t].operand, &nhwc[k++]);
        }
        args->out = (kiln_tensor *)nhwc_order(args->out, &nhwc[k]);
        return KILN_OK;
    }
    for (uint32_t t = 0; t < args->n_tail; t++) {
        ok = ok && same_dims_or_one(args->tail[t].operand, args->out);
    }
    if (!ok) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "%s: an operand's shape differs from the output's in an NHWC layer; "
                              "set the option cuda.nhwc to false",
                              ctx->where ? ctx->where : "?");
    }
    return KILN_OK;
}

// An sdpa or matmul layer whose operands the attention fold turned into strided views: points
// ctx->sdpa_io at them (views[4] is the storage; a matmul's a and b are 0 and 1).
static void sdpa_fold_views(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx,
                            kiln_cuda_strided *views) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    memset(ctx->sdpa_io, 0, sizeof ctx->sdpa_io);
    ctx->mm_alpha = e->fold.mm_alpha[li];
    if (e->fold.sdpa_in[li] == 0 && e->fold.sdpa_out[li] < 0) return;
    for (uint32_t j = 0; j < 3; j++) {
        if (!(e->fold.sdpa_in[li] & (1u << j))) continue;
        kiln_cuda_fold_view(p, &e->fold, c->views, p->ids[p->layers[li].input_begin + j],
                            &views[j]);
        ctx->sdpa_io[j] = &views[j];
    }
    if (e->fold.sdpa_out[li] >= 0) {
        kiln_cuda_fold_out_view(p, &e->fold, c->views, li, &views[3]);
        ctx->sdpa_io[3] = &views[3];
    }
}

// A GEMV linear with folds (cuda_fold.h): the folded norm's input, weight and eps, the pair's up
// projection and the gate's activation into ctx.
static void gemv_fold_args(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    ctx->gemv_x = ctx->gemv_norm_w = ctx->gemv_up_w = ctx->gemv_up_b = NULL;
    ctx->gemv_eps = 0.0f;
    ctx->gemv_act = 0;
    ctx->gemv_n_sib = 0;
    for (int32_t k = e->fold.gemv_next[li]; k >= 0 && ctx->gemv_n_sib < KILN_CUDA_GEMV_MAX_SIB - 1;
         k = e->fold.gemv_next[k]) {
        const kiln_plan_layer *kl = &p->layers[k];
        const int i = ctx->gemv_n_sib++;
        ctx->gemv_sib_w[i] = &c->views[p->ids[kl->input_begin + 1]];
        ctx->gemv_sib_b[i] = kl->n_inputs > 2 && p->ids[kl->input_begin + 2] >= 0
                                 ? &c->views[p->ids[kl->input_begin + 2]]
                                 : NULL;
        ctx->gemv_sib_y[i] = &c->views[p->ids[kl->output_begin]];
        ctx->gemv_sib_keep[i] = e->l2_keep[k];
    }
    const int32_t n = e->fold.gemv_norm[li], u = e->fold.gemv_pair[li];
    if (n >= 0) {
        const kiln_plan_layer *nl = &p->layers[n];
        kiln_attrs a = kiln_plan_layer_attrs(p, nl);
        ctx->gemv_x = &c->views[p->ids[nl->input_begin]];
        if (nl->n_inputs > 1 && p->ids[nl->input_begin + 1] >= 0) {
            ctx->gemv_norm_w = &c->views[p->ids[nl->input_begin + 1]];
        }
        ctx->gemv_eps = (float)kiln_attrs_float(&a, KILN_A_RMS_EPS, 0);
    }
    if (u >= 0) {
        const kiln_plan_layer *ul = &p->layers[u], *act = &p->layers[li + 1];
        ctx->gemv_up_w = &c->views[p->ids[ul->input_begin + 1]];
        if (ul->n_inputs > 2 && p->ids[ul->input_begin + 2] >= 0) {
            ctx->gemv_up_b = &c->views[p->ids[ul->input_begin + 2]];
        }
        if (act->op == KILN_OP_SILU) {
            ctx->gemv_act = KILN_CUDA_GEMV_ACT_SILU;
        } else if (act->op == KILN_OP_RELU) {
            ctx->gemv_act = KILN_CUDA_WG_EPI_RELU;
        } else {
            kiln_attrs a = kiln_plan_layer_attrs(p, act);
            ctx->gemv_act = kiln_attrs_int(&a, KILN_A_GELU_APPROXIMATE, 0) != 0
                                ? KILN_CUDA_WG_EPI_GELU_TANH
                                : KILN_CUDA_WG_EPI_GELU_ERF;
        }
    }
}

// A rope group's q rotary (cuda_fold.h): the members' tensors into ctx, and the views of the
// inputs it reads through folded permutes (views[3] is the storage).
static void rope_fold_args(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx,
                           kiln_cuda_strided *views) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    ctx->rope_kx = ctx->rope_idx = ctx->rope_vsrc = NULL;
    ctx->rope_kcache = ctx->rope_vcache = NULL;
    ctx->rope_kwrap = ctx->rope_vwrap = 0;
    memset(ctx->rope_in, 0, sizeof ctx->rope_in);
    if (e->fold.rope_k[li] < 0) return;
    int32_t in[3] = {p->ids[p->layers[li].input_begin], -1, -1}; // q's x, k's x, value rows
    in[1] = p->ids[p->layers[e->fold.rope_k[li]].input_begin];
    if (e->fold.rope_vc[li] >= 0) in[2] = p->ids[p->layers[e->fold.rope_vc[li]].input_begin + 2];
    for (uint32_t j = 0; j < 3; j++) {
        kiln_cuda_fold_rope_view(p, &e->fold, c->views, in[j], &views[j]);
        if (views[j].rank > 0) ctx->rope_in[j] = &views[j];
    }
    const kiln_plan_layer *kl = &p->layers[e->fold.rope_k[li]];
    const kiln_plan_layer *kc = &p->layers[e->fold.rope_kc[li]];
    kiln_attrs a = kiln_plan_layer_attrs(p, kc);
    ctx->rope_kx = &c->views[p->ids[kl->input_begin]];
    ctx->rope_kcache = &c->views[p->ids[kc->input_begin]];
    ctx->rope_idx = &c->views[p->ids[kc->input_begin + 1]];
    ctx->rope_kwrap = (int)kiln_attrs_int(&a, KILN_A_INDEX_COPY_WRAP, 0);
    if (e->fold.rope_vc[li] >= 0) {
        const kiln_plan_layer *vc = &p->layers[e->fold.rope_vc[li]];
        kiln_attrs b = kiln_plan_layer_attrs(p, vc);
        ctx->rope_vcache = &c->views[p->ids[vc->input_begin]];
        ctx->rope_vsrc = &c->views[p->ids[vc->input_begin + 2]];
        ctx->rope_vwrap = (int)kiln_attrs_int(&b, KILN_A_INDEX_COPY_WRAP, 0);
    }
}

// A mean ratio's MEAN (cuda_fold.h): the add's eps and the div's output into ctx.
static void ratio_fold_args(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    ctx->ratio_y = NULL;
    ctx->ratio_eps = NULL;
    if (e->fold.ratio_div[li] < 0) return;
    const kiln_plan_layer *al = &p->layers[e->fold.ratio_add[li]];
    const kiln_plan_layer *dl = &p->layers[e->fold.ratio_div[li]];
    const int32_t mo = p->ids[p->layers[li].output_begin];
    const int32_t a0 = p->ids[al->input_begin], a1 = p->ids[al->input_begin + 1];
    ctx->ratio_eps = &c->views[a0 == mo ? a1 : a0];
    ctx->ratio_y = &c->views[p->ids[dl->output_begin]];
    ctx->ratio_mean_dtype = p->tensors[mo].dtype;
    ctx->ratio_add_dtype = p->tensors[p->ids[al->output_begin]].dtype;
}

// A softmax-weighted sum's SUM (cuda_fold.h): the softmax's input and the mul's x into ctx.
static void wsum_fold_args(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    ctx->wsum_s = ctx->wsum_x = NULL;
    if (e->fold.wsum_sm[li] < 0) return;
    const kiln_plan_layer *sl = &p->layers[e->fold.wsum_sm[li]];
    const kiln_plan_layer *ml = &p->layers[e->fold.wsum_mul[li]];
    const int32_t so = p->ids[sl->output_begin], m0 = p->ids[ml->input_begin];
    ctx->wsum_s = &c->views[p->ids[sl->input_begin]];
    ctx->wsum_x = &c->views[m0 == so ? p->ids[ml->input_begin + 1] : m0];
    ctx->wsum_sm_dtype = p->tensors[so].dtype;
    ctx->wsum_mul_dtype = p->tensors[p->ids[ml->output_begin]].dtype;
}

// An overflow clamp's ABS (cuda_fold.h): the MINIMUM's output and the WHERE's constants into ctx.
static void clamp_fold_args(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    ctx->clamp_y = NULL;
    if (e->fold.clamp_mn[li] < 0) return;
    ctx->clamp_y = &c->views[p->ids[p->layers[e->fold.clamp_mn[li]].output_begin]];
    ctx->clamp_a = e->fold.clamp_ab[2 * li];
    ctx->clamp_b = e->fold.clamp_ab[2 * li + 1];
}

// Conv prologues (cuda_fold.h): the conv P whose tail a depthwise conv D applies runs without it;
// D gets P's tail ops (their one-element operands are weights: no layout copies).
static void pre_fold_args(const cuda_context *c, uint32_t li, cuda_bound *b) {
    const cuda_engine *e = c->engine;
    b->ctx.pre = NULL;
    b->ctx.n_pre = 0;
    if (e->fold.pre_dst[li] >= 0) b->args.n_tail = 0;
    const int32_t pl = e->fold.pre_src[li];
    if (pl < 0) return;
    kiln_kernel_args pa;
    kiln_plan_group_args(e->plan, (uint32_t)pl, c->views, b->pre, &pa);
    b->ctx.pre = b->pre;
    b->ctx.n_pre = pa.n_tail;
}

kiln_status kiln_cuda_layer_bind(const cuda_context *c, uint32_t li, cuda_bound *b, int run) {
    const cuda_engine *e = c->engine;
    kiln_cuda_ctx *ctx = &b->ctx;
    snprintf(b->where, sizeof b->where, "layer %u (%s)", li,
             kiln_cuda_op_name(e->plan->layers[li].op));
    ctx->nhwc = 0;
    ctx->w_krsc = NULL;
    ctx->x_cpad = 0;
    ctx->stem = 0;
    ctx->out_nchw = 0;
    ctx->out_nhwc = 0;
    ctx->in_nhwc = 0;
    ctx->l2_keep = e->l2_keep[li];
    ctx->sdpa_store = e->plan->layers[li].op == KILN_OP_SDPA ? c->sdpa_store : NULL;
    ctx->choice = NULL;
    kiln_plan_group_args(e->plan, li, c->views, b->tails, &b->args);
    pre_fold_args(c, li, b);
    KILN_CUDA_TRY(layer_layout(c, li, ctx, &b->args, b->tails, b->views, b->nhwc, run));
    sdpa_fold_views(c, li, ctx, b->sdpa_io);
    gemv_fold_args(c, li, ctx);
    rope_fold_args(c, li, ctx, b->rope_views);
    ratio_fold_args(c, li, ctx);
    wsum_fold_args(c, li, ctx);
    clamp_fold_args(c, li, ctx);
    return KILN_OK;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

// A layout permute (cuda_layout.h) whose output the fold pass could not alias: its output holds
// exactly its input's bytes (one of them stored NHWC), so it is a copy of them.
static kiln_status ident_copy(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *y = args->out;
    if (x == NULL || x->data == y->data || kiln_tensor_numel(y) <= 0) return KILN_OK;
    const size_t n = (size_t)kiln_tensor_numel(y) * kiln_cuda_dtype_size(y->dtype);
    cudaError_t err = cudaMemcpyAsync(y->data, x->data, n, cudaMemcpyDeviceToDevice, ctx->stream);
    return err == cudaSuccess ? KILN_OK
                              : kiln_cuda_error(ctx, "cudaMemcpyAsync (layout permute)", err);
}

kiln_status kiln_cuda_layers_run(cuda_context *c, cudaStream_t stream) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    cuda_bound b;
    kiln_cuda_bound_init(c, stream, &b);
    int profiling = c->prof.ev != NULL;
    c->prof.n = 0;
    if (profiling) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess ||
            cap != cudaStreamCaptureStatusNone) {
            kiln_cuda_consume();
            profiling = 0; // a caller's capture: events cannot be timed
        }
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if (e->fold.virt[li]) continue; // folded into an sdpa: no kernel (cuda_fold.h)
        const double t0 = profiling ? now_us() : 0.0;
        if (profiling) {
            KILN_CUDA_TRY(kiln_cuda_profile_begin(&c->prof, li, stream,
                                                  (unsigned)e->policy.profile_delay_us));
        }
        KILN_CUDA_TRY(kiln_cuda_layer_bind(c, li, &b, 1));
        if (e->layout.ident[li] || e->layout.rs_xpose[li]) {
            // a layout permute not aliased: the same bytes, copied; a reshape of an NHWC map:
            // the map's NCHW bytes
            KILN_CUDA_TRY(e->layout.ident[li] ? ident_copy(&b.ctx, &b.args)
                                              : reshape_transpose(&b.ctx, &b.args));
            if (profiling) {
                KILN_CUDA_TRY(kiln_cuda_profile_end(&c->prof, li, stream, now_us() - t0));
            }
            continue;
        }
        kiln_cuda_layer_plan *plan = NULL;
        if (kiln_cuda_op_planned(b.args.op)) {
            cuda_layer *L = &c->layers[li];
            plan = &L->tuned;
            L->last_now = 0;
            if (!kiln_cuda_plan_current(&b.ctx, &b.args, plan)) {
                plan = &L->now;
                L->last_now = 1;
                if (!kiln_cuda_plan_current(&b.ctx, &b.args, plan)) {
                    KILN_CUDA_TRY(kiln_cuda_plan(&b.ctx, &b.args, 0, plan));
                }
            }
        }
        KILN_CUDA_TRY(kiln_cuda_run(&b.ctx, &b.args, plan));
        if (profiling) {
            KILN_CUDA_TRY(kiln_cuda_profile_end(&c->prof, li, stream, now_us() - t0));
        }
        if (e->policy.debug_sync) { // finds the layer of an asynchronous fault
            cudaError_t err = cudaStreamSynchronize(stream);
            if (err != cudaSuccess) {
                return kiln_cuda_error(&b.ctx, "cudaStreamSynchronize (cuda.debug_sync)", err);
            }
        }
    }
    if (!profiling) c->prof.n = 0;
    return KILN_OK;
}

int kiln_cuda_layers_enqueue(void *context) {
    cuda_context *c = context;
    return kiln_cuda_layers_run(c, c->stream) == KILN_OK;
}
