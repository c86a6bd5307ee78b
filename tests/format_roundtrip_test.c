// SPDX-License-Identifier: Apache-2.0
// Engine format v1 round trip: hand-built plans -> kiln_serialize -> bytes checked against
// docs/format.md with an independent reader (byte offsets and a bitwise CRC-32 written here) ->
// kiln_load_plan -> equal field for field -> kiln_serialize again -> identical bytes. Also:
// determinism, loading from every misalignment 1..15, canonical form of inapplicable fields, and
// an allocation-failure sweep over the loader (every kiln_malloc failed in turn: NO_MEMORY, no
// leak).
#include "builder/builder.h"
#include "builder/serialize.h"
#include "check.h"
#include "format_built.h"
#include "format_fixtures.h"
#include "kiln/kiln.h"
#include "runtime/load.h"

// --- an independent reader of the bytes (not the library's helpers)

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static uint32_t crc32_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static void check_layout(const kiln_plan *plan, const uint8_t *e, size_t n) {
    CHECK(n >= 360);
    CHECK(memcmp(e, "\x89KLN\r\n\x1a\n", 8) == 0);
    CHECK_EQ_INT(le32(e + 8), 1);
    CHECK_EQ_INT(le32(e + 12), 40);
    CHECK_EQ_INT(le32(e + 16), 0);
    CHECK_EQ_INT(le32(e + 20), 10);
    CHECK_EQ_INT(le64(e + 24), n);
    CHECK_EQ_INT(le32(e + 32), kiln_version());
    uint8_t head[360];
    memcpy(head, e, sizeof head);
    memset(head + 36, 0, 4);
    CHECK_EQ_INT(le32(e + 36), crc32_bitwise(head, sizeof head));
    uint64_t end = 360;
    for (uint32_t i = 0; i < 10; i++) {
        const uint8_t *s = e + 40 + 32 * i;
        uint32_t kind = le32(s);
        uint64_t off = le64(s + 8), nb = le64(s + 16);
        uint64_t align = kind == 10 ? 64 : 8;
        CHECK_EQ_INT(kind, i + 1);
        CHECK_EQ_INT(le32(s + 4), 0);
        CHECK_EQ_INT(off, (end + align - 1) / align * align);
        for (uint64_t b = end; b < off; b++) CHECK(e[b] == 0);
        CHECK_EQ_INT(le32(s + 24), crc32_bitwise(e + off, (size_t)nb));
        CHECK_EQ_INT(le32(s + 28), 0);
        end = off + nb;
        switch (kind) {
        case 1:
            CHECK_EQ_INT(nb, 16);
            CHECK_EQ_INT(le64(e + off), plan->arena_nbytes);
            CHECK_EQ_INT(le32(e + off + 8), plan->precision);
            break;
        case 2:
            CHECK_EQ_INT(le32(e + off), plan->n_inputs);
            CHECK_EQ_INT(le32(e + off + 4), plan->n_outputs);
            CHECK_EQ_INT(nb, 8 + 4 * (plan->n_inputs + plan->n_outputs));
            if (plan->n_outputs > 0) {
                CHECK_EQ_INT(le32(e + off + 8 + 4 * plan->n_inputs), plan->outputs[0]);
            }
            break;
        case 3: CHECK(nb == plan->strings_nbytes && memcmp(e + off, plan->strings, nb) == 0); break;
        case 4:
            CHECK_EQ_INT(nb, 168 * plan->n_tensors);
            for (uint32_t t = 0; t < plan->n_tensors; t++) {
                const uint8_t *r = e + off + 168 * t;
                const kiln_plan_tensor *pt = &plan->tensors[t];
                CHECK_EQ_INT(le32(r), pt->kind);
                CHECK_EQ_INT(le32(r + 4), pt->dtype);
                CHECK_EQ_INT(le32(r + 8), pt->shape.rank);
                CHECK_EQ_INT(le32(r + 12), pt->name);
                CHECK_EQ_INT(le32(r + 20), pt->key);
                CHECK_EQ_INT(le64(r + 24), pt->offset);
                CHECK_EQ_INT(le64(r + 32), pt->nbytes);
                for (uint32_t d = 0; d < 8; d++) {
                    int64_t lo = d < pt->shape.rank ? pt->shape.min[d] : 0;
                    int64_t hi = d < pt->shape.rank ? pt->shape.max[d] : 0;
                    CHECK_EQ_INT((int64_t)le64(r + 40 + 8 * d), lo);
                    CHECK_EQ_INT((int64_t)le64(r + 104 + 8 * d), hi);
                }
            }
            break;
        case 5:
            CHECK_EQ_INT(nb, 40 * plan->n_layers);
            for (uint32_t l = 0; l < plan->n_layers; l++) {
                const uint8_t *r = e + off + 40 * l;
                const kiln_plan_layer *pl = &plan->layers[l];
                CHECK(le32(r) == pl->op && le32(r + 4) == pl->flags &&
                      le32(r + 8) == pl->input_begin && le32(r + 12) == pl->n_inputs &&
                      le32(r + 16) == pl->output_begin && le32(r + 20) == pl->n_outputs &&
                      le32(r + 24) == pl->attr_begin && le32(r + 28) == pl->n_attrs &&
                      le32(r + 32) == pl->n_tail && le32(r + 36) == 0);
            }
            break;
        case 6:
            CHECK_EQ_INT(nb, 4 * plan->n_ids);
            for (uint32_t j = 0; j < plan->n_ids; j++) {
                CHECK_EQ_INT((int32_t)le32(e + off + 4 * j), plan->ids[j]);
            }
            break;
        case 7:
            CHECK_EQ_INT(nb, 16 * plan->n_attr_refs);
            for (uint32_t j = 0; j < plan->n_attr_refs; j++) {
                CHECK(le32(e + off + 16 * j) == plan->attr_refs[j].kind &&
                      le32(e + off + 16 * j + 4) == plan->attr_refs[j].n &&
                      le64(e + off + 16 * j + 8) == plan->attr_refs[j].begin);
            }
            break;
        case 8:
            CHECK_EQ_INT(nb, 8 * plan->n_ints);
            for (uint64_t j = 0; j < plan->n_ints; j++) {
                CHECK_EQ_INT((int64_t)le64(e + off + 8 * j), plan->ints[j]);
            }
            break;
        case 9:
            CHECK_EQ_INT(nb, 8 * plan->n_floats);
            for (uint64_t j = 0; j < plan->n_floats; j++) {
                uint64_t u;
                memcpy(&u, &plan->floats[j], 8);
                CHECK(le64(e + off + 8 * j) == u);
            }
            break;
        case 10:
            CHECK_EQ_INT(off % 64, 0);
            CHECK(nb == plan->weights_nbytes &&
                  (nb == 0 || memcmp(e + off, plan->weights, nb) == 0));
            break;
        default: break;
        }
    }
    CHECK_EQ_INT(end, n);
}

// --- allocation-failure injection

static long fail_at, n_allocs, live_allocs;
static void *failing_alloc(void *ud, size_t nbytes, size_t align) {
    (void)ud;
    if (++n_allocs == fail_at) return NULL;
    size_t rounded = (nbytes + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded == 0 ? align : rounded);
    if (p) live_allocs++;
    return p;
}
static void counting_free(void *ud, void *p, size_t nbytes) {
    (void)ud;
    (void)nbytes;
    if (p) live_allocs--;
    free(p);
}

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

static void test_fixture(int which) {
    kiln_plan plan;
    fx_make(which, &plan);
    uint8_t *e1 = NULL, *e2 = NULL, *e3 = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0;
    CHECK_OK(kiln_serialize(&plan, &e1, &n1));
    CHECK_OK(kiln_serialize(&plan, &e3, &n3));
    CHECK_MSG(n1 == n3 && memcmp(e1, e3, n1) == 0, "%s: serialize is not deterministic",
              fx_name(which));
    check_layout(&plan, e1, n1);

    kiln_plan loaded;
    kiln_status st = kiln_load_plan(e1, n1, &loaded);
    CHECK_MSG(st == KILN_OK, "%s: load failed: %s", fx_name(which), kiln_last_error());
    if (st == KILN_OK) {
        const char *diff = fx_plan_diff(&plan, &loaded);
        CHECK_MSG(diff == NULL, "%s: loaded plan differs in %s", fx_name(which), diff);
        CHECK((void *)loaded.weights != (void *)e1); // copied, not borrowed
        CHECK_OK(kiln_serialize(&loaded, &e2, &n2));
        CHECK_MSG(n1 == n2 && memcmp(e1, e2, n1) == 0, "%s: re-serialized bytes differ",
                  fx_name(which));
        kiln_plan_release(&loaded);
        CHECK(loaded.tensors == NULL && loaded.n_tensors == 0);
    }

    // Misaligned base pointers: fields are read byte-wise, so every shift loads.
    uint8_t *shifted = malloc(n1 + 16);
    for (size_t shift = 1; shift < 16; shift++) {
        memcpy(shifted + shift, e1, n1);
        st = kiln_load_plan(shifted + shift, n1, &loaded);
        CHECK_MSG(st == KILN_OK, "%s: load at misalignment %zu: %s", fx_name(which), shift,
                  kiln_last_error());
        if (st == KILN_OK) {
            CHECK(fx_plan_diff(&plan, &loaded) == NULL);
            kiln_plan_release(&loaded);
        }
    }
    free(shifted);

    // Fields that do not apply to a tensor's kind are written canonically.
    kiln_plan_tensor saved = plan.tensors[0];
    plan.tensors[0].offset = 12345; // tensor 0 of every fixture is an input
    plan.tensors[0].nbytes = 777;
    plan.tensors[0].key = 3;
    uint8_t *e4 = NULL;
    size_t n4 = 0;
    CHECK_OK(kiln_serialize(&plan, &e4, &n4));
    CHECK(n4 == n1 && memcmp(e4, e1, n1) == 0);
    plan.tensors[0] = saved;

    // Allocation failures: each kiln_malloc of a load failed in turn.
    kiln_log_set(quiet_log, NULL, KILN_LOG_DEBUG);
    kiln_allocator a = {NULL, failing_alloc, counting_free};
    long total = -1;
    for (fail_at = 1; fail_at < 200; fail_at++) {
        n_allocs = 0;
        live_allocs = 0;
        CHECK_OK(kiln_set_allocator(&a));
        st = kiln_load_plan(e1, n1, &loaded);
        if (st == KILN_OK) kiln_plan_release(&loaded);
        long leaked = live_allocs;
        kiln_set_allocator(NULL);
        CHECK_MSG(leaked == 0, "%s: %ld allocations leaked when allocation %ld failed",
                  fx_name(which), leaked, fail_at);
        if (st == KILN_OK) {
            total = fail_at - 1;
            break;
        }
        CHECK_MSG(st == KILN_ERR_NO_MEMORY, "%s: allocation %ld failed: got %s", fx_name(which),
                  fail_at, kiln_status_str(st));
    }
    CHECK_MSG(total > 5, "%s: the allocation sweep ended after %ld allocations", fx_name(which),
              total);
    kiln_log_set(NULL, NULL, KILN_LOG_WARN);

    kiln_free(e1, n1);
    kiln_free(e2, n2);
    kiln_free(e3, n3);
    kiln_free(e4, n4);
    kiln_plan_release(&plan);
}

// --- engines built through the public graph API

typedef struct resolver_ctx {
    const kiln_built *built;
    int calls;
} resolver_ctx;

static kiln_status resolve(void *ud, const char *key, const void **out_data, size_t *out_nbytes) {
    resolver_ctx *r = ud;
    for (uint32_t i = 0; i < kiln_built_n_weights(r->built); i++) {
        const char *k;
        if (kiln_built_weight(r->built, i, &k, out_data, out_nbytes) == KILN_OK &&
            strcmp(k, key) == 0) {
            r->calls++;
            return KILN_OK;
        }
    }
    return KILN_ERR_MISSING_DATA;
}

static void test_built(int graph, int variant) {
    const char *name = fb_name(graph), *var = fb_variant(graph >= 0 ? variant : 0);
    kiln_built *b1 = NULL, *b2 = NULL;
    kiln_status st = fb_build(graph, variant, &b1);
    CHECK_MSG(st == KILN_OK, "%s/%s: build failed: %s", name, var, kiln_last_error());
    if (st != KILN_OK) return;
    CHECK_OK(fb_build(graph, variant, &b2));
    const void *d1 = NULL, *d2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK_OK(kiln_built_engine(b1, &d1, &n1));
    if (b2 != NULL) CHECK_OK(kiln_built_engine(b2, &d2, &n2));
    CHECK_MSG(d2 != NULL && n1 == n2 && memcmp(d1, d2, n1) == 0,
              "%s/%s: build is not deterministic", name, var);

    // bytes -> plan -> bytes
    kiln_plan loaded;
    st = kiln_load_plan(d1, n1, &loaded);
    CHECK_MSG(st == KILN_OK, "%s/%s: a built engine does not load: %s", name, var,
              kiln_last_error());
    if (st == KILN_OK) {
        check_layout(&loaded, d1, n1);
        uint8_t *e = NULL;
        size_t n = 0;
        CHECK_OK(kiln_serialize(&loaded, &e, &n));
        CHECK_MSG(n == n1 && memcmp(e, d1, n) == 0, "%s/%s: re-serialized bytes differ", name, var);
        kiln_free(e, n);
        uint32_t n_ext = 0;
        for (uint32_t t = 0; t < loaded.n_tensors; t++) {
            n_ext += loaded.tensors[t].kind == KILN_TENSOR_WEIGHT &&
                     loaded.tensors[t].key != KILN_NO_KEY;
        }
        CHECK_MSG((variant == 2) == (n_ext > 0), "%s/%s: %u external weights", name, var, n_ext);
        CHECK(n_ext == 0 || loaded.weights_nbytes == 0);
        CHECK_EQ_INT(loaded.precision, variant == 1 ? KILN_PRECISION_FP16 : KILN_PRECISION_FP32);
        kiln_plan_release(&loaded);
    }

    // plan -> bytes -> plan, for the builder's own plan
    kiln_graph *g = NULL;
    CHECK_OK(fb_graph(graph, &g));
    kiln_build_options o;
    fb_options(variant, &o);
    kiln_plan built;
    st = kiln_build_plan(g, &o, &built, NULL);
    CHECK_MSG(st == KILN_OK, "%s/%s: build_plan: %s", name, var, kiln_last_error());
    if (st == KILN_OK) {
        uint8_t *e = NULL;
        size_t n = 0;
        CHECK_OK(kiln_serialize(&built, &e, &n));
        CHECK(n == n1 && memcmp(e, d1, n) == 0);
        if (kiln_load_plan(e, n, &loaded) == KILN_OK) {
            const char *diff = fx_plan_diff(&built, &loaded);
            CHECK_MSG(diff == NULL, "%s/%s: loaded plan differs from the built one in %s", name,
                      var, diff);
            kiln_plan_release(&loaded);
        }
        kiln_free(e, n);
        kiln_plan_release(&built);
    }
    kiln_graph_free(g);

    // The public runtime loads it (resolving external weights by key).
    resolver_ctx rc = {b1, 0};
    kiln_load_options lo;
    kiln_load_options_init(&lo);
    lo.resolve = resolve;
    lo.resolve_user_data = &rc;
    kiln_engine *eng = NULL;
    st = kiln_engine_load(d1, n1, &lo, &eng);
    CHECK_MSG(st == KILN_OK, "%s/%s: kiln_engine_load: %s", name, var, kiln_last_error());
    CHECK(variant != 2 || rc.calls > 0);
    kiln_engine_free(eng);
    kiln_built_free(b1);
    kiln_built_free(b2);
}

int main(void) {
    for (int i = 0; i < FX_N_FIXTURES; i++) test_fixture(i);
    for (int g = 0; g < FB_N_GRAPHS; g++) {
        for (int v = 0; v < FB_N_VARIANTS; v++) test_built(g, v);
    }
    // Arguments.
    uint8_t *b;
    size_t n;
    kiln_plan p;
    CHECK_STATUS(kiln_serialize(NULL, &b, &n), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_load_plan(NULL, 0, &p), KILN_ERR_NOT_ENGINE);
    CHECK_STATUS(kiln_load_plan(NULL, 5, &p), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_load_plan("x", 1, NULL), KILN_ERR_INVALID_ARG);
    kiln_plan_release(NULL);
    return check_summary();
}
