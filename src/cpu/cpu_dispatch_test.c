// SPDX-License-Identifier: Apache-2.0
// The CPU backend's dispatch: every op of the op table runs for every dtype its dtype_mask
// lists (a small valid layer per op), scratch queries work without data pointers, and bad
// requests (unknown op, unsupported dtype, missing input, NULL args) fail with the right status.
#include "cpu/cpu_internal.h"
#include "cpu/cpu_test_util.h"

typedef struct layer {
    kiln_tensor *in[5];
    uint32_t n_in;
    kiln_tensor *out;
    tattrs a;
} layer;

static void layer_free(layer *l) {
    for (uint32_t i = 0; i < l->n_in; i++) tt_free(l->in[i]);
    tt_free(l->out);
}

// A small valid layer of `op` in dtype dt; 0 if the op has no recipe here.
static int make_layer(uint32_t op, uint32_t dt, layer *l) {
    memset(l, 0, sizeof *l);
    tattrs_init(&l->a, op);
    const kiln_op_def *def = kiln_op_def_get(op);
    switch (op) {
    case KILN_OP_LINEAR:
        l->in[0] = tt_new2(dt, 3, 4), l->in[1] = tt_new2(dt, 5, 4), l->in[2] = tt_new1(dt, 5);
        l->n_in = 3, l->out = tt_new2(dt, 3, 5);
        break;
    case KILN_OP_MATMUL:
        l->in[0] = tt_new3(dt, 2, 3, 4), l->in[1] = tt_new2(dt, 4, 5);
        l->n_in = 2, l->out = tt_new3(dt, 2, 3, 5);
        break;
    case KILN_OP_SELECTIVE_SCAN:
        l->in[0] = tt_new4(dt, 2, 3, 5, 4), l->in[1] = tt_new4(dt, 2, 3, 5, 4);
        l->in[2] = tt_new3(dt, 2, 5, 4), l->in[3] = tt_new3(dt, 2, 3, 4), l->n_in = 4;
        l->out = tt_new3(dt, 2, 3, 5);
        break;
    case KILN_OP_GATHER_MATMUL:
        l->in[0] = tt_new3(dt, 3, 2, 4), l->in[1] = tt_new1(KILN_DTYPE_I64, 5);
        l->in[2] = tt_new3(dt, 5, 4, 2), l->n_in = 3, l->out = tt_new3(dt, 5, 2, 2);
        break;
    case KILN_OP_CONV2D:
        l->in[0] = tt_new4(dt, 1, 2, 5, 5), l->in[1] = tt_new4(dt, 3, 2, 3, 3);
        l->in[2] = tt_new1(dt, 3), l->n_in = 3, l->out = tt_new4(dt, 1, 3, 3, 3);
        break;
    case KILN_OP_CONV_TRANSPOSE2D:
        l->in[0] = tt_new4(dt, 1, 2, 3, 3), l->in[1] = tt_new4(dt, 2, 3, 2, 2);
        l->in[2] = tt_new1(dt, 3), l->n_in = 3, l->out = tt_new4(dt, 1, 3, 4, 4);
        break;
    case KILN_OP_BATCH_NORM:
        l->in[0] = tt_new3(dt, 2, 3, 4);
        for (int i = 1; i < 5; i++) l->in[i] = tt_new1(dt, 3);
        l->n_in = 5, l->out = tt_new3(dt, 2, 3, 4);
        break;
    case KILN_OP_CAST:
        l->in[0] = tt_new2(KILN_DTYPE_F32, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        tattrs_int(&l->a, KILN_A_CAST_DTYPE, dt);
        break;
    case KILN_OP_WHERE:
        l->in[0] = tt_new2(KILN_DTYPE_BOOL, 2, 3), l->in[1] = tt_new2(dt, 2, 3);
        l->in[2] = tt_new1(dt, 3), l->n_in = 3, l->out = tt_new2(dt, 2, 3);
        break;
    case KILN_OP_SOFTMAX:
    case KILN_OP_LOG_SOFTMAX:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        tattrs_int(&l->a, KILN_A_SOFTMAX_DIM, -1);
        break;
    case KILN_OP_LAYER_NORM:
        l->in[0] = tt_new2(dt, 2, 3), l->in[1] = tt_new1(dt, 3), l->in[2] = tt_new1(dt, 3);
        l->n_in = 3, l->out = tt_new2(dt, 2, 3);
        tattrs_int(&l->a, KILN_A_LN_NDIM, 1);
        break;
    case KILN_OP_RMS_NORM:
        l->in[0] = tt_new2(dt, 2, 3), l->in[1] = tt_new1(dt, 3);
        l->n_in = 2, l->out = tt_new2(dt, 2, 3);
        break;
    case KILN_OP_ROTARY:
        l->in[0] = tt_new3(dt, 2, 3, 4), l->in[1] = tt_new2(dt, 3, 4);
        l->in[2] = tt_new2(KILN_DTYPE_F32, 3, 4), l->n_in = 3, l->out = tt_new3(dt, 2, 3, 4);
        break;
    case KILN_OP_MAX_POOL2D:
    case KILN_OP_AVG_POOL2D:
        l->in[0] = tt_new4(dt, 1, 2, 4, 4), l->n_in = 1, l->out = tt_new4(dt, 1, 2, 2, 2);
        tattrs_int2(&l->a, 0, 2, 2); // kernel
        tattrs_int2(&l->a, 1, 2, 2); // stride
        break;
    case KILN_OP_ADAPTIVE_AVG_POOL2D:
        l->in[0] = tt_new4(dt, 1, 2, 4, 4), l->n_in = 1, l->out = tt_new4(dt, 1, 2, 2, 2);
        tattrs_int2(&l->a, KILN_A_ADAPTIVE_OUTPUT, 2, 2);
        break;
    case KILN_OP_MEAN:
    case KILN_OP_SUM:
    case KILN_OP_VECTOR_NORM:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new1(dt, 2);
        tattrs_int(&l->a, KILN_A_REDUCE_DIMS, 1);
        break;
    case KILN_OP_RESHAPE:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new1(dt, 6);
        tattrs_int(&l->a, KILN_A_RESHAPE_SHAPE, -1);
        break;
    case KILN_OP_PERMUTE:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 3, 2);
        tattrs_int2(&l->a, KILN_A_PERMUTE_DIMS, 1, 0);
        break;
    case KILN_OP_EXPAND:
        l->in[0] = tt_new2(dt, 1, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        tattrs_int2(&l->a, KILN_A_EXPAND_SHAPE, 2, -1);
        break;
    case KILN_OP_CAT:
        l->in[0] = tt_new2(dt, 2, 3), l->in[1] = tt_new2(dt, 1, 3), l->n_in = 2;
        l->out = tt_new2(dt, 3, 3);
        tattrs_int(&l->a, KILN_A_CAT_DIM, 0);
        break;
    case KILN_OP_SLICE:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 2);
        tattrs_int(&l->a, KILN_A_SLICE_DIM, 1);
        tattrs_int(&l->a, KILN_A_SLICE_START, 1);
        break;
    case KILN_OP_SELECT:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new1(dt, 3);
        tattrs_int(&l->a, KILN_A_SELECT_DIM, 0);
        tattrs_int(&l->a, KILN_A_SELECT_INDEX, 1);
        break;
    case KILN_OP_SQUEEZE:
        l->in[0] = tt_new3(dt, 2, 1, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        tattrs_int(&l->a, KILN_A_SQUEEZE_DIMS, 1);
        break;
    case KILN_OP_UNSQUEEZE:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new3(dt, 1, 2, 3);
        tattrs_int(&l->a, KILN_A_UNSQUEEZE_DIM, 0);
        break;
    case KILN_OP_EMBEDDING:
        l->in[0] = tt_new2(dt, 5, 3), l->in[1] = tt_new1(KILN_DTYPE_I64, 2), l->n_in = 2;
        l->out = tt_new2(dt, 2, 3);
        break;
    case KILN_OP_EQ:
    case KILN_OP_NE:
    case KILN_OP_LT:
    case KILN_OP_LE:
    case KILN_OP_GT:
    case KILN_OP_GE:
        l->in[0] = tt_new2(dt, 2, 3), l->in[1] = tt_new1(dt, 3), l->n_in = 2;
        l->out = tt_new2(KILN_DTYPE_BOOL, 2, 3);
        break;
    case KILN_OP_GROUP_NORM:
        l->in[0] = tt_new3(dt, 2, 4, 3), l->in[1] = tt_new1(dt, 4), l->in[2] = tt_new1(dt, 4);
        l->n_in = 3, l->out = tt_new3(dt, 2, 4, 3);
        tattrs_int(&l->a, KILN_A_GN_GROUPS, 2);
        break;
    case KILN_OP_UPSAMPLE_NEAREST2D:
    case KILN_OP_UPSAMPLE_BILINEAR2D:
        l->in[0] = tt_new4(dt, 1, 2, 2, 3), l->n_in = 1, l->out = tt_new4(dt, 1, 2, 4, 5);
        tattrs_int2(&l->a, KILN_A_UPSAMPLE_SIZE, 4, 5);
        break;
    case KILN_OP_GRID_SAMPLE:
        l->in[0] = tt_new4(dt, 1, 2, 2, 3), l->in[1] = tt_new4(dt, 1, 4, 5, 2), l->n_in = 2;
        l->out = tt_new4(dt, 1, 2, 4, 5);
        break;
    case KILN_OP_CUMSUM:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        tattrs_int(&l->a, KILN_A_CUMSUM_DIM, 1);
        break;
    case KILN_OP_ARGMAX:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new1(KILN_DTYPE_I64, 2);
        tattrs_int(&l->a, KILN_A_ARGMAX_DIM, 1);
        break;
    case KILN_OP_TOPK:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(KILN_DTYPE_I64, 2, 2);
        tattrs_int(&l->a, KILN_A_TOPK_DIM, 1);
        tattrs_int(&l->a, KILN_A_TOPK_K, 2);
        break;
    case KILN_OP_PAD: {
        int64_t pads[2] = {1, -1};
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        tattrs_ints(&l->a, KILN_A_PAD_PADS, 2, pads);
        break;
    }
    case KILN_OP_ARANGE:
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new1(KILN_DTYPE_I64, 3);
        tattrs_int(&l->a, KILN_A_ARANGE_DIM, 1);
        tattrs_int(&l->a, KILN_A_ARANGE_DTYPE, KILN_DTYPE_I64);
        break;
    case KILN_OP_INDEX:
        l->in[0] = tt_new2(dt, 4, 3), l->in[1] = tt_new1(KILN_DTYPE_I32, 2), l->n_in = 2;
        l->out = tt_new2(dt, 2, 3);
        break;
    case KILN_OP_GATHER:
        l->in[0] = tt_new2(dt, 4, 3), l->in[1] = tt_new2(KILN_DTYPE_I64, 2, 3), l->n_in = 2;
        l->out = tt_new2(dt, 2, 3);
        tattrs_int(&l->a, KILN_A_GATHER_DIM, 0);
        break;
    case KILN_OP_INDEX_COPY:
        l->in[0] = tt_new2(dt, 4, 3), l->in[1] = tt_new1(KILN_DTYPE_I64, 2);
        l->in[2] = tt_new2(dt, 2, 3), l->n_in = 3, l->out = tt_new2(dt, 4, 3);
        tattrs_int(&l->a, KILN_A_INDEX_COPY_DIM, 0);
        break;
    case KILN_OP_SDPA:
        l->in[0] = tt_new3(dt, 2, 3, 4), l->in[1] = tt_new3(dt, 2, 5, 4);
        l->in[2] = tt_new3(dt, 2, 5, 4), l->n_in = 3, l->out = tt_new3(dt, 2, 3, 4);
        break;
    default:
        if (def == NULL || !(def->flags & (KILN_OPF_UNARY | KILN_OPF_BINARY))) return 0;
        l->in[0] = tt_new2(dt, 2, 3), l->n_in = 1, l->out = tt_new2(dt, 2, 3);
        if (def->flags & KILN_OPF_BINARY) l->in[1] = tt_new1(dt, 3), l->n_in = 2;
        break;
    }
    for (uint32_t i = 0; i < l->n_in; i++) {
        int positive = op == KILN_OP_LOG || op == KILN_OP_LOG1P || op == KILN_OP_SQRT ||
                       op == KILN_OP_RSQRT || op == KILN_OP_POW || op == KILN_OP_DIV ||
                       op == KILN_OP_BATCH_NORM;
        tt_rand(l->in[i], positive ? 1 : -2, 2);
    }
    if (op == KILN_OP_EMBEDDING || op == KILN_OP_INDEX || op == KILN_OP_GATHER ||
        op == KILN_OP_INDEX_COPY) {
        tt_rand(l->in[1], 0, 1);
    }
    if (op == KILN_OP_GATHER_MATMUL) tt_rand(l->in[1], 0, 2); // indices of w's 3 matrices
    return 1;
}

static void test_every_op_and_dtype(void) {
    for (uint32_t i = 0; i < kiln_op_count(); i++) {
        uint32_t op = kiln_op_id_at(i);
        const kiln_op_def *def = kiln_op_def_get(op);
        for (uint32_t dt = KILN_DTYPE_F32; dt < KILN_DTYPE_COUNT; dt++) {
            if (!(def->dtype_mask & KILN_DTYPE_BIT(dt))) continue;
            layer l;
            int made = make_layer(op, dt, &l);
            CHECK_MSG(made, "no test layer for op %s", def->name);
            if (!made) break;
            kiln_kernel_args args = targs(op, &l.a, l.in, l.n_in, l.out);
            CHECK_MSG(kiln_cpu_supports(&args), "%s does not support %s", def->name,
                      kiln_dtype_name((kiln_dtype)dt));
            // Scratch is a shape question: it must not touch data.
            kiln_kernel_args probe = args;
            kiln_tensor shadow[5], oshadow = *l.out;
            for (uint32_t j = 0; j < l.n_in; j++) {
                shadow[j] = *l.in[j];
                shadow[j].data = NULL;
                probe.in[j] = &shadow[j];
            }
            oshadow.data = NULL;
            probe.out = &oshadow;
            CHECK(kiln_cpu_scratch_nbytes(&probe) == kiln_cpu_scratch_nbytes(&args));
            kiln_status st = trun_args(&args);
            CHECK_MSG(st == KILN_OK, "%s %s: %s", def->name, kiln_dtype_name((kiln_dtype)dt),
                      kiln_last_error());
            layer_free(&l);
        }
    }
}

static void test_refusals(void) {
    CHECK_STATUS(kiln_cpu_run(NULL), KILN_ERR_INVALID_ARG);
    CHECK(!kiln_cpu_supports(NULL));
    CHECK(kiln_cpu_scratch_nbytes(NULL) == 0);
    layer l;
    make_layer(KILN_OP_RELU, KILN_DTYPE_F32, &l);
    kiln_kernel_args args = targs(KILN_OP_RELU, &l.a, l.in, l.n_in, l.out);
    args.op = 0; // invalid id
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    args.op = 99; // unused id
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    args.op = 1000;
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    layer_free(&l);
    // relu is float-only: int32 is refused with a message naming the op.
    make_layer(KILN_OP_RELU, KILN_DTYPE_I32, &l);
    args = targs(KILN_OP_RELU, &l.a, l.in, l.n_in, l.out);
    CHECK(!kiln_cpu_supports(&args));
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    CHECK(strstr(kiln_last_error(), "relu") != NULL);
    layer_free(&l);
    // A missing required input (linear's weight).
    make_layer(KILN_OP_LINEAR, KILN_DTYPE_F32, &l);
    args = targs(KILN_OP_LINEAR, &l.a, l.in, l.n_in, l.out);
    args.in[1] = NULL;
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    args.in[1] = l.in[1];
    args.n_in = 1; // too few inputs
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    layer_free(&l);
    // A view op whose input and output dtypes differ.
    make_layer(KILN_OP_PERMUTE, KILN_DTYPE_F32, &l);
    l.out->dtype = KILN_DTYPE_I32;
    args = targs(KILN_OP_PERMUTE, &l.a, l.in, l.n_in, l.out);
    CHECK_STATUS(kiln_cpu_run(&args), KILN_ERR_UNSUPPORTED);
    l.out->dtype = KILN_DTYPE_F32;
    layer_free(&l);
}

// The runtime sizes scratch once, at the largest shapes: the need must never shrink as shapes
// grow (matmul's batch folding depends on b's batch dims, for one).
static void test_scratch_monotone(void) {
    kiln_tensor *a = tt_new4(KILN_DTYPE_F32, 2, 3, 40, 5);
    kiln_tensor *b_small = tt_new4(KILN_DTYPE_F32, 1, 1, 5, 6);
    kiln_tensor *b_big = tt_new4(KILN_DTYPE_F32, 2, 3, 5, 6);
    kiln_tensor *y = tt_new4(KILN_DTYPE_F32, 2, 3, 40, 6);
    kiln_tensor *small[2] = {a, b_small}, *big[2] = {a, b_big};
    kiln_kernel_args s = targs(KILN_OP_MATMUL, NULL, small, 2, y);
    kiln_kernel_args g = targs(KILN_OP_MATMUL, NULL, big, 2, y);
    CHECK(kiln_cpu_scratch_nbytes(&s) <= kiln_cpu_scratch_nbytes(&g));
    tt_rand(a, -1, 1);
    tt_rand(b_small, -1, 1);
    // Running the folded case inside the scratch sized for the unfolded one works.
    size_t n = kiln_cpu_scratch_nbytes(&g);
    void *buf = malloc(n);
    s.scratch = buf;
    s.scratch_nbytes = n;
    CHECK_OK(kiln_cpu_run(&s));
    free(buf);
    tt_free(a), tt_free(b_small), tt_free(b_big), tt_free(y);
    // Growing any dim of a conv or a linear never lowers the need.
    for (int64_t m = 1; m < 300; m += 37) {
        kiln_tensor *x1 = tt_new2(KILN_DTYPE_F16, m, 20), *x2 = tt_new2(KILN_DTYPE_F16, m + 1, 20);
        kiln_tensor *w = tt_new2(KILN_DTYPE_F16, 9, 20);
        kiln_tensor *y1 = tt_new2(KILN_DTYPE_F16, m, 9), *y2 = tt_new2(KILN_DTYPE_F16, m + 1, 9);
        kiln_tensor *i1[2] = {x1, w}, *i2[2] = {x2, w};
        kiln_kernel_args a1 = targs(KILN_OP_LINEAR, NULL, i1, 2, y1);
        kiln_kernel_args a2 = targs(KILN_OP_LINEAR, NULL, i2, 2, y2);
        CHECK(kiln_cpu_scratch_nbytes(&a1) <= kiln_cpu_scratch_nbytes(&a2));
        tt_free(x1), tt_free(x2), tt_free(w), tt_free(y1), tt_free(y2);
    }
}

int main(void) {
    check_rng_seed();
    test_every_op_and_dtype();
    test_refusals();
    test_scratch_monotone();
    return check_summary();
}
