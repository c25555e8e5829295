// The LeNet-style CNN the benchmarks compare across frameworks:
// conv 3x3 1->32 pad 1, ReLU, max-pool 2; conv 3x3 32->64 pad 1, ReLU, max-pool 2;
// linear 3136->128, ReLU; linear 128->10.
#pragma once

#include "graph/nn/module.h"

namespace kiln {

class LeNet : public nn::Layer {
 public:
  explicit LeNet(Philox& rng);
  Value forward(Value x) override;  // x: [B, 1, 28, 28] -> logits [B, 10]
  Value features(
      Value x);  // x: [B, 1, 28, 28] -> [B, 128], the activations the last layer reads (FID)

 private:
  nn::Conv2d conv1_, conv2_;
  nn::Linear fc1_, fc2_;
};

}  // namespace kiln
