// SPDX-License-Identifier: Apache-2.0
// Kiln: a GPU inference engine and ExecuTorch delegate, in C.
//
// This is the one header users include. It declares the process-wide pieces (version, status
// codes, the log and allocator hooks, dtypes, runtime options) and pulls in the rest:
//   kiln_ops.h     the op table (ids are file-format ABI)
//   kiln_graph.h   describe a graph and build it into engine bytes
//   kiln_engine.h  load engine bytes, bind inputs and outputs, execute
//   kiln_format.h  engine-format constants
//
// Usage sketch (error handling elided):
//   kiln_graph *g;            kiln_graph_new(&g);
//   int32_t x;                kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, mins, maxs, &x);
//   ...add constants and nodes, mark outputs...
//   kiln_build_options o;     kiln_build_options_init(&o);
//   kiln_built *b;            kiln_build(g, &o, &b);
//   const void *bytes; size_t n;  kiln_built_engine(b, &bytes, &n);
//   kiln_engine *e;           kiln_engine_load(bytes, n, NULL, &e);
//   kiln_context *c;          kiln_context_new(e, &c);
//   kiln_context_set_input(c, 0, 2, dims, x_data);  kiln_context_set_output(c, 0, y, y_nbytes);
//   kiln_context_execute(c);
//
// Conventions: every fallible call returns kiln_status; results come through out-parameters
// written only on success; the detail of a failure goes to the log hook and is kept in a
// thread-local message (kiln_last_error). Whoever creates an object frees it; every _free
// accepts NULL. The library never aborts or exits.
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define KILN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

// --- version

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

// The library's version as (major << 16) | (minor << 8) | patch.
KILN_API uint32_t kiln_version(void);
KILN_API const char *kiln_version_string(void);

// --- status codes (values are ABI: never renumber)

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG = 1,    // the caller broke an API contract (null pointer, bad index, ...)
    KILN_ERR_NO_MEMORY = 2,      // a host or device allocation failed
    KILN_ERR_NOT_ENGINE = 3,     // the bytes are not a Kiln engine at all (bad magic)
    KILN_ERR_CORRUPT = 4,        // a Kiln engine, but malformed or truncated
    KILN_ERR_VERSION = 5,        // a well-formed engine made by a newer Kiln (format or op version)
    KILN_ERR_UNSUPPORTED = 6,    // op, dtype, attribute or shape not supported
    KILN_ERR_SHAPE = 7,          // an input shape or dtype outside what the engine accepts
    KILN_ERR_MISSING_DATA = 8,   // an external weight key could not be resolved
    KILN_ERR_DEVICE = 9,         // a device (CUDA) call failed; the engine may be unusable
    KILN_ERR_IO = 10,            // a file read or write failed (CLI, tools)
    KILN_ERR_BUSY = 11,          // the execution context is in use by another thread
    KILN_ERR_INVALID_STATE = 12, // call out of order (e.g. execute before inputs are bound)
    KILN_ERR_INTERNAL = 13,      // an invariant broke: a bug in Kiln
    KILN_STATUS_COUNT
} kiln_status;

// A short, static, human-readable name for a status ("corrupt engine", ...). Never NULL.
KILN_API const char *kiln_status_str(kiln_status status);
// The status's identifier as in this header ("KILN_ERR_CORRUPT", ...; "KILN_ERR_UNKNOWN" for a
// value outside the enum). Never NULL.
KILN_API const char *kiln_status_name(kiln_status status);

// The message of the last failure on this thread (names the field, the value and the remedy),
// or "" if none: valid UTF-8 without control characters (bytes quoted from a damaged file are
// written as \xNN), at most 4095 bytes. Valid until the next Kiln call on this thread.
KILN_API const char *kiln_last_error(void);
KILN_API void kiln_clear_error(void);

// --- logging

typedef enum kiln_log_level {
    KILN_LOG_DEBUG = 0,
    KILN_LOG_INFO = 1,
    KILN_LOG_WARN = 2,
    KILN_LOG_ERROR = 3,
    KILN_LOG_NONE = 4,
} kiln_log_level;

// Receives one complete message per call (no trailing newline): valid UTF-8 without control
// characters (bytes quoted from a damaged file are written as \xNN). May be called from any
// thread.
typedef void (*kiln_log_fn)(void *user_data, kiln_log_level level, const char *message);

// Installs the log callback (NULL restores the default: stderr) and the minimum level delivered
// (default KILN_LOG_WARN, or the KILN_LOG_LEVEL environment variable: debug|info|warn|error|none).
KILN_API void kiln_log_set(kiln_log_fn fn, void *user_data, kiln_log_level min_level);
KILN_API kiln_log_level kiln_log_get_level(void);

// --- allocator hook

// All host memory Kiln allocates goes through this hook. alloc returns memory aligned to at
// least `align` (a power of two, at most 4096) or NULL; free receives the size given to alloc.
typedef struct kiln_allocator {
    void *user_data;
    void *(*alloc)(void *user_data, size_t nbytes, size_t align);
    void (*free)(void *user_data, void *ptr, size_t nbytes);
} kiln_allocator;

// Installs the allocator (NULL restores the default, aligned malloc). Not thread-safe: set it
// before any other Kiln call, and free every Kiln object before changing it again.
KILN_API kiln_status kiln_set_allocator(const kiln_allocator *allocator);

// --- dtypes (values are file-format ABI)

typedef enum kiln_dtype {
    KILN_DTYPE_INVALID = 0,
    KILN_DTYPE_F32 = 1,
    KILN_DTYPE_F16 = 2,
    KILN_DTYPE_BF16 = 3,
    KILN_DTYPE_I32 = 4,
    KILN_DTYPE_I64 = 5,
    KILN_DTYPE_BOOL = 6,
    KILN_DTYPE_COUNT
} kiln_dtype;

// Size of one element in bytes, or 0 for an invalid dtype.
KILN_API size_t kiln_dtype_size(kiln_dtype dtype);
// "float32", "float16", "bfloat16", "int32", "int64", "bool"; "invalid" otherwise.
KILN_API const char *kiln_dtype_name(kiln_dtype dtype);

// Largest tensor rank Kiln handles.
#define KILN_MAX_RANK 8

// --- runtime options (process-wide; see docs/options.md for the table)

typedef enum kiln_option_type {
    KILN_OPTION_BOOL = 1,
    KILN_OPTION_INT = 2,
    KILN_OPTION_STRING = 3,
} kiln_option_type;

// Sets a process-wide runtime option. Unknown names give KILN_ERR_INVALID_ARG naming the valid
// ones; a value of the wrong type or out of range gives KILN_ERR_INVALID_ARG too.
KILN_API kiln_status kiln_set_option_bool(const char *name, int value);
KILN_API kiln_status kiln_set_option_int(const char *name, int64_t value);
KILN_API kiln_status kiln_set_option_string(const char *name, const char *value);
// Reads an option's current value as text into buf (NUL-terminated, truncated to buf_nbytes).
KILN_API kiln_status kiln_get_option(const char *name, char *buf, size_t buf_nbytes);
KILN_API uint32_t kiln_option_count(void);
// Describes option i: its name, type, default (as text) and scope ("process", "load", "both").
KILN_API kiln_status kiln_option_info(uint32_t index, const char **out_name,
                                      kiln_option_type *out_type, const char **out_default,
                                      const char **out_scope);
// Documents option i: one line of help (static), the environment variable that overrides it for
// debugging ("" when none; e.g. KILN_CUDA_TUNE for cuda.tune) and its accepted values as text.
// Any out-pointer may be NULL (a buffer with its size 0).
KILN_API kiln_status kiln_option_describe(uint32_t index, const char **out_help, char *env_buf,
                                          size_t env_nbytes, char *accepted_buf,
                                          size_t accepted_nbytes);

#ifdef __cplusplus
}
#endif

#include "kiln_engine.h"
#include "kiln_format.h"
#include "kiln_graph.h"
#include "kiln_ops.h"

#endif // KILN_H
