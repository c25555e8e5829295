// TinyCnn, a model defined outside kiln with its C++ API (examples/tiny_cnn.cpp trains it by
// hand; custom_trainer.cpp, custom_dump.cpp and custom_bench.cpp register it in kiln's tools).
#pragma once

#include <memory>

#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "models/registry.h"

// conv 3x3 1->8, ReLU, max-pool 2; conv 3x3 8->16, ReLU, max-pool 2; linear 784->64, ReLU; linear
// 64->10.
class TinyCnn : public kiln::nn::Layer {
 public:
  explicit TinyCnn(kiln::Philox& rng)
      : conv1_({.in_channels = 1, .out_channels = 8, .kernel = 3, .padding = 1}, rng),
        conv2_({.in_channels = 8, .out_channels = 16, .kernel = 3, .padding = 1}, rng),
        fc1_(16 * 7 * 7, 64, rng),
        fc2_(64, 10, rng, true, kiln::nn::Init::xavier_uniform) {
    register_module("conv1", conv1_);
    register_module("conv2", conv2_);
    register_module("fc1", fc1_);
    register_module("fc2", fc2_);
  }

  kiln::Value forward(kiln::Value x) override {      // x: [B, 1, 28, 28]
    x = kiln::max_pool2d(kiln::relu(conv1_(x)), 2);  // [B, 8, 14, 14]
    x = kiln::max_pool2d(kiln::relu(conv2_(x)), 2);  // [B, 16, 7, 7]
    x = kiln::relu(fc1_(kiln::flatten(x)));          // [B, 64]
    return fc2_(x);                                  // [B, 10]
  }

 private:
  kiln::nn::Conv2d conv1_, conv2_;
  kiln::nn::Linear fc1_, fc2_;
};

// TinyCnn as the model "tiny-cnn" of kiln's tools (models/registry.h).
inline void register_tiny_cnn() {
  kiln::register_classifier(
      {.name = "tiny-cnn",
       .description = "2 conv + 2 linear layers for 28x28 images (examples/tiny_cnn.h)",
       .input_shape = kiln::Shape{1, 28, 28},
       .classes = 10},
      [](kiln::Philox& rng, const kiln::Shape&, std::int64_t) {
        return std::make_unique<TinyCnn>(rng);
      });
}
