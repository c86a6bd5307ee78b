// SPDX-License-Identifier: Apache-2.0
// Fuzz target: an ExecuTorch program and its .ptd through Kiln's C program API
// (include/kiln/kiln_program.h): kiln_program_load (Kiln's .ptd check, ExecuTorch's verified
// program load, KilnBackend's engine and weight validation) twice, then every method run twice on
// each load, on the CPU with small deterministic inputs, the two loads' outputs compared call by
// call (programs with state: an output depends on the calls before it, the same on both). The
// input is
//
//   u32 little-endian n, n bytes of .pte, the rest: the .ptd (none when empty)
//
// written to two files in a private temporary folder (the API takes paths). Every failure must
// carry a message that is UTF-8 text; a successful run must be deterministic. In libFuzzer builds
// a structure-aware mutator aims most mutations at one part (the Kiln engine inside the .pte,
// with its CRCs repaired so that the semantic checks are reached; the .pte's weights; the .ptd's
// header and flatbuffer; the .ptd's weights) and leaves the rest intact.
// Built as a libFuzzer target (KILN_FUZZ with KILN_EXECUTORCH) and as a corpus replay against the
// installed package (tests/consumer/files, run by python/tests/test_untrusted.py).
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/utf8.h"
#include "kiln/kiln_program.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT_NBYTES (1u << 20)

static char dir[64], pte_path[96], ptd_path[96];

static void setup(void) {
    if (dir[0] != '\0') return;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/kiln-fuzz-XXXXXX", base);
    if (mkdtemp(dir) == NULL) abort();
    snprintf(pte_path, sizeof pte_path, "%s/p.pte", dir);
    snprintf(ptd_path, sizeof ptd_path, "%s/d.ptd", dir);
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    kiln_program_set_planned_limit(64u << 20); // a fuzzed size must not exhaust the fuzzer
}

static void write_file(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || (n > 0 && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();
}

static void check_message(const char *msg) {
    size_t n = strlen(msg);
    if (n == 0 || kiln_utf8_check(msg, n) != n) abort(); // every failure says why, as text
}

// Binds every tensor input (small values from a fixed seed), runs, copies output 0.
static kiln_status run_once(kiln_program *p, const char *m, uint8_t **out, size_t *out_n) {
    uint32_t n_in = 0;
    kiln_status st = kiln_program_n_inputs(p, m, &n_in);
    void *bufs[8] = {0};
    for (uint32_t i = 0; st == KILN_OK && i < n_in && i < 8; i++) {
        kiln_tensor_info info;
        st = kiln_program_input_info(p, m, i, &info);
        if (st != KILN_OK || !info.is_tensor) continue;
        if (info.nbytes > MAX_INPUT_NBYTES || info.dtype == KILN_DTYPE_INVALID) {
            st = KILN_ERR_UNSUPPORTED;
            break;
        }
        uint8_t *x = malloc(info.nbytes + 1);
        bufs[i] = x;
        uint64_t seed = 0x9e3779b97f4a7c15u + i;
        for (uint64_t k = 0; k < info.nbytes; k++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            // Small values: index inputs stay mostly in range, floats stay finite.
            x[k] = (uint8_t)((seed >> 33) & (info.dtype == KILN_DTYPE_F32 ? 0x3f : 0x01));
        }
        kiln_input in = {.data = x, .dtype = info.dtype, .rank = info.rank, .dims = info.dims};
        st = kiln_program_set_input(p, m, i, &in);
    }
    if (st == KILN_OK) st = kiln_program_execute(p, m);
    kiln_output y;
    if (st == KILN_OK) st = kiln_program_output(p, m, 0, &y);
    if (st == KILN_OK && y.memory == KILN_MEMORY_HOST) {
        *out_n = (size_t)y.nbytes;
        *out = malloc(*out_n + 1);
        memcpy(*out, y.data, *out_n);
    }
    for (int i = 0; i < 8; i++) free(bufs[i]);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (size < 4) return 0;
    size_t n =
        (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    if (n > size - 4) n = size - 4;
    write_file(pte_path, data + 4, n);
    size_t ptd_n = size - 4 - n;
    if (ptd_n > 0) write_file(ptd_path, data + 4 + n, ptd_n);

    kiln_option_setting cpu = {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"};
    const char *paths[1] = {ptd_path};
    kiln_program_options o;
    kiln_program_options_init(&o);
    o.settings = &cpu;
    o.n_settings = 1;
    if (ptd_n > 0) {
        o.data_paths = paths;
        o.n_data_paths = 1;
    }
    kiln_program *p = NULL, *q = NULL;
    if (kiln_program_load(pte_path, &o, &p) != KILN_OK) {
        check_message(kiln_program_last_error());
        return 0;
    }
    if (kiln_program_load(pte_path, &o, &q) != KILN_OK) abort(); // the same files load again
    uint32_t n_methods = 0;
    if (kiln_program_method_count(p, &n_methods) != KILN_OK) abort();
    for (uint32_t i = 0; i < n_methods && i < 4; i++) {
        const char *m = NULL;
        if (kiln_program_method_name(p, i, &m) != KILN_OK) abort();
        for (int rep = 0; rep < 2; rep++) {
            uint8_t *a = NULL, *b = NULL;
            size_t an = 0, bn = 0;
            kiln_status s1 = run_once(p, m, &a, &an);
            if (s1 != KILN_OK && s1 != KILN_ERR_UNSUPPORTED)
                check_message(kiln_program_last_error());
            kiln_status s2 = run_once(q, m, &b, &bn);
            // Deterministic: the same calls give the same status and bit-identical outputs.
            if (s1 != s2 || an != bn || (an > 0 && memcmp(a, b, an) != 0)) abort();
            free(a);
            free(b);
        }
    }
    kiln_program_free(q);
    kiln_program_free(p);
    return 0;
}

#if defined(KILN_FUZZ_MUTATOR)
// A size from a fuzzed file may ask for more than the sanitizer's allocator can give: Kiln must
// then fail cleanly (KILN_ERR_NO_MEMORY), so the allocator returns NULL instead of aborting.
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

// --- structure-aware mutation (libFuzzer builds)

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t crc32(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

// Mutates region [off, off + len) of data in place, keeping its length (the containers around it
// record their sizes).
static void mutate_in_place(uint8_t *data, size_t off, size_t len) {
    if (len == 0) return;
    uint8_t *tmp = malloc(len);
    memcpy(tmp, data + off, len);
    size_t m = LLVMFuzzerMutate(tmp, len, len);
    memcpy(data + off, tmp, m < len ? m : len);
    free(tmp);
}

// The Kiln engine inside the .pte: recomputes its section and header CRCs (docs/format.md §2).
static void fix_engine(uint8_t *e, size_t n) {
    if (n < 40) return;
    uint32_t ns = rd32(e + 20);
    if (ns > 64 || 40 + 32 * (uint64_t)ns > n) return;
    for (uint32_t i = 0; i < ns; i++) {
        uint8_t *s = e + 40 + 32 * (size_t)i;
        uint64_t off = rd64(s + 8), nb = rd64(s + 16);
        if (off <= n && nb <= n - off) wr32(s + 24, crc32(0, e + off, (size_t)nb));
    }
    memset(e + 36, 0, 4);
    wr32(e + 36, crc32(0, e, 40 + 32 * (size_t)ns));
}

static const uint8_t kMagic[8] = {0x89, 'K', 'L', 'N', '\r', '\n', 0x1a, '\n'};

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    if (size < 4 || seed % 10 == 0) return LLVMFuzzerMutate(data, size, max_size);
    size_t n = rd32(data);
    if (n > size - 4) return LLVMFuzzerMutate(data, size, max_size);
    uint8_t *pte = data + 4, *ptd = data + 4 + n;
    size_t ptd_n = size - 4 - n;
    size_t e_at = 0, e_n = 0;
    for (size_t i = 0; i + 32 <= n; i++) {
        if (memcmp(pte + i, kMagic, 8) == 0) {
            uint64_t fn = rd64(pte + i + 24);
            if (fn <= n - i) e_at = i, e_n = (size_t)fn;
            break;
        }
    }
    switch (seed % 10) {
    case 1:
    case 2:
    case 3: // the engine, CRCs repaired (mostly)
        if (e_n == 0) return LLVMFuzzerMutate(data, size, max_size);
        mutate_in_place(pte, e_at, e_n);
        if (seed % 10 != 3) fix_engine(pte + e_at, e_n);
        return size;
    case 4: // the .pte after the engine: its named data (weights)
        if (e_n == 0 || e_at + e_n >= n) return LLVMFuzzerMutate(data, size, max_size);
        mutate_in_place(pte, e_at + e_n, n - (e_at + e_n));
        return size;
    case 5: // the .pte before the engine: ExecuTorch's flatbuffer
        mutate_in_place(pte, 0, e_n ? e_at : n);
        return size;
    case 6:
    case 7: { // the .ptd's header and flatbuffer
        if (ptd_n < 48) return LLVMFuzzerMutate(data, size, max_size);
        uint64_t fb_end = rd64(ptd + 16) + rd64(ptd + 24);
        mutate_in_place(ptd, 0, fb_end <= ptd_n ? (size_t)fb_end : ptd_n);
        return size;
    }
    case 8: { // the .ptd's tensor data
        if (ptd_n < 48) return LLVMFuzzerMutate(data, size, max_size);
        uint64_t base = rd64(ptd + 32);
        if (base >= ptd_n) return LLVMFuzzerMutate(data, size, max_size);
        mutate_in_place(ptd, (size_t)base, ptd_n - (size_t)base);
        return size;
    }
    default: // the .ptd as a whole may grow or shrink
        if (ptd_n == 0) return LLVMFuzzerMutate(data, size, max_size);
        return 4 + n + LLVMFuzzerMutate(ptd, ptd_n, max_size - 4 - n);
    }
}
#endif
