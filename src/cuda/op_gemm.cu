// SPDX-License-Identifier: Apache-2.0
// linear (x[.., K] w[N, K] bias?[N] -> x w^T + b) and matmul (torch.matmul: 1-D operands, batch
// broadcasting) through cuBLASLt with float32 compute (CUBLAS_COMPUTE_32F: no TF32) for float32,
// float16 and bfloat16 operands of one dtype. Row-major C = A B is computed as column-major
// C^T = B^T A^T. The bias, and a ReLU that directly follows it, run in cuBLASLt's epilogue; the
// rest of the fused tail in one elementwise kernel. The set-up (descriptors, heuristic algorithm)
// is cached per layer and redone only when sizes, dtypes or pointer alignments change. Cases
// cuBLASLt does not take (mixed dtypes, general batch broadcasting, K = 0, no algorithm) run on
// Kiln's tiled GEMM kernel (tiled_gemm.cuh), as does everything when ctx->lt is NULL.
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_layout.h"
#include "cuda/cuda_wg.h"
#include "cuda/tiled_gemm.cuh"

// --- the fallback kernel's loader: C[b][i][j] = sum_k A[b](i, k) B[b](k, j) (+ bias[j])

typedef struct gemm_view {
    const void *a, *b, *bias;
    uint32_t a_dt, b_dt, bias_dt, c_dt;
    void *c;
    int64_t a_rs, a_cs, b_rs, b_cs; // element strides inside one matrix
    int nb;                         // batch rank
    int64_t bdims[KC_MAX_RANK], a_bstr[KC_MAX_RANK], b_bstr[KC_MAX_RANK];
    int64_t m, n;
} gemm_view;

template <bool BKF> struct gemm_loader {
    gemm_view v;
    static constexpr bool b_k_fast = BKF;
    __device__ __forceinline__ int64_t off(int64_t bt, const int64_t *str) const {
        int64_t o = 0;
        for (int d = v.nb - 1; d >= 0; d--) {
            o += (bt % v.bdims[d]) * str[d];
            bt /= v.bdims[d];
        }
        return o;
    }
    __device__ __forceinline__ float a(int64_t bt, int64_t i, int64_t k) const {
        return kc_ld_f(v.a, v.a_dt, off(bt, v.a_bstr) + i * v.a_rs + k * v.a_cs);
    }
    __device__ __forceinline__ float b(int64_t bt, int64_t k, int64_t j) const {
        return kc_ld_f(v.b, v.b_dt, off(bt, v.b_bstr) + k * v.b_rs + j * v.b_cs);
    }
    __device__ __forceinline__ void store(int64_t bt, int64_t i, int64_t j, float acc) const {
        if (v.bias != NULL) acc += kc_ld_f(v.bias, v.bias_dt, j);
        kc_st_f(v.c, v.c_dt, (bt * v.m + i) * v.n + j, acc);
    }
};

static kiln_status gemm_fallback(const kiln_cuda_ctx *ctx, const gemm_view *v, int64_t k,
                                 int64_t batch) {
    if (v->m == 0 || v->n == 0 || batch == 0) return KILN_OK;
    dim3 grid = tg_grid(v->m, v->n, batch);
    if (v->b_cs != 1 && v->b_rs == 1) {
        gemm_loader<true> ld = {*v};
        tiled_gemm_kernel<gemm_loader<true>>
            <<<grid, TG_THREADS, 0, ctx->stream>>>(ld, v->m, v->n, k, batch);
    } else {
        gemm_loader<false> ld = {*v};
        tiled_gemm_kernel<gemm_loader<false>>
            <<<grid, TG_THREADS, 0, ctx->stream>>>(ld, v->m, v->n, k, batch);
    }
    return kiln_cuda_check_launch(ctx, "tiled_gemm_kernel");
}

// --- cuBLASLt

static cudaDataType_t lt_type(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_F16: return CUDA_R_16F;
    case KILN_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

// Largest power of two (<= 256) dividing the address.
static int64_t lt_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int64_t a = 1;
    while (a < 256 && (u & (uintptr_t)(2 * a - 1)) == 0) a *= 2;
    return a;
}

// One column-major cuBLASLt problem: D (m x n, ld ldd) = op(A) (m x k) * op(B) (k x n) + bias[m].
typedef struct lt_problem {
    uint32_t dtype;
    int trans_a; // A stored k x m (ld lda), used transposed; else m x k
    int64_t m, n, k, lda, ldb, ldd;
    int64_t batch, stride_a, stride_b, stride_d;
    const void *a, *b, *bias;
    const void *c; // beta = 1, C = c (a residual of D's shape and layout) when not NULL
    void *d;
    int relu;         // fuse ReLU (after the bias) into the epilogue
    int gelu;         // fuse GELU, tanh form (cuBLASLt's GELU epilogue is the tanh approximation)
    uint32_t d_dtype; // D's (and C's) dtype when it is not A's and B's (0: the same)
} lt_problem;

static void lt_key(const lt_problem *p, int64_t *key) {
    memset(key, 0, KILN_CUDA_GEMM_KEY * sizeof(int64_t));
    key[0] = p->dtype;
    key[1] = p->trans_a;
    key[2] = p->m;
    key[3] = p->n;
    key[4] = p->k;
    key[5] = p->lda;
    key[6] = p->ldb;
    key[7] = p->ldd;
    key[8] = p->batch;
    key[9] = p->stride_a;
    key[10] = p->stride_b;
    key[11] = p->stride_d;
    key[12] = (int64_t)(uintptr_t)p->bias;
    key[13] = p->relu;
    key[14] = lt_align(p->a);
    key[15] = lt_align(p->b);
    key[16] = lt_align(p->d);
    key[17] = p->gelu;
    key[18] = (int64_t)(uintptr_t)p->c; // the residual's address (C's layout is D's)
    key[19] = p->c != NULL ? lt_align(p->c) : 0;
    key[20] = 2 + ((int64_t)p->d_dtype << 8); // key format, D's dtype
}

#define LT_TUNE_MAX 8 // heuristic candidates timed at context creation

// The key without the bias and residual addresses (alignments stay in it).
static void lt_shape_key(const int64_t *key, int64_t *out) {
    memcpy(out, key, KILN_CUDA_GEMM_KEY * sizeof(int64_t));
    out[12] = out[12] != 0;
    out[18] = out[18] != 0;
}

// KILN_CUDA_LT_WORKSPACE_KB=N: the workspace cuBLASLt's algorithms may use, at most N KiB (A/B
// of the heuristic's candidate set; default, or a value that is not a number: all of it).
static uint64_t lt_workspace_cap(uint64_t have) {
    const char *v = getenv("KILN_CUDA_LT_WORKSPACE_KB");
    char *end = NULL;
    const long long kb = v != NULL && v[0] != '\0' ? strtoll(v, &end, 10) : -1;
    if (kb < 0 || end == NULL || *end != '\0' || (uint64_t)kb > have / 1024) return have;
    return (uint64_t)kb * 1024;
}

static int lt_tune_enabled(void) {
    const char *v = getenv("KILN_CUDA_GEMM_TUNE");
    return v == NULL || strcmp(v, "0") != 0;
}

// KILN_CUDA_GEMM_TUNE=stream: candidates timed as back-to-back stream launches (the previous
// method, for A/B) instead of inside a CUDA graph.
static int lt_tune_stream(void) {
    const char *v = getenv("KILN_CUDA_GEMM_TUNE");
    return v != NULL && strcmp(v, "stream") == 0;
}

#define LT_TUNE_REPS 10 // timed runs of one candidate (KILN_CUDA_GEMM_TUNE=stream)

// Queues one run of the problem with algorithm algo on the context's stream.
static cublasStatus_t lt_enqueue(const kiln_cuda_ctx *ctx, const lt_problem *p,
                                 kiln_cuda_gemm_cache *c, const cublasLtMatmulAlgo_t *algo) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(ctx->lt, &c->desc, &one, p->a, &c->a, p->b, &c->b,
                          p->c != NULL ? &one : &zero, p->c != NULL ? p->c : p->d, &c->c, p->d,
                          &c->c, algo, ctx->workspace, ctx->workspace_nbytes, ctx->stream);
}

typedef struct lt_timed {
    const kiln_cuda_ctx *ctx;
    const lt_problem *p;
    kiln_cuda_gemm_cache *c;
    const cublasLtMatmulAlgo_t *algo;
} lt_timed;

static int lt_timed_enqueue(void *arg) {
    const lt_timed *t = (const lt_timed *)arg;
    return lt_enqueue(t->ctx, t->p, t->c, t->algo) == CUBLAS_STATUS_SUCCESS;
}

// One candidate's microseconds per run, or a negative value when it cannot run. By default it
// is timed as the engine runs it, inside a CUDA graph (kiln_cuda_time_in_graph: 10 runs
// captured, launched once to warm up and then twice between events): the layers run as graph
// kernel nodes, where the gap between two kernels is smaller than between stream launches and
// differs by kernel (Nsight Compute on the H200: a candidate that wins back-to-back stream
// launches can lose by 1.5 us inside the graph). With `stream` (KILN_CUDA_GEMM_TUNE=stream):
// 2 + 10 stream launches, the last 10 timed between e0 and e1.
static float lt_time_one(const kiln_cuda_ctx *ctx, const lt_problem *p, kiln_cuda_gemm_cache *c,
                         const cublasLtMatmulAlgo_t *algo, int stream, cudaEvent_t e0,
                         cudaEvent_t e1) {
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    float ms = -1.0f;
    if (!stream) {
        lt_timed t = {ctx, p, c, algo};
        return kiln_cuda_time_in_graph(ctx->stream, lt_timed_enqueue, &t);
    }
    // the GPU waits while the host queues every run: the events then time GPU work only
    if (kiln_cuda_delay(ctx->stream, 250) != KILN_OK) return -1.0f;
    for (int rep = 0; rep < LT_TUNE_REPS + 2 && s == CUBLAS_STATUS_SUCCESS; rep++) {
        if (rep == 2 && cudaEventRecord(e0, ctx->stream) != cudaSuccess)
            s = CUBLAS_STATUS_EXECUTION_FAILED;
        if (s == CUBLAS_STATUS_SUCCESS) s = lt_enqueue(ctx, p, c, algo);
    }
    const int ok = s == CUBLAS_STATUS_SUCCESS && cudaEventRecord(e1, ctx->stream) == cudaSuccess &&
                   cudaEventSynchronize(e1) == cudaSuccess &&
                   cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
    cudaGetLastError();
    return ok ? ms * 1000.0f / LT_TUNE_REPS : -1.0f;
}

// Times each candidate on the layer's own buffers at context creation; returns the index of the
// fastest, or -1 when none ran.
static int lt_time_candidates(const kiln_cuda_ctx *ctx, const lt_problem *p,
                              kiln_cuda_gemm_cache *c, const cublasLtMatmulHeuristicResult_t *r,
                              int n, float *best_us) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    int best = -1;
    const int stream = lt_tune_stream();
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto out;
    for (int i = 0; i < n; i++) {
        if (r[i].state != CUBLAS_STATUS_SUCCESS || r[i].workspaceSize > ctx->workspace_nbytes) {
            continue;
        }
        const float us = lt_time_one(ctx, p, c, &r[i].algo, stream, e0, e1);
        if (us >= 0.0f && (best < 0 || us < *best_us)) {
            best = i;
            *best_us = us;
        }
    }
out:
    if (e0 != NULL) cudaEventDestroy(e0);
    if (e1 != NULL) cudaEventDestroy(e1);
    cudaStreamSynchronize(ctx->stream);
    cudaGetLastError();
    return best;
}

// Sets up descriptors and picks an algorithm; 0 when cuBLASLt has none (use the fallback).
// At context creation (ctx->plan_only) up to LT_TUNE_MAX heuristic candidates are timed
// (lt_time_one: inside a CUDA graph) and the fastest is kept (KILN_CUDA_GEMM_TUNE=0: the
// heuristic's first choice); a later set-up of the same problem with other pointers reuses it.
static int lt_setup(const kiln_cuda_ctx *ctx, const lt_problem *p, kiln_cuda_gemm_cache *c) {
    cudaDataType_t t = lt_type(p->dtype);
    cublasOperation_t ta = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = p->bias ? (p->relu   ? CUBLASLT_EPILOGUE_RELU_BIAS
                                        : p->gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                  : CUBLASLT_EPILOGUE_BIAS)
                                     : (p->relu   ? CUBLASLT_EPILOGUE_RELU
                                        : p->gelu ? CUBLASLT_EPILOGUE_GELU
                                                  : CUBLASLT_EPILOGUE_DEFAULT);
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t results[LT_TUNE_MAX];
    int found = 0, pick = 0, n_ask = 1;
    int64_t key[KILN_CUDA_GEMM_KEY], skey[KILN_CUDA_GEMM_KEY];
    float tuned_us = -1.0f;
    uint64_t ws = lt_workspace_cap(ctx->workspace_nbytes);
    uint32_t al_a = (uint32_t)lt_align(p->a), al_b = (uint32_t)lt_align(p->b),
             al_d = (uint32_t)lt_align(p->d);
    uint32_t al_c = p->c != NULL ? (uint32_t)lt_align(p->c) : al_d;
    int32_t batch = (int32_t)p->batch;
    cublasStatus_t s;

    s = cublasLtMatmulDescInit(&c->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&c->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&c->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(&c->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof epi);
    }
    if (s == CUBLAS_STATUS_SUCCESS && p->bias != NULL) {
        s = cublasLtMatmulDescSetAttribute(&c->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                           sizeof p->bias);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = p->trans_a ? cublasLtMatrixLayoutInit(&c->a, t, (uint64_t)p->k, (uint64_t)p->m, p->lda)
                       : cublasLtMatrixLayoutInit(&c->a, t, (uint64_t)p->m, (uint64_t)p->k, p->lda);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutInit(&c->b, t, (uint64_t)p->k, (uint64_t)p->n, p->ldb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutInit(&c->c, p->d_dtype != 0 ? lt_type(p->d_dtype) : t,
                                     (uint64_t)p->m, (uint64_t)p->n, p->ldd);
    }
    if (s == CUBLAS_STATUS_SUCCESS && p->batch > 1) {
        cublasLtMatrixLayoutOpaque_t *ls[3] = {&c->a, &c->b, &c->c};
        int64_t strides[3] = {p->stride_a, p->stride_b, p->stride_d};
        for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; i++) {
            s = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                 sizeof batch);
            if (s == CUBLAS_STATUS_SUCCESS) {
                s = cublasLtMatrixLayoutSetAttribute(ls[i],
                                                     CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &strides[i], sizeof strides[i]);
            }
        }
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceInit(&pref);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &al_a, sizeof al_a);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &al_b, sizeof al_b);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &al_c, sizeof al_c);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &al_d, sizeof al_d);
    }
    lt_key(p, key);
    lt_shape_key(key, skey);
    const int reuse = c->tuned && memcmp(c->tuned_key, skey, sizeof skey) == 0;
    if (ctx->plan_only && !reuse && lt_tune_enabled()) n_ask = LT_TUNE_MAX;
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, &c->desc, &c->a, &c->b, &c->c, &c->c, &pref,
                                           n_ask, results, &found);
    }
    if (s == CUBLAS_STATUS_SUCCESS && found > 1) {
        int t = lt_time_candidates(ctx, p, c, results, found, &tuned_us);
        if (t >= 0) pick = t;
    }
    const cublasLtMatmulHeuristicResult_t result = results[pick];
    if (s != CUBLAS_STATUS_SUCCESS || found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "cuBLASLt has no algorithm for m=%lld n=%lld k=%lld batch=%lld (%s, status "
                      "%d) at %s: using Kiln's GEMM kernel",
                      (long long)p->m, (long long)p->n, (long long)p->k, (long long)p->batch,
                      kiln_cuda_dtype_name(p->dtype), (int)s, ctx->where ? ctx->where : "?");
        return 0;
    }
    c->algo = reuse ? c->tuned_algo : result.algo;
    if (n_ask > 1) {
        c->tuned = 1;
        memcpy(c->tuned_key, skey, sizeof skey);
        c->tuned_algo = result.algo;
    }
    if (ctx->plan_only && kiln_cuda_log_enabled(KILN_LOG_INFO)) {
        int32_t id = -1, tile = -1, stages = -1, splitk = -1;
        cublasLtMatmulAlgoConfigGetAttribute(&c->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                             NULL);
        cublasLtMatmulAlgoConfigGetAttribute(&c->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof tile, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(&c->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof stages, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(&c->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                             sizeof splitk, NULL);
        kiln_cuda_log(KILN_LOG_INFO,
                      "gemm m=%lld n=%lld k=%lld batch=%lld (%s, epilogue %d%s) at %s: cuBLASLt "
                      "algo %d tile %d stages %d split-k %d, waves %.2f, workspace %zu, "
                      "candidate %d of %d (%.2f us)",
                      (long long)p->m, (long long)p->n, (long long)p->k, (long long)p->batch,
                      kiln_cuda_dtype_name(p->dtype), (int)epi, p->c != NULL ? ", +C" : "",
                      ctx->where ? ctx->where : "?", (int)id, (int)tile, (int)stages, (int)splitk,
                      (double)result.wavesCount, result.workspaceSize, pick + 1, found,
                      (double)tuned_us);
    }
    return 1;
}

// Runs the problem through cuBLASLt when it can; *done = 0 when the caller must use the fallback.
static kiln_status lt_run(const kiln_cuda_ctx *ctx, const lt_problem *p, int *done) {
    kiln_cuda_gemm_cache local;
    kiln_cuda_gemm_cache *c = ctx->gemm ? ctx->gemm : &local;
    int64_t key[KILN_CUDA_GEMM_KEY];
    const float one = 1.0f, zero = 0.0f;
    const float *beta = p->c != NULL ? &one : &zero;
    const void *cptr = p->c != NULL ? p->c : p->d;
    *done = 0;
    if (ctx->lt == NULL) return KILN_OK;
    lt_key(p, key);
    if (ctx->gemm == NULL || !c->valid || memcmp(c->key, key, sizeof key) != 0) {
        c->valid = 0;
        c->use_lt = lt_setup(ctx, p, c);
        memcpy(c->key, key, sizeof key);
        c->valid = 1;
    }
    if (!c->use_lt) return KILN_OK;
    if (ctx->plan_only) {
        *done = 1;
        return KILN_OK;
    }
    cublasStatus_t s =
        cublasLtMatmul(ctx->lt, &c->desc, &one, p->a, &c->a, p->b, &c->b, beta, cptr, &c->c, p->d,
                       &c->c, &c->algo, ctx->workspace, ctx->workspace_nbytes, ctx->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        // Rejected before any work was enqueued: remember it and use Kiln's kernel instead.
        kiln_cuda_log(KILN_LOG_WARN,
                      "cublasLtMatmul rejected m=%lld n=%lld k=%lld batch=%lld %s at %s: %s (%d); "
                      "using Kiln's GEMM kernel for this layer",
                      (long long)p->m, (long long)p->n, (long long)p->k, (long long)p->batch,
                      kiln_cuda_dtype_name(p->dtype), ctx->where ? ctx->where : "?",
                      cublasLtGetStatusString(s), (int)s);
        c->use_lt = 0;
        return kiln_cuda_check_launch(ctx, "cublasLtMatmul");
    }
    *done = 1;
    return kiln_cuda_check_launch(ctx, "cublasLtMatmul");
}

static const kiln_tensor *opt_in(const kiln_kernel_args *args, uint32_t i) {
    return i < args->n_in ? args->in[i] : NULL;
}

// The first tail op can ride in the epilogue when it is a ReLU.
static int tail_relu_first(const kiln_kernel_args *args) {
    return args->n_tail > 0 && args->tail[0].op == KILN_OP_RELU;
}

// ... or a GELU of the tanh form (cuBLASLt's GELU epilogue is the tanh approximation, so the
// exact erf GELU stays in Kiln's tail kernel).
static int tail_gelu_tanh_first(const kiln_kernel_args *args) {
    return args->n_tail > 0 && args->tail[0].op == KILN_OP_GELU &&
           kiln_attrs_int(&args->tail[0].attrs, KILN_A_GELU_APPROXIMATE, 0) == 1;
}

// ... or an add of a residual of exactly the output's dtype and shape (not the output itself):
// D = A B + bias + C with beta = 1 and C = the residual. Returns the residual, or NULL.
static const void *tail_residual_first(const kiln_kernel_args *args) {
    const kiln_tensor *y = args->out, *r;
    if (args->n_tail == 0 || args->tail[0].op != KILN_OP_ADD) return NULL;
    r = args->tail[0].operand;
    if (r == NULL || r->data == NULL || r->data == y->data || r->dtype != y->dtype ||
        r->rank != y->rank || memcmp(r->dims, y->dims, y->rank * sizeof(int64_t)) != 0) {
        return NULL;
    }
    return r->data;
}

static kiln_status gemm_bad(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                            const char *what) {
    if (ctx->plan_only) return KILN_ERR_UNSUPPORTED; // quietly: execute reports it if it recurs
    return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda %s: %s at %s", kiln_cuda_op_name(args->op),
                          what, ctx->where ? ctx->where : "?");
}

// --- small-M linear: a weight-streaming GEMV kernel (M <= GEMV_MAX_M rows)
// At M = 1..8 a linear is a pass over the weight: cuBLASLt's tiles leave most of each CTA idle
// and split K across a second reduction kernel. Here each warp owns GEMV_COLS output columns
// (weight rows), streams them with 16-byte loads (several in flight per lane), multiplies by the
// M input rows (16-byte __ldg: every warp of the block reads the same rows, so they stay in L1),
// reduces across the warp, and applies the epilogue in float32 before the one rounding: bias,
// then one of ReLU, GELU (erf or tanh form) or a residual add of the output's shape.
// float16/bfloat16, K a multiple of 8, 16-byte aligned x and w.
// Programmatic dependent launch (sm_90): the kernel is launched with programmatic stream
// serialization, so it may start while the previous kernel of the stream still runs; it touches
// no memory before griddepcontrol.wait (which returns once the previous grid has finished and
// its writes are visible), so arena reuse stays safe, and then lets the next kernel launch
// early. Back-to-back linears (the MLP at batch 1) overlap one's launch with the other's tail.
// (Prefetching the weight rows into L2 before the wait was measured on the H200 and removed:
// the MLP b1 took 29.3-30.7 us with it, 27.4-28.4 us without.) KILN_CUDA_NO_PDL=1 launches
// plainly.
// L2 plan (ctx->gemv_keep, per engine: kiln_cuda_plan_gemv_l2 in cuda_layout.h): the weight
// loads carry an L2 cache policy that keeps the first `keep` bytes of the weight (evict-last:
// they stay cached from one execute to the next) and streams the rest (evict-first: read once,
// it pushes out neither the kept bytes nor the activations). KILN_CUDA_NO_L2_HINTS=1: plain
// loads.

#define GEMV_MAX_M KILN_CUDA_GEMV_MAX_M
#define GEMV_WARPS 8
#define GEMV_COLS 2
#define GEMV_UNROLL 4

// (the same codes as Kiln's small-M wgmma linear's, cuda_wg.h)
enum {
    GEMV_EPI_NONE = KILN_CUDA_WG_EPI_NONE,
    GEMV_EPI_RELU = KILN_CUDA_WG_EPI_RELU,
    GEMV_EPI_GELU_ERF = KILN_CUDA_WG_EPI_GELU_ERF,
    GEMV_EPI_GELU_TANH = KILN_CUDA_WG_EPI_GELU_TANH,
    GEMV_EPI_RESIDUAL = KILN_CUDA_WG_EPI_RESIDUAL
};

// The L2 cache policy of a GEMV weight of `total` bytes at w whose first `keep` bytes are kept
// (evict-last) and the rest streamed (evict-first).
__device__ __forceinline__ uint64_t gemv_policy(const void *w, int64_t keep, int64_t total) {
    uint64_t cp;
    if (keep >= total) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(cp));
    } else if (keep <= 0 || total > 0xffffffffll) {
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(cp));
    } else {
        asm("createpolicy.range.global.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
            : "=l"(cp)
            : "l"(w), "r"((unsigned)keep), "r"((unsigned)total));
    }
    return cp;
}

// A weight vector: a plain non-coherent load, or with `hint` one with L2 cache policy cp.
__device__ __forceinline__ uint4 gemv_ldw(const uint4 *p, bool hint, uint64_t cp) {
    if (!hint) return __ldg(p);
    uint4 v;
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(cp));
    return v;
}

template <typename T> __device__ __forceinline__ void gemv_unpack(const uint4 &u, float *f) {
    const T *h = (const T *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = kc_to_f(h[i]);
}

// KS warps share a column group and split K among them (KS = 1: each warp its own columns;
// KS = GEMV_WARPS: the block's warps all work on GEMV_COLS columns, partial sums meet in shared
// memory), so that a narrow output (N = 1024 at K = 4096) still spreads over every SM.
template <typename T, int M, int KS>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ bias,
                const T *__restrict__ res, T *__restrict__ y, int64_t n, int64_t k, int epi,
                int64_t keep) {
    constexpr int GROUPS = GEMV_WARPS / KS; // column groups per block
    __shared__ float part[KS > 1 ? GEMV_WARPS * GEMV_COLS * M : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = warp / KS, ks = warp % KS;
    const int64_t col0 = ((int64_t)blockIdx.x * GROUPS + grp) * GEMV_COLS;
    if (KS == 1 && col0 >= n) return; // (split blocks stay whole for the barrier)
    const int64_t kv = k / 8;         // 16-byte vectors per row
    float acc[GEMV_COLS][M];
#pragma unroll
    for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
        for (int r = 0; r < M; r++) acc[c][r] = 0.0f;
    }
    const uint4 *wv[GEMV_COLS];
#pragma unroll
    for (int c = 0; c < GEMV_COLS; c++) {
        const int64_t col = col0 + c < n ? col0 + c : n - 1; // a clamped duplicate, not stored
        wv[c] = (const uint4 *)(w + col * k);
    }
    const uint4 *xv = (const uint4 *)x;
    const bool hint = keep >= 0; // the L2 plan (cuda_layout.h)
    const uint64_t cp = hint ? gemv_policy(w, keep, n * k * (int64_t)sizeof(T)) : 0;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    for (int64_t j0 = lane + 32 * ks; j0 < kv; j0 += 32 * KS * GEMV_UNROLL) {
        uint4 wb[GEMV_UNROLL][GEMV_COLS];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t j = j0 + 32 * KS * u;
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) {
                wb[u][c] = j < kv ? gemv_ldw(wv[c] + j, hint, cp) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t j = j0 + 32 * KS * u;
            if (j >= kv) break;
            float wf[GEMV_COLS][8];
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) gemv_unpack<T>(wb[u][c], wf[c]);
#pragma unroll
            for (int r = 0; r < M; r++) {
                float xf[8];
                gemv_unpack<T>(__ldg(xv + r * kv + j), xf);
#pragma unroll
                for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[c][r] = fmaf(wf[c][e], xf[e], acc[c][r]);
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
        for (int r = 0; r < M; r++) acc[c][r] = kc_warp_sum(acc[c][r]);
    }
    // thread `lane` = c * M + r of the group finishes column col0 + c of row r
    int mine = -1;
    float v = 0.0f;
    if (KS == 1) {
#pragma unroll
        for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (lane == c * M + r) v = acc[c][r];
            }
        }
        mine = lane < GEMV_COLS * M ? lane : -1;
    } else {
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) {
#pragma unroll
                for (int r = 0; r < M; r++) part[(warp * GEMV_COLS + c) * M + r] = acc[c][r];
            }
        }
        __syncthreads();
        if (ks == 0 && lane < GEMV_COLS * M) {
            for (int s = 0; s < KS; s++) v += part[((grp * KS + s) * GEMV_COLS) * M + lane];
            mine = lane;
        }
    }
    if (mine < 0) return;
    const int c = mine / M, r = mine % M;
    const int64_t col = col0 + c;
    if (col >= n) return;
    if (bias != NULL) v += kc_to_f(bias[col]);
    v = kc_linear_epilogue<T>(v, epi, res, r * n + col);
    y[r * n + col] = kc_from_f<T>(v);
}

// Launches gemv_kernel<T, M, KS> with programmatic stream serialization (see above).
template <typename T, int M, int KS>
static cudaError_t gemv_start(const kiln_cuda_ctx *ctx, unsigned blocks, const T *x, const T *w,
                              const T *b, const T *res, T *y, int64_t n, int64_t k, int epi,
                              int64_t keep) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(GEMV_WARPS * 32);
    cfg.stream = ctx->stream;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = (ctx->small_m & KILN_CUDA_SMALL_M_NO_PDL) ? 0 : 1;
    return cudaLaunchKernelEx(&cfg, gemv_kernel<T, M, KS>, x, w, b, res, y, n, k, epi, keep);
}

// The first tail op a small-M kernel fuses after the bias (GEMV_EPI_*), and its residual.
static void small_m_epilogue(const kiln_kernel_args *args, int *epi_out, const void **res_out) {
    *epi_out = GEMV_EPI_NONE;
    *res_out = NULL;
    if (args->n_tail > 0) {
        const kiln_tail_op *t = &args->tail[0];
        if (t->op == KILN_OP_RELU) {
            *epi_out = GEMV_EPI_RELU;
        } else if (t->op == KILN_OP_GELU) {
            *epi_out = kiln_attrs_int(&t->attrs, KILN_A_GELU_APPROXIMATE, 0) != 0
                           ? GEMV_EPI_GELU_TANH
                           : GEMV_EPI_GELU_ERF;
        } else if ((*res_out = tail_residual_first(args)) != NULL) {
            *epi_out = GEMV_EPI_RESIDUAL;
        }
    }
}

// The GEMV path for this linear, or 0 (then cuBLASLt / the tiled kernel). *epi_out: the fused
// first tail op (GEMV_EPI_*), *res_out its residual.
static int gemv_applies(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m,
                        int64_t n, int64_t k, int *epi_out, const void **res_out) {
    const kiln_tensor *x = args->in[0], *w = args->in[1];
    const kiln_tensor *bias = args->n_in > 2 ? args->in[2] : NULL;
    const kiln_tensor *y = args->out;
    if (ctx->small_m & KILN_CUDA_SMALL_M_NO_GEMV) return 0;
    if (m < 1 || m > GEMV_MAX_M || k < 8 || k % 8 != 0 || n < 1) return 0;
    if (y->dtype != KILN_DTYPE_F16 && y->dtype != KILN_DTYPE_BF16) return 0;
    if (x->dtype != y->dtype || w->dtype != y->dtype || (bias != NULL && bias->dtype != y->dtype))
        return 0;
    if (((uintptr_t)x->data % 16) != 0 || ((uintptr_t)w->data % 16) != 0) return 0;
    if ((uint64_t)n > (uint64_t)GEMV_COLS * 0x7fffffffu) return 0;
    small_m_epilogue(args, epi_out, res_out);
    return 1;
}

template <typename T>
static kiln_status gemv_launch_t(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m,
                                 int64_t n, int64_t k, int epi, const void *res) {
    const kiln_tensor *bias = args->n_in > 2 ? args->in[2] : NULL;
    const T *x = (const T *)args->in[0]->data, *w = (const T *)args->in[1]->data;
    const T *b = bias ? (const T *)bias->data : NULL;
    T *y = (T *)args->out->data;
    // one warp per column pair while that gives every SM a block; else the block's warps split K
    const int64_t whole = (n + GEMV_WARPS * GEMV_COLS - 1) / (GEMV_WARPS * GEMV_COLS);
    const bool split = whole < (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 132);
    const unsigned blocks = (unsigned)(split ? (n + GEMV_COLS - 1) / GEMV_COLS : whole);
    cudaError_t err = cudaSuccess;
    const int64_t keep = ctx->gemv_keep;
#define GEMV_CASE(MM)                                                                              \
    case MM:                                                                                       \
        err = split ? gemv_start<T, MM, GEMV_WARPS>(ctx, blocks, x, w, b, (const T *)res, y, n, k, \
                                                    epi, keep)                                     \
                    : gemv_start<T, MM, 1>(ctx, blocks, x, w, b, (const T *)res, y, n, k, epi,     \
                                           keep);                                                  \
        break
    switch (m) {
        GEMV_CASE(1);
        GEMV_CASE(2);
        GEMV_CASE(3);
        GEMV_CASE(4);
        GEMV_CASE(5);
        GEMV_CASE(6);
        GEMV_CASE(7);
    default: GEMV_CASE(8);
    }
#undef GEMV_CASE
    if (err != cudaSuccess) return kiln_cuda_error(ctx, "cudaLaunchKernelEx (gemv_kernel)", err);
    return kiln_cuda_check_launch(ctx, "gemv_kernel");
}

static kiln_status gemv_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m,
                               int64_t n, int64_t k, int epi, const void *res) {
    if (args->out->dtype == KILN_DTYPE_F16) {
        return gemv_launch_t<__half>(ctx, args, m, n, k, epi, res);
    }
    return gemv_launch_t<__nv_bfloat16>(ctx, args, m, n, k, epi, res);
}

// --- small-M linear on Hopper: Kiln's TMA + wgmma kernel (op_linear_wg.cu, cuda_wg.h)
// Offered for 8 < M <= KILN_CUDA_WG_MAX_M float16/bfloat16 linears on sm_90. At context creation
// (gemm_prepare) the layer is timed as it runs, inside a CUDA graph: cuBLASLt with its tuned
// algorithm and Kiln's tail kernel, against each configuration of Kiln's kernel (one wave of
// 64 x BN tiles, K split over a cluster of 1-8 CTAs) with the epilogue fused; the fastest runs
// the layer. Nothing is decided at execute: an undecided shape runs on cuBLASLt.

// Fills *p for this linear when Kiln's kernel can take it; 0 otherwise.
static int wg_applies(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m, int64_t n,
                      int64_t k, kiln_cuda_wg_problem *p) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *bias = opt_in(args, 2);
    const kiln_tensor *y = args->out;
    if (!(ctx->small_m & KILN_CUDA_SMALL_M_WG)) return 0;
    if (m < 1 || m > KILN_CUDA_WG_MAX_M || k < 64 || k % 8 != 0 || n < 1 || n > 0x7fffffff ||
        k > 0x7fffffff)
        return 0;
    if (y->dtype != KILN_DTYPE_F16 && y->dtype != KILN_DTYPE_BF16) return 0;
    if (x->dtype != y->dtype || w->dtype != y->dtype || (bias != NULL && bias->dtype != y->dtype))
        return 0;
    if (((uintptr_t)x->data % 16) != 0 || ((uintptr_t)w->data % 16) != 0 ||
        ((uintptr_t)y->data % 8) != 0)
        return 0;
    memset(p, 0, sizeof *p);
    p->dtype = y->dtype;
    p->m = m;
    p->n = n;
    p->k = k;
    p->x = x->data;
    p->w = w->data;
    p->bias = bias != NULL ? bias->data : NULL;
    p->y = y->data;
    p->keep = ctx->gemv_keep; // the engine's L2 plan (-1: none, or KILN_CUDA_NO_L2_HINTS)
    small_m_epilogue(args, &p->epi, &p->res);
    if (p->res != NULL && ((uintptr_t)p->res % 8) != 0) {
        p->epi = KILN_CUDA_WG_EPI_NONE; // the residual then runs in the tail kernel
        p->res = NULL;
    }
    return 1;
}

static void wg_key(const kiln_cuda_wg_problem *p, int64_t *key) {
    key[0] = p->m;
    key[1] = p->n;
    key[2] = p->k;
    key[3] = p->dtype;
    key[4] = p->epi | (p->bias != NULL ? 0x100 : 0);
}

// Enqueues the layer on Kiln's kernel with cfg, then the tail ops it did not fuse.
static kiln_status wg_layer(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                            const kiln_cuda_wg_problem *p, kiln_cuda_wg_cfg cfg,
                            kiln_cuda_wg_maps_t *maps) {
    if (!kiln_cuda_wg_maps(maps, p, cfg)) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "cuda linear: the driver refused a tensor map (m=%lld n=%lld "
                              "k=%lld) at %s; set KILN_CUDA_NO_WG=1 to run it on cuBLASLt",
                              (long long)p->m, (long long)p->n, (long long)p->k,
                              ctx->where ? ctx->where : "?");
    }
    const int pdl = !(ctx->small_m & KILN_CUDA_SMALL_M_NO_PDL);
    cudaError_t err = kiln_cuda_wg_launch(ctx->stream, maps, p, cfg, pdl);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "CUDA error in cudaLaunchKernelEx (wg_linear_kernel, configuration "
                              "%dx%d/%d) at %s: %s (%s); set KILN_CUDA_NO_WG=1 to run the small-M "
                              "linears on cuBLASLt",
                              cfg.bn, cfg.split, cfg.occ, ctx->where ? ctx->where : "?",
                              cudaGetErrorName(err), cudaGetErrorString(err));
    }
    return kiln_cuda_tail(ctx, args, p->epi != KILN_CUDA_WG_EPI_NONE ? 1 : 0);
}

typedef struct wg_timed {
    kiln_cuda_ctx run; // the layer's context, executing
    const kiln_kernel_args *args;
    const kiln_cuda_wg_problem *p;
    int own; // 1: Kiln's kernel with cfg; 0: the layer as cuBLASLt runs it
    kiln_cuda_wg_cfg cfg;
} wg_timed;

static int wg_timed_enqueue(void *arg) {
    wg_timed *t = (wg_timed *)arg;
    if (t->own) return wg_layer(&t->run, t->args, t->p, t->cfg, &t->run.gemm->wg_maps) == KILN_OK;
    return kiln_cuda_linear(&t->run, t->args) == KILN_OK;
}

// How much faster than cuBLASLt (with its tail kernel) the wgmma kernel must time to take a layer.
#define WG_MARGIN 0.95f

// Context creation: decides between cuBLASLt (already set up) and Kiln's kernel for this shape,
// and keeps the fastest configuration and its time over cuBLASLt's for the whole-engine choice.
static void wg_pick(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args,
                    const kiln_cuda_wg_problem *p) {
    kiln_cuda_gemm_cache *c = ctx->gemm;
    int64_t key[5];
    kiln_cuda_wg_cfg cfgs[16];
    char line[512];
    wg_key(p, key);
    if (c->wg != 0 && memcmp(c->wg_key, key, sizeof key) == 0) return; // decided
    const int ncfg = kiln_cuda_wg_configs(p->m, p->n, p->k, ctx->sm_count, cfgs, 16);
    memcpy(c->wg_key, key, sizeof key);
    c->wg = -1;
    c->wg_alt_ratio = 0.0f;
    // KILN_CUDA_GEMM_TUNE=0 (profiling): nothing timed, so cuBLASLt's heuristic choice, as for
    // every other GEMM (KILN_CUDA_WG_CFG runs the small-M kernel untimed)
    if (ncfg == 0 || !lt_tune_enabled()) return;
    wg_timed t;
    memset(&t, 0, sizeof t);
    t.run = *ctx;
    t.run.plan_only = 0;
    t.args = args;
    t.p = p;
    const float lt_us =
        c->valid && c->use_lt ? kiln_cuda_time_in_graph(ctx->stream, wg_timed_enqueue, &t) : -1.0f;
    float best_us = -1.0f; // the fastest wgmma configuration's
    int best = -1, used = 0;
    used = snprintf(line, sizeof line, "linear m=%lld n=%lld k=%lld at %s: cuBLASLt %.2f us",
                    (long long)p->m, (long long)p->n, (long long)p->k,
                    ctx->where ? ctx->where : "?", (double)lt_us);
    t.own = 1;
    for (int i = 0; i < ncfg; i++) {
        t.cfg = cfgs[i];
        const float us = kiln_cuda_time_in_graph(ctx->stream, wg_timed_enqueue, &t);
        if (used > 0 && (size_t)used < sizeof line) {
            used += snprintf(line + used, sizeof line - (size_t)used, ", %dx%d/%d %.2f", cfgs[i].bn,
                             cfgs[i].split, cfgs[i].occ, (double)us);
        }
        if (us >= 0.0f && (best < 0 || us < best_us)) {
            best = i;
            best_us = us;
        }
    }
    if (best >= 0 && lt_us > 0.0f) { // for the choice on the whole engine (cuda_backend.c)
        c->wg_alt = cfgs[best];
        c->wg_alt_ratio = best_us / lt_us;
    }
    // Each candidate is timed alone, its weight hot in L2 from the repeats; in the engine the
    // weight may come from HBM and the L2 plan changes with the choice. A win within the margin
    // does not carry over: the MLP b64's first layer at 5.41 against cuBLASLt's 5.59 us (3%)
    // made the model 2 us slower through ExecuTorch (35.4 against 33.1-33.5 us, round 18).
    const int in_margin =
        best >= 0 && lt_us >= 0.0f && best_us > WG_MARGIN * lt_us && best_us < lt_us;
    if (best >= 0 && lt_us >= 0.0f && best_us > WG_MARGIN * lt_us) best = -1;
    if (best >= 0) {
        c->wg = 1;
        c->wg_cfg = cfgs[best];
    }
    kiln_cuda_log(KILN_LOG_INFO, "%s: %s", line,
                  best >= 0   ? "Kiln's wgmma kernel"
                  : in_margin ? "cuBLASLt (the wgmma kernel's lead is under 5%)"
                              : "cuBLASLt");
}

// --- K split over a strided-batched cuBLASLt GEMM
// A linear whose output has few tiles for its K (BERT-base b1's FFN 2: 128 x 768 outputs over K
// 3072, six 128 x 128 tiles for 132 SMs) leaves most SMs idle in cuBLASLt's kernel. Here it runs
// as one strided-batched GEMM over S slices of K (batch i: x[:, i K/S ..] w[:, i K/S ..]^T; the
// batch count multiplies the tiles) writing float32 partial sums into the tail of the context's
// cuBLASLt workspace (the GEMM is given the rest), then one kernel adds the S partial sums, the
// bias and the first tail op (ReLU, GELU erf or tanh, or a residual) in float32 and rounds once.
// Chosen per layer at context creation by timing inside a CUDA graph, the plain GEMM with its
// tail against each S, where it may pay: float16/bfloat16, M > 64 (smaller M is the GEMV's and
// the wgmma kernel's, whose K split needs no second kernel; the MLP b64 lost 1.5-2 us with every
// eligible layer split, round 17), at most 16 output tiles of 128 x 128, K >= 1024.

#define SK_MAX_PART ((size_t)16 << 20) // float32 partial sums at most (bytes)
#define SK_TIMING 0x100                // kiln_cuda_ctx.splitk: a split being timed (not logged)

// 1 when the K split can run this linear with S slices (dtypes, alignment, divisibility, room in
// the workspace).
static int sk_fits(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m, int64_t n,
                   int64_t k, int s) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *bias = opt_in(args, 2);
    const kiln_tensor *y = args->out;
    const size_t part = (size_t)s * (size_t)m * (size_t)n * 4u;
    if ((s != 2 && s != 4 && s != 8) || ctx->lt == NULL || ctx->workspace == NULL) return 0;
    if (y->dtype != KILN_DTYPE_F16 && y->dtype != KILN_DTYPE_BF16) return 0;
    if (x->dtype != y->dtype || w->dtype != y->dtype || (bias != NULL && bias->dtype != y->dtype))
        return 0;
    if (m < 1 || n % 4 != 0 || k % (8 * s) != 0 || k / s < 64) return 0;
    if (((uintptr_t)x->data % 16) != 0 || ((uintptr_t)w->data % 16) != 0 ||
        ((uintptr_t)y->data % 8) != 0)
        return 0;
    return part <= SK_MAX_PART && part <= ctx->workspace_nbytes / 2;
}

// 1 when timing the K split against the plain GEMM is worth it for this linear (see above).
static int sk_worth(const kiln_cuda_ctx *ctx, int64_t m, int64_t n, int64_t k) {
    if (ctx->splitk < 0 || ctx->gemm == NULL) return 0;
    return m > 64 && k >= 1024 && ((m + 127) / 128) * ((n + 127) / 128) <= 16;
}

template <typename T, int SK>
static __global__ void __launch_bounds__(256)
    sk_reduce_kernel(const float4 *__restrict__ part, int64_t m, int64_t n,
                     const T *__restrict__ bias, int epi, const T *__restrict__ res,
                     T *__restrict__ y) {
    const int64_t plane = m * n / 4;
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= plane) return;
    float4 p[SK];
#pragma unroll
    for (int s = 0; s < SK; s++) p[s] = __ldcs(&part[s * plane + i]); // all loads in flight
    float o[4] = {p[0].x, p[0].y, p[0].z, p[0].w};
#pragma unroll
    for (int s = 1; s < SK; s++) {
        o[0] += p[s].x;
        o[1] += p[s].y;
        o[2] += p[s].z;
        o[3] += p[s].w;
    }
    const int64_t at = i * 4, col = at % n;
    T out[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float v = o[j] + (bias != NULL ? kc_to_f(bias[col + j]) : 0.0f);
        out[j] = kc_from_f<T>(kc_linear_epilogue<T>(v, epi, res, at + j));
    }
    *(uint2 *)&y[at] = *(const uint2 *)out;
}

template <typename T>
static void sk_reduce_t(cudaStream_t st, const float *part, int s, int64_t m, int64_t n,
                        const void *bias, int epi, const void *res, void *y) {
    const unsigned blocks = (unsigned)((m * n / 4 + 255) / 256);
    const float4 *p = (const float4 *)part;
    const T *b = (const T *)bias, *r = (const T *)res;
    if (s == 2) sk_reduce_kernel<T, 2><<<blocks, 256, 0, st>>>(p, m, n, b, epi, r, (T *)y);
    if (s == 4) sk_reduce_kernel<T, 4><<<blocks, 256, 0, st>>>(p, m, n, b, epi, r, (T *)y);
    if (s == 8) sk_reduce_kernel<T, 8><<<blocks, 256, 0, st>>>(p, m, n, b, epi, r, (T *)y);
}

// Enqueues (or, at context creation, sets up and times the algorithms of) the linear with K split
// over s slices, then its tail ops. *done = 0: cuBLASLt has no algorithm (the caller runs it
// plainly).
static kiln_status sk_run(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m,
                          int64_t n, int64_t k, int s, int *done) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *bias = opt_in(args, 2);
    kiln_tensor *y = args->out;
    kiln_cuda_ctx sctx = *ctx;
    const size_t part = ((size_t)s * (size_t)m * (size_t)n * 4u + 255u) & ~(size_t)255u;
    *done = 0;
    // the GEMM's own workspace is what the partial sums leave free
    sctx.workspace_nbytes = (ctx->workspace_nbytes - part) & ~(size_t)255u;
    if (ctx->gemm != NULL) {
        if (ctx->gemm->split == NULL) {
            if (!ctx->plan_only) return KILN_OK; // never set up: run it plainly
            ctx->gemm->split = (kiln_cuda_gemm_cache *)kiln_cuda_calloc(sizeof *ctx->gemm->split);
            if (ctx->gemm->split == NULL) return KILN_OK;
        }
        sctx.gemm = ctx->gemm->split;
    } else {
        sctx.gemm = NULL; // (run_op) lt_run sets up on every call
    }
    lt_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = y->dtype;
    p.d_dtype = KILN_DTYPE_F32;
    p.trans_a = 1; // D^T[n x m] = W (stored k x n, transposed) * X^T, per slice of K
    p.m = n;
    p.n = m;
    p.k = k / s;
    p.lda = k;
    p.ldb = k;
    p.ldd = n;
    p.batch = s;
    p.stride_a = k / s;
    p.stride_b = k / s;
    p.stride_d = m * n;
    p.a = w->data;
    p.b = x->data;
    p.d = (char *)ctx->workspace + sctx.workspace_nbytes;
    KILN_CUDA_TRY(lt_run(&sctx, &p, done));
    if (!*done || ctx->plan_only) return KILN_OK;
    int epi = 0;
    const void *res = NULL;
    small_m_epilogue(args, &epi, &res);
    if (y->dtype == KILN_DTYPE_F16) {
        sk_reduce_t<__half>(ctx->stream, (const float *)p.d, s, m, n, bias ? bias->data : NULL, epi,
                            res, y->data);
    } else {
        sk_reduce_t<__nv_bfloat16>(ctx->stream, (const float *)p.d, s, m, n,
                                   bias ? bias->data : NULL, epi, res, y->data);
    }
    KILN_CUDA_TRY(kiln_cuda_check_launch(ctx, "sk_reduce_kernel"));
    return kiln_cuda_tail(ctx, args, epi != GEMV_EPI_NONE ? 1 : 0);
}

static void sk_key(int64_t m, int64_t n, int64_t k, const kiln_kernel_args *args, int64_t *key) {
    int epi = 0;
    const void *res = NULL;
    small_m_epilogue(args, &epi, &res);
    key[0] = m;
    key[1] = n;
    key[2] = k;
    key[3] = args->out->dtype;
    key[4] = epi | (opt_in(args, 2) != NULL ? 0x100 : 0);
}

typedef struct sk_timed {
    kiln_cuda_ctx run; // the layer's context, executing
    const kiln_kernel_args *args;
} sk_timed;

static int sk_timed_enqueue(void *arg) {
    sk_timed *t = (sk_timed *)arg;
    return kiln_cuda_linear(&t->run, t->args) == KILN_OK;
}

// Context creation: decides between the plain GEMM (already set up) and a K split for this shape
// (ctx->gemm->sk), timing each the way the engine runs it.
static void sk_pick(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m, int64_t n,
                    int64_t k) {
    kiln_cuda_gemm_cache *c = ctx->gemm;
    int64_t key[5];
    char line[512];
    sk_key(m, n, k, args, key);
    if (c->sk != 0 && memcmp(c->sk_key, key, sizeof key) == 0) return; // decided
    memcpy(c->sk_key, key, sizeof key);
    c->sk = 1;
    if (!lt_tune_enabled() || !c->valid || !c->use_lt) return;
    sk_timed t;
    t.run = *ctx;
    t.run.plan_only = 0;
    t.run.splitk = -1; // the plain GEMM and its tail
    t.args = args;
    const float plain_us = kiln_cuda_time_in_graph(ctx->stream, sk_timed_enqueue, &t);
    float best_us = plain_us;
    int best = 1, used = 0;
    used = snprintf(line, sizeof line, "linear m=%lld n=%lld k=%lld at %s: cuBLASLt %.2f us",
                    (long long)m, (long long)n, (long long)k, ctx->where ? ctx->where : "?",
                    (double)plain_us);
    static const int splits[3] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        const int s = splits[i];
        int done = 0;
        if (!sk_fits(ctx, args, m, n, k, s)) continue;
        kiln_cuda_ctx plan = *ctx;
        if (sk_run(&plan, args, m, n, k, s, &done) != KILN_OK || !done) continue;
        t.run.splitk = s | SK_TIMING;
        const float us = kiln_cuda_time_in_graph(ctx->stream, sk_timed_enqueue, &t);
        if (used > 0 && (size_t)used < sizeof line) {
            used += snprintf(line + used, sizeof line - (size_t)used, ", K split %d %.2f", s,
                             (double)us);
        }
        if (us >= 0.0f && (plain_us < 0.0f || us < best_us)) {
            best = s;
            best_us = us;
        }
    }
    if (best > 1) { // set up again for the pick (the last one timed may be another split)
        int done = 0;
        kiln_cuda_ctx plan = *ctx;
        if (sk_run(&plan, args, m, n, k, best, &done) != KILN_OK || !done) best = 1;
    }
    c->sk = best;
    cudaGetLastError();
    if (best > 1) {
        kiln_cuda_log(KILN_LOG_INFO, "%s: K split %d", line, best);
    } else {
        kiln_cuda_log(KILN_LOG_INFO, "%s: cuBLASLt", line);
    }
}

// The K split this execute runs (0: none): forced (ctx->splitk > 0, where it fits; with
// SK_TIMING, sk_pick's timed runs), or decided at context creation for this shape.
static int sk_now(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int64_t m, int64_t n,
                  int64_t k) {
    if (ctx->splitk > 0) {
        const int s = ctx->splitk & ~SK_TIMING;
        return sk_fits(ctx, args, m, n, k, s) ? s : 0;
    }
    if (ctx->splitk < 0 || ctx->gemm == NULL || ctx->gemm->sk <= 1) return 0;
    int64_t key[5];
    sk_key(m, n, k, args, key);
    if (memcmp(ctx->gemm->sk_key, key, sizeof key) != 0) return 0;
    // (the pointers bound now, e.g. a caller's device output, must suit it too)
    return sk_fits(ctx, args, m, n, k, ctx->gemm->sk) ? ctx->gemm->sk : 0;
}

extern "C" void kiln_cuda_gemm_cache_release(kiln_cuda_gemm_cache *c) {
    if (c == NULL || c->split == NULL) return;
    kiln_cuda_free(c->split, sizeof *c->split);
    c->split = NULL;
}

// --- entry points

extern "C" kiln_status kiln_cuda_linear(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *x = args->in[0], *w = args->in[1], *bias = opt_in(args, 2);
    kiln_tensor *y = args->out;
    if (x == NULL || w == NULL || w->rank != 2 || !kiln_cuda_is_float(x->dtype) ||
        !kiln_cuda_is_float(w->dtype) || !kiln_cuda_is_float(y->dtype) ||
        (bias != NULL && !kiln_cuda_is_float(bias->dtype))) {
        return gemm_bad(ctx, args, "needs float operands and a 2-D weight");
    }
    int64_t k = x->rank > 0 ? x->dims[x->rank - 1] : 1;
    int64_t n = y->rank > 0 ? y->dims[y->rank - 1] : 1;
    int64_t m = 1;
    for (uint32_t i = 0; i + 1 < y->rank; i++) m *= y->dims[i];
    if (w->dims[0] != n || w->dims[1] != k || (bias != NULL && kc_numel(bias) != n)) {
        return gemm_bad(ctx, args, "weight or bias shape does not match");
    }
    if (m == 0 || n == 0) return KILN_OK;
    uint32_t skip = 0;
    int done = 0, epi = 0;
    const void *res = NULL;
    if (gemv_applies(ctx, args, m, n, k, &epi, &res)) {
        if (ctx->plan_only) return KILN_OK;
        KILN_CUDA_TRY(gemv_launch(ctx, args, m, n, k, epi, res));
        return kiln_cuda_tail(ctx, args, epi != GEMV_EPI_NONE ? 1 : 0);
    }
    kiln_cuda_wg_problem wp;
    const int wg = wg_applies(ctx, args, m, n, k, &wp);
    if (wg && ctx->wg_force.bn > 0) { // run_op: a test's configuration
        if (ctx->plan_only) return KILN_OK;
        kiln_cuda_wg_maps_t maps;
        memset(&maps, 0, sizeof maps);
        kiln_cuda_log(KILN_LOG_INFO, "linear at %s: Kiln's wgmma kernel %dx%d/%d (forced)",
                      ctx->where ? ctx->where : "?", ctx->wg_force.bn, ctx->wg_force.split,
                      ctx->wg_force.occ);
        return wg_layer(ctx, args, &wp, ctx->wg_force, &maps);
    }
    if (wg && !ctx->plan_only && ctx->gemm != NULL && ctx->gemm->wg == 1) {
        int64_t key[5];
        wg_key(&wp, key);
        if (memcmp(ctx->gemm->wg_key, key, sizeof key) == 0)
            return wg_layer(ctx, args, &wp, ctx->gemm->wg_cfg, &ctx->gemm->wg_maps);
    }
    int same =
        x->dtype == w->dtype && x->dtype == y->dtype && (bias == NULL || bias->dtype == y->dtype);
    const int sk = ctx->plan_only ? 0 : sk_now(ctx, args, m, n, k);
    if (sk > 1) {
        if (ctx->splitk > 0 && !(ctx->splitk & SK_TIMING)) {
            kiln_cuda_log(KILN_LOG_INFO, "linear at %s: K split %d (forced)",
                          ctx->where ? ctx->where : "?", sk);
        }
        KILN_CUDA_TRY(sk_run(ctx, args, m, n, k, sk, &done));
        if (done) return KILN_OK;
    }
    if (same && k > 0) {
        // D^T[n x m] = W (stored k x n, transposed) * X^T (stored k x m)
        lt_problem p;
        memset(&p, 0, sizeof p);
        p.dtype = y->dtype;
        p.trans_a = 1;
        p.m = n;
        p.n = m;
        p.k = k;
        p.lda = k;
        p.ldb = k;
        p.ldd = n;
        p.batch = 1;
        p.a = w->data;
        p.b = x->data;
        p.bias = bias ? bias->data : NULL;
        p.d = y->data;
        p.relu = tail_relu_first(args);
        p.gelu = tail_gelu_tanh_first(args);
        p.c = p.relu || p.gelu ? NULL : tail_residual_first(args);
        KILN_CUDA_TRY(lt_run(ctx, &p, &done));
        if (done && (p.relu || p.gelu || p.c != NULL)) skip = 1;
    }
    if (ctx->plan_only) {
        // a forced split (KILN_CUDA_SPLITK) is set up here; else timed where it may pay
        if (ctx->splitk > 0 && sk_fits(ctx, args, m, n, k, ctx->splitk)) {
            int sk_done = 0;
            KILN_CUDA_TRY(sk_run(ctx, args, m, n, k, ctx->splitk, &sk_done));
        } else if (done && sk_worth(ctx, m, n, k)) {
            sk_pick(ctx, args, m, n, k);
        }
        // (a forced split leaves every layer it takes on it: no small-M kernel timed)
        if (wg && ctx->gemm != NULL && ctx->splitk <= 0) wg_pick(ctx, args, &wp);
        return KILN_OK;
    }
    if (!done) {
        gemm_view v;
        memset(&v, 0, sizeof v);
        v.a = x->data;
        v.a_dt = x->dtype;
        v.a_rs = k;
        v.a_cs = 1;
        v.b = w->data; // B(k, j) = w[j][k]
        v.b_dt = w->dtype;
        v.b_rs = 1;
        v.b_cs = k;
        v.bias = bias ? bias->data : NULL;
        v.bias_dt = bias ? bias->dtype : 0;
        v.c = y->data;
        v.c_dt = y->dtype;
        v.m = m;
        v.n = n;
        KILN_CUDA_TRY(gemm_fallback(ctx, &v, k, 1));
    }
    return kiln_cuda_tail(ctx, args, skip);
}

extern "C" kiln_status kiln_cuda_matmul(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *a = args->in[0], *b = args->in[1];
    kiln_tensor *y = args->out;
    if (a == NULL || b == NULL || a->rank < 1 || b->rank < 1 || !kiln_cuda_is_float(a->dtype) ||
        !kiln_cuda_is_float(b->dtype) || !kiln_cuda_is_float(y->dtype)) {
        return gemm_bad(ctx, args, "needs float operands of rank >= 1");
    }
    int ar = (int)a->rank, br = (int)b->rank;
    int64_t k = a->dims[ar - 1];
    int64_t m = ar >= 2 ? a->dims[ar - 2] : 1;
    int64_t n = br >= 2 ? b->dims[br - 1] : 1;
    if (b->dims[br >= 2 ? br - 2 : 0] != k) return gemm_bad(ctx, args, "inner dims differ");
    gemm_view v;
    memset(&v, 0, sizeof v);
    int nab = ar >= 2 ? ar - 2 : 0, nbb = br >= 2 ? br - 2 : 0;
    int64_t as[KC_MAX_RANK], bs[KC_MAX_RANK];
    kc_strides(a, as);
    kc_strides(b, bs);
    v.nb = nab > nbb ? nab : nbb;
    int64_t batch = 1, a_batch = 1, b_batch = 1;
    for (int d = 0; d < v.nb; d++) {
        int ia = d - (v.nb - nab), ib = d - (v.nb - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        v.bdims[d] = da > db ? da : db;
        if (da == 0 || db == 0) v.bdims[d] = 0;
        v.a_bstr[d] = (ia >= 0 && da != 1) ? as[ia] : 0;
        v.b_bstr[d] = (ib >= 0 && db != 1) ? bs[ib] : 0;
        batch *= v.bdims[d];
        a_batch *= da;
        b_batch *= db;
    }
    if (kc_numel(y) != batch * m * n) return gemm_bad(ctx, args, "output size does not match");
    if (batch * m * n == 0) return ctx->plan_only ? KILN_OK : kiln_cuda_tail(ctx, args, 0);
    int same = a->dtype == b->dtype && a->dtype == y->dtype;
    int fold = b_batch == 1;                         // one b: fold a's batch into m
    int full = a_batch == batch && b_batch == batch; // no broadcasting
    int64_t b_rs = br >= 2 ? n : 1;
    uint32_t skip = 0;
    int done = 0;
    if (same && k > 0 && (fold || full)) {
        // D^T[n x m] = B^T (b row-major k x n = column-major n x k, ld b_rs) * A^T (k x m, ld k)
        lt_problem p;
        memset(&p, 0, sizeof p);
        p.dtype = y->dtype;
        p.trans_a = 0;
        p.m = n;
        p.n = fold ? m * batch : m;
        p.k = k;
        p.lda = b_rs;
        p.ldb = k;
        p.ldd = n;
        p.batch = fold ? 1 : batch;
        p.stride_a = k * n;
        p.stride_b = m * k;
        p.stride_d = m * n;
        p.a = b->data;
        p.b = a->data;
        p.d = y->data;
        p.relu = tail_relu_first(args);
        p.c = p.relu ? NULL : tail_residual_first(args);
        KILN_CUDA_TRY(lt_run(ctx, &p, &done));
        if (done && (p.relu || p.c != NULL)) skip = 1;
    }
    if (ctx->plan_only) return KILN_OK;
    if (!done) {
        v.a = a->data;
        v.a_dt = a->dtype;
        v.a_rs = k;
        v.a_cs = 1;
        v.b = b->data;
        v.b_dt = b->dtype;
        v.b_rs = b_rs;
        v.b_cs = 1;
        v.c = y->data;
        v.c_dt = y->dtype;
        v.m = m;
        v.n = n;
        KILN_CUDA_TRY(gemm_fallback(ctx, &v, k, batch));
    }
    return kiln_cuda_tail(ctx, args, skip);
}

extern "C" kiln_status kiln_cuda_gemm_prepare(const kiln_cuda_ctx *ctx,
                                              const kiln_kernel_args *args) {
    kiln_cuda_ctx plan = *ctx;
    plan.plan_only = 1;
    if (args->op == KILN_OP_LINEAR) return kiln_cuda_linear(&plan, args);
    if (args->op == KILN_OP_MATMUL) return kiln_cuda_matmul(&plan, args);
    if (args->op == KILN_OP_CONV2D) return kiln_cuda_conv2d(&plan, args);
    if (args->op == KILN_OP_SDPA) return kiln_cuda_sdpa(&plan, args);
    return KILN_OK;
}
