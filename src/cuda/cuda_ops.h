// SPDX-License-Identifier: Apache-2.0
// Inside the CUDA plugin: the per-launch context every kernel launcher receives, the C-callable
// launchers (one per op family, defined in op_<family>.cu), and the plugin's error and log
// helpers (forwarded to libkiln through kiln_cuda_services, see runtime/backend_plugin.h).
//
// Launchers: kiln_status kiln_cuda_<op>(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args)
// with every tensor of args in device memory of the current device. They enqueue work on
// ctx->stream only (no allocation, no synchronization), apply args->tail after the head, check
// cudaGetLastError after each launch and return KILN_ERR_DEVICE naming the kernel, the CUDA
// error and ctx->where on failure. Zero-element tensors launch nothing.
#ifndef KILN_CUDA_CUDA_OPS_H
#define KILN_CUDA_CUDA_OPS_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "cuda/cuda_fold.h"
#include "cuda/cuda_wg.h"
#include "kiln/kiln.h"
#include "runtime/backend_plugin.h"
#include "runtime/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_CUDA_PRINTF_(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define KILN_CUDA_PRINTF_(fmt_idx, args_idx)
#endif

// Propagates a failure (KILN_TRY without libkiln's header).
#define KILN_CUDA_TRY(expr)                                                                        \
    do {                                                                                           \
        kiln_status kc_try_st_ = (expr);                                                           \
        if (kc_try_st_ != KILN_OK) return kc_try_st_;                                              \
    } while (0)

// The cached cuBLASLt set-up of one GEMM layer: rebuilt only when its key (sizes, dtypes,
// epilogue, pointer alignments) changes, so that a steady-state execute does no heuristic query.
#define KILN_CUDA_GEMM_KEY 24
typedef struct kiln_cuda_gemm_cache {
    int valid;  // key and the fields below describe the last set-up
    int use_lt; // 1: cuBLASLt with algo; 0: Kiln's own GEMM kernel
    int64_t key[KILN_CUDA_GEMM_KEY];
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    // the algorithm timed at context creation, for the key without its pointers (a re-set-up for
    // other I/O pointers keeps it)
    int tuned;
    int64_t tuned_key[KILN_CUDA_GEMM_KEY];
    cublasLtMatmulAlgo_t tuned_algo;
    // Kiln's small-M linear (cuda_wg.h), timed against cuBLASLt at context creation: wg = 1
    // runs it with wg_cfg, -1 keeps cuBLASLt, 0 not decided (cuBLASLt) for wg_key's shape
    int wg;
    kiln_cuda_wg_cfg wg_cfg;
    int64_t wg_key[5];
    kiln_cuda_wg_maps_t wg_maps;
    // the fastest wgmma configuration timed for it, and its time over cuBLASLt's (0: none), for
    // the choice on the whole engine (cuda_backend.c, wg_engine_choice)
    kiln_cuda_wg_cfg wg_alt;
    float wg_alt_ratio;
    // K split (op_gemm.cu), timed against the plain GEMM at context creation for sk_key's shape:
    // sk = S (2, 4, 8) runs the linear as one strided-batched cuBLASLt GEMM over S slices of K
    // into float32 partial sums (in the workspace's tail) and one kernel that adds them with
    // the bias and the epilogue; 1 the plain GEMM; 0 not decided (plain). split: that GEMM's
    // cuBLASLt set-up (allocated when first timed, freed with the cache).
    int sk;
    int64_t sk_key[5];
    struct kiln_cuda_gemm_cache *split;
} kiln_cuda_gemm_cache;

// Frees what a layer's GEMM cache owns (not the cache itself).
void kiln_cuda_gemm_cache_release(kiln_cuda_gemm_cache *c);

// cuDNN (cuda_dnn.c, loaded at run time): a handle per context; NULL when cuDNN is absent.
typedef struct kiln_cuda_dnn kiln_cuda_dnn;

// The cached cuDNN set-up of one conv2d layer (descriptors created once, at context creation;
// re-set and the algorithm re-chosen only when the key changes).
#define KILN_CUDA_CONV_KEY 16
typedef struct kiln_cuda_conv_cache {
    int state; // 0: not set up; 1: cuDNN with algo; 2: never cuDNN; 3: not at these shapes
    int fused; // -1: cuDNN declined the fused bias/residual/relu call (unfused from then on)
    int fused_identity; // the same for the fused call without relu (identity activation)
    int algo;           // cudnnConvolutionFwdAlgo_t
    size_t ws_nbytes;
    int64_t key[KILN_CUDA_CONV_KEY];
    void *descs; // cuDNN descriptors (cuda_dnn.c)
} kiln_cuda_conv_cache;

// The cuDNN set-up of one sdpa layer (cuda_dnn.c: the backend graph API's fused SDPA operation,
// cuDNN >= 9.13): a plan per geometry (key: sizes, strides, dtype, scale), kept for the life of
// the context. At context creation the fastest engine configuration is timed against Kiln's
// own kernel (op_attention.cu) and the faster one runs the layer.
#define KILN_CUDA_ATTN_KEY 25
typedef struct kiln_cuda_attn_cache {
    int state;    // 0: not set up; 1: cuDNN; 2: never cuDNN; 4: Kiln's kernel timed faster
    float dnn_us; // cuDNN's time at context creation (negative: not timed)
    void *descs;  // cuDNN backend descriptors (cuda_dnn.c)
} kiln_cuda_attn_cache;

// One sdpa as cuDNN sees it: q [b, hq, sq, d], k [b, hk, skv, d], v [b, hk, skv, dv],
// out [b, hq, sq, dv], each with element strides over those four dims (innermost 1).
typedef struct kiln_cuda_attn_geom {
    uint32_t dtype;
    int64_t b, hq, hk, sq, skv, d, dv;
    int64_t str[4][4]; // q, k, v, out
    float scale;
    const void *q, *k, *v;
    void *out;
} kiln_cuda_attn_geom;

// One conv2d's geometry (NCHW input, OIHW weight).
typedef struct kiln_cuda_conv_params {
    int64_t n, c, h, w, o, oh, ow, groups;
    int kh, kw, sh, sw, ph, pw, dh, dw;
} kiln_cuda_conv_params;

// kiln_cuda_ctx.small_m: KILN_CUDA_NO_GEMV=1 (small-M linears then run on cuBLASLt) and
// KILN_CUDA_NO_PDL=1 (the GEMV launched plainly), read when an engine is created.
#define KILN_CUDA_SMALL_M_NO_GEMV 0x1
#define KILN_CUDA_SMALL_M_NO_PDL 0x2
// Kiln's small-M wgmma linear can run (sm_90 device, KILN_CUDA_NO_WG unset: cuda_wg.h).
#define KILN_CUDA_SMALL_M_WG 0x4

typedef struct kiln_cuda_ctx {
    cudaStream_t stream;
    cublasLtHandle_t lt; // NULL: every GEMM through Kiln's kernel
    void *workspace;     // cuBLASLt workspace (device)
    size_t workspace_nbytes;
    kiln_cuda_gemm_cache *gemm; // this layer's cache (NULL: none, set up on every call)
    kiln_cuda_dnn *dnn;         // NULL: convolutions on Kiln's kernels
    kiln_cuda_conv_cache *conv; // this layer's cuDNN cache (NULL: none, set up on every call)
    kiln_cuda_attn_cache *attn; // this sdpa layer's cuDNN cache (NULL: Kiln's kernels)
    int no_dnn_attention;       // sdpa: never cuDNN (KILN_CUDA_NO_CUDNN_SDPA, tests)
    int sm_count;               // multiprocessors of the device
    int plan_only;              // GEMM launchers only choose (and cache) their algorithm
    int no_tc_attention;        // sdpa: never the tensor-core kernel (tests, debugging)
    int attn_rows;              // sdpa tensor-core kernel: query rows per CTA (16, 32, 64; 0:
                                // by occupancy: fewer rows while the grid is under one wave)
    int small_m; // KILN_CUDA_SMALL_M_* bits: small-M linear kernels switched off (env)
    kiln_cuda_wg_cfg wg_force; // run_op (tests): bn > 0 runs Kiln's small-M linear with it
    int splitk; // K split of linears (op_gemm.cu): 0 timed at context creation where it may pay,
                // -1 never (KILN_CUDA_SPLITK=0), 2/4/8 every linear it can take (tests, A/B)
    int64_t gemv_keep; // this layer's GEMV weight: bytes kept in L2 (evict-last; the rest
                       // evict-first), -1: no cache hints (cuda_layout.h)
    int attn_split;    // sdpa split-key kernel: warps per 16-row block (2, 4, 8 for D 64; 2 for
                       // D 128), whatever the grid (0: by residency; attn_rows wins)
    // sdpa with folded views (cuda_fold.h): q, k, v, out read/written through these strided
    // views (NULL: the dense tensor of args); dims are the args' logical ones
    const kiln_cuda_strided *sdpa_io[4];
    // NHWC layout (cuda_layout.h): conv2d's input, output and residual, max/avg pool's input and
    // output, adaptive_avg_pool2d's input (its output stays NCHW) are stored NHWC (their dims
    // stay logical NCHW). Elementwise heads and tails are layout-blind (same-shape operands).
    int nhwc;
    const void *w_krsc; // conv2d with nhwc: the weight in KRSC (O, kh, kw, C) order, for cuDNN
    int64_t x_cpad;     // conv2d with nhwc: x's NHWC channel stride when its copy is padded
                        // (cuda_layout.h; w_krsc padded alike), 0 when dense
    int stem;           // conv2d with nhwc: Kiln's stem kernel (x read NCHW, the OIHW weight)
    const char *where;  // "layer 12 (linear)", for messages
} kiln_cuda_ctx;

// --- errors and logging (cuda_util.c)

// Installs the services (the plugin entry point does, once).
void kiln_cuda_services_set(const kiln_cuda_services *services);
kiln_status kiln_cuda_fail(kiln_status status, const char *fmt, ...) KILN_CUDA_PRINTF_(2, 3);
// The message of this thread's last kiln_cuda_fail ("" if none).
const char *kiln_cuda_last_message(void);
void kiln_cuda_log(kiln_log_level level, const char *fmt, ...) KILN_CUDA_PRINTF_(2, 3);
// 1 when a message at `level` would be logged.
int kiln_cuda_log_enabled(kiln_log_level level);
void *kiln_cuda_malloc(size_t nbytes);
void *kiln_cuda_calloc(size_t nbytes);
void kiln_cuda_free(void *ptr, size_t nbytes);
const char *kiln_cuda_op_name(uint32_t op);
const char *kiln_cuda_dtype_name(uint32_t dtype);
// A failed CUDA call: "CUDA error in <what> at <where>: <name> (<string>)" -> KILN_ERR_DEVICE.
kiln_status kiln_cuda_error(const kiln_cuda_ctx *ctx, const char *what, cudaError_t err);
// The last launch's error, if any (cudaGetLastError), reported as above.
kiln_status kiln_cuda_check_launch(const kiln_cuda_ctx *ctx, const char *kernel);

// Element size of a dtype (0 if invalid).
size_t kiln_cuda_dtype_size(uint32_t dtype);
static inline int kiln_cuda_is_float(uint32_t dtype) {
    return dtype == KILN_DTYPE_F32 || dtype == KILN_DTYPE_F16 || dtype == KILN_DTYPE_BF16;
}

// --- launchers (op_<family>.cu)

#define KILN_CUDA_LAUNCHER(name)                                                                   \
    kiln_status kiln_cuda_##name(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args)

KILN_CUDA_LAUNCHER(linear);              // op_gemm.cu
KILN_CUDA_LAUNCHER(matmul);              // op_gemm.cu
KILN_CUDA_LAUNCHER(conv2d);              // op_conv.cu
KILN_CUDA_LAUNCHER(conv_transpose2d);    // op_conv.cu
KILN_CUDA_LAUNCHER(unary);               // op_eltwise.cu: activations, math, copy, cast, clamp
KILN_CUDA_LAUNCHER(binary);              // op_eltwise.cu: add, sub, mul, div, pow, where
KILN_CUDA_LAUNCHER(batch_norm);          // op_norm.cu
KILN_CUDA_LAUNCHER(layer_norm);          // op_norm.cu
KILN_CUDA_LAUNCHER(softmax);             // op_norm.cu: softmax, log_softmax
KILN_CUDA_LAUNCHER(max_pool2d);          // op_pool.cu
KILN_CUDA_LAUNCHER(avg_pool2d);          // op_pool.cu
KILN_CUDA_LAUNCHER(adaptive_avg_pool2d); // op_pool.cu
KILN_CUDA_LAUNCHER(reduce);              // op_reduce.cu: mean, sum
KILN_CUDA_LAUNCHER(reshape);             // op_shape.cu: reshape, squeeze, unsqueeze
KILN_CUDA_LAUNCHER(permute);             // op_shape.cu
KILN_CUDA_LAUNCHER(expand);              // op_shape.cu
KILN_CUDA_LAUNCHER(cat);                 // op_shape.cu
KILN_CUDA_LAUNCHER(slice);               // op_shape.cu
KILN_CUDA_LAUNCHER(select);              // op_shape.cu
KILN_CUDA_LAUNCHER(embedding);           // op_embed.cu
KILN_CUDA_LAUNCHER(sdpa);                // op_attention.cu
KILN_CUDA_LAUNCHER(logic);               // op_logic.cu: eq .. ge, bitwise_and/or/xor/not
KILN_CUDA_LAUNCHER(index);               // op_index.cu
KILN_CUDA_LAUNCHER(gather);              // op_index.cu
KILN_CUDA_LAUNCHER(upsample);            // op_resize.cu: upsample_nearest2d, _bilinear2d
KILN_CUDA_LAUNCHER(group_norm);          // op_norm.cu
KILN_CUDA_LAUNCHER(cumsum);              // op_reduce.cu
KILN_CUDA_LAUNCHER(pad);                 // op_shape.cu
KILN_CUDA_LAUNCHER(arange);              // op_shape.cu

// KILN_CUDA_PROFILE: a one-thread kernel that waits `us` microseconds (op_eltwise.cu).
kiln_status kiln_cuda_delay(cudaStream_t stream, unsigned us);

// Microseconds per run of a candidate, timed as the engine runs it: KILN_CUDA_TIME_REPS runs
// (`enqueue` queues one on `stream` and returns nonzero on success) captured into a CUDA graph,
// launched once to warm up, then twice between events (cuda_util.c). Negative when it cannot
// run (nothing is left pending). Context creation only: it synchronizes the stream.
#define KILN_CUDA_TIME_REPS 10
float kiln_cuda_time_in_graph(cudaStream_t stream, int (*enqueue)(void *arg), void *arg);

// Copies a strided view: dst[sum idx*dst_strides] = src[sum idx*src_strides] over dims (element
// strides, esize-byte elements; src strides may be 0 to broadcast) (op_shape.cu).
kiln_status kiln_cuda_copy_strided(const kiln_cuda_ctx *ctx, void *dst, const void *src,
                                   size_t esize, int rank, const int64_t *dims,
                                   const int64_t *dst_strides, const int64_t *src_strides);

// Nonzero when the elementwise engine runs op over these operands (op_eltwise.cu).
int kiln_cuda_eltwise_supports(uint32_t op, const kiln_tensor *const *ins, int n,
                               const kiln_tensor *out);
int kiln_cuda_tail_supports(const kiln_kernel_args *args);

// Applies args->tail[skip..] in place on args->out (op_eltwise.cu); heads call it last.
kiln_status kiln_cuda_tail(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, uint32_t skip);

// Raises the shared-memory limits of the attention kernels on the current device (before any
// launch or capture on it) (op_attention.cu).
kiln_status kiln_cuda_attention_init(void);

// Chooses and caches the set-up of a linear/matmul layer (cuBLASLt) or conv2d layer (cuDNN) at
// the shapes and pointer alignments in args without running it (context creation: algorithms
// chosen at load).
kiln_status kiln_cuda_gemm_prepare(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args);

// cuDNN (cuda_dnn.c). kiln_cuda_dnn_create: a handle, or NULL when cuDNN cannot be loaded or
// KILN_CUDA_NO_CUDNN is set (logged once at INFO; not an error).
kiln_cuda_dnn *kiln_cuda_dnn_create(void);
void kiln_cuda_dnn_destroy(kiln_cuda_dnn *dnn);
size_t kiln_cuda_dnn_version(void); // 0 when not loadable
void kiln_cuda_conv_cache_free(kiln_cuda_conv_cache *cache);
// Runs conv2d (and the part of the tail it fuses: *skip tail ops) through cuDNN; *done = 0 when
// the caller must run Kiln's kernel. With ctx->plan_only it only sets up the cache.
kiln_status kiln_cuda_dnn_conv2d(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                 const kiln_cuda_conv_params *p, uint32_t *skip, int *done);

void kiln_cuda_attn_cache_free(kiln_cuda_attn_cache *cache);
// Runs sdpa (no mask, not causal) through cuDNN's fused attention; *done = 0 when the caller
// must run Kiln's kernel (cuDNN absent or older than 9.13, no ctx->attn cache, or it declined
// these shapes: declines are remembered per key). With ctx->plan_only it only sets up the cache.
kiln_status kiln_cuda_dnn_sdpa(const kiln_cuda_ctx *ctx, const kiln_cuda_attn_geom *g, int *done);

// Runs one layer: dispatches on args->op (cuda_dispatch.c).
kiln_status kiln_cuda_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args);
// Nonzero when the CUDA backend implements the layer (op, dtypes, tail); when zero and why is
// not NULL, writes the reason.
int kiln_cuda_supports(const kiln_kernel_args *args, char *why, size_t why_nbytes);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_OPS_H
