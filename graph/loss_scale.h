// Dynamic loss scaling for fp16 steps, as graph ops (no host synchronisation: it runs inside a
// captured CUDA graph). The loss is multiplied by the scale before the backward, so that small
// gradients survive in f16; the gradients are divided by it again in fp32; if any gradient is
// Inf or NaN, every update of the step (parameters and optimizer state) is skipped and the
// scale halves, otherwise the scale doubles after `growth_interval` clean steps in a row
// (PyTorch's GradScaler, with its defaults).
#pragma once

#include <vector>

#include "graph/optim.h"

namespace kiln {

struct LossScaleOptions {
  double initial = 65536;  // 2^16
  double growth = 2.0;
  double backoff = 0.5;
  double growth_interval = 2000;
};

// The scaler's state lives in the optimizer's (checkpointed with it): "loss_scale" (f32),
// "loss_scale.clean_steps" (f32, below growth_interval) and "loss_scale.skipped_steps" (f64:
// exact for 2^53 steps).
// The pending assignments of `params` and of the optimizer's state (the floating ones) kept as
// the variables were where `condition` ([], 1 or 0) is 0: each becomes select(condition, new,
// old). A skipped update (the loss scaler's overflow, a run that only accumulates gradients).
void update_only_if(Graph& g, const Value& condition, const std::vector<VariablePtr>& params,
                    const Optimizer& optimizer);

class LossScaler {
 public:
  LossScaler(Optimizer& optimizer, const LossScaleOptions& options);
  Value scaled(Value loss);                                      // loss * scale
  std::vector<Value> unscaled(const std::vector<Value>& grads);  // each / scale, in fp32
  // After the optimizer's update: 1 when every gradient is finite, else 0; each assignment of
  // a parameter or optimizer variable keeps its old value when 0; the scale and the counts
  // update. Adds outputs "loss_scale" and "skipped_steps".
  void guard_update(Graph& g, const std::vector<Value>& grads,
                    const std::vector<VariablePtr>& params);

 private:
  LossScaleOptions options_;
  Optimizer& optimizer_;
  VariablePtr scale_, clean_, skipped_;
};

}  // namespace kiln
