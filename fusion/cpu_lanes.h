// Fused groups over values stored in oneDNN's 16-channel blocked layout (aBcd16b:
// [B][C / 16][H][W][16], the layout its convolutions run in), so that a value between a
// convolution and a group, or between two groups, needs no reorder. Such a group runs over
// the iteration space [B, C / 16, H, W, 16] instead of [B, C, H, W]: a blocked value is read
// and written in place, in its own order (the 16 channels of a pixel side by side); a value
// kept in NCHW through strides over the new space (LaneTileIo: a per-channel value as a
// pattern of 16 that repeats over the pixels of a block, gathered once a block; an image's
// 16 planes through transposes); a reduction that keeps the channels folds each tile into 16
// accumulators, one per channel of the block.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "fusion/cpu_tile_spans.h"
#include "fusion/fused_group.h"
#include "fusion/strided_walk.h"
#include "graph/kernels/block_transpose.h"

namespace kiln::cpu_tiles {

constexpr std::int64_t kLanes = kernels::kBlockLanes;  // channels in a block

// Where element `nchw` of a [B, C, H, W] value (its NCHW offset) lives when it is blocked.
inline std::int64_t blocked_offset(std::int64_t nchw, std::int64_t channels, std::int64_t plane) {
  const std::int64_t image_channel = nchw / plane, at = nchw % plane;
  const std::int64_t image = image_channel / channels, channel = image_channel % channels;
  return ((image * (channels / kLanes) + channel / kLanes) * plane + at) * kLanes +
         channel % kLanes;
}

// Whether g can run over blocked values: an f32 group over [B, C, H, W], C a multiple of 16,
// that is not staged.
bool lanes_group(const FusedGroup& g);

// The group as it runs with the values of `bits` (KernelCall::blocked) blocked.
struct LaneView {
  // g over [B, C / 16, H, W, 16], each input's strides and offset into its stored layout.
  FusedGroup group;
  // Per output of the group: empty where it is blocked (written in the iteration order), else
  // its NCHW strides over the new shape.
  std::vector<std::vector<std::int64_t>> output_strides;
  // Strides over the new shape at which the reductions' outputs (NCHW) are written.
  std::vector<std::int64_t> reduced_strides;
  std::int64_t block = 0;  // elements of one image's block of 16 channels: H * W * 16
};
LaneView lane_view(const FusedGroup& g, std::uint32_t bits);

// The tiles of a lane view of n elements: pieces of each block (`block` elements), every piece
// a whole number of pixels (16 elements each), so that a per-channel value is one pattern
// over a tile and a reduction over the pixels folds a tile into 16 lanes.
TileSpans lane_spans(std::int64_t n, std::int64_t block);

// How a lane view reads an input or writes an output: in place (blocked, or any value read
// in order), as one pattern of 16 values over the tile (a per-channel value: the same at every
// pixel of a block), as 16 planes of pixels transposed to and from the tile (an NCHW image),
// or element by element through its strides.
enum class LaneAccess { in_place, pattern, planes, strided };
LaneAccess lane_access(const Shape& lanes_shape, const std::vector<std::int64_t>& strides);

// Where a tile of a lane view lies (lane_spans: in one block): the block (image * C / 16 +
// block of channels), its first pixel and its pixels.
struct LaneTile {
  std::int64_t block, pixel, pixels;
  // The offset, at strides s over the view, of the tile's first pixel's channel 16 * block.
  std::int64_t at(const std::vector<std::int64_t>& s, std::int64_t blocks_per_image,
                  std::int64_t width) const {
    return block / blocks_per_image * s[0] + block % blocks_per_image * s[1] +
           pixel / width * s[2] + pixel % width * s[3];
  }
};
inline LaneTile lane_tile(std::int64_t block, std::int64_t start, std::int64_t count) {
  return {start / block, start % block / kLanes, count / kLanes};
}

// A thread's reads and writes of a lane view's values where they are not in place (cpu_fused.cpp
// reads the rest itself), for tiles of lane_spans.
class LaneTileIo {
 public:
  LaneTileIo(const LaneView& view, std::span<const Tensor> inputs, std::span<Tensor> outputs);
  // Input k of the tile of `count` elements at `start`, gathered into buf (kTile floats) as a
  // pattern of 16 or from 16 planes; null where it is read in place or through its strides.
  const float* read(std::size_t k, std::int64_t start, std::int64_t count, float* buf);
  // Whether output o is NCHW (computed into a tile register and written by write).
  bool writes(std::size_t o) const { return out_[o] != LaneAccess::in_place; }
  void write(std::size_t o, std::int64_t start, std::int64_t count, const float* tile);
  // Where the reductions' outputs of the tile's 16 channels start, at reduced_lane_stride()
  // apart, where they keep no pixel axis (the tile folds into 16 lanes); else -1.
  std::int64_t reduced_at(std::int64_t start) const;
  std::int64_t reduced_lane_stride() const { return view_.reduced_strides[4]; }

 private:
  const LaneView& view_;
  std::vector<LaneAccess> in_, out_;
  std::vector<const float*> in_data_;
  std::vector<float*> out_data_;
  std::vector<StridedWalk> out_walks_;
  std::vector<StridedWalk::Cursor> cursors_;
  std::vector<std::pair<std::int64_t, std::int64_t>> pattern_at_;  // gathered from, length
};

// Whether each block of the view (16 channels of an image) owns its reductions' outputs: they
// keep the image and channel axes, and no pixel axis.
bool lane_blocks_own_outputs(const LaneView& view);

// The view of g for `bits`, made once (FusedGroup::cpu_lane_views keeps it).
const LaneView& lane_view_of(const FusedGroup& g, std::uint32_t bits);

}  // namespace kiln::cpu_tiles
