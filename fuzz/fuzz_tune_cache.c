// SPDX-License-Identifier: Apache-2.0
// Fuzz target: bytes as a tuning cache file (src/core/tune_cache.c, the option tuning_cache).
// Whatever the file holds, reading it never crashes or reads out of bounds; a lookup returns only
// what fits the caller's buffer; and a record put afterwards survives the flush (which discards a
// damaged file and rewrites it) and a fresh read. Built as a libFuzzer target (KILN_FUZZ) and, in
// every build, as a corpus replay (fuzz.cmake).
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/crc32.h"
#include "core/tune_cache.h"
#include "kiln/kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef KILN_FUZZ_MUTATOR
// Most mutations get their header's body size and both CRCs made valid again, so that the record
// bounds behind the CRC checks are reached.
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    size = LLVMFuzzerMutate(data, size, max_size);
    if (size >= 32 && seed % 4 != 0) {
        if (seed % 3 != 0) { // the body size as the file's
            const uint64_t body = size - 32;
            put32(data + 16, (uint32_t)body);
            put32(data + 20, (uint32_t)(body >> 32));
        }
        put32(data + 24, kiln_crc32(0, data + 32, size - 32));
        put32(data + 28, kiln_crc32(0, data, 28));
    }
    return size;
}
#endif

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[96], lock_path[112];
    unsigned char val[KILN_TUNE_VALUE_MAX], small[4];
    size_t vn = 0;
    if (path[0] == '\0') {
        snprintf(path, sizeof path, "/tmp/kiln_fuzz_tune.%ld.kilncache", (long)getpid());
        snprintf(lock_path, sizeof lock_path, "%s.lock", path);
    }
    kiln_log_set(quiet_log, NULL, KILN_LOG_DEBUG);
    FILE *f = fopen(path, "wb");
    if (f == NULL) return 0;
    if (size > 0 && fwrite(data, 1, size, f) != size) {
        fclose(f);
        return 0;
    }
    fclose(f);
    kiln_tune_cache_reset();
    // lookups of a key that the input may hold (its bytes after the header), at two capacities
    if (size > 40) {
        size_t kn = size - 36 < 64 ? size - 36 : 64;
        if (kiln_tune_cache_get(path, data + 36, kn, val, sizeof val, &vn) && vn > sizeof val) {
            abort();
        }
        if (kiln_tune_cache_get(path, data + 36, kn, small, sizeof small, &vn) &&
            vn > sizeof small) {
            abort();
        }
    }
    kiln_tune_cache_put(path, "fuzz-key", 8, "value", 5);
    kiln_tune_cache_flush(path);
    kiln_tune_cache_reset();
    if (!kiln_tune_cache_get(path, "fuzz-key", 8, val, sizeof val, &vn) || vn != 5 ||
        memcmp(val, "value", 5) != 0) {
        abort(); // the record put must survive the rewrite
    }
    kiln_tune_cache_reset();
    unlink(path);
    unlink(lock_path);
    return 0;
}
