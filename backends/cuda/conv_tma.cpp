// The TMA channels-last pass (conv_tma.h): its fit, its tensor maps and its launch.
#include "backends/cuda/conv_tma.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/conv_mma.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/env_switch.h"
#include "core/error.h"
#include "gpu/cuda_check.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

// On unless KILN_CONV_TMA=0 or a tile is forced (conv_tiles_forced); a test may say otherwise.
std::optional<bool>& tma_for_testing() {
  static std::optional<bool> on;
  return on;
}
bool tma_on() {
  static const bool by_env = env_switch_on("KILN_CONV_TMA");
  return tma_for_testing().value_or(by_env && !conv_tiles_forced());
}

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link to libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    KILN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                     cudaEnableDefault, &found));
#else
    KILN_CUDA_CHECK(
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found));
#endif
    KILN_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
               "conv TMA pass: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

int sm_count() {  // the device's, or the one dump assumes without one (gpu::plan_target)
  static const int count = [] {
    const std::optional<gpu::PlanTarget> target = gpu::plan_target();
    KILN_CHECK(target.has_value(), "conv TMA pass: no GPU to plan for");
    return std::max(target->sms, 1);
  }();
  return count;
}

std::string wgrad_name(DType dtype, const TmaWgradPlan& p, bool dy_nhwc) {
  return fmt::format("kiln_conv_wgrad_tma_{}x{}_s{}_a{}{}{}{}_{}", p.bm, 64 * p.atoms, p.stages,
                     p.ar, p.br > 0 ? fmt::format("_b{}", p.br) : "", p.wide ? "_wide" : "",
                     dy_nhwc ? "_dy_nhwc" : "", dtype_name(dtype));
}
std::string sum_name(DType dtype) {
  return fmt::format("kiln_conv_wgrad_tap_sum_{}", dtype_name(dtype));
}

// The largest stride the passes take (2; KILN_CONV_TMA_MAX_STRIDE=1 keeps them to stride 1).
int max_stride() {
  static const int stride = [] {
    const char* v = std::getenv("KILN_CONV_TMA_MAX_STRIDE");
    return v != nullptr && std::string(v) == "1" ? 1 : 2;
  }();
  return stride;
}

int& tma_teams() {
  static int teams = [] {
    const char* v = std::getenv("KILN_CONV_TMA_TEAMS");
    return v != nullptr && std::string(v) == "1" ? 1 : 2;
  }();
  return teams;
}

int& persistent_blocks_cap() {  // a test's cap on the persistent grid (0: the SM count)
  static int cap = 0;
  return cap;
}

std::optional<detail::TmaSplit>& split_for_testing() {
  static std::optional<detail::TmaSplit> split;
  return split;
}
detail::TmaSplit split_mode() {
  static const detail::TmaSplit by_env = [] {
    const char* v = std::getenv("KILN_CONV_TMA_SPLIT");
    return v != nullptr && std::string(v) == "0" ? detail::TmaSplit::never
                                                 : detail::TmaSplit::automatic;
  }();
  return split_for_testing().value_or(by_env);
}

std::optional<bool>& halo_for_testing() {
  static std::optional<bool> on;
  return on;
}
bool halo_on() {
  static const bool by_env = env_switch_on("KILN_CONV_TMA_HALO");
  return halo_for_testing().value_or(by_env);
}

bool& wide_on() {
  static bool on = env_switch_on("KILN_CONV_TMA_WIDE");
  return on;
}

// A tiled map of `rank` dims (innermost first; strides in bytes of dims 1..), zeros outside the
// tensor, in the swizzle of `swizzle_bytes` (128, 64 or 32: the box's inner row).
CUtensorMap tiled_map(DType dtype, const void* base, int rank, const cuuint64_t* dims,
                      const cuuint64_t* strides, const cuuint32_t* box, int swizzle_bytes = 128,
                      const cuuint32_t* steps = nullptr) {
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_32B;
  CUtensorMap map;
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      encode_tiled()(&map,
                     dtype == DType::bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                     : dtype == DType::f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                     static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box,
                     steps != nullptr ? steps : unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KILN_CHECK(r == CUDA_SUCCESS, "conv TMA pass: cuTensorMapEncodeTiled failed ({})",
             static_cast<int>(r));
  return map;
}

// The channels-last image of `images` (a `channels`-channel NHWC copy, of the pass's img_h x
// img_w): [N][H][W][C], C innermost; boxes of 64 channels x s_w columns x `rows` x `box_images`
// of the pass's output grid, every stride-th column and row of the image (the TMA's element
// strides: the box spans stride x as many).
CUtensorMap image_map(DType dtype, const ConvGemmShape& g, const void* xt, std::int64_t channels,
                      std::int64_t images, int rows, int box_images) {
  const auto c = static_cast<cuuint64_t>(channels);
  const auto stride = static_cast<cuuint32_t>(g.stride);
  const cuuint64_t dims[4] = {c, static_cast<cuuint64_t>(g.img_w), static_cast<cuuint64_t>(g.img_h),
                              static_cast<cuuint64_t>(images)};
  const cuuint64_t strides[3] = {c * 2, c * 2 * g.img_w, c * 2 * g.img_w * g.img_h};
  const cuuint32_t box[4] = {64, stride * static_cast<cuuint32_t>(g.s_w),
                             stride * static_cast<cuuint32_t>(rows),
                             static_cast<cuuint32_t>(box_images)};
  const cuuint32_t steps[4] = {1, stride, stride, 1};
  return tiled_map(dtype, xt, 4, dims, strides, box, 128, steps);
}

// A persistent grid: a block an SM (or a test's cap), at most one a tile.
int persistent_grid(std::int64_t tiles) {
  const int cap = persistent_blocks_cap() > 0 ? persistent_blocks_cap() : sm_count();
  return static_cast<int>(std::min<std::int64_t>(tiles, cap));
}

// Whether a forward pass's blocks are persistent, one an SM taking the tiles in turn, so that
// the producer fills the next tile's stages during a tile's epilogue (a block a tile loaded,
// multiplied and stored one after the other): every tile but a split one (clusters of a tile).
// resnet18 bf16 b512 on the H200, with staged stores: 6.911 -> 6.822 ms (a block a tile where
// the K loop is longer than the stages: 6.911). KILN_CONV_TMA_PERSISTENT=0: two teams only.
bool tma_persistent(const TmaTile& tile) {
  static const bool on = env_switch_on("KILN_CONV_TMA_PERSISTENT");
  return tile.teams == 2 || (on && tile.split == 1);
}

// Whether the passes store y through shared memory (staged_store_c in kernels/conv_mma.cuh);
// KILN_CONV_TMA_STAGING=0: from the fragments (mma_store_c).
int staging_on() {
  static const int on = env_switch_on("KILN_CONV_TMA_STAGING") ? 1 : 0;
  return on;
}

// The halo form's launch (kernels/conv_wgmma_tma_halo.cuh): the image's boxes are `rows` output
// rows and the taps' KH - 1 more, one image.
void halo_forward(DType dtype, const ConvGemmShape& g, const TmaTile& tile,
                  const CUtensorMap& filters, const void* xt, void* y, gpu::Stream stream, int rows,
                  int staging) {
  const CUtensorMap image =
      image_map(dtype, g, xt, g.k / g.khkw, g.n / g.s_hw, rows + g.khkw / g.kw - 1, 1);
  const std::string name = conv_tma_name(dtype, tile);
  const DeviceKernel& k = device_kernel(
      name, [&] { return conv_tma_source(dtype, tile); }, tile.shared_bytes());
  ConvGemmShape s = g;
  void* args[] = {const_cast<CUtensorMap*>(&filters), const_cast<CUtensorMap*>(&image), &y, &s,
                  &staging};
  const std::int64_t tiles = (g.n + tile.bn - 1) / tile.bn;
  k.kernel.launch({static_cast<unsigned>(persistent_grid(tiles)), 1, 1},
                  {static_cast<unsigned>(tile.threads()), 1, 1}, tile.shared_bytes(), stream, args);
}

}  // namespace

// KILN_CONV_TMA_TILE=bm,bn,stages forces a tile wherever it fits (for measuring).
std::optional<TmaTile> forced_tma_tile() {
  static const std::optional<TmaTile> forced = []() -> std::optional<TmaTile> {
    const char* v = std::getenv("KILN_CONV_TMA_TILE");
    if (v == nullptr || *v == 0) return std::nullopt;
    TmaTile t{};
    KILN_CHECK(std::sscanf(v, "%d,%d,%d", &t.bm, &t.bn, &t.stages) == 3 &&
                   (t.bm == 64 || t.bm == 128) && (t.bn == 64 || t.bn == 128 || t.bn == 256) &&
                   t.stages >= 2 && t.shared_bytes() <= 227 * 1024,
               "KILN_CONV_TMA_TILE='{}': expected bm,bn,stages (bm 64 or 128, bn 64, 128 or 256, "
               "at least 2 stages, at most 227 KiB)",
               v);
    return t;
  }();
  return forced;
}

std::optional<TmaTile> conv_tma_tile(DType dtype, const ConvGemmShape& g, bool dilated,
                                     bool moments) {
  if (!tma_on() || dilated || !conv_wgmma_enabled(dtype) || !is_low_precision(dtype) ||
      g.stride < 1 || g.stride > max_stride() || g.khkw == 0 || g.m == 0 || g.n == 0)
    return std::nullopt;
  const int channels = g.k / g.khkw;
  if (channels % 64 != 0) return std::nullopt;
  if (const std::optional<TmaTile> forced = forced_tma_tile())
    return conv_tma_box(g, forced->bn) ? forced : std::nullopt;
  if (!moments && halo_on() && tma_teams() == 2)
    if (const std::optional<TmaTile> halo = conv_tma_halo_tile(g)) return halo;
  const int bm = g.m >= 128 ? 128 : 64;
  auto blocks = [&](int bn) {
    return static_cast<std::int64_t>((g.m + bm - 1) / bm) * ((g.n + bn - 1) / bn);
  };
  // 64 filters: 128 pixels first (two blocks an SM, conv_tma_tile_of); 128: 256 pixels where
  // that still gives a block to every SM.
  for (int bn : bm == 64 ? std::array{128, 256} : std::array{256, 128}) {
    if (!conv_tma_box(g, bn) || (bn == 256 && blocks(256) < sm_count() && conv_tma_box(g, 128)))
      continue;
    if (bm == 64) return conv_tma_tile_of(bm, bn, tma_teams());  // two teams: 64 filters only
    const int steps = g.k / 64;
    int split = 1;
    switch (split_mode()) {
      case detail::TmaSplit::never:
        break;
      case detail::TmaSplit::automatic:
        split = conv_tma_split_of(bm, blocks(bn), steps, sm_count());
        break;
      case detail::TmaSplit::always:
        split = steps >= 2 ? 2 : 1;
        break;
    }
    return conv_tma_tile_of(bm, bn, 1, split);
  }
  return std::nullopt;
}

std::string conv_tma_name(DType dtype, TmaTile t, bool moments, int classes) {
  if (t.halo()) return fmt::format("kiln_conv_nhwc_tma_halo_64x{}_{}", t.bn, dtype_name(dtype));
  return fmt::format("kiln_conv_nhwc_tma_{}x{}_s{}{}{}{}{}_{}", t.bm, t.bn, t.stages,
                     t.teams == 2 ? "_t2" : "", t.split == 2 ? "_k2" : "",
                     moments ? "_moments" : "", classes > 1 ? fmt::format("_c{}", classes) : "",
                     dtype_name(dtype));
}

gpu::KernelSource conv_tma_source(DType dtype, TmaTile t, bool moments, int classes) {
  KILN_CHECK((classes == 1 || classes == 4) && (classes == 1 || (!moments && t.split == 1)) &&
                 (!t.halo() || (classes == 1 && !moments)),
             "conv TMA pass: {} classes (1, or 4 without moments or a split K){}", classes,
             t.halo() ? ", the halo form (one class, no moments)" : "");
  if (t.halo()) {
    gpu::KernelSource source = embedded_kernel(
        conv_tma_name(dtype, t), kernel_files::conv_wgmma_tma_halo_cuh, "KILN_CONV_WGMMA_TMA_HALO",
        {{"KILN_T", cuda_type_name(dtype)}, {"KILN_BN", std::to_string(t.bn)}});
    source.arch_specific = true;
    return source;
  }
  gpu::KernelSource source =
      embedded_kernel(conv_tma_name(dtype, t, moments, classes), kernel_files::conv_wgmma_tma_cuh,
                      "KILN_CONV_WGMMA_TMA",
                      {{"KILN_T", cuda_type_name(dtype)},
                       {"KILN_BM", std::to_string(t.bm)},
                       {"KILN_BN", std::to_string(t.bn)},
                       {"KILN_STAGES", std::to_string(t.stages)},
                       {"KILN_TEAMS", std::to_string(t.teams)},
                       {"KILN_SPLIT", std::to_string(t.split)},
                       {"KILN_MOMENTS", moments ? "1" : "0"},
                       {"KILN_CLASSES", std::to_string(classes)}});
  source.arch_specific = true;
  return source;
}

void conv_tma_forward(DType dtype, const ConvGemmShape& g, TmaTile tile, const void* a,
                      const void* xt, void* y, gpu::Stream stream, float* moments,
                      const ConvClasses* classes, bool y_channels_last) {
  const auto box = conv_tma_box(g, tile.bn);
  KILN_CHECK(box.has_value() && reinterpret_cast<std::uintptr_t>(a) % 16 == 0 &&
                 reinterpret_cast<std::uintptr_t>(xt) % 16 == 0,
             "conv TMA pass: tile {}x{} does not fit the pass (output {} wide, {} pixels an "
             "image) or an operand is not 16-byte aligned",
             tile.bm, tile.bn, g.s_w, g.s_hw);
  // A: [M][K], K innermost; boxes of 64 x bm.
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(g.k), static_cast<cuuint64_t>(g.m)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(g.k) * 2};
  const cuuint32_t a_box[2] = {64, static_cast<cuuint32_t>(tile.bm)};
  const CUtensorMap filters = tiled_map(dtype, a, 2, a_dims, a_strides, a_box);
  KILN_CHECK(!y_channels_last || moments == nullptr,
             "conv TMA pass: a channels-last output with run moments");
  // The epilogue's store (the kernels' `staging`): channels-last, staged or from the fragments.
  int staging = y_channels_last ? 2 : staging_on();
  if (tile.halo()) {
    KILN_CHECK(moments == nullptr && classes == nullptr && conv_tma_halo_tile(g).has_value(),
               "conv TMA pass: the halo form does not fit the pass (or moments or classes asked)");
    halo_forward(dtype, g, tile, filters, xt, y, stream, box->first, staging);
    return;
  }
  const CUtensorMap image =
      image_map(dtype, g, xt, g.k / g.khkw, g.n / g.s_hw, box->first, box->second);
  const bool with_moments = moments != nullptr;
  const int count = classes != nullptr ? classes->count : 1;
  const DeviceKernel& k = device_kernel(
      conv_tma_name(dtype, tile, with_moments, count),
      [&] { return conv_tma_source(dtype, tile, with_moments, count); }, tile.shared_bytes());
  ConvGemmShape s = g;
  ConvClasses cl = classes != nullptr ? *classes : ConvClasses{};
  void* args[] = {const_cast<CUtensorMap*>(&filters),
                  const_cast<CUtensorMap*>(&image),
                  &y,
                  &moments,
                  &s,
                  &cl,
                  &staging};
  // The tiles, N fastest (as a 2-D grid's x), dealt out to the blocks in turn: a block each, or
  // a persistent block an SM (tma_persistent).
  const std::int64_t tiles =
      static_cast<std::int64_t>((g.m + tile.bm - 1) / tile.bm) * ((g.n + tile.bn - 1) / tile.bn);
  const std::int64_t blocks = tma_persistent(tile) ? persistent_grid(tiles) : tiles;
  const gpu::Dim3 block{static_cast<unsigned>(tile.threads()), 1, 1};
  if (tile.split == 2)  // clusters of two blocks, a tile each
    k.kernel.launch_clusters({static_cast<unsigned>(2 * tiles), 1, 1}, block, tile.shared_bytes(),
                             stream, args, 2);
  else
    k.kernel.launch({static_cast<unsigned>(blocks), 1, 1}, block, tile.shared_bytes(), stream,
                    args);
}

bool conv_tma_wgrad_reads_nhwc_dy(const ConvGemmShape& g) { return g.m >= 64 && g.m % 8 == 0; }

namespace {
// f32's (TF32) pass over x's tap columns; KILN_TF32_TMA_WGRAD=0 leaves f32's weight gradient to
// the register-gather kernels (conv_wgmma_wgrad.cuh).
bool tf32_tma_wgrad_on() {
  static const bool on = env_switch_on("KILN_TF32_TMA_WGRAD");
  return on;
}
}  // namespace

std::optional<TmaWgradPlan> conv_tma_wgrad_plan(DType dtype, const ConvGemmShape& g) {
  if (!tma_on() || !conv_wgmma_enabled(dtype)) return std::nullopt;
  if (dtype == DType::f32)
    return tf32_tma_wgrad_on() ? conv_tma_tf32_wgrad_plan_of(g, sm_count(), wide_on())
                               : std::nullopt;
  if (!is_low_precision(dtype)) return std::nullopt;
  return conv_tma_wgrad_plan_of(g, max_stride(), sm_count(), wide_on());
}

gpu::KernelSource conv_tma_wgrad_source(DType dtype, const TmaWgradPlan& p, bool dy_nhwc) {
  gpu::KernelSource source =
      embedded_kernel(wgrad_name(dtype, p, dy_nhwc), kernel_files::conv_wgmma_wgrad_tma_cuh,
                      "KILN_CONV_WGMMA_WGRAD_TMA",
                      {{"KILN_T", cuda_type_name(dtype)},
                       {"KILN_BM", std::to_string(p.bm)},
                       {"KILN_NA", std::to_string(p.atoms)},
                       {"KILN_STAGES", std::to_string(p.stages)},
                       {"KILN_AR", std::to_string(p.ar)},
                       {"KILN_WIDE", p.wide ? "true" : "false"},
                       {"KILN_DY_NHWC", dy_nhwc ? "true" : "false"},
                       {"KILN_BR", std::to_string(p.br)}});
  source.arch_specific = true;
  return source;
}

gpu::KernelSource conv_tma_wgrad_sum_source(DType dtype) {
  return embedded_kernel(sum_name(dtype), kernel_files::conv_wgmma_wgrad_tma_cuh,
                         "KILN_WGRAD_TAP_SUM", {{"KILN_T", cuda_type_name(dtype)}});
}

namespace {
// f32's maps (TF32; plan.br > 0): A dy [N][M][OH*OW], boxes of 32 pixels (or 32 / OH*OW whole
// images) x bm filters; B x's tap columns x3 [N][C][KW][rows][OW], boxes of br columns x 1 row x
// 1 tap x 64 channels (one output row's run at its own columns, 16-byte aligned), or where
// images are shorter than a step, of one image's run of rows x OW (rows and columns one
// dimension) x 1 tap x 64 channels.
std::pair<CUtensorMap, CUtensorMap> tf32_wgrad_maps(const ConvGemmShape& g, const TmaWgradPlan& p,
                                                    const void* dy, const void* x) {
  const bool images = g.s_hw < 32;
  KILN_CHECK(p.br > 0 && (g.stride == 1 || g.stride == 2) &&
                 (g.s_hw % 32 == 0 || (images && g.stride == 1 && p.br == g.s_hw)) &&
                 g.k_chunk == p.chunk && g.k_chunk % 32 == 0 && g.s_w % 4 == 0 &&
                 reinterpret_cast<std::uintptr_t>(dy) % 16 == 0 &&
                 reinterpret_cast<std::uintptr_t>(x) % 16 == 0,
             "conv2d_grad_weight (TMA, TF32): a plan for stride 1 or 2, OH*OW % 32 == 0 (or "
             "whole images of 16 or 8 pixels at stride 1), OW % 4 == 0 and 16-byte aligned "
             "operands (stride {}, {} pixels, OW {}, K chunk {} for {})",
             g.stride, g.s_hw, g.s_w, g.k_chunk, p.chunk);
  const auto u64 = [](std::int64_t v) { return static_cast<cuuint64_t>(v); };
  const auto u32 = [](int v) { return static_cast<cuuint32_t>(v); };
  const cuuint64_t a_dims[3] = {u64(g.s_hw), u64(g.m), u64(g.k / g.s_hw)};
  const cuuint64_t a_strides[2] = {u64(g.s_hw) * 4, u64(g.s_hw) * 4 * g.m};
  const int ar = std::min(32, g.s_hw);
  const cuuint32_t a_box[3] = {u32(ar), u32(p.bm), u32(32 / ar)};
  const CUtensorMap dy_map = tiled_map(DType::f32, dy, 3, a_dims, a_strides, a_box, ar * 4);
  const std::int64_t channels = g.n / g.khkw, rows = tf32_tap_rows(g);
  const cuuint64_t plane = u64(rows) * g.s_w * 4;
  if (images) {
    const cuuint64_t x_dims[4] = {u64(rows * g.s_w), u64(g.kw), u64(channels), u64(g.k / g.s_hw)};
    const cuuint64_t x_strides[3] = {plane, plane * g.kw, plane * g.kw * channels};
    const cuuint32_t x_box[4] = {u32(p.br), 1, 64, 1};
    return {dy_map, tiled_map(DType::f32, x, 4, x_dims, x_strides, x_box, p.br * 4)};
  }
  const cuuint64_t x_dims[5] = {u64(g.s_w), u64(rows), u64(g.kw), u64(channels),
                                u64(g.k / g.s_hw)};
  const cuuint64_t x_strides[4] = {u64(g.s_w) * 4, plane, plane * g.kw, plane * g.kw * channels};
  const cuuint32_t x_box[5] = {u32(p.br), 1, 1, 64, 1};
  return {dy_map, tiled_map(DType::f32, x, 5, x_dims, x_strides, x_box, p.br * 4)};
}

// The pass over its maps, then the sum of its splits into dW.
void wgrad_launch(DType dtype, const ConvGemmShape& g, const TmaWgradPlan& p,
                  const CUtensorMap& dy_map, const CUtensorMap& x_map, void* partials, void* dw,
                  gpu::Stream stream, bool dy_nhwc) {
  const DeviceKernel& k = device_kernel(
      wgrad_name(dtype, p, dy_nhwc), [&] { return conv_tma_wgrad_source(dtype, p, dy_nhwc); },
      p.shared_bytes());
  ConvGemmShape s = g;
  void* args[] = {const_cast<CUtensorMap*>(&dy_map), const_cast<CUtensorMap*>(&x_map), &partials,
                  &s};
  const gpu::Dim3 grid{static_cast<unsigned>(g.n / (64 * p.atoms)),
                       static_cast<unsigned>((g.m + p.bm - 1) / p.bm),
                       static_cast<unsigned>(p.splits)};
  k.kernel.launch(grid, {static_cast<unsigned>(p.threads()), 1, 1}, p.shared_bytes(), stream, args);
  const DeviceKernel& sum =
      device_kernel(sum_name(dtype), [&] { return conv_tma_wgrad_sum_source(dtype); });
  int m = g.m, n = g.n, khkw = g.khkw, splits = p.splits;
  void* sum_args[] = {&partials, &dw, &m, &n, &khkw, &splits};
  sum.kernel.launch({static_cast<unsigned>(n / khkw / 32), static_cast<unsigned>(m), 1},
                    {256, 1, 1}, 0, stream, sum_args);
}
}  // namespace

void conv_tma_grad_weight(DType dtype, const ConvGemmShape& g, const TmaWgradPlan& p,
                          const void* dy, const void* xt, void* partials, void* dw,
                          gpu::Stream stream, bool dy_nhwc) {
  if (dtype == DType::f32) {
    KILN_CHECK(!dy_nhwc && reinterpret_cast<std::uintptr_t>(partials) % 16 == 0,
               "conv2d_grad_weight (TMA, TF32): dy NCHW and 16-byte aligned partials");
    const auto [dy_map, x_map] = tf32_wgrad_maps(g, p, dy, xt);
    wgrad_launch(dtype, g, p, dy_map, x_map, partials, dw, stream, false);
    return;
  }
  const auto box = conv_tma_box(g, 64);  // a K step's pixels: (rows, images)
  KILN_CHECK(box.has_value() && g.k_chunk == p.chunk &&
                 reinterpret_cast<std::uintptr_t>(partials) % 16 == 0 &&
                 reinterpret_cast<std::uintptr_t>(dy) % 16 == 0 &&
                 reinterpret_cast<std::uintptr_t>(xt) % 16 == 0,
             "conv2d_grad_weight (TMA): K steps of 64 pixels are not whole rows (output {} wide, "
             "{} pixels an image), K chunk {} for a plan of {}, or an operand is not 16-byte "
             "aligned",
             g.s_w, g.s_hw, g.k_chunk, p.chunk);
  const cuuint64_t images = static_cast<cuuint64_t>(g.k / g.s_hw);
  // A: dy [N][M][OH*OW]; boxes of ar pixels x bm filters x 64 / ar images.
  const cuuint64_t a_dims[3] = {static_cast<cuuint64_t>(g.s_hw), static_cast<cuuint64_t>(g.m),
                                images};
  const cuuint64_t a_strides[2] = {static_cast<cuuint64_t>(g.s_hw) * 2,
                                   static_cast<cuuint64_t>(g.s_hw) * 2 * g.m};
  const cuuint32_t a_box[3] = {static_cast<cuuint32_t>(p.ar), static_cast<cuuint32_t>(p.bm),
                               static_cast<cuuint32_t>(64 / p.ar)};
  // (dy_nhwc) A: dy [pixels][M]; boxes of 64 filters x the step's 64 pixels, one a warpgroup.
  KILN_CHECK(!dy_nhwc || conv_tma_wgrad_reads_nhwc_dy(g),
             "conv2d_grad_weight (TMA): a channels-last dy of {} filters (64 or more, a multiple "
             "of 8)",
             g.m);
  const cuuint64_t nhwc_dims[2] = {static_cast<cuuint64_t>(g.m), static_cast<cuuint64_t>(g.k)};
  const cuuint64_t nhwc_strides[1] = {static_cast<cuuint64_t>(g.m) * 2};
  const cuuint32_t nhwc_box[2] = {64, 64};
  const CUtensorMap dy_map = dy_nhwc ? tiled_map(dtype, dy, 2, nhwc_dims, nhwc_strides, nhwc_box)
                                     : tiled_map(dtype, dy, 3, a_dims, a_strides, a_box, p.ar * 2);
  const CUtensorMap x_map = image_map(dtype, g, xt, g.n / g.khkw, images, box->first, box->second);
  wgrad_launch(dtype, g, p, dy_map, x_map, partials, dw, stream, dy_nhwc);
}

namespace detail {
void set_conv_tma_for_testing(std::optional<bool> on) { tma_for_testing() = on; }
void set_conv_tma_halo_for_testing(std::optional<bool> on) { halo_for_testing() = on; }
void set_conv_tma_wide_for_testing(bool wide) { wide_on() = wide; }
void set_conv_tma_split_for_testing(std::optional<TmaSplit> split) { split_for_testing() = split; }
void set_conv_tma_teams_for_testing(int teams, int max_blocks) {
  tma_teams() = teams == 2 ? 2 : 1;
  persistent_blocks_cap() = max_blocks;
}
}  // namespace detail

}  // namespace kiln::cuda
