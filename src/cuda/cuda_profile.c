// SPDX-License-Identifier: Apache-2.0
// The option profile on the CUDA backend (cuda_backend.h): each launched layer's GPU time between
// two events and the host time spent on it, summed over the executes after the first two (which
// load modules lazily and set up first-use state). A short delay kernel ahead of each layer
// (cuda.profile_delay_us) lets the host queue the layer and its events before the GPU reaches
// it, so that the time between a layer's two events is GPU time, not launch latency. CUDA graphs
// are off while profiling. kiln_context_layer_info reports the means; freeing the context logs
// the table at INFO: per layer group its time, share, the bytes it moves (each tensor it reads
// and writes, once) and the rate, and for GEMM-like heads the FLOPs and the rate.
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_backend.h"

kiln_status kiln_cuda_profile_init(cuda_profile *pr, uint32_t n_layers) {
    memset(pr, 0, sizeof *pr);
    pr->ev = kiln_cuda_calloc(2 * (size_t)n_layers * sizeof *pr->ev + 1);
    pr->layer = kiln_cuda_calloc((size_t)n_layers * sizeof *pr->layer + 1);
    pr->us = kiln_cuda_calloc((size_t)n_layers * sizeof *pr->us + 1);
    pr->host_us = kiln_cuda_calloc((size_t)n_layers * sizeof *pr->host_us + 1);
    if (pr->ev == NULL || pr->layer == NULL || pr->us == NULL || pr->host_us == NULL) {
        kiln_cuda_profile_free(pr, n_layers);
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY, "out of memory (CUDA profile tables)");
    }
    for (uint32_t i = 0; i < 2 * n_layers; i++) {
        cudaError_t err = cudaEventCreate(&pr->ev[i]);
        if (err != cudaSuccess) {
            pr->ev[i] = NULL;
            kiln_cuda_profile_free(pr, n_layers);
            return kiln_cuda_call_failed("cudaEventCreate (profile)", err);
        }
    }
    return KILN_OK;
}

void kiln_cuda_profile_free(cuda_profile *pr, uint32_t n_layers) {
    if (pr->ev != NULL) {
        for (uint32_t i = 0; i < 2 * n_layers; i++) {
            if (pr->ev[i] != NULL) cudaEventDestroy(pr->ev[i]);
        }
    }
    kiln_cuda_free(pr->ev, 2 * (size_t)n_layers * sizeof *pr->ev + 1);
    kiln_cuda_free(pr->layer, (size_t)n_layers * sizeof *pr->layer + 1);
    kiln_cuda_free(pr->us, (size_t)n_layers * sizeof *pr->us + 1);
    kiln_cuda_free(pr->host_us, (size_t)n_layers * sizeof *pr->host_us + 1);
    memset(pr, 0, sizeof *pr);
}

kiln_status kiln_cuda_profile_begin(cuda_profile *pr, uint32_t li, cudaStream_t stream,
                                    unsigned delay_us) {
    KILN_CUDA_TRY(kiln_cuda_delay(stream, delay_us));
    pr->layer[pr->n] = li;
    cudaError_t err = cudaEventRecord(pr->ev[2 * pr->n], stream);
    return err == cudaSuccess ? KILN_OK : kiln_cuda_call_failed("cudaEventRecord (profile)", err);
}

kiln_status kiln_cuda_profile_end(cuda_profile *pr, uint32_t li, cudaStream_t stream,
                                  double host_us) {
    cudaError_t err = cudaEventRecord(pr->ev[2 * pr->n + 1], stream);
    if (err != cudaSuccess) return kiln_cuda_call_failed("cudaEventRecord (profile)", err);
    if (pr->warm >= 2) pr->host_us[li] += host_us;
    pr->n++;
    return KILN_OK;
}

kiln_status kiln_cuda_profile_collect(cuda_profile *pr) {
    if (pr->n == 0) return KILN_OK;
    if (pr->warm < 2) { // the first executes load modules lazily: not counted
        pr->warm++;
        pr->n = 0;
        return KILN_OK;
    }
    for (uint32_t k = 0; k < pr->n; k++) {
        float ms = 0;
        cudaError_t err = cudaEventElapsedTime(&ms, pr->ev[2 * k], pr->ev[2 * k + 1]);
        if (err != cudaSuccess) return kiln_cuda_call_failed("cudaEventElapsedTime (profile)", err);
        pr->us[pr->layer[k]] += 1000.0 * (double)ms;
    }
    pr->runs++;
    pr->n = 0;
    return KILN_OK;
}

// The bytes a layer group moves at these shapes: each distinct tensor its head and tail read
// (weights included) and the one it writes, once each; what the layer's time is compared with.
static double group_bytes(const cuda_context *c, uint32_t li) {
    const kiln_plan *p = c->engine->plan;
    const kiln_plan_layer *l = &p->layers[li];
    int32_t seen[KILN_MAX_INPUTS * (KILN_MAX_TAIL + 1) + 1];
    uint32_t n_seen = 0;
    double bytes = 0;
    for (uint32_t t = 0; t <= l->n_tail; t++) {
        const kiln_plan_layer *g = &p->layers[li + t];
        for (uint32_t j = 0; j < g->n_inputs; j++) {
            const int32_t r = p->ids[g->input_begin + j];
            if (r < 0 || (t > 0 && r == p->ids[p->layers[li + t - 1].output_begin])) continue;
            int dup = 0;
            for (uint32_t k = 0; k < n_seen; k++) dup |= seen[k] == r;
            if (dup || n_seen >= sizeof seen / sizeof seen[0]) continue;
            seen[n_seen++] = r;
            bytes += (double)kiln_tensor_numel(&c->views[r]) *
                     (double)kiln_cuda_dtype_size(c->views[r].dtype);
        }
    }
    const kiln_tensor *o = &c->views[p->ids[p->layers[li + l->n_tail].output_begin]];
    return bytes + (double)kiln_tensor_numel(o) * (double)kiln_cuda_dtype_size(o->dtype);
}

// The multiply-adds x 2 of a GEMM-like head at these shapes (0 for other ops): linear,
// matmul, conv2d, sdpa (both products; the causal half not discounted).
static double head_flops(const cuda_context *c, uint32_t li) {
    const kiln_plan *p = c->engine->plan;
    const kiln_plan_layer *l = &p->layers[li];
    const kiln_tensor *o = &c->views[p->ids[l->output_begin]];
    const int32_t a = l->n_inputs > 0 ? p->ids[l->input_begin] : -1;
    const int32_t w = l->n_inputs > 1 ? p->ids[l->input_begin + 1] : -1;
    if (a < 0 || w < 0 || c->views[a].rank == 0) return 0;
    const kiln_tensor *x = &c->views[a], *y = &c->views[w];
    const double out = (double)kiln_tensor_numel(o);
    switch (l->op) {
    case KILN_OP_LINEAR:
    case KILN_OP_MATMUL: return 2.0 * out * (double)x->dims[x->rank - 1];
    case KILN_OP_CONV2D:
        return y->rank == 4 ? 2.0 * out * (double)(y->dims[1] * y->dims[2] * y->dims[3]) : 0;
    case KILN_OP_SDPA: // q [.., L, E], k [.., S, E]: q k^T and p v
        return y->rank >= 2 ? 4.0 * out * (double)y->dims[y->rank - 2] : 0;
    default: return 0;
    }
}

void kiln_cuda_profile_log(const cuda_context *c) {
    const cuda_engine *e = c->engine;
    const kiln_plan *p = e->plan;
    const cuda_profile *pr = &c->prof;
    double total = 0;
    if (pr->runs == 0) return;
    for (uint32_t li = 0; li < p->n_layers; li++) total += pr->us[li];
    kiln_cuda_log(KILN_LOG_INFO,
                  "CUDA profile: %llu executes (after 2 uncounted), %.2f us of GPU time per "
                  "execute (graphs off; each layer timed alone behind a delay kernel)",
                  (unsigned long long)pr->runs, total / (double)pr->runs);
    for (uint32_t li = 0; li < p->n_layers; li += 1 + p->layers[li].n_tail) {
        const kiln_plan_layer *l = &p->layers[li];
        char tail[96] = "", dims[96] = "";
        size_t used = 0;
        if (e->fold.virt[li]) continue;
        for (uint32_t t = 0; t < l->n_tail && used + 16 < sizeof tail; t++) {
            int n = snprintf(tail + used, sizeof tail - used, "+%s",
                             kiln_cuda_op_name(p->layers[li + 1 + t].op));
            if (n > 0) used += (size_t)n;
        }
        const kiln_tensor *o = &c->views[p->ids[l->output_begin]];
        used = 0;
        for (uint32_t d = 0; d < o->rank && used + 24 < sizeof dims; d++) {
            int n = snprintf(dims + used, sizeof dims - used, "%s%lld", d ? "x" : "",
                             (long long)o->dims[d]);
            if (n > 0) used += (size_t)n;
        }
        double us = pr->us[li] / (double)pr->runs;
        const double mb = group_bytes(c, li) / 1e6, gflop = head_flops(c, li) / 1e9;
        char rate[64] = "";
        if (us > 0 && gflop > 0) {
            snprintf(rate, sizeof rate, " %6.3f GFLOP %6.1f TFLOP/s", gflop, gflop / us * 1e-3);
        }
        kiln_cuda_log(KILN_LOG_INFO,
                      "CUDA profile: layer %4u %-14s%-18s -> %-20s %9.2f us %5.1f%% %8.2f MB "
                      "%7.1f GB/s%s",
                      li, kiln_cuda_op_name(l->op), tail, dims, us,
                      total > 0 ? 100.0 * pr->us[li] / total : 0.0, mb,
                      us > 0 ? mb / us * 1e3 : 0.0, rate);
    }
}
