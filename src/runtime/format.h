// SPDX-License-Identifier: Apache-2.0
// Engine format v1 (docs/format.md): little-endian field access that works at any alignment, and
// the structural layer of the loader: header, section table, section bounds, alignment, packing,
// padding and CRCs. src/runtime/load.c decodes and validates the section contents on top of it;
// src/builder/serialize.c writes the same layout; tools/kiln_cli.c prints it.
#ifndef KILN_RUNTIME_FORMAT_H
#define KILN_RUNTIME_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kiln/kiln.h"

// Kiln never writes a format_version above this: a larger value is damage (CORRUPT), not a
// newer format (docs/format.md §5).
#define KILN_FORMAT_VERSION_CAP 255

// --- little-endian access (no alignment assumed)

static inline uint32_t kiln_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t kiln_rd_u64(const uint8_t *p) {
    return (uint64_t)kiln_rd_u32(p) | ((uint64_t)kiln_rd_u32(p + 4) << 32);
}
static inline int64_t kiln_rd_i64(const uint8_t *p) {
    uint64_t u = kiln_rd_u64(p);
    int64_t v;
    // Two's complement reinterpretation without implementation-defined conversion.
    memcpy(&v, &u, sizeof v);
    return v;
}
static inline void kiln_wr_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void kiln_wr_u64(uint8_t *p, uint64_t v) {
    kiln_wr_u32(p, (uint32_t)v);
    kiln_wr_u32(p + 4, (uint32_t)(v >> 32));
}
static inline void kiln_wr_i64(uint8_t *p, int64_t v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    kiln_wr_u64(p, u);
}

// --- the parsed layout

typedef struct kiln_format_section {
    uint32_t kind;   // kiln_section_kind, or an unknown optional kind
    uint32_t flags;  // KILN_SECTION_FLAG_*
    uint64_t offset; // from the start of the engine
    uint64_t nbytes;
    uint32_t crc32;      // stored
    uint32_t crc32_calc; // computed over the section's bytes
} kiln_format_section;

typedef struct kiln_format_info {
    uint32_t format_version;
    uint32_t header_nbytes;
    uint32_t flags;
    uint32_t n_sections;
    uint64_t file_nbytes;
    uint32_t writer_version;
    uint32_t header_crc32;
    kiln_format_section sections[KILN_FORMAT_MAX_SECTIONS]; // table order
    int32_t by_kind[KILN_SECTION_KIND_COUNT]; // index into sections of each known kind; -1: none
} kiln_format_info;

// Checks the structure of engine bytes: magic, version, header fields, header CRC, file size, and
// every section table entry (kind, flags, bounds, alignment, order, packing, zero padding, CRC).
// Every known kind is present exactly once when this returns KILN_OK. Errors:
// KILN_ERR_NOT_ENGINE (fewer than 8 bytes or bad magic), KILN_ERR_VERSION (format_version newer
// than KILN_FORMAT_VERSION, unknown header flags, an unknown required section kind),
// KILN_ERR_CORRUPT (everything else), each with a message naming the field and the value.
kiln_status kiln_format_parse(const void *data, size_t nbytes, kiln_format_info *out);

// Name of a section kind ("tensors", ...), or "unknown".
const char *kiln_format_section_name(uint32_t kind);

// Required alignment of a section of this kind (KILN_FORMAT_WEIGHT_ALIGN for weights, else 8).
uint64_t kiln_format_section_align(uint32_t kind);

// The header CRC: CRC-32 of bytes [0, header_nbytes + n_sections * 32) with the 4 bytes of the
// header_crc32 field read as zero. `nbytes` is that length (the caller checked it is in bounds).
uint32_t kiln_format_header_crc(const uint8_t *data, size_t nbytes);

#endif // KILN_RUNTIME_FORMAT_H
