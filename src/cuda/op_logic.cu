// SPDX-License-Identifier: Apache-2.0
// Comparisons (eq, ne, lt, le, gt, ge: any input dtype, bool output) and bitwise ops
// (bitwise_and/or/xor/not: logical on bool, two's complement on int32/int64) with numpy
// broadcasting, by the CPU reference's rules (src/cpu/op_logic.c): float inputs compare as
// float32, integer and bool inputs exactly as int64.
#include "cuda/cuda_common.cuh"

#define LOGIC_BLOCK 256

typedef struct logic_params {
    uint32_t op;
    int rank;
    int n_in;
    int as_float;
    int64_t numel;
    int64_t dims[KC_MAX_RANK];
    int64_t strides[2][KC_MAX_RANK]; // element strides of each input over the output dims
    const void *in[2];
    uint32_t in_dtype;
    void *out;
    uint32_t out_dtype;
} logic_params;

// --- kernels

// The comparisons, on float or integer operands.
template <typename V> __device__ __forceinline__ int logic_cmp(uint32_t op, V a, V b) {
    switch (op) {
    case KILN_OP_EQ: return a == b;
    case KILN_OP_NE: return a != b;
    case KILN_OP_LT: return a < b;
    case KILN_OP_LE: return a <= b;
    case KILN_OP_GT: return a > b;
    default: return a >= b;
    }
}

// Integer and boolean operands: the bitwise ops, else a comparison.
__device__ __forceinline__ int64_t logic_i(uint32_t op, int64_t a, int64_t b) {
    switch (op) {
    case KILN_OP_BITWISE_AND: return a & b;
    case KILN_OP_BITWISE_OR: return a | b;
    case KILN_OP_BITWISE_XOR: return a ^ b;
    case KILN_OP_BITWISE_NOT: return ~a;
    default: return logic_cmp<int64_t>(op, a, b);
    }
}

// Element i's offsets into the inputs: 32-bit division where the count allows (a 64-bit one is
// ~100 instructions: a [512, 4224] causal mask from positions took 28 us on the H100 with them).
__device__ __forceinline__ void logic_offsets(const logic_params &P, int64_t i, int64_t *off) {
    off[0] = off[1] = 0;
    if (P.numel <= INT32_MAX) {
        uint32_t rem = (uint32_t)i;
        for (int d = P.rank - 1; d >= 0; d--) {
            const uint32_t n = (uint32_t)P.dims[d], q = rem / n, c = rem - q * n;
            rem = q;
            off[0] += (int64_t)c * P.strides[0][d];
            off[1] += (int64_t)c * P.strides[1][d];
        }
        return;
    }
    int64_t rem = i;
    for (int d = P.rank - 1; d >= 0; d--) {
        const int64_t c = rem % P.dims[d];
        rem /= P.dims[d];
        off[0] += c * P.strides[0][d];
        off[1] += c * P.strides[1][d];
    }
}

static __global__ void logic_kernel(const __grid_constant__ logic_params P) {
    kc_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        logic_offsets(P, i, off);
        int64_t v;
        if (P.as_float) {
            v = logic_cmp<float>(P.op, kc_ld_f(P.in[0], P.in_dtype, off[0]),
                                 kc_ld_f(P.in[1], P.in_dtype, off[1]));
        } else {
            int64_t a = kc_ld_i(P.in[0], P.in_dtype, off[0]);
            int64_t b = P.n_in > 1 ? kc_ld_i(P.in[1], P.in_dtype, off[1]) : 0;
            v = logic_i(P.op, a, b);
            if (P.out_dtype == KILN_DTYPE_BOOL && P.op >= KILN_OP_BITWISE_AND) v &= 1;
        }
        kc_st_i(P.out, P.out_dtype, i, v);
    }
}

// --- launchers

static kiln_status logic_launch(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    const kiln_tensor *y = args->out;
    logic_params P;
    memset(&P, 0, sizeof P);
    P.op = args->op;
    P.n_in = P.op == KILN_OP_BITWISE_NOT ? 1 : 2;
    for (int k = 0; k < P.n_in; k++) {
        if ((uint32_t)k >= args->n_in || args->in[k] == NULL ||
            args->in[k]->dtype != args->in[0]->dtype || args->in[k]->rank > y->rank) {
            return kiln_cuda_fail(KILN_ERR_UNSUPPORTED,
                                  "cuda %s: needs %d inputs of one dtype broadcasting to the "
                                  "output at %s",
                                  kiln_cuda_op_name(P.op), P.n_in, ctx->where ? ctx->where : "?");
        }
        P.in[k] = args->in[k]->data;
        kc_bcast_strides(args->in[k], y->rank, P.strides[k]);
    }
    P.in_dtype = args->in[0]->dtype;
    P.as_float = P.op <= KILN_OP_GE && kiln_cuda_is_float(P.in_dtype);
    P.out = y->data;
    P.out_dtype = y->dtype;
    P.rank = 0; // the output's dims, size-1 ones dropped
    for (uint32_t d = 0; d < y->rank; d++) {
        if (y->dims[d] == 1) continue;
        P.dims[P.rank] = y->dims[d];
        P.strides[0][P.rank] = P.strides[0][d];
        P.strides[1][P.rank] = P.strides[1][d];
        P.rank++;
    }
    P.numel = kc_numel(y);
    if (P.numel == 0) return KILN_OK;
    kc_launch(ctx, logic_kernel, kc_blocks(P.numel, LOGIC_BLOCK), LOGIC_BLOCK, 0, P);
    return kiln_cuda_check_launch(ctx, "logic_kernel");
}

// --- entry points

extern "C" kiln_status kiln_cuda_logic(const kiln_cuda_ctx *ctx, const kiln_kernel_args *args) {
    return logic_launch(ctx, args);
}
