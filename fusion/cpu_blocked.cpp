// Transposes between oneDNN's blocked planes and kiln's (cpu_blocked.h): 16 x 16 tiles
// through a local array, which GCC turns into vector permutes (0.06 ns an element from L1 on
// the build machine, against 0.2 for an element at a time).
#include "fusion/cpu_blocked.h"

#include <algorithm>

#include "fusion/cpu_tile_spans.h"
#include "fusion/cpu_tiles.h"

namespace kiln {
namespace cpu_tiles {

// Planes under 64 elements would be tiles too short for the per-tile work.
constexpr std::int64_t kMinBlockedPlane = 64;

bool blocked_tiles(const FusedGroup& g) {
  const Shape& s = g.shape;
  if (g.staged() || g.compute != DType::f32 || s.rank() != 4 || s[1] % kBlock != 0) return false;
  const std::int64_t plane = s[2] * s[3];
  if (plane < kMinBlockedPlane || plane > kTile) return false;
  if (!g.reduction) return true;
  const TileSpans spans = tile_spans(g);
  return !channel_tiles(g) && spans.run == plane && spans.piece == plane &&
         row_length(StridedWalk(s, row_strides(s, g.reduction->axes))) == 0;
}

// Gathered reads of a blocked value: at most this many distinct elements (a per-channel slice).
constexpr std::int64_t kMaxGathered = 4096;

BlockedRead blocked_read(const FusedGroup& g, std::size_t k, bool planes) {
  const FusedInput& in = g.inputs[k];
  const Shape& base = in.type.shape;
  if (in.type.dtype != DType::f32 || base.rank() != 4 || base[1] % kBlock != 0)
    return BlockedRead::none;
  if (planes && base == g.shape && in.offset == 0 && in.contiguous(g.shape))
    return BlockedRead::plane;
  const bool per_plane =
      planes && (g.shape[2] == 1 || in.strides[2] == 0) && (g.shape[3] == 1 || in.strides[3] == 0);
  return per_plane || in.elements_read(g.shape) <= kMaxGathered ? BlockedRead::gather
                                                                : BlockedRead::none;
}

BlockedStage::BlockedStage(const FusedGroup& g, std::uint32_t bits, bool planes,
                           std::span<const Tensor> inputs, std::span<Tensor> outputs)
    : channels_(planes ? g.shape[1] : 0),
      plane_(planes ? g.shape[2] * g.shape[3] : 0),
      planes_in_(0),
      planes_out_(0) {
  std::int64_t next = 0;
  for (std::size_t k = 0; k < g.inputs.size(); ++k) {
    const bool blocked = k < kBlockedOutputs && (bits >> k & 1u) != 0;
    reads_.push_back(blocked ? blocked_read(g, k, planes) : BlockedRead::none);
    input_data_.push_back(inputs[k].data<float>());
    const Shape& base = g.inputs[k].type.shape;
    input_shape_.push_back(blocked ? std::pair{base[1], base[2] * base[3]} : std::pair{0L, 0L});
    slot_in_.push_back(reads_.back() == BlockedRead::plane ? next : -1);
    if (reads_.back() == BlockedRead::plane) next += kBlock * plane_;
  }
  planes_in_ = AlignedBuffer<float>(static_cast<std::size_t>(next));
  next = 0;
  for (std::size_t o = 0; o < g.outputs.size(); ++o) {
    const bool blocked = (bits >> (kBlockedOutputs + o) & 1u) != 0;
    KILN_ASSERT(!blocked || planes, "fused group: a blocked output off image planes");
    output_data_.push_back(outputs[o].data<float>());
    slot_out_.push_back(blocked ? next : -1);
    if (blocked) next += kBlock * plane_;
  }
  planes_out_ = AlignedBuffer<float>(static_cast<std::size_t>(next));
}

void BlockedStage::enter(std::int64_t start) {
  if (plane_ == 0) return;  // gathers only: nothing staged
  const std::int64_t image_channel = start / plane_;
  const std::int64_t block = image_channel / kBlock;  // channels_ is a multiple of kBlock
  channel_ = image_channel % kBlock;
  if (block == block_) return;
  finish();
  block_ = block;
  first_ = channel_;
  last_ = channel_ - 1;
  for (std::size_t k = 0; k < reads_.size(); ++k)
    if (slot_in_[k] >= 0)
      blocked_to_planes(input_data_[k] + block * plane_ * kBlock, plane_,
                        &planes_in_[static_cast<std::size_t>(slot_in_[k])]);
}

void BlockedStage::finish() {
  if (block_ < 0 || last_ < first_) return;
  for (std::size_t o = 0; o < slot_out_.size(); ++o)
    if (slot_out_[o] >= 0)
      planes_to_blocked(&planes_out_[static_cast<std::size_t>(slot_out_[o])], plane_,
                        static_cast<int>(first_), static_cast<int>(last_),
                        output_data_[o] + block_ * plane_ * kBlock);
  last_ = first_ - 1;
}

const float* BlockedStage::value(std::size_t k, std::int64_t nchw) const {
  const auto [channels, plane] = input_shape_[k];
  return input_data_[k] + blocked_offset(nchw, channels, plane);
}

void blocked_to_planes(const float* blocked, std::int64_t plane, float* planes) {
  std::int64_t p0 = 0;
  for (; p0 + kBlock <= plane; p0 += kBlock) {
    float tile[kBlock][kBlock];
    for (std::int64_t p = 0; p < kBlock; ++p)
      for (std::int64_t c = 0; c < kBlock; ++c) tile[c][p] = blocked[(p0 + p) * kBlock + c];
    for (std::int64_t c = 0; c < kBlock; ++c)
      for (std::int64_t p = 0; p < kBlock; ++p) planes[c * plane + p0 + p] = tile[c][p];
  }
  for (; p0 < plane; ++p0)
    for (std::int64_t c = 0; c < kBlock; ++c) planes[c * plane + p0] = blocked[p0 * kBlock + c];
}

void planes_to_blocked(const float* planes, std::int64_t plane, int first, int last,
                       float* blocked) {
  if (first != 0 || last != kBlock - 1) {  // part of a block (where threads' tiles meet)
    for (std::int64_t p = 0; p < plane; ++p)
      for (int c = first; c <= last; ++c) blocked[p * kBlock + c] = planes[c * plane + p];
    return;
  }
  std::int64_t p0 = 0;
  for (; p0 + kBlock <= plane; p0 += kBlock) {
    float tile[kBlock][kBlock];  // [c][p] both ways: with [p][c] here GCC's code was 2.5x slower
    for (std::int64_t c = 0; c < kBlock; ++c)
      for (std::int64_t p = 0; p < kBlock; ++p) tile[c][p] = planes[c * plane + p0 + p];
    for (std::int64_t p = 0; p < kBlock; ++p)
      for (std::int64_t c = 0; c < kBlock; ++c) blocked[(p0 + p) * kBlock + c] = tile[c][p];
  }
  for (; p0 < plane; ++p0)
    for (std::int64_t c = 0; c < kBlock; ++c) blocked[p0 * kBlock + c] = planes[c * plane + p0];
}

}  // namespace cpu_tiles

std::uint32_t FusedGroup::cpu_blocked(std::span<const TensorType> /*inputs*/) const {
  using namespace cpu_tiles;
  // Staged groups and channel-major tiles bind their inputs in their own ways.
  if (staged() || compute != DType::f32 || channel_tiles(*this)) return 0;
  const bool planes = blocked_tiles(*this);
  std::uint32_t bits = 0;
  for (std::size_t k = 0; k < inputs.size() && k < kBlockedOutputs; ++k)
    if (blocked_read(*this, k, planes) != BlockedRead::none) bits |= 1u << k;
  for (std::size_t o = 0; planes && o < outputs.size() && o < 32 - kBlockedOutputs; ++o)
    if (operand_dtype(outputs[o]) == DType::f32) bits |= 1u << (kBlockedOutputs + o);
  return bits;
}

}  // namespace kiln
