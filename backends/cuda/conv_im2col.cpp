// The convolution passes' fallback (conv_passes.h): im2col + cuBLAS, for grad_input at
// stride > 1, forward and grad_input with fewer than 16 output channels or a 1x1 filter, offsets
// past 2^30 elements and image or filter sides past 4096. Forward and grad_input use a per-image
// patch layout [b][P][OH*OW] (P = Cin*KH*KW) and one strided-batched GEMM per chunk of images,
// whose per-image outputs land directly in NCHW order; grad_input's col2im is a deterministic
// gather. grad_weight folds the batch into the GEMM's K: patches as [P][b][OH*OW] and dy
// transposed to [Cout][b][OH*OW], then one GEMM dW = dy^T col^T. bf16 and f16 GEMMs accumulate
// in f32 on the tensor cores; grad_input's col is f32 scratch that col2im sums, and grad_weight
// sums its chunks in an f32 dW that one pass rounds at the end.
#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "backends/cuda/conv_passes.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/layout.h"
#include "core/error.h"

namespace kiln::cuda::conv_detail {

namespace {

std::size_t col_bytes(const ConvGeometry& g, DType dtype, std::int64_t images) {
  return static_cast<std::size_t>(images * patch_rows(g) * patch_cols(g)) * dtype_size(dtype);
}

// grad_weight's scratch: col, then dy transposed, then (bf16, f16) the f32 dW the chunks sum in.
struct GradWeightScratch {
  std::size_t dy_t = 0, dw_wide = 0, bytes = 0;
};
GradWeightScratch grad_weight_scratch(const ConvGeometry& g, DType dtype, std::int64_t images) {
  GradWeightScratch s;
  s.dy_t = round_up(col_bytes(g, dtype, images));
  const auto dy_t_bytes =
      static_cast<std::size_t>(images * g.out_channels * patch_cols(g)) * dtype_size(dtype);
  s.dw_wide = s.dy_t + round_up(dy_t_bytes);
  const auto dw_bytes = static_cast<std::size_t>(g.out_channels * patch_rows(g)) * 4;
  s.bytes = is_low_precision(dtype) ? s.dw_wide + dw_bytes : s.dy_t + dy_t_bytes;
  return s;
}

std::size_t workspace_of(const ConvGeometry& g, DType dtype, ConvPass pass, std::int64_t images) {
  if (pass == ConvPass::forward) return pointwise(g) ? 0 : col_bytes(g, dtype, images);
  if (pass == ConvPass::grad_input)  // col holds the GEMM's sums: f32 for bf16, f16
    return pointwise(g) ? 0 : col_bytes(g, wide_dtype(dtype), images);
  return grad_weight_scratch(g, dtype, images).bytes;
}

// How many images one step of `pass` processes with `bytes` of scratch.
std::int64_t chunk_images(const ConvGeometry& g, DType dtype, ConvPass pass,
                          const ConvWorkspace& ws, const char* op) {
  const std::size_t one = workspace_of(g, dtype, pass, 1);
  KILN_CHECK(ws.bytes >= one,
             "{}: the workspace of {} bytes is smaller than the {} bytes one image needs", op,
             ws.bytes, one);
  KILN_CHECK(reinterpret_cast<std::uintptr_t>(ws.data) % 256 == 0,
             "{}: the workspace is not 256-byte aligned", op);
  std::int64_t images = std::min<std::int64_t>(g.batch, static_cast<std::int64_t>(ws.bytes / one));
  while (images > 1 && workspace_of(g, dtype, pass, images) > ws.bytes)
    --images;  // the alignment padding
  if (pass == ConvPass::grad_weight)
    images = std::min<std::int64_t>(images, INT_MAX / patch_cols(g));  // GEMM's K
  return std::max<std::int64_t>(images, 1);
}

ConvShape shape_of(const ConvGeometry& g, std::int64_t images, bool batch_folded) {
  const std::int64_t cols = patch_cols(g);
  return {images,
          g.in_channels,
          g.height,
          g.width,
          g.kernel_h,
          g.kernel_w,
          g.stride,
          g.padding,
          g.out_h,
          g.out_w,
          batch_folded ? images * cols : cols,
          batch_folded ? cols : patch_rows(g) * cols};
}

void im2col(DType dtype, ConvShape shape, const void* x, void* col, gpu::Stream stream) {
  const DeviceKernel& k = device_kernel(fmt::format("kiln_im2col_{}", dtype_name(dtype)),
                                        [&] { return im2col_source(dtype); });
  void* args[] = {&x, &col, &shape};
  launch_items(
      k,
      shape.images * shape.channels * shape.kernel_h * shape.kernel_w * shape.out_h * shape.out_w,
      stream, args);
}

void col2im(DType dtype, ConvShape shape, const void* col, void* x, gpu::Stream stream) {
  const DeviceKernel& k = device_kernel(fmt::format("kiln_col2im_{}", dtype_name(dtype)),
                                        [&] { return col2im_source(dtype); });
  void* args[] = {&col, &x, &shape};
  launch_items(k, shape.images * shape.channels * shape.height * shape.width, stream, args);
}

const char* at(const void* base, std::int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + static_cast<std::size_t>(elements) * dtype_size(dtype);
}
char* at(void* base, std::int64_t elements, DType dtype) {
  return static_cast<char*>(base) + static_cast<std::size_t>(elements) * dtype_size(dtype);
}

// Per image b of a chunk: out_b[M, OH*OW] = op(A)[M, K] in_b[K, OH*OW], A shared by all;
// out of `out_dtype` (dtype, or f32 for bf16/f16 sums that are summed further).
void per_image_gemm(DType dtype, bool trans_a, std::int64_t m, std::int64_t k, std::int64_t cols,
                    const void* a, const void* in, void* out, std::int64_t images,
                    gpu::Stream stream, DType out_dtype) {
  RowMajorGemm gemm_args;
  gemm_args.trans_a = trans_a;
  gemm_args.m = m;
  gemm_args.n = cols;
  gemm_args.k = k;
  gemm_args.batch = images;
  gemm_args.a = a;
  gemm_args.ld_a = trans_a ? m : k;
  gemm_args.b = in;
  gemm_args.ld_b = cols;
  gemm_args.stride_b = k * cols;
  gemm_args.c = out;
  gemm_args.ld_c = cols;
  gemm_args.stride_c = m * cols;
  gemm(dtype, out_dtype, gemm_args, stream);
}

}  // namespace

void splitk_sum(DType dtype, const void* part, void* out, std::int64_t elements, std::int64_t count,
                gpu::Stream stream) {
  const DeviceKernel& sum = device_kernel(fmt::format("kiln_conv_splitk_sum_{}", dtype_name(dtype)),
                                          [&] { return conv_splitk_sum_source(dtype); });
  // The summation order: 8 classes of splits (32 below 4096 outputs, where more threads an
  // output keep the SMs busy), each class a thread; a block takes 256 / classes outputs.
  int mn = static_cast<int>(elements), splits = static_cast<int>(count),
      lanes = mn >= 4096 ? 8 : 32;
  if (mn == 0) return;
  const auto classes = static_cast<unsigned>(std::min(lanes, std::max(splits, 1)));
  const unsigned outputs = 256 / classes;
  void* sum_args[] = {&part, &out, &mn, &splits, &lanes};
  sum.kernel.launch({static_cast<unsigned>((elements + outputs - 1) / outputs), 1, 1},
                    {outputs, classes, 1}, 0, stream, sum_args);
}

std::size_t im2col_workspace(const ConvGeometry& g, DType dtype, ConvPass pass,
                             std::int64_t images) {
  return workspace_of(g, dtype, pass, images);
}

void im2col_forward(DType dtype, const ConvGeometry& g, const void* x, const void* w, void* y,
                    const ConvWorkspace& ws, gpu::Stream stream) {
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  if (pointwise(g)) {  // y_b[Cout, HW] = W[Cout, Cin] x_b[Cin, HW]
    per_image_gemm(dtype, false, g.out_channels, g.in_channels, patch_cols(g), w, x, y, g.batch,
                   stream, dtype);
    return;
  }
  const std::int64_t chunk = chunk_images(g, dtype, ConvPass::forward, ws, "conv2d");
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
    const std::int64_t images = std::min(chunk, g.batch - b0);
    im2col(dtype, shape_of(g, images, false), at(x, b0 * in_size, dtype), ws.data, stream);
    // y_b[Cout, OH*OW] = W[Cout, P] col_b[P, OH*OW]
    per_image_gemm(dtype, false, g.out_channels, patch_rows(g), patch_cols(g), w, ws.data,
                   at(y, b0 * out_size, dtype), images, stream, dtype);
  }
}

void im2col_grad_input(DType dtype, const ConvGeometry& g, const void* dy, const void* w, void* dx,
                       const ConvWorkspace& ws, gpu::Stream stream) {
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  if (pointwise(g)) {  // dx_b[Cin, HW] = W^T[Cin, Cout] dy_b[Cout, HW]
    per_image_gemm(dtype, true, g.in_channels, g.out_channels, patch_cols(g), w, dy, dx, g.batch,
                   stream, dtype);
    return;
  }
  const std::int64_t chunk = chunk_images(g, dtype, ConvPass::grad_input, ws, "conv2d_grad_input");
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
    const std::int64_t images = std::min(chunk, g.batch - b0);
    // col_b[P, OH*OW] = W^T[P, Cout] dy_b[Cout, OH*OW], then dx_b = col2im(col_b)
    per_image_gemm(dtype, true, patch_rows(g), g.out_channels, patch_cols(g), w,
                   at(dy, b0 * out_size, dtype), ws.data, images, stream, wide_dtype(dtype));
    col2im(dtype, shape_of(g, images, false), ws.data, at(dx, b0 * in_size, dtype), stream);
  }
}

void im2col_grad_weight(DType dtype, const ConvGeometry& g, const void* x, const void* dy, void* dw,
                        const ConvWorkspace& ws, gpu::Stream stream) {
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  const std::int64_t chunk =
      chunk_images(g, dtype, ConvPass::grad_weight, ws, "conv2d_grad_weight");
  const GradWeightScratch scratch = grad_weight_scratch(g, dtype, chunk);
  void* col = ws.data;
  void* dy_t = static_cast<char*>(ws.data) + scratch.dy_t;
  const bool low = is_low_precision(dtype);  // chunks summed in f32, rounded once at the end
  void* dw_sum = low ? static_cast<char*>(ws.data) + scratch.dw_wide : dw;
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
    const std::int64_t images = std::min(chunk, g.batch - b0);
    const std::int64_t k = images * patch_cols(g);
    im2col(dtype, shape_of(g, images, true), at(x, b0 * in_size, dtype), col,
           stream);  // [P][b][OH*OW]
    transpose(dtype, Shape{images, g.out_channels, patch_cols(g)}, {1, 0, 2},
              at(dy, b0 * out_size, dtype), dy_t,
              stream);  // [Cout][b][OH*OW]
    // dW[Cout, P] (+)= dy_t[Cout, K] col[P, K]^T with K = images * OH*OW
    RowMajorGemm gemm_args;
    gemm_args.trans_b = true;
    gemm_args.m = g.out_channels;
    gemm_args.n = patch_rows(g);
    gemm_args.k = k;
    gemm_args.a = dy_t;
    gemm_args.ld_a = k;
    gemm_args.b = col;
    gemm_args.ld_b = k;
    gemm_args.c = dw_sum;
    gemm_args.ld_c = patch_rows(g);
    gemm_args.beta = b0 == 0 ? 0.0 : 1.0;
    gemm(dtype, low ? DType::f32 : dtype, gemm_args, stream);
  }
  if (low) splitk_sum(dtype, dw_sum, dw, g.out_channels * patch_rows(g), 1, stream);
}

}  // namespace kiln::cuda::conv_detail
