// SPDX-License-Identifier: Apache-2.0
// The weight stream of an LLM decode step on this GPU: how fast GEMV kernels of different forms
// read the weights of a Llama-3.2-1B-shaped decoder (16 layers of q 2048x2048, k and v 512x2048,
// o 2048x2048, gate and up 8192x2048, down 2048x8192, then the 128256x2048 logits head; bfloat16,
// 2.47 GB, distinct buffers so nothing stays in L2 from one replay to the next), one row of x.
// Each form runs the whole step as one CUDA graph (PDL on), replayed 20 times; printed: the mean
// step time, the bytes over it, and per-shape times of each kernel alone (back to back, the same
// weight: partly L2-hot for the small ones). "merged" runs q/k/v as one 3072x2048 GEMV and
// gate/up as one 16384x2048 GEMV (what a sibling-linear merge gives).
// Forms:
//   cols2   - Kiln's GEMV (op_gemv.cu): a warp per 2 output columns, 4 x 16-byte loads in flight
//             per column per lane, warps splitting K when the output is narrow;
//   cols4   - the same with 4 columns per warp;
//   rows    - a persistent kernel: every warp walks rows (output columns) grid-stride, a whole row
//             of K loaded per lane at once, the next row's loads issued before the current row's
//             reduction (a continuous stream per warp).
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/gemv_probe bench/gemv_probe.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef __nv_bfloat16 T;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void unpack(const uint4 &u, float *f) {
    const T *h = (const T *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = __bfloat162float(h[i]);
}

__device__ __forceinline__ uint4 ldw(const uint4 *p, uint64_t cp) {
    uint4 v;
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(cp));
    return v;
}

__device__ __forceinline__ uint64_t evict_first() {
    uint64_t cp;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(cp));
    return cp;
}

// --- cols: Kiln's form (COLS columns per warp, KS warps splitting K)
template <int COLS, int KS>
__global__ void __launch_bounds__(256)
    gemv_cols(const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y, int n, int k) {
    constexpr int WARPS = 8, UNROLL = 4, GROUPS = WARPS / KS;
    __shared__ float part[WARPS * COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = warp / KS, ks = warp % KS;
    const int col0 = (blockIdx.x * GROUPS + grp) * COLS;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    if (KS == 1 && col0 >= n) return;
    const int kv = k / 8;
    float acc[COLS] = {};
    const uint4 *wv[COLS];
    for (int c = 0; c < COLS; c++) wv[c] = (const uint4 *)(w + (size_t)min(col0 + c, n - 1) * k);
    const uint4 *xv = (const uint4 *)x;
    const uint64_t cp = evict_first();
    for (int j0 = lane + 32 * ks; j0 < kv; j0 += 32 * KS * UNROLL) {
        uint4 wb[UNROLL][COLS];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int j = j0 + 32 * KS * u;
#pragma unroll
            for (int c = 0; c < COLS; c++)
                wb[u][c] = j < kv ? ldw(wv[c] + j, cp) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int j = j0 + 32 * KS * u;
            if (j >= kv) break;
            float xf[8];
            unpack(__ldg(xv + j), xf);
#pragma unroll
            for (int c = 0; c < COLS; c++) {
                float wf[8];
                unpack(wb[u][c], wf);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[c] = fmaf(wf[e], xf[e], acc[c]);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < COLS; c++) acc[c] = warp_sum(acc[c]);
    if (KS == 1) {
        if (lane < COLS && col0 + lane < n) {
            float v = 0;
#pragma unroll
            for (int c = 0; c < COLS; c++)
                if (lane == c) v = acc[c];
            y[col0 + lane] = __float2bfloat16(v);
        }
        return;
    }
    if (lane == 0)
        for (int c = 0; c < COLS; c++) part[warp * COLS + c] = acc[c];
    __syncthreads();
    if (ks == 0 && lane < COLS && col0 + lane < n) {
        float v = 0;
        for (int s = 0; s < KS; s++) v += part[(grp * KS + s) * COLS + lane];
        y[col0 + lane] = __float2bfloat16(v);
    }
}

// --- rows: persistent, a whole row per warp per step, next row prefetched (K = 2048 or 8192:
// V = K / 256 vectors per lane)
template <int V>
__global__ void __launch_bounds__(256)
    gemv_rows(const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y, int n, int k) {
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    const uint64_t cp = evict_first();
    const uint4 *xv = (const uint4 *)x;
    float xf[V][8];
#pragma unroll
    for (int v = 0; v < V; v++) unpack(__ldg(xv + lane + 32 * v), xf[v]);
    uint4 cur[V];
    int r = gw;
    if (r >= n) return;
#pragma unroll
    for (int v = 0; v < V; v++)
        cur[v] = ldw((const uint4 *)(w + (size_t)r * k) + lane + 32 * v, cp);
    while (r < n) {
        const int nx = r + nw;
        uint4 nxt[V];
        if (nx < n) {
#pragma unroll
            for (int v = 0; v < V; v++)
                nxt[v] = ldw((const uint4 *)(w + (size_t)nx * k) + lane + 32 * v, cp);
        }
        float acc = 0;
#pragma unroll
        for (int v = 0; v < V; v++) {
            float wf[8];
            unpack(cur[v], wf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[v][e], acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) y[r] = __float2bfloat16(acc);
        if (nx < n) {
#pragma unroll
            for (int v = 0; v < V; v++) cur[v] = nxt[v];
        }
        r = nx;
    }
}

__global__ void fill(T *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.05f);
    }
}

struct Lin {
    int n, k;
    T *w;
};

static int sms;

template <typename K>
static void go(K kern, int blocks, cudaStream_t s, const T *x, const Lin &l, T *y) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kern, x, (const T *)l.w, y, l.n, l.k));
}

// One GEMV of form `form` on stream s.
static void enqueue(int form, const Lin &l, const T *x, T *y, cudaStream_t s) {
    if (form == 0 || form == 1) {
        const int cols = form == 0 ? 2 : 4;
        const int whole = (l.n + 8 * cols - 1) / (8 * cols);
        const int split = (l.n + cols - 1) / cols;
        if (whole < sms) {
            if (cols == 2)
                go(gemv_cols<2, 8>, split, s, x, l, y);
            else
                go(gemv_cols<4, 8>, split, s, x, l, y);
        } else {
            if (cols == 2)
                go(gemv_cols<2, 1>, whole, s, x, l, y);
            else
                go(gemv_cols<4, 1>, whole, s, x, l, y);
        }
    } else {
        const int blocks = sms * (l.k == 2048 ? 4 : 2);
        if (l.k == 2048)
            go(gemv_rows<8>, blocks, s, x, l, y);
        else
            go(gemv_rows<32>, blocks, s, x, l, y);
    }
}

int main() {
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int L = 16, D = 2048, F = 8192, KV = 512, V = 128256;
    std::vector<Lin> sep, mer;
    size_t bytes = 0;
    unsigned seed = 1;
    auto mk = [&](int n, int k) {
        Lin l{n, k, nullptr};
        CK(cudaMalloc(&l.w, (size_t)n * k * sizeof(T)));
        fill<<<1024, 256>>>(l.w, (size_t)n * k, seed++);
        bytes += (size_t)n * k * sizeof(T);
        return l;
    };
    for (int i = 0; i < L; i++) {
        Lin q = mk(D, D), kk = mk(KV, D), vv = mk(KV, D), o = mk(D, D), g = mk(F, D), u = mk(F, D),
            d = mk(D, F);
        sep.insert(sep.end(), {q, kk, vv, o, g, u, d});
        // merged: q/k/v and gate/up as one weight each (their own buffers; counted once)
        Lin qkv = mk(D + 2 * KV, D), gu = mk(2 * F, D);
        bytes -= (size_t)(D + 2 * KV + 2 * F) * D * sizeof(T);
        mer.insert(mer.end(), {qkv, o, gu, d});
    }
    Lin head = mk(V, D);
    sep.push_back(head);
    mer.push_back(head);
    T *x, *y;
    CK(cudaMalloc(&x, F * sizeof(T)));
    CK(cudaMalloc(&y, (size_t)V * sizeof(T) * 2));
    fill<<<64, 256>>>(x, F, 99);
    CK(cudaDeviceSynchronize());
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("SMs %d, step weight bytes %.3f GB\n", sms, bytes / 1e9);
    const char *names[3] = {"cols2", "cols4", "rows"};
    for (int form = 0; form < 3; form++) {
        for (int variant = 0; variant < 2; variant++) {
            std::vector<Lin> &seq = variant ? mer : sep;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (const Lin &l : seq) enqueue(form, l, x, y, s);
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            const int R = 20;
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < R; i++) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaStreamSynchronize(s));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ms /= R;
            printf("%-6s %-9s kernels %3zu  step %.3f ms  %.2f TB/s\n", names[form],
                   variant ? "merged" : "separate", seq.size(), ms, bytes / (ms * 1e-3) / 1e12);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    }
    // each shape alone (the same weight back to back), and the forms' outputs against cols2
    const Lin shapes[6] = {sep[0], sep[1], sep[4], sep[6], mer[0], head};
    T *y2;
    CK(cudaMalloc(&y2, (size_t)V * sizeof(T)));
    std::vector<T> ha(V), hb(V);
    for (const Lin &l : shapes) {
        printf("%6d x %5d:", l.n, l.k);
        enqueue(0, l, x, y2, s);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(ha.data(), y2, l.n * sizeof(T), cudaMemcpyDeviceToHost));
        for (int form = 0; form < 3; form++) {
            const int R = 50;
            for (int i = 0; i < 3; i++) enqueue(form, l, x, y, s);
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < R; i++) enqueue(form, l, x, y, s);
            CK(cudaEventRecord(e1, s));
            CK(cudaStreamSynchronize(s));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            CK(cudaMemcpy(hb.data(), y, l.n * sizeof(T), cudaMemcpyDeviceToHost));
            float md = 0, mx = 0;
            for (int i = 0; i < l.n; i++) {
                float a = __bfloat162float(ha[i]), b = __bfloat162float(hb[i]);
                md = fmaxf(md, fabsf(a - b));
                mx = fmaxf(mx, fabsf(a));
            }
            printf("  %s %.2f us (%.2f TB/s, diff %.1e)", names[form], ms * 1e3 / R,
                   (double)l.n * l.k * sizeof(T) / (ms * 1e-3 / R) / 1e12, md / (mx > 0 ? mx : 1));
        }
        printf("\n");
    }
    return 0;
}
