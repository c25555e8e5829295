// The TMA passes' plans (conv_tma.h), which need no GPU: the boxes a tile reads, the tiles and
// their forms, grad_weight's tiles and K splits.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cuda/conv_tma.h"
#include "core/env_switch.h"

namespace kiln::cuda {
namespace {

// grad_weight's K split by a model of its time, in microseconds: a block's stages fill the
// shared memory (or half of it: two blocks an SM, plan.per_sm), so `splits` splits of `tiles`
// tiles run in ceil(blocks / (SMs x per_sm)) waves of a split's steps, a block's K step of bm x
// 64 atoms x 64 multiplies at kSmFlopsPerUs, or half of it for a tile of one warpgroup (bm 64:
// alone it cannot keep the SM's tensor cores busy, resnet18's stage 1 at 250 TFLOP/s of bf16
// against 380-420 for the other stages' tiles of two, H200); each split adds its f32 partials,
// written and read back by the tap sum, at kBytesPerUs. (resnet18's stage-4 passes at b512,
// H100: a step of 128 x 256 took 1.2 us; the earlier rule, about one block an SM, gave them 144
// blocks, two waves of which the second kept 12 SMs busy.)
constexpr double kSmFlopsPerUs = 3.5e6, kBytesPerUs = 3.0e6;
double wgrad_time(std::int64_t tiles, std::int64_t steps, std::int64_t splits, int bm, int atoms,
                  int per_sm, std::int64_t m, std::int64_t n, int sms) {
  const std::int64_t per = (steps + splits - 1) / splits;
  const std::int64_t used = (steps + per - 1) / per;  // the splits that have steps
  const std::int64_t slots = static_cast<std::int64_t>(sms) * per_sm;
  const std::int64_t waves = (tiles * used + slots - 1) / slots;
  const double step = 2.0 * bm * 64 * atoms * 64 / (bm == 64 ? kSmFlopsPerUs / 2 : kSmFlopsPerUs);
  const double partials = 8.0 * static_cast<double>(m) * static_cast<double>(n) / kBytesPerUs;
  return static_cast<double>(waves * per) * step + static_cast<double>(used) * partials;
}

// K in `wanted` splits of whole steps (`step` pixels), none empty.
void set_splits(TmaWgradPlan& plan, std::int64_t steps, std::int64_t wanted, int step) {
  const std::int64_t per = (steps + wanted - 1) / wanted;
  plan.splits = static_cast<int>((steps + per - 1) / per);
  plan.chunk = static_cast<int>(per * step);
}

// The pass's tile (64 or 128 filters by the most atoms, 4, 3, 2 or 1, that divide N) and its K
// split (steps of `step` pixels: 64 16-bit or 32 f32 ones, a step of the same time at TF32's half
// rate) by wgrad_time.
TmaWgradPlan wgrad_split(const ConvGemmShape& g, int ar, int step, int sms, bool wide) {
  const int atoms = g.n / 64;
  const int na = atoms % 4 == 0 ? 4 : atoms % 3 == 0 ? 3 : atoms % 2 == 0 ? 2 : 1;
  TmaWgradPlan plan = conv_tma_wgrad_tile_of(g.m >= 128 ? 128 : 64, na, ar, wide);
  const int bm = plan.bm;
  const std::int64_t tiles = static_cast<std::int64_t>((g.m + bm - 1) / bm) * (atoms / na);
  const std::int64_t slots = static_cast<std::int64_t>(sms) * plan.per_sm;
  const std::int64_t steps = (static_cast<std::int64_t>(g.k) + step - 1) / step;
  // The quickest split by wgrad_time, at least 4 steps a split (the fewest splits of a tie);
  // KILN_CONV_WGRAD_WAVES=0: the earlier rule, about a block an SM (for measuring).
  static const bool by_waves = env_switch_on("KILN_CONV_WGRAD_WAVES");
  std::int64_t wanted = by_waves ? 1
                                 : std::clamp<std::int64_t>((slots + tiles / 2) / tiles, 1,
                                                            std::max<std::int64_t>(1, steps / 4));
  double best = wgrad_time(tiles, steps, 1, bm, na, plan.per_sm, g.m, g.n, sms);
  for (std::int64_t s = 2; by_waves && s <= std::min<std::int64_t>(steps / 4, 4 * slots); ++s) {
    const double t = wgrad_time(tiles, steps, s, bm, na, plan.per_sm, g.m, g.n, sms);
    if (t < best) {
      best = t;
      wanted = s;
    }
  }
  set_splits(plan, steps, wanted, step);
  return plan;
}
}  // namespace

std::optional<std::pair<int, int>> conv_tma_box(const ConvGemmShape& g, int bn) {
  if (g.s_w <= 0 || g.s_hw % g.s_w != 0) return std::nullopt;
  const int s_h = g.s_hw / g.s_w;
  if (g.s_w * std::max(g.stride, 1) > 256 || bn % g.s_w != 0) return std::nullopt;
  const int rows = bn / g.s_w;
  if (rows <= s_h)
    return s_h % rows == 0 && rows * g.stride <= 256 ? std::optional(std::pair(rows, 1))
                                                     : std::nullopt;
  if (bn % g.s_hw != 0 || bn / g.s_hw > 256 || s_h * g.stride > 256) return std::nullopt;
  return std::pair(s_h, bn / g.s_hw);
}

std::optional<TmaTile> conv_tma_halo_tile(const ConvGemmShape& g) {
  constexpr int bn = 128;
  if (g.stride != 1 || g.khkw == 0 || g.k != 64 * g.khkw || g.m > 64 || g.m == 0 || g.n == 0 ||
      g.kw > kHaloMaxTapsW || g.s_w % 8 != 0)
    return std::nullopt;
  const std::optional<std::pair<int, int>> box = conv_tma_box(g, bn);
  const int taps_h = g.khkw / g.kw;
  if (!box || box->second != 1 || box->first + taps_h - 1 > 256) return std::nullopt;
  // the filter, two teams' boxes of rows, 1 KiB to align them (the barriers are static), the
  // eight consumer warps' staging tiles
  TmaTile tile = conv_tma_tile_of(64, bn, 2);
  const std::size_t bytes = 1024 + static_cast<std::size_t>(g.khkw) * 64 * 128 +
                            2 * static_cast<std::size_t>(g.kw) * (box->first + taps_h - 1) *
                                static_cast<std::size_t>(g.s_w) * 128 +
                            tile.staging_bytes();
  if (bytes > 227 * 1024 - 256) return std::nullopt;
  tile.stages = 2;
  tile.halo_bytes = bytes;
  return tile;
}

// The stage-4 passes of resnet18 at b128 (512 filters x 2048 pixels, K 4608: 64 tiles of
// 128 x 128 on 132 SMs) ran 46-58 us a pass with half the SMs idle.
int conv_tma_split_of(int bm, std::int64_t tiles, int steps, int sms) {
  return bm == 128 && 2 * tiles <= sms && steps >= 16 ? 2 : 1;
}

TmaTile conv_tma_tile_of(int bm, int bn, int teams, int split) {
  if (split == 2) {
    TmaTile t = conv_tma_tile_of(bm, bn, 1);
    t.split = 2;
    return t;
  }
  const std::size_t stage = static_cast<std::size_t>(bm + bn) * 128 + 16;
  const std::size_t staging = TmaTile{bm, bn, 1, teams}.staging_bytes();
  if (teams == 2)
    return {bm, bn,
            static_cast<int>(std::min<std::size_t>(8, (227 * 1024 - 1024 - 16 - staging) / stage)),
            2};
  // One warpgroup's tiles (bm 64) keep two blocks an SM, so that one's loads and stores overlap
  // the other's multiplies (stage-1 forward of resnet18 at b128: 64x256 in 5 stages 53.9 us,
  // 64x128 in 4 stages 43.0 us, ncu on the H200).
  const std::size_t room = (bm == 64 ? (227 * 1024) / 2 - 1024 : 227 * 1024 - 1024) - staging;
  return {bm, bn, static_cast<int>(std::min<std::size_t>(6, room / stage)), 1};
}

std::optional<TmaWgradPlan> conv_tma_wgrad_halo_plan_of(const ConvGemmShape& g, int sms,
                                                        bool wide) {
  if (g.stride != 1 || g.khkw != 9 || g.kw != 3 || g.n != 9 * 64 || g.m == 0 || g.m > 65535 ||
      g.s_w <= 0 || g.s_w % 8 != 0 || 64 % g.s_w != 0 || g.s_hw % 64 != 0 || g.k % 64 != 0)
    return std::nullopt;
  TmaWgradPlan plan{64, 9, 0, 64, wide, 1, 0};
  plan.halo = g.s_w;
  plan.stages =
      static_cast<int>(std::min<std::size_t>(4, (227 * 1024 - 1024) / (plan.stage_bytes() + 16)));
  if (plan.stages < 3) return std::nullopt;
  // one wave of the SMs: a block each, its split at least 4 steps
  const std::int64_t tiles = (g.m + 63) / 64, steps = g.k / 64;
  set_splits(plan, steps,
             std::clamp<std::int64_t>(sms / tiles, 1, std::max<std::int64_t>(1, steps / 4)), 64);
  return plan;
}

bool conv_tma_wgrad_halo_pays(const ConvGemmShape& g, int sms) {
  const std::int64_t tiles = (g.m + 63) / 64, steps = g.k / 64;
  return tiles * steps >= 32 * static_cast<std::int64_t>(std::max(sms, 1));
}

std::optional<TmaWgradPlan> conv_tma_wgrad_plan_of(const ConvGemmShape& g, int max_stride, int sms,
                                                   bool wide, bool halo) {
  if (halo)
    if (std::optional<TmaWgradPlan> plan = conv_tma_wgrad_halo_plan_of(g, sms, wide)) return plan;
  if (g.stride < 1 || g.stride > max_stride || g.khkw == 0 || g.m == 0 || g.n == 0 || g.k == 0 ||
      g.n % g.khkw != 0 || g.n / g.khkw % 64 != 0 || g.khkw > 64 || g.m > 65535)
    return std::nullopt;
  // A K step is 64 pixels: B's box is conv_tma_box's of a 64-pixel tile, A's rows the step's
  // pixels of one image (64, or a whole image of 32 or 16: a row of 128, 64 or 32 bytes).
  const int ar = std::min(64, g.s_hw);
  if (!conv_tma_box(g, 64) || ar % 16 != 0) return std::nullopt;
  return wgrad_split(g, ar, 64, sms, wide);
}

std::optional<TmaWgradPlan> conv_tma_tf32_wgrad_plan_of(const ConvGemmShape& g, int sms,
                                                        bool wide) {
  // whole images of 16 or 8 pixels a block of B's rows (stride 1), or runs of an output row
  const bool images = g.stride == 1 && (g.s_hw == 16 || g.s_hw == 8) && g.s_w > 0 &&
                      g.s_w % 4 == 0 && g.s_hw % g.s_w == 0;
  if (g.stride < 1 || g.stride > 2 || g.khkw == 0 || g.m == 0 || g.n == 0 || g.k == 0 ||
      g.n % g.khkw != 0 || g.n / g.khkw % 64 != 0 || g.khkw > 64 || g.m > 65535 || g.s_w <= 0 ||
      (!images && (g.s_hw % 32 != 0 || (g.s_w % 32 != 0 && (32 % g.s_w != 0 || g.s_w < 8)))))
    return std::nullopt;
  // (the tap columns' quads a 32-bit count: kernels/tap_expand.cuh)
  const std::int64_t x3 =
      std::int64_t{g.k} / g.s_hw * (g.n / g.khkw) * g.kw * tf32_tap_rows(g) * g.s_w;  // (at most)
  if (x3 / 4 >= (std::int64_t{1} << 31)) return std::nullopt;
  TmaWgradPlan plan = wgrad_split(g, std::min(32, g.s_hw), 32, sms, wide);
  plan.br = images ? g.s_hw : std::min(32, g.s_w);
  return plan;
}

int tf32_tap_columns(const ConvGemmShape& g) { return tf32_centre_from_x(g) ? g.kw - 1 : g.kw; }

int tf32_tap_rows(const ConvGemmShape& g) { return g.s_hw < 32 ? g.img_h + 2 * g.pad_h : g.img_h; }

TmaWgradPlan conv_tma_wgrad_tile_of(int bm, int atoms, int ar, bool wide) {
  static const bool two_a_sm = env_switch_on("KILN_CONV_WGRAD_TWO_A_SM");
  const int stage = (bm + 64 * atoms) * 128 + 16;
  const int half = (227 * 1024) / 2 - 1024;  // (the forward's tiles of bm 64 likewise)
  if (two_a_sm && bm == 64 && half / stage >= 3) {
    TmaWgradPlan plan{bm, atoms, std::min(4, half / stage), ar, wide, 1, 0};
    plan.per_sm = 2;
    return plan;
  }
  return {bm, atoms, std::min(8, (227 * 1024 - 1024) / stage), ar, wide, 1, 0};
}

}  // namespace kiln::cuda
