// AlexNet: five convolutions with two overlapping max pools, three linear layers.
#include "models/alexnet.h"

namespace kiln {
namespace {

void add_conv(nn::Sequential& s, std::int64_t in, std::int64_t out, std::int64_t kernel,
              std::int64_t stride, Philox& rng) {
  s.add<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in,
                                      .out_channels = out,
                                      .kernel = kernel,
                                      .stride = stride,
                                      .padding = kernel / 2},
                    rng);
  s.add<nn::ReLU>();
}

}  // namespace

AlexNet::AlexNet(Philox& rng) {
  add_conv(features_, 1, 32, 5, 2, rng);   // [B, 32, 14, 14]
  add_conv(features_, 32, 48, 3, 1, rng);  // [B, 48, 14, 14]
  features_.add<nn::MaxPool2d>(3, 2, 1);   // [B, 48, 7, 7]
  add_conv(features_, 48, 96, 3, 1, rng);
  add_conv(features_, 96, 96, 3, 1, rng);
  add_conv(features_, 96, 64, 3, 1, rng);  // [B, 64, 7, 7]
  features_.add<nn::MaxPool2d>(3, 2, 1);   // [B, 64, 4, 4]
  features_.add<nn::Flatten>();
  classifier_.add<nn::Dropout>(0.5, rng);
  classifier_.add<nn::Linear>(64 * 4 * 4, 512, rng);
  classifier_.add<nn::ReLU>();
  classifier_.add<nn::Dropout>(0.5, rng);
  classifier_.add<nn::Linear>(512, 512, rng);
  classifier_.add<nn::ReLU>();
  classifier_.add<nn::Linear>(512, 10, rng, true, nn::Init::xavier_uniform);
  register_module("features", features_);
  register_module("classifier", classifier_);
}

Value AlexNet::forward(Value x) { return classifier_(features_(x)); }

}  // namespace kiln
