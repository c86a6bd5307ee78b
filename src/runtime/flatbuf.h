// SPDX-License-Identifier: Apache-2.0
// A bounded walk of a flatbuffer against a schema description, for the ExecuTorch files Kiln
// checks before ExecuTorch reads them (src/runtime/pte.c): every offset, vtable, table, vector,
// string and union with the flatbuffer Verifier's rules (inside the buffer, aligned, strings
// NUL-terminated, arithmetic that cannot wrap), and every field the schema marks required present
// (the fields ExecuTorch's writer always writes and its reader dereferences without a check).
#ifndef KILN_RUNTIME_FLATBUF_H
#define KILN_RUNTIME_FLATBUF_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

typedef enum kiln_fb_kind {
    KILN_FB_SCALAR,     // `size` bytes
    KILN_FB_STRING,     // a string
    KILN_FB_VEC_SCALAR, // a vector of `size`-byte scalars
    KILN_FB_VEC_TABLE,  // a vector of tables of type `ref`
    KILN_FB_TABLE,      // a table of type `ref`
    KILN_FB_UNION,      // a union: slot k its type (u8), slot k + 1 its value (union `ref`)
} kiln_fb_kind;

typedef struct kiln_fb_field {
    const char *name;
    uint8_t kind;     // kiln_fb_kind
    uint8_t size;     // scalar or element bytes
    uint8_t required; // a reference field that must be present
    int8_t ref;       // table (or union) index in the schema
} kiln_fb_field;

typedef struct kiln_fb_table {
    const char *name;
    uint32_t n_fields; // fields in declaration order (a union takes two vtable slots)
    const kiln_fb_field *fields;
} kiln_fb_table;

typedef struct kiln_fb_union {
    const char *name;
    uint32_t n_types;    // types 1..n_types (0 is NONE)
    const int8_t *table; // table index of type t at table[t - 1]
} kiln_fb_union;

typedef struct kiln_fb_schema {
    const char *file; // for messages: ".pte"
    const kiln_fb_table *tables;
    const kiln_fb_union *unions;
    int root; // the root table's index
} kiln_fb_schema;

// Walks buf[0, nbytes) from its root offset (the u32 at byte 0). KILN_ERR_CORRUPT names the
// path of the offending field ("ExecutionPlan[0].delegates[1].id"), its offset and the remedy.
kiln_status kiln_fb_check(const kiln_fb_schema *schema, const uint8_t *buf, uint64_t nbytes);

// --- reading a buffer that kiln_fb_check accepted (every position below is then in bounds)

// The root table.
uint64_t kiln_fb_root(const uint8_t *b);
// The position of slot k of the table at t, or 0 when the field is absent.
uint64_t kiln_fb_slot(const uint8_t *b, uint64_t t, uint32_t k);
// What the reference field at `at` points to (a table, vector or string), or 0 when at is 0.
uint64_t kiln_fb_ref(const uint8_t *b, uint64_t at);
// The table (or vector, string) field in slot k of t, or 0 when absent.
uint64_t kiln_fb_ref_field(const uint8_t *b, uint64_t t, uint32_t k);
// A vector's element count (0 for an absent vector, at = 0), and element i of a vector of
// tables.
uint32_t kiln_fb_len(const uint8_t *b, uint64_t vec);
uint64_t kiln_fb_elem(const uint8_t *b, uint64_t vec, uint32_t i);
// A scalar field of t (its default, 0, when absent).
uint64_t kiln_fb_u(const uint8_t *b, uint64_t t, uint32_t k, uint32_t nbytes);
int64_t kiln_fb_i32(const uint8_t *b, uint64_t t, uint32_t k);

#endif // KILN_RUNTIME_FLATBUF_H
