// SPDX-License-Identifier: Apache-2.0
// Decide apart from run. A heavy layer (linear, matmul, conv2d, sdpa) has a plan step that
// writes a decision record (kiln_cuda_layer_plan: which kernel, its algorithm or configuration,
// its workspace, the tail ops it fuses) and a run step that executes the record without
// deciding anything. Plans are made at context creation for the largest shapes (with the
// policy's tune: candidates timed by gemm_tune.cu and attn_tune.c, which call the strategies'
// run steps, never a layer's entry point) and, untimed, at an execute that meets a problem the
// record was not made for (its key: shapes, dtypes, alignments, the fused epilogue).
// Every other op has no choices: its launcher runs it (cuda_ops.h). kiln_cuda_run dispatches.
#ifndef KILN_CUDA_CUDA_PLAN_H
#define KILN_CUDA_CUDA_PLAN_H

#include "cuda/cuda_ctx.h"
#include "cuda/cuda_wg.h"

#ifdef __cplusplus
extern "C" {
#endif

// What runs a planned layer.
typedef enum kiln_cuda_kernel {
    KILN_CUDA_K_NONE = 0,      // not planned yet
    KILN_CUDA_K_EMPTY,         // zero elements: nothing runs
    KILN_CUDA_K_TILED,         // linear, matmul: Kiln's tiled GEMM kernel (tiled_gemm.cuh)
    KILN_CUDA_K_CUBLASLT,      // linear, matmul: cuBLASLt
    KILN_CUDA_K_GEMV,          // linear of at most 8 rows: Kiln's GEMV (op_gemv.cu)
    KILN_CUDA_K_WGMMA,         // linear of 9-256 rows: Kiln's TMA + wgmma kernel (op_linear_wg.cu)
    KILN_CUDA_K_SPLITK,        // linear: K split over a batched cuBLASLt GEMM + reduce kernel
    KILN_CUDA_K_CUDNN,         // conv2d, sdpa: cuDNN
    KILN_CUDA_K_STEM,          // conv2d with C % 8 != 0 in NHWC: Kiln's stem kernel
    KILN_CUDA_K_CONV_DIRECT,   // conv2d with few output channels per group: one thread each
    KILN_CUDA_K_CONV_GEMM,     // conv2d: implicit GEMM on the tiled kernel
    KILN_CUDA_K_SDPA_TC,       // sdpa: tensor-core kernel, pipelined K/V tiles
    KILN_CUDA_K_SDPA_TC_SPLIT, // sdpa: tensor-core kernel, keys split across warps
    KILN_CUDA_K_SDPA_FLASH,    // sdpa: fp32-FMA flash kernel (head sizes up to 256)
    KILN_CUDA_K_SDPA_SIMPLE,   // sdpa: one block per query row (larger heads)
    KILN_CUDA_K_CONV_DW,       // depthwise conv2d in NHWC: 8 channels per thread (op_conv.cu)
    KILN_CUDA_K_CONV_PW,       // 1x1 conv2d in NHWC: a tensor-core GEMM over pixels (conv_pw.cu)
    KILN_CUDA_K_CONV_LT,       // 1x1 conv2d on cuBLASLt: NCHW a GEMM per image, NHWC one over
                               // the pixels (op_conv.cu)
} kiln_cuda_kernel;

// The name kiln_layer_info reports ("cublaslt", "wgmma", ...).
const char *kiln_cuda_kernel_name(kiln_cuda_kernel k);

#define KILN_CUDA_PLAN_KEY 64

// One cuBLASLt matmul, set up (descriptors, algorithm) for one problem.
typedef struct kiln_cuda_lt_plan {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    const void *bias; // the bias pointer set in desc (re-set at run if it differs)
    size_t ws_nbytes; // workspace the algorithm needs
    int epilogue;     // cublasLtEpilogue_t
    int candidate;    // the heuristic's candidate it runs (1-based) ...
    int n_candidates; // ... of how many it returned
    float us;         // its time when the candidates were timed (< 0: untimed)
} kiln_cuda_lt_plan;

typedef struct kiln_cuda_gemm_rec {
    kiln_cuda_lt_plan lt; // CUBLASLT, CONV_LT; SPLITK: the batched GEMM over the K slices
    int splitk;           // SPLITK: slices (2, 4, 8)
    kiln_cuda_wg_cfg wg;  // WGMMA: the configuration
    int epi;              // GEMV, WGMMA, SPLITK: the op fused after the bias (KILN_CUDA_WG_EPI_*)
    int forced;           // a configuration the policy forced (untimed)
    kiln_cuda_wg_maps_t maps; // WGMMA: the TMA descriptors, re-encoded when pointers change
    // What tuning measured (us < 0: not timed), kept for the whole-engine choice (cuda_tune.c)
    // and kiln_layer_info: the chosen kernel's time, the fastest wgmma configuration and its
    // time, and why the choice went as it did.
    float us;
    kiln_cuda_wg_cfg wg_alt;
    float wg_alt_us;
    char why[96];
} kiln_cuda_gemm_rec;

typedef struct kiln_cuda_conv_rec {
    int algo;           // cudnnConvolutionFwdAlgo_t
    int math;           // cudnnMathType_t
    size_t ws_nbytes;   // workspace the algorithm needs
    int fused;          // cuDNN's fused bias+activation call: -1 once declined (unfused after)
    int fused_identity; // the same without the ReLU (identity activation)
    void *descs;        // cuDNN descriptors (dnn_conv.c)
    kiln_cuda_kernel fallback; // what runs if cuDNN declines at run (DIRECT or CONV_GEMM)
    int dw_rows;         // CONV_DW: output pixels of a row per thread at the planned shapes, 0: one
                         // pixel (each run re-decides)
    int dw_tile;         // CONV_DW: output rows per block of the 7x7 tile kernel (0: not taken)
    int lt_nhwc;         // CONV_LT: the NHWC form (a GEMM over the pixels, the tail fused)
    float dnn_us, pw_us; // a 1x1 conv timed on cuDNN and on Kiln's kernel: the pointwise one
                         // (NHWC) or the implicit GEMM (NCHW) (< 0: not timed)
} kiln_cuda_conv_rec;

typedef struct kiln_cuda_sdpa_rec {
    int dnn;              // CUDNN: the plan's index in the layer's store
    int rows;             // SDPA_TC: query rows per CTA (16, 32, 64)
    int split;            // SDPA_TC_SPLIT: warps per 16-row block (2, 4, 8)
    int chunks;           // SDPA_TC_SPLIT: CTAs the keys are cut into (1: none)
    kiln_cuda_kernel own; // Kiln's kernel for it (what CUDNN falls back to)
    float dnn_us, own_us; // timed at context creation (< 0: not timed)
} kiln_cuda_sdpa_rec;

// A timed choice as the tuning cache keeps it (cuda_tune.c): indices the heuristics re-derive on
// use (never pointers or a library's opaque structs), each checked there against what the
// heuristic returns now; a choice that does not check is timed again.
typedef struct kiln_cuda_choice {
    int32_t kernel;       // kiln_cuda_kernel
    int32_t lt_candidate; // CUBLASLT, SPLITK: the heuristic's candidate (1-based) ...
    int32_t lt_n;         // ... of how many it returned (must be as many again)
    int32_t splitk;       // SPLITK: slices
    int32_t wg[3];        // WGMMA: bn, split, occ (one of kiln_cuda_wg_configs)
    int32_t wg_alt[3];    // the fastest wgmma configuration (bn 0: none), for the engine choice
    float us, wg_alt_us;  // the times tuning measured (kiln_layer_info, the engine choice)
    int32_t dnn_cfg;      // sdpa on CUDNN: cuDNN's engine configuration (0-based) ...
    int32_t dnn_n;        // ... of how many the heuristic offered
    float dnn_us, own_us; // sdpa: the times tuning measured
    int32_t conv_algo;    // conv2d on CUDNN: the heuristic's algorithm (-1: none) ...
    int32_t conv_math;    // ... and math type
} kiln_cuda_choice;

typedef struct kiln_cuda_layer_plan {
    kiln_cuda_kernel kernel;
    uint32_t fused; // tail ops the kernel applies itself (the rest run in the tail kernel)
    int timed;      // chosen by timing candidates
    int cached;     // applied from the tuning cache (ctx->choice), not timed in this process
    int fell_back;  // the library it named refused at run: the fallback kernel runs it now
    int64_t key[KILN_CUDA_PLAN_KEY]; // the problem it was made for
    kiln_cuda_gemm_rec gemm;
    kiln_cuda_conv_rec conv;
    kiln_cuda_sdpa_rec sdpa;
} kiln_cuda_layer_plan;

// --- dispatch (cuda_dispatch.c)

// Nonzero when the CUDA backend implements the layer (op, dtypes, tail); when zero and why is
// not NULL, writes the reason.
int kiln_cuda_supports(const kiln_kernel_args *args, char *why, size_t why_nbytes);
// Nonzero for the ops that are planned (linear, matmul, conv2d, sdpa).
int kiln_cuda_op_planned(uint32_t op);
// The key of the layer's problem: *plan is current for it when kiln_cuda_plan_current.
void kiln_cuda_plan_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t *key);
int kiln_cuda_plan_current(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                           const kiln_cuda_layer_plan *plan);
// Plans a layer of a planned op into *plan (released first); with tune, by timing candidates on
// the layer's own buffers (context creation only: it synchronizes the stream). A failure names
// the layer; *plan is then not planned.
kiln_status kiln_cuda_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int tune,
                           kiln_cuda_layer_plan *plan);
// Runs one layer and its fused tail: a planned op with *plan (current for args), any other op
// with its launcher (plan unused, may be NULL).
kiln_status kiln_cuda_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                          kiln_cuda_layer_plan *plan);
void kiln_cuda_plan_release(kiln_cuda_layer_plan *plan);
// Fills out->kernel, detail, workspace and the TIMED flag from a plan (NULL: a launcher).
void kiln_cuda_plan_describe(const kiln_cuda_layer_plan *plan, uint32_t op, kiln_layer_info *out);

// --- the families (op_gemm.cu, op_conv.cu, op_attention.cu)

void kiln_cuda_linear_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t *key);
kiln_status kiln_cuda_linear_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int tune,
                                  kiln_cuda_layer_plan *plan);
void kiln_cuda_matmul_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t *key);
kiln_status kiln_cuda_matmul_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int tune,
                                  kiln_cuda_layer_plan *plan);
// Runs a linear or matmul plan (gemm_run.cu).
kiln_status kiln_cuda_gemm_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                               kiln_cuda_layer_plan *plan);
void kiln_cuda_gemm_describe(const kiln_cuda_layer_plan *plan, char *buf, size_t n);

void kiln_cuda_conv2d_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t *key);
kiln_status kiln_cuda_conv2d_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int tune,
                                  kiln_cuda_layer_plan *plan);
kiln_status kiln_cuda_conv2d_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                 kiln_cuda_layer_plan *plan);
void kiln_cuda_conv_plan_release(kiln_cuda_conv_rec *plan);
void kiln_cuda_conv_describe(const kiln_cuda_layer_plan *plan, char *buf, size_t n);

void kiln_cuda_sdpa_key(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t *key);
kiln_status kiln_cuda_sdpa_plan(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int tune,
                                kiln_cuda_layer_plan *plan);
kiln_status kiln_cuda_sdpa_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                               kiln_cuda_layer_plan *plan);
void kiln_cuda_sdpa_describe(const kiln_cuda_layer_plan *plan, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_PLAN_H
