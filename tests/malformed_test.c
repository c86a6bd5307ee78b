// SPDX-License-Identifier: Apache-2.0
// The malformed-engine battery (reliability-anchors §6.2, docs/format.md): for several small
// valid engines, every truncation, every single-bit flip, boundary values in every integer field
// of the header, the section table and the first records (CRCs recomputed so the semantic check
// is what rejects), wrapping offsets, overlapping / duplicate / missing / out-of-order / misaligned
// sections, unknown optional and required sections, caps at the limit and one past it, misaligned
// base pointers, newer versions, bad magic, empty / all-0x00 / all-0xFF inputs and trailing
// garbage. Each case must return the expected status (never crash: run it under ASan+UBSan) with
// a non-empty message naming the field.
#include <stdarg.h>

#include "builder/serialize.h"
#include "check.h"
#include "core/crc32.h"
#include "core/utf8.h"
#include "format_built.h"
#include "format_fixtures.h"
#include "runtime/format.h"
#include "runtime/load.h"

#if defined(__GNUC__)
#define KILN_TEST_PRINTF __attribute__((format(printf, 1, 2)))
#else
#define KILN_TEST_PRINTF
#endif

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

static kiln_status load(const uint8_t *e, size_t n) {
    kiln_plan p;
    kiln_clear_error();
    kiln_status st = kiln_load_plan(e, n, &p);
    if (st == KILN_OK) kiln_plan_release(&p);
    return st;
}

static char what_[256];
static const char *what(const char *fmt, ...) KILN_TEST_PRINTF;
static const char *what(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what_, sizeof what_, fmt, ap);
    va_end(ap);
    return what_;
}

// Loads e[0, n) and checks the status and that the message contains substr.
static void expect_(const uint8_t *e, size_t n, kiln_status status, const char *substr,
                    const char *desc) {
    kiln_status st = load(e, n);
    CHECK_MSG(st == status, "%s: got %s, expected %s (%s)", desc, kiln_status_str(st),
              kiln_status_str(status), kiln_last_error());
    if (st != KILN_OK) {
        CHECK_MSG(kiln_last_error()[0] != '\0', "%s: empty message", desc);
        CHECK_MSG(strstr(kiln_last_error(), substr) != NULL, "%s: message '%s' lacks '%s'", desc,
                  kiln_last_error(), substr);
    }
}
#define EXPECT(e, n, status, substr, ...) expect_((e), (n), (status), (substr), what(__VA_ARGS__))

static uint32_t rd32(const uint8_t *p) { return kiln_rd_u32(p); }
static uint64_t rd64(const uint8_t *p) { return kiln_rd_u64(p); }

static uint8_t *entry(uint8_t *e, uint32_t i) { return e + 40 + 32 * (size_t)i; }
static const uint8_t *centry(const uint8_t *e, uint32_t i) { return e + 40 + 32 * (size_t)i; }
static uint8_t *sec(uint8_t *e, uint32_t kind) {
    for (uint32_t i = 0; i < 10; i++) {
        if (rd32(entry(e, i)) == kind) return e + rd64(entry(e, i) + 8);
    }
    return NULL;
}

// Recomputes every in-bounds section CRC (unless skip_sections) and the header CRC.
static void fix_crcs(uint8_t *e, size_t n, int skip_sections) {
    if (n < 40) return;
    uint32_t ns = rd32(e + 20);
    if (ns > 64 || 40 + 32 * (uint64_t)ns > n) return;
    for (uint32_t i = 0; i < ns && !skip_sections; i++) {
        uint64_t off = rd64(entry(e, i) + 8), nb = rd64(entry(e, i) + 16);
        if (off <= n && nb <= n - off) kiln_wr_u32(entry(e, i) + 24, kiln_crc32(0, e + off, nb));
    }
    kiln_wr_u32(e + 36, kiln_format_header_crc(e, 40 + 32 * (size_t)ns));
}

static uint8_t *dup_bytes(const uint8_t *e, size_t n, size_t extra) {
    uint8_t *c = malloc(n + extra + 1);
    memcpy(c, e, n);
    return c;
}

// --- M1 truncation, M2 bit flips

static void truncations(const uint8_t *e, size_t n, const char *fx) {
    for (size_t len = 0; len < n; len++) {
        uint8_t *c = dup_bytes(e, len, 0); // exact-size copy: ASan sees any over-read
        if (len < 8)
            EXPECT(c, len, KILN_ERR_NOT_ENGINE, "not a Kiln engine", "%s truncated to %zu", fx,
                   len);
        else
            EXPECT(c, len, KILN_ERR_CORRUPT, "truncated", "%s truncated to %zu", fx, len);
        free(c);
    }
}

// Every bit of the header and section table; of the body, every bit of every `body_stride`-th
// byte (1: all of them).
static void bit_flips(const uint8_t *e, size_t n, const char *fx, size_t body_stride) {
    uint8_t *c = dup_bytes(e, n, 0);
    for (size_t byte = 0; byte < n; byte += byte < 360 ? 1 : body_stride) {
        for (int bit = 0; bit < 8; bit++) {
            c[byte] ^= (uint8_t)(1u << bit);
            kiln_status want = KILN_ERR_CORRUPT;
            const char *msg = "";
            if (byte < 8) {
                want = KILN_ERR_NOT_ENGINE;
                msg = "magic";
            } else if (byte < 12) {
                // 0 is invalid; any other flip gives a version that is either above the cap or
                // whose header CRC still matches version 1: damage, not a newer Kiln.
                want = KILN_ERR_CORRUPT;
                msg = "format_version";
            } else if (byte < 40 + 320) {
                msg = byte >= 36 && byte < 40 ? "header_crc32" : "";
            } else {
                msg = "crc32"; // every body byte is covered by a section CRC or is zero padding
                for (uint32_t i = 0; i < 10; i++) {
                    uint64_t off = rd64(entry(c, i) + 8), nb = rd64(entry(c, i) + 16);
                    if (byte >= off && byte < off + nb) break;
                    if (i == 9 || byte < off) {
                        msg = "padding";
                        break;
                    }
                }
            }
            EXPECT(c, n, want, msg, "%s byte %zu bit %d flipped", fx, byte, bit);
            c[byte] ^= (uint8_t)(1u << bit);
        }
    }
    free(c);
}

// --- M3 boundary values in integer fields (CRCs recomputed)

enum field_class {
    F_CORRUPT,     // every changed value is CORRUPT
    F_VERSION,     // format_version: 0 and > 255 CORRUPT, 2..255 (CRC fixed) VERSION
    F_FLAGS,       // header flags: VERSION
    F_INFO,        // informational: OK
    F_HEADER_CRC,  // header_crc32 (not recomputed)
    F_SECTION_CRC, // a section's crc32 (only the header CRC recomputed)
    F_ARENA,       // arena_nbytes: OK if >= the original and <= 2^62
    F_PRECISION,   // 0..2 OK
    F_ANY,         // may or may not be valid: only "no crash, a message if rejected"
};

typedef struct field {
    const char *name;
    size_t offset;
    int width; // 4 or 8
    enum field_class cls;
    const char *msg; // substring the message must contain ("" = any non-empty)
} field;

static void boundary(const uint8_t *e, size_t n, const char *fx, const field *f) {
    uint64_t vals[] = {0,
                       1,
                       UINT64_MAX,
                       (UINT64_C(1) << 31) - 1,
                       UINT64_C(1) << 31,
                       (UINT64_C(1) << 32) - 1,
                       UINT64_C(1) << 32,
                       (UINT64_C(1) << 63) - 1,
                       UINT64_MAX,
                       (uint64_t)n - 1,
                       (uint64_t)n,
                       (uint64_t)n + 1};
    uint64_t orig = f->width == 4 ? rd32(e + f->offset) : rd64(e + f->offset);
    uint8_t *c = dup_bytes(e, n, 0);
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
        uint64_t v = f->width == 4 ? (uint32_t)vals[k] : vals[k];
        if (v == orig) continue;
        memcpy(c, e, n);
        if (f->width == 4)
            kiln_wr_u32(c + f->offset, (uint32_t)v);
        else
            kiln_wr_u64(c + f->offset, v);
        if (f->cls == F_SECTION_CRC)
            fix_crcs(c, n, 1);
        else if (f->cls != F_HEADER_CRC)
            fix_crcs(c, n, 0);
        kiln_status want = KILN_ERR_CORRUPT;
        switch (f->cls) {
        case F_VERSION:
            want = v == 0 || v > KILN_FORMAT_VERSION_CAP ? KILN_ERR_CORRUPT : KILN_ERR_VERSION;
            break;
        case F_FLAGS: want = KILN_ERR_VERSION; break;
        case F_INFO: want = KILN_OK; break;
        case F_ARENA:
            want = v >= orig && v <= (UINT64_C(1) << 62) ? KILN_OK : KILN_ERR_CORRUPT;
            break;
        case F_PRECISION: want = v <= 2 ? KILN_OK : KILN_ERR_CORRUPT; break;
        default: break;
        }
        if (f->cls == F_ANY) {
            kiln_status st = load(c, n);
            CHECK_MSG(st == KILN_OK || kiln_last_error()[0] != '\0', "%s %s = %llu: empty message",
                      fx, f->name, (unsigned long long)v);
        } else {
            EXPECT(c, n, want, f->msg, "%s %s = %llu", fx, f->name, (unsigned long long)v);
        }
    }
    free(c);
}

static void boundaries(const uint8_t *e, size_t n, const char *fx, const kiln_plan *plan) {
    static const field header[] = {
        {"format_version", 8, 4, F_VERSION, "format_version"},
        {"header_nbytes", 12, 4, F_CORRUPT, "header_nbytes"},
        {"flags", 16, 4, F_FLAGS, "flags"},
        {"n_sections", 20, 4, F_CORRUPT, "n_sections"},
        {"file_nbytes", 24, 8, F_CORRUPT, "file_nbytes"},
        {"writer_version", 32, 4, F_INFO, ""},
        {"header_crc32", 36, 4, F_HEADER_CRC, "header_crc32"},
    };
    for (size_t i = 0; i < sizeof header / sizeof header[0]; i++) boundary(e, n, fx, &header[i]);
    for (uint32_t s = 0; s < 10; s++) {
        size_t b = 40 + 32 * (size_t)s;
        field fs[] = {
            {"section.kind", b, 4, F_CORRUPT, "section"},
            {"section.flags", b + 4, 4, F_CORRUPT, "section"},
            {"section.offset", b + 8, 8, F_CORRUPT, "section"},
            {"section.nbytes", b + 16, 8, F_CORRUPT, ""},
            {"section.crc32", b + 24, 4, F_SECTION_CRC, "crc32"},
            {"section.reserved", b + 28, 4, F_CORRUPT, "reserved"},
        };
        for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) boundary(e, n, fx, &fs[i]);
    }
    uint8_t *ee = (uint8_t *)e;
    size_t plan_off = (size_t)(sec(ee, KILN_SECTION_PLAN) - e);
    size_t bind_off = (size_t)(sec(ee, KILN_SECTION_BINDINGS) - e);
    size_t t0 = (size_t)(sec(ee, KILN_SECTION_TENSORS) - e);
    size_t l0 = (size_t)(sec(ee, KILN_SECTION_LAYERS) - e);
    size_t a0 = (size_t)(sec(ee, KILN_SECTION_ATTR_REFS) - e);
    // Value 1 in n_inputs is a valid arity for ops whose other inputs are optional.
    kiln_op_info l0_info = {0};
    (void)kiln_op_get_info(plan->layers[0].op, &l0_info);
    uint32_t l0_min_inputs = l0_info.min_inputs;
    field rec[] = {
        {"plan.arena_nbytes", plan_off, 8, F_ARENA, "arena_nbytes"},
        {"plan.precision", plan_off + 8, 4, F_PRECISION, "precision"},
        {"plan.reserved", plan_off + 12, 4, F_CORRUPT, "plan: reserved"},
        {"bindings.n_inputs", bind_off, 4, F_CORRUPT, "bindings"},
        {"bindings.n_outputs", bind_off + 4, 4, F_CORRUPT, "bindings"},
        {"tensor.kind", t0, 4, F_CORRUPT, "tensor 0"},
        {"tensor.dtype", t0 + 4, 4, F_CORRUPT, ""},
        {"tensor.rank", t0 + 8, 4, F_CORRUPT, "tensor 0"},
        {"tensor.name", t0 + 12, 4, F_CORRUPT, "tensor 0"},
        {"tensor.binding", t0 + 16, 4, F_CORRUPT, "tensor 0"},
        {"tensor.key", t0 + 20, 4, F_CORRUPT, "tensor 0"},
        {"tensor.offset", t0 + 24, 8, F_CORRUPT, "tensor 0"},
        {"tensor.nbytes", t0 + 32, 8, F_CORRUPT, "tensor 0"},
        {"layer.op", l0, 4, F_CORRUPT, "layer 0"},
        {"layer.flags", l0 + 4, 4, F_CORRUPT, "layer 0"},
        {"layer.input_begin", l0 + 8, 4, F_CORRUPT, "layer 0"},
        {"layer.n_inputs", l0 + 12, 4, l0_min_inputs <= 1 ? F_ANY : F_CORRUPT, "layer 0"},
        {"layer.output_begin", l0 + 16, 4, F_CORRUPT, "layer 0"},
        {"layer.n_outputs", l0 + 20, 4, F_CORRUPT, "layer 0"},
        {"layer.attr_begin", l0 + 24, 4, plan->layers[0].n_attrs ? F_CORRUPT : F_ANY, "layer 0"},
        {"layer.n_attrs", l0 + 28, 4, F_CORRUPT, "layer 0"},
        {"layer.n_tail", l0 + 32, 4, F_CORRUPT, ""},
        {"layer.reserved", l0 + 36, 4, F_CORRUPT, "layer 0"},
    };
    for (size_t i = 0; i < sizeof rec / sizeof rec[0]; i++) boundary(e, n, fx, &rec[i]);
    for (uint32_t d = 0; d < 8; d++) {
        // Input 0's dims within the rank: a wider range may still be consistent (shape
        // inference accepts a dynamic K that may equal the weight's; execute checks the actual
        // shape), so only "no crash, a message if rejected". Beyond the rank: must stay 0.
        enum field_class cls = d < plan->tensors[0].shape.rank ? F_ANY : F_CORRUPT;
        field fd[] = {{"tensor.dim_min", t0 + 40 + 8 * d, 8, cls, "beyond rank"},
                      {"tensor.dim_max", t0 + 104 + 8 * d, 8, cls, "beyond rank"}};
        boundary(e, n, fx, &fd[0]);
        boundary(e, n, fx, &fd[1]);
    }
    if (plan->n_attr_refs > 0) {
        field fa[] = {{"attr_ref.kind", a0, 4, F_CORRUPT, ""},
                      {"attr_ref.n", a0 + 4, 4, F_CORRUPT, ""},
                      {"attr_ref.begin", a0 + 8, 8, F_ANY, ""}};
        for (size_t i = 0; i < 3; i++) boundary(e, n, fx, &fa[i]);
    }
}

// --- rebuilding an engine from a list of sections (for structural cases)

typedef struct sec_spec {
    uint32_t kind, flags;
    const uint8_t *data;
    uint64_t nbytes;
} sec_spec;

// Lays sections out per the spec (packed, aligned, zero padding, CRCs). Caller frees.
static uint8_t *assemble(const sec_spec *s, uint32_t ns, size_t *out_n) {
    uint64_t end = 40 + 32 * (uint64_t)ns, offs[80];
    for (uint32_t i = 0; i < ns; i++) {
        uint64_t a = s[i].kind == KILN_SECTION_WEIGHTS ? 64 : 8;
        offs[i] = (end + a - 1) / a * a;
        end = offs[i] + s[i].nbytes;
    }
    uint8_t *e = calloc(1, (size_t)end + 1);
    memcpy(e, KILN_FORMAT_MAGIC, 8);
    kiln_wr_u32(e + 8, 1);
    kiln_wr_u32(e + 12, 40);
    kiln_wr_u32(e + 20, ns);
    kiln_wr_u64(e + 24, end);
    for (uint32_t i = 0; i < ns; i++) {
        kiln_wr_u32(entry(e, i), s[i].kind);
        kiln_wr_u32(entry(e, i) + 4, s[i].flags);
        kiln_wr_u64(entry(e, i) + 8, offs[i]);
        kiln_wr_u64(entry(e, i) + 16, s[i].nbytes);
        if (s[i].nbytes) memcpy(e + offs[i], s[i].data, (size_t)s[i].nbytes);
    }
    fix_crcs(e, (size_t)end, 0);
    *out_n = (size_t)end;
    return e;
}

static uint32_t split(const uint8_t *e, sec_spec *s) {
    for (uint32_t i = 0; i < 10; i++) {
        const uint8_t *t = e + 40 + 32 * (size_t)i;
        s[i] = (sec_spec){rd32(t), 0, e + rd64(t + 8), rd64(t + 16)};
    }
    return 10;
}

static void structure(const uint8_t *e, size_t n, const char *fx) {
    sec_spec s[80];
    size_t m;
    uint8_t *c;

    // The sections re-assembled unchanged give the same bytes (the assembler follows the spec).
    split(e, s);
    c = assemble(s, 10, &m);
    kiln_wr_u32(c + 32, rd32(e + 32));
    fix_crcs(c, m, 0);
    CHECK(m == n && memcmp(c, e, n) == 0);
    free(c);

    // Unknown optional sections are skipped (also empty ones, and up to the cap of 64).
    static const uint8_t blob[24] = "future metadata";
    for (uint32_t extra = 1; extra <= 55; extra += 27) {
        split(e, s);
        for (uint32_t i = 0; i < extra; i++) {
            s[10 + i] = (sec_spec){11 + i, KILN_SECTION_FLAG_OPTIONAL, blob, i % 2 ? 0 : 13};
        }
        c = assemble(s, 10 + extra, &m);
        EXPECT(c, m, extra <= 54 ? KILN_OK : KILN_ERR_CORRUPT, "n_sections 65",
               "%s + %u optional sections", fx, extra);
        free(c);
    }
    // ... in the middle of the table, too; and at kind 255.
    split(e, s);
    memmove(s + 4, s + 3, 7 * sizeof *s);
    s[3] = (sec_spec){255, KILN_SECTION_FLAG_OPTIONAL, blob, 7};
    c = assemble(s, 11, &m);
    EXPECT(c, m, KILN_OK, "", "%s optional kind 255 in the middle", fx);
    free(c);
    // Unknown required kind: VERSION. Kind 256: CORRUPT.
    split(e, s);
    s[10] = (sec_spec){42, 0, blob, 8};
    c = assemble(s, 11, &m);
    EXPECT(c, m, KILN_ERR_VERSION, "kind 42 is unknown", "%s required kind 42", fx);
    free(c);
    s[10] = (sec_spec){256, KILN_SECTION_FLAG_OPTIONAL, blob, 8};
    c = assemble(s, 11, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "kind 256 is not a valid", "%s kind 256", fx);
    free(c);
    s[10] = (sec_spec){43, 2 | KILN_SECTION_FLAG_OPTIONAL, blob, 8};
    c = assemble(s, 11, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "undefined bits", "%s section flag 2", fx);
    free(c);
    // A known kind flagged optional; duplicates of known and unknown kinds; missing kinds.
    split(e, s);
    s[2].flags = KILN_SECTION_FLAG_OPTIONAL;
    c = assemble(s, 10, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "must be 0 on a section kind this format defines",
           "%s optional strings", fx);
    free(c);
    split(e, s);
    s[10] = s[3];
    c = assemble(s, 11, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "a second section of kind 4", "%s duplicate tensors", fx);
    free(c);
    s[10] = (sec_spec){77, KILN_SECTION_FLAG_OPTIONAL, blob, 8};
    s[11] = s[10];
    c = assemble(s, 12, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "a second section of kind 77", "%s duplicate optional", fx);
    free(c);
    for (uint32_t drop = 0; drop < 10; drop++) {
        split(e, s);
        uint32_t kind = s[drop].kind;
        s[drop] = (sec_spec){100 + drop, KILN_SECTION_FLAG_OPTIONAL, blob, 8};
        c = assemble(s, 10, &m);
        char msg[64];
        snprintf(msg, sizeof msg, "the %s section (kind %u) is missing",
                 kiln_format_section_name(kind), kind);
        EXPECT(c, m, KILN_ERR_CORRUPT, msg, "%s without section %u", fx, kind);
        free(c);
    }
    // Table order must follow offsets: swap two entries of the table (content in place).
    c = dup_bytes(e, n, 0);
    uint8_t tmp[32];
    memcpy(tmp, entry(c, 2), 32);
    memcpy(entry(c, 2), entry(c, 3), 32);
    memcpy(entry(c, 3), tmp, 32);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "section 2", "%s swapped entries", fx);
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 3) + 8, rd64(entry(c, 2) + 8) - 8);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "increasing offset order", "%s out of order", fx);
    // Overlap: section 3 starts inside section 2; gaps; misalignment; overlap with the table.
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 3) + 8, rd64(entry(c, 2) + 8) + 8 * (rd64(entry(c, 2) + 16) > 8));
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "section 3", "%s overlapping sections", fx);
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 3) + 8, rd64(entry(c, 3) + 8) + 4);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "is not a multiple of 8", "%s misaligned section", fx);
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 9) + 8, rd64(entry(c, 9) + 8) - 8);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "is not a multiple of 64", "%s misaligned weights", fx);
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 0) + 8, 32);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "overlaps the header and section table", "%s sec in table", fx);
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 9) + 8, rd64(entry(c, 9) + 8) + 64);
    kiln_wr_u64(entry(c, 9) + 16, 0);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "section 9", "%s gap before weights", fx);
    memcpy(c, e, n);
    kiln_wr_u64(entry(c, 2) + 8, rd64(entry(c, 2) + 8) + 8);
    kiln_wr_u64(entry(c, 2) + 16, rd64(entry(c, 2) + 16) - 8);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "leaves a gap", "%s gap before strings", fx);
    // M4 wrapping: offset + nbytes overflows 64 bits.
    for (uint32_t i = 0; i < 10; i += 3) {
        uint64_t off = rd64(centry(e, i) + 8);
        uint64_t wraps[][2] = {{off, UINT64_MAX - off + 9},
                               {off, UINT64_MAX},
                               {UINT64_MAX - 63, 128},
                               {UINT64_C(1) << 63, UINT64_C(1) << 63}};
        for (int w = 0; w < 4; w++) {
            memcpy(c, e, n);
            kiln_wr_u64(entry(c, i) + 8, wraps[w][0]);
            kiln_wr_u64(entry(c, i) + 16, wraps[w][1]);
            fix_crcs(c, n, 0);
            EXPECT(c, n, KILN_ERR_CORRUPT, "section", "%s wrap %d in section %u", fx, w, i);
        }
    }
    // Non-zero padding, when the engine has any.
    for (uint32_t i = 1; i < 10; i++) {
        uint64_t prev_end = rd64(centry(e, i - 1) + 8) + rd64(centry(e, i - 1) + 16);
        if (prev_end < rd64(centry(e, i) + 8)) {
            memcpy(c, e, n);
            c[prev_end] = 0x5a;
            EXPECT(c, n, KILN_ERR_CORRUPT, "padding byte", "%s padding before section %u", fx, i);
            break;
        }
    }
    // Section contents that only the decoder checks (CRCs fixed): strings and record sizes.
    memcpy(c, e, n);
    uint8_t *strs = sec(c, KILN_SECTION_STRINGS);
    uint64_t strs_n = rd64(entry(c, 2) + 16);
    strs[strs_n - 1] = 'x';
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "strings section: last byte", "%s unterminated strings", fx);
    memcpy(c, e, n);
    strs[0] = 'x';
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "strings section: byte 0", "%s strings[0]", fx);
    memcpy(c, e, n);
    uint8_t *t0 = sec(c, KILN_SECTION_TENSORS);
    kiln_wr_u64(t0 + 40 + 8 * 7, 1); // dim_min[7] beyond rank
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "tensor 0: dim_min[7] / dim_max[7] are 1 / 0 beyond rank",
           "%s dims beyond rank", fx);
    free(c);
    for (uint32_t k = 0; k < 10; k++) {
        // Record sections with a size that is not a multiple of the record.
        static const uint64_t rec[] = {0, 0, 0, 168, 40, 4, 16, 8, 8, 0};
        if (rec[k] == 0) continue;
        split(e, s);
        uint8_t *grown = calloc(1, (size_t)s[k].nbytes + 8);
        memcpy(grown, s[k].data, (size_t)s[k].nbytes);
        s[k].data = grown;
        s[k].nbytes += rec[k] == 4 ? 2 : 4;
        c = assemble(s, 10, &m);
        EXPECT(c, m, KILN_ERR_CORRUPT, "is not a multiple of its", "%s %s size", fx,
               kiln_format_section_name(s[k].kind));
        free(c);
        free(grown);
    }
    split(e, s);
    s[0].nbytes = 8;
    c = assemble(s, 10, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "plan section: nbytes 8", "%s short plan", fx);
    free(c);
    split(e, s);
    s[1].nbytes = 4;
    c = assemble(s, 10, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "bindings section: nbytes 4", "%s short bindings", fx);
    free(c);
}

// --- M6/M10: versions, magic, trivial inputs, trailing bytes; M8 misaligned base

static void headers(const uint8_t *e, size_t n, const char *fx) {
    uint8_t *c = dup_bytes(e, n, 64);
    kiln_wr_u32(c + 8, 2);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_VERSION, "format_version 2: the engine was made by a newer Kiln",
           "%s version+1", fx);
    kiln_wr_u32(c + 8, 2);
    memset(c + 12, 0xEE, n - 12); // a newer version's layout is not interpreted at all
    EXPECT(c, n, KILN_ERR_VERSION, "format_version 2", "%s version+1, garbage after", fx);
    EXPECT(c, 12, KILN_ERR_VERSION, "format_version 2", "%s version+1, 12 bytes", fx);
    // Damage, not a newer format: the header CRC still matches version 1, or the value is beyond
    // any version Kiln will write.
    for (uint32_t v = 2; v <= KILN_FORMAT_VERSION_CAP; v++) {
        memcpy(c, e, n);
        kiln_wr_u32(c + 8, v);
        EXPECT(c, n, KILN_ERR_CORRUPT, "the header CRC matches format_version 1",
               "%s version %u, CRC of version 1", fx, v);
    }
    memcpy(c, e, n);
    kiln_wr_u32(c + 8, KILN_FORMAT_VERSION_CAP + 1);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_CORRUPT, "format_version 256 is outside every released range",
           "%s version 256", fx);
    memcpy(c, e, n);
    kiln_wr_u32(c + 16, 0x100);
    fix_crcs(c, n, 0);
    EXPECT(c, n, KILN_ERR_VERSION, "flags 0x00000100 has bits", "%s unknown flag", fx);
    for (int i = 0; i < 8; i++) {
        memcpy(c, e, n);
        c[i] ^= 0x20;
        EXPECT(c, n, KILN_ERR_NOT_ENGINE, "not a Kiln engine: magic", "%s magic byte %d", fx, i);
    }
    // Text-mode mangling: CR LF -> LF.
    memcpy(c, e, 4);
    memcpy(c + 4, e + 5, n - 5);
    EXPECT(c, n - 1, KILN_ERR_NOT_ENGINE, "magic", "%s CRLF->LF", fx);
    // Trailing garbage: the length says so, and so does a file_nbytes that covers it.
    memcpy(c, e, n);
    memset(c + n, 0xAB, 64);
    EXPECT(c, n + 1, KILN_ERR_CORRUPT, "1 trailing bytes", "%s + 1 byte", fx);
    EXPECT(c, n + 64, KILN_ERR_CORRUPT, "64 trailing bytes", "%s + 64 bytes", fx);
    kiln_wr_u64(c + 24, n + 64);
    fix_crcs(c, n + 64, 0);
    EXPECT(c, n + 64, KILN_ERR_CORRUPT, "64 bytes are not in any section", "%s + 64 covered", fx);
    // Misaligned base pointer.
    for (size_t shift = 1; shift < 16; shift++) {
        memmove(c + shift, e, n);
        EXPECT(c + shift, n, KILN_OK, "", "%s at misalignment %zu", fx, shift);
    }
    free(c);
}

static void trivial_inputs(void) {
    static const uint8_t z[4096], magic_only[8] = "\x89KLN\r\n\x1a\n";
    uint8_t ff[4096];
    memset(ff, 0xFF, sizeof ff);
    EXPECT(z, 0, KILN_ERR_NOT_ENGINE, "0 bytes", "empty");
    EXPECT(NULL, 0, KILN_ERR_NOT_ENGINE, "0 bytes", "NULL, 0");
    EXPECT(z, sizeof z, KILN_ERR_NOT_ENGINE, "magic", "all 0x00");
    EXPECT(ff, sizeof ff, KILN_ERR_NOT_ENGINE, "magic", "all 0xFF");
    EXPECT(magic_only, 8, KILN_ERR_CORRUPT, "truncated", "magic only");
    uint8_t mz[4096] = {0};
    memcpy(mz, magic_only, 8);
    EXPECT(mz, sizeof mz, KILN_ERR_CORRUPT, "format_version 0", "magic + zeros");
    memset(mz + 8, 0xFF, sizeof mz - 8);
    EXPECT(mz, sizeof mz, KILN_ERR_CORRUPT, "format_version 4294967295 is outside every",
           "magic + 0xFF");
    kiln_wr_u32(mz + 8, 1);
    EXPECT(mz, sizeof mz, KILN_ERR_CORRUPT, "header_nbytes", "v1 + 0xFF");
}

// --- strings: every string of the engine (input, output, weight and activation names, weight
// keys) with bytes that are not UTF-8 text, CRCs recomputed; valid multi-byte UTF-8 loads.

typedef struct bad_text {
    const char *bytes; // replaces the string's first bytes (the string keeps its length)
    size_t n;
    const char *what;
} bad_text;

static void strings(const uint8_t *e, size_t n, const char *fx) {
    static const bad_text bad[] = {
        {"\xff", 1, "0xff"},
        {"\x80", 1, "a lone continuation byte"},
        {"\xc0\xaf", 2, "an overlong '/'"},
        {"\xe0\x80\xaf", 3, "an overlong 3-byte form"},
        {"\xed\xa0\x80", 3, "a surrogate"},
        {"\xf4\x90\x80\x80", 4, "a code point above U+10FFFF"},
        {"\xc3", 1, "a truncated sequence"},
        {"\x1b[2J", 4, "ESC (clear screen)"},
        {"\x0a", 1, "a newline"},
        {"\x7f", 1, "DEL"},
        {"\xc2\x85", 2, "a C1 control (NEL)"},
        {"\xc2\x9b", 2, "a C1 control (CSI)"},
    };
    const uint8_t *ss = sec((uint8_t *)e, KILN_SECTION_STRINGS);
    uint64_t snb = 0;
    for (uint32_t i = 0; i < 10; i++) {
        if (rd32(centry(e, i)) == KILN_SECTION_STRINGS) snb = rd64(centry(e, i) + 16);
    }
    size_t s0 = (size_t)(ss - e);
    uint8_t *c = dup_bytes(e, n, 0);
    int n_strings = 0;
    for (uint64_t at = 1; at < snb; at += strlen((const char *)ss + at) + 1) {
        size_t len = strlen((const char *)ss + at);
        if (len == 0) continue;
        n_strings++;
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            if (bad[k].n > len) continue;
            memcpy(c, e, n);
            memcpy(c + s0 + at, bad[k].bytes, bad[k].n);
            fix_crcs(c, n, 0);
            EXPECT(c, n, KILN_ERR_CORRUPT, "is not UTF-8 text", "%s string at %llu: %s", fx,
                   (unsigned long long)at, bad[k].what);
            // The message itself is UTF-8 text: the bad bytes are shown as \xNN.
            const char *m = kiln_last_error();
            CHECK_MSG(kiln_utf8_check(m, strlen(m)) == strlen(m), "%s: message is not text: %s", fx,
                      m);
            CHECK_MSG(strstr(m, "\\x") != NULL, "%s: message lacks a \\x escape: %s", fx, m);
        }
        // Valid multi-byte text (U+00E9, U+20AC, U+1F600) loads.
        static const char *good[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
        for (size_t k = 0; k < 3; k++) {
            size_t gn = strlen(good[k]);
            if (gn > len) continue;
            memcpy(c, e, n);
            memcpy(c + s0 + at, good[k], gn);
            fix_crcs(c, n, 0);
            kiln_status st = load(c, n);
            // A renamed binding may collide with another name, nothing else may fail.
            CHECK_MSG(st == KILN_OK || strstr(kiln_last_error(), "used by two") != NULL,
                      "%s string at %llu: valid UTF-8 %zu bytes refused: %s", fx,
                      (unsigned long long)at, gn, kiln_last_error());
        }
        // A reference into the middle of a multi-byte character.
        if (len >= 3) {
            memcpy(c, e, n);
            memcpy(c + s0 + at, "\xe2\x82\xac", 3);
            fix_crcs(c, n, 0);
            kiln_plan p;
            if (kiln_load_plan(c, n, &p) == KILN_OK) {
                int done = 0;
                for (uint32_t t = 0; t < p.n_tensors && !done; t++) {
                    if (p.tensors[t].name != at) continue;
                    p.tensors[t].name = (uint32_t)at + 1;
                    uint8_t *e2;
                    size_t n2;
                    CHECK_OK(kiln_serialize(&p, &e2, &n2));
                    EXPECT(e2, n2, KILN_ERR_CORRUPT, "starts inside a UTF-8 character",
                           "%s name inside a character", fx);
                    kiln_free(e2, n2);
                    p.tensors[t].name = (uint32_t)at;
                    done = 1;
                }
                kiln_plan_release(&p);
            }
        }
    }
    CHECK_MSG(n_strings > 0, "%s: no strings", fx);
    free(c);
}

// --- M7 caps at the limit and one past it

static void caps(void) {
    // Tensors: 65536 (2 bindings + 65534 rank-0 weights sharing 4 bytes) loads; 65537 does not,
    // and is refused before any allocation sized by the file.
    uint32_t n_t = KILN_FORMAT_MAX_TENSORS;
    kiln_plan p;
    memset(&p, 0, sizeof p);
    p.n_tensors = n_t;
    p.tensors = kiln_calloc(n_t * sizeof *p.tensors, 16);
    int64_t d[] = {4};
    p.tensors[0] = (kiln_plan_tensor){.kind = KILN_TENSOR_INPUT,
                                      .dtype = KILN_DTYPE_F32,
                                      .shape = {1, {4}, {4}},
                                      .name = 1,
                                      .key = KILN_NO_KEY};
    p.tensors[1] = p.tensors[0];
    p.tensors[1].kind = KILN_TENSOR_OUTPUT;
    p.tensors[1].name = 3;
    for (uint32_t i = 2; i < n_t; i++) {
        p.tensors[i] = (kiln_plan_tensor){
            .kind = KILN_TENSOR_WEIGHT, .dtype = KILN_DTYPE_F32, .nbytes = 4, .key = KILN_NO_KEY};
    }
    (void)d;
    static char strings[] = "\0x\0y";
    p.strings = kiln_malloc(5, 1);
    memcpy(p.strings, strings, 5);
    p.strings_nbytes = 5;
    p.n_inputs = p.n_outputs = 1;
    p.inputs = kiln_calloc(4, 16);
    p.outputs = kiln_calloc(4, 16);
    p.outputs[0] = 1;
    p.n_layers = 1;
    p.layers = kiln_calloc(sizeof *p.layers, 16);
    p.layers[0] =
        (kiln_plan_layer){.op = KILN_OP_RELU, .n_inputs = 1, .output_begin = 1, .n_outputs = 1};
    p.n_ids = 2;
    p.ids = kiln_calloc(8, 16);
    p.ids[1] = 1;
    p.weights_nbytes = 4;
    p.weights = kiln_calloc(4, 64);
    p.attr_refs = kiln_malloc(0, 16);
    p.ints = kiln_malloc(0, 16);
    p.floats = kiln_malloc(0, 16);
    uint8_t *e;
    size_t n;
    CHECK_OK(kiln_serialize(&p, &e, &n));
    EXPECT(e, n, KILN_OK, "", "65536 tensors");
    kiln_free(e, n);
    kiln_free(p.tensors, n_t * sizeof *p.tensors);
    p.n_tensors = n_t + 1;
    p.tensors = kiln_calloc(p.n_tensors * sizeof *p.tensors, 16);
    CHECK_OK(kiln_serialize(&p, &e, &n));
    EXPECT(e, n, KILN_ERR_CORRUPT, "tensors section: 65537 records exceed the cap of 65536",
           "65537 tensors");
    kiln_free(e, n);
    kiln_free(p.tensors, p.n_tensors * sizeof *p.tensors);
    p.n_tensors = 2;
    p.tensors = kiln_calloc(2 * sizeof *p.tensors, 16);
    kiln_plan_release(&p);

    // Layers: one past the cap, refused from the section size alone.
    kiln_plan mlp;
    fx_mlp(&mlp);
    uint8_t *me;
    size_t mn;
    CHECK_OK(kiln_serialize(&mlp, &me, &mn));
    sec_spec s[10];
    split(me, s);
    uint64_t big = (uint64_t)(KILN_FORMAT_MAX_LAYERS + 1) * KILN_FORMAT_LAYER_NBYTES;
    uint8_t *layers = calloc(1, (size_t)big);
    s[4].data = layers;
    s[4].nbytes = big;
    size_t m;
    uint8_t *c = assemble(s, 10, &m);
    EXPECT(c, m, KILN_ERR_CORRUPT, "layers section: 1048577 records exceed the cap", "layers+1");
    free(c);
    free(layers);
    // Names: 1024 bytes load, 1025 do not.
    for (uint32_t len = 1024; len <= 1025; len++) {
        char *strs = kiln_malloc(mlp.strings_nbytes + len + 1, 1);
        memcpy(strs, mlp.strings, mlp.strings_nbytes);
        memset(strs + mlp.strings_nbytes, 'n', len);
        strs[mlp.strings_nbytes + len] = '\0';
        kiln_plan q = mlp;
        q.strings = strs;
        q.strings_nbytes = mlp.strings_nbytes + len + 1;
        kiln_plan_tensor *t = &q.tensors[0];
        uint32_t saved = t->name;
        t->name = (uint32_t)mlp.strings_nbytes;
        CHECK_OK(kiln_serialize(&q, &e, &n));
        t->name = saved;
        EXPECT(e, n, len <= 1024 ? KILN_OK : KILN_ERR_CORRUPT,
               "is longer than the cap of 1024 bytes", "name of %u bytes", len);
        kiln_free(e, n);
        kiln_free(strs, q.strings_nbytes);
    }
    // An attribute of 1025 values.
    kiln_plan conv;
    fx_conv(&conv);
    int64_t *ints = kiln_calloc(2000 * 8, 16);
    memcpy(ints, conv.ints, conv.n_ints * 8);
    kiln_free(conv.ints, conv.n_ints * 8);
    conv.ints = ints;
    conv.n_ints = 2000;
    conv.attr_refs[9].n = 1025;
    CHECK_OK(kiln_serialize(&conv, &e, &n));
    EXPECT(e, n, KILN_ERR_CORRUPT, "attr_ref 9: n 1025 exceeds the cap", "1025 values");
    kiln_free(e, n);
    kiln_plan_release(&conv);
    kiln_free(me, mn);
    kiln_plan_release(&mlp);
}

int main(void) {
    kiln_log_set(quiet_log, NULL, KILN_LOG_DEBUG);
    trivial_inputs();
    for (int f = 0; f < FX_N_FIXTURES; f++) {
        kiln_plan plan;
        fx_make(f, &plan);
        uint8_t *e;
        size_t n;
        CHECK_OK(kiln_serialize(&plan, &e, &n));
        EXPECT(e, n, KILN_OK, "", "%s unchanged", fx_name(f));
        int before = check_failed_;
        truncations(e, n, fx_name(f));
        bit_flips(e, n, fx_name(f), 1);
        boundaries(e, n, fx_name(f), &plan);
        structure(e, n, fx_name(f));
        headers(e, n, fx_name(f));
        strings(e, n, fx_name(f));
        printf("%s: %zu bytes, %d failures\n", fx_name(f), n, check_failed_ - before);
        kiln_free(e, n);
        kiln_plan_release(&plan);
    }
    // The same over engines built through the public graph API (kiln_build).
    for (int g = 0; g < FB_N_GRAPHS; g++) {
        for (int v = 0; v < FB_N_VARIANTS; v++) {
            kiln_built *b = NULL;
            kiln_status st = fb_build(g, v, &b);
            CHECK_MSG(st == KILN_OK, "%s/%s: build: %s", fb_name(g), fb_variant(v),
                      kiln_last_error());
            if (st != KILN_OK) continue;
            const void *data;
            size_t n;
            CHECK_OK(kiln_built_engine(b, &data, &n));
            uint8_t *e = dup_bytes(data, n, 0);
            kiln_plan plan;
            CHECK_OK(kiln_load_plan(e, n, &plan));
            char name[64];
            snprintf(name, sizeof name, "%s/%s", fb_name(g), fb_variant(v));
            int before = check_failed_;
            truncations(e, n, name);
            bit_flips(e, n, name, 7);
            boundaries(e, n, name, &plan);
            structure(e, n, name);
            headers(e, n, name);
            strings(e, n, name);
            printf("%s: %zu bytes, %d failures\n", name, n, check_failed_ - before);
            kiln_plan_release(&plan);
            free(e);
            kiln_built_free(b);
        }
    }
    caps();
    return check_summary();
}
