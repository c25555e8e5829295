// nn layers as plain C++ classes over the builder API (LibTorch-style): a module owns its
// parameters as Variables; calling it on a Value records ops into that Value's graph, so
// one model can be used in several graphs (train step, eval step, a GAN's two steps).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "graph/graph.h"

namespace kiln::nn {

enum class Init { kaiming_uniform, xavier_uniform };

// U(-b, b) with b = sqrt(6 / fan_in) (Kaiming/He, for ReLU) or sqrt(6 / (fan_in + fan_out))
// (Xavier).
Tensor init_weight(const Shape& shape, std::int64_t fan_in, std::int64_t fan_out, Init init,
                   Philox& rng, DType dtype = DType::f32);

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;  // children are registered by address
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // Parameters of this module and its children, in registration order, named "fc1.weight".
  std::vector<VariablePtr> parameters() const;
  // Non-trainable state (batch norm's running statistics, dropout's step counter), named
  // like parameters ("bn1.running_mean"). Checkpoints carry them; optimizers do not see them.
  std::vector<VariablePtr> buffers() const;

  // Training mode (the default) or evaluation mode, for this module and all its children.
  // The mode is read when a graph is recorded: record the eval graph after set_training(false).
  void set_training(bool training);
  bool training() const { return training_; }
  // Calls `fn` on this module, then on each child's subtree in registration order.
  void apply(const std::function<void(Module&)>& fn);

 protected:
  VariablePtr register_parameter(const std::string& name, Tensor value);
  VariablePtr register_buffer(const std::string& name, Tensor value);
  // `child` must outlive this module (a member, or owned by it); its parameters and buffers
  // are renamed "name.*".
  void register_module(const std::string& name, Module& child);

 private:
  std::vector<VariablePtr> params_;
  std::vector<VariablePtr> buffers_;
  std::vector<Module*> children_;
  bool training_ = true;
};

// A module with one input and one output, so that it can sit in a Sequential.
class Layer : public Module {
 public:
  virtual Value forward(Value x) = 0;
  Value operator()(Value x) { return forward(x); }
};

class Linear : public Layer {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Philox& rng, bool bias = true,
         Init init = Init::kaiming_uniform);
  Value forward(Value x) override;                       // x: [B, in] -> [B, out]
  const VariablePtr& weight() const { return weight_; }  // [out, in]

 private:
  VariablePtr weight_, bias_;
};

struct Conv2dOptions {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 3;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  bool bias = true;
  Init init = Init::kaiming_uniform;
};

class Conv2d : public Layer {
 public:
  Conv2d(const Conv2dOptions& options, Philox& rng);
  Value forward(Value x) override;  // x: [B, Cin, H, W] -> [B, Cout, OH, OW]

 private:
  Conv2dOptions options_;
  VariablePtr weight_, bias_;  // [Cout, Cin, K, K], [Cout]
};

// The transpose of Conv2d (a "deconvolution", as in DCGAN's generator); weight [Cin, Cout, K, K]
// as PyTorch. Kaiming/Xavier fans count the inputs that reach one output: Cin * K * K / stride^2.
struct ConvTranspose2dOptions {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 4;
  std::int64_t stride = 2;
  std::int64_t padding = 1;
  std::int64_t output_padding = 0;
  bool bias = true;
  Init init = Init::kaiming_uniform;
};

class ConvTranspose2d : public Layer {
 public:
  ConvTranspose2d(const ConvTranspose2dOptions& options, Philox& rng);
  Value forward(Value x) override;  // x: [B, Cin, H, W] -> [B, Cout, (H - 1) * stride - 2 * padding
                                    // + K + output_padding, ...]
  const VariablePtr& weight() const { return weight_; }

 private:
  ConvTranspose2dOptions options_;
  VariablePtr weight_, bias_;  // [Cin, Cout, K, K], [Cout]
};

// Pooling over kernel x kernel windows (stride 0: the kernel), padded cells ignored
// (graph/ops.h).
class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0)
      : kernel_(kernel), stride_(stride), padding_(padding) {}
  Value forward(Value x) override;

 private:
  std::int64_t kernel_, stride_, padding_;
};

class AvgPool2d : public Layer {
 public:
  explicit AvgPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0)
      : kernel_(kernel), stride_(stride), padding_(padding) {}
  Value forward(Value x) override;

 private:
  std::int64_t kernel_, stride_, padding_;
};

// x: [B, C, H, W] -> [B, C], the mean over H and W.
class GlobalAvgPool : public Layer {
 public:
  Value forward(Value x) override;
};

class ReLU : public Layer {
 public:
  Value forward(Value x) override;
};

class LeakyReLU : public Layer {
 public:
  explicit LeakyReLU(double slope = 0.01);  // slope in [0, 1]
  Value forward(Value x) override;

 private:
  double slope_;
};

class Sigmoid : public Layer {
 public:
  Value forward(Value x) override;
};

class Tanh : public Layer {
 public:
  Value forward(Value x) override;
};

class Flatten : public Layer {
 public:
  Value forward(Value x) override;
};

// Layers applied in order; owns them. Parameters are named by position: "0.weight".
class Sequential : public Layer {
 public:
  template <class L, class... Args>
  L& add(Args&&... args) {
    auto layer = std::make_unique<L>(std::forward<Args>(args)...);
    L& ref = *layer;
    register_module(std::to_string(layers_.size()), ref);
    layers_.push_back(std::move(layer));
    return ref;
  }
  Value forward(Value x) override;
  std::size_t size() const { return layers_.size(); }

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace kiln::nn
