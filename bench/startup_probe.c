// SPDX-License-Identifier: Apache-2.0
// What a fresh process pays for the pieces of an engine's start-up on the GPU, each alone
// (docs/benchmarks.md, "Start-up"): cuBLASLt's first heuristic query per type pair against an
// algorithm rebuilt from its configuration attributes and checked, cuDNN's handle, the weight
// upload from pageable memory in the forms Kiln could use, and SHA-256 through libcrypto. Each
// mode runs in its own process (the first call of a library is what is measured).
//
//   gcc -O2 -std=c11 -I/usr/local/cuda/include bench/startup_probe.c -L/usr/local/cuda/lib64
//       -lcudart -lcublasLt -ldl -lpthread -o .dev/probe/startup_probe      (one line)
//   startup_probe lt-heur CFG   # heuristic queries (fp16, then the fp16->fp32 batched pair);
//                               # writes the chosen configurations to CFG
//   startup_probe lt-init CFG   # the same algorithms from CFG: AlgoInit + attributes + AlgoCheck
//   startup_probe upload MB     # MB of weights in 1 MiB tensors, four ways
//   startup_probe sha MB        # SHA-256 of MB on 1 and 8 threads
//   startup_probe dnn           # cudnnCreate
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        int rc_ = (int)(x);                                                                        \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, rc_);                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// --- cuBLASLt

typedef struct problem {
    cudaDataType_t ab, cd;
    int m, n, k, batch;
} problem;

static const problem problems[2] = {
    {CUDA_R_16F, CUDA_R_16F, 768, 128, 768, 1}, // a BERT linear
    {CUDA_R_16F, CUDA_R_32F, 768, 128, 768, 4}, // its K split: fp16 in, fp32 out, batched
};

static const cublasLtMatmulAlgoConfigAttributes_t cfg_attrs[] = {
    CUBLASLT_ALGO_CONFIG_TILE_ID,        CUBLASLT_ALGO_CONFIG_STAGES_ID,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM,     CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
    CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,  CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
    CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
};
#define N_CFG (int)(sizeof cfg_attrs / sizeof cfg_attrs[0])

typedef struct lt_state {
    cublasLtMatmulDescOpaque_t d;
    cublasLtMatrixLayoutOpaque_t a, b, c;
} lt_state;

static void lt_describe(const problem *p, lt_state *s) {
    const cublasOperation_t tr = CUBLAS_OP_T;
    CK(cublasLtMatmulDescInit(&s->d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(&s->d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
    CK(cublasLtMatrixLayoutInit(&s->a, p->ab, p->k, p->m, p->k));
    CK(cublasLtMatrixLayoutInit(&s->b, p->ab, p->k, p->n, p->k));
    CK(cublasLtMatrixLayoutInit(&s->c, p->cd, p->m, p->n, p->m));
    if (p->batch > 1) {
        int32_t b = p->batch;
        int64_t st[3] = {(int64_t)p->m * p->k, (int64_t)p->k * p->n, (int64_t)p->m * p->n};
        cublasLtMatrixLayoutOpaque_t *ls[3] = {&s->a, &s->b, &s->c};
        for (int i = 0; i < 3; i++) {
            CK(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b,
                                                sizeof b));
            CK(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &st[i], sizeof st[i]));
        }
    }
}

static double lt_run(cublasLtHandle_t h, const problem *p, lt_state *s,
                     const cublasLtMatmulAlgo_t *algo) {
    void *a, *b, *c;
    const float one = 1, zero = 0;
    size_t es = p->cd == CUDA_R_32F ? 4 : 2;
    CK(cudaMalloc(&a, (size_t)p->m * p->k * 2 * p->batch));
    CK(cudaMalloc(&b, (size_t)p->k * p->n * 2 * p->batch));
    CK(cudaMalloc(&c, (size_t)p->m * p->n * es * p->batch));
    CK(cudaDeviceSynchronize());
    double t0 = now_ms();
    CK(cublasLtMatmul(h, &s->d, &one, a, &s->a, b, &s->b, &zero, c, &s->c, c, &s->c, algo, NULL, 0,
                      0));
    CK(cudaDeviceSynchronize());
    double t = now_ms() - t0;
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return t;
}

static int lt_probe(int from_cfg, const char *path) {
    cublasLtHandle_t h;
    double t0 = now_ms();
    CK(cublasLtCreate(&h));
    printf("cublasLtCreate %.2f ms\n", now_ms() - t0);
    FILE *f = fopen(path, from_cfg ? "r" : "w");
    if (f == NULL) return 1;
    for (int i = 0; i < 2; i++) {
        const problem *p = &problems[i];
        lt_state s;
        cublasLtMatmulAlgo_t algo;
        lt_describe(p, &s);
        t0 = now_ms();
        if (!from_cfg) {
            cublasLtMatmulPreferenceOpaque_t pref;
            cublasLtMatmulHeuristicResult_t r[8];
            int found = 0;
            CK(cublasLtMatmulPreferenceInit(&pref));
            CK(cublasLtMatmulAlgoGetHeuristic(h, &s.d, &s.a, &s.b, &s.c, &s.c, &pref, 8, r,
                                              &found));
            if (found == 0) return 1;
            algo = r[0].algo;
            printf("problem %d: heuristic %.2f ms (%d found)\n", i, now_ms() - t0, found);
            int32_t id = 0;
            CK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                                    NULL));
            fprintf(f, "%d", id);
            for (int a = 0; a < N_CFG; a++) {
                uint64_t v = 0; // every attribute fits: read it at its own size
                size_t got = 0;
                if (cublasLtMatmulAlgoConfigGetAttribute(&algo, cfg_attrs[a], &v, sizeof v, &got) !=
                    CUBLAS_STATUS_SUCCESS) {
                    (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, cfg_attrs[a], NULL, 0, &got);
                    v = 0;
                    if (got == 0 || got > sizeof v ||
                        cublasLtMatmulAlgoConfigGetAttribute(&algo, cfg_attrs[a], &v, got, &got) !=
                            CUBLAS_STATUS_SUCCESS) {
                        got = 0; // not readable: not restored
                    }
                }
                fprintf(f, " %zu:%llu", got, (unsigned long long)v);
            }
            fprintf(f, "\n");
        } else {
            int id;
            if (fscanf(f, "%d", &id) != 1) return 1;
            CK(cublasLtMatmulAlgoInit(h, CUBLAS_COMPUTE_32F, CUDA_R_32F, p->ab, p->ab, p->cd, p->cd,
                                      id, &algo));
            double t_init = now_ms() - t0;
            for (int a = 0; a < N_CFG; a++) {
                size_t got;
                unsigned long long v;
                if (fscanf(f, " %zu:%llu", &got, &v) != 2) return 1;
                uint64_t v64 = v;
                if (got != 0)
                    CK(cublasLtMatmulAlgoConfigSetAttribute(&algo, cfg_attrs[a], &v64, got));
            }
            cublasLtMatmulHeuristicResult_t r;
            t0 = now_ms();
            cublasStatus_t cs = getenv("NOCHECK") ? CUBLAS_STATUS_SUCCESS
                                                  : cublasLtMatmulAlgoCheck(h, &s.d, &s.a, &s.b,
                                                                            &s.c, &s.c, &algo, &r);
            printf("problem %d: AlgoInit %.2f ms, AlgoCheck %.2f ms (status %d)\n", i, t_init,
                   now_ms() - t0, (int)cs);
        }
        printf("problem %d: first matmul %.2f ms, second %.3f ms\n", i, lt_run(h, p, &s, &algo),
               lt_run(h, p, &s, &algo));
    }
    fclose(f);
    cublasLtDestroy(h);
    return 0;
}

// --- upload

static int upload_probe(int mb) {
    const size_t piece = (size_t)1 << 20, total = (size_t)mb << 20;
    uint8_t *host = malloc(total);
    if (host == NULL) return 1;
    for (size_t i = 0; i < total; i++) host[i] = (uint8_t)(i * 2654435761u >> 13);
    CK(cudaFree(0));
    void *dev;
    double t0;
    // (a) a cudaMalloc and a cudaMemcpy per tensor
    void **ptrs = calloc((size_t)mb, sizeof *ptrs);
    t0 = now_ms();
    for (int i = 0; i < mb; i++) CK(cudaMalloc(&ptrs[i], piece));
    double t_alloc = now_ms() - t0;
    t0 = now_ms();
    for (int i = 0; i < mb; i++)
        CK(cudaMemcpy(ptrs[i], host + i * piece, piece, cudaMemcpyHostToDevice));
    printf("upload %d MiB: %d cudaMalloc %.2f ms, %d cudaMemcpy %.2f ms\n", mb, mb, t_alloc, mb,
           now_ms() - t0);
    for (int i = 0; i < mb; i++) cudaFree(ptrs[i]);
    // (b) one block, one cudaMemcpy per tensor
    CK(cudaMalloc(&dev, total));
    t0 = now_ms();
    for (int i = 0; i < mb; i++) {
        CK(cudaMemcpy((uint8_t *)dev + i * piece, host + i * piece, piece, cudaMemcpyHostToDevice));
    }
    printf("upload %d MiB: one block, per-tensor cudaMemcpy %.2f ms\n", mb, now_ms() - t0);
    // (c) one cudaMemcpy of everything
    t0 = now_ms();
    CK(cudaMemcpy(dev, host, total, cudaMemcpyHostToDevice));
    printf("upload %d MiB: one cudaMemcpy %.2f ms\n", mb, now_ms() - t0);
    // (d) a pinned ring: chunks copied into pinned buffers by the CPU, DMA'd asynchronously
    for (int chunk_mb = 2; chunk_mb <= 16; chunk_mb *= 2) {
        const int slots = 4;
        size_t chunk = (size_t)chunk_mb << 20;
        uint8_t *pin;
        cudaStream_t s;
        cudaEvent_t ev[4];
        t0 = now_ms();
        CK(cudaHostAlloc((void **)&pin, chunk * slots, cudaHostAllocDefault));
        double t_pin = now_ms() - t0;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        for (int i = 0; i < slots; i++)
            CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
        t0 = now_ms();
        size_t off = 0;
        for (int k = 0; off < total; k++, off += chunk) {
            int slot = k % slots;
            size_t n = total - off < chunk ? total - off : chunk;
            if (k >= slots) CK(cudaEventSynchronize(ev[slot]));
            memcpy(pin + slot * chunk, host + off, n);
            CK(cudaMemcpyAsync((uint8_t *)dev + off, pin + slot * chunk, n, cudaMemcpyHostToDevice,
                               s));
            CK(cudaEventRecord(ev[slot], s));
        }
        CK(cudaStreamSynchronize(s));
        printf("upload %d MiB: pinned ring %d x %d MiB %.2f ms (cudaHostAlloc %.2f ms)\n", mb,
               slots, chunk_mb, now_ms() - t0, t_pin);
        t0 = now_ms();
        CK(cudaFreeHost(pin));
        printf("  cudaFreeHost %.2f ms\n", now_ms() - t0);
        for (int i = 0; i < slots; i++) cudaEventDestroy(ev[i]);
        cudaStreamDestroy(s);
    }
    // (e) the host buffer registered (pinned in place), one copy, unregistered
    t0 = now_ms();
    CK(cudaHostRegister(host, total, cudaHostRegisterDefault));
    double t_reg = now_ms() - t0;
    t0 = now_ms();
    CK(cudaMemcpy(dev, host, total, cudaMemcpyHostToDevice));
    double t_cp = now_ms() - t0;
    t0 = now_ms();
    CK(cudaHostUnregister(host));
    printf("upload %d MiB: cudaHostRegister %.2f ms, copy %.2f ms, unregister %.2f ms\n", mb, t_reg,
           t_cp, now_ms() - t0);
    cudaFree(dev);
    free(host);
    free(ptrs);
    return 0;
}

// --- SHA-256 through libcrypto (what kiln_sha256_fast uses)

typedef int (*digest_fn)(const void *, size_t, unsigned char *, unsigned int *, const void *,
                         void *);
static digest_fn g_digest;
static const void *g_md;
typedef struct sha_job {
    const uint8_t *p;
    size_t n;
} sha_job;

static void *sha_worker(void *arg) {
    sha_job *j = arg;
    unsigned char out[32];
    unsigned int n;
    for (size_t off = 0; off < j->n; off += (size_t)1 << 20)
        g_digest(j->p + off, 1 << 20, out, &n, g_md, NULL);
    return NULL;
}

static int sha_probe(int mb) {
    void *h = dlopen("libcrypto.so.3", RTLD_NOW);
    if (h == NULL) h = dlopen("libcrypto.so", RTLD_NOW);
    if (h == NULL) {
        printf("sha: no libcrypto\n");
        return 1;
    }
    g_digest = (digest_fn)dlsym(h, "EVP_Digest");
    const void *(*md)(void) = (const void *(*)(void))dlsym(h, "EVP_sha256");
    g_md = md();
    size_t total = (size_t)mb << 20;
    uint8_t *buf = malloc(total);
    for (size_t i = 0; i < total; i++) buf[i] = (uint8_t)i;
    for (int nt = 1; nt <= 16; nt *= 2) {
        pthread_t th[16];
        sha_job jobs[16];
        double t0 = now_ms();
        for (int t = 0; t < nt; t++) {
            jobs[t].p = buf + total / nt * t;
            jobs[t].n = total / nt;
            pthread_create(&th[t], NULL, sha_worker, &jobs[t]);
        }
        for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
        printf("sha256 %d MiB on %d threads: %.2f ms\n", mb, nt, now_ms() - t0);
    }
    free(buf);
    return 0;
}

static int dnn_probe(void) {
    CK(cudaFree(0));
    double t0 = now_ms();
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    double t_open = now_ms() - t0;
    if (lib == NULL) {
        printf("dnn: %s\n", dlerror());
        return 1;
    }
    int (*create)(void **) = (int (*)(void **))dlsym(lib, "cudnnCreate");
    void *handle;
    t0 = now_ms();
    int rc = create(&handle);
    printf("cudnn: dlopen %.2f ms, cudnnCreate %.2f ms (rc %d)\n", t_open, now_ms() - t0, rc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    double t0 = now_ms();
    if (strcmp(argv[1], "dnn") != 0 && strcmp(argv[1], "sha") != 0) {
        CK(cudaFree(0));
        printf("CUDA context %.2f ms\n", now_ms() - t0);
    }
    if (strcmp(argv[1], "lt-heur") == 0 && argc > 2) return lt_probe(0, argv[2]);
    if (strcmp(argv[1], "lt-init") == 0 && argc > 2) return lt_probe(1, argv[2]);
    if (strcmp(argv[1], "upload") == 0 && argc > 2) return upload_probe(atoi(argv[2]));
    if (strcmp(argv[1], "sha") == 0 && argc > 2) return sha_probe(atoi(argv[2]));
    if (strcmp(argv[1], "dnn") == 0) return dnn_probe();
    return 2;
}
