// SPDX-License-Identifier: Apache-2.0
// Kiln engine-format constants. The normative byte layout is docs/format.md; this header holds
// the numbers a reader of an engine needs to recognise one, to know which version it is, and the
// sizes, kinds and caps of format v1 (Python mirrors these; keep the two in step).
//
// Layout in one breath (all integers little-endian):
//   header (40 bytes) | section table (n_sections x 32 bytes) | sections, packed in table order,
//   each aligned to 8 bytes (weights: 64), zero padding between them, the last one ending the file.
#ifndef KILN_FORMAT_H
#define KILN_FORMAT_H

#include "kiln.h"

// The first 8 bytes of every engine. The high byte and the CR LF / SUB bytes catch 7-bit and
// text-mode mangling (the PNG trick).
#define KILN_FORMAT_MAGIC "\x89KLN\r\n\x1a\n"
#define KILN_FORMAT_MAGIC_NBYTES 8

// Format version written by this library, and the newest one it reads. A reader rejects a
// larger version with KILN_ERR_VERSION ("made by a newer Kiln").
#define KILN_FORMAT_VERSION 1

// Alignment of inline weights, relative to the start of the engine.
#define KILN_FORMAT_WEIGHT_ALIGN 64
// Alignment of activation offsets in the arena (the memory plan).
#define KILN_FORMAT_ACTIVATION_ALIGN 64

// --- v1 header: byte offsets of its fields
#define KILN_FORMAT_HEADER_NBYTES 40      // v1 header size (header_nbytes must equal it)
#define KILN_FORMAT_OFF_VERSION 8         // u32 format_version
#define KILN_FORMAT_OFF_HEADER_NBYTES 12  // u32 header_nbytes
#define KILN_FORMAT_OFF_FLAGS 16          // u32 flags (none defined in v1: must be 0)
#define KILN_FORMAT_OFF_N_SECTIONS 20     // u32 n_sections
#define KILN_FORMAT_OFF_FILE_NBYTES 24    // u64 file_nbytes
#define KILN_FORMAT_OFF_WRITER_VERSION 32 // u32 kiln_version() of the writer (informational)
#define KILN_FORMAT_OFF_HEADER_CRC 36     // u32 CRC-32 of header + section table (this field 0)

// Header flag bits this reader knows (none in v1). Any other bit: KILN_ERR_VERSION.
#define KILN_FORMAT_KNOWN_FLAGS 0u

// --- section table entry (32 bytes): u32 kind, u32 flags, u64 offset, u64 nbytes, u32 crc32,
// u32 reserved (0). offset is relative to the start of the engine.
#define KILN_FORMAT_SECTION_ENTRY_NBYTES 32
#define KILN_FORMAT_SECTION_ALIGN 8

typedef enum kiln_section_kind {
    KILN_SECTION_PLAN = 1,      // one plan record (arena size, precision)
    KILN_SECTION_BINDINGS = 2,  // u32 n_inputs, u32 n_outputs, u32 tensor ids
    KILN_SECTION_STRINGS = 3,   // NUL-terminated names and keys; byte 0 is NUL
    KILN_SECTION_TENSORS = 4,   // tensor records
    KILN_SECTION_LAYERS = 5,    // layer records, in execution order
    KILN_SECTION_IDS = 6,       // i32 tensor ids of layer inputs and outputs (-1: absent)
    KILN_SECTION_ATTR_REFS = 7, // attribute refs (kind, count, first value)
    KILN_SECTION_INTS = 8,      // i64 attribute values
    KILN_SECTION_FLOATS = 9,    // f64 attribute values
    KILN_SECTION_WEIGHTS = 10,  // inline weight data, 64-byte aligned
    KILN_SECTION_KIND_COUNT = 11,
} kiln_section_kind;

// Section kinds 1..KILN_SECTION_KIND_MAX are the kind space; kinds beyond this reader's set are
// skipped when flagged optional, else KILN_ERR_VERSION. 0 and larger kinds are corrupt.
#define KILN_SECTION_KIND_MAX 255
#define KILN_SECTION_FLAG_OPTIONAL 0x1u // only on kinds this reader does not know

// --- record sizes (bytes)
#define KILN_FORMAT_PLAN_NBYTES 16
#define KILN_FORMAT_TENSOR_NBYTES 168
#define KILN_FORMAT_LAYER_NBYTES 40
#define KILN_FORMAT_ATTR_REF_NBYTES 16

// --- caps, checked before any allocation sized by the file
#define KILN_FORMAT_MAX_SECTIONS 64
#define KILN_FORMAT_MAX_TENSORS 65536u
#define KILN_FORMAT_MAX_BINDINGS 65536u // inputs, and outputs, each
#define KILN_FORMAT_MAX_LAYERS (1u << 20)
#define KILN_FORMAT_MAX_IDS (1u << 24)
#define KILN_FORMAT_MAX_ATTR_REFS (1u << 23)
#define KILN_FORMAT_MAX_INTS (1u << 24)
#define KILN_FORMAT_MAX_FLOATS (1u << 24)
#define KILN_FORMAT_MAX_ATTR_VALUES 1024u // values in one attribute
#define KILN_FORMAT_MAX_STRINGS_NBYTES (1u << 26)
#define KILN_FORMAT_MAX_NAME_NBYTES 1024u // a name or key, without its NUL
#define KILN_FORMAT_MAX_TAIL 8            // fused tail layers after one head
#define KILN_FORMAT_MAX_DIM (INT64_C(1) << 40)
#define KILN_FORMAT_MAX_TENSOR_NBYTES (UINT64_C(1) << 62)

#endif // KILN_FORMAT_H
