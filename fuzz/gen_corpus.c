// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpus of fuzz_load: the valid hand-built engines of tests/format_fixtures.h and
// targeted mutations of them (CRCs recomputed, so they reach the semantic checks). Deterministic;
// rerun after a format change:  build-fmt/gen_corpus fuzz/corpus
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder/serialize.h"
#include "core/crc32.h"
#include "format_built.h"
#include "format_fixtures.h"
#include "runtime/format.h"

static const char *out_dir;

static void write_to(const char *target, const char *name, const char *ext, const uint8_t *data,
                     size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s.%s", out_dir, target, name, ext);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, n, f) != n) {
        fprintf(stderr, "gen_corpus: cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void write_file(const char *name, const uint8_t *data, size_t n) {
    write_to("fuzz_load", name, "kiln", data, n);
}

static void fix_crcs(uint8_t *e, size_t n) {
    uint32_t ns = kiln_rd_u32(e + 20);
    for (uint32_t i = 0; i < ns; i++) {
        uint8_t *t = e + 40 + 32 * (size_t)i;
        uint64_t off = kiln_rd_u64(t + 8), nb = kiln_rd_u64(t + 16);
        if (off <= n && nb <= n - off) kiln_wr_u32(t + 24, kiln_crc32(0, e + off, (size_t)nb));
    }
    kiln_wr_u32(e + 36, kiln_format_header_crc(e, 40 + 32 * (size_t)ns));
}

static uint8_t *section(uint8_t *e, uint32_t kind) {
    for (uint32_t i = 0; i < 10; i++) {
        uint8_t *t = e + 40 + 32 * (size_t)i;
        if (kiln_rd_u32(t) == kind) return e + kiln_rd_u64(t + 8);
    }
    return NULL;
}

typedef struct mutation {
    const char *name;
    size_t (*apply)(uint8_t *e, size_t n); // returns the new length
} mutation;

static size_t m_version2(uint8_t *e, size_t n) {
    kiln_wr_u32(e + 8, 2);
    return n;
}
static size_t m_flags(uint8_t *e, size_t n) {
    kiln_wr_u32(e + 16, 1);
    return n;
}
static size_t m_truncated(uint8_t *e, size_t n) {
    (void)e;
    return n - 1;
}
static size_t m_header_only(uint8_t *e, size_t n) {
    (void)e;
    (void)n;
    return 40;
}
static size_t m_dtype9(uint8_t *e, size_t n) {
    kiln_wr_u32(section(e, KILN_SECTION_TENSORS) + 4, 9);
    return n;
}
static size_t m_rank9(uint8_t *e, size_t n) {
    kiln_wr_u32(section(e, KILN_SECTION_TENSORS) + 8, 9);
    return n;
}
static size_t m_op99(uint8_t *e, size_t n) {
    kiln_wr_u32(section(e, KILN_SECTION_LAYERS), 99);
    return n;
}
static size_t m_ids_max(uint8_t *e, size_t n) {
    kiln_wr_u32(section(e, KILN_SECTION_IDS), 0x7fffffffu);
    return n;
}
static size_t m_section_wrap(uint8_t *e, size_t n) {
    uint8_t *t = e + 40 + 32 * 3;
    kiln_wr_u64(t + 16, UINT64_MAX - kiln_rd_u64(t + 8) + 9);
    return n;
}
static size_t m_arena_small(uint8_t *e, size_t n) {
    kiln_wr_u64(section(e, KILN_SECTION_PLAN), 1);
    return n;
}
static size_t m_n_sections_max(uint8_t *e, size_t n) {
    kiln_wr_u32(e + 20, 64);
    return n;
}
static size_t m_layer_tail(uint8_t *e, size_t n) {
    kiln_wr_u32(section(e, KILN_SECTION_LAYERS) + 4, 1);
    return n;
}
static size_t m_dim_huge(uint8_t *e, size_t n) {
    kiln_wr_u64(section(e, KILN_SECTION_TENSORS) + 104, (uint64_t)1 << 40);
    return n;
}

static const mutation mutations[] = {
    {"version2", m_version2},
    {"flags1", m_flags},
    {"truncated", m_truncated},
    {"header-only", m_header_only},
    {"dtype9", m_dtype9},
    {"rank9", m_rank9},
    {"op99", m_op99},
    {"ids-max", m_ids_max},
    {"section-wrap", m_section_wrap},
    {"arena-1", m_arena_small},
    {"n-sections-64", m_n_sections_max},
    {"layer0-tail", m_layer_tail},
    {"dim-2e40", m_dim_huge},
};

// --- fuzz_build programs (encoding: fuzz/fuzz_build.c)

static uint32_t op_index(uint32_t op) {
    for (uint32_t i = 0; i < kiln_op_count(); i++) {
        if (kiln_op_id_at(i) == op) return i;
    }
    return 0;
}

static void write_programs(void) {
    // x[1..4, 4] -> linear(w[4,4]) -> relu -> output; then the same with fp16 / external.
    uint8_t lin = (uint8_t)op_index(KILN_OP_LINEAR), relu = (uint8_t)op_index(KILN_OP_RELU);
    uint8_t add = (uint8_t)op_index(KILN_OP_ADD), sm = (uint8_t)op_index(KILN_OP_SOFTMAX);
    uint8_t mlp[] = {0,                      // flags
                     0, 0,    2, 1, 3, 4, 0, // input f32 [1..4, 4]
                     1, 0,    2, 3, 3, 7,    // constant f32 [4, 4]
                     2, lin,  0, 0, 1, 0,    // linear(v0, v1)
                     2, relu, 0, 2, 0,       // relu(v2)
                     2, add,  0, 3, 0, 0,    // add(v3, v0)
                     2, sm,   0, 4, 1, 1, 2, // softmax(v4); dim: count kept (1), value 2 - 3 = -1
                     3, 5};                  // output v5
    static const char *const names[] = {"mlp-fp32", "mlp-fp16", "mlp-bf16", "mlp-external",
                                        "mlp-noopt"};
    static const uint8_t flags[] = {0, 1, 2, 4, 8};
    for (int i = 0; i < 5; i++) {
        mlp[0] = flags[i];
        write_to("fuzz_build", names[i], "bin", mlp, sizeof mlp);
    }
    // Deterministic pseudo-random programs.
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (int k = 0; k < 24; k++) {
        uint8_t prog[96];
        for (size_t i = 0; i < sizeof prog; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            prog[i] = (uint8_t)x;
        }
        char name[32];
        snprintf(name, sizeof name, "random-%02d", k);
        write_to("fuzz_build", name, "bin", prog, sizeof prog);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus CORPUS_DIR (writes CORPUS_DIR/fuzz_load/*.kiln, "
                        "fuzz_build/*.bin)\n");
        return 2;
    }
    out_dir = argv[1];
    write_programs();
    // Engines built through the public graph API.
    for (int g = 0; g < FB_N_GRAPHS; g++) {
        for (int v = 0; v < FB_N_VARIANTS; v++) {
            kiln_built *b;
            if (fb_build(g, v, &b) != KILN_OK) {
                fprintf(stderr, "gen_corpus: %s/%s: %s\n", fb_name(g), fb_variant(v),
                        kiln_last_error());
                return 1;
            }
            const void *data;
            size_t n;
            (void)kiln_built_engine(b, &data, &n);
            uint8_t *e = malloc(n);
            memcpy(e, data, n);
            kiln_wr_u32(e + KILN_FORMAT_OFF_WRITER_VERSION, 0x000100);
            fix_crcs(e, n);
            char name[128];
            snprintf(name, sizeof name, "%s-%s", fb_name(g), fb_variant(v));
            write_file(name, e, n);
            free(e);
            kiln_built_free(b);
        }
    }
    for (int f = 0; f < FX_N_FIXTURES; f++) {
        kiln_plan p;
        fx_make(f, &p);
        uint8_t *e;
        size_t n;
        if (kiln_serialize(&p, &e, &n) != KILN_OK) return 1;
        kiln_wr_u32(e + KILN_FORMAT_OFF_WRITER_VERSION, 0x000100); // stable across releases
        fix_crcs(e, n);
        char name[128];
        snprintf(name, sizeof name, "%s-valid", fx_name(f));
        write_file(name, e, n);
        for (size_t m = 0; m < sizeof mutations / sizeof mutations[0]; m++) {
            uint8_t *c = malloc(n);
            memcpy(c, e, n);
            size_t cn = mutations[m].apply(c, n);
            if (cn >= 360) fix_crcs(c, cn);
            snprintf(name, sizeof name, "%s-%s", fx_name(f), mutations[m].name);
            write_file(name, c, cn);
            free(c);
        }
        kiln_free(e, n);
        kiln_plan_release(&p);
    }
    return 0;
}
