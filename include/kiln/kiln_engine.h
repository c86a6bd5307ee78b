// SPDX-License-Identifier: Apache-2.0
// Kiln engine runtime API: load engine bytes (validating every field: the bytes are untrusted),
// query the I/O bindings, create execution contexts, bind inputs and outputs, execute.
//
// Threading: a loaded kiln_engine is immutable and may be shared by threads; a kiln_context is
// single-owner (a second thread calling into a busy context gets KILN_ERR_BUSY).
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_engine kiln_engine;
typedef struct kiln_context kiln_context;

// Resolves an external weight key (engines built with external_weights). On success writes a
// pointer to nbytes bytes that must stay valid until kiln_engine_load returns (the engine copies
// or uploads them). Return KILN_ERR_MISSING_DATA if the key is unknown.
typedef kiln_status (*kiln_weight_resolver)(void *user_data, const char *key, const void **out_data,
                                            size_t *out_nbytes);

// One per-load option override ("device" = "cpu", "use_cuda_graphs" = false, ...).
typedef struct kiln_option_setting {
    const char *name;
    kiln_option_type type;
    int64_t int_value;        // KILN_OPTION_BOOL (0/1) and KILN_OPTION_INT
    const char *string_value; // KILN_OPTION_STRING
} kiln_option_setting;

typedef struct kiln_load_options {
    uint32_t struct_nbytes;       // sizeof(kiln_load_options), set by kiln_load_options_init
    kiln_weight_resolver resolve; // required when the engine has external weights
    void *resolve_user_data;
    const kiln_option_setting *settings; // per-load overrides of process-wide options
    uint32_t n_settings;
} kiln_load_options;

KILN_API void kiln_load_options_init(kiln_load_options *options);

// Loads and validates an engine. The bytes are not referenced after the call returns.
// Errors: KILN_ERR_NOT_ENGINE (bad magic), KILN_ERR_CORRUPT (names the field and value),
// KILN_ERR_VERSION (made by a newer Kiln), KILN_ERR_MISSING_DATA (a weight key the resolver
// does not know), KILN_ERR_NO_MEMORY. options may be NULL.
KILN_API kiln_status kiln_engine_load(const void *data, size_t nbytes,
                                      const kiln_load_options *options, kiln_engine **out);
KILN_API void kiln_engine_free(kiln_engine *engine);

typedef struct kiln_binding_info {
    const char *name; // valid while the engine lives
    kiln_dtype dtype;
    uint32_t rank;
    int64_t dim_min[KILN_MAX_RANK];
    int64_t dim_max[KILN_MAX_RANK];
    int32_t is_input;    // 1 for inputs, 0 for outputs
    uint64_t max_nbytes; // bytes at the largest shape
} kiln_binding_info;

KILN_API uint32_t kiln_engine_n_inputs(const kiln_engine *engine);
KILN_API uint32_t kiln_engine_n_outputs(const kiln_engine *engine);
// Input i (is_input != 0) or output i (is_input == 0).
KILN_API kiln_status kiln_engine_binding(const kiln_engine *engine, int32_t is_input,
                                         uint32_t index, kiln_binding_info *out);
// "cpu" or "cuda:N": where this engine runs.
KILN_API const char *kiln_engine_device(const kiln_engine *engine);
// Bytes of the activation arena (the memory plan) and of the weights.
KILN_API uint64_t kiln_engine_arena_nbytes(const kiln_engine *engine);
KILN_API uint64_t kiln_engine_weight_nbytes(const kiln_engine *engine);

// The value of option `name` this engine was loaded with (the process-wide value, the per-load
// settings and the environment's debug overrides applied), as text, as kiln_get_option writes
// it. KILN_ERR_INVALID_ARG for an unknown name (the message lists the valid ones).
KILN_API kiln_status kiln_engine_get_option(const kiln_engine *engine, const char *name, char *buf,
                                            size_t buf_nbytes);

// Memory where the engine runs, for binding inputs and outputs without staging: device memory
// of the engine's GPU on CUDA (bound there directly: no copy through a staging buffer), host
// memory aligned to 64 bytes (through the allocator hook) on the CPU. An output bound to it
// stays where the engine wrote it, and an engine on the same device reads it as an input in
// place: how the ExecuTorch delegate passes a tensor from one Kiln engine to the next without a
// round trip through host memory. nbytes == 0 gives a unique pointer that must still be freed.
// Free with kiln_engine_free_memory (the same nbytes) before freeing the engine.
KILN_API kiln_status kiln_engine_alloc_memory(const kiln_engine *engine, size_t nbytes, void **out);
// NULL is accepted.
KILN_API void kiln_engine_free_memory(const kiln_engine *engine, void *data, size_t nbytes);
// Copies nbytes from src to dst, each host memory or memory of the engine's device (CUDA:
// cudaMemcpyDefault), and returns with the copy finished. On CUDA it runs on the calling
// thread's stream (kiln_set_thread_stream) or else the thread's default stream of the device;
// while that stream is being captured into a CUDA graph it is only enqueued. A plain memmove on
// the CPU.
KILN_API kiln_status kiln_engine_copy_memory(const kiln_engine *engine, void *dst, const void *src,
                                             size_t nbytes);

// Creates an execution context (owns the activation arena, or on CUDA with the process option
// use_shared_activation_scratch shares its device's arena). The engine must outlive it.
KILN_API kiln_status kiln_context_new(kiln_engine *engine, kiln_context **out);
KILN_API void kiln_context_free(kiln_context *context);

// The engine's states (kiln_graph_add_state): a model's mutable buffers, which every context
// keeps from one execute to the next, starting from their initial values.
KILN_API uint32_t kiln_engine_n_states(const kiln_engine *engine);
// Sets every state of the context back to its initial value (a new sequence for a KV cache).
KILN_API kiln_status kiln_context_reset_states(kiln_context *context);
// Makes context use owner's states instead of its own for every state the two engines have in
// common: a state of context's engine and one of owner's with the same name (which must have
// the same dtype and shape: KILN_ERR_SHAPE names the state otherwise). States owner lacks stay
// the context's own; with no state in common nothing changes (KILN_ERR_INVALID_ARG). Both
// engines must run on the same device (else KILN_ERR_UNSUPPORTED). From then on the two
// contexts read and update one copy of each shared state (a prefill and a decode method over
// one KV cache; an encoder writing a cross-attention cache a decoder reads beside its own),
// also where owner's copy is itself shared from a third context; the memory lives until every
// context using it is freed, in any order. Sharing again re-points the states in common to the
// new owner's. Contexts sharing states must not execute at the same time. Resetting a context
// resets the states it uses (shared ones included) to its engine's initial values.
KILN_API kiln_status kiln_context_share_states(kiln_context *context, kiln_context *owner);

// Binds input i: its shape (checked against the binding's ranges: KILN_ERR_SHAPE names the
// dimension, the value and the range) and its data (host memory, or device memory on CUDA).
// The data must stay valid and unmodified until execute returns.
KILN_API kiln_status kiln_context_set_input(kiln_context *context, uint32_t index, uint32_t rank,
                                            const int64_t *dims, const void *data);
// Binds output i to caller memory of capacity_nbytes (checked at execute against the actual
// output size).
KILN_API kiln_status kiln_context_set_output(kiln_context *context, uint32_t index, void *data,
                                             size_t capacity_nbytes);
// Sets the CUDA stream (a cudaStream_t) to run on; NULL selects the engine's own stream.
// Ignored on the CPU.
KILN_API kiln_status kiln_context_set_stream(kiln_context *context, void *stream);
// Sets the calling thread's CUDA stream (a cudaStream_t): kiln_context_execute called from this
// thread runs on it unless the context has its own stream (kiln_context_set_stream). NULL
// clears it. Per thread, so it reaches Kiln through callers that never see a kiln_context (the
// ExecuTorch delegate). The stream must belong to the engine's device; execute still returns
// with the work finished. Ignored on the CPU.
KILN_API kiln_status kiln_set_thread_stream(void *stream);
// The calling thread's stream set by kiln_set_thread_stream, or NULL.
KILN_API void *kiln_thread_stream(void);
// Computes every output's shape from the bound input shapes without running anything, so a
// caller can size or resize its output buffers first (kiln_context_output_shape is valid after).
KILN_API kiln_status kiln_context_infer_shapes(kiln_context *context);
// Runs the engine; returns with the work finished and outputs written.
KILN_API kiln_status kiln_context_execute(kiln_context *context);
// The actual shape of output i after a successful execute or kiln_context_infer_shapes
// (out_dims holds KILN_MAX_RANK).
KILN_API kiln_status kiln_context_output_shape(const kiln_context *context, uint32_t index,
                                               uint32_t *out_rank, int64_t *out_dims);

// Describes engine bytes as JSON text (the schema of `kiln inspect --json`, docs/cli.md): the
// header, sections and CRCs, bindings, every plan layer (op, tensors with dtypes and shape
// ranges, attributes, fused tails, weight bytes), the memory plan and the weights. The bytes are
// validated as kiln_engine_load validates them (the same errors), but nothing is loaded onto a
// device and no external weight is needed. Writes the text and its NUL to buf when buf_nbytes
// is larger than the text; always sets *out_nbytes to the text's length (without the NUL), so a
// call with buf NULL and buf_nbytes 0 gives the size to allocate. Strings from the engine are
// escaped (bytes that are not UTF-8 become \u00XX): the text is valid JSON for any engine.
KILN_API kiln_status kiln_engine_describe(const void *data, size_t nbytes, char *buf,
                                          size_t buf_nbytes, size_t *out_nbytes);

// --- ExecuTorch data files (.ptd), checked before any other reader is given them

// Checks that data[0, nbytes) is a well-formed ExecuTorch .ptd file (FlatTensor): the header,
// the flatbuffer (every offset, vtable, vector and string inside the buffer, with the flatbuffer
// Verifier's rules), every segment inside the file's data region, every key present, unique and
// UTF-8 text, every segment index in range, every tensor layout consistent. ExecuTorch's own
// reader checks none of this and can crash on a damaged file; kiln.load and kiln_program_load
// run this check first. Errors: KILN_ERR_CORRUPT (names the field, the offset and the value),
// KILN_ERR_NO_MEMORY. The tensor data itself is not read (the weights are checked at engine load
// against their keys, option verify_weights).
KILN_API kiln_status kiln_ptd_check(const void *data, size_t nbytes);
// The same for a file, reading only its header and flatbuffer. Also KILN_ERR_IO.
KILN_API kiln_status kiln_ptd_check_file(const char *path);

// Checks that data[0, nbytes) is a well-formed ExecuTorch program (.pte): its extended header,
// and its whole flatbuffer with the Verifier's rules plus every field ExecuTorch's writer always
// writes present (ExecuTorch's method loader dereferences those without checking; a damaged one
// crashes it), every index inside what it indexes, and the memory each method plans at most
// the machine's physical memory (KILN_ERR_NO_MEMORY otherwise: ExecuTorch would allocate it).
// The segments (engines, weights) are not read: the engines and weights are checked when they
// load. kiln.load and kiln_program_load run this check first. Errors as kiln_ptd_check.
KILN_API kiln_status kiln_pte_check(const void *data, size_t nbytes);
// The same for a file, reading only its header and flatbuffer. Also KILN_ERR_IO.
KILN_API kiln_status kiln_pte_check_file(const char *path);

// Adds the tuning records a program carries (an image of a tuning cache file, what `kiln tune`
// writes; the export option tuning_records stores one in the program) to this process: contexts
// created later on a GPU apply the records made for it instead of timing, whatever the option
// tuning_cache (docs/cuda.md, "Tuning cache and start-up"); records made for another GPU, driver
// or Kiln version are never used. Untrusted input, checked whole (header, CRCs, every record's
// bounds): KILN_ERR_CORRUPT naming why when it does not check, and nothing is added. The
// ExecuTorch delegate calls it for a program that carries records. *out_n_records (may be NULL):
// the records added.
KILN_API kiln_status kiln_add_tuning_records(const void *data, size_t nbytes,
                                             uint32_t *out_n_records);

// --- what runs each layer (diagnostics, tests, `kiln inspect` and `kiln profile`)

#define KILN_LAYER_INFO_TAIL 0x1u   // fused into the head layer `head` (kernel "fused")
#define KILN_LAYER_INFO_FOLDED 0x2u // runs no kernel: its readers read its input through a view
#define KILN_LAYER_INFO_NHWC 0x4u   // the CUDA backend keeps its activations channels-last
#define KILN_LAYER_INFO_TIMED 0x8u  // its kernel was chosen by timing candidates on this device
#define KILN_LAYER_INFO_FELL_BACK                                                                  \
    0x10u // the library its plan named refused at run: Kiln's
          // own kernel runs it now (a warning or debug log says why)

typedef struct kiln_layer_info {
    uint32_t op;               // kiln_op of this plan layer
    uint32_t flags;            // KILN_LAYER_INFO_*
    uint32_t head;             // the head layer of its group (itself for a head layer)
    uint32_t n_fused;          // head layers: the tail layers fused into it
    char kernel[32];           // what runs the group: "cpu", "cublaslt", "gemv", "wgmma", ...
    char detail[224];          // the decision in words (algorithm, configuration, layout)
    uint64_t workspace_nbytes; // device workspace the group uses (0: none)
    int64_t l2_keep_nbytes;    // bytes of its weight the L2 plan keeps between executes (-1: none)
    uint64_t n_profiled;       // executes timed so far (the option profile; 0 without it)
    double device_us;          // mean device time of the group per timed execute (-1: not timed)
    double host_us;            // mean host time of the group per timed execute (-1: not timed)
} kiln_layer_info;

// The engine's plan layers (heads and fused tails, in execution order).
KILN_API uint32_t kiln_engine_n_layers(const kiln_engine *engine);
// Describes plan layer `layer` as this context runs it: the kernel and the decision made at
// context creation (or at the last execute, for shapes first seen there) and, with the option
// profile, its mean times. KILN_ERR_BUSY while another thread is inside the context.
KILN_API kiln_status kiln_context_layer_info(kiln_context *context, uint32_t layer,
                                             kiln_layer_info *out);

#ifdef __cplusplus
}
#endif

#endif // KILN_ENGINE_H
