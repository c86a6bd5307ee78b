// SPDX-License-Identifier: Apache-2.0
// I/O lowering: every output binding needs its own tensor written by a layer. An output that is
// a graph input, a constant, or the same value as an earlier output gets a copy layer.
//
// States: a state's update is written into the state by one layer. When the update is
// index_copy(state, ...) and nothing else reads the state, that layer writes in place (only the
// copied rows move: a KV cache update costs its new rows, not the cache). Otherwise a copy
// layer after every other layer writes the update into the state, so every reader of the old
// value has run before it changes.
#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"

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
        if (uv->kind == KILN_IR_NODE && !seen[u] && b->uses[s->value] == 1) {
            const kiln_bnode *p = &b->nodes[uv->index];
            int taken = 0;
            for (size_t i = 0; i < b->n_outputs; i++) taken |= b->outputs[i].value == u;
            if (!taken && p->op == KILN_OP_INDEX_COPY && p->head < 0 && p->n_tail == 0 &&
                kiln_bgraph_input(b, p, 0) == s->value) {
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
