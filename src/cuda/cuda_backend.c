// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: the plugin's entry point and the kiln_backend_ops the runtime drives
// (runtime/backend.h); the files around it are listed in cuda_backend.h.
//
// Engine: the device ("auto" = 0, "cuda:N"), the policy (the options cuda.*, resolved by libkiln
// at load), every layer checked against kiln_cuda_supports at its largest shapes, the layout,
// fold and L2 plans over the engine's plan, the weights uploaded once (cuda_memory.c).
// Context: a non-blocking stream, a cuBLASLt handle, a cuDNN handle where a layer may use it,
// ONE activation arena (plan->arena_nbytes, zeroed), ONE states block and ONE extras block
// (cuda_memory.c), a tensor view per plan tensor, and each planned layer's plan, made here
// (cuda_tune.c). The states are set to their initial values last (context creation's planning
// and warm-up run the layers, which may write them), and again by reset_states.
// With use_shared_activation_scratch a context takes no arena of its own: it joins its device's
// shared arena (cuda_scratch.h) and holds that arena's execution lock through each execute; when
// the arena was replaced (grown) since its last execute, it re-points its arena views and drops
// its CUDA graphs first.
// Execute: each I/O pointer is bound directly when it is memory of this device (or managed),
// else staged (cudaMemcpyAsync before and after the layers); the layers run on the caller's
// stream if one was set, else the context's; nothing is allocated and nothing synchronizes until
// the end: directly, recorded or replayed as CUDA graphs (cuda_graph.c). Context creation records
// the layers over the staging buffers as a graph; an execute at the largest shapes whose device
// pointers are new stages its I/O and replays that graph (a library's host work per layer, such
// as cuDNN's ~0.1 ms per convolution, is paid only where a graph is recorded). A CUDA error marks
// the context failed: later executes return KILN_ERR_DEVICE at once.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attn.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_dnn.h"
#include "cuda/cuda_graph_rules.h"
#include "cuda/cuda_ops.h"
#include "cuda/gemm.h"
#include "runtime/plan_group.h"

kiln_status kiln_cuda_device_enter(int device, int *prev) {
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) {
        kiln_cuda_consume(); // no CUDA error may stay pending for a later check
        *prev = -1;
    }
    if (*prev == device) return KILN_OK;
    e = cudaSetDevice(device);
    if (e == cudaSuccess) return KILN_OK;
    kiln_cuda_consume();
    return kiln_cuda_call_failed("cudaSetDevice", e);
}

void kiln_cuda_device_leave(int device, int prev) {
    if (prev >= 0 && prev != device && cudaSetDevice(prev) != cudaSuccess) kiln_cuda_consume();
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

// --- engine

static void cuda_engine_free(void *state) {
    cuda_engine *e = state;
    int prev;
    kiln_cuda_warm_up_wait(); // (a load that failed, or no context made)
    if (e == NULL) return;
    if ((e->weights != NULL || e->state_init != NULL || e->n_shared > 0) &&
        kiln_cuda_device_enter(e->device, &prev) == KILN_OK) {
        cudaFree(e->weights);
        cudaFree(e->state_init);
        kiln_cuda_weights_free(e); // the shared weights' references (their device current)
        kiln_cuda_device_leave(e->device, prev);
    }
    kiln_cuda_weights_free(e);
    kiln_cuda_states_free(e);
    kiln_cuda_extras_free(e->plan, &e->extras);
    kiln_cuda_free(e->l2_keep, ((size_t)e->plan->n_layers + 1) * sizeof *e->l2_keep);
    kiln_cuda_layout_free(e->plan, &e->layout);
    kiln_cuda_fold_free(e->plan, &e->fold);
    kiln_cuda_free(e, sizeof *e);
}

// The runtime's verdict on the weights (backend.h): the shared copies this engine made are
// found by other engines from now on.
static void cuda_weights_checked(void *state) {
    if (state != NULL) kiln_cuda_weights_checked(state);
}

// Checks every layer at its largest shapes (data pointers are NULL: nothing runs).
static kiln_status check_layers(const kiln_plan *p) {
    size_t nbytes = (size_t)p->n_tensors * sizeof(kiln_tensor);
    kiln_tensor *views = kiln_cuda_calloc(nbytes + 1);
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
        kiln_plan_group_args(p, li, views, tails, &args);
        if (!kiln_cuda_supports(&args, why, sizeof why)) {
            st = kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                                "layer %u: the CUDA backend cannot run it: %s; load the engine "
                                "with device 'cpu'",
                                li, why);
            break;
        }
    }
    kiln_cuda_free(views, nbytes + 1);
    return st;
}

static int plan_wants_dnn(const kiln_plan *p, const kiln_cuda_policy *pol) {
    if (!pol->cudnn) return 0;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        if (p->layers[li].op == KILN_OP_CONV2D) return 1;
        if (p->layers[li].op == KILN_OP_SDPA && pol->cudnn_sdpa) return 1;
    }
    return 0;
}

static kiln_status cuda_engine_init(const kiln_plan *p, const void *const *weight_data,
                                    const kiln_options *options, void **out_state) {
    cuda_engine *e;
    struct cudaDeviceProp prop;
    int device, count = 0, prev = -1, entered = 0;
    kiln_status st;
    if (!parse_device(options->device, &device)) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG, "device '%s' is not a CUDA device",
                              options->device);
    }
    if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
        kiln_cuda_consume();
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "device '%s' does not exist: %d CUDA device%s visible; use cuda:0 .. "
                              "cuda:%d, or check CUDA_VISIBLE_DEVICES",
                              options->device, count, count == 1 ? " is" : "s are",
                              count > 0 ? count - 1 : 0);
    }
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        kiln_cuda_consume();
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
    e->policy = options->cuda;
    if (!e->policy.cudnn) e->policy.cudnn_sdpa = 0;
    e->device = device;
    e->profile = options->profile != 0;
    e->use_graphs = options->use_cuda_graphs != 0 && !e->policy.debug_sync && !e->profile;
    e->share_arena = options->use_shared_activation_scratch != 0;
    e->sm_count = prop.multiProcessorCount;
    e->wants_dnn = plan_wants_dnn(p, &e->policy);
    st = kiln_cuda_device_enter(device, &prev);
    if (st != KILN_OK) goto fail;
    entered = 1;
    e->wg_ok = e->policy.wgmma && prop.major == 9 && prop.minor == 0 && kiln_cuda_wg_init(device);
    // The L2 plan covers the linears the small-M kernels take (their loads carry its hints).
    e->l2_keep = kiln_cuda_calloc(((size_t)p->n_layers + 1) * sizeof *e->l2_keep);
    if (e->l2_keep == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA layer table)");
        goto fail;
    }
    const uint64_t l2_budget =
        prop.l2CacheSize > 0 ? (uint64_t)prop.l2CacheSize * (uint64_t)e->policy.l2_keep_pct / 100
                             : 0;
    e->l2_kept = kiln_cuda_plan_l2(
        p, l2_budget, e->wg_ok ? KILN_CUDA_WG_MAX_M : KILN_CUDA_GEMV_MAX_M, e->l2_keep);
    // NHWC needs cuDNN (Kiln's own NHWC conv is only the per-shape fallback).
    st = kiln_cuda_layout_plan(p,
                               e->policy.nhwc && e->policy.cudnn && kiln_cuda_dnn_version() > 0
                                   ? KILN_CUDA_LAYOUT_NHWC |
                                         (e->policy.stem_kernel ? KILN_CUDA_LAYOUT_STEM : 0)
                                   : 0,
                               &e->layout);
    if (st != KILN_OK) goto fail;
    st = kiln_cuda_fold_plan(p, e->layout.nhwc, e->layout.alt, e->layout.ident,
                             e->policy.attention_fold, e->policy.gemv && e->policy.gemv_fold,
                             &e->fold);
    if (st != KILN_OK) goto fail;
    st = kiln_cuda_extras_plan(e);
    if (st != KILN_OK) goto fail;
    kiln_cuda_tune_engine_init(e, &prop, options->tuning_cache);
    st = kiln_cuda_attention_init();
    if (st != KILN_OK) goto fail;
    st = kiln_cuda_weights_upload(e, weight_data, options->verify_weights);
    if (st != KILN_OK) goto fail;
    st = kiln_cuda_states_upload(e, weight_data);
    if (st != KILN_OK) goto fail;
    kiln_cuda_device_leave(device, prev);
    kiln_cuda_log(
        KILN_LOG_INFO,
        "CUDA engine on device %d (%s): %u layers, %zu bytes of weights (%llu more shared with "
        "other engines, %llu of them uploaded by another), arena %llu bytes%s, "
        "extras %llu bytes, %u states of %llu bytes per context (%llu bytes of initial values "
        "kept), CUDA graphs %s; NHWC: %u of %u conv2d (%u channel-padded, %u on the "
        "stem kernel), %u tensors, %u boundary transposes; attention folds: %u layers run no "
        "kernel, %u sdpa operands, %u outputs, %u matmul operands and %u rotary inputs through "
        "strided views, %u "
        "tensors moved out of "
        "the arena, %u reshapes and slices aliased (no kernel); GEMV folds: %u RMSNorms inside "
        "GEMVs, %u "
        "gated pairs as one GEMV, %u linears run by a sibling's launch; %u rope groups (rotary "
        "and KV cache writes in one launch, %u permutes read through); small-M weights kept in "
        "L2: %llu bytes",
        device, prop.name, p->n_layers, e->weights_nbytes, (unsigned long long)e->shared_nbytes,
        (unsigned long long)e->shared_found_nbytes, (unsigned long long)p->arena_nbytes,
        e->share_arena ? " (shared: use_shared_activation_scratch)" : "",
        (unsigned long long)e->extras.nbytes, e->n_states, (unsigned long long)e->states_nbytes,
        (unsigned long long)e->states_init_nbytes, e->use_graphs ? "on" : "off",
        e->layout.n_conv_nhwc, e->layout.n_conv, e->layout.n_conv_padded, e->layout.n_conv_stem,
        e->layout.n_nhwc, e->layout.n_copies, e->fold.n_virtual, e->fold.n_sdpa_in,
        e->fold.n_sdpa_out, e->fold.n_mm_in, e->fold.n_rot_in, e->fold.n_reloc, e->fold.n_alias,
        e->fold.n_gemv_norm, e->fold.n_gemv_pair, e->fold.n_gemv_sib, e->fold.n_rope,
        e->fold.n_rope_in, (unsigned long long)e->l2_kept);
    *out_state = e;
    return KILN_OK;

fail:
    if (st != KILN_OK) kiln_cuda_consume(); // allocation failures are not sticky: clear them
    if (entered) kiln_cuda_device_leave(device, prev);
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
    entered = kiln_cuda_device_enter(e->device, &prev) == KILN_OK;
    kiln_cuda_profile_log(c);
    if (entered) {
        if (c->stream != NULL) cudaStreamSynchronize(c->stream);
        kiln_cuda_profile_free(&c->prof, p->n_layers);
        kiln_cuda_graph_free(&c->graph);
        kiln_cuda_graph_free(&c->staged_graph);
        for (uint32_t li = 0; c->layers != NULL && li < p->n_layers; li++) {
            kiln_cuda_plan_release(&c->layers[li].tuned);
            kiln_cuda_plan_release(&c->layers[li].now);
        }
        kiln_cuda_sdpa_store_free(c->sdpa_store);
        if (c->scratch == NULL) cudaFree(c->arena);
        cudaFree(c->extras);
        cudaFree(c->workspace);
        if (c->lt != NULL) cublasLtDestroy(c->lt);
        kiln_cuda_dnn_destroy(c->dnn);
        if (c->stream != NULL) cudaStreamDestroy(c->stream);
        kiln_cuda_consume();
        kiln_cuda_device_leave(e->device, prev);
    }
    kiln_cuda_scratch_release(c->scratch); // after the synchronize: no work of c is in flight
    int any_held = 0;
    for (uint32_t i = 0; c->held != NULL && i < p->n_tensors; i++) any_held |= c->held[i] != NULL;
    if (c->states != NULL || any_held) { // the last reference to a block frees it, on its device
        int sprev = -1;
        const int sin = kiln_cuda_device_enter(e->device, &sprev) == KILN_OK;
        kiln_cuda_states_release(c->states, sin);
        for (uint32_t i = 0; c->held != NULL && i < p->n_tensors; i++) {
            kiln_cuda_states_release(c->held[i], sin);
        }
        if (sin) {
            kiln_cuda_consume();
            kiln_cuda_device_leave(e->device, sprev);
        }
    }
    kiln_cuda_free(c->staged, c->n_io + 1);
    kiln_cuda_free(c->views, (size_t)p->n_tensors * sizeof *c->views + 1);
    kiln_cuda_free(c->held, (size_t)p->n_tensors * sizeof *c->held + 1);
    kiln_cuda_free(c->layers, (size_t)p->n_layers * sizeof *c->layers + 1);
    kiln_cuda_free(c->sig_now, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_last, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_graph, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c->sig_staged, c->sig_n * sizeof(int64_t));
    kiln_cuda_free(c, sizeof *c);
}

// A replay waits for the graph's last node unless cuda.flag_wait is off or the device's schedule
// is yield or blocking-sync (the caller asked not to spin: cudaSetDeviceFlags). On its device.
static int flag_wait_enabled(const cuda_engine *e) {
    unsigned flags = 0;
    if (!e->policy.flag_wait) return 0;
    if (cudaGetDeviceFlags(&flags) != cudaSuccess) {
        kiln_cuda_consume();
        return 0;
    }
    flags &= cudaDeviceScheduleMask;
    return flags == cudaDeviceScheduleAuto || flags == cudaDeviceScheduleSpin;
}

static uint64_t bound_nbytes(const kiln_tensor *t) {
    uint64_t n = kiln_cuda_dtype_size(t->dtype);
    for (uint32_t i = 0; i < t->rank; i++) n *= (uint64_t)(t->dims[i] > 0 ? t->dims[i] : 0);
    return n;
}

static kiln_status record_enqueue(void *arg, cudaStream_t stream) {
    return kiln_cuda_layers_run(arg, stream);
}

// The signature of the views bound now: the bindings' addresses, then each input's rank and
// dims (zeros past the rank).
static void sig_of_views(const cuda_context *c, int64_t *sig) {
    const kiln_plan *p = c->engine->plan;
    memset(sig, 0, c->sig_n * sizeof *sig);
    for (uint32_t b = 0; b < c->n_io; b++) {
        sig[b] = (int64_t)(uintptr_t)c->views[kiln_cuda_binding_tensor(p, b)].data;
    }
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        const kiln_tensor *t = &c->views[p->inputs[i]];
        int64_t *s = sig + c->n_io + (size_t)i * (1 + KILN_MAX_RANK);
        s[0] = t->rank;
        for (uint32_t d = 0; d < t->rank && d < KILN_MAX_RANK; d++) s[1 + d] = t->dims[d];
    }
}

// 1 when every tensor is bound at its largest shape (the shapes the staged graph recorded).
static int at_largest_shapes(const cuda_context *c) {
    const kiln_plan *p = c->engine->plan;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_tensor *v = &c->views[i];
        const kiln_shape *m = &p->tensors[i].shape;
        if (v->rank != m->rank || memcmp(v->dims, m->max, m->rank * sizeof *v->dims) != 0) {
            return 0;
        }
    }
    return 1;
}

// Binds every I/O tensor to its staging buffer (NULL where it has none: no bytes at any shape),
// as the staged graph recorded them; the bindings with bytes are copied in and out.
static void stage_all(cuda_context *c) {
    const cuda_engine *e = c->engine;
    for (uint32_t b = 0; b < c->n_io; b++) {
        const uint32_t t = kiln_cuda_binding_tensor(e->plan, b);
        const uint64_t off = e->extras.staging_off[b];
        c->views[t].data = off == KILN_CUDA_NO_OFFSET ? NULL : (uint8_t *)c->extras + off;
        c->staged[b] = (uint8_t)(off != KILN_CUDA_NO_OFFSET && bound_nbytes(&c->views[t]) > 0);
    }
}

// Records the staged graph over the views bound now (stage_all's, at the largest shapes). At
// context creation a failure leaves it out for the context's lifetime (logged at DEBUG: the
// executes record their own graphs as before); at an execute it fails the execute.
static kiln_status record_staged(cuda_context *c, cudaStream_t stream, int at_creation) {
    if (c->no_staged || !at_largest_shapes(c)) return KILN_OK;
    stage_all(c);
    kiln_status st = kiln_cuda_graph_record(&c->staged_graph, stream, record_enqueue, c,
                                            c->engine->plan->n_layers, 0);
    if (st == KILN_OK) {
        sig_of_views(c, c->sig_staged);
    } else if (at_creation) {
        kiln_cuda_log(KILN_LOG_DEBUG, "no CUDA graph over the staging buffers: %s",
                      kiln_cuda_last_message());
        kiln_cuda_consume();
        c->no_staged = 1;
        st = KILN_OK;
    }
    return st;
}

// After the warm-up run: the workspace shrinks to what its layers used (cuDNN's convolutions
// and cuBLASLt's algorithms chosen here often need none or a few KiB of the 32 MiB planned
// with), at least KILN_CUDA_WORKSPACE_MIN_NBYTES: room for plans made later at other shapes
// (made within the smaller size; the split kernels size their partials to it).
static kiln_status workspace_fit(cuda_context *c) {
    if (c->workspace == NULL) return KILN_OK;
    size_t need = c->workspace_used > KILN_CUDA_WORKSPACE_MIN_NBYTES
                      ? c->workspace_used
                      : KILN_CUDA_WORKSPACE_MIN_NBYTES;
    need = (need + KILN_CUDA_BLOCK_ALIGN - 1) & ~(size_t)(KILN_CUDA_BLOCK_ALIGN - 1);
    if (need >= c->workspace_nbytes) return KILN_OK;
    cudaError_t err = cudaStreamSynchronize(c->stream); // the warm-up run's work is done
    if (err != cudaSuccess) return kiln_cuda_call_failed("cudaStreamSynchronize (workspace)", err);
    cudaFree(c->workspace);
    c->workspace = NULL;
    err = cudaMalloc(&c->workspace, need);
    if (err != cudaSuccess) {
        c->workspace_nbytes = 0;
        return kiln_cuda_call_failed("cudaMalloc (workspace)", err);
    }
    kiln_cuda_log(KILN_LOG_DEBUG, "workspace: %zu bytes used of %zu", need, c->workspace_nbytes);
    c->workspace_nbytes = need;
    return KILN_OK;
}

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = kiln_cuda_call_failed(what, e_);                                                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static kiln_status cuda_context_init(void *engine_state, void **out_state) {
    const cuda_engine *e = engine_state;
    const kiln_plan *p = e->plan;
    cuda_context *c;
    int prev = -1, entered = 0;
    kiln_status st = KILN_OK;
    kiln_cuda_warm_up_wait(); // the libraries initialised in the background, if they are
    c = kiln_cuda_calloc(sizeof *c);
    if (c == NULL) return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA context)");
    c->engine = e;
    c->n_io = p->n_inputs + p->n_outputs;
    c->sig_n = (size_t)c->n_io + (size_t)p->n_inputs * (1 + KILN_MAX_RANK);
    c->staged = kiln_cuda_calloc(c->n_io + 1);
    c->views = kiln_cuda_calloc((size_t)p->n_tensors * sizeof *c->views + 1);
    c->held = kiln_cuda_calloc((size_t)p->n_tensors * sizeof *c->held + 1);
    c->layers = kiln_cuda_calloc((size_t)p->n_layers * sizeof *c->layers + 1);
    c->sig_now = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_last = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_graph = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    c->sig_staged = kiln_cuda_calloc(c->sig_n * sizeof(int64_t));
    if (c->staged == NULL || c->views == NULL || c->held == NULL || c->layers == NULL ||
        c->sig_now == NULL || c->sig_last == NULL || c->sig_graph == NULL ||
        c->sig_staged == NULL) {
        st = kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA context tables)");
        goto fail;
    }
    st = kiln_cuda_device_enter(e->device, &prev);
    if (st != KILN_OK) goto fail;
    entered = 1;
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    st = kiln_cuda_graph_init(&c->graph, e->use_graphs && flag_wait_enabled(e));
    if (st != KILN_OK) goto fail;
    st = kiln_cuda_graph_init(&c->staged_graph, 0); // its outputs are staged: no flag wait
    if (st != KILN_OK) goto fail;
    if (e->policy.cublaslt) {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            c->lt = NULL;
            st = kiln_cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_NO_MEMORY
                                                                : KILN_ERR_DEVICE,
                                "cublasLtCreate failed: %s", cublasLtGetStatusString(s));
            goto fail;
        }
    }
    if (e->wants_dnn) {
        c->dnn = kiln_cuda_warm_take_dnn(e->device);         // made beside the load, if it was
        if (c->dnn == NULL) c->dnn = kiln_cuda_dnn_create(); // NULL: Kiln's kernels
    }
    for (uint32_t li = 0; c->dnn != NULL && e->policy.cudnn_sdpa && li < p->n_layers; li++) {
        if (p->layers[li].op != KILN_OP_SDPA || (p->layers[li].flags & KILN_LAYER_TAIL)) continue;
        c->sdpa_store = kiln_cuda_sdpa_store_new(); // NULL: Kiln's kernel
        break;
    }
    if (e->policy.cublaslt || e->wants_dnn) { // the libraries' (and the split kernels') room
        CUDA_TRY(cudaMalloc(&c->workspace, KILN_CUDA_WORKSPACE_NBYTES), "cudaMalloc (workspace)");
        c->workspace_nbytes = KILN_CUDA_WORKSPACE_NBYTES;
    }
    if (e->extras.nbytes > 0) {
        CUDA_TRY(cudaMalloc(&c->extras, (size_t)e->extras.nbytes), "cudaMalloc (extras block)");
        // zeroed: the pad channels of padded copies stay zero (transposes write channels < C)
        CUDA_TRY(cudaMemsetAsync(c->extras, 0, (size_t)e->extras.nbytes, c->stream),
                 "cudaMemsetAsync (extras block)");
    }
    st = kiln_cuda_states_new(e, &c->states);
    if (st != KILN_OK) goto fail;
    if (c->states != NULL) { // zeroed for the planning and warm-up runs; the values come after
        CUDA_TRY(cudaMemsetAsync(c->states->data, 0, (size_t)e->states_nbytes, c->stream),
                 "cudaMemsetAsync (states block)");
    }
    if (p->arena_nbytes > 0 && e->share_arena) {
        st = kiln_cuda_scratch_acquire(e->device, (size_t)p->arena_nbytes, &c->scratch);
        if (st != KILN_OK) goto fail;
    } else if (p->arena_nbytes > 0) {
        CUDA_TRY(cudaMalloc(&c->arena, (size_t)p->arena_nbytes), "cudaMalloc (activation arena)");
        CUDA_TRY(cudaMemsetAsync(c->arena, 0, (size_t)p->arena_nbytes, c->stream),
                 "cudaMemsetAsync (arena)");
    }
    if (e->profile) {
        st = kiln_cuda_profile_init(&c->prof, p->n_layers);
        if (st != KILN_OK) goto fail;
    }
    CUDA_TRY(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (context init)");
    // A shared arena: its execution lock from here through the planning, which times the
    // candidates on the layers' own buffers (arena memory other contexts use).
    if (c->scratch != NULL) c->arena = kiln_cuda_scratch_lock(c->scratch, &c->arena_gen);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        c->views[i].dtype = t->dtype;
        c->views[i].rank = t->shape.rank;
        memcpy(c->views[i].dims, t->shape.max, sizeof c->views[i].dims);
        if (t->kind == KILN_TENSOR_WEIGHT) {
            c->views[i].data = e->weight_ptrs[i];
        } else if (t->kind == KILN_TENSOR_ACTIVATION && e->fold.reloc[i]) {
            c->views[i].data = (uint8_t *)c->extras + e->extras.reloc_off[i];
        } else if (t->kind == KILN_TENSOR_STATE) { // fixed for the context's lifetime
            c->views[i].data =
                c->states != NULL ? (uint8_t *)c->states->data + e->state_offsets[i] : NULL;
        }
    }
    kiln_cuda_bind_arena_views(c);
    for (uint32_t b = 0; b < c->n_io; b++) {
        const uint64_t off = e->extras.staging_off[b];
        c->views[kiln_cuda_binding_tensor(p, b)].data =
            off == KILN_CUDA_NO_OFFSET ? NULL : (uint8_t *)c->extras + off;
    }
    if (kiln_cuda_tune_context(c)) {
        st = workspace_fit(c);
        if (st != KILN_OK) goto fail;
    }
    if (e->use_graphs) record_staged(c, c->stream, 1);
    if (c->scratch != NULL) {
        cudaError_t err = cudaStreamSynchronize(c->stream); // the timing runs are done
        kiln_cuda_scratch_unlock(c->scratch);
        if (err != cudaSuccess) {
            st = kiln_cuda_call_failed("cudaStreamSynchronize (context init, shared arena)", err);
            goto fail;
        }
    }
    // The states' initial values, after every run of the layers above (they may write states).
    st = kiln_cuda_states_set(e, c->states != NULL ? c->states->data : NULL, c->stream);
    if (st != KILN_OK) goto fail;
    CUDA_TRY(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (states)");
    kiln_cuda_device_leave(e->device, prev);
    *out_state = c;
    return KILN_OK;

fail:
    kiln_cuda_consume();
    if (entered) kiln_cuda_device_leave(e->device, prev);
    cuda_context_free(c);
    return st;
}

// --- execute

// 1 when ptr is memory the kernels of `device` may use directly (device memory of that device,
// or managed memory).
static int is_device_memory(const void *ptr, int device) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        kiln_cuda_consume(); // older drivers: unregistered host memory is an error
        return 0;
    }
    if (a.type == cudaMemoryTypeManaged) return 1;
    return a.type == cudaMemoryTypeDevice && a.device == device;
}

// The runtime's question (kiln_backend_ops.memory_is_host): can the host read ptr?
static int cuda_memory_is_host(void *engine_state, const void *ptr) {
    struct cudaPointerAttributes a;
    (void)engine_state;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        kiln_cuda_consume(); // older drivers: unregistered host memory is an error
        return 1;
    }
    return a.type != cudaMemoryTypeDevice;
}

static int64_t host_index(const void *data, uint32_t dtype, int64_t i) {
    switch (dtype) {
    case KILN_DTYPE_I32: return ((const int32_t *)data)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)data)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)data)[i] != 0;
    default: return 0;
    }
}

// Indices the caller passes in host memory are checked before anything runs, as the CPU
// reference checks them: a position past a KV cache (index_copy) or a token id outside the
// vocabulary (embedding) fails the execute with the CPU's message, and no state changes. Indices
// already in device memory (device I/O) are not read back: there an index_copy row out of range
// is skipped and an embedding row is zeros (docs/cuda.md).
static kiln_status check_host_indices(const cuda_context *c, const kiln_exec *exec) {
    const kiln_plan *p = c->engine->plan;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *l = &p->layers[li];
        int32_t xt, it;
        int64_t size, lo;
        if ((l->op != KILN_OP_INDEX_COPY && l->op != KILN_OP_EMBEDDING) || l->n_inputs < 2) {
            continue;
        }
        xt = p->ids[l->input_begin];
        it = p->ids[l->input_begin + 1];
        if (xt < 0 || it < 0 || p->tensors[it].kind != KILN_TENSOR_INPUT ||
            !c->staged[p->tensors[it].binding]) {
            continue;
        }
        const kiln_tensor *ix = &exec->tensors[it];
        const kiln_tensor *x = &c->views[xt];
        kiln_attrs a = kiln_plan_layer_attrs(p, l);
        if (l->op == KILN_OP_INDEX_COPY) {
            int64_t dim = kiln_attrs_int(&a, KILN_A_INDEX_COPY_DIM, 0);
            if (dim < 0) dim += x->rank;
            if (dim < 0 || dim >= (int64_t)x->rank) continue;
            size = x->dims[dim];
            lo = kiln_attrs_int(&a, KILN_A_INDEX_COPY_WRAP, 0) ? -size : 0;
        } else {
            size = x->dims[0];
            lo = 0;
        }
        int64_t n = 1;
        for (uint32_t d = 0; d < ix->rank; d++) n *= ix->dims[d];
        for (int64_t i = 0; i < n; i++) {
            int64_t v = host_index(ix->data, ix->dtype, i);
            if (v >= lo && v < size) continue;
            const char *name = kiln_plan_string(p, p->tensors[it].name);
            if (l->op == KILN_OP_EMBEDDING) {
                return kiln_cuda_fail(KILN_ERR_INVALID_ARG,
                                      "embedding: index %lld at position %lld of input '%s' is out "
                                      "of range [0, %lld); indices must be valid rows of the "
                                      "weight (a token id outside the vocabulary)",
                                      (long long)v, (long long)i, name, (long long)size);
            }
            return kiln_cuda_fail(KILN_ERR_INVALID_ARG,
                                  "index_copy: index %lld at position %lld of input '%s' is out of "
                                  "range for a dimension of size %lld (a position past the end of "
                                  "a cache: the cache holds %lld)",
                                  (long long)v, (long long)i, name, (long long)size,
                                  (long long)size);
        }
    }
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
        if (err != cudaSuccess) return kiln_cuda_call_failed("cudaStreamIsCapturing", err);
        external_capture = cap != cudaStreamCaptureStatusNone;
    }
    // Shapes, then I/O binding: direct or staged.
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        c->views[i].rank = exec->tensors[i].rank;
        memcpy(c->views[i].dims, exec->tensors[i].dims, sizeof c->views[i].dims);
    }
    for (uint32_t b = 0; b < c->n_io; b++) {
        const uint32_t t = kiln_cuda_binding_tensor(p, b);
        const uint64_t off = e->extras.staging_off[b];
        void *user = exec->tensors[t].data;
        int direct = bound_nbytes(&c->views[t]) == 0 || off == KILN_CUDA_NO_OFFSET ||
                     is_device_memory(user, e->device);
        c->staged[b] = (uint8_t)!direct;
        c->views[t].data = direct ? user : (uint8_t *)c->extras + off;
    }
    sig_of_views(c, c->sig_now);
    KILN_CUDA_TRY(check_host_indices(c, exec));
    // How the layers run (cuda_graph_rules.h: kiln_cuda_run_choice).
    size_t sig_nbytes = c->sig_n * sizeof(int64_t);
    int use_graph = e->use_graphs && !special && !external_capture;
    int same_as_last =
        c->last_valid && !exec->shapes_changed && memcmp(c->sig_now, c->sig_last, sig_nbytes) == 0;
    kiln_cuda_run_facts facts;
    facts.use_graph = use_graph;
    facts.graph_matches = c->graph.valid && !exec->shapes_changed &&
                          memcmp(c->sig_now, c->sig_graph, sig_nbytes) == 0;
    // (the shapes' walk is skipped on a replay, which does not need it)
    facts.at_largest = use_graph && !facts.graph_matches && at_largest_shapes(c);
    facts.staged_ok = !c->no_staged;
    facts.staged_matches =
        c->staged_graph.valid && memcmp(c->sig_now, c->sig_staged, sig_nbytes) == 0;
    facts.repeats_last = same_as_last;
    const int how = kiln_cuda_run_choice(&facts);
    memcpy(c->sig_last, c->sig_now, sig_nbytes); // the signature as bound, before any staging
    c->last_valid = 0;                           // until the layers are enqueued
    if (how == KILN_CUDA_RUN_STAGED) {
        stage_all(c);
        if (!c->staged_graph.valid) KILN_CUDA_TRY(record_staged(c, stream, 0));
    }
    for (uint32_t b = 0; b < p->n_inputs; b++) {
        const uint32_t t = kiln_cuda_binding_tensor(p, b);
        if (!c->staged[b]) continue;
        err = cudaMemcpyAsync(c->views[t].data, exec->tensors[t].data,
                              (size_t)bound_nbytes(&c->views[t]), cudaMemcpyDefault, stream);
        if (err != cudaSuccess)
            return kiln_cuda_call_failed("cudaMemcpyAsync (input staging)", err);
    }
    // The layers.
    cuda_graph *ran = NULL; // the graph launched: its last node writes the end-of-execute flag
    switch (how) {
    case KILN_CUDA_RUN_REPLAY: ran = &c->graph; break;
    case KILN_CUDA_RUN_STAGED: ran = &c->staged_graph; break;
    case KILN_CUDA_RUN_RECORD:
        KILN_CUDA_TRY(kiln_cuda_graph_record(&c->graph, stream, record_enqueue, c, p->n_layers, 1));
        memcpy(c->sig_graph, c->sig_now, sig_nbytes);
        ran = &c->graph;
        break;
    default: KILN_CUDA_TRY(kiln_cuda_layers_run(c, stream)); break; // KILN_CUDA_RUN_DIRECT
    }
    if (ran != NULL) KILN_CUDA_TRY(kiln_cuda_graph_launch(ran, stream));
    c->last_valid = 1;
    int staged_out = 0; // output copies after the graph: the flag would come before them
    for (uint32_t b = p->n_inputs; b < c->n_io; b++) {
        const uint32_t t = kiln_cuda_binding_tensor(p, b);
        if (!c->staged[b]) continue;
        staged_out = 1;
        err = cudaMemcpyAsync(exec->tensors[t].data, c->views[t].data,
                              (size_t)bound_nbytes(&c->views[t]), cudaMemcpyDefault, stream);
        if (err != cudaSuccess) {
            return kiln_cuda_call_failed("cudaMemcpyAsync (output staging)", err);
        }
    }
    // The caller's graph runs the work later. On a shared arena the execution lock covers only
    // the enqueue: a caller who captures sharing engines must not replay their graphs
    // concurrently (with each other or with other executes of sharing engines on the device),
    // and must capture again after a new sharing context grew the arena (the old block is freed).
    if (external_capture) return KILN_OK;
    const int by_flag = ran != NULL && !staged_out;
    err = kiln_cuda_graph_wait(ran != NULL ? ran : &c->graph, stream, by_flag);
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "CUDA error at the end of execute: %s (%s); a kernel of this engine "
                              "faulted (set the option cuda.debug_sync to name the layer)",
                              cudaGetErrorName(err), cudaGetErrorString(err));
    }
    return kiln_cuda_profile_collect(&c->prof);
}

// A context on a shared arena: takes the arena's execution lock (held until the execute's work
// is finished, or enqueued into a caller's capture) and, when the arena was replaced since the
// views were bound, re-points them and drops the CUDA graph that recorded the old addresses
// (the next executes run directly, then re-record). The plans need nothing: their keys hold
// the operands' alignments (cudaMalloc blocks are aligned past the 256 bytes they distinguish).
static void scratch_enter(cuda_context *c) {
    uint64_t gen;
    void *base = kiln_cuda_scratch_lock(c->scratch, &gen);
    if (gen == c->arena_gen && base == c->arena) return;
    c->arena = base;
    c->arena_gen = gen;
    kiln_cuda_bind_arena_views(c);
    kiln_cuda_graph_drop(&c->graph);
    kiln_cuda_graph_drop(&c->staged_graph);
    c->last_valid = 0;
    kiln_cuda_log(KILN_LOG_DEBUG,
                  "shared activation arena replaced: views re-pointed, CUDA graphs dropped");
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
    st = kiln_cuda_device_enter(e->device, &prev);
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
        kiln_cuda_consume();
    } else if (st != KILN_OK) {
        c->last_valid = 0;
        cudaStreamSynchronize(stream);
        kiln_cuda_consume();
    }
    // After the synchronize (or, in a caller's capture, the enqueue): the next user may start.
    if (locked) kiln_cuda_scratch_unlock(c->scratch);
    kiln_cuda_device_leave(e->device, prev);
    return st;
}

// Sets every state of the context back to its initial value, on the context's stream, finished
// on return: its own block at once, or (sharing another context's states) each state it maps,
// from its engine's initial values. Executes return with their work finished, so nothing of
// this context is in flight then; a caller that captured executes into its own CUDA graph
// orders its replays itself.
static kiln_status cuda_reset_states(void *context_state) {
    cuda_context *c = context_state;
    const cuda_engine *e = c->engine;
    int prev = -1;
    kiln_status st;
    if (c->failed) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "this CUDA execution context failed earlier and can no longer run "
                              "(%s); free it and create a new context",
                              c->fail_msg);
    }
    if (e->states_nbytes == 0) return KILN_OK;
    st = kiln_cuda_device_enter(e->device, &prev);
    if (st != KILN_OK) return st;
    st = c->states_shared
             ? kiln_cuda_states_set_views(e, c->views, c->stream)
             : kiln_cuda_states_set(e, c->states != NULL ? c->states->data : NULL, c->stream);
    if (st == KILN_OK) {
        cudaError_t err = cudaStreamSynchronize(c->stream);
        if (err != cudaSuccess) {
            st = kiln_cuda_call_failed("cudaStreamSynchronize (reset_states)", err);
        }
    }
    if (st != KILN_OK) { // a copy between two live blocks of this device failed: sticky
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", kiln_cuda_last_message());
        c->failed = 1;
        c->last_valid = 0;
        cudaStreamSynchronize(c->stream);
        kiln_cuda_consume();
    }
    kiln_cuda_device_leave(e->device, prev);
    return st;
}

// The states c and owner have in common become owner's (runtime/backend.h: the runtime matched
// them; UINT32_MAX: owner lacks it, c keeps its own): each such STATE view points where owner's
// does, and c holds a reference on that block (owner's own, or the one owner shares); c's own
// block is released once none of its states uses it. c's CUDA graphs recorded the old
// addresses: dropped (the next executes run directly, then record again). Neither context
// executes meanwhile.
static kiln_status cuda_share_states(void *context_state, void *owner_state,
                                     const uint32_t *owner_tensor) {
    cuda_context *c = context_state;
    const cuda_context *o = owner_state;
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    int prev = -1;
    if (o->engine->device != e->device) {
        return kiln_cuda_fail(KILN_ERR_INVALID_ARG,
                              "share_states: the contexts run on devices %d and %d", e->device,
                              o->engine->device);
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].kind != KILN_TENSOR_STATE || owner_tensor[i] == UINT32_MAX) continue;
        if (owner_tensor[i] >= o->engine->plan->n_tensors ||
            o->engine->plan->tensors[owner_tensor[i]].kind != KILN_TENSOR_STATE ||
            o->engine->plan->tensors[owner_tensor[i]].nbytes != p->tensors[i].nbytes) {
            return kiln_cuda_fail(KILN_ERR_INTERNAL,
                                  "share_states: tensor %u maps to no state of "
                                  "the owner's size",
                                  i);
        }
    }
    KILN_CUDA_TRY(kiln_cuda_device_enter(e->device, &prev));
    // c's executes are finished (they return so), but its block may still be in a caller's
    // capture: that is the caller's to order; here nothing of c may be in flight.
    cudaError_t err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess) {
        kiln_cuda_consume();
        kiln_cuda_device_leave(e->device, prev);
        return kiln_cuda_call_failed("cudaStreamSynchronize (share_states)", err);
    }
    int own_used = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].kind != KILN_TENSOR_STATE) continue;
        const uint32_t j = owner_tensor[i];
        if (j != UINT32_MAX) {
            cuda_states *b = o->held[j] != NULL ? o->held[j] : o->states;
            if (b != NULL) atomic_fetch_add(&b->refs, 1); // (NULL: the engines' states are empty)
            kiln_cuda_states_release(c->held[i], 1);
            c->held[i] = b;
            c->views[i].data = o->views[j].data;
        }
        own_used |= c->held[i] == NULL;
    }
    if (!own_used) {
        kiln_cuda_states_release(c->states, 1);
        c->states = NULL;
    }
    c->states_shared = 1;
    kiln_cuda_graph_drop(&c->graph);
    kiln_cuda_graph_drop(&c->staged_graph);
    c->last_valid = 0;
    kiln_cuda_consume();
    kiln_cuda_device_leave(e->device, prev);
    return KILN_OK;
}

// " (updates state 3 in place)": the detail of a group that writes a STATE tensor.
static void describe_state_write(const kiln_plan *p, uint32_t li, kiln_layer_info *out) {
    const kiln_plan_layer *l = &p->layers[li];
    const int32_t o = kiln_plan_group_output(p, li);
    if (o < 0 || p->tensors[o].kind != KILN_TENSOR_STATE) return;
    const int in_place = l->op == KILN_OP_INDEX_COPY && l->n_inputs > 0 &&
                         p->ids[l->input_begin] == o && l->n_tail == 0;
    const size_t used = strlen(out->detail);
    if (used + 1 < sizeof out->detail) {
        snprintf(out->detail + used, sizeof out->detail - used, " (%s state %u%s)",
                 in_place ? "updates" : "writes", p->tensors[o].binding,
                 in_place ? " in place: only the rows move" : "");
    }
}

// Appends a clause to out->detail ("; " after what is there), truncated to fit.
static void detail_add(kiln_layer_info *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void detail_add(kiln_layer_info *out, const char *fmt, ...) {
    size_t n = strlen(out->detail);
    if (n > 0 && n + 2 < sizeof out->detail) {
        memcpy(out->detail + n, "; ", 3);
        n += 2;
    }
    if (n + 1 >= sizeof out->detail) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->detail + n, sizeof out->detail - n, fmt, ap);
    va_end(ap);
}

// 1 when layer li runs in a sibling's GEMV launch (cuda_fold.h).
static int gemv_sibling(const cuda_engine *e, uint32_t li) {
    for (uint32_t k = 0; k < e->plan->n_layers; k++) {
        if (e->fold.gemv_next[k] == (int32_t)li) return 1;
    }
    return 0;
}

static void cuda_describe_layer(const void *context_state, uint32_t li, kiln_layer_info *out) {
    const cuda_context *c = context_state;
    const cuda_engine *e = c->engine;
    const cuda_layer *L = &c->layers[li];
    const uint32_t op = e->plan->layers[li].op;
    if (e->fold.virt[li]) {
        out->flags |= KILN_LAYER_INFO_FOLDED;
        snprintf(out->kernel, sizeof out->kernel, "none");
        snprintf(out->detail, sizeof out->detail, "%s",
                 (e->fold.virt[li] & KILN_CUDA_FOLD_ALIAS)
                     ? "an alias: its readers read its input's memory (a dense reshape, a "
                       "contiguous slice or a layout permute)"
                 : (e->fold.virt[li] & KILN_CUDA_FOLD_GEMV)
                     ? (op == KILN_OP_RMS_NORM
                            ? "run inside the GEMVs that read it (the norm applied to their x)"
                        : gemv_sibling(e, li)
                            ? "run by a sibling's GEMV launch (the same x, its own blocks)"
                            : "run inside the gated GEMV that reads it (both weights streamed)")
                 : (e->fold.virt[li] & KILN_CUDA_FOLD_ROPE)
                     ? (op == KILN_OP_ROTARY
                            ? "run by the q rotary's launch, its rows written straight into the "
                              "key cache"
                        : op == KILN_OP_PERMUTE || op == KILN_OP_SLICE
                            ? "a view: the rope group reading it reads its input through strides"
                            : "run by the q rotary's launch (the cache rows written there)")
                 : (e->fold.virt[li] & KILN_CUDA_FOLD_WSUM)
                     ? "run by a softmax-weighted sum's launch: sum(x * softmax(s)) in one kernel"
                 : (e->fold.virt[li] & KILN_CUDA_FOLD_RATIO)
                     ? "run by the mean's launch: x / (mean(x) + eps) in one kernel"
                 : (e->fold.virt[li] & KILN_CUDA_FOLD_CLAMP)
                     ? "run by an overflow clamp's launch (at its abs): clamp(x, -c, c), c "
                       "chosen by whether any |x| is inf, in one kernel"
                 : e->fold.base_nhwc[e->plan->ids[e->plan->layers[li].input_begin]]
                     ? "a view of an NHWC map's channels-last bytes: the sdpa or matmul reading "
                       "it reads them through strides"
                     : "a view: the sdpa, matmul or rotary reading it reads its input "
                       "through strides");
        return;
    }
    if (e->layout.rs_xpose[li]) {
        snprintf(out->kernel, sizeof out->kernel, "copy_strided");
        snprintf(out->detail, sizeof out->detail,
                 "a reshape of an NHWC map: its NCHW bytes transposed into the output");
        return;
    }
    if (e->layout.ident[li]) {
        snprintf(out->kernel, sizeof out->kernel, "memcpy");
        snprintf(out->detail, sizeof out->detail,
                 op == KILN_OP_RESHAPE
                     ? "a reshape of a permute's channels-last bytes, the NHWC map's: copied"
                     : "a layout permute: its output is its input's bytes (one of them NHWC), "
                       "copied");
        return;
    }
    kiln_cuda_plan_describe(kiln_cuda_op_planned(op) ? (L->last_now ? &L->now : &L->tuned) : NULL,
                            op, out);
    describe_state_write(e->plan, li, out);
    if (e->layout.out_nchw[li] || e->layout.out_nhwc[li]) {
        detail_add(out, "%s",
                   e->layout.out_nchw[li]  ? "reads NHWC, writes its output NCHW"
                   : e->layout.in_nhwc[li] ? "reads and writes channels-last (NHWC maps' bytes)"
                                           : "reads NCHW, writes its output NHWC");
    } else if (e->layout.in_nhwc[li]) {
        detail_add(out, "reads its input channels-last (an NHWC map's bytes)");
    }
    if (e->fold.clamp_mn[li] >= 0) {
        detail_add(out,
                   "an overflow clamp: runs the 11 layers to %d in one kernel (c = %g when "
                   "some |x| is inf, else %g)",
                   e->fold.clamp_mn[li], (double)e->fold.clamp_ab[2 * li],
                   (double)e->fold.clamp_ab[2 * li + 1]);
    }
    if (op == KILN_OP_MATMUL && e->fold.sdpa_in[li] != 0) {
        detail_add(out, "reads %s through strided views (no copies)",
                   e->fold.sdpa_in[li] == 3   ? "a and b"
                   : e->fold.sdpa_in[li] == 1 ? "a"
                                              : "b");
    }
    if (op == KILN_OP_ROTARY && e->fold.sdpa_in[li] != 0) {
        detail_add(out, "reads x through a strided view (no copy)");
    }
    if (op == KILN_OP_MATMUL && e->fold.sdpa_out[li] >= 0) {
        detail_add(out,
                   "writes the output of layer %d through strides (its permute runs no "
                   "kernel)",
                   e->fold.sdpa_dst[li] >= 0 ? e->fold.producer[e->fold.sdpa_dst[li]] : -1);
    }
    if (e->fold.gemv_norm[li] >= 0 || e->fold.gemv_pair[li] >= 0 || e->fold.gemv_next[li] >= 0) {
        size_t n = strlen(out->detail);
        if (e->fold.gemv_norm[li] >= 0 && n < sizeof out->detail) {
            n += (size_t)snprintf(out->detail + n, sizeof out->detail - n,
                                  "; the RMSNorm of layer %d applied to x", e->fold.gemv_norm[li]);
        }
        if (e->fold.gemv_pair[li] >= 0 && n < sizeof out->detail) {
            n += (size_t)snprintf(out->detail + n, sizeof out->detail - n,
                                  "; gated with layer %d's weight: act(gate) * up written",
                                  e->fold.gemv_pair[li]);
        }
        for (int32_t k = e->fold.gemv_next[li]; k >= 0 && n < sizeof out->detail;
             k = e->fold.gemv_next[k]) {
            n += (size_t)snprintf(out->detail + n, sizeof out->detail - n,
                                  "; also runs sibling layer %d", k);
        }
    }
    if (e->fold.rope_k[li] >= 0) {
        size_t n = strlen(out->detail);
        if (n < sizeof out->detail) {
            snprintf(out->detail + n, sizeof out->detail - n,
                     "; also runs layers %d (k rotary), %d (key cache write)%s", e->fold.rope_k[li],
                     e->fold.rope_kc[li],
                     e->fold.rope_vc[li] >= 0 ? " and the value cache write" : "");
        }
    }
    if (e->fold.wsum_sm[li] >= 0) {
        detail_add(out, "also runs layers %d (softmax) and %d (x * it): a softmax-weighted sum",
                   e->fold.wsum_sm[li], e->fold.wsum_mul[li]);
    }
    if (e->fold.ratio_div[li] >= 0) {
        detail_add(out, "also runs layers %d (add eps) and %d (x / it): a mean ratio",
                   e->fold.ratio_add[li], e->fold.ratio_div[li]);
    }
    if (e->fold.pre_dst[li] >= 0) {
        detail_add(out, "its tail ops run as layer %d reads it (a conv prologue)",
                   e->fold.pre_dst[li]);
    }
    if (e->fold.pre_src[li] >= 0) {
        detail_add(out, "applies layer %d's tail ops to its input (a conv prologue)",
                   e->fold.pre_src[li]);
    }
    if (e->layout.head_nhwc[li]) out->flags |= KILN_LAYER_INFO_NHWC;
    out->l2_keep_nbytes = e->l2_keep[li];
    if (c->prof.runs > 0) {
        out->n_profiled = c->prof.runs;
        out->device_us = c->prof.us[li] / (double)c->prof.runs;
        out->host_us = c->prof.host_us[li] / (double)c->prof.runs;
    }
}

// The runtime's early call (before it resolves, checks and hands over the weights): the libraries
// this engine will use start initialising in the background (cuda_warm.c).
static void cuda_warm_up(const kiln_plan *p, const kiln_options *options) {
    int device;
    kiln_cuda_warm_needs needs = {0, 0, 0};
    if (!parse_device(options->device, &device)) return;
    uint32_t dnn_dtype = 0;
    for (uint32_t li = 0; li < p->n_layers; li++) {
        const kiln_plan_layer *L = &p->layers[li];
        if (L->op == KILN_OP_CONV2D || (L->op == KILN_OP_SDPA && options->cuda.cudnn_sdpa)) {
            needs.dnn = options->cuda.cudnn;
            if (dnn_dtype == 0 && L->n_outputs > 0) {
                dnn_dtype = p->tensors[p->ids[L->output_begin]].dtype;
            }
        }
        if ((L->op != KILN_OP_LINEAR && L->op != KILN_OP_MATMUL) || L->n_outputs == 0 ||
            !options->cuda.cublaslt) {
            continue;
        }
        const kiln_plan_tensor *y = &p->tensors[p->ids[L->output_begin]]; // (load.c checked ids)
        const int half = y->dtype == KILN_DTYPE_F16 || y->dtype == KILN_DTYPE_BF16;
        const kiln_plan_tensor *w = NULL, *x = NULL;
        int64_t m = 1, n = 0, k = 0;
        if (L->op == KILN_OP_LINEAR && L->n_inputs >= 2 && p->ids[L->input_begin] >= 0 &&
            p->ids[L->input_begin + 1] >= 0) {
            x = &p->tensors[p->ids[L->input_begin]];
            w = &p->tensors[p->ids[L->input_begin + 1]];
            n = w->shape.rank == 2 ? w->shape.max[0] : 0;
            k = w->shape.rank == 2 ? w->shape.max[1] : 0;
            for (uint32_t d = 0; d + 1 < y->shape.rank; d++) m *= y->shape.max[d];
        }
        // a linear of at most 8 rows at every shape runs on the GEMV, never on cuBLASLt
        // (op_gemv.cu: 16-bit operands of one dtype; K % 8 == 0 here, conservatively)
        if (w != NULL && options->cuda.gemv && half && m <= KILN_CUDA_GEMV_MAX_M &&
            x->dtype == y->dtype && w->dtype == y->dtype && k > 0 && k % 8 == 0) {
            continue;
        }
        if (needs.lt_dtype == 0) needs.lt_dtype = y->dtype;
        // a linear the K split may time (gemm_splitk.cu)
        if (w != NULL && options->cuda.splitk >= 0 && half && kiln_cuda_splitk_worth_mnk(m, n, k)) {
            needs.splitk = 1;
        }
    }
    // cuDNN's first convolution set-up initialises cuBLASLt when nothing has (ResNet-50 on the
    // H200: 94-120 ms at its first convolution, 17 ms with the type pair warmed beside the load)
    if (needs.dnn && needs.lt_dtype == 0 && options->cuda.cublaslt) needs.lt_dtype = dnn_dtype;
    kiln_cuda_warm_up_start(device, &needs);
}

// --- memory for I/O bound without staging (kiln_engine_alloc_memory, kiln_engine_copy_memory)

static kiln_status cuda_memory_alloc(void *engine_state, size_t nbytes, void **out) {
    const cuda_engine *e = engine_state;
    void *p = NULL;
    int prev = -1;
    cudaError_t err;
    KILN_CUDA_TRY(kiln_cuda_device_enter(e->device, &prev));
    err = cudaMalloc(&p, nbytes > 0 ? nbytes : 1); // a unique pointer for 0 bytes too
    kiln_cuda_device_leave(e->device, prev);
    if (err != cudaSuccess) {
        kiln_cuda_consume();
        if (err == cudaErrorMemoryAllocation) {
            return kiln_cuda_fail(KILN_ERR_NO_MEMORY,
                                  "out of device memory allocating %zu bytes of I/O memory on "
                                  "device %d",
                                  nbytes, e->device);
        }
        return kiln_cuda_call_failed("cudaMalloc (I/O memory)", err);
    }
    *out = p;
    return KILN_OK;
}

static void cuda_memory_free(void *engine_state, void *ptr, size_t nbytes) {
    const cuda_engine *e = engine_state;
    int prev = -1;
    (void)nbytes;
    if (ptr == NULL || kiln_cuda_device_enter(e->device, &prev) != KILN_OK) return;
    if (cudaFree(ptr) != cudaSuccess) kiln_cuda_consume();
    kiln_cuda_device_leave(e->device, prev);
}

// On the caller's stream (its earlier work first), else the thread's default stream of the
// device (which does not wait for other streams); synchronized unless the stream is capturing.
static kiln_status cuda_memory_copy(void *engine_state, void *dst, const void *src, size_t nbytes,
                                    void *stream_arg) {
    const cuda_engine *e = engine_state;
    cudaStream_t stream = stream_arg != NULL ? (cudaStream_t)stream_arg : cudaStreamPerThread;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    int prev = -1;
    cudaError_t err;
    KILN_CUDA_TRY(kiln_cuda_device_enter(e->device, &prev));
    err = cudaStreamIsCapturing(stream, &cap);
    if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream);
    if (err == cudaSuccess && cap == cudaStreamCaptureStatusNone) {
        err = cudaStreamSynchronize(stream);
    }
    kiln_cuda_device_leave(e->device, prev);
    if (err != cudaSuccess) {
        kiln_cuda_consume();
        return kiln_cuda_call_failed("cudaMemcpyAsync (kiln_engine_copy_memory)", err);
    }
    return KILN_OK;
}

const kiln_backend_ops kiln_cuda_backend_ops = {
    .name = "cuda",
    .warm_up = cuda_warm_up,
    .engine_init = cuda_engine_init,
    .engine_free = cuda_engine_free,
    .context_init = cuda_context_init,
    .reset_states = cuda_reset_states,
    .share_states = cuda_share_states,
    .context_free = cuda_context_free,
    .execute = cuda_execute,
    .describe_layer = cuda_describe_layer,
    .memory_alloc = cuda_memory_alloc,
    .memory_free = cuda_memory_free,
    .memory_copy = cuda_memory_copy,
    .memory_is_host = cuda_memory_is_host,
    .weights_checked = cuda_weights_checked,
};
