// Inception: modules of parallel 1x1, 3x3, 5x5 and pooling branches, concatenated.
#include "models/inception.h"

#include "graph/nn/functional.h"

namespace kiln {
namespace {

constexpr InceptionWidths k3a{
    .b1 = 16, .b3_reduce = 16, .b3 = 32, .b5_reduce = 8, .b5 = 16, .pool_proj = 16};  // 80
constexpr InceptionWidths k3b{
    .b1 = 32, .b3_reduce = 32, .b3 = 48, .b5_reduce = 8, .b5 = 24, .pool_proj = 24};  // 128
constexpr InceptionWidths k4a{
    .b1 = 48, .b3_reduce = 32, .b3 = 64, .b5_reduce = 8, .b5 = 24, .pool_proj = 24};  // 160

ConvBnOptions conv(std::int64_t in, std::int64_t out, std::int64_t kernel) {
  return {.in_channels = in, .out_channels = out, .kernel = kernel};
}

}  // namespace

InceptionModule::InceptionModule(std::int64_t in, const InceptionWidths& w, Philox& rng) {
  branch1_.add<ConvBn>(conv(in, w.b1, 1), rng);
  branch3_.add<ConvBn>(conv(in, w.b3_reduce, 1), rng);
  branch3_.add<ConvBn>(conv(w.b3_reduce, w.b3, 3), rng);
  branch5_.add<ConvBn>(conv(in, w.b5_reduce, 1), rng);
  branch5_.add<ConvBn>(conv(w.b5_reduce, w.b5, 5), rng);
  branch_pool_.add<nn::MaxPool2d>(3, 1, 1);
  branch_pool_.add<ConvBn>(conv(in, w.pool_proj, 1), rng);
  register_module("branch1", branch1_);
  register_module("branch3", branch3_);
  register_module("branch5", branch5_);
  register_module("branch_pool", branch_pool_);
}

Value InceptionModule::forward(Value x) {
  return concat({branch1_(x), branch3_(x), branch5_(x), branch_pool_(x)}, 1);
}

Inception::Inception(Philox& rng, std::int64_t in_channels, std::int64_t classes)
    : stem_(conv(in_channels, 32, 3), rng),
      inception3a_(32, k3a, rng),
      inception3b_(k3a.out(), k3b, rng),
      inception4a_(k3b.out(), k4a, rng),
      dropout_(0.3, rng),
      fc_(k4a.out(), classes, rng, true, nn::Init::xavier_uniform) {
  register_module("stem", stem_);
  register_module("inception3a", inception3a_);
  register_module("inception3b", inception3b_);
  register_module("inception4a", inception4a_);
  register_module("dropout", dropout_);
  register_module("fc", fc_);
}

Value Inception::forward(Value x) {
  x = max_pool2d(stem_(x), 3, 2, 1);                       // [B, 32, 14, 14]
  x = max_pool2d(inception3b_(inception3a_(x)), 3, 2, 1);  // [B, 128, 7, 7]
  return fc_(dropout_(global_avg_pool(inception4a_(x))));  // [B, 160] -> [B, 10]
}

}  // namespace kiln
