// SPDX-License-Identifier: Apache-2.0
// The graph the builder works on (the public kiln_graph of include/kiln/kiln_graph.h): values
// (graph inputs, constants, node outputs) with their inferred dtype and shape range, nodes in
// the order they were added (which is a topological order: a node only reads earlier values),
// attributes in the shared representation of src/core/ops.h (kiln_attr_ref + int/float pools,
// schema order, defaults filled in), and the marked outputs.
//
// Ownership: everything lives in growable arrays owned by the graph (kiln_malloc); constant data
// is copied into one KILN_DATA_ALIGN-aligned allocation per constant. kiln_graph_free frees all.
//
// Caps (checked by the add_* calls, KILN_ERR_INVALID_ARG): KILN_GRAPH_MAX_VALUES values in all
// (inputs + constants + node outputs: an engine holds at most 65536 tensors),
// KILN_GRAPH_MAX_NODES nodes, KILN_GRAPH_MAX_IO inputs and as many outputs, names of at most
// KILN_GRAPH_MAX_NAME bytes.
#ifndef KILN_IR_GRAPH_H
#define KILN_IR_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "ir/shape.h"
#include "kiln/kiln.h"

#define KILN_GRAPH_MAX_VALUES 65536u
#define KILN_GRAPH_MAX_NODES 65536u
#define KILN_GRAPH_MAX_IO 4096u
#define KILN_GRAPH_MAX_NAME 255u

typedef enum kiln_ir_value_kind {
    KILN_IR_INPUT = 1,    // a graph input (index: its input number)
    KILN_IR_CONSTANT = 2, // constant data (index: into consts)
    KILN_IR_NODE = 3,     // the output of a node (index: the node)
    KILN_IR_STATE = 4,    // a state, as execute finds it (index: into states)
} kiln_ir_value_kind;

#define KILN_GRAPH_MAX_STATES 4096u

typedef struct kiln_ir_value {
    uint32_t kind;  // kiln_ir_value_kind
    uint32_t index; // see kiln_ir_value_kind
    uint32_t name;  // offset into names (0: unnamed)
    kiln_value_desc desc;
} kiln_ir_value;

typedef struct kiln_ir_const {
    void *data;      // owned, KILN_DATA_ALIGN-aligned, nbytes bytes (non-NULL even when empty)
    uint64_t nbytes; // numel * dtype size
    int32_t value;   // the value id
} kiln_ir_const;

// A state (kiln_graph_add_state): kept by each context from one execute to the next.
typedef struct kiln_ir_state {
    int32_t value;   // the value id that reads it
    int32_t update;  // the value it takes at the end of execute (kiln_graph_update_state), or -1
    void *data;      // owned initial value (KILN_DATA_ALIGN-aligned), or NULL: zeros
    uint64_t nbytes; // numel * dtype size
} kiln_ir_state;

typedef struct kiln_ir_node {
    uint32_t op;
    uint32_t input_begin; // into ids: n_inputs value ids, -1 for an absent optional input
    uint32_t n_inputs;
    uint32_t attr_begin; // into attr_refs: the op's schema count of attributes
    int32_t output;      // the value id of the node's single output
} kiln_ir_node;

typedef struct kiln_ir_output {
    int32_t value;
    uint32_t name; // offset into names
} kiln_ir_output;

struct kiln_graph {
    kiln_ir_value *values;
    size_t n_values, cap_values;
    kiln_ir_node *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *ids;
    size_t n_ids, cap_ids;
    kiln_attr_ref *attr_refs;
    size_t n_attr_refs, cap_attr_refs;
    int64_t *ints;
    size_t n_ints, cap_ints;
    double *floats;
    size_t n_floats, cap_floats;
    char *names; // NUL-terminated strings; names[0] == '\0'
    size_t names_nbytes, cap_names;
    kiln_ir_const *consts;
    size_t n_consts, cap_consts;
    int32_t *inputs; // value ids, in input order
    size_t n_inputs, cap_inputs;
    kiln_ir_output *outputs;
    size_t n_outputs, cap_outputs;
    kiln_ir_state *states;
    size_t n_states, cap_states;
};

// Ensures room for `need` elements of elem_nbytes in *array (capacity *cap, grown
// geometrically, contents kept). KILN_ERR_NO_MEMORY on failure (the array is unchanged).
kiln_status kiln_ir_grow(void **array, size_t *cap, size_t need, size_t elem_nbytes);

// Frees an array grown by kiln_ir_grow.
void kiln_ir_array_free(void *array, size_t cap, size_t elem_nbytes);

// The attributes of a node as a view into the graph's pools.
static inline kiln_attrs kiln_graph_node_attrs(const kiln_graph *g, const kiln_ir_node *n) {
    const kiln_op_def *d = kiln_op_def_get(n->op);
    uint32_t na = d != NULL ? d->n_attrs : 0;
    kiln_attrs a = {na > 0 ? g->attr_refs + n->attr_begin : NULL, na, g->ints, g->floats};
    return a;
}

static inline const char *kiln_graph_name(const kiln_graph *g, uint32_t offset) {
    return offset < g->names_nbytes ? g->names + offset : "";
}

// The data of a constant value (NULL for other values).
static inline const kiln_ir_const *kiln_graph_const_of(const kiln_graph *g, int32_t value) {
    if (value < 0 || (size_t)value >= g->n_values) return NULL;
    if (g->values[value].kind != KILN_IR_CONSTANT) return NULL;
    return &g->consts[g->values[value].index];
}

#endif // KILN_IR_GRAPH_H
