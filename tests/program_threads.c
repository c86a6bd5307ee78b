// SPDX-License-Identifier: Apache-2.0
// The C program API from many threads (kiln/kiln_program.h, over ExecuTorch's Module): for every
// exported program of the fuzz_program seed corpus (fuzz/corpus/fuzz_program/seed-*), 64 threads
// each run several inputs, with
//   - one program per thread (kiln_program_load in each thread), and
//   - one program shared by all threads (kiln_program_share: one ExecuTorch Program, a handle
//     with its own methods and engines per thread; programs without a .ptd),
// and every output must be bit-identical to the one a single thread computes for that input.
// Programs with state (seed-states-*: an output depends on the calls before it) are left out.
// Built in builds with the delegate (adapter/executorch/CMakeLists.txt) and run under
// ThreadSanitizer by python/tests/test_untrusted.py.
//
//   kiln_program_threads SEED_DIR [N_THREADS]
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln_program.h"

#define N_INPUTS 3 // per thread
#define MAX_IN 8

static int failures;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        pthread_mutex_lock(&fail_lock);                                                            \
        failures++;                                                                                \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        pthread_mutex_unlock(&fail_lock);                                                          \
    } while (0)

typedef struct prog_files {
    char name[256];
    char pte[512], ptd[512];
    int has_ptd;
} prog_files;

typedef struct reference {
    uint8_t *out[64 * N_INPUTS];
    size_t nbytes[64 * N_INPUTS];
} reference;

static kiln_option_setting cpu = {
    .name = "device", .type = KILN_OPTION_STRING, .string_value = "cpu"};

static kiln_status load(const prog_files *f, kiln_program **out) {
    kiln_program_options o;
    kiln_program_options_init(&o);
    const char *paths[1] = {f->ptd};
    if (f->has_ptd) {
        o.data_paths = paths;
        o.n_data_paths = 1;
    }
    o.settings = &cpu;
    o.n_settings = 1;
    return kiln_program_load(f->pte, &o, out);
}

// Runs "forward" on input number k (values from k); returns a malloc'd copy of output 0.
static kiln_status run(kiln_program *p, int k, uint8_t **out, size_t *out_n) {
    uint32_t n_in = 0;
    kiln_status st = kiln_program_n_inputs(p, NULL, &n_in);
    void *bufs[MAX_IN] = {0};
    for (uint32_t i = 0; st == KILN_OK && i < n_in && i < MAX_IN; i++) {
        kiln_tensor_info info;
        st = kiln_program_input_info(p, NULL, i, &info);
        if (st != KILN_OK || !info.is_tensor) continue;
        uint8_t *x = malloc(info.nbytes + 1);
        bufs[i] = x;
        uint64_t seed = 0x9e3779b97f4a7c15u * (uint64_t)(k + 1) + i;
        for (uint64_t b = 0; b < info.nbytes; b++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            x[b] = (uint8_t)((seed >> 33) & (info.dtype == KILN_DTYPE_F32 ? 0x3f : 0x01));
        }
        kiln_input in = {.data = x, .dtype = info.dtype, .rank = info.rank, .dims = info.dims};
        st = kiln_program_set_input(p, NULL, i, &in);
    }
    if (st == KILN_OK) st = kiln_program_execute(p, NULL);
    kiln_output y;
    if (st == KILN_OK) st = kiln_program_output(p, NULL, 0, &y);
    if (st == KILN_OK) {
        *out_n = (size_t)y.nbytes;
        *out = malloc(*out_n + 1);
        memcpy(*out, y.data, *out_n);
    }
    for (int i = 0; i < MAX_IN; i++) free(bufs[i]);
    return st;
}

typedef struct job {
    const prog_files *f;
    const reference *ref;
    const kiln_program *shared; // NULL: load a program of its own
    int thread;
    int n_threads;
} job;

static void *worker(void *arg) {
    const job *j = arg;
    kiln_program *p = NULL;
    kiln_status st = j->shared ? kiln_program_share(j->shared, &p) : load(j->f, &p);
    if (st != KILN_OK) {
        FAIL("%s thread %d: %s: %s", j->f->name, j->thread, j->shared ? "share" : "load",
             kiln_program_last_error());
        return NULL;
    }
    for (int r = 0; r < N_INPUTS; r++) {
        int k = j->thread + r * j->n_threads;
        uint8_t *y = NULL;
        size_t n = 0;
        st = run(p, k, &y, &n);
        if (st != KILN_OK) {
            FAIL("%s thread %d input %d: %s", j->f->name, j->thread, k, kiln_program_last_error());
        } else if (n != j->ref->nbytes[k] || memcmp(y, j->ref->out[k], n) != 0) {
            FAIL("%s thread %d input %d (%s): output differs from the single-threaded one",
                 j->f->name, j->thread, k, j->shared ? "shared program" : "own program");
        }
        free(y);
    }
    kiln_program_free(p);
    return NULL;
}

static void run_threads(const prog_files *f, const reference *ref, const kiln_program *shared,
                        int n_threads) {
    pthread_t t[64];
    job jobs[64];
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (job){f, ref, shared, i, n_threads};
        if (pthread_create(&t[i], NULL, worker, &jobs[i]) != 0) {
            FAIL("pthread_create failed");
            n_threads = i;
            break;
        }
    }
    for (int i = 0; i < n_threads; i++) pthread_join(t[i], NULL);
}

static int split_seed(const char *path, const char *dir, prog_files *f) {
    FILE *in = fopen(path, "rb");
    if (in == NULL) return 0;
    fseek(in, 0, SEEK_END);
    long len = ftell(in);
    fseek(in, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    size_t got = fread(b, 1, (size_t)len, in);
    fclose(in);
    if (got < 4) {
        free(b);
        return 0;
    }
    size_t n = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (n > got - 4) n = got - 4;
    snprintf(f->pte, sizeof f->pte, "%s/p.pte", dir);
    snprintf(f->ptd, sizeof f->ptd, "%s/d.ptd", dir);
    FILE *o = fopen(f->pte, "wb");
    fwrite(b + 4, 1, n, o);
    fclose(o);
    f->has_ptd = got - 4 - n > 0;
    if (f->has_ptd) {
        o = fopen(f->ptd, "wb");
        fwrite(b + 4 + n, 1, got - 4 - n, o);
        fclose(o);
    }
    free(b);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SEED_DIR [N_THREADS]\n", argv[0]);
        return 2;
    }
    int n_threads = argc > 2 ? atoi(argv[2]) : 64;
    if (n_threads < 1 || n_threads > 64) n_threads = 64;
    kiln_log_set(NULL, NULL, KILN_LOG_NONE);
    DIR *d = opendir(argv[1]);
    if (d == NULL) {
        fprintf(stderr, "cannot open %s\n", argv[1]);
        return 2;
    }
    char tmp[] = "/tmp/kiln-threads-XXXXXX";
    if (mkdtemp(tmp) == NULL) return 2;
    int n_programs = 0, n_shared = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "seed-", 5) != 0 || strncmp(e->d_name, "seed-states-", 12) == 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        prog_files f;
        snprintf(f.name, sizeof f.name, "%s", e->d_name);
        if (!split_seed(path, tmp, &f)) continue;
        // The single-threaded reference for every input the threads will run.
        kiln_program *p = NULL;
        if (load(&f, &p) != KILN_OK) {
            FAIL("%s: the seed does not load: %s", f.name, kiln_program_last_error());
            continue;
        }
        reference ref;
        memset(&ref, 0, sizeof ref);
        int ok = 1;
        for (int k = 0; k < n_threads * N_INPUTS && ok; k++) {
            if (run(p, k, &ref.out[k], &ref.nbytes[k]) != KILN_OK) {
                FAIL("%s: single-threaded run %d: %s", f.name, k, kiln_program_last_error());
                ok = 0;
            }
        }
        if (ok) {
            run_threads(&f, &ref, NULL, n_threads);
            if (!f.has_ptd) {
                run_threads(&f, &ref, p, n_threads);
                n_shared++;
            } else {
                kiln_program *q = NULL; // sharing is refused, by name
                if (kiln_program_share(p, &q) != KILN_ERR_UNSUPPORTED ||
                    strstr(kiln_program_last_error(), "once per thread") == NULL)
                    FAIL("%s: kiln_program_share of a program with a .ptd: %s", f.name,
                         kiln_program_last_error());
            }
            n_programs++;
        }
        kiln_program_free(p);
        for (int k = 0; k < 64 * N_INPUTS; k++) free(ref.out[k]);
    }
    closedir(d);
    unlink(tmp);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "%s/p.pte", tmp);
    unlink(cmd);
    snprintf(cmd, sizeof cmd, "%s/d.ptd", tmp);
    unlink(cmd);
    rmdir(tmp);
    printf("%d programs (%d shared) x %d threads x %d inputs: %d failures\n", n_programs, n_shared,
           n_threads, N_INPUTS, failures);
    return failures != 0 || n_programs == 0;
}
