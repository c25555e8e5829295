// 2-D convolution on the GPU (NCHW; f32, f64, and bf16/f16 computed in float on the tensor cores;
// stride and padding as in graph/kernels/conv_cpu.cpp). Each pass is one implicit GEMM (patches
// gathered on the fly; grad_weight sums split-K partials in a fixed order; bf16/f16 grad_input
// transposes the weights into scratch first); grad_input at stride > 1 (bf16/f16: > 2), very
// few output channels, 1x1 filters and sizes past 32-bit offsets use im2col + cuBLAS GEMM with
// col2im as a deterministic gather. No atomics: results are bitwise repeatable.
#pragma once

#include "gpu/kernel_source.h"

#include <optional>
#include <span>
#include <vector>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/cuda_runtime.h"
#include "graph/graph.h"
#include "graph/passes/channels_last_values.h"
#include "graph/passes/filter_layouts.h"
#include "graph/kernels/conv_cpu.h"

namespace kiln::cuda {

enum class ConvPass { forward, grad_input, grad_weight };

// Scratch bytes that `pass` needs to process `images_per_chunk` images per step (0: the
// whole batch in one step, the fastest). For the implicit-GEMM passes: 0 (forward,
// grad_input) or grad_weight's split-K partials (less scratch only means fewer splits; none
// at all works too). For the im2col passes any workspace of at least one image's size
// works: they loop over as many images as fit. 0 when the pass needs no scratch.
// image_channels_last: the image arrives channels-last (only where conv_reads_channels_last),
// so the scratch holds no reordered copy of it; filter_laid_out: likewise the filter
// (conv_filter_layout, where conv_copied_filter_taps).
std::size_t conv_workspace_bytes(const kernels::ConvGeometry& g, DType dtype, ConvPass pass,
                                 std::int64_t images_per_chunk = 0,
                                 bool image_channels_last = false, bool filter_laid_out = false);

// Device scratch from the caller (e.g. the memory plan), 256-byte aligned.
struct ConvWorkspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// conv2d_bias's epilogue, applied by the forward pass as it stores y where
// conv_forward_applies_bias: y = the sum rounded, + bias[filter] (null: none), then ReLU where
// relu; the bits of the unfused add and relu ops.
struct ConvBias {
  const void* bias = nullptr;  // [Cout], the pass's dtype
  bool relu = false;
};

// The input gradient's filter taps (kernels/conv_params.h, ConvClasses): one class of the whole
// flipped filter, or (by_residue) one for each residue of dx's pixels modulo the stride (at
// most 2), the stride-2 pass's four stride-1 convolutions of dy (where the TMA pass fits them).
ConvClasses conv_input_gradient_classes(const kernels::ConvGeometry& g, bool by_residue);

// x: [B, Cin, H, W], w: [Cout, Cin, KH, KW] -> y: [B, Cout, OH, OW].
// The hand-written kernels a pass over `g` launches (the implicit-GEMM tile chosen for it and
// its split-K sum, or im2col/col2im), so that a program can compile them up front. moments
// (the forward where conv_forward_writes_moments): its TMA kernel with the moments epilogue.
// dy_channels_last: grad_weight's kernel that reads dy stored channels-last.
std::vector<gpu::KernelSource> conv_kernel_sources(const kernels::ConvGeometry& g, DType dtype,
                                                   ConvPass pass, bool moments = false,
                                                   bool dy_channels_last = false);

// Whether `pass` reorders its image (the forward's or grad_weight's x) to NHWC itself: the
// channels-last tensor-core passes and grad_weight's TMA pass. Only those take an image stored
// channels-last ([B, H, W, Cin]: x_channels_last below; graph/passes/channels_last.h), and
// skip the copy.
bool conv_reads_channels_last(const kernels::ConvGeometry& g, DType dtype, ConvPass pass);
// Whether `pass` runs on the channels-last tensor-core kernels (the TMA or wgmma passes over NHWC
// operands; grad_weight's TMA pass), which could take y, dy and dx channels-last too.
bool conv_runs_channels_last(const kernels::ConvGeometry& g, DType dtype, ConvPass pass);
// Whether `pass` can store its output (conv2d's y, grad_input's dx) channels-last: the TMA
// pass's epilogue (kernels/conv_mma.cuh's nhwc_store_c; store_class_pair's NHWC by classes).
bool conv_writes_channels_last(const kernels::ConvGeometry& g, DType dtype, ConvPass pass);
// Whether grad_weight's pass over `g` can read dy stored channels-last: its TMA pass, 64 or more
// filters, a multiple of 8 (the MN-major A of kernels/conv_wgmma_wgrad_tma.cuh).
bool conv_grad_weight_reads_nhwc_dy(const kernels::ConvGeometry& g, DType dtype);
// The same for a bf16/f16 conv2d or conv2d_grad_weight node whose image (inputs[0]) is
// [B, C, H, W]: the layout pass's choice on the GPU (graph/passes/channels_last.h). False for
// f32, whose passes depend on the TF32 switch that the program sets later.
bool conv_node_reads_channels_last(const Node& conv, std::span<const TensorType> inputs);
// Whether a bf16/f16 conv2d_grad_input or conv2d_grad_weight node (inputs: as the node has them)
// should read its dy stored [B, OH, OW, Cout] (channels_last_images' `wants_dy`): an input
// gradient on the channels-last tensor-core passes (which would copy an NCHW dy so itself); a
// weight gradient whose TMA pass reads an NHWC dy (KILN_WGRAD_NHWC_DY=0: never), taking the
// copy only where an input gradient of the same dy made it.
bool conv_node_reads_nhwc_dy(const Node& conv, std::span<const TensorType> inputs);
// Which activations of a bf16/f16 conv2d, conv2d_grad_input or conv2d_grad_weight node
// (inputs: as the node has them) the channels-last values pass
// (graph/passes/channels_last_values.h) may store channels-last, with KILN_CHANNELS_LAST_VALUES=1
// (otherwise none): the forward's y and grad_input's dx where the TMA pass writes them
// (conv_writes_channels_last), grad_input's dy where its pass reads NHWC (which copies a
// [B, C, H, W] dy so itself); grad_weight none (its kernel reads dy [B, C, H, W]). Off by
// default: not yet run on a GPU.
// KILN_CHANNELS_LAST_VALUES=all instead grants every side of every pass on the channels-last
// tensor cores, whether its kernels take it or not: `dump`'s projection of the finished work (a
// program refuses the nodes its kernels do not take).
ChannelsLastSides conv_node_channels_last_sides(const Node& conv,
                                                std::span<const TensorType> inputs);
// Whether the forward of a conv2d node (inputs: its image, [B, H, W, C] where the node is marked
// channels-last, and its weights) runs the TMA pass, whose epilogue computes conv2d_moments'
// run moments (the conv-statistics pass's choice on the GPU, fusion/conv_statistics.h).
bool conv_node_writes_moments(const Node& conv, std::span<const TensorType> inputs);
// The order of its filter that a bf16/f16 conv2d or conv2d_grad_input node's pass reads where
// it copies the filter first (conv_copied_filter_taps): the layout pass's choice on the GPU
// (graph/passes/filter_layouts.h); nullopt elsewhere, and everywhere under KILN_FILTER_LAYOUTS=0
// (the passes copy their filters themselves, as before).
std::optional<FilterOrder> conv_node_filter_order(const Node& conv,
                                                  std::span<const TensorType> inputs);
// Whether the forward pass over `g` runs the TMA pass (conv_tma.h), whose epilogue can write the
// run moments (conv2d_forward's `moments`).
bool conv_forward_writes_moments(const kernels::ConvGeometry& g, DType dtype);
// Whether the forward pass over `g` adds a bias and applies ReLU as it stores y (conv2d_forward's
// `bias`): the CUDA cores' passes (the direct stem kernel's f32 form, the implicit GEMM) under
// the current TF32 switch; the others leave conv2d_bias's epilogue to a kernel of its own.
bool conv_forward_applies_bias(const kernels::ConvGeometry& g, DType dtype);
// The same for an f32 conv2d node (inputs: its image [B, C, H, W] and filter) under the current
// TF32 switch: the GPU's choice of the convolutions that the GEMM-epilogue pass makes conv2d_bias
// nodes of (fusion/gemm_epilogues.h). False for bf16/f16, whose bias groups stay groups.
bool conv_node_applies_bias(const Node& conv, std::span<const TensorType> inputs);

// Where `pass` (the forward or the input gradient) copies its filter into the channels-last
// GEMM's order before it multiplies (kernels/conv_mma_nhwc.cuh, nhwc_weights): the order of the
// taps in that copy (conv_filter_taps), whose rows are the filters (the forward) or the input
// channels (the input gradient); nullopt where the pass reads the filter as stored. A graph can
// make the copy a node of its own (graph/passes/filter_layouts.h), and the pass then takes the
// filter so (filter_laid_out below).
std::optional<std::vector<std::int64_t>> conv_copied_filter_taps(const kernels::ConvGeometry& g,
                                                                 DType dtype, ConvPass pass);
// moments: where not null (only where conv_forward_writes_moments), y's run moments too
// (graph/ops.h's conv2d_moments, [3, ceil(B OH OW / 64), Cout] f32), from the epilogue.
// y_channels_last: y stored [B, OH, OW, Cout] (only where conv_writes_channels_last).
// filter_laid_out: w is [Cout, KH, KW, Cin] in conv_copied_filter_taps' order (only where that
// has a value), read as it is.
// bias: conv2d_bias's epilogue (only where conv_forward_applies_bias).
void conv2d_forward(DType dtype, const kernels::ConvGeometry& g, const void* x, const void* w,
                    void* y, ConvWorkspace workspace, gpu::Stream stream,
                    bool x_channels_last = false, float* moments = nullptr,
                    bool y_channels_last = false, bool filter_laid_out = false, ConvBias bias = {});
// dy: [B, Cout, OH, OW], w -> dx: [B, Cin, H, W]; dy_channels_last: dy stored [B, OH, OW, Cout]
// (where conv_runs_channels_last), dx_channels_last: dx [B, H, W, Cin] (where
// conv_writes_channels_last); filter_laid_out: w is [Cin, KH, KW, Cout] in
// conv_copied_filter_taps' order (only where that has a value).
void conv2d_grad_input(DType dtype, const kernels::ConvGeometry& g, const void* dy, const void* w,
                       void* dx, ConvWorkspace workspace, gpu::Stream stream,
                       bool dy_channels_last = false, bool dx_channels_last = false,
                       bool filter_laid_out = false);
// x, dy -> dw: [Cout, Cin, KH, KW], summed over the batch.
// dy_channels_last: dy stored [B, OH, OW, Cout] (where conv_grad_weight_reads_nhwc_dy).
void conv2d_grad_weight(DType dtype, const kernels::ConvGeometry& g, const void* x, const void* dy,
                        void* dw, ConvWorkspace workspace, gpu::Stream stream,
                        bool x_channels_last = false, bool dy_channels_last = false);

namespace detail {
// Test and benchmark hooks, not for production code (not thread-safe; take effect at the
// next call, conv_workspace_bytes included). im2col_gemm forces the fallback everywhere,
// im2col_grad_weight only for the weight gradient.
// cuda_cores: bf16/f16 passes on the CUDA-core implicit GEMM, not the tensor cores.
// mma_nchw: bf16/f16 forward and grad_input on the tensor cores gathering from NCHW, never
// through the channels-last copy.
// tensor_cores: as automatic, but bf16/f16 passes of any size on the tensor cores.
enum class ConvAlgo {
  automatic,
  im2col_gemm,
  im2col_grad_weight,
  cuda_cores,
  mma_nchw,
  tensor_cores
};
void set_conv_algo_for_testing(ConvAlgo algo);
// Forces the implicit GEMM's tile (bm x bn, kg thread groups of ks K rows per step; bm 0:
// the default choice) and grad_weight's number of K splits (0: the default) for one pass.
struct ConvTiling {
  int bm = 0, bn = 0, kg = 0;
  std::int64_t splits = 0;
  int ks = 16;
  int tm = 4, tn = 4;
};
void set_conv_tiling_for_testing(ConvPass pass, ConvTiling tiling);
}  // namespace detail

}  // namespace kiln::cuda
