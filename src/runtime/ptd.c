// SPDX-License-Identifier: Apache-2.0
// The .ptd check (kiln_ptd_check, include/kiln/kiln_engine.h): an ExecuTorch FlatTensor data
// file is validated completely before ExecuTorch's own reader (FlatTensorDataMap, which runs no
// flatbuffer Verifier and dereferences what the file says) is given it. Layout
// (executorch/extension/flat_tensor/serialize/flat_tensor.fbs and flat_tensor_header.h):
//
//   [0, 4)     u32 offset of the root table (a flatbuffer: every offset below is from byte 0)
//   [4, 8)     file identifier "FT01"
//   [8, ...)   header: "FH01", u32 length (>= 40), u64 flatbuffer_offset, u64 flatbuffer_size,
//              u64 segment_base_offset, u64 segment_data_size (little-endian)
//   [0, flatbuffer_offset + flatbuffer_size)   the flatbuffer (the header sits in its padding)
//   [segment_base_offset, + segment_data_size) the tensor data; segment offsets are relative
//
//   table FlatTensor { version: uint32; segments: [DataSegment]; named_data: [NamedData]; }
//   table DataSegment { offset: uint64; size: uint64; }
//   table NamedData { key: string; segment_index: uint32; tensor_layout: TensorLayout; }
//   table TensorLayout { scalar_type: int8; sizes: [int32]; dim_order: [uint8]; }
//
// Every offset, size and count is checked with overflow-safe arithmetic against the bytes that
// exist, with the flatbuffer Verifier's rules (offsets in bounds and aligned, vtables and tables
// inside the buffer, strings NUL-terminated), and then the meaning: the header's regions are
// ordered and inside the file, every key is present, non-empty, unique and UTF-8 text, every
// segment index is in range and every segment lies inside the data region, and a tensor layout
// has sizes and a dim_order of the same rank (ExecuTorch reads both without checking).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/utf8.h"
#include "runtime/format.h"

#define C_ KILN_ERR_CORRUPT
#define REMEDY "re-export it, or the file was damaged in transit"

#define PTD_HEADER_AT 8
#define PTD_HEADER_MIN 40u
#define PTD_MIN_NBYTES 64 // ExecuTorch reads a 64-byte head (FlatTensorHeader::kNumHeadBytes)

typedef struct fb {
    const uint8_t *b;
    uint64_t n;        // flatbuffer bytes: [0, n)
    uint64_t file_n;   // bytes of the whole file
    uint64_t seg_base; // segment region [seg_base, seg_base + seg_size)
    uint64_t seg_size;
} fb;

typedef struct table {
    uint64_t at;    // table start
    uint64_t vt;    // its vtable
    uint32_t vsize; // vtable bytes
    uint32_t tsize; // table bytes
} table;

static int aligned(uint64_t at, uint64_t a) { return at % a == 0; }

static kiln_status get_table(const fb *f, uint64_t at, const char *what, table *out) {
    KILN_CHECK(aligned(at, 4) && kiln_range_ok(at, 4, f->n), C_,
               ".ptd: %s table at offset %" PRIu64 " lies outside the %" PRIu64
               "-byte flatbuffer or is misaligned; " REMEDY,
               what, at, f->n);
    uint32_t u = kiln_rd_u32(f->b + at); // soffset_t: the vtable is at table - soffset
    int64_t so = u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296;
    int64_t vt = (int64_t)at - so;
    KILN_CHECK(vt >= 0 && aligned((uint64_t)vt, 2) && kiln_range_ok((uint64_t)vt, 4, f->n), C_,
               ".ptd: %s table at offset %" PRIu64 ": its vtable offset %" PRId64
               " lies outside the flatbuffer; " REMEDY,
               what, at, vt);
    uint32_t vsize = (uint32_t)f->b[vt] | (uint32_t)f->b[vt + 1] << 8;
    uint32_t tsize = (uint32_t)f->b[vt + 2] | (uint32_t)f->b[vt + 3] << 8;
    KILN_CHECK(vsize >= 4 && vsize % 2 == 0 && kiln_range_ok((uint64_t)vt, vsize, f->n), C_,
               ".ptd: %s table at offset %" PRIu64 ": vtable of %" PRIu32
               " bytes at offset %" PRId64 " is not valid; " REMEDY,
               what, at, vsize, vt);
    KILN_CHECK(tsize >= 4 && kiln_range_ok(at, tsize, f->n), C_,
               ".ptd: %s table at offset %" PRIu64 ": its %" PRIu32
               " bytes run past the flatbuffer; " REMEDY,
               what, at, tsize);
    *out = (table){at, (uint64_t)vt, vsize, tsize};
    return KILN_OK;
}

// Position of field `k` (size `nbytes`, aligned to it) in table t, or 0 when absent.
static kiln_status field_at(const fb *f, const table *t, uint32_t k, uint32_t nbytes,
                            const char *what, uint64_t *out) {
    uint32_t slot = 4 + 2 * k;
    *out = 0;
    if (slot + 2 > t->vsize) return KILN_OK;
    uint32_t off = (uint32_t)f->b[t->vt + slot] | (uint32_t)f->b[t->vt + slot + 1] << 8;
    if (off == 0) return KILN_OK;
    KILN_CHECK(off >= 4 && off + nbytes <= t->tsize && aligned(t->at + off, nbytes), C_,
               ".ptd: %s (field %" PRIu32 " at offset %" PRIu64
               ") lies outside its table or is misaligned; " REMEDY,
               what, k, t->at + off);
    *out = t->at + off;
    return KILN_OK;
}

// Follows the uoffset stored at `at` (a reference field or a vector element).
static kiln_status follow(const fb *f, uint64_t at, const char *what, uint64_t *out) {
    uint32_t o = kiln_rd_u32(f->b + at);
    uint64_t to = at + o;
    KILN_CHECK(o >= 4 && o <= INT32_MAX && aligned(to, 4) && kiln_range_ok(to, 4, f->n), C_,
               ".ptd: %s at offset %" PRIu64 " points to offset %" PRIu64 ", outside the %" PRIu64
               "-byte flatbuffer or misaligned; " REMEDY,
               what, at, to, f->n);
    *out = to;
    return KILN_OK;
}

// A vector of `elem`-byte elements at `at`: its count, checked to fit.
static kiln_status vector(const fb *f, uint64_t at, uint64_t elem, const char *what,
                          uint64_t *out_n) {
    uint64_t n = kiln_rd_u32(f->b + at), nbytes;
    KILN_CHECK(kiln_mul_u64(n, elem, &nbytes) && kiln_range_ok(at + 4, nbytes, f->n), C_,
               ".ptd: %s: a vector of %" PRIu64 " elements at offset %" PRIu64
               " runs past the %" PRIu64 "-byte flatbuffer; " REMEDY,
               what, n, at, f->n);
    *out_n = n;
    return KILN_OK;
}

// A required reference field of table t: the position it points to.
static kiln_status required_ref(const fb *f, const table *t, uint32_t k, const char *what,
                                uint64_t *out) {
    uint64_t at;
    KILN_TRY(field_at(f, t, k, 4, what, &at));
    KILN_CHECK(at != 0, C_, ".ptd: %s is missing (table at offset %" PRIu64 "); " REMEDY, what,
               t->at);
    return follow(f, at, what, out);
}

static uint64_t scalar(const fb *f, uint64_t at, uint32_t nbytes) {
    if (at == 0) return 0; // absent: the schema default
    return nbytes == 8 ? kiln_rd_u64(f->b + at) : nbytes == 4 ? kiln_rd_u32(f->b + at) : f->b[at];
}

typedef struct key_ref {
    const char *s;
    uint32_t n;
    uint32_t index;
} key_ref;

static int cmp_key(const void *a, const void *b) {
    const key_ref *x = a, *y = b;
    uint32_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    if (c != 0) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

static kiln_status check_layout(const fb *f, uint64_t i, uint64_t lay_at) {
    char what[64];
    table lt;
    snprintf(what, sizeof what, "named_data[%" PRIu64 "].tensor_layout", i);
    KILN_TRY(get_table(f, lay_at, what, &lt));
    uint64_t sizes_at, order_at, n_sizes = 0, n_order = 0;
    snprintf(what, sizeof what, "named_data[%" PRIu64 "].tensor_layout.sizes", i);
    KILN_TRY(required_ref(f, &lt, 1, what, &sizes_at));
    KILN_TRY(vector(f, sizes_at, 4, what, &n_sizes));
    snprintf(what, sizeof what, "named_data[%" PRIu64 "].tensor_layout.dim_order", i);
    KILN_TRY(required_ref(f, &lt, 2, what, &order_at));
    KILN_TRY(vector(f, order_at, 1, what, &n_order));
    KILN_CHECK(n_sizes == n_order && n_sizes <= 64, C_,
               ".ptd: named_data[%" PRIu64 "].tensor_layout has %" PRIu64 " sizes but %" PRIu64
               " dim_order entries; " REMEDY,
               i, n_sizes, n_order);
    uint64_t seen = 0;
    for (uint64_t d = 0; d < n_sizes; d++) {
        uint32_t sz = kiln_rd_u32(f->b + sizes_at + 4 + 4 * d);
        uint8_t o = f->b[order_at + 4 + d];
        KILN_CHECK(sz <= INT32_MAX, C_,
                   ".ptd: named_data[%" PRIu64 "].tensor_layout.sizes[%" PRIu64
                   "] is negative; " REMEDY,
                   i, d);
        KILN_CHECK(o < n_sizes && !(seen >> o & 1u), C_,
                   ".ptd: named_data[%" PRIu64 "].tensor_layout.dim_order is not a permutation "
                   "of 0..%" PRIu64 "; " REMEDY,
                   i, n_sizes - 1);
        seen |= UINT64_C(1) << o;
    }
    return KILN_OK;
}

static kiln_status check_entries(const fb *f, uint64_t seg_vec, uint64_t n_seg, uint64_t nd_vec,
                                 uint64_t n_nd, key_ref *keys);

static kiln_status check_flatbuffer(const fb *f) {
    uint64_t root = 0;
    table ft;
    KILN_TRY(follow(f, 0, "the root offset", &root));
    KILN_TRY(get_table(f, root, "the FlatTensor", &ft));

    uint64_t ver_at, seg_vec, nd_vec, n_seg = 0, n_nd = 0;
    KILN_TRY(field_at(f, &ft, 0, 4, "FlatTensor.version", &ver_at));
    uint64_t version = scalar(f, ver_at, 4);
    KILN_CHECK(version == 0, C_,
               ".ptd: FlatTensor schema version %" PRIu64
               ": ExecuTorch's reader takes version 0; the file is damaged or was written by a "
               "newer ExecuTorch; re-export it with the ExecuTorch this runtime pins",
               version);
    KILN_TRY(required_ref(f, &ft, 1, "FlatTensor.segments", &seg_vec));
    KILN_TRY(vector(f, seg_vec, 4, "FlatTensor.segments", &n_seg));
    KILN_TRY(required_ref(f, &ft, 2, "FlatTensor.named_data", &nd_vec));
    KILN_TRY(vector(f, nd_vec, 4, "FlatTensor.named_data", &n_nd));
    // n_nd 4-byte slots fit in the buffer, so this allocation is bounded by the file's size.
    size_t keys_nbytes = (size_t)(n_nd > 0 ? n_nd : 1) * sizeof(key_ref);
    key_ref *keys = kiln_malloc(keys_nbytes, KILN_ALIGN);
    KILN_CHECK(keys != NULL, KILN_ERR_NO_MEMORY,
               "out of memory checking a .ptd of %" PRIu64 " keys", n_nd);
    kiln_status st = check_entries(f, seg_vec, n_seg, nd_vec, n_nd, keys);
    kiln_free(keys, keys_nbytes);
    return st;
}

static kiln_status check_entries(const fb *f, uint64_t seg_vec, uint64_t n_seg, uint64_t nd_vec,
                                 uint64_t n_nd, key_ref *keys) {
    char what[64];
    for (uint64_t i = 0; i < n_seg; i++) {
        uint64_t at = 0, off_at, size_at;
        table st;
        snprintf(what, sizeof what, "segments[%" PRIu64 "]", i);
        KILN_TRY(follow(f, seg_vec + 4 + 4 * i, what, &at));
        KILN_TRY(get_table(f, at, what, &st));
        KILN_TRY(field_at(f, &st, 0, 8, what, &off_at));
        KILN_TRY(field_at(f, &st, 1, 8, what, &size_at));
        uint64_t off = scalar(f, off_at, 8), size = scalar(f, size_at, 8);
        KILN_CHECK(kiln_range_ok(off, size, f->seg_size), C_,
                   ".ptd: segments[%" PRIu64 "] (offset %" PRIu64 ", %" PRIu64
                   " bytes) lies outside the %" PRIu64
                   "-byte data region the header declares; " REMEDY,
                   i, off, size, f->seg_size);
    }
    for (uint64_t i = 0; i < n_nd; i++) {
        uint64_t at = 0, key_at, idx_at, lay_at, n_key = 0;
        table nt;
        snprintf(what, sizeof what, "named_data[%" PRIu64 "]", i);
        KILN_TRY(follow(f, nd_vec + 4 + 4 * i, what, &at));
        KILN_TRY(get_table(f, at, what, &nt));
        snprintf(what, sizeof what, "named_data[%" PRIu64 "].key", i);
        KILN_TRY(required_ref(f, &nt, 0, what, &key_at));
        KILN_TRY(vector(f, key_at, 1, what, &n_key));
        KILN_CHECK(kiln_range_ok(key_at + 4, n_key + 1, f->n) && f->b[key_at + 4 + n_key] == 0, C_,
                   ".ptd: %s at offset %" PRIu64 " is not NUL-terminated; " REMEDY, what, key_at);
        const char *key = (const char *)f->b + key_at + 4;
        size_t bad = kiln_utf8_check(key, (size_t)n_key);
        KILN_CHECK(n_key > 0 && n_key <= KILN_FORMAT_MAX_NAME_NBYTES, C_,
                   ".ptd: %s is %" PRIu64 " bytes long (1..%u); " REMEDY, what, n_key,
                   KILN_FORMAT_MAX_NAME_NBYTES);
        KILN_CHECK(bad == n_key, C_,
                   ".ptd: %s ('%.80s') is not UTF-8 text: byte %zu (0x%02x) is %s; " REMEDY, what,
                   key, bad, (unsigned char)key[bad], kiln_utf8_problem(key + bad, n_key - bad));
        keys[i] = (key_ref){key, (uint32_t)n_key, (uint32_t)i};
        snprintf(what, sizeof what, "named_data[%" PRIu64 "].segment_index", i);
        KILN_TRY(field_at(f, &nt, 1, 4, what, &idx_at));
        uint64_t idx = scalar(f, idx_at, 4);
        KILN_CHECK(idx < n_seg, C_,
                   ".ptd: named_data[%" PRIu64 "] ('%.80s') names segment %" PRIu64
                   ", but the file has %" PRIu64 " segments; " REMEDY,
                   i, key, idx, n_seg);
        snprintf(what, sizeof what, "named_data[%" PRIu64 "].tensor_layout", i);
        KILN_TRY(field_at(f, &nt, 2, 4, what, &lay_at));
        if (lay_at != 0) {
            uint64_t lay = 0;
            KILN_TRY(follow(f, lay_at, what, &lay));
            KILN_TRY(check_layout(f, i, lay));
        }
    }
    if (n_nd > 1) {
        qsort(keys, (size_t)n_nd, sizeof *keys, cmp_key);
        for (uint64_t i = 1; i < n_nd; i++) {
            KILN_CHECK(keys[i].n != keys[i - 1].n || memcmp(keys[i].s, keys[i - 1].s, keys[i].n),
                       C_,
                       ".ptd: named_data[%" PRIu32 "] and [%" PRIu32
                       "] have the same key '%.80s'; " REMEDY,
                       keys[i - 1].index, keys[i].index, keys[i].s);
        }
    }
    return KILN_OK;
}

// head: the file's first head_n bytes (at least the whole flatbuffer, once the header says how
// long it is); file_n: the size of the whole file.
static kiln_status check_ptd(const uint8_t *head, size_t head_n, uint64_t file_n) {
    KILN_CHECK(file_n >= PTD_MIN_NBYTES && head_n >= PTD_MIN_NBYTES, C_,
               ".ptd: %" PRIu64 " bytes is too short for an ExecuTorch data file (at least %d); "
               "pass the .ptd written together with the .pte",
               file_n, PTD_MIN_NBYTES);
    KILN_CHECK(memcmp(head + 4, "FT01", 4) == 0, C_,
               ".ptd: file identifier %02x %02x %02x %02x, expected \"FT01\": not an ExecuTorch "
               ".ptd data file (or a damaged one); pass the .ptd written together with the .pte",
               head[4], head[5], head[6], head[7]);
    KILN_CHECK(memcmp(head + PTD_HEADER_AT, "FH01", 4) == 0, C_,
               ".ptd: header magic %02x %02x %02x %02x at offset 8, expected \"FH01\"; " REMEDY,
               head[8], head[9], head[10], head[11]);
    uint32_t hlen = kiln_rd_u32(head + 12);
    uint64_t fb_off = kiln_rd_u64(head + 16), fb_size = kiln_rd_u64(head + 24);
    uint64_t seg_base = kiln_rd_u64(head + 32), seg_size = kiln_rd_u64(head + 40);
    uint64_t fb_end = 0, seg_end = 0;
    KILN_CHECK(hlen >= PTD_HEADER_MIN && (uint64_t)PTD_HEADER_AT + hlen <= fb_off, C_,
               ".ptd: header length %" PRIu32 " does not fit before flatbuffer_offset %" PRIu64
               " (it is at least %u); " REMEDY,
               hlen, fb_off, PTD_HEADER_MIN);
    KILN_CHECK(kiln_add_u64(fb_off, fb_size, &fb_end) && fb_end <= file_n, C_,
               ".ptd: flatbuffer_offset %" PRIu64 " + flatbuffer_size %" PRIu64
               " runs past the %" PRIu64 "-byte file; " REMEDY,
               fb_off, fb_size, file_n);
    KILN_CHECK(seg_base >= fb_end, C_,
               ".ptd: segment_base_offset %" PRIu64
               " lies inside the flatbuffer, which ends at %" PRIu64 "; " REMEDY,
               seg_base, fb_end);
    KILN_CHECK(kiln_add_u64(seg_base, seg_size, &seg_end) && seg_end <= file_n, C_,
               ".ptd: segment_base_offset %" PRIu64 " + segment_data_size %" PRIu64
               " runs past the %" PRIu64 "-byte file; " REMEDY,
               seg_base, seg_size, file_n);
    KILN_CHECK(head_n >= fb_end, KILN_ERR_INTERNAL,
               ".ptd check: only %zu of %" PRIu64 " bytes read", head_n, fb_end);
    fb f = {head, fb_end, file_n, seg_base, seg_size};
    return check_flatbuffer(&f);
}

kiln_status kiln_ptd_check(const void *data, size_t nbytes) {
    KILN_CHECK(data != NULL || nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_ptd_check: data is NULL but nbytes = %zu", nbytes);
    if (data == NULL) data = "";
    return check_ptd(data, nbytes, nbytes);
}

kiln_status kiln_ptd_check_file(const char *path) {
    KILN_CHECK(path != NULL, KILN_ERR_INVALID_ARG, "kiln_ptd_check_file: path is NULL");
    FILE *fp = fopen(path, "rb");
    KILN_CHECK(fp != NULL, KILN_ERR_IO, "cannot open the data file '%s'", path);
    uint8_t head[PTD_MIN_NBYTES];
    long end = -1;
    size_t got = fread(head, 1, sizeof head, fp);
    int read_error = ferror(fp);
    if (fseek(fp, 0, SEEK_END) == 0) end = ftell(fp);
    kiln_status st;
    if (read_error) {
        st = kiln_fail(KILN_ERR_IO, "cannot read the data file '%s' (a directory?)", path);
    } else if (end < 0) {
        st = kiln_fail(KILN_ERR_IO, "cannot read the size of the data file '%s'", path);
    } else if (got < sizeof head) {
        st = check_ptd(head, got, (uint64_t)end); // too short: fails with its own message
    } else {
        // The flatbuffer only (not the tensor data), once its size is checked against the file.
        uint64_t fb_end = 0;
        if (!kiln_add_u64(kiln_rd_u64(head + 16), kiln_rd_u64(head + 24), &fb_end) ||
            fb_end > (uint64_t)end || fb_end < sizeof head || fb_end > SIZE_MAX) {
            st = check_ptd(head, sizeof head, (uint64_t)end); // fails on the header's sizes
        } else {
            uint8_t *buf = kiln_malloc((size_t)fb_end, KILN_ALIGN);
            if (buf == NULL) {
                st = kiln_fail(KILN_ERR_NO_MEMORY,
                               "out of memory reading the %" PRIu64 "-byte flatbuffer of '%s'",
                               fb_end, path);
            } else if (fseek(fp, 0, SEEK_SET) != 0 ||
                       fread(buf, 1, (size_t)fb_end, fp) != (size_t)fb_end) {
                st = kiln_fail(KILN_ERR_IO, "cannot read the data file '%s'", path);
                kiln_free(buf, (size_t)fb_end);
                buf = NULL;
            } else {
                st = check_ptd(buf, (size_t)fb_end, (uint64_t)end);
            }
            if (buf != NULL) kiln_free(buf, (size_t)fb_end);
        }
    }
    fclose(fp);
    if (st == KILN_ERR_CORRUPT) {
        char msg[3072];
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        return kiln_fail(st, "data file '%s': %s", path, msg);
    }
    return st;
}
