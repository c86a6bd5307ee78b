// SPDX-License-Identifier: Apache-2.0
// Internal allocation: every host allocation goes through the allocator hook (kiln.h), so tests
// can fail the Nth allocation. Sizes are passed back on free.
#ifndef KILN_CORE_ALLOC_H
#define KILN_CORE_ALLOC_H

#include <stddef.h>

// Returns nbytes of memory aligned to `align` (power of two <= 4096), or NULL. nbytes == 0
// returns a unique non-NULL pointer that must still be freed with size 0.
void *kiln_malloc(size_t nbytes, size_t align);
// Like kiln_malloc, zero-filled.
void *kiln_calloc(size_t nbytes, size_t align);
// Frees memory from kiln_malloc; NULL is accepted.
void kiln_free(void *ptr, size_t nbytes);
// Duplicates a NUL-terminated string (free with kiln_free(p, strlen(p) + 1)).
char *kiln_strdup(const char *s);

// Default alignment for general allocations.
#define KILN_ALIGN 16
// Alignment for tensor data (activation arena, weights).
#define KILN_DATA_ALIGN 64

#endif // KILN_CORE_ALLOC_H
