// The internals that the convolution passes share (conv.cpp dispatches; conv_im2col.cpp is the
// im2col + cuBLAS fallback; conv_mma.cpp the tensor cores): the patch matrix's sizes, the
// ordered split-K sum, and the fallback's passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "graph/kernels/conv_cpu.h"

namespace kiln::cuda::conv_detail {

using kernels::ConvGeometry;

inline std::int64_t patch_rows(const ConvGeometry& g) {
  return g.in_channels * g.kernel_h * g.kernel_w;
}
inline std::int64_t patch_cols(const ConvGeometry& g) { return g.out_h * g.out_w; }
inline std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
// A 1x1 kernel at stride 1 without padding: x itself is the patch matrix.
inline bool pointwise(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride == 1 && g.padding == 0;
}
// What sums are kept in: f64 for f64, else f32 (bf16 and f16 accumulate in f32 scratch).
inline DType wide_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// C = A B of `pass`: M rows, N columns, K terms.
struct GemmDims {
  std::int64_t m, n, k;
};
GemmDims dims_of(const ConvGeometry& g, ConvPass pass);
// The implicit GEMM's input gradient at stride 2 by classes of dx's pixels (four stride-1
// passes in one launch, none of dy's dilation zeros multiplied: ConvClasses) where dx's sides
// are even; KILN_IGEMM_CLASSES=0: im2col + cuBLAS, as before.
bool igemm_by_classes(const ConvGeometry& g);
// The kernel's mode of `pass`, and the GEMM it runs (dims_of's; by classes, N is one class's).
IgemmMode igemm_mode(const ConvGeometry& g, ConvPass pass);
GemmDims igemm_dims(const ConvGeometry& g, ConvPass pass);
// The GEMM's description for the kernels: which tensor is the image, how its windows are laid
// out, and the strides of A and C along M (kernels/conv_params.h, ConvGemmShape).
ConvGemmShape gemm_shape(const ConvGeometry& g, ConvPass pass, const GemmDims& d,
                         std::int64_t k_chunk);

// The input gradient on the TMA pass (conv_tma.h) where it fits: at stride 1 the convolution of
// dy with the flipped filter; at stride 2 by classes of dx's pixels (four stride-1 passes in one
// launch, none of dy's dilation zeros multiplied) where dx's height is even and its width a
// multiple of 4 (every class grid H / 2 x W / 2, an even width: the kernel stores four columns
// of dx at once; KILN_CONV_CLASSES=0: the dilated pass). Both read dy's channels-last copy.
struct TmaGradInput {
  ConvGemmShape shape;  // stride 2: one class's grid, N = B H W / 4
  TmaTile tile;
  ConvClasses classes;
};
std::optional<TmaGradInput> tma_grad_input(const ConvGeometry& g, DType dtype);

// The CUDA-core implicit GEMM (conv_igemm.cpp): grad_weight's partials (the pass's tile is
// tuned when it is sized), the kernels a pass may launch, and one pass: a = W (forward,
// grad_input) or dy; img = x or dy; out = y, dx or dW.
std::size_t igemm_workspace(const ConvGeometry& g, DType dtype, ConvPass pass);
std::vector<gpu::KernelSource> igemm_sources(const ConvGeometry& g, DType dtype, ConvPass pass);
void run_igemm(DType dtype, const ConvGeometry& g, ConvPass pass, const void* a, const void* img,
               void* out, const ConvWorkspace& ws, gpu::Stream stream, ConvBias bias = {});

// The direct forward of images with few channels (conv_direct.cpp, kernels/conv_direct.cuh;
// a network's stem): a block's output rows `th` of one image (`tiles` an image), its input's
// rows x cols in shared memory, and those bytes. Where it fits: at most 4 channels, a filter of
// at most 7 x 7, stride at most 4, f32, bf16 or f16, tensors under 2^31 elements, a tile's
// shared memory in 48 KiB (the CUDA cores' form) or 160 KiB (the tensor cores'). conv.cpp's
// dispatch takes it at stride 1 only.
struct DirectPlan {
  int th = 0, tiles = 0, rows = 0, cols = 0;
  std::size_t shared_bytes = 0;
};
std::optional<DirectPlan> conv_direct_plan(const ConvGeometry& g, DType dtype);
gpu::KernelSource conv_direct_source(const ConvGeometry& g, DType dtype);
// The stems all_kernel_sources lists: 3x3 over 1 and 3 channels, 5x5 over 1, 7x7 at stride 2.
std::vector<gpu::KernelSource> conv_direct_sample_sources();
// bias: conv2d_bias's epilogue (the CUDA cores' form only: direct_applies_bias).
bool direct_applies_bias(const ConvGeometry& g, DType dtype);
void conv_direct_forward(DType dtype, const ConvGeometry& g, const DirectPlan& plan, const void* x,
                         const void* w, void* y, gpu::Stream stream, ConvBias bias = {});

// The pass choice (conv_choice.cpp; conv.cpp dispatches in this order): the direct stem kernel
// (the stride-1 forward over at most 4 channels; KILN_CONV_DIRECT=0: none), the tensor cores
// over a channels-last copy of the image (use_nhwc) or NCHW (use_mma; bf16/f16 wherever an
// implicit GEMM fits and the pass is large enough, f32 under TF32), the CUDA cores' implicit
// GEMM (use_igemm; igemm_fits: the sizes its kernel takes), else im2col + cuBLAS.
std::optional<DirectPlan> direct_plan(const ConvGeometry& g, DType dtype, ConvPass pass);
bool use_tf32_mma(const ConvGeometry& g, DType dtype, ConvPass pass);
bool use_mma(const ConvGeometry& g, DType dtype, ConvPass pass);
bool use_nhwc(const ConvGeometry& g, DType dtype, ConvPass pass);
bool igemm_fits(const ConvGeometry& g, ConvPass pass);
bool use_igemm(const ConvGeometry& g, DType dtype, ConvPass pass);

// out[i] = the ordered sum of `count` partials part[z * mn + i] (of the compute type), rounded
// once to `dtype`; a count of 1 is the rounding alone.
void splitk_sum(DType dtype, const void* part, void* out, std::int64_t elements, std::int64_t count,
                gpu::Stream stream);

// The fallback (conv_im2col.cpp): scratch for `images` images a step, and each pass.
std::size_t im2col_workspace(const ConvGeometry& g, DType dtype, ConvPass pass,
                             std::int64_t images);
void im2col_forward(DType dtype, const ConvGeometry& g, const void* x, const void* w, void* y,
                    const ConvWorkspace& ws, gpu::Stream stream);
void im2col_grad_input(DType dtype, const ConvGeometry& g, const void* dy, const void* w, void* dx,
                       const ConvWorkspace& ws, gpu::Stream stream);
void im2col_grad_weight(DType dtype, const ConvGeometry& g, const void* x, const void* dy, void* dw,
                        const ConvWorkspace& ws, gpu::Stream stream);

}  // namespace kiln::cuda::conv_detail
