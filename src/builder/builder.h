// SPDX-License-Identifier: Apache-2.0
// The builder's working graph and its passes (docs/builder.md). kiln_build copies the caller's
// graph into a kiln_bgraph, runs the passes in order, lays out the plan and serializes it:
//
//   verify -> [optimize: dce -> fold -> bn_fold -> matmul_to_linear -> patchify -> views
//              -> attention -> llm -> act -> views -> bn_fold -> cse -> dce -> fuse]
//          -> precision -> [optimize: fuse_ew] -> lower_io -> check
//          -> emit (tensors, layers, memory plan, weights)
//
// The working graph mirrors src/ir/graph.h with what the passes need: nodes can die, gain
// inputs, change op, carry a fused tail; constants can be computed (owned blobs) or borrowed
// from the caller's graph; every node has an emission key `seq`. Values and nodes only grow
// (indices stay valid); pointers into the arrays do not survive an add.
#ifndef KILN_BUILDER_BUILDER_H
#define KILN_BUILDER_BUILDER_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "core/plan_memory.h"
#include "ir/graph.h"
#include "ir/shape.h"
#include "kiln/kiln.h"
#include "runtime/kernel.h"
#include "runtime/plan.h"

// Value kinds: those of kiln_ir_value_kind (a STATE value's data and nbytes are its initial
// value, NULL for zeros), plus orphans (no longer produced by any node).
#define KILN_BV_DEAD 0u

typedef struct kiln_bvalue {
    uint32_t kind;    // KILN_IR_INPUT / KILN_IR_CONSTANT / KILN_IR_NODE / KILN_BV_DEAD
    uint32_t index;   // INPUT: input number; NODE: producing node
    const char *name; // "" when unnamed (borrowed from the source graph or a literal)
    kiln_value_desc desc;
    const void *data; // CONSTANT: nbytes bytes (the source graph's, or a blob of the bgraph)
    uint64_t nbytes;
} kiln_bvalue;

typedef struct kiln_bnode {
    uint32_t op;
    uint32_t input_begin, n_inputs; // into ids (-1: absent optional input)
    uint32_t attr_begin;            // into attr_refs; the op's schema count
    int32_t output;                 // value id
    int64_t seq;                    // emission key (KILN_SEQ_*)
    int32_t head;                   // a fused tail: its head node; -1 otherwise
    uint32_t n_tail;                // a head: its fused tail nodes, in order
    int32_t tails[KILN_MAX_TAIL];
    uint8_t dead;
} kiln_bnode;

// Emission keys: input casts first, then the caller's nodes in their order, then output casts,
// then output copies.
#define KILN_SEQ_INPUT_CAST INT64_C(0)
#define KILN_SEQ_NODE (INT64_C(1) << 32)
#define KILN_SEQ_OUTPUT_CAST (INT64_C(2) << 32)
#define KILN_SEQ_OUTPUT_COPY (INT64_C(3) << 32)

typedef struct kiln_boutput {
    int32_t value;
    const char *name;
} kiln_boutput;

// A state (kiln_graph_add_state; plan.h KILN_TENSOR_STATE).
typedef struct kiln_bstate {
    int32_t value;    // the STATE value (reads the state as execute finds it)
    int32_t update;   // the value it takes at the end of execute, or -1
    int32_t write;    // set by I/O lowering: the value whose layer writes the state, or -1
    const void *data; // initial value (nbytes bytes), or NULL: zeros
    uint64_t nbytes;
} kiln_bstate;

typedef struct kiln_bblob {
    void *data;
    size_t nbytes;
} kiln_bblob;

// What the passes did (for logs and tests).
typedef struct kiln_build_stats {
    uint32_t n_dead;          // nodes removed by dead-code elimination
    uint32_t n_folded;        // nodes evaluated at build time
    uint32_t n_bn_folded;     // batch norms folded into a conv2d/linear
    uint32_t n_bn_split;      // other batch norms turned into a per-channel multiply and add
    uint32_t n_ew_heads;      // elementwise ops and concatenations that carry a fused tail
    uint32_t n_linear;        // matmuls with a constant weight turned into linear
    uint32_t n_gather_matmul; // matmuls of gathered matrices turned into gather_matmul
    uint32_t n_scan;          // unrolled selective scans turned into selective_scan
    uint32_t n_bias_fused;    // adds that became a head's bias
    uint32_t n_tail_fused;    // elementwise ops fused as tails
    uint32_t n_casts;         // casts inserted by precision conversion
    uint32_t n_copies;        // copies inserted by I/O lowering
    uint32_t n_select;        // slice + squeeze pairs turned into select
    uint32_t n_qkv_merged;    // sdpa whose q, k, v projections became one linear
    uint32_t n_heads_merged;  // head projections of one x merged into one linear (and slices)
    uint32_t n_patchify;      // stride = kernel convolutions turned into a linear
    uint32_t n_pool_first;    // average pools moved before the pointwise conv they read
    uint32_t n_in_place;      // state updates written in place (index_copy into the state)
    uint32_t n_gqa;           // sdpa reading a repeated kv cache that now reads the cache itself
    uint32_t n_rms_norm; // RMSNorm chains (pow, mean, add, rsqrt, mul, ...) turned into rms_norm
    uint32_t n_l2_normalize; // x / max(|x|, eps) over the last dim turned into rms_norm
    uint32_t n_vector_norm;  // sqrt(sum(x^2)) turned into vector_norm
    uint32_t n_rotary; // rotate-half rotary chains (mul, slice, neg, cat, ...) turned into rotary
    uint32_t n_views;  // views rewritten as reshapes, reshape chains collapsed, identities removed
    uint32_t n_cse;    // nodes equal to an earlier one (op, inputs, attributes) removed
    uint32_t n_act;    // activations written as arithmetic turned into their op
    uint32_t n_causal; // sdpa masks equal to the causal mask turned into is_causal
    uint32_t n_eager_attention; // matmul, softmax, matmul attention turned into sdpa
} kiln_build_stats;

typedef struct kiln_bgraph {
    kiln_build_options opts;
    kiln_bvalue *values;
    size_t n_values, cap_values;
    kiln_bnode *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *ids;
    size_t n_ids, cap_ids;
    kiln_attr_ref *attr_refs;
    size_t n_attr_refs, cap_attr_refs;
    int64_t *ints;
    size_t n_ints, cap_ints;
    double *floats;
    size_t n_floats, cap_floats;
    int32_t *inputs; // graph inputs (value ids), in binding order
    size_t n_inputs, cap_inputs;
    kiln_boutput *outputs;
    size_t n_outputs, cap_outputs;
    kiln_bstate *states; // in state order (plan binding order)
    size_t n_states, cap_states;
    kiln_bblob *blobs; // data owned by the build (folded and converted constants)
    size_t n_blobs, cap_blobs;
    // Use information, refreshed by kiln_bgraph_count_uses (sized n_values at that time).
    uint32_t *uses;     // input slots of live nodes that read the value
    int32_t *user;      // the last live node reading the value (-1 if none)
    uint8_t *is_output; // marked as a graph output, or a state's update
    size_t n_use_info, cap_uses, cap_user, cap_is_output;
    kiln_build_stats stats;
    uint32_t n_views_runs; // how many times the view pass has run (it runs twice, build.c)
} kiln_bgraph;

// --- the working graph (bgraph.c)

kiln_status kiln_bgraph_init(kiln_bgraph *b, const kiln_graph *g, const kiln_build_options *o);
void kiln_bgraph_release(kiln_bgraph *b);

// Owned zeroed memory for constant data (KILN_DATA_ALIGN-aligned), freed with the bgraph.
kiln_status kiln_bgraph_blob(kiln_bgraph *b, size_t nbytes, void **out);
// Adds a constant value over data that outlives the bgraph (a blob, or the source graph's).
kiln_status kiln_bgraph_add_const(kiln_bgraph *b, uint32_t dtype, const kiln_shape *shape,
                                  const void *data, uint64_t nbytes, int32_t *out_value);
// Adds a node (attributes: a schema-complete view to copy, or NULL for all defaults), infers
// its output and returns the new value.
kiln_status kiln_bgraph_add_node(kiln_bgraph *b, uint32_t op, const int32_t *inputs,
                                 uint32_t n_inputs, const kiln_attrs *attrs, int64_t seq,
                                 int32_t *out_value);
// Replaces a node's inputs (any count within the op's arity; `inputs` must not point into
// the bgraph).
kiln_status kiln_bgraph_set_inputs(kiln_bgraph *b, uint32_t node, const int32_t *inputs,
                                   uint32_t n_inputs);
// A copy of a node's attributes in the caller's storage, for kiln_bgraph_add_node of a node with
// the same attributes (the bgraph's pools move when a node is added, so a view into them may not
// be passed). 0 when they do not fit (more than KILN_BATTRS_MAX_VALUES values).
#define KILN_BATTRS_MAX_VALUES 32
typedef struct kiln_battrs_copy {
    kiln_attr_ref refs[KILN_MAX_ATTRS];
    int64_t ints[KILN_BATTRS_MAX_VALUES];
    double floats[KILN_BATTRS_MAX_VALUES];
    kiln_attrs a; // the view of the copy
} kiln_battrs_copy;
int kiln_bgraph_copy_attrs(const kiln_bgraph *b, const kiln_bnode *n, kiln_battrs_copy *c);
// Re-runs shape inference for a node; writes the result to *out (does not store it).
kiln_status kiln_bgraph_infer(const kiln_bgraph *b, uint32_t node, kiln_value_desc *out);
// The node producing new_value takes over old_node's output value (its readers now read the new
// node's result; the descriptors must agree, else KILN_ERR_INTERNAL naming `what`) and old_node
// dies.
kiln_status kiln_bgraph_replace_node(kiln_bgraph *b, uint32_t old_node, int32_t new_value,
                                     const char *what);
// Reorders the nodes by (seq, index), the emission order, within a topological order: after a
// rewrite that appended nodes read by earlier ones, index order is a topological order again
// (what the later passes assume), also where nodes share a seq (a node split in two, one half
// rewritten later). Node indices change; value ids do not.
kiln_status kiln_bgraph_sort_nodes(kiln_bgraph *b);
// The only reader of v (read once, not an output) when it is a live plain node (no fused tail,
// not a tail), else -1; uses as of the last kiln_bgraph_count_uses.
int32_t kiln_bgraph_only_reader(const kiln_bgraph *b, int32_t v);
// Recomputes uses / user / is_output.
kiln_status kiln_bgraph_count_uses(kiln_bgraph *b);
// Reports one finished step to the options' progress callback (nothing without one); a nonzero
// return from the callback becomes KILN_ERR_INVALID_STATE, which stops the build.
kiln_status kiln_build_report(const kiln_build_options *o, kiln_build_phase phase, const char *name,
                              uint32_t step, uint32_t n_steps);

static inline kiln_attrs kiln_bgraph_attrs(const kiln_bgraph *b, const kiln_bnode *n) {
    const kiln_op_def *d = kiln_op_def_get(n->op);
    uint32_t na = d != NULL ? d->n_attrs : 0;
    kiln_attrs a = {na > 0 ? b->attr_refs + n->attr_begin : NULL, na, b->ints, b->floats};
    return a;
}
static inline const int32_t *kiln_bgraph_inputs(const kiln_bgraph *b, const kiln_bnode *n) {
    return b->ids + n->input_begin;
}
// The present input i of a node, or -1.
static inline int32_t kiln_bgraph_input(const kiln_bgraph *b, const kiln_bnode *n, uint32_t i) {
    return i < n->n_inputs ? b->ids[n->input_begin + i] : -1;
}
static inline int kiln_bgraph_is_const(const kiln_bgraph *b, int32_t v) {
    return v >= 0 && b->values[v].kind == KILN_IR_CONSTANT;
}
// True when dim i of a and dim j of c have the same range.
static inline int kiln_shape_same_dim(const kiln_shape *a, uint32_t i, const kiln_shape *c,
                                      uint32_t j) {
    return a->min[i] == c->min[j] && a->max[i] == c->max[j];
}
// True when a and c have the same rank and ranges.
static inline int kiln_shape_same(const kiln_shape *a, const kiln_shape *c) {
    if (a->rank != c->rank) return 0;
    for (uint32_t i = 0; i < a->rank; i++) {
        if (!kiln_shape_same_dim(a, i, c, i)) return 0;
    }
    return 1;
}
// True when two descriptors are the same dtype and ranges.
int kiln_desc_equal(const kiln_value_desc *a, const kiln_value_desc *b);
// Bytes of a value at its largest shape (false on overflow).
int kiln_desc_max_nbytes(const kiln_value_desc *d, uint64_t *out);

// --- passes (one file each)

kiln_status kiln_pass_verify(kiln_bgraph *b);           // pass_verify.c
kiln_status kiln_pass_dce(kiln_bgraph *b);              // pass_dce.c
kiln_status kiln_pass_fold(kiln_bgraph *b);             // pass_fold.c
kiln_status kiln_pass_bn_fold(kiln_bgraph *b);          // pass_bn_fold.c
kiln_status kiln_pass_matmul_to_linear(kiln_bgraph *b); // pass_linear.c
kiln_status kiln_pass_patchify(kiln_bgraph *b);         // pass_patchify.c
kiln_status kiln_pass_eager_attention(kiln_bgraph *b);  // pass_eager_attention.c
kiln_status kiln_pass_attention(kiln_bgraph *b);        // pass_attention.c
kiln_status kiln_pass_llm(kiln_bgraph *b);              // pass_llm.c: rms_norm, rotary
kiln_status kiln_pass_scan(kiln_bgraph *b);             // pass_scan.c: unrolled selective scans
kiln_status kiln_pass_act(kiln_bgraph *b);              // pass_act.c: activation formulas
kiln_status kiln_pass_views(kiln_bgraph *b);            // pass_views.c
kiln_status kiln_pass_cse(kiln_bgraph *b);              // pass_cse.c
kiln_status kiln_pass_fuse(kiln_bgraph *b);             // pass_fuse.c
kiln_status kiln_pass_fuse_ew(kiln_bgraph *b);          // pass_fuse.c: elementwise heads
kiln_status kiln_pass_precision(kiln_bgraph *b);        // pass_precision.c
kiln_status kiln_pass_lower_io(kiln_bgraph *b);         // pass_io.c
kiln_status kiln_pass_check(const kiln_bgraph *b);      // pass_verify.c: final consistency

// Largest output (bytes) constant folding evaluates.
#define KILN_FOLD_MAX_NBYTES ((uint64_t)16 << 20)

// --- emission (plan_emit.c)

typedef struct kiln_ext_weight {
    uint8_t digest[32]; // SHA-256 of the bytes
    uint32_t key;       // offset of "kiln-t-<hex>" in the plan's strings
    const void *data;   // borrowed from the bgraph (valid until kiln_bgraph_release)
    uint64_t nbytes;
} kiln_ext_weight;

// Lays out the plan of a checked bgraph. External weights (options.external_weights) are
// listed once per distinct content in *out_ext (kiln_malloc'd, *out_n_ext entries).
kiln_status kiln_bgraph_emit(const kiln_bgraph *b, kiln_plan *out, kiln_ext_weight **out_ext,
                             uint32_t *out_n_ext);

// --- the whole pipeline up to the plan (build.c); kiln_build serializes its result.

kiln_status kiln_build_plan(const kiln_graph *g, const kiln_build_options *o, kiln_plan *out,
                            kiln_build_stats *out_stats);

#endif // KILN_BUILDER_BUILDER_H
