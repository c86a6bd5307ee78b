// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's private activation layout (host C only): which 4-D fp16/bf16 activations
// it keeps in NHWC in the arena (so that cuDNN's convolutions run NHWC, on tensor cores, without
// transposes), decided once per engine by a pass over the plan (cuda_layout.c).
//
// A tensor is NHWC only when it is an activation (never an engine input or output: those stay
// NCHW), 4-D, float16/bfloat16, and every layer that writes or reads it can work in NHWC:
//   * producers: conv2d with groups 1 and C, K multiples of 8 (its fused tail elementwise with
//     operands of the output's shape, in the same layout, or of one element); relu-like unary
//     heads, same-shape binary heads, max_pool2d, avg_pool2d whose inputs are NHWC too;
//   * consumers: such a conv2d's input (a conv whose output is NCHW demotes its input), those
//     unary/binary heads and pools (input and output in one layout), a fused tail's residual
//     operand (same layout as the group's output), adaptive_avg_pool2d's input (it writes NCHW).
// Demotions propagate to a fixed point. A conv2d computing in NHWC whose input is NCHW (the
// layout boundary: the stem's output, an engine input) reads an NHWC copy of it, made by a
// transpose at the first such conv in layer order (the copy lives in the context, outside the
// arena). NHWC convs use their weights in KRSC (OHWI) order, a second copy made at upload.
// KILN_CUDA_NO_NHWC=1 turns the pass off (everything NCHW, the previous behaviour).
#ifndef KILN_CUDA_CUDA_LAYOUT_H
#define KILN_CUDA_CUDA_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "runtime/plan.h"

typedef struct kiln_cuda_layout {
    uint8_t *nhwc;      // n_tensors: 1 = stored NHWC (logical dims stay NCHW)
    uint8_t *head_nhwc; // n_layers: head layer runs with ctx->nhwc
    uint8_t *xpose;     // n_layers: head transposes its NCHW input 0 into that tensor's copy
    uint8_t *copy;      // n_tensors: an NCHW tensor some NHWC conv reads (needs an NHWC copy)
    uint8_t *krsc;      // n_tensors: a weight some NHWC conv uses (needs a KRSC copy)
    uint32_t n_conv, n_conv_nhwc, n_nhwc, n_copies;
} kiln_cuda_layout;

// Decides the layout of every tensor of p (all NCHW when enable is 0). Fails only for memory.
kiln_status kiln_cuda_layout_plan(const kiln_plan *p, int enable, kiln_cuda_layout *out);
void kiln_cuda_layout_free(const kiln_plan *p, kiln_cuda_layout *l);

// The plugin's allocator and error helpers (cuda_util.c; also declared in cuda_ops.h).
void *kiln_cuda_calloc(size_t nbytes);
void kiln_cuda_free(void *ptr, size_t nbytes);
kiln_status kiln_cuda_fail(kiln_status status, const char *fmt, ...);

// The final tensor a head layer's group writes (the head's output or its last tail's).
int32_t kiln_cuda_group_output(const kiln_plan *p, uint32_t li);

#endif // KILN_CUDA_CUDA_LAYOUT_H
