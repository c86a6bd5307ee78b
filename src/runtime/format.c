// SPDX-License-Identifier: Apache-2.0
// The structural layer of engine loading (docs/format.md §2-3): magic, version, header, section
// table, section bounds, alignment, packing, padding and CRCs. Untrusted input: every offset and
// size goes through src/core/checked.h, and every field is checked before it is used.
#include <inttypes.h>
#include <string.h>

#include "core/checked.h"
#include "core/crc32.h"
#include "core/status.h"
#include "runtime/format.h"

const char *kiln_format_section_name(uint32_t kind) {
    switch (kind) {
    case KILN_SECTION_PLAN: return "plan";
    case KILN_SECTION_BINDINGS: return "bindings";
    case KILN_SECTION_STRINGS: return "strings";
    case KILN_SECTION_TENSORS: return "tensors";
    case KILN_SECTION_LAYERS: return "layers";
    case KILN_SECTION_IDS: return "ids";
    case KILN_SECTION_ATTR_REFS: return "attr_refs";
    case KILN_SECTION_INTS: return "ints";
    case KILN_SECTION_FLOATS: return "floats";
    case KILN_SECTION_WEIGHTS: return "weights";
    default: return "unknown";
    }
}

uint64_t kiln_format_section_align(uint32_t kind) {
    return kind == KILN_SECTION_WEIGHTS ? KILN_FORMAT_WEIGHT_ALIGN : KILN_FORMAT_SECTION_ALIGN;
}

uint32_t kiln_format_header_crc(const uint8_t *data, size_t nbytes) {
    static const uint8_t zeros[4] = {0, 0, 0, 0};
    uint32_t crc = kiln_crc32(0, data, KILN_FORMAT_OFF_HEADER_CRC);
    crc = kiln_crc32(crc, zeros, sizeof zeros);
    return kiln_crc32(crc, data + KILN_FORMAT_OFF_HEADER_CRC + 4,
                      nbytes - (KILN_FORMAT_OFF_HEADER_CRC + 4));
}

// The header CRC of a version-1 layout with format_version read as `version`.
static uint32_t header_crc_as(const uint8_t *p, size_t table_end, uint32_t version) {
    static const uint8_t zeros[4] = {0, 0, 0, 0};
    uint8_t v[4];
    kiln_wr_u32(v, version);
    uint32_t crc = kiln_crc32(0, p, KILN_FORMAT_OFF_VERSION);
    crc = kiln_crc32(crc, v, sizeof v);
    crc = kiln_crc32(crc, p + KILN_FORMAT_OFF_VERSION + 4,
                     KILN_FORMAT_OFF_HEADER_CRC - (KILN_FORMAT_OFF_VERSION + 4));
    crc = kiln_crc32(crc, zeros, sizeof zeros);
    return kiln_crc32(crc, p + KILN_FORMAT_OFF_HEADER_CRC + 4,
                      table_end - (KILN_FORMAT_OFF_HEADER_CRC + 4));
}

// A format_version above KILN_FORMAT_VERSION: damage or a newer format (docs/format.md §5).
// Beyond KILN_FORMAT_VERSION_CAP no Kiln will ever write it; and when the rest of the header is
// a released layout whose CRC matches with a released version in the field, the field itself was
// damaged. Otherwise the engine is taken to be from a newer Kiln.
static kiln_status newer_version(const uint8_t *p, size_t nbytes, uint32_t version) {
    KILN_CHECK(version <= KILN_FORMAT_VERSION_CAP, KILN_ERR_CORRUPT,
               "format_version %" PRIu32 " is outside every released range (this Kiln %s reads "
               "1..%d, and no Kiln uses versions above %d): the engine is damaged; re-export it, "
               "or the file was damaged in transit",
               version, KILN_VERSION_STRING, KILN_FORMAT_VERSION, KILN_FORMAT_VERSION_CAP);
    if (nbytes >= KILN_FORMAT_HEADER_NBYTES) {
        uint32_t n_sections = kiln_rd_u32(p + KILN_FORMAT_OFF_N_SECTIONS);
        uint64_t table_end = (uint64_t)KILN_FORMAT_HEADER_NBYTES +
                             (uint64_t)n_sections * KILN_FORMAT_SECTION_ENTRY_NBYTES;
        uint32_t stored = kiln_rd_u32(p + KILN_FORMAT_OFF_HEADER_CRC);
        if (n_sections <= KILN_FORMAT_MAX_SECTIONS && table_end <= nbytes) {
            for (uint32_t v = 1; v <= KILN_FORMAT_VERSION; v++) {
                KILN_CHECK(header_crc_as(p, (size_t)table_end, v) != stored, KILN_ERR_CORRUPT,
                           "format_version %" PRIu32 " is not a released version, and the header "
                           "CRC matches format_version %" PRIu32
                           ": the field is damaged, not from a newer Kiln; re-export the "
                           "engine, or the file was damaged in transit",
                           version, v);
            }
        }
    }
    return kiln_fail(KILN_ERR_VERSION,
                     "format_version %" PRIu32 ": the engine was made by a newer Kiln (this is "
                     "Kiln %s, which reads format versions up to %d); upgrade Kiln or rebuild the "
                     "engine",
                     version, KILN_VERSION_STRING, KILN_FORMAT_VERSION);
}

static kiln_status parse_header(const uint8_t *p, size_t nbytes, kiln_format_info *info) {
    KILN_CHECK(nbytes >= KILN_FORMAT_MAGIC_NBYTES, KILN_ERR_NOT_ENGINE,
               "not a Kiln engine: %zu bytes is shorter than the %d-byte magic", nbytes,
               KILN_FORMAT_MAGIC_NBYTES);
    KILN_CHECK(memcmp(p, KILN_FORMAT_MAGIC, KILN_FORMAT_MAGIC_NBYTES) == 0, KILN_ERR_NOT_ENGINE,
               "not a Kiln engine: magic is %02x %02x %02x %02x %02x %02x %02x %02x, expected "
               "89 4b 4c 4e 0d 0a 1a 0a (\\x89KLN\\r\\n\\x1a\\n)",
               p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    KILN_CHECK(nbytes >= KILN_FORMAT_OFF_VERSION + 4, KILN_ERR_CORRUPT,
               "truncated engine: %zu bytes, the header alone needs %d", nbytes,
               KILN_FORMAT_HEADER_NBYTES);
    info->format_version = kiln_rd_u32(p + KILN_FORMAT_OFF_VERSION);
    KILN_CHECK(info->format_version != 0, KILN_ERR_CORRUPT,
               "format_version 0 is not valid (versions start at 1)");
    if (info->format_version > KILN_FORMAT_VERSION) {
        return newer_version(p, nbytes, info->format_version);
    }
    KILN_CHECK(nbytes >= KILN_FORMAT_HEADER_NBYTES, KILN_ERR_CORRUPT,
               "truncated engine: %zu bytes, the header alone needs %d", nbytes,
               KILN_FORMAT_HEADER_NBYTES);

    info->header_nbytes = kiln_rd_u32(p + KILN_FORMAT_OFF_HEADER_NBYTES);
    info->flags = kiln_rd_u32(p + KILN_FORMAT_OFF_FLAGS);
    info->n_sections = kiln_rd_u32(p + KILN_FORMAT_OFF_N_SECTIONS);
    info->file_nbytes = kiln_rd_u64(p + KILN_FORMAT_OFF_FILE_NBYTES);
    info->writer_version = kiln_rd_u32(p + KILN_FORMAT_OFF_WRITER_VERSION);
    info->header_crc32 = kiln_rd_u32(p + KILN_FORMAT_OFF_HEADER_CRC);

    KILN_CHECK(info->header_nbytes == KILN_FORMAT_HEADER_NBYTES, KILN_ERR_CORRUPT,
               "header_nbytes %" PRIu32 " is wrong: format_version 1 headers are %d bytes",
               info->header_nbytes, KILN_FORMAT_HEADER_NBYTES);
    KILN_CHECK(info->n_sections >= KILN_SECTION_KIND_COUNT - 1 &&
                   info->n_sections <= KILN_FORMAT_MAX_SECTIONS,
               KILN_ERR_CORRUPT, "n_sections %" PRIu32 " is out of range (%d..%d)",
               info->n_sections, KILN_SECTION_KIND_COUNT - 1, KILN_FORMAT_MAX_SECTIONS);
    // n_sections <= 64: no overflow.
    uint64_t table_end = (uint64_t)KILN_FORMAT_HEADER_NBYTES +
                         (uint64_t)info->n_sections * KILN_FORMAT_SECTION_ENTRY_NBYTES;
    KILN_CHECK(table_end <= nbytes, KILN_ERR_CORRUPT,
               "truncated engine: %zu bytes, the header and the section table of %" PRIu32
               " sections need %" PRIu64,
               nbytes, info->n_sections, table_end);

    uint32_t crc = kiln_format_header_crc(p, (size_t)table_end);
    if (crc != info->header_crc32) {
        if (info->file_nbytes != nbytes) {
            return kiln_fail(KILN_ERR_CORRUPT,
                             "header_crc32 0x%08" PRIx32 " does not match the header and section "
                             "table (computed 0x%08" PRIx32 "), and file_nbytes %" PRIu64
                             " differs from the %zu bytes given: the engine is damaged",
                             info->header_crc32, crc, info->file_nbytes, nbytes);
        }
        return kiln_fail(KILN_ERR_CORRUPT,
                         "header_crc32 0x%08" PRIx32 " does not match the header and section "
                         "table (computed 0x%08" PRIx32 "): the engine is damaged",
                         info->header_crc32, crc);
    }
    KILN_CHECK(info->file_nbytes >= nbytes, KILN_ERR_CORRUPT,
               "file_nbytes %" PRIu64 " but %zu bytes were given: %" PRIu64
               " trailing bytes after the engine",
               info->file_nbytes, nbytes, (uint64_t)nbytes - info->file_nbytes);
    KILN_CHECK(info->file_nbytes <= nbytes, KILN_ERR_CORRUPT,
               "truncated engine: file_nbytes is %" PRIu64 " but only %zu bytes were given",
               info->file_nbytes, nbytes);
    KILN_CHECK((info->flags & ~KILN_FORMAT_KNOWN_FLAGS) == 0, KILN_ERR_VERSION,
               "flags 0x%08" PRIx32 " has bits this Kiln (%s) does not know (0x%08" PRIx32
               "): the engine needs a newer Kiln",
               info->flags, KILN_VERSION_STRING, info->flags & ~KILN_FORMAT_KNOWN_FLAGS);
    return KILN_OK;
}

static kiln_status parse_sections(const uint8_t *p, size_t nbytes, kiln_format_info *info) {
    uint8_t seen[(KILN_SECTION_KIND_MAX + 1) / 8] = {0};
    uint64_t prev_end = (uint64_t)KILN_FORMAT_HEADER_NBYTES +
                        (uint64_t)info->n_sections * KILN_FORMAT_SECTION_ENTRY_NBYTES;
    int32_t prev = -1;
    for (int k = 0; k < KILN_SECTION_KIND_COUNT; k++) info->by_kind[k] = -1;

    for (uint32_t i = 0; i < info->n_sections; i++) {
        const uint8_t *e =
            p + KILN_FORMAT_HEADER_NBYTES + (size_t)i * KILN_FORMAT_SECTION_ENTRY_NBYTES;
        kiln_format_section *s = &info->sections[i];
        s->kind = kiln_rd_u32(e);
        s->flags = kiln_rd_u32(e + 4);
        s->offset = kiln_rd_u64(e + 8);
        s->nbytes = kiln_rd_u64(e + 16);
        s->crc32 = kiln_rd_u32(e + 24);
        s->crc32_calc = 0;
        uint32_t reserved = kiln_rd_u32(e + 28);
        const char *name = kiln_format_section_name(s->kind);

        KILN_CHECK(s->kind != 0 && s->kind <= KILN_SECTION_KIND_MAX, KILN_ERR_CORRUPT,
                   "section %" PRIu32 ": kind %" PRIu32 " is not a valid section kind (1..%d)", i,
                   s->kind, KILN_SECTION_KIND_MAX);
        KILN_CHECK(reserved == 0, KILN_ERR_CORRUPT,
                   "section %" PRIu32 " (%s): reserved field is 0x%08" PRIx32 ", must be 0", i,
                   name, reserved);
        KILN_CHECK((s->flags & ~KILN_SECTION_FLAG_OPTIONAL) == 0, KILN_ERR_CORRUPT,
                   "section %" PRIu32 " (%s): flags 0x%08" PRIx32 " has undefined bits", i, name,
                   s->flags);
        KILN_CHECK(!(seen[s->kind / 8] & (1u << (s->kind % 8))), KILN_ERR_CORRUPT,
                   "section %" PRIu32 ": a second section of kind %" PRIu32
                   " (%s); each kind appears at most once",
                   i, s->kind, name);
        seen[s->kind / 8] |= (uint8_t)(1u << (s->kind % 8));
        if (s->kind < KILN_SECTION_KIND_COUNT) {
            KILN_CHECK(s->flags == 0, KILN_ERR_CORRUPT,
                       "section %" PRIu32 " (%s): flags 0x%08" PRIx32
                       " must be 0 on a section kind this format defines",
                       i, name, s->flags);
            info->by_kind[s->kind] = (int32_t)i;
        } else {
            KILN_CHECK(s->flags & KILN_SECTION_FLAG_OPTIONAL, KILN_ERR_VERSION,
                       "section %" PRIu32 ": kind %" PRIu32
                       " is unknown to this Kiln (%s) and not optional: the engine needs a newer "
                       "Kiln",
                       i, s->kind, KILN_VERSION_STRING);
        }

        uint64_t align = kiln_format_section_align(s->kind);
        KILN_CHECK(s->offset % align == 0, KILN_ERR_CORRUPT,
                   "section %" PRIu32 " (%s): offset %" PRIu64 " is not a multiple of %" PRIu64, i,
                   name, s->offset, align);
        KILN_CHECK(kiln_range_ok(s->offset, s->nbytes, nbytes), KILN_ERR_CORRUPT,
                   "section %" PRIu32 " (%s): offset %" PRIu64 " + nbytes %" PRIu64
                   " lies outside the %zu-byte engine",
                   i, name, s->offset, s->nbytes, nbytes);
        if (prev < 0) {
            KILN_CHECK(s->offset >= prev_end, KILN_ERR_CORRUPT,
                       "section %" PRIu32 " (%s): offset %" PRIu64
                       " overlaps the header and section table, which end at %" PRIu64,
                       i, name, s->offset, prev_end);
        } else {
            const kiln_format_section *ps = &info->sections[prev];
            KILN_CHECK(s->offset >= ps->offset, KILN_ERR_CORRUPT,
                       "section %" PRIu32 " (%s): offset %" PRIu64 " is below section %" PRId32
                       "'s offset %" PRIu64 ": sections must be in increasing offset order",
                       i, name, s->offset, prev, ps->offset);
            KILN_CHECK(s->offset >= prev_end, KILN_ERR_CORRUPT,
                       "section %" PRIu32 " (%s): offset %" PRIu64 " overlaps section %" PRId32
                       " (%s), which ends at %" PRIu64,
                       i, name, s->offset, prev, kiln_format_section_name(ps->kind), prev_end);
        }
        uint64_t expected = 0;
        // prev_end <= nbytes, so aligning it cannot overflow.
        (void)kiln_align_up_u64(prev_end, align, &expected);
        KILN_CHECK(s->offset == expected, KILN_ERR_CORRUPT,
                   "section %" PRIu32 " (%s): offset %" PRIu64 " leaves a gap after offset %" PRIu64
                   "; sections are packed, so it must be %" PRIu64,
                   i, name, s->offset, prev_end, expected);
        for (uint64_t b = prev_end; b < s->offset; b++) {
            KILN_CHECK(p[b] == 0, KILN_ERR_CORRUPT,
                       "padding byte at offset %" PRIu64 " (before section %" PRIu32
                       ") is 0x%02x, must be 0",
                       b, i, p[b]);
        }
        s->crc32_calc = kiln_crc32(0, p + s->offset, (size_t)s->nbytes);
        KILN_CHECK(s->crc32_calc == s->crc32, KILN_ERR_CORRUPT,
                   "section %" PRIu32 " (%s): crc32 0x%08" PRIx32 " does not match its %" PRIu64
                   " bytes at offset %" PRIu64 " (computed 0x%08" PRIx32 "): the engine is damaged",
                   i, name, s->crc32, s->nbytes, s->offset, s->crc32_calc);
        prev_end = s->offset + s->nbytes;
        prev = (int32_t)i;
    }
    KILN_CHECK(prev_end == nbytes, KILN_ERR_CORRUPT,
               "the last section ends at offset %" PRIu64 " but file_nbytes is %zu: %" PRIu64
               " bytes are not in any section",
               prev_end, nbytes, (uint64_t)nbytes - prev_end);
    for (uint32_t k = 1; k < KILN_SECTION_KIND_COUNT; k++) {
        KILN_CHECK(info->by_kind[k] >= 0, KILN_ERR_CORRUPT,
                   "the %s section (kind %" PRIu32 ") is missing", kiln_format_section_name(k), k);
    }
    return KILN_OK;
}

kiln_status kiln_format_parse(const void *data, size_t nbytes, kiln_format_info *out) {
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_format_parse: out is NULL");
    KILN_CHECK(data != NULL || nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_format_parse: data is NULL but nbytes is %zu", nbytes);
    if (data == NULL) data = ""; // nbytes == 0: fails the magic check below
    kiln_format_info info;
    memset(&info, 0, sizeof info);
    KILN_TRY(parse_header(data, nbytes, &info));
    KILN_TRY(parse_sections(data, nbytes, &info));
    *out = info;
    return KILN_OK;
}
