// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
#include "core/philox.h"

#include <cmath>

#include "core/dispatch.h"

namespace kiln {
namespace {

constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;

void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(product >> 32);
  lo = static_cast<std::uint32_t>(product);
}

}  // namespace

std::array<std::uint32_t, 4> philox_block(std::uint64_t seed, std::uint64_t counter,
                                          std::uint64_t high) {
  std::array<std::uint32_t, 4> c = {
      static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32),
      static_cast<std::uint32_t>(high), static_cast<std::uint32_t>(high >> 32)};
  std::uint32_t k0 = static_cast<std::uint32_t>(seed);
  std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kMul0, c[0], hi0, lo0);
    mul_hi_lo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

std::uint64_t Philox::take_blocks(std::int64_t values) {
  const std::uint64_t first = offset_;
  offset_ += static_cast<std::uint64_t>((values + 3) / 4);
  return first;
}

void Philox::fill_uniform(Tensor& t, double low, double high) {
  if (is_low_precision(t.dtype())) {  // drawn in f32, rounded to nearest even: the same stream
    Tensor wide = Tensor::empty(t.shape(), DType::f32);
    fill_uniform(wide, low, high);
    t.copy_from(wide.to(t.dtype()));
    return;
  }
  const std::uint64_t first = take_blocks(t.numel());
  visit_floating(t.dtype(), "fill_uniform", [&](auto zero) {
    using T = decltype(zero);
    T* out = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const auto block = philox_block(seed_, first + static_cast<std::uint64_t>(i / 4));
      const float u = uniform_from_bits(block[static_cast<std::size_t>(i % 4)]);
      out[i] = static_cast<T>(low + (high - low) * static_cast<double>(u));
    }
  });
}

void Philox::fill_normal(Tensor& t, double mean, double stddev) {
  if (is_low_precision(t.dtype())) {  // drawn in f32, rounded to nearest even: the same stream
    Tensor wide = Tensor::empty(t.shape(), DType::f32);
    fill_normal(wide, mean, stddev);
    t.copy_from(wide.to(t.dtype()));
    return;
  }
  fill_normal_part(t, mean, stddev, 0, t.numel());
}

void Philox::fill_normal_part(Tensor& t, double mean, double stddev, std::int64_t begin,
                              std::int64_t end) {
  KILN_CHECK(begin % 2 == 0 && 0 <= begin && begin <= end && end <= t.numel(),
             "fill_normal_part: elements [{}, {}) of {} (the first must be even)", begin, end,
             t.numel());
  KILN_CHECK(!is_low_precision(t.dtype()), "fill_normal_part: a {} tensor (f32 or f64 only)",
             dtype_name(t.dtype()));
  const std::uint64_t first = take_blocks(t.numel());
  visit_floating(t.dtype(), "fill_normal", [&](auto zero) {
    using T = decltype(zero);
    T* out = t.data<T>();
    const std::int64_t n = end;
    // Elements 2p and 2p + 1 are the cosine and sine of one Box-Muller pair, from words
    // 2 (p % 2) and 2 (p % 2) + 1 of block first + p / 2: each block is computed once.
    std::array<std::uint32_t, 4> block{};
    for (std::int64_t p = begin / 2; 2 * p < n; ++p) {
      if (p % 2 == 0 || p == begin / 2)
        block = philox_block(seed_, first + static_cast<std::uint64_t>(p / 2));
      const std::size_t word = static_cast<std::size_t>(p % 2) * 2;
      const double u1 = 1.0 - static_cast<double>(uniform_from_bits(block[word]));  // (0, 1]
      const double u2 = static_cast<double>(uniform_from_bits(block[word + 1]));
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double angle = 2.0 * M_PI * u2;
      out[2 * p] = static_cast<T>(mean + stddev * (radius * std::cos(angle)));
      if (2 * p + 1 < n)
        out[2 * p + 1] = static_cast<T>(mean + stddev * (radius * std::sin(angle)));
    }
  });
}

std::uint64_t Philox::next_below(std::uint64_t n) {
  KILN_ASSERT(n > 0, "next_below(0)");
  const auto block = philox_block(seed_, take_blocks(4));
  const std::uint64_t bits = (static_cast<std::uint64_t>(block[0]) << 32) | block[1];
  return bits % n;  // bias below 2^-32 for the n (dataset sizes) used here
}

}  // namespace kiln
