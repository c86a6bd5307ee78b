// SPDX-License-Identifier: Apache-2.0
// The GEMM family's internals. linear (x[.., K] w[N, K] bias?[N] -> x w^T + b) and matmul
// (torch.matmul: 1-D operands, batch broadcasting) run on one of five strategies: cuBLASLt
// (gemm_lt.cu), Kiln's tiled kernel (gemm_tiled.cu, for what cuBLASLt does not take), the GEMV
// for linears of at most 8 rows (op_gemv.cu), the small-M TMA + wgmma kernel for 9-256 rows
// (gemm_wg.cu over op_linear_wg.cu), and a K split over a batched cuBLASLt GEMM (gemm_splitk.cu).
// op_gemm.cu plans a layer (kiln_cuda_layer_plan, cuda_plan.h), gemm_run.cu runs a plan, and
// gemm_tune.cu times the candidates at context creation through the strategies' runs.
#ifndef KILN_CUDA_GEMM_H
#define KILN_CUDA_GEMM_H

#include "cuda/cuda_ops.h"
#include "cuda/cuda_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

// A linear's operands and sizes: y[m, n] = x[m, k] w[n, k]^T + bias[n] (m: every dim of y but
// the last).
typedef struct kiln_cuda_linear_geom {
    const kiln_tensor *x, *w, *bias;
    kiln_tensor *y;
    int64_t m, n, k;
} kiln_cuda_linear_geom;

// Fills *g; KILN_ERR_UNSUPPORTED naming the layer when args is not a linear of float operands
// with a matching 2-D weight and bias.
kiln_status kiln_cuda_linear_geom_of(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                     kiln_cuda_linear_geom *g);

// --- the fused epilogue (the first tail op, when a kernel can apply it)

int kiln_cuda_tail_relu_first(const kiln_kernel_args *args);
// A GELU of the tanh form (cuBLASLt's GELU epilogue is the tanh approximation).
int kiln_cuda_tail_gelu_tanh_first(const kiln_kernel_args *args);
// An add of a residual of exactly the output's dtype and shape (not the output itself).
const void *kiln_cuda_tail_residual_first(const kiln_kernel_args *args);
// The op the small-M kernels (GEMV, wgmma, the K split's reduce) fuse after the bias
// (KILN_CUDA_WG_EPI_*) and its residual.
void kiln_cuda_small_m_epilogue(const kiln_kernel_args *args, int *epi, const void **res);

// --- cuBLASLt (gemm_lt.cu): float32 compute (no TF32); row-major C = A B as column-major
// C^T = B^T A^T; the bias and a ReLU, tanh GELU or residual that directly follows ride in the
// epilogue.

// One column-major problem: D (m x n, ld ldd) = op(A) (m x k) * op(B) (k x n) + bias[m] (+ C).
typedef struct kiln_cuda_lt_problem {
    uint32_t dtype;
    int trans_a; // A stored k x m (ld lda), used transposed; else m x k
    int trans_b; // B stored n x k (ld ldb), used transposed; else k x n
    int64_t m, n, k, lda, ldb, ldd;
    int64_t batch, stride_a, stride_b, stride_d;
    const void *a, *b, *bias;
    const void *c; // beta = 1, C = c (a residual of D's shape and layout) when not NULL
    void *d;
    float alpha;      // D = alpha op(A) op(B) (+ C); 0 means 1
    int relu;         // fuse ReLU (after the bias) into the epilogue
    int gelu;         // fuse GELU, tanh form
    uint32_t d_dtype; // D's (and C's) dtype when it is not A's and B's (0: the same)
} kiln_cuda_lt_problem;

#define KILN_CUDA_LT_CANDIDATES 8 // heuristic candidates asked for when tuning

// A linear as a cuBLASLt problem (D^T[n x m] = W^T-stored-k-x-n transposed * X^T).
void kiln_cuda_lt_linear_problem(const kiln_cuda_linear_geom *g, const kiln_kernel_args *args,
                                 kiln_cuda_lt_problem *p);
// A matmul's operand j (0: a, 1: b) as the kernels read it: the strided view the attention fold
// bound (ctx->sdpa_io[j], cuda_fold.h), else the dense tensor.
void kiln_cuda_mm_operand(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int j,
                          kiln_cuda_strided *out);
// A matmul as a cuBLASLt problem over its operands (kiln_cuda_mm_operand); 0 when cuBLASLt cannot
// take it (mixed dtypes, K = 0, general batch broadcasting, strides no matrix layout expresses).
int kiln_cuda_lt_matmul_problem(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                kiln_cuda_lt_problem *p);
// Sets up descriptors for p and asks the heuristic for up to n_ask algorithms (best first into
// cands with the workspace each needs in cand_ws, *n_cands of them); the plan runs the first.
// 0 (logged at DEBUG) when there is none.
int kiln_cuda_lt_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_lt_problem *p, int n_ask,
                       cublasLtMatmulAlgo_t *cands, size_t *cand_ws, int *n_cands,
                       kiln_cuda_lt_plan *plan);
// Enqueues p with the plan's descriptors and algo (NULL: the plan's).
cublasStatus_t kiln_cuda_lt_exec(const kiln_cuda_ctx *ctx, const kiln_cuda_lt_problem *p,
                                 kiln_cuda_lt_plan *plan, const cublasLtMatmulAlgo_t *algo);
void kiln_cuda_lt_describe(const kiln_cuda_lt_plan *plan, char *buf, size_t n);

// --- Kiln's tiled kernel (gemm_tiled.cu)

kiln_status kiln_cuda_tiled_linear(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g);
kiln_status kiln_cuda_tiled_matmul(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args);

// --- the GEMV (op_gemv.cu)

// 1 when the GEMV runs this linear (policy, M <= 8, float16/bfloat16 of one dtype; K % 8 == 0
// with 16-byte aligned x and w, or else a weight of at most 64 Ki elements on the scalar kernel,
// without GEMV folds). Its epilogue applies the bias and the first tail op when that is ReLU,
// GELU, a residual add (KILN_CUDA_WG_EPI_*), SiLU, sigmoid, hard-sigmoid or hard-swish.
int kiln_cuda_gemv_applies(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g);
// The GEMV activation code (KILN_CUDA_GEMV_ACT_*) of the layer's first tail op, or
// KILN_CUDA_WG_EPI_NONE.
int kiln_cuda_gemv_tail_act(const kiln_kernel_args *args);
kiln_status kiln_cuda_gemv_run(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g, int epi,
                               const void *res);

// --- the small-M wgmma kernel (gemm_wg.cu)

// Fills *p when the kernel can take this linear (ctx->wg_ok, 9 <= M <= 256, float16/bfloat16,
// alignments); 0 otherwise.
int kiln_cuda_wg_problem_of(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g,
                            const kiln_kernel_args *args, kiln_cuda_wg_problem *p);
// Enqueues the layer on the kernel with cfg, then the tail ops it does not fuse.
kiln_status kiln_cuda_wg_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                             const kiln_cuda_wg_problem *p, kiln_cuda_wg_cfg cfg,
                             kiln_cuda_wg_maps_t *maps);

// --- K split over a batched cuBLASLt GEMM (gemm_splitk.cu)

// 1 when the split can run this linear with s slices (dtypes, alignment, divisibility, room for
// the partial sums in the workspace).
int kiln_cuda_splitk_fits(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g, int s);
// 1 when timing the split against the plain GEMM may pay (M > 64, K >= 1024, few output tiles).
int kiln_cuda_splitk_worth(const kiln_cuda_linear_geom *g);
// The same rule on the problem's sizes (m rows, n outputs, k inputs): what the library warm-up
// reads off a plan before any buffer exists.
int kiln_cuda_splitk_worth_mnk(int64_t m, int64_t n, int64_t k);
// The split's batched GEMM as a cuBLASLt problem, and the context it runs under (*sctx: the
// workspace without the partial sums, which take its tail).
void kiln_cuda_splitk_problem(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g, int s,
                              kiln_cuda_ctx *sctx, kiln_cuda_lt_problem *p);
// Sets up the batched GEMM of the split into *lt (up to n_ask heuristic candidates into cands and
// cand_ws, as kiln_cuda_lt_setup); 0 when cuBLASLt has no algorithm.
int kiln_cuda_splitk_setup(const kiln_cuda_ctx *ctx, const kiln_cuda_linear_geom *g, int s,
                           int n_ask, cublasLtMatmulAlgo_t *cands, size_t *cand_ws, int *n_cands,
                           kiln_cuda_lt_plan *lt);
// Enqueues the split GEMM, the reduce kernel (bias, first tail op) and the remaining tail.
kiln_status kiln_cuda_splitk_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                                 const kiln_cuda_linear_geom *g, int s, kiln_cuda_lt_plan *lt);

// --- tuning (gemm_tune.cu): context creation only

// Applies ctx->choice (the tuning cache's record) to a plan set up for tuning (the heuristic's
// candidates in cands): 1 when it checks against them, else 0 (the plan is then planned again).
int kiln_cuda_linear_apply(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                           const kiln_cuda_linear_geom *g, const cublasLtMatmulAlgo_t *cands,
                           const size_t *cand_ws, int n_cands, kiln_cuda_layer_plan *plan);
int kiln_cuda_matmul_apply(const kiln_cuda_ctx *ctx, const cublasLtMatmulAlgo_t *cands,
                           const size_t *cand_ws, int n_cands, kiln_cuda_layer_plan *plan);

// Times a linear's candidates as the engine runs them (inside a CUDA graph, on the layer's own
// buffers): the heuristic's cuBLASLt algorithms, then the K split where it may pay, then the
// wgmma configurations; leaves the fastest in *plan (its times recorded).
void kiln_cuda_linear_tune(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                           const kiln_cuda_linear_geom *g, const cublasLtMatmulAlgo_t *cands,
                           const size_t *cand_ws, int n_cands, kiln_cuda_layer_plan *plan);
// Times a matmul's cuBLASLt candidates; the fastest stays in *plan.
void kiln_cuda_matmul_tune(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                           const cublasLtMatmulAlgo_t *cands, const size_t *cand_ws, int n_cands,
                           kiln_cuda_layer_plan *plan);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_GEMM_H
