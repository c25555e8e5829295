// A small GoogLeNet (Szegedy et al. 2015) for 28x28 images, with batch norm after every
// convolution: stem conv 3x3 (32) and max pool 3/2 pad 1 (28 -> 14); Inception modules
// 3a (-> 80 channels) and 3b (-> 128); max pool 3/2 pad 1 (14 -> 7); module 4a (-> 160);
// global average pooling, dropout 0.3, linear 160 -> 10.
#pragma once

#include "graph/nn/dropout.h"
#include "models/conv_bn.h"

namespace kiln {

// Output channels of an Inception module's four branches (reduce: the 1x1 before a 3x3/5x5).
struct InceptionWidths {
  std::int64_t b1, b3_reduce, b3, b5_reduce, b5, pool_proj;
  std::int64_t out() const { return b1 + b3 + b5 + pool_proj; }
};

// Four independent branches over the same input, concatenated along channels:
// 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | max pool 3/1 pad 1 -> 1x1. Spatial size is kept.
class InceptionModule : public nn::Layer {
 public:
  InceptionModule(std::int64_t in_channels, const InceptionWidths& widths, Philox& rng);
  Value forward(Value x) override;  // x: [B, Cin, H, W] -> [B, widths.out(), H, W]

 private:
  nn::Sequential branch1_, branch3_, branch5_, branch_pool_;
};

class Inception : public nn::Layer {
 public:
  // Any [B, in_channels, H, W] (global pooling absorbs the size).
  explicit Inception(Philox& rng, std::int64_t in_channels = 1, std::int64_t classes = 10);
  Value forward(Value x) override;  // x: [B, 1, 28, 28] -> logits [B, 10]

 private:
  ConvBn stem_;
  InceptionModule inception3a_, inception3b_, inception4a_;
  nn::Dropout dropout_;
  nn::Linear fc_;
};

}  // namespace kiln
