// SPDX-License-Identifier: Apache-2.0
// The ABI between libkiln and the CUDA plugin (libkiln_cuda.so). libkiln never links a CUDA
// library: src/runtime/backend_cuda.c dlopen()s the plugin once, calls its one exported entry
// point with libkiln's services (error, log and allocator hooks, so that the plugin's messages
// reach the same log hook and kiln_last_error) and receives a table of functions. Plain C types
// only; both sides are built from the same tree and check abi and struct sizes.
#ifndef KILN_RUNTIME_BACKEND_PLUGIN_H
#define KILN_RUNTIME_BACKEND_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/plan_memory.h"
#include "kiln/kiln.h"
#include "runtime/backend.h"
#include "runtime/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CUDA_PLUGIN_ABI 7u
#define KILN_CUDA_PLUGIN_ENTRY "kiln_cuda_plugin_v2"
#define KILN_CUDA_PLUGIN_TEST_ENTRY "kiln_cuda_plugin_test_hooks_v2" // the test hooks (below)
#define KILN_CUDA_PLUGIN_FILE "libkiln_cuda.so"
#define KILN_CUDA_PLUGIN_ENV "KILN_CUDA_PLUGIN" // full path of the plugin, overrides the search

// What libkiln lends the plugin. Every function is thread-safe.
typedef struct kiln_cuda_services {
    uint32_t struct_nbytes;   // sizeof(kiln_cuda_services)
    uint32_t abi;             // KILN_CUDA_PLUGIN_ABI
    const char *kiln_version; // KILN_VERSION_STRING of libkiln: must equal the plugin's
    // Records `message` as this thread's last error, logs it at ERROR, returns status.
    kiln_status (*fail)(kiln_status status, const char *message);
    // Logs one message through the log hook (filtered by the current level).
    void (*log)(kiln_log_level level, const char *message);
    kiln_log_level (*log_level)(void);
    // The allocator hook (kiln_malloc / kiln_free).
    void *(*malloc)(size_t nbytes, size_t align);
    void (*free)(void *ptr, size_t nbytes);
    // Names for messages.
    const char *(*op_name)(uint32_t op);
    const char *(*dtype_name)(uint32_t dtype);
    // The memory planner the builder uses (src/core/plan_memory.h): the plugin places the
    // buffers its layer plans ask for with it.
    kiln_status (*plan_memory)(kiln_mem_item *items, uint32_t n, uint64_t align,
                               uint64_t *out_nbytes);
    // The tuning cache (src/core/tune_cache.h) the option value `where` (tuning_cache) names:
    // opaque records the plugin keys and checks itself.
    int (*tune_get)(const char *where, const void *key, size_t key_nbytes, void *val,
                    size_t val_cap, size_t *val_nbytes);
    void (*tune_put)(const char *where, const void *key, size_t key_nbytes, const void *val,
                     size_t val_nbytes);
    void (*tune_flush)(const char *where);
    void (*tune_stats)(const char *where, const void *prefix, size_t prefix_nbytes,
                       uint32_t *n_records, uint32_t *n_prefix);
} kiln_cuda_services;

// What the plugin gives back. Valid for the life of the process (the plugin is never unloaded).
typedef struct kiln_cuda_plugin {
    uint32_t struct_nbytes; // sizeof(kiln_cuda_plugin)
    uint32_t abi;           // KILN_CUDA_PLUGIN_ABI
    kiln_backend_ops ops;   // the backend (name "cuda")
    int (*device_count)(void);
    // "kiln_cuda 0.1.0: CUDA runtime 13.0, driver 13.0, cuBLASLt 130100, device 0 NVIDIA H200
    // (sm_90)"
    const char *(*version)(void);
} kiln_cuda_plugin;

// The plugin's exported entry point (KILN_CUDA_PLUGIN_ENTRY). Probes the driver and devices
// (once; later calls return the same table). On failure returns a status and writes why into
// reason (NUL-terminated, reason_nbytes > 0): the caller logs it and falls back to the CPU.
typedef kiln_status (*kiln_cuda_plugin_entry_fn)(const kiln_cuda_services *services, char *reason,
                                                 size_t reason_nbytes,
                                                 const kiln_cuda_plugin **out);

// The parity program's way into the plugin, behind a second exported symbol
// (KILN_CUDA_PLUGIN_TEST_ENTRY, valid after the entry point succeeded): nothing in libkiln uses it.
typedef struct kiln_cuda_test_hooks {
    uint32_t struct_nbytes; // sizeof(kiln_cuda_test_hooks)
    uint32_t abi;           // KILN_CUDA_PLUGIN_ABI
    // Runs one layer (op + fused tail) whose tensors live in device memory of `device`, on
    // `stream` (a cudaStream_t; NULL: a private stream), under `policy` (the options cuda.*; its
    // choices are planned untimed, as at an execute of a shape not seen at context creation),
    // and waits for it. *info (NULL: not wanted) receives the kernel and decision that ran.
    kiln_status (*run_op)(const kiln_kernel_args *args, int device, void *stream,
                          const kiln_cuda_policy *policy, kiln_layer_info *info);
    // cuDNN's version (cudnnGetVersion, e.g. 91900), loading it on first call; 0 when it cannot
    // be loaded (which cuDNN paths a test must see run).
    size_t (*dnn_version)(void);
} kiln_cuda_test_hooks;

typedef const kiln_cuda_test_hooks *(*kiln_cuda_test_entry_fn)(void);

#ifdef KILN_BUILDING_CUDA_PLUGIN
// The plugin's definitions of the two exported symbols (src/cuda/cuda_backend.c, cuda_run_op.c).
kiln_status kiln_cuda_plugin_v2(const kiln_cuda_services *services, char *reason,
                                size_t reason_nbytes, const kiln_cuda_plugin **out);
const kiln_cuda_test_hooks *kiln_cuda_plugin_test_hooks_v2(void);
#endif

// libkiln side (src/runtime/backend_cuda.c): the loaded plugin table, or NULL when the plugin
// is unavailable (the reason was logged at INFO). Loads at most once per process.
const kiln_cuda_plugin *kiln_cuda_plugin_get(void);
// The loaded plugin's test hooks, or NULL (no plugin, or one without them).
const kiln_cuda_test_hooks *kiln_cuda_test_hooks_get(void);

#ifdef __cplusplus
}
#endif

#endif // KILN_RUNTIME_BACKEND_PLUGIN_H
