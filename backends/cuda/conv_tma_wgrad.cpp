// The TMA weight-gradient pass (conv_tma.h; kernels/conv_wgmma_wgrad_tma.cuh): its plan on this
// device, its kernels' sources, its tensor maps (x's channels-last copy for bf16/f16, x's tap
// columns for f32 under TF32) and its launch with the sum of its splits.
#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "backends/cuda/conv_mma.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/conv_tma_maps.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/env_switch.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {
std::string wgrad_name(DType dtype, const TmaWgradPlan& p, bool dy_nhwc) {
  return fmt::format("kiln_conv_wgrad_tma_{}x{}_s{}_a{}{}{}{}{}_{}", p.bm, 64 * p.atoms, p.stages,
                     p.ar, p.br > 0 ? fmt::format("_b{}", p.br) : "",
                     p.halo > 0 ? fmt::format("_halo{}", p.halo) : "", p.wide ? "_wide" : "",
                     dy_nhwc ? "_dy_nhwc" : "", dtype_name(dtype));
}
std::string sum_name(DType dtype) {
  return fmt::format("kiln_conv_wgrad_tap_sum_{}", dtype_name(dtype));
}

// The sum of the splits: blocks of 256 threads, a thread a quad of dW's elements, `groups`
// threads sharing a quad (up to 8, at least 4 splits a group) while the quads' threads would not
// fill the SMs once (stage 1's 9216 quads over 131 splits: 8 groups of 16 or 17 splits;
// KILN_WGRAD_SUM_GROUPS=0: one, for measuring).
constexpr unsigned kSumThreads = 256;
int wgrad_sum_groups(std::int64_t quads, int splits) {
  static const bool on = env_switch_on("KILN_WGRAD_SUM_GROUPS");
  const std::int64_t fill = static_cast<std::int64_t>(sm_count()) * 2048;
  int groups = 1;
  while (on && groups < 8 && 8 * groups <= splits && quads * groups < fill) groups *= 2;
  return groups;
}

// The halo form where it pays (conv_tma_wgrad_halo_pays); KILN_CONV_WGRAD_HALO=1: wherever it
// fits, =0: never (the nine taps' boxes); a test may say (true: wherever it fits).
std::optional<bool>& wgrad_halo_for_testing() {
  static std::optional<bool> on;
  return on;
}
bool wgrad_halo_on(const ConvGemmShape& g) {
  static const std::int64_t by_env =
      env_integer("KILN_CONV_WGRAD_HALO", -1, 0, 1, "0 (never) or 1 (wherever it fits)");
  return wgrad_halo_for_testing().value_or(by_env >= 0 ? by_env == 1
                                                       : conv_tma_wgrad_halo_pays(g, sm_count()));
}

// f32's (TF32) pass over x's tap columns; KILN_TF32_TMA_WGRAD=0 leaves f32's weight gradient to
// the register-gather kernels (conv_wgmma_wgrad.cuh).
bool tf32_tma_wgrad_on() {
  static const bool on = env_switch_on("KILN_TF32_TMA_WGRAD");
  return on;
}
}  // namespace

bool conv_tma_wgrad_reads_nhwc_dy(const ConvGemmShape& g) { return g.m >= 64 && g.m % 8 == 0; }

std::optional<TmaWgradPlan> conv_tma_wgrad_plan(DType dtype, const ConvGemmShape& g) {
  if (!tma_on() || !conv_wgmma_enabled(dtype)) return std::nullopt;
  if (dtype == DType::f32)
    return tf32_tma_wgrad_on() ? conv_tma_tf32_wgrad_plan_of(g, sm_count(), wide_on())
                               : std::nullopt;
  if (!is_low_precision(dtype)) return std::nullopt;
  return conv_tma_wgrad_plan_of(g, max_stride(), sm_count(), wide_on(), wgrad_halo_on(g));
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
                       {"KILN_BR", std::to_string(p.br)},
                       {"KILN_HALO", std::to_string(p.halo)}});
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
// dimension) x 1 tap x 64 channels; and x itself [N][C][H][W] for the centre tap
// (tf32_centre_from_x: W = OW, the same boxes with one tap; else unused, x3's map again).
struct Tf32WgradMaps {
  CUtensorMap dy, x3, centre;
};
Tf32WgradMaps tf32_wgrad_maps(const ConvGemmShape& g, const TmaWgradPlan& p, const void* dy,
                              const void* x3, const void* x) {
  const bool images = g.s_hw < 32;
  KILN_CHECK(p.br > 0 && (g.stride == 1 || g.stride == 2) &&
                 (g.s_hw % 32 == 0 || (images && g.stride == 1 && p.br == g.s_hw)) &&
                 g.k_chunk == p.chunk && g.k_chunk % 32 == 0 && g.s_w % 4 == 0 &&
                 reinterpret_cast<std::uintptr_t>(dy) % 16 == 0 &&
                 reinterpret_cast<std::uintptr_t>(x3) % 16 == 0 &&
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
  const std::int64_t channels = g.n / g.khkw, rows = tf32_tap_rows(g), taps = tf32_tap_columns(g);
  const cuuint64_t plane = u64(rows) * g.s_w * 4;
  if (images) {
    const cuuint64_t x_dims[4] = {u64(rows * g.s_w), u64(taps), u64(channels), u64(g.k / g.s_hw)};
    const cuuint64_t x_strides[3] = {plane, plane * taps, plane * taps * channels};
    const cuuint32_t x_box[4] = {u32(p.br), 1, 64, 1};
    const CUtensorMap x3_map = tiled_map(DType::f32, x3, 4, x_dims, x_strides, x_box, p.br * 4);
    return {dy_map, x3_map, x3_map};
  }
  // a map of x's tap columns [N][C][taps][rows][OW] (taps 1 and rows H: x itself)
  auto columns = [&](const void* base, std::int64_t count) {
    const cuuint64_t x_dims[5] = {u64(g.s_w), u64(rows), u64(count), u64(channels),
                                  u64(g.k / g.s_hw)};
    const cuuint64_t x_strides[4] = {u64(g.s_w) * 4, plane, plane * count,
                                     plane * count * channels};
    const cuuint32_t x_box[5] = {u32(p.br), 1, 1, 64, 1};
    return tiled_map(DType::f32, base, 5, x_dims, x_strides, x_box, p.br * 4);
  };
  if (!tf32_centre_from_x(g)) {
    const CUtensorMap x3_map = columns(x3, taps);
    return {dy_map, x3_map, x3_map};
  }
  const CUtensorMap centre = columns(x, 1);  // (rows = H and OW = W here)
  return {dy_map, taps > 0 ? columns(x3, taps) : centre, centre};
}

// The pass over its maps, then the sum of its splits into dW.
void wgrad_launch(DType dtype, const ConvGemmShape& g, const TmaWgradPlan& p,
                  const CUtensorMap& dy_map, const CUtensorMap& x_map,
                  const CUtensorMap& centre_map, void* partials, void* dw, gpu::Stream stream,
                  bool dy_nhwc) {
  const DeviceKernel& k = device_kernel(
      wgrad_name(dtype, p, dy_nhwc), [&] { return conv_tma_wgrad_source(dtype, p, dy_nhwc); },
      p.shared_bytes());
  ConvGemmShape s = g;
  void* args[] = {const_cast<CUtensorMap*>(&dy_map), const_cast<CUtensorMap*>(&x_map),
                  const_cast<CUtensorMap*>(&centre_map), &partials, &s};
  const gpu::Dim3 grid{static_cast<unsigned>(g.n / (64 * p.atoms)),
                       static_cast<unsigned>((g.m + p.bm - 1) / p.bm),
                       static_cast<unsigned>(p.splits)};
  k.kernel.launch(grid, {static_cast<unsigned>(p.threads()), 1, 1}, p.shared_bytes(), stream, args);
  const DeviceKernel& sum =
      device_kernel(sum_name(dtype), [&] { return conv_tma_wgrad_sum_source(dtype); });
  int m = g.m, n = g.n, khkw = g.khkw, splits = p.splits;
  const std::int64_t quads = static_cast<std::int64_t>(m) * n / 4;
  KILN_CHECK(n % 4 == 0 && quads < (std::int64_t{1} << 31),
             "conv2d_grad_weight (TMA): the sum of the splits takes dW in quads of a 32-bit count "
             "({} x {})",
             m, n);
  int groups = wgrad_sum_groups(quads, splits);
  const std::int64_t per = kSumThreads / groups;  // a block's quads
  void* sum_args[] = {&partials, &dw, &m, &n, &khkw, &splits, &groups};
  sum.kernel.launch({static_cast<unsigned>((quads + per - 1) / per), 1, 1}, {kSumThreads, 1, 1}, 0,
                    stream, sum_args);
}
}  // namespace

void conv_tma_grad_weight(DType dtype, const ConvGemmShape& g, const TmaWgradPlan& p,
                          const void* dy, const void* xt, void* partials, void* dw,
                          gpu::Stream stream, bool dy_nhwc, const void* x) {
  if (dtype == DType::f32) {
    KILN_CHECK(!dy_nhwc && x != nullptr && reinterpret_cast<std::uintptr_t>(partials) % 16 == 0,
               "conv2d_grad_weight (TMA, TF32): dy NCHW, x given and 16-byte aligned partials");
    const Tf32WgradMaps maps = tf32_wgrad_maps(g, p, dy, xt, x);
    wgrad_launch(dtype, g, p, maps.dy, maps.x3, maps.centre, partials, dw, stream, false);
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
  // (the halo form: a tap column's box, the step's rows and the two more its taps reach)
  const CUtensorMap x_map =
      p.halo > 0 ? image_map(dtype, g, xt, 64, images, box->first + 2, 1)
                 : image_map(dtype, g, xt, g.n / g.khkw, images, box->first, box->second);
  wgrad_launch(dtype, g, p, dy_map, x_map, x_map, partials, dw, stream, dy_nhwc);
}

namespace detail {
void set_conv_wgrad_halo_for_testing(std::optional<bool> on) { wgrad_halo_for_testing() = on; }
}  // namespace detail

}  // namespace kiln::cuda
