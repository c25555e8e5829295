// CPU transpose: y = x with its axes permuted (y's axis d is x's axis perm[d]), any dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kiln::kernels {

void transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& y);

}  // namespace kiln::kernels
