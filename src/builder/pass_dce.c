// SPDX-License-Identifier: Apache-2.0
// Dead-code elimination: a node lives when its output reaches a graph output. One backward
// sweep suffices because a node's inputs are always defined before it (index order is a
// topological order for the nodes this pass runs on).
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
    for (size_t k = b->n_nodes; k-- > 0;) {
        kiln_bnode *nd = &b->nodes[k];
        if (nd->dead) continue;
        if (!live[nd->output]) {
            nd->dead = 1;
            b->stats.n_dead++;
            continue;
        }
        for (uint32_t j = 0; j < nd->n_inputs; j++) {
            int32_t v = b->ids[nd->input_begin + j];
            if (v >= 0) live[v] = 1;
        }
    }
    kiln_free(live, n);
    return KILN_OK;
}
