// SPDX-License-Identifier: Apache-2.0
// The allocation-failure sweep (SQLite style): a counting allocator fails allocation N, for
// every N from 1 until the operation succeeds, once (transient) and from N on (persistent), over
// (a) graph construction + kiln_build, (b) kiln_engine_load (inline and external weights),
// (c) kiln_context_new + execute. Every failure must be KILN_ERR_NO_MEMORY with no byte leaked,
// and the following unfaulted run must give the same engine bytes / bit-identical outputs.
// Finally execute runs with every allocation refused: it allocates nothing.
#include "test_util.h"

#define B_MAX 4
#define K 8
#define H 16

static float w1[H * K], b1[H], w2[K * H], b2[K], lg[K], lb[K];

static tu_alloc_state *as;

// x[B, 8] -> linear(16) + relu -> linear(8) -> + x -> layer_norm -> softmax. Propagates every
// failure (no CHECKs: a failure here is the point).
static kiln_status make_graph(kiln_graph **out) {
    kiln_graph *g = NULL;
    int32_t x, c[6], h, y;
    kiln_status st;
    const float *data[6] = {w1, b1, w2, b2, lg, lb};
    const int64_t dims[6][2] = {{H, K}, {H, 0}, {K, H}, {K, 0}, {K, 0}, {K, 0}};
    TU_TRY(kiln_graph_new(&g));
#define G_TRY(expr)                                                                                \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != KILN_OK) goto fail;                                                              \
    } while (0)
    G_TRY(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B_MAX, K), &x));
    for (int i = 0; i < 6; i++) {
        uint32_t rank = dims[i][1] ? 2 : 1;
        size_t n = (size_t)dims[i][0] * (size_t)(dims[i][1] ? dims[i][1] : 1);
        G_TRY(
            kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, rank, dims[i], data[i], n * 4, &c[i]));
    }
    G_TRY(kiln_graph_add_node(g, KILN_OP_LINEAR, TU_IDS(x, c[0], c[1]), TU_NO_ATTRS, &h, 1));
    G_TRY(kiln_graph_add_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS, &h, 1));
    G_TRY(kiln_graph_add_node(g, KILN_OP_LINEAR, TU_IDS(h, c[2], c[3]), TU_NO_ATTRS, &y, 1));
    G_TRY(kiln_graph_add_node(g, KILN_OP_ADD, TU_IDS(y, x), TU_NO_ATTRS, &y, 1));
    G_TRY(kiln_graph_add_node(g, KILN_OP_LAYER_NORM, TU_IDS(y, c[4], c[5]),
                              TU_ATTRS(TU_INTS("normalized_ndim", 1)), &y, 1));
    G_TRY(kiln_graph_add_node(g, KILN_OP_SOFTMAX, TU_IDS(y), TU_ATTRS(TU_INTS("dim", -1)), &y, 1));
    G_TRY(kiln_graph_mark_output(g, y, "y"));
#undef G_TRY
    *out = g;
    return KILN_OK;
fail:
    kiln_graph_free(g);
    return st;
}

static kiln_status make_built(int external, kiln_built **out) {
    kiln_graph *g = NULL;
    kiln_status st;
    TU_TRY(make_graph(&g));
    st = tu_build(g, KILN_PRECISION_FP32, external, out);
    kiln_graph_free(g);
    return st;
}

static int same_engine(const kiln_built *a, const kiln_built *b) {
    const void *pa, *pb;
    size_t na = 0, nb = 1;
    if (kiln_built_engine(a, &pa, &na) != KILN_OK || kiln_built_engine(b, &pb, &nb) != KILN_OK)
        return 0;
    return na == nb && memcmp(pa, pb, na) == 0;
}

// Arms the allocator for sweep step k: transient (fail only allocation k from now) or
// persistent (fail k and everything after).
static void arm(long k, int persistent) {
    as->n_failed = 0;
    if (persistent) {
        as->fail_from = as->n_calls + k;
    } else {
        as->fail_at = as->n_calls + k;
    }
}
static void disarm(void) { as->fail_at = as->fail_from = 0; }

static float x_data[B_MAX * K];

static kiln_status run(kiln_engine *e, kiln_context **io_c, float *y) {
    if (*io_c == NULL) TU_TRY(kiln_context_new(e, io_c));
    TU_TRY(kiln_context_set_input(*io_c, 0, 2, TU_DIMS(3, K), x_data));
    TU_TRY(kiln_context_set_output(*io_c, 0, y, B_MAX * K * 4));
    return kiln_context_execute(*io_c);
}

// (a) graph construction + build.
static void sweep_build(int external, const kiln_built *ref) {
    long k, n_fail = 0;
    for (int persistent = 0; persistent < 2; persistent++) {
        long long base = as->live;
        for (k = 1; k < 100000; k++) {
            kiln_built *b = NULL;
            kiln_status st;
            arm(k, persistent);
            st = make_built(external, &b);
            disarm();
            if (st == KILN_OK) {
                // A failure absorbed on the way must not change the result.
                CHECK_MSG(same_engine(b, ref), "build with allocation %ld failed: other bytes", k);
                kiln_built_free(b);
                if (as->n_failed == 0) break;
            } else {
                n_fail++;
                CHECK_MSG(st == KILN_ERR_NO_MEMORY, "build, allocation %ld failed: %s (%s)", k,
                          kiln_status_str(st), kiln_last_error());
            }
            CHECK_MSG(as->live == base, "build, allocation %ld failed: %lld bytes leaked", k,
                      as->live - base);
        }
        CHECK(k < 100000);
    }
    CHECK(n_fail > 10);
    fprintf(stderr, "build sweep (external %d): %ld failures checked\n", external, n_fail);
}

// (b) load.
static void sweep_load(const kiln_built *b, const float *want) {
    long k, n_fail = 0;
    const void *bytes;
    size_t n;
    kiln_load_options lo;
    CHECK_OK(kiln_built_engine(b, &bytes, &n));
    kiln_load_options_init(&lo);
    lo.resolve = tu_resolve_built;
    lo.resolve_user_data = (void *)(uintptr_t)b;
    for (int persistent = 0; persistent < 2; persistent++) {
        long long base = as->live;
        for (k = 1; k < 100000; k++) {
            kiln_engine *e = NULL;
            kiln_status st;
            arm(k, persistent);
            st = kiln_engine_load(bytes, n, &lo, &e);
            disarm();
            if (st == KILN_OK) {
                kiln_context *c = NULL;
                float y[B_MAX * K];
                int done = as->n_failed == 0;
                CHECK_OK(run(e, &c, y));
                CHECK_MSG(memcmp(y, want, 3 * K * 4) == 0,
                          "load with allocation %ld failed: "
                          "different output",
                          k);
                kiln_context_free(c);
                kiln_engine_free(e);
                if (done) break;
            } else {
                n_fail++;
                CHECK_MSG(st == KILN_ERR_NO_MEMORY, "load, allocation %ld failed: %s (%s)", k,
                          kiln_status_str(st), kiln_last_error());
            }
            CHECK_MSG(as->live == base, "load, allocation %ld failed: %lld bytes leaked", k,
                      as->live - base);
        }
    }
    CHECK(n_fail > 4);
}

// (c) context creation + execute; then execute with every allocation refused.
static void sweep_context(const kiln_built *b, const float *want) {
    kiln_engine *e = NULL;
    long k, n_fail = 0;
    CHECK_OK(tu_load(b, "cpu", &e));
    if (e == NULL) return;
    for (int persistent = 0; persistent < 2; persistent++) {
        long long base = as->live;
        for (k = 1; k < 100000; k++) {
            kiln_context *c = NULL;
            float y[B_MAX * K];
            kiln_status st;
            arm(k, persistent);
            st = run(e, &c, y);
            disarm();
            if (st == KILN_OK) {
                int done = as->n_failed == 0;
                CHECK_MSG(memcmp(y, want, 3 * K * 4) == 0,
                          "context with allocation %ld failed: different output", k);
                kiln_context_free(c);
                if (done) break;
            } else {
                n_fail++;
                CHECK_MSG(st == KILN_ERR_NO_MEMORY, "context, allocation %ld failed: %s (%s)", k,
                          kiln_status_str(st), kiln_last_error());
                kiln_context_free(c);
            }
            CHECK_MSG(as->live == base, "context, allocation %ld failed: %lld bytes leaked", k,
                      as->live - base);
        }
    }
    CHECK(n_fail > 2);
    // Execute allocates nothing: after warm-up, with every allocation refused, including a
    // shape change (shape inference) and a rebind.
    {
        kiln_context *c = NULL;
        float y[B_MAX * K], x4[B_MAX * K];
        tu_fill(x4, B_MAX * K, -1, 1);
        CHECK_OK(run(e, &c, y));
        if (c != NULL) {
            as->fail_all = 1;
            as->n_failed = 0;
            memset(y, 0, sizeof y);
            CHECK_OK(kiln_context_execute(c));
            CHECK(memcmp(y, want, 3 * K * 4) == 0);
            CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(B_MAX, K), x4));
            CHECK_OK(kiln_context_set_output(c, 0, y, sizeof y));
            CHECK_OK(kiln_context_set_stream(c, NULL));
            CHECK_OK(kiln_context_infer_shapes(c));
            CHECK_OK(kiln_context_execute(c));
            CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(3, K), x_data));
            CHECK_OK(kiln_context_execute(c));
            CHECK(memcmp(y, want, 3 * K * 4) == 0);
            as->fail_all = 0;
            CHECK_EQ_INT(as->n_failed, 0);
        }
        kiln_context_free(c);
    }
    kiln_engine_free(e);
}

int main(void) {
    kiln_built *ref_inline = NULL, *ref_external = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    float want[B_MAX * K];
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    as = tu_alloc_install(); // before any other Kiln call
    tu_fill(w1, H * K, -0.5f, 0.5f);
    tu_fill(b1, H, -0.5f, 0.5f);
    tu_fill(w2, K * H, -0.5f, 0.5f);
    tu_fill(b2, K, -0.5f, 0.5f);
    tu_fill(lg, K, 0.5f, 1.5f);
    tu_fill(lb, K, -0.5f, 0.5f);
    tu_fill(x_data, B_MAX * K, -1, 1);
    CHECK_OK(make_built(0, &ref_inline));
    CHECK_OK(make_built(1, &ref_external));
    if (ref_inline == NULL || ref_external == NULL) goto done;
    CHECK_OK(tu_load(ref_inline, "cpu", &e));
    if (e == NULL) goto done;
    CHECK_OK(run(e, &c, want));
    kiln_context_free(c);
    kiln_engine_free(e);
    // The reference output is a softmax: each row sums to 1 (so the comparisons mean something).
    for (int r = 0; r < 3; r++) {
        double s = 0;
        for (int i = 0; i < K; i++) s += want[r * K + i];
        CHECK_NEAR(s, 1.0, 1e-5, 0);
    }
    sweep_build(0, ref_inline);
    sweep_build(1, ref_external);
    sweep_load(ref_inline, want);
    sweep_load(ref_external, want);
    sweep_context(ref_inline, want);
done:
    kiln_built_free(ref_inline);
    kiln_built_free(ref_external);
    CHECK_MSG(as->live == 0 && as->live_blocks == 0, "%lld bytes in %ld blocks still live",
              as->live, as->live_blocks);
    kiln_set_allocator(NULL);
    return check_summary();
}
