// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's private state, shared by its files (one job each):
//   cuda_plugin.c   the plugin's entry point (runtime/backend_plugin.h)
//   cuda_backend.c  engines, contexts and execute (the seam of runtime/backend.h)
//   cuda_memory.c   the device memory an engine needs beyond the arena: the weights block
//                   (weights and their KRSC copies), the states' initial values, each context's
//                   states block and extras block (I/O staging, the libraries' workspace, layout
//                   copies, relocated attention bases, placed by libkiln's memory planner)
//   cuda_layers.c   the layer loop: each group's kernel arguments and layout, its plan, its run
//   cuda_graph.c    CUDA graphs: record, update or re-instantiate, replay, the end-of-execute flag
//   cuda_profile.c  the option profile: per-layer events and times
//   cuda_tune.c     context creation's planning pass (with timing) and the choice on the whole
//                   engine
//   cuda_run_op.c   the test hooks (one layer on device tensors)
// Execute reads backend -> layers -> graph; nothing below calls back up (the graph recorder and
// the tuner take the layer loop as a callback).
#ifndef KILN_CUDA_CUDA_BACKEND_H
#define KILN_CUDA_CUDA_BACKEND_H

#include <stdatomic.h>

#include "cuda/cuda_fold.h"
#include "cuda/cuda_layout.h"
#include "cuda/cuda_plan.h"
#include "cuda/cuda_scratch.h"
#include "runtime/backend.h"

// The workspace of the libraries and the split kernels while a context is planned (Hopper: 32
// MiB); the context keeps what its warm-up run used.
#define KILN_CUDA_WORKSPACE_NBYTES ((size_t)32 << 20)
#define KILN_CUDA_WORKSPACE_MIN_NBYTES ((size_t)4 << 20) // what a context keeps at the least
#define KILN_CUDA_BLOCK_ALIGN 256                        // offsets inside the device blocks
#define KILN_CUDA_NO_OFFSET UINT64_MAX

// Where a context's buffers beyond the arena go inside its one extras block (cuda_memory.c):
// offsets for the engine, the same in every context.
typedef struct cuda_extras {
    uint64_t nbytes;       // the block (zeroed at context creation)
    uint64_t *staging_off; // n_io: a binding's staging buffer at its largest size
    uint64_t *copy_off;    // n_tensors: the tensor's copy in the other layout (cuda_layout.h)
    uint64_t *reloc_off;   // n_tensors: a folded attention base moved out of the arena
} cuda_extras;

// The smallest external weight shared between engines (cuda_memory.c).
#define KILN_CUDA_SHARE_MIN ((uint64_t)2 << 20)

typedef struct cuda_engine {
    const kiln_plan *plan;   // borrowed: outlives the state
    kiln_cuda_policy policy; // the options cuda.* resolved at load; immutable
    int device;
    int use_graphs;  // option use_cuda_graphs, off with profile and cuda.debug_sync
    int profile;     // option profile: per-layer events (graphs off)
    int share_arena; // use_shared_activation_scratch: contexts use the device's shared arena
    int sm_count;
    int wg_ok;     // Kiln's small-M wgmma linear can run (sm_90, cuda.wgmma)
    int wants_dnn; // a layer may run on cuDNN (a conv2d; an sdpa with cuda.cudnn_sdpa)
    void *weights; // device, owned: every weight not shared, then the KRSC copies
    size_t weights_nbytes;
    uint64_t *weight_offsets; // n_tensors (WEIGHT tensors in the block)
    void **weight_ptrs;       // n_tensors: every WEIGHT tensor's device data (block or shared)
    // Weights shared with the other engines of the process on this device (cuda_memory.c): the
    // entries this engine holds a reference to, and their bytes (those it found uploaded
    // already, and all of them).
    struct cuda_shared_weight **shared;
    uint32_t n_shared;
    uint64_t shared_found_nbytes, shared_nbytes;
    uint64_t *krsc_offsets;  // n_tensors (where layout.krsc)
    kiln_cuda_layout layout; // NHWC activations (cuda_layout.h)
    kiln_cuda_fold fold;     // views folded into sdpa (cuda_fold.h)
    int64_t *l2_keep;        // n_layers: the L2 plan (cuda_layout.h), -1: no hints
    uint64_t l2_kept;        // bytes of small-M weights loaded evict-last
    cuda_extras extras;
    // The states (plan.h: KILN_TENSOR_STATE): each context's states block holds them at fixed
    // offsets (aligned), those with an initial value first, then the zero-initialised ones, so
    // that setting them (context creation, reset_states) is one copy and one memset.
    uint32_t n_states;
    uint64_t *state_offsets;     // n_tensors: a STATE tensor's offset in the states block
    uint64_t states_nbytes;      // the states block
    uint64_t states_init_nbytes; // its first part, copied from state_init
    void *state_init; // device, owned: the initial values, laid out as the block's first part
    // The tuning cache (cuda_tune.c): the option tuning_cache, and what every record's key starts
    // with: Kiln's version, the GPU (name, compute capability, SMs), the driver, runtime,
    // cuBLASLt and cuDNN versions, and the policy.
    char tune_where[1024];
    unsigned char tune_prefix[512];
    size_t tune_prefix_nbytes;
} cuda_engine;

// A head layer's plans: the one made at context creation (largest shapes, timed) and the one
// made at an execute that met another problem (untimed).
typedef struct cuda_layer {
    kiln_cuda_layer_plan tuned, now;
    int last_now; // the last run used `now`
} cuda_layer;

// CUDA graphs of a context (cuda_graph.c).
typedef struct cuda_graph {
    cudaGraphExec_t exec;
    cudaGraph_t src; // the graph `exec` was instantiated (or last updated) from
    int valid;
    uint64_t instantiations, updates; // counters (DEBUG log)
    // The end-of-execute flag (pinned host memory the device writes): the recorded graph ends
    // with a memset of it to 0, and a replay whose outputs need no staging waits for that
    // write instead of cudaStreamSynchronize. NULL: always cudaStreamSynchronize.
    volatile uint32_t *done_flag;
    void *done_dev; // its device address
} cuda_graph;

// The option profile (cuda_profile.c): an event before and after each launched layer.
typedef struct cuda_profile {
    cudaEvent_t *ev; // 2 * n_layers
    uint32_t *layer; // n_layers: the plan layer of the k-th launched layer
    double *us;      // n_layers: accumulated GPU microseconds per plan layer
    double *host_us; // n_layers: accumulated host microseconds per plan layer
    uint32_t n;      // layers launched by the last layer loop
    uint64_t runs;   // executes counted
    uint32_t warm;   // executes seen before counting (module loading, first-use set-up)
} cuda_profile;

// A states block (the context's STATE tensors, cuda_memory.c): one per context, shared by
// contexts that share states (kiln_context_share_states), freed with the last of them.
typedef struct cuda_states {
    atomic_int refs;
    void *data; // device: the engine's states_nbytes
} cuda_states;

typedef struct cuda_context {
    const cuda_engine *engine;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    kiln_cuda_dnn *dnn; // cuDNN handle (NULL: convolutions and attention on Kiln's kernels)
    // sdpa on cuDNN: the execution plans of every sdpa layer, one per geometry, shared by the
    // layers of that geometry (each finalize compiles kernels) (NULL: none)
    kiln_cuda_sdpa_store *sdpa_store;
    void *arena;                // owned; borrowed from `scratch` when that is not NULL
    kiln_cuda_scratch *scratch; // the device's shared arena (use_shared_activation_scratch)
    uint64_t arena_gen;         // the shared arena's generation the views point into
    void *extras;               // owned: the extras block (cuda_extras)
    // owned: the workspace (KILN_CUDA_WORKSPACE_NBYTES while planning, then what the warm-up run
    // used; NULL: the engine uses no library), and the most bytes a run used of it
    void *workspace;
    size_t workspace_nbytes, workspace_used;
    cuda_states *states; // a reference: its own block (NULL: no states, or every one shared)
    cuda_states **held;  // n_tensors: a shared state's block (a reference; share_states), or NULL
    int states_shared;   // some STATE views point into another context's block (share_states)
    uint32_t n_io;       // n_inputs + n_outputs (bindings: inputs first)
    uint8_t *staged;     // n_io: this execute stages binding i
    kiln_tensor *views;  // n_tensors
    cuda_layer *layers;  // n_layers (head layers used)
    // graph signatures: n_io device pointers, then for each input rank and KILN_MAX_RANK dims
    size_t sig_n; // int64 entries
    int64_t *sig_now, *sig_last, *sig_graph, *sig_staged;
    int last_valid;
    cuda_graph graph; // the last signature recorded (device pointers bound directly)
    // The layers over the staging buffers at the inputs' largest shapes, recorded at context
    // creation: replayed, with the I/O copied in and out, by an execute whose device pointers are
    // new (the first execute, a caller who passes other buffers each time); re-recorded at such
    // an execute after being dropped. sig_staged: its signature.
    cuda_graph staged_graph;
    int no_staged; // its recording failed at context creation: not used
    cuda_profile prof;
    int failed;
    char fail_msg[512];
} cuda_context;

// --- cuda_backend.c

// The backend (runtime/backend.h); cuda_plugin.c hands it to libkiln.
extern const kiln_backend_ops kiln_cuda_backend_ops;
// Makes `device` current, remembering the caller's device (*prev; -1 when unknown).
kiln_status kiln_cuda_device_enter(int device, int *prev);
void kiln_cuda_device_leave(int device, int prev);

// --- cuda_memory.c

// Uploads every weight (and the KRSC copies the layout wants) into one device block, except the
// large external weights other engines of the process share (cuda_memory.c); verified: libkiln
// checks the external weights against their keys' digests (the option verify_weights), and the
// copies this engine adds to the shared ones are found by other engines only once it has
// (kiln_cuda_weights_checked).
kiln_status kiln_cuda_weights_upload(cuda_engine *e, const void *const *weight_data, int verified);
void kiln_cuda_weights_checked(cuda_engine *e);
void kiln_cuda_weights_free(cuda_engine *e);
// Places the states in the states block (e->state_offsets) and uploads their initial values
// (weight_data[i] of a STATE tensor; NULL: zeros) into e->state_init.
kiln_status kiln_cuda_states_upload(cuda_engine *e, const void *const *weight_data);
void kiln_cuda_states_free(cuda_engine *e); // the host table (the device copy: cuda_engine_free)
// A context's states block (refs 1, contents undefined) on the current device; NULL states when
// the engine has none.
kiln_status kiln_cuda_states_new(const cuda_engine *e, cuda_states **out);
// Drops a reference; the last frees the block (its device memory only when free_device: the
// caller made the block's device current).
void kiln_cuda_states_release(cuda_states *s, int free_device);
// Enqueues on `stream` the states' initial values into a context's own states block (laid out
// by e: one copy, one memset).
kiln_status kiln_cuda_states_set(const cuda_engine *e, void *states, cudaStream_t stream);
// The same, tensor by tensor, through the STATE views (a context sharing another's states).
kiln_status kiln_cuda_states_set_views(const cuda_engine *e, const kiln_tensor *views,
                                       cudaStream_t stream);
// Plans the extras block (e->extras) over the engine's layout, folds and bindings.
kiln_status kiln_cuda_extras_plan(cuda_engine *e);
void kiln_cuda_extras_free(const kiln_plan *p, cuda_extras *x);
// Bytes of a tensor at its largest shape (C padded where the layout pads it).
uint64_t kiln_cuda_tensor_max_nbytes(const cuda_engine *e, uint32_t tensor);

// --- cuda_layers.c

// The binding's tensor id (inputs first, then outputs).
uint32_t kiln_cuda_binding_tensor(const kiln_plan *p, uint32_t binding);
// Points the views of the arena's tensors into c->arena (not the relocated ones).
void kiln_cuda_bind_arena_views(cuda_context *c);
// One head layer bound for a launch: its launch context and kernel arguments, and the storage
// they point into.
typedef struct cuda_bound {
    kiln_cuda_ctx ctx;
    kiln_kernel_args args;
    kiln_tail_op tails[KILN_MAX_TAIL];
    kiln_tail_op pre[KILN_MAX_TAIL];                       // a conv prologue's ops (cuda_fold.h)
    kiln_tensor views[KILN_MAX_INPUTS + KILN_MAX_TAIL];    // reads of tensors' layout copies
    kiln_tensor nhwc[KILN_MAX_INPUTS + KILN_MAX_TAIL + 1]; // NHWC-ordered views (per-channel op)
    kiln_cuda_strided sdpa_io[4];                          // sdpa's folded views
    kiln_cuda_strided rope_views[3];                       // a rope group's folded inputs
    char where[96];                                        // "layer 12 (linear)"
} cuda_bound;

// A launch context over c's resources on `stream` (no layer bound yet).
void kiln_cuda_bound_init(const cuda_context *c, cudaStream_t stream, cuda_bound *b);
// Binds head layer li: its kernel arguments over c->views, its layout (the ctx's per-layer
// fields; reads of copies; with `run`, the first read of a copy makes it) and its sdpa views.
kiln_status kiln_cuda_layer_bind(const cuda_context *c, uint32_t li, cuda_bound *b, int run);
// The layer loop on `stream`: each head layer that runs a kernel, planned again (untimed) when
// its plan is not current for the shapes and pointers bound now.
kiln_status kiln_cuda_layers_run(cuda_context *c, cudaStream_t stream);
// The enqueue callback form of the layer loop on c->stream (for timing: cuda_tune.c).
int kiln_cuda_layers_enqueue(void *context);

// --- cuda_graph.c

kiln_status kiln_cuda_graph_init(cuda_graph *g, int want_flag);
void kiln_cuda_graph_free(cuda_graph *g);
void kiln_cuda_graph_drop(cuda_graph *g);
// Records enqueue(arg) on stream into the executable graph: updated in place when the rule
// allows it (cuda_graph_rules.h), else instantiated anew; the flag's memset last.
// log_info: the node counts at INFO (else DEBUG).
kiln_status kiln_cuda_graph_record(cuda_graph *g, cudaStream_t stream,
                                   kiln_status (*enqueue)(void *arg, cudaStream_t s), void *arg,
                                   uint32_t n_layers, int log_info);
// Launches the executable graph (arming the flag first).
kiln_status kiln_cuda_graph_launch(cuda_graph *g, cudaStream_t stream);
// Waits for a replay's last node (the flag), or for the stream.
cudaError_t kiln_cuda_graph_wait(const cuda_graph *g, cudaStream_t stream, int by_flag);

// --- cuda_profile.c

kiln_status kiln_cuda_profile_init(cuda_profile *pr, uint32_t n_layers);
void kiln_cuda_profile_free(cuda_profile *pr, uint32_t n_layers);
// Around each launched layer of a profiled loop.
kiln_status kiln_cuda_profile_begin(cuda_profile *pr, uint32_t li, cudaStream_t stream,
                                    unsigned delay_us);
kiln_status kiln_cuda_profile_end(cuda_profile *pr, uint32_t li, cudaStream_t stream,
                                  double host_us);
// After an execute's synchronize: the launched layers' times into the totals.
kiln_status kiln_cuda_profile_collect(cuda_profile *pr);
// The per-layer table at INFO (when the context is freed).
void kiln_cuda_profile_log(const cuda_context *c);

// --- cuda_warm.c

// What an engine will initialise in the libraries (cuda_backend.c reads it off the plan).
typedef struct kiln_cuda_warm_needs {
    uint32_t lt_dtype; // the linears' KILN_DTYPE_* on cuBLASLt (0: none)
    int splitk;        // a linear the K split may take (cuBLASLt's float32-output batched product)
    int dnn;           // a layer cuDNN may take (a cuDNN handle)
} kiln_cuda_warm_needs;
// Starts a thread for each piece not started before in this process (one per piece: they run
// in parallel beside the load).
void kiln_cuda_warm_up_start(int device, const kiln_cuda_warm_needs *needs);
// Waits for those threads (no-op when none runs).
void kiln_cuda_warm_up_wait(void);
// The cuDNN handle the warm-up made on `device`, once (NULL: none; the caller owns it).
kiln_cuda_dnn *kiln_cuda_warm_take_dnn(int device);

// --- cuda_tune.c

// Fills e->tune_where and e->tune_prefix (engine creation, on its device).
void kiln_cuda_tune_engine_init(cuda_engine *e, const struct cudaDeviceProp *prop,
                                const char *where);

// Context creation: plans every planned layer at the largest shapes with the I/O in staging
// (timing candidates with cuda.tune), then the choice of the wgmma kernel on the whole engine,
// then one warm-up run of the layers; 1 when that run completed (c->workspace_used is then the
// most workspace a layer used).
int kiln_cuda_tune_context(cuda_context *c);

#endif // KILN_CUDA_CUDA_BACKEND_H
