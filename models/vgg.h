// VGG scaled to 28x28 images: stacks of 3x3 convolutions (pad 1, batch norm, ReLU), each
// stack ended by 2x2 max pooling: channels [16, 16, M, 32, 32, M, 64, 64, M]
// (28 -> 14 -> 7 -> 3), then linear 576 -> 256, ReLU, dropout 0.5, linear 256 -> 10.
#pragma once

#include "graph/nn/dropout.h"
#include "graph/nn/module.h"

namespace kiln {

class Vgg : public nn::Layer {
 public:
  explicit Vgg(Philox& rng);
  Value forward(Value x) override;  // x: [B, 1, 28, 28] -> logits [B, 10]

 private:
  nn::Sequential features_, classifier_;
};

}  // namespace kiln
