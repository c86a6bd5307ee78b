// SPDX-License-Identifier: Apache-2.0
// The runtime's objects (include/kiln/kiln_engine.h declares them opaque): a loaded engine (the
// validated plan, the resolved options, the backend and its state) and an execution context
// (bindings, the concrete shapes of the last execute, the backend's per-context state).
//
// Memory: an engine owns its plan (kiln_plan_release) and its backend state; the plan's inline
// weights are released once the backend has copied or uploaded them. A context owns three arrays
// sized at creation (tensors, value descriptors, bindings) and its backend state (the activation
// arena and scratch); execute allocates nothing.
#ifndef KILN_RUNTIME_ENGINE_INTERNAL_H
#define KILN_RUNTIME_ENGINE_INTERNAL_H

#include <stdatomic.h>

#include "core/options.h"
#include "kiln/kiln_engine.h"
#include "runtime/backend.h"
#include "runtime/index_inputs.h"
#include "runtime/plan.h"
#include "runtime/state_rows.h"

struct kiln_engine {
    kiln_plan plan;                  // owned; plan.weights released after backend init
    kiln_options options;            // process-wide options with the per-load settings applied
    const kiln_backend_ops *backend; // static table
    void *backend_state;             // owned by the backend
    char device[32];                 // "cpu" or "cuda:N"
    uint64_t weight_nbytes;          // inline + external weight bytes
    kiln_row_write *row_writes;      // owned: the cache writes at input positions (state_rows.h)
    uint32_t n_row_writes;
    kiln_index_input *index_inputs; // owned: the embeddings' token-id inputs (index_inputs.h)
    uint32_t n_index_inputs;
};

typedef struct kiln_input_binding {
    int bound;
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
    const void *data; // borrowed: valid until execute returns
} kiln_input_binding;

typedef struct kiln_output_binding {
    int bound;
    void *data; // borrowed
    size_t capacity_nbytes;
} kiln_output_binding;

struct kiln_context {
    kiln_engine *engine;          // borrowed: outlives the context
    void *backend_state;          // owned by the backend
    atomic_int busy;              // 1 while a call is inside the context
    kiln_tensor *tensors;         // plan.n_tensors: concrete shapes of the last inference
    kiln_value_desc *descs;       // plan.n_tensors: the same as value descriptors for kiln_infer
    kiln_input_binding *inputs;   // plan.n_inputs
    kiln_output_binding *outputs; // plan.n_outputs
    void *stream;                 // the caller's CUDA stream, or NULL
    int shapes_valid;             // tensors/descs hold the shapes inferred from the bound inputs
    int shapes_changed;           // shapes differ from those the backend last ran with
    // With row writes (state_rows.h): the written rows of each state (n_tensors entries, NULL for
    // states not checked; a reference per entry); with row writes or index inputs
    // (index_inputs.h), each input's host data and element count for one execute (n_inputs each)
    kiln_state_rows **rows;
    const void **row_in;
    int64_t *row_numel;
};

// Builds an engine from a loaded, validated plan (takes ownership of *plan on success and on
// failure: the plan is released either way and zeroed). kiln_engine_load = kiln_load_plan + this.
kiln_status kiln_engine_from_plan(kiln_plan *plan, const kiln_load_options *options,
                                  kiln_engine **out);

// The plan of a loaded engine (read-only; inline weights already released).
const kiln_plan *kiln_engine_plan(const kiln_engine *engine);

#endif // KILN_RUNTIME_ENGINE_INTERNAL_H
