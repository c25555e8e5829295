// Fused groups over values stored in oneDNN's 16-channel blocked layout (aBcd16b:
// [B][C / 16][H][W][16], the layout its convolutions run in), so that a value between a
// convolution and a group needs no reorder to or from NCHW. A group whose tiles are whole
// image planes (one channel each, in the order of the NCHW tiles it would take anyway, so the
// results are the same bits) reads and writes such a value 16 channels of one image at a
// time, transposed between [plane][16] and [16][plane] in cache; any other group may gather
// a few of its elements (a per-channel slice).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "fusion/cpu_tiles.h"
#include "fusion/fused_group.h"

namespace kiln::cpu_tiles {

constexpr std::int64_t kBlock = 16;  // channels in a block

// Where element `nchw` of a [B, C, H, W] value (its NCHW offset) lives when it is blocked.
inline std::int64_t blocked_offset(std::int64_t nchw, std::int64_t channels, std::int64_t plane) {
  const std::int64_t image_channel = nchw / plane, at = nchw % plane;
  const std::int64_t image = image_channel / channels, channel = image_channel % channels;
  return ((image * (channels / kBlock) + channel / kBlock) * plane + at) * kBlock +
         channel % kBlock;
}

// How a group reads input k when that value is blocked: each tile's plane through the staged
// block (the input is the group's own shape, read in order), element by element at their
// blocked offsets (one value a tile where it is constant over each image plane and g runs on
// planes; else a few elements: a per-channel slice, batch norm's shift x[0, c, 0, 0]), or not
// at all. `planes`: g runs on image planes (blocked_tiles).
enum class BlockedRead { none, plane, gather };
BlockedRead blocked_read(const FusedGroup& g, std::size_t k, bool planes);

// Whether g can run on whole image planes, one channel a tile, in NCHW tile order: an f32
// group over [B, C, H, W], C a multiple of 16, planes of 64 to kTile elements, and where it
// reduces, planes are the tiles it takes anyway (the same folds in the same order).
bool blocked_tiles(const FusedGroup& g);

// One thread's staging of a group's blocked values (KernelCall::blocked): the tile's block of
// 16 planes of each plane-read input, transposed in when a tile enters a new block, and of
// each blocked output, transposed out (the channels this thread computed) when it leaves.
class BlockedStage {
 public:
  // `planes`: the group runs on image planes (blocked_tiles), else it only gathers.
  BlockedStage(const FusedGroup& g, std::uint32_t bits, bool planes, std::span<const Tensor> inputs,
               std::span<Tensor> outputs);
  // The tile of the plane starting at group element `start` begins.
  void enter(std::int64_t start);
  // The tile's outputs are written (its channel is done).
  void done() { last_ = channel_; }
  // Writes out what is staged (at the end of a thread's tiles).
  void finish();

  BlockedRead read(std::size_t k) const { return reads_[k]; }
  const float* plane(std::size_t k) const {
    return &planes_in_[static_cast<std::size_t>(slot_in_[k] + channel_ * plane_)];
  }
  // Input k's element at `nchw` (an NCHW offset into its value).
  const float* value(std::size_t k, std::int64_t nchw) const;
  float* output(std::size_t o) {  // null where output o is not blocked
    return slot_out_[o] < 0
               ? nullptr
               : &planes_out_[static_cast<std::size_t>(slot_out_[o] + channel_ * plane_)];
  }

 private:
  std::vector<BlockedRead> reads_;
  std::vector<const float*> input_data_;
  std::vector<std::pair<std::int64_t, std::int64_t>> input_shape_;  // channels, plane
  std::vector<float*> output_data_;
  std::vector<std::int64_t> slot_in_, slot_out_;  // offsets into the staging (-1: none)
  std::int64_t channels_, plane_;
  AlignedBuffer<float> planes_in_, planes_out_;
  std::int64_t block_ = -1;             // the block staged: image * C / 16 + channel / 16
  std::int64_t channel_ = 0;            // the tile's channel within it
  std::int64_t first_ = 0, last_ = -1;  // the channels of it computed here
};

// A block's 16 planes: from blocked [plane][16] into [16][plane], and channels [first, last]
// of [16][plane] back into blocked [plane][16] (the others left as they are).
void blocked_to_planes(const float* blocked, std::int64_t plane, float* planes);
void planes_to_blocked(const float* planes, std::int64_t plane, int first, int last,
                       float* blocked);

}  // namespace kiln::cpu_tiles
