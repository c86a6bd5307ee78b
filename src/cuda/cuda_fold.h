// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's view folding into attention (host C only; cuda_fold.c): the head
// split/merge around sdpa and batched matmuls runs no kernel. Decided once per engine by a pass
// over the plan.
//
// Reads: a PERMUTE, SELECT, SLICE or RESHAPE layer (no fused tail, its input stored as the plan
// says) is *virtual* (no kernel; its output is never written) when its output is an activation,
// not an engine output, and every reader of that output is a virtual layer, the q, k or v input
// of an sdpa, either operand of a MATMUL (an eager attention's q k^T and weights v: the
// operands split from one projection and permuted to heads), or the x of a ROTARY (no tail)
// that is not a KV cache's (its tables shared with a rotary whose output an INDEX_COPY writes
// into a state: rope groups read those): the heads of a merged q/k/v projection sliced for
// their rotaries (docs/builder.md, head projections), read row by row with the last dim
// innermost. A RESHAPE of another view's output
// is virtual only at static shapes, and only where strides express it (each run of dims it
// merges or splits contiguous in the view: torch's view rule; checked with the plan's shapes,
// else the chain runs). A SLICE is virtual at static shapes only, and its chain runs where the
// view's offset is not a multiple of 16 bytes (the sdpa's vector loads). A RESHAPE of a 4-D map
// stored NHWC (cuda_layout.h) that reads it as it is (the layout pass's rs_xpose: no copy) may
// start a chain too, at static shapes: its view is of the map's channels-last bytes (base_nhwc),
// so a conv-form attention (CoAtNet's: a 1x1 conv's channels split into heads, the pixels
// merged, q/k/v sliced and transposed) reads q, k and v straight from the NHWC conv output, E
// innermost. The sdpa reads each such
// operand through a strided view of the nearest materialized tensor (the *base*): [B, S, H, E]
// memory as [B, H, S, E], the packed QKV projection [B, S, 3, H, E] through permute (2, 0, 3,
// 1, 4) and select, or torch's nn.MultiheadAttention chain over a sequence-first [S, 1, 3D]
// projection (unflatten, unsqueeze, transpose, squeeze, select, view, transpose, view), with the
// innermost stride 1. A matmul reads its operand through the view when one of the view's two
// innermost dims has stride 1 and the other a stride at least the first's size (a matrix
// cuBLASLt reads, transposed or not), and its batch dims collapse into one stride
// (kiln_cuda_mm_geom_of); else the chain runs. A DIV or MUL of a tensor by a one-element inline
// constant whose readers are all matmul operands (DeBERTa's k^T / sqrt(d)) is virtual like a
// view (the same strides): the matmul scales its product by the constant instead (mm_alpha[],
// cuBLASLt's alpha), a float32 scale of the sum rather than a rounding of each operand.
// Writes: an sdpa (no fused tail) whose output is an activation read only by a PERMUTE that keeps
// the innermost dim (e.g. (0, 2, 1, 3)) writes the permute's output directly ([B, L, H, E]); the
// permute is then virtual too, and so is a RESHAPE that is the permute output's only reader (the
// sdpa writes the reshape's output: the merge [B, L, H, E] -> [B, L, H * E] is the same bytes).
// So does a MATMUL (operands of rank >= 2) whose fused tail ops, if any, are unary (they then
// run over the written bytes), where the written view's batch dims collapse into one stride;
// its output may reach the permute through a RESHAPE at static shapes that strides express (the
// heads a bmm flattened into its batch split again, [B * H, L, E] -> [B, H, L, E]: DeBERTa's),
// which then runs no kernel either (mm_pre[]). A matmul operand whose bytes the planner gave to
// the written output moves out of the arena instead (as a folded base does).
// Lifetimes: the memory plan ends a tensor's life at its last reader in the plan, so a folded
// base must not be overwritten before the sdpa reads it: every fold is checked against the
// arena ranges of the tensors written by the layers that really run in between (and the
// redirected sdpa output against the tensors the sdpa reads, with nothing running between the
// sdpa and its permute). A base that fails moves out of the arena: the context places it in its
// extras block by its live range (producer .. last read through the views) with libkiln's
// memory planner (cuda_memory.c); a redirected output that fails is undone; to a fixed point.
// States (plan.h): a fold whose base is a state is undone when the state's update (one layer)
// falls between the first view layer and the sdpa (the read cannot move past the update); no
// fold writes a state.
// Aliases: then a RESHAPE layer (no tail) from an activation to an activation, both stored as the
// plan says (not NHWC, not relocated, not read through a copy), runs no kernel when the memory of
// its input (or of the tensor that input aliases) is not overwritten by any layer that runs
// between the reshape and the last read of its output (directly or through folded views): the
// output's view points at the input's memory (a dense reshape is the same bytes). So does a
// SLICE with step 1 of a statically shaped tensor whose dims before the sliced one are all 1
// (a contiguous run of the input: MobileViTv2's split of one conv's output into query, key and
// value channels), at the run's byte offset when that is a multiple of 16, and a layout permute
// (ident[] of the layout pass, cuda_layout.h: its input or its output NHWC, the same bytes).
// Decided after the folds, in layer order, so chains of reshapes and slices share one base. A
// reshape whose output is a fold's base moved out of the arena aliases too: its input moves out
// instead, live to the last read through the views.
// The option cuda.attention_fold = false turns the pass off (every layer runs), rope groups
// included.
// GEMV folds (with cuda.gemv and cuda.gemv_fold), decided last, for linears the GEMV runs with
// one row (every dim of the output but the last 1 at the largest shapes: a decode step of batch
// 1; the fused GEMV exists for that row count only, which keeps the plugin small),
// float16/bfloat16 operands of one dtype, K a multiple of 8, weights and activations 16-byte
// aligned, the x slot not read through a layout copy):
//  - norm: an RMS_NORM layer (no tail) whose output is an activation read only as the x of such
//    linears runs no kernel: each of them reads the norm's input (an activation or a state) and
//    applies the norm itself (float32 sum of squares over its row, then x * rsqrt * w), when that
//    input's memory is not written over between the norm and the last of them;
//  - pair: a linear U (no tail) whose output is read only by the mul that follows the activation
//    (SiLU, ReLU or GELU) fused after a linear G of the same x, weight shape and bias presence
//    (act(x W_g + b_g) * (x W_u + b_u), a gated MLP) runs no kernel: G's GEMV streams both
//    weights, a warp's two columns being row j of W_g and row j of W_u, and writes the product.
//  - siblings: up to KILN_CUDA_GEMV_MAX_SIB linears (no tails, not part of a pair) of the same x
//    that run one after another (only layers that run no kernel between them) run as one GEMV
//    launch at the first of them, each block on one member's columns; the others run no kernel.
//    Their outputs are then written earlier than planned: they must not overlap each other, x,
//    or the folded norm's input, and a relocated one lives from the first of them.
// The readers of a folded norm, the G of a pair and the first of siblings name them in
// gemv_norm[], gemv_pair[] and gemv_next[] (the next sibling, a chain).
// Rope groups (with cuda.attention_fold): the rotary embedding of q and k and the KV cache
// writes of a decoder's attention run as one launch at the q rotary Q. The members: a ROTARY K
// (no tail) of the same cos and sin, whose output is an activation read only by an in-place
// INDEX_COPY KC into a state (the key cache; dim = rank - 2, static shapes: the rotated rows go
// straight into the cache rows the index names), and optionally an in-place INDEX_COPY VC into
// another state by the same index and dim (the value rows). K, KC and VC run no kernel. Their
// inputs (K's x, the index, cos, sin, VC's rows) are written before Q and not written again up
// to the last member, and no layer between Q and the last member reads or writes either cache
// (the rows land earlier than planned). Q names them in rope_k[], rope_kc[], rope_vc[].
// A member's input (Q's x, K's x, VC's rows) that a PERMUTE (no tail) keeping the last dim
// innermost produces, read by nothing else, over an activation of static shape: the permute
// runs no kernel either (KILN_CUDA_FOLD_ROPE) and the group reads the permute's input through
// the permuted strides (a prompt's projections [B, L, H, E] as [B, H, L, E]); that input's
// memory moves out of the arena, live to Q, where the planner reuses it before Q.
// Mean ratios (with cuda.attention_fold): x / (mean(x over its last dim) + eps), a global
// response norm's ratio (ConvNeXt-V2), runs as one launch at the MEAN layer M: M (no tail) reduces
// only the last dim of a float activation X of static shape, at most KILN_CUDA_RATIO_MAX long;
// its output is an activation read only by the ADD A (no tail) that runs next, adding a
// one-element weight of its dtype; A's output is an activation read only by the DIV D (no tail)
// that runs next, dividing X by it into a tensor of X's shape and dtype (only layers that run
// no kernel between them). X and D's output are dense (not NHWC, not read through a layout
// copy) and D's output does not overlap X's memory. M's launch takes a block per row: the mean,
// then the sum with eps and the quotients, each rounded to its layer's dtype as the three layers
// would; A and D run no kernel. M names them in ratio_add[] and ratio_div[].
// Softmax-weighted sums (with cuda.attention_fold): sum(x * softmax(s over its last dim) over the
// last dim), one query's attention over a row of scores (MobileViT's separable attention: its
// context vector), runs as one launch at the SUM U: the SOFTMAX (no tail) over the last dim of a
// float tensor s of static shape, its output an activation read only by the MUL (no tail) that
// runs next, multiplying it by a dense x of the product's shape (the softmax's output
// broadcasting to it over leading dims), whose output is an activation read only by U, running
// next, a SUM over the last dim only (only layers that run no kernel between them). s, x and
// U's output are dense (not NHWC, not read through a layout copy), and U's output overlaps
// neither s's nor x's memory. A warp per output row: the softmax of the row's scores, each
// product and the sum rounded as the three layers would; the softmax and the mul run no kernel.
// U names them in wsum_sm[] and wsum_mul[].
// Overflow clamps (with cuda.attention_fold): transformers' float16 guard in T5-family blocks,
// clamp(x, -c, c) with c = where(isinf(x).any(), finfo.max - 1000, finfo.max), exported as
// ABS, EQ (+inf), CAST, SUM (all elements), CAST, GT (0), WHERE (two scalar constants a, b),
// NEG, CAST, MAXIMUM, CAST, MINIMUM, runs as one launch at the ABS A: x a float activation (or
// input) of static shape, at most KILN_CUDA_CLAMP_MAX elements, dense (not NHWC), each link read
// only by the next (the WHERE's output by the NEG and one CAST), the twelve running one after
// another, the MINIMUM's output of x's shape and dtype, dense, apart from x's memory or exactly
// in it (then in place). The launch (one block) finds whether any |x| is +inf, takes c = a or b as
// the WHERE would, rounds -c and c to x's dtype as the casts do, and writes min(max(x, -c), c) (NaN
// kept); the other eleven run no kernel. A names the MINIMUM in clamp_mn[] and a, b in clamp_ab[2
// A], [2 A + 1].
// Conv prologues (with cuda.attention_fold): a CONV2D P whose tail (1 to KILN_CUDA_PRE_MAX ops)
// is relu, clamp, a square (pow by an inline 2, the running value the base), or add, sub, mul,
// maximum or minimum of the running value and a one-element float weight, and whose output is an
// activation stored NHWC read only as the x of a CONV2D D, depthwise (groups = C = O, C a
// multiple of 8) 7x7 of stride 1 and dilation 1 over 16-bit values of its weight's dtype, not
// through a layout copy: P runs without its tail (its output holds the conv with its bias) and
// D applies the tail to each input value before it convolves, each value rounded to the dtype
// as P's tail pass would have stored it; the zero padding stays zero. MetaFormer's separable
// conv (ConvFormer's StarReLU, s * relu(x)^2 + b, after a 1x1 conv whose cuBLASLt epilogue
// cannot take it) otherwise ran that tail as a pass over the block's widest activation. D's
// tile kernel applies it to the staged input; where D runs another kernel (its shapes or
// pointers at run time), the tail runs first as one pass over D's input, in place. D names P in
// pre_src[], P names D in pre_dst[].
#ifndef KILN_CUDA_CUDA_FOLD_H
#define KILN_CUDA_CUDA_FOLD_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "runtime/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_plan;

// A strided view of device memory (element strides; the innermost is 1 where sdpa reads it).
typedef struct kiln_cuda_strided {
    void *data;
    uint32_t rank;
    int64_t dims[KILN_MAX_RANK];
    int64_t str[KILN_MAX_RANK];
} kiln_cuda_strided;

#define KILN_CUDA_FOLD_VIRTUAL 1u // the layer runs no kernel: its readers read through views
#define KILN_CUDA_FOLD_WRITTEN 2u // ... and its output is written by the sdpa before it
#define KILN_CUDA_FOLD_ALIAS 4u   // a reshape or slice whose output is in its input's memory
#define KILN_CUDA_FOLD_GEMV 8u    // a norm, up projection or sibling run inside a GEMV (gemv_*[])
#define KILN_CUDA_FOLD_ROPE 16u   // a rotary or cache write run by a rope group's launch (rope_*[])
#define KILN_CUDA_FOLD_RATIO 32u  // the add or div of a mean ratio, run by the mean's launch
#define KILN_CUDA_RATIO_MAX 65536 // the longest row a mean ratio's launch takes
#define KILN_CUDA_FOLD_WSUM 64u   // the softmax or mul of a softmax-weighted sum, run by the sum
#define KILN_CUDA_FOLD_CLAMP 128u // a member of an overflow clamp, run by its ABS's launch
#define KILN_CUDA_CLAMP_MAX (1 << 20) // the most elements an overflow clamp's launch takes
#define KILN_CUDA_GEMV_MAX_SIB 4      // linears one GEMV launch runs as siblings
#define KILN_CUDA_PRE_MAX 4           // the most tail ops a conv prologue takes
#define KILN_CUDA_GEMV_FOLD_M 1       // the rows of a linear with GEMV folds

typedef struct kiln_cuda_fold {
    uint8_t *virt;        // n_layers: 0, KILN_CUDA_FOLD_VIRTUAL or _VIRTUAL | _WRITTEN
    uint8_t *sdpa_in;     // n_layers: bit j (0..2): the sdpa's q/k/v (a matmul's a/b, a
                          // rotary's x) is read through a view
    int32_t *sdpa_out;    // n_layers: the layer index of the permute the sdpa writes for, or -1
    int32_t *sdpa_dst;    // n_layers: the tensor it writes: the permute's output, or the output of
                          // the RESHAPE that is its only reader (dense: the same bytes), or -1
    int32_t *producer;    // n_tensors: the layer writing the tensor (-1: input, weight, none)
    uint8_t *base_nhwc;   // n_tensors: 1 for a 4-D tensor stored NHWC (cuda_layout.h) that a
                          // virtual RESHAPE reads: its view has NHWC strides
    uint8_t *cl_dims;     // n_tensors: k for a permute output an sdpa writes that the layout
                          // stores channels-last (dims 1..k innermost: cuda_layout.h), else 0
    uint8_t *reloc;       // n_tensors: 1 for a folded base whose arena slot is reused before
                          // the sdpa reads it (placed outside the arena: cuda_memory.c)
    uint32_t *live_first; // n_tensors: a relocated base's live range over the layers
    uint32_t *live_last;
    int32_t *alias;       // n_tensors: the tensor whose memory an aliased reshape's or
                          // slice's output is in (KILN_CUDA_FOLD_ALIAS), or -1
    int64_t *alias_off;   // n_tensors: the alias's byte offset into that memory
    int32_t *gemv_norm;   // n_layers: the RMS_NORM layer a GEMV linear applies to its x, or -1
    int32_t *gemv_pair;   // n_layers: the up projection U a gated GEMV G also streams, or -1
    int32_t *gemv_next;   // n_layers: the next sibling run by this one's launch, or -1
    int32_t *rope_k;      // n_layers: at a rope group's q rotary: the k rotary K, or -1
    int32_t *rope_kc;     // ... the key cache write KC
    int32_t *rope_vc;     // ... the value cache write VC, or -1
    int32_t *ratio_add;   // n_layers: at a mean ratio's MEAN: the ADD of eps, or -1
    int32_t *ratio_div;   // ... the DIV, or -1
    int32_t *wsum_sm;     // n_layers: at a softmax-weighted sum's SUM: the SOFTMAX, or -1
    int32_t *wsum_mul;    // ... the MUL, or -1
    int32_t *clamp_mn;    // n_layers: at an overflow clamp's ABS: its MINIMUM, or -1
    float *clamp_ab;      // 2 n_layers: ... the WHERE's a (some |x| is inf) and b (none)
    int32_t *pre_src;     // n_layers: at a depthwise conv D with a prologue: the conv P whose
                          // tail D applies to its input, or -1
    int32_t *pre_dst;     // n_layers: at such a P: D, or -1
    float *mm_alpha;      // n_layers: a matmul's product scale (the constant scales folded on
                          // its operands' views), else 1
    int32_t *mm_pre;      // n_layers: at a matmul writing through a permute: the RESHAPE of its
                          // output the permute reads (run by neither), or -1
    uint32_t n_alias;     // reshapes and slices aliased
    uint32_t n_gemv_norm; // norms run inside GEMVs
    uint32_t n_gemv_pair; // gated pairs run as one GEMV
    uint32_t n_gemv_sib;  // linears run by a sibling's launch
    uint32_t n_rope;      // rope groups
    uint32_t n_rope_in;   // permutes a rope group reads through (no kernel)
    uint32_t n_ratio;     // mean ratios
    uint32_t n_wsum;      // softmax-weighted sums
    uint32_t n_clamp;     // overflow clamps
    uint32_t n_pre;       // conv prologues
    uint32_t n_reloc;     // relocated bases
    uint32_t n_virtual;   // layers that run no kernel
    uint32_t n_sdpa_in, n_sdpa_out; // folded sdpa operands / outputs
    uint32_t n_mm_in;               // folded matmul operands
    uint32_t n_rot_in;              // rotaries reading their x through a view
} kiln_cuda_fold;

// A matmul y[b] = a[b] @ b[b] (torch.matmul's batch broadcasting) over strided operands, its
// batch dims collapsed into one: a(i, k) at a + bt * a_bs + i * a_rs + k * a_cs, b(k, j) alike,
// y dense. A broadcast operand has batch stride 0.
typedef struct kiln_cuda_mm_geom {
    int64_t m, n, k, batch;
    int64_t a_rs, a_cs, a_bs;
    int64_t b_rs, b_cs, b_bs;
    int64_t y_rs, y_bs; // y(i, j) at bt * y_bs + i * y_rs + j
} kiln_cuda_mm_geom;

// Fills *g from the operands' views (dims [.., m, k] and [.., k, n]; rank 1 as torch.matmul
// reads it) and the output's (y: NULL when dense; else [.., m, n] with n innermost, both
// operands of rank >= 2) when every batch dim of size > 1 collapses into one stride for each;
// 0 otherwise (then only Kiln's tiled kernel, which takes any strides, runs it).
int kiln_cuda_mm_geom_of(const kiln_cuda_strided *a, const kiln_cuda_strided *b,
                         const kiln_cuda_strided *y, kiln_cuda_mm_geom *g);
// A matmul as one column-major GEMM, the form cuBLASLt takes (gemm_lt.cu): D^T [n x m] = B^T
// A^T, its A the matmul's b (stored n x k with ld lda, or k x n used transposed: trans_a), its B
// the matmul's a transposed (k x m with ld ldb, or m x k used transposed: trans_b), D the output
// (ld ldd); batch matrices stride_a, stride_b, stride_d apart (batch 1: a's batch folded into
// the rows when b has none). m, n, k here are the GEMM's (the matmul's n, m, k).
typedef struct kiln_cuda_mm_gemm {
    int trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldd, batch, stride_a, stride_b, stride_d;
} kiln_cuda_mm_gemm;

// Fills *c from *g; 0 when no such GEMM reads the strides (then Kiln's tiled kernel runs it).
int kiln_cuda_mm_gemm_of(const kiln_cuda_mm_geom *g, kiln_cuda_mm_gemm *c);

// 1 when the matrix x(i, j) at i * rs + j * cs (rows x cols) is one cuBLASLt reads: cs == 1 with
// rs >= cols (row-major), or rs == 1 with cs >= rows (column-major); a dim of size 1 takes any
// stride.
int kiln_cuda_mm_matrix_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs);

// Decides the folds of p (none when enable is 0). nhwc (n_tensors, may be NULL) and alt (n_ids,
// may be NULL) are the layout pass's tensors stored NHWC and slots reading a copy: nothing
// involving them is folded. Fails only for memory.
// gemv: the GEMV folds (cuda.gemv and cuda.gemv_fold).
kiln_status kiln_cuda_fold_plan(const struct kiln_plan *p, const uint8_t *nhwc, const uint8_t *alt,
                                const uint8_t *ident, int enable, int gemv, kiln_cuda_fold *out);
void kiln_cuda_fold_free(const struct kiln_plan *p, kiln_cuda_fold *f);

// The view of tensor id at the current shapes (views[]: the context's tensor views, dims of this
// execute and data of materialized tensors): through the virtual layers writing it, down to
// its base.
void kiln_cuda_fold_view(const struct kiln_plan *p, const kiln_cuda_fold *f,
                         const kiln_tensor *views, int32_t id, kiln_cuda_strided *out);

// The view through which a rope group reads its input t when a permute producing t is folded
// into the group (KILN_CUDA_FOLD_ROPE on a PERMUTE: t is the permute's input under permuted
// strides, the innermost 1); rank 0 when t is read as stored.
void kiln_cuda_fold_rope_view(const struct kiln_plan *p, const kiln_cuda_fold *f,
                              const kiln_tensor *views, int32_t t, kiln_cuda_strided *out);

// The view through which sdpa layer li writes its output o (logical [.., L, Ev]) into the
// output of the permute f->sdpa_out[li].
void kiln_cuda_fold_out_view(const struct kiln_plan *p, const kiln_cuda_fold *f,
                             const kiln_tensor *views, uint32_t li, kiln_cuda_strided *out);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_FOLD_H
