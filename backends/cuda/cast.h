// cast on the GPU outside a compiled step: y = x converted elementwise (floating dtypes, rounding
// to nearest even), one launch of the cast op's kernel (kernels/cast.cuh).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

void cast(DType from, DType to, std::int64_t n, const void* x, void* y, gpu::Stream stream);

}  // namespace kiln::cuda
