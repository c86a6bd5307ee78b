// SPDX-License-Identifier: Apache-2.0
// embedding: weight[V, D] gathered by integer indices (int32 / int64 / bool) -> [.., D], in the
// weight's dtype. An index outside [0, V) cannot fail a launched kernel, so its row is written
// as zeros (the CPU reference rejects it; inputs are expected to be in range).
#include "cuda/cuda_common.cuh"

#define EMBED_BLOCK 256

// --- kernels

template <typename T>
static __global__ void embedding_kernel(const T *w, const void *idx, uint32_t idx_dtype, T *y,
                                        int64_t n_idx, int64_t vocab, int64_t d) {
    kc_pdl_enter();
    int64_t n = n_idx * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = kc_ld_i(idx, idx_dtype, i / d), col = i % d;
        y[i] = (row >= 0 && row < vocab) ? w[row * d + col] : kc_from_f<T>(0.0f);
    }
}

// --- launchers

template <typename T>
static kiln_status embedding_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *w = args->in[0], *idx = args->in[1], *y = args->out;
    int64_t vocab = w->dims[0], d = w->dims[1], n_idx = kc_numel(idx);
    if (n_idx * d == 0) return KILN_OK;
    kc_launch(ctx, embedding_kernel<T>, kc_blocks(n_idx * d, EMBED_BLOCK), EMBED_BLOCK, 0,
              (const T *)w->data, idx->data, idx->dtype, (T *)y->data, n_idx, vocab, d);
    return kiln_cuda_check_launch(ctx, "embedding_kernel");
}

// --- entry points

extern "C" kiln_status kiln_cuda_embedding(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *w = args->n_in > 0 ? args->in[0] : NULL;
    const kiln_tensor *idx = args->n_in > 1 ? args->in[1] : NULL;
    if (w == NULL || idx == NULL || w->rank != 2 || w->dtype != args->out->dtype ||
        !(idx->dtype == KILN_DTYPE_I32 || idx->dtype == KILN_DTYPE_I64 ||
          idx->dtype == KILN_DTYPE_BOOL)) {
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                              "cuda embedding: needs weight [V, D] of the output dtype and integer "
                              "indices at %s",
                              ctx->where ? ctx->where : "?");
    }
    switch (args->out->dtype) {
    case KILN_DTYPE_F32: return embedding_launch<float>(ctx, args);
    case KILN_DTYPE_F16: return embedding_launch<__half>(ctx, args);
    case KILN_DTYPE_BF16: return embedding_launch<__nv_bfloat16>(ctx, args);
    default:
        return kiln_cuda_fail(KILN_ERR_UNSUPPORTED, "cuda embedding: dtype %s at %s",
                              kiln_cuda_dtype_name(args->out->dtype),
                              ctx->where ? ctx->where : "?");
    }
}
