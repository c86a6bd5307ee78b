// SPDX-License-Identifier: Apache-2.0
// Writes a plan as engine bytes (format v1, docs/format.md). Deterministic: the same plan gives
// the same bytes (padding zeroed, no timestamps, no pointers).
#ifndef KILN_BUILDER_SERIALIZE_H
#define KILN_BUILDER_SERIALIZE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/plan.h"

// On success *out_bytes (kiln_malloc'd, free with kiln_free(*out_bytes, *out_nbytes)).
kiln_status kiln_serialize(const kiln_plan *plan, uint8_t **out_bytes, size_t *out_nbytes);

#endif // KILN_BUILDER_SERIALIZE_H
