// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's entry point (runtime/backend_plugin.h): checks libkiln's ABI and version,
// installs its services, probes the driver and devices once, and hands back the backend table
// (cuda_backend.c).
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_backend.h"

#if defined(__GNUC__)
#define KILN_CUDA_EXPORT __attribute__((visibility("default")))
#else
#define KILN_CUDA_EXPORT
#endif

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_ok;
static int probe_count;
static char probe_reason[512];
static char version_text[512];

static int plugin_device_count(void) { return probe_count; }
static const char *plugin_version(void) { return version_text; }

static void probe(void) {
    int drv = 0, rt = 0, n = 0, usable = 0;
    size_t lt_version = cublasLtGetVersion();
    struct cudaDeviceProp prop0;
    cudaError_t err = cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    kiln_cuda_consume();
    if (err != cudaSuccess || drv == 0) {
        snprintf(probe_reason, sizeof probe_reason,
                 "no NVIDIA driver was found (cudaDriverGetVersion: %s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "version 0");
        return;
    }
    err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(probe_reason, sizeof probe_reason,
                 "cudaGetDeviceCount failed: %s (%s); driver CUDA %d.%d, runtime %d.%d",
                 cudaGetErrorName(err), cudaGetErrorString(err), drv / 1000, (drv % 1000) / 10,
                 rt / 1000, (rt % 1000) / 10);
        kiln_cuda_consume();
        return;
    }
    if (n <= 0) {
        snprintf(probe_reason, sizeof probe_reason, "no CUDA device is visible");
        return;
    }
    memset(&prop0, 0, sizeof prop0);
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
            kiln_cuda_consume();
            continue;
        }
        if (d == 0) prop0 = prop;
        if (prop.major >= 9) usable++;
    }
    if (usable == 0) {
        snprintf(probe_reason, sizeof probe_reason,
                 "no CUDA device of compute capability 9.0 or newer (device 0: %s, %d.%d); this "
                 "build carries sm_90 code only",
                 prop0.name, prop0.major, prop0.minor);
        return;
    }
    snprintf(version_text, sizeof version_text,
             "kiln_cuda %s: CUDA runtime %d.%d, driver %d.%d, cuBLASLt %zu, device 0 %s (sm_%d%d)",
             KILN_VERSION_STRING, rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10,
             lt_version, prop0.name, prop0.major, prop0.minor);
    probe_count = n;
    probe_ok = 1;
}

static kiln_cuda_plugin plugin_table;

KILN_CUDA_EXPORT kiln_status kiln_cuda_plugin_v2(const kiln_cuda_services *services, char *reason,
                                                 size_t reason_nbytes,
                                                 const kiln_cuda_plugin **out) {
    const char *why = NULL;
    char buf[256];
    if (services == NULL || out == NULL) return KILN_ERR_INVALID_ARG;
    if (services->abi != KILN_CUDA_PLUGIN_ABI ||
        services->struct_nbytes != sizeof(kiln_cuda_services)) {
        snprintf(buf, sizeof buf,
                 "the plugin's ABI (%u, %u bytes) differs from libkiln's (%u, %u bytes)",
                 KILN_CUDA_PLUGIN_ABI, (unsigned)sizeof(kiln_cuda_services), services->abi,
                 services->struct_nbytes);
        why = buf;
    } else if (services->kiln_version == NULL ||
               strcmp(services->kiln_version, KILN_VERSION_STRING) != 0) {
        snprintf(buf, sizeof buf,
                 "the plugin is version %s but libkiln is %s: install matching builds",
                 KILN_VERSION_STRING, services->kiln_version ? services->kiln_version : "?");
        why = buf;
    }
    if (why != NULL) {
        if (reason != NULL && reason_nbytes > 0) snprintf(reason, reason_nbytes, "%s", why);
        return KILN_ERR_VERSION;
    }
    kiln_cuda_services_set(services);
    pthread_once(&probe_once, probe);
    if (!probe_ok) {
        if (reason != NULL && reason_nbytes > 0)
            snprintf(reason, reason_nbytes, "%s", probe_reason);
        return KILN_ERR_DEVICE;
    }
    plugin_table.struct_nbytes = (uint32_t)sizeof(kiln_cuda_plugin);
    plugin_table.abi = KILN_CUDA_PLUGIN_ABI;
    plugin_table.ops = kiln_cuda_backend_ops;
    plugin_table.device_count = plugin_device_count;
    plugin_table.version = plugin_version;
    *out = &plugin_table;
    return KILN_OK;
}
