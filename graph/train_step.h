// The training step as graph ops: gradients of the loss, then the optimizer's update.
#pragma once

#include <vector>

#include "graph/optim.h"

namespace kiln {

// Appends to loss's graph the gradients of `params`, the optimizer update (as
// assignments) and the output "loss". `params` must be trainable.
void append_training_step(Value loss, const std::vector<VariablePtr>& params, Optimizer& optimizer);

}  // namespace kiln
