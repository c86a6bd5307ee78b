// SPDX-License-Identifier: Apache-2.0
// Dead-code elimination: a node lives when its output reaches a graph output or a state's
// update. Backward sweeps (index order is almost a topological order: nodes inserted by a
// rewrite come after their readers) mark the inputs of live nodes live until nothing changes (two
// sweeps when no node was inserted out of order), then every node whose output stayed unreached
// dies.
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"

kiln_status kiln_pass_dce(kiln_bgraph *b) {
    uint8_t *live;
    size_t n = b->n_values;
    live = kiln_calloc(n, KILN_ALIGN);
    KILN_CHECK(live != NULL, KILN_ERR_NO_MEMORY, "out of memory in dead-code elimination");
    for (size_t i = 0; i < b->n_outputs; i++) live[b->outputs[i].value] = 1;
    for (size_t i = 0; i < b->n_states; i++) {
        if (b->states[i].update >= 0) live[b->states[i].update] = 1;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t k = b->n_nodes; k-- > 0;) {
            const kiln_bnode *nd = &b->nodes[k];
            if (nd->dead || !live[nd->output]) continue;
            for (uint32_t j = 0; j < nd->n_inputs; j++) {
                int32_t v = b->ids[nd->input_begin + j];
                if (v >= 0 && !live[v]) {
                    live[v] = 1;
                    changed = 1;
                }
            }
        }
    }
    for (size_t k = 0; k < b->n_nodes; k++) {
        kiln_bnode *nd = &b->nodes[k];
        if (nd->dead || live[nd->output]) continue;
        nd->dead = 1;
        b->stats.n_dead++;
    }
    kiln_free(live, n);
    return KILN_OK;
}
