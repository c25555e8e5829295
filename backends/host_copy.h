// A host copy of a tensor wherever it lives (checkpoints, tests, printing).
#pragma once

#include "core/tensor.h"

namespace kiln {

Tensor to_host(const Tensor& t);

}  // namespace kiln
