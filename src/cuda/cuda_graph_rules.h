// SPDX-License-Identifier: Apache-2.0
// When may an executable CUDA graph be updated in place (cudaGraphExecUpdate) from a newly
// captured graph, rather than instantiated anew? Pure C (no CUDA header), so that the rule is
// tested on machines without a GPU (tests/cuda/cuda_graph_rules_test.c).
//
// cudaGraphExecUpdate checks topology and a few parameter constraints itself, but
//  * a failed update is an API error (cudaErrorGraphExecUpdateFailure) that tools such as
//    compute-sanitizer report, and
//  * it does NOT correctly carry a change of thread-block cluster dimensions (cuBLASLt's Hopper
//    kernels launch with clusters, and pick other kernels, clusters and split-K reductions when
//    the shapes change): the update "succeeds" and the replay computes wrong results
//    (ml-explore/mlx#2748, fixed by re-instantiating in mlx#2813).
// So the backend updates only when this conservative rule holds, and re-instantiates otherwise:
//  * the same number of nodes, pairwise of the same type, and the same edges (by node index,
//    with the same edge type and ports);
//  * kernel nodes: the same function, not cooperative, no cluster launch attribute (or 1x1x1) in
//    either graph: only the grid, block, shared-memory size and arguments may differ;
//  * memcpy and memset nodes: 1-D on both sides, same memcpy kind;
//  * empty nodes; any other node type: no update.
// Then how an execute runs its layers (kiln_cuda_run_choice), pure C too.
#ifndef KILN_CUDA_CUDA_GRAPH_RULES_H
#define KILN_CUDA_CUDA_GRAPH_RULES_H

#include <stddef.h>
#include <stdint.h>

enum {
    KILN_CUDA_GNODE_OTHER = 0,
    KILN_CUDA_GNODE_KERNEL = 1,
    KILN_CUDA_GNODE_MEMCPY = 2,
    KILN_CUDA_GNODE_MEMSET = 3,
    KILN_CUDA_GNODE_EMPTY = 4,
};

typedef struct kiln_cuda_gnode {
    int type;             // KILN_CUDA_GNODE_*
    uintptr_t func;       // kernel: the function (driver handle)
    uint32_t cluster[3];  // kernel: cluster launch attribute (0 or 1 = none)
    int cooperative;      // kernel: cooperative launch attribute
    int one_d;            // memcpy / memset: a 1-D operation
    int memcpy_kind;      // memcpy: the copy kind
    int info_unavailable; // the node's parameters could not be read
} kiln_cuda_gnode;

typedef struct kiln_cuda_gedge {
    size_t from, to; // node indices
    int type, from_port, to_port;
} kiln_cuda_gedge;

static inline int kiln_cuda_gnode_clustered(const kiln_cuda_gnode *n) {
    return (n->cluster[0] > 1 || n->cluster[1] > 1 || n->cluster[2] > 1);
}

// 1 when an executable graph instantiated from (old_nodes, old_edges) may be updated from
// (new_nodes, new_edges); else 0 and *why names the first reason.
static inline int kiln_cuda_graph_updatable(const kiln_cuda_gnode *old_nodes, size_t n_old,
                                            const kiln_cuda_gedge *old_edges, size_t e_old,
                                            const kiln_cuda_gnode *new_nodes, size_t n_new,
                                            const kiln_cuda_gedge *new_edges, size_t e_new,
                                            const char **why) {
    const char *w = NULL;
    if (n_old != n_new)
        w = "node count differs";
    else if (e_old != e_new)
        w = "edge count differs";
    for (size_t i = 0; w == NULL && i < n_new; i++) {
        const kiln_cuda_gnode *a = &old_nodes[i], *b = &new_nodes[i];
        if (a->info_unavailable || b->info_unavailable)
            w = "node parameters unavailable";
        else if (a->type != b->type)
            w = "node type differs";
        else if (a->type == KILN_CUDA_GNODE_OTHER)
            w = "node of a type that is not updated";
        else if (a->type == KILN_CUDA_GNODE_KERNEL) {
            if (a->func != b->func)
                w = "kernel function differs";
            else if (kiln_cuda_gnode_clustered(a) || kiln_cuda_gnode_clustered(b))
                w = "kernel launched with thread-block clusters";
            else if (a->cooperative || b->cooperative)
                w = "cooperative kernel";
        } else if (a->type == KILN_CUDA_GNODE_MEMCPY || a->type == KILN_CUDA_GNODE_MEMSET) {
            if (!a->one_d || !b->one_d)
                w = "memcpy/memset that is not 1-D";
            else if (a->type == KILN_CUDA_GNODE_MEMCPY && a->memcpy_kind != b->memcpy_kind)
                w = "memcpy kind differs";
        }
    }
    for (size_t i = 0; w == NULL && i < e_new; i++) {
        const kiln_cuda_gedge *a = &old_edges[i], *b = &new_edges[i];
        if (a->from != b->from || a->to != b->to || a->type != b->type ||
            a->from_port != b->from_port || a->to_port != b->to_port) {
            w = "edges differ";
        }
    }
    if (why != NULL) *why = w;
    return w == NULL;
}

// How an execute runs the layers (cuda_backend.c), from what it knows of its signature (the
// I/O addresses as bound, and the inputs' shapes) and of the context's two graphs: the graph of
// the last recorded signature, and the staged graph (the layers over the I/O staging buffers at
// the largest shapes, recorded at context creation). Recording costs a host pass over the layers
// (the libraries' calls: cuDNN's legacy convolution call ~0.1 ms each), so it happens only when a
// signature repeats the last execute's; an execute at the largest shapes otherwise stages its I/O
// and replays the staged graph.
enum {
    KILN_CUDA_RUN_DIRECT, // the layer loop, launched directly
    KILN_CUDA_RUN_REPLAY, // the signature's graph replayed
    KILN_CUDA_RUN_RECORD, // a graph recorded for this signature, then replayed
    KILN_CUDA_RUN_STAGED, // the I/O staged and the staged graph replayed
};

typedef struct kiln_cuda_run_facts {
    int use_graph;      // graphs on for this execute (use_cuda_graphs, not a special stream, not
                        // inside a caller's capture)
    int graph_matches;  // the signature graph is valid, recorded for this signature, shapes as then
    int at_largest;     // every tensor is bound at its largest shape
    int staged_ok;      // the context has a staged graph (or may record it: its recording did not
                        // fail at context creation)
    int staged_matches; // ... it is valid and this execute's signature is its own (host I/O)
    int repeats_last;   // the signature and shapes are the last execute's
} kiln_cuda_run_facts;

static inline int kiln_cuda_run_choice(const kiln_cuda_run_facts *f) {
    if (!f->use_graph) return KILN_CUDA_RUN_DIRECT;
    if (f->graph_matches) return KILN_CUDA_RUN_REPLAY;
    const int staged = f->staged_ok && f->at_largest;
    if (staged && f->staged_matches) return KILN_CUDA_RUN_STAGED;
    if (f->repeats_last) return KILN_CUDA_RUN_RECORD;
    return staged ? KILN_CUDA_RUN_STAGED : KILN_CUDA_RUN_DIRECT;
}

#endif // KILN_CUDA_CUDA_GRAPH_RULES_H
