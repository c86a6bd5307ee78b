// SPDX-License-Identifier: Apache-2.0
// kiln_cuda_bench: a quick per-model latency print for the GPU suite. Each model is built with the
// C graph API at the benchmark shapes (fp16 precision, random weights), loaded on cuda:0 with
// CUDA graphs on, bound to device-resident inputs and outputs, and timed as the median of 200
// kiln_context_execute calls (each returns with the work finished) after 20 warm-ups, beside the
// best PyTorch anchor of shared/reference/gpu-performance.md §1.4 and the 0.8x target. The
// "overhead" entry (a one-kernel engine) comes with the floor it is measured against (BASE: a
// bare CUDA graph of one empty kernel, launched and synchronized) and the cost of each CUDA call
// an execute makes (API lines).
// Not a test: it prints numbers (exit 77 without a GPU, 1 when a model fails to build or run).
//
//   kiln_cuda_bench [--filter SUBSTRING] [--runs N] [--dry]   (--dry: build and run once on the
//   CPU)
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

#define F32 KILN_DTYPE_F32

typedef struct gb {
    kiln_graph *g;
    int ok;
    uint64_t rng;
} gb;

static void gb_check(gb *b, kiln_status st, const char *what) {
    if (st != KILN_OK && b->ok) {
        fprintf(stderr, "graph building failed at %s: %s\n", what, kiln_last_error());
        b->ok = 0;
    }
}

static float rnd(gb *b) {
    b->rng = b->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((b->rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

// A float32 constant of the given dims, uniform in [-scale, scale].
static int32_t cst(gb *b, uint32_t rank, const int64_t *dims, float scale) {
    int64_t n = 1;
    int32_t v = -1;
    for (uint32_t i = 0; i < rank; i++) n *= dims[i];
    float *d = malloc((size_t)n * sizeof *d);
    if (d == NULL) {
        b->ok = 0;
        return -1;
    }
    for (int64_t i = 0; i < n; i++) d[i] = scale * rnd(b);
    gb_check(b, kiln_graph_add_constant(b->g, NULL, F32, rank, dims, d, (size_t)n * 4, &v),
             "constant");
    free(d);
    return v;
}

static int32_t cst1(gb *b, int64_t n, float scale) { return cst(b, 1, &n, scale); }
static int32_t cst2(gb *b, int64_t a, int64_t c, float scale) {
    int64_t d[2] = {a, c};
    return cst(b, 2, d, scale);
}

static int32_t node(gb *b, uint32_t op, const int32_t *ins, uint32_t n_in, const kiln_attr *attrs,
                    uint32_t n_attrs) {
    int32_t v = -1;
    gb_check(b, kiln_graph_add_node(b->g, op, ins, n_in, attrs, n_attrs, &v, 1), kiln_op_name(op));
    return v;
}

static int32_t node1(gb *b, uint32_t op, int32_t x) { return node(b, op, &x, 1, NULL, 0); }
static int32_t node2(gb *b, uint32_t op, int32_t x, int32_t y) {
    int32_t ins[2] = {x, y};
    return node(b, op, ins, 2, NULL, 0);
}

static kiln_attr ints(const char *name, const int64_t *v, uint32_t n) {
    kiln_attr a = {name, v, NULL, n};
    return a;
}

static int32_t linear(gb *b, int32_t x, int64_t in, int64_t out) {
    float s = 1.0f / (float)in;
    int32_t ins[3] = {x, cst2(b, out, in, s * 1.7f), cst1(b, out, 0.1f)};
    return node(b, KILN_OP_LINEAR, ins, 3, NULL, 0);
}

static int32_t layer_norm(gb *b, int32_t x, int64_t d) {
    int64_t nd = 1;
    int32_t ins[3] = {x, cst1(b, d, 0.1f), cst1(b, d, 0.1f)};
    kiln_attr a = ints("normalized_ndim", &nd, 1);
    return node(b, KILN_OP_LAYER_NORM, ins, 3, &a, 1);
}

// conv k x k (stride s, padding k/2) with bias (BatchNorm folded), optional relu.
static int32_t conv(gb *b, int32_t x, int64_t cin, int64_t cout, int64_t k, int64_t s, int relu) {
    int64_t wd[4] = {cout, cin, k, k}, pad[2] = {k / 2, k / 2}, st[2] = {s, s};
    int32_t ins[3] = {x, cst(b, 4, wd, 1.0f / (float)(cin * k * k)), cst1(b, cout, 0.1f)};
    kiln_attr a[2] = {ints("padding", pad, 2), ints("stride", st, 2)};
    int32_t y = node(b, KILN_OP_CONV2D, ins, 3, a, 2);
    return relu ? node1(b, KILN_OP_RELU, y) : y;
}

typedef struct model {
    const char *name;
    double anchor_ms; // best PyTorch configuration on the H200 (gpu-performance.md §1.4)
    const char *anchor_note;
    void *bytes;
    size_t nbytes;
    int64_t in_dims[KILN_MAX_RANK];
    uint32_t in_rank;
} model;

static int finish(gb *b, int32_t y, model *m) {
    kiln_build_options o;
    kiln_built *built = NULL;
    const void *data;
    size_t n;
    gb_check(b, kiln_graph_mark_output(b->g, y, "y"), "output");
    if (b->ok) {
        kiln_build_options_init(&o);
        o.precision = KILN_PRECISION_FP16;
        if (kiln_build(b->g, &o, &built) != KILN_OK ||
            kiln_built_engine(built, &data, &n) != KILN_OK) {
            fprintf(stderr, "kiln_build (%s) failed: %s\n", m->name, kiln_last_error());
            b->ok = 0;
        } else {
            m->bytes = malloc(n);
            if (m->bytes == NULL)
                b->ok = 0;
            else {
                memcpy(m->bytes, data, n);
                m->nbytes = n;
            }
        }
    }
    kiln_built_free(built);
    kiln_graph_free(b->g);
    b->g = NULL;
    return b->ok;
}

static int32_t input(gb *b, uint32_t rank, const int64_t *dims, model *m) {
    int32_t v = -1;
    m->in_rank = rank;
    memcpy(m->in_dims, dims, rank * sizeof *dims);
    gb_check(b, kiln_graph_add_input(b->g, "x", F32, rank, dims, dims, &v), "input");
    return v;
}

// MLP 1024-4096-4096-1024 with ReLU (anchor: eager + CUDA graph).
static int build_mlp(model *m, int64_t batch) {
    gb b = {NULL, 1, 12345};
    int64_t d[2] = {batch, 1024};
    kiln_graph_new(&b.g);
    int32_t h = input(&b, 2, d, m);
    h = node1(&b, KILN_OP_RELU, linear(&b, h, 1024, 4096));
    h = node1(&b, KILN_OP_RELU, linear(&b, h, 4096, 4096));
    h = linear(&b, h, 4096, 1024);
    return finish(&b, h, m);
}

// ResNet-50 stage 1 (conv2_x): three bottlenecks, 256 channels at 56x56, BN folded into the
// convs. About 1/8 of ResNet-50's FLOPs; the anchor line shows the whole network's.
static int build_resnet_stage(model *m, int64_t batch) {
    gb b = {NULL, 1, 777};
    int64_t d[4] = {batch, 256, 56, 56};
    kiln_graph_new(&b.g);
    int32_t x = input(&b, 4, d, m);
    for (int blk = 0; blk < 3; blk++) {
        int32_t h = conv(&b, x, 256, 64, 1, 1, 1);
        h = conv(&b, h, 64, 64, 3, 1, 1);
        h = conv(&b, h, 64, 256, 1, 1, 0);
        x = node1(&b, KILN_OP_RELU, node2(&b, KILN_OP_ADD, h, x));
    }
    return finish(&b, x, m);
}

// One transformer encoder layer: post-norm (BERT: GELU erf) or pre-norm (nn.TransformerEncoder
// with norm_first: ReLU). Self-attention through sdpa, heads of 64.
static int build_encoder(model *m, int64_t batch, int64_t seq, int64_t dm, int64_t ff,
                         int pre_norm) {
    gb b = {NULL, 1, 4242};
    int64_t heads = dm / 64;
    int64_t d[3] = {batch, seq, dm};
    int64_t split[5] = {batch, seq, 3, heads, 64}, perm[5] = {2, 0, 3, 1, 4};
    int64_t back[4] = {0, 2, 1, 3}, merge[3] = {batch, seq, dm}, zero = 0;
    kiln_graph_new(&b.g);
    int32_t x = input(&b, 3, d, m);
    int32_t h = pre_norm ? layer_norm(&b, x, dm) : x;
    int32_t qkv = linear(&b, h, dm, 3 * dm);
    kiln_attr ra = ints("shape", split, 5), pa = ints("dims", perm, 5);
    qkv = node(&b, KILN_OP_RESHAPE, &qkv, 1, &ra, 1);
    qkv = node(&b, KILN_OP_PERMUTE, &qkv, 1, &pa, 1);
    int32_t parts[3];
    for (int64_t i = 0; i < 3; i++) {
        int64_t idx = i;
        kiln_attr sa[2] = {ints("dim", &zero, 1), ints("index", &idx, 1)};
        parts[i] = node(&b, KILN_OP_SELECT, &qkv, 1, sa, 2);
    }
    int32_t att = node(&b, KILN_OP_SDPA, parts, 3, NULL, 0);
    kiln_attr pb = ints("dims", back, 4), rb = ints("shape", merge, 3);
    att = node(&b, KILN_OP_PERMUTE, &att, 1, &pb, 1);
    att = node(&b, KILN_OP_RESHAPE, &att, 1, &rb, 1);
    x = node2(&b, KILN_OP_ADD, linear(&b, att, dm, dm), x);
    if (!pre_norm) x = layer_norm(&b, x, dm);
    h = pre_norm ? layer_norm(&b, x, dm) : x;
    h = linear(&b, h, dm, ff);
    h = node1(&b, pre_norm ? KILN_OP_RELU : KILN_OP_GELU, h);
    x = node2(&b, KILN_OP_ADD, linear(&b, h, ff, dm), x);
    if (!pre_norm) x = layer_norm(&b, x, dm);
    return finish(&b, x, m);
}

// The smallest engine: one ReLU over 256 float16 values, one kernel (Kiln's fixed cost per
// execute, beside api_costs' bare graph of one empty kernel).
static int build_tiny(model *m) {
    gb b = {NULL, 1, 99};
    int64_t d[2] = {1, 256};
    int32_t x = -1;
    kiln_graph_new(&b.g);
    m->in_rank = 2;
    memcpy(m->in_dims, d, sizeof d);
    gb_check(&b, kiln_graph_add_input(b.g, "x", KILN_DTYPE_F16, 2, d, d, &x), "input");
    return finish(&b, node1(&b, KILN_OP_RELU, x), m);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

// An empty kernel through the runtime's library API (this program has no device code), for the
// floor of a one-kernel graph.
static const char empty_ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                                ".visible .entry kiln_bench_empty()\n{\n\tret;\n}\n";

static double per_call_us(double t0_ms, int n) { return (now_ms() - t0_ms) * 1e3 / n; }

// One BASE line: the median, p10 and p90 of `runs` launches (graph ge, else kernel k alone) each
// followed by a synchronize, after 20 warm-ups; 0 when a call failed.
static int base_line(const char *what, cudaGraphExec_t ge, cudaKernel_t k, cudaStream_t st,
                     double *t, int runs) {
    dim3 one = {1, 1, 1}, warp = {32, 1, 1};
    for (int i = 0; i < 20 + runs; i++) {
        double t0 = now_ms();
        cudaError_t e = ge != NULL ? cudaGraphLaunch(ge, st)
                                   : cudaLaunchKernel((const void *)k, one, warp, NULL, 0, st);
        if (e != cudaSuccess || cudaStreamSynchronize(st) != cudaSuccess) return 0;
        if (i >= 20) t[i - 20] = now_ms() - t0;
    }
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    printf("BASE  %s: median %8.4f ms  p10 %8.4f  p90 %8.4f\n", what, t[runs / 2], t[runs / 10],
           t[runs * 9 / 10]);
    return 1;
}

// The CUDA runtime calls Kiln's execute makes, each timed alone (mean of n calls), and a graph
// of one empty kernel launched and synchronized (median).
static void api_costs(int runs) {
    const int n = 2000;
    cudaStream_t st = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaLibrary_t lib = NULL;
    cudaKernel_t k = NULL;
    void *dbuf = NULL, *hbuf = malloc(4096);
    double *t = calloc((size_t)runs, sizeof *t), t0;
    int dev = 0;
    dim3 one = {1, 1, 1}, warp = {32, 1, 1};
    enum cudaStreamCaptureStatus cap;
    struct cudaPointerAttributes a;
    if (t == NULL || hbuf == NULL ||
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&dbuf, 4096) != cudaSuccess)
        goto done;
    t0 = now_ms();
    for (int i = 0; i < n; i++) cudaGetDevice(&dev);
    printf("API   cudaGetDevice %.3f us\n", per_call_us(t0, n));
    t0 = now_ms();
    for (int i = 0; i < n; i++) cudaStreamIsCapturing(st, &cap);
    printf("API   cudaStreamIsCapturing %.3f us\n", per_call_us(t0, n));
    t0 = now_ms();
    for (int i = 0; i < n; i++) cudaPointerGetAttributes(&a, dbuf);
    printf("API   cudaPointerGetAttributes (device memory) %.3f us\n", per_call_us(t0, n));
    t0 = now_ms();
    for (int i = 0; i < n; i++) cudaPointerGetAttributes(&a, hbuf);
    cudaGetLastError();
    printf("API   cudaPointerGetAttributes (malloc'd host memory) %.3f us\n", per_call_us(t0, n));
    t0 = now_ms();
    for (int i = 0; i < n; i++) cudaStreamSynchronize(st);
    printf("API   cudaStreamSynchronize (idle stream) %.3f us\n", per_call_us(t0, n));
    if (cudaLibraryLoadData(&lib, empty_ptx, NULL, NULL, 0, NULL, NULL, 0) != cudaSuccess ||
        cudaLibraryGetKernel(&k, lib, "kiln_bench_empty") != cudaSuccess ||
        cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        goto done;
    cudaLaunchKernel((const void *)k, one, warp, NULL, 0, st);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess ||
        cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        goto done;
    if (base_line("cudaGraphLaunch + cudaStreamSynchronize (one empty kernel)", ge, k, st, t, runs))
        base_line("cudaLaunchKernel + cudaStreamSynchronize (one empty kernel)", NULL, k, st, t,
                  runs);
done:
    cudaGetLastError();
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (lib) cudaLibraryUnload(lib);
    if (dbuf) cudaFree(dbuf);
    if (st) cudaStreamDestroy(st);
    cudaGetLastError();
    free(hbuf);
    free(t);
}

// dry: on the CPU, host buffers, one execute (checks the graphs without a GPU).
static int run_model(model *m, int runs, int dry) {
    kiln_option_setting s[2];
    kiln_load_options o;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    kiln_binding_info in, out;
    void *din = NULL, *dout = NULL, *host = NULL;
    double *t = calloc((size_t)runs, sizeof *t);
    int ok = 0;
    memset(s, 0, sizeof s);
    s[0].name = "device";
    s[0].type = KILN_OPTION_STRING;
    s[0].string_value = dry ? "cpu" : "cuda:0";
    s[1].name = "use_cuda_graphs";
    s[1].type = KILN_OPTION_BOOL;
    s[1].int_value = 1;
    kiln_load_options_init(&o);
    o.settings = s;
    o.n_settings = 2;
    if (t == NULL || kiln_engine_load(m->bytes, m->nbytes, &o, &e) != KILN_OK ||
        kiln_context_new(e, &c) != KILN_OK || kiln_engine_binding(e, 1, 0, &in) != KILN_OK ||
        kiln_engine_binding(e, 0, 0, &out) != KILN_OK) {
        fprintf(stderr, "%s: load failed: %s\n", m->name, kiln_last_error());
        goto done;
    }
    host = malloc((size_t)in.max_nbytes);
    if (dry) {
        din = malloc((size_t)in.max_nbytes);
        dout = malloc((size_t)out.max_nbytes);
    }
    if (host == NULL || (dry ? din == NULL || dout == NULL
                             : cudaMalloc(&din, (size_t)in.max_nbytes) != cudaSuccess ||
                                   cudaMalloc(&dout, (size_t)out.max_nbytes) != cudaSuccess)) {
        fprintf(stderr, "%s: out of memory\n", m->name);
        goto done;
    }
    if (in.dtype == F32) {
        float *f = host;
        for (uint64_t i = 0; i < in.max_nbytes / 4; i++)
            f[i] = (float)((i * 7919) % 200) / 100.0f - 1.0f;
    } else {
        uint16_t *h = host; // fp16 / bf16: small values of either format
        for (uint64_t i = 0; i < in.max_nbytes / 2; i++) h[i] = (uint16_t)(i % 2 ? 0x3800 : 0xB400);
    }
    if (dry)
        memcpy(din, host, (size_t)in.max_nbytes);
    else
        cudaMemcpy(din, host, (size_t)in.max_nbytes, cudaMemcpyHostToDevice);
    if (kiln_context_set_input(c, 0, m->in_rank, m->in_dims, din) != KILN_OK ||
        kiln_context_set_output(c, 0, dout, (size_t)out.max_nbytes) != KILN_OK) {
        fprintf(stderr, "%s: binding failed: %s\n", m->name, kiln_last_error());
        goto done;
    }
    for (int i = 0; i < (dry ? 1 : 20); i++) {
        if (kiln_context_execute(c) != KILN_OK) {
            fprintf(stderr, "%s: execute failed: %s\n", m->name, kiln_last_error());
            goto done;
        }
    }
    if (dry) {
        printf("DRY   %s: built, loaded and ran on the CPU\n", m->name);
        ok = 1;
        goto done;
    }
    for (int i = 0; i < runs; i++) {
        double t0 = now_ms();
        kiln_status st = kiln_context_execute(c);
        t[i] = now_ms() - t0;
        if (st != KILN_OK) {
            fprintf(stderr, "%s: execute failed: %s\n", m->name, kiln_last_error());
            goto done;
        }
    }
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    double med = t[runs / 2];
    if (m->anchor_ms > 0) {
        printf("BENCH %-34s median %8.4f ms  p10 %8.4f  p90 %8.4f  | torch best %7.3f ms (%s) -> "
               "ratio %5.2fx (target <= 0.8x)\n",
               m->name, med, t[runs / 10], t[runs * 9 / 10], m->anchor_ms, m->anchor_note,
               med / m->anchor_ms);
    } else {
        printf("BENCH %-34s median %8.4f ms  p10 %8.4f  p90 %8.4f  | %s\n", m->name, med,
               t[runs / 10], t[runs * 9 / 10], m->anchor_note);
    }
    fflush(stdout);
    ok = 1;
done:
    kiln_context_free(c);
    kiln_engine_free(e);
    if (dry) {
        free(din);
        free(dout);
    } else {
        if (din) cudaFree(din);
        if (dout) cudaFree(dout);
    }
    free(host);
    free(t);
    return ok;
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    int runs = 200, n_dev = 0, failed = 0, dry = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dry") == 0)
            dry = 1;
    }
    if (runs < 10) runs = 10;
    setvbuf(stdout, NULL, _IOLBF, 0); // BENCH lines interleave with the plugin's log (stderr)
    if (!dry && (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)) {
        printf("kiln_cuda_bench: no CUDA device: skipped\n");
        return 77;
    }
    struct {
        const char *name;
        double anchor;
        const char *note;
        int kind;
        int64_t batch;
    } list[] = {
        {"mlp 1024-4096-4096-1024 b1", 0.030, "eager+graph", 0, 1},
        {"mlp 1024-4096-4096-1024 b64", 0.034, "eager+graph", 0, 64},
        {"resnet50 conv2_x (3 bottlenecks) b1", 0.58, "whole ResNet-50", 1, 1},
        {"resnet50 conv2_x (3 bottlenecks) b32", 1.58, "whole ResNet-50", 1, 32},
        {"bert-base layer s128 b1", 1.09 / 12, "BERT-base / 12", 2, 1},
        {"bert-base layer s128 b8", 1.15 / 12, "BERT-base / 12", 2, 8},
        {"pre-norm encoder d1024 s256 b1", 0.049, "nn.TransformerEncoderLayer", 3, 1},
        {"overhead: relu 1x256 fp16", 0.0, "Kiln's fixed cost per execute (one kernel)", 4, 1},
    };
    if (!dry && (filter == NULL || strstr("overhead", filter) != NULL)) {
        api_costs(runs);
    }
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        model m;
        int ok;
        if (filter != NULL && strstr(list[i].name, filter) == NULL) continue;
        memset(&m, 0, sizeof m);
        printf("== %s\n", list[i].name); // the INFO log lines below belong to this model
        m.name = list[i].name;
        m.anchor_ms = list[i].anchor;
        m.anchor_note = list[i].note;
        switch (list[i].kind) {
        case 0: ok = build_mlp(&m, list[i].batch); break;
        case 1: ok = build_resnet_stage(&m, list[i].batch); break;
        case 2: ok = build_encoder(&m, list[i].batch, 128, 768, 3072, 0); break;
        case 4: ok = build_tiny(&m); break;
        default: ok = build_encoder(&m, list[i].batch, 256, 1024, 4096, 1); break;
        }
        if (!ok || !run_model(&m, runs, dry)) {
            printf("BENCH %-34s FAILED: %s\n", m.name, kiln_last_error());
            failed++;
        }
        free(m.bytes);
    }
    return failed ? 1 : 0;
}
