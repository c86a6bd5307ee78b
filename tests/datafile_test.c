// SPDX-License-Identifier: Apache-2.0
// Kiln's checks of ExecuTorch files (kiln_ptd_check, kiln_pte_check: src/runtime/ptd.c, pte.c),
// on the exported programs of the fuzz_program seed corpus: the pristine files pass; every
// single-bit flip of a .ptd's first 512 bytes and of every .pte flatbuffer byte, every
// truncation, and boundary values in the .ptd header's fields (sums that wrap, regions out of
// order) either pass or fail with KILN_ERR_CORRUPT (or, for a planned size beyond the machine's
// memory, KILN_ERR_NO_MEMORY) and a message naming the file kind (run under
// ASan+UBSan by `make asan`: no read outside the buffer); the file variants read the same and
// report unreadable files as KILN_ERR_IO.
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <unistd.h>

#include "check.h"
#include "core/utf8.h"
#include "runtime/format.h"

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

// Exact-size copies, so that ASan sees any read past the end.
static kiln_status check_copy(int pte, const uint8_t *b, size_t n) {
    uint8_t *c = malloc(n > 0 ? n : 1);
    memcpy(c, b, n);
    kiln_clear_error();
    kiln_status st = pte ? kiln_pte_check(c, n) : kiln_ptd_check(c, n);
    free(c);
    return st;
}

static int n_refused, n_passed;

static void expect_ok_or_corrupt(int pte, const uint8_t *b, size_t n, const char *what, size_t at) {
    kiln_status st = check_copy(pte, b, n);
    const char *m = kiln_last_error();
    if (st == KILN_OK) {
        n_passed++;
        return;
    }
    n_refused++;
    // A planned size beyond the machine's memory is NO_MEMORY (it may be a real, huge program).
    int huge_plan = pte && st == KILN_ERR_NO_MEMORY && strstr(m, "plans more than") != NULL;
    CHECK_MSG(st == KILN_ERR_CORRUPT || huge_plan, "%s %zu: %s: %s", what, at, kiln_status_str(st),
              m);
    CHECK_MSG(strstr(m, pte ? ".pte" : ".ptd") != NULL, "%s %zu: %s", what, at, m);
    CHECK_MSG(kiln_utf8_check(m, strlen(m)) == strlen(m), "%s %zu: message is not text", what, at);
}

static void ptd_cases(const uint8_t *d, size_t n, const char *name) {
    CHECK_MSG(kiln_ptd_check(d, n) == KILN_OK, "%s: pristine .ptd: %s", name, kiln_last_error());
    uint8_t *c = malloc(n);
    for (size_t bit = 0; bit < 8 * 512 && bit < 8 * n; bit++) {
        memcpy(c, d, n);
        c[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        expect_ok_or_corrupt(0, c, n, "ptd bit", bit);
    }
    uint64_t fb_end = kiln_rd_u64(d + 16) + kiln_rd_u64(d + 24);
    for (size_t len = 0; len < n; len += len < fb_end + 64 ? 1 : 97) {
        expect_ok_or_corrupt(0, d, len, "ptd truncated to", len);
        if (len < fb_end) CHECK_MSG(check_copy(0, d, len) == KILN_ERR_CORRUPT, "len %zu", len);
    }
    // Header fields: values that wrap, point past the file or put regions out of order.
    static const size_t fields[] = {16, 24, 32, 40};
    uint64_t vals[] = {
        0, 1, 47, 48, UINT64_MAX, UINT64_MAX - 47, (uint64_t)n, (uint64_t)n + 1, UINT64_C(1) << 63};
    for (size_t f = 0; f < 4; f++) {
        for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
            memcpy(c, d, n);
            kiln_wr_u64(c + fields[f], vals[v]);
            expect_ok_or_corrupt(0, c, n, "ptd header field", fields[f]);
        }
    }
    memcpy(c, d, n);
    kiln_wr_u64(c + 32, UINT64_MAX - 8); // segment_base_offset + segment_data_size wraps
    CHECK_STATUS(kiln_ptd_check(c, n), KILN_ERR_CORRUPT);
    CHECK(strstr(kiln_last_error(), "segment_base_offset") != NULL);
    memcpy(c, d, n);
    kiln_wr_u64(c + 24, UINT64_MAX - 40); // flatbuffer_offset + flatbuffer_size wraps
    CHECK_STATUS(kiln_ptd_check(c, n), KILN_ERR_CORRUPT);
    CHECK(strstr(kiln_last_error(), "flatbuffer_offset") != NULL);
    memcpy(c, d, n);
    c[5] = 'X';
    CHECK_STATUS(kiln_ptd_check(c, n), KILN_ERR_CORRUPT);
    CHECK(strstr(kiln_last_error(), "not an ExecuTorch .ptd") != NULL);
    free(c);
}

static void pte_cases(const uint8_t *p, size_t n, const char *name) {
    CHECK_MSG(kiln_pte_check(p, n) == KILN_OK, "%s: pristine .pte: %s", name, kiln_last_error());
    // The flatbuffer: [0, program_size) from the extended header.
    size_t fb = memcmp(p + 8, "eh00", 4) == 0 ? (size_t)kiln_rd_u64(p + 16) : n;
    uint8_t *c = malloc(n);
    // Every bit of every byte of small flatbuffers; of larger ones, every bit of every 5th byte.
    size_t stride = fb <= 8192 ? 1 : 5;
    for (size_t byte = 0; byte < fb; byte += byte < 64 ? 1 : stride) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(c, p, n);
            c[byte] ^= (uint8_t)(1u << bit);
            expect_ok_or_corrupt(1, c, n, "pte bit", 8 * byte + (size_t)bit);
        }
    }
    for (size_t len = 0; len < fb; len += len < 256 ? 1 : 61) {
        expect_ok_or_corrupt(1, p, len, "pte truncated to", len);
    }
    free(c);
}

int main(void) {
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    const char *dir = "fuzz/corpus/fuzz_program";
    DIR *dd = opendir(dir);
    CHECK_MSG(dd != NULL, "cannot open %s (run from the source folder)", dir);
    int n_seeds = 0, n_ptd = 0;
    for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
        if (strncmp(e->d_name, "seed-", 5) != 0) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t n = 0;
        uint8_t *b = read_all(path, &n);
        if (b == NULL || n < 4) continue;
        size_t pn = kiln_rd_u32(b);
        if (pn > n - 4) pn = n - 4;
        pte_cases(b + 4, pn, e->d_name);
        if (n - 4 - pn > 0) {
            ptd_cases(b + 4 + pn, n - 4 - pn, e->d_name);
            n_ptd++;
        }
        // The file variants read the same files and agree.
        char tmp[] = "/tmp/kiln-datafile-XXXXXX";
        int fd = mkstemp(tmp);
        CHECK(fd >= 0);
        CHECK(write(fd, b + 4, pn) == (ssize_t)pn);
        close(fd);
        CHECK_OK(kiln_pte_check_file(tmp));
        CHECK_STATUS(kiln_ptd_check_file(tmp), KILN_ERR_CORRUPT); // a .pte is not a .ptd
        CHECK(strstr(kiln_last_error(), tmp) != NULL);
        unlink(tmp);
        free(b);
        n_seeds++;
    }
    if (dd != NULL) closedir(dd);
    CHECK(n_seeds >= 6 && n_ptd >= 2);
    CHECK(n_refused > 1000 && n_passed > 100);
    CHECK_STATUS(kiln_ptd_check_file("/nonexistent/k.ptd"), KILN_ERR_IO);
    CHECK_STATUS(kiln_pte_check_file("/nonexistent/k.pte"), KILN_ERR_IO);
    CHECK_STATUS(kiln_pte_check_file("/"), KILN_ERR_IO);
    CHECK_STATUS(kiln_ptd_check(NULL, 0), KILN_ERR_CORRUPT);
    CHECK_STATUS(kiln_ptd_check(NULL, 5), KILN_ERR_INVALID_ARG);
    printf("%d seeds: %d refused, %d passed\n", n_seeds, n_refused, n_passed);
    return check_summary();
}
