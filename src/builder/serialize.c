// SPDX-License-Identifier: Apache-2.0
// Writes a plan as engine format v1 (docs/format.md): header, section table, then the sections
// packed in kind order, each aligned (weights to 64 bytes) with zeroed padding. Deterministic: the
// output depends only on the plan (and the writer version recorded in the header). Fields that do
// not apply to a tensor's kind are written in their canonical form (0, or KILN_NO_KEY for key),
// which is what the loader requires.
#include <inttypes.h>
#include <string.h>

#include "builder/serialize.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/crc32.h"
#include "core/status.h"
#include "runtime/format.h"

#define N_KINDS (KILN_SECTION_KIND_COUNT - 1)

static kiln_status check_array(const void *ptr, uint64_t n, const char *what) {
    KILN_CHECK(ptr != NULL || n == 0, KILN_ERR_INVALID_ARG,
               "kiln_serialize: plan.%s is NULL but its count is %" PRIu64, what, n);
    return KILN_OK;
}

static void write_tensor(uint8_t *r, const kiln_plan_tensor *t) {
    int is_binding = t->kind == KILN_TENSOR_INPUT || t->kind == KILN_TENSOR_OUTPUT ||
                     t->kind == KILN_TENSOR_STATE;
    int is_weight = t->kind == KILN_TENSOR_WEIGHT || t->kind == KILN_TENSOR_STATE;
    int is_inline = is_weight && t->key == KILN_NO_KEY;
    int has_offset = t->kind == KILN_TENSOR_ACTIVATION || is_inline;
    int has_nbytes = t->kind == KILN_TENSOR_ACTIVATION || is_weight;
    kiln_wr_u32(r + 0, t->kind);
    kiln_wr_u32(r + 4, t->dtype);
    kiln_wr_u32(r + 8, t->shape.rank);
    kiln_wr_u32(r + 12, t->name);
    kiln_wr_u32(r + 16, is_binding ? t->binding : 0);
    kiln_wr_u32(r + 20, is_weight ? t->key : KILN_NO_KEY);
    kiln_wr_u64(r + 24, has_offset ? t->offset : 0);
    kiln_wr_u64(r + 32, has_nbytes ? t->nbytes : 0);
    uint32_t rank = t->shape.rank < KILN_MAX_RANK ? t->shape.rank : KILN_MAX_RANK;
    for (uint32_t d = 0; d < rank; d++) {
        kiln_wr_i64(r + 40 + 8 * d, t->shape.min[d]);
        kiln_wr_i64(r + 104 + 8 * d, t->shape.max[d]);
    }
}

static void write_layer(uint8_t *r, const kiln_plan_layer *l) {
    kiln_wr_u32(r + 0, l->op);
    kiln_wr_u32(r + 4, l->flags);
    kiln_wr_u32(r + 8, l->input_begin);
    kiln_wr_u32(r + 12, l->n_inputs);
    kiln_wr_u32(r + 16, l->output_begin);
    kiln_wr_u32(r + 20, l->n_outputs);
    kiln_wr_u32(r + 24, l->attr_begin);
    kiln_wr_u32(r + 28, l->n_attrs);
    kiln_wr_u32(r + 32, l->n_tail);
    // r + 36: reserved, 0 (the buffer is zeroed)
}

kiln_status kiln_serialize(const kiln_plan *plan, uint8_t **out_bytes, size_t *out_nbytes) {
    KILN_CHECK(plan != NULL && out_bytes != NULL && out_nbytes != NULL, KILN_ERR_INVALID_ARG,
               "kiln_serialize: plan, out_bytes and out_nbytes must not be NULL");
    KILN_TRY(check_array(plan->tensors, plan->n_tensors, "tensors"));
    KILN_TRY(check_array(plan->layers, plan->n_layers, "layers"));
    KILN_TRY(check_array(plan->ids, plan->n_ids, "ids"));
    KILN_TRY(check_array(plan->attr_refs, plan->n_attr_refs, "attr_refs"));
    KILN_TRY(check_array(plan->ints, plan->n_ints, "ints"));
    KILN_TRY(check_array(plan->floats, plan->n_floats, "floats"));
    KILN_TRY(check_array(plan->inputs, plan->n_inputs, "inputs"));
    KILN_TRY(check_array(plan->outputs, plan->n_outputs, "outputs"));
    KILN_TRY(check_array(plan->weights, plan->weights_nbytes, "weights"));
    KILN_CHECK(plan->strings != NULL && plan->strings_nbytes >= 1 && plan->strings[0] == '\0' &&
                   plan->strings[plan->strings_nbytes - 1] == '\0',
               KILN_ERR_INVALID_ARG,
               "kiln_serialize: plan.strings must be non-empty and start and end with NUL");

    // Section sizes, in kind order (kind = index + 1). Counts are 32-bit or bounded by memory
    // the plan already holds, so only the 64-bit pools and the total need checked math.
    uint64_t size[N_KINDS];
    size[KILN_SECTION_PLAN - 1] = KILN_FORMAT_PLAN_NBYTES;
    size[KILN_SECTION_BINDINGS - 1] = 8 + 4 * ((uint64_t)plan->n_inputs + plan->n_outputs);
    size[KILN_SECTION_STRINGS - 1] = plan->strings_nbytes;
    size[KILN_SECTION_TENSORS - 1] = (uint64_t)plan->n_tensors * KILN_FORMAT_TENSOR_NBYTES;
    size[KILN_SECTION_LAYERS - 1] = (uint64_t)plan->n_layers * KILN_FORMAT_LAYER_NBYTES;
    size[KILN_SECTION_IDS - 1] = (uint64_t)plan->n_ids * 4;
    size[KILN_SECTION_ATTR_REFS - 1] = (uint64_t)plan->n_attr_refs * KILN_FORMAT_ATTR_REF_NBYTES;
    KILN_CHECK(kiln_mul_u64(plan->n_ints, 8, &size[KILN_SECTION_INTS - 1]) &&
                   kiln_mul_u64(plan->n_floats, 8, &size[KILN_SECTION_FLOATS - 1]),
               KILN_ERR_INVALID_ARG, "kiln_serialize: attribute pools too large");
    size[KILN_SECTION_WEIGHTS - 1] = plan->weights_nbytes;

    uint64_t offset[N_KINDS];
    uint64_t end = KILN_FORMAT_HEADER_NBYTES + (uint64_t)N_KINDS * KILN_FORMAT_SECTION_ENTRY_NBYTES;
    for (int k = 0; k < N_KINDS; k++) {
        KILN_CHECK(kiln_align_up_u64(end, kiln_format_section_align((uint32_t)k + 1), &offset[k]) &&
                       kiln_add_u64(offset[k], size[k], &end),
                   KILN_ERR_INVALID_ARG, "kiln_serialize: engine size overflows");
    }
    KILN_CHECK(end <= SIZE_MAX, KILN_ERR_NO_MEMORY,
               "kiln_serialize: a %" PRIu64 "-byte engine does not fit in memory", end);
    size_t total = (size_t)end;
    uint8_t *buf = kiln_calloc(total, KILN_DATA_ALIGN);
    KILN_CHECK(buf != NULL, KILN_ERR_NO_MEMORY,
               "kiln_serialize: out of memory allocating %zu bytes for the engine", total);

    // --- sections
    uint8_t *s = buf + offset[KILN_SECTION_PLAN - 1];
    kiln_wr_u64(s, plan->arena_nbytes);
    kiln_wr_u32(s + 8, plan->precision);

    s = buf + offset[KILN_SECTION_BINDINGS - 1];
    kiln_wr_u32(s, plan->n_inputs);
    kiln_wr_u32(s + 4, plan->n_outputs);
    for (uint32_t i = 0; i < plan->n_inputs; i++)
        kiln_wr_u32(s + 8 + 4 * (size_t)i, plan->inputs[i]);
    s += 8 + 4 * (size_t)plan->n_inputs;
    for (uint32_t i = 0; i < plan->n_outputs; i++) kiln_wr_u32(s + 4 * (size_t)i, plan->outputs[i]);

    memcpy(buf + offset[KILN_SECTION_STRINGS - 1], plan->strings, (size_t)plan->strings_nbytes);

    s = buf + offset[KILN_SECTION_TENSORS - 1];
    for (uint32_t i = 0; i < plan->n_tensors; i++) {
        write_tensor(s + (size_t)i * KILN_FORMAT_TENSOR_NBYTES, &plan->tensors[i]);
    }
    s = buf + offset[KILN_SECTION_LAYERS - 1];
    for (uint32_t i = 0; i < plan->n_layers; i++) {
        write_layer(s + (size_t)i * KILN_FORMAT_LAYER_NBYTES, &plan->layers[i]);
    }
    s = buf + offset[KILN_SECTION_IDS - 1];
    for (uint32_t i = 0; i < plan->n_ids; i++)
        kiln_wr_u32(s + 4 * (size_t)i, (uint32_t)plan->ids[i]);
    s = buf + offset[KILN_SECTION_ATTR_REFS - 1];
    for (uint32_t i = 0; i < plan->n_attr_refs; i++) {
        uint8_t *r = s + (size_t)i * KILN_FORMAT_ATTR_REF_NBYTES;
        kiln_wr_u32(r, plan->attr_refs[i].kind);
        kiln_wr_u32(r + 4, plan->attr_refs[i].n);
        kiln_wr_u64(r + 8, plan->attr_refs[i].begin);
    }
    s = buf + offset[KILN_SECTION_INTS - 1];
    for (uint64_t i = 0; i < plan->n_ints; i++) kiln_wr_i64(s + 8 * i, plan->ints[i]);
    s = buf + offset[KILN_SECTION_FLOATS - 1];
    for (uint64_t i = 0; i < plan->n_floats; i++) {
        uint64_t u;
        memcpy(&u, &plan->floats[i], sizeof u);
        kiln_wr_u64(s + 8 * i, u);
    }
    if (plan->weights_nbytes > 0) {
        memcpy(buf + offset[KILN_SECTION_WEIGHTS - 1], plan->weights, (size_t)plan->weights_nbytes);
    }

    // --- header and section table (CRCs last)
    memcpy(buf, KILN_FORMAT_MAGIC, KILN_FORMAT_MAGIC_NBYTES);
    kiln_wr_u32(buf + KILN_FORMAT_OFF_VERSION, KILN_FORMAT_VERSION);
    kiln_wr_u32(buf + KILN_FORMAT_OFF_HEADER_NBYTES, KILN_FORMAT_HEADER_NBYTES);
    kiln_wr_u32(buf + KILN_FORMAT_OFF_FLAGS, 0);
    kiln_wr_u32(buf + KILN_FORMAT_OFF_N_SECTIONS, N_KINDS);
    kiln_wr_u64(buf + KILN_FORMAT_OFF_FILE_NBYTES, end);
    kiln_wr_u32(buf + KILN_FORMAT_OFF_WRITER_VERSION, kiln_version());
    for (int k = 0; k < N_KINDS; k++) {
        uint8_t *e = buf + KILN_FORMAT_HEADER_NBYTES + (size_t)k * KILN_FORMAT_SECTION_ENTRY_NBYTES;
        kiln_wr_u32(e, (uint32_t)k + 1);
        kiln_wr_u64(e + 8, offset[k]);
        kiln_wr_u64(e + 16, size[k]);
        kiln_wr_u32(e + 24, kiln_crc32(0, buf + offset[k], (size_t)size[k]));
    }
    size_t table_end =
        KILN_FORMAT_HEADER_NBYTES + (size_t)N_KINDS * KILN_FORMAT_SECTION_ENTRY_NBYTES;
    kiln_wr_u32(buf + KILN_FORMAT_OFF_HEADER_CRC, kiln_format_header_crc(buf, table_end));

    *out_bytes = buf;
    *out_nbytes = total;
    return KILN_OK;
}
