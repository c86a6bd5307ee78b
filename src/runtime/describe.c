// SPDX-License-Identifier: Apache-2.0
// kiln_engine_describe (include/kiln/kiln_engine.h): engine bytes as JSON, after the loader's
// validation: header, section table with CRCs, bindings, every plan layer (op, input and output
// tensors with dtypes and shape ranges, attributes, fused tails, the weight bytes it reads), the
// memory plan and the weights. The schema is `kiln inspect --json`'s for engines (docs/cli.md);
// the C CLI and the Python `kiln` command print this text.
//
// Strings from the engine (tensor names, weight keys) are untrusted bytes: they are written as
// JSON with control characters escaped and bytes that are not UTF-8 written as \u00XX, so the
// output is valid JSON for any engine the loader accepts.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "kiln/kiln.h"
#include "runtime/format.h"
#include "runtime/load.h"

typedef struct jbuf {
    char *s;
    size_t n, cap;
    int need_comma;
    int oom;
} jbuf;

static void j_put(jbuf *j, const char *s, size_t n) {
    if (j->oom) return;
    if (j->n + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 4096;
        while (cap < j->n + n + 1) cap *= 2;
        char *q = kiln_malloc(cap, 1);
        if (q == NULL) {
            j->oom = 1;
            return;
        }
        if (j->n) memcpy(q, j->s, j->n);
        kiln_free(j->s, j->cap);
        j->s = q;
        j->cap = cap;
    }
    memcpy(j->s + j->n, s, n);
    j->n += n;
    j->s[j->n] = '\0';
}

static void j_printf(jbuf *j, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) j_put(j, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// Length of the valid UTF-8 sequence at p (1-4), or 0 if the bytes there are not one.
static size_t utf8_len(const unsigned char *p) {
    unsigned c = p[0];
    size_t n;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    unsigned cp = c & (0x3fu >> (n - 1));
    for (size_t k = 1; k < n; k++) {
        if ((p[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[k] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

static void j_str_raw(jbuf *j, const char *s) {
    j_put(j, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_len(p);
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            j_put(j, e, 2);
            p++;
        } else if (*p < 0x20 || *p == 0x7f || n == 0) {
            j_printf(j, "\\u%04x", (unsigned)*p);
            p++;
        } else {
            j_put(j, (const char *)p, n);
            p += n;
        }
    }
    j_put(j, "\"", 1);
}

static void j_sep(jbuf *j) {
    if (j->need_comma) j_put(j, ",", 1);
    j->need_comma = 0;
}
static void j_key(jbuf *j, const char *k) {
    j_sep(j);
    if (k) {
        j_str_raw(j, k);
        j_put(j, ":", 1);
    }
}
static void j_open(jbuf *j, const char *k, char c) {
    j_key(j, k);
    j_put(j, &c, 1);
    j->need_comma = 0;
}
static void j_close(jbuf *j, char c) {
    j_put(j, &c, 1);
    j->need_comma = 1;
}
static void j_str(jbuf *j, const char *k, const char *v) {
    j_key(j, k);
    j_str_raw(j, v);
    j->need_comma = 1;
}
static void j_u64(jbuf *j, const char *k, uint64_t v) {
    j_key(j, k);
    j_printf(j, "%" PRIu64, v);
    j->need_comma = 1;
}
static void j_i64(jbuf *j, const char *k, int64_t v) {
    j_key(j, k);
    j_printf(j, "%" PRId64, v);
    j->need_comma = 1;
}
static void j_f64(jbuf *j, const char *k, double v) {
    j_key(j, k);
    if (isfinite(v))
        j_printf(j, "%.17g", v);
    else
        j_put(j, "null", 4); // NaN ("none") and infinities are not JSON numbers
    j->need_comma = 1;
}
static void j_bool(jbuf *j, const char *k, int v) {
    j_key(j, k);
    j_put(j, v ? "true" : "false", v ? 4 : 5);
    j->need_comma = 1;
}

static const char *tensor_kind_name(uint32_t kind) {
    switch (kind) {
    case KILN_TENSOR_INPUT: return "input";
    case KILN_TENSOR_OUTPUT: return "output";
    case KILN_TENSOR_ACTIVATION: return "activation";
    case KILN_TENSOR_WEIGHT: return "weight";
    case KILN_TENSOR_STATE: return "state";
    default: return "invalid";
    }
}

static const char *precision_name(uint32_t p) {
    return p == KILN_PRECISION_FP16 ? "fp16" : p == KILN_PRECISION_BF16 ? "bf16" : "fp32";
}

static void json_tensor(jbuf *j, const kiln_plan *p, int32_t id) {
    j_open(j, NULL, '{');
    j_i64(j, "tensor", id);
    if (id >= 0) {
        const kiln_plan_tensor *t = &p->tensors[id];
        j_str(j, "name", kiln_plan_string(p, t->name));
        j_str(j, "kind", tensor_kind_name(t->kind));
        j_str(j, "dtype", kiln_dtype_name((kiln_dtype)t->dtype));
        j_open(j, "dim_min", '[');
        for (uint32_t d = 0; d < t->shape.rank; d++) j_i64(j, NULL, t->shape.min[d]);
        j_close(j, ']');
        j_open(j, "dim_max", '[');
        for (uint32_t d = 0; d < t->shape.rank; d++) j_i64(j, NULL, t->shape.max[d]);
        j_close(j, ']');
        if (t->kind == KILN_TENSOR_WEIGHT) {
            j_u64(j, "nbytes", t->nbytes);
            j_bool(j, "external", t->key != KILN_NO_KEY);
        }
        if (t->kind == KILN_TENSOR_STATE) {
            j_u64(j, "nbytes", t->nbytes);
            j_str(j, "initial",
                  t->key != KILN_NO_KEY          ? "external"
                  : t->offset == KILN_STATE_ZERO ? "zeros"
                                                 : "inline");
        }
    }
    j_close(j, '}');
}

static void json_attrs(jbuf *j, const kiln_plan *p, const kiln_plan_layer *l) {
    j_open(j, "attrs", '{');
    for (uint32_t a = 0; a < l->n_attrs; a++) {
        kiln_attr_info info;
        if (kiln_op_get_attr_info(l->op, a, &info) != KILN_OK) continue;
        const kiln_attr_ref *r = &p->attr_refs[l->attr_begin + a];
        j_open(j, info.name, '[');
        for (uint32_t k = 0; k < r->n; k++) {
            if (r->kind == KILN_ATTR_INTS)
                j_i64(j, NULL, p->ints[r->begin + k]);
            else
                j_f64(j, NULL, p->floats[r->begin + k]);
        }
        j_close(j, ']');
    }
    j_close(j, '}');
}

// Bytes of the weights a layer reads (each weight counted once per layer).
static uint64_t layer_weight_nbytes(const kiln_plan *p, const kiln_plan_layer *l) {
    uint64_t n = 0;
    for (uint32_t k = 0; k < l->n_inputs; k++) {
        int32_t id = p->ids[l->input_begin + k];
        if (id < 0 || p->tensors[id].kind != KILN_TENSOR_WEIGHT) continue;
        int seen = 0;
        for (uint32_t m = 0; m < k; m++) seen |= p->ids[l->input_begin + m] == id;
        if (!seen) n += p->tensors[id].nbytes;
    }
    return n;
}

static void describe(jbuf *j, const kiln_format_info *h, const kiln_plan *p) {
    uint32_t n_inline = 0, n_external = 0, n_activations = 0;
    uint64_t inline_nbytes = 0, external_nbytes = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind == KILN_TENSOR_ACTIVATION) n_activations++;
        if (t->kind != KILN_TENSOR_WEIGHT) continue;
        if (t->key == KILN_NO_KEY) {
            n_inline++;
            inline_nbytes += t->nbytes;
        } else {
            n_external++;
            external_nbytes += t->nbytes;
        }
    }
    j_open(j, NULL, '{');
    j_str(j, "kind", "engine");
    j_open(j, "header", '{');
    j_bool(j, "magic_ok", 1);
    j_u64(j, "format_version", h->format_version);
    j_u64(j, "header_nbytes", h->header_nbytes);
    j_u64(j, "flags", h->flags);
    j_u64(j, "file_nbytes", h->file_nbytes);
    j_u64(j, "writer_version", h->writer_version);
    j_u64(j, "header_crc32", h->header_crc32);
    j_close(j, '}');
    j_open(j, "sections", '[');
    for (uint32_t i = 0; i < h->n_sections; i++) {
        const kiln_format_section *s = &h->sections[i];
        j_open(j, NULL, '{');
        j_u64(j, "kind", s->kind);
        j_str(j, "name",
              s->kind < KILN_SECTION_KIND_COUNT ? kiln_format_section_name(s->kind) : "optional");
        j_u64(j, "flags", s->flags);
        j_u64(j, "offset", s->offset);
        j_u64(j, "nbytes", s->nbytes);
        j_u64(j, "crc32", s->crc32);
        j_bool(j, "crc_ok", s->crc32 == s->crc32_calc);
        j_close(j, '}');
    }
    j_close(j, ']');
    j_str(j, "precision", precision_name(p->precision));
    for (int io = 1; io >= 0; io--) {
        uint32_t n = io ? p->n_inputs : p->n_outputs;
        j_open(j, io ? "inputs" : "outputs", '[');
        for (uint32_t i = 0; i < n; i++)
            json_tensor(j, p, (int32_t)(io ? p->inputs[i] : p->outputs[i]));
        j_close(j, ']');
    }
    j_open(j, "layers", '[');
    for (uint32_t i = 0; i < p->n_layers; i++) {
        const kiln_plan_layer *l = &p->layers[i];
        j_open(j, NULL, '{');
        j_u64(j, "index", i);
        j_str(j, "op", kiln_op_name(l->op));
        j_bool(j, "tail", (l->flags & KILN_LAYER_TAIL) != 0);
        j_u64(j, "n_tail", l->n_tail);
        j_open(j, "fused", '[');
        for (uint32_t t = 1; t <= l->n_tail && i + t < p->n_layers; t++)
            j_str(j, NULL, kiln_op_name(p->layers[i + t].op));
        j_close(j, ']');
        j_u64(j, "weight_nbytes", layer_weight_nbytes(p, l));
        j_open(j, "inputs", '[');
        for (uint32_t k = 0; k < l->n_inputs; k++) json_tensor(j, p, p->ids[l->input_begin + k]);
        j_close(j, ']');
        j_open(j, "outputs", '[');
        for (uint32_t k = 0; k < l->n_outputs; k++) json_tensor(j, p, p->ids[l->output_begin + k]);
        j_close(j, ']');
        json_attrs(j, p, l);
        j_close(j, '}');
    }
    j_close(j, ']');
    j_open(j, "memory_plan", '{');
    j_u64(j, "arena_nbytes", p->arena_nbytes);
    j_u64(j, "n_activations", n_activations);
    j_open(j, "activations", '[');
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_ACTIVATION) continue;
        j_open(j, NULL, '{');
        j_u64(j, "tensor", i);
        j_u64(j, "offset", t->offset);
        j_u64(j, "nbytes", t->nbytes);
        j_close(j, '}');
    }
    j_close(j, ']');
    j_close(j, '}');
    j_open(j, "weights", '{');
    j_u64(j, "section_nbytes", p->weights_nbytes);
    j_u64(j, "n_inline", n_inline);
    j_u64(j, "inline_nbytes", inline_nbytes);
    j_u64(j, "n_external", n_external);
    j_u64(j, "external_nbytes", external_nbytes);
    j_open(j, "external", '[');
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_WEIGHT || t->key == KILN_NO_KEY) continue;
        j_open(j, NULL, '{');
        j_u64(j, "tensor", i);
        j_str(j, "key", kiln_plan_string(p, t->key));
        j_u64(j, "nbytes", t->nbytes);
        j_close(j, '}');
    }
    j_close(j, ']');
    j_close(j, '}');
    j_close(j, '}');
}

kiln_status kiln_engine_describe(const void *data, size_t nbytes, char *buf, size_t buf_nbytes,
                                 size_t *out_nbytes) {
    kiln_format_info h;
    kiln_plan p;
    jbuf j = {0};
    KILN_CHECK(data != NULL || nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_engine_describe: data is NULL");
    KILN_CHECK(out_nbytes != NULL, KILN_ERR_INVALID_ARG,
               "kiln_engine_describe: out_nbytes is NULL");
    KILN_CHECK(buf != NULL || buf_nbytes == 0, KILN_ERR_INVALID_ARG,
               "kiln_engine_describe: buf is NULL but buf_nbytes is %zu", buf_nbytes);
    KILN_TRY(kiln_format_parse(data, nbytes, &h));
    KILN_TRY(kiln_load_plan(data, nbytes, &p));
    describe(&j, &h, &p);
    kiln_plan_release(&p);
    if (j.oom) {
        kiln_free(j.s, j.cap);
        return kiln_fail(KILN_ERR_NO_MEMORY, "kiln_engine_describe: out of memory");
    }
    if (buf_nbytes > j.n) memcpy(buf, j.s, j.n + 1);
    *out_nbytes = j.n;
    kiln_free(j.s, j.cap);
    return KILN_OK;
}
