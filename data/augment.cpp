// Random crop with padding and horizontal flip, from counter-based random numbers.
#include "data/augment.h"

#include "core/philox.h"

namespace kiln {

AugmentDraw augment_draw(const Augmentation& a, std::uint64_t seed, std::int64_t epoch,
                         std::int64_t index) {
  // One Philox block per (epoch, example): word 0 the rows' offset, 1 the columns', 2 the flip.
  const std::array<std::uint32_t, 4> w = philox_block(
      seed ^ 0xa06e47a7e5ULL, static_cast<std::uint64_t>(index), static_cast<std::uint64_t>(epoch));
  AugmentDraw d;
  if (a.crop_padding > 0) {
    const auto span = static_cast<std::uint64_t>(2 * a.crop_padding + 1);
    d.dy = static_cast<std::int64_t>(w[0] % span) - a.crop_padding;
    d.dx = static_cast<std::int64_t>(w[1] % span) - a.crop_padding;
  }
  d.flip = a.flip && (w[2] >> 31) != 0;
  return d;
}

void augment_image(const float* in, float* out, std::int64_t channels, std::int64_t height,
                   std::int64_t width, const Augmentation& a, const AugmentDraw& draw) {
  for (std::int64_t c = 0; c < channels; ++c) {
    const float border = a.fill.empty() ? 0.0f : a.fill[static_cast<std::size_t>(c)];
    const float* plane = in + c * height * width;
    float* o = out + c * height * width;
    for (std::int64_t y = 0; y < height; ++y) {
      const std::int64_t sy = y + draw.dy;
      for (std::int64_t x = 0; x < width; ++x) {
        const std::int64_t sx = (draw.flip ? width - 1 - x : x) + draw.dx;
        const bool inside = sy >= 0 && sy < height && sx >= 0 && sx < width;
        o[y * width + x] = inside ? plane[sy * width + sx] : border;
      }
    }
  }
}

}  // namespace kiln
