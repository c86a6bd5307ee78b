// SPDX-License-Identifier: Apache-2.0
// Kiln program API: load and run an ExecuTorch program (.pte, optionally with .ptd weight files)
// from C, with the KilnBackend delegate registered. Implemented in libkiln_executorch.so over
// ExecuTorch's Module API; link it with the CMake target kiln::executorch_backend.
//
// Usage sketch (error handling elided; see examples/c/main.c):
//   kiln_program *p;
//   kiln_program_load("mlp.pte", NULL, &p);            // NULL options: no .ptd, eager load
//   kiln_tensor_info in;
//   kiln_program_input_info(p, "forward", 0, &in);     // dtype, rank, dims, nbytes
//   kiln_input x = {.data = buf, .dtype = in.dtype, .rank = in.rank, .dims = in.dims};
//   kiln_program_set_input(p, "forward", 0, &x);
//   kiln_program_execute(p, "forward");
//   kiln_output y;
//   kiln_program_output(p, "forward", 0, &y);          // y.data, y.dims, y.dtype, y.nbytes
//   kiln_program_free(p);
//
// Conventions (as in kiln.h): every fallible call returns kiln_status, writes out-parameters only
// on success, and keeps the failure's message (what failed, the value, the remedy) in a
// thread-local string read with kiln_program_last_error(). No call throws, aborts or exits. A
// method name of NULL means "forward".
//
// Threading: a kiln_program is single-owner. A call that runs, binds or reads outputs while
// another thread is inside such a call on the same program gets KILN_ERR_BUSY; queries of the
// program's metadata (method names, tensor info) may run concurrently.
//
// Options: per load, kiln_program_options.settings are handed to KilnBackend for this program's
// engines (ExecuTorch's LoadBackendOptionsMap); process-wide options are kiln_set_option_* in
// kiln.h. docs/options.md lists the options, docs/cpp.md documents this API.
#ifndef KILN_PROGRAM_H
#define KILN_PROGRAM_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_program kiln_program;

// Where a tensor's data lives.
typedef enum kiln_memory {
    KILN_MEMORY_HOST = 0, // host memory
    KILN_MEMORY_CUDA = 1, // CUDA device memory (device_index selects the GPU)
} kiln_memory;

typedef struct kiln_program_options {
    uint32_t struct_nbytes;        // sizeof(kiln_program_options), set by _init
    const char *const *data_paths; // .ptd files holding the program's external weights
    uint32_t n_data_paths;
    const kiln_option_setting *settings; // per-load KilnBackend options for this program
    uint32_t n_settings;
    int32_t lazy_methods; // 0 (default): load every method in _load;
                          // 1: load each method at its first use
    int32_t use_mmap;     // 1: map the files instead of reading them
} kiln_program_options;

KILN_API void kiln_program_options_init(kiln_program_options *options);

// Loads an ExecuTorch program. The files are untrusted: every .ptd is checked by Kiln before
// ExecuTorch reads it (kiln_ptd_check_file), the program's flatbuffer is verified in full, and
// every Kiln engine and weight is validated at method load. Errors: KILN_ERR_IO (a file is
// missing or unreadable: names it), KILN_ERR_CORRUPT (not an ExecuTorch program, a damaged
// .ptd, a damaged Kiln engine or weight), KILN_ERR_VERSION (an engine from a newer Kiln),
// KILN_ERR_MISSING_DATA (a method needs external weights that no .ptd given holds),
// KILN_ERR_DEVICE (the option device asks for a GPU that is not available),
// KILN_ERR_INVALID_ARG (an unknown or process-only option), KILN_ERR_UNSUPPORTED (an operator
// without a kernel, or a delegate not registered in this process), KILN_ERR_NO_MEMORY. A
// failure inside KilnBackend returns Kiln's own status and its whole message.
// options may be NULL. The methods of one loaded program share its state: the states Kiln's
// engines own, and ExecuTorch's shared mutable-buffer arena (programs exported with
// share_mutable_buffers: buffers several methods update outside the delegates); each load
// (and each kiln_program_share handle) has its own.
KILN_API kiln_status kiln_program_load(const char *path, const kiln_program_options *options,
                                       kiln_program **out);
KILN_API void kiln_program_free(kiln_program *program);

// The most memory one method may plan (ExecuTorch allocates and zeroes it when the method
// loads), for methods loaded after the call, process-wide: a program asking for more is refused
// with KILN_ERR_NO_MEMORY before anything is allocated, so a damaged size cannot take the
// machine's memory. 0 (the default): the machine's physical memory.
KILN_API void kiln_program_set_planned_limit(uint64_t nbytes);
// Another handle on the same loaded program, for another thread: ExecuTorch's Program (the
// file's bytes, read and verified once) is immutable and shared; the new handle has its own
// methods, Kiln engines and buffers, so handles run at the same time, each single-owner as
// above. It takes the original's options and lazy_methods; either handle may be freed first.
// KILN_ERR_UNSUPPORTED for a program loaded with .ptd data files (ExecuTorch's Module cannot
// attach them to a shared program: load it once per thread).
KILN_API kiln_status kiln_program_share(const kiln_program *program, kiln_program **out);

// The message of the last kiln_program_* call on this thread if it failed, else "" (every call
// clears it first). Valid until the next kiln_program_* call on this thread.
KILN_API const char *kiln_program_last_error(void);

// --- methods

KILN_API kiln_status kiln_program_method_count(const kiln_program *program, uint32_t *out_count);
// Method i's name (valid while the program lives), in the program's order.
KILN_API kiln_status kiln_program_method_name(const kiln_program *program, uint32_t index,
                                              const char **out_name);
// Loads a method now (with lazy_methods: otherwise its first set_input/execute does).
// An unknown name gives KILN_ERR_INVALID_ARG listing the program's methods.
KILN_API kiln_status kiln_program_load_method(kiln_program *program, const char *method);
// 1 when the method delegates work to KilnBackend, else 0.
KILN_API kiln_status kiln_program_method_uses_kiln(const kiln_program *program, const char *method,
                                                   int32_t *out_uses_kiln);

// --- metadata of a method's inputs and outputs (from the program: no method load needed)

typedef struct kiln_tensor_info {
    int32_t is_tensor;   // 0 for a non-tensor value (int, bool, None): the rest is zero
    kiln_dtype dtype;    // KILN_DTYPE_INVALID when not one of Kiln's dtypes
    int32_t scalar_type; // ExecuTorch's ScalarType code (6 = float, 4 = long, ...)
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK]; // the exported shape; upper bounds for dynamic dimensions
    uint64_t nbytes;             // bytes at that shape
    int32_t memory_planned;      // 1: the program owns the memory (inputs are copied in,
                                 // outputs are read in place); 0: the caller supplies it
} kiln_tensor_info;

KILN_API kiln_status kiln_program_n_inputs(const kiln_program *program, const char *method,
                                           uint32_t *out_count);
KILN_API kiln_status kiln_program_n_outputs(const kiln_program *program, const char *method,
                                            uint32_t *out_count);
KILN_API kiln_status kiln_program_input_info(const kiln_program *program, const char *method,
                                             uint32_t index, kiln_tensor_info *out);
KILN_API kiln_status kiln_program_output_info(const kiln_program *program, const char *method,
                                              uint32_t index, kiln_tensor_info *out);

// --- binding and running

typedef struct kiln_input {
    const void *data;     // contiguous, row-major
    kiln_dtype dtype;     // must equal the input's dtype
    uint32_t rank;        // must equal the input's rank
    const int64_t *dims;  // rank entries: static dimensions must match, dynamic ones may be
                          // at most the exported size
    kiln_memory memory;   // KILN_MEMORY_CUDA only for inputs that are not memory-planned
    int32_t device_index; // with KILN_MEMORY_CUDA
} kiln_input;

// Binds input `index`. A memory-planned input (the default export) is copied into the program's
// memory now, and must be bound again before every execute (the program may reuse that memory
// while it runs); any other input is used in place (its data must stay valid until execute
// returns) and stays bound. Errors: KILN_ERR_INVALID_ARG (index out of range: says how many
// inputs the method takes; a non-tensor input), KILN_ERR_SHAPE (a dtype, rank or dimension that
// does not match: names it and the expected value), KILN_ERR_UNSUPPORTED (device memory for a
// memory-planned input).
KILN_API kiln_status kiln_program_set_input(kiln_program *program, const char *method,
                                            uint32_t index, const kiln_input *input);
// Binds all inputs; n_inputs must equal the method's input count (KILN_ERR_INVALID_ARG).
KILN_API kiln_status kiln_program_set_inputs(kiln_program *program, const char *method,
                                             uint32_t n_inputs, const kiln_input *inputs);
// Supplies caller memory for output `index` (capacity_nbytes at least the output's nbytes from
// kiln_program_output_info), used by every later execute. Only for outputs that are not
// memory-planned (exported with alloc_graph_output=False): a planned output gives
// KILN_ERR_UNSUPPORTED (read it with kiln_program_output instead).
KILN_API kiln_status kiln_program_set_output_buffer(kiln_program *program, const char *method,
                                                    uint32_t index, void *data,
                                                    size_t capacity_nbytes, kiln_memory memory);
// Runs the method. KILN_ERR_INVALID_STATE when an input was not bound since the last execute
// or an output that is not memory-planned has no buffer (names which).
KILN_API kiln_status kiln_program_execute(kiln_program *program, const char *method);

typedef struct kiln_output {
    void *data; // valid until the method's next execute or kiln_program_free
    kiln_dtype dtype;
    int32_t scalar_type;
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
    uint64_t nbytes;
    kiln_memory memory;
    int32_t device_index;
} kiln_output;

// Output `index` of the last successful execute (KILN_ERR_INVALID_STATE before one).
KILN_API kiln_status kiln_program_output(kiln_program *program, const char *method, uint32_t index,
                                         kiln_output *out);

// --- the delegate library itself

// The ExecuTorch version libkiln_executorch.so was built against (e.g. "1.5.1+cpu").
KILN_API const char *kiln_executorch_built_against(void);
// 1 when ExecuTorch's backend registry maps "KilnBackend" to this library, else 0.
KILN_API int kiln_executorch_owns_registration(void);
// ExecuTorch's error code from the static registration (0: registered).
KILN_API uint32_t kiln_executorch_registration_error(void);

// The last failure of the KilnBackend delegate on the calling thread (ExecuTorch passes only an
// error code up: this is the cause), for callers that use ExecuTorch directly (Module, Python's
// executorch.runtime): its status (KILN_OK when none since the last clear) and its whole message
// ("loading the Kiln engine failed (method 'forward'): KILN_ERR_CORRUPT (corrupt engine): ...",
// UTF-8 text, valid until the thread's next delegate call). The same text goes to ExecuTorch's
// log in lines of at most 256 bytes. kiln_program_* calls read it themselves.
KILN_API kiln_status kiln_executorch_last_status(void);
KILN_API const char *kiln_executorch_last_error(void);
KILN_API void kiln_executorch_clear_error(void);

// Counts, process-wide, of what the links between the Kiln delegates of a method did (a tensor
// one Kiln delegate passes straight to another stays in the producing engine's memory:
// docs/runtime.md, "Between delegates"; option link_delegates). For checking that a program's
// engines pass their tensors on the device, and for debugging.
typedef struct kiln_executorch_link_stats {
    uint64_t inputs_linked;        // delegate inputs bound to the producing engine's memory
    uint64_t inputs_host;          // linked inputs that read the host buffer instead (the reason
                                   // is logged at DEBUG, once per input)
    uint64_t outputs_kept;         // linked outputs left in the engine's memory only: no copy
    uint64_t outputs_copied;       // linked outputs also copied to their host buffer (a reader
                                   // outside Kiln, or a Kiln reader that did not take the link
                                   // in the previous run)
    uint64_t outputs_materialized; // host copies made later, for a reader that could not take
                                   // the link
} kiln_executorch_link_stats;
KILN_API void kiln_executorch_link_stats_get(kiln_executorch_link_stats *out);
KILN_API void kiln_executorch_link_stats_reset(void);

#ifdef __cplusplus
}
#endif

#endif // KILN_PROGRAM_H
