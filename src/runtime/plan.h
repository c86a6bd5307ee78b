// SPDX-License-Identifier: Apache-2.0
// The engine plan: the in-memory form of an engine. The builder produces one and the serializer
// writes it (src/builder/serialize.c); the loader reads and validates one (src/runtime/load.c);
// the runtime executes one (src/runtime/engine.c). load(serialize(p)) == p field for field.
//
// Tensors: every value the engine touches. Inputs and outputs live in caller memory; activations
// at planned offsets of one arena; weights in the weights blob (inline) or resolved by key.
// Layers: in execution order. A head layer (linear, matmul, conv) may be followed by n_tail TAIL
// layers, elementwise ops fused into it: each reads the head's output (in place) and writes it.
#ifndef KILN_RUNTIME_PLAN_H
#define KILN_RUNTIME_PLAN_H

#include <stdint.h>

#include "core/ops.h"
#include "ir/shape.h"

typedef enum kiln_tensor_kind {
    KILN_TENSOR_INPUT = 1,      // bound by the caller: kiln_context_set_input
    KILN_TENSOR_OUTPUT = 2,     // bound by the caller: kiln_context_set_output
    KILN_TENSOR_ACTIVATION = 3, // arena + offset
    KILN_TENSOR_WEIGHT = 4,     // constant data
    KILN_TENSOR_STATE = 5,      // owned by each context, kept from one execute to the next
} kiln_tensor_kind;

// A STATE tensor is a model's mutable buffer (a KV cache): static shape, nbytes = its bytes,
// binding = its number among the engine's states (in tensor order). Every context holds its own
// copy, set to the initial value when the context is created (and by kiln_context_reset_states):
// the data of an external key, else inline data at `offset` of the weights, else (offset ==
// KILN_STATE_ZERO) zeros. Layers read it like any tensor; a layer may write it (its output id is
// the state's): the builder orders every read of the old value before that write. index_copy
// whose x is the state it writes updates it in place.
#define KILN_STATE_ZERO UINT64_MAX

#define KILN_NO_KEY UINT32_MAX // kiln_plan_tensor.key of an inline weight

typedef struct kiln_plan_tensor {
    uint32_t kind;    // kiln_tensor_kind
    uint32_t dtype;   // kiln_dtype
    kiln_shape shape; // per-dimension [min, max]; weights are static (min == max)
    uint32_t name;    // offset into strings ("" at offset 0)
    uint32_t binding; // INPUT / OUTPUT: index among inputs / outputs; STATE: state number
    uint64_t offset;  // ACTIVATION: arena offset; WEIGHT / STATE (inline): offset into weights
    uint64_t nbytes;  // ACTIVATION: planned capacity (max shape); WEIGHT / STATE: data bytes
    uint32_t key;     // WEIGHT / STATE: offset into strings of the external key, or KILN_NO_KEY
} kiln_plan_tensor;

#define KILN_LAYER_TAIL 0x1u // fused into the preceding head layer

typedef struct kiln_plan_layer {
    uint32_t op;                      // kiln_op
    uint32_t flags;                   // KILN_LAYER_*
    uint32_t input_begin, n_inputs;   // into ids[]; an id of -1 is an absent optional input
    uint32_t output_begin, n_outputs; // into ids[]
    uint32_t attr_begin, n_attrs;     // into attr_refs[]; n_attrs == the op's schema count
    uint32_t n_tail;                  // head layers: number of TAIL layers that follow; 0 otherwise
} kiln_plan_layer;

typedef struct kiln_plan {
    uint32_t n_tensors;
    kiln_plan_tensor *tensors;
    uint32_t n_layers;
    kiln_plan_layer *layers;
    uint32_t n_ids;
    int32_t *ids;
    uint32_t n_attr_refs;
    kiln_attr_ref *attr_refs;
    uint64_t n_ints;
    int64_t *ints;
    uint64_t n_floats;
    double *floats;
    uint32_t n_inputs;
    uint32_t *inputs; // tensor ids of the input bindings, in binding order
    uint32_t n_outputs;
    uint32_t *outputs; // tensor ids of the output bindings
    uint64_t strings_nbytes;
    char *strings;         // NUL-terminated names and keys; strings[0] == '\0'
    uint64_t arena_nbytes; // activation arena size (the memory plan)
    uint64_t weights_nbytes;
    uint8_t *weights;   // inline weight data, KILN_FORMAT_WEIGHT_ALIGN-aligned offsets
    uint32_t precision; // kiln_precision the engine was built with (informational)
} kiln_plan;

// Frees every array of a plan (kiln_malloc'd, sizes from the counts) and zeroes it. NULL ok.
void kiln_plan_release(kiln_plan *plan);

// The attributes of a layer as a view.
static inline kiln_attrs kiln_plan_layer_attrs(const kiln_plan *p, const kiln_plan_layer *l) {
    kiln_attrs a = {p->attr_refs + l->attr_begin, l->n_attrs, p->ints, p->floats};
    return a;
}

static inline const char *kiln_plan_string(const kiln_plan *p, uint32_t offset) {
    return offset < p->strings_nbytes ? p->strings + offset : "";
}

// Tensor t's name for a message ("?" when it has none).
static inline const char *kiln_plan_tensor_name(const kiln_plan *p, uint32_t t) {
    const char *s = kiln_plan_string(p, p->tensors[t].name);
    return s[0] != '\0' ? s : "?";
}

// The input binding of tensor t (UINT32_MAX when t is not an input).
static inline uint32_t kiln_plan_input_index(const kiln_plan *p, uint32_t t) {
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        if (p->inputs[i] == t) return i;
    }
    return UINT32_MAX;
}

#endif // KILN_RUNTIME_PLAN_H
