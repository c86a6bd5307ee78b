// SPDX-License-Identifier: Apache-2.0
// The backend interface: what the runtime (src/runtime/engine.c) asks of a device. The runtime
// owns the plan, validation, shape inference and binding checks; a backend owns device memory
// (weights, the activation arena, scratch) and runs the layers.
//
// Backends: cpu (src/cpu/cpu_backend.c over the reference kernels) and cuda (src/cuda/, a plugin
// library loaded at run time so that libkiln loads on machines without CUDA). The runtime owns
// this seam and never includes a backend's headers.
#ifndef KILN_RUNTIME_BACKEND_H
#define KILN_RUNTIME_BACKEND_H

#include <stdint.h>

#include "core/options.h"
#include "runtime/kernel.h"
#include "runtime/plan.h"

// One execute: the concrete shape of every plan tensor (inferred by the runtime from the bound
// input shapes, checked against the plan's ranges) and the caller's pointers for the I/O.
typedef struct kiln_exec {
    const kiln_plan *plan;
    kiln_tensor *tensors; // plan->n_tensors entries: dtype and dims set for every tensor;
                          // data set for INPUT and OUTPUT tensors (caller memory), NULL for
                          // the rest (the backend supplies arena and weight pointers)
    int shapes_changed;   // nonzero when any shape differs from the previous execute
    void *stream;         // the caller's CUDA stream, or NULL
} kiln_exec;

typedef struct kiln_backend_ops {
    const char *name; // "cpu", "cuda"
    // Prepares an engine: copies or uploads the weights (weight_data[i] is the host data of
    // tensor i for WEIGHT tensors and for STATE tensors with an initial value, NULL otherwise;
    // valid only during the call: keep what context_init needs), chooses kernels. The plan
    // outlives the state.
    kiln_status (*engine_init)(const kiln_plan *plan, const void *const *weight_data,
                               const kiln_options *options, void **out_state);
    void (*engine_free)(void *engine_state); // NULL-safe
    // Per-context state: the activation arena (plan->arena_nbytes), scratch, and the STATE
    // tensors (plan.h), set to their initial values.
    kiln_status (*context_init)(void *engine_state, void **out_context_state);
    // Sets every STATE tensor of the context back to its initial value (finished on return).
    kiln_status (*reset_states)(void *context_state);
    // The context's STATE tensor i becomes owner's STATE tensor owner_tensor[i] (UINT32_MAX for
    // tensors that are not states and for states the owner lacks, which stay the context's own;
    // the runtime has matched names, dtypes and shapes, at least one state matches, and both
    // contexts belong to this backend and device). Each block of states stays alive while a
    // context uses one of its states. Never called while either context executes.
    kiln_status (*share_states)(void *context_state, void *owner_state,
                                const uint32_t *owner_tensor);
    void (*context_free)(void *context_state); // NULL-safe
    // Runs every layer; returns with the work finished and outputs written.
    kiln_status (*execute)(void *context_state, const kiln_exec *exec);
    // Fills what the backend knows of head layer li (kernel, detail, flags, workspace, L2,
    // profile times) into *out, which the runtime has filled with the plan's view (op, head,
    // n_fused, "?" as the kernel, -1 times). Never called while the context executes.
    void (*describe_layer)(const void *context_state, uint32_t li, kiln_layer_info *out);
    // Memory where the backend runs, for binding I/O (kiln_engine_alloc_memory): the CPU's is
    // host memory, CUDA's device memory of the engine's device. nbytes may be 0 (a unique
    // pointer). Thread-safe; never called while the engine is freed.
    kiln_status (*memory_alloc)(void *engine_state, size_t nbytes, void **out);
    void (*memory_free)(void *engine_state, void *ptr, size_t nbytes); // NULL-safe
    // Copies nbytes between host memory and memory of the engine's device, or within either,
    // on `stream` (a cudaStream_t, or NULL: the backend's choice); returns with the copy
    // finished, unless the stream is being captured (then it is only enqueued).
    kiln_status (*memory_copy)(void *engine_state, void *dst, const void *src, size_t nbytes,
                               void *stream);
    // Optional (NULL: none): called as soon as the runtime knows an engine of this plan will load
    // here, before it resolves and checks the weights: the backend may start initialising what
    // engine_init and context_init will need, in the background. Never fails.
    void (*warm_up)(const kiln_plan *plan, const kiln_options *options);
    // Optional (NULL: every pointer is host memory): whether the caller's data at ptr can be
    // read by the host (host memory, or managed), for the runtime's checks of cache positions
    // (state_rows.h). Thread-safe; never fails.
    int (*memory_is_host)(void *engine_state, const void *ptr);
    // Optional (NULL: the runtime checks the weights before engine_init). With the option
    // verify_weights, the runtime hashes the weights while engine_init uploads them, then calls
    // this once they matched their keys; when they do not, it calls engine_free instead. Until
    // then the backend must not let another engine use this engine's copies of the weights (a
    // copy shared by key would hand damaged bytes to a load whose own bytes are sound).
    void (*weights_checked)(void *engine_state);
} kiln_backend_ops;

// The CPU backend (always present).
extern const kiln_backend_ops kiln_backend_cpu;

// The CUDA backend, or NULL when it is not available (not built, plugin not found, no device).
// Defined by src/runtime/backend_cuda.c (the plugin loader, compiled into every build).
const kiln_backend_ops *kiln_backend_cuda_get(void);

#endif // KILN_RUNTIME_BACKEND_H
