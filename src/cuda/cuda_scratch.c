// SPDX-License-Identifier: Apache-2.0
// The registry of shared activation arenas, one per CUDA device (cuda_scratch.h).
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_ops.h"
#include "cuda/cuda_scratch.h"

struct kiln_cuda_scratch {
    int device;
    void *base;           // device block, nbytes (NULL while the arena has no user)
    size_t nbytes;        // registry lock and execution lock to write; either one to read
    uint32_t users;       // registry lock
    uint64_t generation;  // bumped whenever base changes (never reused: it only grows)
    pthread_mutex_t exec; // the execution lock
};

static kiln_cuda_scratch arenas[KILN_CUDA_SCRATCH_MAX_DEVICES];
static pthread_mutex_t registry_mtx;
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;
static int registry_ok;

static void registry_init(void) {
    int ok = pthread_mutex_init(&registry_mtx, NULL) == 0;
    for (int d = 0; d < KILN_CUDA_SCRATCH_MAX_DEVICES && ok; d++) {
        arenas[d].device = d;
        ok = pthread_mutex_init(&arenas[d].exec, NULL) == 0;
    }
    registry_ok = ok;
}

// Replaces s's block by a zeroed one of nbytes (registry lock held). Takes the execution lock,
// so no user is executing, and synchronizes the device before freeing the old block; on
// failure the old block stays and *what names the failed call. Logs nothing (the caller does,
// after unlocking: a log hook must never run under these locks).
static cudaError_t grow(kiln_cuda_scratch *s, size_t nbytes, const char **what) {
    void *fresh = NULL;
    pthread_mutex_lock(&s->exec);
    *what = "cudaMalloc";
    cudaError_t err = cudaMalloc(&fresh, nbytes);
    if (err == cudaSuccess) {
        *what = "cudaMemset";
        err = cudaMemset(fresh, 0, nbytes);
    }
    if (err == cudaSuccess) {
        *what = "cudaDeviceSynchronize";
        err = cudaDeviceSynchronize(); // the zeroing, and any work still on the old block
    }
    if (err != cudaSuccess) {
        if (fresh != NULL) cudaFree(fresh);
        cudaGetLastError(); // reported by the caller: leave nothing pending
        pthread_mutex_unlock(&s->exec);
        return err;
    }
    if (s->base != NULL) cudaFree(s->base);
    cudaGetLastError();
    s->base = fresh;
    s->nbytes = nbytes;
    s->generation++;
    pthread_mutex_unlock(&s->exec);
    return cudaSuccess;
}

kiln_status kiln_cuda_scratch_acquire(int device, size_t nbytes, kiln_cuda_scratch **out) {
    kiln_cuda_scratch *s;
    cudaError_t err = cudaSuccess;
    const char *what = "";
    if (device < 0 || device >= KILN_CUDA_SCRATCH_MAX_DEVICES) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "use_shared_activation_scratch: device %d is beyond the %d devices "
                              "that share arenas (cuda:0 .. cuda:%d); set the option to false",
                              device, KILN_CUDA_SCRATCH_MAX_DEVICES,
                              KILN_CUDA_SCRATCH_MAX_DEVICES - 1);
    }
    pthread_once(&registry_once, registry_init);
    if (!registry_ok) {
        return kiln_cuda_fail(KILN_ERR_INTERNAL,
                              "use_shared_activation_scratch: the arena registry's locks could "
                              "not be created; set the option to false");
    }
    s = &arenas[device];
    pthread_mutex_lock(&registry_mtx);
    size_t before = s->nbytes;
    if (nbytes > s->nbytes) err = grow(s, nbytes, &what);
    if (err == cudaSuccess) s->users++;
    size_t now = s->nbytes;
    uint32_t users = s->users;
    pthread_mutex_unlock(&registry_mtx);
    if (err == cudaErrorMemoryAllocation) {
        return kiln_cuda_fail(KILN_ERR_NO_MEMORY,
                              "out of device memory for the shared activation arena of device %d "
                              "(use_shared_activation_scratch): %zu bytes needed, %zu allocated "
                              "now; free contexts or engines on this device, or load the engine "
                              "with smaller shape ranges",
                              device, nbytes, before);
    }
    if (err != cudaSuccess) {
        return kiln_cuda_fail(KILN_ERR_DEVICE,
                              "CUDA error in %s growing the shared activation arena of device %d "
                              "to %zu bytes (use_shared_activation_scratch): %s (%s)",
                              what, device, nbytes, cudaGetErrorName(err), cudaGetErrorString(err));
    }
    if (now != before) {
        kiln_cuda_log(KILN_LOG_INFO,
                      "shared activation scratch on device %d: %zu bytes, %u contexts (grown from "
                      "%zu bytes)",
                      device, now, users, before);
    } else {
        kiln_cuda_log(KILN_LOG_INFO,
                      "shared activation scratch on device %d: %zu bytes, %u contexts (a context "
                      "of %zu bytes joined)",
                      device, now, users, nbytes);
    }
    *out = s;
    return KILN_OK;
}

void kiln_cuda_scratch_release(kiln_cuda_scratch *s) {
    size_t nbytes, freed = 0;
    uint32_t users;
    if (s == NULL) return;
    pthread_mutex_lock(&registry_mtx);
    if (s->users > 0) s->users--;
    if (s->users == 0 && s->base != NULL) {
        int prev = -1;
        freed = s->nbytes;
        pthread_mutex_lock(&s->exec);
        if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
        if (prev != s->device) cudaSetDevice(s->device);
        cudaFree(s->base);
        if (prev >= 0 && prev != s->device) cudaSetDevice(prev);
        cudaGetLastError(); // nothing to report from a free: leave nothing pending
        s->base = NULL;
        s->nbytes = 0;
        s->generation++;
        pthread_mutex_unlock(&s->exec);
    }
    nbytes = s->nbytes;
    users = s->users;
    pthread_mutex_unlock(&registry_mtx);
    if (freed > 0) {
        kiln_cuda_log(KILN_LOG_INFO,
                      "shared activation scratch on device %d: %zu bytes freed, 0 contexts",
                      s->device, freed);
    } else {
        kiln_cuda_log(KILN_LOG_DEBUG,
                      "shared activation scratch on device %d: %zu bytes, %u contexts (a context "
                      "left)",
                      s->device, nbytes, users);
    }
}

void *kiln_cuda_scratch_lock(kiln_cuda_scratch *s, uint64_t *generation) {
    pthread_mutex_lock(&s->exec);
    *generation = s->generation;
    return s->base;
}

void kiln_cuda_scratch_unlock(kiln_cuda_scratch *s) { pthread_mutex_unlock(&s->exec); }
