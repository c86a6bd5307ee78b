// SPDX-License-Identifier: Apache-2.0
// I/O lowering: every output binding needs its own tensor written by a layer. An output that is
// a graph input, a constant, or the same value as an earlier output gets a copy layer.
//
// States: a state's update is written into the state by one layer. When every other reader of
// the state runs before that layer (emission order) and the update is index_copy(state, ...) (only
// the copied rows move: a KV cache update costs its new rows, not the cache) or an elementwise add,
// sub, mul or div with the state as one operand of the output's dtype and shape (each element is
// read before the same element is written: a position counter advanced by one), or any op when
// nothing reads the old value (a counter set from the positions), that layer writes in place.
// Otherwise a copy layer after every other layer writes the update into the state, so every reader
// of the old value has run before it changes.
#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"

// True when node p, producing a state's update from the state s, can write the state in place.
static int writes_in_place(const kiln_bgraph *b, const kiln_bnode *p, int32_t s) {
    if (p->head >= 0 || p->n_tail != 0) return 0;
    if (b->uses[s] == 0) return 1; // the old value is never read: the state is just the output
    if (p->op == KILN_OP_INDEX_COPY) return kiln_bgraph_input(b, p, 0) == s;
    if (p->op != KILN_OP_ADD && p->op != KILN_OP_SUB && p->op != KILN_OP_MUL &&
        p->op != KILN_OP_DIV)
        return 0;
    const int32_t a0 = kiln_bgraph_input(b, p, 0), a1 = kiln_bgraph_input(b, p, 1);
    if ((a0 == s) == (a1 == s)) return 0; // the state once (not x op x)
    return kiln_desc_equal(&b->values[p->output].desc, &b->values[s].desc);
}

// The emission position of node k: a fused tail runs with its head.
static int before(const kiln_bgraph *b, uint32_t x, uint32_t y) {
    if (b->nodes[x].head >= 0) x = (uint32_t)b->nodes[x].head;
    if (b->nodes[y].head >= 0) y = (uint32_t)b->nodes[y].head;
    const int64_t sx = b->nodes[x].seq, sy = b->nodes[y].seq;
    return sx != sy ? sx < sy : x < y;
}

// True when every live reader of state value s other than node p runs before p.
static int read_before(const kiln_bgraph *b, int32_t s, uint32_t p) {
    for (size_t k = 0; k < b->n_nodes; k++) {
        const kiln_bnode *n = &b->nodes[k];
        if (n->dead || k == p) continue;
        for (uint32_t j = 0; j < n->n_inputs; j++) {
            if (kiln_bgraph_input(b, n, j) == s && !before(b, (uint32_t)k, p)) return 0;
        }
    }
    return 1;
}

kiln_status kiln_pass_lower_io(kiln_bgraph *b) {
    size_t n = b->n_values;
    uint8_t *seen = kiln_calloc(n, KILN_ALIGN);
    kiln_status st = KILN_OK;
    KILN_CHECK(seen != NULL, KILN_ERR_NO_MEMORY, "out of memory in I/O lowering");
    for (size_t i = 0; i < b->n_outputs && st == KILN_OK; i++) {
        int32_t v = b->outputs[i].value, w;
        if (b->values[v].kind == KILN_IR_NODE && !seen[v]) {
            seen[v] = 1;
            continue;
        }
        st = kiln_bgraph_add_node(b, KILN_OP_COPY, &v, 1, NULL, KILN_SEQ_OUTPUT_COPY + (int64_t)i,
                                  &w);
        if (st == KILN_OK) {
            b->outputs[i].value = w;
            b->stats.n_copies++;
        }
    }
    if (st == KILN_OK && b->n_states > 0) st = kiln_bgraph_count_uses(b);
    for (size_t k = 0; k < b->n_states && st == KILN_OK; k++) {
        kiln_bstate *s = &b->states[k];
        int32_t u = s->update, w = -1;
        const kiln_bvalue *uv;
        if (u < 0 || u == s->value) continue;
        uv = &b->values[u];
        if (uv->kind == KILN_IR_NODE && !seen[u]) {
            const kiln_bnode *p = &b->nodes[uv->index];
            int taken = 0;
            for (size_t i = 0; i < b->n_outputs; i++) taken |= b->outputs[i].value == u;
            if (!taken && writes_in_place(b, p, s->value) && read_before(b, s->value, uv->index)) {
                seen[u] = 1;
                s->write = u;
                b->stats.n_in_place++;
                continue;
            }
        }
        st = kiln_bgraph_add_node(b, KILN_OP_COPY, &u, 1, NULL,
                                  KILN_SEQ_OUTPUT_COPY + (int64_t)(b->n_outputs + k), &w);
        if (st == KILN_OK) {
            s->write = w;
            b->stats.n_copies++;
        }
    }
    kiln_free(seen, n);
    return st;
}
