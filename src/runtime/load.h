// SPDX-License-Identifier: Apache-2.0
// Reads engine bytes into a plan, validating every field before use (the untrusted boundary).
// After a successful load the runtime may execute the plan without re-checking: ids in range,
// attributes match the op schemas, shapes consistent (shape inference re-run over the ranges),
// weights in bounds, memory plan inside the arena with no overlap among live tensors.
#ifndef KILN_RUNTIME_LOAD_H
#define KILN_RUNTIME_LOAD_H

#include <stddef.h>

#include "runtime/plan.h"

// On success fills *out (release with kiln_plan_release). The bytes are copied; nothing in the
// plan points into them. KILN_ERR_NOT_ENGINE / KILN_ERR_CORRUPT / KILN_ERR_VERSION /
// KILN_ERR_NO_MEMORY, with a message naming the field and the value.
kiln_status kiln_load_plan(const void *data, size_t nbytes, kiln_plan *out);

#endif // KILN_RUNTIME_LOAD_H
