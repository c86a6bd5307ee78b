// SPDX-License-Identifier: Apache-2.0
// Activations written out as elementwise arithmetic become the one op they compute
// (docs/builder.md). Model code often spells an activation as a formula rather than calling it:
// transformers' NewGELUActivation (GPT-2, GPT-J, CodeGen) is
//     0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))
// eight ops reading x three times, which no tail fusion can take (a tail reads the running
// value once), so each runs as its own pass over the tensor. Other spellings of the same
// function (FastGELU's x * 0.7978845608 * (1 + 0.044715 * x * x), a hand-written swish
// x * sigmoid(x), hard-swish x * clamp(x + 3, 0, 6) / 6) differ in their ops, so the match is
// by value, not by shape:
//
// 1. region: from a sink node, the largest set of elementwise nodes (the unary and binary
//    arithmetic ops below) that reaches back to exactly one variable x, every other operand a
//    float constant of one element, every value of the x's dtype and shape, and every value
//    but the sink read only inside the set and not a graph output;
// 2. value: the region is evaluated in double precision at probe points over [-12, 12] and a
//    few far ones, its constants as stored (so rounded to their dtype), and compared with each
//    candidate activation (relu, gelu erf and tanh, silu, sigmoid, tanh, hardswish,
//    hardsigmoid); the closest one within the tolerance of the graph's dtype (far below one
//    unit in the last place of a float32 result; a fraction of one for float16 and bfloat16,
//    whose intermediate roundings the formula would pay anyway) replaces the sink:
//    act(x), which the fusion pass can then take as a linear's or convolution's tail.
// Probes where the formula overflows (|x| > 12, a non-finite result) are skipped: there the
// activation gives the limit the formula was written for. A region that matches nothing stays
// as it is. The new node takes the sink's emission key; the old nodes lose their readers and
// the dead-code elimination that follows removes them.
#include <math.h>

#include "builder/builder.h"
#include "core/dtype.h"
#include "core/status.h"

#define ACT_MAX_NODES 24
#define ACT_N_PROBES 257

// The value of a float constant with one element (any rank), or 0 when v is not one.
static int scalar_const(const kiln_bgraph *b, int32_t v, double *out) {
    uint64_t numel;
    if (!kiln_bgraph_is_const(b, v)) return 0;
    const kiln_bvalue *c = &b->values[v];
    if (!kiln_dtype_is_float((kiln_dtype)c->desc.dtype) ||
        !kiln_shape_max_numel(&c->desc.shape, &numel) || numel != 1 ||
        c->nbytes != kiln_dtype_size((kiln_dtype)c->desc.dtype)) {
        return 0;
    }
    *out = (double)kiln_load_f32(c->data, c->desc.dtype, 0);
    return 1;
}

static int arith_op(uint32_t op) {
    switch (op) {
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
    case KILN_OP_CLAMP:
    case KILN_OP_COS:
    case KILN_OP_SIN:
    case KILN_OP_COPY:
    case KILN_OP_ADD:
    case KILN_OP_SUB:
    case KILN_OP_MUL:
    case KILN_OP_DIV:
    case KILN_OP_POW: return 1;
    default: return 0;
    }
}

typedef struct act_region {
    uint32_t nodes[ACT_MAX_NODES]; // ascending node index (a topological order)
    uint32_t n;
    int32_t x; // the one variable
} act_region;

static int in_list(const uint32_t *list, uint32_t n, uint32_t v) {
    for (uint32_t i = 0; i < n; i++) {
        if (list[i] == v) return 1;
    }
    return 0;
}

// The node producing v when it may join a region (live, elementwise arithmetic, not fused, of
// desc *d, not a cut), else -1.
static int32_t joinable(const kiln_bgraph *b, int32_t v, const kiln_value_desc *d,
                        const uint32_t *cuts, uint32_t n_cuts) {
    if (v < 0 || b->values[v].kind != KILN_IR_NODE || in_list(cuts, n_cuts, (uint32_t)v)) {
        return -1;
    }
    const kiln_bnode *n = &b->nodes[b->values[v].index];
    if (n->dead || !arith_op(n->op) || n->n_tail > 0 || n->head >= 0) return -1;
    if (!kiln_desc_equal(&b->values[v].desc, d)) return -1;
    return (int32_t)b->values[v].index;
}

// Grows the region of `sink` back to its leaves, not through the values in cuts. 0 when it is
// too large or reads more than one variable.
static int grow(const kiln_bgraph *b, uint32_t sink, const uint32_t *cuts, uint32_t n_cuts,
                act_region *r) {
    const kiln_value_desc *d = &b->values[b->nodes[sink].output].desc;
    uint32_t stack[ACT_MAX_NODES], sp = 0;
    if (!kiln_dtype_is_float((kiln_dtype)d->dtype)) return 0; // integer arithmetic: not ours
    r->n = 0;
    r->x = -1;
    stack[sp++] = sink;
    r->nodes[r->n++] = sink;
    while (sp > 0) {
        const kiln_bnode *n = &b->nodes[stack[--sp]];
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            int32_t v = kiln_bgraph_input(b, n, i);
            double c;
            if (v < 0 || scalar_const(b, v, &c)) continue;
            int32_t p = joinable(b, v, d, cuts, n_cuts);
            if (p >= 0) {
                if (in_list(r->nodes, r->n, (uint32_t)p)) continue;
                if (r->n == ACT_MAX_NODES) return 0;
                r->nodes[r->n++] = (uint32_t)p;
                stack[sp++] = (uint32_t)p;
                continue;
            }
            if (r->x >= 0 && r->x != v) return 0;
            r->x = v;
        }
    }
    if (r->x < 0 || !kiln_desc_equal(&b->values[r->x].desc, d)) return 0;
    for (uint32_t i = 1; i < r->n; i++) { // insertion sort: ascending index
        uint32_t t = r->nodes[i], j = i;
        while (j > 0 && r->nodes[j - 1] > t) {
            r->nodes[j] = r->nodes[j - 1];
            j--;
        }
        r->nodes[j] = t;
    }
    return 1;
}

// The first value of the region (not the sink) read outside it or marked an output, or -1.
static int32_t leaks(const kiln_bgraph *b, uint32_t sink, const act_region *r) {
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->nodes[i] == sink) continue;
        int32_t v = b->nodes[r->nodes[i]].output;
        uint32_t inside = 0;
        for (uint32_t k = 0; k < r->n; k++) {
            const kiln_bnode *n = &b->nodes[r->nodes[k]];
            for (uint32_t j = 0; j < n->n_inputs; j++) inside += kiln_bgraph_input(b, n, j) == v;
        }
        if (b->is_output[v] || b->uses[v] != inside) return v;
    }
    return -1;
}

static double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_tanh(double x) {
    return 0.5 * x *
           (1.0 + tanh(0.79788456080286535588 /* sqrt(2 / pi) */ * (x + 0.044715 * x * x * x)));
}
static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double hardsigmoid(double x) { return fmin(fmax(x + 3.0, 0.0), 6.0) / 6.0; }

// One node of the region at one point; its inputs are x, scalar constants or earlier values.
static double eval_node(const kiln_bgraph *b, const kiln_bnode *n, const double *in) {
    double a = in[0], c = n->n_inputs > 1 ? in[1] : 0.0;
    kiln_attrs at = kiln_bgraph_attrs(b, n);
    switch (n->op) {
    case KILN_OP_RELU: return a > 0.0 ? a : 0.0;
    case KILN_OP_GELU:
        return kiln_attrs_int(&at, KILN_A_GELU_APPROXIMATE, 0) ? gelu_tanh(a) : gelu_erf(a);
    case KILN_OP_SILU: return a * sigmoid(a);
    case KILN_OP_SIGMOID: return sigmoid(a);
    case KILN_OP_TANH: return tanh(a);
    case KILN_OP_HARDSWISH: return a * hardsigmoid(a);
    case KILN_OP_HARDSIGMOID: return hardsigmoid(a);
    case KILN_OP_NEG: return -a;
    case KILN_OP_SQRT: return sqrt(a);
    case KILN_OP_RSQRT: return 1.0 / sqrt(a);
    case KILN_OP_EXP: return exp(a);
    case KILN_OP_LOG: return log(a);
    case KILN_OP_LOG1P: return log1p(a);
    case KILN_OP_ERF: return erf(a);
    case KILN_OP_CLAMP: {
        double lo = kiln_attrs_float(&at, KILN_A_CLAMP_MIN, 0);
        double hi = kiln_attrs_float(&at, KILN_A_CLAMP_MAX, 0);
        if (isnan(a)) return a;
        if (!isnan(lo) && a < lo) a = lo;
        if (!isnan(hi) && a > hi) a = hi;
        return a;
    }
    case KILN_OP_COS: return cos(a);
    case KILN_OP_SIN: return sin(a);
    case KILN_OP_COPY: return a;
    case KILN_OP_ADD: return a + c;
    case KILN_OP_SUB: return a - c;
    case KILN_OP_MUL: return a * c;
    case KILN_OP_DIV: return a / c;
    case KILN_OP_POW: return pow(a, c);
    default: return NAN;
    }
}

// The region's result at x (its values in vals, indexed like r->nodes).
static double eval_region(const kiln_bgraph *b, const act_region *r, double x, double *vals) {
    for (uint32_t i = 0; i < r->n; i++) {
        const kiln_bnode *n = &b->nodes[r->nodes[i]];
        double in[2] = {0.0, 0.0};
        for (uint32_t j = 0; j < n->n_inputs && j < 2; j++) {
            int32_t v = kiln_bgraph_input(b, n, j);
            double c = 0.0;
            if (v == r->x) {
                in[j] = x;
            } else if (scalar_const(b, v, &c)) {
                in[j] = c;
            } else {
                for (uint32_t k = 0; k < i; k++) {
                    if (b->nodes[r->nodes[k]].output == v) in[j] = vals[k];
                }
            }
        }
        vals[i] = eval_node(b, n, in);
    }
    return vals[r->n - 1];
}

typedef struct act_candidate {
    uint32_t op;
    int64_t approximate; // gelu only
    double (*f)(double);
} act_candidate;

static double relu_f(double x) { return x > 0.0 ? x : 0.0; }
static double silu_f(double x) { return x * sigmoid(x); }
static double hardswish_f(double x) { return x * hardsigmoid(x); }

static const act_candidate CANDIDATES[] = {
    {KILN_OP_RELU, 0, relu_f},           {KILN_OP_GELU, 0, gelu_erf},
    {KILN_OP_GELU, 1, gelu_tanh},        {KILN_OP_SILU, 0, silu_f},
    {KILN_OP_SIGMOID, 0, sigmoid},       {KILN_OP_TANH, 0, tanh},
    {KILN_OP_HARDSWISH, 0, hardswish_f}, {KILN_OP_HARDSIGMOID, 0, hardsigmoid},
};
#define N_CANDIDATES (sizeof CANDIDATES / sizeof CANDIDATES[0])

static double probe(uint32_t i) {
    static const double far[] = {-1000.0, -100.0, -30.0, -15.0, 15.0, 30.0, 100.0, 1000.0};
    if (i < 8) return far[i];
    return -12.0 + 24.0 * (double)(i - 8) / (double)(ACT_N_PROBES - 9);
}

// The tolerance of a match, relative to 1 + |f(x)|, for results of dtype dt.
static double tolerance(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_F16: return 1.0 / 4096.0;
    case KILN_DTYPE_BF16: return 1.0 / 512.0;
    default: return 1e-6;
    }
}

// The candidate the region computes (index into CANDIDATES), or -1.
static int match(const kiln_bgraph *b, const act_region *r) {
    double vals[ACT_MAX_NODES], worst[N_CANDIDATES];
    double tol = tolerance(b->values[r->x].desc.dtype);
    for (uint32_t k = 0; k < N_CANDIDATES; k++) worst[k] = 0.0;
    for (uint32_t i = 0; i < ACT_N_PROBES; i++) {
        double x = probe(i), y = eval_region(b, r, x, vals);
        if (!isfinite(y)) {
            if (fabs(x) > 12.0) continue;
            return -1;
        }
        for (uint32_t k = 0; k < N_CANDIDATES; k++) {
            double want = CANDIDATES[k].f(x), e = fabs(y - want) / (1.0 + fabs(want));
            if (!(e <= worst[k])) worst[k] = isnan(e) ? INFINITY : e;
        }
    }
    int best = -1;
    for (uint32_t k = 0; k < N_CANDIDATES; k++) {
        if (worst[k] <= tol && (best < 0 || worst[k] < worst[best])) best = (int)k;
    }
    return best;
}

static kiln_status try_sink(kiln_bgraph *b, uint32_t sink, int *done) {
    uint32_t cuts[ACT_MAX_NODES], n_cuts = 0;
    act_region r;
    *done = 0;
    for (;;) {
        if (!grow(b, sink, cuts, n_cuts, &r) || r.n < 2) return KILN_OK;
        int32_t v = leaks(b, sink, &r);
        if (v < 0) break;
        if (n_cuts == ACT_MAX_NODES) return KILN_OK;
        cuts[n_cuts++] = (uint32_t)v; // read elsewhere: a leaf, not part of the formula
    }
    int k = match(b, &r);
    if (k < 0) return KILN_OK;
    const act_candidate *c = &CANDIDATES[k];
    kiln_attr_ref ref;
    int64_t approx = c->approximate;
    kiln_attrs attrs = {NULL, 0, &approx, NULL};
    if (c->op == KILN_OP_GELU) {
        ref.kind = KILN_ATTR_INTS;
        ref.n = 1;
        ref.begin = 0;
        attrs.refs = &ref;
        attrs.n_attrs = 1;
    }
    int32_t y;
    KILN_TRY(kiln_bgraph_add_node(b, c->op, &r.x, 1, &attrs, b->nodes[sink].seq, &y));
    if (!kiln_desc_equal(&b->values[y].desc, &b->values[b->nodes[sink].output].desc)) {
        b->nodes[b->values[y].index].dead = 1;
        return KILN_OK;
    }
    KILN_TRY(kiln_bgraph_replace_node(b, sink, y, "activation"));
    *done = 1;
    return KILN_OK;
}

kiln_status kiln_pass_act(kiln_bgraph *b) {
    int changed = 0;
    KILN_TRY(kiln_bgraph_count_uses(b));
    // Last node first: the widest formula is met at its sink before any part of it.
    for (size_t i = b->n_nodes; i-- > 0;) {
        int done = 0;
        if (b->nodes[i].dead || !arith_op(b->nodes[i].op)) continue;
        int32_t out = b->nodes[i].output;
        if ((size_t)out >= b->n_use_info) continue;            // added by this pass
        if (b->uses[out] == 0 && !b->is_output[out]) continue; // inside a formula replaced
        KILN_TRY(try_sink(b, (uint32_t)i, &done));
        if (!done) continue;
        changed = 1;
        b->stats.n_act++;
        KILN_TRY(kiln_bgraph_count_uses(b));
    }
    if (changed) KILN_TRY(kiln_bgraph_sort_nodes(b));
    return KILN_OK;
}
