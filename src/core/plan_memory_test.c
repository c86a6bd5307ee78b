// SPDX-License-Identifier: Apache-2.0
// The activation memory planner: hand cases, then properties over random lifetimes and over
// lifetimes of random DAGs: every item inside the arena and aligned, no two items live at a
// common layer overlap, the arena is at most the naive sum and at least the peak live bytes, and
// the result is deterministic.
#include "check.h"
#include "core/plan_memory.h"

#define ALIGN 64u

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

// Checks the plan of items; returns 0 on any violation.
static int check_plan(const kiln_mem_item *it, uint32_t n, uint64_t arena, const char *what) {
    uint64_t naive = 0;
    int32_t max_layer = 0;
    int ok = 1;
    for (uint32_t i = 0; i < n; i++) {
        naive += align_up(it[i].nbytes);
        if (it[i].last > max_layer) max_layer = it[i].last;
        if (it[i].nbytes == 0) continue;
        if (it[i].offset % ALIGN != 0 || it[i].offset + it[i].nbytes > arena) {
            CHECK_MSG(0, "%s: item %u at %llu+%llu outside arena %llu or unaligned", what, i,
                      (unsigned long long)it[i].offset, (unsigned long long)it[i].nbytes,
                      (unsigned long long)arena);
            ok = 0;
        }
    }
    for (uint32_t i = 0; i < n && ok; i++) {
        for (uint32_t j = i + 1; j < n; j++) {
            const kiln_mem_item *a = &it[i], *b = &it[j];
            if (a->nbytes == 0 || b->nbytes == 0) continue;
            if (a->last < b->first || b->last < a->first) continue; // never live together
            if (a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes) {
                CHECK_MSG(0,
                          "%s: items %u [%d,%d] at %llu+%llu and %u [%d,%d] at %llu+%llu overlap",
                          what, i, a->first, a->last, (unsigned long long)a->offset,
                          (unsigned long long)a->nbytes, j, b->first, b->last,
                          (unsigned long long)b->offset, (unsigned long long)b->nbytes);
                ok = 0;
                break;
            }
        }
    }
    // Lower bound: the bytes live at the busiest layer.
    for (int32_t l = 0; l <= max_layer; l++) {
        uint64_t live = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (it[i].first <= l && l <= it[i].last) live += it[i].nbytes;
        }
        if (live > arena) {
            CHECK_MSG(0, "%s: %llu bytes live at layer %d exceed the arena %llu", what,
                      (unsigned long long)live, l, (unsigned long long)arena);
            ok = 0;
            break;
        }
    }
    if (arena > align_up(naive)) {
        CHECK_MSG(0, "%s: arena %llu exceeds the naive sum %llu", what, (unsigned long long)arena,
                  (unsigned long long)naive);
        ok = 0;
    }
    CHECK(ok);
    return ok;
}

static void test_hand(void) {
    kiln_mem_item it[4];
    uint64_t arena = 1;
    // a chain: each tensor lives from its producer to its consumer; two buffers ping-pong
    memset(it, 0, sizeof it);
    it[0] = (kiln_mem_item){100, 0, 1, 0};
    it[1] = (kiln_mem_item){100, 1, 2, 0};
    it[2] = (kiln_mem_item){100, 2, 3, 0};
    CHECK_OK(kiln_plan_memory(it, 3, ALIGN, &arena));
    CHECK(it[0].offset == 0 && it[1].offset == 128 && it[2].offset == 0);
    CHECK(arena == 256);
    check_plan(it, 3, arena, "chain");
    // a small tensor fits the gap left between two large ones
    it[0] = (kiln_mem_item){1000, 0, 4, 0};
    it[1] = (kiln_mem_item){500, 0, 1, 0};
    it[2] = (kiln_mem_item){900, 0, 4, 0};
    it[3] = (kiln_mem_item){200, 2, 4, 0}; // after it[1] died: reuses its bytes
    CHECK_OK(kiln_plan_memory(it, 4, ALIGN, &arena));
    CHECK(it[0].offset == 0 && it[2].offset == 1024 && it[1].offset == 1024 + 960);
    CHECK(it[3].offset == it[1].offset);
    CHECK(arena == 1024 + 960 + 512);
    check_plan(it, 4, arena, "gap");
    // empty input, zero-size items
    CHECK_OK(kiln_plan_memory(NULL, 0, ALIGN, &arena));
    CHECK(arena == 0);
    it[0] = (kiln_mem_item){0, 0, 5, 7};
    it[1] = (kiln_mem_item){64, 0, 5, 7};
    CHECK_OK(kiln_plan_memory(it, 2, ALIGN, &arena));
    CHECK(it[0].offset == 0 && it[1].offset == 0 && arena == 64);
    CHECK_STATUS(kiln_plan_memory(it, 2, 48, &arena), KILN_ERR_INTERNAL);
}

static void test_random_lifetimes(void) {
    static kiln_mem_item it[300], again[300];
    for (int iter = 0; iter < 200; iter++) {
        uint32_t n = (uint32_t)check_rng_int(1, 300);
        int32_t layers = (int32_t)check_rng_int(1, 400);
        uint64_t arena = 0, arena2 = 0;
        for (uint32_t i = 0; i < n; i++) {
            int32_t first = (int32_t)check_rng_int(0, layers - 1);
            int32_t span = (int32_t)check_rng_int(0, check_rng_int(0, 3) == 0 ? layers : 8);
            it[i].first = first;
            it[i].last = first + span;
            it[i].nbytes = check_rng_int(0, 9) == 0 ? 0 : (uint64_t)check_rng_int(1, 1 << 16);
            it[i].offset = 12345;
        }
        memcpy(again, it, n * sizeof *it);
        CHECK_OK(kiln_plan_memory(it, n, ALIGN, &arena));
        if (!check_plan(it, n, arena, "random lifetimes")) break;
        CHECK_OK(kiln_plan_memory(again, n, ALIGN, &arena2));
        CHECK(arena == arena2 && memcmp(it, again, n * sizeof *it) == 0);
    }
}

// Lifetimes of a random DAG in topological order: node i reads 1..3 earlier nodes; its output
// lives from i to its last reader (or i when nothing reads it).
static void test_random_dags(void) {
    static kiln_mem_item it[500];
    for (int iter = 0; iter < 100; iter++) {
        uint32_t n = (uint32_t)check_rng_int(2, 500);
        uint64_t arena = 0, naive = 0;
        for (uint32_t i = 0; i < n; i++) {
            it[i].first = (int32_t)i;
            it[i].last = (int32_t)i;
            it[i].nbytes = (uint64_t)check_rng_int(1, 100000);
            naive += align_up(it[i].nbytes);
        }
        for (uint32_t i = 1; i < n; i++) {
            int k = (int)check_rng_int(1, 3);
            for (int r = 0; r < k; r++) {
                // mostly local reads (a chain with skips), sometimes a long residual
                uint32_t lo = i > 4 && check_rng_int(0, 4) != 0 ? i - 4 : 0;
                uint32_t src = (uint32_t)check_rng_int(lo, i - 1);
                if (it[src].last < (int32_t)i) it[src].last = (int32_t)i;
            }
        }
        CHECK_OK(kiln_plan_memory(it, n, ALIGN, &arena));
        if (!check_plan(it, n, arena, "random DAG")) break;
        // sharing must actually happen on chains this long
        if (n > 50) CHECK(arena < naive);
    }
}

int main(void) {
    test_hand();
    test_random_lifetimes();
    test_random_dags();
    return check_summary();
}
