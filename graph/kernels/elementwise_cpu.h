// The CPU evaluator of elementwise ops: broadcasting, dimension collapsing and threads
// around an op's ElementwiseLoops.
#pragma once

#include "graph/op.h"

namespace kiln::kernels {

// Evaluates `loops` over broadcast inputs into `out` (contiguous, the broadcast shape).
void run_elementwise(const ElementwiseLoops& loops, std::span<const Tensor> inputs, Tensor& out);

}  // namespace kiln::kernels
