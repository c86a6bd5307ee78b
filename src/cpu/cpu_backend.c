// SPDX-License-Identifier: Apache-2.0
// The CPU backend: glue between the runtime's plan and the reference kernels (src/cpu/cpu.h).
//
// Engine state: every weight copied into one 64-byte aligned block (tensor i at
// weight_offsets[i]), and the scratch size: the maximum of kiln_cpu_scratch_nbytes over the
// head layers at their largest shapes. Context state: the activation arena (plan->arena_nbytes),
// one scratch buffer, the states (set from the engine's copy of their initial values) and a
// tensor view per plan tensor whose data pointers are fixed for weights, states and activations;
// execute only refreshes shapes and the caller's I/O pointers.
// With the option profile every group is timed by the monotonic clock.
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"
#include "cpu/cpu.h"
#include "runtime/backend.h"
#include "runtime/plan_group.h"

typedef struct cpu_engine {
    const kiln_plan *plan; // borrowed: outlives the state
    uint8_t *weights;      // owned, KILN_DATA_ALIGN-aligned
    size_t weights_nbytes;
    uint64_t *weight_offsets; // owned, plan->n_tensors entries (used for WEIGHT tensors)
    uint8_t *state_init;      // owned: every STATE's initial value (tensor i at state_offsets[i])
    size_t states_nbytes;
    uint64_t *state_offsets; // owned, plan->n_tensors entries (used for STATE tensors)
    size_t scratch_nbytes;
    int profile; // the option profile: each group is timed (wall clock)
} cpu_engine;

// A context's states: one block, whose states other contexts may use (kiln_context_share_states),
// freed with the last reference.
typedef struct cpu_states {
    atomic_int refs;
    uint8_t *data;
    size_t nbytes;
} cpu_states;

static void states_release(cpu_states *s) {
    if (s == NULL || atomic_fetch_sub(&s->refs, 1) != 1) return;
    kiln_free(s->data, s->nbytes);
    kiln_free(s, sizeof *s);
}

typedef struct cpu_context {
    const cpu_engine *engine; // borrowed
    uint8_t *arena;           // owned, plan->arena_nbytes bytes
    void *scratch;            // owned, engine->scratch_nbytes bytes
    cpu_states *states;       // a reference: its own block (NULL once every state is shared)
    cpu_states **held;        // owned, n_tensors: a shared state's block (a reference), or NULL
    kiln_tensor *views;       // owned, plan->n_tensors entries
    double *prof_us;          // owned, plan->n_layers entries with profile: summed time per head
    uint64_t prof_runs;       // executes timed
} cpu_context;

static void cpu_engine_free(void *state) {
    cpu_engine *e = state;
    if (e == NULL) return;
    kiln_free(e->weights, e->weights_nbytes);
    kiln_free(e->weight_offsets, (size_t)e->plan->n_tensors * sizeof *e->weight_offsets);
    kiln_free(e->state_init, e->states_nbytes);
    kiln_free(e->state_offsets, (size_t)e->plan->n_tensors * sizeof *e->state_offsets);
    kiln_free(e, sizeof *e);
}

// Scratch at the largest shapes, and a support check of every head layer.
static kiln_status size_scratch(const kiln_plan *p, size_t *out) {
    size_t views_nbytes = (size_t)p->n_tensors * sizeof(kiln_tensor);
    kiln_tensor *views = kiln_calloc(views_nbytes, KILN_ALIGN);
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_kernel_args args;
    size_t max = 0;
    kiln_status st = KILN_OK;
    KILN_CHECK(views != NULL, KILN_ERR_NO_MEMORY, "out of memory sizing the CPU scratch");
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        views[i].dtype = p->tensors[i].dtype;
        views[i].rank = p->tensors[i].shape.rank;
        memcpy(views[i].dims, p->tensors[i].shape.max, sizeof views[i].dims);
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        size_t n;
        kiln_plan_group_args(p, li, views, tails, &args);
        if (!kiln_cpu_supports(&args)) {
            char ins[160] = "";
            size_t at = 0;
            for (uint32_t i = 0; i < args.n_in && at < sizeof ins - 1; i++) {
                const kiln_tensor *t = args.in[i];
                int w =
                    snprintf(ins + at, sizeof ins - at, "%s%s rank %u", i ? ", " : "",
                             t ? kiln_dtype_name((kiln_dtype)t->dtype) : "none", t ? t->rank : 0u);
                if (w < 0) break;
                at += (size_t)w < sizeof ins - at ? (size_t)w : sizeof ins - at - 1;
            }
            st = kiln_fail(KILN_ERR_UNSUPPORTED,
                           "layer %u (%s of %s, %u tail ops): the CPU backend does not implement "
                           "this op for output dtype %s rank %u",
                           li, kiln_op_name(args.op), ins, args.n_tail,
                           kiln_dtype_name((kiln_dtype)args.out->dtype), args.out->rank);
            break;
        }
        n = kiln_cpu_scratch_nbytes(&args);
        if (n > max) max = n;
    }
    kiln_free(views, views_nbytes);
    if (st == KILN_OK) *out = max;
    return st;
}

// The engine's copy of every state's initial value, which each context starts from.
static kiln_status init_states(cpu_engine *e, const void *const *weight_data) {
    const kiln_plan *p = e->plan;
    uint64_t total = 0;
    e->state_offsets = kiln_calloc((size_t)p->n_tensors * sizeof *e->state_offsets, KILN_ALIGN);
    KILN_CHECK(e->state_offsets != NULL, KILN_ERR_NO_MEMORY,
               "out of memory allocating the CPU state table");
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].kind != KILN_TENSOR_STATE) continue;
        e->state_offsets[i] = total;
        KILN_CHECK(kiln_add_u64(total, p->tensors[i].nbytes, &total) &&
                       kiln_align_up_u64(total, KILN_DATA_ALIGN, &total) && total <= SIZE_MAX,
                   KILN_ERR_NO_MEMORY, "the states do not fit in memory (tensor %u)", i);
    }
    e->states_nbytes = (size_t)total;
    e->state_init = kiln_calloc(e->states_nbytes, KILN_DATA_ALIGN);
    KILN_CHECK(e->state_init != NULL, KILN_ERR_NO_MEMORY,
               "out of memory allocating %zu bytes of initial states", e->states_nbytes);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_STATE || weight_data[i] == NULL || t->nbytes == 0) continue;
        memcpy(e->state_init + e->state_offsets[i], weight_data[i], (size_t)t->nbytes);
    }
    return KILN_OK;
}

static kiln_status cpu_engine_init(const kiln_plan *p, const void *const *weight_data,
                                   const kiln_options *options, void **out_state) {
    cpu_engine *e;
    uint64_t total = 0;
    kiln_status st;
    // num_threads is accepted: the reference kernels run on the calling thread
    e = kiln_calloc(sizeof *e, KILN_ALIGN);
    KILN_CHECK(e != NULL, KILN_ERR_NO_MEMORY, "out of memory allocating the CPU engine state");
    e->plan = p;
    e->profile = options->profile;
    e->weight_offsets = kiln_calloc((size_t)p->n_tensors * sizeof *e->weight_offsets, KILN_ALIGN);
    if (e->weight_offsets == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory allocating the CPU weight table");
        goto fail;
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].kind != KILN_TENSOR_WEIGHT) continue;
        e->weight_offsets[i] = total;
        if (!kiln_add_u64(total, p->tensors[i].nbytes, &total) ||
            !kiln_align_up_u64(total, KILN_DATA_ALIGN, &total) || total > SIZE_MAX) {
            st = kiln_fail(KILN_ERR_NO_MEMORY, "the weights do not fit in memory (tensor %u)", i);
            goto fail;
        }
    }
    e->weights_nbytes = (size_t)total;
    e->weights = kiln_malloc(e->weights_nbytes, KILN_DATA_ALIGN);
    if (e->weights == NULL) {
        st = kiln_fail(KILN_ERR_NO_MEMORY, "out of memory allocating %zu bytes of weights",
                       e->weights_nbytes);
        goto fail;
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_WEIGHT || t->nbytes == 0) continue;
        memcpy(e->weights + e->weight_offsets[i], weight_data[i], (size_t)t->nbytes);
    }
    st = init_states(e, weight_data);
    if (st != KILN_OK) goto fail;
    st = size_scratch(p, &e->scratch_nbytes);
    if (st != KILN_OK) goto fail;
    *out_state = e;
    return KILN_OK;

fail:
    cpu_engine_free(e);
    return st;
}

static void cpu_context_free(void *state) {
    cpu_context *c = state;
    if (c == NULL) return;
    kiln_free(c->arena, (size_t)c->engine->plan->arena_nbytes);
    kiln_free(c->scratch, c->engine->scratch_nbytes);
    states_release(c->states);
    for (uint32_t i = 0; c->held != NULL && i < c->engine->plan->n_tensors; i++) {
        states_release(c->held[i]);
    }
    kiln_free(c->held, (size_t)c->engine->plan->n_tensors * sizeof *c->held + 1);
    kiln_free(c->views, (size_t)c->engine->plan->n_tensors * sizeof *c->views);
    kiln_free(c->prof_us, (size_t)c->engine->plan->n_layers * sizeof *c->prof_us);
    kiln_free(c, sizeof *c);
}

static kiln_status cpu_context_init(void *engine_state, void **out_state) {
    const cpu_engine *e = engine_state;
    const kiln_plan *p = e->plan;
    cpu_context *c;
    KILN_CHECK(p->arena_nbytes <= SIZE_MAX, KILN_ERR_NO_MEMORY,
               "the activation arena (%llu bytes) does not fit in memory",
               (unsigned long long)p->arena_nbytes);
    c = kiln_calloc(sizeof *c, KILN_ALIGN);
    KILN_CHECK(c != NULL, KILN_ERR_NO_MEMORY, "out of memory allocating the CPU context state");
    c->engine = e;
    // Zeroed so that a run never depends on what was in memory before.
    c->arena = kiln_calloc((size_t)p->arena_nbytes, KILN_DATA_ALIGN);
    c->scratch = kiln_malloc(e->scratch_nbytes, KILN_DATA_ALIGN);
    c->states = kiln_calloc(sizeof *c->states, KILN_ALIGN);
    if (c->states != NULL) {
        atomic_init(&c->states->refs, 1);
        c->states->nbytes = e->states_nbytes;
        c->states->data = kiln_malloc(e->states_nbytes, KILN_DATA_ALIGN);
        if (c->states->data == NULL) {
            kiln_free(c->states, sizeof *c->states);
            c->states = NULL;
        }
    }
    c->views = kiln_calloc((size_t)p->n_tensors * sizeof *c->views, KILN_ALIGN);
    c->held = kiln_calloc((size_t)p->n_tensors * sizeof *c->held + 1, KILN_ALIGN);
    if (e->profile) c->prof_us = kiln_calloc((size_t)p->n_layers * sizeof *c->prof_us, KILN_ALIGN);
    if (c->arena == NULL || c->scratch == NULL || c->views == NULL || c->held == NULL ||
        c->states == NULL || (e->profile && p->n_layers > 0 && c->prof_us == NULL)) {
        cpu_context_free(c);
        return kiln_fail(KILN_ERR_NO_MEMORY,
                         "out of memory allocating the activation arena (%llu bytes) and scratch "
                         "(%zu bytes)",
                         (unsigned long long)p->arena_nbytes, e->scratch_nbytes);
    }
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        c->views[i].dtype = t->dtype;
        c->views[i].rank = t->shape.rank;
        memcpy(c->views[i].dims, t->shape.max, sizeof c->views[i].dims);
        if (t->kind == KILN_TENSOR_WEIGHT) c->views[i].data = e->weights + e->weight_offsets[i];
        if (t->kind == KILN_TENSOR_ACTIVATION) c->views[i].data = c->arena + t->offset;
        if (t->kind == KILN_TENSOR_STATE) c->views[i].data = c->states->data + e->state_offsets[i];
    }
    if (e->states_nbytes > 0) memcpy(c->states->data, e->state_init, e->states_nbytes);
    *out_state = c;
    return KILN_OK;
}

// Per tensor: a context sharing another's states resets the tensors it maps.
static kiln_status cpu_reset_states(void *context_state) {
    cpu_context *c = context_state;
    const kiln_plan *p = c->engine->plan;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_plan_tensor *t = &p->tensors[i];
        if (t->kind != KILN_TENSOR_STATE || t->nbytes == 0) continue;
        memcpy(c->views[i].data, c->engine->state_init + c->engine->state_offsets[i],
               (size_t)t->nbytes);
    }
    return KILN_OK;
}

// Each state the owner has (owner_tensor[i] < UINT32_MAX) points where the owner's does, and the
// context holds a reference on that block (the owner's own, or the one the owner shares); its
// own block goes once no state uses it.
static kiln_status cpu_share_states(void *context_state, void *owner_state,
                                    const uint32_t *owner_tensor) {
    cpu_context *c = context_state, *o = owner_state;
    const kiln_plan *p = c->engine->plan;
    int own_used = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].kind != KILN_TENSOR_STATE) continue;
        const uint32_t j = owner_tensor[i];
        if (j != UINT32_MAX) {
            cpu_states *b = o->held[j] != NULL ? o->held[j] : o->states;
            atomic_fetch_add(&b->refs, 1);
            states_release(c->held[i]);
            c->held[i] = b;
            c->views[i].data = o->views[j].data;
        }
        own_used |= c->held[i] == NULL;
    }
    if (!own_used) {
        states_release(c->states);
        c->states = NULL;
    }
    return KILN_OK;
}

static kiln_status cpu_execute(void *context_state, const kiln_exec *exec) {
    cpu_context *c = context_state;
    const cpu_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_kernel_args args;
    KILN_ASSERT(exec->plan == p);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const kiln_tensor *src = &exec->tensors[i];
        uint32_t kind = p->tensors[i].kind;
        c->views[i].rank = src->rank;
        memcpy(c->views[i].dims, src->dims, sizeof c->views[i].dims);
        if (kind == KILN_TENSOR_INPUT || kind == KILN_TENSOR_OUTPUT) c->views[i].data = src->data;
    }
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        kiln_plan_group_args(p, li, c->views, tails, &args);
        args.scratch = c->scratch;
        args.scratch_nbytes = e->scratch_nbytes;
        KILN_CHECK(kiln_cpu_scratch_nbytes(&args) <= e->scratch_nbytes, KILN_ERR_INTERNAL,
                   "layer %u (%s) needs more scratch than planned at its largest shape (%zu)", li,
                   kiln_op_name(args.op), e->scratch_nbytes);
        if (c->prof_us == NULL) {
            KILN_TRY(kiln_cpu_run(&args));
            continue;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        KILN_TRY(kiln_cpu_run(&args));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        c->prof_us[li] +=
            (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    if (c->prof_us != NULL) c->prof_runs++;
    return KILN_OK;
}

static void cpu_describe_layer(const void *context_state, uint32_t li, kiln_layer_info *out) {
    const cpu_context *c = context_state;
    snprintf(out->kernel, sizeof out->kernel, "cpu");
    snprintf(out->detail, sizeof out->detail, "reference kernel (float32 arithmetic)");
    if (c->prof_us != NULL && c->prof_runs > 0) {
        out->n_profiled = c->prof_runs;
        out->device_us = out->host_us = c->prof_us[li] / (double)c->prof_runs;
    }
}

// Memory for I/O bound without a copy (kiln_engine_alloc_memory): host memory, aligned like the
// arena.
static kiln_status cpu_memory_alloc(void *engine_state, size_t nbytes, void **out) {
    void *p = kiln_malloc(nbytes, KILN_DATA_ALIGN);
    (void)engine_state;
    KILN_CHECK(p != NULL, KILN_ERR_NO_MEMORY, "out of memory allocating %zu bytes of I/O memory",
               nbytes);
    *out = p;
    return KILN_OK;
}

static void cpu_memory_free(void *engine_state, void *ptr, size_t nbytes) {
    (void)engine_state;
    kiln_free(ptr, nbytes);
}

static kiln_status cpu_memory_copy(void *engine_state, void *dst, const void *src, size_t nbytes,
                                   void *stream) {
    (void)engine_state;
    (void)stream;
    memmove(dst, src, nbytes);
    return KILN_OK;
}

// The weights' verdict (backend.h): a CPU engine shares no weights with other engines, so the
// runtime may hash them while engine_init copies them, and nothing waits for the verdict here.
static void cpu_weights_checked(void *state) { (void)state; }

const kiln_backend_ops kiln_backend_cpu = {
    .name = "cpu",
    .engine_init = cpu_engine_init,
    .engine_free = cpu_engine_free,
    .context_init = cpu_context_init,
    .context_free = cpu_context_free,
    .reset_states = cpu_reset_states,
    .share_states = cpu_share_states,
    .execute = cpu_execute,
    .describe_layer = cpu_describe_layer,
    .memory_alloc = cpu_memory_alloc,
    .memory_free = cpu_memory_free,
    .memory_copy = cpu_memory_copy,
    .weights_checked = cpu_weights_checked,
};
