// SPDX-License-Identifier: Apache-2.0
// The option profile on the CUDA backend (cuda_backend.h): each launched layer's GPU time between
// two events and the host time spent on it, summed over the executes after the first two (which
// load modules lazily and set up first-use state). A short delay kernel ahead of each layer
// (cuda.profile_delay_us) lets the host queue the layer and its events before the GPU reaches
// it, so that the time between a layer's two events is GPU time, not launch latency. CUDA graphs
// are off while profiling. kiln_context_layer_info reports the means; freeing the context logs
// the table at INFO.
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
        kiln_cuda_log(KILN_LOG_INFO, "CUDA profile: layer %4u %-14s%-18s -> %-20s %9.2f us %5.1f%%",
                      li, kiln_cuda_op_name(l->op), tail, dims, us,
                      total > 0 ? 100.0 * pr->us[li] / total : 0.0);
    }
}
