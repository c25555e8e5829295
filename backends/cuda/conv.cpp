// Convolution passes. The fast path is one implicit GEMM per pass (conv_kernels.cpp):
//   forward      y[co, (b, pix)]  = W[co, P] x patches[P, (b, pix)]
//   grad_input   dx[ci, (b, pix)] = W_flipped[ci, (co, kh, kw)] x dy patches (stride 1: the
//                forward convolution of dy with the transposed, flipped filter)
//   grad_weight  dW[co, P]        = dy[co, (b, pix)] x patches[(b, pix), P]
// with the patch matrix never written to memory and y, dx read and written in NCHW order.
// grad_weight splits its long K = B*OH*OW over blocks and sums the partials in a fixed
// order (a second small kernel), so it stays deterministic.
// bf16 and f16 (DESIGN.md, Precision) run every pass on the tensor cores wherever an implicit
// GEMM fits (conv_mma.cpp; grad_input transposes the weights into the workspace first, and at
// stride 2 reads dy as if dilated by 2, or on the TMA pass by classes of dx's pixels:
// conv_classes.cpp). Where the image's channels are a multiple of 8, the
// forward and grad_input read a channels-last copy of it instead (16-byte loads of 8 channels:
// conv_mma_nhwc.cuh). The CUDA-core implicit GEMM's tiles and launch are in conv_igemm.cpp;
// every pass's tile is autotuned (conv_tuning.h). The stride-1 forward over images of at most 4
// channels (a stem) is a direct kernel (conv_direct.cpp: mma.sync for bf16/f16, else the CUDA
// cores). The fallback is im2col + cuBLAS (conv_im2col.cpp).
#include "backends/cuda/conv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/conv_mma.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/conv_passes.h"
#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/layout.h"
#include "core/error.h"

namespace kiln::cuda {

namespace {

using namespace conv_detail;

// Its plan (conv_nhwc_plan, tuned here when the pass is sized or its sources listed, never
// while a step is captured) and scratch: the image's NHWC copy, the GEMM's A (the reordered
// weights), then the split-K partials where the plan splits.
NhwcPlan nhwc_plan(const ConvGeometry& g, DType dtype, ConvPass pass) {
  const GemmDims d = dims_of(g, pass);
  return conv_nhwc_plan(dtype, gemm_shape(g, pass, d, d.k),
                        pass == ConvPass::grad_input && g.stride == 2, true);
}
struct NhwcScratch {
  std::size_t image = 0, partials = 0, total = 0;
};
// image_given: the forward's x arrives channels-last, so the scratch holds no copy of it;
// filter_given: the filter arrives laid out (conv_filter_layout), so it holds no copy of that.
NhwcScratch nhwc_scratch(const ConvGeometry& g, DType dtype, ConvPass pass,
                         bool image_given = false, bool filter_given = false) {
  const std::int64_t image = pass == ConvPass::forward
                                 ? g.batch * g.in_channels * g.height * g.width
                                 : g.batch * g.out_channels * g.out_h * g.out_w;
  const std::size_t bytes = dtype_size(dtype);
  const std::size_t image_bytes =
      image_given ? 0 : round_up(static_cast<std::size_t>(image) * bytes);
  const std::size_t partials =
      image_bytes +
      (filter_given ? 0
                    : round_up(static_cast<std::size_t>(g.out_channels * patch_rows(g)) * bytes));
  if (pass == ConvPass::grad_input && tma_grad_input(g, dtype))
    return {image_bytes, partials, partials};
  const GemmDims d = dims_of(g, pass);
  return {image_bytes, partials,
          partials + round_up(nhwc_plan(g, dtype, pass).partial_bytes(d.m, d.n))};
}

// grad_weight's TMA pass (conv_tma.h), where it fits, and its scratch: x's channels-last copy,
// then the split partials.
std::optional<TmaWgradPlan> tma_wgrad_plan(const ConvGeometry& g, DType dtype) {
  const GemmDims d = dims_of(g, ConvPass::grad_weight);
  return conv_tma_wgrad_plan(dtype, gemm_shape(g, ConvPass::grad_weight, d, d.k));
}
std::size_t tma_wgrad_image_bytes(const ConvGeometry& g, DType dtype, bool image_given) {
  if (dtype == DType::f32)  // TF32: x's tap columns, [B][C][KW][rows][OW]
    return round_up(tf32_tap_expand_bytes(
        gemm_shape(g, ConvPass::grad_weight, dims_of(g, ConvPass::grad_weight), 0)));
  if (image_given) return 0;  // x arrives channels-last
  return round_up(static_cast<std::size_t>(g.batch * g.in_channels * g.height * g.width) *
                  dtype_size(dtype));
}

ConvMmaKind mma_kind(const ConvGeometry& g, ConvPass pass) {
  if (pass != ConvPass::grad_input) return ConvMmaKind::forward;
  return g.stride == 1 ? ConvMmaKind::grad_input : ConvMmaKind::grad_input_stride2;
}

// The tensor cores' scratch: grad_input's transposed weights (16-bit), grad_weight's partials
// (whose tile is tuned here, when the pass is sized, never while a step is captured).
std::size_t mma_workspace(const ConvGeometry& g, DType dtype, ConvPass pass,
                          bool image_given = false) {
  const GemmDims d = dims_of(g, pass);
  if (pass == ConvPass::grad_input)
    return round_up(static_cast<std::size_t>(g.out_channels * patch_rows(g)) * 2);
  if (pass != ConvPass::grad_weight) return 0;
  if (const std::optional<TmaWgradPlan> plan = tma_wgrad_plan(g, dtype))
    return tma_wgrad_image_bytes(g, dtype, image_given) + round_up(plan->partial_bytes(d.m, d.n));
  const MmaSplits splits = conv_mma_wgrad_splits(d.m, d.n, d.k);
  conv_mma_wgrad_tile(dtype, gemm_shape(g, pass, d, splits.chunk), splits, true);
  return conv_mma_wgrad_scratch(splits, d.m, d.n);
}

std::vector<gpu::KernelSource> mma_sources(const ConvGeometry& g, DType dtype, ConvPass pass,
                                           bool moments, bool dy_channels_last) {
  const GemmDims d = dims_of(g, pass);
  if (use_nhwc(g, dtype, pass)) {
    const bool forward = pass == ConvPass::forward;
    if (const std::optional<TmaGradInput> tma = forward ? std::nullopt : tma_grad_input(g, dtype)) {
      return {nhwc_image_source(dtype_size(dtype)), nhwc_weights_source(true, dtype_size(dtype)),
              conv_tma_source(dtype, tma->tile, false, tma->classes.count)};
    }
    const NhwcPlan plan = nhwc_plan(g, dtype, pass);
    const bool dilated = !forward && g.stride == 2;
    std::vector<gpu::KernelSource> sources = {
        nhwc_image_source(dtype_size(dtype)), nhwc_weights_source(!forward, dtype_size(dtype)),
        conv_nhwc_source(dtype, plan.tile, dilated, plan.splits > 1)};
    if (const auto tma =
            conv_tma_tile(dtype, gemm_shape(g, pass, d, d.k), dilated, moments && forward))
      sources.push_back(conv_tma_source(dtype, *tma, moments && forward));
    if (plan.splits > 1) sources.push_back(conv_splitk_sum_source(dtype));
    return sources;
  }
  if (pass == ConvPass::forward)
    return {conv_mma_source(dtype, conv_mma_tile_m(d.m, d.n), conv_mma_vector_weights(d.k))};
  if (pass == ConvPass::grad_input)  // the weights are transposed into 256-byte-aligned scratch
    return {transpose_source(2), conv_mma_source(dtype, conv_mma_tile_m(d.m, d.n),
                                                 conv_mma_vector_weights(d.k), mma_kind(g, pass))};
  if (const std::optional<TmaWgradPlan> plan = tma_wgrad_plan(g, dtype)) {
    if (dtype == DType::f32)  // (TF32: x's tap columns)
      return {tap_expand_source(), conv_tma_wgrad_source(dtype, *plan),
              conv_tma_wgrad_sum_source(dtype)};
    return {nhwc_image_source(dtype_size(dtype)),
            conv_tma_wgrad_source(dtype, *plan, dy_channels_last),
            conv_tma_wgrad_sum_source(dtype)};
  }
  const MmaSplits splits = conv_mma_wgrad_splits(d.m, d.n, d.k);
  const bool split = splits.count > 1;
  const ConvGemmShape shape = gemm_shape(g, pass, d, splits.chunk);
  std::vector<gpu::KernelSource> sources = {
      conv_mma_wgrad_source(dtype, conv_mma_wgrad_tile(dtype, shape, splits, true),
                            conv_mma_vector_dy(shape.s_hw), split, conv_mma_vector_x(shape))};
  if (split) sources.push_back(conv_splitk_sum_source(dtype));
  return sources;
}

// One channels-last pass: the image (the forward's x or grad_input's dy) and the weights
// reordered into the workspace, then the GEMM into `out` (y or dx). image_nhwc: the image is
// stored channels-last already (its region of the workspace unused); out_nhwc: out is stored
// channels-last (the TMA pass only, conv_writes_channels_last), else NCHW; filter_laid_out: w
// is the GEMM's A already (conv_filter_layout, in conv_copied_filter_taps' order).
void run_nhwc(DType dtype, const ConvGeometry& g, ConvPass pass, const void* image, const void* w,
              void* out, const ConvWorkspace& ws, gpu::Stream stream, bool image_nhwc = false,
              float* moments = nullptr, bool out_nhwc = false, bool filter_laid_out = false) {
  const bool forward = pass == ConvPass::forward;
  const NhwcScratch scratch = nhwc_scratch(g, dtype, pass, image_nhwc, filter_laid_out);
  KILN_CHECK(ws.bytes >= scratch.total,
             "{}: a workspace of {} bytes cannot hold the channels-last image and weights ({})",
             forward ? "conv2d" : "conv2d_grad_input", ws.bytes, scratch.total);
  auto* base = static_cast<std::uint8_t*>(ws.data);
  const void* a = filter_laid_out ? w : base + scratch.image;
  const void* xt = base;
  const std::optional<TmaGradInput> tma = forward ? std::nullopt : tma_grad_input(g, dtype);
  if (image_nhwc)
    xt = image;
  else if (forward)
    nchw_to_nhwc(dtype, image, base, g.batch, g.in_channels, g.height * g.width, stream);
  else
    nchw_to_nhwc(dtype, image, base, g.batch, g.out_channels, g.out_h * g.out_w, stream);
  if (!filter_laid_out) {  // the copy a conv_filter_layout node would make, in the same order
    const std::optional<std::vector<std::int64_t>> order = conv_copied_filter_taps(g, dtype, pass);
    KILN_CHECK(order.has_value(), "conv: a filter of {}x{} taps has no channels-last copy",
               g.kernel_h, g.kernel_w);
    const FilterLayoutJob job{w, base + scratch.image, g.out_channels, g.in_channels};
    nhwc_weights(dtype, {&job, 1}, g.kernel_h * g.kernel_w, !forward, *order, stream);
  }
  if (tma) {
    conv_tma_forward(dtype, tma->shape, tma->tile, a, xt, out, stream, nullptr,
                     tma->classes.count > 1 ? &tma->classes : nullptr, out_nhwc);
    return;
  }
  const GemmDims d = dims_of(g, pass);
  conv_nhwc_forward(dtype, gemm_shape(g, pass, d, d.k), a, xt, out, base + scratch.partials, stream,
                    !forward && g.stride == 2, moments, out_nhwc);
}

void check_geometry(const ConvGeometry& g, DType dtype, const char* op) {
  KILN_CHECK(is_floating(dtype), "{}: dtype {} is not supported (f32, f64, bf16 or f16 expected)",
             op, dtype_name(dtype));
  KILN_CHECK(g.batch >= 0 && g.stride >= 1 && g.padding >= 0 && g.out_h >= 1 && g.out_w >= 1,
             "{}: batch {}, stride {}, padding {} give a {}x{} output", op, g.batch, g.stride,
             g.padding, g.out_h, g.out_w);
}

}  // namespace

std::size_t conv_workspace_bytes(const ConvGeometry& g, DType dtype, ConvPass pass,
                                 std::int64_t images_per_chunk, bool image_channels_last,
                                 bool filter_laid_out) {
  if (direct_plan(g, dtype, pass)) return 0;
  if (use_nhwc(g, dtype, pass))
    return nhwc_scratch(g, dtype, pass, image_channels_last, filter_laid_out).total;
  if (use_mma(g, dtype, pass)) return mma_workspace(g, dtype, pass, image_channels_last);
  if (use_igemm(g, dtype, pass)) return igemm_workspace(g, dtype, pass);
  const std::int64_t images = images_per_chunk > 0 ? std::min(images_per_chunk, g.batch) : g.batch;
  return im2col_workspace(g, dtype, pass, std::max<std::int64_t>(images, 1));
}

std::vector<gpu::KernelSource> conv_kernel_sources(const ConvGeometry& g, DType dtype,
                                                   ConvPass pass, bool moments,
                                                   bool dy_channels_last) {
  if (direct_plan(g, dtype, pass)) return {conv_direct_source(g, dtype)};
  if (use_nhwc(g, dtype, pass) || use_mma(g, dtype, pass))
    return mma_sources(g, dtype, pass, moments, dy_channels_last);
  if (!use_igemm(g, dtype, pass)) {
    if (pointwise(g) && pass != ConvPass::grad_weight) return {};  // cuBLAS only
    if (pass == ConvPass::grad_weight && is_low_precision(dtype))  // rounding the f32 dW
      return {im2col_source(dtype), conv_splitk_sum_source(dtype)};
    return {pass == ConvPass::grad_input ? col2im_source(dtype) : im2col_source(dtype)};
  }
  return igemm_sources(g, dtype, pass);
}

bool conv_reads_channels_last(const ConvGeometry& g, DType dtype, ConvPass pass) {
  switch (pass) {
    case ConvPass::forward:
      return use_nhwc(g, dtype, pass);
    case ConvPass::grad_weight:  // (TF32's TMA pass reads x NCHW)
      return dtype != DType::f32 && use_mma(g, dtype, pass) && tma_wgrad_plan(g, dtype).has_value();
    case ConvPass::grad_input:
      return false;
  }
  return false;
}

bool conv_runs_channels_last(const ConvGeometry& g, DType dtype, ConvPass pass) {
  return pass == ConvPass::grad_input ? use_nhwc(g, dtype, pass)
                                      : conv_reads_channels_last(g, dtype, pass);
}

bool conv_grad_weight_reads_nhwc_dy(const ConvGeometry& g, DType dtype) {
  if (g.batch == 0 || dtype == DType::f32 || !use_mma(g, dtype, ConvPass::grad_weight) ||
      !tma_wgrad_plan(g, dtype))
    return false;
  const GemmDims d = dims_of(g, ConvPass::grad_weight);
  return conv_tma_wgrad_reads_nhwc_dy(gemm_shape(g, ConvPass::grad_weight, d, d.k));
}

bool conv_writes_channels_last(const ConvGeometry& g, DType dtype, ConvPass pass) {
  if (g.batch == 0 || pass == ConvPass::grad_weight || !is_low_precision(dtype) ||
      !use_nhwc(g, dtype, pass))  // (TF32's TMA pass stores NCHW)
    return false;
  if (pass == ConvPass::grad_input) return tma_grad_input(g, dtype).has_value();
  return conv_forward_writes_moments(g, dtype);  // the forward's TMA pass
}

std::optional<std::vector<std::int64_t>> conv_copied_filter_taps(const ConvGeometry& g, DType dtype,
                                                                 ConvPass pass) {
  if (g.batch == 0 || pass == ConvPass::grad_weight || direct_plan(g, dtype, pass) ||
      !use_nhwc(g, dtype, pass))
    return std::nullopt;
  const std::int64_t khkw = g.kernel_h * g.kernel_w;
  if (khkw > kMaxFilterTaps) return std::nullopt;
  if (pass == ConvPass::forward) return conv_filter_taps(nullptr, khkw);
  const std::optional<TmaGradInput> tma = tma_grad_input(g, dtype);
  const ConvClasses classes = tma ? tma->classes : conv_input_gradient_classes(g, false);
  return conv_filter_taps(&classes, khkw);
}

bool conv_forward_writes_moments(const ConvGeometry& g, DType dtype) {
  if (g.batch == 0 || !is_low_precision(dtype) || !use_nhwc(g, dtype, ConvPass::forward))
    return false;  // (TF32's TMA pass writes no moments)
  const GemmDims d = dims_of(g, ConvPass::forward);
  return conv_tma_tile(dtype, gemm_shape(g, ConvPass::forward, d, d.k), false).has_value();
}

bool conv_forward_applies_bias(const ConvGeometry& g, DType dtype) {
  if (direct_plan(g, dtype, ConvPass::forward)) return direct_applies_bias(g, dtype);
  return !use_nhwc(g, dtype, ConvPass::forward) && !use_mma(g, dtype, ConvPass::forward) &&
         use_igemm(g, dtype, ConvPass::forward);
}

void conv2d_forward(DType dtype, const ConvGeometry& g, const void* x, const void* w, void* y,
                    ConvWorkspace ws, gpu::Stream stream, bool x_channels_last, float* moments,
                    bool y_channels_last, bool filter_laid_out, ConvBias bias) {
  check_geometry(g, dtype, "conv2d");
  KILN_CHECK(!y_channels_last || conv_writes_channels_last(g, dtype, ConvPass::forward),
             "conv2d: a channels-last y asked of a pass that writes NCHW ({} -> {} channels, "
             "{}x{})",
             g.in_channels, g.out_channels, g.height, g.width);
  KILN_CHECK(!x_channels_last || conv_reads_channels_last(g, dtype, ConvPass::forward),
             "conv2d: a channels-last image on a pass that reads NCHW ({} channels, {}x{})",
             g.in_channels, g.height, g.width);
  KILN_CHECK(moments == nullptr || conv_forward_writes_moments(g, dtype),
             "conv2d: run moments asked of a forward pass that does not write them ({} -> {} "
             "channels, {}x{})",
             g.in_channels, g.out_channels, g.height, g.width);
  KILN_CHECK((bias.bias == nullptr && !bias.relu) || conv_forward_applies_bias(g, dtype),
             "conv2d: a bias or ReLU epilogue asked of a pass that does not apply it ({} -> {} "
             "channels, {}x{}, {})",
             g.in_channels, g.out_channels, g.height, g.width, dtype_name(dtype));
  if (g.batch == 0) return;
  if (const std::optional<DirectPlan> plan = direct_plan(g, dtype, ConvPass::forward)) {
    conv_direct_forward(dtype, g, *plan, x, w, y, stream, bias);
  } else if (use_nhwc(g, dtype, ConvPass::forward)) {
    run_nhwc(dtype, g, ConvPass::forward, x, w, y, ws, stream, x_channels_last, moments,
             y_channels_last, filter_laid_out);
  } else if (use_mma(g, dtype, ConvPass::forward)) {
    const GemmDims d = dims_of(g, ConvPass::forward);
    conv_mma_forward(dtype, gemm_shape(g, ConvPass::forward, d, d.k), w, x, y, stream);
  } else if (use_igemm(g, dtype, ConvPass::forward)) {
    run_igemm(dtype, g, ConvPass::forward, w, x, y, ws, stream, bias);
  } else {
    im2col_forward(dtype, g, x, w, y, ws, stream);
  }
}

void conv2d_grad_input(DType dtype, const ConvGeometry& g, const void* dy, const void* w, void* dx,
                       ConvWorkspace ws, gpu::Stream stream, bool dy_channels_last,
                       bool dx_channels_last, bool filter_laid_out) {
  check_geometry(g, dtype, "conv2d_grad_input");
  KILN_CHECK(!dy_channels_last || use_nhwc(g, dtype, ConvPass::grad_input),
             "conv2d_grad_input: a channels-last dy on a pass that reads NCHW ({} -> {} channels, "
             "{}x{})",
             g.out_channels, g.in_channels, g.out_h, g.out_w);
  KILN_CHECK(!dx_channels_last || conv_writes_channels_last(g, dtype, ConvPass::grad_input),
             "conv2d_grad_input: a channels-last dx asked of a pass that writes NCHW ({} -> {} "
             "channels, {}x{})",
             g.out_channels, g.in_channels, g.height, g.width);
  if (g.batch == 0) return;
  if (use_nhwc(g, dtype, ConvPass::grad_input)) {
    run_nhwc(dtype, g, ConvPass::grad_input, dy, w, dx, ws, stream, dy_channels_last, nullptr,
             dx_channels_last, filter_laid_out);
  } else if (use_mma(g, dtype, ConvPass::grad_input)) {
    KILN_CHECK(ws.bytes >= mma_workspace(g, dtype, ConvPass::grad_input),
               "conv2d_grad_input: a workspace of {} bytes cannot hold the {} transposed weights",
               ws.bytes, g.out_channels * patch_rows(g));
    // A[ci, (co, kh, kw)] = w[co, ci, kh, kw]; the kernel mirrors the taps.
    transpose(dtype, Shape{g.out_channels, g.in_channels, g.kernel_h * g.kernel_w}, {1, 0, 2}, w,
              ws.data, stream);
    const GemmDims d = dims_of(g, ConvPass::grad_input);
    conv_mma_forward(dtype, gemm_shape(g, ConvPass::grad_input, d, d.k), ws.data, dy, dx, stream,
                     mma_kind(g, ConvPass::grad_input));
  } else if (use_igemm(g, dtype, ConvPass::grad_input)) {
    run_igemm(dtype, g, ConvPass::grad_input, w, dy, dx, ws, stream);
  } else {
    im2col_grad_input(dtype, g, dy, w, dx, ws, stream);
  }
}

void conv2d_grad_weight(DType dtype, const ConvGeometry& g, const void* x, const void* dy, void* dw,
                        ConvWorkspace ws, gpu::Stream stream, bool x_channels_last,
                        bool dy_channels_last) {
  check_geometry(g, dtype, "conv2d_grad_weight");
  KILN_CHECK(!dy_channels_last || conv_grad_weight_reads_nhwc_dy(g, dtype),
             "conv2d_grad_weight: a channels-last dy on a pass that reads it NCHW ({} filters, "
             "{}x{})",
             g.out_channels, g.out_h, g.out_w);
  KILN_CHECK(!x_channels_last || conv_reads_channels_last(g, dtype, ConvPass::grad_weight),
             "conv2d_grad_weight: a channels-last image on a pass that reads NCHW ({} channels, "
             "{}x{})",
             g.in_channels, g.height, g.width);
  if (g.batch == 0) {
    fill(dtype, 0.0, g.out_channels * patch_rows(g), dw, stream);
  } else if (const std::optional<TmaWgradPlan> plan = use_mma(g, dtype, ConvPass::grad_weight)
                                                          ? tma_wgrad_plan(g, dtype)
                                                          : std::nullopt) {
    const GemmDims d = dims_of(g, ConvPass::grad_weight);
    const std::size_t image = tma_wgrad_image_bytes(g, dtype, x_channels_last);
    KILN_CHECK(ws.bytes >= image + plan->partial_bytes(d.m, d.n),
               "conv2d_grad_weight: a workspace of {} bytes cannot hold x's channels-last copy "
               "and {} split partials",
               ws.bytes, plan->splits);
    auto* base = static_cast<std::uint8_t*>(ws.data);  // x's copy (unused where x is NHWC)
    const ConvGemmShape shape = gemm_shape(g, ConvPass::grad_weight, d, plan->chunk);
    if (dtype == DType::f32)  // TF32: x's tap columns (x NCHW)
      tf32_tap_expand(shape, x, base, stream);
    else if (!x_channels_last)
      nchw_to_nhwc(dtype, x, base, g.batch, g.in_channels, g.height * g.width, stream);
    conv_tma_grad_weight(dtype, shape, *plan, dy, x_channels_last && dtype != DType::f32 ? x : base,
                         base + image, dw, stream, dy_channels_last, x);
  } else if (use_mma(g, dtype, ConvPass::grad_weight)) {
    const GemmDims d = dims_of(g, ConvPass::grad_weight);
    const MmaSplits splits = conv_mma_wgrad_splits(d.m, d.n, d.k, ws.bytes);
    conv_mma_grad_weight(dtype, gemm_shape(g, ConvPass::grad_weight, d, splits.chunk), splits, dy,
                         x, dw, ws.data, stream);
    if (splits.count > 1) splitk_sum(dtype, ws.data, dw, d.m * d.n, splits.count, stream);
  } else if (use_igemm(g, dtype, ConvPass::grad_weight)) {
    run_igemm(dtype, g, ConvPass::grad_weight, dy, x, dw, ws, stream);
  } else {
    im2col_grad_weight(dtype, g, x, dy, dw, ws, stream);
  }
}

}  // namespace kiln::cuda
