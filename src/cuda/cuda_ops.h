// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's launchers of the ops that have no choices to plan (one per op family,
// defined in op_<family>.cu) and the elementwise engine's helpers. The planned ops (linear,
// matmul, conv2d, sdpa) are in cuda_plan.h; kiln_cuda_run (cuda_dispatch.c) runs either.
//
// Launchers: kiln_status kiln_cuda_<op>(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args)
// with every tensor of args in device memory of the current device (cuda_ctx.h for the rules).
// They apply args->tail after the head unless the dispatcher does (see kiln_cuda_run).
// Zero-element tensors launch nothing.
#ifndef KILN_CUDA_CUDA_OPS_H
#define KILN_CUDA_CUDA_OPS_H

#include "core/ops.h"
#include "cuda/cuda_ctx.h"
#include "cuda/cuda_wg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CUDA_LAUNCHER(name)                                                                   \
    kiln_status kiln_cuda_##name(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args)

KILN_CUDA_LAUNCHER(conv_transpose2d);    // op_conv.cu
KILN_CUDA_LAUNCHER(unary);               // op_eltwise.cu: activations, math, copy, cast, clamp
KILN_CUDA_LAUNCHER(binary);              // op_eltwise.cu: add, sub, mul, div, pow, where
KILN_CUDA_LAUNCHER(batch_norm);          // op_norm.cu
KILN_CUDA_LAUNCHER(layer_norm);          // op_norm.cu
KILN_CUDA_LAUNCHER(rms_norm);            // op_norm.cu
KILN_CUDA_LAUNCHER(rotary);              // op_eltwise.cu
KILN_CUDA_LAUNCHER(softmax);             // op_norm.cu: softmax, log_softmax
KILN_CUDA_LAUNCHER(max_pool2d);          // op_pool.cu
KILN_CUDA_LAUNCHER(avg_pool2d);          // op_pool.cu
KILN_CUDA_LAUNCHER(adaptive_avg_pool2d); // op_pool.cu
KILN_CUDA_LAUNCHER(reduce);              // op_reduce.cu: mean, sum
KILN_CUDA_LAUNCHER(reshape);             // op_shape.cu: reshape, squeeze, unsqueeze
KILN_CUDA_LAUNCHER(permute);             // op_shape.cu
KILN_CUDA_LAUNCHER(expand);              // op_shape.cu
KILN_CUDA_LAUNCHER(cat);                 // op_shape.cu
KILN_CUDA_LAUNCHER(slice);               // op_shape.cu
KILN_CUDA_LAUNCHER(select);              // op_shape.cu
KILN_CUDA_LAUNCHER(embedding);           // op_embed.cu
KILN_CUDA_LAUNCHER(logic);               // op_logic.cu: eq .. ge, bitwise_and/or/xor/not
KILN_CUDA_LAUNCHER(index);               // op_index.cu
KILN_CUDA_LAUNCHER(gather);              // op_index.cu
KILN_CUDA_LAUNCHER(gather_matmul);       // op_index.cu: y[b] = w[idx[b]] @ x[b]
KILN_CUDA_LAUNCHER(index_copy);          // op_index.cu: in place when out->data == in[0]->data
KILN_CUDA_LAUNCHER(upsample);            // op_resize.cu: upsample_nearest2d, _bilinear2d
KILN_CUDA_LAUNCHER(grid_sample);         // op_resize.cu
KILN_CUDA_LAUNCHER(group_norm);          // op_norm.cu
KILN_CUDA_LAUNCHER(argmax);              // op_reduce.cu
KILN_CUDA_LAUNCHER(topk);                // op_reduce.cu
KILN_CUDA_LAUNCHER(selective_scan);      // op_reduce.cu
KILN_CUDA_LAUNCHER(cumsum);              // op_reduce.cu
KILN_CUDA_LAUNCHER(pad);                 // op_shape.cu
KILN_CUDA_LAUNCHER(arange);              // op_shape.cu

// Copies a strided view: dst[sum idx*dst_strides] = src[sum idx*src_strides] over dims (element
// strides, esize-byte elements; src strides may be 0 to broadcast) (op_shape.cu).
kiln_status kiln_cuda_copy_strided(const kiln_cuda_ctx *ctx, void *dst, const void *src,
                                   size_t esize, int rank, const int64_t *dims,
                                   const int64_t *dst_strides, const int64_t *src_strides);

// The operand count of an elementwise op (1: unary, 2 or 3: binary, where), -1 for any other op
// (op_eltwise.cu).
int kiln_cuda_eltwise_arity(uint32_t op);
// Nonzero when the elementwise engine runs op over these operands (op_eltwise.cu).
int kiln_cuda_eltwise_supports(uint32_t op, const kiln_tensor *const *ins, int n,
                               const kiln_tensor *out);
int kiln_cuda_tail_supports(const kiln_kernel_args *args);
// Nonzero when the rotary kernel runs these shapes: x [..., even D], cos and sin broadcasting to
// x (op_eltwise.cu).
int kiln_cuda_rotary_supports(const kiln_kernel_args *args);

// The concatenation of args' inputs along dim (of the views as given) in one kernel, with its
// tail when *fused is set (op_eltwise.cu); KILN_ERR_UNSUPPORTED, nothing launched, when the
// inputs do not fit it.
kiln_status kiln_cuda_cat_fused(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, int dim,
                                int *fused);
// Applies args->tail[skip..] in place on args->out (op_eltwise.cu); heads call it last.
kiln_status kiln_cuda_tail(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args, uint32_t skip);

// Raises the shared-memory limits of the attention kernels on the current device (before any
// launch or capture on it) (op_attention.cu).
kiln_status kiln_cuda_attention_init(void);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_OPS_H
