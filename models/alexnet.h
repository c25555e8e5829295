// AlexNet scaled to 28x28 images: a large strided first kernel (5x5 stride 2, 32 channels,
// 28 -> 14), conv 3x3 48, overlapping max pooling 3/2 pad 1 (14 -> 7), three 3x3 convs
// (96, 96, 64), max pooling 3/2 pad 1 (7 -> 4), then the classifier of dropout 0.5,
// linear 1024 -> 512, ReLU, dropout 0.5, linear 512 -> 512, ReLU, linear 512 -> 10.
// ReLU after every convolution; no normalisation layers (AlexNet's LRN is left out).
#pragma once

#include "graph/nn/dropout.h"
#include "graph/nn/module.h"

namespace kiln {

class AlexNet : public nn::Layer {
 public:
  explicit AlexNet(Philox& rng);
  Value forward(Value x) override;  // x: [B, 1, 28, 28] -> logits [B, 10]

 private:
  nn::Sequential features_, classifier_;
};

}  // namespace kiln
