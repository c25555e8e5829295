// Residual networks of basic blocks (He et al.). ResNet: a small one for 28x28 images (ResNet-14
// in the CIFAR style): a 3x3 stem (16 channels), three stages of two basic blocks each (16, 32,
// 64 channels at 28x28, 14x14, 7x7; the first block of stages 2 and 3 downsamples with stride 2
// and a 1x1 projection shortcut), global average pooling, dropout 0.2, linear 64 -> 10.
// ResNet18: the CIFAR form of ResNet-18 (below).
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
  // Any [B, in_channels, H, W] with H, W >= 4 (global pooling absorbs the size).
  explicit ResNet(Philox& rng, std::int64_t in_channels = 1, std::int64_t classes = 10);
  Value forward(Value x) override;  // x: [B, 1, 28, 28] -> logits [B, 10]

 private:
  ConvBn stem_;
  nn::Sequential blocks_;
  nn::Dropout dropout_;
  nn::Linear fc_;
};

// ResNet-18 in its CIFAR form: a 3x3 stride-1 stem of 64 channels (no max pooling), four stages
// of two basic blocks at 64, 128, 256 and 512 channels (stages 2-4 halve the size with a strided
// first block and a 1x1 projection), global average pooling, linear 512 -> classes. Takes any
// [B, C, H, W] with the C it was built for (3 for CIFAR, 1 for Fashion-MNIST) and H, W >= 8
// (global pooling absorbs the size); 11,173,962 parameters for 3 channels and 10 classes.
class ResNet18 : public nn::Layer {
 public:
  ResNet18(Philox& rng, std::int64_t in_channels = 3, std::int64_t classes = 10);
  Value forward(Value x) override;  // x: [B, C, H, W] -> logits [B, classes]

 private:
  std::int64_t in_channels_;
  ConvBn stem_;
  nn::Sequential blocks_;
  nn::Linear fc_;
};

}  // namespace kiln
