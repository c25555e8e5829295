// Optimizers as graph ops: the update of every parameter is appended after the backward,
// so the whole step (forward, backward, update) compiles, and later fuses, as one graph.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace kiln {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2 penalty added to the gradient
  bool nesterov = false;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // true: AdamW
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Appends the update of every parameter (given its gradient in `g`) as graph ops and
  // registers each new value as an assignment of the parameter.
  virtual void append_update(Graph& g, const std::vector<VariablePtr>& params,
                             const std::vector<Value>& grads) = 0;
  // Optimizer state (learning rate, step count, moment buffers), for checkpoints.
  std::vector<VariablePtr> state() const;
  // The learning rate is a variable the graph reads: changing it needs no recompilation.
  void set_lr(double lr);
  double lr() const;
  // A scalar state variable of `dtype`, created on first use (public for state that belongs
  // with the optimizer's in checkpoints: the loss scaler's).
  VariablePtr scalar_state(const std::string& name, double initial, DType dtype);

 protected:
  explicit Optimizer(double lr) : initial_lr_(lr) {}
  // A zero-initialised buffer shaped like `param`, one per (param, name).
  VariablePtr buffer_for(const VariablePtr& param, const std::string& name);
  Value lr_value(Graph& g, DType dtype);

 private:
  double initial_lr_;
  std::map<std::string, VariablePtr> state_;  // by name: "lr", "step", "fc1.weight.momentum", ...
};

class Sgd : public Optimizer {
 public:
  explicit Sgd(const SgdOptions& options);
  void append_update(Graph& g, const std::vector<VariablePtr>& params,
                     const std::vector<Value>& grads) override;

 private:
  SgdOptions options_;
};

class Adam : public Optimizer {
 public:
  explicit Adam(const AdamOptions& options);
  void append_update(Graph& g, const std::vector<VariablePtr>& params,
                     const std::vector<Value>& grads) override;

 private:
  AdamOptions options_;
};

}  // namespace kiln
