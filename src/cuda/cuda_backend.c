// SPDX-License-Identifier: Apache-2.0
// The CUDA backend (host glue, C): the plugin's entry point, and the kiln_backend_ops the runtime
// drives (src/runtime/backend.h).
//
// Engine: the device ("auto" = 0, "cuda:N"), every weight uploaded once into one device block
// (256-byte aligned offsets), every layer checked against kiln_cuda_supports at its largest
// shapes. Context: a non-blocking stream, a cuBLASLt handle and workspace, ONE activation arena
// (plan->arena_nbytes, zeroed), a staging buffer per I/O binding (its largest size), a tensor
// view per plan tensor, a GEMM set-up cache per layer.
// With use_shared_activation_scratch (read at engine load) a context takes no arena of its own:
// it joins its device's shared arena (cuda_scratch.h), sized to the largest sharing context, and
// holds that arena's execution lock through each execute (sharing engines run one at a time);
// when the arena was replaced (grown) since its last execute, the context re-points its arena
// views and drops its CUDA graph first.
// Execute: each I/O pointer is bound directly when it is memory of this device (or managed),
// else staged (cudaMemcpyAsync before and after the layers); the layers run on the caller's
// stream if one was set, else the context's; nothing is allocated and nothing synchronizes
// until the final cudaStreamSynchronize. With use_cuda_graphs the first execute of a signature
// (input shapes + device I/O pointers) runs directly, the second records the layer loop into a
// CUDA graph (staging copies stay outside it) and later ones replay it; a new signature runs
// directly once and is then re-recorded: cudaGraphExecUpdate only when cuda_graph_rules.h allows
// it (same kernels, no thread-block clusters: cuBLASLt's cluster kernels are not updated
// correctly), else a new instantiation. Expected CUDA errors are consumed where they occur.
// A CUDA error marks the context failed: later executes return KILN_ERR_DEVICE at once.
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h> // driver types only: entry points come through cudaGetDriverEntryPointByVersion

#include "cuda/cuda_graph_rules.h"
#include "cuda/cuda_layout.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_scratch.h"

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
    int debug_sync;      // KILN_CUDA_DEBUG_SYNC: graphs off, synchronize after every layer
    int profile;         // KILN_CUDA_PROFILE: graphs off, per-layer GPU times (logged at free); the
                         // delay ahead of each layer in us (0: not profiling)
    int no_tc_attention; // KILN_CUDA_NO_TC_ATTENTION: sdpa on the fp32-FMA kernel only
    int no_dnn_attention; // KILN_CUDA_NO_CUDNN_SDPA: sdpa on Kiln's kernels, not cuDNN's
    int sm_count;
    void *weights; // device, owned
    size_t weights_nbytes;
    uint64_t *weight_offsets; // host, n_tensors entries
    kiln_cuda_layout layout;  // NHWC activations (cuda_layout.h)
    void *krsc;               // device, owned: KRSC copies of the NHWC convs' weights
    size_t krsc_nbytes;
    uint64_t *krsc_offsets;    // host, n_tensors entries (valid where layout.krsc)
    kiln_cuda_fold fold;       // views folded into sdpa (cuda_fold.h)
    int attn_rows;             // KILN_CUDA_ATTN_ROWS: the tensor-core sdpa's rows per CTA (0: auto)
    int attn_split;            // KILN_CUDA_ATTN_SPLIT: its key-split warps per row block (0: auto)
    int small_m;               // small-M linear kernels switched off (kiln_cuda_ctx.small_m)
    int splitk;                // KILN_CUDA_SPLITK (kiln_cuda_ctx.splitk)
    kiln_cuda_wg_cfg wg_force; // KILN_CUDA_WG_CFG=bn,split,occ (profiling): every eligible linear
    int64_t *gemv_keep;        // n_layers: kiln_cuda_ctx.gemv_keep (the L2 plan, cuda_layout.h)
    uint64_t l2_kept;          // bytes of GEMV weights loaded evict-last
    int share_arena; // use_shared_activation_scratch: contexts use the device's shared arena
} cuda_engine;

typedef struct cuda_context {
    const cuda_engine *engine;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *arena;                // owned; borrowed from `scratch` when that is not NULL
    kiln_cuda_scratch *scratch; // the device's shared arena (use_shared_activation_scratch)
    uint64_t arena_gen;         // the shared arena's generation the views point into
    void *fold_pool;            // the folded attention bases moved out of the arena (cuda_fold.h)
    void *workspace;
    size_t workspace_nbytes;
    uint32_t n_io;              // n_inputs + n_outputs (bindings: inputs first)
    void **staging;             // n_io device buffers (NULL when the binding is empty)
    uint8_t *staged;            // n_io: this execute stages binding i
    kiln_tensor *views;         // n_tensors
    kiln_cuda_gemm_cache *gemm; // n_layers
    kiln_cuda_dnn *dnn;         // cuDNN handle (NULL: convolutions on Kiln's kernels)
    kiln_cuda_conv_cache *conv; // n_layers (cuDNN set-up of conv2d layers)
    kiln_cuda_attn_cache *attn; // n_layers (cuDNN set-up of sdpa layers)
    void **nhwc_copy;           // n_tensors: copies in the other layout (layout.copy)
    // graph signatures: n_io device pointers, then for each input rank and KILN_MAX_RANK dims
    size_t sig_n; // int64 entries
    int64_t *sig_now, *sig_last, *sig_graph;
    int last_valid;
    cudaGraphExec_t graph;
    cudaGraph_t graph_src; // the graph `graph` was instantiated from (or last updated from)
    int graph_valid;
    uint64_t graph_instantiations, graph_updates; // counters (DEBUG log)
    // The end-of-execute flag (pinned host memory the device writes): the recorded graph ends
    // with a memset of it to 0, and a replay whose outputs need no staging waits for that write
    // instead of cudaStreamSynchronize (flag_wait). NULL: always cudaStreamSynchronize.
    volatile uint32_t *done_flag;
    void *done_dev; // its device address
    int failed;
    char fail_msg[512];
    // KILN_CUDA_PROFILE: an event before and after each launched layer
    cudaEvent_t *prof_ev; // 2 * n_layers (created at context init)
    uint32_t *prof_layer; // n_layers: the plan layer of the k-th launched layer
    double *prof_us;      // n_layers: accumulated GPU microseconds per plan layer
    uint32_t prof_n;      // layers launched by the last run_layers
    uint64_t prof_runs;
    uint32_t prof_warm; // executes seen before counting (module loading, first-use set-up)
} cuda_context;

// --- small helpers

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

// KILN_CUDA_ATTN_ROWS=16|32|64: the tensor-core sdpa kernel's query rows per CTA (0, unset or
// anything else: by occupancy; 64 is the kernel before the occupancy rule).
static int attn_rows_env(void) {
    const char *v = getenv("KILN_CUDA_ATTN_ROWS");
    int n = v != NULL ? atoi(v) : 0;
    return n == 16 || n == 32 || n == 64 ? n : 0;
}

// KILN_CUDA_ATTN_SPLIT=2|4|8: the split-key sdpa kernel with that many warps per 16-row block
// whatever the grid (tests; 0, unset or anything else: by residency).
static int attn_split_env(void) {
    const char *v = getenv("KILN_CUDA_ATTN_SPLIT");
    int n = v != NULL ? atoi(v) : 0;
    return n == 2 || n == 4 || n == 8 ? n : 0;
}

// KILN_CUDA_NO_GEMV / KILN_CUDA_NO_PDL as kiln_cuda_ctx.small_m bits (cuda_ops.h).
static int small_m_env(void) {
    return (env_flag("KILN_CUDA_NO_GEMV") ? KILN_CUDA_SMALL_M_NO_GEMV : 0) |
           (env_flag("KILN_CUDA_NO_PDL") ? KILN_CUDA_SMALL_M_NO_PDL : 0);
}

// KILN_CUDA_NO_WG=1: Kiln's small-M wgmma linear never runs (cuda_wg.h; every such layer on
// cuBLASLt, no timing of the two at context creation).
static int wg_enabled(void) { return !env_flag("KILN_CUDA_NO_WG"); }

// KILN_CUDA_WG_CFG=bn,split,occ: every linear the small-M wgmma kernel takes runs on it with
// that configuration, untimed (profiling the kernel; nothing else reads it).
static kiln_cuda_wg_cfg wg_force_env(void) {
    kiln_cuda_wg_cfg c = {0, 0, 0};
    const char *v = getenv("KILN_CUDA_WG_CFG");
    if (v == NULL || sscanf(v, "%d,%d,%d", &c.bn, &c.split, &c.occ) != 3 ||
        (c.bn != 64 && c.bn != 128) ||
        (c.split != 1 && c.split != 2 && c.split != 4 && c.split != 8) ||
        (c.occ != 1 && c.occ != 2)) {
        c.bn = c.split = c.occ = 0;
    }
    return c;
}

// KILN_CUDA_SPLITK=0: linears never split K over a batched GEMM; =2, 4 or 8: every linear the
// split can take runs with that many slices, untimed (A/B, the GPU suite); unset: timed at
// context creation where it may pay (kiln_cuda_ctx.splitk).
static int splitk_env(void) {
    const char *v = getenv("KILN_CUDA_SPLITK");
    if (v == NULL) return 0;
    if (strcmp(v, "0") == 0) return -1;
    if (strcmp(v, "2") == 0 || strcmp(v, "4") == 0 || strcmp(v, "8") == 0) return v[0] - '0';
    kiln_cuda_log(KILN_LOG_WARN,
                  "KILN_CUDA_SPLITK=%s is not 0, 2, 4 or 8: ignored (the K split is timed per "
                  "layer); unset it, or set 0 (off) or 2, 4, 8 (slices, forced)",
                  v);
    return 0;
}

// A replay waits for the graph's last node (flag_wait) unless KILN_CUDA_NO_FLAG_WAIT=1 or the
// device's schedule is yield or blocking-sync (the caller asked not to spin: cudaSetDeviceFlags).
// Call on the engine's device.
static int flag_wait_enabled(void) {
    unsigned flags = 0;
    if (env_flag("KILN_CUDA_NO_FLAG_WAIT")) return 0;
    if (cudaGetDeviceFlags(&flags) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    flags &= cudaDeviceScheduleMask;
    return flags == cudaDeviceScheduleAuto || flags == cudaDeviceScheduleSpin;
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
    if (e != cudaSuccess) {
        cudaGetLastError(); // consumed: no CUDA error may stay pending for a later check
        *prev = -1;
    }
    if (*prev == device) return KILN_OK;
    e = cudaSetDevice(device);
    if (e == cudaSuccess) return KILN_OK;
    cudaGetLastError();
    return cuda_fail("cudaSetDevice", e);
}

static void device_leave(int device, int prev) {
    if (prev >= 0 && prev != device && cudaSetDevice(prev) != cudaSuccess) cudaGetLastError();
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

// Channels rounded up to a multiple of 8: the padded NHWC copies and KRSC weights (layout.padc).
static int64_t pad8(int64_t c) { return (c + 7) / 8 * 8; }

// Bytes of tensor t at its largest shape, C padded where layout.padc says so (4-D).
static uint64_t layout_nbytes(const kiln_cuda_layout *L, uint32_t i, const kiln_plan_tensor *t) {
    int64_t dims[KILN_MAX_RANK];
    for (uint32_t d = 0; d < t->shape.rank && d < KILN_MAX_RANK; d++) dims[d] = t->shape.max[d];
    if (L->padc[i] && t->shape.rank == 4) dims[1] = pad8(dims[1]);
    return tensor_nbytes(t->dtype, t->shape.rank, dims);
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
    if ((e->weights != NULL || e->krsc != NULL) && device_enter(e->device, &prev) == KILN_OK) {
        cudaFree(e->weights);
        cudaFree(e->krsc);
        device_leave(e->device, prev);
    }
    kiln_cuda_free(e->weight_offsets, (size_t)e->plan->n_tensors * sizeof *e->weight_offsets);
    kiln_cuda_free(e->krsc_offsets, (size_t)e->plan->n_tensors * sizeof *e->krsc_offsets);
    kiln_cuda_free(e->gemv_keep, ((size_t)e->plan->n_layers + 1) * sizeof *e->gemv_keep);
    kiln_cuda_layout_free(e->plan, &e->layout);
    kiln_cuda_fold_free(e->plan, &e->fold);
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

// Uploads an OIHW weight reordered to KRSC (O, kh, kw, C): cuDNN's NHWC filter layout; with
// `padded`, C rounded up to a multiple of 8 with zero filters (layout.padc).
static kiln_status upload_krsc(const kiln_plan_tensor *t, const void *src, void *dst, int padded) {
    size_t es = kiln_cuda_dtype_size(t->dtype);
    int64_t o = t->shape.max[0], c = t->shape.max[1], hw = t->shape.max[2] * t->shape.max[3];
    int64_t cp = padded ? pad8(c) : c;
    size_t nbytes = (size_t)(o * hw * cp) * es;
    const uint8_t *s = src;
    uint8_t *h;
    cudaError_t err;
    if (nbytes == 0) return KILN_OK;
    if (src == NULL || es == 0 || (uint64_t)(o * c * hw) * es != t->nbytes) {
        return kiln_cuda_fail(KILN_ERR_CORRUPT, "conv2d weight of %llu bytes is not OIHW",
                              (unsigned long long)t->nbytes);
    }
    h = kiln_cuda_calloc(nbytes);
    if (h == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (KRSC weight)");
    for (int64_t k = 0; k < o; k++) {
        for (int64_t ci = 0; ci < c; ci++) {
            for (int64_t r = 0; r < hw; r++) {
                memcpy(h + (size_t)((k * hw + r) * cp + ci) * es,
                       s + (size_t)((k * c + ci) * hw + r) * es, es);
            }
        }
    }
    err = cudaMemcpy(dst, h, nbytes, cudaMemcpyHostToDevice);
    kiln_cuda_free(h, nbytes);
    if (err != cudaSuccess) return cuda_fail("cudaMemcpy (KRSC weight upload)", err);
    return KILN_OK;
}

// The bytes of GEMV weights an engine keeps in L2 (kiln_cuda_plan_gemv_l2): a percentage of the
// device's L2, KILN_L2_KEEP_PCT or KILN_CUDA_L2_KEEP_PCT (0 streams every GEMV weight).
// KILN_CUDA_NO_L2_HINTS=1 (the caller) drops the hints altogether.
#define KILN_L2_KEEP_PCT 50
static uint64_t l2_budget(const struct cudaDeviceProp *prop) {
    const char *v = getenv("KILN_CUDA_L2_KEEP_PCT");
    long pct = KILN_L2_KEEP_PCT;
    if (v != NULL && v[0] != '\0') {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end == '\0' && n >= 0 && n <= 100) pct = n;
    }
    return prop->l2CacheSize > 0 ? (uint64_t)prop->l2CacheSize * (uint64_t)pct / 100 : 0;
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
    e->no_tc_attention = env_flag("KILN_CUDA_NO_TC_ATTENTION");
    e->no_dnn_attention = env_flag("KILN_CUDA_NO_CUDNN_SDPA");
    e->small_m = small_m_env();
    e->splitk = splitk_env();
    e->profile = 0;
    if (env_flag("KILN_CUDA_PROFILE")) { // 1: 100 us of delay per layer; N > 1: N us
        long us = strtol(getenv("KILN_CUDA_PROFILE"), NULL, 10);
        e->profile = us > 1 && us <= 1000000 ? (int)us : 100;
    }
    e->use_graphs = options->use_cuda_graphs != 0 && !e->debug_sync && !e->profile;
    e->share_arena = options->use_shared_activation_scratch != 0;
    e->sm_count = prop.multiProcessorCount;
    e->gemv_keep = kiln_cuda_calloc(((size_t)p->n_layers + 1) * sizeof *e->gemv_keep);
    if (e->gemv_keep == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA layer table)");
        goto fail;
    }
    // (on sm_90 the small-M wgmma linear's weights too: cuda_wg.h)
    e->l2_kept =
        kiln_cuda_plan_l2(p, l2_budget(&prop),
                          prop.major == 9 && prop.minor == 0 && wg_enabled() ? KILN_CUDA_WG_MAX_M
                                                                             : KILN_CUDA_GEMV_MAX_M,
                          e->gemv_keep);
    if (env_flag("KILN_CUDA_NO_L2_HINTS")) {
        for (uint32_t li = 0; li < p->n_layers; li++) e->gemv_keep[li] = -1;
        e->l2_kept = 0;
    }
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
    // NHWC needs cuDNN (Kiln's own NHWC conv is only the per-shape fallback).
    st = kiln_cuda_layout_plan(p,
                               !env_flag("KILN_CUDA_NO_NHWC") && !env_flag("KILN_CUDA_NO_CUDNN") &&
                                       kiln_cuda_dnn_version() > 0
                                   ? KILN_CUDA_LAYOUT_NHWC |
                                         (env_flag("KILN_CUDA_NO_STEM") ? 0 : KILN_CUDA_LAYOUT_STEM)
                                   : 0,
                               &e->layout);
    if (st != KILN_OK) goto fail;
    st = kiln_cuda_fold_plan(p, e->layout.nhwc, e->layout.alt,
                             !env_flag("KILN_CUDA_NO_PERMUTE_FOLD"), &e->fold);
    if (st != KILN_OK) goto fail;
    e->attn_rows = attn_rows_env();
    e->attn_split = attn_split_env();
    e->krsc_offsets = kiln_cuda_calloc((size_t)p->n_tensors * sizeof *e->krsc_offsets + 1);
    if (e->krsc_offsets == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA weight table)");
        goto fail;
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (!e->layout.krsc[i]) continue;
        e->krsc_offsets[i] = e->krsc_nbytes;
        e->krsc_nbytes +=
            (size_t)(layout_nbytes(&e->layout, i, &p->tensors[i]) + WEIGHT_ALIGN - 1) /
            WEIGHT_ALIGN * WEIGHT_ALIGN;
    }
    st = device_enter(device, &prev);
    if (st != KILN_OK) goto fail;
    entered = 1;
    st = kiln_cuda_attention_init();
    if (st != KILN_OK) goto fail;
    if (wg_enabled() && kiln_cuda_wg_init(device)) {
        e->small_m |= KILN_CUDA_SMALL_M_WG;
        e->wg_force = wg_force_env();
    }
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
    if (e->krsc_nbytes > 0) {
        CUDA_TRY(cudaMalloc(&e->krsc, e->krsc_nbytes), "cudaMalloc (KRSC weights)");
        for (uint32_t i = 0; i < p->n_tensors; i++) {
            if (!e->layout.krsc[i]) continue;
            st = upload_krsc(&p->tensors[i], weight_data[i],
                             (uint8_t *)e->krsc + e->krsc_offsets[i], e->layout.padc[i]);
            if (st != KILN_OK) goto fail;
        }
    }
    device_leave(device, prev);
    kiln_cuda_log(
        KILN_LOG_INFO,
        "CUDA engine on device %d (%s): %u layers, %zu bytes of weights, arena %llu "
        "bytes%s, CUDA graphs %s; NHWC: %u of %u conv2d (%u channel-padded, %u on the stem "
        "kernel), %u tensors, %u "
        "boundary transposes; attention folds: %u layers run no kernel, %u sdpa operands and %u "
        "outputs through strided views, %u tensors (%llu bytes) moved out of the arena; GEMV "
        "weights kept in L2: %llu bytes",
        device, prop.name, p->n_layers, e->weights_nbytes, (unsigned long long)p->arena_nbytes,
        e->share_arena ? " (shared: use_shared_activation_scratch)" : "",
        e->use_graphs ? "on" : "off", e->layout.n_conv_nhwc, e->layout.n_conv,
        e->layout.n_conv_padded, e->layout.n_conv_stem, e->layout.n_nhwc, e->layout.n_copies,
        e->fold.n_virtual, e->fold.n_sdpa_in, e->fold.n_sdpa_out, e->fold.n_reloc,
        (unsigned long long)e->fold.pool_nbytes, (unsigned long long)e->l2_kept);
    *out_state = e;
    return KILN_OK;

fail:
    if (st != KILN_OK) cudaGetLastError(); // allocation failures are not sticky: clear them
    if (entered) device_leave(device, prev);
    cuda_engine_free(e);
    return st;
}

// --- context

// KILN_CUDA_PROFILE: each launched layer's mean GPU time over the profiled executes, at INFO.
// A short delay kernel ahead of each layer lets the host queue the layer (and its events) before
// the GPU reaches it, so the time between a layer's two events is GPU time, not launch latency.
static void profile_log(const cuda_context *c) {
    const kiln_plan *p = c->engine->plan;
    double total = 0;
    for (uint32_t li = 0; li < p->n_layers; li++) total += c->prof_us[li];
    kiln_cuda_log(KILN_LOG_INFO,
                  "CUDA profile: %llu executes (after 2 uncounted), %.2f us of GPU time per "
                  "execute (graphs off; each layer timed alone behind a delay kernel)",
                  (unsigned long long)c->prof_runs, total / (double)c->prof_runs);
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *l = &p->layers[li];
        char tail[96] = "";
        size_t used = 0;
        if (c->engine->fold.virt[li]) continue;
        for (uint32_t t = 0; t < l->n_tail && used + 16 < sizeof tail; t++) {
            int n = snprintf(tail + used, sizeof tail - used, "+%s",
                             kiln_cuda_op_name(p->layers[li + 1 + t].op));
            if (n > 0) used += (size_t)n;
        }
        const kiln_tensor *o = &c->views[p->ids[l->output_begin]];
        char dims[96] = "";
        used = 0;
        for (uint32_t d = 0; d < o->rank && used + 24 < sizeof dims; d++) {
            int n = snprintf(dims + used, sizeof dims - used, "%s%lld", d ? "x" : "",
                             (long long)o->dims[d]);
            if (n > 0) used += (size_t)n;
        }
        double us = c->prof_us[li] / (double)c->prof_runs;
        kiln_cuda_log(KILN_LOG_INFO, "CUDA profile: layer %4u %-14s%-18s -> %-20s %9.2f us %5.1f%%",
                      li, kiln_cuda_op_name(l->op), tail, dims, us,
                      total > 0 ? 100.0 * c->prof_us[li] / total : 0.0);
    }
}

static void cuda_context_free(void *state) {
    cuda_context *c = state;
    int prev = -1, entered;
    if (c == NULL) return;
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    entered = device_enter(e->device, &prev) == KILN_OK;
    if (c->prof_runs > 0) profile_log(c);
    if (entered) {
        if (c->stream != NULL) cudaStreamSynchronize(c->stream);
        if (c->prof_ev != NULL) {
            for (uint32_t i = 0; i < 2 * p->n_layers; i++) {
                if (c->prof_ev[i] != NULL) cudaEventDestroy(c->prof_ev[i]);
            }
        }
        if (c->graph_valid) cudaGraphExecDestroy(c->graph);
        if (c->graph_src != NULL) cudaGraphDestroy(c->graph_src);
        if (c->staging != NULL) {
            for (uint32_t i = 0; i < c->n_io; i++) cudaFree(c->staging[i]);
        }
        if (c->nhwc_copy != NULL) {
            for (uint32_t i = 0; i < p->n_tensors; i++) cudaFree(c->nhwc_copy[i]);
        }
        if (c->scratch == NULL) cudaFree(c->arena);
        cudaFree(c->fold_pool);
        cudaFree(c->workspace);
        if (c->lt != NULL) cublasLtDestroy(c->lt);
        if (c->conv != NULL) {
            for (uint32_t i = 0; i < p->n_layers; i++) kiln_cuda_conv_cache_free(&c->conv[i]);
        }
        if (c->attn != NULL) {
            for (uint32_t i = 0; i < p->n_layers; i++) kiln_cuda_attn_cache_free(&c->attn[i]);
        }
        kiln_cuda_dnn_destroy(c->dnn);
        if (c->stream != NULL) cudaStreamDestroy(c->stream);
        if (c->done_flag != NULL) cudaFreeHost((void *)(uintptr_t)c->done_flag);
        cudaGetLastError();
        device_leave(e->device, prev);
    }
    kiln_cuda_scratch_release(c->scratch); // after the synchronize: no work of c is in flight
    kiln_cuda_free(c->staging, (size_t)c->n_io * sizeof *c->staging);
    kiln_cuda_free(c->staged, c->n_io);
    kiln_cuda_free(c->views, (size_t)p->n_tensors * sizeof *c->views);
    kiln_cuda_free(c->nhwc_copy, (size_t)p->n_tensors * sizeof *c->nhwc_copy + 1);
    for (uint32_t li = 0; c->gemm != NULL && li < p->n_layers; li++)
        kiln_cuda_gemm_cache_release(&c->gemm[li]);
    kiln_cuda_free(c->gemm, (size_t)p->n_layers * sizeof *c->gemm);
    kiln_cuda_free(c->conv, (size_t)p->n_layers * sizeof *c->conv);
    kiln_cuda_free(c->attn, (size_t)p->n_layers * sizeof *c->attn);
    kiln_cuda_free(c->sig_now, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_last, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_graph, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->prof_ev, 2 * (size_t)p->n_layers * sizeof *c->prof_ev + 1);
    kiln_cuda_free(c->prof_layer, (size_t)p->n_layers * sizeof *c->prof_layer + 1);
    kiln_cuda_free(c->prof_us, (size_t)p->n_layers * sizeof *c->prof_us + 1);
    kiln_cuda_free(c, sizeof *c);
}

static uint32_t binding_tensor(const kiln_plan *p, uint32_t b) {
    return b < p->n_inputs ? p->inputs[b] : p->outputs[b - p->n_inputs];
}

static int same_dims_or_one(const kiln_tensor *t, const kiln_tensor *out) {
    return t == NULL || kiln_tensor_numel(t) == 1 ||
           (t->rank == out->rank && memcmp(t->dims, out->dims, t->rank * sizeof(int64_t)) == 0);
}

// Points a read at ids slot `slot` of tensor src (a view) at the tensor's copy in the other
// layout (cuda_layout.h) in *view; with `run`, the first such read in layer order makes the copy
// (a transpose: NCHW -> NHWC when the tensor is stored NCHW, NHWC -> NCHW otherwise).
static kiln_status read_copy(const cuda_context *c, const kiln_cuda_ctx *ctx, uint32_t slot,
                             int32_t id, const kiln_tensor *src, kiln_tensor *view, int run) {
    const kiln_cuda_layout *L = &c->engine->layout;
    *view = *src;
    view->data = c->nhwc_copy[id];
    if (run && L->xpose[slot] && kiln_tensor_numel(src) > 0) {
        const int64_t *d = src->dims;                 // logical N, C, H, W
        int64_t cs = L->padc[id] ? pad8(d[1]) : d[1]; // NHWC channel stride (padded copies)
        // iterate in the destination's order (dense destination strides)
        int64_t to_nhwc_dims[4] = {d[0], d[2], d[3], d[1]};
        int64_t to_nhwc_dst[4] = {d[2] * d[3] * cs, d[3] * cs, cs, 1};
        int64_t to_nhwc_src[4] = {d[1] * d[2] * d[3], d[3], 1, d[2] * d[3]};
        int64_t to_nchw_dst[4] = {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
        int64_t to_nchw_src[4] = {d[2] * d[3] * d[1], 1, d[3] * d[1], d[1]};
        int back = L->nhwc[id]; // stored NHWC: the copy is NCHW
        KILN_CUDA_TRY(
            kiln_cuda_copy_strided(ctx, view->data, src->data, kiln_cuda_dtype_size(src->dtype), 4,
                                   back ? d : to_nhwc_dims, back ? to_nchw_dst : to_nhwc_dst,
                                   back ? to_nchw_src : to_nhwc_src));
    }
    return KILN_OK;
}

// Sets ctx's layout fields for head layer li (cuda_layout.h). A read of a tensor in the layout
// it is not stored in (a conv's input or residual, an NCHW-only consumer of an NHWC tensor)
// reads the tensor's copy (args->in[j] / tails[t].operand are pointed at views[]); with `run`,
// the first such read in layer order makes the copy. An NHWC group's elementwise operands must
// have the output's shape (or one element) at these shapes too.
static kiln_status layer_layout(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx,
                                kiln_kernel_args *args, kiln_tail_op *tails, kiln_tensor *views,
                                int run) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    const kiln_cuda_layout *L = &e->layout;
    const kiln_plan_layer *l = &p->layers[li];
    uint32_t nv = 0;
    ctx->nhwc = L->head_nhwc[li];
    ctx->w_krsc = NULL;
    ctx->x_cpad = 0;
    ctx->stem = 0;
    for (uint32_t j = 0; j < l->n_inputs && j < KILN_MAX_INPUTS; j++) {
        uint32_t slot = l->input_begin + j;
        if (!L->alt[slot] || args->in[j] == NULL) continue;
        KILN_CUDA_TRY(read_copy(c, ctx, slot, p->ids[slot], args->in[j], &views[nv], run));
        args->in[j] = &views[nv++];
    }
    int32_t running = p->ids[l->output_begin];
    for (uint32_t t = 0; t < l->n_tail && t < KILN_MAX_TAIL; t++) {
        const kiln_plan_layer *tl = &p->layers[li + 1 + t];
        for (uint32_t j = 0; j < tl->n_inputs && tails[t].operand != NULL; j++) {
            uint32_t slot = tl->input_begin + j;
            if (p->ids[slot] == running || !L->alt[slot]) continue;
            KILN_CUDA_TRY(read_copy(c, ctx, slot, p->ids[slot], tails[t].operand, &views[nv], run));
            tails[t].operand = &views[nv++];
        }
        running = p->ids[tl->output_begin];
    }
    if (!ctx->nhwc) return KILN_OK;
    if (args->op == KILN_OP_CONV2D && L->stem[li]) {
        ctx->stem = 1; // x NCHW, the OIHW weight: nothing to point at
    } else if (args->op == KILN_OP_CONV2D) {
        int32_t w = p->ids[l->input_begin + 1], x = p->ids[l->input_begin];
        ctx->w_krsc = (const uint8_t *)e->krsc + e->krsc_offsets[w];
        if (L->padc[x] && L->alt[l->input_begin] && args->in[0] != NULL) {
            ctx->x_cpad = pad8(args->in[0]->dims[1]);
        }
    }
    int ok = 1;
    if (args->op != KILN_OP_CONV2D && args->n_in == 2) {
        ok = same_dims_or_one(args->in[0], args->out) && same_dims_or_one(args->in[1], args->out);
    }
    for (uint32_t t = 0; t < args->n_tail; t++) {
        ok = ok && same_dims_or_one(args->tail[t].operand, args->out);
    }
    if (!ok) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "%s: an operand's shape differs from the output's in an NHWC layer; "
                              "set KILN_CUDA_NO_NHWC=1",
                              ctx->where ? ctx->where : "?");
    }
    return KILN_OK;
}

// An sdpa layer whose operands the attention fold turned into strided views (cuda_fold.h):
// points ctx->sdpa_io at them (views[4] is the storage).
static void sdpa_fold_views(const cuda_context *c, uint32_t li, kiln_cuda_ctx *ctx,
                            kiln_cuda_strided *views) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    memset(ctx->sdpa_io, 0, sizeof ctx->sdpa_io);
    if (e->fold.sdpa_in[li] == 0 && e->fold.sdpa_out[li] < 0) return;
    for (uint32_t j = 0; j < 3; j++) {
        if (!(e->fold.sdpa_in[li] & (1u << j))) continue;
        kiln_cuda_fold_view(p, &e->fold, c->views, p->ids[p->layers[li].input_begin + j],
                            &views[j]);
        ctx->sdpa_io[j] = &views[j];
    }
    if (e->fold.sdpa_out[li] >= 0) {
        kiln_cuda_fold_out_view(p, &e->fold, c->views, li, &views[3]);
        ctx->sdpa_io[3] = &views[3];
    }
}

// Chooses every GEMM layer's cuBLASLt algorithm and every conv2d layer's cuDNN descriptors and
// algorithm now, at the largest shapes with the I/O in the staging buffers, so that a first
// execute at those shapes finds them cached (and the layer loop creates no descriptor).
static void prepare_gemms(cuda_context *c) {
    const kiln_plan *p = c->engine->plan;
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_kernel_args args;
    kiln_cuda_ctx ctx;
    kiln_tensor views[KILN_MAX_INPUTS + KILN_MAX_TAIL];
    kiln_cuda_strided sdpa_io[4];
    char where[96];
    if (c->lt == NULL && c->dnn == NULL) return;
    memset(&ctx, 0, sizeof ctx);
    ctx.gemv_keep = -1;
    ctx.stream = c->stream;
    ctx.lt = c->lt;
    ctx.dnn = c->dnn;
    ctx.workspace = c->workspace;
    ctx.workspace_nbytes = c->workspace_nbytes;
    ctx.sm_count = c->engine->sm_count;
    ctx.small_m = c->engine->small_m;
    ctx.splitk = c->engine->splitk;
    ctx.no_tc_attention = c->engine->no_tc_attention;
    ctx.no_dnn_attention = c->engine->no_dnn_attention;
    ctx.attn_rows = c->engine->attn_rows;
    ctx.attn_split = c->engine->attn_split;
    ctx.where = where;
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        uint32_t op = p->layers[li].op;
        if (op != KILN_OP_LINEAR && op != KILN_OP_MATMUL && op != KILN_OP_CONV2D &&
            op != KILN_OP_SDPA)
            continue;
        if (c->engine->fold.virt[li]) continue;
        build_args(p, c->views, li, tails, &args);
        snprintf(where, sizeof where, "layer %u (%s)", li, kiln_cuda_op_name(op));
        ctx.gemm = &c->gemm[li];
        ctx.conv = &c->conv[li];
        ctx.attn = &c->attn[li];
        ctx.gemv_keep = c->engine->gemv_keep[li]; // (timed under the L2 plan's hints)
        if (layer_layout(c, li, &ctx, &args, tails, views, 0) != KILN_OK) continue;
        sdpa_fold_views(c, li, &ctx, sdpa_io);
        (void)kiln_cuda_gemm_prepare(&ctx, &args); // a miss only means a set-up at execute
    }
}

// Points the views of the arena's tensors (activations the attention fold did not move to the
// fold pool) into c->arena. I/O bindings (staging or caller memory) and weights are not touched.
static void bind_arena_views(cuda_context *c) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind == KILN_TENSOR_ACTIVATION && e->fold.reloc[i] == 0) {
            c->views[i].data = (uint8_t *)c->arena + t->offset;
        }
    }
}

// Convolutions and attention may run on cuDNN (attention: not with KILN_CUDA_NO_CUDNN_SDPA).
static int plan_wants_dnn(const cuda_engine *e) {
    const kiln_plan *p = e->plan;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        if (p->layers[li].op == KILN_OP_CONV2D) return 1;
        if (p->layers[li].op == KILN_OP_SDPA && !e->no_dnn_attention) return 1;
    }
    return 0;
}

static void wg_engine_choice(cuda_context *c); // (below, beside the layer loop)

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
    c->nhwc_copy = kiln_cuda_calloc((size_t)p->n_tensors * sizeof *c->nhwc_copy + 1);
    c->gemm = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->gemm);
    c->conv = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->conv);
    c->attn = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->attn);
    c->sig_now = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_last = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_graph = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    if ((c->n_io > 0 && (c->staging == NULL || c->staged == NULL)) ||
        (p->n_tensors > 0 && c->views == NULL) || c->nhwc_copy == NULL ||
        (p->n_layers > 0 && (c->gemm == NULL || c->conv == NULL || c->attn == NULL)) ||
        c->sig_now == NULL || c->sig_last == NULL || c->sig_graph == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA context tables)");
        goto fail;
    }
    st = device_enter(e->device, &prev);
    if (st != KILN_OK) goto fail;
    entered = 1;
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (e->use_graphs && flag_wait_enabled()) {
        // An optimization only: without the mapped flag every execute synchronizes the stream.
        void *flag = NULL;
        if (cudaHostAlloc(&flag, 64, cudaHostAllocMapped) == cudaSuccess &&
            cudaHostGetDevicePointer(&c->done_dev, flag, 0) == cudaSuccess) {
            c->done_flag = flag;
        } else {
            if (flag != NULL) cudaFreeHost(flag);
            cudaGetLastError(); // non-sticky (no pinned memory left): consumed
            c->done_dev = NULL;
            kiln_cuda_log(KILN_LOG_DEBUG, "no mapped end-of-execute flag: executes synchronize "
                                          "the stream");
        }
    }
    if (!no_cublaslt()) {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            c->lt = NULL;
            st = kiln_cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_NO_MEMORY
                                                                : KILN_ERR_DEVICE,
                                "cublasLtCreate failed: %s", cublasLtGetStatusString(s));
            goto fail;
        }
    }
    if (plan_wants_dnn(e)) c->dnn = kiln_cuda_dnn_create(); // NULL: Kiln's kernels
    if (c->lt != NULL || c->dnn != NULL) { // one workspace: the layers run one after another
        c->workspace_nbytes = WORKSPACE_NBYTES;
        CUDA_TRY(cudaMalloc(&c->workspace, c->workspace_nbytes), "cudaMalloc (workspace)");
    }
    if (p->arena_nbytes > 0 && e->share_arena) {
        st = kiln_cuda_scratch_acquire(e->device, (size_t)p->arena_nbytes, &c->scratch);
        if (st != KILN_OK) goto fail;
    } else if (p->arena_nbytes > 0) {
        CUDA_TRY(cudaMalloc(&c->arena, (size_t)p->arena_nbytes), "cudaMalloc (activation arena)");
        CUDA_TRY(cudaMemsetAsync(c->arena, 0, (size_t)p->arena_nbytes, c->stream),
                 "cudaMemsetAsync (arena)");
    }
    if (e->fold.pool_nbytes > 0) {
        CUDA_TRY(cudaMalloc(&c->fold_pool, (size_t)e->fold.pool_nbytes),
                 "cudaMalloc (attention fold pool)");
        CUDA_TRY(cudaMemsetAsync(c->fold_pool, 0, (size_t)e->fold.pool_nbytes, c->stream),
                 "cudaMemsetAsync (attention fold pool)");
    }
    for (uint32_t b = 0; b < c->n_io; b++) {
        const kiln_plan_tensor *t = &p->tensors[binding_tensor(p, b)];
        uint64_t n = tensor_nbytes(t->dtype, t->shape.rank, t->shape.max);
        if (n > 0) CUDA_TRY(cudaMalloc(&c->staging[b], (size_t)n), "cudaMalloc (I/O staging)");
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        uint64_t n = layout_nbytes(&e->layout, i, t);
        if (e->layout.copy[i] && n > 0) {
            CUDA_TRY(cudaMalloc(&c->nhwc_copy[i], (size_t)n), "cudaMalloc (layout copy)");
            // the pad channels of a padded copy stay zero: transposes write channels < C only
            if (e->layout.padc[i]) {
                CUDA_TRY(cudaMemset(c->nhwc_copy[i], 0, (size_t)n), "cudaMemset (layout copy)");
            }
        }
    }
    if (e->profile) {
        c->prof_ev = kiln_cuda_calloc(2 * (size_t)p->n_layers * sizeof *c->prof_ev + 1);
        c->prof_layer = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->prof_layer + 1);
        c->prof_us = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->prof_us + 1);
        if (c->prof_ev == NULL || c->prof_layer == NULL || c->prof_us == NULL) {
            st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA profile tables)");
            goto fail;
        }
        for (uint32_t i = 0; i < 2 * p->n_layers; i++) {
            CUDA_TRY(cudaEventCreate(&c->prof_ev[i]), "cudaEventCreate (profile)");
        }
    }
    CUDA_TRY(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (context init)");
    // A shared arena: its execution lock from here through the GEMM set-up, which times the
    // candidate algorithms on the layers' own buffers (arena memory other contexts use).
    if (c->scratch != NULL) c->arena = kiln_cuda_scratch_lock(c->scratch, &c->arena_gen);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        c->views[i].dtype = t->dtype;
        c->views[i].rank = t->shape.rank;
        memcpy(c->views[i].dims, t->shape.max, sizeof c->views[i].dims);
        if (t->kind == KILN_TENSOR_WEIGHT) {
            c->views[i].data = (uint8_t *)e->weights + e->weight_offsets[i];
        } else if (t->kind == KILN_TENSOR_ACTIVATION && e->fold.reloc[i] != 0) {
            c->views[i].data = (uint8_t *)c->fold_pool + (e->fold.reloc[i] - 1);
        }
    }
    bind_arena_views(c);
    for (uint32_t b = 0; b < c->n_io; b++) c->views[binding_tensor(p, b)].data = c->staging[b];
    prepare_gemms(c);
    wg_engine_choice(c);
    if (c->scratch != NULL) {
        cudaError_t err = cudaStreamSynchronize(c->stream); // the timing runs are done
        kiln_cuda_scratch_unlock(c->scratch);
        if (err != cudaSuccess) {
            st = cuda_fail("cudaStreamSynchronize (context init, shared arena)", err);
            goto fail;
        }
    }
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
    kiln_tensor views[KILN_MAX_INPUTS + KILN_MAX_TAIL];
    kiln_cuda_strided sdpa_io[4];
    kiln_status st;
    char where[96];
    memset(&ctx, 0, sizeof ctx);
    ctx.gemv_keep = -1;
    ctx.stream = stream;
    ctx.lt = c->lt;
    ctx.dnn = c->dnn;
    ctx.workspace = c->workspace;
    ctx.workspace_nbytes = c->workspace_nbytes;
    ctx.sm_count = e->sm_count;
    ctx.no_tc_attention = e->no_tc_attention;
    ctx.no_dnn_attention = e->no_dnn_attention;
    ctx.attn_rows = e->attn_rows;
    ctx.attn_split = e->attn_split;
    ctx.small_m = e->small_m;
    ctx.splitk = e->splitk;
    ctx.wg_force = e->wg_force;
    ctx.where = where;
    int profiling = c->prof_ev != NULL;
    c->prof_n = 0;
    if (profiling) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess ||
            cap != cudaStreamCaptureStatusNone) {
            cudaGetLastError();
            profiling = 0; // a caller's capture: events cannot be timed
        }
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        if (e->fold.virt[li]) continue; // folded into an sdpa: no kernel (cuda_fold.h)
        if (profiling) {
            KILN_CUDA_TRY(kiln_cuda_delay(stream, (unsigned)e->profile));
            c->prof_layer[c->prof_n] = li;
            cudaError_t err = cudaEventRecord(c->prof_ev[2 * c->prof_n], stream);
            if (err != cudaSuccess) return cuda_fail("cudaEventRecord (profile)", err);
        }
        build_args(p, c->views, li, tails, &args);
        snprintf(where, sizeof where, "layer %u (%s)", li, kiln_cuda_op_name(args.op));
        ctx.gemm = &c->gemm[li];
        ctx.conv = &c->conv[li];
        ctx.gemv_keep = e->gemv_keep[li];
        ctx.attn = &c->attn[li];
        KILN_CUDA_TRY(layer_layout(c, li, &ctx, &args, tails, views, 1));
        sdpa_fold_views(c, li, &ctx, sdpa_io);
        st = kiln_cuda_run(&ctx, &args);
        memset(ctx.sdpa_io, 0, sizeof ctx.sdpa_io);
        if (st != KILN_OK) return st;
        if (profiling) {
            cudaError_t err = cudaEventRecord(c->prof_ev[2 * c->prof_n++ + 1], stream);
            if (err != cudaSuccess) return cuda_fail("cudaEventRecord (profile)", err);
        }
        if (e->debug_sync) { // finds the layer of an asynchronous fault
            cudaError_t err = cudaStreamSynchronize(stream);
            if (err != cudaSuccess)
                return kiln_cuda_error(&ctx, "cudaStreamSynchronize (debug)", err);
        }
    }
    if (!profiling) c->prof_n = 0;
    return KILN_OK;
}

// --- the wgmma kernel chosen on the whole engine
// The per-layer choice (op_gemm.cu, wg_pick) times each linear alone, its weight hot in L2 from
// the repeats. In the engine a weight comes from HBM unless the L2 plan keeps it (only the wgmma
// kernel's loads carry the plan's hints), the erf GELU the kernel fuses saves a kernel, and with
// PDL a layer's weight stream starts under the previous layer's end: a chain of linears can run
// faster on it even where each layer alone is slower (round 17: the MLP b64 about 2 us faster
// with every layer on it). So once the layers are chosen, the linears left on cuBLASLt whose
// fastest wgmma configuration timed within WG_ENGINE_RATIO of cuBLASLt move to it together; the
// whole engine is timed both ways inside a CUDA graph, and the move stays only when the engine
// runs at WG_ENGINE_GAIN of its time or better. KILN_CUDA_NO_WG_ENGINE=1 keeps the per-layer
// choice.
#define WG_ENGINE_RATIO 1.3f
#define WG_ENGINE_GAIN 0.98f

static int engine_enqueue(void *arg) {
    cuda_context *c = arg;
    return run_layers(c, c->stream) == KILN_OK;
}

static uint32_t wg_engine_candidate(const kiln_cuda_gemm_cache *g) {
    return g->wg == -1 && g->wg_alt_ratio > 0.0f && g->wg_alt_ratio <= WG_ENGINE_RATIO ? 1u : 0u;
}

static void wg_engine_choice(cuda_context *c) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    uint32_t moved = 0;
    if (c->lt == NULL || env_flag("KILN_CUDA_NO_WG_ENGINE") || e->profile || e->debug_sync ||
        e->wg_force.bn > 0)
        return;
    for (uint32_t li = 0; li < p->n_layers; li++) moved += wg_engine_candidate(&c->gemm[li]);
    if (moved == 0) return;
    uint8_t *mv = kiln_cuda_calloc(p->n_layers);
    if (mv == NULL) return; // (an optimization only)
    const float per_layer = kiln_cuda_time_in_graph(c->stream, engine_enqueue, c);
    for (uint32_t li = 0; li < p->n_layers; li++) {
        kiln_cuda_gemm_cache *g = &c->gemm[li];
        if (!wg_engine_candidate(g)) continue;
        mv[li] = 1;
        g->wg = 1; // run_layers takes the wgmma kernel with wg_cfg
        g->wg_cfg = g->wg_alt;
    }
    const float together = kiln_cuda_time_in_graph(c->stream, engine_enqueue, c);
    const int keep = per_layer > 0.0f && together > 0.0f && together <= WG_ENGINE_GAIN * per_layer;
    for (uint32_t li = 0; li < p->n_layers && !keep; li++) {
        if (mv[li]) c->gemm[li].wg = -1;
    }
    kiln_cuda_free(mv, p->n_layers);
    kiln_cuda_log(KILN_LOG_INFO,
                  "engine: %u linear%s left on cuBLASLt within %.1fx of the wgmma kernel, moved "
                  "to it together: %.2f us per run against %.2f us as chosen per layer: %s",
                  moved, moved == 1 ? "" : "s", (double)WG_ENGINE_RATIO, (double)together,
                  (double)per_layer, keep ? "kept" : "undone");
}

// After the execute's synchronize: the launched layers' times into the profile.
static kiln_status profile_collect(cuda_context *c) {
    if (c->prof_n == 0) return KILN_OK;
    if (c->prof_warm < 2) { // the first executes load modules lazily: not counted
        c->prof_warm++;
        c->prof_n = 0;
        return KILN_OK;
    }
    for (uint32_t k = 0; k < c->prof_n; k++) {
        float ms = 0;
        cudaError_t err = cudaEventElapsedTime(&ms, c->prof_ev[2 * k], c->prof_ev[2 * k + 1]);
        if (err != cudaSuccess) return cuda_fail("cudaEventElapsedTime (profile)", err);
        c->prof_us[c->prof_layer[k]] += 1000.0 * (double)ms;
    }
    c->prof_runs++;
    c->prof_n = 0;
    return KILN_OK;
}

// --- graph update or re-instantiation (the rule: cuda_graph_rules.h)

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
    cudaGetLastError();
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
        cudaGetLastError();
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
    cudaGetLastError(); // a failed query only means "no update": consume it
    kiln_cuda_free(from, ea * sizeof *from);
    kiln_cuda_free(to, ea * sizeof *to);
    kiln_cuda_free(data, ea * sizeof *data);
    return ok;
}

// 1 when c->graph may be updated from g (cuda_graph_rules.h); 0: instantiate anew.
static int graph_updatable(const cuda_context *c, cudaGraph_t g) {
    graph_desc a, b;
    const char *why = "a graph could not be described";
    int ok = 0;
    if (c->graph_src == NULL) return 0;
    int da = graph_describe(c->graph_src, &a);
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

// INFO: the node count of a freshly instantiated graph by kind (the benchmark prints it).
static void graph_log_nodes(const cuda_context *c, cudaGraph_t g) {
    size_t n = 0, kinds[4] = {0, 0, 0, 0}; // kernel, memcpy, memset, other
    if (!kiln_cuda_log_enabled(KILN_LOG_INFO)) return;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess || n == 0) {
        cudaGetLastError();
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
        kiln_cuda_log(KILN_LOG_INFO,
                      "CUDA graph instantiated: %zu nodes (%zu kernels, %zu memcpy, %zu memset, "
                      "%zu other) for %u plan layers",
                      n, kinds[0], kinds[1], kinds[2], kinds[3], c->engine->plan->n_layers);
    }
    cudaGetLastError();
    kiln_cuda_free(nodes, cap * sizeof *nodes);
}

static void graph_drop(cuda_context *c) {
    if (c->graph_valid) cudaGraphExecDestroy(c->graph);
    if (c->graph_src != NULL) cudaGraphDestroy(c->graph_src);
    c->graph_valid = 0;
    c->graph_src = NULL;
}

// Records the layer loop into a graph: updates the executable graph in place when the rule
// allows it (and the update succeeds), else instantiates anew. A refused update is an expected,
// non-sticky error: it is consumed here so that no later cudaGetLastError sees it.
static kiln_status record_graph(cuda_context *c, cudaStream_t stream) {
    cudaGraph_t g = NULL;
    kiln_status st;
    cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) return cuda_fail("cudaStreamBeginCapture", err);
    st = run_layers(c, stream);
    if (st == KILN_OK && c->done_flag != NULL) { // the last node: the end-of-execute flag
        err = cudaMemsetAsync(c->done_dev, 0, sizeof(uint32_t), stream);
        if (err != cudaSuccess) st = cuda_fail("cudaMemsetAsync (execute flag)", err);
    }
    err = cudaStreamEndCapture(stream, &g); // always ends the capture, even after a failure
    if (st != KILN_OK) {
        if (g != NULL) cudaGraphDestroy(g);
        cudaGetLastError();
        return st;
    }
    if (err != cudaSuccess) return cuda_fail("cudaStreamEndCapture", err);
    if (c->graph_valid && graph_updatable(c, g)) {
        cudaGraphExecUpdateResultInfo info;
        memset(&info, 0, sizeof info);
        err = cudaGraphExecUpdate(c->graph, g, &info);
        if (err == cudaSuccess) {
            cudaGraphDestroy(c->graph_src);
            c->graph_src = g;
            c->graph_updates++;
            return KILN_OK;
        }
        // Expected (cudaErrorGraphExecUpdateFailure, not sticky): consume it, re-instantiate.
        cudaGetLastError();
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cudaGraphExecUpdate refused (%s, result %d): re-instantiating",
                      cudaGetErrorName(err), (int)info.result);
    }
    graph_drop(c);
    err = cudaGraphInstantiate(&c->graph, g, 0);
    if (err != cudaSuccess) {
        cudaGraphDestroy(g);
        return cuda_fail("cudaGraphInstantiate", err);
    }
    c->graph_src = g;
    c->graph_valid = 1;
    c->graph_instantiations++;
    graph_log_nodes(c, g);
    return KILN_OK;
}

// Waits for a replay to write the end-of-execute flag (its last node, after every layer):
// about 1 us sooner than cudaStreamSynchronize, which also waits for the graph launch to retire
// (H200, session 11: 5.4 against 6.6 us for a one-kernel graph, 8.8 against 10.2 for seven).
// The stream is queried every 4096 polls, so a fault (the flag's node then never runs) or an
// idle stream ends the wait too; the caller's device schedule is spin (flag_wait_enabled).
static cudaError_t flag_wait(const cuda_context *c, cudaStream_t stream) {
    for (uint32_t i = 1;; i++) {
        if (*c->done_flag == 0) {
            atomic_thread_fence(memory_order_acquire);
            return cudaSuccess;
        }
        if ((i & 4095u) == 0) {
            cudaError_t e = cudaStreamQuery(stream);
            if (e != cudaErrorNotReady) return e;
            cudaGetLastError(); // "not ready" is no error: leave none pending
        }
    }
}

// Sets the end-of-execute flag to 1 ahead of a launch; the fence orders the store before the
// launch's own writes (on weakly ordered hosts too), so the device's 0 always lands last.
static void flag_arm(cuda_context *c) {
    if (c->done_flag == NULL) return;
    *c->done_flag = 1;
    atomic_thread_fence(memory_order_seq_cst);
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
    int replayed = 0; // the graph ran: its last node writes the end-of-execute flag
    if (use_graph && c->graph_valid && memcmp(c->sig_now, c->sig_graph, sig_nbytes) == 0 &&
        !exec->shapes_changed) {
        flag_arm(c); // before the launch: the graph's last node writes 0
        err = cudaGraphLaunch(c->graph, stream);
        if (err != cudaSuccess) return cuda_fail("cudaGraphLaunch", err);
        replayed = 1;
    } else if (use_graph && same_as_last) {
        KILN_CUDA_TRY(record_graph(c, stream));
        memcpy(c->sig_graph, c->sig_now, sig_nbytes);
        flag_arm(c);
        err = cudaGraphLaunch(c->graph, stream);
        if (err != cudaSuccess) return cuda_fail("cudaGraphLaunch", err);
        replayed = 1;
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
    // The caller's graph runs the work later. On a shared arena the execution lock covers only
    // the enqueue: a caller who captures sharing engines must not replay their graphs
    // concurrently (with each other or with other executes of sharing engines on the device),
    // and must capture again after a new sharing context grew the arena (the old block is freed).
    if (external_capture) return KILN_OK;
    int staged_out = 0; // output copies after the graph: the flag would come before them
    for (uint32_t b = p->n_inputs; b < c->n_io; b++) staged_out |= c->staged[b];
    const int by_flag = replayed && c->done_flag != NULL && !staged_out;
    err = by_flag ? flag_wait(c, stream) : cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "CUDA error in %s at the end of execute: %s (%s); a kernel of this "
                              "engine faulted (set KILN_CUDA_DEBUG_SYNC=1 to name the layer)",
                              by_flag ? "the wait for the execute's last node"
                                      : "cudaStreamSynchronize",
                              cudaGetErrorName(err), cudaGetErrorString(err));
    }
    return profile_collect(c);
}

// A context on a shared arena: takes the arena's execution lock (held until the execute's work
// is finished, or enqueued into a caller's capture) and, when the arena was replaced since the
// views were bound, re-points them and drops the CUDA graph that recorded the old addresses
// (the next executes run directly, then re-record). The GEMM and conv set-up caches need nothing:
// the GEMM key holds the residual's address and the operands' alignments (cudaMalloc blocks are
// aligned past the 256 bytes the key distinguishes), cuDNN's set-up no address at all.
static void scratch_enter(cuda_context *c) {
    uint64_t gen;
    void *base = kiln_cuda_scratch_lock(c->scratch, &gen);
    if (gen == c->arena_gen && base == c->arena) return;
    c->arena = base;
    c->arena_gen = gen;
    bind_arena_views(c);
    graph_drop(c);
    c->last_valid = 0;
    kiln_cuda_log(KILN_LOG_DEBUG,
                  "shared activation arena replaced: views re-pointed, CUDA graph dropped");
}

static kiln_status cuda_execute(void *context_state, const kiln_exec *exec) {
    cuda_context *c = context_state;
    const cuda_engine *e = c->engine;
    cudaStream_t stream = exec->stream != NULL ? (cudaStream_t)exec->stream : c->stream;
    int prev = -1, locked = 0;
    kiln_status st;
    if (c->failed) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "this CUDA execution context failed earlier and can no longer run "
                              "(%s); free it and create a new context (after a sticky CUDA error "
                              "such as an illegal address, restart the process)",
                              c->fail_msg);
    }
    st = device_enter(e->device, &prev);
    if (st == KILN_OK && c->scratch != NULL) {
        scratch_enter(c);
        locked = 1;
    }
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
    // After the synchronize (or, in a caller's capture, the enqueue): the next user may start.
    if (locked) kiln_cuda_scratch_unlock(c->scratch);
    device_leave(e->device, prev);
    return st;
}

// --- test hook: one layer on device tensors

// One cuDNN handle per device for run_op, created on first use and kept (the test programs run
// hundreds of cases; creating a handle costs far more than a case).
#define RUN_OP_MAX_DEVICES 64
static pthread_mutex_t run_op_mtx;
static pthread_once_t run_op_once = PTHREAD_ONCE_INIT;
static kiln_cuda_dnn *run_op_handles[RUN_OP_MAX_DEVICES];
static uint8_t run_op_tried[RUN_OP_MAX_DEVICES];

static void run_op_init(void) { pthread_mutex_init(&run_op_mtx, NULL); }

static kiln_cuda_dnn *run_op_dnn(int device) {
    kiln_cuda_dnn *d = NULL;
    if (device < 0 || device >= RUN_OP_MAX_DEVICES) return NULL;
    pthread_once(&run_op_once, run_op_init);
    pthread_mutex_lock(&run_op_mtx);
    if (!run_op_tried[device]) {
        run_op_tried[device] = 1;
        run_op_handles[device] = kiln_cuda_dnn_create();
    }
    d = run_op_handles[device];
    pthread_mutex_unlock(&run_op_mtx);
    return d;
}

static kiln_status plugin_run_op(const kiln_kernel_args *args, int device, void *stream,
                                 uint32_t flags) {
    kiln_cuda_ctx ctx;
    kiln_cuda_attn_cache attn;
    cudaStream_t own = NULL;
    int prev = -1, entered = 0;
    char where[96], why[256];
    memset(&attn, 0, sizeof attn);
    kiln_status st = KILN_OK;
    memset(&ctx, 0, sizeof ctx);
    ctx.gemv_keep = -1;
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
    ctx.no_tc_attention = (flags & KILN_CUDA_RUN_NO_TC_ATTENTION) != 0;
    ctx.attn_rows = attn_rows_env();
    ctx.attn_split = attn_split_env();
    ctx.small_m = small_m_env();
    ctx.splitk = KILN_CUDA_RUN_SPLITK_OF(flags) != 0 ? (int)KILN_CUDA_RUN_SPLITK_OF(flags) : -1;
    if (KILN_CUDA_RUN_WG_BN(flags) != 0 && kiln_cuda_wg_init(device)) {
        // a test forces one configuration of Kiln's small-M linear
        ctx.small_m |= KILN_CUDA_SMALL_M_WG;
        ctx.wg_force.bn = (int)KILN_CUDA_RUN_WG_BN(flags);
        ctx.wg_force.split = (int)KILN_CUDA_RUN_WG_SPLIT(flags);
        ctx.wg_force.occ = KILN_CUDA_RUN_WG_OCC(flags) == 2 ? 2 : 1;
    }
    if (cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, device) !=
        cudaSuccess) {
        cudaGetLastError(); // consumed: the sdpa occupancy rule then keeps 64-row blocks
        ctx.sm_count = 0;
    }
    if (!(flags & KILN_CUDA_RUN_NO_CUBLASLT) && !no_cublaslt()) {
        if (cublasLtCreate(&ctx.lt) != CUBLAS_STATUS_SUCCESS) {
            ctx.lt = NULL;
            st = kiln_cuda_fail(KILN_ERR_DEVICE, "run_op: cublasLtCreate failed");
            goto fail;
        }
    }
    ctx.no_dnn_attention = env_flag("KILN_CUDA_NO_CUDNN_SDPA");
    if (!(flags & KILN_CUDA_RUN_NO_CUDNN) &&
        (args->op == KILN_OP_CONV2D || (args->op == KILN_OP_SDPA && !ctx.no_dnn_attention))) {
        ctx.dnn = run_op_dnn(device); // kept for the process: cudnnCreate is slow
    }
    ctx.attn = &attn; // freed after the synchronize below
    if (ctx.lt != NULL || ctx.dnn != NULL) {
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
    if (st != KILN_OK) cudaGetLastError(); // reported: leave nothing pending
    kiln_cuda_attn_cache_free(&attn);
    cudaFree(ctx.workspace);
    if (ctx.lt != NULL) cublasLtDestroy(ctx.lt);
    if (own != NULL) cudaStreamDestroy(own);
    if (entered) device_leave(device, prev);
    return st;
}

// --- plugin entry point

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
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
    cudaGetLastError();
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
    .dnn_version = kiln_cuda_dnn_version,
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
    pthread_once(&probe_once, probe);
    if (!probe_ok) {
        if (reason != NULL && reason_nbytes > 0)
            snprintf(reason, reason_nbytes, "%s", probe_reason);
        return KILN_ERR_DEVICE;
    }
    *out = &plugin_table;
    return KILN_OK;
}
