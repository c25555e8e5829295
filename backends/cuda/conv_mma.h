// The tensor-core convolution forward of bf16 and f16 (kernels/conv_mma.cuh): its launch over
// one implicit GEMM; conv.cpp decides where it runs (wherever the implicit GEMM would).
#pragma once

#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// y = W x patches as `shape` describes the forward GEMM (conv.cpp's gemm_shape): one launch of
// 64 x 64 tiles; the weights by cp.async where K % 8 == 0 and w is 16-byte aligned.
void conv_mma_forward(DType dtype, const ConvGemmShape& shape, const void* w, const void* x,
                      void* y, gpu::Stream stream);
// Whether conv_mma_forward loads the weights of a K-long filter by cp.async (w aligned).
inline bool conv_mma_vector_weights(int k) { return k % 8 == 0; }

}  // namespace kiln::cuda
