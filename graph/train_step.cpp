// Autograd, gradient clipping and the optimizer, in one graph.
#include "graph/train_step.h"

#include <algorithm>
#include <cmath>

#include "graph/autograd.h"
#include "graph/ops.h"

namespace kiln {

std::vector<Value> clip_by_global_norm(const std::vector<Value>& grads, double max_norm,
                                       Value* norm) {
  KILN_CHECK(std::isfinite(max_norm) && max_norm > 0,
             "gradient clipping: the maximum norm must be positive (got {})", max_norm);
  if (grads.empty()) return grads;
  Value squares;  // sum over params of sum(g * g): []
  for (const Value& g : grads) {
    KILN_CHECK(g.dtype() == grads[0].dtype(),
               "gradient clipping: gradients of dtypes {} and {} cannot share one norm",
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

std::vector<Value> average_over_ranks(const std::vector<Value>& grads, int group,
                                      std::size_t bucket_bytes, Value* loss) {
  std::vector<Value> averaged(grads.size());
  std::vector<std::size_t> bucket;  // indices into grads
  std::size_t bytes = 0;
  auto flush = [&](bool last) {
    std::vector<Value> values;
    for (std::size_t i : bucket) values.push_back(grads[i]);
    if (last && loss != nullptr) values.push_back(*loss);
    if (values.empty()) return;
    const std::vector<Value> means = all_reduce_mean(values, group);
    for (std::size_t k = 0; k < bucket.size(); ++k) averaged[bucket[k]] = means[k];
    if (last && loss != nullptr) *loss = means.back();
    bucket.clear();
    bytes = 0;
  };
  for (std::size_t i = grads.size(); i-- > 0;) {
    bucket.push_back(i);
    bytes += static_cast<std::size_t>(grads[i].shape().numel()) * dtype_size(grads[i].dtype());
    if (bytes >= bucket_bytes && i > 0) flush(false);
  }
  flush(true);
  return averaged;
}

namespace {

// The forward's pending floating-point buffer updates (batch norm's running statistics)
// replaced by their mean over the ranks, so every replica keeps the same buffers.
void average_buffer_updates(Graph& g, const std::vector<VariablePtr>& params, int group) {
  std::vector<VariablePtr> vars;
  std::vector<Value> values;
  for (const auto& [var, ref] : g.assignments()) {
    if (!is_floating(var->value.dtype()) ||
        std::find(params.begin(), params.end(), var) != params.end())
      continue;
    vars.push_back(var);
    values.push_back(g.value(ref));
  }
  if (values.empty()) return;
  const std::vector<Value> means = all_reduce_mean(values, group);
  for (std::size_t i = 0; i < vars.size(); ++i) g.assign_latest(vars[i], means[i]);
}

// Gradient accumulation (TrainStepOptions::accumulate): each gradient replaced by the mean of
// its accumulator plus it; returns the run's `apply` flag, [] of 1 on every n-th run, else 0.
Value accumulate_gradients(Graph& g, const std::vector<VariablePtr>& params,
                           std::vector<Value>& grads, int n) {
  const VariablePtr counter =
      make_variable("accumulate.runs", Tensor::zeros({}, DType::f32), false);
  const Value runs = g.variable(counter) + 1.0;
  const Value apply = 1.0 - greater(scalar_like(runs, n), runs);  // runs >= n
  g.assign(counter, select(apply, scalar_like(runs, 0.0), runs));
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const VariablePtr sum = make_variable("accumulate." + params[i]->name,
                                          Tensor::zeros(grads[i].shape(), grads[i].dtype()), false);
    const Value total = g.variable(sum) + grads[i];
    // select, not a product: a non-finite sum (an fp16 overflow) is emptied too.
    g.assign(sum, select(cast(apply, total.dtype()), scalar_like(total, 0.0), total));
    grads[i] = total * (1.0 / n);
  }
  return apply;
}

}  // namespace

void append_training_step(Value loss, const std::vector<VariablePtr>& params, Optimizer& optimizer,
                          const TrainStepOptions& options) {
  Graph& g = loss.graph();
  std::vector<Value> wrt;
  for (const VariablePtr& p : params) {
    KILN_CHECK(p->trainable, "training step: '{}' is not trainable", p->name);
    wrt.push_back(g.variable(p));
  }
  std::optional<LossScaler> scaler;
  if (options.loss_scale) scaler.emplace(optimizer, *options.loss_scale);
  std::vector<Value> grads = grad(scaler ? scaler->scaled(loss) : loss, wrt);
  KILN_CHECK(options.accumulate >= 1, "training step: accumulate must be >= 1 (got {})",
             options.accumulate);
  Value apply;  // accumulation: whether this run updates
  if (options.accumulate > 1) {
    if (scaler) grads = scaler->unscaled(grads);  // each run's own scale
    apply = accumulate_gradients(g, params, grads, options.accumulate);
  }
  if (options.data_parallel_group >= 0) {
    KILN_CHECK(options.bucket_bytes > 0,
               "training step: the all-reduce bucket size must be positive");
    average_buffer_updates(g, params, options.data_parallel_group);
    grads = average_over_ranks(grads, options.data_parallel_group, options.bucket_bytes, &loss);
  }
  if (scaler && !apply.valid()) grads = scaler->unscaled(grads);
  KILN_CHECK(std::isfinite(options.clip_grad_norm) && options.clip_grad_norm >= 0,
             "training step: clip_grad_norm must be >= 0 (got {})", options.clip_grad_norm);
  if (options.clip_grad_norm > 0) {
    Value norm;
    grads = clip_by_global_norm(grads, options.clip_grad_norm, &norm);
    g.output("grad_norm", norm);
  }
  optimizer.append_update(g, params, grads);
  if (scaler) scaler->guard_update(g, grads, params);
  // The runs that only accumulate keep every parameter and state.
  if (apply.valid()) update_only_if(g, apply, params, optimizer);
  g.output("loss", loss);
}

}  // namespace kiln
