// The conv -> batch norm (-> ReLU) unit that resnet, vgg and inception are built from.
// The convolution has no bias: batch norm's shift takes its place.
#pragma once

#include "graph/nn/batch_norm.h"
#include "graph/nn/module.h"

namespace kiln {

struct ConvBnOptions {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 3;
  std::int64_t stride = 1;
  std::int64_t padding = -1;  // -1: kernel / 2 ("same" for odd kernels at stride 1)
  bool relu = true;
};

class ConvBn : public nn::Layer {
 public:
  ConvBn(const ConvBnOptions& options, Philox& rng);
  Value forward(Value x) override;  // x: [B, Cin, H, W] -> [B, Cout, OH, OW]

 private:
  bool relu_;
  nn::Conv2d conv_;
  nn::BatchNorm2d bn_;
};

}  // namespace kiln
