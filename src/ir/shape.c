// SPDX-License-Identifier: Apache-2.0
// Shape and dtype inference for every op (src/ir/shape.h), over per-dimension [min, max] ranges.
//
// Rules, shared by every op:
//  - For concrete shapes (min == max everywhere) the result is exact and equals PyTorch's.
//  - For ranges the result is sound: every concrete execution inside the input ranges that the
//    op accepts produces a shape inside the output ranges. Monotone formulas (conv, pool) take
//    the minimum from the minimum and the maximum from the maximum; a range admitting only
//    invalid sizes is an error, a range admitting some invalid sizes is narrowed (those sizes
//    fail at run time, where the runtime calls this code with the concrete shapes).
//  - Dimensions that must agree (linear K, conv channels, ...) are intersected; an empty
//    intersection is an error. Broadcasting follows numpy over ranges (see bcast_dim).
//  - Attribute values are validated but not rewritten: negative axes are normalized here and by
//    every backend.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/status.h"
#include "ir/shape.h"

#define MAXD KILN_SHAPE_MAX_DIM

// --- failure messages

typedef struct ictx {
    const char *what; // "node 12 (linear)" or "linear"
    uint32_t op;
    const kiln_op_def *def;
} ictx;

static kiln_status ifail(const ictx *c, kiln_status st, const char *fmt, ...) KILN_PRINTF(3, 4);

static kiln_status ifail(const ictx *c, kiln_status st, const char *fmt, ...) {
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return kiln_fail(st, "%s: %s", c->what, buf);
}

#define SHAPE_FAIL(c, ...) ifail((c), KILN_ERR_SHAPE, __VA_ARGS__)
#define UNSUP_FAIL(c, ...) ifail((c), KILN_ERR_UNSUPPORTED, __VA_ARGS__)

// "5" or "1..8"
static const char *rstr(char *buf, size_t n, int64_t lo, int64_t hi) {
    if (lo == hi) {
        snprintf(buf, n, "%" PRId64, lo);
    } else {
        snprintf(buf, n, "%" PRId64 "..%" PRId64, lo, hi);
    }
    return buf;
}
#define RS(lo, hi) rstr((char[48]){0}, 48, (lo), (hi))

// "[2, 1..8, 3]"
static const char *sstr(char *buf, size_t n, const kiln_shape *s) {
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i <= s->rank && i <= KILN_MAX_RANK; i++) {
        char r[48];
        int w;
        if (i < s->rank) {
            w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "[",
                         rstr(r, sizeof r, s->min[i], s->max[i]));
        } else {
            w = snprintf(buf + used, n - used, "%s]", s->rank ? "" : "[");
        }
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    return buf;
}
#define SS(shape) sstr((char[256]){0}, 256, (shape))

static const char *dname(uint32_t dtype) { return kiln_dtype_name((kiln_dtype)dtype); }

// Names of the inputs of an op, for messages ("input 1 (weight)").
static const char *input_role(uint32_t op, uint32_t i) {
    static const char *const xwb[] = {"x", "weight", "bias"};
    static const char *const bn[] = {"x", "weight", "bias", "running_mean", "running_var"};
    static const char *const ab[] = {"a", "b"};
    static const char *const where[] = {"condition", "a", "b"};
    static const char *const like[] = {"x", "like"};
    static const char *const emb[] = {"weight", "indices"};
    static const char *const sdpa[] = {"query", "key", "value", "mask"};
    static const char *const rot[] = {"x", "cos", "sin"};
    switch (op) {
    case KILN_OP_LINEAR:
    case KILN_OP_CONV2D:
    case KILN_OP_CONV_TRANSPOSE2D:
    case KILN_OP_LAYER_NORM:
    case KILN_OP_GROUP_NORM:
    case KILN_OP_RMS_NORM: return i < 3 ? xwb[i] : "?";
    case KILN_OP_ROTARY: return i < 3 ? rot[i] : "?";
    case KILN_OP_EQ:
    case KILN_OP_NE:
    case KILN_OP_LT:
    case KILN_OP_LE:
    case KILN_OP_GT:
    case KILN_OP_GE:
    case KILN_OP_BITWISE_AND:
    case KILN_OP_BITWISE_OR:
    case KILN_OP_BITWISE_XOR: return i < 2 ? ab[i] : "?";
    case KILN_OP_INDEX: return i == 0 ? "x" : "index";
    case KILN_OP_ARANGE: return "like";
    case KILN_OP_GATHER: return i == 0 ? "x" : (i == 1 ? "index" : "?");
    case KILN_OP_INDEX_COPY: return i == 0 ? "x" : (i == 1 ? "index" : (i == 2 ? "src" : "?"));
    case KILN_OP_GATHER_MATMUL: return i == 0 ? "w" : (i == 1 ? "index" : (i == 2 ? "x" : "?"));
    case KILN_OP_SELECTIVE_SCAN: return i < 4 ? (const char *[]){"a", "u", "c", "h0"}[i] : "?";
    case KILN_OP_BATCH_NORM: return i < 5 ? bn[i] : "?";
    case KILN_OP_MATMUL:
    case KILN_OP_ADD:
    case KILN_OP_SUB:
    case KILN_OP_MUL:
    case KILN_OP_DIV:
    case KILN_OP_POW:
    case KILN_OP_REMAINDER:
    case KILN_OP_FMOD:
    case KILN_OP_FLOOR_DIVIDE:
    case KILN_OP_MAXIMUM:
    case KILN_OP_MINIMUM: return i < 2 ? ab[i] : "?";
    case KILN_OP_WHERE: return i < 3 ? where[i] : "?";
    case KILN_OP_RESHAPE:
    case KILN_OP_EXPAND: return i < 2 ? like[i] : "?";
    case KILN_OP_EMBEDDING: return i < 2 ? emb[i] : "?";
    case KILN_OP_SDPA: return i < 4 ? sdpa[i] : "?";
    case KILN_OP_CAT: return "tensor";
    default: return "x";
    }
}

static const char *iname(char *buf, size_t n, const ictx *c, uint32_t i) {
    snprintf(buf, n, "input %u (%s)", i, input_role(c->op, i));
    return buf;
}
#define IN(c, i) iname((char[48]){0}, 48, (c), (i))

static const char *aname(const ictx *c, uint32_t idx) {
    return idx < c->def->n_attrs ? c->def->attrs[idx].name : "?";
}

// --- checked int64 arithmetic on non-negative values

static bool mul_nn(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// floor(a / b) for b > 0
static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && (a < 0)) q--;
    return q;
}

// --- dimension range algebra

static void set_dim(kiln_shape *s, uint32_t i, int64_t lo, int64_t hi) {
    s->min[i] = lo;
    s->max[i] = hi;
}

static bool is_static(const kiln_shape *s, uint32_t i) { return s->min[i] == s->max[i]; }

// Intersection of two ranges that must be equal; false if empty.
static bool agree_dim(int64_t a0, int64_t a1, int64_t b0, int64_t b1, int64_t *o0, int64_t *o1) {
    int64_t lo = max64(a0, b0), hi = min64(a1, b1);
    if (lo > hi) return false;
    *o0 = lo;
    *o1 = hi;
    return true;
}

// Broadcasts two dimension ranges by numpy rules: a pair (x, y) is compatible when x == y, x ==
// 1 or y == 1, and gives max(x, y) (1 against 0 gives 0). The result is the hull over all
// compatible pairs; false if there is none. Exact for concrete dimensions.
static bool bcast_dim(int64_t a0, int64_t a1, int64_t b0, int64_t b1, int64_t *o0, int64_t *o1) {
    bool any = false;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    int64_t i0 = max64(a0, b0), i1 = min64(a1, b1);
    if (i0 <= i1) { // x == y
        lo = min64(lo, i0);
        hi = max64(hi, i1);
        any = true;
    }
    if (a0 <= 1 && 1 <= a1) { // x == 1: the result is y
        lo = min64(lo, b0);
        hi = max64(hi, b1);
        any = true;
    }
    if (b0 <= 1 && 1 <= b1) { // y == 1: the result is x
        lo = min64(lo, a0);
        hi = max64(hi, a1);
        any = true;
    }
    if (!any) return false;
    *o0 = lo;
    *o1 = hi;
    return true;
}

// Expands a dimension range X to a target range T (torch.expand: x == t or x == 1 gives t).
static bool expand_dim(int64_t x0, int64_t x1, int64_t t0, int64_t t1, int64_t *o0, int64_t *o1) {
    bool any = false;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    int64_t i0 = max64(x0, t0), i1 = min64(x1, t1);
    if (i0 <= i1) {
        lo = i0;
        hi = i1;
        any = true;
    }
    if (x0 <= 1 && 1 <= x1) {
        lo = min64(lo, t0);
        hi = max64(hi, t1);
        any = true;
    }
    if (!any) return false;
    *o0 = lo;
    *o1 = hi;
    return true;
}

// Broadcasts shapes a and b into out (right-aligned).
static kiln_status bcast_shapes(const ictx *c, const kiln_shape *a, uint32_t ia,
                                const kiln_shape *b, uint32_t ib, kiln_shape *out) {
    uint32_t r = a->rank > b->rank ? a->rank : b->rank;
    kiln_shape o;
    memset(&o, 0, sizeof o);
    o.rank = r;
    for (uint32_t i = 0; i < r; i++) {
        uint32_t k = r - 1 - i; // output dim
        int64_t a0 = 1, a1 = 1, b0 = 1, b1 = 1;
        if (i < a->rank) {
            a0 = a->min[a->rank - 1 - i];
            a1 = a->max[a->rank - 1 - i];
        }
        if (i < b->rank) {
            b0 = b->min[b->rank - 1 - i];
            b1 = b->max[b->rank - 1 - i];
        }
        if (!bcast_dim(a0, a1, b0, b1, &o.min[k], &o.max[k])) {
            return SHAPE_FAIL(c,
                              "%s %s and %s %s do not broadcast: dimension %u (from the right) "
                              "is %s against %s (sizes must be equal or 1)",
                              IN(c, ia), SS(a), IN(c, ib), SS(b), i, RS(a0, a1), RS(b0, b1));
        }
    }
    *out = o;
    return KILN_OK;
}

// Normalizes axis v against rank r (valid: -r <= v < r); false when out of range.
static bool norm_axis(int64_t v, uint32_t r, uint32_t *out) {
    int64_t rr = (int64_t)r;
    if (v < -rr || v >= rr) return false;
    *out = (uint32_t)(v < 0 ? v + rr : v);
    return true;
}

// --- common validations

static kiln_status want_rank(const ictx *c, const kiln_value_desc *d, uint32_t i, uint32_t lo,
                             uint32_t hi) {
    if (d->shape.rank >= lo && d->shape.rank <= hi) return KILN_OK;
    if (lo == hi) {
        return SHAPE_FAIL(c, "%s has rank %u %s; %s needs rank %u", IN(c, i), d->shape.rank,
                          SS(&d->shape), c->def->name, lo);
    }
    return SHAPE_FAIL(c, "%s has rank %u %s; %s needs rank %u to %u", IN(c, i), d->shape.rank,
                      SS(&d->shape), c->def->name, lo, hi);
}

static kiln_status want_dtype_mask(const ictx *c, const kiln_value_desc *d, uint32_t i,
                                   uint32_t mask) {
    if (kiln_dtype_valid(d->dtype) && (mask & KILN_DTYPE_BIT(d->dtype))) return KILN_OK;
    char names[128];
    size_t used = 0;
    names[0] = '\0';
    for (uint32_t t = 1; t < KILN_DTYPE_COUNT; t++) {
        if (mask & KILN_DTYPE_BIT(t)) {
            int w = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", dname(t));
            if (w < 0 || (size_t)w >= sizeof names - used) break;
            used += (size_t)w;
        }
    }
    return UNSUP_FAIL(c, "%s has dtype %s; %s supports %s", IN(c, i), dname(d->dtype), c->def->name,
                      names);
}

static kiln_status want_same_dtype(const ictx *c, const kiln_value_desc *const *in, uint32_t i,
                                   uint32_t j) {
    if (in[i]->dtype == in[j]->dtype) return KILN_OK;
    return SHAPE_FAIL(c,
                      "%s has dtype %s but %s has dtype %s; %s needs equal dtypes (insert a "
                      "cast)",
                      IN(c, i), dname(in[i]->dtype), IN(c, j), dname(in[j]->dtype), c->def->name);
}

// Dimension da of input ia must agree with dimension db of input ib; the intersection is
// written to *o0, *o1.
static kiln_status want_agree(const ictx *c, const char *role, const kiln_value_desc *const *in,
                              uint32_t ia, uint32_t da, uint32_t ib, uint32_t db, int64_t *o0,
                              int64_t *o1) {
    const kiln_shape *a = &in[ia]->shape, *b = &in[ib]->shape;
    if (agree_dim(a->min[da], a->max[da], b->min[db], b->max[db], o0, o1)) return KILN_OK;
    return SHAPE_FAIL(c, "%s: %s dimension %u = %s does not match %s dimension %u = %s", role,
                      IN(c, ia), da, RS(a->min[da], a->max[da]), IN(c, ib), db,
                      RS(b->min[db], b->max[db]));
}

// A 1-D parameter (bias, norm weights) of length matching range [n0, n1].
static kiln_status want_vec(const ictx *c, const kiln_value_desc *const *in, uint32_t i,
                            const char *role, int64_t n0, int64_t n1, uint32_t dtype_of) {
    const kiln_value_desc *d = in[i];
    int64_t lo, hi;
    KILN_TRY(want_rank(c, d, i, 1, 1));
    if (!agree_dim(d->shape.min[0], d->shape.max[0], n0, n1, &lo, &hi)) {
        return SHAPE_FAIL(c, "%s has %s elements; expected %s (%s)", IN(c, i),
                          RS(d->shape.min[0], d->shape.max[0]), RS(n0, n1), role);
    }
    return want_same_dtype(c, in, i, dtype_of);
}

static kiln_status out_dims_ok(const ictx *c, const kiln_shape *s) {
    for (uint32_t i = 0; i < s->rank; i++) {
        if (s->min[i] < 0 || s->min[i] > s->max[i]) {
            return ifail(c, KILN_ERR_INTERNAL, "inferred dimension %u = [%" PRId64 ", %" PRId64 "]",
                         i, s->min[i], s->max[i]);
        }
        if (s->max[i] > MAXD) {
            return UNSUP_FAIL(c, "output dimension %u would be %s, above Kiln's limit of 2^40", i,
                              RS(s->min[i], s->max[i]));
        }
    }
    return KILN_OK;
}

// An int attribute value in [lo, hi].
static kiln_status want_attr_range(const ictx *c, uint32_t idx, uint32_t j, int64_t v, int64_t lo,
                                   int64_t hi) {
    if (v >= lo && v <= hi) return KILN_OK;
    if (hi == INT64_MAX) {
        return UNSUP_FAIL(c, "attribute '%s'[%u] = %" PRId64 "; must be >= %" PRId64, aname(c, idx),
                          j, v, lo);
    }
    return UNSUP_FAIL(c, "attribute '%s'[%u] = %" PRId64 "; must be in [%" PRId64 ", %" PRId64 "]",
                      aname(c, idx), j, v, lo, hi);
}

static kiln_status want_bool_attr(const ictx *c, const kiln_attrs *a, uint32_t idx) {
    return want_attr_range(c, idx, 0, kiln_attrs_int(a, idx, 0), 0, 1);
}

static kiln_status want_eps(const ictx *c, const kiln_attrs *a, uint32_t idx) {
    double eps = kiln_attrs_float(a, idx, 0);
    if (isfinite(eps) && eps >= 0.0) return KILN_OK;
    return UNSUP_FAIL(c, "attribute '%s' = %g; must be finite and >= 0", aname(c, idx), eps);
}

// --- per-op inference. Each writes *out (zeroed by the caller, dtype preset to in[0]).

typedef kiln_status (*infer_fn)(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n, kiln_value_desc *out);

static kiln_status infer_linear(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape, *w = &in[1]->shape;
    int64_t k0, k1;
    (void)a;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_rank(c, in[1], 1, 2, 2));
    KILN_TRY(want_same_dtype(c, in, 1, 0));
    KILN_TRY(want_agree(c, "in_features (K)", in, 0, x->rank - 1, 1, 1, &k0, &k1));
    if (n > 2 && in[2] != NULL) {
        KILN_TRY(
            want_vec(c, in, 2, "out_features, the rows of the weight", w->min[0], w->max[0], 0));
    }
    out->shape = *x;
    set_dim(&out->shape, x->rank - 1, w->min[0], w->max[0]);
    return KILN_OK;
}

static kiln_status infer_matmul(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *sa = &in[0]->shape, *sb = &in[1]->shape;
    kiln_shape ba, bb, bo;
    int64_t k0, k1;
    (void)a;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 2, KILN_MAX_RANK));
    KILN_TRY(want_rank(c, in[1], 1, 2, KILN_MAX_RANK));
    KILN_TRY(want_same_dtype(c, in, 1, 0));
    KILN_TRY(want_agree(c, "inner dimension (K)", in, 0, sa->rank - 1, 1, sb->rank - 2, &k0, &k1));
    memset(&ba, 0, sizeof ba);
    memset(&bb, 0, sizeof bb);
    ba.rank = sa->rank - 2;
    bb.rank = sb->rank - 2;
    memcpy(ba.min, sa->min, ba.rank * sizeof(int64_t));
    memcpy(ba.max, sa->max, ba.rank * sizeof(int64_t));
    memcpy(bb.min, sb->min, bb.rank * sizeof(int64_t));
    memcpy(bb.max, sb->max, bb.rank * sizeof(int64_t));
    KILN_TRY(bcast_shapes(c, &ba, 0, &bb, 1, &bo));
    out->shape = bo;
    out->shape.rank = bo.rank + 2;
    set_dim(&out->shape, bo.rank, sa->min[sa->rank - 2], sa->max[sa->rank - 2]);
    set_dim(&out->shape, bo.rank + 1, sb->min[sb->rank - 1], sb->max[sb->rank - 1]);
    return KILN_OK;
}

static kiln_status want_pos_attrs(const ictx *c, const kiln_attrs *a, uint32_t idx, int64_t lo) {
    for (uint32_t j = 0; j < kiln_attrs_count(a, idx); j++) {
        KILN_TRY(want_attr_range(c, idx, j, kiln_attrs_int(a, idx, j), lo, MAXD));
    }
    return KILN_OK;
}

// Output size of a convolution along one dim at input size h: floor((h + 2p - d(k-1) - 1)/s) + 1.
// false on overflow (cannot happen with validated inputs, kept for safety).
static bool conv_out(int64_t h, int64_t k, int64_t s, int64_t p, int64_t d, int64_t *out) {
    int64_t eff;
    if (!mul_nn(d, k - 1, &eff)) return false;
    *out = floor_div(h + 2 * p - eff - 1, s) + 1;
    return true;
}

// Applies a monotone size formula to range [h0, h1]: results below 1 are invalid. The max must
// be valid; the min is raised to 1 (those input sizes fail at run time).
static kiln_status spatial_range(const ictx *c, const char *axis, int64_t h0, int64_t h1,
                                 int64_t r0, int64_t r1, int64_t *o0, int64_t *o1) {
    if (r1 < 1) {
        return SHAPE_FAIL(c,
                          "the output %s would be %" PRId64 " (< 1) for input %s %s: the input "
                          "is smaller than the kernel window",
                          axis, r1, axis, RS(h0, h1));
    }
    *o0 = r0 < 1 ? 1 : r0;
    *o1 = r1;
    return KILN_OK;
}

static kiln_status infer_conv2d(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape, *w = &in[1]->shape;
    int64_t g = kiln_attrs_int(a, KILN_A_CONV_GROUPS, 0), c0, c1, cin;
    static const char *const axis[2] = {"height", "width"};
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_rank(c, in[1], 1, 4, 4));
    KILN_TRY(want_same_dtype(c, in, 1, 0));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONV_STRIDE, 1));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONV_PADDING, 0));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONV_DILATION, 1));
    KILN_TRY(want_attr_range(c, KILN_A_CONV_GROUPS, 0, g, 1, MAXD));
    if (w->min[0] % g != 0 || !is_static(w, 0)) {
        return SHAPE_FAIL(c, "%s has %s output channels, not a multiple of groups = %" PRId64,
                          IN(c, 1), RS(w->min[0], w->max[0]), g);
    }
    if (!is_static(w, 1) || !mul_nn(w->min[1], g, &cin)) {
        return SHAPE_FAIL(c, "%s dimension 1 = %s is not a static channel count", IN(c, 1),
                          RS(w->min[1], w->max[1]));
    }
    if (!agree_dim(x->min[1], x->max[1], cin, cin, &c0, &c1)) {
        return SHAPE_FAIL(c,
                          "%s has %s channels but the weight expects %" PRId64
                          " (weight dimension 1 = %" PRId64 " x groups = %" PRId64 ")",
                          IN(c, 0), RS(x->min[1], x->max[1]), cin, w->min[1], g);
    }
    if (n > 2 && in[2] != NULL) {
        KILN_TRY(want_vec(c, in, 2, "output channels", w->min[0], w->max[0], 0));
    }
    out->shape.rank = 4;
    set_dim(&out->shape, 0, x->min[0], x->max[0]);
    set_dim(&out->shape, 1, w->min[0], w->max[0]);
    for (uint32_t i = 0; i < 2; i++) {
        int64_t k = w->min[2 + i], s = kiln_attrs_int(a, KILN_A_CONV_STRIDE, i);
        int64_t p = kiln_attrs_int(a, KILN_A_CONV_PADDING, i);
        int64_t d = kiln_attrs_int(a, KILN_A_CONV_DILATION, i);
        int64_t r0, r1;
        if (!is_static(w, 2 + i) || k < 1) {
            return SHAPE_FAIL(c, "%s kernel %s = %s; must be static and >= 1", IN(c, 1), axis[i],
                              RS(w->min[2 + i], w->max[2 + i]));
        }
        if (!conv_out(x->min[2 + i], k, s, p, d, &r0) ||
            !conv_out(x->max[2 + i], k, s, p, d, &r1)) {
            return UNSUP_FAIL(c, "kernel %s %" PRId64 " with dilation %" PRId64 " is too large",
                              axis[i], k, d);
        }
        KILN_TRY(spatial_range(c, axis[i], x->min[2 + i], x->max[2 + i], r0, r1,
                               &out->shape.min[2 + i], &out->shape.max[2 + i]));
    }
    return KILN_OK;
}

static kiln_status infer_conv_transpose2d(const ictx *c, const kiln_attrs *a,
                                          const kiln_value_desc *const *in, uint32_t n,
                                          kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape, *w = &in[1]->shape;
    int64_t g = kiln_attrs_int(a, KILN_A_CONVT_GROUPS, 0), c0, c1, cout;
    static const char *const axis[2] = {"height", "width"};
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_rank(c, in[1], 1, 4, 4));
    KILN_TRY(want_same_dtype(c, in, 1, 0));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONVT_STRIDE, 1));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONVT_PADDING, 0));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONVT_OUTPUT_PADDING, 0));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_CONVT_DILATION, 1));
    KILN_TRY(want_attr_range(c, KILN_A_CONVT_GROUPS, 0, g, 1, MAXD));
    if (!is_static(w, 0) || w->min[0] % g != 0) {
        return SHAPE_FAIL(c, "%s has %s input channels, not a static multiple of groups = %" PRId64,
                          IN(c, 1), RS(w->min[0], w->max[0]), g);
    }
    if (!is_static(w, 1) || !mul_nn(w->min[1], g, &cout)) {
        return SHAPE_FAIL(c, "%s dimension 1 = %s is not a static channel count", IN(c, 1),
                          RS(w->min[1], w->max[1]));
    }
    if (!agree_dim(x->min[1], x->max[1], w->min[0], w->max[0], &c0, &c1)) {
        return SHAPE_FAIL(c, "%s has %s channels but the weight expects %" PRId64, IN(c, 0),
                          RS(x->min[1], x->max[1]), w->min[0]);
    }
    if (n > 2 && in[2] != NULL) {
        KILN_TRY(want_vec(c, in, 2, "output channels", cout, cout, 0));
    }
    out->shape.rank = 4;
    set_dim(&out->shape, 0, x->min[0], x->max[0]);
    set_dim(&out->shape, 1, cout, cout);
    for (uint32_t i = 0; i < 2; i++) {
        int64_t k = w->min[2 + i], s = kiln_attrs_int(a, KILN_A_CONVT_STRIDE, i);
        int64_t p = kiln_attrs_int(a, KILN_A_CONVT_PADDING, i);
        int64_t op = kiln_attrs_int(a, KILN_A_CONVT_OUTPUT_PADDING, i);
        int64_t d = kiln_attrs_int(a, KILN_A_CONVT_DILATION, i);
        int64_t eff, r[2];
        if (!is_static(w, 2 + i) || k < 1) {
            return SHAPE_FAIL(c, "%s kernel %s = %s; must be static and >= 1", IN(c, 1), axis[i],
                              RS(w->min[2 + i], w->max[2 + i]));
        }
        if (op >= s && op >= d) {
            return UNSUP_FAIL(c,
                              "attribute 'output_padding'[%u] = %" PRId64 " must be smaller than "
                              "the stride (%" PRId64 ") or the dilation (%" PRId64 ")",
                              i, op, s, d);
        }
        if (!mul_nn(d, k - 1, &eff)) {
            return UNSUP_FAIL(c, "kernel %s %" PRId64 " with dilation %" PRId64 " is too large",
                              axis[i], k, d);
        }
        if (x->max[2 + i] < 1) {
            return SHAPE_FAIL(c, "%s %s is %s; must be >= 1", IN(c, 0), axis[i],
                              RS(x->min[2 + i], x->max[2 + i]));
        }
        if (eff > MAXD) {
            return UNSUP_FAIL(c, "kernel %s %" PRId64 " with dilation %" PRId64 " is too large",
                              axis[i], k, d);
        }
        for (int e = 0; e < 2; e++) {
            // An input size of 0 is invalid (fails at run time): the minimum starts at 1.
            int64_t h = e ? x->max[2 + i] : (x->min[2 + i] < 1 ? 1 : x->min[2 + i]), t;
            if (!mul_nn(h - 1, s, &t) || t > MAXD) {
                return UNSUP_FAIL(c,
                                  "output %s overflows Kiln's limit of 2^40 (input %" PRId64
                                  ", stride %" PRId64 ")",
                                  axis[i], h, s);
            }
            r[e] = t - 2 * p + eff + op + 1;
        }
        KILN_TRY(spatial_range(c, axis[i], x->min[2 + i], x->max[2 + i], r[0], r[1],
                               &out->shape.min[2 + i], &out->shape.max[2 + i]));
    }
    return KILN_OK;
}

static kiln_status infer_batch_norm(const ictx *c, const kiln_attrs *a,
                                    const kiln_value_desc *const *in, uint32_t n,
                                    kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int64_t c0 = x->min[1], c1 = x->max[1];
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 2, KILN_MAX_RANK));
    KILN_TRY(want_eps(c, a, KILN_A_BN_EPS));
    for (uint32_t i = 1; i < 5; i++) {
        if (in[i] == NULL) continue;
        KILN_TRY(want_vec(c, in, i, "one per channel, dimension 1 of x", c0, c1, 0));
        (void)agree_dim(c0, c1, in[i]->shape.min[0], in[i]->shape.max[0], &c0, &c1);
    }
    out->shape = *x;
    set_dim(&out->shape, 1, c0, c1);
    return KILN_OK;
}

static kiln_status infer_unary(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                               uint32_t n, kiln_value_desc *out) {
    (void)n;
    if (c->op == KILN_OP_GELU) KILN_TRY(want_bool_attr(c, a, KILN_A_GELU_APPROXIMATE));
    out->shape = in[0]->shape;
    return KILN_OK;
}

static kiln_status infer_cast(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                              uint32_t n, kiln_value_desc *out) {
    int64_t t = kiln_attrs_int(a, KILN_A_CAST_DTYPE, 0);
    (void)n;
    if (t <= KILN_DTYPE_INVALID || t >= KILN_DTYPE_COUNT) {
        return UNSUP_FAIL(c, "attribute 'dtype' = %" PRId64 " is not a Kiln dtype (1..%d)", t,
                          KILN_DTYPE_COUNT - 1);
    }
    out->dtype = (uint32_t)t;
    out->shape = in[0]->shape;
    return KILN_OK;
}

static kiln_status infer_binary(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    (void)a;
    (void)n;
    KILN_TRY(want_same_dtype(c, in, 1, 0));
    return bcast_shapes(c, &in[0]->shape, 0, &in[1]->shape, 1, &out->shape);
}

static kiln_status infer_where(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                               uint32_t n, kiln_value_desc *out) {
    kiln_shape t;
    (void)a;
    (void)n;
    if (in[0]->dtype != KILN_DTYPE_BOOL) {
        return UNSUP_FAIL(c, "%s has dtype %s; where needs a bool condition", IN(c, 0),
                          dname(in[0]->dtype));
    }
    KILN_TRY(want_same_dtype(c, in, 2, 1));
    KILN_TRY(bcast_shapes(c, &in[1]->shape, 1, &in[2]->shape, 2, &t));
    KILN_TRY(bcast_shapes(c, &in[0]->shape, 0, &t, 1, &out->shape));
    out->dtype = in[1]->dtype;
    return KILN_OK;
}

static kiln_status want_axis(const ictx *c, uint32_t idx, uint32_t j, int64_t v, uint32_t rank,
                             uint32_t *out) {
    if (norm_axis(v, rank, out)) return KILN_OK;
    return SHAPE_FAIL(c,
                      "attribute '%s'[%u] = %" PRId64 " is out of range for rank %u (valid: "
                      "%d..%u)",
                      aname(c, idx), j, v, rank, -(int)rank, rank == 0 ? 0 : rank - 1);
}

static kiln_status infer_softmax(const ictx *c, const kiln_attrs *a,
                                 const kiln_value_desc *const *in, uint32_t n,
                                 kiln_value_desc *out) {
    uint32_t d = 0;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_axis(c, KILN_A_SOFTMAX_DIM, 0, kiln_attrs_int(a, KILN_A_SOFTMAX_DIM, 0),
                       in[0]->shape.rank, &d));
    out->shape = in[0]->shape;
    return KILN_OK;
}

static kiln_status infer_layer_norm(const ictx *c, const kiln_attrs *a,
                                    const kiln_value_desc *const *in, uint32_t n,
                                    kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int64_t nd = kiln_attrs_int(a, KILN_A_LN_NDIM, 0);
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_attr_range(c, KILN_A_LN_NDIM, 0, nd, 1, x->rank));
    KILN_TRY(want_eps(c, a, KILN_A_LN_EPS));
    out->shape = *x;
    for (uint32_t i = 1; i < n && i < 3; i++) {
        const kiln_shape *p;
        if (in[i] == NULL) continue;
        p = &in[i]->shape;
        KILN_TRY(want_same_dtype(c, in, i, 0));
        if (p->rank != (uint32_t)nd) {
            return SHAPE_FAIL(c,
                              "%s has shape %s; expected the last %" PRId64 " dimensions of x %s",
                              IN(c, i), SS(p), nd, SS(x));
        }
        for (uint32_t j = 0; j < p->rank; j++) {
            uint32_t xd = x->rank - p->rank + j;
            if (!agree_dim(out->shape.min[xd], out->shape.max[xd], p->min[j], p->max[j],
                           &out->shape.min[xd], &out->shape.max[xd])) {
                return SHAPE_FAIL(
                    c, "%s has shape %s; expected the last %" PRId64 " dimensions of x %s",
                    IN(c, i), SS(p), nd, SS(x));
            }
        }
    }
    return KILN_OK;
}

// rms_norm: x[..., D], weight?[D]; the output is x's shape (D intersected with the weight's).
static kiln_status infer_rms_norm(const ictx *c, const kiln_attrs *a,
                                  const kiln_value_desc *const *in, uint32_t n,
                                  kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_eps(c, a, KILN_A_RMS_EPS));
    out->shape = *x;
    if (n > 1 && in[1] != NULL) {
        uint32_t d = x->rank - 1;
        KILN_TRY(want_vec(c, in, 1, "the last dimension of x", x->min[d], x->max[d], 0));
        agree_dim(x->min[d], x->max[d], in[1]->shape.min[0], in[1]->shape.max[0],
                  &out->shape.min[d], &out->shape.max[d]);
    }
    return KILN_OK;
}

// rotary: x[..., D] with D static and even; cos and sin (each x's dtype or float32) expand to
// x's shape (a dimension equal to x's or 1, at most x's rank). The output is x's shape, narrowed
// where a cos/sin dimension range meets x's.
static kiln_status infer_rotary(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t d;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    const int64_t inter = kiln_attrs_int(a, KILN_A_ROTARY_INTERLEAVED, 0);
    if (inter != 0 && inter != 1) {
        return SHAPE_FAIL(c, "rotary's interleaved is %lld; it must be 0 (halves) or 1 (pairs)",
                          (long long)inter);
    }
    d = x->rank - 1;
    if (!is_static(x, d) || x->min[d] % 2 != 0) {
        return SHAPE_FAIL(c, "%s has shape %s; rotary needs a static, even last dimension",
                          IN(c, 0), SS(x));
    }
    // Partial rotation: tables whose last dim is a static even R below D (and not 1) rotate the
    // first R of x's D and pass the rest (GPT-NeoX's, StableLM's and Phi's rotary_pct).
    const int64_t r = kiln_rotary_dims(
        in[1]->shape.rank ? in[1]->shape.max[in[1]->shape.rank - 1] : 1, x->max[d]);
    const int64_t r2 = kiln_rotary_dims(
        in[2]->shape.rank ? in[2]->shape.max[in[2]->shape.rank - 1] : 1, x->max[d]);
    if (r != r2 || r % 2 != 0 || r < 2 || r > x->max[d]) {
        return SHAPE_FAIL(c,
                          "%s and %s have shapes %s and %s; rotary needs tables over x's last "
                          "dimension (%lld), or both over the same even number of its first "
                          "dimensions",
                          IN(c, 1), IN(c, 2), SS(&in[1]->shape), SS(&in[2]->shape),
                          (long long)x->max[d]);
    }
    kiln_shape xr = *x; // the rotated part, which the tables broadcast to
    xr.min[d] = xr.max[d] = r;
    out->shape = xr;
    for (uint32_t i = 1; i < 3; i++) {
        const kiln_shape *t = &in[i]->shape;
        if (in[i]->dtype != in[0]->dtype && in[i]->dtype != KILN_DTYPE_F32) {
            return SHAPE_FAIL(c, "%s has dtype %s; rotary needs x's dtype (%s) or float32",
                              IN(c, i), dname(in[i]->dtype), dname(in[0]->dtype));
        }
        if (t->rank > x->rank || (t->rank > 0 && !is_static(t, t->rank - 1))) {
            return SHAPE_FAIL(c, "%s has shape %s; it must broadcast to x %s", IN(c, i), SS(t),
                              SS(x));
        }
        for (uint32_t j = 0; j < t->rank; j++) {
            uint32_t k = x->rank - t->rank + j;
            if (!expand_dim(t->min[j], t->max[j], out->shape.min[k], out->shape.max[k],
                            &out->shape.min[k], &out->shape.max[k])) {
                return SHAPE_FAIL(c, "%s has shape %s; it must broadcast to x %s", IN(c, i), SS(t),
                                  SS(x));
            }
        }
    }
    out->shape.min[d] = out->shape.max[d] = x->max[d];
    return KILN_OK;
}

// torch's pooling_output_shape: floor or ceil division, and with ceil_mode the last window
// must start inside the input or the left padding.
static int64_t pool_out(int64_t h, int64_t k, int64_t s, int64_t p, int64_t d, int ceil) {
    int64_t eff = d * (k - 1); // bounded: validated k, d <= 2^20 via mul check by caller
    int64_t num = h + 2 * p - eff - 1 + (ceil ? s - 1 : 0);
    int64_t o = floor_div(num, s) + 1;
    if (ceil && (o - 1) * s >= h + p) o--;
    return o;
}

static kiln_status infer_pool(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                              uint32_t n, kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int maxpool = c->op == KILN_OP_MAX_POOL2D;
    uint32_t ak = maxpool ? KILN_A_MAXPOOL_KERNEL : KILN_A_AVGPOOL_KERNEL;
    uint32_t as = maxpool ? KILN_A_MAXPOOL_STRIDE : KILN_A_AVGPOOL_STRIDE;
    uint32_t ap = maxpool ? KILN_A_MAXPOOL_PADDING : KILN_A_AVGPOOL_PADDING;
    uint32_t ac = maxpool ? KILN_A_MAXPOOL_CEIL : KILN_A_AVGPOOL_CEIL;
    static const char *const axis[2] = {"height", "width"};
    int ceil_mode;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_pos_attrs(c, a, ak, 1));
    KILN_TRY(want_pos_attrs(c, a, as, 1));
    KILN_TRY(want_pos_attrs(c, a, ap, 0));
    KILN_TRY(want_bool_attr(c, a, ac));
    if (maxpool) {
        KILN_TRY(want_pos_attrs(c, a, KILN_A_MAXPOOL_DILATION, 1));
    } else {
        KILN_TRY(want_bool_attr(c, a, KILN_A_AVGPOOL_COUNT_PAD));
        KILN_TRY(want_attr_range(c, KILN_A_AVGPOOL_DIVISOR, 0,
                                 kiln_attrs_int(a, KILN_A_AVGPOOL_DIVISOR, 0), 0, INT32_MAX));
    }
    ceil_mode = (int)kiln_attrs_int(a, ac, 0);
    out->shape = *x;
    for (uint32_t i = 0; i < 2; i++) {
        int64_t k = kiln_attrs_int(a, ak, i), s = kiln_attrs_int(a, as, i);
        int64_t p = kiln_attrs_int(a, ap, i);
        int64_t d = maxpool ? kiln_attrs_int(a, KILN_A_MAXPOOL_DILATION, i) : 1, eff;
        if (p > k / 2) {
            return UNSUP_FAIL(c,
                              "attribute 'padding'[%u] = %" PRId64 " must be at most half the "
                              "kernel size (%" PRId64 ")",
                              i, p, k);
        }
        if (!mul_nn(d, k - 1, &eff) || eff > MAXD) {
            return UNSUP_FAIL(c, "kernel %s %" PRId64 " with dilation %" PRId64 " is too large",
                              axis[i], k, d);
        }
        KILN_TRY(spatial_range(c, axis[i], x->min[2 + i], x->max[2 + i],
                               pool_out(x->min[2 + i], k, s, p, d, ceil_mode),
                               pool_out(x->max[2 + i], k, s, p, d, ceil_mode),
                               &out->shape.min[2 + i], &out->shape.max[2 + i]));
    }
    return KILN_OK;
}

static kiln_status infer_adaptive_pool(const ictx *c, const kiln_attrs *a,
                                       const kiln_value_desc *const *in, uint32_t n,
                                       kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_ADAPTIVE_OUTPUT, 1));
    for (uint32_t i = 1; i < 4; i++) {
        if (x->max[i] < 1) {
            return SHAPE_FAIL(c,
                              "%s dimension %u is %s; adaptive_avg_pool2d needs non-empty "
                              "channel and spatial dimensions",
                              IN(c, 0), i, RS(x->min[i], x->max[i]));
        }
    }
    out->shape = *x;
    for (uint32_t i = 0; i < 2; i++) {
        int64_t o = kiln_attrs_int(a, KILN_A_ADAPTIVE_OUTPUT, i);
        set_dim(&out->shape, 2 + i, o, o);
    }
    return KILN_OK;
}

static kiln_status infer_reduce(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t nd = 0, r = 0;
    const int64_t *dims = kiln_attrs_ints(a, KILN_A_REDUCE_DIMS, &nd);
    int64_t keep = kiln_attrs_int(a, KILN_A_REDUCE_KEEPDIM, 0);
    bool red[KILN_MAX_RANK] = {false};
    (void)n;
    KILN_TRY(want_bool_attr(c, a, KILN_A_REDUCE_KEEPDIM));
    for (uint32_t j = 0; j < nd; j++) {
        uint32_t d = 0;
        KILN_TRY(want_axis(c, KILN_A_REDUCE_DIMS, j, dims[j], x->rank, &d));
        if (red[d]) {
            return SHAPE_FAIL(c, "attribute 'dims' names dimension %u twice", d);
        }
        red[d] = true;
    }
    if (nd == 0) {
        for (uint32_t d = 0; d < x->rank; d++) red[d] = true;
    }
    for (uint32_t d = 0; d < x->rank; d++) {
        if (!red[d]) {
            set_dim(&out->shape, r++, x->min[d], x->max[d]);
        } else if (keep) {
            set_dim(&out->shape, r++, 1, 1);
        }
    }
    out->shape.rank = r;
    return KILN_OK;
}

// Decodes a shape code of reshape/expand: >= 0 literal, -1 (special, handled by the caller),
// <= -2 copy dimension (-v - 2) of `src`. Writes the range; *copied_from gets the source dim
// index for copies (-1 for literals).
static kiln_status shape_code(const ictx *c, uint32_t idx, uint32_t j, int64_t v,
                              const kiln_value_desc *src, uint32_t src_input, int64_t *o0,
                              int64_t *o1, int32_t *copied_from) {
    *copied_from = -1;
    if (v >= 0) {
        if (v > MAXD) {
            return UNSUP_FAIL(c, "attribute '%s'[%u] = %" PRId64 " is above Kiln's limit of 2^40",
                              aname(c, idx), j, v);
        }
        *o0 = *o1 = v;
        return KILN_OK;
    }
    // v <= -2: dimension -(v + 2); v + 2 cannot overflow for v <= -2.
    int64_t d = -(v + 2);
    if (d >= (int64_t)src->shape.rank) {
        return SHAPE_FAIL(c,
                          "attribute '%s'[%u] = %" PRId64 " copies dimension %" PRId64
                          " of %s, which has rank %u",
                          aname(c, idx), j, v, d, IN(c, src_input), src->shape.rank);
    }
    *o0 = src->shape.min[d];
    *o1 = src->shape.max[d];
    *copied_from = (int32_t)d;
    return KILN_OK;
}

// Product of ranges; false on overflow.
static bool prod_range(const int64_t *lo, const int64_t *hi, const bool *skip, uint32_t n,
                       int64_t *p0, int64_t *p1) {
    int64_t a = 1, b = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (skip != NULL && skip[i]) continue;
        if (!mul_nn(a, lo[i], &a) || !mul_nn(b, hi[i], &b)) return false;
    }
    *p0 = a;
    *p1 = b;
    return true;
}

static kiln_status infer_reshape(const ictx *c, const kiln_attrs *a,
                                 const kiln_value_desc *const *in, uint32_t n,
                                 kiln_value_desc *out) {
    const kiln_value_desc *x = in[0];
    const kiln_value_desc *like = n > 1 ? in[1] : NULL;
    const kiln_value_desc *src = like != NULL ? like : x;
    uint32_t src_input = like != NULL ? 1 : 0, nc = 0;
    const int64_t *codes = kiln_attrs_ints(a, KILN_A_RESHAPE_SHAPE, &nc);
    int32_t infer_at = -1;
    bool x_cancel[KILN_MAX_RANK] = {false}, o_cancel[KILN_MAX_RANK] = {false};
    int64_t n0, n1, d0, d1;
    if (nc > KILN_MAX_RANK) {
        return UNSUP_FAIL(c, "attribute 'shape' has %u entries; Kiln's maximum rank is %d", nc,
                          KILN_MAX_RANK);
    }
    out->shape.rank = nc;
    for (uint32_t j = 0; j < nc; j++) {
        int32_t from;
        if (codes[j] == -1) {
            if (infer_at >= 0) {
                return SHAPE_FAIL(c,
                                  "attribute 'shape' has -1 (infer) at entries %d and %u; "
                                  "at most one may be inferred",
                                  infer_at, j);
            }
            infer_at = (int32_t)j;
            o_cancel[j] = true; // not part of the known product
            continue;
        }
        KILN_TRY(shape_code(c, KILN_A_RESHAPE_SHAPE, j, codes[j], src, src_input,
                            &out->shape.min[j], &out->shape.max[j], &from));
        // A copy of x's own dimension cancels against the same factor of numel(x).
        if (from >= 0 && src == x && !x_cancel[from]) {
            x_cancel[from] = true;
            o_cancel[j] = true;
        }
    }
    if (!prod_range(x->shape.min, x->shape.max, x_cancel, x->shape.rank, &n0, &n1) ||
        !prod_range(out->shape.min, out->shape.max, o_cancel, nc, &d0, &d1)) {
        return UNSUP_FAIL(c, "element count of %s or of the target shape overflows", SS(&x->shape));
    }
    if (infer_at >= 0) {
        int64_t lo, hi;
        if (n0 == n1 && d0 == d1) { // exact
            if (d0 == 0 || n0 % d0 != 0) {
                return SHAPE_FAIL(c,
                                  "cannot reshape %s into a shape with -1 at entry %d: the other "
                                  "entries multiply to %" PRId64 ", which does not divide %" PRId64,
                                  SS(&x->shape), infer_at, d0, n0);
            }
            lo = hi = n0 / d0;
        } else {
            if (d1 == 0) {
                return SHAPE_FAIL(c, "cannot infer -1 at entry %d: the other entries are always 0",
                                  infer_at);
            }
            lo = n0 / d1 + (n0 % d1 != 0);
            hi = n1 / (d0 < 1 ? 1 : d0);
            if (lo > hi) {
                return SHAPE_FAIL(c, "cannot reshape %s with -1 at entry %d: no size fits",
                                  SS(&x->shape), infer_at);
            }
        }
        set_dim(&out->shape, (uint32_t)infer_at, lo, hi);
    } else if (n0 == n1 && d0 == d1 ? n0 != d0 : (n1 < d0 || d1 < n0)) {
        char o[256];
        return SHAPE_FAIL(c, "cannot reshape %s into %s: the element counts differ", SS(&x->shape),
                          sstr(o, sizeof o, &out->shape));
    }
    return KILN_OK;
}

static kiln_status infer_expand(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    const kiln_value_desc *src = n > 1 && in[1] != NULL ? in[1] : in[0];
    uint32_t src_input = src == in[0] ? 0 : 1, nc = 0;
    const int64_t *codes = kiln_attrs_ints(a, KILN_A_EXPAND_SHAPE, &nc);
    if (nc > KILN_MAX_RANK) {
        return UNSUP_FAIL(c, "attribute 'shape' has %u entries; Kiln's maximum rank is %d", nc,
                          KILN_MAX_RANK);
    }
    if (nc < x->rank) {
        return SHAPE_FAIL(c, "attribute 'shape' has %u entries, fewer than the rank %u of x %s", nc,
                          x->rank, SS(x));
    }
    out->shape.rank = nc;
    for (uint32_t j = 0; j < nc; j++) {
        int32_t xd = (int32_t)j - (int32_t)(nc - x->rank); // aligned dim of x, or < 0 (new)
        int64_t t0 = 0, t1 = 0;
        int32_t from;
        if (codes[j] == -1) {
            if (xd < 0) {
                return SHAPE_FAIL(c,
                                  "attribute 'shape'[%u] = -1 (keep) is not allowed for a new "
                                  "leading dimension",
                                  j);
            }
            set_dim(&out->shape, j, x->min[xd], x->max[xd]);
            continue;
        }
        KILN_TRY(shape_code(c, KILN_A_EXPAND_SHAPE, j, codes[j], src, src_input, &t0, &t1, &from));
        if (xd < 0) {
            set_dim(&out->shape, j, t0, t1);
        } else if (!expand_dim(x->min[xd], x->max[xd], t0, t1, &out->shape.min[j],
                               &out->shape.max[j])) {
            return SHAPE_FAIL(c,
                              "cannot expand dimension %d of x %s (size %s) to %s: only size-1 "
                              "dimensions can be expanded",
                              xd, SS(x), RS(x->min[xd], x->max[xd]), RS(t0, t1));
        }
    }
    return KILN_OK;
}

static kiln_status infer_permute(const ictx *c, const kiln_attrs *a,
                                 const kiln_value_desc *const *in, uint32_t n,
                                 kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t nd = 0;
    const int64_t *dims = kiln_attrs_ints(a, KILN_A_PERMUTE_DIMS, &nd);
    bool seen[KILN_MAX_RANK] = {false};
    (void)n;
    if (nd != x->rank) {
        return SHAPE_FAIL(c, "attribute 'dims' has %u entries but x %s has rank %u", nd, SS(x),
                          x->rank);
    }
    out->shape.rank = nd;
    for (uint32_t j = 0; j < nd; j++) {
        uint32_t d = 0;
        KILN_TRY(want_axis(c, KILN_A_PERMUTE_DIMS, j, dims[j], x->rank, &d));
        if (seen[d]) {
            return SHAPE_FAIL(c,
                              "attribute 'dims' is not a permutation: dimension %u appears "
                              "twice",
                              d);
        }
        seen[d] = true;
        set_dim(&out->shape, j, x->min[d], x->max[d]);
    }
    return KILN_OK;
}

static kiln_status infer_cat(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                             uint32_t n, kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t d = 0;
    int64_t s0 = 0, s1 = 0;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_axis(c, KILN_A_CAT_DIM, 0, kiln_attrs_int(a, KILN_A_CAT_DIM, 0), x->rank, &d));
    out->shape = *x;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_shape *s = &in[i]->shape;
        KILN_TRY(want_same_dtype(c, in, i, 0));
        if (s->rank != x->rank) {
            return SHAPE_FAIL(c, "%s has rank %u %s but input 0 has rank %u %s", IN(c, i), s->rank,
                              SS(s), x->rank, SS(x));
        }
        for (uint32_t j = 0; j < x->rank; j++) {
            if (j == d) continue;
            if (!agree_dim(out->shape.min[j], out->shape.max[j], s->min[j], s->max[j],
                           &out->shape.min[j], &out->shape.max[j])) {
                return SHAPE_FAIL(c,
                                  "%s %s does not match the other inputs in dimension %u (%s); "
                                  "cat needs equal sizes except in dim %u",
                                  IN(c, i), SS(s), j, RS(out->shape.min[j], out->shape.max[j]), d);
            }
        }
        s0 += s->min[d]; // each <= 2^40, at most 64 inputs: no overflow
        s1 += s->max[d];
    }
    set_dim(&out->shape, d, s0, s1);
    return KILN_OK;
}

// Length of slice [start:end:step] of a dimension of size s (torch semantics: negative bounds
// count from the end, then both clamp to [0, s]).
static int64_t slice_len(int64_t s, int64_t start, int64_t end, int64_t step) {
    if (start < 0) start = start < -s ? 0 : start + s;
    if (start > s) start = s;
    if (end < 0) end = end < -s ? 0 : end + s;
    if (end > s) end = s;
    if (end <= start) return 0;
    return (end - start - 1) / step + 1;
}

static kiln_status infer_slice(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                               uint32_t n, kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int64_t start = kiln_attrs_int(a, KILN_A_SLICE_START, 0);
    int64_t end = kiln_attrs_int(a, KILN_A_SLICE_END, 0);
    int64_t step = kiln_attrs_int(a, KILN_A_SLICE_STEP, 0);
    int64_t s0, s1, lo = INT64_MAX, hi = INT64_MIN;
    int64_t cand[6];
    uint32_t d = 0, nc = 0;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(
        want_axis(c, KILN_A_SLICE_DIM, 0, kiln_attrs_int(a, KILN_A_SLICE_DIM, 0), x->rank, &d));
    KILN_TRY(want_attr_range(c, KILN_A_SLICE_STEP, 0, step, 1, INT64_MAX));
    s0 = x->min[d];
    s1 = x->max[d];
    // The length is piecewise monotone in the size; its extremes over [s0, s1] are at the ends
    // or at the sizes where start or end stop clamping.
    cand[nc++] = s0;
    cand[nc++] = s1;
    {
        int64_t bps[2] = {start, end};
        for (int i = 0; i < 2; i++) {
            int64_t bp = bps[i] >= 0 ? bps[i] : (bps[i] == INT64_MIN ? INT64_MAX : -bps[i]);
            if (bp > s0 && bp < s1) cand[nc++] = bp;
        }
    }
    for (uint32_t i = 0; i < nc; i++) {
        int64_t l = slice_len(cand[i], start, end, step);
        lo = min64(lo, l);
        hi = max64(hi, l);
    }
    out->shape = *x;
    set_dim(&out->shape, d, lo, hi);
    return KILN_OK;
}

static kiln_status infer_select(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int64_t idx = kiln_attrs_int(a, KILN_A_SELECT_INDEX, 0);
    uint32_t d = 0, r = 0;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(
        want_axis(c, KILN_A_SELECT_DIM, 0, kiln_attrs_int(a, KILN_A_SELECT_DIM, 0), x->rank, &d));
    // Valid for size s when -s <= idx < s: some size in the range must allow it (the runtime
    // checks the concrete size).
    if (idx >= 0 ? idx >= x->max[d] : (idx == INT64_MIN || -idx > x->max[d])) {
        return SHAPE_FAIL(c,
                          "attribute 'index' = %" PRId64 " is out of range for dimension %u of "
                          "size %s",
                          idx, d, RS(x->min[d], x->max[d]));
    }
    for (uint32_t j = 0; j < x->rank; j++) {
        if (j != d) set_dim(&out->shape, r++, x->min[j], x->max[j]);
    }
    out->shape.rank = r;
    return KILN_OK;
}

static kiln_status infer_squeeze(const ictx *c, const kiln_attrs *a,
                                 const kiln_value_desc *const *in, uint32_t n,
                                 kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t nd = 0, r = 0;
    const int64_t *dims = kiln_attrs_ints(a, KILN_A_SQUEEZE_DIMS, &nd);
    bool drop[KILN_MAX_RANK] = {false};
    (void)n;
    if (nd == 0) {
        return UNSUP_FAIL(c, "attribute 'dims' is empty: pass the size-1 dimensions to remove "
                             "explicitly");
    }
    for (uint32_t j = 0; j < nd; j++) {
        uint32_t d = 0;
        KILN_TRY(want_axis(c, KILN_A_SQUEEZE_DIMS, j, dims[j], x->rank, &d));
        if (drop[d]) return SHAPE_FAIL(c, "attribute 'dims' names dimension %u twice", d);
        if (x->min[d] != 1 || x->max[d] != 1) {
            return SHAPE_FAIL(c, "cannot squeeze dimension %u of x %s: its size is %s, not 1", d,
                              SS(x), RS(x->min[d], x->max[d]));
        }
        drop[d] = true;
    }
    for (uint32_t j = 0; j < x->rank; j++) {
        if (!drop[j]) set_dim(&out->shape, r++, x->min[j], x->max[j]);
    }
    out->shape.rank = r;
    return KILN_OK;
}

static kiln_status infer_unsqueeze(const ictx *c, const kiln_attrs *a,
                                   const kiln_value_desc *const *in, uint32_t n,
                                   kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t d = 0, r = 0;
    (void)n;
    if (x->rank >= KILN_MAX_RANK) {
        return UNSUP_FAIL(c, "x %s already has Kiln's maximum rank %d", SS(x), KILN_MAX_RANK);
    }
    KILN_TRY(want_axis(c, KILN_A_UNSQUEEZE_DIM, 0, kiln_attrs_int(a, KILN_A_UNSQUEEZE_DIM, 0),
                       x->rank + 1, &d));
    for (uint32_t j = 0; j <= x->rank; j++) {
        if (j == d) {
            set_dim(&out->shape, r++, 1, 1);
        }
        if (j < x->rank) set_dim(&out->shape, r++, x->min[j], x->max[j]);
    }
    out->shape.rank = r;
    return KILN_OK;
}

static kiln_status infer_embedding(const ictx *c, const kiln_attrs *a,
                                   const kiln_value_desc *const *in, uint32_t n,
                                   kiln_value_desc *out) {
    const kiln_shape *w = &in[0]->shape, *idx = &in[1]->shape;
    (void)a;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 2, 2));
    KILN_TRY(want_dtype_mask(c, in[1], 1,
                             KILN_DTYPE_BIT(KILN_DTYPE_I32) | KILN_DTYPE_BIT(KILN_DTYPE_I64)));
    KILN_TRY(want_rank(c, in[1], 1, 0, KILN_MAX_RANK - 1));
    out->shape = *idx;
    out->shape.rank = idx->rank + 1;
    set_dim(&out->shape, idx->rank, w->min[1], w->max[1]);
    out->dtype = in[0]->dtype;
    return KILN_OK;
}

static kiln_status infer_sdpa(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                              uint32_t n, kiln_value_desc *out) {
    const kiln_shape *q = &in[0]->shape, *v = &in[2]->shape;
    uint32_t r = q->rank, nb;
    double scale = kiln_attrs_float(a, KILN_A_SDPA_SCALE, 0);
    int64_t e0, e1, s0, s1;
    KILN_TRY(want_rank(c, in[0], 0, 2, KILN_MAX_RANK));
    for (uint32_t i = 1; i < 3; i++) {
        KILN_TRY(want_rank(c, in[i], i, r, r));
        KILN_TRY(want_same_dtype(c, in, i, 0));
    }
    KILN_TRY(want_bool_attr(c, a, KILN_A_SDPA_CAUSAL));
    if (!isnan(scale) && !isfinite(scale)) {
        return UNSUP_FAIL(c, "attribute 'scale' = %g; must be finite (NaN selects 1/sqrt(E))",
                          scale);
    }
    KILN_TRY(want_agree(c, "embedding size (E)", in, 0, r - 1, 1, r - 1, &e0, &e1));
    KILN_TRY(want_agree(c, "key/value length (S)", in, 1, r - 2, 2, r - 2, &s0, &s1));
    nb = r - 2;
    out->shape = *q;
    for (uint32_t j = 0; j < nb;
         j++) { // batch dims broadcast (grouped-query k, v: [B, G, 1, S, E])
        for (uint32_t i = 1; i < 3; i++) {
            const kiln_shape *o = &in[i]->shape;
            if (!bcast_dim(out->shape.min[j], out->shape.max[j], o->min[j], o->max[j],
                           &out->shape.min[j], &out->shape.max[j])) {
                return SHAPE_FAIL(c,
                                  "batch dimension %u of %s %s does not broadcast with the "
                                  "query's %s",
                                  j, IN(c, i), SS(o), SS(q));
            }
        }
    }
    set_dim(&out->shape, r - 1, v->min[r - 1], v->max[r - 1]);
    if (n > 3 && in[3] != NULL) {
        const kiln_shape *m = &in[3]->shape;
        kiln_shape t = out->shape; // scores: [batch..., L, S]
        if (kiln_attrs_int(a, KILN_A_SDPA_CAUSAL, 0) != 0) {
            return UNSUP_FAIL(c, "a mask (input 3) and is_causal = 1 cannot be combined (as in "
                                 "PyTorch): fold the causal mask into the mask");
        }
        if (in[3]->dtype != KILN_DTYPE_BOOL && in[3]->dtype != in[0]->dtype) {
            return UNSUP_FAIL(c, "%s has dtype %s; the mask must be bool or %s like the query",
                              IN(c, 3), dname(in[3]->dtype), dname(in[0]->dtype));
        }
        set_dim(&t, r - 1, s0, s1);
        if (m->rank > r) {
            return SHAPE_FAIL(c, "%s has rank %u, more than the query's %u", IN(c, 3), m->rank, r);
        }
        for (uint32_t i = 0; i < m->rank; i++) {
            uint32_t md = m->rank - 1 - i, td = r - 1 - i;
            int64_t lo, hi;
            bool one = m->min[md] <= 1 && 1 <= m->max[md];
            if (!one && !agree_dim(m->min[md], m->max[md], t.min[td], t.max[td], &lo, &hi)) {
                return SHAPE_FAIL(c,
                                  "%s %s does not broadcast to the attention scores %s "
                                  "(dimension %u)",
                                  IN(c, 3), SS(m), SS(&t), md);
            }
        }
    }
    return KILN_OK;
}

static kiln_status infer_compare(const ictx *c, const kiln_attrs *a,
                                 const kiln_value_desc *const *in, uint32_t n,
                                 kiln_value_desc *out) {
    KILN_TRY(infer_binary(c, a, in, n, out));
    out->dtype = KILN_DTYPE_BOOL;
    return KILN_OK;
}

static kiln_status infer_group_norm(const ictx *c, const kiln_attrs *a,
                                    const kiln_value_desc *const *in, uint32_t n,
                                    kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int64_t g = kiln_attrs_int(a, KILN_A_GN_GROUPS, 0), c0, c1;
    KILN_TRY(want_rank(c, in[0], 0, 2, KILN_MAX_RANK));
    KILN_TRY(want_attr_range(c, KILN_A_GN_GROUPS, 0, g, 1, MAXD));
    KILN_TRY(want_eps(c, a, KILN_A_GN_EPS));
    c0 = x->min[1];
    c1 = x->max[1];
    if (!is_static(x, 1) || c0 % g != 0) {
        return SHAPE_FAIL(c,
                          "%s has %s channels; group_norm needs a static multiple of groups = "
                          "%" PRId64,
                          IN(c, 0), RS(c0, c1), g);
    }
    for (uint32_t i = 1; i < n && i < 3; i++) {
        if (in[i] == NULL) continue;
        KILN_TRY(want_vec(c, in, i, "one per channel, dimension 1 of x", c0, c1, 0));
    }
    out->shape = *x;
    return KILN_OK;
}

static kiln_status infer_upsample(const ictx *c, const kiln_attrs *a,
                                  const kiln_value_desc *const *in, uint32_t n,
                                  kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_pos_attrs(c, a, KILN_A_UPSAMPLE_SIZE, 1));
    if (c->op == KILN_OP_UPSAMPLE_BILINEAR2D) {
        KILN_TRY(want_bool_attr(c, a, KILN_A_UPSAMPLE_ALIGN));
    }
    for (uint32_t i = 0; i < 2; i++) {
        double sc = kiln_attrs_float(a, KILN_A_UPSAMPLE_SCALES, i);
        if (!isnan(sc) && !(isfinite(sc) && sc > 0.0)) {
            return UNSUP_FAIL(c, "attribute 'scales'[%u] = %g; must be > 0 (or NaN: size ratio)", i,
                              sc);
        }
        if (x->max[2 + i] < 1) {
            return SHAPE_FAIL(c, "%s has an empty spatial dimension %u (%s)", IN(c, 0), 2 + i,
                              RS(x->min[2 + i], x->max[2 + i]));
        }
    }
    out->shape = *x;
    for (uint32_t i = 0; i < 2; i++) {
        int64_t o = kiln_attrs_int(a, KILN_A_UPSAMPLE_SIZE, i);
        set_dim(&out->shape, 2 + i, o, o);
    }
    return KILN_OK;
}

// grid_sample: x [N, C, H, W] read at grid [N, Ho, Wo, 2] (x's dtype, or float32 with a 16-bit
// x: coordinates the precision pass keeps in float32) -> [N, C, Ho, Wo].
static kiln_status infer_grid_sample(const ictx *c, const kiln_attrs *a,
                                     const kiln_value_desc *const *in, uint32_t n,
                                     kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape, *g = &in[1]->shape;
    int64_t lo, hi;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_rank(c, in[1], 1, 4, 4));
    if (in[1]->dtype != KILN_DTYPE_F32) KILN_TRY(want_same_dtype(c, in, 1, 0));
    int64_t mode = kiln_attrs_int(a, KILN_A_GRID_MODE, 0);
    int64_t pad = kiln_attrs_int(a, KILN_A_GRID_PADDING, 0);
    if (mode != 0 && mode != 1) {
        return UNSUP_FAIL(c, "attribute 'mode' = %lld; 0 (bilinear) or 1 (nearest)",
                          (long long)mode);
    }
    if (pad != 0 && pad != 1) {
        return UNSUP_FAIL(c, "attribute 'padding_mode' = %lld; 0 (zeros) or 1 (border)",
                          (long long)pad);
    }
    KILN_TRY(want_bool_attr(c, a, KILN_A_GRID_ALIGN));
    if (g->min[3] != 2 || g->max[3] != 2) {
        return SHAPE_FAIL(c, "%s %s must end in a dimension of 2 (x, y)", IN(c, 1), SS(g));
    }
    if (x->max[2] < 1 || x->max[3] < 1) {
        return SHAPE_FAIL(c, "%s %s has an empty spatial dimension", IN(c, 0), SS(x));
    }
    KILN_TRY(want_agree(c, "batch", in, 1, 0, 0, 0, &lo, &hi));
    out->shape = *x;
    set_dim(&out->shape, 0, lo, hi);
    set_dim(&out->shape, 2, g->min[1], g->max[1]);
    set_dim(&out->shape, 3, g->min[2], g->max[2]);
    out->dtype = in[0]->dtype;
    return KILN_OK;
}

static kiln_status infer_cumsum(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    uint32_t d = 0;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_axis(c, KILN_A_CUMSUM_DIM, 0, kiln_attrs_int(a, KILN_A_CUMSUM_DIM, 0),
                       in[0]->shape.rank, &d));
    out->shape = in[0]->shape;
    return KILN_OK;
}

static kiln_status infer_argmax(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t d = 0, r = 0;
    const int64_t keep = kiln_attrs_int(a, KILN_A_ARGMAX_KEEPDIM, 0);
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_bool_attr(c, a, KILN_A_ARGMAX_KEEPDIM));
    KILN_TRY(
        want_axis(c, KILN_A_ARGMAX_DIM, 0, kiln_attrs_int(a, KILN_A_ARGMAX_DIM, 0), x->rank, &d));
    if (x->min[d] < 1) {
        return SHAPE_FAIL(c, "argmax over dimension %u of x %s, which may be empty", d, SS(x));
    }
    for (uint32_t j = 0; j < x->rank; j++) {
        if (j != d) {
            set_dim(&out->shape, r++, x->min[j], x->max[j]);
        } else if (keep) {
            set_dim(&out->shape, r++, 1, 1);
        }
    }
    out->shape.rank = r;
    out->dtype = KILN_DTYPE_I64;
    return KILN_OK;
}

static kiln_status infer_topk(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                              uint32_t n, kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t d = 0;
    const int64_t k = kiln_attrs_int(a, KILN_A_TOPK_K, 0);
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_bool_attr(c, a, KILN_A_TOPK_LARGEST));
    KILN_TRY(want_axis(c, KILN_A_TOPK_DIM, 0, kiln_attrs_int(a, KILN_A_TOPK_DIM, 0), x->rank, &d));
    if (k < 0 || x->min[d] < k) {
        return SHAPE_FAIL(c,
                          "topk of k = %lld over dimension %u of x %s; k must be at least 0 and at "
                          "most the dimension's smallest size",
                          (long long)k, d, SS(x));
    }
    out->shape = *x;
    out->shape.min[d] = out->shape.max[d] = k;
    out->dtype = KILN_DTYPE_I64;
    return KILN_OK;
}

static kiln_status infer_gather_matmul(const ictx *c, const kiln_attrs *a,
                                       const kiln_value_desc *const *in, uint32_t n,
                                       kiln_value_desc *out) {
    int64_t b0, b1, k0, k1;
    (void)a;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 3, 3));
    KILN_TRY(want_dtype_mask(c, in[1], 1,
                             KILN_DTYPE_BIT(KILN_DTYPE_I32) | KILN_DTYPE_BIT(KILN_DTYPE_I64)));
    KILN_TRY(want_rank(c, in[1], 1, 1, 1));
    KILN_TRY(want_rank(c, in[2], 2, 3, 3));
    KILN_TRY(want_same_dtype(c, in, 2, 0));
    KILN_TRY(want_agree(c, "gather_matmul batch", in, 1, 0, 2, 0, &b0, &b1));
    KILN_TRY(want_agree(c, "gather_matmul inner", in, 0, 2, 2, 1, &k0, &k1));
    out->shape = in[2]->shape;
    set_dim(&out->shape, 0, b0, b1);
    set_dim(&out->shape, 1, in[0]->shape.min[1], in[0]->shape.max[1]);
    out->dtype = in[0]->dtype;
    return KILN_OK;
}

static kiln_status infer_selective_scan(const ictx *c, const kiln_attrs *a,
                                        const kiln_value_desc *const *in, uint32_t n,
                                        kiln_value_desc *out) {
    int64_t lo, hi;
    (void)a;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 4, 4));
    KILN_TRY(want_rank(c, in[1], 1, 4, 4));
    KILN_TRY(want_rank(c, in[2], 2, 3, 3));
    KILN_TRY(want_rank(c, in[3], 3, 3, 3));
    for (uint32_t i = 1; i < 4; i++) KILN_TRY(want_same_dtype(c, in, i, 0));
    for (uint32_t d = 0; d < 4; d++)
        KILN_TRY(want_agree(c, "selective_scan", in, 0, d, 1, d, &lo, &hi));
    KILN_TRY(want_agree(c, "selective_scan batch", in, 0, 0, 2, 0, &lo, &hi));
    KILN_TRY(want_agree(c, "selective_scan length", in, 0, 2, 2, 1, &lo, &hi));
    KILN_TRY(want_agree(c, "selective_scan state", in, 0, 3, 2, 2, &lo, &hi));
    KILN_TRY(want_agree(c, "selective_scan initial batch", in, 0, 0, 3, 0, &lo, &hi));
    KILN_TRY(want_agree(c, "selective_scan initial channels", in, 0, 1, 3, 1, &lo, &hi));
    KILN_TRY(want_agree(c, "selective_scan initial state", in, 0, 3, 3, 2, &lo, &hi));
    out->shape = in[0]->shape;
    out->shape.rank = 3;
    out->shape.min[3] = out->shape.max[3] = 0;
    out->dtype = in[0]->dtype;
    return KILN_OK;
}

static kiln_status infer_pad(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                             uint32_t n, kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    uint32_t np = 0;
    const int64_t *pads = kiln_attrs_ints(a, KILN_A_PAD_PADS, &np);
    double v = kiln_attrs_float(a, KILN_A_PAD_VALUE, 0);
    (void)n;
    if (np % 2 != 0 || np / 2 > x->rank) {
        return SHAPE_FAIL(c,
                          "attribute 'pads' has %u entries; it needs (before, after) pairs for at "
                          "most the %u dimensions of x %s",
                          np, x->rank, SS(x));
    }
    if (isinf(v) && !kiln_dtype_is_float((kiln_dtype)in[0]->dtype)) {
        return UNSUP_FAIL(c, "attribute 'value' = %g cannot be stored in %s", v,
                          dname(in[0]->dtype));
    }
    out->shape = *x;
    for (uint32_t j = 0; j < np / 2; j++) {
        uint32_t d = x->rank - 1 - j;
        int64_t b = pads[2 * j], e = pads[2 * j + 1];
        if (b < -MAXD || b > MAXD || e < -MAXD || e > MAXD) {
            return UNSUP_FAIL(c,
                              "attribute 'pads' entry for dimension %u (%" PRId64 ", %" PRId64
                              ") is beyond Kiln's limit of 2^40",
                              d, b, e);
        }
        int64_t lo = x->min[d] + b + e, hi = x->max[d] + b + e;
        if (hi < 0) {
            return SHAPE_FAIL(c,
                              "padding dimension %u of x %s by (%" PRId64 ", %" PRId64
                              ") leaves a negative size",
                              d, SS(x), b, e);
        }
        set_dim(&out->shape, d, lo < 0 ? 0 : lo, hi);
    }
    return KILN_OK;
}

static kiln_status infer_arange(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *like = &in[0]->shape;
    int64_t t = kiln_attrs_int(a, KILN_A_ARANGE_DTYPE, 0);
    double start = kiln_attrs_float(a, KILN_A_ARANGE_START, 0);
    double step = kiln_attrs_float(a, KILN_A_ARANGE_STEP, 0);
    uint32_t d = 0;
    (void)n;
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_axis(c, KILN_A_ARANGE_DIM, 0, kiln_attrs_int(a, KILN_A_ARANGE_DIM, 0), like->rank,
                       &d));
    if (t <= KILN_DTYPE_INVALID || t >= KILN_DTYPE_COUNT || t == KILN_DTYPE_BOOL) {
        return UNSUP_FAIL(c, "attribute 'dtype' = %" PRId64 " is not a numeric Kiln dtype", t);
    }
    if (!isfinite(start) || !isfinite(step) || step == 0.0) {
        return UNSUP_FAIL(c, "attributes 'start' = %g and 'step' = %g must be finite, step != 0",
                          start, step);
    }
    if (!kiln_dtype_is_float((kiln_dtype)t) && (start != floor(start) || step != floor(step))) {
        return UNSUP_FAIL(c, "an integer arange needs an integer start and step (%g, %g)", start,
                          step);
    }
    out->dtype = (uint32_t)t;
    out->shape.rank = 1;
    set_dim(&out->shape, 0, like->min[d], like->max[d]);
    return KILN_OK;
}

static const uint32_t IDX_MASK = KILN_DTYPE_BIT(KILN_DTYPE_I32) | KILN_DTYPE_BIT(KILN_DTYPE_I64);

static kiln_status infer_index(const ictx *c, const kiln_attrs *a, const kiln_value_desc *const *in,
                               uint32_t n, kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape;
    int64_t dim = kiln_attrs_int(a, KILN_A_INDEX_DIM, 0);
    uint32_t k = n - 1, r = 0;
    kiln_shape b;
    memset(&b, 0, sizeof b);
    KILN_TRY(want_bool_attr(c, a, KILN_A_INDEX_WRAP));
    if (dim < 0 || dim + k > x->rank) {
        return SHAPE_FAIL(c,
                          "attribute 'dim' = %" PRId64 " with %u index tensors does not fit x %s "
                          "(rank %u): indices cover dimensions dim .. dim + %u - 1",
                          dim, k, SS(x), x->rank, k);
    }
    for (uint32_t i = 1; i < n; i++) {
        KILN_TRY(want_dtype_mask(c, in[i], i, IDX_MASK));
        KILN_TRY(bcast_shapes(c, &b, i == 1 ? 1 : i - 1, &in[i]->shape, i, &b));
    }
    if ((uint32_t)dim + b.rank + (x->rank - (uint32_t)dim - k) > KILN_MAX_RANK) {
        return UNSUP_FAIL(c, "the result would have rank above Kiln's maximum %d", KILN_MAX_RANK);
    }
    for (uint32_t j = 0; j < (uint32_t)dim; j++) set_dim(&out->shape, r++, x->min[j], x->max[j]);
    for (uint32_t j = 0; j < b.rank; j++) set_dim(&out->shape, r++, b.min[j], b.max[j]);
    for (uint32_t j = (uint32_t)dim + k; j < x->rank; j++) {
        set_dim(&out->shape, r++, x->min[j], x->max[j]);
    }
    for (uint32_t j = 0; j < k; j++) {
        if (x->max[dim + j] < 1 && b.rank > 0) {
            bool empty = false;
            for (uint32_t q = 0; q < b.rank; q++) empty |= b.max[q] == 0;
            if (!empty) {
                return SHAPE_FAIL(c, "dimension %u of x %s is empty: no index can be valid",
                                  (uint32_t)dim + j, SS(x));
            }
        }
    }
    out->shape.rank = r;
    return KILN_OK;
}

static kiln_status infer_gather(const ictx *c, const kiln_attrs *a,
                                const kiln_value_desc *const *in, uint32_t n,
                                kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape, *ix = &in[1]->shape;
    uint32_t d = 0;
    (void)n;
    KILN_TRY(want_dtype_mask(c, in[1], 1, IDX_MASK));
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(
        want_axis(c, KILN_A_GATHER_DIM, 0, kiln_attrs_int(a, KILN_A_GATHER_DIM, 0), x->rank, &d));
    if (ix->rank != x->rank) {
        return SHAPE_FAIL(c, "%s %s has rank %u; gather needs the rank of x %s (%u)", IN(c, 1),
                          SS(ix), ix->rank, SS(x), x->rank);
    }
    for (uint32_t j = 0; j < x->rank; j++) {
        if (j != d && ix->min[j] > x->max[j]) {
            return SHAPE_FAIL(c, "%s %s is larger than x %s in dimension %u", IN(c, 1), SS(ix),
                              SS(x), j);
        }
    }
    out->shape = *ix;
    return KILN_OK;
}

static kiln_status infer_index_copy(const ictx *c, const kiln_attrs *a,
                                    const kiln_value_desc *const *in, uint32_t n,
                                    kiln_value_desc *out) {
    const kiln_shape *x = &in[0]->shape, *src = &in[2]->shape;
    uint32_t d = 0;
    int64_t lo, hi;
    (void)n;
    KILN_TRY(want_dtype_mask(c, in[1], 1, IDX_MASK));
    KILN_TRY(want_rank(c, in[1], 1, 1, 1));
    KILN_TRY(want_rank(c, in[0], 0, 1, KILN_MAX_RANK));
    KILN_TRY(want_rank(c, in[2], 2, x->rank, x->rank));
    KILN_TRY(want_same_dtype(c, in, 2, 0));
    KILN_TRY(want_axis(c, KILN_A_INDEX_COPY_DIM, 0, kiln_attrs_int(a, KILN_A_INDEX_COPY_DIM, 0),
                       x->rank, &d));
    for (uint32_t j = 0; j < x->rank; j++) {
        if (j == d) {
            KILN_TRY(want_agree(c, "rows", in, 2, j, 1, 0, &lo, &hi));
        } else {
            KILN_TRY(want_agree(c, "src against x", in, 2, j, 0, j, &lo, &hi));
        }
    }
    (void)src;
    out->shape = *x;
    return KILN_OK;
}

// --- dispatch

static infer_fn infer_for(uint32_t op) {
    switch (op) {
    case KILN_OP_LINEAR: return infer_linear;
    case KILN_OP_MATMUL: return infer_matmul;
    case KILN_OP_CONV2D: return infer_conv2d;
    case KILN_OP_CONV_TRANSPOSE2D: return infer_conv_transpose2d;
    case KILN_OP_BATCH_NORM: return infer_batch_norm;
    case KILN_OP_RELU:
    case KILN_OP_GELU:
    case KILN_OP_SILU:
    case KILN_OP_SIGMOID:
    case KILN_OP_TANH:
    case KILN_OP_HARDSWISH:
    case KILN_OP_HARDSIGMOID:
    case KILN_OP_NEG:
    case KILN_OP_SQRT:
    case KILN_OP_RSQRT:
    case KILN_OP_EXP:
    case KILN_OP_LOG:
    case KILN_OP_LOG1P:
    case KILN_OP_ERF:
    case KILN_OP_COPY:
    case KILN_OP_CLAMP:
    case KILN_OP_COS:
    case KILN_OP_SIN:
    case KILN_OP_ABS:
    case KILN_OP_SIGN:
    case KILN_OP_CEIL:
    case KILN_OP_FLOOR:
    case KILN_OP_ROUND:
    case KILN_OP_TRUNC:
    case KILN_OP_BITWISE_NOT: return infer_unary;
    case KILN_OP_CAST: return infer_cast;
    case KILN_OP_ADD:
    case KILN_OP_SUB:
    case KILN_OP_MUL:
    case KILN_OP_DIV:
    case KILN_OP_POW:
    case KILN_OP_REMAINDER:
    case KILN_OP_FMOD:
    case KILN_OP_FLOOR_DIVIDE:
    case KILN_OP_MAXIMUM:
    case KILN_OP_MINIMUM:
    case KILN_OP_BITWISE_AND:
    case KILN_OP_BITWISE_OR:
    case KILN_OP_BITWISE_XOR: return infer_binary;
    case KILN_OP_EQ:
    case KILN_OP_NE:
    case KILN_OP_LT:
    case KILN_OP_LE:
    case KILN_OP_GT:
    case KILN_OP_GE: return infer_compare;
    case KILN_OP_WHERE: return infer_where;
    case KILN_OP_SOFTMAX:
    case KILN_OP_LOG_SOFTMAX: return infer_softmax;
    case KILN_OP_LAYER_NORM: return infer_layer_norm;
    case KILN_OP_GROUP_NORM: return infer_group_norm;
    case KILN_OP_RMS_NORM: return infer_rms_norm;
    case KILN_OP_ROTARY: return infer_rotary;
    case KILN_OP_UPSAMPLE_NEAREST2D:
    case KILN_OP_UPSAMPLE_BILINEAR2D: return infer_upsample;
    case KILN_OP_GRID_SAMPLE: return infer_grid_sample;
    case KILN_OP_CUMSUM: return infer_cumsum;
    case KILN_OP_ARGMAX: return infer_argmax;
    case KILN_OP_TOPK: return infer_topk;
    case KILN_OP_GATHER_MATMUL: return infer_gather_matmul;
    case KILN_OP_SELECTIVE_SCAN: return infer_selective_scan;
    case KILN_OP_PAD: return infer_pad;
    case KILN_OP_ARANGE: return infer_arange;
    case KILN_OP_INDEX: return infer_index;
    case KILN_OP_GATHER: return infer_gather;
    case KILN_OP_INDEX_COPY: return infer_index_copy;
    case KILN_OP_MAX_POOL2D:
    case KILN_OP_AVG_POOL2D: return infer_pool;
    case KILN_OP_ADAPTIVE_AVG_POOL2D: return infer_adaptive_pool;
    case KILN_OP_MEAN:
    case KILN_OP_SUM:
    case KILN_OP_VECTOR_NORM: return infer_reduce;
    case KILN_OP_RESHAPE: return infer_reshape;
    case KILN_OP_PERMUTE: return infer_permute;
    case KILN_OP_EXPAND: return infer_expand;
    case KILN_OP_CAT: return infer_cat;
    case KILN_OP_SLICE: return infer_slice;
    case KILN_OP_SELECT: return infer_select;
    case KILN_OP_SQUEEZE: return infer_squeeze;
    case KILN_OP_UNSQUEEZE: return infer_unsqueeze;
    case KILN_OP_EMBEDDING: return infer_embedding;
    case KILN_OP_SDPA: return infer_sdpa;
    default: return NULL;
    }
}

// Which inputs the op's dtype_mask applies to (bit i: input i); the rest are checked by the op.
static uint32_t data_inputs_mask(uint32_t op, uint32_t n) {
    switch (op) {
    case KILN_OP_WHERE: return (1u << 1) | (1u << 2);
    case KILN_OP_RESHAPE:
    case KILN_OP_EXPAND:
    case KILN_OP_EMBEDDING:
    case KILN_OP_INDEX:
    case KILN_OP_GATHER: return 1u;        // like: any dtype; indices: checked by the op
    case KILN_OP_INDEX_COPY: return 5u;    // x and src: any dtype; the index: checked by the op
    case KILN_OP_GATHER_MATMUL: return 5u; // w and x; the index: checked by the op
    case KILN_OP_SDPA: return 7u;          // mask: bool or the query dtype
    default: return n >= 32 ? UINT32_MAX : (1u << n) - 1;
    }
}

static kiln_status check_attrs(const ictx *c, const kiln_attrs *a) {
    const kiln_op_def *d = c->def;
    if (d->n_attrs == 0 && (a == NULL || a->n_attrs == 0)) return KILN_OK;
    if (a == NULL || a->n_attrs != d->n_attrs || (a->n_attrs > 0 && a->refs == NULL)) {
        return ifail(c, KILN_ERR_INVALID_ARG, "expected %u attributes (schema of %s), got %u",
                     d->n_attrs, d->name, a == NULL ? 0 : a->n_attrs);
    }
    for (uint32_t i = 0; i < d->n_attrs; i++) {
        const kiln_attr_info *s = &d->attrs[i];
        const kiln_attr_ref *r = &a->refs[i];
        if (r->kind != (uint32_t)s->kind) {
            return ifail(c, KILN_ERR_INVALID_ARG, "attribute '%s' has kind %u; the schema says %s",
                         s->name, r->kind, s->kind == KILN_ATTR_INTS ? "ints" : "floats");
        }
        if (s->count >= 0 ? r->n != (uint32_t)s->count : r->n > KILN_MAX_RANK) {
            return ifail(c, KILN_ERR_INVALID_ARG, "attribute '%s' has %u values; expected %s%d",
                         s->name, r->n, s->count >= 0 ? "" : "at most ",
                         s->count >= 0 ? s->count : KILN_MAX_RANK);
        }
        if (r->n > 0 && (s->kind == KILN_ATTR_INTS ? a->ints == NULL : a->floats == NULL)) {
            return ifail(c, KILN_ERR_INVALID_ARG, "attribute '%s': value pool is NULL", s->name);
        }
    }
    return KILN_OK;
}

static kiln_status check_input_desc(const ictx *c, const kiln_value_desc *d, uint32_t i) {
    if (!kiln_dtype_valid(d->dtype)) {
        return ifail(c, KILN_ERR_INVALID_ARG, "%s has invalid dtype %u", IN(c, i), d->dtype);
    }
    if (d->shape.rank > KILN_MAX_RANK) {
        return ifail(c, KILN_ERR_INVALID_ARG, "%s has rank %u (maximum %d)", IN(c, i),
                     d->shape.rank, KILN_MAX_RANK);
    }
    for (uint32_t j = 0; j < d->shape.rank; j++) {
        if (d->shape.min[j] < 0 || d->shape.min[j] > d->shape.max[j] || d->shape.max[j] > MAXD) {
            return ifail(c, KILN_ERR_INVALID_ARG,
                         "%s dimension %u has range [%" PRId64 ", %" PRId64
                         "] (need 0 <= min <= max <= 2^40)",
                         IN(c, i), j, d->shape.min[j], d->shape.max[j]);
        }
    }
    return KILN_OK;
}

kiln_status kiln_infer(uint32_t op, const kiln_attrs *attrs, const kiln_value_desc *const *inputs,
                       uint32_t n_inputs, const char *what, kiln_value_desc *out) {
    ictx c;
    kiln_value_desc o;
    infer_fn fn;
    uint32_t mask;
    c.op = op;
    c.def = kiln_op_def_get(op);
    c.what = what != NULL ? what : (c.def != NULL ? c.def->name : "?");
    if (out == NULL || (n_inputs > 0 && inputs == NULL)) {
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: kiln_infer: out or inputs is NULL", c.what);
    }
    fn = infer_for(op);
    if (c.def == NULL || fn == NULL) {
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: unknown op id %u", c.what, op);
    }
    if (n_inputs < c.def->min_inputs || n_inputs > c.def->max_inputs) {
        if (c.def->min_inputs == c.def->max_inputs) {
            return ifail(&c, KILN_ERR_INVALID_ARG, "%s takes %u inputs, got %u", c.def->name,
                         c.def->min_inputs, n_inputs);
        }
        return ifail(&c, KILN_ERR_INVALID_ARG, "%s takes %u to %u inputs, got %u", c.def->name,
                     c.def->min_inputs, c.def->max_inputs, n_inputs);
    }
    for (uint32_t i = 0; i < n_inputs; i++) {
        if (inputs[i] == NULL) {
            if (i < 32 && (c.def->optional_mask & (1u << i))) continue;
            return ifail(&c, KILN_ERR_INVALID_ARG, "%s is required but absent", IN(&c, i));
        }
        KILN_TRY(check_input_desc(&c, inputs[i], i));
    }
    KILN_TRY(check_attrs(&c, attrs));
    mask = data_inputs_mask(op, n_inputs);
    for (uint32_t i = 0; i < n_inputs; i++) {
        if (inputs[i] != NULL && i < 32 && (mask & (1u << i))) {
            KILN_TRY(want_dtype_mask(&c, inputs[i], i, c.def->dtype_mask));
        }
    }
    memset(&o, 0, sizeof o);
    o.dtype = inputs[0] != NULL ? inputs[0]->dtype : KILN_DTYPE_INVALID;
    KILN_TRY(fn(&c, attrs, inputs, n_inputs, &o));
    KILN_TRY(out_dims_ok(&c, &o.shape));
    // Canonical form: unused dims are zero (plans and engines compare shapes bytewise).
    for (uint32_t i = o.shape.rank; i < KILN_MAX_RANK; i++) o.shape.min[i] = o.shape.max[i] = 0;
    *out = o;
    return KILN_OK;
}

bool kiln_shape_max_numel(const kiln_shape *s, uint64_t *out) {
    uint64_t n = 1;
    if (s == NULL || s->rank > KILN_MAX_RANK) return false;
    for (uint32_t i = 0; i < s->rank; i++) {
        if (s->max[i] < 0) return false;
        if (!kiln_mul_u64(n, (uint64_t)s->max[i], &n)) return false;
    }
    *out = n;
    return true;
}

void kiln_shape_from_dims(kiln_shape *s, uint32_t rank, const int64_t *dims) {
    memset(s, 0, sizeof *s);
    if (rank > KILN_MAX_RANK) rank = KILN_MAX_RANK;
    s->rank = rank;
    for (uint32_t i = 0; i < rank; i++) s->min[i] = s->max[i] = dims[i];
}
