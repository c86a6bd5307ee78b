// SPDX-License-Identifier: Apache-2.0
// The one reader of the environment (env.h).
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"

extern char **environ;

const char *kiln_env(const char *name) { return name != NULL ? getenv(name) : NULL; }

void kiln_env_each(const char *prefix, void (*fn)(const char *name, size_t name_nbytes, void *),
                   void *user_data) {
    size_t np = strlen(prefix);
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        size_t n = eq != NULL ? (size_t)(eq - *e) : strlen(*e);
        if (n >= np && strncmp(*e, prefix, np) == 0) fn(*e, n, user_data);
    }
}
