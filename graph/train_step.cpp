// Autograd, gradient clipping and the optimizer, in one graph.
#include "graph/train_step.h"

#include <cmath>

#include "graph/autograd.h"
#include "graph/ops.h"

namespace kiln {

std::vector<Value> clip_by_global_norm(const std::vector<Value>& grads, double max_norm, Value* norm) {
  KILN_CHECK(std::isfinite(max_norm) && max_norm > 0, "gradient clipping: the maximum norm must be positive (got {})", max_norm);
  if (grads.empty()) return grads;
  Value squares;  // sum over params of sum(g * g): []
  for (const Value& g : grads) {
    KILN_CHECK(g.dtype() == grads[0].dtype(), "gradient clipping: gradients of dtypes {} and {} cannot share one norm",
               dtype_name(grads[0].dtype()), dtype_name(g.dtype()));
    const Value s = sum_all(g * g);
    squares = squares.valid() ? squares + s : s;
  }
  const Value total = sqrt(squares);
  if (norm != nullptr) *norm = total;
  // min(1, c / (total + eps)) written as c / max(total + eps, c): exactly 1 below the threshold.
  const Value scale = max_norm / maximum(total + 1e-6, scalar_like(total, max_norm));
  std::vector<Value> clipped;
  for (const Value& g : grads) clipped.push_back(g * scale);
  return clipped;
}

void append_training_step(Value loss, const std::vector<VariablePtr>& params, Optimizer& optimizer, const TrainStepOptions& options) {
  Graph& g = loss.graph();
  std::vector<Value> wrt;
  for (const VariablePtr& p : params) {
    KILN_CHECK(p->trainable, "training step: '{}' is not trainable", p->name);
    wrt.push_back(g.variable(p));
  }
  std::vector<Value> grads = grad(loss, wrt);
  KILN_CHECK(std::isfinite(options.clip_grad_norm) && options.clip_grad_norm >= 0,
             "training step: clip_grad_norm must be >= 0 (got {})", options.clip_grad_norm);
  if (options.clip_grad_norm > 0) {
    Value norm;
    grads = clip_by_global_norm(grads, options.clip_grad_norm, &norm);
    g.output("grad_norm", norm);
  }
  optimizer.append_update(g, params, grads);
  g.output("loss", loss);
}

}  // namespace kiln
