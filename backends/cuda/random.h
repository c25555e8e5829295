// random_uniform (graph/ops/random_ops.cpp) on the GPU: the same Philox words and float
// conversion as the CPU kernel, so element i of step s is the same bits on both.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// out[0, n) = uniform [0, 1) values of `dtype` (f32, f64; bf16, f16: the f32 value rounded) for
// (seed, *step); *next_step = *step + 1. step and next_step are device pointers to one i64 each.
void random_uniform(DType dtype, std::uint64_t seed, std::int64_t n, const void* step, void* out,
                    void* next_step, gpu::Stream stream);

}  // namespace kiln::cuda
