// SPDX-License-Identifier: Apache-2.0
// Internal error vocabulary: record a failure (log + thread-local message) and return its
// status. The code is the class of the failure; the message carries the detail (field, value,
// expected, remedy). See include/kiln/kiln.h for the status codes.
#ifndef KILN_CORE_STATUS_H
#define KILN_CORE_STATUS_H

#include <assert.h>

#include "kiln/kiln.h"

#if defined(__GNUC__)
#define KILN_PRINTF(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define KILN_PRINTF(fmt_idx, args_idx)
#endif

// Records `status` with a printf-style message as this thread's last error (kiln_last_error),
// logs it at INFO level (callers report failures they do not handle) and returns `status`.
kiln_status kiln_fail(kiln_status status, const char *fmt, ...) KILN_PRINTF(2, 3);

// Logs a message at `level` through the log hook (no thread-local error is recorded).
void kiln_log(kiln_log_level level, const char *fmt, ...) KILN_PRINTF(2, 3);

// Propagate a failure.
#define KILN_TRY(expr)                                                                             \
    do {                                                                                           \
        kiln_status kiln_try_st_ = (expr);                                                         \
        if (kiln_try_st_ != KILN_OK) return kiln_try_st_;                                          \
    } while (0)

// Check a condition; on failure record the message and return the status.
#define KILN_CHECK(cond, status, ...)                                                              \
    do {                                                                                           \
        if (!(cond)) return kiln_fail((status), __VA_ARGS__);                                      \
    } while (0)

// Internal invariant (on in debug, fuzz and sanitizer builds; never reached by bad input).
#define KILN_ASSERT(cond) assert(cond)

#endif // KILN_CORE_STATUS_H
