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
// matmul(index(W, idx), x) with W [E, M, K], one 1-D index over dim 0 and x [B, K, N] is
// gather_matmul(W, idx, x): each batch's matrix read from W in place (a mixture of experts as
// transformers' batched_mm experts export it: each token's experts' weights gathered into a
// [B, M, K] copy, 2 MiB a token for a 2048 x 512 expert, then a batched matmul), when the index's
// only reader is that matmul (the dead index is removed by the next dce pass).
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

// idx when value v is index(W, idx) along dim 0 of a rank-3 W by one 1-D index (a live plain
// node read only by one node, not an output), with *w = W; else -1.
static int32_t gathered_matrices(const kiln_bgraph *b, int32_t v, int32_t *w) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE || (size_t)v >= b->n_use_info ||
        b->is_output[v] || b->uses[v] != 1)
        return -1;
    const kiln_bnode *p = &b->nodes[b->values[v].index];
    if (p->dead || p->op != KILN_OP_INDEX || p->n_tail > 0 || p->head >= 0 || p->n_inputs != 2)
        return -1;
    const kiln_attrs a = kiln_bgraph_attrs(b, p);
    const int32_t x = kiln_bgraph_input(b, p, 0), idx = kiln_bgraph_input(b, p, 1);
    if (x < 0 || idx < 0 || kiln_attrs_int(&a, KILN_A_INDEX_DIM, 0) != 0 ||
        b->values[x].desc.shape.rank != 3 || b->values[idx].desc.shape.rank != 1)
        return -1;
    *w = x;
    return idx;
}

// matmul node i of a gathered W [B, M, K] and x [B, K, N] as gather_matmul (the file's top);
// 0 when it is not one.
static kiln_status gather_matmul(kiln_bgraph *b, size_t i, int *done) {
    kiln_bnode *nd = &b->nodes[i];
    int32_t w = -1, ins[3];
    kiln_value_desc d;
    *done = 0;
    const int32_t a = kiln_bgraph_input(b, nd, 0), x = kiln_bgraph_input(b, nd, 1);
    const int32_t idx = gathered_matrices(b, a, &w);
    if (idx < 0 || x < 0 || b->values[x].desc.shape.rank != 3 ||
        b->values[x].desc.dtype != b->values[w].desc.dtype)
        return KILN_OK;
    ins[0] = w, ins[1] = idx, ins[2] = x;
    nd->op = KILN_OP_GATHER_MATMUL; // neither op has attributes
    KILN_TRY(kiln_bgraph_set_inputs(b, (uint32_t)i, ins, 3));
    if (kiln_bgraph_infer(b, (uint32_t)i, &d) != KILN_OK ||
        !kiln_desc_equal(&d, &b->values[b->nodes[i].output].desc)) {
        // not the same product (a broadcast batch, say): the matmul stays as it was
        const int32_t back[2] = {a, x};
        b->nodes[i].op = KILN_OP_MATMUL;
        return kiln_bgraph_set_inputs(b, (uint32_t)i, back, 2);
    }
    b->uses[a]--;
    b->stats.n_gather_matmul++;
    *done = 1;
    return KILN_OK;
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
        int gathered = 0;
        st = gather_matmul(b, i, &gathered);
        if (st != KILN_OK || gathered) continue;
        nd = &b->nodes[i];
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
