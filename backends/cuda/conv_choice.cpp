// Which kernels run a convolution pass: the direct stem kernel, the tensor cores (NCHW or over a
// channels-last copy, TF32 for f32 where allowed), the CUDA cores' implicit GEMM or im2col +
// cuBLAS (conv.cpp dispatches by these rules, in that order; conv_passes.h declares them).
#include <climits>
#include <cstdint>
#include <optional>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_mma.h"
#include "backends/cuda/conv_passes.h"
#include "backends/cuda/cublas_handle.h"
#include "core/env_switch.h"

namespace kiln::cuda {

namespace detail {
namespace {
ConvAlgo g_algo = ConvAlgo::automatic;
}  // namespace
void set_conv_algo_for_testing(ConvAlgo algo) { g_algo = algo; }
}  // namespace detail

namespace conv_detail {
namespace {

constexpr std::int64_t kMaxOffset = std::int64_t{1} << 30;
constexpr std::int64_t kMaxExtent =
    4096;  // image sides, kernel sides, padding, stride (table entries)

// The smallest pass (M * N * K multiply-adds) that goes to the tensor cores by default:
// below it, the channels-last copies and the reordered weights cost more than the faster math
// saves. Whole-step A/B on the H200, bf16, device ms at batch 64 and 256 (2^0 / 2^24 / 2^26 /
// 2^28): inception 1.504 1.455 1.462 1.504 and 3.192 3.201 3.179 3.338, resnet 1.159 1.150
// 1.127 1.337 and 2.490 2.491 2.447 2.505, vgg 0.449 0.444 0.461 0.511 and 0.955 0.957 0.939
// 0.994, dcgan 0.804 0.787 0.790 0.785 and 1.608 1.607 1.562 1.565, lenet 0.153 0.146 0.148
// 0.169 and 0.347 0.345 0.328 0.328 (bench/results/2026-12-01-h200-size-rule.txt).
// KILN_MMA_MIN_MACS overrides it; ConvAlgo::tensor_cores ignores it.
constexpr std::int64_t kMmaMinMacs = std::int64_t{1} << 26;

std::int64_t mma_min_macs() {
  static const std::int64_t macs =
      env_integer("KILN_MMA_MIN_MACS", kMmaMinMacs, 0, INT64_MAX, "a count of multiply-adds");
  return detail::g_algo == detail::ConvAlgo::tensor_cores ? 0 : macs;
}

}  // namespace

// Whether `pass` fits an implicit GEMM kernel (the stride of grad_input aside).
bool igemm_fits(const ConvGeometry& g, ConvPass pass) {
  if (detail::g_algo == detail::ConvAlgo::im2col_gemm) return false;
  if (detail::g_algo == detail::ConvAlgo::im2col_grad_weight && pass == ConvPass::grad_weight)
    return false;
  if (pass != ConvPass::grad_weight && pointwise(g))
    return false;  // plain cuBLAS, no scratch either
  // Fewer than 16 output channels (conv1's grad_input: 1) would leave most of a tile's rows
  // idle; cuBLAS's per-image GEMMs do better there.
  if (pass != ConvPass::grad_weight && dims_of(g, pass).m < 16) return false;
  const std::int64_t x = g.batch * g.in_channels * g.height * g.width;
  const std::int64_t y = g.batch * g.out_channels * g.out_h * g.out_w;
  const std::int64_t w = g.out_channels * patch_rows(g);
  if (x >= kMaxOffset || y >= kMaxOffset || w >= kMaxOffset) return false;
  for (std::int64_t e :
       {g.height, g.width, g.out_h, g.out_w, g.kernel_h, g.kernel_w, g.stride, g.padding})
    if (e > kMaxExtent) return false;
  const GemmDims d = dims_of(g, pass);
  return d.m / 16 < 65535;  // grid.y
}

// The CUDA-core implicit GEMM: grad_input at stride 1, or 2 by classes (igemm_by_classes).
bool use_igemm(const ConvGeometry& g, DType /*every floating dtype*/, ConvPass pass) {
  return igemm_fits(g, pass) &&
         (pass != ConvPass::grad_input || g.stride == 1 || igemm_by_classes(g));
}

// The direct forward of images with few channels (conv_direct.cpp) where the kernels are chosen
// automatically, at stride 1: on an H100 it made resnet18's stem 130 -> 69 us and left the zoo's
// 28x28 first layers as fast as before, but the stride-2 ones of alexnet (5x5 to 12x12) and
// dcgan (4x4 to 14x14) slower (bf16 steps +2 % and +6-9 %; not looked into: small planes, or the
// stride; bench/README.md). KILN_CONV_DIRECT=0 leaves every forward to the GEMM passes.
std::optional<DirectPlan> direct_plan(const ConvGeometry& g, DType dtype, ConvPass pass) {
  static const bool on = env_switch_on("KILN_CONV_DIRECT");
  if (!on || pass != ConvPass::forward || detail::g_algo != detail::ConvAlgo::automatic ||
      g.stride != 1)
    return std::nullopt;
  return conv_direct_plan(g, dtype);
}

// f32 on the TF32 tensor cores where TF32 is allowed (--precision tf32: set_allow_tf32): the
// forward and grad_input through the channels-last path only (use_nhwc), grad_weight on the
// NCHW kernels of the 16-bit types (use_mma; KILN_TF32_WGRAD=0 keeps it on the CUDA cores, for
// measuring).
bool use_tf32_mma(const ConvGeometry& g, DType dtype, ConvPass pass) {
  static const bool weight_gradient = env_switch_on("KILN_TF32_WGRAD");
  return dtype == DType::f32 && allow_tf32() &&
         (pass != ConvPass::grad_weight || weight_gradient) &&
         (detail::g_algo == detail::ConvAlgo::automatic ||
          detail::g_algo == detail::ConvAlgo::tensor_cores) &&
         igemm_fits(g, pass) && (pass != ConvPass::grad_input || g.stride <= 2);
}

// bf16/f16 run on the tensor cores wherever an implicit GEMM fits, grad_input at stride 1 or
// 2, and the pass is not too small for them (mma_min_macs); so does f32's grad_weight under
// TF32.
bool use_mma(const ConvGeometry& g, DType dtype, ConvPass pass) {
  const GemmDims d = dims_of(g, pass);
  const bool tf32_weight_gradient = pass == ConvPass::grad_weight && use_tf32_mma(g, dtype, pass);
  return (is_low_precision(dtype) || tf32_weight_gradient) && !direct_plan(g, dtype, pass) &&
         detail::g_algo != detail::ConvAlgo::cuda_cores && igemm_fits(g, pass) &&
         (pass != ConvPass::grad_input || g.stride <= 2) && d.m * d.n * d.k >= mma_min_macs();
}

// The channels-last tensor-core path (conv_mma_nhwc.cuh): forward and grad_input over an NHWC
// copy of their image (x or dy) where its channels are a multiple of 16 bytes' worth.
bool use_nhwc(const ConvGeometry& g, DType dtype, ConvPass pass) {
  if (pass == ConvPass::grad_weight || detail::g_algo == detail::ConvAlgo::mma_nchw ||
      direct_plan(g, dtype, pass))
    return false;
  const std::int64_t channels = pass == ConvPass::forward ? g.in_channels : g.out_channels;
  const bool tensor_cores = use_mma(g, dtype, pass) || use_tf32_mma(g, dtype, pass);
  return tensor_cores && conv_nhwc_fits(channels, dtype) && g.batch <= 65535;
}

}  // namespace conv_detail
}  // namespace kiln::cuda
