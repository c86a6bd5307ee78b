// SPDX-License-Identifier: Apache-2.0
// The CPU reference backend: plain C11, obviously correct, the oracle for every other backend.
// Computes in float32 internally; tensors are stored in their declared dtypes.
#ifndef KILN_CPU_CPU_H
#define KILN_CPU_CPU_H

#include <stddef.h>

#include "runtime/kernel.h"

// Runs one layer (and its fused tail). Shapes were validated by the caller; returns
// KILN_ERR_UNSUPPORTED for an op or dtype combination the CPU backend does not implement.
kiln_status kiln_cpu_run(const kiln_kernel_args *args);

// Scratch bytes the layer needs at the shapes in args (the runtime calls this with the largest
// shapes at context creation and passes one scratch buffer of the maximum to every layer).
size_t kiln_cpu_scratch_nbytes(const kiln_kernel_args *args);

// True when the CPU backend implements this op for these input/output dtypes.
int kiln_cpu_supports(const kiln_kernel_args *args);

#endif // KILN_CPU_CPU_H
