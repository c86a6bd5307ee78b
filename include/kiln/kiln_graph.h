// SPDX-License-Identifier: Apache-2.0
// Kiln graph and builder API: describe a dataflow graph (inputs with per-dimension [min, max]
// ranges, constants, nodes with an op id and attributes, outputs) and build it into engine
// bytes. Python's KilnBackend.preprocess drives this through ctypes; plain C types only.
//
// Values are identified by int32 ids returned from the add_* calls. Optional node inputs are
// passed as -1. A graph owns copies of everything passed in (names, data, attributes).
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_graph kiln_graph;
typedef struct kiln_built kiln_built;

// One attribute of a node. Pass exactly one of ints/floats (matching the schema's kind) with
// n values. Attributes not passed take their schema default; unknown names are an error.
typedef struct kiln_attr {
    const char *name;
    const int64_t *ints;
    const double *floats;
    uint32_t n;
} kiln_attr;

KILN_API kiln_status kiln_graph_new(kiln_graph **out);
KILN_API void kiln_graph_free(kiln_graph *graph);

// Adds a graph input. dim_min[i] <= dim_max[i]; equal bounds make a dimension static.
// Names must be unique among inputs and outputs, non-empty, at most 255 bytes.
KILN_API kiln_status kiln_graph_add_input(kiln_graph *graph, const char *name, kiln_dtype dtype,
                                          uint32_t rank, const int64_t *dim_min,
                                          const int64_t *dim_max, int32_t *out_value);

// Adds a constant (weights). data holds nbytes = numel * dtype size bytes, copied. name is
// informational (may be NULL).
KILN_API kiln_status kiln_graph_add_constant(kiln_graph *graph, const char *name, kiln_dtype dtype,
                                             uint32_t rank, const int64_t *dims, const void *data,
                                             size_t nbytes, int32_t *out_value);

// Adds a state: a tensor the engine keeps from one execute to the next (a model's mutable
// buffer, such as a KV cache). Every execution context holds its own copy, set to the initial
// value when the context is created: data (nbytes = numel * dtype size bytes, copied), or zeros
// when data is NULL and nbytes is 0. Static shape. Names follow the input rules (unique among
// inputs, states and outputs). The value reads the state as it was when execute began.
KILN_API kiln_status kiln_graph_add_state(kiln_graph *graph, const char *name, kiln_dtype dtype,
                                          uint32_t rank, const int64_t *dims, const void *data,
                                          size_t nbytes, int32_t *out_state);

// Declares that at the end of each execute, state (a value from kiln_graph_add_state) takes
// new_value (same dtype and shape). At most one update per state; a state without one keeps
// its value. Where new_value is index_copy(state, ...), the engine updates the state in place.
KILN_API kiln_status kiln_graph_update_state(kiln_graph *graph, int32_t state, int32_t new_value);

// Adds a node. inputs[i] is a value id or -1 for an absent optional input. Writes n_outputs
// new value ids to out_values (n_outputs must equal the op's output count). Shapes and dtypes
// of the outputs are inferred; errors name the node, the op and the offending input.
KILN_API kiln_status kiln_graph_add_node(kiln_graph *graph, uint32_t op, const int32_t *inputs,
                                         uint32_t n_inputs, const kiln_attr *attrs,
                                         uint32_t n_attrs, int32_t *out_values, uint32_t n_outputs);

// Marks a value as a graph output under a name. Outputs keep the order of these calls.
KILN_API kiln_status kiln_graph_mark_output(kiln_graph *graph, int32_t value, const char *name);

// Reads the inferred dtype and shape range of a value (for callers that want to check).
KILN_API kiln_status kiln_graph_value_info(const kiln_graph *graph, int32_t value,
                                           kiln_dtype *out_dtype, uint32_t *out_rank,
                                           int64_t *out_dim_min, int64_t *out_dim_max);

// --- build

typedef enum kiln_precision {
    KILN_PRECISION_FP32 = 0,
    KILN_PRECISION_FP16 = 1,
    KILN_PRECISION_BF16 = 2,
} kiln_precision;

// --- build progress: kiln_build reports what it is doing through an optional callback.

typedef enum kiln_build_phase {
    KILN_BUILD_PHASE_PASS = 1,   // a graph pass finished; name = the pass ("verify", "fold", ...)
    KILN_BUILD_PHASE_LAYER = 2,  // a layer was laid out in the plan; name = its op ("linear")
    KILN_BUILD_PHASE_TUNE = 3,   // a build-time tuning step. Not reported today: the builder
                                 // makes no timed choices (kernels are chosen at load, on the
                                 // device); kept so that a callback can handle it when it is
    KILN_BUILD_PHASE_OUTPUT = 4, // the engine is being written; name = "memory plan",
                                 // "serialize" or "self-check"
} kiln_build_phase;

typedef struct kiln_build_progress {
    uint32_t struct_nbytes; // sizeof(kiln_build_progress) of the library that calls
    kiln_build_phase phase;
    const char *name; // what just finished (static; valid during the call)
    uint32_t step;    // steps of this phase finished so far, from 1
    uint32_t n_steps; // steps this phase has in this build (every phase is reported in full)
} kiln_build_progress;

// Called by kiln_build on the calling thread after each step of each phase, in order (passes,
// then layers, then output). Return 0 to go on; any other value stops the build, which then
// returns KILN_ERR_INVALID_STATE ("stopped by the progress callback ...") and writes nothing.
typedef int (*kiln_build_progress_fn)(void *user_data, const kiln_build_progress *progress);

typedef struct kiln_build_options {
    uint32_t struct_nbytes;   // sizeof(kiln_build_options), set by kiln_build_options_init
    kiln_precision precision; // dtype of compute-heavy ops and activations (fp32 accumulation;
                              // model input/output dtypes are kept)
    int32_t external_weights; // nonzero: weights become named keys (see kiln_built_weight)
                              // instead of being stored inline in the engine
    int32_t optimize;         // nonzero (default): fold, fuse and eliminate dead code
    uint64_t
        min_external_nbytes; // with external_weights: smaller constants stay inline (default 0)
    // struct_nbytes = KILN_BUILD_OPTIONS_V1_NBYTES (the options without the two fields below)
    // is accepted and means no callback, so callers built against the earlier header work.
    kiln_build_progress_fn progress; // optional (NULL: no progress reports)
    void *progress_user_data;        // passed to progress
} kiln_build_options;

// struct_nbytes of kiln_build_options before the progress fields: still accepted.
#define KILN_BUILD_OPTIONS_V1_NBYTES 24u

KILN_API void kiln_build_options_init(kiln_build_options *options);

// Verifies, optimizes, plans memory and serializes the graph. The graph is not modified.
// Deterministic: the same graph and options give byte-identical engines.
KILN_API kiln_status kiln_build(const kiln_graph *graph, const kiln_build_options *options,
                                kiln_built **out);
KILN_API void kiln_built_free(kiln_built *built);

// The engine bytes; valid until kiln_built_free.
KILN_API kiln_status kiln_built_engine(const kiln_built *built, const void **out_data,
                                       size_t *out_nbytes);
// External weights (only with external_weights): key i is a content hash ("kiln-t-<hex>"),
// data is what kiln_engine_load's resolver must return for that key. Valid until _free.
KILN_API uint32_t kiln_built_n_weights(const kiln_built *built);
KILN_API kiln_status kiln_built_weight(const kiln_built *built, uint32_t index,
                                       const char **out_key, const void **out_data,
                                       size_t *out_nbytes);

#ifdef __cplusplus
}
#endif

#endif // KILN_GRAPH_H
