// LeNet: two conv/ReLU/pool stages and two linear layers.
#include "models/lenet.h"

#include "graph/nn/functional.h"

namespace kiln {

LeNet::LeNet(Philox& rng)
    : conv1_({.in_channels = 1, .out_channels = 32, .kernel = 3, .padding = 1}, rng),
      conv2_({.in_channels = 32, .out_channels = 64, .kernel = 3, .padding = 1}, rng),
      fc1_(64 * 7 * 7, 128, rng),
      fc2_(128, 10, rng, true, nn::Init::xavier_uniform) {
  register_module("conv1", conv1_);
  register_module("conv2", conv2_);
  register_module("fc1", fc1_);
  register_module("fc2", fc2_);
}

Value LeNet::features(Value x) {
  x = max_pool2d(relu(conv1_(x)), 2);  // [B, 32, 14, 14]
  x = max_pool2d(relu(conv2_(x)), 2);  // [B, 64, 7, 7]
  return relu(fc1_(flatten(x)));       // [B, 128]
}

Value LeNet::forward(Value x) { return fc2_(features(x)); }  // [B, 10]

}  // namespace kiln
