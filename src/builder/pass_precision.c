// SPDX-License-Identifier: Apache-2.0
// Precision conversion (options.precision = fp16 or bf16): every float32 weight and activation
// of the graph becomes the target dtype; the engine's bindings keep their dtypes through casts
// at the boundary (float32 inputs are cast once, right after the input; float32 outputs are
// cast back at the end). Explicit casts to float32 inside the model cast to the target instead.
// Norm and softmax kernels accumulate in float32 whatever the storage dtype.
//
// Position math stays float32: a float32 value computed only from integer tensors, small float
// constants (at most KILN_PRECISION_SMALL_CONST elements: rotary inverse frequencies, scales) and
// other such values (rotary cos/sin tables from position ids, masks built from positions) keeps
// its dtype, explicit casts to float32 included, and is cast to the target once where another
// node reads it (except by rotary, which takes float32 cos/sin tables with a 16-bit x as they
// are, and grid_sample, which takes a float32 grid: RAFT's coordinate grid from aranges). In half
// precision a position of a few hundred loses its low bits, and a rotary angle computed from it is
// off by radians. States are internal to the engine: a float32 state becomes a state of the target
// dtype (its initial value converted), so that a KV cache is stored and read at the compute
// precision.
#include <math.h>
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"

// A finite float32 beyond the target's range becomes the target's largest finite value of its
// sign, not infinity: a model's "minus infinity" written as torch.finfo(torch.float32).min (an
// attention mask's fill) stays finite, as the same model gets torch.finfo(dtype).min when it runs
// in that dtype, and a row masked whole stays a row of equal finite scores (softmax: uniform)
// instead of -inf everywhere (softmax: NaN). Infinities and NaN stay as they are.
static void store_saturated(void *data, uint32_t target, int64_t i, float f) {
    const float max = target == KILN_DTYPE_F16 ? 65504.0f : 3.38953139e38f;
    if (isfinite(f) && fabsf(f) > max) f = copysignf(max, f);
    kiln_store_f32(data, target, i, f);
}

static kiln_status convert_const(kiln_bgraph *b, int32_t v, uint32_t target, int32_t *out) {
    const kiln_bvalue *src = &b->values[v];
    uint64_t numel = src->nbytes / 4;
    kiln_shape s = src->desc.shape;
    void *data;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)(numel * 2), &data));
    src = &b->values[v];
    for (uint64_t i = 0; i < numel; i++) {
        store_saturated(data, target, (int64_t)i, ((const float *)src->data)[i]);
    }
    return kiln_bgraph_add_const(b, target, &s, data, numel * 2, out);
}

static kiln_status cast_node(kiln_bgraph *b, int32_t v, uint32_t to, int64_t seq, int32_t *out) {
    kiln_attr_ref ref = {KILN_ATTR_INTS, 1, 0};
    int64_t dt = (int64_t)to;
    kiln_attrs a = {&ref, 1, &dt, NULL};
    KILN_TRY(kiln_bgraph_add_node(b, KILN_OP_CAST, &v, 1, &a, seq, out));
    b->stats.n_casts++;
    return KILN_OK;
}

#define KILN_PRECISION_SMALL_CONST 4096

// Whether node n computes position math (see above): every present input is an integer or bool
// value, a small constant, or position math itself.
static int is_position_math(const kiln_bgraph *b, const kiln_bnode *n, const uint8_t *keep,
                            const uint8_t *was_f32, size_t n_orig_vals) {
    int runtime = 0;
    if (!was_f32[n->output]) return 0;
    // A lookup into a float table gives the table's values: nothing to keep.
    if (n->op == KILN_OP_EMBEDDING || n->op == KILN_OP_GATHER || n->op == KILN_OP_INDEX) {
        int32_t data = kiln_bgraph_input(b, n, 0);
        if (data >= 0 && b->values[data].kind == KILN_IR_CONSTANT) return 0;
    }
    for (uint32_t j = 0; j < n->n_inputs; j++) {
        int32_t v = b->ids[n->input_begin + j];
        const kiln_bvalue *bv;
        if (v < 0) continue;
        if ((size_t)v >= n_orig_vals) return 0;
        bv = &b->values[v];
        if (bv->kind == KILN_IR_CONSTANT) {
            uint64_t numel;
            if (kiln_dtype_is_float((kiln_dtype)bv->desc.dtype) &&
                (!kiln_shape_max_numel(&bv->desc.shape, &numel) ||
                 numel > KILN_PRECISION_SMALL_CONST)) {
                return 0;
            }
            continue;
        }
        if (bv->kind == KILN_IR_STATE) return 0;
        runtime = 1;
        if (keep[v]) continue;
        if (kiln_dtype_is_float((kiln_dtype)bv->desc.dtype)) return 0;
    }
    return runtime;
}

// Casts that convert nothing (a float32 cast retargeted to the target dtype, as the float32 norms
// of HF models compute: x.float() ... .to(x.dtype)) are removed: their readers read the input.
// Kept: casts fused with other ops, graph outputs and state updates, casts of a state.
static kiln_status drop_identity_casts(kiln_bgraph *b) {
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t i = 0; i < b->n_nodes; i++) {
        kiln_bnode *n = &b->nodes[i];
        int32_t in, out = n->output;
        if (n->dead || n->op != KILN_OP_CAST || n->head >= 0 || n->n_tail != 0 ||
            n->n_inputs != 1 || b->is_output[out])
            continue;
        in = b->ids[n->input_begin];
        if (in < 0 || b->values[in].kind == KILN_IR_STATE ||
            !kiln_desc_equal(&b->values[in].desc, &b->values[out].desc))
            continue;
        for (size_t k = 0; k < b->n_nodes; k++) {
            const kiln_bnode *r = &b->nodes[k];
            if (r->dead) continue;
            for (uint32_t j = 0; j < r->n_inputs; j++) {
                if (b->ids[r->input_begin + j] == out) b->ids[r->input_begin + j] = in;
            }
        }
        n->dead = 1;
        b->values[out].kind = KILN_BV_DEAD;
    }
    return kiln_bgraph_count_uses(b);
}

kiln_status kiln_pass_precision(kiln_bgraph *b) {
    uint32_t target;
    size_t n_orig_vals = b->n_values, n_orig_nodes = b->n_nodes, map_nbytes;
    int32_t *map = NULL;   // F32 input/constant value -> its converted value
    int32_t *castv = NULL; // position-math value -> its cast to the target
    uint8_t *was_f32 = NULL, *keep = NULL;
    kiln_status st = KILN_OK;
    if (b->opts.precision == KILN_PRECISION_FP32) return KILN_OK;
    target = b->opts.precision == KILN_PRECISION_FP16 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
    KILN_TRY(kiln_bgraph_count_uses(b));
    map_nbytes = n_orig_vals * sizeof *map;
    map = kiln_malloc(map_nbytes, KILN_ALIGN);
    castv = kiln_malloc(map_nbytes, KILN_ALIGN);
    was_f32 = kiln_malloc(n_orig_vals, KILN_ALIGN);
    keep = kiln_calloc(n_orig_vals, KILN_ALIGN);
    if (map == NULL || castv == NULL || was_f32 == NULL || keep == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory in precision conversion");
        goto done;
    }
    for (size_t v = 0; v < n_orig_vals; v++) {
        map[v] = castv[v] = -1;
        was_f32[v] = b->values[v].desc.dtype == KILN_DTYPE_F32;
    }
    for (size_t i = 0; i < n_orig_nodes; i++) {
        const kiln_bnode *n = &b->nodes[i];
        if (!n->dead && (size_t)n->output < n_orig_vals &&
            is_position_math(b, n, keep, was_f32, n_orig_vals)) {
            keep[n->output] = 1;
        }
    }
    // Boundary casts for float32 inputs, converted copies of float32 constants (read by nodes).
    for (size_t i = 0; i < b->n_inputs && st == KILN_OK; i++) {
        int32_t v = b->inputs[i];
        if (was_f32[v] && b->uses[v] > 0) {
            st = cast_node(b, v, target, KILN_SEQ_INPUT_CAST + (int64_t)i, &map[v]);
        }
    }
    for (size_t v = 0; v < n_orig_vals && st == KILN_OK; v++) {
        if (b->values[v].kind == KILN_IR_CONSTANT && was_f32[v] && b->uses[v] > 0) {
            st = convert_const(b, (int32_t)v, target, &map[v]);
        }
    }
    for (size_t k = 0; k < b->n_states && st == KILN_OK; k++) {
        kiln_bstate *ks = &b->states[k];
        kiln_bvalue *v = &b->values[ks->value];
        if (!was_f32[ks->value]) continue;
        if (ks->data != NULL) {
            uint64_t numel = ks->nbytes / 4;
            void *data;
            st = kiln_bgraph_blob(b, (size_t)(numel * 2), &data);
            if (st != KILN_OK) break;
            v = &b->values[ks->value];
            for (uint64_t i = 0; i < numel; i++) {
                store_saturated(data, target, (int64_t)i, ((const float *)ks->data)[i]);
            }
            ks->data = v->data = data;
            ks->nbytes = v->nbytes = numel * 2;
        } else {
            ks->nbytes = v->nbytes = ks->nbytes / 2;
        }
        v->desc.dtype = target;
    }
    // The caller's nodes, in order (producers before readers): remap, retarget casts, re-infer.
    for (size_t i = 0; i < n_orig_nodes && st == KILN_OK; i++) {
        kiln_bnode *n = &b->nodes[i];
        kiln_value_desc d;
        int kept;
        if (n->dead) continue;
        kept = (size_t)n->output < n_orig_vals && keep[n->output];
        for (uint32_t j = 0; j < n->n_inputs && !kept && st == KILN_OK; j++) {
            int32_t v = b->ids[n->input_begin + j];
            if (v < 0 || (size_t)v >= n_orig_vals) continue;
            // rotary reads its cos and sin tables in float32 (exact angles), grid_sample its
            // grid (exact pixel positions): no cast for them
            if (keep[v] && n->op != KILN_OP_CAST && !(n->op == KILN_OP_ROTARY && j >= 1) &&
                !(n->op == KILN_OP_GRID_SAMPLE && j == 1)) {
                if (castv[v] < 0) { // emitted right after its producer (same key, later index)
                    int64_t seq = b->nodes[b->values[v].index].seq;
                    st = cast_node(b, v, target, seq, &castv[v]);
                    if (st != KILN_OK) break;
                    n = &b->nodes[i];
                }
                b->ids[n->input_begin + j] = castv[v];
            } else if (map[v] >= 0) {
                b->ids[n->input_begin + j] = map[v];
            }
        }
        if (st != KILN_OK) break;
        if (n->op == KILN_OP_CAST && !kept) {
            kiln_attrs a = kiln_bgraph_attrs(b, n);
            if (kiln_attrs_int(&a, KILN_A_CAST_DTYPE, 0) == KILN_DTYPE_F32) {
                b->ints[a.refs[KILN_A_CAST_DTYPE].begin] = target;
            }
        }
        st = kiln_bgraph_infer(b, (uint32_t)i, &d);
        if (st == KILN_OK) b->values[n->output].desc = d;
    }
    // Float32 outputs computed in the target dtype are cast back (once per value).
    for (size_t i = 0; i < b->n_outputs && st == KILN_OK; i++) {
        int32_t v = b->outputs[i].value, w = -1;
        if ((size_t)v >= n_orig_vals || !was_f32[v] || b->values[v].kind != KILN_IR_NODE ||
            b->values[v].desc.dtype == KILN_DTYPE_F32) {
            continue;
        }
        if (map[v] < 0) {
            st = cast_node(b, v, KILN_DTYPE_F32, KILN_SEQ_OUTPUT_CAST + (int64_t)i, &w);
            if (st != KILN_OK) break;
            map[v] = w;
        }
        b->outputs[i].value = map[v];
    }
    if (st == KILN_OK && b->opts.optimize) st = drop_identity_casts(b);
done:
    kiln_free(map, map_nbytes);
    kiln_free(castv, map_nbytes);
    kiln_free(was_f32, n_orig_vals);
    kiln_free(keep, n_orig_vals);
    return st;
}
