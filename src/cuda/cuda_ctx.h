// SPDX-License-Identifier: Apache-2.0
// What one layer's launch sees inside the CUDA plugin (kiln_cuda_ctx): the stream, the engine's
// policy (the options cuda.*: nothing in the plugin reads the environment), the libraries'
// handles and workspace, and how this layer's operands are stored (set by the layer loop,
// cuda_layers.c). Launchers enqueue work on ctx->stream only (no allocation, no
// synchronization), check each launch and return KILN_ERR_DEVICE naming the kernel, the CUDA
// error and ctx->where on failure.
#ifndef KILN_CUDA_CUDA_CTX_H
#define KILN_CUDA_CUDA_CTX_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "cuda/cuda_fold.h"
#include "cuda/cuda_util.h"
#include "runtime/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

// cuDNN (cuda_dnn.c, loaded at run time): a handle per context.
typedef struct kiln_cuda_dnn kiln_cuda_dnn;
// The cuDNN attention plans of one sdpa layer (dnn_sdpa.c), kept for the context's life: a
// CUDA graph recorded with a plan's kernel may be described or replayed after shapes change.
typedef struct kiln_cuda_sdpa_store kiln_cuda_sdpa_store;

// Activations the GEMV applies that the other small-M kernels do not (its other epilogues are
// KILN_CUDA_WG_EPI_* codes): a gated GEMV's SiLU (cuda_fold.h), and a plain GEMV's first tail op
// when it is one of these (squeeze-excite's linears: SiLU or ReLU, then sigmoid or hard-sigmoid).
#define KILN_CUDA_GEMV_ACT_SILU 16
#define KILN_CUDA_GEMV_ACT_SIGMOID 17
#define KILN_CUDA_GEMV_ACT_HARDSIGMOID 18
#define KILN_CUDA_GEMV_ACT_HARDSWISH 19

typedef struct kiln_cuda_ctx {
    cudaStream_t stream;
    const kiln_cuda_policy *policy; // never NULL
    cublasLtHandle_t lt;            // NULL: GEMMs on Kiln's tiled kernel (policy, or no handle)
    kiln_cuda_dnn *dnn;             // NULL: no cuDNN (policy, absent, or not needed)
    void *workspace;                // the libraries' workspace (device), shared by the layers
    size_t workspace_nbytes;
    size_t *workspace_used; // the most bytes of it a layer used (NULL: not counted; ws_note)
    int sm_count;           // multiprocessors of the device (0: unknown)
    int wg_ok;              // Kiln's small-M wgmma linear can run (sm_90, policy cuda.wgmma)
    const char *where;      // "layer 12 (linear)", for messages
    // This layer, as the layer loop binds it (zero when none applies):
    int nhwc;           // its 4-D operands are stored NHWC, dims logical NCHW (cuda_layout.h)
    const void *w_krsc; // conv2d with nhwc: the weight in KRSC (O, kh, kw, C) order
    int64_t w_krsc_cs;  // ... its channel stride (C / groups, padded to 8 with the input)
    int64_t x_cpad;     // conv2d with nhwc: x's NHWC channel stride when padded (0: dense)
    int stem;           // conv2d with nhwc: Kiln's stem kernel (x read NCHW, the OIHW weight)
    int out_nchw;       // group_norm with nhwc: the output is stored NCHW (cuda_layout.h)
    int out_nhwc;       // an elementwise group or permute: its 4-D output is stored NHWC (ditto)
    int in_nhwc;        // a permute: its input is stored channels-last (ditto)
    int64_t l2_keep;    // small-M linear: bytes of its weight the L2 plan keeps (-1: no hints)
    // sdpa with folded views (cuda_fold.h): q, k, v, out through these (NULL: the dense tensor);
    // a matmul's a and b likewise (0 and 1), and its product scaled by mm_alpha (the constant
    // scales folded on its operands' views; 1 otherwise)
    const kiln_cuda_strided *sdpa_io[4];
    float mm_alpha;
    kiln_cuda_sdpa_store *sdpa_store; // sdpa: the context's cuDNN plans (NULL: cuDNN not used)
    // A GEMV linear with GEMV folds (cuda_fold.h), else NULL: the input of the RMSNorm it applies
    // (read instead of its x), the norm's weight (NULL: none) and eps; the up projection's weight
    // and bias of a gated pair, and the activation before the product (KILN_CUDA_WG_EPI_*, SiLU
    // as KILN_CUDA_GEMV_ACT_SILU).
    const kiln_tensor *gemv_x, *gemv_norm_w;
    float gemv_eps;
    const kiln_tensor *gemv_up_w, *gemv_up_b;
    int gemv_act;
    // ... and the siblings its launch also runs: weights, biases (NULL: none), outputs, and the
    // bytes of each weight the L2 plan keeps (cuda_layout.h)
    int gemv_n_sib;
    const kiln_tensor *gemv_sib_w[KILN_CUDA_GEMV_MAX_SIB - 1],
        *gemv_sib_b[KILN_CUDA_GEMV_MAX_SIB - 1];
    kiln_tensor *gemv_sib_y[KILN_CUDA_GEMV_MAX_SIB - 1];
    int64_t gemv_sib_keep[KILN_CUDA_GEMV_MAX_SIB - 1];
    // The q rotary of a rope group (cuda_fold.h), else rope_kx NULL: the k rotary's input, the
    // key cache, the index (shared by both writes) and the key write's wrap (negative positions
    // count from the end), the value rows and cache (NULL: none) and that write's wrap.
    const kiln_tensor *rope_kx, *rope_idx, *rope_vsrc;
    kiln_tensor *rope_kcache, *rope_vcache;
    int rope_kwrap, rope_vwrap;
    // ... and q's x, k's x and the value rows where the group reads them through a folded
    // permute (NULL: as stored; the views' dims are the tensors', the innermost stride 1).
    const kiln_cuda_strided *rope_in[3];
    // The MEAN of a mean ratio (cuda_fold.h), else ratio_y NULL: the DIV's output, the ADD's
    // one-element eps, and the dtypes of the mean's and the add's outputs (each value rounded
    // to its layer's dtype).
    kiln_tensor *ratio_y;
    const kiln_tensor *ratio_eps;
    uint32_t ratio_mean_dtype, ratio_add_dtype;
    // The SUM of a softmax-weighted sum (cuda_fold.h), else wsum_s NULL: the softmax's input,
    // the mul's other operand x, and the dtypes of the softmax's and the mul's outputs.
    const kiln_tensor *wsum_s, *wsum_x;
    uint32_t wsum_sm_dtype, wsum_mul_dtype;
    // The ABS of an overflow clamp (cuda_fold.h), else clamp_y NULL: the MINIMUM's output, and
    // the WHERE's constants a (some |x| is inf) and b (none).
    kiln_tensor *clamp_y;
    float clamp_a, clamp_b;
    // A depthwise conv with a prologue (cuda_fold.h, conv prologues), else n_pre 0: the tail ops
    // of the conv that wrote its input, applied to each input value before the conv reads it.
    const kiln_tail_op *pre;
    uint32_t n_pre;
    // Planning with tuning: a choice read from the tuning cache to apply instead of timing
    // (struct kiln_cuda_choice, cuda_plan.h; NULL: time the candidates).
    const struct kiln_cuda_choice *choice;
} kiln_cuda_ctx;

// Notes that a layer uses the first n bytes of the workspace (the context keeps the most).
static inline void kiln_cuda_ws_note(const kiln_cuda_ctx *ctx, size_t n) {
    if (ctx->workspace_used != NULL && n > *ctx->workspace_used) *ctx->workspace_used = n;
}

// A failed CUDA call in a layer: "CUDA error in <what> at <where>: <name> (<string>)" ->
// KILN_ERR_DEVICE.
kiln_status kiln_cuda_error(const kiln_cuda_ctx *ctx, const char *what, cudaError_t err);
// The last launch's error, if any (cudaGetLastError), reported as above.
kiln_status kiln_cuda_check_launch(const kiln_cuda_ctx *ctx, const char *kernel);
// A failed CUDA call outside a layer (allocation: KILN_ERR_NO_MEMORY; else KILN_ERR_DEVICE).
kiln_status kiln_cuda_call_failed(const char *what, cudaError_t err);
// Clears the thread's pending CUDA error after a call whose failure is expected and handled
// here (a refused update, a declined candidate): no later check may see it.
void kiln_cuda_consume(void);

// A one-thread kernel that waits `us` microseconds (op_eltwise.cu): lets the host queue work
// ahead of the GPU (profiling, timing).
kiln_status kiln_cuda_delay(cudaStream_t stream, unsigned us);

// Microseconds per run of a candidate, timed as the engine runs it: KILN_CUDA_TIME_REPS runs
// (`enqueue` queues one on `stream` and returns nonzero on success) captured into a CUDA graph,
// launched once to warm up, then twice between events. Negative when it cannot run (nothing is
// left pending). Context creation only: it synchronizes the stream.
#define KILN_CUDA_TIME_REPS 10
float kiln_cuda_time_in_graph(cudaStream_t stream, int (*enqueue)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_CTX_H
