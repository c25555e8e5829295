// SGD (momentum, Nesterov, weight decay) and Adam/AdamW with PyTorch's update rules.
#include "graph/optim.h"

#include <cmath>

#include "graph/ops.h"

namespace kiln {

std::vector<VariablePtr> Optimizer::state() const {
  std::vector<VariablePtr> out;
  for (const auto& [name, var] : state_) out.push_back(var);
  return out;
}

void Optimizer::set_lr(double lr) {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, "learning rate {} must be finite and non-negative", lr);
  initial_lr_ = lr;
  auto it = state_.find("lr");
  if (it != state_.end()) it->second->value = Tensor::full({}, lr, it->second->value.dtype());
}

double Optimizer::lr() const { return initial_lr_; }

VariablePtr Optimizer::scalar_state(const std::string& name, double initial, DType dtype) {
  auto it = state_.find(name);
  if (it != state_.end()) return it->second;
  VariablePtr var = make_variable("optimizer." + name, Tensor::full({}, initial, dtype), false);
  state_.emplace(name, var);
  return var;
}

VariablePtr Optimizer::buffer_for(const VariablePtr& param, const std::string& name) {
  const std::string key = param->name + "." + name;
  auto it = state_.find(key);
  if (it != state_.end()) return it->second;
  VariablePtr var = make_variable("optimizer." + key,
                                  Tensor::zeros(param->value.shape(), param->value.dtype()), false);
  state_.emplace(key, var);
  return var;
}

Value Optimizer::lr_value(Graph& g, DType dtype) {
  return g.variable(scalar_state("lr", initial_lr_, dtype));
}

Sgd::Sgd(const SgdOptions& options) : Optimizer(options.lr), options_(options) {
  KILN_CHECK(options.momentum >= 0 && options.weight_decay >= 0,
             "sgd: momentum {} and weight decay {} must be >= 0", options.momentum,
             options.weight_decay);
  KILN_CHECK(!options.nesterov || options.momentum > 0, "sgd: Nesterov needs momentum > 0");
}

void Sgd::append_update(Graph& g, const std::vector<VariablePtr>& params,
                        const std::vector<Value>& grads) {
  KILN_ASSERT(params.size() == grads.size(), "{} params, {} grads", params.size(), grads.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Value p = g.variable(params[i]);
    const Value lr = lr_value(g, p.dtype());
    Value step = grads[i];
    if (options_.weight_decay > 0) step = step + p * options_.weight_decay;
    if (options_.momentum > 0) {
      const VariablePtr buf = buffer_for(params[i], "momentum");
      const Value new_buf = g.variable(buf) * options_.momentum + step;
      g.assign(buf, new_buf);
      step = options_.nesterov ? step + new_buf * options_.momentum : new_buf;
    }
    g.assign(params[i], p - lr * step);
  }
}

Adam::Adam(const AdamOptions& options) : Optimizer(options.lr), options_(options) {
  KILN_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
             "adam: betas ({}, {}) must lie in [0, 1)", options.beta1, options.beta2);
  KILN_CHECK(options.eps > 0 && options.weight_decay >= 0,
             "adam: eps {} must be > 0 and weight decay {} >= 0", options.eps,
             options.weight_decay);
}

void Adam::append_update(Graph& g, const std::vector<VariablePtr>& params,
                         const std::vector<Value>& grads) {
  KILN_ASSERT(params.size() == grads.size(), "{} params, {} grads", params.size(), grads.size());
  if (params.empty()) return;
  const DType dtype = params[0]->value.dtype();
  // The step count is kept in f64, exact to 2^53 steps (f32 stops counting at 2^24), and the
  // bias corrections use it in the parameters' dtype, as before.
  // (t is computed from the old count, so that the new one has no reader but its update,
  // which then writes in place.)
  const VariablePtr step_var = scalar_state("step", 0.0, DType::f64);
  const Value t = cast(g.variable(step_var), dtype) + 1.0;
  g.assign(step_var, g.variable(step_var) + 1.0);
  // Bias corrections 1 - beta^t, as exp(t * log(beta)).
  const Value correction1 = 1.0 - exp(t * std::log(options_.beta1));
  const Value correction2 = 1.0 - exp(t * std::log(options_.beta2));
  const Value lr = lr_value(g, dtype);
  for (std::size_t i = 0; i < params.size(); ++i) {
    Value p = g.variable(params[i]);
    Value grad = grads[i];
    if (options_.weight_decay > 0 && !options_.decoupled_weight_decay)
      grad = grad + p * options_.weight_decay;
    const VariablePtr m_var = buffer_for(params[i], "m");
    const VariablePtr v_var = buffer_for(params[i], "v");
    const Value m = g.variable(m_var) * options_.beta1 + grad * (1.0 - options_.beta1);
    const Value v = g.variable(v_var) * options_.beta2 + grad * grad * (1.0 - options_.beta2);
    g.assign(m_var, m);
    g.assign(v_var, v);
    const Value update = (m / correction1) / (sqrt(v / correction2) + options_.eps);
    if (options_.weight_decay > 0 && options_.decoupled_weight_decay)
      p = p * (1.0 - lr * options_.weight_decay);
    g.assign(params[i], p - lr * update);
  }
}

}  // namespace kiln
