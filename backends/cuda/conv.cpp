// Convolution as im2col + cuBLAS. Forward and grad_input use a per-image patch layout
// [b][P][OH*OW] (P = Cin*KH*KW) and one strided-batched GEMM per chunk of images, whose
// per-image outputs land directly in NCHW order, so no transpose of y is needed. grad_weight
// folds the batch into the GEMM's K: patches as [P][b][OH*OW] and dy transposed to
// [Cout][b][OH*OW], then one GEMM dW = dy^T col^T sums the batch without a reduction pass.
#include "backends/cuda/conv.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "backends/cuda/gemm.h"
#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/layout.h"
#include "core/error.h"

namespace kiln::cuda {
namespace {

using kernels::ConvGeometry;

std::int64_t patch_rows(const ConvGeometry& g) { return g.in_channels * g.kernel_h * g.kernel_w; }
std::int64_t patch_cols(const ConvGeometry& g) { return g.out_h * g.out_w; }
std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// A 1x1 kernel at stride 1 without padding: x itself is the patch matrix.
bool pointwise(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride == 1 && g.padding == 0;
}

std::size_t col_bytes(const ConvGeometry& g, DType dtype, std::int64_t images) {
  return static_cast<std::size_t>(images * patch_rows(g) * patch_cols(g)) * dtype_size(dtype);
}

std::size_t workspace_for(const ConvGeometry& g, DType dtype, ConvPass pass, std::int64_t images) {
  if (pass != ConvPass::grad_weight) return pointwise(g) ? 0 : col_bytes(g, dtype, images);
  const auto dy_t = static_cast<std::size_t>(images * g.out_channels * patch_cols(g)) * dtype_size(dtype);
  return round_up(col_bytes(g, dtype, images)) + dy_t;
}

// How many images one step of `pass` processes with `bytes` of scratch.
std::int64_t chunk_images(const ConvGeometry& g, DType dtype, ConvPass pass, const ConvWorkspace& ws, const char* op) {
  const std::size_t one = workspace_for(g, dtype, pass, 1);
  KILN_CHECK(ws.bytes >= one, "{}: the workspace of {} bytes is smaller than the {} bytes one image needs", op,
             ws.bytes, one);
  KILN_CHECK(reinterpret_cast<std::uintptr_t>(ws.data) % 256 == 0, "{}: the workspace is not 256-byte aligned", op);
  std::int64_t images = std::min<std::int64_t>(g.batch, static_cast<std::int64_t>(ws.bytes / one));
  while (images > 1 && workspace_for(g, dtype, pass, images) > ws.bytes) --images;  // the alignment padding
  if (pass == ConvPass::grad_weight) images = std::min<std::int64_t>(images, INT_MAX / patch_cols(g));  // GEMM's K
  return std::max<std::int64_t>(images, 1);
}

void check_geometry(const ConvGeometry& g, DType dtype, const char* op) {
  KILN_CHECK(dtype == DType::f32 || dtype == DType::f64, "{}: dtype {} is not supported (f32 or f64 expected)", op,
             dtype_name(dtype));
  KILN_CHECK(g.batch >= 0 && g.stride >= 1 && g.padding >= 0 && g.out_h >= 1 && g.out_w >= 1,
             "{}: batch {}, stride {}, padding {} give a {}x{} output", op, g.batch, g.stride, g.padding, g.out_h,
             g.out_w);
}

ConvShape shape_of(const ConvGeometry& g, std::int64_t images, bool batch_folded) {
  const std::int64_t cols = patch_cols(g);
  return {images,   g.in_channels, g.height, g.width,
          g.kernel_h, g.kernel_w, g.stride, g.padding,
          g.out_h,  g.out_w,      batch_folded ? images * cols : cols,
          batch_folded ? cols : patch_rows(g) * cols};
}

void im2col(DType dtype, ConvShape shape, const void* x, void* col, jit::Stream stream) {
  const DeviceKernel& k =
      device_kernel(fmt::format("kiln_im2col_{}", dtype_name(dtype)), [&] { return im2col_source(dtype); });
  void* args[] = {&x, &col, &shape};
  launch_items(k, shape.images * shape.channels * shape.kernel_h * shape.kernel_w * shape.out_h * shape.out_w, stream,
               args);
}

void col2im(DType dtype, ConvShape shape, const void* col, void* x, jit::Stream stream) {
  const DeviceKernel& k =
      device_kernel(fmt::format("kiln_col2im_{}", dtype_name(dtype)), [&] { return col2im_source(dtype); });
  void* args[] = {&col, &x, &shape};
  launch_items(k, shape.images * shape.channels * shape.height * shape.width, stream, args);
}

const char* at(const void* base, std::int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + static_cast<std::size_t>(elements) * dtype_size(dtype);
}
char* at(void* base, std::int64_t elements, DType dtype) {
  return static_cast<char*>(base) + static_cast<std::size_t>(elements) * dtype_size(dtype);
}

// Per image b of a chunk: out_b[M, OH*OW] = op(A)[M, K] in_b[K, OH*OW], A shared by all.
void per_image_gemm(DType dtype, bool trans_a, std::int64_t m, std::int64_t k, std::int64_t cols, const void* a,
                    const void* in, void* out, std::int64_t images, jit::Stream stream) {
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
  gemm(dtype, gemm_args, stream);
}

}  // namespace

std::size_t conv_workspace_bytes(const ConvGeometry& g, DType dtype, ConvPass pass, std::int64_t images_per_chunk) {
  const std::int64_t images = images_per_chunk > 0 ? std::min(images_per_chunk, g.batch) : g.batch;
  return workspace_for(g, dtype, pass, std::max<std::int64_t>(images, 1));
}

void conv2d_forward(DType dtype, const ConvGeometry& g, const void* x, const void* w, void* y, ConvWorkspace ws,
                    jit::Stream stream) {
  check_geometry(g, dtype, "conv2d");
  if (g.batch == 0) return;
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  if (pointwise(g)) {  // y_b[Cout, HW] = W[Cout, Cin] x_b[Cin, HW]
    per_image_gemm(dtype, false, g.out_channels, g.in_channels, patch_cols(g), w, x, y, g.batch, stream);
    return;
  }
  const std::int64_t chunk = chunk_images(g, dtype, ConvPass::forward, ws, "conv2d");
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
    const std::int64_t images = std::min(chunk, g.batch - b0);
    im2col(dtype, shape_of(g, images, false), at(x, b0 * in_size, dtype), ws.data, stream);
    // y_b[Cout, OH*OW] = W[Cout, P] col_b[P, OH*OW]
    per_image_gemm(dtype, false, g.out_channels, patch_rows(g), patch_cols(g), w, ws.data, at(y, b0 * out_size, dtype),
                   images, stream);
  }
}

void conv2d_grad_input(DType dtype, const ConvGeometry& g, const void* dy, const void* w, void* dx, ConvWorkspace ws,
                       jit::Stream stream) {
  check_geometry(g, dtype, "conv2d_grad_input");
  if (g.batch == 0) return;
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  if (pointwise(g)) {  // dx_b[Cin, HW] = W^T[Cin, Cout] dy_b[Cout, HW]
    per_image_gemm(dtype, true, g.in_channels, g.out_channels, patch_cols(g), w, dy, dx, g.batch, stream);
    return;
  }
  const std::int64_t chunk = chunk_images(g, dtype, ConvPass::grad_input, ws, "conv2d_grad_input");
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
    const std::int64_t images = std::min(chunk, g.batch - b0);
    // col_b[P, OH*OW] = W^T[P, Cout] dy_b[Cout, OH*OW], then dx_b = col2im(col_b)
    per_image_gemm(dtype, true, patch_rows(g), g.out_channels, patch_cols(g), w, at(dy, b0 * out_size, dtype), ws.data,
                   images, stream);
    col2im(dtype, shape_of(g, images, false), ws.data, at(dx, b0 * in_size, dtype), stream);
  }
}

void conv2d_grad_weight(DType dtype, const ConvGeometry& g, const void* x, const void* dy, void* dw, ConvWorkspace ws,
                        jit::Stream stream) {
  check_geometry(g, dtype, "conv2d_grad_weight");
  if (g.batch == 0) {
    fill(dtype, 0.0, g.out_channels * patch_rows(g), dw, stream);
    return;
  }
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  const std::int64_t chunk = chunk_images(g, dtype, ConvPass::grad_weight, ws, "conv2d_grad_weight");
  void* col = ws.data;
  void* dy_t = static_cast<char*>(ws.data) + round_up(col_bytes(g, dtype, chunk));
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
    const std::int64_t images = std::min(chunk, g.batch - b0);
    const std::int64_t k = images * patch_cols(g);
    im2col(dtype, shape_of(g, images, true), at(x, b0 * in_size, dtype), col, stream);  // [P][b][OH*OW]
    transpose(dtype, Shape{images, g.out_channels, patch_cols(g)}, {1, 0, 2}, at(dy, b0 * out_size, dtype), dy_t,
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
    gemm_args.c = dw;
    gemm_args.ld_c = patch_rows(g);
    gemm_args.beta = b0 == 0 ? 0.0 : 1.0;
    gemm(dtype, gemm_args, stream);
  }
}

}  // namespace kiln::cuda
