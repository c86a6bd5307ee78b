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

#include "kiln/kiln.h"
#include "runtime/backend.h"
#include "runtime/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CUDA_PLUGIN_ABI 1u
#define KILN_CUDA_PLUGIN_ENTRY "kiln_cuda_plugin_v1"
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
} kiln_cuda_services;

// Flags of run_op.
#define KILN_CUDA_RUN_NO_CUBLASLT 0x1u     // GEMMs through Kiln's own kernel instead of cuBLASLt
#define KILN_CUDA_RUN_NO_CUDNN 0x2u        // convolutions through Kiln's own kernels, not cuDNN
#define KILN_CUDA_RUN_NO_TC_ATTENTION 0x4u // sdpa on the fp32-FMA kernel, not the tensor-core one
// A linear Kiln's small-M wgmma kernel takes (cuda_wg.h) runs on it with BN columns per CTA (64
// or 128), K split over `split` CTAs (1, 2, 4, 8) and occ CTAs per SM (1, 2), where the device
// has it (sm_90).
#define KILN_CUDA_RUN_WG(bn, split, occ)                                                           \
    ((((uint32_t)(bn) / 64u) << 8) | ((uint32_t)(split) << 12) | ((uint32_t)(occ) << 16))
#define KILN_CUDA_RUN_WG_BN(flags) ((((flags) >> 8) & 0xfu) * 64u)
#define KILN_CUDA_RUN_WG_SPLIT(flags) (((flags) >> 12) & 0xfu)
#define KILN_CUDA_RUN_WG_OCC(flags) (((flags) >> 16) & 0xfu)
// A float16/bfloat16 linear runs with K split over s (2, 4, 8) slices of a strided-batched
// cuBLASLt GEMM and Kiln's reduce kernel, where it can (op_gemm.cu); without it run_op never
// splits.
#define KILN_CUDA_RUN_SPLITK(s) ((uint32_t)(s) << 20)
#define KILN_CUDA_RUN_SPLITK_OF(flags) (((flags) >> 20) & 0xfu)

// What the plugin gives back. Valid for the life of the process (the plugin is never unloaded).
typedef struct kiln_cuda_plugin {
    uint32_t struct_nbytes; // sizeof(kiln_cuda_plugin)
    uint32_t abi;           // KILN_CUDA_PLUGIN_ABI
    kiln_backend_ops ops;   // the backend (name "cuda")
    int (*device_count)(void);
    // "kiln_cuda 0.1.0: CUDA runtime 13.0, driver 13.0, cuBLASLt 130100, device 0 NVIDIA H200
    // (sm_90)"
    const char *(*version)(void);
    // Test hook: runs one layer (op + fused tail) whose tensors live in device memory on device
    // `device`, on `stream` (a cudaStream_t; NULL: a private stream), and waits for it.
    kiln_status (*run_op)(const kiln_kernel_args *args, int device, void *stream, uint32_t flags);
    // cuDNN's version (cudnnGetVersion, e.g. 91900), loading it on first call; 0 when it cannot
    // be loaded (tests and diagnostics: which cuDNN paths must run).
    size_t (*dnn_version)(void);
} kiln_cuda_plugin;

// The plugin's exported entry point (KILN_CUDA_PLUGIN_ENTRY). Probes the driver and devices
// (once; later calls return the same table). On failure returns a status and writes why into
// reason (NUL-terminated, reason_nbytes > 0): the caller logs it and falls back to the CPU.
typedef kiln_status (*kiln_cuda_plugin_entry_fn)(const kiln_cuda_services *services, char *reason,
                                                 size_t reason_nbytes,
                                                 const kiln_cuda_plugin **out);

#ifdef KILN_BUILDING_CUDA_PLUGIN
// The plugin's definition of the entry point (src/cuda/cuda_backend.c).
kiln_status kiln_cuda_plugin_v1(const kiln_cuda_services *services, char *reason,
                                size_t reason_nbytes, const kiln_cuda_plugin **out);
#endif

// libkiln side (src/runtime/backend_cuda.c): the loaded plugin table, or NULL when the plugin
// is unavailable (the reason was logged at INFO). Loads at most once per process.
const kiln_cuda_plugin *kiln_cuda_plugin_get(void);

#ifdef __cplusplus
}
#endif

#endif // KILN_RUNTIME_BACKEND_PLUGIN_H
