// The launches of the tensor-core convolution passes (conv_mma.h, kernels/conv_mma*.cuh).
#include "backends/cuda/conv_mma.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "backends/cuda/conv_passes.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/conv_tuning.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/env_switch.h"
#include "core/error.h"

namespace kiln::cuda {

namespace {
bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
constexpr std::int64_t kStep = 32;           // pixels per K step of the weight gradient
constexpr std::int64_t kTargetBlocks = 528;  // four per SM of an H100/H200
constexpr std::int64_t kMinSteps = 8;        // K steps per split at least
// A block's share of a weight copy: at most 64 columns of a row (a [512, 512, 3, 3] copy in
// 4096 blocks; one block a row, 512 of them, left it latency-bound at 15 us), at most 32 KiB.
constexpr std::int64_t kWeightChunkColumns = 64, kWeightChunkBytes = 32 * 1024;
}  // namespace

void conv_mma_forward(DType dtype, const ConvGemmShape& shape, const void* w, const void* x,
                      void* y, gpu::Stream stream, ConvMmaKind kind) {
  if (shape.m == 0 || shape.n == 0) return;
  const bool vec_a = conv_mma_vector_weights(shape.k) && aligned16(w);
  const int bm = conv_mma_tile_m(shape.m, shape.n);
  const DeviceKernel& k = device_kernel(conv_mma_name(dtype, bm, vec_a, kind),
                                        [&] { return conv_mma_source(dtype, bm, vec_a, kind); });
  ConvGemmShape s = shape;
  void* args[] = {&w, &x, &y, &s};
  const gpu::Dim3 grid{static_cast<unsigned>((shape.n + 63) / 64),
                       static_cast<unsigned>((shape.m + bm - 1) / bm), 1};
  k.kernel.launch(grid, {static_cast<unsigned>(2 * bm), 1, 1}, 0, stream, args);
}

std::vector<std::int64_t> conv_filter_taps(const ConvClasses* classes, std::int64_t khkw) {
  std::vector<std::int64_t> taps(static_cast<std::size_t>(khkw));
  for (std::int64_t t = 0; t < khkw; ++t)
    taps[static_cast<std::size_t>(t)] =
        classes ? class_source_tap(*classes, static_cast<int>(t)) : t;
  return taps;
}

void nhwc_weights(DType dtype, std::span<const FilterLayoutJob> jobs, std::int64_t khkw,
                  bool channels_major, std::span<const std::int64_t> taps, gpu::Stream stream) {
  const std::size_t bytes = dtype_size(dtype);
  const DeviceKernel& k =
      device_kernel(nhwc_weights_name(channels_major, bytes),
                    [channels_major, bytes] { return nhwc_weights_source(channels_major, bytes); });
  KILN_CHECK(khkw >= 1 && khkw <= kMaxFilterTaps &&
                 khkw * static_cast<std::int64_t>(bytes) <= kWeightChunkBytes &&
                 static_cast<std::int64_t>(taps.size()) == khkw,
             "conv: a filter of {} taps ({} ordered) is too large for the channels-last copy", khkw,
             taps.size());
  FilterTaps order{};
  for (std::int64_t t = 0; t < khkw; ++t) {
    const std::int64_t source = taps[static_cast<std::size_t>(t)];
    KILN_CHECK(source >= 0 && source < khkw, "conv: tap {} of a filter of {}", source, khkw);
    order.source[t] = static_cast<int>(source);
  }
  // A launch for each kMaxFilterCopies filters; a is [rows][khkw][cols], a block moves a chunk
  // of one row's columns through shared memory.
  for (std::size_t begin = 0; begin < jobs.size(); begin += kMaxFilterCopies) {
    FilterCopies copies{};
    copies.khkw = static_cast<int>(khkw);
    std::int64_t blocks = 0, widest = 0;
    for (std::size_t i = begin; i < std::min(jobs.size(), begin + kMaxFilterCopies); ++i) {
      const FilterLayoutJob& job = jobs[i];
      const std::int64_t rows = channels_major ? job.in_channels : job.out_channels;
      const std::int64_t cols = channels_major ? job.out_channels : job.in_channels;
      if (rows == 0 || cols == 0) continue;
      const std::int64_t chunk =
          std::clamp<std::int64_t>(kWeightChunkBytes / (khkw * static_cast<std::int64_t>(bytes)), 1,
                                   std::min(cols, kWeightChunkColumns));
      KILN_CHECK(rows * cols * khkw < (std::int64_t{1} << 31),
                 "conv: weights [{}, {}, {}] are too large for the channels-last copy",
                 job.out_channels, job.in_channels, khkw);
      copies.copy[copies.count++] = {job.w,
                                     job.a,
                                     static_cast<int>(rows),
                                     static_cast<int>(cols),
                                     static_cast<int>(chunk),
                                     static_cast<int>(blocks)};
      blocks += rows * ((cols + chunk - 1) / chunk);
      widest = std::max(widest, chunk);
    }
    KILN_CHECK(blocks < (std::int64_t{1} << 31), "conv: {} blocks of filter copies", blocks);
    if (blocks == 0) continue;
    void* args[] = {&copies, &order};
    k.kernel.launch({static_cast<unsigned>(blocks), 1, 1}, {256, 1, 1},
                    static_cast<std::size_t>(widest * khkw) * bytes, stream, args);
  }
}

namespace {

// KILN_NHWC_TILE's plan, if set.
std::optional<NhwcPlan> plan_from_environment() {
  const char* v = std::getenv("KILN_NHWC_TILE");
  if (v == nullptr || *v == 0) return std::nullopt;
  NhwcPlan p;
  NhwcTile& t = p.tile;
  long long splits = 1;
  int wgmma = 0;
  const int read = std::sscanf(v, "%d,%d,%d,%d,%d,%d,%lld,%d", &t.bm, &t.bn, &t.wm, &t.wn,
                               &t.pieces, &t.stages, &splits, &wgmma);
  t.wgmma = wgmma != 0;
  KILN_CHECK(read >= 6 && nhwc_tile_valid(t) && splits >= 1 && (!t.wgmma || splits == 1),
             "KILN_NHWC_TILE='{}': expected bm,bn,wm,wn,pieces,stages[,splits[,wgmma]] of a valid "
             "tile (wgmma 1: a tile of conv_wgmma.cuh, not split)",
             v);
  p.splits = splits;
  return p;
}

// The forced plan: KILN_NHWC_TILE's until a test sets another.
std::optional<NhwcPlan>& forced_nhwc_plan() {
  static std::optional<NhwcPlan> forced = plan_from_environment();
  return forced;
}

// The K ranges of `wanted` splits of a K of `steps` steps of `step` rows.
NhwcPlan split_plan(NhwcTile tile, std::int64_t wanted, std::int64_t steps, std::int64_t step) {
  const std::int64_t per =
      (steps + std::max<std::int64_t>(wanted, 1) - 1) / std::max<std::int64_t>(wanted, 1);
  return {tile, (steps + per - 1) / per, per * step};
}

// The GEMM of `plan` (its split partials into `target` when it splits).
void launch_nhwc(DType dtype, const ConvGemmShape& shape, const NhwcPlan& plan, const void* a,
                 const void* xt, void* target, gpu::Stream stream, bool dilated) {
  const NhwcTile tile = plan.tile;
  const bool split = plan.splits > 1;
  const DeviceKernel& k = device_kernel(
      conv_nhwc_name(dtype, tile, dilated, split),
      [&] { return conv_nhwc_source(dtype, tile, dilated, split); }, tile.shared_bytes());
  ConvGemmShape s = shape;
  s.k_chunk = static_cast<int>(plan.chunk);
  void* args[] = {&a, &xt, &target, &s};
  const gpu::Dim3 grid{static_cast<unsigned>((shape.n + tile.bn - 1) / tile.bn),
                       static_cast<unsigned>((shape.m + tile.bm - 1) / tile.bm),
                       static_cast<unsigned>(plan.splits)};
  k.kernel.launch(grid, {static_cast<unsigned>(tile.threads()), 1, 1}, tile.shared_bytes(), stream,
                  args);
}

}  // namespace

namespace {
bool& wgmma_allowed() {
  static bool allowed = env_switch_on("KILN_WGMMA");
  return allowed;
}
bool wgmma_device() {
  static const bool sm90 = [] {  // the device here, or the one dump assumes without one
    const std::optional<gpu::PlanTarget> target = gpu::plan_target();
    return target && target->sm == 90;
  }();
  return sm90 && wgmma_allowed();
}
}  // namespace

bool conv_wgmma_enabled(DType dtype) {
  return wgmma_device() && (is_low_precision(dtype) || dtype == DType::f32);
}

NhwcPlan conv_nhwc_plan(DType dtype, const ConvGemmShape& shape, bool dilated, bool may_time) {
  const std::int64_t m = shape.m, n = shape.n, k = shape.k;
  auto blocks = [&](NhwcTile t) { return ((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn); };
  auto steps_of = [&](NhwcTile t, std::int64_t& step) {
    step = t.pieces * static_cast<std::int64_t>(16 / dtype_size(dtype));
    return std::max<std::int64_t>(1, (k + step - 1) / step);
  };
  std::int64_t step = 0;
  const std::optional<NhwcPlan> forced = forced_nhwc_plan();
  if (forced && (!forced->tile.wgmma || conv_wgmma_enabled(dtype))) {  // wgmma: where it runs
    const std::int64_t steps = steps_of(forced->tile, step);
    return split_plan(forced->tile, std::min(forced->splits, steps), steps, step);
  }
  NhwcTile tile = m >= 128                       ? kNhwcTiles[0]
                  : blocks(kNhwcTiles[1]) >= 132 ? kNhwcTiles[1]
                                                 : kNhwcTiles[2];
  if (conv_wgmma_enabled(dtype))
    tile = m >= 128 && blocks(kWgmmaTiles[0]) >= 132 ? kWgmmaTiles[0]
           : blocks(kWgmmaTiles[1]) >= 132           ? kWgmmaTiles[1]
                                                     : kWgmmaTiles[2];
  if (const std::optional<NhwcTile> tuned = tuned_nhwc_tile(dtype, shape, dilated, may_time))
    tile = *tuned;
  return split_plan(tile, 1, steps_of(tile, step), step);
}

void conv_nhwc_launch(DType dtype, const ConvGemmShape& shape, NhwcTile tile, const void* a,
                      const void* xt, void* y, gpu::Stream stream, bool dilated) {
  launch_nhwc(dtype, shape, NhwcPlan{tile, 1, shape.k}, a, xt, y, stream, dilated);
}

void conv_nhwc_forward(DType dtype, const ConvGemmShape& shape, const void* a, const void* xt,
                       void* y, void* partials, gpu::Stream stream, bool dilated, float* moments,
                       bool y_channels_last) {
  if (shape.m == 0 || shape.n == 0) return;
  const auto per_piece = static_cast<int>(16 / dtype_size(dtype));
  KILN_CHECK(aligned16(a) && aligned16(xt) && shape.k % per_piece == 0,
             "conv: the channels-last pass needs 16-byte aligned operands and K % {} == 0 (K {})",
             per_piece, shape.k);
  if (const std::optional<TmaTile> tma = conv_tma_tile(dtype, shape, dilated, moments != nullptr)) {
    conv_tma_forward(dtype, shape, *tma, a, xt, y, stream, moments, nullptr, y_channels_last);
    return;
  }
  KILN_CHECK(moments == nullptr, "conv: run moments asked of a pass that is not the TMA pass");
  KILN_CHECK(!y_channels_last,
             "conv: a channels-last output asked of a pass that is not the TMA "
             "pass (M {}, N {}, K {})",
             shape.m, shape.n, shape.k);
  const NhwcPlan plan = conv_nhwc_plan(dtype, shape, dilated, false);
  const bool split = plan.splits > 1;
  KILN_CHECK(
      !split || (partials != nullptr && reinterpret_cast<std::uintptr_t>(partials) % 256 == 0),
      "conv: the channels-last pass's split-K partials are missing or not 256-byte aligned");
  launch_nhwc(dtype, shape, plan, a, xt, split ? partials : y, stream, dilated);
  if (split)
    conv_detail::splitk_sum(dtype, partials, y, shape.m * static_cast<std::int64_t>(shape.n),
                            plan.splits, stream);
}

namespace {
std::optional<WgradTile>& forced_wgrad_tile() {
  static std::optional<WgradTile> forced;
  return forced;
}
bool& wgrad_runs_allowed() {
  static bool allowed = env_switch_on("KILN_WGRAD_RUNS");
  return allowed;
}
}  // namespace

bool conv_mma_vector_x(const ConvGemmShape& shape) {
  return wgrad_runs_allowed() && shape.stride == 1 && shape.img_w % 8 == 0 && shape.s_w % 8 == 0;
}

namespace detail {
void set_wgrad_runs_for_testing(bool allowed) { wgrad_runs_allowed() = allowed; }
void force_wgrad_tile_for_testing(std::optional<WgradTile> tile) {
  KILN_CHECK(!tile || wgrad_tile_valid(*tile), "force_wgrad_tile_for_testing: invalid tile");
  forced_wgrad_tile() = tile;
}
void set_wgmma_for_testing(bool allowed) { wgmma_allowed() = allowed; }
void force_nhwc_plan_for_testing(std::optional<NhwcPlan> plan) {
  KILN_CHECK(!plan || nhwc_tile_valid(plan->tile), "force_nhwc_plan_for_testing: invalid tile");
  forced_nhwc_plan() = plan;
}
}  // namespace detail

bool conv_tiles_forced() {
  return forced_nhwc_plan().has_value() || forced_wgrad_tile().has_value();
}

MmaSplits conv_mma_wgrad_splits(std::int64_t m, std::int64_t n, std::int64_t k,
                                std::size_t scratch_bytes) {
  const std::int64_t bm = conv_mma_wgrad_tile_m(m);
  const std::int64_t tiles = ((m + bm - 1) / bm) * ((n + 63) / 64);
  const std::int64_t steps = std::max<std::int64_t>(1, (k + kStep - 1) / kStep);
  std::int64_t wanted = std::clamp<std::int64_t>((kTargetBlocks + tiles - 1) / tiles, 1,
                                                 std::max<std::int64_t>(1, steps / kMinSteps));
  const auto per_split = static_cast<std::size_t>(m * n) * 4;
  if (wanted > 1 && per_split > 0)
    wanted = std::min<std::int64_t>(wanted, static_cast<std::int64_t>(scratch_bytes / per_split));
  wanted = std::clamp<std::int64_t>(wanted, 1, 65535);
  const std::int64_t per = (steps + wanted - 1) / wanted;
  return {(steps + per - 1) / per, per * kStep};
}

void conv_mma_grad_weight(DType dtype, const ConvGemmShape& shape, const MmaSplits& splits,
                          const void* dy, const void* x, void* dw, void* partials,
                          gpu::Stream stream) {
  if (shape.m == 0 || shape.n == 0) return;
  const bool split = splits.count > 1;
  KILN_CHECK(
      !split || (partials != nullptr && reinterpret_cast<std::uintptr_t>(partials) % 256 == 0),
      "conv2d_grad_weight: the split-K scratch is missing or not 256-byte aligned");
  KILN_CHECK(shape.k_chunk == splits.chunk, "conv2d_grad_weight: K chunk {} for splits of {}",
             shape.k_chunk, splits.chunk);
  conv_mma_wgrad_launch(dtype, shape, splits, conv_mma_wgrad_tile(dtype, shape, splits, false), dy,
                        x, split ? partials : dw, stream);
}

void conv_mma_wgrad_launch(DType dtype, const ConvGemmShape& shape, const MmaSplits& splits,
                           WgradTile tile, const void* dy, const void* x, void* target,
                           gpu::Stream stream) {
  const bool split = splits.count > 1;
  const bool vec_a = conv_mma_vector_dy(shape.s_hw) && aligned16(dy);
  const bool vec_b = conv_mma_vector_x(shape) && aligned16(x);
  const DeviceKernel& k = device_kernel(
      conv_mma_wgrad_name(dtype, tile, vec_a, split, vec_b),
      [&] { return conv_mma_wgrad_source(dtype, tile, vec_a, split, vec_b); }, tile.shared_bytes());
  ConvGemmShape s = shape;
  void* args[] = {&dy, &x, &target, &s};
  const gpu::Dim3 grid{static_cast<unsigned>((shape.n + tile.bn - 1) / tile.bn),
                       static_cast<unsigned>((shape.m + tile.bm - 1) / tile.bm),
                       static_cast<unsigned>(splits.count)};
  k.kernel.launch(grid, {static_cast<unsigned>(tile.threads()), 1, 1}, tile.shared_bytes(), stream,
                  args);
}

WgradTile conv_mma_wgrad_tile(DType dtype, const ConvGemmShape& shape, const MmaSplits& splits,
                              bool may_time) {
  const std::optional<WgradTile> forced = forced_wgrad_tile();
  if (forced && (!forced->wgmma || conv_wgmma_enabled(dtype)))  // wgmma: sm_90
    return *forced;
  if (const std::optional<WgradTile> tuned = tuned_wgrad_tile(dtype, shape, splits, may_time))
    return *tuned;
  return conv_wgmma_enabled(dtype) ? conv_wgmma_wgrad_default_tile(shape.m)
                                   : conv_mma_wgrad_default_tile(shape.m);
}

}  // namespace kiln::cuda
