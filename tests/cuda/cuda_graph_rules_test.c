// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's rule for updating an executable graph in place (src/cuda/cuda_graph_rules.h):
// pure C, checked without a GPU. A random straight-line graph (as stream capture records it) is
// compared with a copy of itself (updatable) and with copies carrying one change each, where the
// expected verdict is written out case by case. Then the execute's choice of how to run the
// layers (kiln_cuda_run_choice) over every combination of its facts, against the properties the
// execute path promises.
#include "check.h"
#include "cuda/cuda_graph_rules.h"

#define MAX_NODES 64

typedef struct graph {
    kiln_cuda_gnode nodes[MAX_NODES];
    kiln_cuda_gedge edges[MAX_NODES];
    size_t n, ne;
} graph;

static void random_graph(graph *g) {
    memset(g, 0, sizeof *g);
    g->n = (size_t)check_rng_int(2, MAX_NODES);
    for (size_t i = 0; i < g->n; i++) {
        kiln_cuda_gnode *x = &g->nodes[i];
        int64_t kind = check_rng_int(0, 9);
        if (kind < 7) {
            x->type = KILN_CUDA_GNODE_KERNEL;
            x->func = (uintptr_t)check_rng_int(1, 1000) * 64;
            x->cluster[0] = x->cluster[1] = x->cluster[2] = (uint32_t)check_rng_int(0, 1);
        } else if (kind < 9) {
            x->type = kind == 7 ? KILN_CUDA_GNODE_MEMCPY : KILN_CUDA_GNODE_MEMSET;
            x->one_d = 1;
            x->memcpy_kind = x->type == KILN_CUDA_GNODE_MEMCPY ? 3 : 0;
        } else {
            x->type = KILN_CUDA_GNODE_EMPTY;
        }
    }
    for (size_t i = 0; i + 1 < g->n; i++) { // a chain: node i -> node i + 1
        g->edges[i].from = i;
        g->edges[i].to = i + 1;
    }
    g->ne = g->n - 1;
}

static int updatable(const graph *a, const graph *b, const char **why) {
    return kiln_cuda_graph_updatable(a->nodes, a->n, a->edges, a->ne, b->nodes, b->n, b->edges,
                                     b->ne, why);
}

// The first node of type t in g, or -1.
static long find_type(const graph *g, int t) {
    for (size_t i = 0; i < g->n; i++) {
        if (g->nodes[i].type == t) return (long)i;
    }
    return -1;
}

// kiln_cuda_run_choice over every combination of what an execute knows, against the properties
// the execute path promises (docs/cuda.md, "Execute and CUDA graphs"), each stated apart.
static void run_choice_properties(void) {
    int n = 0;
    for (int m = 0; m < 64; m++) {
        kiln_cuda_run_facts f = {m & 1,        (m >> 1) & 1, (m >> 2) & 1,
                                 (m >> 3) & 1, (m >> 4) & 1, (m >> 5) & 1};
        const int how = kiln_cuda_run_choice(&f);
        const int staged_here = f.staged_ok && f.at_largest;
        // graphs off (a special stream, a caller's capture, the option): always the layer loop
        if (!f.use_graph) CHECK_MSG(how == KILN_CUDA_RUN_DIRECT, "case %d", m);
        // the graph of this very signature is never recorded again, nor left unused
        if (f.use_graph && f.graph_matches) CHECK_MSG(how == KILN_CUDA_RUN_REPLAY, "case %d", m);
        // a replay of the signature's graph needs that graph
        if (how == KILN_CUDA_RUN_REPLAY) CHECK_MSG(f.graph_matches, "case %d", m);
        // the staged graph only at the largest shapes, where the context has one
        if (how == KILN_CUDA_RUN_STAGED) CHECK_MSG(staged_here, "case %d", m);
        // a recording (a host pass over the layers) only for a repeated signature, never for the
        // staged graph's own (host I/O at the largest shapes replays it, repeated or not)
        if (how == KILN_CUDA_RUN_RECORD) {
            CHECK_MSG(f.repeats_last && !f.graph_matches && !(staged_here && f.staged_matches),
                      "case %d", m);
        }
        // new device pointers at the largest shapes: staged, not run directly or recorded
        if (f.use_graph && !f.graph_matches && !f.repeats_last && staged_here)
            CHECK_MSG(how == KILN_CUDA_RUN_STAGED, "case %d", m);
        // a repeated signature with graphs on is never run directly
        if (f.use_graph && f.repeats_last) CHECK_MSG(how != KILN_CUDA_RUN_DIRECT, "case %d", m);
        // the layer loop with graphs on only for a new signature where no staged graph applies
        if (f.use_graph && how == KILN_CUDA_RUN_DIRECT)
            CHECK_MSG(!f.repeats_last && !f.graph_matches && !staged_here, "case %d", m);
        n++;
    }
    CHECK_EQ_INT(n, 64);
}

int main(void) {
    run_choice_properties();
    const char *why = NULL;
    for (int trial = 0; trial < 200; trial++) {
        graph a, b;
        random_graph(&a);
        b = a;
        CHECK_MSG(updatable(&a, &b, &why), "identical graphs refused: %s", why ? why : "?");

        // Different grid / arguments are not described at all: only what the rule reads.
        long k = find_type(&a, KILN_CUDA_GNODE_KERNEL);
        if (k >= 0) {
            b = a;
            b.nodes[k].func += 64; // cuBLASLt picked another kernel for the new shapes
            CHECK(!updatable(&a, &b, &why));
            CHECK(why != NULL && strstr(why, "function") != NULL);

            b = a;
            b.nodes[k].cluster[0] = 2; // the mlx#2748 case: clusters are never updated
            b.nodes[k].cluster[1] = b.nodes[k].cluster[2] = 1;
            CHECK(!updatable(&a, &b, &why));
            CHECK(why != NULL && strstr(why, "cluster") != NULL);
            CHECK(!updatable(&b, &b, &why)); // even unchanged

            b = a;
            b.nodes[k].cooperative = 1;
            CHECK(!updatable(&a, &b, &why));

            b = a;
            b.nodes[k].info_unavailable = 1;
            CHECK(!updatable(&a, &b, &why));

            b = a;
            b.nodes[k].type = KILN_CUDA_GNODE_MEMSET;
            b.nodes[k].one_d = 1;
            CHECK(!updatable(&a, &b, &why));
            CHECK(why != NULL && strstr(why, "type") != NULL);
        }
        long m = find_type(&a, KILN_CUDA_GNODE_MEMCPY);
        if (m >= 0) {
            b = a;
            b.nodes[m].one_d = 0;
            CHECK(!updatable(&a, &b, &why));
            b = a;
            b.nodes[m].memcpy_kind = 1;
            CHECK(!updatable(&a, &b, &why));
        }
        long s = find_type(&a, KILN_CUDA_GNODE_MEMSET);
        if (s >= 0) {
            b = a;
            b.nodes[s].one_d = 0;
            CHECK(!updatable(&a, &b, &why));
        }

        // A split-K reduction appended (one more node and edge).
        if (a.n < MAX_NODES) {
            b = a;
            b.nodes[b.n] = b.nodes[0];
            b.edges[b.ne].from = b.n - 1;
            b.edges[b.ne].to = b.n;
            b.n++;
            b.ne++;
            CHECK(!updatable(&a, &b, &why));
            CHECK(why != NULL && strstr(why, "count") != NULL);
        }
        // Same counts, other wiring or edge type.
        if (a.ne >= 2) {
            b = a;
            b.edges[0].to = a.n - 1;
            CHECK(!updatable(&a, &b, &why));
            b = a;
            b.edges[1].type = 1; // programmatic
            CHECK(!updatable(&a, &b, &why));
        }
        // A node of a type the backend does not update.
        b = a;
        a.nodes[0].type = b.nodes[0].type = KILN_CUDA_GNODE_OTHER;
        CHECK(!updatable(&a, &b, &why));
    }
    return check_summary();
}
