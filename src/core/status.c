// SPDX-License-Identifier: Apache-2.0
// Status strings, the thread-local last-error message, the log hook and the version.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__STDC_NO_ATOMICS__)
#error "Kiln needs C11 atomics"
#endif
#include <stdatomic.h>

#include "core/env.h"
#include "core/status.h"
#include "core/utf8.h"

static const char *const status_names[KILN_STATUS_COUNT] = {
    [KILN_OK] = "ok",
    [KILN_ERR_INVALID_ARG] = "invalid argument",
    [KILN_ERR_NO_MEMORY] = "out of memory",
    [KILN_ERR_NOT_ENGINE] = "not a Kiln engine",
    [KILN_ERR_CORRUPT] = "corrupt engine",
    [KILN_ERR_VERSION] = "engine made by a newer Kiln",
    [KILN_ERR_UNSUPPORTED] = "unsupported",
    [KILN_ERR_SHAPE] = "shape or dtype mismatch",
    [KILN_ERR_MISSING_DATA] = "missing external data",
    [KILN_ERR_DEVICE] = "device error",
    [KILN_ERR_IO] = "I/O error",
    [KILN_ERR_BUSY] = "context busy",
    [KILN_ERR_INVALID_STATE] = "invalid state",
    [KILN_ERR_INTERNAL] = "internal error",
};

static const char *const status_ids[KILN_STATUS_COUNT] = {
    [KILN_OK] = "KILN_OK",
    [KILN_ERR_INVALID_ARG] = "KILN_ERR_INVALID_ARG",
    [KILN_ERR_NO_MEMORY] = "KILN_ERR_NO_MEMORY",
    [KILN_ERR_NOT_ENGINE] = "KILN_ERR_NOT_ENGINE",
    [KILN_ERR_CORRUPT] = "KILN_ERR_CORRUPT",
    [KILN_ERR_VERSION] = "KILN_ERR_VERSION",
    [KILN_ERR_UNSUPPORTED] = "KILN_ERR_UNSUPPORTED",
    [KILN_ERR_SHAPE] = "KILN_ERR_SHAPE",
    [KILN_ERR_MISSING_DATA] = "KILN_ERR_MISSING_DATA",
    [KILN_ERR_DEVICE] = "KILN_ERR_DEVICE",
    [KILN_ERR_IO] = "KILN_ERR_IO",
    [KILN_ERR_BUSY] = "KILN_ERR_BUSY",
    [KILN_ERR_INVALID_STATE] = "KILN_ERR_INVALID_STATE",
    [KILN_ERR_INTERNAL] = "KILN_ERR_INTERNAL",
};

const char *kiln_status_str(kiln_status status) {
    if ((unsigned)status >= KILN_STATUS_COUNT) return "unknown status";
    return status_names[status];
}

const char *kiln_status_name(kiln_status status) {
    if ((unsigned)status >= KILN_STATUS_COUNT) return "KILN_ERR_UNKNOWN";
    return status_ids[status];
}

uint32_t kiln_version(void) {
    return ((uint32_t)KILN_VERSION_MAJOR << 16) | ((uint32_t)KILN_VERSION_MINOR << 8) |
           (uint32_t)KILN_VERSION_PATCH;
}

const char *kiln_version_string(void) { return KILN_VERSION_STRING; }

// --- messages: formatted, then made safe text (src/core/utf8.h) so that neither the log hook
// nor kiln_last_error ever carries bytes that are not valid UTF-8, or control characters, even
// when a message quotes a string from a damaged file. A message longer than the buffer ends
// with "..." at a character boundary.

#define MSG_NBYTES 4096

static void format_message(char *out, const char *fmt, va_list ap) {
    char raw[MSG_NBYTES];
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n, used = 0;
    int cut = len >= sizeof raw;
    if (cut) {
        // Drop a multi-byte character that vsnprintf cut in half.
        len = sizeof raw - 1;
        size_t j = len;
        while (j > 0 && len - j < 3 && ((unsigned char)raw[j - 1] & 0xC0) == 0x80) j--;
        if (j > 0 && (unsigned char)raw[j - 1] >= 0xC0 &&
            kiln_utf8_seq_len((const unsigned char *)raw + j - 1, len - (j - 1)) == 0)
            len = j - 1;
    }
    size_t w = kiln_utf8_escape(out, MSG_NBYTES - 3, raw, len, &used);
    if (cut || used < len) memcpy(out + w, "...", 4);
}

// --- last error (thread-local)

static _Thread_local char last_error[MSG_NBYTES];

const char *kiln_last_error(void) { return last_error; }
void kiln_clear_error(void) { last_error[0] = '\0'; }

// --- log hook

static void default_log(void *user_data, kiln_log_level level, const char *message) {
    static const char *const names[] = {"debug", "info", "warning", "error"};
    (void)user_data;
    fprintf(stderr, "kiln %s: %s\n", level <= KILN_LOG_ERROR ? names[level] : "?", message);
}

static kiln_log_fn log_fn = default_log;
static void *log_user_data;
static _Atomic int log_level = -1; // -1: not yet read from KILN_LOG_LEVEL

static kiln_log_level level_from_env(void) {
    const char *v = kiln_env("KILN_LOG_LEVEL");
    static const char *const names[] = {"debug", "info", "warn", "error", "none"};
    if (v != NULL) {
        for (int i = 0; i <= KILN_LOG_NONE; i++) {
            if (strcmp(v, names[i]) == 0) return (kiln_log_level)i;
        }
    }
    return KILN_LOG_WARN;
}

kiln_log_level kiln_log_get_level(void) {
    int l = atomic_load(&log_level);
    if (l < 0) {
        l = (int)level_from_env();
        atomic_store(&log_level, l);
    }
    return (kiln_log_level)l;
}

void kiln_log_set(kiln_log_fn fn, void *user_data, kiln_log_level min_level) {
    log_fn = fn ? fn : default_log;
    log_user_data = fn ? user_data : NULL;
    if ((unsigned)min_level > KILN_LOG_NONE) min_level = KILN_LOG_WARN;
    atomic_store(&log_level, (int)min_level);
}

static void emit(kiln_log_level level, const char *msg) {
    if (level < kiln_log_get_level()) return;
    log_fn(log_user_data, level, msg);
}

void kiln_log(kiln_log_level level, const char *fmt, ...) {
    char buf[MSG_NBYTES];
    va_list ap;
    if (level < kiln_log_get_level()) return;
    va_start(ap, fmt);
    format_message(buf, fmt, ap);
    va_end(ap);
    emit(level, buf);
}

kiln_status kiln_fail(kiln_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_message(last_error, fmt, ap);
    va_end(ap);
    // The caller receives the status and kiln_last_error(); the log gets the detail at INFO so
    // that errors the caller handles (and reports itself) are not printed twice by default.
    emit(KILN_LOG_INFO, last_error);
    return status;
}
