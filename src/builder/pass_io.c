// SPDX-License-Identifier: Apache-2.0
// I/O lowering: every output binding needs its own tensor written by a layer. An output that is
// a graph input, a constant, or the same value as an earlier output gets a copy layer.
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
    kiln_free(seen, n);
    return st;
}
