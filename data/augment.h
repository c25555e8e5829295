// Host augmentation of training images: random crops of the image padded by a border,
// and horizontal flips, each drawn from (seed, epoch, index of the example in the dataset)
// alone, so that a resumed run, any rank count and any thread count see the same images.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

struct Augmentation {
  std::int64_t crop_padding = 0;  // > 0: crops at offsets in [-crop_padding, crop_padding]
  bool flip = false;              // a horizontal flip with probability 1/2
  std::vector<float> fill;        // per channel: the border's value (normalised black)
  bool active() const { return crop_padding > 0 || flip; }
};

// One example's draw: the crop's offset (the output's pixel (y, x) is the input's
// (y + dy, x + dx), the border outside it) and whether it is flipped.
struct AugmentDraw {
  std::int64_t dy = 0, dx = 0;
  bool flip = false;
};

AugmentDraw augment_draw(const Augmentation& a, std::uint64_t seed, std::int64_t epoch,
                         std::int64_t index);

// Writes the augmented image (f32 [C, H, W], out must not alias in).
void augment_image(const float* in, float* out, std::int64_t channels, std::int64_t height,
                   std::int64_t width, const Augmentation& a, const AugmentDraw& draw);

}  // namespace kiln
