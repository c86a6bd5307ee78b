// SPDX-License-Identifier: Apache-2.0
// The CUDA backend (host glue, C): the plugin's entry point, and the kiln_backend_ops the runtime
// drives (src/runtime/backend.h).
//
// Engine: the device ("auto" = 0, "cuda:N"), every weight uploaded once into one device block
// (256-byte aligned offsets), every layer checked against kiln_cuda_supports at its largest
// shapes. Context: a non-blocking stream, a cuBLASLt handle and workspace, ONE activation arena
// (plan->arena_nbytes, zeroed), a staging buffer per I/O binding (its largest size), a tensor
// view per plan tensor, a GEMM set-up cache per layer.
// Execute: each I/O pointer is bound directly when it is memory of this device (or managed),
// else staged (cudaMemcpyAsync before and after the layers); the layers run on the caller's
// stream if one was set, else the context's; nothing is allocated and nothing synchronizes
// until the final cudaStreamSynchronize. With use_cuda_graphs the first execute of a signature
// (input shapes + device I/O pointers) runs directly, the second records the layer loop into a
// CUDA graph (staging copies stay outside it) and later ones replay it; a new signature runs
// directly once and is then re-recorded (cudaGraphExecUpdate, else a new instantiation).
// A CUDA error marks the context failed: later executes return KILN_ERR_DEVICE at once.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "cuda/cuda_ops.h"

#define WORKSPACE_NBYTES ((size_t)32 << 20) // cuBLASLt workspace per context (Hopper: 32 MiB)
#define WEIGHT_ALIGN 256

#if defined(__GNUC__)
#define KILN_CUDA_EXPORT __attribute__((visibility("default")))
#else
#define KILN_CUDA_EXPORT
#endif

typedef struct cuda_engine {
    const kiln_plan *plan; // borrowed: outlives the state
    int device;
    int use_graphs;
    int debug_sync; // KILN_CUDA_DEBUG_SYNC: graphs off, synchronize after every layer
    int sm_count;
    void *weights; // device, owned
    size_t weights_nbytes;
    uint64_t *weight_offsets; // host, n_tensors entries
} cuda_engine;

typedef struct cuda_context {
    const cuda_engine *engine;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *arena;
    void *workspace;
    size_t workspace_nbytes;
    uint32_t n_io;              // n_inputs + n_outputs (bindings: inputs first)
    void **staging;             // n_io device buffers (NULL when the binding is empty)
    uint8_t *staged;            // n_io: this execute stages binding i
    kiln_tensor *views;         // n_tensors
    kiln_cuda_gemm_cache *gemm; // n_layers
    // graph signatures: n_io device pointers, then for each input rank and KILN_MAX_RANK dims
    size_t sig_n; // int64 entries
    int64_t *sig_now, *sig_last, *sig_graph;
    int last_valid;
    cudaGraphExec_t graph;
    int graph_valid;
    int failed;
    char fail_msg[512];
} cuda_context;

// --- small helpers

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

// KILN_CUDA_NO_CUBLASLT=1: every GEMM through Kiln's own kernel (debugging).
static int no_cublaslt(void) { return env_flag("KILN_CUDA_NO_CUBLASLT"); }

static kiln_status cuda_fail(const char *what, cudaError_t err) {
    kiln_status st = err == cudaErrorMemoryAllocation ? KILN_ERR_NO_MEMORY : KILN_ERR_DEVICE;
    return kiln_cuda_fail(st, "CUDA error in %s: %s (%s)", what, cudaGetErrorName(err),
                          cudaGetErrorString(err));
}

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = cuda_fail(what, e_);                                                              \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

// Makes `device` current, remembering the caller's device.
static kiln_status device_enter(int device, int *prev) {
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) *prev = -1;
    if (*prev == device) return KILN_OK;
    e = cudaSetDevice(device);
    return e == cudaSuccess ? KILN_OK : cuda_fail("cudaSetDevice", e);
}

static void device_leave(int device, int prev) {
    if (prev >= 0 && prev != device) cudaSetDevice(prev);
}

static int parse_device(const char *s, int *out) {
    if (strcmp(s, "auto") == 0) {
        *out = 0;
        return 1;
    }
    if (strncmp(s, "cuda:", 5) == 0) {
        char *end;
        long n = strtol(s + 5, &end, 10);
        if (end != s + 5 && *end == '\0' && n >= 0 && n < 1024) {
            *out = (int)n;
            return 1;
        }
    }
    return 0;
}

static uint64_t tensor_nbytes(uint32_t dtype, uint32_t rank, const int64_t *dims) {
    uint64_t n = kiln_cuda_dtype_size(dtype);
    for (uint32_t i = 0; i < rank; i++) n *= (uint64_t)(dims[i] > 0 ? dims[i] : 0);
    return n;
}

// The kernel arguments of head layer li over `views`, tails[] receiving its fused tail (the
// runtime's grouping: a head, then n_tail TAIL layers each reading the running value once).
static void build_args(const kiln_plan *p, kiln_tensor *views, uint32_t li, kiln_tail_op *tails,
                       kiln_kernel_args *args) {
    const kiln_plan_layer *l = &p->layers[li];
    int32_t running = p->ids[l->output_begin];
    memset(args, 0, sizeof *args);
    args->op = l->op;
    args->attrs = kiln_plan_layer_attrs(p, l);
    for (uint32_t j = 0; j < l->n_inputs && j < KILN_MAX_INPUTS; j++) {
        int32_t id = p->ids[l->input_begin + j];
        args->in[j] = id < 0 ? NULL : &views[id];
    }
    args->n_in = l->n_inputs;
    for (uint32_t t = 0; t < l->n_tail && t < KILN_MAX_TAIL; t++) {
        const kiln_plan_layer *tl = &p->layers[li + 1 + t];
        int32_t a = p->ids[tl->input_begin];
        int32_t b = tl->n_inputs > 1 ? p->ids[tl->input_begin + 1] : -1;
        tails[t].op = tl->op;
        tails[t].attrs = kiln_plan_layer_attrs(p, tl);
        tails[t].running_is_lhs = a == running;
        tails[t].operand = tl->n_inputs < 2 ? NULL : a == running ? &views[b] : &views[a];
        running = p->ids[tl->output_begin];
    }
    args->out = &views[running]; // the head writes the group's final tensor; tails run in place
    args->tail = tails;
    args->n_tail = l->n_tail;
}

// --- engine

static void cuda_engine_free(void *state) {
    cuda_engine *e = state;
    int prev;
    if (e == NULL) return;
    if (e->weights != NULL && device_enter(e->device, &prev) == KILN_OK) {
        cudaFree(e->weights);
        device_leave(e->device, prev);
    }
    kiln_cuda_free(e->weight_offsets, (size_t)e->plan->n_tensors * sizeof *e->weight_offsets);
    kiln_cuda_free(e, sizeof *e);
}

// Checks every layer at its largest shapes (data pointers are NULL: nothing runs).
static kiln_status check_layers(const kiln_plan *p) {
    size_t nbytes = (size_t)p->n_tensors * sizeof(kiln_tensor);
    kiln_tensor *views = kiln_cuda_calloc(nbytes);
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_kernel_args args;
    kiln_status st = KILN_OK;
    char why[256];
    if (views == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory checking layers");
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        views[i].dtype = p->tensors[i].dtype;
        views[i].rank = p->tensors[i].shape.rank;
        memcpy(views[i].dims, p->tensors[i].shape.max, sizeof views[i].dims);
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if (p->layers[li].n_tail > KILN_MAX_TAIL || li + p->layers[li].n_tail >= p->n_layers) {
            st = kiln_cuda_fail(KILN_ERR_CORRUPT, "layer %u: bad fused tail count %u", li,
                                p->layers[li].n_tail);
            break;
        }
        build_args(p, views, li, tails, &args);
        if (!kiln_cuda_supports(&args, why, sizeof why)) {
            st = kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                                "layer %u: the CUDA backend cannot run it: %s; load the engine "
                                "with device 'cpu'",
                                li, why);
            break;
        }
    }
    kiln_cuda_free(views, nbytes);
    return st;
}

static kiln_status cuda_engine_init(const kiln_plan *p, const void *const *weight_data,
                                    const kiln_options *options, void **out_state) {
    cuda_engine *e;
    struct cudaDeviceProp prop;
    int device, count = 0, prev = -1, entered = 0;
    uint64_t total = 0;
    kiln_status st;
    if (!parse_device(options->device, &device)) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "device '%s' is not a CUDA device",
                              options->device);
    }
    if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
        cudaGetLastError();
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "device '%s' does not exist: %d CUDA device%s visible; use cuda:0 .. "
                              "cuda:%d, or check CUDA_VISIBLE_DEVICES",
                              options->device, count, count == 1 ? " is" : "s are",
                              count > 0 ? count - 1 : 0);
    }
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return kiln_cuda_fail(KILN_ERR_DEVICE, "cudaGetDeviceProperties(%d) failed", device);
    }
    if (prop.major < 9) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "device %d (%s) has compute capability %d.%d; this build of the "
                              "CUDA backend carries code for 9.0 (Hopper) and newer only: use "
                              "device 'cpu'",
                              device, prop.name, prop.major, prop.minor);
    }
    KILN_CUDA_TRY(check_layers(p));
    e = kiln_cuda_calloc(sizeof *e);
    if (e == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA engine)");
    e->plan = p;
    e->device = device;
    e->debug_sync = env_flag("KILN_CUDA_DEBUG_SYNC");
    e->use_graphs = options->use_cuda_graphs != 0 && !e->debug_sync;
    e->sm_count = prop.multiProcessorCount;
    e->weight_offsets = kiln_cuda_calloc((size_t)p->n_tensors * sizeof *e->weight_offsets);
    if (e->weight_offsets == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA weight table)");
        goto fail;
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].kind != KILN_TENSOR_WEIGHT) continue;
        e->weight_offsets[i] = total;
        total += (p->tensors[i].nbytes + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN;
    }
    st = device_enter(device, &prev);
    if (st != KILN_OK) goto fail;
    entered = 1;
    st = kiln_cuda_attention_init();
    if (st != KILN_OK) goto fail;
    if (total > 0) {
        e->weights_nbytes = (size_t)total;
        CUDA_TRY(cudaMalloc(&e->weights, e->weights_nbytes), "cudaMalloc (weights)");
        for (uint32_t i = 0; i < p->n_tensors; i++) {
            const kiln_plan_tensor *t = &p->tensors[i];
            if (t->kind != KILN_TENSOR_WEIGHT || t->nbytes == 0) continue;
            CUDA_TRY(cudaMemcpy((uint8_t *)e->weights + e->weight_offsets[i], weight_data[i],
                                (size_t)t->nbytes, cudaMemcpyHostToDevice),
                     "cudaMemcpy (weight upload)");
        }
    }
    device_leave(device, prev);
    kiln_cuda_log(KILN_LOG_INFO,
                  "CUDA engine on device %d (%s): %u layers, %zu bytes of weights, arena %llu "
                  "bytes, CUDA graphs %s",
                  device, prop.name, p->n_layers, e->weights_nbytes,
                  (unsigned long long)p->arena_nbytes, e->use_graphs ? "on" : "off");
    *out_state = e;
    return KILN_OK;

fail:
    if (st != KILN_OK) cudaGetLastError(); // allocation failures are not sticky: clear them
    if (entered) device_leave(device, prev);
    cuda_engine_free(e);
    return st;
}

// --- context

static void cuda_context_free(void *state) {
    cuda_context *c = state;
    int prev = -1, entered;
    if (c == NULL) return;
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    entered = device_enter(e->device, &prev) == KILN_OK;
    if (entered) {
        if (c->stream != NULL) cudaStreamSynchronize(c->stream);
        if (c->graph_valid) cudaGraphExecDestroy(c->graph);
        if (c->staging != NULL) {
            for (uint32_t i = 0; i < c->n_io; i++) cudaFree(c->staging[i]);
        }
        cudaFree(c->arena);
        cudaFree(c->workspace);
        if (c->lt != NULL) cublasLtDestroy(c->lt);
        if (c->stream != NULL) cudaStreamDestroy(c->stream);
        cudaGetLastError();
        device_leave(e->device, prev);
    }
    kiln_cuda_free(c->staging, (size_t)c->n_io * sizeof *c->staging);
    kiln_cuda_free(c->staged, c->n_io);
    kiln_cuda_free(c->views, (size_t)p->n_tensors * sizeof *c->views);
    kiln_cuda_free(c->gemm, (size_t)p->n_layers * sizeof *c->gemm);
    kiln_cuda_free(c->sig_now, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_last, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_graph, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c, sizeof *c);
}

static uint32_t binding_tensor(const kiln_plan *p, uint32_t b) {
    return b < p->n_inputs ? p->inputs[b] : p->outputs[b - p->n_inputs];
}

// Chooses every GEMM layer's cuBLASLt algorithm now, at the largest shapes with the I/O in the
// staging buffers, so that a first execute at those shapes finds it cached.
static void prepare_gemms(cuda_context *c) {
    const kiln_plan *p = c->engine->plan;
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_kernel_args args;
    kiln_cuda_ctx ctx;
    char where[96];
    if (c->lt == NULL) return;
    memset(&ctx, 0, sizeof ctx);
    ctx.stream = c->stream;
    ctx.lt = c->lt;
    ctx.workspace = c->workspace;
    ctx.workspace_nbytes = c->workspace_nbytes;
    ctx.sm_count = c->engine->sm_count;
    ctx.where = where;
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        uint32_t op = p->layers[li].op;
        if (op != KILN_OP_LINEAR && op != KILN_OP_MATMUL) continue;
        build_args(p, c->views, li, tails, &args);
        snprintf(where, sizeof where, "layer %u (%s)", li, kiln_cuda_op_name(op));
        ctx.gemm = &c->gemm[li];
        (void)kiln_cuda_gemm_prepare(&ctx, &args); // a miss only means a set-up at execute
    }
}

static kiln_status cuda_context_init(void *engine_state, void **out_state) {
    const cuda_engine *e = engine_state;
    const kiln_plan *p = e->plan;
    cuda_context *c;
    int prev = -1, entered = 0;
    kiln_status st = KILN_OK;
    c = kiln_cuda_calloc(sizeof *c);
    if (c == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA context)");
    c->engine = e;
    c->n_io = p->n_inputs + p->n_outputs;
    c->sig_n = (size_t)c->n_io + (size_t)p->n_inputs * (1 + KILN_MAX_RANK);
    c->staging = kiln_cuda_calloc((size_t)c->n_io * sizeof *c->staging);
    c->staged = kiln_cuda_calloc(c->n_io);
    c->views = kiln_cuda_calloc((size_t)p->n_tensors * sizeof *c->views);
    c->gemm = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->gemm);
    c->sig_now = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_last = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_graph = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    if ((c->n_io > 0 && (c->staging == NULL || c->staged == NULL)) ||
        (p->n_tensors > 0 && c->views == NULL) || (p->n_layers > 0 && c->gemm == NULL) ||
        c->sig_now == NULL || c->sig_last == NULL || c->sig_graph == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA context tables)");
        goto fail;
    }
    st = device_enter(e->device, &prev);
    if (st != KILN_OK) goto fail;
    entered = 1;
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!no_cublaslt()) {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            c->lt = NULL;
            st = kiln_cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_NO_MEMORY
                                                                : KILN_ERR_DEVICE,
                                "cublasLtCreate failed: %s", cublasLtGetStatusString(s));
            goto fail;
        }
        c->workspace_nbytes = WORKSPACE_NBYTES;
        CUDA_TRY(cudaMalloc(&c->workspace, c->workspace_nbytes), "cudaMalloc (cuBLASLt workspace)");
    }
    if (p->arena_nbytes > 0) {
        CUDA_TRY(cudaMalloc(&c->arena, (size_t)p->arena_nbytes), "cudaMalloc (activation arena)");
        CUDA_TRY(cudaMemsetAsync(c->arena, 0, (size_t)p->arena_nbytes, c->stream),
                 "cudaMemsetAsync (arena)");
    }
    for (uint32_t b = 0; b < c->n_io; b++) {
        const kiln_plan_tensor *t = &p->tensors[binding_tensor(p, b)];
        uint64_t n = tensor_nbytes(t->dtype, t->shape.rank, t->shape.max);
        if (n > 0) CUDA_TRY(cudaMalloc(&c->staging[b], (size_t)n), "cudaMalloc (I/O staging)");
    }
    CUDA_TRY(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (context init)");
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        c->views[i].dtype = t->dtype;
        c->views[i].rank = t->shape.rank;
        memcpy(c->views[i].dims, t->shape.max, sizeof c->views[i].dims);
        if (t->kind == KILN_TENSOR_WEIGHT) {
            c->views[i].data = (uint8_t *)e->weights + e->weight_offsets[i];
        } else if (t->kind == KILN_TENSOR_ACTIVATION) {
            c->views[i].data = (uint8_t *)c->arena + t->offset;
        }
    }
    for (uint32_t b = 0; b < c->n_io; b++) c->views[binding_tensor(p, b)].data = c->staging[b];
    prepare_gemms(c);
    device_leave(e->device, prev);
    *out_state = c;
    return KILN_OK;

fail:
    cudaGetLastError();
    if (entered) device_leave(e->device, prev);
    cuda_context_free(c);
    return st;
}

// --- execute

// 1 when ptr is memory the kernels of `device` may use directly (device memory of that device,
// or managed memory).
static int is_device_memory(const void *ptr, int device) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        cudaGetLastError(); // older drivers: unregistered host memory is an error
        return 0;
    }
    if (a.type == cudaMemoryTypeManaged) return 1;
    return a.type == cudaMemoryTypeDevice && a.device == device;
}

static kiln_status run_layers(cuda_context *c, cudaStream_t stream) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_kernel_args args;
    kiln_cuda_ctx ctx;
    char where[96];
    memset(&ctx, 0, sizeof ctx);
    ctx.stream = stream;
    ctx.lt = c->lt;
    ctx.workspace = c->workspace;
    ctx.workspace_nbytes = c->workspace_nbytes;
    ctx.sm_count = e->sm_count;
    ctx.where = where;
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        build_args(p, c->views, li, tails, &args);
        snprintf(where, sizeof where, "layer %u (%s)", li, kiln_cuda_op_name(args.op));
        ctx.gemm = &c->gemm[li];
        KILN_CUDA_TRY(kiln_cuda_run(&ctx, &args));
        if (e->debug_sync) { // finds the layer of an asynchronous fault
            cudaError_t err = cudaStreamSynchronize(stream);
            if (err != cudaSuccess)
                return kiln_cuda_error(&ctx, "cudaStreamSynchronize (debug)", err);
        }
    }
    return KILN_OK;
}

// Records the layer loop into a graph (updating the existing executable graph when possible).
static kiln_status record_graph(cuda_context *c, cudaStream_t stream) {
    cudaGraph_t g = NULL;
    kiln_status st;
    cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) return cuda_fail("cudaStreamBeginCapture", err);
    st = run_layers(c, stream);
    err = cudaStreamEndCapture(stream, &g); // always ends the capture, even after a failure
    if (st != KILN_OK) {
        if (g != NULL) cudaGraphDestroy(g);
        cudaGetLastError();
        return st;
    }
    if (err != cudaSuccess) return cuda_fail("cudaStreamEndCapture", err);
    if (c->graph_valid) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(c->graph, g, &info) == cudaSuccess) {
            cudaGraphDestroy(g);
            return KILN_OK;
        }
        cudaGetLastError(); // topology changed: instantiate anew
        cudaGraphExecDestroy(c->graph);
        c->graph_valid = 0;
    }
    err = cudaGraphInstantiate(&c->graph, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) return cuda_fail("cudaGraphInstantiate", err);
    c->graph_valid = 1;
    return KILN_OK;
}

static kiln_status execute_on(cuda_context *c, const kiln_exec *exec, cudaStream_t stream) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t err;
    int special = stream == cudaStreamLegacy || stream == cudaStreamPerThread;
    int external_capture = 0;
    if (!special && stream != NULL) {
        err = cudaStreamIsCapturing(stream, &cap);
        if (err != cudaSuccess) return cuda_fail("cudaStreamIsCapturing", err);
        external_capture = cap != cudaStreamCaptureStatusNone;
    }
    // Shapes, then I/O binding: direct or staged.
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        c->views[i].rank = exec->tensors[i].rank;
        memcpy(c->views[i].dims, exec->tensors[i].dims, sizeof c->views[i].dims);
    }
    for (uint32_t b = 0; b < c->n_io; b++) {
        uint32_t t = binding_tensor(p, b);
        void *user = exec->tensors[t].data;
        uint64_t n = tensor_nbytes(c->views[t].dtype, c->views[t].rank, c->views[t].dims);
        int direct = n == 0 || c->staging[b] == NULL || is_device_memory(user, e->device);
        c->staged[b] = (uint8_t)!direct;
        c->views[t].data = direct ? user : c->staging[b];
        c->sig_now[b] = (int64_t)(uintptr_t)c->views[t].data;
    }
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        const kiln_tensor *t = &exec->tensors[p->inputs[i]];
        int64_t *s = c->sig_now + c->n_io + (size_t)i * (1 + KILN_MAX_RANK);
        s[0] = t->rank;
        for (uint32_t d = 0; d < KILN_MAX_RANK; d++) s[1 + d] = d < t->rank ? t->dims[d] : 0;
    }
    for (uint32_t b = 0; b < p->n_inputs; b++) {
        uint32_t t = binding_tensor(p, b);
        uint64_t n = tensor_nbytes(c->views[t].dtype, c->views[t].rank, c->views[t].dims);
        if (!c->staged[b]) continue;
        err = cudaMemcpyAsync(c->staging[b], exec->tensors[t].data, (size_t)n, cudaMemcpyDefault,
                              stream);
        if (err != cudaSuccess) return cuda_fail("cudaMemcpyAsync (input staging)", err);
    }
    // The layers: direct, recorded or replayed.
    size_t sig_nbytes = c->sig_n * sizeof(int64_t);
    int use_graph = e->use_graphs && !special && !external_capture;
    int same_as_last =
        c->last_valid && !exec->shapes_changed && memcmp(c->sig_now, c->sig_last, sig_nbytes) == 0;
    if (use_graph && c->graph_valid && memcmp(c->sig_now, c->sig_graph, sig_nbytes) == 0 &&
        !exec->shapes_changed) {
        err = cudaGraphLaunch(c->graph, stream);
        if (err != cudaSuccess) return cuda_fail("cudaGraphLaunch", err);
    } else if (use_graph && same_as_last) {
        KILN_CUDA_TRY(record_graph(c, stream));
        memcpy(c->sig_graph, c->sig_now, sig_nbytes);
        err = cudaGraphLaunch(c->graph, stream);
        if (err != cudaSuccess) return cuda_fail("cudaGraphLaunch", err);
    } else {
        KILN_CUDA_TRY(run_layers(c, stream));
    }
    memcpy(c->sig_last, c->sig_now, sig_nbytes);
    c->last_valid = 1;
    for (uint32_t b = p->n_inputs; b < c->n_io; b++) {
        uint32_t t = binding_tensor(p, b);
        uint64_t n = tensor_nbytes(c->views[t].dtype, c->views[t].rank, c->views[t].dims);
        if (!c->staged[b]) continue;
        err = cudaMemcpyAsync(exec->tensors[t].data, c->staging[b], (size_t)n, cudaMemcpyDefault,
                              stream);
        if (err != cudaSuccess) return cuda_fail("cudaMemcpyAsync (output staging)", err);
    }
    if (external_capture) return KILN_OK; // the caller's graph runs the work later
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "CUDA error in cudaStreamSynchronize at the end of execute: %s (%s); "
                              "a kernel of this engine faulted (set KILN_CUDA_DEBUG_SYNC=1 to name "
                              "the layer)",
                              cudaGetErrorName(err), cudaGetErrorString(err));
    }
    return KILN_OK;
}

static kiln_status cuda_execute(void *context_state, const kiln_exec *exec) {
    cuda_context *c = context_state;
    const cuda_engine *e = c->engine;
    cudaStream_t stream = exec->stream != NULL ? (cudaStream_t)exec->stream : c->stream;
    int prev = -1;
    kiln_status st;
    if (c->failed) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "this CUDA execution context failed earlier and can no longer run "
                              "(%s); free it and create a new context (after a sticky CUDA error "
                              "such as an illegal address, restart the process)",
                              c->fail_msg);
    }
    st = device_enter(e->device, &prev);
    if (st == KILN_OK) st = execute_on(c, exec, stream);
    if (st == KILN_ERR_DEVICE) {
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", kiln_cuda_last_message());
        c->failed = 1;
        c->last_valid = 0;
        cudaStreamSynchronize(stream); // leave no work in flight on the caller's buffers
        cudaGetLastError();
    } else if (st != KILN_OK) {
        c->last_valid = 0;
        cudaStreamSynchronize(stream);
        cudaGetLastError();
    }
    device_leave(e->device, prev);
    return st;
}

// --- test hook: one layer on device tensors

static kiln_status plugin_run_op(const kiln_kernel_args *args, int device, void *stream,
                                 uint32_t flags) {
    kiln_cuda_ctx ctx;
    cudaStream_t own = NULL;
    int prev = -1, entered = 0;
    char where[96], why[256];
    kiln_status st = KILN_OK;
    memset(&ctx, 0, sizeof ctx);
    if (!kiln_cuda_supports(args, why, sizeof why)) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "run_op: %s", why);
    }
    st = device_enter(device, &prev);
    if (st != KILN_OK) return st;
    entered = 1;
    st = kiln_cuda_attention_init();
    if (st != KILN_OK) goto fail;
    if (stream == NULL) {
        CUDA_TRY(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "cudaStreamCreate");
        stream = own;
    }
    ctx.stream = (cudaStream_t)stream;
    if (!(flags & KILN_CUDA_RUN_NO_CUBLASLT) && !no_cublaslt()) {
        if (cublasLtCreate(&ctx.lt) != CUBLAS_STATUS_SUCCESS) {
            ctx.lt = NULL;
            st = kiln_cuda_fail(KILN_ERR_DEVICE, "run_op: cublasLtCreate failed");
            goto fail;
        }
        ctx.workspace_nbytes = WORKSPACE_NBYTES;
        CUDA_TRY(cudaMalloc(&ctx.workspace, ctx.workspace_nbytes), "cudaMalloc (workspace)");
    }
    snprintf(where, sizeof where, "run_op (%s)", kiln_cuda_op_name(args->op));
    ctx.where = where;
    st = kiln_cuda_run(&ctx, args);
    if (st == KILN_OK)
        CUDA_TRY(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize (run_op)");

fail:
    if (ctx.stream != NULL) cudaStreamSynchronize(ctx.stream);
    cudaFree(ctx.workspace);
    if (ctx.lt != NULL) cublasLtDestroy(ctx.lt);
    if (own != NULL) cudaStreamDestroy(own);
    if (entered) device_leave(device, prev);
    return st;
}

// --- plugin entry point

static once_flag probe_once = ONCE_FLAG_INIT;
static int probe_ok;
static int probe_count;
static char probe_reason[512];
static char version_text[512];

static int plugin_device_count(void) { return probe_count; }
static const char *plugin_version(void) { return version_text; }

static void probe(void) {
    int drv = 0, rt = 0, n = 0, usable = 0;
    size_t lt_version = cublasLtGetVersion();
    struct cudaDeviceProp prop0;
    cudaError_t err = cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (err != cudaSuccess || drv == 0) {
        snprintf(probe_reason, sizeof probe_reason,
                 "no NVIDIA driver was found (cudaDriverGetVersion: %s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "version 0");
        return;
    }
    err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(probe_reason, sizeof probe_reason,
                 "cudaGetDeviceCount failed: %s (%s); driver CUDA %d.%d, runtime %d.%d",
                 cudaGetErrorName(err), cudaGetErrorString(err), drv / 1000, (drv % 1000) / 10,
                 rt / 1000, (rt % 1000) / 10);
        cudaGetLastError();
        return;
    }
    if (n <= 0) {
        snprintf(probe_reason, sizeof probe_reason, "no CUDA device is visible");
        return;
    }
    memset(&prop0, 0, sizeof prop0);
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        if (d == 0) prop0 = prop;
        if (prop.major >= 9) usable++;
    }
    if (usable == 0) {
        snprintf(probe_reason, sizeof probe_reason,
                 "no CUDA device of compute capability 9.0 or newer (device 0: %s, %d.%d); this "
                 "build carries sm_90 code only",
                 prop0.name, prop0.major, prop0.minor);
        return;
    }
    snprintf(version_text, sizeof version_text,
             "kiln_cuda %s: CUDA runtime %d.%d, driver %d.%d, cuBLASLt %zu, device 0 %s (sm_%d%d)",
             KILN_VERSION_STRING, rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10,
             lt_version, prop0.name, prop0.major, prop0.minor);
    probe_count = n;
    probe_ok = 1;
}

static const kiln_cuda_plugin plugin_table = {
    .struct_nbytes = (uint32_t)sizeof(kiln_cuda_plugin),
    .abi = KILN_CUDA_PLUGIN_ABI,
    .ops =
        {
            .name = "cuda",
            .engine_init = cuda_engine_init,
            .engine_free = cuda_engine_free,
            .context_init = cuda_context_init,
            .context_free = cuda_context_free,
            .execute = cuda_execute,
        },
    .device_count = plugin_device_count,
    .version = plugin_version,
    .run_op = plugin_run_op,
};

KILN_CUDA_EXPORT kiln_status kiln_cuda_plugin_v1(const kiln_cuda_services *services, char *reason,
                                                 size_t reason_nbytes,
                                                 const kiln_cuda_plugin **out) {
    const char *why = NULL;
    char buf[256];
    if (services == NULL || out == NULL) return KILN_ERR_INVALID_ARG;
    if (services->abi != KILN_CUDA_PLUGIN_ABI ||
        services->struct_nbytes != sizeof(kiln_cuda_services)) {
        snprintf(buf, sizeof buf,
                 "the plugin's ABI (%u, %u bytes) differs from libkiln's (%u, %u bytes)",
                 KILN_CUDA_PLUGIN_ABI, (unsigned)sizeof(kiln_cuda_services), services->abi,
                 services->struct_nbytes);
        why = buf;
    } else if (services->kiln_version == NULL ||
               strcmp(services->kiln_version, KILN_VERSION_STRING) != 0) {
        snprintf(buf, sizeof buf,
                 "the plugin is version %s but libkiln is %s: install matching "
                 "builds",
                 KILN_VERSION_STRING, services->kiln_version ? services->kiln_version : "?");
        why = buf;
    }
    if (why != NULL) {
        if (reason != NULL && reason_nbytes > 0) snprintf(reason, reason_nbytes, "%s", why);
        return KILN_ERR_VERSION;
    }
    kiln_cuda_services_set(services);
    call_once(&probe_once, probe);
    if (!probe_ok) {
        if (reason != NULL && reason_nbytes > 0)
            snprintf(reason, reason_nbytes, "%s", probe_reason);
        return KILN_ERR_DEVICE;
    }
    *out = &plugin_table;
    return KILN_OK;
}
