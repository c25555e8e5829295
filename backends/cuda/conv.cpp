// Convolution passes. The fast path is one implicit GEMM per pass (conv_kernels.cpp):
//   forward      y[co, (b, pix)]  = W[co, P] x patches[P, (b, pix)]
//   grad_input   dx[ci, (b, pix)] = W_flipped[ci, (co, kh, kw)] x dy patches (stride 1: the
//                forward convolution of dy with the transposed, flipped filter)
//   grad_weight  dW[co, P]        = dy[co, (b, pix)] x patches[(b, pix), P]
// with the patch matrix never written to memory and y, dx read and written in NCHW order.
// grad_weight splits its long K = B*OH*OW over blocks and sums the partials in a fixed
// order (a second small kernel), so it stays deterministic.
// Tiles: igemm_choose_tile (kernel_sources.cpp). The fallback (grad_input at stride > 1;
// forward and grad_input with fewer than 16 output channels or a 1x1 filter; offsets past
// 2^30 elements; image or filter sides past 4096) is im2col + cuBLAS: forward and grad_input use a
// per-image patch layout [b][P][OH*OW] (P = Cin*KH*KW) and one strided-batched GEMM per chunk of
// images, whose per-image outputs land directly in NCHW order. grad_weight folds the batch into the
// GEMM's K: patches as [P][b][OH*OW] and dy transposed to [Cout][b][OH*OW], then one GEMM dW = dy^T
// col^T.
// bf16 and f16 (DESIGN.md, Precision) compute in float and round each output once: the
// implicit GEMM widens as it loads and sums split-K partials in f32 scratch; the fallback
// GEMMs accumulate in f32 on the tensor cores, grad_input's col is f32 scratch that col2im
// sums, and grad_weight sums its chunks in an f32 dW that one pass rounds at the end.
#include "backends/cuda/conv.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "backends/cuda/conv_mma.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/layout.h"
#include "core/error.h"

namespace kiln::cuda {

namespace detail {
namespace {
ConvAlgo g_algo = ConvAlgo::automatic;
ConvTiling g_tiling[3];
}  // namespace
void set_conv_algo_for_testing(ConvAlgo algo) { g_algo = algo; }
void set_conv_tiling_for_testing(ConvPass pass, ConvTiling tiling) {
  g_tiling[static_cast<int>(pass)] = tiling;
}
}  // namespace detail

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

// What sums are kept in: f64 for f64, else f32 (bf16 and f16 accumulate in f32 scratch).
DType wide_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// ---- implicit GEMM ----

constexpr std::int64_t kGradWeightBlocks =
    264;  // split-K target: two blocks per SM of an H100/H200
constexpr std::int64_t kMaxOffset = std::int64_t{1} << 30;
constexpr std::int64_t kMaxExtent =
    4096;  // image sides, kernel sides, padding, stride (table entries)

IgemmMode mode_of(ConvPass pass) {
  return pass == ConvPass::forward      ? IgemmMode::forward
         : pass == ConvPass::grad_input ? IgemmMode::grad_input
                                        : IgemmMode::grad_weight;
}

// C = A B of `pass`: M rows, N columns, K terms.
struct GemmDims {
  std::int64_t m, n, k;
};
GemmDims dims_of(const ConvGeometry& g, ConvPass pass) {
  const std::int64_t b = g.batch, kk = g.kernel_h * g.kernel_w;
  switch (pass) {
    case ConvPass::forward:
      return {g.out_channels, b * g.out_h * g.out_w, g.in_channels * kk};
    case ConvPass::grad_input:
      return {g.in_channels, b * g.height * g.width, g.out_channels * kk};
    case ConvPass::grad_weight:
      return {g.out_channels, g.in_channels * kk, b * g.out_h * g.out_w};
  }
  return {0, 0, 0};
}

bool use_igemm(const ConvGeometry& g, DType /*every floating dtype*/, ConvPass pass) {
  if (detail::g_algo == detail::ConvAlgo::im2col_gemm) return false;
  if (detail::g_algo == detail::ConvAlgo::im2col_grad_weight && pass == ConvPass::grad_weight)
    return false;
  if (pass == ConvPass::grad_input && g.stride != 1) return false;
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

// The bf16/f16 forward runs on the tensor cores wherever the implicit GEMM would.
bool use_mma(const ConvGeometry& g, DType dtype, ConvPass pass) {
  return pass == ConvPass::forward && is_low_precision(dtype) &&
         detail::g_algo != detail::ConvAlgo::cuda_cores && use_igemm(g, dtype, pass);
}

IgemmTile tile_for(const GemmDims& d, DType dtype, ConvPass pass) {
  const detail::ConvTiling& forced = detail::g_tiling[static_cast<int>(pass)];
  if (forced.bm > 0) {
    const IgemmTile tile{forced.bm, forced.bn, forced.kg, forced.ks > 0 ? forced.ks : 16,
                         forced.tm, forced.tn};
    KILN_CHECK(
        igemm_tile_valid(tile, dtype),
        "conv: no implicit-GEMM kernel for the forced {}x{}x{} tile (K step {}, {}x{} per thread)",
        tile.bm, tile.bn, tile.kg, tile.ks, tile.tm, tile.tn);
    return tile;
  }
  return igemm_choose_tile(mode_of(pass), dtype, d.m, d.n);
}

// K splits of grad_weight and the K range of each (a multiple of the tile's K step).
struct Splits {
  std::int64_t count = 1, chunk = 0;
};
Splits splits_for(const GemmDims& d, IgemmTile tile, ConvPass pass, std::int64_t wanted = 0) {
  const std::int64_t bk = static_cast<std::int64_t>(tile.ks) * tile.kg;
  const std::int64_t steps = std::max<std::int64_t>(1, (d.k + bk - 1) / bk);
  if (pass != ConvPass::grad_weight) return {1, steps * bk};
  if (wanted <= 0) {
    const std::int64_t forced = detail::g_tiling[static_cast<int>(pass)].splits;
    const std::int64_t tiles = ((d.m + tile.bm - 1) / tile.bm) * ((d.n + tile.bn - 1) / tile.bn);
    wanted = forced > 0 ? forced : (kGradWeightBlocks + tiles - 1) / tiles;
  }
  wanted = std::clamp<std::int64_t>(wanted, 1, std::min<std::int64_t>(steps, 65535));
  const std::int64_t per = (steps + wanted - 1) / wanted;
  return {(steps + per - 1) / per, per * bk};
}

std::size_t igemm_workspace(const ConvGeometry& g, DType dtype, ConvPass pass) {
  if (pass != ConvPass::grad_weight) return 0;
  const GemmDims d = dims_of(g, pass);
  const Splits s = splits_for(d, tile_for(d, dtype, pass), pass);
  return s.count > 1 ? static_cast<std::size_t>(s.count * d.m * d.n) * wide_size(dtype) : 0;
}

std::int32_t i32(std::int64_t v) { return static_cast<std::int32_t>(v); }

// The GEMM's description for the kernel: which tensor is the image, how its windows are
// laid out, and the strides of A and C along M (kernels/conv_params.h, ConvGemmShape).
ConvGemmShape gemm_shape(const ConvGeometry& g, ConvPass pass, const GemmDims& d,
                         std::int64_t k_chunk) {
  ConvGemmShape s{};
  s.m = i32(d.m);
  s.n = i32(d.n);
  s.k = i32(d.k);
  s.k_chunk = i32(k_chunk);
  s.khkw = i32(g.kernel_h * g.kernel_w);
  s.kw = i32(g.kernel_w);
  if (pass == ConvPass::grad_input) {  // image dy, windows over dx's grid, flipped filter
    s.s_hw = i32(g.height * g.width);
    s.s_w = i32(g.width);
    s.stride = 1;
    s.pad_h = i32(g.kernel_h - 1 - g.padding);
    s.pad_w = i32(g.kernel_w - 1 - g.padding);
    s.img_chw = i32(g.out_channels * g.out_h * g.out_w);
    s.img_hw = i32(g.out_h * g.out_w);
    s.img_h = i32(g.out_h);
    s.img_w = i32(g.out_w);
    s.a_ms = s.khkw;
    s.c_ms = s.s_hw;
    return s;
  }
  s.s_hw = i32(g.out_h * g.out_w);  // image x, windows over y's (dy's) grid
  s.s_w = i32(g.out_w);
  s.stride = i32(g.stride);
  s.pad_h = s.pad_w = i32(g.padding);
  s.img_chw = i32(g.in_channels * g.height * g.width);
  s.img_hw = i32(g.height * g.width);
  s.img_h = i32(g.height);
  s.img_w = i32(g.width);
  s.a_ms = pass == ConvPass::forward ? s.k : s.s_hw;
  s.c_ms = pass == ConvPass::forward ? s.s_hw : s.n;
  return s;
}

// out[i] = the ordered sum of `count` partials part[z * mn + i] (of the compute type), rounded
// once to `dtype`; a count of 1 is the rounding alone.
void splitk_sum(DType dtype, const void* part, void* out, std::int64_t elements, std::int64_t count,
                gpu::Stream stream) {
  const DeviceKernel& sum = device_kernel(fmt::format("kiln_conv_splitk_sum_{}", dtype_name(dtype)),
                                          [&] { return conv_splitk_sum_source(dtype); });
  int mn = i32(elements), splits = i32(count);
  void* sum_args[] = {&part, &out, &mn, &splits};
  const unsigned lanes = mn >= 4096 ? 8 : 32;  // more lanes per output when there are few outputs
  sum.kernel.launch({static_cast<unsigned>((mn + 31) / 32), 1, 1}, {32, lanes, 1}, 0, stream,
                    sum_args);
}

// One implicit-GEMM pass: a = W (forward, grad_input) or dy; img = x or dy; out = y, dx or dW.
void run_igemm(DType dtype, const ConvGeometry& g, ConvPass pass, const void* a, const void* img,
               void* out, const ConvWorkspace& ws, gpu::Stream stream) {
  const GemmDims d = dims_of(g, pass);
  if (d.m == 0 || d.n == 0) return;
  const IgemmTile tile = tile_for(d, dtype, pass);
  Splits splits = splits_for(d, tile, pass);
  const std::size_t partial_bytes = static_cast<std::size_t>(d.m * d.n) * wide_size(dtype);
  if (splits.count > 1 &&
      ws.bytes < splits.count * partial_bytes)  // as many splits as the scratch holds
    splits =
        splits_for(d, tile, pass,
                   std::max<std::int64_t>(1, static_cast<std::int64_t>(ws.bytes / partial_bytes)));
  if (splits.count > 1)
    KILN_CHECK(reinterpret_cast<std::uintptr_t>(ws.data) % 256 == 0,
               "conv2d_grad_weight: the workspace is not 256-byte aligned");
  ConvGemmShape shape = gemm_shape(g, pass, d, splits.chunk);
  const IgemmMode mode = mode_of(pass);
  const bool float_out = splits.count > 1 && is_low_precision(dtype);  // f32 partials
  const DeviceKernel& k = device_kernel(conv_igemm_name(mode, tile, dtype, float_out), [&] {
    return conv_igemm_source(mode, tile, dtype, float_out);
  });
  void* target = splits.count > 1 ? ws.data : out;
  void* args[] = {&a, &img, &target, &shape};
  const gpu::Dim3 grid{static_cast<unsigned>((d.n + tile.bn - 1) / tile.bn),
                       static_cast<unsigned>((d.m + tile.bm - 1) / tile.bm),
                       static_cast<unsigned>(splits.count)};
  k.kernel.launch(grid, {static_cast<unsigned>(igemm_threads(tile)), 1, 1}, 0, stream, args);
  if (splits.count > 1) splitk_sum(dtype, ws.data, out, d.m * d.n, splits.count, stream);
}

// ---- im2col + cuBLAS ----

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

std::size_t workspace_for(const ConvGeometry& g, DType dtype, ConvPass pass, std::int64_t images) {
  if (pass == ConvPass::forward) return pointwise(g) ? 0 : col_bytes(g, dtype, images);
  if (pass == ConvPass::grad_input)  // col holds the GEMM's sums: f32 for bf16, f16
    return pointwise(g) ? 0 : col_bytes(g, wide_dtype(dtype), images);
  return grad_weight_scratch(g, dtype, images).bytes;
}

// How many images one step of `pass` processes with `bytes` of scratch.
std::int64_t chunk_images(const ConvGeometry& g, DType dtype, ConvPass pass,
                          const ConvWorkspace& ws, const char* op) {
  const std::size_t one = workspace_for(g, dtype, pass, 1);
  KILN_CHECK(ws.bytes >= one,
             "{}: the workspace of {} bytes is smaller than the {} bytes one image needs", op,
             ws.bytes, one);
  KILN_CHECK(reinterpret_cast<std::uintptr_t>(ws.data) % 256 == 0,
             "{}: the workspace is not 256-byte aligned", op);
  std::int64_t images = std::min<std::int64_t>(g.batch, static_cast<std::int64_t>(ws.bytes / one));
  while (images > 1 && workspace_for(g, dtype, pass, images) > ws.bytes)
    --images;  // the alignment padding
  if (pass == ConvPass::grad_weight)
    images = std::min<std::int64_t>(images, INT_MAX / patch_cols(g));  // GEMM's K
  return std::max<std::int64_t>(images, 1);
}

void check_geometry(const ConvGeometry& g, DType dtype, const char* op) {
  KILN_CHECK(is_floating(dtype), "{}: dtype {} is not supported (f32, f64, bf16 or f16 expected)",
             op, dtype_name(dtype));
  KILN_CHECK(g.batch >= 0 && g.stride >= 1 && g.padding >= 0 && g.out_h >= 1 && g.out_w >= 1,
             "{}: batch {}, stride {}, padding {} give a {}x{} output", op, g.batch, g.stride,
             g.padding, g.out_h, g.out_w);
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

std::size_t conv_workspace_bytes(const ConvGeometry& g, DType dtype, ConvPass pass,
                                 std::int64_t images_per_chunk) {
  if (use_igemm(g, dtype, pass)) return igemm_workspace(g, dtype, pass);
  const std::int64_t images = images_per_chunk > 0 ? std::min(images_per_chunk, g.batch) : g.batch;
  return workspace_for(g, dtype, pass, std::max<std::int64_t>(images, 1));
}

std::vector<gpu::KernelSource> conv_kernel_sources(const ConvGeometry& g, DType dtype,
                                                   ConvPass pass) {
  if (!use_igemm(g, dtype, pass)) {
    if (pointwise(g) && pass != ConvPass::grad_weight) return {};  // cuBLAS only
    if (pass == ConvPass::grad_weight && is_low_precision(dtype))  // rounding the f32 dW
      return {im2col_source(dtype), conv_splitk_sum_source(dtype)};
    return {pass == ConvPass::grad_input ? col2im_source(dtype) : im2col_source(dtype)};
  }
  const GemmDims d = dims_of(g, pass);
  if (use_mma(g, dtype, pass))
    return {conv_mma_source(dtype, conv_mma_tile_m(d.m, d.n), conv_mma_vector_weights(d.k))};
  const IgemmTile tile = tile_for(d, dtype, pass);
  std::vector<gpu::KernelSource> sources = {conv_igemm_source(mode_of(pass), tile, dtype)};
  if (splits_for(d, tile, pass).count == 1) return sources;
  if (is_low_precision(dtype))  // the splits write f32 partials
    sources.push_back(conv_igemm_source(mode_of(pass), tile, dtype, true));
  sources.push_back(conv_splitk_sum_source(dtype));
  return sources;
}

void conv2d_forward(DType dtype, const ConvGeometry& g, const void* x, const void* w, void* y,
                    ConvWorkspace ws, gpu::Stream stream) {
  check_geometry(g, dtype, "conv2d");
  if (g.batch == 0) return;
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  if (use_mma(g, dtype, ConvPass::forward)) {
    const GemmDims d = dims_of(g, ConvPass::forward);
    conv_mma_forward(dtype, gemm_shape(g, ConvPass::forward, d, d.k), w, x, y, stream);
    return;
  }
  if (use_igemm(g, dtype, ConvPass::forward)) {
    run_igemm(dtype, g, ConvPass::forward, w, x, y, ws, stream);
    return;
  }
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

void conv2d_grad_input(DType dtype, const ConvGeometry& g, const void* dy, const void* w, void* dx,
                       ConvWorkspace ws, gpu::Stream stream) {
  check_geometry(g, dtype, "conv2d_grad_input");
  if (g.batch == 0) return;
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  if (use_igemm(g, dtype, ConvPass::grad_input)) {
    run_igemm(dtype, g, ConvPass::grad_input, w, dy, dx, ws, stream);
    return;
  }
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

void conv2d_grad_weight(DType dtype, const ConvGeometry& g, const void* x, const void* dy, void* dw,
                        ConvWorkspace ws, gpu::Stream stream) {
  check_geometry(g, dtype, "conv2d_grad_weight");
  if (g.batch == 0) {
    fill(dtype, 0.0, g.out_channels * patch_rows(g), dw, stream);
    return;
  }
  if (use_igemm(g, dtype, ConvPass::grad_weight)) {
    run_igemm(dtype, g, ConvPass::grad_weight, dy, x, dw, ws, stream);
    return;
  }
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

}  // namespace kiln::cuda
