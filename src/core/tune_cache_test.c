// SPDX-License-Identifier: Apache-2.0
// The tuning cache's file: records survive a write and a fresh read; "off" keeps nothing; every
// truncation, every single-bit flip of a written file and a file of another format version are
// discarded whole (never a crash, never a record read from damaged bytes) and rewritten by the
// next flush; several processes writing the same file at once lose no record.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/crc32.h"
#include "core/tune_cache.h"

static char path[512];

static long file_bytes(unsigned char **out) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (fread(*out, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

static void write_bytes(const unsigned char *b, long n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (n > 0) CHECK(fwrite(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
}

// Key i's value is a function of i and a random salt, so a record read from the wrong bytes
// cannot pass.
static void rec_of(int i, uint32_t salt, char *key, size_t *kn, uint32_t *val) {
    *kn = (size_t)snprintf(key, 64, "gpu H200|layer problem %d", i);
    for (int j = 0; j < 8; j++) val[j] = salt * 2654435761u + (uint32_t)(i * 8 + j);
}

static int has(int i, uint32_t salt) {
    char key[64];
    size_t kn, vn = 0;
    uint32_t want[8], got[8];
    rec_of(i, salt, key, &kn, want);
    if (!kiln_tune_cache_get(path, key, kn, got, sizeof got, &vn)) return 0;
    return vn == sizeof got && memcmp(got, want, sizeof got) == 0;
}

static void put_n(int from, int to, uint32_t salt) {
    char key[64];
    size_t kn;
    uint32_t val[8];
    for (int i = from; i < to; i++) {
        rec_of(i, salt, key, &kn, val);
        kiln_tune_cache_put(path, key, kn, val, sizeof val);
    }
}

int main(void) {
    const uint32_t salt = (uint32_t)check_rng_seed();
    char buf[1100];
    snprintf(path, sizeof path, "/tmp/kiln_tune_cache_test.%ld/sub/t.kilncache", (long)getpid());

    // path resolution
    CHECK(!kiln_tune_cache_path("off", buf, sizeof buf));
    CHECK(kiln_tune_cache_path(path, buf, sizeof buf) && strcmp(buf, path) == 0);
    CHECK(!kiln_tune_cache_path(path, buf, 8)); // does not fit
    if (kiln_tune_cache_path("auto", buf, sizeof buf)) {
        CHECK(strstr(buf, "/kiln/tuning.kilncache") != NULL);
    }

    // "off" keeps nothing
    {
        uint32_t v = 7, got = 0;
        size_t n = 0;
        kiln_tune_cache_put("off", "k", 1, &v, sizeof v);
        CHECK(!kiln_tune_cache_get("off", "k", 1, &got, sizeof got, &n));
    }

    // records survive a write (the directories made) and a fresh read
    put_n(0, 100, salt);
    CHECK(has(42, salt) && !has(100, salt));
    kiln_tune_cache_flush(path);
    kiln_tune_cache_reset();
    for (int i = 0; i < 100; i++) CHECK_MSG(has(i, salt), "record %d after a fresh read", i);
    CHECK(!has(0, salt + 1)); // another value under the same key is not what was stored

    // the records with a key prefix (every key here starts "gpu H200|"; none "gpu A100|")
    {
        uint32_t total = 0, match = 0;
        kiln_tune_cache_stats(path, "gpu H200|", 9, &total, &match);
        CHECK(total == 100 && match == 100);
        kiln_tune_cache_stats(path, "gpu A100|", 9, &total, &match);
        CHECK(total == 100 && match == 0);
        kiln_tune_cache_stats("off", "gpu", 3, &total, &match);
        CHECK(total == 0 && match == 0);
    }

    // a too-small buffer is a miss, not an overflow
    {
        char key[64];
        size_t kn, vn = 0;
        uint32_t val[8], small[2];
        rec_of(3, salt, key, &kn, val);
        CHECK(!kiln_tune_cache_get(path, key, kn, small, sizeof small, &vn));
    }

    unsigned char *good = NULL;
    const long n = file_bytes(&good);
    CHECK(n > 32);

    // every truncation: discarded, nothing read
    for (long cut = 0; cut < n; cut += (cut < 64 ? 1 : 37)) {
        write_bytes(good, cut);
        kiln_tune_cache_reset();
        CHECK_MSG(!has(0, salt) && !has(99, salt), "truncated to %ld bytes: a record was read",
                  cut);
    }
    // every single-bit flip of the header and a spread over the body
    for (long bit = 0; bit < n * 8; bit += (bit < 32 * 8 ? 1 : 13)) {
        good[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        write_bytes(good, n);
        good[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        kiln_tune_cache_reset();
        int found = 0;
        for (int i = 0; i < 100; i += 11) found += has(i, salt);
        CHECK_MSG(found == 0, "bit %ld flipped: %d records read", bit, found);
    }
    // another format version (CRCs made valid): discarded
    {
        unsigned char *b = malloc((size_t)n);
        memcpy(b, good, (size_t)n);
        b[8] = 2;
        uint32_t crc = kiln_crc32(0, b, 28);
        for (int i = 0; i < 4; i++) b[28 + i] = (unsigned char)(crc >> (8 * i));
        write_bytes(b, n);
        kiln_tune_cache_reset();
        CHECK(!has(5, salt));
        // the next flush rewrites it with this process's records
        put_n(0, 10, salt);
        kiln_tune_cache_flush(path);
        kiln_tune_cache_reset();
        CHECK(has(9, salt) && !has(10, salt));
        free(b);
    }

    // records a program carries (kiln_tune_cache_add_image): used with any cache option, "off"
    // included; an image that does not check adds nothing, whatever is wrong with it
    {
        uint32_t added = 1;
        remove(path);
        kiln_tune_cache_reset();
        CHECK(!has(7, salt));
        CHECK(kiln_tune_cache_add_image(good, 31, &added) != NULL && added == 0);
        for (long bit = 0; bit < n * 8; bit += 29) {
            good[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            const char *why = kiln_tune_cache_add_image(good, (size_t)n, &added);
            good[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            CHECK_MSG(why != NULL && added == 0, "bit %ld flipped: image taken", bit);
        }
        CHECK(kiln_tune_cache_add_image(good, (size_t)n - 1, &added) != NULL && added == 0);
        CHECK(!has(7, salt));
        CHECK(kiln_tune_cache_add_image(good, (size_t)n, &added) == NULL && added == 100);
        for (int i = 0; i < 100; i += 9) CHECK_MSG(has(i, salt), "program record %d", i);
        char key[64];
        size_t kn, vn = 0;
        uint32_t val[8], got[8];
        rec_of(7, salt, key, &kn, val);
        CHECK(kiln_tune_cache_get("off", key, kn, got, sizeof got, &vn) && vn == sizeof got &&
              memcmp(got, val, sizeof got) == 0);
        // read-only: a flush writes the file's records, not the program's
        kiln_tune_cache_flush(path);
        unsigned char *after = NULL;
        CHECK(file_bytes(&after) < 0); // nothing put: no file written
        free(after);
        kiln_tune_cache_reset();
        CHECK(!has(7, salt));
    }

    // several processes at once: each puts its own records and flushes repeatedly; the file
    // ends with all of them
    {
        enum { PROCS = 6, PER = 40 };
        pid_t pids[PROCS];
        remove(path);
        kiln_tune_cache_reset();
        for (int p = 0; p < PROCS; p++) {
            pids[p] = fork();
            if (pids[p] == 0) {
                kiln_tune_cache_reset();
                for (int r = 0; r < 4; r++) {
                    put_n(1000 + p * PER + r * (PER / 4), 1000 + p * PER + (r + 1) * (PER / 4),
                          salt);
                    kiln_tune_cache_flush(path);
                }
                _exit(0);
            }
            CHECK(pids[p] > 0);
        }
        for (int p = 0; p < PROCS; p++) {
            int st = 0;
            CHECK(waitpid(pids[p], &st, 0) == pids[p] && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
        kiln_tune_cache_reset();
        int found = 0;
        for (int i = 1000; i < 1000 + PROCS * PER; i++) found += has(i, salt);
        CHECK_MSG(found == PROCS * PER, "%d of %d records after concurrent writers", found,
                  PROCS * PER);
    }

    free(good);
    kiln_tune_cache_reset();
    remove(path);
    snprintf(buf, sizeof buf, "%s.lock", path);
    remove(buf);
    return check_summary();
}
