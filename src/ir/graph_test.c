// SPDX-License-Identifier: Apache-2.0
// The graph API: argument validation with messages, attribute matching (names, kinds, counts,
// defaults in schema order), shape inference at add_node with rollback on failure, the caps, and
// an allocation-failure sweep (every failing allocation gives KILN_ERR_NO_MEMORY, no leaks).
#include "check.h"
#include "core/ops.h"
#include "ir/graph.h"

static void quiet(void *user_data, kiln_log_level level, const char *message) {
    (void)user_data;
    (void)level;
    (void)message;
}

#define HAS(needle)                                                                                \
    CHECK_MSG(strstr(kiln_last_error(), (needle)) != NULL, "message '%s' lacks '%s'",              \
              kiln_last_error(), (needle))

static void test_inputs(void) {
    kiln_graph *g = NULL;
    int32_t x = -5, y = -5;
    int64_t lo[3] = {1, 3, 4}, hi[3] = {8, 3, 4};
    char longname[300];
    CHECK_OK(kiln_graph_new(&g));
    CHECK_STATUS(kiln_graph_new(NULL), KILN_ERR_INVALID_ARG);
    CHECK_OK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, lo, hi, &x));
    CHECK(x == 0);
    CHECK_STATUS(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 3, lo, hi, &y), KILN_ERR_INVALID_ARG);
    HAS("already used by input 0");
    CHECK(y == -5);
    CHECK_STATUS(kiln_graph_add_input(g, "", KILN_DTYPE_F32, 3, lo, hi, &y), KILN_ERR_INVALID_ARG);
    HAS("empty");
    CHECK_STATUS(kiln_graph_add_input(g, NULL, KILN_DTYPE_F32, 3, lo, hi, &y),
                 KILN_ERR_INVALID_ARG);
    memset(longname, 'a', sizeof longname);
    longname[256] = '\0';
    CHECK_STATUS(kiln_graph_add_input(g, longname, KILN_DTYPE_F32, 3, lo, hi, &y),
                 KILN_ERR_INVALID_ARG);
    HAS("longer than 255");
    longname[255] = '\0';
    CHECK_OK(kiln_graph_add_input(g, longname, KILN_DTYPE_F32, 3, lo, hi, &y));
    CHECK_STATUS(kiln_graph_add_input(g, "z", (kiln_dtype)0, 3, lo, hi, &y), KILN_ERR_INVALID_ARG);
    HAS("dtype 0");
    CHECK_STATUS(kiln_graph_add_input(g, "z", (kiln_dtype)7, 3, lo, hi, &y), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 9, lo, hi, &y), KILN_ERR_INVALID_ARG);
    HAS("rank 9");
    CHECK_STATUS(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 3, hi, lo, &y), KILN_ERR_INVALID_ARG);
    HAS("dimension 0 has range [8, 1]");
    CHECK_STATUS(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 3, NULL, hi, &y),
                 KILN_ERR_INVALID_ARG);
    {
        int64_t neg[1] = {-1}, big[1] = {(INT64_C(1) << 40) + 1}, zero[1] = {0};
        CHECK_STATUS(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 1, neg, zero, &y),
                     KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_add_input(g, "z", KILN_DTYPE_F32, 1, zero, big, &y),
                     KILN_ERR_INVALID_ARG);
        CHECK_OK(kiln_graph_add_input(g, "z", KILN_DTYPE_I64, 1, zero, zero, &y));
        CHECK(y == 2);
    }
    CHECK_OK(kiln_graph_add_input(g, "s", KILN_DTYPE_BOOL, 0, NULL, NULL, &y));
    {
        kiln_dtype dt = KILN_DTYPE_INVALID;
        uint32_t rank = 99;
        int64_t mn[8] = {0}, mx[8] = {0};
        CHECK_OK(kiln_graph_value_info(g, x, &dt, &rank, mn, mx));
        CHECK(dt == KILN_DTYPE_F32 && rank == 3 && mn[0] == 1 && mx[0] == 8 && mn[2] == 4);
        CHECK_OK(kiln_graph_value_info(g, y, &dt, &rank, NULL, NULL));
        CHECK(dt == KILN_DTYPE_BOOL && rank == 0);
        CHECK_STATUS(kiln_graph_value_info(g, 99, &dt, &rank, mn, mx), KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_value_info(g, -1, &dt, &rank, mn, mx), KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_value_info(NULL, 0, &dt, &rank, mn, mx), KILN_ERR_INVALID_ARG);
    }
    kiln_graph_free(g);
    kiln_graph_free(NULL);
}

static void test_constants(void) {
    kiln_graph *g = NULL;
    float data[6] = {1, 2, 3, 4, 5, 6};
    int64_t dims[2] = {2, 3};
    int32_t c = -1, d = -1;
    const kiln_ir_const *k;
    CHECK_OK(kiln_graph_new(&g));
    CHECK_OK(kiln_graph_add_constant(g, "w", KILN_DTYPE_F32, 2, dims, data, sizeof data, &c));
    data[0] = 100.0f; // the graph holds a copy
    k = kiln_graph_const_of(g, c);
    CHECK(k != NULL && k->nbytes == 24 && ((const float *)k->data)[0] == 1.0f &&
          ((const float *)k->data)[5] == 6.0f);
    CHECK(((uintptr_t)k->data % 64) == 0);
    CHECK(strcmp(kiln_graph_name(g, g->values[c].name), "w") == 0);
    CHECK_STATUS(kiln_graph_add_constant(g, "w2", KILN_DTYPE_F32, 2, dims, data, 20, &d),
                 KILN_ERR_INVALID_ARG);
    HAS("needs 24 bytes but nbytes = 20");
    CHECK_STATUS(kiln_graph_add_constant(g, "w2", KILN_DTYPE_F32, 2, dims, NULL, 24, &d),
                 KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_graph_add_constant(g, "w2", KILN_DTYPE_F32, 2, NULL, data, 24, &d),
                 KILN_ERR_INVALID_ARG);
    CHECK(d == -1);
    // unnamed, empty and scalar constants
    CHECK_OK(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, 0, NULL, data, 4, &d));
    CHECK(g->values[d].name == 0 && g->values[d].desc.shape.rank == 0);
    {
        int64_t z[1] = {0};
        CHECK_OK(kiln_graph_add_constant(g, "empty", KILN_DTYPE_I64, 1, z, NULL, 0, &d));
        CHECK(kiln_graph_const_of(g, d)->data != NULL);
        CHECK(kiln_graph_const_of(g, 0) != NULL && kiln_graph_const_of(g, 77) == NULL);
    }
    kiln_graph_free(g);
}

static void test_nodes(void) {
    kiln_graph *g = NULL;
    int64_t xlo[4] = {1, 3, 8, 8}, xhi[4] = {4, 3, 32, 32};
    float w[16 * 3 * 3 * 3] = {0};
    int64_t wd[4] = {16, 3, 3, 3};
    int32_t x, x5, cw, y = -7, z = -7;
    int64_t stride[2] = {2, 2}, pad[2] = {1, 1}, three[3] = {1, 2, 3};
    double eps = 1e-3;
    size_t nv, nn, ni, nr, nints;
    CHECK_OK(kiln_graph_new(&g));
    CHECK_OK(kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 4, xlo, xhi, &x));
    CHECK_OK(kiln_graph_add_constant(g, "w", KILN_DTYPE_F32, 4, wd, w, sizeof w, &cw));
    {
        kiln_attr a[2] = {{"padding", pad, NULL, 2}, {"stride", stride, NULL, 2}};
        int32_t in[3] = {x, cw, -1};
        CHECK_OK(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 3, a, 2, &y, 1));
        CHECK(y == 2 && g->n_nodes == 1);
        // attributes in schema order with defaults: stride, padding, dilation, groups
        {
            kiln_attrs v = kiln_graph_node_attrs(g, &g->nodes[0]);
            CHECK(v.n_attrs == 4);
            CHECK(kiln_attrs_int(&v, KILN_A_CONV_STRIDE, 1) == 2);
            CHECK(kiln_attrs_int(&v, KILN_A_CONV_PADDING, 0) == 1);
            CHECK(kiln_attrs_int(&v, KILN_A_CONV_DILATION, 0) == 1);
            CHECK(kiln_attrs_count(&v, KILN_A_CONV_GROUPS) == 1 &&
                  kiln_attrs_int(&v, KILN_A_CONV_GROUPS, 0) == 1);
        }
        // (8 + 2 - 3)/2 + 1 = 4 .. (32 + 2 - 3)/2 + 1 = 16
        {
            kiln_dtype dt;
            uint32_t r;
            int64_t mn[8], mx[8];
            CHECK_OK(kiln_graph_value_info(g, y, &dt, &r, mn, mx));
            CHECK(r == 4 && mn[0] == 1 && mx[0] == 4 && mn[1] == 16 && mn[2] == 4 && mx[2] == 16 &&
                  mx[3] == 16);
        }
    }
    {
        int64_t d5[4] = {1, 5, 8, 8};
        CHECK_OK(kiln_graph_add_input(g, "x5", KILN_DTYPE_F32, 4, d5, d5, &x5));
    }
    nv = g->n_values;
    nn = g->n_nodes;
    ni = g->n_ids;
    nr = g->n_attr_refs;
    nints = g->n_ints;
    {
        int32_t in[2] = {x, cw};
        kiln_attr bad[1] = {{"strides", stride, NULL, 2}};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, bad, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("node 1 (conv2d): conv2d has no attribute 'strides' (valid attributes: stride, "
            "padding, dilation, groups)");
        kiln_attr dup[2] = {{"stride", stride, NULL, 2}, {"stride", stride, NULL, 2}};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, dup, 2, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("twice");
        kiln_attr kind[1] = {{"stride", NULL, &eps, 2}};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, kind, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("takes integers");
        kiln_attr cnt[1] = {{"stride", three, NULL, 3}};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, cnt, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("takes 2 values, got 3");
        kiln_attr noname[1] = {{NULL, stride, NULL, 2}};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, noname, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, NULL, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        // shape inference rejects: wrong channel count
        int32_t in2[2] = {x5, cw};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in2, 2, NULL, 0, &z, 1),
                     KILN_ERR_SHAPE);
        HAS("node 1 (conv2d)");
        HAS("channels");
        // arity, -1, unknown values, outputs
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 1, NULL, 0, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("takes 2 to 3 inputs, got 1");
        int32_t absent[2] = {x, -1};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, absent, 2, NULL, 0, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("input 1 is -1");
        int32_t missing[2] = {x, 42};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, missing, 2, NULL, 0, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("value 42");
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, NULL, 0, &z, 2),
                     KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CONV2D, in, 2, NULL, 0, NULL, 1),
                     KILN_ERR_INVALID_ARG);
        CHECK_STATUS(kiln_graph_add_node(g, 99, in, 2, NULL, 0, &z, 1), KILN_ERR_INVALID_ARG);
        HAS("unknown op id 99");
        CHECK(z == -7);
    }
    // a failed add leaves the graph unchanged
    CHECK(g->n_values == nv && g->n_nodes == nn && g->n_ids == ni && g->n_attr_refs == nr &&
          g->n_ints == nints);
    {
        // required attribute missing; float attribute; empty list attribute
        int32_t in[1] = {y};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_SOFTMAX, in, 1, NULL, 0, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("needs attribute 'dim'");
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_MEAN, in, 1, NULL, 0, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("needs attribute 'dims'");
        kiln_attr none[1] = {{"dims", NULL, NULL, 0}};
        CHECK_OK(kiln_graph_add_node(g, KILN_OP_MEAN, in, 1, none, 1, &z, 1));
        {
            kiln_dtype dt;
            uint32_t r = 9;
            CHECK_OK(kiln_graph_value_info(g, z, &dt, &r, NULL, NULL));
            CHECK(r == 0 && dt == KILN_DTYPE_F32);
        }
        double lo = -1.0, hi = 6.0;
        kiln_attr cl[2] = {{"max", NULL, &hi, 1}, {"min", NULL, &lo, 1}};
        CHECK_OK(kiln_graph_add_node(g, KILN_OP_CLAMP, in, 1, cl, 2, &z, 1));
        {
            kiln_attrs v = kiln_graph_node_attrs(g, &g->nodes[g->n_nodes - 1]);
            CHECK(kiln_attrs_float(&v, KILN_A_CLAMP_MIN, 0) == -1.0 &&
                  kiln_attrs_float(&v, KILN_A_CLAMP_MAX, 0) == 6.0);
        }
        kiln_attr clk[1] = {{"min", stride, NULL, 1}};
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_CLAMP, in, 1, clk, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("takes floats");
        CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_RELU, in, 1, clk, 1, &z, 1),
                     KILN_ERR_INVALID_ARG);
        HAS("valid attributes: none");
    }
    // outputs
    CHECK_OK(kiln_graph_mark_output(g, y, "y"));
    CHECK_OK(kiln_graph_mark_output(g, y, "y_again"));
    CHECK_STATUS(kiln_graph_mark_output(g, y, "x"), KILN_ERR_INVALID_ARG);
    HAS("already used by input 0");
    CHECK_STATUS(kiln_graph_mark_output(g, z, "y"), KILN_ERR_INVALID_ARG);
    HAS("already used by output 0");
    CHECK_STATUS(kiln_graph_mark_output(g, 1000, "q"), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_graph_mark_output(g, z, NULL), KILN_ERR_INVALID_ARG);
    CHECK(g->n_outputs == 2 && g->outputs[1].value == y &&
          strcmp(kiln_graph_name(g, g->outputs[1].name), "y_again") == 0);
    {
        int64_t d1[1] = {1};
        int32_t q;
        CHECK_STATUS(kiln_graph_add_input(g, "y_again", KILN_DTYPE_F32, 1, d1, d1, &q),
                     KILN_ERR_INVALID_ARG);
        HAS("already used by output 1");
    }
    kiln_graph_free(g);
}

static void test_caps(void) {
    kiln_graph *g = NULL;
    int64_t d[1] = {4};
    int32_t v, prev;
    char name[32];
    kiln_status st = KILN_OK;
    CHECK_OK(kiln_graph_new(&g));
    for (uint32_t i = 0; i < KILN_GRAPH_MAX_IO && st == KILN_OK; i++) {
        snprintf(name, sizeof name, "in%u", i);
        st = kiln_graph_add_input(g, name, KILN_DTYPE_F32, 1, d, d, &v);
    }
    CHECK_OK(st);
    CHECK_STATUS(kiln_graph_add_input(g, "one_more", KILN_DTYPE_F32, 1, d, d, &v),
                 KILN_ERR_INVALID_ARG);
    HAS("4096 inputs");
    for (uint32_t i = 0; i < KILN_GRAPH_MAX_IO && st == KILN_OK; i++) {
        snprintf(name, sizeof name, "out%u", i);
        st = kiln_graph_mark_output(g, 0, name);
    }
    CHECK_OK(st);
    CHECK_STATUS(kiln_graph_mark_output(g, 0, "one_more"), KILN_ERR_INVALID_ARG);
    // values: a relu chain up to the cap
    prev = 0;
    while (g->n_values < KILN_GRAPH_MAX_VALUES && st == KILN_OK) {
        st = kiln_graph_add_node(g, KILN_OP_RELU, &prev, 1, NULL, 0, &v, 1);
        prev = v;
    }
    CHECK_OK(st);
    CHECK(g->n_values == KILN_GRAPH_MAX_VALUES);
    CHECK_STATUS(kiln_graph_add_node(g, KILN_OP_RELU, &prev, 1, NULL, 0, &v, 1),
                 KILN_ERR_INVALID_ARG);
    HAS("65536 values");
    CHECK_STATUS(kiln_graph_add_constant(g, "c", KILN_DTYPE_F32, 0, NULL, &d, 4, &v),
                 KILN_ERR_INVALID_ARG);
    kiln_graph_free(g);
}

// --- allocation-failure sweep

static long live_allocs, fail_at, n_allocs;

static void *counting_alloc(void *user, size_t nbytes, size_t align) {
    (void)user;
    if (fail_at > 0 && ++n_allocs == fail_at) return NULL;
    void *p = aligned_alloc(align, (nbytes + align - 1) / align * align + (nbytes == 0) * align);
    if (p != NULL) live_allocs++;
    return p;
}

static void counting_free(void *user, void *p, size_t nbytes) {
    (void)user;
    (void)nbytes;
    live_allocs--;
    free(p);
}

static kiln_status build_small(void) {
    kiln_graph *g = NULL;
    int64_t lo[2] = {1, 8}, hi[2] = {16, 8}, wd[2] = {4, 8};
    float w[32] = {0};
    int32_t x, c, y, z;
    int64_t dim = -1;
    kiln_attr a = {"dim", &dim, NULL, 1};
    kiln_status st = kiln_graph_new(&g);
    if (st != KILN_OK) return st;
    st = kiln_graph_add_input(g, "x", KILN_DTYPE_F32, 2, lo, hi, &x);
    if (st == KILN_OK) st = kiln_graph_add_constant(g, "w", KILN_DTYPE_F32, 2, wd, w, sizeof w, &c);
    for (int i = 0; i < 40 && st == KILN_OK; i++) { // enough nodes to grow every array
        int32_t in[2] = {x, c};
        st = kiln_graph_add_node(g, KILN_OP_LINEAR, in, 2, NULL, 0, &y, 1);
        if (st == KILN_OK) st = kiln_graph_add_node(g, KILN_OP_SOFTMAX, &y, 1, &a, 1, &z, 1);
    }
    if (st == KILN_OK) st = kiln_graph_mark_output(g, z, "z");
    kiln_graph_free(g);
    return st;
}

static void test_alloc_failures(void) {
    kiln_allocator al = {NULL, counting_alloc, counting_free};
    long failures = 0;
    CHECK_OK(kiln_set_allocator(&al));
    for (fail_at = 1; fail_at < 10000; fail_at++) {
        kiln_status st;
        n_allocs = 0;
        st = build_small();
        CHECK_MSG(live_allocs == 0, "fail_at %ld: %ld allocations leaked", fail_at, live_allocs);
        if (st == KILN_OK) break;
        CHECK_MSG(st == KILN_ERR_NO_MEMORY, "fail_at %ld: %s", fail_at, kiln_status_str(st));
        failures++;
    }
    CHECK(failures > 5);
    CHECK(fail_at < 10000);
    CHECK_OK(kiln_set_allocator(NULL));
}

int main(void) {
    kiln_log_set(quiet, NULL, KILN_LOG_ERROR);
    test_inputs();
    test_constants();
    test_nodes();
    test_caps();
    test_alloc_failures();
    return check_summary();
}
