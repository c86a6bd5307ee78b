// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's private activation layout (host C only): which 4-D fp16/bf16 activations
// it keeps in NHWC in the arena (so that cuDNN's convolutions run NHWC, on tensor cores, without
// transposes), decided once per engine by a pass over the plan (cuda_layout.c).
//
// A tensor is NHWC only when it is an activation (never an engine input, output or state: those
// stay NCHW, and a group reading or writing a state runs NCHW, so no state has a layout copy),
// 4-D, float16/bfloat16, with C a multiple of 8, written by a layer that can work in NHWC:
//   * conv2d with groups 1 (or, when a conv writes its input, depthwise of at most
//     KILN_CUDA_DW_NHWC_MAX_TAPS taps, or grouped with C/g and K/g multiples of 8), a static C
//     and K a multiple of 8 (its fused tail elementwise with
//     operands of the output's shape or of one element: layout-blind); unary activation heads,
//     same-shape binary heads, max_pool2d, avg_pool2d, the two upsamples (the same tail rule),
//     cat of such tensors (4-D, C % 8 == 0); after an elementwise head or a cat, a tail operand
//     may also be one value per channel ([1 or N, C, 1, 1]: the same bytes in either layout);
//   * a group_norm of one group (MobileViT's GroupNorm(1, C): statistics over the whole sample
//     in either layout, the affine indexed by the stored layout) with its input's shape;
//   * unary/binary heads, pools, upsamples, cats and one-group norms keep their input(s) and
//     output in one layout (a batch norm the builder made a per-channel multiply and add is
//     one): an NCHW input demotes their output and an NCHW output their input (to a fixed
//     point); nothing else demotes a tensor.
// Layout permutes (channels-last model code: ConvNeXt's blocks, `x.permute(0, 3, 1, 2)` around a
// depthwise conv, `permute(0, 2, 3, 1)` back for the LayerNorm and the linears):
//   * a PERMUTE (0, 3, 1, 2) (no tail, no state) of a 4-D float16/bfloat16 activation [N, H, W, C]
//     stored as the plan says, to an activation [N, C, H, W] with a static C % 8 == 0, writes its
//     output NHWC: the same bytes as its input. Convs may read it as NHWC like a conv's output
//     (depthwise and grouped ones included);
//   * a PERMUTE (0, 2, 3, 1) (no tail, no state) of an NHWC tensor [N, C, H, W] reads it as it is
//     and writes [N, H, W, C] as the plan says: again the same bytes.
// Such a permute is marked in ident[]: the fold pass (cuda_fold.h) makes its output an alias of
// its input's memory (no kernel), and where it cannot, the layer copies the bytes.
// Every other layout mismatch is a boundary read through a copy of the tensor in the other
// layout (an NHWC copy of an NCHW tensor, an NCHW copy of an NHWC one), made by one transpose at
// the first such read in layer order and shared by later ones (the copy lives in the context,
// outside the arena). A RESHAPE (no tail) that is the only reader of an NHWC tensor's NCHW copy
// makes no copy: its output is the NCHW bytes of its input in other dims, so it writes them
// itself by the same transpose (rs_xpose: the reshapes of a conv's map in a patchify or an
// unfold, as in ConvNeXt's downsampling, MobileViT, MaxViT, SegFormer and wav2vec2, which then
// copied the copy). Likewise a one-group norm over an NHWC map whose every reader reads its
// output through the NCHW copy writes that output NCHW itself (out_nchw; MobileViT's norm before
// a qkv projection of 1 + 2C channels, which stays NCHW): its output is then stored NCHW and the
// copy is not made. And an elementwise group run NCHW (a unary or binary head with its tail:
// MobileViT's relu(v) * context, whose context operand broadcasts over the pixels) or a permute
// whose every reader reads its output through the NHWC copy writes that output NHWC itself
// (out_nhwc; the output has C % 8 == 0 like every NHWC tensor). A permute read only by a reshape
// to [N, C, H, W] whose C is the product of the permute output's dims 1..k (k = 1: MobileViT's
// fold of patches back into a map; k = 2: a conv-form attention's heads [N, heads, E, pixels]
// merged back into channels) (MobileViT's fold of patches back into a map
// before a conv) writes its output channels-last at any rank (dim 1 innermost) when the
// reshape's readers read NHWC: those are the reshape's NHWC bytes, so the reshape is a layer of
// the same bytes (ident, aliased by the fold pass where it can be). The other way round, a
// reshape of an NHWC map that keeps its first two dims, read only by a permute (MobileViT's
// unfold of a map into patches), is a view of the map's NHWC bytes channels-last: the reshape is
// such a layer of the same bytes and the permute reads its input channels-last (in_nhwc), where
// the reshape would otherwise transpose the map for it (rs_xpose). Other mismatches: a conv
// computing NHWC whose input is NCHW (the stem's pool, a cast engine input), a conv group's
// residual operand in the other layout, any NCHW-only consumer (mean, cast, reshape, linear,
// batch_norm, ...) of an NHWC tensor. adaptive_avg_pool2d reads either layout and writes NCHW. NHWC
// convs use their weights in KRSC (OHWI) order, a second copy made at upload. A conv whose C is not
// a multiple of 8 (a 3-channel stem) reads an NHWC copy whose channels are padded with zeros to the
// next multiple of 8, and a KRSC weight padded the same way (zero filters for the pad), so that
// cuDNN runs it on tensor cores: such a tensor is never NHWC itself, so the copy is always the
// padded one. With KILN_CUDA_LAYOUT_STEM, such a conv whose depth C * kh * kw is at most
// KILN_CUDA_STEM_MAX_K (ResNet's 3-channel 7x7 stem) runs on Kiln's stem kernel instead
// (conv_stem.cu): it reads its NCHW input as it is (no copy, no KRSC weight) and writes NHWC. The
// options cuda.nhwc = false turns the pass off (everything NCHW) and cuda.stem_kernel = false only
// the stem kernel (the padded copy and cuDNN instead). The copies and KRSC weights are placed by
// cuda_memory.c.
#ifndef KILN_CUDA_CUDA_LAYOUT_H
#define KILN_CUDA_CUDA_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_util.h"
#include "kiln/kiln.h"
#include "runtime/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

// Depthwise convs of at most this many taps run NHWC on Kiln's depthwise kernel (3x3, 5x5 and
// ConvNeXt's 7x7 unrolled; a 7x7 with 2 output pixels a thread beat cuDNN's NCHW kernel plus
// its two transposes at every ConvNeXt-T layer, docs/benchmarks.md); larger ones stay NCHW on
// cuDNN (the kernel's generic form, taps not unrolled, was 2-3x slower than cuDNN at 7x7)
#define KILN_CUDA_DW_NHWC_MAX_TAPS 49

typedef struct kiln_cuda_layout {
    uint8_t *nhwc;      // n_tensors: >= 1 = stored NHWC (logical dims stay NCHW); a permute's
                        // output stored channels-last at any rank: its channel dims' count k
                        // (dims 1..k innermost, then the others in order, then dim 0)
    uint8_t *head_nhwc; // n_layers: head layer runs with ctx->nhwc
    uint8_t *alt;       // n_ids: this input slot (of a head or a tail) reads the tensor's copy
    uint8_t *xpose;     // n_ids: ... and makes it first (transposes the tensor into the copy)
    uint8_t *copy;      // n_tensors: the tensor has a copy in the other layout (NHWC of an
                        // NCHW tensor, NCHW of an NHWC one)
    uint8_t *krsc;      // n_tensors: a weight some NHWC conv uses (needs a KRSC copy)
    uint8_t *krsc_only; // n_tensors: a krsc weight no layer reads but through its KRSC copy
                        // (its OIHW bytes need not be on the device)
    uint8_t *padc;      // n_tensors: the NHWC copy of this NCHW tensor, or this weight's KRSC
                        // copy, pads C up to a multiple of 8 with zeros (a conv with C % 8 != 0)
    uint8_t *stem;      // n_layers: conv2d head on the stem kernel (NCHW input, NHWC output)
    uint8_t *ident;     // n_layers: a layout permute (or a reshape, above) of its input's bytes
    uint8_t *rs_xpose;  // n_layers: a reshape of an NHWC tensor that writes its output by
                        // transposing the NHWC bytes itself (no copy: below)
    uint8_t *out_nchw;  // n_layers: a one-group norm that reads its input NHWC and writes its
                        // output NCHW (below)
    uint8_t *out_nhwc;  // n_layers: an elementwise group or permute that writes its output NHWC
                        // (a permute: channels-last with its output's k channel dims)
    uint8_t *in_nhwc;   // n_layers: a permute that reads its input channels-last (below)
    uint32_t n_conv, n_conv_nhwc, n_nhwc, n_copies, n_conv_padded, n_conv_stem, n_ident;
    uint32_t n_rs_xpose, n_out_nchw, n_out_nhwc, n_in_nhwc;
} kiln_cuda_layout;

// kiln_cuda_layout_plan's flags: NHWC activations where they pay; the stem kernel for convs with
// C % 8 != 0 (only with NHWC).
#define KILN_CUDA_LAYOUT_NHWC 0x1
#define KILN_CUDA_LAYOUT_STEM 0x2

// The stem kernel's limits (op_conv.cu), checked at plan time on the largest shapes: a conv2d of
// groups 1 with C % 8 != 0, depth C * kh * kw <= KILN_CUDA_STEM_MAX_K, kh and kw at most 31 (the
// tap masks are 32-bit), and every offset within an image (C * H * W, the last tap's) below 2^31.
#define KILN_CUDA_STEM_MAX_K 192
static inline int kiln_cuda_stem_fits(int64_t c, int64_t kh, int64_t kw, int64_t h, int64_t w,
                                      int64_t dh, int64_t dw) {
    return c > 0 && c % 8 != 0 && kh > 0 && kw > 0 && kh <= 31 && kw <= 31 && dh > 0 && dw > 0 &&
           c * kh * kw <= KILN_CUDA_STEM_MAX_K && c * h * w < ((int64_t)1 << 31) &&
           (c * h + (kh - 1) * dh) * w + (kw - 1) * dw < ((int64_t)1 << 31);
}

// The GEMV kernel's largest M (op_gemv.cu).
#define KILN_CUDA_GEMV_MAX_M 8

// The L2 plan of the GEMV weights (kiln_cuda_ctx.l2_keep): for every linear layer of p that
// runs on the GEMV kernel (a float16/bfloat16 weight, at most KILN_CUDA_GEMV_MAX_M input rows at
// the largest shape), smallest weight first, keep[li] = the bytes at the start of its weight
// that its loads mark evict-last, while the kept bytes sum to at most budget (the last one kept
// in part); the rest of every such weight is marked evict-first (streamed once, it pushes out
// neither the kept weights nor the activations). Back-to-back executes then read the kept bytes
// from L2 instead of HBM. Other layers get -1 (no hint). Returns the bytes kept.
uint64_t kiln_cuda_plan_gemv_l2(const kiln_plan *p, uint64_t budget, int64_t *keep);
// The same plan over the linears of at most max_rows input rows (on sm_90 the small-M wgmma
// linear, cuda_wg.h, loads its weight tiles under the same hints: KILN_CUDA_WG_MAX_M).
uint64_t kiln_cuda_plan_l2(const kiln_plan *p, uint64_t budget, int64_t max_rows, int64_t *keep);

// Decides the layout of every tensor of p (flags: KILN_CUDA_LAYOUT_*; 0: all NCHW). Fails only
// for memory.
kiln_status kiln_cuda_layout_plan(const kiln_plan *p, int flags, kiln_cuda_layout *out);
void kiln_cuda_layout_free(const kiln_plan *p, kiln_cuda_layout *l);

#ifdef __cplusplus
}
#endif

#endif // KILN_CUDA_CUDA_LAYOUT_H
