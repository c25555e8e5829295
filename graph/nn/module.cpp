// Parameter registration, initialisation and the standard layers.
#include "graph/nn/module.h"

#include <algorithm>
#include <cmath>

#include "graph/nn/functional.h"

namespace kiln::nn {

Tensor init_weight(const Shape& shape, std::int64_t fan_in, std::int64_t fan_out, Init init,
                   Philox& rng, DType dtype) {
  KILN_CHECK(fan_in > 0 && fan_out > 0, "init_weight: fan_in {} and fan_out {} must be positive",
             fan_in, fan_out);
  const double bound = init == Init::kaiming_uniform
                           ? std::sqrt(6.0 / static_cast<double>(fan_in))
                           : std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  Tensor t = Tensor::empty(shape, dtype);
  rng.fill_uniform(t, -bound, bound);
  return t;
}

std::vector<VariablePtr> Module::parameters() const {
  std::vector<VariablePtr> all = params_;
  for (const Module* child : children_) {
    std::vector<VariablePtr> sub = child->parameters();
    all.insert(all.end(), sub.begin(), sub.end());
  }
  return all;
}

std::vector<VariablePtr> Module::buffers() const {
  std::vector<VariablePtr> all = buffers_;
  for (const Module* child : children_) {
    std::vector<VariablePtr> sub = child->buffers();
    all.insert(all.end(), sub.begin(), sub.end());
  }
  return all;
}

void Module::set_training(bool training) {
  training_ = training;
  for (Module* child : children_) child->set_training(training);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (Module* child : children_) child->apply(fn);
}

VariablePtr Module::register_parameter(const std::string& name, Tensor value) {
  params_.push_back(make_variable(name, std::move(value), true));
  return params_.back();
}

VariablePtr Module::register_buffer(const std::string& name, Tensor value) {
  buffers_.push_back(make_variable(name, std::move(value), false));
  return buffers_.back();
}

void Module::register_module(const std::string& name, Module& child) {
  for (const VariablePtr& p : child.parameters()) p->name = name + "." + p->name;
  for (const VariablePtr& b : child.buffers()) b->name = name + "." + b->name;
  child.set_training(training_);
  children_.push_back(&child);
}

Linear::Linear(std::int64_t in_features, std::int64_t out_features, Philox& rng, bool bias,
               Init init) {
  weight_ = register_parameter(
      "weight", init_weight({out_features, in_features}, in_features, out_features, init, rng));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}, DType::f32));
}

Value Linear::forward(Value x) {
  Graph& g = x.graph();
  const Shape& w = weight_->value.shape();
  KILN_CHECK(x.shape().rank() == 2 && x.shape()[1] == w[1],
             "Linear({} -> {}): input is {} but [B, {}] was expected", w[1], w[0], x.type().str(),
             w[1]);
  Value y = matmul(x, g.variable(weight_), false, true);
  return bias_ ? y + g.variable(bias_) : y;
}

Conv2d::Conv2d(const Conv2dOptions& options, Philox& rng) : options_(options) {
  const std::int64_t k = options.kernel;
  weight_ =
      register_parameter("weight", init_weight({options.out_channels, options.in_channels, k, k},
                                               options.in_channels * k * k,
                                               options.out_channels * k * k, options.init, rng));
  if (options.bias)
    bias_ = register_parameter("bias", Tensor::zeros({options.out_channels}, DType::f32));
}

Value Conv2d::forward(Value x) {
  Graph& g = x.graph();
  Value y = conv2d(x, g.variable(weight_), options_.stride, options_.padding);
  if (!bias_) return y;
  return y + reshape(g.variable(bias_), {1, options_.out_channels, 1, 1});
}

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dOptions& options, Philox& rng)
    : options_(options) {
  const std::int64_t k = options.kernel, s2 = options.stride * options.stride;
  KILN_CHECK(options.in_channels >= 1 && options.out_channels >= 1 && k >= 1 && options.stride >= 1,
             "ConvTranspose2d: {} -> {} channels, kernel {}, stride {} (all must be positive)",
             options.in_channels, options.out_channels, k, options.stride);
  const std::int64_t fan_in = std::max<std::int64_t>(1, options.in_channels * k * k / s2);
  const std::int64_t fan_out = std::max<std::int64_t>(1, options.out_channels * k * k / s2);
  weight_ =
      register_parameter("weight", init_weight({options.in_channels, options.out_channels, k, k},
                                               fan_in, fan_out, options.init, rng));
  if (options.bias)
    bias_ = register_parameter("bias", Tensor::zeros({options.out_channels}, DType::f32));
}

Value ConvTranspose2d::forward(Value x) {
  Graph& g = x.graph();
  KILN_CHECK(x.shape().rank() == 4 && x.shape()[1] == options_.in_channels,
             "ConvTranspose2d({} -> {}): input is {} but [B, {}, H, W] was expected",
             options_.in_channels, options_.out_channels, x.type().str(), options_.in_channels);
  Value y = conv_transpose2d(x, g.variable(weight_), options_.stride, options_.padding,
                             options_.output_padding);
  if (!bias_) return y;
  return y + reshape(g.variable(bias_), {1, options_.out_channels, 1, 1});
}

Value MaxPool2d::forward(Value x) { return max_pool2d(x, kernel_, stride_, padding_); }
Value AvgPool2d::forward(Value x) { return avg_pool2d(x, kernel_, stride_, padding_); }
Value GlobalAvgPool::forward(Value x) { return global_avg_pool(x); }
Value ReLU::forward(Value x) { return relu(x); }
LeakyReLU::LeakyReLU(double slope) : slope_(slope) {
  KILN_CHECK(slope >= 0 && slope <= 1, "LeakyReLU: slope {} must be in [0, 1]",
             slope);  // leaky_relu is max(x, slope * x)
}

Value LeakyReLU::forward(Value x) { return leaky_relu(x, slope_); }
Value Sigmoid::forward(Value x) { return sigmoid(x); }
Value Tanh::forward(Value x) { return tanh(x); }
Value Flatten::forward(Value x) { return flatten(x); }

Value Sequential::forward(Value x) {
  for (const auto& layer : layers_) x = layer->forward(x);
  return x;
}

}  // namespace kiln::nn
