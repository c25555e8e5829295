// A small residual network for 28x28 images (ResNet-14 in the CIFAR style of He et al.):
// a 3x3 stem (16 channels), three stages of two basic blocks each (16, 32, 64 channels at
// 28x28, 14x14, 7x7; the first block of stages 2 and 3 downsamples with stride 2 and a 1x1
// projection shortcut), global average pooling, dropout 0.2, linear 64 -> 10.
#pragma once

#include <memory>

#include "graph/nn/dropout.h"
#include "models/conv_bn.h"

namespace kiln {

// relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x)); the shortcut is x itself, or a
// strided 1x1 conv with batch norm where the shape changes.
class BasicBlock : public nn::Layer {
 public:
  BasicBlock(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride, Philox& rng);
  Value forward(Value x) override;

 private:
  ConvBn conv1_, conv2_;
  std::unique_ptr<ConvBn> projection_;  // null: identity shortcut
};

class ResNet : public nn::Layer {
 public:
  explicit ResNet(Philox& rng);
  Value forward(Value x) override;  // x: [B, 1, 28, 28] -> logits [B, 10]

 private:
  ConvBn stem_;
  nn::Sequential blocks_;
  nn::Dropout dropout_;
  nn::Linear fc_;
};

}  // namespace kiln
