// SPDX-License-Identifier: Apache-2.0
// Liveness-based placement of buffers in one block (plan_memory.c): the builder places an engine's
// activations with it, and the CUDA plugin (through kiln_cuda_services.plan_memory) the buffers
// its layer plans ask for beside the arena, so that Kiln has one memory planner.
#ifndef KILN_CORE_PLAN_MEMORY_H
#define KILN_CORE_PLAN_MEMORY_H

#include <stdint.h>

#include "kiln/kiln.h"

typedef struct kiln_mem_item {
    uint64_t nbytes;     // size (0: placed at offset 0, takes no space)
    int32_t first, last; // live over layers [first, last], inclusive
    uint64_t offset;     // out: offset in the block, a multiple of the alignment
} kiln_mem_item;

// Assigns offsets so that no two items live at a common layer overlap in [offset, offset +
// nbytes): greedy by size, each item into the best-fitting gap among the items already placed
// that it conflicts with (offset order), else after them. *out_nbytes = the block's size.
// Deterministic (ties broken by item index).
kiln_status kiln_plan_memory(kiln_mem_item *items, uint32_t n, uint64_t align,
                             uint64_t *out_nbytes);

#endif // KILN_CORE_PLAN_MEMORY_H
