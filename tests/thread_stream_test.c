// SPDX-License-Identifier: Apache-2.0
// kiln_set_thread_stream / kiln_thread_stream on the CPU: the value is per thread (two threads
// see only their own), NULL clears it, and execute on the CPU backend ignores it (a bogus
// non-NULL stream must not be touched) while the results stay equal to a naive reference.
// The CUDA side (work really running on the thread's stream) is in tests/cuda/cuda_parity.c.
#include <pthread.h> // not C11 threads: ThreadSanitizer only follows pthread_create
#include <sched.h>
#include <stdatomic.h>

#include "test_util.h"

#define K 12
#define N 7
#define B 5

typedef struct seen {
    void *mine;          // what this thread sets
    void *before;        // kiln_thread_stream() before setting
    void *after_set;     // after kiln_set_thread_stream(mine)
    void *after_barrier; // after the other thread has set its own value
    void *after_clear;   // after kiln_set_thread_stream(NULL)
    kiln_status st;
} seen;

// A two-thread barrier (pthread_barrier_t is not in strict C11 + POSIX 2001 headers here).
static atomic_int arrived;

static void barrier_wait(int round) {
    atomic_fetch_add(&arrived, 1);
    while (atomic_load(&arrived) < 2 * round) sched_yield();
}

static void *setter_main(void *arg) {
    seen *s = arg;
    s->before = kiln_thread_stream();
    s->st = kiln_set_thread_stream(s->mine);
    s->after_set = kiln_thread_stream();
    barrier_wait(1); // both threads have set their values
    s->after_barrier = kiln_thread_stream();
    barrier_wait(2);
    kiln_set_thread_stream(NULL);
    s->after_clear = kiln_thread_stream();
    return NULL;
}

static void test_per_thread(void) {
    static int a, b; // two distinct addresses standing in for cudaStream_t values
    seen s[2] = {{.mine = &a}, {.mine = &b}};
    pthread_t t[2];
    void *main_stream = (void *)&s; // the main thread's own value must survive the workers
    CHECK_OK(kiln_set_thread_stream(main_stream));
    atomic_store(&arrived, 0);
    for (int k = 0; k < 2; k++) CHECK(pthread_create(&t[k], NULL, setter_main, &s[k]) == 0);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(s[k].st, KILN_OK);
        CHECK(s[k].before == NULL); // a new thread starts without a stream
        CHECK(s[k].after_set == s[k].mine);
        CHECK(s[k].after_barrier == s[k].mine); // not the other thread's value
        CHECK(s[k].after_clear == NULL);
    }
    CHECK(kiln_thread_stream() == main_stream);
    CHECK_OK(kiln_set_thread_stream(NULL));
    CHECK(kiln_thread_stream() == NULL);
}

// y = relu(x @ w^T + bias) on the CPU with a thread stream set: ignored, results exact vs ref.
static void test_cpu_execute_ignores_it(void) {
    static float w[N * K], bias[N], x[B * K], y[B * N], want[B * N];
    kiln_graph *g = NULL;
    kiln_built *built = NULL;
    kiln_engine *e = NULL;
    kiln_context *c = NULL;
    int32_t xi, wi, bi, h;
    tu_fill(w, N * K, -0.5f, 0.5f);
    tu_fill(bias, N, -0.5f, 0.5f);
    tu_fill(x, B * K, -1.0f, 1.0f);
    CHECK_OK(kiln_graph_new(&g));
    if (g == NULL) return;
    xi = tu_input(g, "x", KILN_DTYPE_F32, 2, TU_DIMS(1, K), TU_DIMS(B, K));
    wi = tu_const(g, "w", KILN_DTYPE_F32, 2, TU_DIMS(N, K), w);
    bi = tu_const(g, "b", KILN_DTYPE_F32, 1, TU_DIMS(N), bias);
    h = tu_node(g, KILN_OP_LINEAR, TU_IDS(xi, wi, bi), TU_NO_ATTRS);
    h = tu_node(g, KILN_OP_RELU, TU_IDS(h), TU_NO_ATTRS);
    tu_output(g, h, "y");
    CHECK_OK(tu_build(g, KILN_PRECISION_FP32, 0, &built));
    kiln_graph_free(g);
    if (built == NULL) return;
    CHECK_OK(tu_load(built, "cpu", &e));
    kiln_built_free(built);
    if (e == NULL) return;
    CHECK_OK(kiln_context_new(e, &c));
    if (c == NULL) {
        kiln_engine_free(e);
        return;
    }
    // Naive reference, written out here (not ref_linear) so the check is independent.
    for (int64_t i = 0; i < B; i++) {
        for (int64_t j = 0; j < N; j++) {
            double acc = bias[j];
            for (int64_t k = 0; k < K; k++) acc += (double)x[i * K + k] * (double)w[j * K + k];
            want[i * N + j] = acc > 0 ? (float)acc : 0.0f;
        }
    }
    // A bogus, non-NULL "stream": the CPU backend must never dereference it.
    CHECK_OK(kiln_set_thread_stream((void *)(uintptr_t)0xdead0000u));
    for (int64_t b = 1; b <= B; b += 2) {
        for (size_t i = 0; i < B * N; i++) y[i] = -7.0f;
        CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(b, K), x));
        CHECK_OK(kiln_context_set_output(c, 0, y, sizeof y));
        CHECK_OK(kiln_context_execute(c));
        for (int64_t i = 0; i < b * N; i++) CHECK_NEAR(y[i], want[i], 1e-5, 1e-5);
    }
    // The context's own stream takes precedence; also ignored on the CPU.
    CHECK_OK(kiln_context_set_stream(c, (void *)(uintptr_t)0xbeef0000u));
    CHECK_OK(kiln_context_set_input(c, 0, 2, TU_DIMS(B, K), x));
    CHECK_OK(kiln_context_execute(c));
    for (int64_t i = 0; i < B * N; i++) CHECK_NEAR(y[i], want[i], 1e-5, 1e-5);
    CHECK_OK(kiln_set_thread_stream(NULL));
    CHECK(kiln_thread_stream() == NULL);
    kiln_context_free(c);
    kiln_engine_free(e);
}

int main(void) {
    test_per_thread();
    test_cpu_execute_ignores_it();
    return check_summary();
}
