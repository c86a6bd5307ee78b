// SPDX-License-Identifier: Apache-2.0
// Unit test of the runtime (engine.c, backend_cpu.c) over a plan written by hand, without the
// builder or the serializer: a linear head with a fused relu + add tail (the operand on the
// left), an external bias resolved by key, a softmax with an attribute, dynamic batch. Checks
// outputs against a naive reference, the binding queries, and every runtime error path.
#include <stdatomic.h>

#include "builder/serialize.h"
#include "check.h"
#include "core/alloc.h"
#include "runtime/engine_internal.h"

#define K 4
#define N 3
#define B_MAX 8

// Copies n bytes into a kiln_malloc'd array (the plan owns its arrays).
static void *dup(const void *src, size_t n) {
    void *p = kiln_malloc(n, 64);
    if (p != NULL && n > 0) memcpy(p, src, n);
    return p;
}

static float w_data[N * K], b_data[N];

static kiln_shape shape2(int64_t min0, int64_t max0, int64_t d1) {
    kiln_shape s;
    memset(&s, 0, sizeof s);
    s.rank = 2;
    s.min[0] = min0;
    s.max[0] = max0;
    s.min[1] = s.max[1] = d1;
    return s;
}

// Tensors: 0 x[B,4] in0, 1 w[3,4] inline, 2 b[3] external "bias", 3 h (activation) =
// linear(x, w, b) with the fused tail relu, add(y, h) (the operand on the left; tails write h in
// place), 4 y[B,3] in1, 5 out = copy(h) (output 0), 6 sm = softmax(h, -1) (output 1).
static void make_plan(kiln_plan *p) {
    kiln_plan_tensor t[7];
    kiln_plan_layer l[5];
    int32_t ids[] = {0, 1, 2, 3, /*relu*/ 3, 3, /*add*/ 4, 3, 3, /*copy*/ 3, 5, /*softmax*/ 3, 6};
    kiln_attr_ref refs[] = {{KILN_ATTR_INTS, 1, 0}};
    int64_t ints[] = {-1};
    char strings[] = "\0x\0w\0b\0bias\0y\0out\0sm\0h";
    uint32_t n_strings = sizeof strings;
    uint8_t weights[64];
    uint32_t inputs[] = {0, 4}, outputs[] = {5, 6};
    memset(t, 0, sizeof t);
    memset(l, 0, sizeof l);
    memset(weights, 0, sizeof weights);
    memcpy(weights, w_data, sizeof w_data);
    // names: "x"=1 "w"=3 "b"=5 "bias"=7 "y"=12 "out"=14 "sm"=18 "h"=21
    t[0] = (kiln_plan_tensor){KILN_TENSOR_INPUT, KILN_DTYPE_F32, shape2(1, B_MAX, K), 1, 0, 0, 0,
                              KILN_NO_KEY};
    t[1] = (kiln_plan_tensor){KILN_TENSOR_WEIGHT, KILN_DTYPE_F32, shape2(N, N, K), 3, 0, 0,
                              sizeof w_data,      KILN_NO_KEY};
    t[2] = (kiln_plan_tensor){KILN_TENSOR_WEIGHT, KILN_DTYPE_F32, {0}, 5, 0, 0, sizeof b_data, 7};
    t[2].shape.rank = 1;
    t[2].shape.min[0] = t[2].shape.max[0] = N;
    t[3] = (kiln_plan_tensor){KILN_TENSOR_ACTIVATION, KILN_DTYPE_F32, shape2(1, B_MAX, N), 21, 0, 0,
                              B_MAX * N * 4,          KILN_NO_KEY};
    t[4] = (kiln_plan_tensor){KILN_TENSOR_INPUT, KILN_DTYPE_F32, shape2(1, B_MAX, N), 12, 1, 0, 0,
                              KILN_NO_KEY};
    t[5] = (kiln_plan_tensor){KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, shape2(1, B_MAX, N), 14, 0, 0, 0,
                              KILN_NO_KEY};
    t[6] = (kiln_plan_tensor){KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, shape2(1, B_MAX, N), 18, 1, 0, 0,
                              KILN_NO_KEY};
    l[0] = (kiln_plan_layer){KILN_OP_LINEAR, 0, 0, 3, 3, 1, 0, 0, 2};
    l[1] = (kiln_plan_layer){KILN_OP_RELU, KILN_LAYER_TAIL, 4, 1, 5, 1, 0, 0, 0};
    l[2] = (kiln_plan_layer){KILN_OP_ADD, KILN_LAYER_TAIL, 6, 2, 8, 1, 0, 0, 0};
    l[3] = (kiln_plan_layer){KILN_OP_COPY, 0, 9, 1, 10, 1, 0, 0, 0};
    l[4] = (kiln_plan_layer){KILN_OP_SOFTMAX, 0, 11, 1, 12, 1, 0, 1, 0};
    memset(p, 0, sizeof *p);
    p->n_tensors = 7;
    p->tensors = dup(t, sizeof t);
    p->n_layers = 5;
    p->layers = dup(l, sizeof l);
    p->n_ids = sizeof ids / sizeof ids[0];
    p->ids = dup(ids, sizeof ids);
    p->n_attr_refs = 1;
    p->attr_refs = dup(refs, sizeof refs);
    p->n_ints = 1;
    p->ints = dup(ints, sizeof ints);
    p->n_floats = 0;
    p->floats = dup(NULL, 0);
    p->n_inputs = 2;
    p->inputs = dup(inputs, sizeof inputs);
    p->n_outputs = 2;
    p->outputs = dup(outputs, sizeof outputs);
    p->strings_nbytes = n_strings;
    p->strings = dup(strings, n_strings);
    p->arena_nbytes = 128;
    p->weights_nbytes = sizeof weights;
    p->weights = dup(weights, sizeof weights);
}

static kiln_status resolve(void *ud, const char *key, const void **out, size_t *n) {
    int *mode = ud;
    if (strcmp(key, "bias") != 0 || *mode == 1) return KILN_ERR_MISSING_DATA;
    *out = b_data;
    *n = *mode == 2 ? sizeof b_data - 4 : sizeof b_data;
    return KILN_OK;
}

static kiln_status load(int mode, const kiln_option_setting *settings, uint32_t n_settings,
                        kiln_engine **out) {
    static int m;
    kiln_plan p;
    kiln_load_options o;
    m = mode;
    make_plan(&p);
    kiln_load_options_init(&o);
    if (mode != 3) {
        o.resolve = resolve;
        o.resolve_user_data = &m;
    }
    o.settings = settings;
    o.n_settings = n_settings;
    return kiln_engine_from_plan(&p, &o, out);
}

// out = y + relu(x w^T + b); sm = softmax(out) over the last dim.
static void reference(int64_t batch, const float *x, const float *y, float *out, float *sm) {
    for (int64_t i = 0; i < batch; i++) {
        double mx = -1e300, sum = 0;
        for (int n = 0; n < N; n++) {
            double acc = b_data[n];
            for (int k = 0; k < K; k++) acc += (double)x[i * K + k] * w_data[n * K + k];
            out[i * N + n] = (float)(y[i * N + n] + (acc > 0 ? acc : 0));
            if (out[i * N + n] > mx) mx = out[i * N + n];
        }
        for (int n = 0; n < N; n++) sum += exp(out[i * N + n] - mx);
        for (int n = 0; n < N; n++) sm[i * N + n] = (float)(exp(out[i * N + n] - mx) / sum);
    }
}

static void run_batch(kiln_context *c, int64_t batch) {
    float x[B_MAX * K], y[B_MAX * N], out[B_MAX * N], sm[B_MAX * N];
    float ref_out[B_MAX * N], ref_sm[B_MAX * N];
    int64_t dx[2] = {batch, K}, dy[2] = {batch, N}, dims[KILN_MAX_RANK];
    uint32_t rank = 0;
    for (int i = 0; i < B_MAX * K; i++) x[i] = check_rng_uniform(-1, 1);
    for (int i = 0; i < B_MAX * N; i++) y[i] = check_rng_uniform(-1, 1);
    reference(batch, x, y, ref_out, ref_sm);
    CHECK_OK(kiln_context_set_input(c, 0, 2, dx, x));
    CHECK_OK(kiln_context_set_input(c, 1, 2, dy, y));
    CHECK_OK(kiln_context_set_output(c, 0, out, sizeof out));
    CHECK_OK(kiln_context_set_output(c, 1, sm, sizeof sm));
    CHECK_OK(kiln_context_execute(c));
    for (int64_t i = 0; i < batch * N; i++) {
        CHECK_NEAR(out[i], ref_out[i], 1e-5, 1e-5);
        CHECK_NEAR(sm[i], ref_sm[i], 1e-6, 1e-5);
    }
    CHECK_OK(kiln_context_output_shape(c, 1, &rank, dims));
    CHECK_EQ_INT(rank, 2);
    CHECK_EQ_INT(dims[0], batch);
    CHECK_EQ_INT(dims[1], N);
}

static void test_run(void) {
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    kiln_binding_info info;
    for (int i = 0; i < N * K; i++) w_data[i] = check_rng_uniform(-1, 1);
    for (int i = 0; i < N; i++) b_data[i] = check_rng_uniform(-1, 1);
    CHECK_OK(load(0, NULL, 0, &e));
    if (e == NULL) return;
    CHECK_EQ_INT(kiln_engine_n_inputs(e), 2);
    CHECK_EQ_INT(kiln_engine_n_outputs(e), 2);
    CHECK(strcmp(kiln_engine_device(e), "cpu") == 0);
    CHECK_EQ_INT(kiln_engine_arena_nbytes(e), 128);
    CHECK_EQ_INT(kiln_engine_weight_nbytes(e), sizeof w_data + sizeof b_data);
    CHECK_OK(kiln_engine_binding(e, 1, 1, &info));
    CHECK(strcmp(info.name, "y") == 0);
    CHECK_EQ_INT(info.is_input, 1);
    CHECK_EQ_INT(info.rank, 2);
    CHECK_EQ_INT(info.dim_min[0], 1);
    CHECK_EQ_INT(info.dim_max[0], B_MAX);
    CHECK_EQ_INT(info.max_nbytes, B_MAX * N * 4);
    CHECK_OK(kiln_engine_binding(e, 0, 1, &info));
    CHECK(strcmp(info.name, "sm") == 0 && info.is_input == 0);
    CHECK_STATUS(kiln_engine_binding(e, 0, 2, &info), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_engine_binding(e, 1, 2, &info), KILN_ERR_INVALID_ARG);

    CHECK_OK(kiln_context_new(e, &c));
    for (int64_t b = 1; b <= B_MAX; b += 3) run_batch(c, b);
    run_batch(c, 5);
    run_batch(c, 5); // cached shapes
    run_batch(c, B_MAX);
    kiln_context_free(c);
    kiln_engine_free(e);
}

// The same plan through the serializer and kiln_engine_load (the loader validates it).
static void test_serialized(void) {
    kiln_plan p;
    uint8_t *bytes = NULL;
    size_t n = 0;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    kiln_load_options o;
    int mode = 0;
    make_plan(&p);
    CHECK_OK(kiln_serialize(&p, &bytes, &n));
    kiln_plan_release(&p);
    if (bytes == NULL) return;
    kiln_load_options_init(&o);
    o.resolve = resolve;
    o.resolve_user_data = &mode;
    CHECK_OK(kiln_engine_load(bytes, n, &o, &e));
    if (e != NULL) {
        CHECK_OK(kiln_context_new(e, &c));
        if (c != NULL) {
            run_batch(c, 7);
            run_batch(c, 1);
        }
    }
    // The engine does not reference the bytes.
    memset(bytes, 0xA5, n);
    if (c != NULL) run_batch(c, 4);
    kiln_free(bytes, n);
    kiln_context_free(c);
    kiln_engine_free(e);
}

static void test_errors(void) {
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    float x[B_MAX * K] = {0}, y[B_MAX * N] = {0}, out[B_MAX * N], sm[B_MAX * N];
    int64_t dx[2] = {2, K}, dy[2] = {2, N}, big[2] = {B_MAX + 1, K}, dims[KILN_MAX_RANK];
    uint32_t rank;
    kiln_option_setting bad_opt = {.name = "no_such_option", .type = KILN_OPTION_BOOL};
    kiln_option_setting bad_type = {.name = "device", .type = KILN_OPTION_INT, .int_value = 1};
    kiln_option_setting cuda = {
        .name = "device", .type = KILN_OPTION_STRING, .string_value = "cuda:0"};
    kiln_option_setting autod = {
        .name = "device", .type = KILN_OPTION_STRING, .string_value = "auto"};
    kiln_load_options lo;

    for (int i = 0; i < B_MAX * K; i++) x[i] = check_rng_uniform(-1, 1);
    CHECK_STATUS(load(1, NULL, 0, &e), KILN_ERR_MISSING_DATA);
    CHECK(strstr(kiln_last_error(), "bias") != NULL);
    CHECK_STATUS(load(3, NULL, 0, &e), KILN_ERR_MISSING_DATA);
    CHECK(strstr(kiln_last_error(), "bias") != NULL && strstr(kiln_last_error(), ".ptd") != NULL);
    CHECK_STATUS(load(2, NULL, 0, &e), KILN_ERR_CORRUPT);
    CHECK(strstr(kiln_last_error(), "bias") != NULL && strstr(kiln_last_error(), "12") != NULL);
    CHECK_STATUS(load(0, &bad_opt, 1, &e), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "num_threads") != NULL);
    CHECK_STATUS(load(0, &bad_type, 1, &e), KILN_ERR_INVALID_ARG);
    if (kiln_backend_cuda_get() == NULL) {
        CHECK_STATUS(load(0, &cuda, 1, &e), KILN_ERR_DEVICE);
        CHECK(strstr(kiln_last_error(), "cuda:0") != NULL);
        CHECK_OK(load(0, &autod, 1, &e));
        CHECK(strcmp(kiln_engine_device(e), "cpu") == 0);
        kiln_engine_free(e);
    }
    kiln_load_options_init(&lo);
    lo.struct_nbytes = 4;
    CHECK_STATUS(kiln_engine_load("x", 1, &lo, &e), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_engine_load(NULL, 8, NULL, &e), KILN_ERR_INVALID_ARG);

    e = NULL;
    CHECK_OK(load(0, NULL, 0, &e));
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    // Binding errors.
    CHECK_STATUS(kiln_context_set_input(c, 2, 2, dx, x), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_context_set_input(c, 0, 1, dx, x), KILN_ERR_SHAPE);
    CHECK(strstr(kiln_last_error(), "'x'") != NULL);
    CHECK_STATUS(kiln_context_set_input(c, 0, 2, big, x), KILN_ERR_SHAPE);
    CHECK(strstr(kiln_last_error(), "dimension 0 = 9") != NULL &&
          strstr(kiln_last_error(), "[1, 8]") != NULL);
    CHECK_STATUS(kiln_context_set_input(c, 0, 2, (int64_t[]){2, K + 1}, x), KILN_ERR_SHAPE);
    CHECK_STATUS(kiln_context_set_input(c, 0, 2, (int64_t[]){0, K}, x), KILN_ERR_SHAPE);
    CHECK_STATUS(kiln_context_set_input(c, 0, 2, dx, NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_context_set_output(c, 2, out, sizeof out), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_context_set_output(c, 0, NULL, 16), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_context_output_shape(c, 0, &rank, dims), KILN_ERR_INVALID_STATE);
    // Unbound input / output.
    CHECK_STATUS(kiln_context_execute(c), KILN_ERR_INVALID_STATE);
    CHECK(strstr(kiln_last_error(), "input 0 'x'") != NULL);
    CHECK_OK(kiln_context_set_input(c, 0, 2, dx, x));
    CHECK_OK(kiln_context_set_input(c, 1, 2, dy, y));
    CHECK_STATUS(kiln_context_execute(c), KILN_ERR_INVALID_STATE);
    CHECK(strstr(kiln_last_error(), "output 0 'out'") != NULL);
    CHECK_OK(kiln_context_set_output(c, 0, out, sizeof out));
    // Output capacity: 2 x 3 floats = 24 bytes needed.
    CHECK_OK(kiln_context_set_output(c, 1, sm, 20));
    CHECK_STATUS(kiln_context_execute(c), KILN_ERR_SHAPE);
    CHECK(strstr(kiln_last_error(), "24 bytes") != NULL && strstr(kiln_last_error(), "20") != NULL);
    // The shapes are known after the failed execute: a caller can size its buffer from them.
    CHECK_OK(kiln_context_output_shape(c, 1, &rank, dims));
    CHECK(rank == 2 && dims[0] == 2 && dims[1] == N);
    // infer_shapes: new input shape, shapes readable before any execute.
    CHECK_OK(kiln_context_set_input(c, 0, 2, (int64_t[]){3, K}, x));
    CHECK_STATUS(kiln_context_output_shape(c, 0, &rank, dims), KILN_ERR_INVALID_STATE);
    CHECK_STATUS(kiln_context_infer_shapes(c), KILN_ERR_SHAPE); // x batch 3, y batch 2
    CHECK_OK(kiln_context_set_input(c, 1, 2, (int64_t[]){3, N}, y));
    CHECK_OK(kiln_context_infer_shapes(c));
    CHECK_OK(kiln_context_output_shape(c, 0, &rank, dims));
    CHECK(rank == 2 && dims[0] == 3 && dims[1] == N);
    CHECK_OK(kiln_context_set_input(c, 0, 2, dx, x));
    CHECK_OK(kiln_context_set_input(c, 1, 2, dy, y));
    CHECK_OK(kiln_context_set_output(c, 1, sm, 24));
    CHECK_OK(kiln_context_execute(c));
    CHECK_OK(kiln_context_output_shape(c, 1, &rank, dims));
    CHECK_STATUS(kiln_context_output_shape(c, 2, &rank, dims), KILN_ERR_INVALID_ARG);
    CHECK_OK(kiln_context_set_stream(c, NULL));
    // A context reports BUSY while marked in use (the flag a second thread would find set).
    atomic_store(&c->busy, 1);
    CHECK_STATUS(kiln_context_execute(c), KILN_ERR_BUSY);
    CHECK_STATUS(kiln_context_set_input(c, 0, 2, dx, x), KILN_ERR_BUSY);
    CHECK_STATUS(kiln_context_set_output(c, 0, out, sizeof out), KILN_ERR_BUSY);
    CHECK_STATUS(kiln_context_output_shape(c, 0, &rank, dims), KILN_ERR_BUSY);
    atomic_store(&c->busy, 0);
    CHECK_OK(kiln_context_execute(c));
    // NULL-safety.
    kiln_context_free(NULL);
    kiln_engine_free(NULL);
    CHECK_STATUS(kiln_context_execute(NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_context_new(NULL, &c), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_engine_n_inputs(NULL), 0);
    kiln_context_free(c);
    kiln_engine_free(e);
}

// --- allocation failures: a counting allocator that fails the Nth allocation

static struct {
    long calls, fail_at, failed;
    int fail_all;
    long long live;
} as;

static void *counting_alloc(void *ud, size_t nbytes, size_t align) {
    size_t rounded = (nbytes + align - 1) & ~(align - 1);
    void *p;
    (void)ud;
    as.calls++;
    if (as.fail_all || as.calls == as.fail_at) {
        as.failed++;
        return NULL;
    }
    p = aligned_alloc(align, rounded ? rounded : align);
    if (p != NULL) as.live += (long long)nbytes;
    return p;
}

static void counting_free(void *ud, void *p, size_t nbytes) {
    (void)ud;
    if (p == NULL) return;
    as.live -= (long long)nbytes;
    free(p);
}

// Fails allocation 1, 2, ... of load and of context creation until each succeeds: every failure
// is KILN_ERR_NO_MEMORY with nothing leaked; then execute runs with every allocation refused.
static void test_alloc_failures(void) {
    kiln_plan p;
    uint8_t *bytes = NULL;
    size_t n = 0;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    kiln_load_options o;
    int mode = 0;
    long long base;
    long k;
    make_plan(&p);
    CHECK_OK(kiln_serialize(&p, &bytes, &n));
    kiln_plan_release(&p);
    if (bytes == NULL) return;
    kiln_load_options_init(&o);
    o.resolve = resolve;
    o.resolve_user_data = &mode;
    base = as.live;
    for (k = 1; k < 10000; k++) {
        kiln_status st;
        as.fail_at = as.calls + k;
        as.failed = 0;
        st = kiln_engine_load(bytes, n, &o, &e);
        as.fail_at = 0;
        if (st == KILN_OK && as.failed == 0) break;
        CHECK_MSG(st == KILN_ERR_NO_MEMORY, "load, allocation %ld failed: %s", k,
                  kiln_status_str(st));
        if (st == KILN_OK) kiln_engine_free(e);
        e = NULL;
        CHECK_MSG(as.live == base, "load, allocation %ld failed: %lld bytes leaked", k,
                  as.live - base);
    }
    CHECK(k > 3 && e != NULL);
    if (e == NULL) goto done;
    base = as.live;
    for (k = 1; k < 10000; k++) {
        kiln_status st;
        as.fail_at = as.calls + k;
        as.failed = 0;
        st = kiln_context_new(e, &c);
        as.fail_at = 0;
        if (st == KILN_OK && as.failed == 0) break;
        CHECK_MSG(st == KILN_ERR_NO_MEMORY, "context, allocation %ld failed: %s", k,
                  kiln_status_str(st));
        if (st == KILN_OK) kiln_context_free(c);
        c = NULL;
        CHECK_MSG(as.live == base, "context, allocation %ld failed: %lld bytes leaked", k,
                  as.live - base);
    }
    CHECK(c != NULL);
    if (c == NULL) goto done;
    // Execute allocates nothing: not on a shape change, not on a repeated run.
    as.fail_all = 1;
    run_batch(c, 3);
    run_batch(c, 3);
    run_batch(c, 8);
    as.fail_all = 0;
    CHECK_EQ_INT(as.failed, 0);
done:
    kiln_context_free(c);
    kiln_engine_free(e);
    kiln_free(bytes, n);
    CHECK_EQ_INT(as.live, 0);
}

int main(void) {
    kiln_allocator counting = {NULL, counting_alloc, counting_free};
    CHECK_OK(kiln_set_allocator(&counting));
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    test_run();
    test_serialized();
    test_errors();
    test_alloc_failures();
    CHECK_EQ_INT(as.live, 0);
    return check_summary();
}
