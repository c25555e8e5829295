// A fused group's view over blocked values (cpu_lanes.h): the iteration space [B, C, H, W]
// becomes [B, C / 16, H, W, 16], and every read and write gets strides over it.
#include "fusion/cpu_lanes.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>

#include "fusion/cpu_tiles.h"
#include "graph/kernels/block_transpose.h"

namespace kiln::cpu_tiles {
namespace {

// Strides over [B, C / 16, H, W, 16] that read what NCHW strides over [B, C, H, W] read:
// channel c = 16 * block + lane.
std::vector<std::int64_t> nchw_lanes(const Shape& shape, const std::vector<std::int64_t>& s) {
  std::vector<std::int64_t> at(4);
  for (std::size_t d = 0; d < 4; ++d) at[d] = shape[d] == 1 ? 0 : s[d];
  return {at[0], kLanes * at[1], at[2], at[3], at[1]};
}

// Input k's strides and offset over [B, C / 16, H, W, 16] when its value is blocked: where the
// group reads the value along its own axes (each stride 0 or the value's NCHW stride of that
// axis; a run of channels starting at a multiple of 16), else nullopt.
std::optional<std::pair<std::vector<std::int64_t>, std::int64_t>> blocked_lanes(const FusedGroup& g,
                                                                                std::size_t k) {
  const FusedInput& in = g.inputs[k];
  const Shape& v = in.type.shape;
  if (in.type.dtype != DType::f32 || v.rank() != 4 || v[1] % kLanes != 0) return std::nullopt;
  const std::vector<std::int64_t> dense = v.strides();
  std::vector<char> moves(4);
  for (std::size_t d = 0; d < 4; ++d) {
    moves[d] = g.shape[d] > 1 && in.strides[d] != 0;
    if (moves[d] && in.strides[d] != dense[d]) return std::nullopt;
  }
  const std::int64_t plane = v[2] * v[3];
  if (moves[1] && in.offset / plane % v[1] % kLanes != 0) return std::nullopt;
  const std::vector<std::int64_t> s = {moves[0] ? dense[0] : 0, moves[1] ? kLanes * plane : 0,
                                       moves[2] ? v[3] * kLanes : 0, moves[3] ? kLanes : 0,
                                       moves[1] ? 1 : 0};
  return std::pair{s, blocked_offset(in.offset, v[1], plane)};
}

bool blocked_bit(std::uint32_t bits, std::size_t i) { return (bits >> i & 1u) != 0; }

}  // namespace

bool lanes_group(const FusedGroup& g) {
  return !g.staged() && g.compute == DType::f32 && g.shape.rank() == 4 && g.shape[1] % kLanes == 0;
}

LaneView lane_view(const FusedGroup& g, std::uint32_t bits) {
  KILN_ASSERT(lanes_group(g), "fused group {}: blocked values, but it cannot run on them",
              g.summary());
  const Shape& s = g.shape;
  LaneView view{.group = g};
  FusedGroup& lanes = view.group;
  lanes.shape = Shape({s[0], s[1] / kLanes, s[2], s[3], kLanes});
  view.block = s[2] * s[3] * kLanes;
  for (std::size_t k = 0; k < g.inputs.size(); ++k) {
    FusedInput& in = lanes.inputs[k];
    if (k < kBlockedOutputs && blocked_bit(bits, k)) {
      const auto read = blocked_lanes(g, k);
      KILN_ASSERT(read.has_value(), "fused group {}: input {} given blocked, read across blocks",
                  g.summary(), k);
      std::tie(in.strides, in.offset) = *read;
    } else {
      in.strides = nchw_lanes(s, g.inputs[k].strides);
    }
  }
  for (std::size_t o = 0; o < g.outputs.size(); ++o)
    view.output_strides.push_back(o < 32 - kBlockedOutputs && blocked_bit(bits, kBlockedOutputs + o)
                                      ? std::vector<std::int64_t>{}
                                      : nchw_lanes(s, s.strides()));
  if (g.reduction) {
    view.reduced_strides = nchw_lanes(s, row_strides(s, g.reduction->axes));
    // The reductions keep their axes in the NCHW shape: the view's are recounted so that the
    // group's summary and checks still hold, but the evaluator writes by reduced_strides.
    std::vector<std::int64_t> axes;  // channel c is axes 1 and 4
    for (std::int64_t a : g.reduction->axes) {
      axes.push_back(a);
      if (a == 1) axes.push_back(4);
    }
    std::sort(axes.begin(), axes.end());
    lanes.reduction->axes = axes;
    for (FusedReduction& r : lanes.more_reductions) r.axes = axes;
  }
  return view;
}

TileSpans lane_spans(std::int64_t n, std::int64_t block) {
  const std::int64_t pixels = block / kLanes;
  const std::int64_t pieces = (block + kTile - 1) / kTile;
  return TileSpans{n, block, (pixels + pieces - 1) / pieces * kLanes};
}

LaneAccess lane_access(const Shape& lanes_shape, const std::vector<std::int64_t>& s) {
  const Shape& v = lanes_shape;
  const auto zero = [&](std::size_t d) { return v[d] == 1 || s[d] == 0; };
  const std::vector<std::int64_t> dense = v.strides();
  bool in_order = true;
  for (std::size_t d = 0; d < v.rank(); ++d) in_order = in_order && (v[d] == 1 || s[d] == dense[d]);
  if (in_order) return LaneAccess::in_place;
  if (zero(2) && zero(3)) return LaneAccess::pattern;
  const bool pixels_in_order = (v[3] == 1 || s[3] == 1) && (v[2] == 1 || s[2] == v[3]);
  return pixels_in_order && !zero(4) ? LaneAccess::planes : LaneAccess::strided;
}

LaneTileIo::LaneTileIo(const LaneView& view, std::span<const Tensor> inputs,
                       std::span<Tensor> outputs)
    : view_(view), cursors_(view.output_strides.size()), pattern_at_(inputs.size(), {-1, 0}) {
  const FusedGroup& g = view.group;
  for (std::size_t k = 0; k < g.inputs.size(); ++k) {
    const FusedInput& in = g.inputs[k];
    in_.push_back(in.contiguous(g.shape) || in.scalar() ? LaneAccess::in_place
                                                        : lane_access(g.shape, in.strides));
    in_data_.push_back(inputs[k].data<float>() + in.offset);
  }
  for (std::size_t o = 0; o < g.outputs.size(); ++o) {
    const std::vector<std::int64_t>& s = view.output_strides[o];
    out_.push_back(s.empty() ? LaneAccess::in_place : lane_access(g.shape, s));
    out_walks_.emplace_back(g.shape, s.empty() ? g.shape.strides() : s);
    out_data_.push_back(outputs[o].data<float>());
  }
}

const float* LaneTileIo::read(std::size_t k, std::int64_t start, std::int64_t count, float* buf) {
  const FusedGroup& g = view_.group;
  const std::vector<std::int64_t>& s = g.inputs[k].strides;
  const LaneTile tile = lane_tile(view_.block, start, count);
  if (in_[k] == LaneAccess::planes) {
    kernels::planes_to_lanes(in_data_[k] + tile.at(s, g.shape[1], g.shape[3]), s[4], tile.pixels,
                             buf);
    return buf;
  }
  if (in_[k] != LaneAccess::pattern) return nullptr;
  // The same 16 values at every pixel of the block: gathered again only for a new block or a
  // longer tile.
  const std::int64_t at = tile.at(s, g.shape[1], 1);
  auto& [last, filled] = pattern_at_[k];
  if (last == at && filled >= count) return buf;
  for (std::int64_t l = 0; l < kLanes; ++l) buf[l] = in_data_[k][at + l * s[4]];
  for (std::int64_t i = kLanes; i < count; i += kLanes)
    std::memcpy(buf + i, buf, kLanes * sizeof(float));
  last = at;
  filled = count;
  return buf;
}

void LaneTileIo::write(std::size_t o, std::int64_t start, std::int64_t count, const float* tile) {
  const FusedGroup& g = view_.group;
  const std::vector<std::int64_t>& s = view_.output_strides[o];
  float* out = out_data_[o];
  if (out_[o] == LaneAccess::planes) {
    const LaneTile t = lane_tile(view_.block, start, count);
    kernels::lanes_to_planes(tile, t.pixels, out + t.at(s, g.shape[1], g.shape[3]), s[4]);
    return;
  }
  out_walks_[o].runs(
      start, count, cursors_[o],
      [&](std::int64_t pos, std::int64_t length, std::int64_t offset, std::int64_t step) {
        for (std::int64_t j = 0; j < length; ++j) out[offset + j * step] = tile[pos + j];
      });
}

std::int64_t LaneTileIo::reduced_at(std::int64_t start) const {
  const std::vector<std::int64_t>& out = view_.reduced_strides;
  if (out[2] != 0 || out[3] != 0) return -1;
  return lane_tile(view_.block, start, 0).at(out, view_.group.shape[1], 1);
}

bool lane_blocks_own_outputs(const LaneView& view) {
  const Shape& v = view.group.shape;
  const std::vector<std::int64_t>& out = view.reduced_strides;
  return (v[0] == 1 || out[0] != 0) && (v[1] == 1 || out[1] != 0) && out[2] == 0 && out[3] == 0 &&
         out[4] != 0;
}

const LaneView& lane_view_of(const FusedGroup& g, std::uint32_t bits) {
  LaneViewCache& cache = g.cpu_lane_views;
  const std::lock_guard lock(cache.mutex);
  for (const auto& [b, view] : cache.views)
    if (b == bits) return *view;
  cache.views.emplace_back(bits, std::make_shared<const LaneView>(lane_view(g, bits)));
  return *cache.views.back().second;
}

}  // namespace kiln::cpu_tiles

namespace kiln {

std::uint32_t FusedGroup::cpu_blocked(std::span<const TensorType> /*inputs*/) const {
  using namespace cpu_tiles;
  if (!lanes_group(*this) || any_channels_last()) return 0;
  std::uint32_t bits = 0;
  for (std::size_t k = 0; k < inputs.size() && k < kBlockedOutputs; ++k)
    if (blocked_lanes(*this, k)) bits |= 1u << k;
  for (std::size_t o = 0; o < outputs.size() && o < 32 - kBlockedOutputs; ++o)
    if (operand_dtype(outputs[o]) == DType::f32) bits |= 1u << (kBlockedOutputs + o);
  return bits;
}

}  // namespace kiln
