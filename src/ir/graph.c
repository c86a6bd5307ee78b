// SPDX-License-Identifier: Apache-2.0
// The public graph API (include/kiln/kiln_graph.h) over the IR of src/ir/graph.h. Every add_*
// call validates its arguments completely and infers node outputs immediately, so an error
// surfaces at the call that causes it and names the node, the op and the offending input or
// attribute. A failed call leaves the graph unchanged.
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/utf8.h"
#include "ir/graph.h"
#include "kiln/kiln_format.h"

// --- growable arrays

kiln_status kiln_ir_grow(void **array, size_t *cap, size_t need, size_t elem_nbytes) {
    size_t new_cap, nbytes;
    void *p;
    if (need <= *cap) return KILN_OK;
    new_cap = *cap < 16 ? 16 : *cap;
    while (new_cap < need) {
        if (new_cap > SIZE_MAX / 2) {
            new_cap = need;
            break;
        }
        new_cap *= 2;
    }
    if (new_cap > SIZE_MAX / elem_nbytes) {
        return kiln_fail(KILN_ERR_NO_MEMORY, "array of %zu elements of %zu bytes overflows",
                         new_cap, elem_nbytes);
    }
    nbytes = new_cap * elem_nbytes;
    p = kiln_malloc(nbytes, KILN_ALIGN);
    if (p == NULL) {
        return kiln_fail(KILN_ERR_NO_MEMORY, "out of memory growing an array to %zu bytes", nbytes);
    }
    if (*cap > 0) memcpy(p, *array, *cap * elem_nbytes);
    kiln_free(*array, *cap * elem_nbytes);
    *array = p;
    *cap = new_cap;
    return KILN_OK;
}

void kiln_ir_array_free(void *array, size_t cap, size_t elem_nbytes) {
    kiln_free(array, cap * elem_nbytes);
}

#define GROW(g, field, need)                                                                       \
    kiln_ir_grow((void **)&(g)->field, &(g)->cap_##field, (need), sizeof *(g)->field)

// --- graph lifetime

kiln_status kiln_graph_new(kiln_graph **out) {
    kiln_graph *g;
    kiln_status st;
    KILN_CHECK(out != NULL, KILN_ERR_INVALID_ARG, "kiln_graph_new: out is NULL");
    g = kiln_calloc(sizeof *g, KILN_ALIGN);
    KILN_CHECK(g != NULL, KILN_ERR_NO_MEMORY, "out of memory allocating a graph");
    // names[0] is the empty string, so offset 0 means "no name".
    // The pools always exist, so views into them never offset a NULL pointer.
    st = kiln_ir_grow((void **)&g->names, &g->cap_names, 1, 1);
    if (st == KILN_OK) st = GROW(g, ints, 1);
    if (st == KILN_OK) st = GROW(g, floats, 1);
    if (st == KILN_OK) st = GROW(g, attr_refs, 1);
    if (st != KILN_OK) {
        kiln_graph_free(g);
        return st;
    }
    g->names[0] = '\0';
    g->names_nbytes = 1;
    *out = g;
    return KILN_OK;
}

void kiln_graph_free(kiln_graph *g) {
    if (g == NULL) return;
    for (size_t i = 0; i < g->n_consts; i++) {
        kiln_free(g->consts[i].data, (size_t)g->consts[i].nbytes);
    }
    kiln_ir_array_free(g->values, g->cap_values, sizeof *g->values);
    kiln_ir_array_free(g->nodes, g->cap_nodes, sizeof *g->nodes);
    kiln_ir_array_free(g->ids, g->cap_ids, sizeof *g->ids);
    kiln_ir_array_free(g->attr_refs, g->cap_attr_refs, sizeof *g->attr_refs);
    kiln_ir_array_free(g->ints, g->cap_ints, sizeof *g->ints);
    kiln_ir_array_free(g->floats, g->cap_floats, sizeof *g->floats);
    kiln_ir_array_free(g->names, g->cap_names, 1);
    kiln_ir_array_free(g->consts, g->cap_consts, sizeof *g->consts);
    kiln_ir_array_free(g->inputs, g->cap_inputs, sizeof *g->inputs);
    kiln_ir_array_free(g->outputs, g->cap_outputs, sizeof *g->outputs);
    for (size_t i = 0; i < g->n_states; i++) {
        if (g->states[i].data != NULL) kiln_free(g->states[i].data, (size_t)g->states[i].nbytes);
    }
    kiln_ir_array_free(g->states, g->cap_states, sizeof *g->states);
    kiln_free(g, sizeof *g);
}

// --- names

// strlen capped at max (strnlen is POSIX, not C11).
static size_t bounded_len(const char *s, size_t max) {
    size_t n = 0;
    while (n < max && s[n] != '\0') n++;
    return n;
}

// Names reach the engine's strings, which the loader accepts only as UTF-8 text without control
// characters (docs/format.md §3): refuse anything else here, at the call that passes it.
static kiln_status check_name_text(const char *fn, const char *name, size_t len) {
    size_t bad = kiln_utf8_check(name, len);
    KILN_CHECK(bad == len, KILN_ERR_INVALID_ARG,
               "%s: the name '%.40s' is not UTF-8 text: byte %zu (0x%02x) is %s; names are "
               "UTF-8 without control characters",
               fn, name, bad, (unsigned char)name[bad], kiln_utf8_problem(name + bad, len - bad));
    return KILN_OK;
}

// Checks a binding name: non-empty, at most KILN_GRAPH_MAX_NAME bytes, UTF-8 text, unique among
// the inputs, states and outputs.
static kiln_status check_binding_name(const kiln_graph *g, const char *fn, const char *name) {
    size_t len;
    KILN_CHECK(name != NULL, KILN_ERR_INVALID_ARG, "%s: name is NULL", fn);
    len = bounded_len(name, KILN_GRAPH_MAX_NAME + 1);
    KILN_CHECK(len > 0, KILN_ERR_INVALID_ARG,
               "%s: the name is empty; inputs and outputs need "
               "a name",
               fn);
    KILN_CHECK(len <= KILN_GRAPH_MAX_NAME, KILN_ERR_INVALID_ARG,
               "%s: the name '%.40s...' is longer than %u bytes", fn, name, KILN_GRAPH_MAX_NAME);
    KILN_TRY(check_name_text(fn, name, len));
    for (size_t i = 0; i < g->n_inputs; i++) {
        const char *other = kiln_graph_name(g, g->values[g->inputs[i]].name);
        KILN_CHECK(strcmp(other, name) != 0, KILN_ERR_INVALID_ARG,
                   "%s: the name '%s' is already used by input %zu; input and output names must "
                   "be unique",
                   fn, name, i);
    }
    for (size_t i = 0; i < g->n_states; i++) {
        const char *other = kiln_graph_name(g, g->values[g->states[i].value].name);
        KILN_CHECK(strcmp(other, name) != 0, KILN_ERR_INVALID_ARG,
                   "%s: the name '%s' is already used by state %zu; input, state and output "
                   "names must be unique",
                   fn, name, i);
    }
    for (size_t i = 0; i < g->n_outputs; i++) {
        const char *other = kiln_graph_name(g, g->outputs[i].name);
        KILN_CHECK(strcmp(other, name) != 0, KILN_ERR_INVALID_ARG,
                   "%s: the name '%s' is already used by output %zu; input and output names must "
                   "be unique",
                   fn, name, i);
    }
    return KILN_OK;
}

// Appends a string to the names pool; *out gets its offset.
static kiln_status add_name(kiln_graph *g, const char *name, uint32_t *out) {
    size_t len = strlen(name) + 1;
    KILN_TRY(kiln_ir_grow((void **)&g->names, &g->cap_names, g->names_nbytes + len, 1));
    memcpy(g->names + g->names_nbytes, name, len);
    *out = (uint32_t)g->names_nbytes;
    g->names_nbytes += len;
    return KILN_OK;
}

static kiln_status check_value_room(const kiln_graph *g, const char *fn) {
    KILN_CHECK(g->n_values < KILN_GRAPH_MAX_VALUES, KILN_ERR_INVALID_ARG,
               "%s: the graph already has %zu values (inputs, constants and node outputs), "
               "Kiln's limit; split the model into several engines",
               fn, g->n_values);
    return KILN_OK;
}

static const char *dims_str(char *buf, size_t n, uint32_t rank, const int64_t *lo,
                            const int64_t *hi) {
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i <= rank; i++) {
        int w;
        if (i == rank) {
            w = snprintf(buf + used, n - used, "%s]", rank ? "" : "[");
        } else if (lo[i] == hi[i]) {
            w = snprintf(buf + used, n - used, "%s%" PRId64, i ? ", " : "[", lo[i]);
        } else {
            w = snprintf(buf + used, n - used, "%s%" PRId64 "..%" PRId64, i ? ", " : "[", lo[i],
                         hi[i]);
        }
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    return buf;
}

// Validates a shape given as per-dimension [min, max] (hi == lo for static shapes).
static kiln_status check_dims(const char *fn, const char *what, uint32_t rank, const int64_t *lo,
                              const int64_t *hi) {
    KILN_CHECK(rank <= KILN_MAX_RANK, KILN_ERR_INVALID_ARG,
               "%s: %s has rank %u; Kiln's maximum rank is %d", fn, what, rank, KILN_MAX_RANK);
    KILN_CHECK(rank == 0 || (lo != NULL && hi != NULL), KILN_ERR_INVALID_ARG,
               "%s: %s: the dimensions are NULL for rank %u", fn, what, rank);
    for (uint32_t i = 0; i < rank; i++) {
        KILN_CHECK(lo[i] >= 0 && lo[i] <= hi[i] && hi[i] <= KILN_SHAPE_MAX_DIM,
                   KILN_ERR_INVALID_ARG,
                   "%s: %s dimension %u has range [%" PRId64 ", %" PRId64
                   "]; need 0 <= min <= max <= 2^40",
                   fn, what, i, lo[i], hi[i]);
    }
    return KILN_OK;
}

// --- inputs, constants, outputs

// A declared tensor (input, constant, state): a Kiln dtype, valid dims, and at its largest shape
// at most the engine format's limit on one tensor (docs/format.md §3.2), refused at the call that
// declares it. *out_nbytes: its bytes at that shape.
static kiln_status check_decl(const char *fn, const char *what, kiln_dtype dtype, uint32_t rank,
                              const int64_t *lo, const int64_t *hi, uint64_t *out_nbytes) {
    uint64_t nbytes;
    KILN_CHECK(kiln_dtype_valid((uint32_t)dtype), KILN_ERR_INVALID_ARG,
               "%s: %s has dtype %d, not a Kiln dtype (1..%d)", fn, what, (int)dtype,
               KILN_DTYPE_COUNT - 1);
    KILN_TRY(check_dims(fn, what, rank, lo, hi));
    nbytes = kiln_dtype_size(dtype);
    for (uint32_t i = 0; i < rank; i++) {
        KILN_CHECK(kiln_mul_u64(nbytes, (uint64_t)hi[i], &nbytes) &&
                       nbytes <= KILN_FORMAT_MAX_TENSOR_NBYTES,
                   KILN_ERR_INVALID_ARG,
                   "%s: %s %s at its largest shape %s needs more than 2^62 bytes, Kiln's limit "
                   "for one tensor (element count times %zu bytes); give smaller sizes",
                   fn, what, kiln_dtype_name(dtype), dims_str((char[160]){0}, 160, rank, hi, hi),
                   kiln_dtype_size(dtype));
    }
    *out_nbytes = nbytes;
    return KILN_OK;
}

kiln_status kiln_graph_add_input(kiln_graph *g, const char *name, kiln_dtype dtype, uint32_t rank,
                                 const int64_t *dim_min, const int64_t *dim_max,
                                 int32_t *out_value) {
    static const char fn[] = "kiln_graph_add_input";
    kiln_ir_value v;
    uint64_t max_nbytes;
    char what[300];
    KILN_CHECK(g != NULL && out_value != NULL, KILN_ERR_INVALID_ARG,
               "%s: graph and out_value must not be NULL", fn);
    KILN_TRY(check_binding_name(g, fn, name));
    snprintf(what, sizeof what, "input '%s'", name);
    KILN_TRY(check_decl(fn, what, dtype, rank, dim_min, dim_max, &max_nbytes));
    KILN_TRY(check_value_room(g, fn));
    KILN_CHECK(g->n_inputs < KILN_GRAPH_MAX_IO, KILN_ERR_INVALID_ARG,
               "%s: the graph already has %u inputs, Kiln's limit", fn, KILN_GRAPH_MAX_IO);
    KILN_TRY(GROW(g, values, g->n_values + 1));
    KILN_TRY(GROW(g, inputs, g->n_inputs + 1));
    memset(&v, 0, sizeof v);
    v.kind = KILN_IR_INPUT;
    v.index = (uint32_t)g->n_inputs;
    v.desc.dtype = (uint32_t)dtype;
    v.desc.shape.rank = rank;
    for (uint32_t i = 0; i < rank; i++) {
        v.desc.shape.min[i] = dim_min[i];
        v.desc.shape.max[i] = dim_max[i];
    }
    KILN_TRY(add_name(g, name, &v.name));
    g->values[g->n_values] = v;
    g->inputs[g->n_inputs++] = (int32_t)g->n_values;
    *out_value = (int32_t)g->n_values++;
    return KILN_OK;
}

kiln_status kiln_graph_add_constant(kiln_graph *g, const char *name, kiln_dtype dtype,
                                    uint32_t rank, const int64_t *dims, const void *data,
                                    size_t nbytes, int32_t *out_value) {
    static const char fn[] = "kiln_graph_add_constant";
    kiln_ir_value v;
    kiln_ir_const c;
    uint64_t want;
    char what[300];
    KILN_CHECK(g != NULL && out_value != NULL, KILN_ERR_INVALID_ARG,
               "%s: graph and out_value must not be NULL", fn);
    if (name != NULL) {
        size_t len = bounded_len(name, KILN_GRAPH_MAX_NAME + 1);
        KILN_CHECK(len <= KILN_GRAPH_MAX_NAME, KILN_ERR_INVALID_ARG,
                   "%s: the name '%.40s...' is longer than %u bytes", fn, name,
                   KILN_GRAPH_MAX_NAME);
        KILN_TRY(check_name_text(fn, name, len));
    }
    snprintf(what, sizeof what, "constant '%s'", name != NULL ? name : "");
    KILN_TRY(check_decl(fn, what, dtype, rank, dims, dims, &want));
    KILN_CHECK(want == (uint64_t)nbytes, KILN_ERR_INVALID_ARG,
               "%s: %s %s %s needs %" PRIu64 " bytes but nbytes = %zu", fn, what,
               kiln_dtype_name(dtype), dims_str((char[160]){0}, 160, rank, dims, dims), want,
               nbytes);
    KILN_CHECK(data != NULL || nbytes == 0, KILN_ERR_INVALID_ARG, "%s: %s: data is NULL", fn, what);
    KILN_TRY(check_value_room(g, fn));
    KILN_TRY(GROW(g, values, g->n_values + 1));
    KILN_TRY(GROW(g, consts, g->n_consts + 1));
    memset(&v, 0, sizeof v);
    v.kind = KILN_IR_CONSTANT;
    v.index = (uint32_t)g->n_consts;
    v.desc.dtype = (uint32_t)dtype;
    kiln_shape_from_dims(&v.desc.shape, rank, dims);
    c.data = kiln_malloc(nbytes, KILN_DATA_ALIGN);
    KILN_CHECK(c.data != NULL, KILN_ERR_NO_MEMORY, "out of memory copying %s (%zu bytes)", what,
               nbytes);
    if (nbytes > 0) memcpy(c.data, data, nbytes);
    c.nbytes = nbytes;
    c.value = (int32_t)g->n_values;
    if (name != NULL && name[0] != '\0') {
        kiln_status st = add_name(g, name, &v.name);
        if (st != KILN_OK) {
            kiln_free(c.data, nbytes);
            return st;
        }
    }
    g->consts[g->n_consts++] = c;
    g->values[g->n_values] = v;
    *out_value = (int32_t)g->n_values++;
    return KILN_OK;
}

kiln_status kiln_graph_add_state(kiln_graph *g, const char *name, kiln_dtype dtype, uint32_t rank,
                                 const int64_t *dims, const void *data, size_t nbytes,
                                 int32_t *out_state) {
    static const char fn[] = "kiln_graph_add_state";
    kiln_ir_value v;
    kiln_ir_state st;
    uint64_t want;
    char what[300];
    KILN_CHECK(g != NULL && out_state != NULL, KILN_ERR_INVALID_ARG,
               "%s: graph and out_state must not be NULL", fn);
    KILN_TRY(check_binding_name(g, fn, name));
    snprintf(what, sizeof what, "state '%s'", name);
    KILN_TRY(check_decl(fn, what, dtype, rank, dims, dims, &want));
    KILN_CHECK(data == NULL ? nbytes == 0 : want == (uint64_t)nbytes, KILN_ERR_INVALID_ARG,
               "%s: %s %s %s needs %" PRIu64 " bytes of initial data but nbytes = %zu (pass "
               "data NULL and nbytes 0 for zeros)",
               fn, what, kiln_dtype_name(dtype), dims_str((char[160]){0}, 160, rank, dims, dims),
               want, nbytes);
    KILN_TRY(check_value_room(g, fn));
    KILN_CHECK(g->n_states < KILN_GRAPH_MAX_STATES, KILN_ERR_INVALID_ARG,
               "%s: the graph already has %u states, Kiln's limit", fn, KILN_GRAPH_MAX_STATES);
    KILN_TRY(GROW(g, values, g->n_values + 1));
    KILN_TRY(GROW(g, states, g->n_states + 1));
    memset(&v, 0, sizeof v);
    v.kind = KILN_IR_STATE;
    v.index = (uint32_t)g->n_states;
    v.desc.dtype = (uint32_t)dtype;
    kiln_shape_from_dims(&v.desc.shape, rank, dims);
    st.value = (int32_t)g->n_values;
    st.update = -1;
    st.data = NULL;
    st.nbytes = want;
    if (data != NULL) {
        st.data = kiln_malloc(nbytes > 0 ? nbytes : 1, KILN_DATA_ALIGN);
        KILN_CHECK(st.data != NULL, KILN_ERR_NO_MEMORY, "out of memory copying %s (%zu bytes)",
                   what, nbytes);
        if (nbytes > 0) memcpy(st.data, data, nbytes);
        st.nbytes = nbytes;
    }
    {
        kiln_status s2 = add_name(g, name, &v.name);
        if (s2 != KILN_OK) {
            if (st.data != NULL) kiln_free(st.data, nbytes > 0 ? nbytes : 1);
            return s2;
        }
    }
    g->states[g->n_states++] = st;
    g->values[g->n_values] = v;
    *out_state = (int32_t)g->n_values++;
    return KILN_OK;
}

kiln_status kiln_graph_update_state(kiln_graph *g, int32_t state, int32_t new_value) {
    static const char fn[] = "kiln_graph_update_state";
    KILN_CHECK(g != NULL, KILN_ERR_INVALID_ARG, "%s: graph is NULL", fn);
    KILN_CHECK(state >= 0 && (size_t)state < g->n_values && g->values[state].kind == KILN_IR_STATE,
               KILN_ERR_INVALID_ARG, "%s: value %" PRId32 " is not a state (kiln_graph_add_state)",
               fn, state);
    KILN_CHECK(new_value >= 0 && (size_t)new_value < g->n_values, KILN_ERR_INVALID_ARG,
               "%s: value %" PRId32 " does not exist (the graph has %zu values)", fn, new_value,
               g->n_values);
    {
        kiln_ir_state *s = &g->states[g->values[state].index];
        const kiln_value_desc *a = &g->values[state].desc, *b = &g->values[new_value].desc;
        const char *nm = kiln_graph_name(g, g->values[state].name);
        int same = a->dtype == b->dtype && a->shape.rank == b->shape.rank;
        for (uint32_t i = 0; same && i < a->shape.rank; i++) {
            same = b->shape.min[i] == a->shape.min[i] && b->shape.max[i] == a->shape.max[i];
        }
        KILN_CHECK(s->update < 0, KILN_ERR_INVALID_ARG,
                   "%s: state '%s' already has an update (value %" PRId32 ")", fn, nm, s->update);
        KILN_CHECK(same, KILN_ERR_INVALID_ARG,
                   "%s: state '%s' is %s %s but value %" PRId32 " is %s %s; an update keeps the "
                   "state's dtype and static shape",
                   fn, nm, kiln_dtype_name((kiln_dtype)a->dtype),
                   dims_str((char[160]){0}, 160, a->shape.rank, a->shape.min, a->shape.max),
                   new_value, kiln_dtype_name((kiln_dtype)b->dtype),
                   dims_str((char[160]){0}, 160, b->shape.rank, b->shape.min, b->shape.max));
        s->update = new_value;
    }
    return KILN_OK;
}

kiln_status kiln_graph_mark_output(kiln_graph *g, int32_t value, const char *name) {
    static const char fn[] = "kiln_graph_mark_output";
    kiln_ir_output o;
    KILN_CHECK(g != NULL, KILN_ERR_INVALID_ARG, "%s: graph is NULL", fn);
    KILN_CHECK(value >= 0 && (size_t)value < g->n_values, KILN_ERR_INVALID_ARG,
               "%s: value %" PRId32 " does not exist (the graph has %zu values)", fn, value,
               g->n_values);
    KILN_TRY(check_binding_name(g, fn, name));
    KILN_CHECK(g->n_outputs < KILN_GRAPH_MAX_IO, KILN_ERR_INVALID_ARG,
               "%s: the graph already has %u outputs, Kiln's limit", fn, KILN_GRAPH_MAX_IO);
    KILN_TRY(GROW(g, outputs, g->n_outputs + 1));
    o.value = value;
    KILN_TRY(add_name(g, name, &o.name));
    g->outputs[g->n_outputs++] = o;
    return KILN_OK;
}

kiln_status kiln_graph_value_info(const kiln_graph *g, int32_t value, kiln_dtype *out_dtype,
                                  uint32_t *out_rank, int64_t *out_dim_min, int64_t *out_dim_max) {
    const kiln_value_desc *d;
    KILN_CHECK(g != NULL, KILN_ERR_INVALID_ARG, "kiln_graph_value_info: graph is NULL");
    KILN_CHECK(value >= 0 && (size_t)value < g->n_values, KILN_ERR_INVALID_ARG,
               "kiln_graph_value_info: value %" PRId32 " does not exist (the graph has %zu "
               "values)",
               value, g->n_values);
    d = &g->values[value].desc;
    if (out_dtype != NULL) *out_dtype = (kiln_dtype)d->dtype;
    if (out_rank != NULL) *out_rank = d->shape.rank;
    for (uint32_t i = 0; i < d->shape.rank; i++) {
        if (out_dim_min != NULL) out_dim_min[i] = d->shape.min[i];
        if (out_dim_max != NULL) out_dim_max[i] = d->shape.max[i];
    }
    return KILN_OK;
}

// --- nodes

// "stride, padding, dilation, groups" or "none"
static const char *attr_names(char *buf, size_t n, const kiln_op_def *d) {
    size_t used = 0;
    snprintf(buf, n, "none");
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", d->attrs[i].name);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    return buf;
}

// Matches the caller's attributes to the op schema: given[i] is the kiln_attr for schema slot i
// or NULL (default).
static kiln_status match_attrs(const char *what, const kiln_op_def *d, const kiln_attr *attrs,
                               uint32_t n_attrs, const kiln_attr **given) {
    char names[256];
    for (uint32_t i = 0; i < d->n_attrs; i++) given[i] = NULL;
    for (uint32_t j = 0; j < n_attrs; j++) {
        const kiln_attr *a = &attrs[j];
        uint32_t slot = UINT32_MAX;
        const kiln_attr_info *s;
        KILN_CHECK(a->name != NULL, KILN_ERR_INVALID_ARG, "%s: attribute %u has a NULL name", what,
                   j);
        for (uint32_t i = 0; i < d->n_attrs; i++) {
            if (strcmp(d->attrs[i].name, a->name) == 0) slot = i;
        }
        KILN_CHECK(slot != UINT32_MAX, KILN_ERR_INVALID_ARG,
                   "%s: %s has no attribute '%.64s' (valid attributes: %s)", what, d->name, a->name,
                   attr_names(names, sizeof names, d));
        KILN_CHECK(given[slot] == NULL, KILN_ERR_INVALID_ARG, "%s: attribute '%s' is given twice",
                   what, a->name);
        s = &d->attrs[slot];
        if (s->kind == KILN_ATTR_INTS) {
            KILN_CHECK(a->floats == NULL && (a->ints != NULL || a->n == 0), KILN_ERR_INVALID_ARG,
                       "%s: attribute '%s' of %s takes integers: pass kiln_attr.ints (and leave "
                       "floats NULL)",
                       what, s->name, d->name);
        } else {
            KILN_CHECK(a->ints == NULL && (a->floats != NULL || a->n == 0), KILN_ERR_INVALID_ARG,
                       "%s: attribute '%s' of %s takes floats: pass kiln_attr.floats (and leave "
                       "ints NULL)",
                       what, s->name, d->name);
        }
        if (s->count >= 0) {
            KILN_CHECK(a->n == (uint32_t)s->count, KILN_ERR_INVALID_ARG,
                       "%s: attribute '%s' of %s takes %d value%s, got %u", what, s->name, d->name,
                       s->count, s->count == 1 ? "" : "s", a->n);
        } else {
            KILN_CHECK(a->n <= KILN_MAX_RANK, KILN_ERR_INVALID_ARG,
                       "%s: attribute '%s' of %s takes at most %d values, got %u", what, s->name,
                       d->name, KILN_MAX_RANK, a->n);
        }
        given[slot] = a;
    }
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        KILN_CHECK(given[i] != NULL || d->attrs[i].n_default > 0, KILN_ERR_INVALID_ARG,
                   "%s: %s needs attribute '%s' (attributes: %s)", what, d->name, d->attrs[i].name,
                   attr_names(names, sizeof names, d));
    }
    return KILN_OK;
}

kiln_status kiln_graph_add_node(kiln_graph *g, uint32_t op, const int32_t *inputs,
                                uint32_t n_inputs, const kiln_attr *attrs, uint32_t n_attrs,
                                int32_t *out_values, uint32_t n_outputs) {
    const kiln_op_def *d;
    const kiln_attr *given[KILN_MAX_ATTRS];
    const kiln_value_desc *descs[KILN_MAX_INPUTS];
    size_t n_ints = 0, n_floats = 0;
    size_t ids0, refs0, ints0, floats0;
    kiln_attrs view;
    kiln_value_desc out;
    kiln_ir_value v;
    kiln_ir_node node;
    kiln_status st;
    char what[64];

    KILN_CHECK(g != NULL, KILN_ERR_INVALID_ARG, "kiln_graph_add_node: graph is NULL");
    d = kiln_op_def_get(op);
    KILN_CHECK(d != NULL, KILN_ERR_INVALID_ARG,
               "kiln_graph_add_node: node %zu: unknown op id %u (kiln_op_count and kiln_op_id_at "
               "list the ops this Kiln knows)",
               g->n_nodes, op);
    snprintf(what, sizeof what, "node %zu (%s)", g->n_nodes, d->name);
    KILN_CHECK(g->n_nodes < KILN_GRAPH_MAX_NODES, KILN_ERR_INVALID_ARG,
               "%s: the graph already has %u nodes, Kiln's limit; split the model into several "
               "engines",
               what, KILN_GRAPH_MAX_NODES);
    KILN_TRY(check_value_room(g, what));
    KILN_CHECK(n_inputs >= d->min_inputs && n_inputs <= d->max_inputs, KILN_ERR_INVALID_ARG,
               "%s: %s takes %u to %u inputs, got %u", what, d->name, d->min_inputs, d->max_inputs,
               n_inputs);
    KILN_CHECK(n_inputs == 0 || inputs != NULL, KILN_ERR_INVALID_ARG, "%s: inputs is NULL", what);
    KILN_CHECK(n_outputs == d->n_outputs && out_values != NULL, KILN_ERR_INVALID_ARG,
               "%s: %s has %u output(s); pass n_outputs = %u and an out_values array", what,
               d->name, d->n_outputs, d->n_outputs);
    KILN_CHECK(n_attrs == 0 || attrs != NULL, KILN_ERR_INVALID_ARG,
               "%s: n_attrs = %u but attrs is NULL", what, n_attrs);
    for (uint32_t i = 0; i < n_inputs; i++) {
        int32_t id = inputs[i];
        if (id == -1) {
            KILN_CHECK(i < 32 && (d->optional_mask >> i & 1u), KILN_ERR_INVALID_ARG,
                       "%s: input %u is -1 (absent) but %s requires it", what, i, d->name);
            continue;
        }
        KILN_CHECK(id >= 0 && (size_t)id < g->n_values, KILN_ERR_INVALID_ARG,
                   "%s: input %u is value %" PRId32 ", which does not exist (the graph has %zu "
                   "values)",
                   what, i, id, g->n_values);
    }
    KILN_TRY(match_attrs(what, d, attrs, n_attrs, given));
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        uint32_t n = given[i] != NULL ? given[i]->n : d->attrs[i].n_default;
        if (d->attrs[i].kind == KILN_ATTR_INTS) {
            n_ints += n;
        } else {
            n_floats += n;
        }
    }

    KILN_TRY(GROW(g, ids, g->n_ids + n_inputs));
    KILN_TRY(GROW(g, attr_refs, g->n_attr_refs + d->n_attrs));
    KILN_TRY(GROW(g, ints, g->n_ints + n_ints));
    KILN_TRY(GROW(g, floats, g->n_floats + n_floats));
    KILN_TRY(GROW(g, values, g->n_values + 1));
    KILN_TRY(GROW(g, nodes, g->n_nodes + 1));

    // Append; rolled back below if inference rejects the node.
    ids0 = g->n_ids;
    refs0 = g->n_attr_refs;
    ints0 = g->n_ints;
    floats0 = g->n_floats;
    if (n_inputs > 0) memcpy(g->ids + g->n_ids, inputs, n_inputs * sizeof *inputs);
    g->n_ids += n_inputs;
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        const kiln_attr_info *s = &d->attrs[i];
        kiln_attr_ref *r = &g->attr_refs[g->n_attr_refs++];
        r->kind = s->kind;
        r->n = given[i] != NULL ? given[i]->n : s->n_default;
        if (s->kind == KILN_ATTR_INTS) {
            const int64_t *src = given[i] != NULL ? given[i]->ints : s->default_ints;
            r->begin = g->n_ints;
            if (r->n > 0) memcpy(g->ints + g->n_ints, src, r->n * sizeof *src);
            g->n_ints += r->n;
        } else {
            const double *src = given[i] != NULL ? given[i]->floats : s->default_floats;
            r->begin = g->n_floats;
            if (r->n > 0) memcpy(g->floats + g->n_floats, src, r->n * sizeof *src);
            g->n_floats += r->n;
        }
    }
    // After the grows: values may have moved.
    for (uint32_t i = 0; i < n_inputs; i++) {
        descs[i] = inputs[i] < 0 ? NULL : &g->values[inputs[i]].desc;
    }
    view.refs = d->n_attrs > 0 ? g->attr_refs + refs0 : NULL; // (NULL + 0 is undefined)
    view.n_attrs = d->n_attrs;
    view.ints = g->ints;
    view.floats = g->floats;
    st = kiln_infer(op, &view, descs, n_inputs, what, &out);
    if (st != KILN_OK) {
        g->n_ids = ids0;
        g->n_attr_refs = refs0;
        g->n_ints = ints0;
        g->n_floats = floats0;
        return st;
    }
    memset(&v, 0, sizeof v);
    v.kind = KILN_IR_NODE;
    v.index = (uint32_t)g->n_nodes;
    v.desc = out;
    node.op = op;
    node.input_begin = (uint32_t)ids0;
    node.n_inputs = n_inputs;
    node.attr_begin = (uint32_t)refs0;
    node.output = (int32_t)g->n_values;
    g->values[g->n_values] = v;
    g->nodes[g->n_nodes++] = node;
    out_values[0] = (int32_t)g->n_values++;
    return KILN_OK;
}
