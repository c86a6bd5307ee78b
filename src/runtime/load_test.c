// SPDX-License-Identifier: Apache-2.0
// Semantic validation of the loader (src/runtime/load.c): each case takes a valid hand-built
// plan, breaks one rule of docs/format.md §3-4 at the plan level, serializes it (so all CRCs are
// right and only the semantic check can reject it), and expects the exact status and a message
// naming the field. Plus: the memory-plan overlap sweep against a naive O(n^2) reference on random
// plans.
#include "builder/serialize.h"
#include "check.h"
#include "format_fixtures.h"
#include "runtime/load.h"

enum { MLP = 0, CONV = 1, EXT = 2, CHAIN = 3 };

// Tensor / layer ids in the fixtures (see tests/format_fixtures.h).
// mlp:   0 x, 1 w1, 2 b1, 3 w2, 4 h, 5 y; layers 0 linear (n_tail 1), 1 relu TAIL, 2 linear
// conv:  0 image, 1 w, 2 bias, 3 scale, 4 c, 5 pool, 6 logits; layers 0 conv, 1 add TAIL, 2 pool,
//        3 reshape; refs 0-3 conv, 4-8 pool, 9 reshape
// ext:   0 x, 1 w (external), 2 t, 3 u, 4 probs; layers 0 linear, 1 clamp, 2 softmax; refs 0-1
//        clamp (floats), 2 softmax dim
// chain: 0 x, 1 s, 2 a0, 3 a1, 4 a2, 5 a3, 6 y, 7 z; layers relu, sigmoid, tanh, mul, gelu, cast

static int32_t *in_id(kiln_plan *p, uint32_t layer, uint32_t j) {
    return &p->ids[p->layers[layer].input_begin + j];
}
static int32_t *out_id(kiln_plan *p, uint32_t layer) {
    return &p->ids[p->layers[layer].output_begin];
}

// Appends a tensor (reallocating the exactly sized array kiln_plan_release expects).
static uint32_t append_tensor(kiln_plan *p, kiln_plan_tensor t) {
    kiln_plan_tensor *a = kiln_malloc((p->n_tensors + 1) * sizeof *a, 16);
    memcpy(a, p->tensors, p->n_tensors * sizeof *a);
    a[p->n_tensors] = t;
    kiln_free(p->tensors, p->n_tensors * sizeof *a);
    p->tensors = a;
    return p->n_tensors++;
}

static void m_unwritten_act(kiln_plan *p) {
    kiln_plan_tensor t = p->tensors[4];
    t.offset = 1024;
    p->arena_nbytes = 4096;
    append_tensor(p, t);
}

#define C KILN_ERR_CORRUPT
#define DIM40 (INT64_C(1) << 40)
#define V KILN_ERR_VERSION
// X(name, fixture, mutation, expected status, substring of the message)
#define CASES(X)                                                                                   \
    X(dtype9, MLP, p->tensors[0].dtype = 9, C, "tensor 0: dtype 9 is not a valid dtype")           \
    X(dtype0, MLP, p->tensors[4].dtype = 0, C, "tensor 4: dtype 0")                                \
    X(kind0, MLP, p->tensors[4].kind = 0, C, "tensor 4: kind 0")                                   \
    X(kind6, MLP, p->tensors[4].kind = 6, C, "tensor 4: kind 6")                                   \
    X(rank9, MLP, p->tensors[4].shape.rank = 9, C, "tensor 4: rank 9")                             \
    X(min_gt_max, MLP, p->tensors[0].shape.min[0] = 5, C, "tensor 0: dim 0 range [5, 4]")          \
    X(neg_dim, MLP, p->tensors[0].shape.min[0] = -1, C, "tensor 0: dim 0 range [-1, 4]")           \
    X(huge_dim, MLP, p->tensors[0].shape.max[0] = (INT64_C(1) << 40) + 1, C, "tensor 0: dim 0")    \
    X(huge_numel, CHAIN, (p->tensors[0].shape.max[0] = DIM40, p->tensors[0].shape.max[1] = DIM40), \
      C, "tensor 0: element count")                                                                \
    X(name_oob, MLP, p->tensors[4].name = 100000, C, "tensor 4: name 100000 is outside")           \
    X(input_unnamed, MLP, p->tensors[0].name = 0, C, "tensor 0 (input 0): name is empty")          \
    X(dup_names, CHAIN, p->tensors[1].name = p->tensors[0].name, C, "the name 'x' is used by two") \
    X(dup_out_name, CHAIN, p->tensors[7].name = p->tensors[0].name, C, "'x' is used by two")       \
    X(binding_oob, MLP, p->tensors[0].binding = 1, C, "tensor 0 (input): binding 1")               \
    X(binding_swap, CHAIN, (p->tensors[0].binding = 1, p->tensors[1].binding = 0), C,              \
      "tensor 0 (input): binding 1")                                                               \
    X(inputs_list, MLP, p->inputs[0] = 4, C, "tensor 0 (input): binding 0 does not name it")       \
    X(outputs_oob, MLP, p->outputs[0] = 99, C, "bindings: output 0 is tensor 99")                  \
    X(no_outputs, MLP, p->n_outputs = 0, C, "n_outputs is 0")                                      \
    X(act_misaligned, MLP, p->tensors[4].offset = 8, C,                                            \
      "tensor 4 (activation): arena offset 8 is not a multiple of 64")                             \
    X(act_small, MLP, p->tensors[4].nbytes = 255, C,                                               \
      "tensor 4 (activation): nbytes 255 is below the 256")                                        \
    X(act_outside, MLP, p->arena_nbytes = 255, C, "lies outside arena_nbytes 255")                 \
    X(arena_huge, MLP, p->arena_nbytes = UINT64_MAX, C, "plan: arena_nbytes")                      \
    X(precision3, MLP, p->precision = 3, C, "plan: precision 3")                                   \
    X(weight_nbytes, MLP, p->tensors[1].nbytes = 4, C, "tensor 1 (weight): nbytes 4 differs")      \
    X(weight_misaligned, MLP, p->tensors[2].offset += 4, C, "tensor 2 (weight): offset")           \
    X(weight_outside, MLP, p->tensors[3].offset = 1 << 20, C, "tensor 3 (weight): offset 1048576") \
    X(weight_dynamic, MLP, p->tensors[1].shape.min[0] = 1, C, "is dynamic; weights are static")    \
    X(key_empty, EXT, p->tensors[1].key = 0, C, "tensor 1 (weight): external key is empty")        \
    X(key_oob, EXT, p->tensors[1].key = 5000, C, "tensor 1: key 5000 is outside")                  \
    X(op0, MLP, p->layers[2].op = 0, C, "layer 2: op 0 is not a valid op id")                      \
    X(op200, MLP, p->layers[2].op = 200, C, "layer 2: op 200 is not a valid op id")                \
    X(op_unknown, MLP, p->layers[2].op = 99, V, "layer 2: op 99 is unknown to this Kiln")          \
    X(layer_flags, MLP, p->layers[2].flags = 2, C, "layer 2 (linear): flags 0x00000002")           \
    X(arity, MLP, p->layers[2].n_inputs = 1, C, "layer 2 (linear): n_inputs 1 is outside")         \
    X(input_range, MLP, p->layers[2].input_begin = 100, C, "layer 2 (linear): input_begin 100")    \
    X(n_outputs2, MLP, p->layers[2].n_outputs = 2, C, "layer 2 (linear): n_outputs 2")             \
    X(output_range, MLP, p->layers[2].output_begin = 10, C, "output_begin 10 + n_outputs 1")       \
    X(n_attrs, CONV, p->layers[0].n_attrs = 3, C, "layer 0 (conv2d): n_attrs 3")                   \
    X(attr_range, CONV, p->layers[3].attr_begin = 10, C, "layer 3 (reshape): attr_begin 10")       \
    X(attr_kind, EXT, (p->attr_refs[0].kind = KILN_ATTR_INTS, p->attr_refs[0].begin = 0), C,       \
      "layer 1 (clamp): attribute 0 (min) has kind 1")                                             \
    X(attr_count, CONV, p->attr_refs[0].n = 1, C,                                                  \
      "layer 0 (conv2d): attribute 0 (stride) has 1 values")                                       \
    X(attr_pool, CONV, p->attr_refs[9].begin = 1000, C, "attr_ref 9: begin 1000")                  \
    X(attr_ref_kind, CONV, p->attr_refs[9].kind = 7, C, "attr_ref 9: kind 7")                      \
    X(attr_value, CONV, p->ints[0] = 0, C, "layer 0 (conv2d): shape inference rejects")            \
    X(not_optional, MLP, *in_id(p, 0, 1) = -1, C, "layer 0 (linear): input 1 is absent")           \
    X(id_range, MLP, *in_id(p, 0, 0) = 6, C, "ids[0]: 6 is not a tensor id")                       \
    X(id_neg, MLP, *in_id(p, 0, 0) = -2, C, "ids[0]: -2 is not a tensor id")                       \
    X(out_absent, MLP, *out_id(p, 2) = -1, C, "layer 2 (linear): output 0 is -1")                  \
    X(out_weight, MLP, *out_id(p, 2) = 3, C, "output 0 is tensor 3, a weight")                     \
    X(out_input, MLP, *out_id(p, 2) = 0, C, "output 0 is tensor 0, an input")                      \
    X(tail_op, MLP, p->layers[1].op = KILN_OP_SQRT, C,                                             \
      "layer 1 (sqrt) is a TAIL layer, but sqrt cannot")                                           \
    X(tail_head_op, CHAIN,                                                                         \
      (p->layers[0].op = KILN_OP_SQRT, p->layers[0].n_tail = 1,                                    \
       p->layers[1].flags = KILN_LAYER_TAIL),                                                      \
      C, "layer 0 (sqrt): n_tail 1, but sqrt cannot carry")                                        \
    X(tail_orphan, CHAIN, p->layers[1].flags = KILN_LAYER_TAIL, C,                                 \
      "layer 1 (sigmoid) is a TAIL layer but does not follow")                                     \
    X(tail_short, MLP, p->layers[0].n_tail = 2, C, "head layer 0 has n_tail 2")                    \
    X(tail_end, MLP, (p->layers[2].n_tail = 1), C,                                                 \
      "layer 2 (linear): n_tail 1, but the engine ends")                                           \
    X(tail_ntail, MLP, p->layers[1].n_tail = 1, C, "TAIL layer with n_tail 1")                     \
    X(tail_cap, MLP, p->layers[0].n_tail = 9, C, "n_tail 9 exceeds the cap of 8")                  \
    X(tail_writes, MLP, *out_id(p, 1) = 5, C, "layer 1 (relu): a TAIL layer writes tensor 5")      \
    X(tail_reads, CONV, *in_id(p, 1, 0) = 3, C, "layer 1 (add): a TAIL layer must read")           \
    X(use_before_def, CHAIN, *in_id(p, 0, 0) = 3, C,                                               \
      "layer 0 (relu): input 0 is tensor 3 (activation), which no earlier layer writes")           \
    X(double_write, CHAIN, *out_id(p, 2) = 2, C,                                                   \
      "layer 2 (tanh): output 0 is tensor 2, which an earlier layer already writes")               \
    X(unwritten, MLP, m_unwritten_act(p), C, "tensor 6 (activation) is never written")             \
    X(out_unwritten, CHAIN, *out_id(p, 5) = 5, C, "output 0 is tensor 5, which an earlier layer")  \
    X(shape_range, MLP,                                                                            \
      (p->tensors[4].shape.min[1] = 17, p->tensors[4].shape.max[1] = 17,                           \
       p->tensors[4].nbytes = 4 * 17 * 4, p->arena_nbytes = 4 * 17 * 4),                           \
      C,                                                                                           \
      "layer 0 (linear): output tensor 4 dim 1 range is [17, 17], but shape inference gives [16, " \
      "16]")                                                                                       \
    X(shape_dtype, MLP, p->tensors[5].dtype = KILN_DTYPE_F16, C,                                   \
      "layer 2 (linear): output tensor 5 is float16 of rank 2, but shape inference gives float32") \
    X(shape_rank, CHAIN, (p->tensors[7].shape.rank = 1), C,                                        \
      "output tensor 7 is float16 of rank 1")                                                      \
    X(shape_input, CHAIN, p->tensors[1].shape.max[0] = p->tensors[1].shape.min[0] = 2, C,          \
      "layer 3 (mul)")                                                                             \
    X(overlap_adjacent, CHAIN, p->tensors[3].offset = 0, C,                                        \
      "memory plan: activations 2 (arena [0, 60), live over layers 0..1) and 3")                   \
    X(overlap_later, CHAIN, p->tensors[4].offset = 64, C, "overlap while both are live")           \
    X(overlap_tail, MLP, (p->tensors[4].offset = 0), KILN_OK, "")

typedef struct mut_case {
    const char *name;
    int fixture;
    void (*mutate)(kiln_plan *p);
    kiln_status expect;
    const char *message;
} mut_case;

#define DEFINE_FN(nm, fx, body, st, msg)                                                           \
    static void mut_##nm(kiln_plan *p) { body; }
CASES(DEFINE_FN)
#define TABLE_ROW(nm, fx, body, st, msg) {#nm, fx, mut_##nm, st, msg},
static const mut_case cases[] = {CASES(TABLE_ROW)};

static void quiet_log(void *ud, kiln_log_level level, const char *msg) {
    (void)ud;
    (void)level;
    (void)msg;
}

static void run_cases(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mut_case *c = &cases[i];
        kiln_plan p, out;
        fx_make(c->fixture, &p);
        c->mutate(&p);
        uint8_t *bytes = NULL;
        size_t n = 0;
        kiln_status st = kiln_serialize(&p, &bytes, &n);
        CHECK_MSG(st == KILN_OK, "%s: serialize: %s", c->name, kiln_last_error());
        kiln_clear_error();
        st = kiln_load_plan(bytes, n, &out);
        CHECK_MSG(st == c->expect, "%s: load returned %s, expected %s: %s", c->name,
                  kiln_status_str(st), kiln_status_str(c->expect), kiln_last_error());
        if (st == KILN_OK)
            kiln_plan_release(&out);
        else
            CHECK_MSG(strstr(kiln_last_error(), c->message) != NULL, "%s: message '%s' lacks '%s'",
                      c->name, kiln_last_error(), c->message);
        kiln_free(bytes, n);
        kiln_plan_release(&p);
    }
}

// --- the memory-plan sweep against a naive reference
//
// A chain of n relu layers over activations with random arena offsets (a few slots, so many
// pairs share bytes) and random extra readers (a final add reads a random earlier activation,
// extending its live interval). The loader must accept exactly when no pair overlaps.

static int naive_overlap(const kiln_plan *p, const int32_t *first, const int32_t *last) {
    for (uint32_t a = 0; a < p->n_tensors; a++) {
        for (uint32_t b = a + 1; b < p->n_tensors; b++) {
            const kiln_plan_tensor *x = &p->tensors[a], *y = &p->tensors[b];
            if (x->kind != KILN_TENSOR_ACTIVATION || y->kind != KILN_TENSOR_ACTIVATION) continue;
            int time = first[a] <= last[b] && first[b] <= last[a];
            int space = x->offset < y->offset + y->nbytes && y->offset < x->offset + x->nbytes;
            if (time && space) return 1;
        }
    }
    return 0;
}

static void random_memory_plans(void) {
    int agree = 0, n_overlapping = 0, n_valid = 0;
    for (int iter = 0; iter < 300; iter++) {
        fx_builder *b = malloc(sizeof *b);
        fx_init(b);
        uint32_t n_act = (uint32_t)check_rng_int(2, 40);
        uint32_t slots = (uint32_t)check_rng_int(2, 5);
        int64_t dims[] = {4, 4}; // 64 bytes of f32
        int32_t first[FX_CAP], last[FX_CAP];
        uint32_t x = fx_tensor(b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "x", 2, dims, NULL);
        first[x] = last[x] = -1;
        int32_t prev = (int32_t)x;
        for (uint32_t i = 0; i < n_act; i++) {
            // Round-robin slots (valid for a plain chain), sometimes a random slot, sometimes a
            // buffer spanning two slots (partial overlaps).
            uint64_t off = 64 * (uint64_t)(i % slots);
            if (check_rng_int(0, 11) == 0) off = 64 * (uint64_t)check_rng_int(0, slots - 1);
            uint32_t t = fx_act(b, KILN_DTYPE_F32, off, 2, dims, NULL);
            if (check_rng_int(0, 15) == 0) b->tensors[t].nbytes = 128;
            if (b->tensors[t].offset + b->tensors[t].nbytes > b->arena_nbytes) {
                b->arena_nbytes = b->tensors[t].offset + b->tensors[t].nbytes;
            }
            int32_t in[] = {prev};
            fx_layer(b, KILN_OP_RELU, 0, 1, in, (int32_t)t, 0, 0);
            first[t] = last[t] = (int32_t)i;
            if (prev != (int32_t)x) last[prev] = (int32_t)i;
            prev = (int32_t)t;
        }
        // The output reads the last activation and a random earlier one.
        uint32_t extra = 1 + (uint32_t)check_rng_int(0, n_act - 1);
        uint32_t y = fx_tensor(b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, "y", 2, dims, NULL);
        int32_t in[] = {prev, (int32_t)extra};
        fx_layer(b, KILN_OP_ADD, 0, 2, in, (int32_t)y, 0, 0);
        last[prev] = (int32_t)n_act;
        last[extra] = (int32_t)n_act;
        first[y] = last[y] = (int32_t)n_act;

        kiln_plan p, out;
        fx_finish(b, &p);
        free(b);
        int expect_overlap = naive_overlap(&p, first, last);
        uint8_t *bytes = NULL;
        size_t n = 0;
        CHECK_OK(kiln_serialize(&p, &bytes, &n));
        kiln_status st = kiln_load_plan(bytes, n, &out);
        if (st == KILN_OK) kiln_plan_release(&out);
        int ok = expect_overlap
                     ? st == KILN_ERR_CORRUPT && strstr(kiln_last_error(), "memory plan") != NULL
                     : st == KILN_OK;
        CHECK_MSG(ok, "random plan %d (%u activations): naive says %s, loader says %s: %s", iter,
                  n_act, expect_overlap ? "overlap" : "no overlap", kiln_status_str(st),
                  kiln_last_error());
        agree += ok;
        n_overlapping += expect_overlap;
        n_valid += !expect_overlap;
        kiln_free(bytes, n);
        kiln_plan_release(&p);
    }
    // Both outcomes must have been exercised for the comparison to mean something.
    CHECK_MSG(n_overlapping > 20 && n_valid > 20, "overlapping %d, valid %d", n_overlapping,
              n_valid);
    printf("memory plans: %d agree (%d overlapping, %d valid)\n", agree, n_overlapping, n_valid);
}

// cat with 40 inputs: loads; an absent input 35 (beyond the 32-bit optional mask) is rejected.
static void wide_cat(void) {
    for (int absent = 0; absent < 2; absent++) {
        fx_builder *b = malloc(sizeof *b);
        fx_init(b);
        int64_t xd[] = {2}, yd[] = {80}, dim[] = {0};
        uint32_t x = fx_tensor(b, KILN_TENSOR_INPUT, KILN_DTYPE_F32, "x", 1, xd, NULL);
        uint32_t y = fx_tensor(b, KILN_TENSOR_OUTPUT, KILN_DTYPE_F32, "y", 1, yd, NULL);
        int32_t in[40];
        for (int i = 0; i < 40; i++) in[i] = (int32_t)x;
        if (absent) in[35] = -1;
        uint32_t r = fx_ints(b, 1, dim);
        fx_layer(b, KILN_OP_CAT, 0, 40, in, (int32_t)y, r, 1);
        kiln_plan p, out;
        fx_finish(b, &p);
        free(b);
        uint8_t *bytes;
        size_t n;
        CHECK_OK(kiln_serialize(&p, &bytes, &n));
        kiln_status st = kiln_load_plan(bytes, n, &out);
        CHECK_MSG(st == (absent ? KILN_ERR_CORRUPT : KILN_OK), "cat absent=%d: %s", absent,
                  kiln_last_error());
        if (absent) CHECK(strstr(kiln_last_error(), "layer 0 (cat): input 35 is absent") != NULL);
        if (st == KILN_OK) kiln_plan_release(&out);
        kiln_free(bytes, n);
        kiln_plan_release(&p);
    }
}

int main(void) {
    kiln_log_set(quiet_log, NULL, KILN_LOG_DEBUG);
    run_cases();
    wide_cat();
    random_memory_plans();
    return check_summary();
}
