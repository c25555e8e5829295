// The launch of the CUDA-core implicit-GEMM convolution kernel (kernels/conv_igemm.cuh) in a
// given tile: conv.cpp runs each pass through it, the tuner (conv_tuning.h) its candidates.
#pragma once

#include <cstdint>

#include "backends/cuda/conv.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// C = A x B of `shape` (k_chunk: each split's K range) in `tile`, `splits` blocks along K
// (more than one: partials of the compute type into `target`, f32 for bf16/f16, summed later);
// a = W (forward, grad_input) or dy; img = x (forward, grad_weight) or dy. The input gradient
// by classes (IgemmMode::grad_input_classes) takes `classes` (a block z a class) and no split.
// The forward may take conv2d_bias's epilogue (`bias`).
void conv_igemm_launch(IgemmMode mode, DType dtype, IgemmTile tile, const ConvGemmShape& shape,
                       std::int64_t splits, const void* a, const void* img, void* target,
                       gpu::Stream stream, const ConvClasses* classes = nullptr,
                       ConvBias bias = {});

}  // namespace kiln::cuda
