// SPDX-License-Identifier: Apache-2.0
// Constant folding: a node whose inputs are all constants is evaluated at build time with the
// CPU reference backend (the same kernels the engine runs on the CPU) when its output is at
// most KILN_FOLD_MAX_NBYTES; its output becomes a constant. Runs in node order, so chains fold
// (a permute of a reshape of a weight folds into one transposed weight). Ops the CPU backend
// does not implement for the dtypes at hand are left alone.
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

// Folds node i if it qualifies; *folded tells whether it did.
static kiln_status fold_node(kiln_bgraph *b, uint32_t i, int *folded) {
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
    if (!kiln_desc_max_nbytes(&ov->desc, &nbytes) || nbytes > KILN_FOLD_MAX_NBYTES) return KILN_OK;
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
    for (size_t i = 0; i < b->n_nodes; i++) {
        int folded;
        if (b->nodes[i].dead || b->nodes[i].head >= 0 || b->nodes[i].n_tail > 0) continue;
        KILN_TRY(fold_node(b, (uint32_t)i, &folded));
        b->stats.n_folded += (uint32_t)folded;
    }
    return KILN_OK;
}
