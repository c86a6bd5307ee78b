// SPDX-License-Identifier: Apache-2.0
// Token ids checked before an execute (src/runtime/index_inputs.h): an embedding whose indices
// are an input (here through an unsqueeze) refuses an id outside its table with the input, the
// id and the vocabulary in the message before any layer runs: the KV cache the same call would
// write keeps its rows, and the next call goes on from them. Checked against a reference kept
// here (the table's rows written at the positions).
#include "test_util.h"

#define V 11 // vocabulary
#define S 5  // cache rows
#define D 4

// cache [S, D] (zeros); inputs tok [n] and pos [n] (int64, n in 1..S); the cache takes
// index_copy(cache, 0, pos, squeeze(embedding(W, unsqueeze(tok, 0)), 0)); output y = 2 * cache.
static kiln_graph *token_graph(const float *w) {
    kiln_graph *g = NULL;
    int32_t cache, tok, pos, t2, e, rows, y, two;
    const float two_f[1] = {2.0f};
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return NULL;
    CHECK_OK(kiln_graph_add_state(g, "cache", KILN_DTYPE_F32, 2, TU_DIMS(S, D), NULL, 0, &cache));
    tok = tu_input(g, "tokens", KILN_DTYPE_I64, 1, TU_DIMS(1), TU_DIMS(S));
    pos = tu_input(g, "pos", KILN_DTYPE_I64, 1, TU_DIMS(1), TU_DIMS(S));
    t2 = tu_node(g, KILN_OP_UNSQUEEZE, TU_IDS(tok), TU_ATTRS(TU_INTS("dim", 0)));
    e = tu_node(g, KILN_OP_EMBEDDING,
                TU_IDS(tu_const(g, "embed", KILN_DTYPE_F32, 2, TU_DIMS(V, D), w), t2), TU_NO_ATTRS);
    rows = tu_node(g, KILN_OP_SQUEEZE, TU_IDS(e), TU_ATTRS(TU_INTS("dims", 0)));
    y = tu_node(g, KILN_OP_INDEX_COPY, TU_IDS(cache, pos, rows), TU_ATTRS(TU_INTS("dim", 0)));
    CHECK_OK(kiln_graph_update_state(g, cache, y));
    two = tu_const(g, "two", KILN_DTYPE_F32, 1, TU_DIMS(1), two_f);
    tu_output(g, tu_node(g, KILN_OP_MUL, TU_IDS(y, two), TU_NO_ATTRS), "y");
    return g;
}

// One call: the table's rows of tok written into ref at pos (as the engine should), then the
// output against 2 * ref.
static kiln_status step(kiln_context *c, const float *w, float *ref, const int64_t *tok,
                        const int64_t *pos, int64_t n, const char *what) {
    float y[S * D];
    tu_io in[2] = {{1, {n}, (void *)tok, 0}, {1, {n}, (void *)pos, 0}};
    tu_io out[1] = {{2, {S, D}, y, sizeof y}};
    kiln_status st = tu_execute(c, in, 2, out, 1);
    if (st != KILN_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t d = 0; d < D; d++) ref[pos[i] * D + d] = w[tok[i] * D + d];
    }
    float want[S * D];
    for (int64_t i = 0; i < S * D; i++) want[i] = 2.0f * ref[i];
    tu_check_close(what, y, want, S * D, 0.0, 0.0);
    return KILN_OK;
}

static void test_tokens(void) {
    float w[V * D], ref[S * D] = {0};
    tu_fill(w, V * D, -1.0f, 1.0f);
    kiln_graph *g = token_graph(w);
    kiln_built *b = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    if (g == NULL) return;
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &b));
    kiln_graph_free(g);
    if (b == NULL) return;
    CHECK_OK(tu_load(b, "cpu", &e));
    if (e != NULL) CHECK_OK(kiln_context_new(e, &c));
    if (c != NULL) {
        CHECK_OK(step(c, w, ref, (const int64_t[]){3, 0, V - 1}, (const int64_t[]){0, 1, 2}, 3,
                      "prefill"));
        // An id past the vocabulary, in the middle of the call: refused before anything ran.
        CHECK_STATUS(step(c, w, ref, (const int64_t[]){4, V}, (const int64_t[]){3, 4}, 2, "id V"),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "input 0 'tokens': index 11 (element 1) is out of range "
                                        "[0, 11) for the embedding 'embed'") != NULL);
        CHECK(strstr(kiln_last_error(), "outside the vocabulary of 11 rows); nothing ran") != NULL);
        CHECK_STATUS(step(c, w, ref, (const int64_t[]){-1}, (const int64_t[]){3}, 1, "id -1"),
                     KILN_ERR_INVALID_ARG);
        CHECK(strstr(kiln_last_error(), "index -1 (element 0)") != NULL);
        // The refused calls wrote nothing: rows 3 and 4 are still zeros in the reference, and the
        // output of the next call must match it.
        CHECK_OK(step(c, w, ref, (const int64_t[]){7}, (const int64_t[]){3}, 1, "after"));
        CHECK_OK(step(c, w, ref, (const int64_t[]){V - 1}, (const int64_t[]){4}, 1, "last row"));
    }
    kiln_context_free(c);
    kiln_engine_free(e);
    kiln_built_free(b);
}

int main(void) {
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    test_tokens();
    return check_summary();
}
