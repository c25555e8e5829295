// ResNet: stem, residual stages, global average pooling, classifier.
#include "models/resnet.h"

#include "graph/nn/functional.h"

namespace kiln {
namespace {

constexpr std::int64_t kWidth = 16;  // channels of the stem and stage 1; stages 2 and 3 double it

}  // namespace

BasicBlock::BasicBlock(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride,
                       Philox& rng)
    : conv1_({.in_channels = in_channels, .out_channels = out_channels, .stride = stride}, rng),
      conv2_({.in_channels = out_channels, .out_channels = out_channels, .relu = false}, rng) {
  register_module("conv1", conv1_);
  register_module("conv2", conv2_);
  if (stride == 1 && in_channels == out_channels) return;
  projection_ = std::make_unique<ConvBn>(ConvBnOptions{.in_channels = in_channels,
                                                       .out_channels = out_channels,
                                                       .kernel = 1,
                                                       .stride = stride,
                                                       .relu = false},
                                         rng);
  register_module("projection", *projection_);
}

Value BasicBlock::forward(Value x) {
  const Value shortcut = projection_ ? (*projection_)(x) : x;
  return relu(conv2_(conv1_(x)) + shortcut);
}

ResNet::ResNet(Philox& rng, std::int64_t in_channels, std::int64_t classes)
    : stem_({.in_channels = in_channels, .out_channels = kWidth}, rng),
      dropout_(0.2, rng),
      fc_(4 * kWidth, classes, rng, true, nn::Init::xavier_uniform) {
  struct Stage {
    std::int64_t channels, stride;
  };
  std::int64_t channels = kWidth;
  for (const Stage stage : {Stage{kWidth, 1}, Stage{2 * kWidth, 2}, Stage{4 * kWidth, 2}}) {
    blocks_.add<BasicBlock>(channels, stage.channels, stage.stride, rng);
    blocks_.add<BasicBlock>(stage.channels, stage.channels, 1, rng);
    channels = stage.channels;
  }
  register_module("stem", stem_);
  register_module("blocks", blocks_);
  register_module("dropout", dropout_);
  register_module("fc", fc_);
}

Value ResNet::forward(Value x) {
  x = blocks_(stem_(x));                     // [B, 64, 7, 7]
  return fc_(dropout_(global_avg_pool(x)));  // [B, 64] -> [B, 10]
}

ResNet18::ResNet18(Philox& rng, std::int64_t in_channels, std::int64_t classes)
    : in_channels_(in_channels),
      stem_({.in_channels = in_channels, .out_channels = 64}, rng),
      fc_(512, classes, rng, true, nn::Init::xavier_uniform) {
  KILN_CHECK(in_channels >= 1 && classes >= 2,
             "resnet18: needs at least 1 input channel and 2 classes, got {} and {}", in_channels,
             classes);
  std::int64_t channels = 64;
  for (const std::int64_t stage : {64, 128, 256, 512}) {
    blocks_.add<BasicBlock>(channels, stage, stage == 64 ? 1 : 2, rng);
    blocks_.add<BasicBlock>(stage, stage, 1, rng);
    channels = stage;
  }
  register_module("stem", stem_);
  register_module("blocks", blocks_);
  register_module("fc", fc_);
}

Value ResNet18::forward(Value x) {
  const Shape& s = x.shape();
  KILN_CHECK(s.rank() == 4 && s[1] == in_channels_ && s[2] >= 8 && s[3] >= 8,
             "resnet18: input is {} but the model takes [B, {}, H, W] with H, W >= 8", s.str(),
             in_channels_);
  x = blocks_(stem_(x));           // [B, 512, H/8, W/8]
  return fc_(global_avg_pool(x));  // [B, 512] -> [B, classes]
}

}  // namespace kiln
