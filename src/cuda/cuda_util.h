// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's host helpers without CUDA types (cuda_util.c): messages, logs and host memory
// go through the services libkiln lent at init (runtime/backend_plugin.h), so that they reach
// libkiln's log hook, kiln_last_error and allocator hook; the memory planner is libkiln's too.
// Plain C: the layout and fold passes (cuda_layout.c, cuda_fold.c) use only this header and are
// compiled into CPU-only tests.
#ifndef KILN_CUDA_CUDA_UTIL_H
#define KILN_CUDA_CUDA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "runtime/backend_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_CUDA_PRINTF_(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define KILN_CUDA_PRINTF_(fmt_idx, args_idx)
#endif

// Propagates a failure (KILN_TRY without libkiln's header).
#define KILN_CUDA_TRY(expr)                                                                        \
    do {                                                                                           \
        kiln_status kc_try_st_ = (expr);                                                           \
        if (kc_try_st_ != KILN_OK) return kc_try_st_;                                              \
    } while (0)

// Installs the services (the plugin entry point does, once, before any other call).
void kiln_cuda_services_set(const kiln_cuda_services *services);
// From now on the calling thread logs nothing and records no error (the background warm-up: a
// log hook must never be entered from a thread the caller does not know, e.g. one that needs a
// lock the caller holds while it waits for that thread).
void kiln_cuda_quiet_thread(void);
// Records the message as this thread's last error (logged by libkiln), returns status.
kiln_status kiln_cuda_fail(kiln_status status, const char *fmt, ...) KILN_CUDA_PRINTF_(2, 3);
// The message of this thread's last kiln_cuda_fail ("" if none).
const char *kiln_cuda_last_message(void);
void kiln_cuda_log(kiln_log_level level, const char *fmt, ...) KILN_CUDA_PRINTF_(2, 3);
// 1 when a message at `level` would be logged.
int kiln_cuda_log_enabled(kiln_log_level level);
void *kiln_cuda_malloc(size_t nbytes);
void *kiln_cuda_calloc(size_t nbytes);
void kiln_cuda_free(void *ptr, size_t nbytes);
const char *kiln_cuda_op_name(uint32_t op);
const char *kiln_cuda_dtype_name(uint32_t dtype);
// Places items by liveness with libkiln's planner (the builder's: src/core/plan_memory.h).
kiln_status kiln_cuda_plan_memory(kiln_mem_item *items, uint32_t n, uint64_t align,
                                  uint64_t *out_nbytes);
// libkiln's tuning cache (src/core/tune_cache.h) named by the option value `where`.
int kiln_cuda_tune_get(const char *where, const void *key, size_t key_nbytes, void *val,
                       size_t val_cap, size_t *val_nbytes);
void kiln_cuda_tune_put(const char *where, const void *key, size_t key_nbytes, const void *val,
                        size_t val_nbytes);
void kiln_cuda_tune_flush(const char *where);
void kiln_cuda_tune_stats(const char *where, const void *prefix, size_t prefix_nbytes,
                          uint32_t *n_records, uint32_t *n_prefix);

// The largest power of two (<= 256) dividing the address; 0 for NULL (plan keys, alignments).
static inline int64_t kiln_cuda_align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int64_t a = 1;
    if (p == NULL) return 0;
    while (a < 256 && (u & (uintptr_t)(2 * a - 1)) == 0) a *= 2;
    return a;
}

// Element size of a dtype (0 if invalid).
size_t kiln_cuda_dtype_size(uint32_t dtype);
static inline int kiln_cuda_is_float(uint32_t dtype) {
    return dtype == KILN_DTYPE_F32 || dtype == KILN_DTYPE_F16 || dtype == KILN_DTYPE_BF16;
}

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_UTIL_H
