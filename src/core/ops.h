// SPDX-License-Identifier: Apache-2.0
// Internal view of the op table (src/core/ops.c) and of attribute storage.
//
// Attributes are stored by schema position: a node or layer of op X has exactly
// kiln_op_def_get(X)->n_attrs attribute slots, in the order of the KILN_A_* constants below,
// each a list of int64 or float64 values held in shared pools. The same representation is used
// by the IR (src/ir), the engine plan (src/runtime/plan.h) and the serialized format.
#ifndef KILN_CORE_OPS_H
#define KILN_CORE_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_MAX_ATTRS 8
#define KILN_MAX_INPUTS 64 // cat is variadic up to this
#define KILN_MAX_OUTPUTS 1

typedef struct kiln_op_def {
    uint32_t id;
    const char *name;
    uint32_t min_inputs, max_inputs, optional_mask, n_outputs;
    uint32_t dtype_mask;
    uint32_t flags;
    uint32_t n_attrs;
    kiln_attr_info attrs[KILN_MAX_ATTRS];
} kiln_op_def;

// The definition of an op, or NULL for an unknown id.
const kiln_op_def *kiln_op_def_get(uint32_t op);

#define KILN_DTYPE_BIT(d) (1u << (d))

// --- attribute storage

typedef struct kiln_attr_ref {
    uint32_t kind;  // kiln_attr_kind
    uint32_t n;     // number of values
    uint64_t begin; // index of the first value in the ints or floats pool
} kiln_attr_ref;

// A read-only view of one node's or layer's attributes.
typedef struct kiln_attrs {
    const kiln_attr_ref *refs; // n_attrs entries, schema order
    uint32_t n_attrs;
    const int64_t *ints;
    const double *floats;
} kiln_attrs;

static inline uint32_t kiln_attrs_count(const kiln_attrs *a, uint32_t idx) {
    return idx < a->n_attrs ? a->refs[idx].n : 0;
}
// Value j of int attribute idx (0 if absent: the loader and graph API guarantee presence).
static inline int64_t kiln_attrs_int(const kiln_attrs *a, uint32_t idx, uint32_t j) {
    if (idx >= a->n_attrs || j >= a->refs[idx].n || a->refs[idx].kind != KILN_ATTR_INTS) return 0;
    return a->ints[a->refs[idx].begin + j];
}
static inline const int64_t *kiln_attrs_ints(const kiln_attrs *a, uint32_t idx, uint32_t *out_n) {
    if (idx >= a->n_attrs || a->refs[idx].kind != KILN_ATTR_INTS || a->refs[idx].n == 0) {
        *out_n = 0;
        return NULL; // an empty list (the pool may be NULL: no pointer arithmetic on it)
    }
    *out_n = a->refs[idx].n;
    return a->ints + a->refs[idx].begin;
}
static inline double kiln_attrs_float(const kiln_attrs *a, uint32_t idx, uint32_t j) {
    if (idx >= a->n_attrs || j >= a->refs[idx].n || a->refs[idx].kind != KILN_ATTR_FLOATS)
        return 0.0;
    return a->floats[a->refs[idx].begin + j];
}

// The dims a rotary rotates, from its cos/sin tables' last dim (1 for a table of rank 0): 1 or
// x's D is all of them; another size R, the first R (the rest passed through). Shape inference
// checks that R is static, even and below D.
static inline int64_t kiln_rotary_dims(int64_t table_last, int64_t d) {
    return table_last == 1 || table_last == d ? d : table_last;
}

// --- attribute positions per op (schema order; see ops.c)

// conv2d: x, w, bias?
#define KILN_A_CONV_STRIDE 0
#define KILN_A_CONV_PADDING 1
#define KILN_A_CONV_DILATION 2
#define KILN_A_CONV_GROUPS 3
// conv_transpose2d: x, w, bias?
#define KILN_A_CONVT_STRIDE 0
#define KILN_A_CONVT_PADDING 1
#define KILN_A_CONVT_OUTPUT_PADDING 2
#define KILN_A_CONVT_DILATION 3
#define KILN_A_CONVT_GROUPS 4
// batch_norm: x, weight?, bias?, mean, var
#define KILN_A_BN_EPS 0
// gelu
#define KILN_A_GELU_APPROXIMATE 0 // 0 = erf, 1 = tanh

// rotary: x, cos, sin. interleaved 0: the pairs (i, i + R/2) (transformers' rotate_half); 1: the
// pairs (2i, 2i + 1) (rotate_every_two: GPT-J, CodeGen, Cohere, RoFormer, EVA-02)
#define KILN_A_ROTARY_INTERLEAVED 0
// cast
#define KILN_A_CAST_DTYPE 0
// clamp (NaN = no bound)
#define KILN_A_CLAMP_MIN 0
#define KILN_A_CLAMP_MAX 1
// softmax, log_softmax
#define KILN_A_SOFTMAX_DIM 0
// layer_norm: x, weight?, bias?   (normalizes over the last normalized_ndim dims)
#define KILN_A_LN_NDIM 0
#define KILN_A_LN_EPS 1
// group_norm: x[N, C, ...], weight?[C], bias?[C]
#define KILN_A_GN_GROUPS 0
#define KILN_A_GN_EPS 1
// rms_norm: x[..., D], weight?[D]   (over the last dim, float32 statistics)
#define KILN_A_RMS_EPS 0
// upsample_nearest2d, upsample_bilinear2d: x[N, C, H, W] -> [N, C, OH, OW]
#define KILN_A_UPSAMPLE_SIZE 0   // output_size ints[2]
#define KILN_A_UPSAMPLE_SCALES 1 // floats[2]: output/input scale per axis (NaN: OH/H)
#define KILN_A_UPSAMPLE_ALIGN 2  // bilinear only: align_corners
// grid_sample: x[N, C, H, W], grid[N, Ho, Wo, 2] (x's dtype or float32; (x, y) in [-1, 1])
#define KILN_A_GRID_MODE 0    // 0 bilinear, 1 nearest (round half to even)
#define KILN_A_GRID_PADDING 1 // 0 zeros (a corner outside reads 0), 1 border (clamped)
#define KILN_A_GRID_ALIGN 2   // align_corners: -1 and 1 are the corner pixels' centres
// max_pool2d
#define KILN_A_MAXPOOL_KERNEL 0
#define KILN_A_MAXPOOL_STRIDE 1
#define KILN_A_MAXPOOL_PADDING 2
#define KILN_A_MAXPOOL_DILATION 3
#define KILN_A_MAXPOOL_CEIL 4
// avg_pool2d
#define KILN_A_AVGPOOL_KERNEL 0
#define KILN_A_AVGPOOL_STRIDE 1
#define KILN_A_AVGPOOL_PADDING 2
#define KILN_A_AVGPOOL_CEIL 3
#define KILN_A_AVGPOOL_COUNT_PAD 4
#define KILN_A_AVGPOOL_DIVISOR 5 // 0 = none
// adaptive_avg_pool2d
#define KILN_A_ADAPTIVE_OUTPUT 0
// mean, sum (dims empty = all dims)
#define KILN_A_REDUCE_DIMS 0
#define KILN_A_REDUCE_KEEPDIM 1
// cumsum
#define KILN_A_CUMSUM_DIM 0
// argmax: x -> int64 (the first maximum along dim; NaN counts as the maximum, as in PyTorch)
#define KILN_A_ARGMAX_DIM 0
#define KILN_A_ARGMAX_KEEPDIM 1
// topk: x (float or integer) -> int64 indices of the k largest (largest 1) or smallest (0) values
// along dim, the best first, equal values in index order, NaN counting as larger than any number
// (as in PyTorch); the values are gather(x, dim, indices)
#define KILN_A_TOPK_DIM 0
#define KILN_A_TOPK_K 1
#define KILN_A_TOPK_LARGEST 2
// gather_matmul: w [E, M, K], idx [B] (int32/int64 in [-E, E): negative from the end, as torch's
// indexing), x [B, K, N] -> y [B, M, N],
// y[b] = w[idx[b]] @ x[b] (a mixture of experts' per-token matrices, read in place instead of
// gathered into a [B, M, K] copy: the builder's fusion of index(w, idx) into a batched matmul)
// selective_scan: a, u [B, D, L, N], c [B, L, N], h0 [B, D, N] (one float dtype) -> y [B, D, L]:
// h_t = a[:, :, t] * h_{t-1} + u[:, :, t] (h_{-1} = h0), y[:, :, t] = sum over n of h_t * c[:, t]
// (a state space model's selective scan, Mamba's, as a loop over the tokens writes it), the
// state kept in float32 and each y rounded once
// reshape: x, like?   expand: x, like?
// shape entries: >= 0 literal; -1 infer (reshape) or keep (expand); <= -2 copy dim (-v - 2) of
// `like` when given, else of x.
#define KILN_A_RESHAPE_SHAPE 0
#define KILN_A_EXPAND_SHAPE 0
// permute
#define KILN_A_PERMUTE_DIMS 0
// cat: inputs... (1..KILN_MAX_INPUTS)
#define KILN_A_CAT_DIM 0
// slice (end clamps; INT64_MAX = to the end; negative start/end count from the end)
#define KILN_A_SLICE_DIM 0
#define KILN_A_SLICE_START 1
#define KILN_A_SLICE_END 2
#define KILN_A_SLICE_STEP 3
// select
#define KILN_A_SELECT_DIM 0
#define KILN_A_SELECT_INDEX 1
// squeeze (dims of size 1 to remove), unsqueeze
#define KILN_A_SQUEEZE_DIMS 0
#define KILN_A_UNSQUEEZE_DIM 0
// pad: x; pads ints[*] = (before, after) pairs from the last dim backwards (torch's F.pad order),
// negative = crop; value floats[1]
#define KILN_A_PAD_PADS 0
#define KILN_A_PAD_VALUE 1
// arange: like -> [like.dims[dim]] holding start + i * step in dtype (a length known at run time)
#define KILN_A_ARANGE_DIM 0
#define KILN_A_ARANGE_START 1
#define KILN_A_ARANGE_STEP 2
#define KILN_A_ARANGE_DTYPE 3
// index: x, idx0 .. idx(k-1): x[:, .., :, idx0, .., idx(k-1), ...] with the first index at dim;
// wrap 1: a negative index counts from the end (x[i]), 0: it is out of range (index_select)
#define KILN_A_INDEX_DIM 0
#define KILN_A_INDEX_WRAP 1
// gather: x, index (same rank); indices in [0, size), as torch.gather
#define KILN_A_GATHER_DIM 0
// index_copy: x, index (1-D, n integers), src (x's shape with n at dim): x with
// x.select(dim, index[i]) replaced by src.select(dim, i) (torch.index_copy; index_put with one
// index tensor). wrap 1: a negative index counts from the end (index_put), 0: out of range.
// Written in place when the output is x's own storage (a state's update).
#define KILN_A_INDEX_COPY_DIM 0
#define KILN_A_INDEX_COPY_WRAP 1
// sdpa: q, k, v, mask?   (mask bool: true = attend; float: added to the scores)
#define KILN_A_SDPA_CAUSAL 0
#define KILN_A_SDPA_SCALE 1 // NaN = 1/sqrt(E)

#endif // KILN_CORE_OPS_H
