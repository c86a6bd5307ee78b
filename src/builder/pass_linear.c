// SPDX-License-Identifier: Apache-2.0
// matmul(x, B) with a constant 2-D B[K, N] is linear(x, B^T): the weight is transposed once at
// build time (into the [N, K] layout linear kernels expect), and the node can then take a bias
// (fusion turns a following add of a constant [N] into it). This is what an exported
// nn.Linear looks like after folding: permute(w) folds into a constant w^T, then mm/matmul.
// Only when every use of B is such a matmul (and B is not an output), so the weight is not
// duplicated; all those matmuls share the one transposed copy.
// matmul(x, permute(W, [1, 0])) with a constant 2-D W (model code that writes `x @ W.T`, as
// Falcon's linears do; a weight too large for the fold pass, which leaves large permutes alone)
// is linear(x, W) over W as it is: no copy at build time and no transpose at run time (the dead
// permute is removed by the last dce pass).
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"

static int only_matmul_rhs(const kiln_bgraph *b, int32_t w) {
    uint32_t n = 0;
    if ((size_t)w >= b->n_use_info || b->is_output[w]) return 0;
    for (size_t i = 0; i < b->n_nodes; i++) {
        const kiln_bnode *nd = &b->nodes[i];
        if (nd->dead) continue;
        for (uint32_t j = 0; j < nd->n_inputs; j++) {
            if (b->ids[nd->input_begin + j] != w) continue;
            if (nd->op != KILN_OP_MATMUL || j != 1) return 0;
            n++;
        }
    }
    return n == b->uses[w];
}

static kiln_status transpose(kiln_bgraph *b, int32_t w, int32_t *out) {
    kiln_shape s = b->values[w].desc.shape;
    uint32_t dtype = b->values[w].desc.dtype;
    size_t es = kiln_dtype_size((kiln_dtype)dtype);
    int64_t k = s.max[0], n = s.max[1];
    const uint8_t *src = b->values[w].data;
    uint64_t nbytes = b->values[w].nbytes;
    uint8_t *dst;
    void *p;
    KILN_TRY(kiln_bgraph_blob(b, (size_t)nbytes, &p));
    dst = p;
    for (int64_t i = 0; i < k; i++) {
        for (int64_t j = 0; j < n; j++) {
            memcpy(dst + (size_t)(j * k + i) * es, src + (size_t)(i * n + j) * es, es);
        }
    }
    s.min[0] = s.max[0] = n;
    s.min[1] = s.max[1] = k;
    return kiln_bgraph_add_const(b, dtype, &s, dst, nbytes, out);
}

// W when value v is permute(W, [1, 0]) of a constant 2-D W (a live plain node), else -1.
static int32_t transposed_const(const kiln_bgraph *b, int32_t v) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE) return -1;
    const kiln_bnode *p = &b->nodes[b->values[v].index];
    if (p->dead || p->op != KILN_OP_PERMUTE || p->n_tail > 0 || p->head >= 0) return -1;
    const int32_t w = kiln_bgraph_input(b, p, 0);
    if (!kiln_bgraph_is_const(b, w) || b->values[w].desc.shape.rank != 2) return -1;
    const kiln_attrs a = kiln_bgraph_attrs(b, p);
    uint32_t n = 0;
    const int64_t *dims = kiln_attrs_ints(&a, KILN_A_PERMUTE_DIMS, &n);
    return n == 2 && dims[0] == 1 && dims[1] == 0 ? w : -1;
}

kiln_status kiln_pass_matmul_to_linear(kiln_bgraph *b) {
    int32_t *tw;
    size_t n_vals;
    kiln_status st = KILN_OK;
    KILN_TRY(kiln_bgraph_count_uses(b));
    n_vals = b->n_use_info;
    tw = kiln_malloc(n_vals * sizeof *tw, KILN_ALIGN);
    KILN_CHECK(tw != NULL, KILN_ERR_NO_MEMORY, "out of memory in matmul-to-linear");
    for (size_t i = 0; i < n_vals; i++) tw[i] = -1;
    for (size_t i = 0; i < b->n_nodes && st == KILN_OK; i++) {
        kiln_bnode *nd = &b->nodes[i];
        int32_t x, w, ins[2];
        kiln_value_desc d;
        if (nd->dead || nd->op != KILN_OP_MATMUL) continue;
        x = kiln_bgraph_input(b, nd, 0);
        w = kiln_bgraph_input(b, nd, 1);
        const int32_t wt = transposed_const(b, w);
        if (wt >= 0) {
            ins[1] = wt;
        } else {
            if (!kiln_bgraph_is_const(b, w) || (size_t)w >= n_vals ||
                b->values[w].desc.shape.rank != 2 || (tw[w] < 0 && !only_matmul_rhs(b, w))) {
                continue;
            }
            if (tw[w] < 0) {
                st = transpose(b, w, &tw[w]);
                if (st != KILN_OK) break;
            }
            ins[1] = tw[w];
        }
        nd = &b->nodes[i];
        ins[0] = x;
        nd->op = KILN_OP_LINEAR; // neither op has attributes
        st = kiln_bgraph_set_inputs(b, (uint32_t)i, ins, 2);
        if (st == KILN_OK) st = kiln_bgraph_infer(b, (uint32_t)i, &d);
        if (st == KILN_OK && !kiln_desc_equal(&d, &b->values[b->nodes[i].output].desc)) {
            st = kiln_fail(KILN_ERR_INTERNAL, "matmul-to-linear changed the output of node %zu", i);
        }
        b->stats.n_linear++;
    }
    kiln_free(tw, n_vals * sizeof *tw);
    return st;
}
