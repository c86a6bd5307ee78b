// SPDX-License-Identifier: Apache-2.0
// verify: the caller's graph is buildable (it has outputs; every output is a value; binding
// names are unique; nodes read only earlier values, so every output is computable from the
// inputs and constants). check: after the passes, every live node still infers exactly its
// recorded output, and fused tails keep their head's output descriptor (in place).
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "builder/builder.h"
#include "core/alloc.h"
#include "core/status.h"

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

kiln_status kiln_pass_verify(kiln_bgraph *b) {
    size_t n_names = b->n_inputs + b->n_outputs;
    const char **names;
    const char *dup = NULL;
    KILN_CHECK(b->n_outputs > 0, KILN_ERR_INVALID_ARG,
               "kiln_build: the graph has no outputs; mark at least one with "
               "kiln_graph_mark_output");
    for (size_t i = 0; i < b->n_outputs; i++) {
        int32_t v = b->outputs[i].value;
        KILN_CHECK(v >= 0 && (size_t)v < b->n_values, KILN_ERR_INVALID_ARG,
                   "kiln_build: output %zu '%s' is value %" PRId32 ", which does not exist", i,
                   b->outputs[i].name, v);
    }
    // Nodes only read values defined before them (the graph API guarantees it: a value id is
    // handed out before it can be used), so the graph is acyclic and every output reachable.
    for (size_t i = 0; i < b->n_nodes; i++) {
        const kiln_bnode *n = &b->nodes[i];
        KILN_CHECK(n->output >= 0 && (size_t)n->output < b->n_values &&
                       b->values[n->output].kind == KILN_IR_NODE && b->values[n->output].index == i,
                   KILN_ERR_INTERNAL,
                   "kiln_build: node %zu: output value %" PRId32 " is not its own", i, n->output);
        for (uint32_t j = 0; j < n->n_inputs; j++) {
            int32_t v = b->ids[n->input_begin + j];
            KILN_CHECK(v >= -1 && v < n->output, KILN_ERR_INTERNAL,
                       "kiln_build: node %zu (%s): input %u is value %" PRId32
                       ", not defined before the node",
                       i, kiln_op_name(n->op), j, v);
        }
    }
    if (n_names < 2) return KILN_OK;
    names = kiln_malloc(n_names * sizeof *names, KILN_ALIGN);
    KILN_CHECK(names != NULL, KILN_ERR_NO_MEMORY, "out of memory checking binding names");
    for (size_t i = 0; i < b->n_inputs; i++) names[i] = b->values[b->inputs[i]].name;
    for (size_t i = 0; i < b->n_outputs; i++) names[b->n_inputs + i] = b->outputs[i].name;
    qsort(names, n_names, sizeof *names, cmp_name);
    for (size_t i = 1; i < n_names && dup == NULL; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) dup = names[i];
    }
    kiln_free(names, n_names * sizeof *names);
    KILN_CHECK(dup == NULL, KILN_ERR_INVALID_ARG,
               "kiln_build: the name '%s' is used by two inputs/outputs; names must be unique",
               dup);
    return KILN_OK;
}

kiln_status kiln_pass_check(const kiln_bgraph *b) {
    for (size_t i = 0; i < b->n_nodes; i++) {
        const kiln_bnode *n = &b->nodes[i];
        kiln_value_desc d;
        if (n->dead) continue;
        KILN_TRY(kiln_bgraph_infer(b, (uint32_t)i, &d));
        KILN_CHECK(kiln_desc_equal(&d, &b->values[n->output].desc), KILN_ERR_INTERNAL,
                   "kiln_build: node %zu (%s): its recorded output no longer matches shape "
                   "inference",
                   i, kiln_op_name(n->op));
        for (uint32_t j = 0; j < n->n_inputs; j++) {
            int32_t v = b->ids[n->input_begin + j];
            KILN_CHECK(v < 0 || b->values[v].kind != KILN_BV_DEAD, KILN_ERR_INTERNAL,
                       "kiln_build: node %zu (%s) reads value %" PRId32 ", which nothing produces",
                       i, kiln_op_name(n->op), v);
        }
        if (n->head >= 0) {
            const kiln_bnode *h = &b->nodes[n->head];
            KILN_CHECK(!h->dead && kiln_desc_equal(&d, &b->values[h->output].desc),
                       KILN_ERR_INTERNAL,
                       "kiln_build: fused tail node %zu (%s) changes its head's output", i,
                       kiln_op_name(n->op));
        }
    }
    for (size_t i = 0; i < b->n_outputs; i++) {
        KILN_CHECK(b->values[b->outputs[i].value].kind != KILN_BV_DEAD, KILN_ERR_INTERNAL,
                   "kiln_build: output %zu '%s' is no longer produced", i, b->outputs[i].name);
    }
    return KILN_OK;
}
