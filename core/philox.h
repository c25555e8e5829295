// Philox4x32-10, a counter-based RNG: value i of a stream depends only on (seed, counter),
// so every device (and every thread) can generate the same numbers independently.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace kiln {

// One Philox block: four 32-bit words for (key = seed, 128-bit counter = (counter, high)).
std::array<std::uint32_t, 4> philox_block(std::uint64_t seed, std::uint64_t counter,
                                          std::uint64_t high = 0);
// Maps 32 random bits to a float in [0, 1) with 24 bits of resolution.
inline float uniform_from_bits(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1.0p-24f;
}

// A stream of blocks: (seed, offset) is its whole state, so it checkpoints as two integers.
// Each fill takes ceil(n / 4) blocks from the stream; element i of a fill uses block
// offset + i / 4, word i % 4, which lets a GPU kernel reproduce the same fill in parallel.
class Philox {
 public:
  explicit Philox(std::uint64_t seed, std::uint64_t offset = 0) : seed_(seed), offset_(offset) {}

  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }

  // Fills a host floating tensor with uniform values in [low, high) (bf16/f16: the f32 values
  // rounded to nearest even).
  void fill_uniform(Tensor& t, double low, double high);
  // Fills a host floating tensor with normal values (Box-Muller on word pairs; bf16/f16 as above).
  void fill_normal(Tensor& t, double mean, double stddev);
  // Only elements [begin, end) of that fill (begin even; f32 or f64), the stream advanced as
  // by the whole fill: threads that each call it on a copy of one generator, with parts that
  // cover the tensor, write fill_normal's values.
  void fill_normal_part(Tensor& t, double mean, double stddev, std::int64_t begin,
                        std::int64_t end);
  // A uniformly random integer in [0, n); uses one block.
  std::uint64_t next_below(std::uint64_t n);

 private:
  std::uint64_t take_blocks(std::int64_t values);

  std::uint64_t seed_;
  std::uint64_t offset_;
};

}  // namespace kiln
