// SPDX-License-Identifier: Apache-2.0
// CUDA graphs of a context (cuda_backend.h): the staged graph recorded at context creation (the
// layers over the staging buffers), and the graph of a signature (input shapes + device I/O
// pointers) recorded when an execute repeats the last one's (staging copies stay outside both);
// which one an execute replays is cuda_backend.c's choice. A re-recording uses
// cudaGraphExecUpdate only when cuda_graph_rules.h allows it (same kernels, no thread-block
// clusters: cuBLASLt's cluster kernels are not updated correctly), else a new instantiation. The
// recorded graph ends with a 4-byte memset of a flag in mapped pinned memory; a replay whose
// outputs need no staging waits for that write instead of cudaStreamSynchronize, about 1 us sooner
// (the synchronize also waits for the launch to retire: 5.4 against 6.6 us for a one-kernel graph
// on the H200).
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <cuda.h> // driver types only: entry points come through cudaGetDriverEntryPointByVersion

#include "cuda/cuda_backend.h"
#include "cuda/cuda_graph_rules.h"

typedef CUresult (*kernel_params_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*kernel_attr_fn)(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue *);
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static kernel_params_fn drv_kernel_params;
static kernel_attr_fn drv_kernel_attr;

// The driver's kernel-node queries (the runtime's cudaGraphKernelNodeGetParams fails, with an
// error left pending, on nodes of kernels the runtime did not load, such as cuBLASLt's).
static void driver_entry_points(void) {
    enum cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &fn, 12000,
                                         cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
        memcpy(&drv_kernel_params, &fn, sizeof fn); // object to function pointer (POSIX)
    }
    fn = NULL;
    if (cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetAttribute", &fn, 12000,
                                         cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
        memcpy(&drv_kernel_attr, &fn, sizeof fn);
    }
    kiln_cuda_consume();
}

typedef struct graph_desc {
    cudaGraphNode_t *nodes;
    kiln_cuda_gnode *info;
    kiln_cuda_gedge *edges;
    size_t n, n_edges;          // counts
    size_t n_alloc, edge_alloc; // allocated entries
} graph_desc;

static void graph_desc_free(graph_desc *d) {
    kiln_cuda_free(d->nodes, d->n_alloc * sizeof *d->nodes);
    kiln_cuda_free(d->info, d->n_alloc * sizeof *d->info);
    kiln_cuda_free(d->edges, d->edge_alloc * sizeof *d->edges);
    memset(d, 0, sizeof *d);
}

static size_t node_index(const graph_desc *d, cudaGraphNode_t node) {
    for (size_t i = 0; i < d->n; i++) {
        if (d->nodes[i] == node) return i;
    }
    return (size_t)-1;
}

// Reads one kernel node's function and launch attributes.
static void describe_kernel(cudaGraphNode_t node, kiln_cuda_gnode *inf) {
    CUDA_KERNEL_NODE_PARAMS kp;
    CUkernelNodeAttrValue v;
    inf->type = KILN_CUDA_GNODE_KERNEL;
    memset(&kp, 0, sizeof kp);
    if (drv_kernel_params == NULL || drv_kernel_attr == NULL ||
        drv_kernel_params((CUgraphNode)node, &kp) != CUDA_SUCCESS) {
        inf->info_unavailable = 1;
        return;
    }
    inf->func = kp.func != NULL ? (uintptr_t)kp.func : (uintptr_t)kp.kern;
    memset(&v, 0, sizeof v);
    if (drv_kernel_attr((CUgraphNode)node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v) !=
        CUDA_SUCCESS) {
        inf->info_unavailable = 1;
        return;
    }
    inf->cluster[0] = v.clusterDim.x;
    inf->cluster[1] = v.clusterDim.y;
    inf->cluster[2] = v.clusterDim.z;
    memset(&v, 0, sizeof v);
    if (drv_kernel_attr((CUgraphNode)node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v) != CUDA_SUCCESS) {
        inf->info_unavailable = 1;
        return;
    }
    inf->cooperative = v.cooperative != 0;
}

static void describe_node(cudaGraphNode_t node, kiln_cuda_gnode *inf) {
    enum cudaGraphNodeType t;
    if (cudaGraphNodeGetType(node, &t) != cudaSuccess) {
        inf->info_unavailable = 1;
    } else if (t == cudaGraphNodeTypeKernel) {
        describe_kernel(node, inf);
    } else if (t == cudaGraphNodeTypeMemcpy) {
        struct cudaMemcpy3DParms mp;
        inf->type = KILN_CUDA_GNODE_MEMCPY;
        memset(&mp, 0, sizeof mp);
        if (cudaGraphMemcpyNodeGetParams(node, &mp) != cudaSuccess) {
            inf->info_unavailable = 1;
            return;
        }
        inf->one_d = mp.extent.height <= 1 && mp.extent.depth <= 1 && mp.srcArray == NULL &&
                     mp.dstArray == NULL;
        inf->memcpy_kind = (int)mp.kind;
    } else if (t == cudaGraphNodeTypeMemset) {
        struct cudaMemsetParams sp;
        inf->type = KILN_CUDA_GNODE_MEMSET;
        memset(&sp, 0, sizeof sp);
        if (cudaGraphMemsetNodeGetParams(node, &sp) != cudaSuccess) {
            inf->info_unavailable = 1;
            return;
        }
        inf->one_d = sp.height <= 1;
    } else if (t == cudaGraphNodeTypeEmpty) {
        inf->type = KILN_CUDA_GNODE_EMPTY;
    } else {
        inf->type = KILN_CUDA_GNODE_OTHER;
    }
}

// Reads a graph's nodes and edges into d; 0 when it cannot (then no update is attempted).
static int graph_describe(cudaGraph_t g, graph_desc *d) {
    size_t n = 0, ne = 0, ea;
    cudaGraphNode_t *from = NULL, *to = NULL;
    cudaGraphEdgeData *data = NULL;
    int ok = 0;
    memset(d, 0, sizeof *d);
    pthread_once(&driver_once, driver_entry_points);
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess ||
        cudaGraphGetEdges(g, NULL, NULL, NULL, &ne) != cudaSuccess) {
        kiln_cuda_consume();
        return 0;
    }
    d->n_alloc = n ? n : 1;
    d->edge_alloc = ea = ne ? ne : 1;
    d->nodes = kiln_cuda_calloc(d->n_alloc * sizeof *d->nodes);
    d->info = kiln_cuda_calloc(d->n_alloc * sizeof *d->info);
    d->edges = kiln_cuda_calloc(ea * sizeof *d->edges);
    from = kiln_cuda_calloc(ea * sizeof *from);
    to = kiln_cuda_calloc(ea * sizeof *to);
    data = kiln_cuda_calloc(ea * sizeof *data);
    if (d->nodes != NULL && d->info != NULL && d->edges != NULL && from != NULL && to != NULL &&
        data != NULL && cudaGraphGetNodes(g, d->nodes, &n) == cudaSuccess &&
        cudaGraphGetEdges(g, from, to, data, &ne) == cudaSuccess && n <= d->n_alloc && ne <= ea) {
        d->n = n;
        d->n_edges = ne;
        for (size_t i = 0; i < n; i++) describe_node(d->nodes[i], &d->info[i]);
        for (size_t i = 0; i < ne; i++) {
            d->edges[i].from = node_index(d, from[i]);
            d->edges[i].to = node_index(d, to[i]);
            d->edges[i].type = data[i].type;
            d->edges[i].from_port = data[i].from_port;
            d->edges[i].to_port = data[i].to_port;
        }
        ok = 1;
    }
    kiln_cuda_consume(); // a failed query only means "no update": consume it
    kiln_cuda_free(from, ea * sizeof *from);
    kiln_cuda_free(to, ea * sizeof *to);
    kiln_cuda_free(data, ea * sizeof *data);
    return ok;
}

// 1 when the executable graph may be updated from g (cuda_graph_rules.h); 0: instantiate anew.
static int graph_updatable(const cuda_graph *cg, cudaGraph_t g) {
    graph_desc a, b;
    const char *why = "a graph could not be described";
    int ok = 0;
    if (cg->src == NULL) return 0;
    int da = graph_describe(cg->src, &a);
    int db = graph_describe(g, &b);
    if (da && db) {
        ok = kiln_cuda_graph_updatable(a.info, a.n, a.edges, a.n_edges, b.info, b.n, b.edges,
                                       b.n_edges, &why);
    }
    if (!ok) kiln_cuda_log(KILN_LOG_DEBUG, "CUDA graph re-instantiated (no update): %s", why);
    graph_desc_free(&a);
    graph_desc_free(&b);
    return ok;
}

// The node count of a freshly instantiated graph by kind (the benchmark reads the INFO lines:
// the graphs of direct signatures; the staged graph's is DEBUG).
static void graph_log_nodes(cudaGraph_t g, uint32_t n_layers, int info) {
    size_t n = 0, kinds[4] = {0, 0, 0, 0}; // kernel, memcpy, memset, other
    const int level = info ? KILN_LOG_INFO : KILN_LOG_DEBUG;
    if (!kiln_cuda_log_enabled(level)) return;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess || n == 0) {
        kiln_cuda_consume();
        return;
    }
    const size_t cap = n;
    cudaGraphNode_t *nodes = kiln_cuda_calloc(cap * sizeof *nodes);
    if (nodes != NULL && cudaGraphGetNodes(g, nodes, &n) == cudaSuccess) {
        for (size_t i = 0; i < n; i++) {
            enum cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) t = cudaGraphNodeTypeEmpty;
            kinds[t == cudaGraphNodeTypeKernel   ? 0
                  : t == cudaGraphNodeTypeMemcpy ? 1
                  : t == cudaGraphNodeTypeMemset ? 2
                                                 : 3]++;
        }
        kiln_cuda_log(level,
                      "CUDA graph %sinstantiated: %zu nodes (%zu kernels, %zu memcpy, %zu memset, "
                      "%zu other) for %u plan layers",
                      info ? "" : "over the staging buffers ", n, kinds[0], kinds[1], kinds[2],
                      kinds[3], n_layers);
    }
    kiln_cuda_consume();
    kiln_cuda_free(nodes, cap * sizeof *nodes);
}

kiln_status kiln_cuda_graph_init(cuda_graph *g, int want_flag) {
    memset(g, 0, sizeof *g);
    if (!want_flag) return KILN_OK;
    // An optimization only: without the mapped flag every execute synchronizes the stream.
    void *flag = NULL;
    if (cudaHostAlloc(&flag, 64, cudaHostAllocMapped) == cudaSuccess &&
        cudaHostGetDevicePointer(&g->done_dev, flag, 0) == cudaSuccess) {
        g->done_flag = flag;
    } else {
        if (flag != NULL) cudaFreeHost(flag);
        kiln_cuda_consume(); // non-sticky (no pinned memory left)
        g->done_dev = NULL;
        kiln_cuda_log(KILN_LOG_DEBUG, "no mapped end-of-execute flag: executes synchronize the "
                                      "stream");
    }
    return KILN_OK;
}

void kiln_cuda_graph_drop(cuda_graph *g) {
    if (g->valid) cudaGraphExecDestroy(g->exec);
    if (g->src != NULL) cudaGraphDestroy(g->src);
    g->valid = 0;
    g->src = NULL;
}

void kiln_cuda_graph_free(cuda_graph *g) {
    kiln_cuda_graph_drop(g);
    if (g->done_flag != NULL) cudaFreeHost((void *)(uintptr_t)g->done_flag);
    g->done_flag = NULL;
}

kiln_status kiln_cuda_graph_record(cuda_graph *cg, cudaStream_t stream,
                                   kiln_status (*enqueue)(void *arg, cudaStream_t s), void *arg,
                                   uint32_t n_layers, int log_info) {
    cudaGraph_t g = NULL;
    kiln_status st;
    cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) return kiln_cuda_call_failed("cudaStreamBeginCapture", err);
    st = enqueue(arg, stream);
    if (st == KILN_OK && cg->done_flag != NULL) { // the last node: the end-of-execute flag
        err = cudaMemsetAsync(cg->done_dev, 0, sizeof(uint32_t), stream);
        if (err != cudaSuccess) st = kiln_cuda_call_failed("cudaMemsetAsync (execute flag)", err);
    }
    err = cudaStreamEndCapture(stream, &g); // always ends the capture, even after a failure
    if (st != KILN_OK) {
        if (g != NULL) cudaGraphDestroy(g);
        kiln_cuda_consume();
        return st;
    }
    if (err != cudaSuccess) return kiln_cuda_call_failed("cudaStreamEndCapture", err);
    if (cg->valid && graph_updatable(cg, g)) {
        cudaGraphExecUpdateResultInfo info;
        memset(&info, 0, sizeof info);
        err = cudaGraphExecUpdate(cg->exec, g, &info);
        if (err == cudaSuccess) {
            cudaGraphDestroy(cg->src);
            cg->src = g;
            cg->updates++;
            return KILN_OK;
        }
        // Expected (cudaErrorGraphExecUpdateFailure, not sticky): consume it, re-instantiate.
        kiln_cuda_consume();
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cudaGraphExecUpdate refused (%s, result %d): re-instantiating",
                      cudaGetErrorName(err), (int)info.result);
    }
    kiln_cuda_graph_drop(cg);
    err = cudaGraphInstantiate(&cg->exec, g, 0);
    if (err != cudaSuccess) {
        cudaGraphDestroy(g);
        return kiln_cuda_call_failed("cudaGraphInstantiate", err);
    }
    cg->src = g;
    cg->valid = 1;
    cg->instantiations++;
    // The graph's first launch would upload it to the device; done here, a graph recorded at
    // context creation (the staged one) costs its first execute only the launch. A failure is
    // left to that launch, which uploads the graph itself.
    if (cudaGraphUpload(cg->exec, stream) != cudaSuccess) kiln_cuda_consume();
    graph_log_nodes(g, n_layers, log_info);
    return KILN_OK;
}

kiln_status kiln_cuda_graph_launch(cuda_graph *g, cudaStream_t stream) {
    if (g->done_flag != NULL) {
        // the fence orders the store before the launch's own writes (on weakly ordered hosts
        // too), so the device's 0 always lands last
        *g->done_flag = 1;
        atomic_thread_fence(memory_order_seq_cst);
    }
    cudaError_t err = cudaGraphLaunch(g->exec, stream);
    if (err != cudaSuccess) return kiln_cuda_call_failed("cudaGraphLaunch", err);
    return KILN_OK;
}

// The stream is queried every 4096 polls, so a fault (the flag's node then never runs) or an
// idle stream ends the wait too; the caller's device schedule is spin (cuda_backend.c).
cudaError_t kiln_cuda_graph_wait(const cuda_graph *g, cudaStream_t stream, int by_flag) {
    if (!by_flag || g->done_flag == NULL) return cudaStreamSynchronize(stream);
    for (uint32_t i = 1;; i++) {
        if (*g->done_flag == 0) {
            atomic_thread_fence(memory_order_acquire);
            return cudaSuccess;
        }
        if ((i & 4095u) == 0) {
            cudaError_t e = cudaStreamQuery(stream);
            if (e != cudaErrorNotReady) return e;
            kiln_cuda_consume(); // "not ready" is no error: leave none pending
        }
    }
}
