// SPDX-License-Identifier: Apache-2.0
// Constant folding: a node whose inputs are all constants is evaluated at build time with the
// CPU reference backend (the same kernels the engine runs on the CPU); its output becomes a
// constant. Runs in node order, so chains fold (a permute of a reshape of a weight folds into one
// transposed weight). Ops the CPU backend does not implement for the dtypes at hand are left
// alone.
// An output up to KILN_FOLD_MAX_NBYTES always folds. A larger one folds only when it costs no
// weight bytes: when it is no larger than the constant inputs it consumes, those that only
// constant computations read (so they are dropped once the chain has folded) and that are not
// outputs. Weight normalization (w = g * v / |v|, as wav2vec2's positional convolution computes
// it on every call) then becomes the one weight w however large v is, while a weight that the
// engine also reads elsewhere (a tied embedding read by a gather and, transposed, by the
// logits head) is not copied. Permutes are left to the linear pass (which transposes a weight
// once, for all its matmuls).
#include <inttypes.h>
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"
#include "cpu/cpu.h"

static void to_tensor(const kiln_bvalue *v, kiln_tensor *t) {
    memset(t, 0, sizeof *t);
    t->data = (void *)(uintptr_t)v->data; // read-only use: kernels never write inputs
    t->dtype = v->desc.dtype;
    t->rank = v->desc.shape.rank;
    for (uint32_t i = 0; i < t->rank; i++) t->dims[i] = v->desc.shape.max[i];
}

// Values computed from constants alone (const_derived) and, of those, the ones that only such
// computations read (consumed): a consumed value is dropped once its readers have folded.
typedef struct fold_info {
    uint8_t *const_derived, *consumed;
} fold_info;

static int foldable_node(const kiln_bnode *n) { return !n->dead && n->head < 0 && n->n_tail == 0; }

static kiln_status fold_info_init(kiln_bgraph *b, fold_info *fi) {
    size_t nv = b->n_values;
    fi->const_derived = kiln_calloc(nv ? nv : 1, 8);
    fi->consumed = kiln_calloc(nv ? nv : 1, 8);
    KILN_CHECK(fi->const_derived != NULL && fi->consumed != NULL, KILN_ERR_NO_MEMORY,
               "out of memory: %zu bytes of constant-folding bookkeeping", 2 * nv);
    KILN_TRY(kiln_bgraph_count_uses(b));
    for (size_t v = 0; v < nv; v++) fi->const_derived[v] = kiln_bgraph_is_const(b, (int32_t)v);
    for (size_t i = 0; i < b->n_nodes; i++) { // node order is a topological order
        const kiln_bnode *n = &b->nodes[i];
        int ok = foldable_node(n), any = 0;
        for (uint32_t j = 0; ok && j < n->n_inputs; j++) {
            int32_t v = b->ids[n->input_begin + j];
            if (v < 0) continue;
            ok = fi->const_derived[v];
            any = 1;
        }
        if (ok && any) fi->const_derived[n->output] = 1;
    }
    for (size_t v = 0; v < nv; v++) fi->consumed[v] = fi->const_derived[v] && !b->is_output[v];
    for (size_t i = 0; i < b->n_nodes; i++) { // a reader that stays in the engine keeps it
        const kiln_bnode *n = &b->nodes[i];
        if (n->dead || (foldable_node(n) && fi->const_derived[n->output])) continue;
        for (uint32_t j = 0; j < n->n_inputs; j++) {
            int32_t v = b->ids[n->input_begin + j];
            if (v >= 0) fi->consumed[v] = 0;
        }
    }
    return KILN_OK;
}

static void fold_info_release(const kiln_bgraph *b, fold_info *fi) {
    size_t nv = b->n_values ? b->n_values : 1;
    kiln_free(fi->const_derived, nv);
    kiln_free(fi->consumed, nv);
}

// Bytes a constant of this dtype takes in the engine: the precision pass stores float32
// weights at 16 bits in a half-precision build.
static uint64_t stored_nbytes(const kiln_bgraph *b, uint32_t dtype, uint64_t nbytes) {
    int half = b->opts.precision == KILN_PRECISION_FP16 || b->opts.precision == KILN_PRECISION_BF16;
    return half && dtype == KILN_DTYPE_F32 ? nbytes / 2 : nbytes;
}

// Whether an output of `nbytes` over the cap costs no weight bytes (see the top of the file).
static int fold_is_free(const kiln_bgraph *b, const fold_info *fi, const kiln_bnode *n,
                        uint64_t nbytes) {
    uint64_t freed = 0;
    if (n->op == KILN_OP_PERMUTE) return 0;
    for (uint32_t j = 0; j < n->n_inputs; j++) {
        int32_t v = b->ids[n->input_begin + j], dup = 0;
        if (v < 0 || !fi->consumed[v]) continue;
        for (uint32_t k = 0; k < j; k++) dup |= b->ids[n->input_begin + k] == v;
        if (!dup) freed += stored_nbytes(b, b->values[v].desc.dtype, b->values[v].nbytes);
    }
    return stored_nbytes(b, b->values[n->output].desc.dtype, nbytes) <= freed;
}

// Folds node i if it qualifies; *folded tells whether it did.
static kiln_status fold_node(kiln_bgraph *b, const fold_info *fi, uint32_t i, int *folded) {
    kiln_bnode *n = &b->nodes[i];
    kiln_tensor ins[KILN_MAX_INPUTS], out;
    kiln_kernel_args args;
    const kiln_bvalue *ov = &b->values[n->output];
    uint64_t nbytes;
    uint32_t n_present = 0;
    size_t scratch_nbytes;
    void *scratch = NULL, *data = NULL;
    kiln_status st;
    *folded = 0;
    for (uint32_t j = 0; j < n->n_inputs; j++) {
        int32_t v = b->ids[n->input_begin + j];
        if (v < 0) continue;
        if (!kiln_bgraph_is_const(b, v)) return KILN_OK;
        n_present++;
    }
    if (n_present == 0) return KILN_OK;
    if (!kiln_desc_max_nbytes(&ov->desc, &nbytes) || nbytes > SIZE_MAX / 2) return KILN_OK;
    if (nbytes > KILN_FOLD_MAX_NBYTES && !fold_is_free(b, fi, n, nbytes)) return KILN_OK;
    memset(&args, 0, sizeof args);
    args.op = n->op;
    args.attrs = kiln_bgraph_attrs(b, n);
    args.n_in = n->n_inputs;
    for (uint32_t j = 0; j < n->n_inputs; j++) {
        int32_t v = b->ids[n->input_begin + j];
        if (v < 0) continue;
        to_tensor(&b->values[v], &ins[j]);
        args.in[j] = &ins[j];
    }
    to_tensor(ov, &out);
    args.out = &out;
    if (!kiln_cpu_supports(&args)) return KILN_OK;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)nbytes, &data));
    out.data = data;
    scratch_nbytes = kiln_cpu_scratch_nbytes(&args);
    if (scratch_nbytes > 0) {
        scratch = kiln_malloc(scratch_nbytes, KILN_DATA_ALIGN);
        KILN_CHECK(scratch != NULL, KILN_ERR_NO_MEMORY,
                   "out of memory: %zu bytes of scratch to fold a %s node", scratch_nbytes,
                   kiln_op_name(n->op));
    }
    args.scratch = scratch;
    args.scratch_nbytes = scratch_nbytes;
    st = kiln_cpu_run(&args);
    kiln_free(scratch, scratch_nbytes);
    KILN_TRY(st);
    // The output value becomes a constant; the node goes away.
    b->values[n->output].kind = KILN_IR_CONSTANT;
    b->values[n->output].index = 0;
    b->values[n->output].data = data;
    b->values[n->output].nbytes = nbytes;
    n->dead = 1;
    *folded = 1;
    return KILN_OK;
}

kiln_status kiln_pass_fold(kiln_bgraph *b) {
    fold_info fi;
    kiln_status st = fold_info_init(b, &fi);
    for (size_t i = 0; st == KILN_OK && i < b->n_nodes; i++) {
        int folded = 0;
        if (!foldable_node(&b->nodes[i])) continue;
        st = fold_node(b, &fi, (uint32_t)i, &folded);
        b->stats.n_folded += (uint32_t)folded;
    }
    fold_info_release(b, &fi);
    return st;
}
