// Reverse-mode autograd: walks the recorded nodes (the tape) backwards from a scalar loss
// and appends gradient ops to the same graph.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace kiln {

// d loss / d v for each v in `wrt`, as values of loss's graph. `loss` must have one
// element. A value that loss does not depend on gets a zero gradient. Gradients of a
// value with several consumers are summed (graph/grad_sum.h); broadcast gradients are
// summed back to the input's shape.
std::vector<Value> grad(Value loss, const std::vector<Value>& wrt);

// Sums `g` over the axes along which `shape` was broadcast to g's shape.
Value sum_to_shape(Value g, const Shape& shape);

}  // namespace kiln
