// The host side of the convolution kernels (kernels/conv.cuh, kernels/conv_igemm.cuh): their
// names, the implicit GEMM's tile rules (threads, shared memory, the K table) and the
// defines that pick an entry and its tile; the CUDA itself is in the .cuh files.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>

#include "backends/cuda/kernel_sources.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {

// col[(c, kh, kw), (oh, ow)] of image b = x[b, c, oh*s - p + kh, ow*s - p + kw], 0 outside.
gpu::KernelSource im2col_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_im2col_{}", dtype_name(dtype)), kernel_files::conv_cuh,
                         "KILN_IM2COL", {{"KILN_T", cuda_type_name(dtype)}});
}

// The adjoint of im2col, a gather in the CPU col2im's order (deterministic sums).
gpu::KernelSource col2im_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_col2im_{}", dtype_name(dtype)), kernel_files::conv_cuh,
                         "KILN_COL2IM", {{"KILN_T", cuda_type_name(dtype)}});
}

namespace {

const char* mode_name(IgemmMode mode) {
  switch (mode) {
    case IgemmMode::forward:
      return "fwd";
    case IgemmMode::grad_input:
      return "dgrad";
    case IgemmMode::grad_weight:
      return "wgrad";
    case IgemmMode::grad_input_classes:
      return "dgrad_classes";
  }
  return "?";
}

}  // namespace

std::string conv_igemm_name(IgemmMode mode, IgemmTile tile, DType dtype, bool float_out) {
  return fmt::format("kiln_conv_igemm_{}_{}x{}x{}k{}t{}x{}_{}{}", mode_name(mode), tile.bm, tile.bn,
                     tile.kg, tile.ks, tile.tm, tile.tn, dtype_name(dtype),
                     float_out ? "_f32out" : "");
}

std::size_t wide_size(DType dtype) { return dtype == DType::f64 ? 8 : 4; }

int igemm_threads(IgemmTile tile) {
  return tile.tm > 0 && tile.tn > 0 ? tile.kg * (tile.bm / tile.tm) * (tile.bn / tile.tn) : 0;
}

namespace {

// Shared memory of a tile with a K table of `table` entries (the tiles are of the compute type).
std::size_t igemm_shared(IgemmTile tile, DType dtype, std::size_t table) {
  const std::size_t t = wide_size(dtype), bk = static_cast<std::size_t>(tile.ks) * tile.kg;
  return 2 * bk * (tile.bm + 4) * t + 2 * bk * (tile.bn + 4) * t + (table + tile.bn) * 16;
}

// The K table's entries: the most of 1024, 512, 256 that fits 48 KiB (0: none fits).
int igemm_table(IgemmTile tile, DType dtype) {
  for (int table : {1024, 512, 256})
    if (igemm_shared(tile, dtype, table) <= 48 * 1024 && table % (tile.ks * tile.kg) == 0)
      return table;
  return 0;
}

}  // namespace

std::size_t igemm_static_shared_bytes(IgemmTile tile, DType dtype) {
  const int table = igemm_table(tile, dtype);
  return table > 0 ? igemm_shared(tile, dtype, table) : 0;
}

bool igemm_tile_valid(IgemmTile tile, DType dtype) {
  if ((tile.tm != 4 && tile.tm != 8) || (tile.tn != 4 && tile.tn != 8)) return false;
  if (tile.bm < 16 || tile.bn < 16 || tile.kg < 1 || tile.bm % (4 * tile.tm) != 0 ||
      tile.bn % (4 * tile.tn) != 0)
    return false;
  if (tile.ks != 16 && tile.ks != 32) return false;
  const int threads = igemm_threads(tile);
  // 64 threads at least: the kernel registry sizes blocks from 64 up to the kernel's bound.
  if (threads < 64 || threads > 1024 || threads % 32 != 0 || threads % tile.bn != 0) return false;
  if (tile.kg > 1 && (tile.kg - 1) * tile.bm * tile.bn > 2 * tile.ks * tile.kg * (tile.bm + 4))
    return false;
  return igemm_table(tile, dtype) > 0;
}

gpu::KernelSource conv_igemm_source(IgemmMode mode, IgemmTile tile, DType dtype, bool float_out) {
  KILN_CHECK(
      igemm_tile_valid(tile, dtype),
      "conv implicit GEMM: no kernel for the {}x{}x{} tile (K step {}, {}x{} per thread) in {}",
      tile.bm, tile.bn, tile.kg, tile.ks, tile.tm, tile.tn, dtype_name(dtype));
  auto number = [](int v) { return std::to_string(v); };
  KILN_CHECK(!float_out || is_low_precision(dtype),
             "conv implicit GEMM: f32 partials are for bf16 and f16 inputs, not {}",
             dtype_name(dtype));
  return embedded_kernel(conv_igemm_name(mode, tile, dtype, float_out),
                         kernel_files::conv_igemm_cuh, "KILN_CONV_IGEMM",
                         {{"KILN_T", cuda_type_name(dtype)},
                          {"KILN_OT", float_out ? "float" : cuda_type_name(dtype)},
                          {"KILN_THREADS", number(igemm_threads(tile))},
                          {"KILN_MODE", number(static_cast<int>(mode))},
                          {"KILN_BM", number(tile.bm)},
                          {"KILN_BN", number(tile.bn)},
                          {"KILN_KG", number(tile.kg)},
                          {"KILN_KS", number(tile.ks)},
                          {"KILN_TK", number(igemm_table(tile, dtype))},
                          {"KILN_TM", number(tile.tm)},
                          {"KILN_TN", number(tile.tn)}});
}

// The tensor-core forward (conv_mma.cuh): bf16 or f16, bm x 64 tiles, weights by cp.async
// when vec_a; grad_input over the transposed weights.
std::string conv_mma_name(DType dtype, int bm, bool vec_a, ConvMmaKind kind) {
  const char* pass = kind == ConvMmaKind::forward      ? "fwd"
                     : kind == ConvMmaKind::grad_input ? "dgrad"
                                                       : "dgrad_s2";
  return fmt::format("kiln_conv_mma_{}_{}x64x32_{}{}", pass, bm, dtype_name(dtype),
                     vec_a ? "_vec" : "");
}

namespace {
void check_mma_tile(DType dtype, int bm) {
  KILN_CHECK(is_low_precision(dtype) && (bm == 64 || bm == 128),
             "conv tensor-core kernel: bf16 or f16 in tiles of 64 or 128 filters, not {} in {}",
             dtype_name(dtype), bm);
}
}  // namespace

gpu::KernelSource conv_mma_source(DType dtype, int bm, bool vec_a, ConvMmaKind kind) {
  check_mma_tile(dtype, bm);
  const bool flip = kind != ConvMmaKind::forward;
  const bool dilated = kind == ConvMmaKind::grad_input_stride2;
  return embedded_kernel(conv_mma_name(dtype, bm, vec_a, kind), kernel_files::conv_mma_cuh,
                         "KILN_CONV_MMA",
                         {{"KILN_T", cuda_type_name(dtype)},
                          {"KILN_BM", std::to_string(bm)},
                          {"KILN_VEC_A", vec_a ? "1" : "0"},
                          {"KILN_FLIP", flip ? "1" : "0"},
                          {"KILN_DIL", dilated ? "2" : "1"}});
}

bool nhwc_tile_valid(NhwcTile t) {
  const int threads = t.threads();
  if (t.wgmma)
    return (t.wm == 1 || t.wm == 2) && t.wn == 1 && t.bm == 64 * t.wm &&
           (t.bn == 64 || t.bn == 128 || t.bn == 256) && t.pieces == 8 && t.stages >= 3 &&
           t.stages <= 6 && (t.bn * t.pieces) % threads == 0 && t.shared_bytes() <= 227 * 1024;
  return t.wm >= 1 && t.wn >= 1 && t.bm % (16 * t.wm) == 0 && t.bn % (16 * t.wn) == 0 &&
         (t.pieces == 4 || t.pieces == 8) && t.stages >= 2 && t.stages <= 6 && threads <= 256 &&
         (t.bm * t.pieces) % threads == 0 && (t.bn * t.pieces) % threads == 0 &&
         t.shared_bytes() <= 227 * 1024;
}

std::string conv_nhwc_name(DType dtype, NhwcTile tile, bool dilated, bool split) {
  return fmt::format("kiln_conv_nhwc_{}_{}x{}x{}_{}{}x{}_s{}_{}{}", dilated ? "dgrad_s2" : "fwd",
                     tile.bm, tile.bn, tile.pieces * 16 / dtype_size(dtype),
                     tile.wgmma ? "wgmma" : "w", tile.wm, tile.wn, tile.stages,
                     dtype == DType::f32 ? "tf32" : dtype_name(dtype), split ? "_splitk" : "");
}

gpu::KernelSource conv_nhwc_source(DType dtype, NhwcTile tile, bool dilated, bool split) {
  KILN_CHECK((is_low_precision(dtype) || dtype == DType::f32) && nhwc_tile_valid(tile),
             "conv channels-last kernel: bf16, f16 or f32 (TF32) in a valid tile, not {} in "
             "{}x{} (warps {}x{}, {} pieces, {} stages)",
             dtype_name(dtype), tile.bm, tile.bn, tile.wm, tile.wn, tile.pieces, tile.stages);
  if (tile.wgmma) {
    KILN_CHECK(!split, "conv channels-last wgmma kernel ({}): K is never split", dtype_name(dtype));
    gpu::KernelSource source = embedded_kernel(conv_nhwc_name(dtype, tile, dilated),
                                               kernel_files::conv_wgmma_cuh, "KILN_CONV_WGMMA",
                                               {{"KILN_T", cuda_type_name(dtype)},
                                                {"KILN_BM", std::to_string(tile.bm)},
                                                {"KILN_BN", std::to_string(tile.bn)},
                                                {"KILN_STAGES", std::to_string(tile.stages)},
                                                {"KILN_DIL", dilated ? "2" : "1"}});
    source.arch_specific = true;
    return source;
  }
  return embedded_kernel(conv_nhwc_name(dtype, tile, dilated, split),
                         kernel_files::conv_mma_nhwc_cuh, "KILN_CONV_NHWC",
                         {{"KILN_T", cuda_type_name(dtype)},
                          {"KILN_BM", std::to_string(tile.bm)},
                          {"KILN_BN", std::to_string(tile.bn)},
                          {"KILN_WM", std::to_string(tile.wm)},
                          {"KILN_WN", std::to_string(tile.wn)},
                          {"KILN_PIECES", std::to_string(tile.pieces)},
                          {"KILN_STAGES", std::to_string(tile.stages)},
                          {"KILN_DIL", dilated ? "2" : "1"},
                          {"KILN_SPLIT", split ? "true" : "false"}});
}

namespace {
const char* unsigned_of(std::size_t element_bytes) {
  KILN_CHECK(element_bytes == 2 || element_bytes == 4,
             "conv channels-last copies: 2- or 4-byte elements, not {}", element_bytes);
  return element_bytes == 2 ? "unsigned short" : "unsigned";
}
}  // namespace

std::string nhwc_image_name(std::size_t element_bytes) {
  return fmt::format("kiln_conv_nchw_to_nhwc_u{}", 8 * element_bytes);
}

std::string nhwc_weights_name(bool flip, std::size_t element_bytes) {
  return fmt::format("kiln_conv_nhwc_weights{}_u{}", flip ? "_flipped" : "", 8 * element_bytes);
}

gpu::KernelSource nhwc_image_source(std::size_t element_bytes) {
  return embedded_kernel(nhwc_image_name(element_bytes), kernel_files::nhwc_copy_cuh,
                         "KILN_NHWC_IMAGE", {{"KILN_U", unsigned_of(element_bytes)}});
}

gpu::KernelSource nhwc_weights_source(bool flip, std::size_t element_bytes) {
  return embedded_kernel(
      nhwc_weights_name(flip, element_bytes), kernel_files::conv_mma_nhwc_cuh, "KILN_NHWC_WEIGHTS",
      {{"KILN_U", unsigned_of(element_bytes)}, {"KILN_FLIP", flip ? "true" : "false"}});
}

// The tensor-core weight gradient (conv_mma_wgrad.cuh): f32 partials when float_out; f32 on
// TF32's tensor cores, its K steps the same bytes as the 16-bit types' (tile.bk / 2 pixels).
bool wgrad_tile_valid(WgradTile t) {
  const int threads = t.threads(), pieces = t.bk / 8;
  if (t.wgmma)
    return (t.wm == 1 || t.wm == 2) && t.wn == 1 && t.bm == 64 * t.wm &&
           (t.bn == 64 || t.bn == 128 || t.bn == 256) && t.bk == 64 &&
           (t.bn * pieces) % threads == 0 && t.shared_bytes() <= 227 * 1024;
  return t.wm >= 1 && t.wn >= 1 && t.bm % (16 * t.wm) == 0 && t.bn % (16 * t.wn) == 0 &&
         (t.bk == 32 || t.bk == 64) && threads <= 256 && threads % t.bk == 0 &&
         (t.bm * pieces) % threads == 0 && (t.bn * pieces) % threads == 0 &&
         t.shared_bytes() <= 227 * 1024;
}

std::string conv_mma_wgrad_name(DType dtype, WgradTile tile, bool vec_a, bool float_out,
                                bool vec_b) {
  return fmt::format("kiln_conv_mma_wgrad_{}x{}x{}_{}{}x{}_{}{}{}{}", tile.bm, tile.bn, tile.bk,
                     tile.wgmma ? "wgmma" : "w", tile.wm, tile.wn,
                     dtype == DType::f32 ? "tf32" : dtype_name(dtype), vec_a ? "_vec" : "",
                     vec_b ? "_runs" : "", float_out && dtype != DType::f32 ? "_f32out" : "");
}

gpu::KernelSource conv_mma_wgrad_source(DType dtype, WgradTile tile, bool vec_a, bool float_out,
                                        bool vec_b) {
  KILN_CHECK((is_low_precision(dtype) || dtype == DType::f32) && wgrad_tile_valid(tile),
             "conv tensor-core weight gradient: bf16, f16 or f32 (TF32) in a valid tile, not {} "
             "in {}x{} (warps {}x{}, {} 16-bit pixels a step)",
             dtype_name(dtype), tile.bm, tile.bn, tile.wm, tile.wn, tile.bk);
  if (tile.wgmma) {
    gpu::KernelSource source =
        embedded_kernel(conv_mma_wgrad_name(dtype, tile, vec_a, float_out, vec_b),
                        kernel_files::conv_wgmma_wgrad_cuh, "KILN_CONV_WGMMA_WGRAD",
                        {{"KILN_T", cuda_type_name(dtype)},
                         {"KILN_OT", float_out ? "float" : cuda_type_name(dtype)},
                         {"KILN_BM", std::to_string(tile.bm)},
                         {"KILN_BN", std::to_string(tile.bn)},
                         {"KILN_VEC_A", vec_a ? "1" : "0"},
                         {"KILN_VEC_B", vec_b ? "1" : "0"}});
    source.arch_specific = true;
    return source;
  }
  return embedded_kernel(conv_mma_wgrad_name(dtype, tile, vec_a, float_out, vec_b),
                         kernel_files::conv_mma_wgrad_cuh, "KILN_CONV_MMA_WGRAD",
                         {{"KILN_T", cuda_type_name(dtype)},
                          {"KILN_OT", float_out ? "float" : cuda_type_name(dtype)},
                          {"KILN_BM", std::to_string(tile.bm)},
                          {"KILN_BN", std::to_string(tile.bn)},
                          {"KILN_WM", std::to_string(tile.wm)},
                          {"KILN_WN", std::to_string(tile.wn)},
                          {"KILN_BK", std::to_string(tile.bk * 2 / dtype_size(dtype))},
                          {"KILN_VEC_A", vec_a ? "1" : "0"},
                          {"KILN_VEC_B", vec_b ? "1" : "0"}});
}

// The ordered sum of grad_weight's split-K partials (conv.cuh, splitk_sum).
gpu::KernelSource conv_splitk_sum_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_conv_splitk_sum_{}", dtype_name(dtype)),
                         kernel_files::conv_cuh, "KILN_SPLITK_SUM",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

gpu::KernelSource conv_bias_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_conv_bias_{}", dtype_name(dtype)),
                         kernel_files::conv_cuh, "KILN_CONV_BIAS",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

gpu::KernelSource conv_moments_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_conv_moments_{}", dtype_name(dtype)),
                         kernel_files::conv_cuh, "KILN_CONV_MOMENTS",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

}  // namespace kiln::cuda
