// SPDX-License-Identifier: Apache-2.0
// Fuzz target: engine bytes -> kiln_load_plan (the untrusted boundary). On success: the format is
// canonical, so serializing the loaded plan must give the same bytes back (unknown optional
// sections and the informational writer_version aside); then the public runtime loads the same
// bytes and, when the engine is small, executes it on the CPU with small deterministic inputs.
// Built as a libFuzzer target (KILN_FUZZ) and, in every build, as a corpus replay (fuzz.cmake).
#include <stdlib.h>
#include <string.h>

#include "builder/serialize.h"
#include "core/alloc.h"
#include "kiln/kiln.h"
#include "runtime/format.h"
#include "runtime/load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_EXEC_NBYTES (UINT64_C(1) << 22) // per binding, and for the arena

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

static kiln_status no_weights(void *ud, const char *key, const void **out_data,
                              size_t *out_nbytes) {
    (void)ud;
    (void)key;
    (void)out_data;
    (void)out_nbytes;
    return KILN_ERR_MISSING_DATA;
}

static void check_canonical(const kiln_plan *p, const uint8_t *data, size_t size) {
    if (kiln_rd_u32(data + KILN_FORMAT_OFF_N_SECTIONS) != KILN_SECTION_KIND_COUNT - 1) return;
    uint8_t *b = NULL;
    size_t n = 0;
    if (kiln_serialize(p, &b, &n) != KILN_OK) abort(); // a loaded plan always serializes
    if (n != size) abort();
    // Ignore writer_version (and so the header CRC, which covers it).
    if (memcmp(b, data, KILN_FORMAT_OFF_WRITER_VERSION) != 0) abort();
    if (memcmp(b + KILN_FORMAT_HEADER_NBYTES, data + KILN_FORMAT_HEADER_NBYTES,
               n - KILN_FORMAT_HEADER_NBYTES) != 0)
        abort();
    kiln_free(b, n);
}

static void execute(const uint8_t *data, size_t size) {
    kiln_load_options opts;
    kiln_load_options_init(&opts);
    opts.resolve = no_weights;
    kiln_option_setting cpu = {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"};
    opts.settings = &cpu;
    opts.n_settings = 1;
    kiln_engine *e = NULL;
    if (kiln_engine_load(data, size, &opts, &e) != KILN_OK) return;
    kiln_context *c = NULL;
    void *bufs[2 * 64] = {0};
    uint32_t n_in = kiln_engine_n_inputs(e), n_out = kiln_engine_n_outputs(e);
    if (kiln_engine_arena_nbytes(e) > MAX_EXEC_NBYTES || n_in > 64 || n_out > 64) goto done;
    if (kiln_context_new(e, &c) != KILN_OK) goto done;
    uint64_t seed = size;
    for (uint32_t i = 0; i < n_in; i++) {
        kiln_binding_info b;
        if (kiln_engine_binding(e, 1, i, &b) != KILN_OK) goto done;
        int64_t dims[KILN_MAX_RANK];
        uint64_t numel = 1;
        for (uint32_t d = 0; d < b.rank; d++) {
            dims[d] = b.dim_min[d] + (b.dim_max[d] > b.dim_min[d]); // min, or min + 1
            numel *= (uint64_t)dims[d];
            if (numel > MAX_EXEC_NBYTES) goto done;
        }
        size_t nbytes = (size_t)(numel * kiln_dtype_size(b.dtype));
        if (nbytes > MAX_EXEC_NBYTES) goto done;
        uint8_t *x = malloc(nbytes + 1);
        bufs[i] = x;
        // Small values: index inputs (embedding) stay mostly in range, floats stay finite.
        for (size_t k = 0; k < nbytes; k++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            x[k] = (uint8_t)((seed >> 33) & (b.dtype == KILN_DTYPE_F32 ? 0x3f : 0x01));
        }
        if (kiln_context_set_input(c, i, b.rank, dims, x) != KILN_OK) goto done;
    }
    for (uint32_t i = 0; i < n_out; i++) {
        kiln_binding_info b;
        if (kiln_engine_binding(e, 0, i, &b) != KILN_OK || b.max_nbytes > MAX_EXEC_NBYTES)
            goto done;
        bufs[64 + i] = malloc((size_t)b.max_nbytes + 1);
        if (kiln_context_set_output(c, i, bufs[64 + i], (size_t)b.max_nbytes) != KILN_OK) goto done;
    }
    (void)kiln_context_execute(c);
done:
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    kiln_context_free(c);
    kiln_engine_free(e);
}

#if defined(KILN_FUZZ_MUTATOR)
// libFuzzer builds: every engine byte is CRC-protected, so plain mutations stop at the CRC check.
// This mutator repairs the CRCs (and usually file_nbytes) of most mutants so that they reach the
// semantic checks; a few stay raw to keep the structural checks covered.
#include "core/crc32.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    size = LLVMFuzzerMutate(data, size, max_size);
    if (seed % 8 == 0 || size < KILN_FORMAT_HEADER_NBYTES) return size;
    if (seed % 8 != 1) kiln_wr_u64(data + KILN_FORMAT_OFF_FILE_NBYTES, size);
    uint32_t ns = kiln_rd_u32(data + KILN_FORMAT_OFF_N_SECTIONS);
    if (ns > KILN_FORMAT_MAX_SECTIONS) return size;
    size_t table_end = KILN_FORMAT_HEADER_NBYTES + (size_t)ns * KILN_FORMAT_SECTION_ENTRY_NBYTES;
    if (table_end > size) return size;
    for (uint32_t i = 0; i < ns; i++) {
        uint8_t *e =
            data + KILN_FORMAT_HEADER_NBYTES + (size_t)i * KILN_FORMAT_SECTION_ENTRY_NBYTES;
        uint64_t off = kiln_rd_u64(e + 8), nb = kiln_rd_u64(e + 16);
        if (off <= size && nb <= size - off) kiln_wr_u32(e + 24, kiln_crc32(0, data + off, nb));
    }
    kiln_wr_u32(data + KILN_FORMAT_OFF_HEADER_CRC, kiln_format_header_crc(data, table_end));
    return size;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_log_set(quiet_log, NULL, KILN_LOG_NONE);
    kiln_plan p;
    if (kiln_load_plan(data, size, &p) != KILN_OK) {
        if (kiln_last_error()[0] == '\0') abort(); // every failure names its cause
        return 0;
    }
    check_canonical(&p, data, size);
    kiln_plan_release(&p);
    execute(data, size);
    return 0;
}
