// The TMA channels-last pass (conv_tma.h): its fit, its tensor maps and its launch (the weight
// gradient's: conv_tma_wgrad.cpp).
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
#include "backends/cuda/conv_tma_maps.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/env_switch.h"
#include "core/error.h"
#include "gpu/cuda_check.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

std::optional<bool>& tma_for_testing() {
  static std::optional<bool> on;
  return on;
}
}  // namespace

bool tma_on() {
  static const bool by_env = env_switch_on("KILN_CONV_TMA");
  return tma_for_testing().value_or(by_env && !conv_tiles_forced());
}

namespace {
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

}  // namespace

int sm_count() {
  static const int count = [] {
    const std::optional<gpu::PlanTarget> target = gpu::plan_target();
    KILN_CHECK(target.has_value(), "conv TMA pass: no GPU to plan for");
    return std::max(target->sms, 1);
  }();
  return count;
}

int max_stride() {
  static const int stride = [] {
    const char* v = std::getenv("KILN_CONV_TMA_MAX_STRIDE");
    return v != nullptr && std::string(v) == "1" ? 1 : 2;
  }();
  return stride;
}

namespace {
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

}  // namespace

bool& wide_on() {
  static bool on = env_switch_on("KILN_CONV_TMA_WIDE");
  return on;
}

CUtensorMap tiled_map(DType dtype, const void* base, int rank, const cuuint64_t* dims,
                      const cuuint64_t* strides, const cuuint32_t* box, int swizzle_bytes,
                      const cuuint32_t* steps) {
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

CUtensorMap image_map(DType dtype, const ConvGemmShape& g, const void* xt, std::int64_t channels,
                      std::int64_t images, int rows, int box_images) {
  const auto c = static_cast<cuuint64_t>(channels);
  const auto stride = static_cast<cuuint32_t>(g.stride);
  const auto bytes = static_cast<cuuint32_t>(dtype_size(dtype));
  const cuuint64_t dims[4] = {c, static_cast<cuuint64_t>(g.img_w), static_cast<cuuint64_t>(g.img_h),
                              static_cast<cuuint64_t>(images)};
  const cuuint64_t strides[3] = {c * bytes, c * bytes * g.img_w, c * bytes * g.img_w * g.img_h};
  const cuuint32_t box[4] = {128 / bytes, stride * static_cast<cuuint32_t>(g.s_w),
                             stride * static_cast<cuuint32_t>(rows),
                             static_cast<cuuint32_t>(box_images)};
  const cuuint32_t steps[4] = {1, stride, stride, 1};
  return tiled_map(dtype, xt, 4, dims, strides, box, 128, steps);
}

namespace {
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

// f32's forward and stride-1 input gradient under TF32 on the TMA pass; KILN_TF32_TMA=0 leaves
// them to conv_wgmma.cuh's register gather (for measuring).
bool tf32_tma_on() {
  static const bool on = env_switch_on("KILN_TF32_TMA");
  return on;
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
  const bool tf32 = dtype == DType::f32;  // (TF32: one class, no moments, no halo form)
  if (!tma_on() || dilated || !conv_wgmma_enabled(dtype) || (!is_low_precision(dtype) && !tf32) ||
      (tf32 && (moments || !tf32_tma_on())) || g.stride < 1 || g.stride > max_stride() ||
      g.khkw == 0 || g.m == 0 || g.n == 0)
    return std::nullopt;
  const int channels = g.k / g.khkw, step = 128 / static_cast<int>(dtype_size(dtype));
  if (channels % step != 0) return std::nullopt;
  if (const std::optional<TmaTile> forced = forced_tma_tile())
    return conv_tma_box(g, forced->bn) ? forced : std::nullopt;
  if (!tf32 && !moments && halo_on() && tma_teams() == 2)
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
    const int steps = g.k / step;
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
  // A: [M][K], K innermost; boxes of a 128-byte row (64 16-bit, 32 f32) x bm.
  const auto bytes = static_cast<cuuint32_t>(dtype_size(dtype));
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(g.k), static_cast<cuuint64_t>(g.m)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(g.k) * bytes};
  const cuuint32_t a_box[2] = {128 / bytes, static_cast<cuuint32_t>(tile.bm)};
  const CUtensorMap filters = tiled_map(dtype, a, 2, a_dims, a_strides, a_box);
  KILN_CHECK(!y_channels_last || moments == nullptr,
             "conv TMA pass: a channels-last output with run moments");
  KILN_CHECK(dtype != DType::f32 ||
                 (!y_channels_last && moments == nullptr && classes == nullptr && !tile.halo()),
             "conv TMA pass (TF32): one class, no moments, an NCHW output, not the halo form");
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
