// SPDX-License-Identifier: Apache-2.0
// Fuzz target: bytes -> a little program of public graph-API calls (add_input, add_constant,
// add_node with fuzzed op ids, inputs and attributes, mark_output, build options) -> kiln_build.
// Must never crash; whatever builds must load (kiln_load_plan and kiln_engine_load), must build
// byte-identically a second time, and a loaded plan must serialize back to the same bytes. Small
// engines are also executed on the CPU. Built as a libFuzzer target (KILN_FUZZ) and, in every
// build, as a corpus replay (fuzz/fuzz.cmake).
//
// Program encoding (each read past the end yields 0):
//   byte 0: build flags (bit 0 fp16, bit 1 bf16, bit 2 external weights, bit 3 no optimize)
//   then instructions, opcode = byte % 4:
//     0 input:    dtype, rank (0..4), per dim: min (0..4), extra (0..3)
//     1 constant: dtype, rank (0..3), per dim (1..4); data from a counter
//     2 node:     op selector, n_inputs, input selectors, attribute presence mask, values
//     3 output:   value selector
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder/serialize.h"
#include "core/alloc.h"
#include "kiln/kiln.h"
#include "runtime/format.h"
#include "runtime/load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_VALUES 256
#define MAX_EXEC_NBYTES (UINT64_C(1) << 20)

typedef struct reader {
    const uint8_t *p;
    size_t n, i;
} reader;

static uint8_t next(reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static int64_t next_small(reader *r) { return (int64_t)(next(r) % 12) - 3; } // -3..8

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

static kiln_dtype pick_dtype(reader *r) {
    static const kiln_dtype d[] = {KILN_DTYPE_F32,  KILN_DTYPE_F32,    KILN_DTYPE_F16,
                                   KILN_DTYPE_BF16, KILN_DTYPE_I32,    KILN_DTYPE_I64,
                                   KILN_DTYPE_BOOL, KILN_DTYPE_INVALID};
    return d[next(r) % 8];
}

static void add_node(kiln_graph *g, reader *r, int32_t *values, uint32_t *n_values) {
    uint8_t sel = next(r);
    uint32_t op = sel < 240 ? kiln_op_id_at(sel % kiln_op_count()) : next(r); // sometimes raw
    kiln_op_info info;
    int known = kiln_op_get_info(op, &info) == KILN_OK;
    uint32_t n_in = known ? info.min_inputs + next(r) % 3 : next(r) % 4;
    if (n_in > 8) n_in = 8;
    int32_t in[8];
    for (uint32_t i = 0; i < n_in; i++) {
        uint8_t b = next(r);
        in[i] = (b >= 250 || *n_values == 0) ? -1 : values[b % *n_values];
    }
    kiln_attr attrs[8];
    int64_t ints[8][8];
    double floats[8][8];
    uint32_t n_attrs = 0;
    uint8_t mask = next(r);
    for (uint32_t a = 0; known && a < info.n_attrs && a < 8; a++) {
        if (!(mask >> a & 1)) continue; // absent: the schema default (or an error if required)
        kiln_attr_info ai;
        if (kiln_op_get_attr_info(op, a, &ai) != KILN_OK) continue;
        uint32_t n = ai.count >= 0 ? (uint32_t)ai.count : next(r) % 5;
        if (next(r) % 16 == 0) n = next(r) % 9; // wrong counts now and then
        if (n > 8) n = 8;
        attrs[n_attrs] = (kiln_attr){.name = ai.name, .n = n};
        if (ai.kind == KILN_ATTR_INTS) {
            for (uint32_t k = 0; k < n; k++) ints[n_attrs][k] = next_small(r);
            attrs[n_attrs].ints = ints[n_attrs];
        } else {
            for (uint32_t k = 0; k < n; k++) floats[n_attrs][k] = (double)next_small(r) * 0.25;
            attrs[n_attrs].floats = floats[n_attrs];
        }
        n_attrs++;
    }
    int32_t out[2];
    uint32_t n_out = known ? info.n_outputs : 1;
    if (kiln_graph_add_node(g, op, in, n_in, attrs, n_attrs, out, n_out) == KILN_OK) {
        for (uint32_t k = 0; k < n_out && *n_values < MAX_VALUES; k++)
            values[(*n_values)++] = out[k];
    }
}

static void run_program(kiln_graph *g, reader *r, int32_t *values, uint32_t *n_values) {
    char name[32];
    uint32_t n_inputs = 0, n_outputs = 0;
    for (int steps = 0; steps < 64 && r->i < r->n && *n_values < MAX_VALUES; steps++) {
        int64_t mn[KILN_MAX_RANK], mx[KILN_MAX_RANK];
        int32_t v;
        switch (next(r) % 4) {
        case 0: {
            kiln_dtype dt = pick_dtype(r);
            uint32_t rank = next(r) % 5;
            for (uint32_t d = 0; d < rank; d++) {
                mn[d] = next(r) % 5;
                mx[d] = mn[d] + next(r) % 4;
            }
            snprintf(name, sizeof name, "in%u", n_inputs++ % 5); // duplicates now and then
            if (kiln_graph_add_input(g, name, dt, rank, mn, mx, &v) == KILN_OK) {
                values[(*n_values)++] = v;
            }
            break;
        }
        case 1: {
            kiln_dtype dt = pick_dtype(r);
            uint32_t rank = next(r) % 4;
            size_t numel = 1;
            for (uint32_t d = 0; d < rank; d++) {
                mn[d] = 1 + next(r) % 4;
                numel *= (size_t)mn[d];
            }
            size_t nbytes = numel * (dt == KILN_DTYPE_INVALID ? 1 : kiln_dtype_size(dt));
            uint8_t buf[64 * 8];
            uint8_t seed = next(r);
            for (size_t k = 0; k < nbytes; k++) {
                // Small non-negative integers and finite floats near 1 (index-safe-ish).
                buf[k] = (uint8_t)(dt == KILN_DTYPE_F32 && k % 4 == 3 ? 0x3f : (seed + k) % 3);
            }
            if (kiln_graph_add_constant(g, NULL, dt, rank, mn, buf, nbytes, &v) == KILN_OK) {
                values[(*n_values)++] = v;
            }
            break;
        }
        case 2: add_node(g, r, values, n_values); break;
        default:
            if (*n_values == 0) break;
            snprintf(name, sizeof name, "out%u", n_outputs++ % 6);
            (void)kiln_graph_mark_output(g, values[next(r) % *n_values], name);
            break;
        }
    }
}

typedef struct resolver_ctx {
    const kiln_built *built;
} resolver_ctx;

static kiln_status resolve(void *ud, const char *key, const void **out_data, size_t *out_nbytes) {
    const resolver_ctx *rc = ud;
    for (uint32_t i = 0; i < kiln_built_n_weights(rc->built); i++) {
        const char *k;
        if (kiln_built_weight(rc->built, i, &k, out_data, out_nbytes) == KILN_OK &&
            strcmp(k, key) == 0)
            return KILN_OK;
    }
    return KILN_ERR_MISSING_DATA;
}

static void execute(kiln_engine *e) {
    kiln_context *c = NULL;
    void *bufs[128] = {0};
    uint32_t n_in = kiln_engine_n_inputs(e), n_out = kiln_engine_n_outputs(e);
    if (kiln_engine_arena_nbytes(e) > MAX_EXEC_NBYTES || n_in > 64 || n_out > 64) return;
    if (kiln_context_new(e, &c) != KILN_OK) return;
    for (uint32_t i = 0; i < n_in; i++) {
        kiln_binding_info b;
        if (kiln_engine_binding(e, 1, i, &b) != KILN_OK || b.max_nbytes > MAX_EXEC_NBYTES)
            goto done;
        bufs[i] = calloc(1, (size_t)b.max_nbytes + 1); // zeros: in range for index inputs
        if (kiln_context_set_input(c, i, b.rank, b.dim_max, bufs[i]) != KILN_OK) goto done;
    }
    for (uint32_t i = 0; i < n_out; i++) {
        kiln_binding_info b;
        if (kiln_engine_binding(e, 0, i, &b) != KILN_OK || b.max_nbytes > MAX_EXEC_NBYTES)
            goto done;
        bufs[64 + i] = malloc((size_t)b.max_nbytes + 1);
        if (kiln_context_set_output(c, i, bufs[64 + i], (size_t)b.max_nbytes) != KILN_OK) goto done;
    }
    (void)kiln_context_execute(c);
done:
    for (size_t i = 0; i < 128; i++) free(bufs[i]);
    kiln_context_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_log_set(quiet_log, NULL, KILN_LOG_NONE);
    reader r = {data, size, 0};
    uint8_t flags = next(&r);
    kiln_graph *g = NULL;
    if (kiln_graph_new(&g) != KILN_OK) return 0;
    int32_t values[MAX_VALUES];
    uint32_t n_values = 0;
    run_program(g, &r, values, &n_values);

    kiln_build_options o;
    kiln_build_options_init(&o);
    o.precision = (flags & 1)   ? KILN_PRECISION_FP16
                  : (flags & 2) ? KILN_PRECISION_BF16
                                : KILN_PRECISION_FP32;
    o.external_weights = (flags & 4) != 0;
    o.optimize = !(flags & 8);
    o.min_external_nbytes = (flags & 16) ? 16 : 0;
    kiln_built *b = NULL, *b2 = NULL;
    // KILN_FUZZ_VERBOSE=1: say what each input did (for corpus maintenance).
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("KILN_FUZZ_VERBOSE") != NULL;
    if (kiln_build(g, &o, &b) != KILN_OK) {
        if (verbose)
            fprintf(stderr, "fuzz_build: %u values, build: %s\n", n_values, kiln_last_error());
        if (kiln_last_error()[0] == '\0') abort(); // every failure names its cause
        kiln_graph_free(g);
        return 0;
    }
    const void *bytes, *bytes2;
    size_t n, n2;
    if (kiln_built_engine(b, &bytes, &n) != KILN_OK) abort();
    if (verbose) fprintf(stderr, "fuzz_build: %u values, built %zu bytes\n", n_values, n);
    // Deterministic.
    if (kiln_build(g, &o, &b2) != KILN_OK || kiln_built_engine(b2, &bytes2, &n2) != KILN_OK ||
        n2 != n || memcmp(bytes, bytes2, n) != 0)
        abort();
    kiln_built_free(b2);
    kiln_graph_free(g);

    // Whatever builds must load, and serialize back to the same bytes.
    kiln_plan p;
    if (kiln_load_plan(bytes, n, &p) != KILN_OK) abort();
    uint8_t *again = NULL;
    size_t n_again = 0;
    if (kiln_serialize(&p, &again, &n_again) != KILN_OK || n_again != n ||
        memcmp(again, bytes, n) != 0)
        abort();
    kiln_free(again, n_again);
    kiln_plan_release(&p);

    resolver_ctx rc = {b};
    kiln_load_options lo;
    kiln_load_options_init(&lo);
    lo.resolve = resolve;
    lo.resolve_user_data = &rc;
    kiln_option_setting cpu = {.name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"};
    lo.settings = &cpu;
    lo.n_settings = 1;
    kiln_engine *e = NULL;
    kiln_status st = kiln_engine_load(bytes, n, &lo, &e);
    if (st != KILN_OK && st != KILN_ERR_NO_MEMORY && st != KILN_ERR_UNSUPPORTED) abort();
    if (st == KILN_OK) execute(e);
    kiln_engine_free(e);
    kiln_built_free(b);
    return 0;
}
