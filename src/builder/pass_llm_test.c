// SPDX-License-Identifier: Apache-2.0
// LLM patterns (pass_llm.c): LlamaRMSNorm, F.normalize and transformers' rotate-half and
// rotate-every-two (interleaved) rotary chains built op by op as an exported decoder spells them
// become one rms_norm / rotary layer (operands in either order, with and without the casts, without
// a weight, Gemma's folded 1 + w, 16-bit models), the chains that differ (mean over another dim,
// pow 4, an intermediate read twice, slices that are not the halves, the cat in the other order)
// stay as they are, and every engine computes what the unoptimized one does (the unfused ops on the
// CPU backend, random inputs). Under bf16 the rotary reads float32 position-math cos/sin tables as
// they are.
#include "builder/builder_test_util.h"

#define D 20 // not a multiple of 8
#define EPS 1e-5

static kiln_build_options o0, o1, o1_bf16;

// --- rms_norm

enum {
    R_SWAP_MUL = 1 << 0,    // mul(rsqrt, x)
    R_SWAP_ADD = 1 << 1,    // add(eps, mean)
    R_SWAP_W = 1 << 2,      // mul(w, h)
    R_CASTS = 1 << 3,       // cast(x -> f32) and cast(h -> f32): no-ops in a float32 graph
    R_NO_WEIGHT = 1 << 4,   // no final mul
    R_GEMMA = 1 << 5,       // weight = 1 + w (two constants folded first), weight [1, 1, D]
    R_BF16 = 1 << 6,        // a bfloat16 model: x and w bf16, the statistics in float32
    R_MEAN_DIM1 = 1 << 7,   // negative: mean over dim 1
    R_POW4 = 1 << 8,        // negative: pow(x, 4)
    R_READ_TWICE = 1 << 9,  // negative: the rsqrt is also an output
    R_NO_KEEPDIM = 1 << 10, // negative: mean without keepdim (broadcasts differently)
    R_T5 = 1 << 11,         // T5LayerNorm: x.f32 squared, x cast again for the product
    R_T5_READ = 1 << 12     // negative: T5's second cast is also an output
};

static int32_t cast_to(kiln_graph *g, int32_t v, kiln_dtype dt) {
    return tu_node(g, KILN_OP_CAST, TU_IDS(v), TU_ATTRS(TU_INTS("dtype", dt)));
}

// x [2, 3, D] (or [3, D] for R_NO_KEEPDIM, whose mean then broadcasts along rows) -> y
static kiln_graph *rms_graph(int f, float *wdata) {
    kiln_graph *g;
    kiln_dtype dt = (f & R_BF16) ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
    float one = 1.0f, eps = (float)EPS, ex = (f & R_POW4) ? 4.0f : 2.0f;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", dt, 3, TU_DIMS(2, 3, D), TU_DIMS(2, 3, D)), h;
    if ((f & R_CASTS) || (f & R_BF16))
        h = cast_to(g, x, KILN_DTYPE_F32);
    else
        h = x;
    int32_t two = tu_const(g, "two", KILN_DTYPE_F32, 0, NULL, &ex);
    int32_t e = tu_const(g, "eps", KILN_DTYPE_F32, 1, TU_DIMS(1), &eps);
    int32_t p = tu_node(g, KILN_OP_POW, TU_IDS(h, two), TU_NO_ATTRS);
    int32_t m = tu_node(g, KILN_OP_MEAN, TU_IDS(p),
                        TU_ATTRS(TU_INTS("dims", (f & R_MEAN_DIM1) ? 1 : -1),
                                 TU_INTS("keepdim", (f & R_NO_KEEPDIM) ? 0 : 1)));
    if (f & R_NO_KEEPDIM) m = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(m), TU_ATTRS(TU_INTS("dim", 2)));
    int32_t a = (f & R_SWAP_ADD) ? tu_node(g, KILN_OP_ADD, TU_IDS(e, m), TU_NO_ATTRS)
                                 : tu_node(g, KILN_OP_ADD, TU_IDS(m, e), TU_NO_ATTRS);
    int32_t r = tu_node(g, KILN_OP_RSQRT, TU_IDS(a), TU_NO_ATTRS);
    if (f & (R_T5 | R_T5_READ)) h = cast_to(g, x, KILN_DTYPE_F32);
    if (f & R_T5_READ) tu_output(g, h, "xf");
    int32_t y = (f & R_SWAP_MUL) ? tu_node(g, KILN_OP_MUL, TU_IDS(r, h), TU_NO_ATTRS)
                                 : tu_node(g, KILN_OP_MUL, TU_IDS(h, r), TU_NO_ATTRS);
    if (f & R_BF16)
        y = cast_to(g, y, KILN_DTYPE_BF16);
    else if (f & R_CASTS)
        y = cast_to(g, y, KILN_DTYPE_F32);
    if (!(f & R_NO_WEIGHT)) {
        int32_t w;
        if (f & R_GEMMA) {
            int32_t c1 = tu_const(g, "one", dt, 0, NULL, &one);
            int32_t wr = tu_const(g, "w", dt, 3, TU_DIMS(1, 1, D), wdata);
            w = tu_node(g, KILN_OP_ADD, TU_IDS(c1, wr), TU_NO_ATTRS);
        } else {
            w = tu_const(g, "w", dt, 1, TU_DIMS(D), wdata);
        }
        y = (f & R_SWAP_W) ? tu_node(g, KILN_OP_MUL, TU_IDS(w, y), TU_NO_ATTRS)
                           : tu_node(g, KILN_OP_MUL, TU_IDS(y, w), TU_NO_ATTRS);
    }
    tu_output(g, y, "y");
    if (f & R_READ_TWICE) tu_output(g, r, "r");
    return g;
}

static void test_rms(int f, const char *want_layers, const char *what) {
    float *w = tu_rand(D, 0.5f, 1.5f);
    kiln_graph *g = rms_graph(f, w);
    kiln_plan p;
    kiln_build_stats st;
    if (bt_plan(g, &o1, &p)) {
        char buf[512];
        bt_layers(&p, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, want_layers) == 0, "%s: layers '%s', expected '%s'", what, buf,
                  want_layers);
        kiln_plan_release(&p);
    }
    memset(&st, 0, sizeof st);
    if (kiln_build_plan(g, &o1, &p, &st) == KILN_OK) {
        int fused = strstr(want_layers, "rms_norm") != NULL;
        CHECK_MSG(st.n_rms_norm == (uint32_t)fused, "%s: %u rms norms counted", what,
                  st.n_rms_norm);
        kiln_plan_release(&p);
    }
    bt_shape s[1] = {{3, {2, 3, D}}};
    int bf = (f & R_BF16) != 0;
    // against the unfused ops (optimize off); a bf16 model rounds differently (once vs twice)
    bt_compare(g, &o0, &o1, 1, s, 0, bf ? 2e-2 : 1e-5, bf ? 2e-2 : 1e-5, what);
    if (!bf) bt_compare(g, &o0, &o1_bf16, 1, s, 0, 3e-2, 3e-2, what);
    kiln_graph_free(g);
    free(w);
}

// The fused op against a direct double computation, so that both engines of bt_compare cannot
// share a mistake: y = x / sqrt(mean(x^2) + eps) * w.
static void test_rms_values(void) {
    float *w = tu_rand(D, 0.5f, 1.5f), *x = tu_rand(2 * 3 * D, -2.0f, 2.0f);
    kiln_graph *g = rms_graph(R_SWAP_MUL | R_CASTS, w);
    kiln_built *b = NULL;
    bt_outputs out;
    CHECK_OK(kiln_build(g, &o1, &b));
    bt_shape s[1] = {{3, {2, 3, D}}};
    void *in[1] = {x};
    if (b != NULL && bt_run(b, 1, s, in, &out)) {
        float ref[2 * 3 * D];
        for (int r = 0; r < 6; r++) {
            double sq = 0;
            for (int i = 0; i < D; i++) sq += (double)x[r * D + i] * x[r * D + i];
            double rs = 1.0 / sqrt(sq / D + EPS);
            for (int i = 0; i < D; i++) ref[r * D + i] = (float)(x[r * D + i] * rs * w[i]);
        }
        tu_check_close("rms_norm values", out.data[0], ref, 6 * D, 1e-5, 1e-5);
        bt_outputs_free(&out);
    }
    kiln_built_free(b);
    kiln_graph_free(g);
    free(w);
    free(x);
}

// --- L2 normalization

enum {
    L_SQRT = 1 << 0,      // sqrt(s) instead of pow(s, 0.5)
    L_NO_CLAMP = 1 << 1,  // x / x.norm(dim=-1, keepdim=True)
    L_EXPAND = 1 << 2,    // the denominator expanded to x's shape first (F.normalize's expand_as)
    L_BF16 = 1 << 3,      // a bfloat16 model
    L_SUM_DIM1 = 1 << 4,  // negative: the sum over dim 1
    L_POW4 = 1 << 5,      // negative: pow(x, 4)
    L_CLAMP_MAX = 1 << 6, // negative: a clamp with a max
    L_TINY_EPS = 1 << 7,  // negative: eps 1e-30 (its square is not a float32 normal)
    L_OTHER_X = 1 << 8,   // negative: y's norm divides x
    L_UPCAST = 1 << 9     // a float16 x, its norm in float32 between casts (a half() model)
};

// x [2, 3, D] -> x / max(|x|, eps) over the last dim (F.normalize)
static kiln_graph *l2_graph(int f) {
    kiln_graph *g;
    kiln_dtype dt = (f & L_BF16)     ? KILN_DTYPE_BF16
                    : (f & L_UPCAST) ? KILN_DTYPE_F16
                                     : KILN_DTYPE_F32;
    kiln_dtype nt = (f & L_UPCAST) ? KILN_DTYPE_F32 : dt; // the norm's dtype
    float ex = (f & L_POW4) ? 4.0f : 2.0f, half = 0.5f;
    double eps = (f & L_TINY_EPS) ? 1e-30 : 1e-12;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", dt, 3, TU_DIMS(2, 3, D), TU_DIMS(2, 3, D)), xn = x;
    if (f & L_OTHER_X) xn = tu_input(g, "y", dt, 3, TU_DIMS(2, 3, D), TU_DIMS(2, 3, D));
    int32_t two = tu_const(g, "two", nt, 0, NULL, &ex);
    if (f & L_UPCAST) xn = tu_node(g, KILN_OP_CAST, TU_IDS(xn), TU_ATTRS(TU_INTS("dtype", nt)));
    int32_t p = tu_node(g, KILN_OP_POW, TU_IDS(xn, two), TU_NO_ATTRS);
    int32_t s =
        tu_node(g, KILN_OP_SUM, TU_IDS(p),
                TU_ATTRS(TU_INTS("dims", (f & L_SUM_DIM1) ? 1 : -1), TU_INTS("keepdim", 1)));
    int32_t n;
    if (f & L_SQRT) {
        n = tu_node(g, KILN_OP_SQRT, TU_IDS(s), TU_NO_ATTRS);
    } else {
        int32_t h = tu_const(g, "half", nt, 0, NULL, &half);
        n = tu_node(g, KILN_OP_POW, TU_IDS(s, h), TU_NO_ATTRS);
    }
    if (f & L_UPCAST) n = tu_node(g, KILN_OP_CAST, TU_IDS(n), TU_ATTRS(TU_INTS("dtype", dt)));
    if (f & L_CLAMP_MAX) {
        n = tu_node(g, KILN_OP_CLAMP, TU_IDS(n),
                    TU_ATTRS(TU_FLOATS("min", eps), TU_FLOATS("max", 10.0)));
    } else if (!(f & L_NO_CLAMP)) {
        n = tu_node(g, KILN_OP_CLAMP, TU_IDS(n), TU_ATTRS(TU_FLOATS("min", eps)));
    }
    if (f & L_EXPAND)
        n = tu_node(g, KILN_OP_EXPAND, TU_IDS(n), TU_ATTRS(TU_INTS("shape", 2, 3, D)));
    tu_output(g, tu_node(g, KILN_OP_DIV, TU_IDS(x, n), TU_NO_ATTRS), "out");
    return g;
}

static void test_l2(int f, int want, const char *what) {
    kiln_graph *g = l2_graph(f);
    kiln_plan p;
    kiln_build_stats st;
    memset(&st, 0, sizeof st);
    if (kiln_build_plan(g, &o1, &p, &st) == KILN_OK) {
        CHECK_MSG(st.n_l2_normalize == (uint32_t)want, "%s: %u l2 normalizations", what,
                  st.n_l2_normalize);
        CHECK_MSG((bt_count(&p, KILN_OP_RMS_NORM) == 1) == want &&
                      p.n_layers == (want ? 1u : p.n_layers),
                  "%s: %u layers, %u rms_norm", what, p.n_layers, bt_count(&p, KILN_OP_RMS_NORM));
        kiln_plan_release(&p);
    } else {
        CHECK_MSG(0, "%s: build: %s", what, kiln_last_error());
    }
    bt_shape s[2] = {{3, {2, 3, D}}, {3, {2, 3, D}}};
    int bf = (f & (L_BF16 | L_UPCAST)) != 0;
    bt_compare(g, &o0, &o1, (f & L_OTHER_X) ? 2 : 1, s, 0, bf ? 2e-2 : 1e-5, bf ? 2e-2 : 1e-5,
               what);
    kiln_graph_free(g);
}

// Against a direct double computation of x / max(|x|, eps), a row of zeros included (zeros out,
// not NaN), so that the two engines of bt_compare cannot share a mistake.
static void test_l2_values(void) {
    float *x = tu_rand(2 * 3 * D, -2.0f, 2.0f);
    for (int i = 0; i < D; i++) x[4 * D + i] = 0.0f;
    kiln_graph *g = l2_graph(L_EXPAND);
    kiln_built *b = NULL;
    bt_outputs out;
    CHECK_OK(kiln_build(g, &o1, &b));
    bt_shape s[1] = {{3, {2, 3, D}}};
    void *in[1] = {x};
    if (b != NULL && bt_run(b, 1, s, in, &out)) {
        float ref[2 * 3 * D];
        for (int r = 0; r < 6; r++) {
            double sq = 0;
            for (int i = 0; i < D; i++) sq += (double)x[r * D + i] * x[r * D + i];
            double nrm = fmax(sqrt(sq), 1e-12);
            for (int i = 0; i < D; i++) ref[r * D + i] = (float)(x[r * D + i] / nrm);
        }
        tu_check_close("l2 normalize values", out.data[0], ref, 6 * D, 1e-6, 1e-5);
        bt_outputs_free(&out);
    }
    kiln_built_free(b);
    kiln_graph_free(g);
    free(x);
}

// --- the 2-norm

enum {
    V_MUL = 1 << 0,      // x * x instead of pow(x, 2)
    V_SQRT = 1 << 1,     // sqrt(s) instead of pow(s, 0.5)
    V_LAST = 1 << 2,     // over the last dim, without keepdim (linalg.vector_norm(x, dim=-1))
    V_BF16 = 1 << 3,     // a bfloat16 model
    V_POW4 = 1 << 4,     // negative: pow(x, 4)
    V_ROOT3 = 1 << 5,    // negative: pow(s, 1/3)
    V_SUM_OUT = 1 << 6,  // negative: the sum is also an output
    V_MUL_OTHER = 1 << 7 // negative: x * (x * c), c > 0 a constant of D elements
};

// x [2, 5, 6, D] -> its 2-norm over H and W, keepdim (ConvNeXt-V2's global response norm), or
// over the last dim
static kiln_graph *vnorm_graph(int f) {
    kiln_graph *g;
    kiln_dtype dt = (f & V_BF16) ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
    float ex = (f & V_POW4) ? 4.0f : 2.0f, root = (f & V_ROOT3) ? 1.0f / 3.0f : 0.5f;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x = tu_input(g, "x", dt, 4, TU_DIMS(2, 5, 6, D), TU_DIMS(2, 5, 6, D)), sq;
    if (f & (V_MUL | V_MUL_OTHER)) {
        int32_t y = x;
        if (f & V_MUL_OTHER) {
            float cv[D];
            for (int i = 0; i < D; i++) cv[i] = 0.5f + (float)i / D;
            y = tu_node(g, KILN_OP_MUL, TU_IDS(x, tu_const(g, "c", dt, 1, TU_DIMS(D), cv)),
                        TU_NO_ATTRS);
        }
        sq = tu_node(g, KILN_OP_MUL, TU_IDS(x, y), TU_NO_ATTRS);
    } else {
        int32_t two = tu_const(g, "two", dt, 0, NULL, &ex);
        sq = tu_node(g, KILN_OP_POW, TU_IDS(x, two), TU_NO_ATTRS);
    }
    int32_t s = (f & V_LAST) ? tu_node(g, KILN_OP_SUM, TU_IDS(sq),
                                       TU_ATTRS(TU_INTS("dims", -1), TU_INTS("keepdim", 0)))
                             : tu_node(g, KILN_OP_SUM, TU_IDS(sq),
                                       TU_ATTRS(TU_INTS("dims", 1, 2), TU_INTS("keepdim", 1)));
    int32_t n;
    if (f & V_SQRT) {
        n = tu_node(g, KILN_OP_SQRT, TU_IDS(s), TU_NO_ATTRS);
    } else {
        int32_t h = tu_const(g, "root", dt, 0, NULL, &root);
        n = tu_node(g, KILN_OP_POW, TU_IDS(s, h), TU_NO_ATTRS);
    }
    tu_output(g, n, "out");
    if (f & V_SUM_OUT) tu_output(g, s, "sum");
    return g;
}

static void test_vnorm(int f, int want, const char *what) {
    kiln_graph *g = vnorm_graph(f);
    kiln_plan p;
    kiln_build_stats st;
    memset(&st, 0, sizeof st);
    if (kiln_build_plan(g, &o1, &p, &st) == KILN_OK) {
        CHECK_MSG(st.n_vector_norm == (uint32_t)want, "%s: %u vector norms", what,
                  st.n_vector_norm);
        CHECK_MSG((bt_count(&p, KILN_OP_VECTOR_NORM) == 1) == want &&
                      p.n_layers == (want ? 1u : p.n_layers),
                  "%s: %u layers, %u vector_norm", what, p.n_layers,
                  bt_count(&p, KILN_OP_VECTOR_NORM));
        kiln_plan_release(&p);
    } else {
        CHECK_MSG(0, "%s: build: %s", what, kiln_last_error());
    }
    bt_shape s[1] = {{4, {2, 5, 6, D}}};
    int bf = (f & V_BF16) != 0;
    bt_compare(g, &o0, &o1, 1, s, 0, bf ? 2e-2 : 1e-5, bf ? 2e-2 : 1e-5, what);
    kiln_graph_free(g);
}

// Against a direct double computation of sqrt(sum over H, W of x^2), so that the two engines of
// bt_compare cannot share a mistake.
static void test_vnorm_values(void) {
    const int64_t n = 2 * 5 * 6 * D;
    float *x = tu_rand(n, -2.0f, 2.0f);
    kiln_graph *g = vnorm_graph(V_MUL);
    kiln_built *b = NULL;
    bt_outputs out;
    CHECK_OK(kiln_build(g, &o1, &b));
    bt_shape s[1] = {{4, {2, 5, 6, D}}};
    void *in[1] = {x};
    if (b != NULL && bt_run(b, 1, s, in, &out)) {
        float ref[2 * D];
        for (int i = 0; i < 2; i++) {
            for (int c = 0; c < D; c++) {
                double sq = 0;
                for (int hw = 0; hw < 30; hw++) {
                    const double v = x[((int64_t)i * 30 + hw) * D + c];
                    sq += v * v;
                }
                ref[i * D + c] = (float)sqrt(sq);
            }
        }
        tu_check_close("vector norm values", out.data[0], ref, 2 * D, 1e-6, 1e-5);
        bt_outputs_free(&out);
    }
    kiln_built_free(b);
    kiln_graph_free(g);
    free(x);
}

// --- rotary

#define RH 3
#define RL 4
#define RD 10

enum {
    T_SWAP_ADD = 1 << 0,   // add(rot * sin, x * cos)
    T_SWAP_COS = 1 << 1,   // mul(cos, x)
    T_SWAP_SIN = 1 << 2,   // mul(sin, cat)
    T_NOT_HALF = 1 << 3,   // negative: slices [0, 2) and [2, D)
    T_CAT_ORDER = 1 << 4,  // negative: cat(x1, -x2)
    T_READ_TWICE = 1 << 5, // negative: the neg is also an output
    T_POSITIONS = 1 << 6,  // cos/sin computed from int64 positions (position math)
    T_NEG_IDX = 1 << 7,    // slices with negative / clamped bounds: [-D/2, INT64_MAX), [0, D/2)
    T_PAIRS = 1 << 8,      // rotate_every_two: stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    T_NEG_AFTER = 1 << 9,  // pairs: the neg after its unsqueeze
    T_UNSQ = 1 << 10,      // pairs: unsqueeze ops instead of reshapes
    T_PAIRS_STEP1 = 1 << 11, // negative (pairs): slices of step 1
    T_PAIRS_DIM = 1 << 12    // negative (pairs): the dim of 1 in front, [.., 1, D/2]
};

// x [2, RH, RL, n] viewed as [2, RH, RL, n, 1] (or [2, RH, RL, 1, n] with T_PAIRS_DIM)
static int32_t unsq(kiln_graph *g, int f, int32_t x, int64_t n) {
    if (f & T_UNSQ) return tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(x), TU_ATTRS(TU_INTS("dim", -1)));
    if (f & T_PAIRS_DIM)
        return tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", 2, RH, RL, 1, n)));
    return tu_node(g, KILN_OP_RESHAPE, TU_IDS(x), TU_ATTRS(TU_INTS("shape", 2, RH, RL, n, 1)));
}

// rotate_every_two(x) for x [2, RH, RL, n]: y[2i] = -x[2i + 1], y[2i + 1] = x[2i]
static int32_t rotate_pairs(kiln_graph *g, int f, int32_t x, int64_t n, int32_t *negv) {
    const int64_t step = (f & T_PAIRS_STEP1) ? 1 : 2, h = n / 2;
    int32_t x1 =
        tu_node(g, KILN_OP_SLICE, TU_IDS(x),
                TU_ATTRS(TU_INTS("dim", -1), TU_INTS("start", 0),
                         TU_INTS("end", step == 2 ? INT64_MAX : h), TU_INTS("step", step)));
    int32_t x2 = tu_node(g, KILN_OP_SLICE, TU_IDS(x),
                         TU_ATTRS(TU_INTS("dim", 3), TU_INTS("start", step == 2 ? 1 : h),
                                  TU_INTS("end", n), TU_INTS("step", step)));
    int32_t u0;
    if (f & T_NEG_AFTER) {
        u0 = tu_node(g, KILN_OP_NEG, TU_IDS(unsq(g, f, x2, h)), TU_NO_ATTRS);
    } else {
        u0 = unsq(g, f, tu_node(g, KILN_OP_NEG, TU_IDS(x2), TU_NO_ATTRS), h);
    }
    *negv = u0;
    int32_t cat = tu_node(g, KILN_OP_CAT, TU_IDS(u0, unsq(g, f, x1, h)),
                          TU_ATTRS(TU_INTS("dim", (f & T_PAIRS_DIM) ? 3 : -1)));
    return tu_node(g, KILN_OP_RESHAPE, TU_IDS(cat), TU_ATTRS(TU_INTS("shape", 2, RH, RL, n)));
}

// q * cos + rotate_half(q) * sin for q [2, RH, RL, RD] and cos/sin [2, 1, RL, RD]
static int32_t rope(kiln_graph *g, int f, int32_t x, int32_t cos, int32_t sin, int32_t *negv) {
    int64_t h = RD / 2, cut = (f & T_NOT_HALF) ? 2 : h;
    int32_t c = (f & T_SWAP_COS) ? tu_node(g, KILN_OP_MUL, TU_IDS(cos, x), TU_NO_ATTRS)
                                 : tu_node(g, KILN_OP_MUL, TU_IDS(x, cos), TU_NO_ATTRS);
    if (f & T_PAIRS) {
        int32_t rp = rotate_pairs(g, f, x, RD, negv);
        int32_t s = (f & T_SWAP_SIN) ? tu_node(g, KILN_OP_MUL, TU_IDS(sin, rp), TU_NO_ATTRS)
                                     : tu_node(g, KILN_OP_MUL, TU_IDS(rp, sin), TU_NO_ATTRS);
        return (f & T_SWAP_ADD) ? tu_node(g, KILN_OP_ADD, TU_IDS(s, c), TU_NO_ATTRS)
                                : tu_node(g, KILN_OP_ADD, TU_IDS(c, s), TU_NO_ATTRS);
    }
    int32_t x2 =
        (f & T_NEG_IDX)
            ? tu_node(g, KILN_OP_SLICE, TU_IDS(x),
                      TU_ATTRS(TU_INTS("dim", 3), TU_INTS("start", -h), TU_INTS("end", INT64_MAX)))
            : tu_node(g, KILN_OP_SLICE, TU_IDS(x),
                      TU_ATTRS(TU_INTS("dim", -1), TU_INTS("start", cut), TU_INTS("end", RD)));
    int32_t x1 = tu_node(g, KILN_OP_SLICE, TU_IDS(x),
                         TU_ATTRS(TU_INTS("dim", -1), TU_INTS("start", 0), TU_INTS("end", cut)));
    int32_t n = tu_node(g, KILN_OP_NEG, TU_IDS(x2), TU_NO_ATTRS);
    *negv = n;
    int32_t cat = (f & T_CAT_ORDER)
                      ? tu_node(g, KILN_OP_CAT, TU_IDS(x1, n), TU_ATTRS(TU_INTS("dim", -1)))
                      : tu_node(g, KILN_OP_CAT, TU_IDS(n, x1), TU_ATTRS(TU_INTS("dim", 3)));
    int32_t s = (f & T_SWAP_SIN) ? tu_node(g, KILN_OP_MUL, TU_IDS(sin, cat), TU_NO_ATTRS)
                                 : tu_node(g, KILN_OP_MUL, TU_IDS(cat, sin), TU_NO_ATTRS);
    return (f & T_SWAP_ADD) ? tu_node(g, KILN_OP_ADD, TU_IDS(s, c), TU_NO_ATTRS)
                            : tu_node(g, KILN_OP_ADD, TU_IDS(c, s), TU_NO_ATTRS);
}

// Inputs q, k [2, RH, RL, RD] and cos, sin [2, 1, RL, RD] (or positions int64 [RL] with
// T_POSITIONS: angle[l, i] = pos[l] * inv_freq[i % (RD/2)], Llama's tables); outputs the
// rotated q and k, which share the tables.
static kiln_graph *rope_graph(int f, float *inv_freq) {
    kiln_graph *g;
    int32_t negv, cos, sin;
    CHECK_OK(kiln_graph_new(&g));
    int32_t q = tu_input(g, "q", KILN_DTYPE_F32, 4, TU_DIMS(2, RH, RL, RD), TU_DIMS(2, RH, RL, RD));
    int32_t k = tu_input(g, "k", KILN_DTYPE_F32, 4, TU_DIMS(2, RH, RL, RD), TU_DIMS(2, RH, RL, RD));
    if (f & T_POSITIONS) {
        int32_t pos = tu_input(g, "pos", KILN_DTYPE_I64, 1, TU_DIMS(RL), TU_DIMS(RL));
        int32_t pf =
            tu_node(g, KILN_OP_CAST, TU_IDS(pos), TU_ATTRS(TU_INTS("dtype", KILN_DTYPE_F32)));
        pf = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(pf), TU_ATTRS(TU_INTS("dim", 1))); // [RL, 1]
        int32_t inv = tu_const(g, "inv_freq", KILN_DTYPE_F32, 1, TU_DIMS(RD / 2), inv_freq);
        int32_t fr = tu_node(g, KILN_OP_MUL, TU_IDS(pf, inv), TU_NO_ATTRS); // [RL, RD/2]
        int32_t emb = tu_node(g, KILN_OP_CAT, TU_IDS(fr, fr), TU_ATTRS(TU_INTS("dim", -1)));
        cos = tu_node(g, KILN_OP_COS, TU_IDS(emb), TU_NO_ATTRS);
        sin = tu_node(g, KILN_OP_SIN, TU_IDS(emb), TU_NO_ATTRS);
    } else {
        cos = tu_input(g, "cos", KILN_DTYPE_F32, 4, TU_DIMS(2, 1, RL, RD), TU_DIMS(2, 1, RL, RD));
        sin = tu_input(g, "sin", KILN_DTYPE_F32, 4, TU_DIMS(2, 1, RL, RD), TU_DIMS(2, 1, RL, RD));
    }
    int32_t yq = rope(g, f, q, cos, sin, &negv);
    int32_t yk = rope(g, f, k, cos, sin, &negv);
    tu_output(g, yq, "q_rot");
    tu_output(g, yk, "k_rot");
    if (f & T_READ_TWICE) tu_output(g, negv, "neg"); // k's neg read twice: only q fuses
    return g;
}

static void test_rope(int f, uint32_t want, const char *what) {
    float inv[RD / 2];
    for (int i = 0; i < RD / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / RD);
    kiln_graph *g = rope_graph(f, inv);
    kiln_plan p;
    if (bt_plan(g, &o1, &p)) {
        CHECK_MSG(bt_count(&p, KILN_OP_ROTARY) == want, "%s: %u rotary layers, want %u", what,
                  bt_count(&p, KILN_OP_ROTARY), want);
        if (want == 2) {
            CHECK_MSG(bt_count(&p, KILN_OP_SLICE) + bt_count(&p, KILN_OP_NEG) == 0,
                      "%s: slices or negs left", what);
            // the position tables' own cat and unsqueeze stay (constants once folded)
            CHECK_MSG((f & T_POSITIONS) ||
                          bt_count(&p, KILN_OP_CAT) + bt_count(&p, KILN_OP_RESHAPE) == 0,
                      "%s: cats or reshapes left", what);
        }
        for (uint32_t i = 0; i < p.n_layers; i++) { // halves, or pairs for rotate_every_two
            if (p.layers[i].op != KILN_OP_ROTARY) continue;
            kiln_attrs a = kiln_plan_layer_attrs(&p, &p.layers[i]);
            CHECK_MSG(kiln_attrs_int(&a, KILN_A_ROTARY_INTERLEAVED, 0) == ((f & T_PAIRS) != 0),
                      "%s: rotary interleaved %lld", what,
                      (long long)kiln_attrs_int(&a, KILN_A_ROTARY_INTERLEAVED, 0));
        }
        kiln_plan_release(&p);
    }
    // under bf16 the position-math tables stay float32 and the rotary reads them so
    if (want > 0 && bt_plan(g, &o1_bf16, &p)) {
        for (uint32_t i = 0; i < p.n_layers; i++) {
            if (p.layers[i].op != KILN_OP_ROTARY) continue;
            uint32_t xd = p.tensors[p.ids[p.layers[i].input_begin]].dtype;
            uint32_t cd = p.tensors[p.ids[p.layers[i].input_begin + 1]].dtype;
            CHECK_MSG(xd == KILN_DTYPE_BF16, "%s: rotary x is %s", what,
                      kiln_dtype_name((kiln_dtype)xd));
            CHECK_MSG(cd == ((f & T_POSITIONS) ? KILN_DTYPE_F32 : KILN_DTYPE_BF16),
                      "%s: rotary cos is %s", what, kiln_dtype_name((kiln_dtype)cd));
        }
        kiln_plan_release(&p);
    }
    if (f & T_POSITIONS) {
        bt_shape s[3] = {{4, {2, RH, RL, RD}}, {4, {2, RH, RL, RD}}, {1, {RL}}};
        bt_compare(g, &o0, &o1, 3, s, 300, 1e-5, 1e-5, what);
        bt_compare(g, &o0, &o1_bf16, 3, s, 300, 3e-2, 3e-2, what);
    } else {
        bt_shape s[4] = {
            {4, {2, RH, RL, RD}}, {4, {2, RH, RL, RD}}, {4, {2, 1, RL, RD}}, {4, {2, 1, RL, RD}}};
        bt_compare(g, &o0, &o1, 4, s, 0, 1e-5, 1e-5, what);
        bt_compare(g, &o0, &o1_bf16, 4, s, 0, 3e-2, 3e-2, what);
    }
    kiln_graph_free(g);
}

// Partial rotary (GPT-NeoX's rotary_pct): q [2, RH, RL, PD] rotated over its first RD dims by
// the rotate-half chain, the rest passed, then cat(rotated, rest). variant 0: one rotary layer
// over q, no slice or cat left; 1: cat(rest, rotated) (another order) stays; 2: the tables
// broadcast over the last dim (not R) stay.
#define PD 16
static void test_rope_partial(int variant, int f, const char *what) {
    kiln_graph *g;
    kiln_plan p;
    int32_t negv;
    const int64_t tl = variant == 2 ? 1 : RD;
    CHECK_OK(kiln_graph_new(&g));
    int32_t q = tu_input(g, "q", KILN_DTYPE_F32, 4, TU_DIMS(2, RH, RL, PD), TU_DIMS(2, RH, RL, PD));
    int32_t cos =
        tu_input(g, "cos", KILN_DTYPE_F32, 4, TU_DIMS(2, 1, RL, tl), TU_DIMS(2, 1, RL, tl));
    int32_t sin =
        tu_input(g, "sin", KILN_DTYPE_F32, 4, TU_DIMS(2, 1, RL, tl), TU_DIMS(2, 1, RL, tl));
    int32_t rot = tu_node(g, KILN_OP_SLICE, TU_IDS(q),
                          TU_ATTRS(TU_INTS("dim", -1), TU_INTS("start", 0), TU_INTS("end", RD)));
    int32_t rest =
        tu_node(g, KILN_OP_SLICE, TU_IDS(q),
                TU_ATTRS(TU_INTS("dim", 3), TU_INTS("start", RD), TU_INTS("end", INT64_MAX)));
    int32_t r = rope(g, f, rot, cos, sin, &negv);
    int32_t y = variant == 1
                    ? tu_node(g, KILN_OP_CAT, TU_IDS(rest, r), TU_ATTRS(TU_INTS("dim", -1)))
                    : tu_node(g, KILN_OP_CAT, TU_IDS(r, rest), TU_ATTRS(TU_INTS("dim", -1)));
    tu_output(g, y, "y");
    if (bt_plan(g, &o1, &p)) {
        char buf[256];
        bt_layers(&p, buf, sizeof buf);
        const char *want = variant == 0 ? "rotary" : "slice|slice|rotary|cat";
        CHECK_MSG(strcmp(buf, want) == 0, "%s: layers '%s', want '%s'", what, buf, want);
        kiln_plan_release(&p);
    }
    bt_shape s[3] = {{4, {2, RH, RL, PD}}, {4, {2, 1, RL, tl}}, {4, {2, 1, RL, tl}}};
    bt_compare(g, &o0, &o1, 3, s, 0, 1e-5, 1e-5, what);
    bt_compare(g, &o0, &o1_bf16, 3, s, 0, 3e-2, 3e-2, what);
    kiln_graph_free(g);
}

int main(void) {
    check_rng_seed();
    o0 = bt_opts(0, KILN_PRECISION_FP32, 0);
    o1 = bt_opts(1, KILN_PRECISION_FP32, 0);
    o1_bf16 = bt_opts(1, KILN_PRECISION_BF16, 0);
    test_rms(0, "rms_norm", "rms plain");
    test_rms(R_SWAP_MUL | R_SWAP_ADD | R_SWAP_W, "rms_norm", "rms swapped operands");
    test_rms(R_CASTS, "rms_norm", "rms with no-op casts");
    test_rms(R_CASTS | R_SWAP_W, "rms_norm", "rms with no-op casts, swapped weight");
    test_rms(R_NO_WEIGHT, "rms_norm", "rms without weight");
    test_rms(R_NO_WEIGHT | R_CASTS, "rms_norm", "rms without weight, with casts");
    test_rms(R_GEMMA, "rms_norm", "rms gemma 1 + w");
    test_rms(R_BF16, "rms_norm", "rms bf16 model");
    test_rms(R_BF16 | R_GEMMA | R_SWAP_MUL, "rms_norm", "rms bf16 model, gemma");
    test_rms(R_MEAN_DIM1, "pow|mean|add|rsqrt|mul,mul", "rms mean over dim 1");
    test_rms(R_POW4, "pow|mean|add|rsqrt|mul,mul", "rms pow 4");
    test_rms(R_READ_TWICE, "pow|mean|add|rsqrt|mul,mul", "rms rsqrt read twice");
    test_rms(R_NO_KEEPDIM, "pow|mean|reshape|add|rsqrt|mul,mul", "rms mean without keepdim");
    test_rms(R_T5 | R_BF16, "rms_norm", "rms t5 form, bf16 model");
    test_rms(R_T5 | R_BF16 | R_SWAP_MUL | R_SWAP_W, "rms_norm", "rms t5 form, swapped");
    test_rms(R_T5 | R_CASTS, "rms_norm", "rms t5 form, float32");
    test_rms(R_T5_READ | R_BF16, "cast|pow|mean|add|rsqrt|cast|mul|cast|mul",
             "rms t5 cast read twice");
    test_rms_values();
    test_l2(0, 1, "l2 F.normalize");
    test_l2(L_SQRT | L_EXPAND, 1, "l2 sqrt, expanded");
    test_l2(L_NO_CLAMP | L_SQRT, 1, "l2 x / x.norm()");
    test_l2(L_BF16 | L_EXPAND, 1, "l2 bf16 model");
    test_l2(L_SUM_DIM1, 0, "l2 sum over dim 1");
    test_l2(L_POW4, 0, "l2 pow 4");
    test_l2(L_CLAMP_MAX, 0, "l2 clamp with a max");
    test_l2(L_TINY_EPS, 0, "l2 eps too small to square");
    test_l2(L_OTHER_X, 0, "l2 another tensor's norm");
    test_l2(L_UPCAST | L_EXPAND, 1, "l2 fp16 model, the norm in float32");
    test_l2(L_UPCAST | L_SQRT, 1, "l2 fp16 model, sqrt in float32");
    test_l2(L_UPCAST | L_OTHER_X, 0, "l2 fp16 model, another tensor's norm");
    test_l2_values();
    test_vnorm(0, 1, "vector norm over H, W");
    test_vnorm(V_MUL | V_SQRT, 1, "vector norm x * x, sqrt");
    test_vnorm(V_LAST, 1, "vector norm over the last dim");
    test_vnorm(V_BF16 | V_MUL, 1, "vector norm bf16 model");
    test_vnorm(V_POW4, 0, "vector norm pow 4");
    test_vnorm(V_ROOT3, 0, "vector norm cube root");
    test_vnorm(V_SUM_OUT, 0, "vector norm sum read twice");
    test_vnorm(V_MUL_OTHER, 0, "vector norm x * (x * c)");
    test_vnorm_values();
    test_rope(0, 2, "rope plain");
    test_rope(T_SWAP_ADD | T_SWAP_COS | T_SWAP_SIN, 2, "rope swapped operands");
    test_rope(T_NEG_IDX | T_SWAP_SIN, 2, "rope negative slice bounds");
    test_rope(T_POSITIONS, 2, "rope from positions");
    test_rope(T_POSITIONS | T_SWAP_ADD, 2, "rope from positions, swapped add");
    test_rope(T_NOT_HALF, 0, "rope slices not halves");
    test_rope(T_CAT_ORDER, 0, "rope cat order");
    test_rope(T_READ_TWICE, 1, "rope neg read twice");
    test_rope(T_PAIRS, 2, "rope pairs");
    test_rope(T_PAIRS | T_NEG_AFTER | T_SWAP_ADD | T_SWAP_SIN, 2, "rope pairs, neg after");
    test_rope(T_PAIRS | T_UNSQ | T_SWAP_COS, 2, "rope pairs, unsqueeze ops");
    test_rope(T_PAIRS | T_POSITIONS, 2, "rope pairs from positions");
    test_rope(T_PAIRS | T_PAIRS_STEP1, 0, "rope pairs of step 1");
    test_rope(T_PAIRS | T_PAIRS_DIM, 0, "rope pairs stacked in front");
    test_rope(T_PAIRS | T_READ_TWICE, 1, "rope pairs, neg read twice");
    test_rope_partial(0, 0, "partial rope");
    test_rope_partial(1, 0, "partial rope, cat in the other order");
    test_rope_partial(2, 0, "partial rope, tables broadcast over the last dim");
    test_rope_partial(0, T_PAIRS, "partial rope pairs");
    test_rope_partial(1, T_PAIRS, "partial rope pairs, cat in the other order");
    return check_summary();
}
