// SPDX-License-Identifier: Apache-2.0
// The bounded flatbuffer walk (src/runtime/flatbuf.h). Layout rules (flatbuffers' binary format):
// a table starts with an i32 soffset to its vtable (vtable = table - soffset); a vtable is u16
// vtable bytes, u16 table bytes, then one u16 field offset per slot (0: absent); a reference
// field holds a u32 offset from its own position; a vector or string is a u32 count followed by
// its elements (a string also by a NUL). The schema has no recursion, so the walk's depth is the
// schema's.
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/checked.h"
#include "core/status.h"
#include "runtime/flatbuf.h"
#include "runtime/format.h"

#define C_ KILN_ERR_CORRUPT

typedef struct walk {
    const kiln_fb_schema *s;
    const uint8_t *b;
    uint64_t n;
    char path[384]; // where the walk is, for messages
    size_t path_n;
} walk;

static kiln_status bad(walk *w, uint64_t at, const char *what) {
    return kiln_fail(C_,
                     "%s: %s (offset %" PRIu64 ") %s: the file is damaged; re-export it, or the "
                     "file was damaged in transit",
                     w->s->file, w->path, at, what);
}

static size_t push(walk *w, const char *fmt, const char *name, uint64_t index) {
    size_t was = w->path_n;
    int k = snprintf(w->path + was, sizeof w->path - was, fmt, name, index);
    if (k > 0) w->path_n = was + (size_t)k < sizeof w->path ? was + (size_t)k : sizeof w->path - 1;
    return was;
}

static void pop(walk *w, size_t was) {
    w->path_n = was;
    w->path[was] = '\0';
}

static int in(const walk *w, uint64_t at, uint64_t len) { return kiln_range_ok(at, len, w->n); }

// The uoffset stored at `at`: where it points (checked in bounds and 4-aligned).
static kiln_status follow(walk *w, uint64_t at, uint64_t *out) {
    uint32_t o = kiln_rd_u32(w->b + at);
    uint64_t to = at + o;
    if (o < 4 || o > INT32_MAX || to % 4 != 0 || !in(w, to, 4))
        return bad(w, at, "points outside the buffer or to a misaligned place");
    *out = to;
    return KILN_OK;
}

typedef struct tbl {
    uint64_t at, vt;
    uint32_t vsize, tsize;
} tbl;

static kiln_status table_at(walk *w, uint64_t at, tbl *t) {
    if (at % 4 != 0 || !in(w, at, 4)) return bad(w, at, "is a table outside the buffer");
    uint32_t u = kiln_rd_u32(w->b + at);
    int64_t so = u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296;
    int64_t vt = (int64_t)at - so;
    if (vt < 0 || vt % 2 != 0 || !in(w, (uint64_t)vt, 4))
        return bad(w, at, "has its vtable outside the buffer");
    t->at = at;
    t->vt = (uint64_t)vt;
    t->vsize = (uint32_t)w->b[vt] | (uint32_t)w->b[vt + 1] << 8;
    t->tsize = (uint32_t)w->b[vt + 2] | (uint32_t)w->b[vt + 3] << 8;
    if (t->vsize < 4 || t->vsize % 2 != 0 || !in(w, t->vt, t->vsize))
        return bad(w, at, "has a vtable that is not valid");
    if (t->tsize < 4 || !in(w, at, t->tsize)) return bad(w, at, "runs past the buffer");
    return KILN_OK;
}

// The position of slot k (nbytes, aligned to it), or 0 when absent.
static kiln_status slot(walk *w, const tbl *t, uint32_t k, uint32_t nbytes, uint64_t *out) {
    uint32_t v = 4 + 2 * k;
    *out = 0;
    if (v + 2 > t->vsize) return KILN_OK;
    uint32_t off = (uint32_t)w->b[t->vt + v] | (uint32_t)w->b[t->vt + v + 1] << 8;
    if (off == 0) return KILN_OK;
    uint32_t align = nbytes > 8 ? 8 : nbytes;
    if (off < 4 || off + nbytes > t->tsize || (t->at + off) % align != 0)
        return bad(w, t->at + off, "lies outside its table or is misaligned");
    *out = t->at + off;
    return KILN_OK;
}

static kiln_status vector(walk *w, uint64_t at, uint64_t elem, uint64_t *count) {
    uint64_t n = kiln_rd_u32(w->b + at), nbytes;
    uint64_t align = elem > 8 ? 8 : elem;
    if (!kiln_mul_u64(n, elem, &nbytes) || !in(w, at + 4, nbytes) || (at + 4) % align != 0)
        return bad(w, at, "is a vector that runs past the buffer");
    *count = n;
    return KILN_OK;
}

static kiln_status check_table(walk *w, int type, uint64_t at);

static kiln_status check_field(walk *w, const kiln_fb_field *f, const tbl *t, uint32_t k) {
    uint64_t at = 0, to = 0, n = 0;
    size_t was = push(w, ".%s", f->name, 0);
    kiln_status st = KILN_OK;
    switch (f->kind) {
    case KILN_FB_SCALAR: st = slot(w, t, k, f->size, &at); break;
    case KILN_FB_UNION: {
        uint64_t type_at = 0;
        st = slot(w, t, k, 1, &type_at);
        if (st == KILN_OK) st = slot(w, t, k + 1, 4, &at);
        if (st != KILN_OK) break;
        const kiln_fb_union *u = &w->s->unions[f->ref];
        uint32_t type = type_at ? w->b[type_at] : 0;
        if (type == 0 || type > u->n_types) {
            st = bad(w, type_at ? type_at : t->at, "has no valid union type");
        } else if (at == 0) {
            st = bad(w, t->at, "is missing");
        } else if ((st = follow(w, at, &to)) == KILN_OK) {
            st = check_table(w, u->table[type - 1], to);
        }
        break;
    }
    default:
        st = slot(w, t, k, 4, &at);
        if (st != KILN_OK) break;
        if (at == 0) {
            if (f->required) st = bad(w, t->at, "is missing");
            break;
        }
        if ((st = follow(w, at, &to)) != KILN_OK) break;
        if (f->kind == KILN_FB_TABLE) {
            st = check_table(w, f->ref, to);
        } else if (f->kind == KILN_FB_STRING) {
            st = vector(w, to, 1, &n);
            if (st == KILN_OK && (!in(w, to + 4, n + 1) || w->b[to + 4 + n] != 0))
                st = bad(w, to, "is a string without its NUL");
        } else if (f->kind == KILN_FB_VEC_SCALAR) {
            st = vector(w, to, f->size, &n);
        } else {
            st = vector(w, to, 4, &n);
            for (uint64_t i = 0; i < n && st == KILN_OK; i++) {
                uint64_t e = 0;
                size_t was_i = push(w, "%s[%" PRIu64 "]", "", i);
                st = follow(w, to + 4 + 4 * i, &e);
                if (st == KILN_OK) st = check_table(w, f->ref, e);
                if (st == KILN_OK) pop(w, was_i);
            }
        }
        break;
    }
    if (st == KILN_OK) pop(w, was);
    return st;
}

static kiln_status check_table(walk *w, int type, uint64_t at) {
    const kiln_fb_table *d = &w->s->tables[type];
    tbl t;
    KILN_TRY(table_at(w, at, &t));
    for (uint32_t f = 0, k = 0; f < d->n_fields; f++) {
        KILN_TRY(check_field(w, &d->fields[f], &t, k));
        k += d->fields[f].kind == KILN_FB_UNION ? 2 : 1;
    }
    return KILN_OK;
}

kiln_status kiln_fb_check(const kiln_fb_schema *schema, const uint8_t *buf, uint64_t nbytes) {
    walk w;
    memset(&w, 0, sizeof w);
    w.s = schema;
    w.b = buf;
    w.n = nbytes;
    snprintf(w.path, sizeof w.path, "%s", schema->tables[schema->root].name);
    w.path_n = strlen(w.path);
    if (nbytes < 8) return bad(&w, 0, "is too short for a flatbuffer");
    uint64_t root = 0;
    KILN_TRY(follow(&w, 0, &root));
    return check_table(&w, schema->root, root);
}

// --- reading an accepted buffer

uint64_t kiln_fb_root(const uint8_t *b) { return kiln_rd_u32(b); }

uint64_t kiln_fb_slot(const uint8_t *b, uint64_t t, uint32_t k) {
    uint32_t u = kiln_rd_u32(b + t);
    int64_t so = u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296;
    uint64_t vt = (uint64_t)((int64_t)t - so);
    uint32_t vsize = (uint32_t)b[vt] | (uint32_t)b[vt + 1] << 8;
    uint32_t v = 4 + 2 * k;
    if (v + 2 > vsize) return 0;
    uint32_t off = (uint32_t)b[vt + v] | (uint32_t)b[vt + v + 1] << 8;
    return off == 0 ? 0 : t + off;
}

uint64_t kiln_fb_ref(const uint8_t *b, uint64_t at) { return at ? at + kiln_rd_u32(b + at) : 0; }

uint64_t kiln_fb_ref_field(const uint8_t *b, uint64_t t, uint32_t k) {
    return kiln_fb_ref(b, kiln_fb_slot(b, t, k));
}

uint32_t kiln_fb_len(const uint8_t *b, uint64_t vec) { return vec ? kiln_rd_u32(b + vec) : 0; }

uint64_t kiln_fb_elem(const uint8_t *b, uint64_t vec, uint32_t i) {
    return kiln_fb_ref(b, vec + 4 + 4 * (uint64_t)i);
}

uint64_t kiln_fb_u(const uint8_t *b, uint64_t t, uint32_t k, uint32_t nbytes) {
    uint64_t at = kiln_fb_slot(b, t, k);
    if (at == 0) return 0;
    return nbytes == 8 ? kiln_rd_u64(b + at) : nbytes == 4 ? kiln_rd_u32(b + at) : b[at];
}

int64_t kiln_fb_i32(const uint8_t *b, uint64_t t, uint32_t k) {
    uint32_t u = (uint32_t)kiln_fb_u(b, t, k, 4);
    return u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296;
}
