// SPDX-License-Identifier: Apache-2.0
// Internals of the CPU reference backend (src/cpu): the per-op entry points the dispatcher in
// cpu_backend.c calls, and the shared machinery they use: scratch carving, dtype row
// conversion, a broadcasting row iterator, the elementwise engine and the blocked GEMM.
// Everything computes in float32 (int64 for integer ops) and stores in the declared dtype.
#ifndef KILN_CPU_CPU_INTERNAL_H
#define KILN_CPU_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "cpu/cpu.h"

// --- scratch: a bump allocator over args->scratch (never allocates)

#define KILN_CPU_ALIGN 64

typedef struct kiln_cpu_scratch {
    uint8_t *base; // aligned start
    size_t nbytes; // usable bytes from base
    size_t used;
} kiln_cpu_scratch;

// Bytes a piece of n floats takes in scratch (rounded to the alignment).
static inline size_t kiln_cpu_f32_nbytes(int64_t n) {
    size_t b = (size_t)(n > 0 ? n : 0) * sizeof(float);
    return (b + KILN_CPU_ALIGN - 1) & ~(size_t)(KILN_CPU_ALIGN - 1);
}
// Slack every scratch request adds once, for aligning the caller's pointer.
#define KILN_CPU_SCRATCH_SLACK ((size_t)KILN_CPU_ALIGN)

void kiln_cpu_scratch_init(kiln_cpu_scratch *s, const kiln_kernel_args *args);
// n floats of scratch, or NULL (and a recorded KILN_ERR_INTERNAL message naming `what`) when the
// buffer is too small; kernels return KILN_ERR_INTERNAL then.
float *kiln_cpu_scratch_f32(kiln_cpu_scratch *s, int64_t n, const char *what);
// Same for raw bytes (aligned).
void *kiln_cpu_scratch_bytes(kiln_cpu_scratch *s, size_t nbytes, const char *what);

// --- dtype rows

// dst[i] = float(src[off + i * stride]) for i < n (stride may be 0: broadcast).
void kiln_cpu_load_f32(const void *src, uint32_t dtype, int64_t off, int64_t stride, int64_t n,
                       float *dst);
// dst[off + i] = src[i] converted to dtype (ints: truncate toward zero, saturating; NaN -> 0).
void kiln_cpu_store_f32(void *dst, uint32_t dtype, int64_t off, int64_t n, const float *src);
// Integer rows (exact for int32/int64/bool; floats truncate toward zero, saturating).
void kiln_cpu_load_i64(const void *src, uint32_t dtype, int64_t off, int64_t stride, int64_t n,
                       int64_t *dst);
void kiln_cpu_store_i64(void *dst, uint32_t dtype, int64_t off, int64_t n, const int64_t *src);
// Fast exact float16 conversions (same results as kiln_f16_to_f32 / kiln_f32_to_f16).
float kiln_cpu_f16_to_f32(uint16_t h);
uint16_t kiln_cpu_f32_to_f16(float v);
// Float to integer without undefined behaviour: truncates, saturates, NaN -> 0.
int64_t kiln_cpu_f32_to_i64(float v);

static inline int kiln_cpu_is_int(uint32_t dtype) {
    return dtype == KILN_DTYPE_I32 || dtype == KILN_DTYPE_I64 || dtype == KILN_DTYPE_BOOL;
}

// Element strides of a dense row-major tensor.
void kiln_cpu_strides(const kiln_tensor *t, int64_t *strides);
// Normalizes a possibly negative dim against rank; -1 when out of range.
int kiln_cpu_norm_dim(int64_t dim, uint32_t rank);

// --- broadcasting row iterator
//
// Operand 0 is the output (dense); operands 1.. are inputs broadcast to the output's dims
// (numpy rules, right-aligned; a size-1 or missing dim gets stride 0). Dims are coalesced, then
// every innermost row is visited once.

#define KILN_CPU_ITER_MAX 5

typedef struct kiln_cpu_iter {
    int n_ops;
    int rank; // >= 1 after coalescing
    int64_t dims[KILN_MAX_RANK];
    int64_t strides[KILN_CPU_ITER_MAX][KILN_MAX_RANK]; // element strides per operand
} kiln_cpu_iter;

void kiln_cpu_iter_init(kiln_cpu_iter *it, const kiln_tensor *out, const kiln_tensor *const *ins,
                        int n_in);
// The same over explicit element strides (strides[o][d] for operand o, dim d < rank).
void kiln_cpu_iter_init_strided(kiln_cpu_iter *it, int rank, const int64_t *dims, int n_ops,
                                const int64_t (*strides)[KILN_MAX_RANK]);
// Calls row(ctx, offs, n, inner) for each innermost row: offs[i] is operand i's element offset
// at the row start, n the row length, inner[i] operand i's stride along the row.
typedef void (*kiln_cpu_row_fn)(void *ctx, const int64_t *offs, int64_t n, const int64_t *inner);
void kiln_cpu_iter_run(const kiln_cpu_iter *it, kiln_cpu_row_fn row, void *ctx);

// --- elementwise engine (op_eltwise.c)

// Runs a unary, binary or where op elementwise: out = op(ins...) with broadcasting. Used by
// the elementwise ops and by fused tails (out may alias an input of the same shape).
kiln_status kiln_cpu_eltwise(uint32_t op, const kiln_attrs *attrs, const kiln_tensor *const *ins,
                             int n_in, const kiln_tensor *out);
// True when kiln_cpu_eltwise implements op with these dtypes.
int kiln_cpu_eltwise_supports(uint32_t op, const kiln_tensor *const *ins, int n_in,
                              const kiln_tensor *out);
// Applies args->tail in order, in place on args->out.
kiln_status kiln_cpu_tail_apply(const kiln_kernel_args *args);
int kiln_cpu_tail_supports(const kiln_kernel_args *args);

// --- GEMM (op_gemm.c): C[m, n] = sum_k A[m, k] B[k, n], cache-blocked over packed panels

#define KILN_CPU_MR 8   // micro-tile rows
#define KILN_CPU_NR 8   // micro-tile columns
#define KILN_CPU_MC 96  // rows of A per packed block (multiple of MR)
#define KILN_CPU_KC 256 // depth per packed block
#define KILN_CPU_NC 512 // columns of B per packed block (multiple of NR)
#define KILN_CPU_MB 768 // rows sharing one packed B block (multiple of MC); f32 accumulator MB x NC

// Packs A rows [m0, m0 + mc) x depth [k0, k0 + kc) into MR-row panels: element (i, kk) of panel
// p at dst[p * MR * kc + kk * MR + i]; rows past mc are zero.
typedef void (*kiln_cpu_pack_a_fn)(const void *ctx, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
                                   float *dst);
// Packs B depth [k0, k0 + kc) x columns [n0, n0 + nc) into NR-column panels: element (kk, j) of
// panel q at dst[q * NR * kc + kk * NR + j]; columns past nc are zero.
typedef void (*kiln_cpu_pack_b_fn)(const void *ctx, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                                   float *dst);
// Receives the finished f32 block C[m0 .. m0 + mc, n0 .. n0 + nc) at tile[i * ld + j].
typedef void (*kiln_cpu_epilogue_fn)(void *ctx, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
                                     const float *tile, int64_t ld);

typedef struct kiln_cpu_gemm {
    int64_t m, n, k;
    kiln_cpu_pack_a_fn pack_a;
    const void *a_ctx;
    kiln_cpu_pack_b_fn pack_b;
    const void *b_ctx;
    kiln_cpu_epilogue_fn epilogue;
    void *e_ctx;
} kiln_cpu_gemm;

// A strided matrix view: element (r, c) at data[offset + r * rs + c * cs].
typedef struct kiln_cpu_matrix {
    const void *data;
    uint32_t dtype;
    int64_t offset, rs, cs;
} kiln_cpu_matrix;

void kiln_cpu_pack_a_matrix(const void *ctx, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
                            float *dst);
void kiln_cpu_pack_b_matrix(const void *ctx, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                            float *dst);

// The usual epilogue: C[r, c] = alpha * acc + row_bias[r] + col_bias[c] stored in dtype at
// data[offset + r * ld + c] (biases optional, f32).
typedef struct kiln_cpu_store {
    void *data;
    uint32_t dtype;
    int64_t offset, ld;
    float alpha;
    const float *row_bias, *col_bias;
} kiln_cpu_store;
void kiln_cpu_epilogue_store(void *ctx, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
                             const float *tile, int64_t ld);

// Scratch one GEMM of these sizes needs (already rounded; no slack).
size_t kiln_cpu_gemm_scratch_nbytes(int64_t m, int64_t n, int64_t k);
// Runs the GEMM; KILN_ERR_INTERNAL if scratch is too small.
kiln_status kiln_cpu_gemm_run(const kiln_cpu_gemm *g, kiln_cpu_scratch *s);

// --- per-op entry points: kiln_cpu_<op>(args) and kiln_cpu_<op>_scratch(args)

#define KILN_CPU_DECLARE(name)                                                                     \
    kiln_status kiln_cpu_##name(const kiln_kernel_args *args);                                     \
    size_t kiln_cpu_##name##_scratch(const kiln_kernel_args *args)

KILN_CPU_DECLARE(linear);
KILN_CPU_DECLARE(matmul);
KILN_CPU_DECLARE(gather_matmul);
KILN_CPU_DECLARE(selective_scan); // op_reduce.c
KILN_CPU_DECLARE(conv2d);
KILN_CPU_DECLARE(conv_transpose2d);
KILN_CPU_DECLARE(batch_norm);
KILN_CPU_DECLARE(layer_norm);
KILN_CPU_DECLARE(rms_norm);
KILN_CPU_DECLARE(rotary);  // op_eltwise.c
KILN_CPU_DECLARE(softmax); // softmax and log_softmax
KILN_CPU_DECLARE(unary);   // unary ops, copy, cast, clamp
KILN_CPU_DECLARE(binary);  // add, sub, mul, div, pow, where
KILN_CPU_DECLARE(max_pool2d);
KILN_CPU_DECLARE(avg_pool2d);
KILN_CPU_DECLARE(adaptive_avg_pool2d);
KILN_CPU_DECLARE(reduce);  // mean, sum
KILN_CPU_DECLARE(reshape); // reshape, squeeze, unsqueeze (plain copies)
KILN_CPU_DECLARE(expand);
KILN_CPU_DECLARE(permute);
KILN_CPU_DECLARE(cat);
KILN_CPU_DECLARE(slice);
KILN_CPU_DECLARE(select);
KILN_CPU_DECLARE(embedding);
KILN_CPU_DECLARE(sdpa);
KILN_CPU_DECLARE(compare); // eq, ne, lt, le, gt, ge (op_logic.c)
KILN_CPU_DECLARE(bitwise); // bitwise_and, _or, _xor, _not (op_logic.c)
KILN_CPU_DECLARE(group_norm);
KILN_CPU_DECLARE(cumsum);
KILN_CPU_DECLARE(argmax);
KILN_CPU_DECLARE(topk);
KILN_CPU_DECLARE(pad);
KILN_CPU_DECLARE(arange);
KILN_CPU_DECLARE(index);
KILN_CPU_DECLARE(gather);
KILN_CPU_DECLARE(index_copy);
KILN_CPU_DECLARE(upsample);    // upsample_nearest2d, upsample_bilinear2d (op_resize.c)
KILN_CPU_DECLARE(grid_sample); // op_resize.c

// True when the comparison or bitwise op of args is implemented for its dtypes and shapes.
int kiln_cpu_logic_supports(const kiln_kernel_args *args);
// The resize index rules (op_resize.c), shared with tests: the nearest source index of output
// index dst, and the two source indices of a linear interpolation with the second one's weight.
int64_t kiln_cpu_nearest_index(int64_t dst, int64_t in, int64_t out, double given_scale);
void kiln_cpu_linear_index(int64_t dst, int64_t in, int64_t out, double given_scale, int align,
                           int64_t *i0, int64_t *i1, float *w1);

#endif // KILN_CPU_CPU_INTERNAL_H
