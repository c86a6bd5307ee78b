// SPDX-License-Identifier: Apache-2.0
// The Kiln program C API (kiln/kiln_program.h) with CUDA device pointers, as an installed
// consumer sees it. For every program export_cases.py wrote (DIR/cases.txt):
//   - host pointers: inputs (and, for programs without memory planning for I/O, caller output
//     buffers) in host memory; outputs against eager PyTorch's (expected.bin);
//   - device pointers (devio programs): inputs and caller output buffers in CUDA memory (and the
//     two mixed ways), outputs copied back and compared with eager PyTorch's, and with the host
//     run of the same program on fresh random inputs;
//   - refusals: a device pointer for a memory-planned input or output (KILN_ERR_UNSUPPORTED
//     naming the export setting), an invalid memory kind, a device buffer that is too small;
//     the program still runs correctly afterwards.
//
//   check_program_cuda DIR [--device cuda:0|cpu] [--fake-device]
//
// --device: the KilnBackend "device" option per load (default cuda:0). --fake-device (for
// machines without a GPU, with --device cpu): host memory labelled KILN_MEMORY_CUDA stands in for
// device memory, which exercises the API's bookkeeping but not CUDA.
// libcudart.so.13 is opened at run time (nothing here links CUDA). Prints "PASS <check>" or
// "FAIL <check>: why" per check and "N passed, N failed" last. Exit status: 0 all passed, 1 a
// check failed, 77 no usable GPU (after the host checks, all passed), 2 bad usage.
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "kiln/kiln_program.h"

#define MAX_IO 8

static int n_pass, n_fail;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
report(int ok, const char *check, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", check);
        n_pass++;
    } else {
        char why[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        printf("FAIL %s: %s\n", check, why);
        n_fail++;
    }
    fflush(stdout);
    return ok;
}

// --- CUDA runtime through dlopen (or host memory with --fake-device)

enum { H2D = 1, D2H = 2 };

static struct {
    int real;
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*memset_)(void *, int, size_t);
    int (*sync)(void);
    int (*count)(int *);
    const char *(*err)(int);
} cu;

static int fake_malloc(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p == NULL;
}
static int fake_free(void *p) {
    free(p);
    return 0;
}
static int fake_memcpy(void *d, const void *s, size_t n, int kind) {
    (void)kind;
    memcpy(d, s, n);
    return 0;
}
static int fake_memset(void *d, int v, size_t n) {
    memset(d, v, n);
    return 0;
}
static int fake_sync(void) { return 0; }
static const char *fake_err(int e) { return e ? "fake allocation failed" : "no error"; }

// 1: a GPU is usable; else 0 with `why` filled.
static int cuda_open(int fake, char *why, size_t why_n) {
    if (fake) {
        cu.malloc_ = fake_malloc;
        cu.free_ = fake_free;
        cu.memcpy_ = fake_memcpy;
        cu.memset_ = fake_memset;
        cu.sync = fake_sync;
        cu.err = fake_err;
        return 1;
    }
    const char *names[] = {"libcudart.so.13", "libcudart.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && lib == NULL; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        snprintf(why, why_n,
                 "cannot open libcudart.so.13 (%s): put the CUDA 13 lib64 on "
                 "LD_LIBRARY_PATH",
                 dlerror());
        return 0;
    }
    *(void **)&cu.malloc_ = dlsym(lib, "cudaMalloc");
    *(void **)&cu.free_ = dlsym(lib, "cudaFree");
    *(void **)&cu.memcpy_ = dlsym(lib, "cudaMemcpy");
    *(void **)&cu.memset_ = dlsym(lib, "cudaMemset");
    *(void **)&cu.sync = dlsym(lib, "cudaDeviceSynchronize");
    *(void **)&cu.count = dlsym(lib, "cudaGetDeviceCount");
    *(void **)&cu.err = dlsym(lib, "cudaGetErrorString");
    if (!cu.malloc_ || !cu.free_ || !cu.memcpy_ || !cu.memset_ || !cu.sync || !cu.count ||
        !cu.err) {
        snprintf(why, why_n, "libcudart lacks cudaMalloc/cudaMemcpy/...");
        return 0;
    }
    int n = 0, e = cu.count(&n);
    if (e != 0 || n < 1) {
        snprintf(why, why_n, "no CUDA device (cudaGetDeviceCount: %d devices, %s)", n,
                 e ? cu.err(e) : "ok");
        return 0;
    }
    cu.real = 1;
    return 1;
}

static void *dev_alloc(size_t n) {
    void *p = NULL;
    int e = cu.malloc_(&p, n ? n : 1);
    if (e != 0) {
        fprintf(stderr, "cudaMalloc(%zu): %s\n", n, cu.err(e));
        return NULL;
    }
    return p;
}

// --- tensor files (examples/cpp/kiln_tensors.py)

typedef struct {
    kiln_dtype dtype;
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
    size_t n, nbytes;
    uint8_t *data;
} tensor;

static size_t dtype_size(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_F32:
    case KILN_DTYPE_I32: return 4;
    case KILN_DTYPE_F16:
    case KILN_DTYPE_BF16: return 2;
    case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

static int read_tensors(const char *path, tensor *out, uint32_t max, uint32_t *count) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return 1;
    char magic[4];
    uint32_t head[2];
    int rc = 1;
    if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "KLNT", 4) != 0) goto done;
    if (fread(head, 4, 2, f) != 2 || head[0] != 1 || head[1] > max) goto done;
    for (uint32_t i = 0; i < head[1]; i++) {
        uint32_t h[2];
        if (fread(h, 4, 2, f) != 2 || dtype_size((kiln_dtype)h[0]) == 0 || h[1] > KILN_MAX_RANK)
            goto done;
        tensor *t = &out[i];
        t->dtype = (kiln_dtype)h[0];
        t->rank = h[1];
        if (fread(t->dims, 8, h[1], f) != h[1]) goto done;
        t->n = 1;
        for (uint32_t d = 0; d < h[1]; d++) t->n *= (size_t)t->dims[d];
        t->nbytes = t->n * dtype_size(t->dtype);
        t->data = malloc(t->nbytes + 1);
        if (t->data == NULL || fread(t->data, 1, t->nbytes, f) != t->nbytes) goto done;
    }
    *count = head[1];
    rc = 0;
done:
    fclose(f);
    return rc;
}

static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15), e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 0x400), (int)e - 25);
    return s ? -v : v;
}

static uint16_t float_to_half(float f) { // values in [-2, 2]: normal or zero, round to nearest
    uint16_t s = signbit(f) ? 0x8000 : 0;
    float a = fabsf(f);
    if (a < 6.1035156e-05f) return s;
    int e;
    float m = frexpf(a, &e); // a = m * 2^e, m in [0.5, 1)
    uint32_t mant = (uint32_t)lrintf((m * 2.0f - 1.0f) * 1024.0f);
    if (mant == 1024) {
        mant = 0;
        e++;
    }
    return (uint16_t)(s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)mant);
}

static double value_at(kiln_dtype dt, const void *data, size_t i) {
    if (dt == KILN_DTYPE_F32) return ((const float *)data)[i];
    if (dt == KILN_DTYPE_F16) return half_to_float(((const uint16_t *)data)[i]);
    if (dt == KILN_DTYPE_BF16) {
        uint32_t b = (uint32_t)((const uint16_t *)data)[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    return NAN;
}

// Elementwise |got - want| <= tol + tol * |want|; 1 when all close, else 0 with `why`.
static int all_close(kiln_dtype dt, const void *got, const tensor *want, double tol, char *why,
                     size_t why_n) {
    double worst = 0.0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < want->n; i++) {
        double g = value_at(dt, got, i), w = value_at(want->dtype, want->data, i);
        double d = fabs(g - w);
        if (!(d <= tol + tol * fabs(w))) {
            if (bad++ == 0 || !(d <= worst)) {
                worst = d;
                worst_i = i;
            }
        }
    }
    if (bad == 0) return 1;
    snprintf(why, why_n, "%zu of %zu elements differ (worst at %zu: got %g, want %g, tol %g)", bad,
             want->n, worst_i, value_at(dt, got, worst_i),
             value_at(want->dtype, want->data, worst_i), tol);
    return 0;
}

// --- one program

typedef struct {
    char name[128];
    int devio;
    double tol;
    char outside[512];
} test_case;

static const char *device_opt = "cuda:0";
// 0 with a real GPU and device=cpu: Kiln's CPU engine would dereference device pointers, so only
// the refusals (which never touch the memory) are checked with them.
static int device_io = 1;
static char dir[1024];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rng_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void fill_random(tensor *t) {
    for (size_t i = 0; i < t->n; i++) {
        float v = rng_uniform();
        if (t->dtype == KILN_DTYPE_F16)
            ((uint16_t *)t->data)[i] = float_to_half(v);
        else
            ((float *)t->data)[i] = v;
    }
}

static kiln_input input_of(const tensor *t, const void *data, kiln_memory mem) {
    kiln_input in = {.data = data,
                     .dtype = t->dtype,
                     .rank = t->rank,
                     .dims = t->dims,
                     .memory = mem,
                     .device_index = 0};
    return in;
}

typedef struct {
    const test_case *c;
    kiln_program *p;
    uint32_t n_in, n_out;
    tensor in[MAX_IO], exp[MAX_IO];
    void *d_in[MAX_IO], *d_out[MAX_IO], *h_out[MAX_IO];
} ctx;

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

// Binds inputs (host or device copies), output buffers (for unplanned outputs: host or device),
// executes, and compares with `want` (copying device outputs back). 1 when every check passed.
static int run_and_compare(ctx *x, const char *label, kiln_memory in_mem, kiln_memory out_mem,
                           const tensor *inputs, const tensor *want) {
    char check[256], why[1024];
    kiln_status st;
    for (uint32_t i = 0; i < x->n_in; i++) {
        const void *data = inputs[i].data;
        if (in_mem == KILN_MEMORY_CUDA) {
            int e = cu.memcpy_(x->d_in[i], inputs[i].data, inputs[i].nbytes, H2D);
            if (e != 0) {
                NAMEF(check, "%s %s: upload input %u", x->c->name, label, i);
                return report(0, check, "cudaMemcpy: %s", cu.err(e));
            }
            data = x->d_in[i];
        }
        kiln_input in = input_of(&inputs[i], data, in_mem);
        st = kiln_program_set_input(x->p, NULL, i, &in);
        if (st != KILN_OK) {
            NAMEF(check, "%s %s: set_input %u", x->c->name, label, i);
            return report(0, check, "%s: %s", kiln_status_str(st), kiln_program_last_error());
        }
    }
    if (x->c->devio) {
        for (uint32_t o = 0; o < x->n_out; o++) {
            size_t nb = want[o].nbytes;
            void *buf = out_mem == KILN_MEMORY_CUDA ? x->d_out[o] : x->h_out[o];
            // NaN-poison the buffer so that an execute writing nothing cannot pass.
            if (out_mem == KILN_MEMORY_CUDA)
                cu.memset_(buf, 0xff, nb);
            else
                memset(buf, 0xff, nb);
            st = kiln_program_set_output_buffer(x->p, NULL, o, buf, nb, out_mem);
            if (st != KILN_OK) {
                NAMEF(check, "%s %s: set_output_buffer %u", x->c->name, label, o);
                return report(0, check, "%s: %s", kiln_status_str(st), kiln_program_last_error());
            }
        }
    }
    st = kiln_program_execute(x->p, NULL);
    NAMEF(check, "%s %s: execute", x->c->name, label);
    if (st != KILN_OK)
        return report(0, check, "%s: %s", kiln_status_str(st), kiln_program_last_error());
    int ok = 1;
    for (uint32_t o = 0; o < x->n_out; o++) {
        kiln_output out;
        st = kiln_program_output(x->p, NULL, o, &out);
        NAMEF(check, "%s %s: output %u", x->c->name, label, o);
        if (st != KILN_OK) {
            ok &= report(0, check, "%s: %s", kiln_status_str(st), kiln_program_last_error());
            continue;
        }
        int shape_ok =
            out.dtype == want[o].dtype && out.rank == want[o].rank && out.nbytes == want[o].nbytes;
        for (uint32_t d = 0; shape_ok && d < out.rank; d++)
            shape_ok = out.dims[d] == want[o].dims[d];
        if (!shape_ok) {
            ok &= report(0, check, "dtype %s rank %u nbytes %llu, expected %s rank %u nbytes %zu",
                         kiln_dtype_name(out.dtype), out.rank, (unsigned long long)out.nbytes,
                         kiln_dtype_name(want[o].dtype), want[o].rank, want[o].nbytes);
            continue;
        }
        const void *host = out.data;
        uint8_t *copy = NULL;
        if (x->c->devio) {
            void *buf = out_mem == KILN_MEMORY_CUDA ? x->d_out[o] : x->h_out[o];
            if (out.data != buf) {
                ok &= report(0, check, "kiln_output.data %p is not the caller's buffer %p",
                             out.data, buf);
                continue;
            }
            if (out_mem == KILN_MEMORY_CUDA) {
                copy = malloc(want[o].nbytes);
                int e = copy ? cu.memcpy_(copy, out.data, want[o].nbytes, D2H) : 1;
                if (e != 0) {
                    ok &= report(0, check, "cudaMemcpy back: %s", cu.err(e));
                    free(copy);
                    continue;
                }
                host = copy;
            }
        }
        ok &= report(all_close(out.dtype, host, &want[o], x->c->tol, why, sizeof why), check, "%s",
                     why);
        free(copy);
        // Where the output says it lives (a separate check: bookkeeping, not the numbers).
        kiln_memory mem_want = x->c->devio ? out_mem : KILN_MEMORY_HOST;
        NAMEF(check, "%s %s: output %u reports %s memory", x->c->name, label, o,
              mem_want == KILN_MEMORY_CUDA ? "CUDA" : "host");
        ok &= report(out.memory == mem_want, check, "kiln_output.memory is %d (device_index %d)",
                     (int)out.memory, out.device_index);
    }
    return ok;
}

static void run_case(const test_case *c, int have_cuda) {
    char check[256], why[1024];
    char path[1400];
    ctx x;
    memset(&x, 0, sizeof x);
    x.c = c;
    uint32_t n_in_file = 0, n_exp_file = 0;
    snprintf(path, sizeof path, "%s/%s/inputs.bin", dir, c->name);
    int rd = read_tensors(path, x.in, MAX_IO, &n_in_file);
    snprintf(path, sizeof path, "%s/%s/expected.bin", dir, c->name);
    rd |= read_tensors(path, x.exp, MAX_IO, &n_exp_file);
    NAMEF(check, "%s: read inputs.bin/expected.bin", c->name);
    if (!report(rd == 0, check, "unreadable tensor file under %s/%s", dir, c->name)) return;

    kiln_program_options o;
    kiln_program_options_init(&o);
    kiln_option_setting dev = {
        .name = "device", .type = KILN_OPTION_STRING, .string_value = device_opt};
    o.settings = &dev;
    o.n_settings = 1;
    snprintf(path, sizeof path, "%s/%s/model.pte", dir, c->name);
    kiln_status st = kiln_program_load(path, &o, &x.p);
    NAMEF(check, "%s: load (device=%s)", c->name, device_opt);
    if (!report(st == KILN_OK, check, "%s: %s", kiln_status_str(st), kiln_program_last_error()))
        goto out;
    int32_t uses = 0;
    kiln_program_method_uses_kiln(x.p, NULL, &uses);
    kiln_program_n_inputs(x.p, NULL, &x.n_in);
    kiln_program_n_outputs(x.p, NULL, &x.n_out);
    NAMEF(check, "%s: metadata (uses Kiln, %u inputs, %u outputs)", c->name, x.n_in, x.n_out);
    int meta_ok = uses == 1 && x.n_in == n_in_file && x.n_out == n_exp_file && x.n_in <= MAX_IO &&
                  x.n_out <= MAX_IO;
    for (uint32_t i = 0; meta_ok && i < x.n_in; i++) {
        kiln_tensor_info ti;
        meta_ok = kiln_program_input_info(x.p, NULL, i, &ti) == KILN_OK &&
                  ti.memory_planned == !c->devio && ti.dtype == x.in[i].dtype &&
                  ti.nbytes == x.in[i].nbytes;
    }
    for (uint32_t i = 0; meta_ok && i < x.n_out; i++) {
        kiln_tensor_info ti;
        meta_ok = kiln_program_output_info(x.p, NULL, i, &ti) == KILN_OK &&
                  ti.memory_planned == !c->devio && ti.dtype == x.exp[i].dtype &&
                  ti.nbytes == x.exp[i].nbytes;
    }
    if (!report(meta_ok, check,
                "uses_kiln %d, %u/%u inputs, %u/%u outputs, or an info (dtype, nbytes, "
                "memory_planned != %d) differs from the tensor files",
                uses, x.n_in, n_in_file, x.n_out, n_exp_file, !c->devio))
        goto out;

    for (uint32_t i = 0; i < x.n_out; i++) x.h_out[i] = malloc(x.exp[i].nbytes);

    // 1. host pointers (twice: bindings and buffers are reused)
    run_and_compare(&x, "host in/host out", KILN_MEMORY_HOST, KILN_MEMORY_HOST, x.in, x.exp);
    run_and_compare(&x, "host in/host out again", KILN_MEMORY_HOST, KILN_MEMORY_HOST, x.in, x.exp);

    if (!c->devio) {
        // 2. refusals: device memory where the program plans host memory
        void *d = have_cuda ? dev_alloc(x.in[0].nbytes) : NULL;
        void *d_o = have_cuda ? dev_alloc(x.exp[0].nbytes) : NULL;
        if (have_cuda && d != NULL && d_o != NULL) {
            cu.memcpy_(d, x.in[0].data, x.in[0].nbytes, H2D);
            kiln_input in = input_of(&x.in[0], d, KILN_MEMORY_CUDA);
            st = kiln_program_set_input(x.p, NULL, 0, &in);
            NAMEF(check, "%s: device pointer for a memory-planned input is refused", c->name);
            report(st == KILN_ERR_UNSUPPORTED &&
                       strstr(kiln_program_last_error(), "alloc_graph_input=False") != NULL,
                   check, "%s: '%s'", kiln_status_str(st), kiln_program_last_error());
            st = kiln_program_set_output_buffer(x.p, NULL, 0, d_o, x.exp[0].nbytes,
                                                KILN_MEMORY_CUDA);
            NAMEF(check, "%s: device buffer for a memory-planned output is refused", c->name);
            report(st == KILN_ERR_UNSUPPORTED &&
                       strstr(kiln_program_last_error(), "alloc_graph_output=False") != NULL,
                   check, "%s: '%s'", kiln_status_str(st), kiln_program_last_error());
            run_and_compare(&x, "host in/host out after the refusals", KILN_MEMORY_HOST,
                            KILN_MEMORY_HOST, x.in, x.exp);
        }
        if (d) cu.free_(d);
        if (d_o) cu.free_(d_o);
        goto out;
    }
    if (!have_cuda || !device_io) goto out;
    if (strcmp(c->outside, "-") != 0) {
        NAMEF(check, "%s: device I/O", c->name);
        report(0, check, "operators outside the delegates (%s) cannot read device memory",
               c->outside);
        goto out;
    }

    // 3. device pointers
    int alloc_ok = 1;
    for (uint32_t i = 0; i < x.n_in; i++) alloc_ok &= (x.d_in[i] = dev_alloc(x.in[i].nbytes)) != 0;
    for (uint32_t i = 0; i < x.n_out; i++)
        alloc_ok &= (x.d_out[i] = dev_alloc(x.exp[i].nbytes)) != 0;
    NAMEF(check, "%s: device buffers", c->name);
    if (!report(alloc_ok, check, "cudaMalloc failed")) goto out;

    run_and_compare(&x, "device in/device out", KILN_MEMORY_CUDA, KILN_MEMORY_CUDA, x.in, x.exp);
    // Inputs and buffers stay bound: execute again without rebinding.
    st = kiln_program_execute(x.p, NULL);
    NAMEF(check, "%s: device in/device out re-execute without rebinding", c->name);
    if (report(st == KILN_OK, check, "%s: %s", kiln_status_str(st), kiln_program_last_error())) {
        uint8_t *copy = malloc(x.exp[0].nbytes);
        cu.memcpy_(copy, x.d_out[0], x.exp[0].nbytes, D2H);
        NAMEF(check, "%s: device in/device out re-execute output 0", c->name);
        report(all_close(x.exp[0].dtype, copy, &x.exp[0], c->tol, why, sizeof why), check, "%s",
               why);
        free(copy);
    }
    run_and_compare(&x, "device in/host out", KILN_MEMORY_CUDA, KILN_MEMORY_HOST, x.in, x.exp);
    run_and_compare(&x, "host in/device out", KILN_MEMORY_HOST, KILN_MEMORY_CUDA, x.in, x.exp);

    // Fresh random inputs: the device-pointer run against the host-pointer run.
    tensor rin[MAX_IO], ref[MAX_IO];
    memset(rin, 0, sizeof rin);
    memset(ref, 0, sizeof ref);
    for (uint32_t i = 0; i < x.n_in; i++) {
        rin[i] = x.in[i];
        rin[i].data = malloc(x.in[i].nbytes);
    }
    for (int trial = 0; trial < 2; trial++) {
        for (uint32_t i = 0; i < x.n_in; i++) fill_random(&rin[i]);
        char label[64];
        snprintf(label, sizeof label, "random inputs #%d host reference", trial);
        // Poisoned host buffers are written by this run; keep copies as the reference.
        NAMEF(check, "%s: %s", c->name, label);
        kiln_status s2 = KILN_OK;
        for (uint32_t i = 0; i < x.n_in && s2 == KILN_OK; i++) {
            kiln_input in = input_of(&rin[i], rin[i].data, KILN_MEMORY_HOST);
            s2 = kiln_program_set_input(x.p, NULL, i, &in);
        }
        for (uint32_t o = 0; o < x.n_out && s2 == KILN_OK; o++)
            s2 = kiln_program_set_output_buffer(x.p, NULL, o, x.h_out[o], x.exp[o].nbytes,
                                                KILN_MEMORY_HOST);
        if (s2 == KILN_OK) s2 = kiln_program_execute(x.p, NULL);
        if (!report(s2 == KILN_OK, check, "%s: %s", kiln_status_str(s2), kiln_program_last_error()))
            break;
        int differs = 0; // the fresh inputs must give other outputs than expected.bin's
        for (uint32_t o = 0; o < x.n_out; o++) {
            ref[o] = x.exp[o];
            ref[o].data = malloc(x.exp[o].nbytes);
            memcpy(ref[o].data, x.h_out[o], x.exp[o].nbytes);
            differs |= memcmp(ref[o].data, x.exp[o].data, x.exp[o].nbytes) != 0;
        }
        NAMEF(check, "%s: random inputs #%d give new outputs", c->name, trial);
        report(differs, check, "the outputs equal expected.bin's: stale results?");
        snprintf(label, sizeof label, "random inputs #%d device in/device out vs host", trial);
        run_and_compare(&x, label, KILN_MEMORY_CUDA, KILN_MEMORY_CUDA, rin, ref);
        for (uint32_t o = 0; o < x.n_out; o++) free(ref[o].data);
    }
    for (uint32_t i = 0; i < x.n_in; i++) free(rin[i].data);

    // 4. refusals on a program that takes device memory
    kiln_input bad = input_of(&x.in[0], x.d_in[0], (kiln_memory)7);
    st = kiln_program_set_input(x.p, NULL, 0, &bad);
    NAMEF(check, "%s: invalid memory kind for an input is refused", c->name);
    report(st == KILN_ERR_INVALID_ARG, check, "%s: '%s'", kiln_status_str(st),
           kiln_program_last_error());
    st = kiln_program_set_output_buffer(x.p, NULL, 0, x.d_out[0], x.exp[0].nbytes - 1,
                                        KILN_MEMORY_CUDA);
    NAMEF(check, "%s: a device output buffer one byte short is refused", c->name);
    report(st == KILN_ERR_INVALID_ARG && strstr(kiln_program_last_error(), "bytes") != NULL, check,
           "%s: '%s'", kiln_status_str(st), kiln_program_last_error());
    st = kiln_program_set_output_buffer(x.p, NULL, 0, x.d_out[0], x.exp[0].nbytes, (kiln_memory)7);
    NAMEF(check, "%s: invalid memory kind for an output is refused", c->name);
    report(st == KILN_ERR_INVALID_ARG, check, "%s: '%s'", kiln_status_str(st),
           kiln_program_last_error());
    run_and_compare(&x, "device in/device out after the refusals", KILN_MEMORY_CUDA,
                    KILN_MEMORY_CUDA, x.in, x.exp);
    int e = cu.sync();
    NAMEF(check, "%s: no pending CUDA error", c->name);
    report(e == 0, check, "cudaDeviceSynchronize: %s", cu.err(e));

out:
    kiln_program_free(x.p);
    for (uint32_t i = 0; i < MAX_IO; i++) {
        if (x.d_in[i]) cu.free_(x.d_in[i]);
        if (x.d_out[i]) cu.free_(x.d_out[i]);
        free(x.h_out[i]);
        free(x.in[i].data);
        free(x.exp[i].data);
    }
}

int main(int argc, char **argv) {
    int fake = 0, usage = 0;
    const char *d = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device_opt = argv[++i];
        else if (strcmp(argv[i], "--fake-device") == 0)
            fake = 1;
        else if (argv[i][0] != '-' && d == NULL)
            d = argv[i];
        else
            usage = 1;
    }
    if (d == NULL || usage) {
        fprintf(stderr, "usage: %s DIR [--device cuda:0|cpu] [--fake-device]\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", d);
    char why[512] = "";
    int have_cuda = cuda_open(fake, why, sizeof why);
    if (!fake && strncmp(device_opt, "cpu", 3) == 0) device_io = 0;
    printf("check_program_cuda: device option %s, %s; executorch %s, registration %s\n", device_opt,
           fake        ? "FAKE device memory (host memory labelled CUDA)"
           : have_cuda ? "CUDA device memory"
                       : why,
           kiln_executorch_built_against(), kiln_executorch_owns_registration() ? "ok" : "MISSING");
    report(kiln_executorch_owns_registration() == 1, "KilnBackend registered",
           "registration error %u", kiln_executorch_registration_error());

    char path[1100];
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *f = fopen(path, "r");
    if (!report(f != NULL, "cases.txt readable", "cannot open %s", path)) goto done;
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) {
        test_case c;
        memset(&c, 0, sizeof c);
        if (sscanf(line, "%127s %d %lf %511s", c.name, &c.devio, &c.tol, c.outside) != 4) continue;
        run_case(&c, have_cuda);
    }
    fclose(f);
done:
    if (have_cuda && !device_io)
        printf("check_program_cuda: device=%s: device-pointer I/O not run (the CPU engine reads "
               "host memory); refusals checked\n",
               device_opt);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    if (n_fail > 0) return 1;
    if (!have_cuda) {
        printf("check_program_cuda: %s: the device-pointer checks did not run (exit 77)\n", why);
        return 77;
    }
    return 0;
}
