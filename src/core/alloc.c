// SPDX-License-Identifier: Apache-2.0
// The allocator hook. The default is aligned_alloc/free; tests install a failing allocator.
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"

static void *default_alloc(void *user_data, size_t nbytes, size_t align) {
    (void)user_data;
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded = (nbytes + align - 1) & ~(align - 1);
    if (rounded < nbytes) return NULL;
    return aligned_alloc(align, rounded == 0 ? align : rounded);
}

static void default_free(void *user_data, void *ptr, size_t nbytes) {
    (void)user_data;
    (void)nbytes;
    free(ptr);
}

static kiln_allocator current = {NULL, default_alloc, default_free};

kiln_status kiln_set_allocator(const kiln_allocator *allocator) {
    if (allocator == NULL) {
        current = (kiln_allocator){NULL, default_alloc, default_free};
        return KILN_OK;
    }
    KILN_CHECK(allocator->alloc != NULL && allocator->free != NULL, KILN_ERR_INVALID_ARG,
               "kiln_set_allocator: alloc and free must both be set");
    current = *allocator;
    return KILN_OK;
}

void *kiln_malloc(size_t nbytes, size_t align) {
    if (align < sizeof(void *)) align = sizeof(void *);
    if (align > 4096 || (align & (align - 1)) != 0) return NULL;
    return current.alloc(current.user_data, nbytes, align);
}

void *kiln_calloc(size_t nbytes, size_t align) {
    void *p = kiln_malloc(nbytes, align);
    if (p != NULL && nbytes > 0) memset(p, 0, nbytes);
    return p;
}

void kiln_free(void *ptr, size_t nbytes) {
    if (ptr == NULL) return;
    current.free(current.user_data, ptr, nbytes);
}

char *kiln_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = kiln_malloc(n, 1);
    if (p != NULL) memcpy(p, s, n);
    return p;
}
