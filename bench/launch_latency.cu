// SPDX-License-Identifier: Apache-2.0
// Host latency of a CUDA graph's launch plus the wait for its end, by how the end is observed
// (docs/cuda.md "The end of an execute"): cudaStreamSynchronize, or a spin on pinned host memory
// that the graph's last node writes (a kernel, a memset node, a cuStreamWriteValue32 node).
// Graphs of 1 and 7 empty kernels, plain and with programmatic dependent launch; each variant
// launched 3000 times after 200 warm-ups, interleaved, median in microseconds.
//
// Built with the CUDA plugin (target kiln_launch_latency; tools/gpu_suite.sh --prepare copies it
// to .dev/gpu, and --run prints it as the step "bench: graph launch and wait"), or alone:
//   nvcc -O2 -arch=sm_90 -o /tmp/launch_latency bench/launch_latency.cu
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void empty_kernel(int *p) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p != nullptr && threadIdx.x == 1023) *p = 1; // never taken: keeps the kernel
}

__global__ void flag_kernel(volatile unsigned *f) {
    __threadfence_system();
    *f = 0;
}

typedef CUresult (*write_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
static write_value_fn write_value;

enum { END_SYNC, END_KERNEL, END_MEMSET, END_WRITE_VALUE, N_END };
static const char *const end_names[N_END] = {"stream synchronize", "flag kernel", "flag memset",
                                             "flag write-value"};

static double now_us(void) {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void launch_empty(cudaStream_t s, int pdl) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.stream = s;
    if (pdl) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    CK(cudaLaunchKernelEx(&cfg, empty_kernel, (int *)nullptr));
}

static cudaGraphExec_t make_graph(cudaStream_t s, int kernels, int pdl, int end, unsigned *flag) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kernels; i++) launch_empty(s, pdl && i > 0);
    if (end == END_KERNEL) flag_kernel<<<1, 1, 0, s>>>(flag);
    if (end == END_MEMSET) CK(cudaMemsetAsync(flag, 0, sizeof(unsigned), s));
    if (end == END_WRITE_VALUE && write_value(s, (CUdeviceptr)flag, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "cuStreamWriteValue32 failed\n");
        exit(1);
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
}

int main(void) {
    const int runs = 3000, warm = 200;
    cudaStream_t s;
    unsigned *host_flag, *dev_flag;
    cudaDriverEntryPointQueryResult q;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaHostAlloc((void **)&host_flag, 64, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&dev_flag, host_flag, 0));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void **)&write_value, 12000,
                                        cudaEnableDefault, &q));
    volatile unsigned *flag = host_flag;
    for (int kernels : {1, 7}) {
        for (int pdl = 0; pdl < 2; pdl++) {
            cudaGraphExec_t ge[N_END];
            std::vector<double> t[N_END];
            for (int v = 0; v < N_END; v++) ge[v] = make_graph(s, kernels, pdl, v, dev_flag);
            for (int it = 0; it < runs + warm; it++) {
                for (int v = 0; v < N_END; v++) {
                    *flag = 1;
                    const double t0 = now_us();
                    CK(cudaGraphLaunch(ge[v], s));
                    if (v == END_SYNC) {
                        CK(cudaStreamSynchronize(s));
                    } else {
                        while (*flag != 0) {
                        }
                    }
                    const double t1 = now_us();
                    if (v != END_SYNC) CK(cudaStreamSynchronize(s));
                    if (it >= warm) t[v].push_back(t1 - t0);
                }
            }
            printf("%d kernel(s)%s:", kernels, pdl ? ", PDL" : "");
            for (int v = 0; v < N_END; v++) {
                std::sort(t[v].begin(), t[v].end());
                printf(" %s %.2f us%s", end_names[v], t[v][t[v].size() / 2],
                       v + 1 < N_END ? " |" : "\n");
                CK(cudaGraphExecDestroy(ge[v]));
            }
        }
    }
    CK(cudaFreeHost(host_flag));
    CK(cudaStreamDestroy(s));
    return 0;
}
