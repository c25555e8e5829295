// The training step as graph ops: gradients of the loss, optionally clipped by their global
// norm, then the optimizer's update.
#pragma once

#include <vector>

#include "graph/optim.h"

namespace kiln {

struct TrainStepOptions {
  // > 0: before the update every gradient is multiplied by min(1, clip / (norm + 1e-6)),
  // norm = sqrt(sum over params of sum(g * g)) (PyTorch's clip_grad_norm_). 0: off.
  double clip_grad_norm = 0;
};

// The gradients scaled to a global L2 norm of at most `max_norm` (> 0), as graph ops that
// fuse like any other; `norm`, when given, receives the global norm before scaling ([]).
// Below the threshold the scale is exactly 1, so the gradients are unchanged.
std::vector<Value> clip_by_global_norm(const std::vector<Value>& grads, double max_norm, Value* norm = nullptr);

// Appends to loss's graph the gradients of `params`, the optimizer update (as
// assignments) and the output "loss" (and "grad_norm", the norm before clipping, when
// clipping is on). `params` must be trainable.
void append_training_step(Value loss, const std::vector<VariablePtr>& params, Optimizer& optimizer,
                          const TrainStepOptions& options = {});

}  // namespace kiln
