// SPDX-License-Identifier: Apache-2.0
// The one place libkiln reads the environment: the options' debug overrides (src/core/options.c),
// KILN_LOG_LEVEL (status.c) and KILN_CUDA_PLUGIN (src/runtime/backend_cuda.c). docs/options.md
// lists every variable.
#ifndef KILN_CORE_ENV_H
#define KILN_CORE_ENV_H

#include <stddef.h>

// The value of environment variable `name`, or NULL when it is unset (or name is NULL).
const char *kiln_env(const char *name);

// Calls fn(name, name_nbytes, user_data) for each variable of the environment whose name starts
// with `prefix` (names are not NUL-terminated: the '=' follows).
void kiln_env_each(const char *prefix, void (*fn)(const char *name, size_t name_nbytes, void *),
                   void *user_data);

#endif // KILN_CORE_ENV_H
