// VGG: a feature stack of conv/BN/ReLU units and max pools, then a two-layer classifier.
#include "models/vgg.h"

#include <vector>

#include "models/conv_bn.h"

namespace kiln {
namespace {

constexpr std::int64_t kPool = 0;  // a 2x2 max pool in the layer list
const std::vector<std::int64_t> kLayers = {16, 16, kPool, 32, 32, kPool, 64, 64, kPool};

}  // namespace

Vgg::Vgg(Philox& rng) {
  std::int64_t channels = 1;
  for (std::int64_t width : kLayers) {
    if (width == kPool) {
      features_.add<nn::MaxPool2d>(2);
      continue;
    }
    features_.add<ConvBn>(ConvBnOptions{.in_channels = channels, .out_channels = width}, rng);
    channels = width;
  }
  features_.add<nn::Flatten>();
  classifier_.add<nn::Linear>(channels * 3 * 3, 256, rng);
  classifier_.add<nn::ReLU>();
  classifier_.add<nn::Dropout>(0.5, rng);
  classifier_.add<nn::Linear>(256, 10, rng, true, nn::Init::xavier_uniform);
  register_module("features", features_);
  register_module("classifier", classifier_);
}

Value Vgg::forward(Value x) {
  return classifier_(features_(x));  // features: [B, 64, 3, 3] flattened to [B, 576]
}

}  // namespace kiln
