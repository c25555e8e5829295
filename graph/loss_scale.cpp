// The loss scaler's graph ops (graph/loss_scale.h).
#include "graph/loss_scale.h"

#include <algorithm>

#include "graph/nn/functional.h"
#include "graph/ops.h"

namespace kiln {

LossScaler::LossScaler(Optimizer& optimizer, const LossScaleOptions& options)
    : options_(options), optimizer_(optimizer) {
  KILN_CHECK(options.initial > 0 && options.growth > 1 && options.backoff > 0 &&
                 options.backoff < 1 && options.growth_interval >= 1,
             "loss scaling: initial {} growth {} backoff {} interval {} (want > 0, > 1, in (0, "
             "1), >= 1)",
             options.initial, options.growth, options.backoff, options.growth_interval);
  scale_ = optimizer.scalar_state("loss_scale", options.initial, DType::f32);
  clean_ = optimizer.scalar_state("loss_scale.clean_steps", 0.0, DType::f32);
  skipped_ = optimizer.scalar_state("loss_scale.skipped_steps", 0.0, DType::f64);
}

void update_only_if(Graph& g, const Value& condition, const std::vector<VariablePtr>& params,
                    const Optimizer& optimizer) {
  std::vector<VariablePtr> vars = params;
  for (const VariablePtr& v : optimizer.state()) vars.push_back(v);
  std::vector<std::pair<VariablePtr, Value>> guarded;
  for (const auto& [var, ref] : g.assignments()) {
    if (std::find(vars.begin(), vars.end(), var) == vars.end() || !is_floating(var->value.dtype()))
      continue;
    const Value old = g.variable(var);
    guarded.emplace_back(var, select(cast(condition, old.dtype()), g.value(ref), old));
  }
  for (const auto& [var, value] : guarded) g.assign_latest(var, value);
}

Value LossScaler::scaled(Value loss) {
  return loss * cast(loss.graph().variable(scale_), loss.dtype());
}

std::vector<Value> LossScaler::unscaled(const std::vector<Value>& grads) {
  std::vector<Value> out;
  if (grads.empty()) return out;
  Graph& g = grads[0].graph();
  const Value inverse = 1.0 / g.variable(scale_);
  for (const Value& grad : grads) out.push_back(grad * cast(inverse, grad.dtype()));
  return out;
}

void LossScaler::guard_update(Graph& g, const std::vector<Value>& grads,
                              const std::vector<VariablePtr>& params) {
  // g * 0 is 0 for a finite g and NaN for an Inf or NaN; their sum is NaN if any one is.
  Value poison;
  for (const Value& grad : grads) {
    const Value s = cast(sum_all(grad * 0.0), DType::f32);
    poison = poison.valid() ? poison + s : s;
  }
  const Value finite = poison.valid() ? equal(poison, poison) : g.fill(1.0);
  update_only_if(g, finite, params, optimizer_);
  // Clean: one more clean step, the scale times growth once there are growth_interval of
  // them (the count then restarts). Skipped: the scale times backoff, the count restarts.
  const Value scale = g.variable(scale_), clean = g.variable(clean_) + 1.0;
  const Value grow = 1.0 - greater(scalar_like(clean, options_.growth_interval), clean);
  const Value clean_scale = select(grow, scale * options_.growth, scale);
  g.assign(scale_, select(finite, clean_scale, scale * options_.backoff));
  g.assign(clean_,
           select(finite, select(grow, scalar_like(clean, 0.0), clean), scalar_like(clean, 0.0)));
  const Value skipped = g.variable(skipped_) + (1.0 - cast(finite, DType::f64));
  g.assign(skipped_, skipped);
  g.output("loss_scale", scale);
  g.output("skipped_steps", skipped);
}

}  // namespace kiln
