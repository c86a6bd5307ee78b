// SPDX-License-Identifier: Apache-2.0
// kiln_infer: hand-computed shapes for every op (static and dynamic ranges), error cases with
// their status and message, and property checks that a range result is the hull of the concrete
// results over every size in the range (computed by brute force with loop-based references).
#include <stdarg.h>

#include "check.h"
#include "core/ops.h"
#include "ir/shape.h"

// --- value specs: "f32[2,1..8,3]", "i64[]", "-" (absent)

static uint32_t parse_dtype(const char **p) {
    static const struct {
        const char *s;
        uint32_t d;
    } t[] = {{"f32", KILN_DTYPE_F32}, {"f16", KILN_DTYPE_F16}, {"bf16", KILN_DTYPE_BF16},
             {"i32", KILN_DTYPE_I32}, {"i64", KILN_DTYPE_I64}, {"bool", KILN_DTYPE_BOOL}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t n = strlen(t[i].s);
        if (strncmp(*p, t[i].s, n) == 0 && (*p)[n] == '[') {
            *p += n;
            return t[i].d;
        }
    }
    fprintf(stderr, "bad spec %s\n", *p);
    abort();
}

static kiln_value_desc V(const char *spec) {
    kiln_value_desc d;
    const char *p = spec;
    memset(&d, 0, sizeof d);
    d.dtype = parse_dtype(&p);
    p++; // '['
    while (*p != ']') {
        char *e;
        int64_t lo = strtoll(p, &e, 10), hi = lo;
        p = e;
        if (p[0] == '.' && p[1] == '.') {
            hi = strtoll(p + 2, &e, 10);
            p = e;
        }
        d.shape.min[d.shape.rank] = lo;
        d.shape.max[d.shape.rank] = hi;
        d.shape.rank++;
        if (*p == ',') p++;
    }
    return d;
}

static void desc_str(const kiln_value_desc *d, char *buf, size_t n) {
    size_t u = (size_t)snprintf(buf, n, "%s[", kiln_dtype_name((kiln_dtype)d->dtype));
    for (uint32_t i = 0; i < d->shape.rank && u < n; i++) {
        if (d->shape.min[i] == d->shape.max[i]) {
            u += (size_t)snprintf(buf + u, n - u, "%s%lld", i ? "," : "",
                                  (long long)d->shape.min[i]);
        } else {
            u += (size_t)snprintf(buf + u, n - u, "%s%lld..%lld", i ? "," : "",
                                  (long long)d->shape.min[i], (long long)d->shape.max[i]);
        }
    }
    if (u < n) snprintf(buf + u, n - u, "]");
}

// --- attributes: schema defaults, then overrides

typedef struct tat {
    uint32_t op;
    kiln_attr_ref refs[KILN_MAX_ATTRS];
    int64_t ints[256];
    double floats[64];
    uint32_t ni, nf;
    kiln_attrs v;
} tat;

static tat T_;

static tat *A(uint32_t op) {
    const kiln_op_def *d = kiln_op_def_get(op);
    tat *t = &T_;
    memset(t, 0, sizeof *t);
    t->op = op;
    for (uint32_t i = 0; d != NULL && i < d->n_attrs; i++) {
        const kiln_attr_info *s = &d->attrs[i];
        t->refs[i].kind = s->kind;
        t->refs[i].n = s->n_default;
        if (s->kind == KILN_ATTR_INTS) {
            t->refs[i].begin = t->ni;
            for (uint32_t j = 0; j < s->n_default; j++) t->ints[t->ni++] = s->default_ints[j];
        } else {
            t->refs[i].begin = t->nf;
            for (uint32_t j = 0; j < s->n_default; j++) t->floats[t->nf++] = s->default_floats[j];
        }
    }
    t->v.refs = t->refs;
    t->v.n_attrs = d != NULL ? d->n_attrs : 0;
    t->v.ints = t->ints;
    t->v.floats = t->floats;
    return t;
}

static tat *seti(tat *t, uint32_t idx, uint32_t n, const int64_t *v) {
    t->refs[idx].kind = KILN_ATTR_INTS;
    t->refs[idx].n = n;
    t->refs[idx].begin = t->ni;
    for (uint32_t j = 0; j < n; j++) t->ints[t->ni++] = v[j];
    return t;
}
#define SETI(t, idx, ...)                                                                          \
    seti((t), (idx), (uint32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),               \
         (int64_t[]){__VA_ARGS__})

static tat *setf(tat *t, uint32_t idx, double v) {
    t->refs[idx].kind = KILN_ATTR_FLOATS;
    t->refs[idx].n = 1;
    t->refs[idx].begin = t->nf;
    t->floats[t->nf++] = v;
    return t;
}

// --- running inference

static kiln_status run(tat *t, kiln_value_desc *out, uint32_t n, const char *const *specs) {
    kiln_value_desc descs[KILN_MAX_INPUTS];
    const kiln_value_desc *ptrs[KILN_MAX_INPUTS];
    for (uint32_t i = 0; i < n; i++) {
        if (strcmp(specs[i], "-") == 0) {
            ptrs[i] = NULL;
        } else {
            descs[i] = V(specs[i]);
            ptrs[i] = &descs[i];
        }
    }
    return kiln_infer(t->op, &t->v, ptrs, n, "node 7 (test)", out);
}

#define NSPECS(...) ((uint32_t)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)))

static void expect_(int line, tat *t, const char *want, uint32_t n, const char *const *specs) {
    kiln_value_desc out, w = V(want);
    kiln_status st = run(t, &out, n, specs);
    char got[256], ws[256];
    CHECK_MSG(st == KILN_OK, "line %d: %s returned %s: %s", line, kiln_op_name(t->op),
              kiln_status_str(st), kiln_last_error());
    if (st != KILN_OK) return;
    desc_str(&out, got, sizeof got);
    desc_str(&w, ws, sizeof ws);
    CHECK_MSG(memcmp(&out, &w, sizeof out) == 0, "line %d: %s gave %s, expected %s", line,
              kiln_op_name(t->op), got, ws);
}
#define EXPECT(t, want, ...)                                                                       \
    expect_(__LINE__, (t), (want), NSPECS(__VA_ARGS__), (const char *[]){__VA_ARGS__})

static void expect_err_(int line, tat *t, kiln_status want, const char *needle, uint32_t n,
                        const char *const *specs) {
    kiln_value_desc out;
    kiln_status st;
    kiln_clear_error();
    st = run(t, &out, n, specs);
    CHECK_MSG(st == want, "line %d: %s returned %s, expected %s (%s)", line, kiln_op_name(t->op),
              kiln_status_str(st), kiln_status_str(want), kiln_last_error());
    CHECK_MSG(strstr(kiln_last_error(), needle) != NULL && strstr(kiln_last_error(), "node 7"),
              "line %d: message '%s' lacks '%s' or the node name", line, kiln_last_error(), needle);
}
#define EXPECT_ERR(t, st, needle, ...)                                                             \
    expect_err_(__LINE__, (t), (st), (needle), NSPECS(__VA_ARGS__), (const char *[]){__VA_ARGS__})

// --- per-op cases

static void test_linear(void) {
    EXPECT(A(KILN_OP_LINEAR), "f32[4,8]", "f32[4,16]", "f32[8,16]");
    EXPECT(A(KILN_OP_LINEAR), "f32[2..6,3,8]", "f32[2..6,3,16]", "f32[8,16]", "f32[8]");
    EXPECT(A(KILN_OP_LINEAR), "f16[8]", "f16[1..32]", "f16[8,16]", "-");
    EXPECT(A(KILN_OP_LINEAR), "bf16[1,8]", "bf16[1,16]", "bf16[8,16]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_SHAPE, "in_features", "f32[4,15]", "f32[8,16]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_SHAPE, "input 2 (bias)", "f32[4,16]", "f32[8,16]",
               "f32[7]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_SHAPE, "float16", "f32[4,16]", "f16[8,16]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_UNSUPPORTED, "int32", "i32[4,16]", "i32[8,16]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_SHAPE, "rank 3", "f32[4,16]", "f32[8,16,1]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_SHAPE, "rank 0", "f32[]", "f32[8,16]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_INVALID_ARG, "takes 2 to 3 inputs", "f32[4,16]");
    EXPECT_ERR(A(KILN_OP_LINEAR), KILN_ERR_INVALID_ARG, "input 1 (weight) is required", "f32[4]",
               "-");
}

static void test_matmul(void) {
    EXPECT(A(KILN_OP_MATMUL), "f32[2,3,5]", "f32[2,3,4]", "f32[4,5]");
    EXPECT(A(KILN_OP_MATMUL), "f32[3,5]", "f32[3,4]", "f32[4,5]");
    EXPECT(A(KILN_OP_MATMUL), "f32[1..8,6,3,5]", "f32[1..8,1,3,4]", "f32[6,4,5]");
    EXPECT(A(KILN_OP_MATMUL), "f16[2,1..9,1..7]", "f16[2,1..9,64]", "f16[2,64,1..7]");
    EXPECT_ERR(A(KILN_OP_MATMUL), KILN_ERR_SHAPE, "broadcast", "f32[2,3,4]", "f32[3,4,5]");
    EXPECT_ERR(A(KILN_OP_MATMUL), KILN_ERR_SHAPE, "inner dimension", "f32[3,4]", "f32[5,6]");
    EXPECT_ERR(A(KILN_OP_MATMUL), KILN_ERR_SHAPE, "rank 1", "f32[4]", "f32[4,5]");
}

static void test_conv2d(void) {
    tat *t;
    EXPECT(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_PADDING, 1, 1), "f32[1,16,32,32]", "f32[1,3,32,32]",
           "f32[16,3,3,3]");
    t = SETI(A(KILN_OP_CONV2D), KILN_A_CONV_PADDING, 1, 1);
    SETI(t, KILN_A_CONV_STRIDE, 2, 2);
    EXPECT(t, "f32[2,16,16,16]", "f32[2,3,32,32]", "f32[16,3,3,3]", "f32[16]");
    // dilation 2, kernel 3: effective 5; 32 - 5 + 1 = 28
    EXPECT(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_DILATION, 2, 2), "f32[1,4,28,28]", "f32[1,3,32,32]",
           "f32[4,3,3,3]");
    // depthwise
    EXPECT(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_GROUPS, 8), "f32[1,8,8,8]", "f32[1,8,10,10]",
           "f32[8,1,3,3]");
    // asymmetric: H = (7 - 2)/2 + 1 = 3, W = (9 + 2 - 3)/1 + 1 = 9
    t = SETI(A(KILN_OP_CONV2D), KILN_A_CONV_STRIDE, 2, 1);
    SETI(t, KILN_A_CONV_PADDING, 0, 1);
    EXPECT(t, "f32[1,16,3,9]", "f32[1,3,7,9]", "f32[16,3,2,3]");
    // dynamic: H in [8, 64], k 3, s 2: (8-3)/2+1 = 3 .. (64-3)/2+1 = 31
    EXPECT(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_STRIDE, 2, 2), "f32[1..4,16,3..31,3]",
           "f32[1..4,3,8..64,8]", "f32[16,3,3,3]");
    // a range reaching sizes below the kernel: the minimum is raised to 1
    EXPECT(A(KILN_OP_CONV2D), "f32[1,16,1..62,1]", "f32[1,3,1..64,3]", "f32[16,3,3,3]");
    // channels given as a range agree with the weight
    EXPECT(A(KILN_OP_CONV2D), "f32[1,16,1,1]", "f32[1,1..8,3,3]", "f32[16,3,3,3]");
    EXPECT_ERR(A(KILN_OP_CONV2D), KILN_ERR_SHAPE, "smaller than the kernel", "f32[1,3,2,8]",
               "f32[16,3,3,3]");
    EXPECT_ERR(A(KILN_OP_CONV2D), KILN_ERR_SHAPE, "channels", "f32[1,4,8,8]", "f32[16,3,3,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_GROUPS, 3), KILN_ERR_SHAPE, "groups",
               "f32[1,3,8,8]", "f32[16,1,3,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_STRIDE, 0, 1), KILN_ERR_UNSUPPORTED,
               "'stride'[0] = 0", "f32[1,3,8,8]", "f32[16,3,3,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_PADDING, -1, 0), KILN_ERR_UNSUPPORTED,
               "'padding'[0] = -1", "f32[1,3,8,8]", "f32[16,3,3,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_GROUPS, 0), KILN_ERR_UNSUPPORTED,
               "'groups'[0] = 0", "f32[1,3,8,8]", "f32[16,3,3,3]");
    EXPECT_ERR(A(KILN_OP_CONV2D), KILN_ERR_SHAPE, "bias", "f32[1,3,8,8]", "f32[16,3,3,3]",
               "f32[15]");
    EXPECT_ERR(A(KILN_OP_CONV2D), KILN_ERR_SHAPE, "rank 3", "f32[3,8,8]", "f32[16,3,3,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CONV2D), KILN_A_CONV_STRIDE, 1), KILN_ERR_INVALID_ARG,
               "'stride' has 1 values", "f32[1,3,8,8]", "f32[16,3,3,3]");
}

static void test_conv_transpose2d(void) {
    tat *t = SETI(A(KILN_OP_CONV_TRANSPOSE2D), KILN_A_CONVT_STRIDE, 2, 2);
    SETI(t, KILN_A_CONVT_PADDING, 1, 1);
    // (8 - 1) * 2 - 2 + 3 + 0 + 1 = 16
    EXPECT(t, "f32[1,8,16,16]", "f32[1,16,8,8]", "f32[16,8,4,4]", "f32[8]");
    // dynamic: H in [1, 8]: 0*2 - 2 + 3 + 1 = 2 .. 16
    EXPECT(t, "f32[1,8,2..16,16]", "f32[1,16,1..8,8]", "f32[16,8,4,4]");
    SETI(t, KILN_A_CONVT_OUTPUT_PADDING, 1, 0);
    EXPECT(t, "f32[1,8,17,16]", "f32[1,16,8,8]", "f32[16,8,4,4]");
    // groups 2: out channels = 4 * 2; (8 - 1) + 2 + 1 = 10
    EXPECT(SETI(A(KILN_OP_CONV_TRANSPOSE2D), KILN_A_CONVT_GROUPS, 2), "f32[1,8,10,10]",
           "f32[1,16,8,8]", "f32[16,4,3,3]", "f32[8]");
    // dilation 2: (8 - 1) + 2 * 2 + 1 = 12
    EXPECT(SETI(A(KILN_OP_CONV_TRANSPOSE2D), KILN_A_CONVT_DILATION, 2, 2), "f32[1,4,12,12]",
           "f32[1,16,8,8]", "f32[16,4,3,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CONV_TRANSPOSE2D), KILN_A_CONVT_OUTPUT_PADDING, 1, 1),
               KILN_ERR_UNSUPPORTED, "output_padding", "f32[1,16,8,8]", "f32[16,8,4,4]");
    EXPECT_ERR(A(KILN_OP_CONV_TRANSPOSE2D), KILN_ERR_SHAPE, "channels", "f32[1,15,8,8]",
               "f32[16,8,4,4]");
    EXPECT_ERR(A(KILN_OP_CONV_TRANSPOSE2D), KILN_ERR_SHAPE, "output channels", "f32[1,16,8,8]",
               "f32[16,8,4,4]", "f32[16]");
    t = SETI(A(KILN_OP_CONV_TRANSPOSE2D), KILN_A_CONVT_PADDING, 3, 3);
    EXPECT_ERR(t, KILN_ERR_SHAPE, "< 1", "f32[1,16,1,1]", "f32[16,8,3,3]");
}

static void test_batch_norm(void) {
    EXPECT(A(KILN_OP_BATCH_NORM), "f32[2,3,4,4]", "f32[2,3,4,4]", "f32[3]", "f32[3]", "f32[3]",
           "f32[3]");
    EXPECT(A(KILN_OP_BATCH_NORM), "f16[2,3]", "f16[2,3]", "-", "-", "f16[3]", "f16[3]");
    EXPECT(A(KILN_OP_BATCH_NORM), "f32[1..4,3,5]", "f32[1..4,1..8,5]", "-", "-", "f32[3]",
           "f32[3]");
    EXPECT_ERR(A(KILN_OP_BATCH_NORM), KILN_ERR_SHAPE, "running_mean", "f32[2,3,4,4]", "-", "-",
               "f32[4]", "f32[3]");
    EXPECT_ERR(setf(A(KILN_OP_BATCH_NORM), KILN_A_BN_EPS, -1.0), KILN_ERR_UNSUPPORTED, "eps",
               "f32[2,3]", "-", "-", "f32[3]", "f32[3]");
    EXPECT_ERR(A(KILN_OP_BATCH_NORM), KILN_ERR_SHAPE, "rank 1", "f32[3]", "-", "-", "f32[3]",
               "f32[3]");
    EXPECT_ERR(A(KILN_OP_BATCH_NORM), KILN_ERR_INVALID_ARG, "running_var", "f32[2,3]", "-", "-",
               "f32[3]", "-");
    EXPECT_ERR(A(KILN_OP_BATCH_NORM), KILN_ERR_SHAPE, "dtype", "f32[2,3]", "f16[3]", "-", "f32[3]",
               "f32[3]");
}

static void test_unary(void) {
    static const uint32_t fops[] = {
        KILN_OP_RELU, KILN_OP_GELU,      KILN_OP_SILU,        KILN_OP_SIGMOID,
        KILN_OP_TANH, KILN_OP_HARDSWISH, KILN_OP_HARDSIGMOID, KILN_OP_NEG,
        KILN_OP_SQRT, KILN_OP_RSQRT,     KILN_OP_EXP,         KILN_OP_LOG,
        KILN_OP_COPY, KILN_OP_CLAMP,     KILN_OP_LOG1P,       KILN_OP_ERF};
    for (size_t i = 0; i < sizeof fops / sizeof fops[0]; i++) {
        EXPECT(A(fops[i]), "f32[2,1..3]", "f32[2,1..3]");
        EXPECT(A(fops[i]), "bf16[]", "bf16[]");
    }
    EXPECT_ERR(A(KILN_OP_RELU), KILN_ERR_UNSUPPORTED, "int32", "i32[2]");
    EXPECT_ERR(A(KILN_OP_SQRT), KILN_ERR_UNSUPPORTED, "int64", "i64[2]");
    EXPECT(A(KILN_OP_NEG), "i64[4]", "i64[4]");
    EXPECT(A(KILN_OP_CLAMP), "i32[4]", "i32[4]");
    EXPECT_ERR(A(KILN_OP_CLAMP), KILN_ERR_UNSUPPORTED, "bool", "bool[4]");
    EXPECT(A(KILN_OP_COPY), "bool[4]", "bool[4]");
    EXPECT(SETI(A(KILN_OP_GELU), KILN_A_GELU_APPROXIMATE, 1), "f32[3]", "f32[3]");
    EXPECT_ERR(SETI(A(KILN_OP_GELU), KILN_A_GELU_APPROXIMATE, 2), KILN_ERR_UNSUPPORTED,
               "'approximate'[0] = 2", "f32[3]");
    EXPECT_ERR(A(KILN_OP_RELU), KILN_ERR_INVALID_ARG, "takes 1 inputs", "f32[3]", "f32[3]");
}

static void test_cast(void) {
    EXPECT(SETI(A(KILN_OP_CAST), KILN_A_CAST_DTYPE, KILN_DTYPE_F16), "f16[3,1..4]", "i64[3,1..4]");
    EXPECT(SETI(A(KILN_OP_CAST), KILN_A_CAST_DTYPE, KILN_DTYPE_BOOL), "bool[2]", "f32[2]");
    EXPECT(SETI(A(KILN_OP_CAST), KILN_A_CAST_DTYPE, KILN_DTYPE_F32), "f32[2]", "bool[2]");
    EXPECT_ERR(SETI(A(KILN_OP_CAST), KILN_A_CAST_DTYPE, 0), KILN_ERR_UNSUPPORTED, "'dtype' = 0",
               "f32[2]");
    EXPECT_ERR(SETI(A(KILN_OP_CAST), KILN_A_CAST_DTYPE, 7), KILN_ERR_UNSUPPORTED, "'dtype' = 7",
               "f32[2]");
    // required attribute left unset by the caller: zero values
    EXPECT_ERR(A(KILN_OP_CAST), KILN_ERR_INVALID_ARG, "'dtype' has 0 values", "f32[2]");
}

static void test_binary(void) {
    static const uint32_t ops[] = {KILN_OP_ADD, KILN_OP_SUB, KILN_OP_MUL, KILN_OP_DIV, KILN_OP_POW};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        EXPECT(A(ops[i]), "f32[2,4,3]", "f32[2,1,3]", "f32[4,1]");
        EXPECT(A(ops[i]), "f32[3]", "f32[3]", "f32[]");
        EXPECT(A(ops[i]), "f32[]", "f32[]", "f32[]");
        EXPECT(A(ops[i]), "f16[1..8,4]", "f16[1..8,4]", "f16[1,4]");
        EXPECT(A(ops[i]), "f32[5,4]", "f32[1..8,4]", "f32[5,4]");
        EXPECT(A(ops[i]), "f32[2..8]", "f32[2..8]", "f32[1]");
        EXPECT(A(ops[i]), "f32[3..4]", "f32[2..4]", "f32[3..8]");
        EXPECT(A(ops[i]), "f32[3..8]", "f32[1..4]", "f32[3..8]");
        EXPECT(A(ops[i]), "f32[1..8]", "f32[1..8]", "f32[1..8]");
        EXPECT(A(ops[i]), "f32[0]", "f32[0]", "f32[1]");
        EXPECT_ERR(A(ops[i]), KILN_ERR_SHAPE, "do not broadcast", "f32[2..8]", "f32[9]");
        EXPECT_ERR(A(ops[i]), KILN_ERR_SHAPE, "do not broadcast", "f32[3]", "f32[4]");
        EXPECT_ERR(A(ops[i]), KILN_ERR_SHAPE, "do not broadcast", "f32[0]", "f32[3]");
        EXPECT_ERR(A(ops[i]), KILN_ERR_SHAPE, "insert a cast", "f32[3]", "f16[3]");
        EXPECT_ERR(A(ops[i]), KILN_ERR_UNSUPPORTED, "bool", "bool[3]", "bool[3]");
    }
    EXPECT(A(KILN_OP_ADD), "i64[2,3]", "i64[2,3]", "i64[3]");
    EXPECT_ERR(A(KILN_OP_DIV), KILN_ERR_UNSUPPORTED, "int32", "i32[3]", "i32[3]");
    EXPECT_ERR(A(KILN_OP_POW), KILN_ERR_UNSUPPORTED, "int64", "i64[3]", "i64[3]");
}

static void test_logic(void) {
    static const uint32_t cmp[] = {KILN_OP_EQ, KILN_OP_NE, KILN_OP_LT,
                                   KILN_OP_LE, KILN_OP_GT, KILN_OP_GE};
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
        EXPECT(A(cmp[i]), "bool[2,4,3]", "f32[2,1,3]", "f32[4,1]");
        EXPECT(A(cmp[i]), "bool[1..8,5]", "i64[1..8,5]", "i64[]");
        EXPECT(A(cmp[i]), "bool[3]", "bool[3]", "bool[1]");
        EXPECT_ERR(A(cmp[i]), KILN_ERR_SHAPE, "insert a cast", "f32[3]", "i64[3]");
        EXPECT_ERR(A(cmp[i]), KILN_ERR_SHAPE, "do not broadcast", "i32[3]", "i32[4]");
    }
    static const uint32_t bit[] = {KILN_OP_BITWISE_AND, KILN_OP_BITWISE_OR, KILN_OP_BITWISE_XOR};
    for (size_t i = 0; i < 3; i++) {
        EXPECT(A(bit[i]), "bool[1,1..128,128]", "bool[1,1..128,1]", "bool[128]");
        EXPECT(A(bit[i]), "i32[2,3]", "i32[2,3]", "i32[3]");
        EXPECT_ERR(A(bit[i]), KILN_ERR_UNSUPPORTED, "supports int32, int64, bool", "f32[3]",
                   "f32[3]");
    }
    EXPECT(A(KILN_OP_BITWISE_NOT), "bool[4,2]", "bool[4,2]");
    EXPECT(A(KILN_OP_BITWISE_NOT), "i64[0]", "i64[0]");
    EXPECT_ERR(A(KILN_OP_BITWISE_NOT), KILN_ERR_UNSUPPORTED, "float16", "f16[2]");
    EXPECT(A(KILN_OP_COS), "f16[2,1..9]", "f16[2,1..9]");
    EXPECT_ERR(A(KILN_OP_SIN), KILN_ERR_UNSUPPORTED, "int64", "i64[2]");
}

static void test_group_norm(void) {
    EXPECT(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 4), "f32[2,8,5,5]", "f32[2,8,5,5]",
           "f32[8]", "f32[8]");
    EXPECT(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 1), "f16[1..4,6,1..100]",
           "f16[1..4,6,1..100]", "-", "-");
    EXPECT_ERR(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 3), KILN_ERR_SHAPE,
               "static multiple of groups = 3", "f32[2,8,5]");
    EXPECT_ERR(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 2), KILN_ERR_SHAPE, "static multiple",
               "f32[2,2..8,5]");
    EXPECT_ERR(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 0), KILN_ERR_UNSUPPORTED,
               "'groups'[0] = 0", "f32[2,8,5]");
    EXPECT_ERR(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 2), KILN_ERR_SHAPE, "expected 8",
               "f32[2,8,5]", "f32[4]");
    EXPECT_ERR(SETI(A(KILN_OP_GROUP_NORM), KILN_A_GN_GROUPS, 1), KILN_ERR_SHAPE, "rank 1",
               "f32[8]");
}

static void test_upsample(void) {
    EXPECT(SETI(A(KILN_OP_UPSAMPLE_NEAREST2D), KILN_A_UPSAMPLE_SIZE, 14, 16), "f32[1..8,3,14,16]",
           "f32[1..8,3,7,8]");
    EXPECT(SETI(A(KILN_OP_UPSAMPLE_BILINEAR2D), KILN_A_UPSAMPLE_SIZE, 224, 224),
           "bf16[2,21,224,224]", "bf16[2,21,28,28]");
    EXPECT(SETI(A(KILN_OP_UPSAMPLE_NEAREST2D), KILN_A_UPSAMPLE_SIZE, 2, 3), "f32[1,1,2,3]",
           "f32[1,1,5,9]");
    EXPECT_ERR(SETI(A(KILN_OP_UPSAMPLE_NEAREST2D), KILN_A_UPSAMPLE_SIZE, 0, 3),
               KILN_ERR_UNSUPPORTED, "'output_size'[0] = 0", "f32[1,1,2,3]");
    EXPECT_ERR(SETI(A(KILN_OP_UPSAMPLE_NEAREST2D), KILN_A_UPSAMPLE_SIZE, 4, 4), KILN_ERR_SHAPE,
               "rank 3", "f32[1,2,3]");
    EXPECT_ERR(SETI(A(KILN_OP_UPSAMPLE_NEAREST2D), KILN_A_UPSAMPLE_SIZE, 4, 4), KILN_ERR_SHAPE,
               "empty spatial", "f32[1,2,0,3]");
    EXPECT_ERR(SETI(SETI(A(KILN_OP_UPSAMPLE_BILINEAR2D), KILN_A_UPSAMPLE_SIZE, 4, 4),
                    KILN_A_UPSAMPLE_ALIGN, 2),
               KILN_ERR_UNSUPPORTED, "'align_corners'", "f32[1,2,3,3]");
    // grid_sample: x [N, C, H, W] at grid [N, Ho, Wo, 2] (x's dtype or float32)
    EXPECT(A(KILN_OP_GRID_SAMPLE), "f32[2,3,300,4]", "f32[2,3,20,25]", "f32[2,300,4,2]");
    EXPECT(A(KILN_OP_GRID_SAMPLE), "f16[1..8,32,5,6]", "f16[1..8,32,9,9]", "f32[1..8,5,6,2]");
    EXPECT(SETI(A(KILN_OP_GRID_SAMPLE), KILN_A_GRID_MODE, 1), "bf16[1,2,3,4]", "bf16[1,2,5,5]",
           "bf16[1,3,4,2]");
    EXPECT_ERR(A(KILN_OP_GRID_SAMPLE), KILN_ERR_SHAPE, "dimension of 2", "f32[1,2,5,5]",
               "f32[1,3,4,3]");
    EXPECT_ERR(A(KILN_OP_GRID_SAMPLE), KILN_ERR_SHAPE, "batch", "f32[2,2,5,5]", "f32[3,3,4,2]");
    EXPECT_ERR(A(KILN_OP_GRID_SAMPLE), KILN_ERR_SHAPE, "dtype", "f16[1,2,5,5]", "bf16[1,3,4,2]");
    EXPECT_ERR(SETI(A(KILN_OP_GRID_SAMPLE), KILN_A_GRID_MODE, 2), KILN_ERR_UNSUPPORTED,
               "'mode' = 2", "f32[1,2,5,5]", "f32[1,3,4,2]");
    EXPECT_ERR(SETI(A(KILN_OP_GRID_SAMPLE), KILN_A_GRID_PADDING, 2), KILN_ERR_UNSUPPORTED,
               "'padding_mode' = 2", "f32[1,2,5,5]", "f32[1,3,4,2]");
}

static void test_cumsum_pad(void) {
    EXPECT(SETI(A(KILN_OP_CUMSUM), 0, -1), "i64[1..8,1..512]", "i64[1..8,1..512]");
    EXPECT(SETI(A(KILN_OP_CUMSUM), 0, 0), "f32[3,2]", "f32[3,2]");
    EXPECT_ERR(SETI(A(KILN_OP_CUMSUM), 0, 2), KILN_ERR_SHAPE, "out of range", "f32[3,2]");
    EXPECT_ERR(SETI(A(KILN_OP_CUMSUM), 0, 0), KILN_ERR_UNSUPPORTED, "bool", "bool[3]");
    // topk: x -> int64 indices, k along dim (at most the dim's smallest size)
    EXPECT(SETI(SETI(A(KILN_OP_TOPK), KILN_A_TOPK_DIM, -1), KILN_A_TOPK_K, 2), "i64[1..8,2]",
           "f32[1..8,6]");
    EXPECT(SETI(SETI(A(KILN_OP_TOPK), KILN_A_TOPK_DIM, 0), KILN_A_TOPK_K, 3), "i64[3,4]",
           "bf16[5,4]");
    EXPECT_ERR(SETI(SETI(A(KILN_OP_TOPK), KILN_A_TOPK_DIM, -1), KILN_A_TOPK_K, 3), KILN_ERR_SHAPE,
               "at most", "f32[4,2..6]");
    EXPECT_ERR(SETI(SETI(A(KILN_OP_TOPK), KILN_A_TOPK_DIM, 2), KILN_A_TOPK_K, 1), KILN_ERR_SHAPE,
               "out of range", "f32[4,6]");
    // gather_matmul: w [E, M, K], idx [B], x [B, K, N] -> [B, M, N]
    EXPECT(A(KILN_OP_GATHER_MATMUL), "f16[1..256,64,1]", "f16[4,64,32]", "i64[1..256]",
           "f16[1..256,32,1]");
    EXPECT(A(KILN_OP_GATHER_MATMUL), "f32[6,5,3]", "f32[2,5,7]", "i32[6]", "f32[6,7,3]");
    EXPECT_ERR(A(KILN_OP_GATHER_MATMUL), KILN_ERR_SHAPE, "inner", "f32[2,5,7]", "i64[6]",
               "f32[6,8,3]");
    EXPECT_ERR(A(KILN_OP_GATHER_MATMUL), KILN_ERR_SHAPE, "batch", "f32[2,5,7]", "i64[5]",
               "f32[6,7,3]");
    EXPECT_ERR(A(KILN_OP_GATHER_MATMUL), KILN_ERR_UNSUPPORTED, "int32, int64", "f32[2,5,7]",
               "f32[6]", "f32[6,7,3]");
    EXPECT(SETI(A(KILN_OP_PAD), 0, 1, 2), "f32[2,3,8]", "f32[2,3,5]");
    EXPECT(SETI(A(KILN_OP_PAD), 0, 0, 0, 1, 2, -1, 0), "bool[1,6,5]", "bool[2,3,5]");
    EXPECT(SETI(A(KILN_OP_PAD), 0, 0, 1), "i64[1..5,2..9]", "i64[1..5,1..8]");
    EXPECT(SETI(A(KILN_OP_PAD), 0, -3, 0), "f32[2,0..5]", "f32[2,1..8]");
    EXPECT_ERR(SETI(A(KILN_OP_PAD), 0, 1), KILN_ERR_SHAPE, "(before, after) pairs", "f32[3]");
    EXPECT_ERR(SETI(A(KILN_OP_PAD), 0, 1, 1, 1, 1), KILN_ERR_SHAPE, "pairs", "f32[3]");
    EXPECT_ERR(SETI(A(KILN_OP_PAD), 0, -2, -2), KILN_ERR_SHAPE, "negative size", "f32[3]");
}

static void test_arange(void) {
    tat *t =
        SETI(SETI(A(KILN_OP_ARANGE), KILN_A_ARANGE_DIM, 1), KILN_A_ARANGE_DTYPE, KILN_DTYPE_I64);
    EXPECT(t, "i64[1..512]", "bool[1..8,1..512]");
    t = SETI(SETI(A(KILN_OP_ARANGE), KILN_A_ARANGE_DIM, -1), KILN_A_ARANGE_DTYPE, KILN_DTYPE_F16);
    EXPECT(t, "f16[7]", "f32[3,7]");
    t = SETI(SETI(A(KILN_OP_ARANGE), KILN_A_ARANGE_DIM, 0), KILN_A_ARANGE_DTYPE, KILN_DTYPE_BOOL);
    EXPECT_ERR(t, KILN_ERR_UNSUPPORTED, "numeric", "f32[3]");
    t = SETI(SETI(A(KILN_OP_ARANGE), KILN_A_ARANGE_DIM, 0), KILN_A_ARANGE_DTYPE, KILN_DTYPE_I32);
    setf(t, KILN_A_ARANGE_STEP, 0.5);
    EXPECT_ERR(t, KILN_ERR_UNSUPPORTED, "integer start and step", "f32[3]");
    t = SETI(SETI(A(KILN_OP_ARANGE), KILN_A_ARANGE_DIM, 0), KILN_A_ARANGE_DTYPE, KILN_DTYPE_F32);
    setf(t, KILN_A_ARANGE_STEP, 0.0);
    EXPECT_ERR(t, KILN_ERR_UNSUPPORTED, "step != 0", "f32[3]");
    t = SETI(SETI(A(KILN_OP_ARANGE), KILN_A_ARANGE_DIM, 2), KILN_A_ARANGE_DTYPE, KILN_DTYPE_F32);
    EXPECT_ERR(t, KILN_ERR_SHAPE, "out of range", "f32[3]");
}

static void test_index_gather(void) {
    EXPECT(A(KILN_OP_INDEX), "f32[4,7]", "f32[10,3]", "i64[4,1]", "i64[7]");
    EXPECT(A(KILN_OP_INDEX), "f32[4,7,3]", "f32[10,3]", "i64[4,7]");
    EXPECT(SETI(A(KILN_OP_INDEX), 0, 1), "f32[2,4,1,3]", "f32[2,10,6,3]", "i32[4,1]", "i64[1]");
    EXPECT(SETI(A(KILN_OP_INDEX), 0, 2), "i64[2,3,5]", "i64[2,3,8]", "i64[5]");
    EXPECT(A(KILN_OP_INDEX), "bool[1..8,1,1,16]", "bool[1..8,16]", "i64[1..8,1,1,1]",
           "i64[1,1,1,16]");
    EXPECT(A(KILN_OP_INDEX), "f32[]", "f32[5]", "i64[]");
    EXPECT_ERR(SETI(A(KILN_OP_INDEX), 0, 2), KILN_ERR_SHAPE, "does not fit", "f32[2,3]", "i64[1]");
    EXPECT_ERR(A(KILN_OP_INDEX), KILN_ERR_UNSUPPORTED, "int32, int64", "f32[2,3]", "f32[1]");
    EXPECT_ERR(A(KILN_OP_INDEX), KILN_ERR_SHAPE, "do not broadcast", "f32[5,5]", "i64[2]",
               "i64[3]");
    EXPECT(SETI(A(KILN_OP_GATHER), 0, 1), "f32[3,7,2]", "f32[3,5,4]", "i64[3,7,2]");
    EXPECT(SETI(A(KILN_OP_GATHER), 0, -1), "i32[2,1]", "i32[2,9]", "i32[2,1]");
    EXPECT_ERR(SETI(A(KILN_OP_GATHER), 0, 0), KILN_ERR_SHAPE, "gather needs the rank", "f32[3,4]",
               "i64[3]");
    EXPECT_ERR(SETI(A(KILN_OP_GATHER), 0, 0), KILN_ERR_SHAPE, "larger than x", "f32[3,4]",
               "i64[3,5]");
    EXPECT_ERR(SETI(A(KILN_OP_GATHER), 0, 0), KILN_ERR_UNSUPPORTED, "int32, int64", "f32[3,4]",
               "bool[3,4]");
}

static void test_where(void) {
    EXPECT(A(KILN_OP_WHERE), "f32[2,3]", "bool[2,1]", "f32[1,3]", "f32[3]");
    EXPECT(A(KILN_OP_WHERE), "i64[4,2,3]", "bool[4,1,1]", "i64[2,3]", "i64[]");
    EXPECT(A(KILN_OP_WHERE), "bool[1..5]", "bool[1..5]", "bool[1]", "bool[1]");
    EXPECT_ERR(A(KILN_OP_WHERE), KILN_ERR_UNSUPPORTED, "bool condition", "f32[2]", "f32[2]",
               "f32[2]");
    EXPECT_ERR(A(KILN_OP_WHERE), KILN_ERR_SHAPE, "insert a cast", "bool[2]", "f32[2]", "f16[2]");
    EXPECT_ERR(A(KILN_OP_WHERE), KILN_ERR_SHAPE, "broadcast", "bool[3]", "f32[2]", "f32[2]");
}

static void test_softmax(void) {
    EXPECT(SETI(A(KILN_OP_SOFTMAX), 0, -1), "f32[2,5]", "f32[2,5]");
    EXPECT(SETI(A(KILN_OP_LOG_SOFTMAX), 0, 0), "f16[2,1..5]", "f16[2,1..5]");
    EXPECT_ERR(SETI(A(KILN_OP_SOFTMAX), 0, 2), KILN_ERR_SHAPE, "'dim'[0] = 2", "f32[2,5]");
    EXPECT_ERR(SETI(A(KILN_OP_SOFTMAX), 0, -3), KILN_ERR_SHAPE, "out of range", "f32[2,5]");
    EXPECT_ERR(SETI(A(KILN_OP_SOFTMAX), 0, 0), KILN_ERR_SHAPE, "rank 0", "f32[]");
    EXPECT_ERR(SETI(A(KILN_OP_SOFTMAX), 0, 0), KILN_ERR_UNSUPPORTED, "int64", "i64[3]");
}

static void test_layer_norm(void) {
    EXPECT(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 1), "f32[2,5,8]", "f32[2,5,8]", "f32[8]",
           "f32[8]");
    EXPECT(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 2), "f32[2,5,8]", "f32[2,5,8]", "f32[5,8]",
           "-");
    EXPECT(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 1), "f32[1..4,768]", "f32[1..4,1..1024]",
           "f32[768]", "f32[768]");
    EXPECT(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 3), "f32[2,5,8]", "f32[2,5,8]");
    EXPECT_ERR(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 2), KILN_ERR_SHAPE, "last 2 dimensions",
               "f32[2,5,8]", "f32[8]");
    EXPECT_ERR(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 1), KILN_ERR_SHAPE, "input 2 (bias)",
               "f32[2,5,8]", "f32[8]", "f32[7]");
    EXPECT_ERR(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 0), KILN_ERR_UNSUPPORTED,
               "'normalized_ndim'[0] = 0", "f32[2,5,8]");
    EXPECT_ERR(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 4), KILN_ERR_UNSUPPORTED,
               "'normalized_ndim'[0] = 4", "f32[2,5,8]");
    EXPECT_ERR(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 1), KILN_ERR_SHAPE, "dtype", "f32[2,8]",
               "f16[8]");
    EXPECT_ERR(setf(SETI(A(KILN_OP_LAYER_NORM), KILN_A_LN_NDIM, 1), KILN_A_LN_EPS, NAN),
               KILN_ERR_UNSUPPORTED, "eps", "f32[2,8]");
}

static void test_rms_norm(void) {
    EXPECT(A(KILN_OP_RMS_NORM), "f32[2,5,8]", "f32[2,5,8]", "f32[8]");
    EXPECT(A(KILN_OP_RMS_NORM), "bf16[2,5,8]", "bf16[2,5,8]");
    EXPECT(A(KILN_OP_RMS_NORM), "f16[1..4,8]", "f16[1..4,1..64]", "f16[8]");
    EXPECT_ERR(A(KILN_OP_RMS_NORM), KILN_ERR_SHAPE, "input 1 (weight)", "f32[2,8]", "f32[7]");
    EXPECT_ERR(A(KILN_OP_RMS_NORM), KILN_ERR_SHAPE, "rank", "f32[2,8]", "f32[1,8]");
    EXPECT_ERR(A(KILN_OP_RMS_NORM), KILN_ERR_SHAPE, "dtype", "bf16[2,8]", "f32[8]");
    EXPECT_ERR(A(KILN_OP_RMS_NORM), KILN_ERR_SHAPE, "rank 0", "f32[]");
    EXPECT_ERR(setf(A(KILN_OP_RMS_NORM), KILN_A_RMS_EPS, -1.0), KILN_ERR_UNSUPPORTED, "eps",
               "f32[2,8]");
}

static void test_rotary(void) {
    EXPECT(A(KILN_OP_ROTARY), "f32[2,4,3,8]", "f32[2,4,3,8]", "f32[2,1,3,8]", "f32[2,1,3,8]");
    EXPECT(A(KILN_OP_ROTARY), "bf16[1,4,1..16,8]", "bf16[1,4,1..16,8]", "f32[1,1,1..16,8]",
           "f32[1..16,8]");
    EXPECT(A(KILN_OP_ROTARY), "f16[2,3,5,8]", "f16[2,1..4,5,8]", "f16[3,5,8]", "f16[8]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "even", "f32[2,7]", "f32[2,7]", "f32[2,7]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "even", "f32[2,2..8]", "f32[8]", "f32[8]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "input 2 (sin)", "f32[2,8]", "f32[2,8]",
               "f32[3,8]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "broadcast", "f32[2,8]", "f32[1,2,8]", "f32[8]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "float32", "bf16[2,8]", "f16[8]", "bf16[8]");
    // partial rotation: tables over the first R of D
    EXPECT(A(KILN_OP_ROTARY), "f32[2,4,3,10]", "f32[2,4,3,10]", "f32[2,1,3,4]", "f32[2,1,3,4]");
    EXPECT(A(KILN_OP_ROTARY), "f16[1,4,1..16,80]", "f16[1,4,1..16,80]", "f32[1..16,20]",
           "f32[1,1,1..16,20]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "same even number", "f32[2,10]", "f32[2,4]",
               "f32[2,10]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "same even number", "f32[2,10]", "f32[2,3]",
               "f32[2,3]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "same even number", "f32[2,10]", "f32[12]",
               "f32[12]");
    EXPECT_ERR(A(KILN_OP_ROTARY), KILN_ERR_SHAPE, "broadcast", "f32[2,10]", "f32[2,2..4]",
               "f32[4]");
    // interleaved: the pairs (2i, 2i + 1); the attribute is 0 or 1
    EXPECT(SETI(A(KILN_OP_ROTARY), KILN_A_ROTARY_INTERLEAVED, 1), "f32[2,4,3,10]", "f32[2,4,3,10]",
           "f32[2,1,3,4]", "f32[2,1,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_ROTARY), KILN_A_ROTARY_INTERLEAVED, 2), KILN_ERR_SHAPE,
               "interleaved is 2", "f32[2,8]", "f32[2,8]", "f32[2,8]");
}

static tat *pool(uint32_t op, int64_t k, int64_t s, int64_t p, int ceil) {
    tat *t = A(op);
    int mp = op == KILN_OP_MAX_POOL2D;
    SETI(t, mp ? KILN_A_MAXPOOL_KERNEL : KILN_A_AVGPOOL_KERNEL, k, k);
    SETI(t, mp ? KILN_A_MAXPOOL_STRIDE : KILN_A_AVGPOOL_STRIDE, s, s);
    SETI(t, mp ? KILN_A_MAXPOOL_PADDING : KILN_A_AVGPOOL_PADDING, p, p);
    SETI(t, mp ? KILN_A_MAXPOOL_CEIL : KILN_A_AVGPOOL_CEIL, ceil);
    return t;
}

static void test_pool(void) {
    EXPECT(pool(KILN_OP_MAX_POOL2D, 2, 2, 0, 0), "f32[1,3,16,16]", "f32[1,3,32,32]");
    EXPECT(pool(KILN_OP_MAX_POOL2D, 3, 2, 1, 0), "f32[1,3,16,16]", "f32[1,3,32,32]");
    // 5 with k2 s2: floor 2, ceil 3
    EXPECT(pool(KILN_OP_MAX_POOL2D, 2, 2, 0, 0), "f32[1,3,2,2]", "f32[1,3,5,5]");
    EXPECT(pool(KILN_OP_MAX_POOL2D, 2, 2, 0, 1), "f32[1,3,3,3]", "f32[1,3,5,5]");
    // ceil mode dropping a window that would start in the right padding: 6, k2 s4 p1 -> 2
    EXPECT(pool(KILN_OP_MAX_POOL2D, 2, 4, 1, 1), "f32[1,3,2,2]", "f32[1,3,6,6]");
    EXPECT(pool(KILN_OP_MAX_POOL2D, 2, 2, 0, 0), "f32[1,3,2..16,1]", "f32[1,3,4..32,3]");
    EXPECT(SETI(pool(KILN_OP_MAX_POOL2D, 3, 1, 0, 0), KILN_A_MAXPOOL_DILATION, 2, 2),
           "f32[1,3,6,6]", "f32[1,3,10,10]");
    EXPECT_ERR(pool(KILN_OP_MAX_POOL2D, 3, 1, 2, 0), KILN_ERR_UNSUPPORTED, "half the kernel",
               "f32[1,3,8,8]");
    EXPECT_ERR(pool(KILN_OP_MAX_POOL2D, 2, 2, 0, 0), KILN_ERR_SHAPE, "< 1", "f32[1,3,1,1]");
    EXPECT_ERR(pool(KILN_OP_MAX_POOL2D, 0, 2, 0, 0), KILN_ERR_UNSUPPORTED, "'kernel'[0] = 0",
               "f32[1,3,8,8]");
    EXPECT_ERR(pool(KILN_OP_MAX_POOL2D, 2, 2, 0, 2), KILN_ERR_UNSUPPORTED, "'ceil_mode'[0] = 2",
               "f32[1,3,8,8]");
    EXPECT(pool(KILN_OP_AVG_POOL2D, 3, 2, 0, 0), "f32[1,3,3,3]", "f32[1,3,7,7]");
    EXPECT(pool(KILN_OP_AVG_POOL2D, 3, 2, 1, 1), "f32[2,3,4,4]", "f32[2,3,7,7]");
    EXPECT_ERR(SETI(pool(KILN_OP_AVG_POOL2D, 3, 2, 0, 0), KILN_A_AVGPOOL_DIVISOR, -1),
               KILN_ERR_UNSUPPORTED, "divisor_override", "f32[1,3,7,7]");
    EXPECT_ERR(SETI(pool(KILN_OP_AVG_POOL2D, 3, 2, 0, 0), KILN_A_AVGPOOL_COUNT_PAD, 2),
               KILN_ERR_UNSUPPORTED, "count_include_pad", "f32[1,3,7,7]");
    EXPECT_ERR(A(KILN_OP_MAX_POOL2D), KILN_ERR_INVALID_ARG, "'kernel' has 0 values",
               "f32[1,3,7,7]");
    EXPECT(SETI(A(KILN_OP_ADAPTIVE_AVG_POOL2D), 0, 1, 1), "f32[1,3,1,1]", "f32[1,3,7..9,7]");
    EXPECT(SETI(A(KILN_OP_ADAPTIVE_AVG_POOL2D), 0, 5, 7), "f32[2,3,5,7]", "f32[2,3,4,4]");
    EXPECT_ERR(SETI(A(KILN_OP_ADAPTIVE_AVG_POOL2D), 0, 0, 1), KILN_ERR_UNSUPPORTED,
               "'output_size'[0] = 0", "f32[1,3,7,7]");
    EXPECT_ERR(SETI(A(KILN_OP_ADAPTIVE_AVG_POOL2D), 0, 1, 1), KILN_ERR_SHAPE, "non-empty",
               "f32[1,3,0,7]");
}

static void test_reduce(void) {
    tat *t;
    EXPECT(SETI(A(KILN_OP_MEAN), KILN_A_REDUCE_DIMS, 1), "f32[2,4]", "f32[2,3,4]");
    t = SETI(A(KILN_OP_MEAN), KILN_A_REDUCE_DIMS, 1);
    SETI(t, KILN_A_REDUCE_KEEPDIM, 1);
    EXPECT(t, "f32[2,1,1..4]", "f32[2,3,1..4]");
    EXPECT(seti(A(KILN_OP_MEAN), KILN_A_REDUCE_DIMS, 0, NULL), "f32[]", "f32[2,3,4]");
    t = seti(A(KILN_OP_SUM), KILN_A_REDUCE_DIMS, 0, NULL);
    SETI(t, KILN_A_REDUCE_KEEPDIM, 1);
    EXPECT(t, "i32[1,1,1]", "i32[2,3,4]");
    EXPECT(SETI(A(KILN_OP_SUM), KILN_A_REDUCE_DIMS, -1, 0), "f32[3]", "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_SUM), KILN_A_REDUCE_DIMS, 1, -2), KILN_ERR_SHAPE, "twice",
               "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_SUM), KILN_A_REDUCE_DIMS, 3), KILN_ERR_SHAPE, "'dims'[0] = 3",
               "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_MEAN), KILN_A_REDUCE_DIMS, 0), KILN_ERR_UNSUPPORTED, "int32",
               "i32[2]");
    // 'dims' is a required list that may be empty: the graph API checks it was given at all
    EXPECT(A(KILN_OP_MEAN), "f32[]", "f32[2]");
}

static void test_reshape(void) {
    tat *t;
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, 6, 4), "f32[6,4]", "f32[2,3,4]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -1), "f32[24]", "f32[2,3,4]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, 4, -1), "i64[4,6]", "i64[2,3,4]");
    EXPECT(seti(A(KILN_OP_RESHAPE), 0, 0, NULL), "f32[]", "f32[1,1]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -1, 4), "f32[0,4]", "f32[0,4]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, 5, -1), KILN_ERR_SHAPE, "does not divide", "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, 7, 4), KILN_ERR_SHAPE, "element counts differ",
               "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, -1, -1), KILN_ERR_SHAPE, "at most one", "f32[2,3,4]");
    EXPECT_ERR(seti(A(KILN_OP_RESHAPE), 0, 0, NULL), KILN_ERR_SHAPE, "element counts", "f32[2]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, 0, -1), KILN_ERR_SHAPE, "-1", "f32[0,4]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, INT64_C(1) << 41, -1), KILN_ERR_UNSUPPORTED, "2^40",
               "f32[2]");
    // copy codes: -2 copies dim 0, -3 dim 1 ...
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -2, 16, 8, 8), "f32[1..8,16,8,8]", "f32[1..8,16,64]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -2, -1), "f32[1..8,1024]", "f32[1..8,16,64]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -1), "f32[1024..8192]", "f32[1..8,16,64]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -2, -3, 12, 64), "f32[1..8,1..128,12,64]",
           "f32[1..8,1..128,768]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -2, -3, 12, -1), "f32[1..8,1..128,12,64]",
           "f32[1..8,1..128,768]");
    // back from [B, H, S, D] permuted: copies of dims 0 and 2 cancel
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -2, -4, -1), "f32[1..8,1..128,768]",
           "f32[1..8,12,1..128,64]");
    // like: the copies come from input 1 (no cancellation; the counts must be able to agree)
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -2, -3, 768), "f32[1..8,1..128,768]",
           "f32[1..8,12,1..128,64]", "i64[1..8,1..128,5]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, -2, -9), KILN_ERR_SHAPE, "copies dimension 7",
               "f32[2,3]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, -2, -5), KILN_ERR_SHAPE, "input 1 (like)", "f32[2,3]",
               "f32[2,3]");
    // ranges without -1: [4, 32] elements can equal 32 but never 64
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, 32), "f32[32]", "f32[1..8,4]");
    EXPECT_ERR(SETI(A(KILN_OP_RESHAPE), 0, 64), KILN_ERR_SHAPE, "element counts", "f32[1..8,4]");
    // -1 over ranges: [12, 24] elements / 3
    t = SETI(A(KILN_OP_RESHAPE), 0, 3, -1);
    EXPECT(t, "f32[3,4..8]", "f32[2..4,6]");
    EXPECT(SETI(A(KILN_OP_RESHAPE), 0, -1, 2), "bool[1..3,2]", "bool[2,1..3]");
    t = seti(A(KILN_OP_RESHAPE), 0, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1});
    EXPECT_ERR(t, KILN_ERR_INVALID_ARG, "at most 8", "f32[1]");
}

static void test_expand(void) {
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, 3, 4), "f32[3,4]", "f32[3,1]");
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, 2, 3, 4), "f32[2,3,4]", "f32[3,1]");
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, -1, 4), "f32[3,4]", "f32[3,1]");
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, 0), "f32[0]", "f32[1]");
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, -2, -3), "f32[1..8,16]", "f32[1..8,1]", "i64[1..8,16]");
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, 5, -3), "bool[5,1..6]", "bool[1,1..6]");
    EXPECT(SETI(A(KILN_OP_EXPAND), 0, 8, 2), "f32[8,2]", "f32[1..8,2]");
    EXPECT_ERR(SETI(A(KILN_OP_EXPAND), 0, -1, -1, 4), KILN_ERR_SHAPE, "new leading", "f32[3,1]");
    EXPECT_ERR(SETI(A(KILN_OP_EXPAND), 0, 3, 4), KILN_ERR_SHAPE, "size-1", "f32[3,2]");
    EXPECT_ERR(SETI(A(KILN_OP_EXPAND), 0, 9, 2), KILN_ERR_SHAPE, "size-1", "f32[2..8,2]");
    EXPECT_ERR(SETI(A(KILN_OP_EXPAND), 0, 4), KILN_ERR_SHAPE, "fewer than the rank", "f32[3,1]");
}

static void test_permute(void) {
    EXPECT(SETI(A(KILN_OP_PERMUTE), 0, 2, 0, 1), "f32[4,2,1..3]", "f32[2,1..3,4]");
    EXPECT(SETI(A(KILN_OP_PERMUTE), 0, -1, 0, 1), "f32[4,2,3]", "f32[2,3,4]");
    EXPECT(seti(A(KILN_OP_PERMUTE), 0, 0, NULL), "f32[]", "f32[]");
    EXPECT_ERR(SETI(A(KILN_OP_PERMUTE), 0, 0, 0, 1), KILN_ERR_SHAPE, "twice", "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_PERMUTE), 0, 0, 1), KILN_ERR_SHAPE, "rank 3", "f32[2,3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_PERMUTE), 0, 0, 1, 3), KILN_ERR_SHAPE, "'dims'[2] = 3", "f32[2,3,4]");
}

static void test_cat(void) {
    EXPECT(SETI(A(KILN_OP_CAT), 0, 0), "f32[6,3]", "f32[2,3]", "f32[4,3]");
    EXPECT(SETI(A(KILN_OP_CAT), 0, -1), "f32[2,8]", "f32[2,3]", "f32[2,5]");
    EXPECT(SETI(A(KILN_OP_CAT), 0, 0), "f32[3..10,3]", "f32[1..8,3]", "f32[2,3]");
    EXPECT(SETI(A(KILN_OP_CAT), 0, 0), "i64[2..16,4]", "i64[1..8,4]", "i64[1..8,1..6]");
    EXPECT(SETI(A(KILN_OP_CAT), 0, 1), "f32[2,3]", "f32[2,3]");
    EXPECT(SETI(A(KILN_OP_CAT), 0, 0), "f32[3,2]", "f32[1,2]", "f32[1,2]", "f32[1,2]");
    EXPECT_ERR(SETI(A(KILN_OP_CAT), 0, 0), KILN_ERR_SHAPE, "dimension 1", "f32[2,3]", "f32[3,4]");
    EXPECT_ERR(SETI(A(KILN_OP_CAT), 0, 0), KILN_ERR_SHAPE, "rank", "f32[2,3]", "f32[3]");
    EXPECT_ERR(SETI(A(KILN_OP_CAT), 0, 0), KILN_ERR_SHAPE, "dtype", "f32[2,3]", "f16[2,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CAT), 0, 2), KILN_ERR_SHAPE, "'dim'[0] = 2", "f32[2,3]", "f32[2,3]");
    EXPECT_ERR(SETI(A(KILN_OP_CAT), 0, 0), KILN_ERR_SHAPE, "rank 0", "f32[]");
}

static tat *slice(int64_t dim, int64_t start, int64_t end, int64_t step) {
    tat *t = A(KILN_OP_SLICE);
    SETI(t, KILN_A_SLICE_DIM, dim);
    SETI(t, KILN_A_SLICE_START, start);
    SETI(t, KILN_A_SLICE_END, end);
    return SETI(t, KILN_A_SLICE_STEP, step);
}

static void test_slice_select_squeeze(void) {
    EXPECT(slice(0, 2, 5, 1), "f32[3]", "f32[10]");
    EXPECT(slice(0, -3, INT64_MAX, 1), "f32[3]", "f32[10]");
    EXPECT(slice(0, 0, INT64_MAX, 3), "f32[4]", "f32[10]");
    EXPECT(slice(0, 8, 2, 1), "f32[0]", "f32[10]");
    EXPECT(slice(0, 20, 30, 1), "f32[0]", "f32[10]");
    EXPECT(slice(0, -20, 4, 1), "f32[4]", "f32[10]");
    EXPECT(slice(0, 0, -1, 1), "f32[9]", "f32[10]");
    EXPECT(slice(-1, 1, INT64_MAX, 2), "f32[2,5]", "f32[2,10]");
    EXPECT(slice(0, INT64_MIN, INT64_MAX, INT64_MAX), "f32[1]", "f32[10]");
    EXPECT(slice(0, 0, 4, 1), "f32[1..4]", "f32[1..16]");
    EXPECT(slice(0, -3, INT64_MAX, 1), "f32[1..3]", "f32[1..16]");
    // not monotone in the size: x[-3:5] has length 3 at sizes 3..5 and 0 from size 8
    EXPECT(slice(0, -3, 5, 1), "f32[0..3]", "f32[1..16]");
    EXPECT_ERR(slice(0, 0, 4, 0), KILN_ERR_UNSUPPORTED, "'step'[0] = 0", "f32[10]");
    EXPECT_ERR(slice(1, 0, 4, 1), KILN_ERR_SHAPE, "'dim'[0] = 1", "f32[10]");

    tat *t = SETI(A(KILN_OP_SELECT), KILN_A_SELECT_DIM, 1);
    SETI(t, KILN_A_SELECT_INDEX, -1);
    EXPECT(t, "f32[2]", "f32[2,5]");
    EXPECT(t, "f32[1]", "f32[1,5]");
    SETI(t, KILN_A_SELECT_INDEX, 5);
    EXPECT_ERR(t, KILN_ERR_SHAPE, "'index' = 5", "f32[2,5]");
    SETI(t, KILN_A_SELECT_INDEX, -6);
    EXPECT_ERR(t, KILN_ERR_SHAPE, "'index' = -6", "f32[2,5]");
    SETI(t, KILN_A_SELECT_INDEX, 6);
    EXPECT(t, "f32[2]", "f32[2,1..8]");
    SETI(t, KILN_A_SELECT_INDEX, INT64_MIN);
    EXPECT_ERR(t, KILN_ERR_SHAPE, "out of range", "f32[2,5]");
    t = SETI(A(KILN_OP_SELECT), KILN_A_SELECT_DIM, 0);
    EXPECT(SETI(t, KILN_A_SELECT_INDEX, 2), "f32[]", "f32[3]");

    EXPECT(SETI(A(KILN_OP_SQUEEZE), 0, 0, 2), "f32[3]", "f32[1,3,1]");
    EXPECT(SETI(A(KILN_OP_SQUEEZE), 0, -1), "f32[1,3]", "f32[1,3,1]");
    EXPECT_ERR(SETI(A(KILN_OP_SQUEEZE), 0, 1), KILN_ERR_SHAPE, "not 1", "f32[1,3,1]");
    EXPECT_ERR(SETI(A(KILN_OP_SQUEEZE), 0, 0), KILN_ERR_SHAPE, "1..4", "f32[1..4,3]");
    EXPECT_ERR(SETI(A(KILN_OP_SQUEEZE), 0, 0, -3), KILN_ERR_SHAPE, "twice", "f32[1,3,1]");
    EXPECT_ERR(seti(A(KILN_OP_SQUEEZE), 0, 0, NULL), KILN_ERR_UNSUPPORTED, "explicitly",
               "f32[1,3,1]");

    EXPECT(SETI(A(KILN_OP_UNSQUEEZE), 0, 0), "f32[1,2,3]", "f32[2,3]");
    EXPECT(SETI(A(KILN_OP_UNSQUEEZE), 0, 2), "f32[2,3,1]", "f32[2,3]");
    EXPECT(SETI(A(KILN_OP_UNSQUEEZE), 0, -1), "f32[2,3,1]", "f32[2,3]");
    EXPECT(SETI(A(KILN_OP_UNSQUEEZE), 0, -3), "f32[1,2,3]", "f32[2,3]");
    EXPECT(SETI(A(KILN_OP_UNSQUEEZE), 0, 0), "f32[1]", "f32[]");
    EXPECT_ERR(SETI(A(KILN_OP_UNSQUEEZE), 0, 3), KILN_ERR_SHAPE, "'dim'[0] = 3", "f32[2,3]");
    EXPECT_ERR(SETI(A(KILN_OP_UNSQUEEZE), 0, 0), KILN_ERR_UNSUPPORTED, "maximum rank",
               "f32[1,1,1,1,1,1,1,1]");
}

static void test_embedding(void) {
    EXPECT(A(KILN_OP_EMBEDDING), "f32[2,1..7,16]", "f32[100,16]", "i64[2,1..7]");
    EXPECT(A(KILN_OP_EMBEDDING), "bf16[16]", "bf16[100,16]", "i32[]");
    EXPECT_ERR(A(KILN_OP_EMBEDDING), KILN_ERR_UNSUPPORTED, "input 1 (indices)", "f32[100,16]",
               "f32[3]");
    EXPECT_ERR(A(KILN_OP_EMBEDDING), KILN_ERR_UNSUPPORTED, "input 0 (weight)", "i32[100,16]",
               "i32[3]");
    EXPECT_ERR(A(KILN_OP_EMBEDDING), KILN_ERR_SHAPE, "rank 1", "f32[100]", "i32[3]");
}

static void test_sdpa(void) {
    tat *t;
    EXPECT(A(KILN_OP_SDPA), "f32[2,8,1..128,32]", "f32[2,8,1..128,64]", "f32[2,8,1..256,64]",
           "f32[2,8,1..256,32]");
    EXPECT(A(KILN_OP_SDPA), "f16[5,8]", "f16[5,4]", "f16[7,4]", "f16[7,8]");
    EXPECT(A(KILN_OP_SDPA), "f32[2,4,3,8]", "f32[2,4,3,8]", "f32[2,4,6,8]", "f32[2,4,6,8]",
           "bool[3,6]");
    EXPECT(A(KILN_OP_SDPA), "f32[2,4,3,8]", "f32[2,4,3,8]", "f32[2,4,6,8]", "f32[2,4,6,8]",
           "f32[2,1,1,6]");
    EXPECT(A(KILN_OP_SDPA), "f32[1,1..9,8]", "f32[1,1..9,8]", "f32[1,1..9,8]", "f32[1,1..9,8]",
           "bool[1..9,1..9]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "embedding size", "f32[2,3,8]", "f32[2,5,4]",
               "f32[2,5,8]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "key/value length", "f32[2,3,8]", "f32[2,5,8]",
               "f32[2,6,8]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "batch dimension 0", "f32[2,3,8]", "f32[3,5,8]",
               "f32[3,5,8]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "rank 2", "f32[2,3,8]", "f32[5,8]", "f32[5,8]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "dtype", "f32[3,8]", "f16[5,8]", "f16[5,8]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_UNSUPPORTED, "bool or float32", "f32[3,8]", "f32[5,8]",
               "f32[5,8]", "f16[3,5]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "does not broadcast", "f32[3,8]", "f32[5,8]",
               "f32[5,8]", "bool[4,5]");
    EXPECT_ERR(A(KILN_OP_SDPA), KILN_ERR_SHAPE, "more than", "f32[3,8]", "f32[5,8]", "f32[5,8]",
               "bool[1,3,5]");
    t = SETI(A(KILN_OP_SDPA), KILN_A_SDPA_CAUSAL, 1);
    EXPECT(t, "f32[3,8]", "f32[3,8]", "f32[5,8]", "f32[5,8]");
    EXPECT_ERR(t, KILN_ERR_UNSUPPORTED, "is_causal", "f32[3,8]", "f32[5,8]", "f32[5,8]",
               "bool[3,5]");
    EXPECT_ERR(setf(A(KILN_OP_SDPA), KILN_A_SDPA_SCALE, INFINITY), KILN_ERR_UNSUPPORTED, "scale",
               "f32[3,8]", "f32[5,8]", "f32[5,8]");
    EXPECT(setf(A(KILN_OP_SDPA), KILN_A_SDPA_SCALE, 0.5), "f32[3,8]", "f32[3,8]", "f32[5,8]",
           "f32[5,8]");
}

static void test_generic(void) {
    kiln_value_desc out, x = V("f32[2]"), bad = V("f32[2]");
    const kiln_value_desc *in[1] = {&x};
    tat *t = A(KILN_OP_RELU);
    CHECK_STATUS(kiln_infer(99, &t->v, in, 1, "node 7 (test)", &out), KILN_ERR_UNSUPPORTED);
    CHECK(strstr(kiln_last_error(), "99") != NULL);
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, &t->v, in, 1, NULL, NULL), KILN_ERR_INVALID_ARG);
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, NULL, in, 1, NULL, &out), KILN_OK);
    // without `what` the op name is used
    bad.shape.min[0] = 3;
    in[0] = &bad;
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, NULL, in, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    CHECK(strncmp(kiln_last_error(), "relu:", 5) == 0);
    bad = V("f32[2]");
    bad.shape.max[0] = (INT64_C(1) << 40) + 1;
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, NULL, in, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    bad = V("f32[2]");
    bad.dtype = 9;
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, NULL, in, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    bad = V("f32[2]");
    bad.shape.rank = 9;
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, NULL, in, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    // attribute of the wrong kind
    t = SETI(A(KILN_OP_CLAMP), KILN_A_CLAMP_MIN, 0);
    in[0] = &x;
    CHECK_STATUS(kiln_infer(KILN_OP_CLAMP, &t->v, in, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "'min'") != NULL);
    // attributes passed to an op without any
    t = A(KILN_OP_CLAMP);
    CHECK_STATUS(kiln_infer(KILN_OP_RELU, &t->v, in, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    // out untouched on failure
    memset(&out, 0x5a, sizeof out);
    CHECK_STATUS(
        kiln_infer(KILN_OP_ADD, NULL, (const kiln_value_desc *[]){&x, &bad}, 2, NULL, &out),
        KILN_ERR_INVALID_ARG);
    CHECK(out.dtype == 0x5a5a5a5au);
    // unused dims of the result are zero
    {
        kiln_value_desc y = V("f32[3]");
        y.shape.min[5] = 77;
        in[0] = &y;
        CHECK_OK(kiln_infer(KILN_OP_RELU, NULL, in, 1, NULL, &out));
        CHECK(out.shape.min[5] == 0 && out.shape.max[7] == 0);
    }
    // every op of the table has an inference
    for (uint32_t i = 0; i < kiln_op_count(); i++) {
        uint32_t op = kiln_op_id_at(i);
        kiln_status st;
        kiln_clear_error();
        st = kiln_infer(op, NULL, NULL, 0, NULL, &out);
        CHECK_MSG(st == KILN_ERR_INVALID_ARG && strstr(kiln_last_error(), "unknown") == NULL,
                  "op %s: %s", kiln_op_name(op), kiln_last_error());
    }
}

static void test_shape_helpers(void) {
    kiln_shape s;
    uint64_t n = 0;
    int64_t dims[3] = {2, 3, 4};
    kiln_shape_from_dims(&s, 3, dims);
    CHECK(s.rank == 3 && s.min[2] == 4 && s.max[1] == 3 && s.min[3] == 0);
    CHECK(kiln_shape_max_numel(&s, &n) && n == 24);
    s.max[0] = 10;
    CHECK(kiln_shape_max_numel(&s, &n) && n == 120);
    kiln_shape_from_dims(&s, 0, dims);
    CHECK(kiln_shape_max_numel(&s, &n) && n == 1);
    s.rank = 2;
    s.max[0] = INT64_C(1) << 40;
    s.max[1] = INT64_C(1) << 40;
    n = 5;
    CHECK(!kiln_shape_max_numel(&s, &n) && n == 5); // overflow: out untouched
    s.max[0] = -1;
    s.max[1] = 1;
    CHECK(!kiln_shape_max_numel(&s, &n));
    CHECK(!kiln_shape_max_numel(NULL, &n));
}

// --- property checks: a range result equals the hull of the concrete results

// Number of conv output positions, by counting windows that fit inside the padded input.
static int64_t ref_conv_len(int64_t h, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t n = 0;
    for (int64_t i = 0; i * s + d * (k - 1) <= h + 2 * p - 1; i++) n++;
    return n;
}

// Pool output positions: floor mode counts windows inside the padded input; ceil mode counts
// windows whose start lies before the end of the padded input (rounded up) and inside input +
// left padding.
static int64_t ref_pool_len(int64_t h, int64_t k, int64_t s, int64_t p, int64_t d, int ceil) {
    int64_t n = 0;
    if (!ceil) return ref_conv_len(h, k, s, p, d);
    for (int64_t i = 0; (i - 1) * s < h + 2 * p - d * (k - 1) - 1 && i * s < h + p; i++) n++;
    return n;
}

static int64_t ref_slice_len(int64_t size, int64_t start, int64_t end, int64_t step) {
    int64_t n = 0;
    // enumerate indices like Python's range over the normalized bounds
    int64_t b = start < 0 ? start + size : start, e = end < 0 ? end + size : end;
    if (b < 0) b = 0;
    if (e > size) e = size;
    for (int64_t i = b; i < e; i += step) n++;
    return n;
}

static void prop_conv_pool(void) {
    for (int iter = 0; iter < 300; iter++) {
        int64_t k = check_rng_int(1, 5), s = check_rng_int(1, 4), d = check_rng_int(1, 3);
        int64_t p = check_rng_int(0, k / 2), h0 = check_rng_int(0, 12),
                h1 = h0 + check_rng_int(0, 20);
        int ceil = (int)check_rng_int(0, 1);
        int which = (int)check_rng_int(0, 1); // 0: conv2d, 1: max_pool2d
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        char x[64], w[64];
        tat *t;
        kiln_value_desc out;
        kiln_status st;
        for (int64_t h = h0; h <= h1; h++) {
            int64_t l = which ? ref_pool_len(h, k, s, p, d, ceil) : ref_conv_len(h, k, s, p, d);
            if (l >= 1) {
                lo = l < lo ? l : lo;
                hi = l > hi ? l : hi;
            }
        }
        snprintf(x, sizeof x, "f32[1,2,%lld..%lld,%lld]", (long long)h0, (long long)h1,
                 (long long)(d * (k - 1) + 1));
        snprintf(w, sizeof w, "f32[3,2,%lld,1]", (long long)k);
        if (which) {
            t = pool(KILN_OP_MAX_POOL2D, k, s, p, ceil);
            SETI(t, KILN_A_MAXPOOL_KERNEL, k, 1);
            SETI(t, KILN_A_MAXPOOL_PADDING, p, 0);
            SETI(t, KILN_A_MAXPOOL_DILATION, d, 1);
            st = run(t, &out, 1, (const char *[]){x});
        } else {
            t = SETI(A(KILN_OP_CONV2D), KILN_A_CONV_STRIDE, s, s);
            SETI(t, KILN_A_CONV_PADDING, p, 0);
            SETI(t, KILN_A_CONV_DILATION, d, 1);
            st = run(t, &out, 2, (const char *[]){x, w});
        }
        if (hi < 1) {
            CHECK_MSG(st == KILN_ERR_SHAPE, "%s k%lld s%lld p%lld d%lld ceil%d h %lld..%lld: %s",
                      which ? "pool" : "conv", (long long)k, (long long)s, (long long)p,
                      (long long)d, ceil, (long long)h0, (long long)h1, kiln_last_error());
            continue;
        }
        CHECK_MSG(st == KILN_OK && out.shape.min[2] == lo && out.shape.max[2] == hi,
                  "%s k%lld s%lld p%lld d%lld ceil%d h %lld..%lld: got %lld..%lld, want "
                  "%lld..%lld (%s)",
                  which ? "pool" : "conv", (long long)k, (long long)s, (long long)p, (long long)d,
                  ceil, (long long)h0, (long long)h1, (long long)out.shape.min[2],
                  (long long)out.shape.max[2], (long long)lo, (long long)hi, kiln_last_error());
    }
}

static void prop_slice(void) {
    for (int iter = 0; iter < 500; iter++) {
        int64_t s0 = check_rng_int(0, 10), s1 = s0 + check_rng_int(0, 12);
        int64_t start = check_rng_int(-15, 15), end = check_rng_int(-15, 15);
        int64_t step = check_rng_int(1, 4), lo = INT64_MAX, hi = INT64_MIN;
        char x[64];
        kiln_value_desc out;
        kiln_status st;
        if (check_rng_int(0, 5) == 0) end = INT64_MAX;
        for (int64_t sz = s0; sz <= s1; sz++) {
            int64_t l = ref_slice_len(sz, start, end, step);
            lo = l < lo ? l : lo;
            hi = l > hi ? l : hi;
        }
        snprintf(x, sizeof x, "f32[%lld..%lld]", (long long)s0, (long long)s1);
        st = run(slice(0, start, end, step), &out, 1, (const char *[]){x});
        CHECK_MSG(st == KILN_OK && out.shape.min[0] == lo && out.shape.max[0] == hi,
                  "slice [%lld:%lld:%lld] of %s: got %lld..%lld want %lld..%lld", (long long)start,
                  (long long)end, (long long)step, x, (long long)out.shape.min[0],
                  (long long)out.shape.max[0], (long long)lo, (long long)hi);
    }
}

static void prop_broadcast(void) {
    for (int iter = 0; iter < 500; iter++) {
        int64_t a0 = check_rng_int(0, 5), a1 = a0 + check_rng_int(0, 4);
        int64_t b0 = check_rng_int(0, 5), b1 = b0 + check_rng_int(0, 4);
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        char xa[48], xb[48];
        kiln_value_desc out;
        kiln_status st;
        if (check_rng_int(0, 2) == 0) a0 = a1 = 1;
        for (int64_t x = a0; x <= a1; x++) {
            for (int64_t y = b0; y <= b1; y++) {
                int64_t r;
                if (x == y || y == 1) {
                    r = x;
                } else if (x == 1) {
                    r = y;
                } else {
                    continue;
                }
                lo = r < lo ? r : lo;
                hi = r > hi ? r : hi;
            }
        }
        snprintf(xa, sizeof xa, "f32[2,%lld..%lld]", (long long)a0, (long long)a1);
        snprintf(xb, sizeof xb, "f32[%lld..%lld]", (long long)b0, (long long)b1);
        st = run(A(KILN_OP_MUL), &out, 2, (const char *[]){xa, xb});
        if (hi == INT64_MIN) {
            CHECK_MSG(st == KILN_ERR_SHAPE, "%s * %s should fail", xa, xb);
        } else {
            CHECK_MSG(st == KILN_OK && out.shape.rank == 2 && out.shape.min[1] == lo &&
                          out.shape.max[1] == hi,
                      "%s * %s: got %lld..%lld want %lld..%lld", xa, xb,
                      (long long)out.shape.min[1], (long long)out.shape.max[1], (long long)lo,
                      (long long)hi);
        }
    }
}

// reshape [a, b] -> [c, -1] over ranges: every concrete reshape that succeeds lands inside
// the inferred range, and a concrete shape gives exactly numel / c.
static void prop_reshape(void) {
    for (int iter = 0; iter < 300; iter++) {
        int64_t a0 = check_rng_int(1, 6), a1 = a0 + check_rng_int(0, 6), b = check_rng_int(1, 6);
        int64_t c = check_rng_int(1, 6);
        char x[48];
        kiln_value_desc out;
        kiln_status st;
        int any = 0;
        snprintf(x, sizeof x, "f32[%lld..%lld,%lld]", (long long)a0, (long long)a1, (long long)b);
        st = run(SETI(A(KILN_OP_RESHAPE), 0, c, -1), &out, 1, (const char *[]){x});
        for (int64_t a = a0; a <= a1; a++) {
            if ((a * b) % c != 0) continue;
            any = 1;
            CHECK_MSG(
                st == KILN_OK && out.shape.min[1] <= a * b / c && a * b / c <= out.shape.max[1],
                "reshape %s to [%lld, -1]: %lld not in %lld..%lld", x, (long long)c,
                (long long)(a * b / c), (long long)out.shape.min[1], (long long)out.shape.max[1]);
        }
        if (a0 == a1)
            CHECK(any ? st == KILN_OK && out.shape.min[1] == out.shape.max[1]
                      : st == KILN_ERR_SHAPE);
    }
}

static void quiet(void *user_data, kiln_log_level level, const char *message) {
    (void)user_data;
    (void)level;
    (void)message;
}

int main(void) {
    kiln_log_set(quiet, NULL, KILN_LOG_ERROR);
    test_linear();
    test_matmul();
    test_conv2d();
    test_conv_transpose2d();
    test_batch_norm();
    test_unary();
    test_cast();
    test_binary();
    test_where();
    test_logic();
    test_group_norm();
    test_upsample();
    test_cumsum_pad();
    test_index_gather();
    test_arange();
    test_softmax();
    test_layer_norm();
    test_rms_norm();
    test_rotary();
    test_pool();
    test_reduce();
    test_reshape();
    test_expand();
    test_permute();
    test_cat();
    test_slice_select_squeeze();
    test_embedding();
    test_sdpa();
    test_generic();
    test_shape_helpers();
    prop_conv_pool();
    prop_slice();
    prop_broadcast();
    prop_reshape();
    return check_summary();
}
