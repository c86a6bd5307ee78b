// SPDX-License-Identifier: Apache-2.0
// Liveness-based memory planning for activations (the "greedy by size" offline planner of
// TFLite Micro): items in decreasing size order; each goes into the smallest gap, among the
// already placed items whose lifetimes intersect its own, that fits it (lowest offset on ties),
// or after the highest of them. Items that are never live together may share bytes; the arena
// is the highest end. O(n^2) in the number of items.
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/plan_memory.h"
#include "core/status.h"

typedef struct order_key {
    uint64_t nbytes;
    int32_t first;
    uint32_t index;
} order_key;

static int cmp_order(const void *a, const void *b) {
    const order_key *x = a, *y = b;
    if (x->nbytes != y->nbytes) return x->nbytes > y->nbytes ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

kiln_status kiln_plan_memory(kiln_mem_item *items, uint32_t n, uint64_t align,
                             uint64_t *out_arena_nbytes) {
    order_key *order = NULL;
    uint32_t *placed = NULL; // indices of placed items, sorted by offset
    uint32_t n_placed = 0;
    uint64_t arena = 0;
    kiln_status st = KILN_OK;
    KILN_CHECK(align > 0 && (align & (align - 1)) == 0, KILN_ERR_INTERNAL,
               "kiln_plan_memory: alignment %llu", (unsigned long long)align);
    if (n == 0) {
        *out_arena_nbytes = 0;
        return KILN_OK;
    }
    order = kiln_malloc((size_t)n * sizeof *order, KILN_ALIGN);
    placed = kiln_malloc((size_t)n * sizeof *placed, KILN_ALIGN);
    if (order == NULL || placed == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory planning %u activations", n);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        order[i].nbytes = items[i].nbytes;
        order[i].first = items[i].first;
        order[i].index = i;
    }
    qsort(order, n, sizeof *order, cmp_order);
    for (uint32_t k = 0; k < n; k++) {
        kiln_mem_item *it = &items[order[k].index];
        uint64_t size, best = UINT64_MAX, best_gap = UINT64_MAX, prev_end = 0, end;
        uint32_t pos;
        if (it->nbytes == 0) {
            it->offset = 0;
            continue;
        }
        if (!kiln_align_up_u64(it->nbytes, align, &size)) {
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "an activation of %llu bytes is too large",
                           (unsigned long long)it->nbytes);
            goto done;
        }
        // Walk the conflicting placed items in offset order, measuring the gaps between them.
        for (uint32_t j = 0; j < n_placed; j++) {
            const kiln_mem_item *o = &items[placed[j]];
            uint64_t o_end = 0;
            if (o->last < it->first || it->last < o->first) continue;
            if (o->offset > prev_end) {
                uint64_t gap = o->offset - prev_end;
                if (gap >= size && gap < best_gap) {
                    best_gap = gap;
                    best = prev_end;
                }
            }
            kiln_align_up_u64(o->offset + o->nbytes, align, &o_end); // fits: placed earlier
            if (o_end > prev_end) prev_end = o_end;
        }
        if (best == UINT64_MAX) best = prev_end; // after every conflicting item
        it->offset = best;
        if (!kiln_add_u64(best, it->nbytes, &end)) {
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "the activation arena overflows");
            goto done;
        }
        if (end > arena) arena = end;
        // Insert into placed, keeping offset order (ties: by index, for determinism).
        pos = n_placed;
        while (pos > 0) {
            const kiln_mem_item *o = &items[placed[pos - 1]];
            if (o->offset < best || (o->offset == best && placed[pos - 1] < order[k].index)) break;
            placed[pos] = placed[pos - 1];
            pos--;
        }
        placed[pos] = order[k].index;
        n_placed++;
    }
    if (!kiln_align_up_u64(arena, align, &arena)) {
        st = kiln_fail(KILN_ERR_UNSUPPORTED, "the activation arena overflows");
        goto done;
    }
    *out_arena_nbytes = arena;
done:
    kiln_free(order, (size_t)n * sizeof *order);
    kiln_free(placed, (size_t)n * sizeof *placed);
    return st;
}
