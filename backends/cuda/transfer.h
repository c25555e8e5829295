// Copies between host and device tensors (synchronous; for setup, checkpoints and tests).
#pragma once

#include "core/tensor.h"

namespace kiln::cuda {

Tensor to_device(const Tensor& host);  // onto the current device, through the caching allocator
Tensor to_host(const Tensor& device);
// Copies `src` into `dst` (same shape and dtype; any devices).
void copy_tensor(const Tensor& src, Tensor& dst);

}  // namespace kiln::cuda
