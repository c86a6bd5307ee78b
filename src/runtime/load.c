// SPDX-License-Identifier: Apache-2.0
// The untrusted boundary: engine bytes -> a validated plan (docs/format.md §4-5). The structure
// (header, section table, CRCs) is checked by src/runtime/format.c; this file decodes every
// section into kiln_malloc'd arrays (caps checked before any allocation sized by the file) and
// validates every field and every cross-reference, so that the runtime may execute the plan
// without re-checking. Nothing in the plan points into the input bytes.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/utf8.h"
#include "runtime/format.h"
#include "runtime/kernel.h"
#include "runtime/load.h"

_Static_assert(KILN_FORMAT_MAX_TAIL == KILN_MAX_TAIL, "tail cap must match the kernel ABI");
_Static_assert(KILN_FORMAT_MAX_SECTIONS == 64, "kiln_format_info holds 64 sections");

#define C_ KILN_ERR_CORRUPT

// Loader scratch: per-tensor dataflow state, released on every path.
typedef struct load_state {
    const uint8_t *data;
    const kiln_format_info *info;
    kiln_plan p;
    uint8_t *defined;       // n_tensors: tensor has a value (inputs, weights, written outputs)
    int32_t *def_layer;     // n_tensors: layer that writes it (-1: inputs and weights)
    int32_t *last_use;      // n_tensors: last layer that reads it (or writes it, for tails)
    kiln_value_desc *descs; // n_tensors
} load_state;

static const uint8_t *section(const load_state *st, uint32_t kind, uint64_t *out_nbytes) {
    const kiln_format_section *s = &st->info->sections[st->info->by_kind[kind]];
    *out_nbytes = s->nbytes;
    return st->data + s->offset;
}

// Allocates n elements of `size` bytes (n may be 0: a unique pointer, freed with size 0).
static kiln_status alloc_array(void **out, uint64_t n, size_t size, size_t align,
                               const char *what) {
    uint64_t nbytes;
    KILN_CHECK(kiln_mul_u64(n, size, &nbytes) && nbytes <= SIZE_MAX, KILN_ERR_NO_MEMORY,
               "out of memory: %s needs %" PRIu64 " x %zu bytes", what, n, size);
    *out = kiln_malloc((size_t)nbytes, align);
    KILN_CHECK(*out != NULL, KILN_ERR_NO_MEMORY,
               "out of memory allocating %" PRIu64 " bytes for the %s", nbytes, what);
    return KILN_OK;
}

static kiln_status section_count(const load_state *st, uint32_t kind, uint64_t record_nbytes,
                                 uint64_t cap, uint64_t *out_n) {
    uint64_t nbytes;
    (void)section(st, kind, &nbytes);
    const char *name = kiln_format_section_name(kind);
    KILN_CHECK(nbytes % record_nbytes == 0, C_,
               "%s section: nbytes %" PRIu64 " is not a multiple of its %" PRIu64 "-byte records",
               name, nbytes, record_nbytes);
    KILN_CHECK(nbytes / record_nbytes <= cap, C_,
               "%s section: %" PRIu64 " records exceed the cap of %" PRIu64, name,
               nbytes / record_nbytes, cap);
    *out_n = nbytes / record_nbytes;
    return KILN_OK;
}

// The string at `offset` of the strings section: in range, NUL-terminated, at most the name cap.
static kiln_status check_string(const kiln_plan *p, uint32_t offset, const char *what,
                                uint32_t index, const char *field) {
    KILN_CHECK(offset < p->strings_nbytes, C_,
               "%s %" PRIu32 ": %s %" PRIu32 " is outside the %" PRIu64 "-byte strings section",
               what, index, field, offset, p->strings_nbytes);
    // Scan at most cap + 1 bytes (a long string referenced by every tensor must not make the
    // load quadratic). The section ends with NUL, so a shorter scan always finds one.
    size_t avail = (size_t)(p->strings_nbytes - offset);
    if (avail > KILN_FORMAT_MAX_NAME_NBYTES + 1) avail = KILN_FORMAT_MAX_NAME_NBYTES + 1;
    const char *s = p->strings + offset;
    const char *nul = memchr(s, '\0', avail);
    KILN_CHECK(nul != NULL, C_,
               "%s %" PRIu32 ": %s at string offset %" PRIu32 " is longer than the cap of %u bytes",
               what, index, field, offset, KILN_FORMAT_MAX_NAME_NBYTES);
    // Every string of the section is valid text (decode_strings), so a reference that starts on
    // a character (not on a UTF-8 continuation byte) is valid text too.
    KILN_CHECK(((unsigned char)s[0] & 0xC0) != 0x80, C_,
               "%s %" PRIu32 ": %s at string offset %" PRIu32
               " starts inside a UTF-8 character (byte 0x%02x)",
               what, index, field, offset, (unsigned char)s[0]);
    return KILN_OK;
}

// --- plan, strings, pools

static kiln_status decode_plan_record(load_state *st) {
    uint64_t nbytes;
    const uint8_t *s = section(st, KILN_SECTION_PLAN, &nbytes);
    KILN_CHECK(nbytes == KILN_FORMAT_PLAN_NBYTES, C_,
               "plan section: nbytes %" PRIu64 ", expected %d", nbytes, KILN_FORMAT_PLAN_NBYTES);
    st->p.arena_nbytes = kiln_rd_u64(s);
    st->p.precision = kiln_rd_u32(s + 8);
    uint32_t reserved = kiln_rd_u32(s + 12);
    KILN_CHECK(
        st->p.arena_nbytes <= KILN_FORMAT_MAX_TENSOR_NBYTES && st->p.arena_nbytes <= SIZE_MAX, C_,
        "plan: arena_nbytes %" PRIu64 " exceeds the cap of 2^62 bytes", st->p.arena_nbytes);
    KILN_CHECK(st->p.precision <= KILN_PRECISION_BF16, C_,
               "plan: precision %" PRIu32 " is not valid (0 fp32, 1 fp16, 2 bf16)",
               st->p.precision);
    KILN_CHECK(reserved == 0, C_, "plan: reserved field is 0x%08" PRIx32 ", must be 0", reserved);
    return KILN_OK;
}

static kiln_status decode_strings(load_state *st) {
    uint64_t nbytes;
    const uint8_t *s = section(st, KILN_SECTION_STRINGS, &nbytes);
    KILN_CHECK(nbytes >= 1 && nbytes <= KILN_FORMAT_MAX_STRINGS_NBYTES, C_,
               "strings section: nbytes %" PRIu64 " is out of range (1..%u)", nbytes,
               KILN_FORMAT_MAX_STRINGS_NBYTES);
    KILN_CHECK(s[0] == 0, C_, "strings section: byte 0 is 0x%02x, must be NUL (the empty name)",
               s[0]);
    KILN_CHECK(s[nbytes - 1] == 0, C_,
               "strings section: last byte is 0x%02x, must be NUL (every string is terminated)",
               s[nbytes - 1]);
    // Every string is UTF-8 text without control characters (src/core/utf8.h), so names and keys
    // can be printed, logged and put in JSON as they are.
    for (uint64_t at = 1; at < nbytes;) {
        const char *str = (const char *)s + at;
        size_t len = strlen(str); // the section ends with NUL
        size_t bad = kiln_utf8_check(str, len);
        KILN_CHECK(bad == len, C_,
                   "strings section: the string at offset %" PRIu64 " ('%.80s') is not UTF-8 text: "
                   "byte 0x%02x at offset %" PRIu64
                   " is %s; names and keys are UTF-8 without control characters",
                   at, str, (unsigned char)str[bad], at + bad,
                   kiln_utf8_problem(str + bad, len - bad));
        at += len + 1;
    }
    KILN_TRY(alloc_array((void **)&st->p.strings, nbytes, 1, 1, "strings"));
    st->p.strings_nbytes = nbytes;
    memcpy(st->p.strings, s, (size_t)nbytes);
    return KILN_OK;
}

static kiln_status decode_pools(load_state *st, uint64_t n_tensors) {
    kiln_plan *p = &st->p;
    uint64_t n = 0, nbytes = 0;
    const uint8_t *s;

    KILN_TRY(section_count(st, KILN_SECTION_INTS, 8, KILN_FORMAT_MAX_INTS, &n));
    KILN_TRY(alloc_array((void **)&p->ints, n, sizeof(int64_t), KILN_ALIGN, "ints pool"));
    p->n_ints = n;
    s = section(st, KILN_SECTION_INTS, &nbytes);
    for (uint64_t i = 0; i < n; i++) p->ints[i] = kiln_rd_i64(s + 8 * i);

    KILN_TRY(section_count(st, KILN_SECTION_FLOATS, 8, KILN_FORMAT_MAX_FLOATS, &n));
    KILN_TRY(alloc_array((void **)&p->floats, n, sizeof(double), KILN_ALIGN, "floats pool"));
    p->n_floats = n;
    s = section(st, KILN_SECTION_FLOATS, &nbytes);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t u = kiln_rd_u64(s + 8 * i);
        memcpy(&p->floats[i], &u, sizeof u);
    }

    KILN_TRY(section_count(st, KILN_SECTION_ATTR_REFS, KILN_FORMAT_ATTR_REF_NBYTES,
                           KILN_FORMAT_MAX_ATTR_REFS, &n));
    KILN_TRY(alloc_array((void **)&p->attr_refs, n, sizeof(kiln_attr_ref), KILN_ALIGN,
                         "attribute refs"));
    p->n_attr_refs = (uint32_t)n;
    s = section(st, KILN_SECTION_ATTR_REFS, &nbytes);
    for (uint32_t i = 0; i < p->n_attr_refs; i++) {
        const uint8_t *r = s + (size_t)i * KILN_FORMAT_ATTR_REF_NBYTES;
        kiln_attr_ref *a = &p->attr_refs[i];
        a->kind = kiln_rd_u32(r);
        a->n = kiln_rd_u32(r + 4);
        a->begin = kiln_rd_u64(r + 8);
        KILN_CHECK(a->kind == KILN_ATTR_INTS || a->kind == KILN_ATTR_FLOATS, C_,
                   "attr_ref %" PRIu32 ": kind %" PRIu32 " is not valid (1 ints, 2 floats)", i,
                   a->kind);
        KILN_CHECK(a->n <= KILN_FORMAT_MAX_ATTR_VALUES, C_,
                   "attr_ref %" PRIu32 ": n %" PRIu32 " exceeds the cap of %u values", i, a->n,
                   KILN_FORMAT_MAX_ATTR_VALUES);
        uint64_t pool = a->kind == KILN_ATTR_INTS ? p->n_ints : p->n_floats;
        KILN_CHECK(kiln_range_ok(a->begin, a->n, pool), C_,
                   "attr_ref %" PRIu32 ": begin %" PRIu64 " + n %" PRIu32
                   " lies outside the %s pool of %" PRIu64 " values",
                   i, a->begin, a->n, a->kind == KILN_ATTR_INTS ? "ints" : "floats", pool);
    }

    KILN_TRY(section_count(st, KILN_SECTION_IDS, 4, KILN_FORMAT_MAX_IDS, &n));
    KILN_TRY(alloc_array((void **)&p->ids, n, sizeof(int32_t), KILN_ALIGN, "ids"));
    p->n_ids = (uint32_t)n;
    s = section(st, KILN_SECTION_IDS, &nbytes);
    for (uint32_t i = 0; i < p->n_ids; i++) {
        uint32_t u = kiln_rd_u32(s + 4 * (size_t)i);
        int32_t v = u <= INT32_MAX ? (int32_t)u : (u == UINT32_MAX ? -1 : INT32_MIN);
        KILN_CHECK(v >= -1 && (int64_t)v < (int64_t)n_tensors, C_,
                   "ids[%" PRIu32 "]: %" PRId64 " is not a tensor id (0..%" PRIu64
                   ") or -1 (absent)",
                   i, u <= INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296, n_tensors);
        p->ids[i] = v;
    }
    return KILN_OK;
}

static kiln_status decode_bindings(load_state *st, uint64_t n_tensors) {
    kiln_plan *p = &st->p;
    uint64_t nbytes;
    const uint8_t *s = section(st, KILN_SECTION_BINDINGS, &nbytes);
    KILN_CHECK(nbytes >= 8, C_, "bindings section: nbytes %" PRIu64 " is below 8", nbytes);
    uint32_t n_in = kiln_rd_u32(s), n_out = kiln_rd_u32(s + 4);
    KILN_CHECK(n_in <= KILN_FORMAT_MAX_BINDINGS, C_,
               "bindings: n_inputs %" PRIu32 " exceeds the cap of %u", n_in,
               KILN_FORMAT_MAX_BINDINGS);
    KILN_CHECK(n_out <= KILN_FORMAT_MAX_BINDINGS, C_,
               "bindings: n_outputs %" PRIu32 " exceeds the cap of %u", n_out,
               KILN_FORMAT_MAX_BINDINGS);
    KILN_CHECK(n_out >= 1, C_, "bindings: n_outputs is 0; an engine has at least one output");
    uint64_t expect = 8 + 4 * ((uint64_t)n_in + n_out);
    KILN_CHECK(nbytes == expect, C_,
               "bindings section: nbytes %" PRIu64 ", but n_inputs %" PRIu32
               " and n_outputs %" PRIu32 " need %" PRIu64,
               nbytes, n_in, n_out, expect);
    KILN_TRY(alloc_array((void **)&p->inputs, n_in, sizeof(uint32_t), KILN_ALIGN, "inputs"));
    p->n_inputs = n_in;
    KILN_TRY(alloc_array((void **)&p->outputs, n_out, sizeof(uint32_t), KILN_ALIGN, "outputs"));
    p->n_outputs = n_out;
    for (uint32_t i = 0; i < n_in + n_out; i++) {
        uint32_t t = kiln_rd_u32(s + 8 + 4 * (size_t)i);
        int is_in = i < n_in;
        uint32_t idx = is_in ? i : i - n_in;
        KILN_CHECK(t < n_tensors, C_,
                   "bindings: %s %" PRIu32 " is tensor %" PRIu32 ", but there are %" PRIu64
                   " tensors",
                   is_in ? "input" : "output", idx, t, n_tensors);
        if (is_in)
            p->inputs[idx] = t;
        else
            p->outputs[idx] = t;
    }
    return KILN_OK;
}

// --- tensors

static const char *kind_name(uint32_t kind) {
    switch (kind) {
    case KILN_TENSOR_INPUT: return "input";
    case KILN_TENSOR_OUTPUT: return "output";
    case KILN_TENSOR_ACTIVATION: return "activation";
    case KILN_TENSOR_WEIGHT: return "weight";
    case KILN_TENSOR_STATE: return "state";
    default: return "invalid";
    }
}

static const char *article(uint32_t kind) {
    return kind == KILN_TENSOR_OUTPUT || kind == KILN_TENSOR_WEIGHT ? "a" : "an";
}

static kiln_status check_tensor(const kiln_plan *p, uint32_t i, const uint8_t *r) {
    kiln_plan_tensor *t = &p->tensors[i];
    t->kind = kiln_rd_u32(r);
    t->dtype = kiln_rd_u32(r + 4);
    t->shape.rank = kiln_rd_u32(r + 8);
    t->name = kiln_rd_u32(r + 12);
    t->binding = kiln_rd_u32(r + 16);
    t->key = kiln_rd_u32(r + 20);
    t->offset = kiln_rd_u64(r + 24);
    t->nbytes = kiln_rd_u64(r + 32);
    KILN_CHECK(t->kind >= KILN_TENSOR_INPUT && t->kind <= KILN_TENSOR_STATE, C_,
               "tensor %" PRIu32 ": kind %" PRIu32
               " is not valid (1 input, 2 output, 3 activation, 4 weight, 5 state)",
               i, t->kind);
    KILN_CHECK(kiln_dtype_valid(t->dtype), C_,
               "tensor %" PRIu32 ": dtype %" PRIu32 " is not a valid dtype (1..%d)", i, t->dtype,
               KILN_DTYPE_COUNT - 1);
    KILN_CHECK(t->shape.rank <= KILN_MAX_RANK, C_,
               "tensor %" PRIu32 ": rank %" PRIu32 " exceeds the maximum rank %d", i, t->shape.rank,
               KILN_MAX_RANK);
    for (uint32_t d = 0; d < KILN_MAX_RANK; d++) {
        int64_t lo = kiln_rd_i64(r + 40 + 8 * d), hi = kiln_rd_i64(r + 104 + 8 * d);
        if (d >= t->shape.rank) {
            KILN_CHECK(lo == 0 && hi == 0, C_,
                       "tensor %" PRIu32 ": dim_min[%" PRIu32 "] / dim_max[%" PRIu32
                       "] are %" PRId64 " / %" PRId64 " beyond rank %" PRIu32 ", must be 0",
                       i, d, d, lo, hi, t->shape.rank);
        } else {
            KILN_CHECK(lo >= 0 && lo <= hi && hi <= KILN_FORMAT_MAX_DIM, C_,
                       "tensor %" PRIu32 ": dim %" PRIu32 " range [%" PRId64 ", %" PRId64
                       "] is not valid (need 0 <= dim_min <= dim_max <= 2^40)",
                       i, d, lo, hi);
        }
        t->shape.min[d] = lo;
        t->shape.max[d] = hi;
    }
    uint64_t numel = 1, max_nbytes;
    for (uint32_t d = 0; d < t->shape.rank; d++) {
        KILN_CHECK(kiln_mul_u64(numel, (uint64_t)t->shape.max[d], &numel), C_,
                   "tensor %" PRIu32 ": element count at the largest shape overflows", i);
    }
    KILN_CHECK(kiln_mul_u64(numel, kiln_dtype_size(t->dtype), &max_nbytes) &&
                   max_nbytes <= KILN_FORMAT_MAX_TENSOR_NBYTES,
               C_, "tensor %" PRIu32 ": the largest shape needs more than 2^62 bytes", i);
    KILN_TRY(check_string(p, t->name, "tensor", i, "name"));

    int is_binding = t->kind == KILN_TENSOR_INPUT || t->kind == KILN_TENSOR_OUTPUT;
    if (is_binding) {
        int is_in = t->kind == KILN_TENSOR_INPUT;
        uint32_t n = is_in ? p->n_inputs : p->n_outputs;
        const uint32_t *ids = is_in ? p->inputs : p->outputs;
        KILN_CHECK(t->binding < n && ids[t->binding] == i, C_,
                   "tensor %" PRIu32 " (%s): binding %" PRIu32
                   " does not name it in the bindings section (%" PRIu32 " %ss)",
                   i, kind_name(t->kind), t->binding, n, kind_name(t->kind));
        KILN_CHECK(p->strings[t->name] != '\0', C_,
                   "tensor %" PRIu32 " (%s %" PRIu32 "): name is empty; bindings are named", i,
                   kind_name(t->kind), t->binding);
    } else if (t->kind != KILN_TENSOR_STATE) { // a state's binding: checked in check_states
        KILN_CHECK(t->binding == 0, C_,
                   "tensor %" PRIu32 " (%s): binding %" PRIu32 " must be 0 (not an input/output)",
                   i, kind_name(t->kind), t->binding);
    }
    KILN_CHECK(
        t->kind == KILN_TENSOR_WEIGHT || t->kind == KILN_TENSOR_STATE || t->key == KILN_NO_KEY, C_,
        "tensor %" PRIu32 " (%s): key %" PRIu32
        " must be 0xffffffff (only weights and states have keys)",
        i, kind_name(t->kind), t->key);

    switch (t->kind) {
    case KILN_TENSOR_INPUT:
    case KILN_TENSOR_OUTPUT:
        KILN_CHECK(t->offset == 0 && t->nbytes == 0, C_,
                   "tensor %" PRIu32 " (%s): offset %" PRIu64 " and nbytes %" PRIu64
                   " must be 0 (caller memory)",
                   i, kind_name(t->kind), t->offset, t->nbytes);
        break;
    case KILN_TENSOR_ACTIVATION:
        KILN_CHECK(t->offset % KILN_FORMAT_ACTIVATION_ALIGN == 0, C_,
                   "tensor %" PRIu32 " (activation): arena offset %" PRIu64
                   " is not a multiple of %d",
                   i, t->offset, KILN_FORMAT_ACTIVATION_ALIGN);
        KILN_CHECK(t->nbytes >= max_nbytes, C_,
                   "tensor %" PRIu32 " (activation): nbytes %" PRIu64 " is below the %" PRIu64
                   " bytes of its largest shape",
                   i, t->nbytes, max_nbytes);
        KILN_CHECK(kiln_range_ok(t->offset, t->nbytes, p->arena_nbytes), C_,
                   "tensor %" PRIu32 " (activation): arena offset %" PRIu64 " + nbytes %" PRIu64
                   " lies outside arena_nbytes %" PRIu64,
                   i, t->offset, t->nbytes, p->arena_nbytes);
        break;
    case KILN_TENSOR_WEIGHT:
    case KILN_TENSOR_STATE:
        for (uint32_t d = 0; d < t->shape.rank; d++) {
            KILN_CHECK(t->shape.min[d] == t->shape.max[d], C_,
                       "tensor %" PRIu32 " (%s): dim %" PRIu32 " range [%" PRId64 ", %" PRId64
                       "] is dynamic; %ss are static",
                       i, kind_name(t->kind), d, t->shape.min[d], t->shape.max[d],
                       kind_name(t->kind));
        }
        KILN_CHECK(t->nbytes == max_nbytes, C_,
                   "tensor %" PRIu32 " (%s): nbytes %" PRIu64
                   " differs from numel x dtype size = %" PRIu64,
                   i, kind_name(t->kind), t->nbytes, max_nbytes);
        if (t->kind == KILN_TENSOR_STATE && t->key == KILN_NO_KEY && t->offset == KILN_STATE_ZERO) {
            break; // starts as zeros
        }
        if (t->key == KILN_NO_KEY) {
            KILN_CHECK(t->offset % KILN_FORMAT_WEIGHT_ALIGN == 0, C_,
                       "tensor %" PRIu32 " (weight): offset %" PRIu64 " is not a multiple of %d", i,
                       t->offset, KILN_FORMAT_WEIGHT_ALIGN);
            KILN_CHECK(kiln_range_ok(t->offset, t->nbytes, p->weights_nbytes), C_,
                       "tensor %" PRIu32 " (weight): offset %" PRIu64 " + nbytes %" PRIu64
                       " lies outside the %" PRIu64 "-byte weights section",
                       i, t->offset, t->nbytes, p->weights_nbytes);
        } else {
            KILN_TRY(check_string(p, t->key, "tensor", i, "key"));
            KILN_CHECK(p->strings[t->key] != '\0', C_,
                       "tensor %" PRIu32 " (weight): external key is empty", i);
            KILN_CHECK(t->offset == 0, C_,
                       "tensor %" PRIu32 " (weight): offset %" PRIu64
                       " must be 0 for an external weight",
                       i, t->offset);
        }
        break;
    default: break;
    }
    return KILN_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static kiln_status check_bindings(const kiln_plan *p) {
    for (uint32_t t = 0, k = 0; t < p->n_tensors; t++) {
        if (p->tensors[t].kind != KILN_TENSOR_STATE) continue;
        KILN_CHECK(p->tensors[t].binding == k, C_,
                   "tensor %" PRIu32 " (state): state number %" PRIu32 " should be %" PRIu32
                   " (states are numbered in tensor order)",
                   t, p->tensors[t].binding, k);
        k++;
    }
    for (uint32_t i = 0; i < p->n_inputs + p->n_outputs; i++) {
        int is_in = i < p->n_inputs;
        uint32_t idx = is_in ? i : i - p->n_inputs;
        uint32_t t = is_in ? p->inputs[idx] : p->outputs[idx];
        uint32_t want = is_in ? KILN_TENSOR_INPUT : KILN_TENSOR_OUTPUT;
        KILN_CHECK(p->tensors[t].kind == want && p->tensors[t].binding == idx, C_,
                   "bindings: %s %" PRIu32 " is tensor %" PRIu32
                   ", which is %s %s with binding %" PRIu32,
                   kind_name(want), idx, t, article(p->tensors[t].kind),
                   kind_name(p->tensors[t].kind), p->tensors[t].binding);
    }
    // Names unique among inputs and outputs.
    uint32_t n = p->n_inputs + p->n_outputs;
    const char **names;
    KILN_TRY(alloc_array((void **)&names, n, sizeof(char *), KILN_ALIGN, "binding names"));
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = i < p->n_inputs ? p->inputs[i] : p->outputs[i - p->n_inputs];
        names[i] = p->strings + p->tensors[t].name;
    }
    qsort(names, n, sizeof *names, cmp_str);
    const char *dup = NULL;
    for (uint32_t i = 1; i < n && dup == NULL; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) dup = names[i];
    }
    kiln_status st = KILN_OK;
    if (dup != NULL) {
        st = kiln_fail(C_, "bindings: the name '%.64s' is used by two inputs/outputs", dup);
    }
    kiln_free(names, (size_t)n * sizeof(char *));
    return st;
}

// --- layers

static kiln_status check_layer_static(const kiln_plan *p, uint32_t i, const uint8_t *r) {
    kiln_plan_layer *l = &p->layers[i];
    l->op = kiln_rd_u32(r);
    l->flags = kiln_rd_u32(r + 4);
    l->input_begin = kiln_rd_u32(r + 8);
    l->n_inputs = kiln_rd_u32(r + 12);
    l->output_begin = kiln_rd_u32(r + 16);
    l->n_outputs = kiln_rd_u32(r + 20);
    l->attr_begin = kiln_rd_u32(r + 24);
    l->n_attrs = kiln_rd_u32(r + 28);
    l->n_tail = kiln_rd_u32(r + 32);
    uint32_t reserved = kiln_rd_u32(r + 36);

    KILN_CHECK(l->op != 0 && l->op <= KILN_OP_MAX_ID, C_,
               "layer %" PRIu32 ": op %" PRIu32 " is not a valid op id (1..%d)", i, l->op,
               KILN_OP_MAX_ID);
    const kiln_op_def *def = kiln_op_def_get(l->op);
    KILN_CHECK(def != NULL, KILN_ERR_VERSION,
               "layer %" PRIu32 ": op %" PRIu32
               " is unknown to this Kiln (%s): the engine was made by a newer Kiln; upgrade Kiln",
               i, l->op, KILN_VERSION_STRING);
    const char *op = def->name;
    KILN_CHECK((l->flags & ~KILN_LAYER_TAIL) == 0, C_,
               "layer %" PRIu32 " (%s): flags 0x%08" PRIx32 " has undefined bits", i, op, l->flags);
    KILN_CHECK(reserved == 0, C_,
               "layer %" PRIu32 " (%s): reserved field is 0x%08" PRIx32 ", must be 0", i, op,
               reserved);
    KILN_CHECK(l->n_inputs >= def->min_inputs && l->n_inputs <= def->max_inputs &&
                   l->n_inputs <= KILN_MAX_INPUTS,
               C_, "layer %" PRIu32 " (%s): n_inputs %" PRIu32 " is outside the op's arity %u..%u",
               i, op, l->n_inputs, def->min_inputs, def->max_inputs);
    KILN_CHECK(kiln_range_ok(l->input_begin, l->n_inputs, p->n_ids), C_,
               "layer %" PRIu32 " (%s): input_begin %" PRIu32 " + n_inputs %" PRIu32
               " lies outside the %" PRIu32 " ids",
               i, op, l->input_begin, l->n_inputs, p->n_ids);
    KILN_CHECK(l->n_outputs == def->n_outputs, C_,
               "layer %" PRIu32 " (%s): n_outputs %" PRIu32 ", the op has %u", i, op, l->n_outputs,
               def->n_outputs);
    KILN_CHECK(kiln_range_ok(l->output_begin, l->n_outputs, p->n_ids), C_,
               "layer %" PRIu32 " (%s): output_begin %" PRIu32 " + n_outputs %" PRIu32
               " lies outside the %" PRIu32 " ids",
               i, op, l->output_begin, l->n_outputs, p->n_ids);
    KILN_CHECK(l->n_attrs == def->n_attrs, C_,
               "layer %" PRIu32 " (%s): n_attrs %" PRIu32 ", the op's schema has %u", i, op,
               l->n_attrs, def->n_attrs);
    KILN_CHECK(kiln_range_ok(l->attr_begin, l->n_attrs, p->n_attr_refs), C_,
               "layer %" PRIu32 " (%s): attr_begin %" PRIu32 " + n_attrs %" PRIu32
               " lies outside the %" PRIu32 " attribute refs",
               i, op, l->attr_begin, l->n_attrs, p->n_attr_refs);
    for (uint32_t j = 0; j < l->n_attrs; j++) {
        const kiln_attr_ref *a = &p->attr_refs[l->attr_begin + j];
        const kiln_attr_info *ai = &def->attrs[j];
        KILN_CHECK(a->kind == (uint32_t)ai->kind, C_,
                   "layer %" PRIu32 " (%s): attribute %" PRIu32 " (%s) has kind %" PRIu32
                   ", the schema says %s",
                   i, op, j, ai->name, a->kind, ai->kind == KILN_ATTR_INTS ? "ints" : "floats");
        KILN_CHECK(ai->count < 0 || a->n == (uint32_t)ai->count, C_,
                   "layer %" PRIu32 " (%s): attribute %" PRIu32 " (%s) has %" PRIu32
                   " values, the schema needs %d",
                   i, op, j, ai->name, a->n, (int)ai->count);
    }
    for (uint32_t j = 0; j < l->n_inputs; j++) {
        int32_t id = p->ids[l->input_begin + j];
        KILN_CHECK(id >= 0 || (j < 32 && (def->optional_mask >> j & 1u)), C_,
                   "layer %" PRIu32 " (%s): input %" PRIu32 " is absent (-1) but not optional", i,
                   op, j);
    }
    for (uint32_t j = 0; j < l->n_outputs; j++) {
        int32_t id = p->ids[l->output_begin + j];
        KILN_CHECK(id >= 0, C_, "layer %" PRIu32 " (%s): output %" PRIu32 " is -1 (absent)", i, op,
                   j);
        uint32_t k = p->tensors[id].kind;
        KILN_CHECK(k == KILN_TENSOR_ACTIVATION || k == KILN_TENSOR_OUTPUT || k == KILN_TENSOR_STATE,
                   C_,
                   "layer %" PRIu32 " (%s): output %" PRIu32 " is tensor %" PRId32
                   ", %s %s; layers write activations, outputs and states",
                   i, op, j, id, article(k), kind_name(k));
    }
    if (l->flags & KILN_LAYER_TAIL) {
        KILN_CHECK(def->flags & KILN_OPF_TAIL, C_,
                   "layer %" PRIu32 " (%s) is a TAIL layer, but %s cannot be fused as a tail", i,
                   op, op);
        KILN_CHECK(l->n_tail == 0, C_,
                   "layer %" PRIu32 " (%s) is a TAIL layer with n_tail %" PRIu32 "; must be 0", i,
                   op, l->n_tail);
    } else if (l->n_tail != 0) {
        KILN_CHECK(def->flags & (KILN_OPF_FUSE_HEAD | KILN_OPF_EW_HEAD), C_,
                   "layer %" PRIu32 " (%s): n_tail %" PRIu32 ", but %s cannot carry a fused tail",
                   i, op, l->n_tail, op);
        KILN_CHECK(l->n_tail <= KILN_FORMAT_MAX_TAIL, C_,
                   "layer %" PRIu32 " (%s): n_tail %" PRIu32 " exceeds the cap of %d", i, op,
                   l->n_tail, KILN_FORMAT_MAX_TAIL);
    }
    return KILN_OK;
}

static kiln_status infer_failed(uint32_t i, const char *op) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kiln_last_error());
    return kiln_fail(C_, "layer %" PRIu32 " (%s): shape inference rejects the stored tensors: %s",
                     i, op, msg);
}

static kiln_status compare_desc(uint32_t i, const char *op, int32_t id, const kiln_value_desc *got,
                                const kiln_value_desc *want) {
    KILN_CHECK(got->dtype == want->dtype && got->shape.rank == want->shape.rank, C_,
               "layer %" PRIu32 " (%s): output tensor %" PRId32 " is %s of rank %" PRIu32
               ", but shape inference gives %s of rank %" PRIu32,
               i, op, id, kiln_dtype_name((kiln_dtype)got->dtype), got->shape.rank,
               kiln_dtype_name((kiln_dtype)want->dtype), want->shape.rank);
    for (uint32_t d = 0; d < got->shape.rank; d++) {
        KILN_CHECK(
            got->shape.min[d] == want->shape.min[d] && got->shape.max[d] == want->shape.max[d], C_,
            "layer %" PRIu32 " (%s): output tensor %" PRId32 " dim %" PRIu32 " range is [%" PRId64
            ", %" PRId64 "], but shape inference gives [%" PRId64 ", %" PRId64 "]",
            i, op, id, d, got->shape.min[d], got->shape.max[d], want->shape.min[d],
            want->shape.max[d]);
    }
    return KILN_OK;
}

// Walks the layers in order: tail structure, defined-before-use, single writer, shape inference.
static kiln_status check_dataflow(load_state *st) {
    kiln_plan *p = &st->p;
    uint32_t head = 0, tails_left = 0;
    for (uint32_t t = 0; t < p->n_tensors; t++) {
        uint32_t k = p->tensors[t].kind;
        st->defined[t] =
            k == KILN_TENSOR_INPUT || k == KILN_TENSOR_WEIGHT || k == KILN_TENSOR_STATE;
        st->def_layer[t] = -1;
        st->last_use[t] = -1;
        st->descs[t].dtype = p->tensors[t].dtype;
        st->descs[t].shape = p->tensors[t].shape;
    }
    for (uint32_t i = 0; i < p->n_layers; i++) {
        const kiln_plan_layer *l = &p->layers[i];
        const char *op = kiln_op_name(l->op);
        const int32_t *in = p->ids + l->input_begin;
        const int32_t *out = p->ids + l->output_begin;
        int is_tail = (l->flags & KILN_LAYER_TAIL) != 0;
        if (is_tail) {
            KILN_CHECK(tails_left > 0, C_,
                       "layer %" PRIu32 " (%s) is a TAIL layer but does not follow a head layer "
                       "whose n_tail covers it",
                       i, op);
            tails_left--;
        } else {
            KILN_CHECK(tails_left == 0, C_,
                       "layer %" PRIu32 " (%s) is not a TAIL layer, but head layer %" PRIu32
                       " has n_tail %" PRIu32 " and only %" PRIu32 " tails precede it",
                       i, op, head, p->layers[head].n_tail, p->layers[head].n_tail - tails_left);
            head = i;
            tails_left = l->n_tail;
        }

        const kiln_value_desc *descs[KILN_MAX_INPUTS];
        for (uint32_t j = 0; j < l->n_inputs; j++) {
            descs[j] = NULL;
            if (in[j] < 0) continue;
            KILN_CHECK(st->defined[in[j]], C_,
                       "layer %" PRIu32 " (%s): input %" PRIu32 " is tensor %" PRId32
                       " (%s), which no earlier layer writes",
                       i, op, j, in[j], kind_name(p->tensors[in[j]].kind));
            st->last_use[in[j]] = (int32_t)i;
            descs[j] = &st->descs[in[j]];
        }
        char what[64];
        snprintf(what, sizeof what, "layer %" PRIu32 " (%s)", i, op);
        kiln_attrs attrs = kiln_plan_layer_attrs(p, l);
        kiln_value_desc inferred;
        if (is_tail) {
            const kiln_plan_layer *h = &p->layers[head];
            int32_t running = p->ids[h->output_begin];
            KILN_CHECK(out[0] == running, C_,
                       "layer %" PRIu32 " (%s): a TAIL layer writes tensor %" PRId32
                       ", not its head layer %" PRIu32 "'s output %" PRId32,
                       i, op, out[0], head, running);
            int reads_running = 0;
            for (uint32_t j = 0; j < l->n_inputs; j++) reads_running |= in[j] == running;
            KILN_CHECK(reads_running, C_,
                       "layer %" PRIu32 " (%s): a TAIL layer must read its head layer %" PRIu32
                       "'s output %" PRId32 " (in place)",
                       i, op, head, running);
            st->last_use[running] = (int32_t)i;
            kiln_status s = kiln_infer(l->op, &attrs, descs, l->n_inputs, what, &inferred);
            if (s == KILN_ERR_NO_MEMORY) return s;
            if (s != KILN_OK) return infer_failed(i, op);
            KILN_TRY(compare_desc(i, op, running, &st->descs[running], &inferred));
            continue;
        }
        kiln_status s = kiln_infer(l->op, &attrs, descs, l->n_inputs, what, &inferred);
        if (s == KILN_ERR_NO_MEMORY) return s;
        if (s != KILN_OK) return infer_failed(i, op);
        for (uint32_t j = 0; j < l->n_outputs; j++) {
            int32_t t = out[j];
            if (p->tensors[t].kind == KILN_TENSOR_STATE) { // one layer writes a state, once
                KILN_CHECK(st->def_layer[t] < 0, C_,
                           "layer %" PRIu32 " (%s): output %" PRIu32 " is state tensor %" PRId32
                           ", which an earlier layer writes; one layer updates a state",
                           i, op, j, t);
                KILN_TRY(compare_desc(i, op, t, &st->descs[t], &inferred));
                st->def_layer[t] = (int32_t)i;
                st->last_use[t] = (int32_t)i;
                continue;
            }
            KILN_CHECK(!st->defined[t], C_,
                       "layer %" PRIu32 " (%s): output %" PRIu32 " is tensor %" PRId32
                       ", which %s already writes",
                       i, op, j, t, st->def_layer[t] >= 0 ? "an earlier layer" : "the caller");
            KILN_TRY(compare_desc(i, op, t, &st->descs[t], &inferred));
            st->defined[t] = 1;
            st->def_layer[t] = (int32_t)i;
            st->last_use[t] = (int32_t)i;
        }
    }
    KILN_CHECK(tails_left == 0, C_,
               "layer %" PRIu32 " (%s): n_tail %" PRIu32 ", but the engine ends after %" PRIu32
               " tail layers",
               head, kiln_op_name(p->layers[head].op), p->layers[head].n_tail,
               p->layers[head].n_tail - tails_left);
    for (uint32_t t = 0; t < p->n_tensors; t++) {
        KILN_CHECK(st->defined[t], C_, "tensor %" PRIu32 " (%s) is never written by any layer", t,
                   kind_name(p->tensors[t].kind));
    }
    return KILN_OK;
}

// --- memory plan: no two activations live at the same time share arena bytes

typedef struct live_buf {
    uint64_t begin, end; // arena bytes [begin, end)
    int32_t first, last; // live over layers [first, last]
    uint32_t tensor;
} live_buf;

static int cmp_by_offset(const void *a, const void *b) {
    const live_buf *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->tensor < y->tensor ? -1 : (x->tensor > y->tensor);
}

// Sweep order: (layer, position) pairs sorted by layer, then position.
typedef struct sweep_key {
    int32_t layer;
    uint32_t pos;
} sweep_key;
static int cmp_sweep(const void *a, const void *b) {
    const sweep_key *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return x->pos < y->pos ? -1 : (x->pos > y->pos);
}

// Predecessor / successor of position r among the set bits of `words` (-1 if none).
static int64_t bits_prev(const uint64_t *words, uint32_t r) {
    for (int64_t w = r / 64; w >= 0; w--) {
        uint64_t m = words[w];
        if ((uint32_t)w == r / 64) m &= (r % 64 == 0) ? 0 : (UINT64_MAX >> (64 - r % 64));
        for (int b = 63; m != 0 && b >= 0; b--) {
            if (m >> b & 1u) return w * 64 + b;
        }
    }
    return -1;
}
static int64_t bits_next(const uint64_t *words, uint32_t n_words, uint32_t r) {
    for (uint32_t w = r / 64; w < n_words; w++) {
        uint64_t m = words[w];
        if (w == r / 64) m &= (r % 64 == 63) ? 0 : (UINT64_MAX << (r % 64 + 1));
        for (int b = 0; m != 0 && b < 64; b++) {
            if (m >> b & 1u) return (int64_t)w * 64 + b;
        }
    }
    return -1;
}

static kiln_status overlap_error(const live_buf *a, const live_buf *b) {
    return kiln_fail(C_,
                     "memory plan: activations %" PRIu32 " (arena [%" PRIu64 ", %" PRIu64
                     "), live over layers %" PRId32 "..%" PRId32 ") and %" PRIu32
                     " (arena [%" PRIu64 ", %" PRIu64 "), layers %" PRId32 "..%" PRId32
                     ") overlap while both are live",
                     a->tensor, a->begin, a->end, a->first, a->last, b->tensor, b->begin, b->end,
                     b->first, b->last);
}

// Sweep over layers with the live set ordered by arena offset. The live set is pairwise
// disjoint (invariant), so a new buffer overlaps one of them iff it overlaps its neighbour
// below or above: O(n log n) sorting plus O(n * n/64) neighbour scans.
static kiln_status check_memory_plan(load_state *st) {
    const kiln_plan *p = &st->p;
    uint32_t n = 0;
    for (uint32_t t = 0; t < p->n_tensors; t++) {
        n += p->tensors[t].kind == KILN_TENSOR_ACTIVATION && p->tensors[t].nbytes > 0;
    }
    if (n < 2) return KILN_OK;
    uint32_t n_words = (n + 63) / 64;
    live_buf *bufs = NULL;
    sweep_key *by_first = NULL, *by_last = NULL;
    uint64_t *live = NULL;
    kiln_status s = alloc_array((void **)&bufs, n, sizeof *bufs, KILN_ALIGN, "memory-plan check");
    if (s == KILN_OK) {
        s = alloc_array((void **)&by_first, n, sizeof *by_first, KILN_ALIGN, "memory-plan check");
    }
    if (s == KILN_OK) {
        s = alloc_array((void **)&by_last, n, sizeof *by_last, KILN_ALIGN, "memory-plan check");
    }
    if (s == KILN_OK) s = alloc_array((void **)&live, n_words, 8, KILN_ALIGN, "memory-plan check");
    if (s == KILN_OK) {
        uint32_t k = 0;
        for (uint32_t t = 0; t < p->n_tensors; t++) {
            const kiln_plan_tensor *pt = &p->tensors[t];
            if (pt->kind != KILN_TENSOR_ACTIVATION || pt->nbytes == 0) continue;
            bufs[k] = (live_buf){pt->offset, pt->offset + pt->nbytes, st->def_layer[t],
                                 st->last_use[t], t};
            k++;
        }
        qsort(bufs, n, sizeof *bufs, cmp_by_offset);
        for (uint32_t i = 0; i < n; i++) {
            by_first[i] = (sweep_key){bufs[i].first, i};
            by_last[i] = (sweep_key){bufs[i].last, i};
        }
        qsort(by_first, n, sizeof *by_first, cmp_sweep);
        qsort(by_last, n, sizeof *by_last, cmp_sweep);
        memset(live, 0, (size_t)n_words * 8);
        uint32_t e = 0;
        for (uint32_t i = 0; i < n && s == KILN_OK; i++) {
            uint32_t r = by_first[i].pos;
            const live_buf *b = &bufs[r];
            for (; e < n && by_last[e].layer < b->first; e++) {
                live[by_last[e].pos / 64] &= ~(UINT64_C(1) << (by_last[e].pos % 64));
            }
            int64_t lo = bits_prev(live, r), hi = bits_next(live, n_words, r);
            if (lo >= 0 && bufs[lo].end > b->begin)
                s = overlap_error(&bufs[lo], b);
            else if (hi >= 0 && bufs[hi].begin < b->end)
                s = overlap_error(b, &bufs[hi]);
            live[r / 64] |= UINT64_C(1) << (r % 64);
        }
    }
    kiln_free(live, (size_t)n_words * 8);
    kiln_free(by_last, (size_t)n * sizeof *by_last);
    kiln_free(by_first, (size_t)n * sizeof *by_first);
    kiln_free(bufs, (size_t)n * sizeof *bufs);
    return s;
}

// --- entry point

// "Too new" is decided before any allocation sized by the file: an op id in the op-id space that
// this build does not know means a newer Kiln wrote the engine. (Other op problems: later.)
static kiln_status check_op_versions(const load_state *st) {
    uint64_t nbytes;
    const uint8_t *s = section(st, KILN_SECTION_LAYERS, &nbytes);
    for (uint64_t i = 0; i + KILN_FORMAT_LAYER_NBYTES <= nbytes; i += KILN_FORMAT_LAYER_NBYTES) {
        uint32_t op = kiln_rd_u32(s + i);
        KILN_CHECK(op == 0 || op > KILN_OP_MAX_ID || kiln_op_def_get(op) != NULL, KILN_ERR_VERSION,
                   "layer %" PRIu64 ": op %" PRIu32
                   " is unknown to this Kiln (%s): the engine was made by a newer Kiln; upgrade "
                   "Kiln",
                   i / KILN_FORMAT_LAYER_NBYTES, op, KILN_VERSION_STRING);
    }
    return KILN_OK;
}

static kiln_status load_body(load_state *st) {
    kiln_plan *p = &st->p;
    uint64_t n_tensors = 0, n_layers = 0, nbytes = 0;

    KILN_TRY(check_op_versions(st));
    KILN_TRY(decode_plan_record(st));
    KILN_TRY(decode_strings(st));
    KILN_TRY(section_count(st, KILN_SECTION_TENSORS, KILN_FORMAT_TENSOR_NBYTES,
                           KILN_FORMAT_MAX_TENSORS, &n_tensors));
    KILN_TRY(section_count(st, KILN_SECTION_LAYERS, KILN_FORMAT_LAYER_NBYTES,
                           KILN_FORMAT_MAX_LAYERS, &n_layers));
    KILN_TRY(decode_bindings(st, n_tensors));
    KILN_TRY(decode_pools(st, n_tensors));

    const uint8_t *w = section(st, KILN_SECTION_WEIGHTS, &nbytes);
    KILN_TRY(alloc_array((void **)&p->weights, nbytes, 1, KILN_DATA_ALIGN, "weights"));
    p->weights_nbytes = nbytes;
    if (nbytes > 0) memcpy(p->weights, w, (size_t)nbytes);

    KILN_TRY(alloc_array((void **)&p->tensors, n_tensors, sizeof(kiln_plan_tensor), KILN_ALIGN,
                         "tensors"));
    p->n_tensors = (uint32_t)n_tensors;
    memset(p->tensors, 0, (size_t)n_tensors * sizeof(kiln_plan_tensor));
    const uint8_t *s = section(st, KILN_SECTION_TENSORS, &nbytes);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        KILN_TRY(check_tensor(p, i, s + (size_t)i * KILN_FORMAT_TENSOR_NBYTES));
    }
    KILN_TRY(check_bindings(p));

    KILN_TRY(
        alloc_array((void **)&p->layers, n_layers, sizeof(kiln_plan_layer), KILN_ALIGN, "layers"));
    p->n_layers = (uint32_t)n_layers;
    memset(p->layers, 0, (size_t)n_layers * sizeof(kiln_plan_layer));
    s = section(st, KILN_SECTION_LAYERS, &nbytes);
    for (uint32_t i = 0; i < p->n_layers; i++) {
        KILN_TRY(check_layer_static(p, i, s + (size_t)i * KILN_FORMAT_LAYER_NBYTES));
    }

    KILN_TRY(alloc_array((void **)&st->defined, n_tensors, 1, KILN_ALIGN, "loader state"));
    KILN_TRY(alloc_array((void **)&st->def_layer, n_tensors, 4, KILN_ALIGN, "loader state"));
    KILN_TRY(alloc_array((void **)&st->last_use, n_tensors, 4, KILN_ALIGN, "loader state"));
    KILN_TRY(alloc_array((void **)&st->descs, n_tensors, sizeof(kiln_value_desc), KILN_ALIGN,
                         "loader state"));
    KILN_TRY(check_dataflow(st));
    return check_memory_plan(st);
}

kiln_status kiln_load_plan(const void *data, size_t nbytes, kiln_plan *out) {
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_load_plan: out is NULL");
    kiln_format_info info;
    KILN_TRY(kiln_format_parse(data, nbytes, &info));
    load_state st;
    memset(&st, 0, sizeof st);
    st.data = data;
    st.info = &info;
    kiln_status s = load_body(&st);
    uint64_t n = st.p.n_tensors;
    kiln_free(st.descs, (size_t)n * sizeof(kiln_value_desc));
    kiln_free(st.last_use, (size_t)n * 4);
    kiln_free(st.def_layer, (size_t)n * 4);
    kiln_free(st.defined, (size_t)n);
    if (s != KILN_OK) {
        kiln_plan_release(&st.p);
        return s;
    }
    *out = st.p;
    return KILN_OK;
}
