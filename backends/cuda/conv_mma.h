// The tensor-core convolution forward of bf16 and f16 (kernels/conv_mma.cuh): its launch over
// one implicit GEMM; conv.cpp decides where it runs (wherever the implicit GEMM would).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// y = W x patches as `shape` describes the forward GEMM (conv.cpp's gemm_shape): one launch of
// conv_mma_tile_m x 64 tiles; the weights by cp.async where K % 8 == 0 and w is 16-byte aligned.
void conv_mma_forward(DType dtype, const ConvGemmShape& shape, const void* w, const void* x,
                      void* y, gpu::Stream stream);
// Whether conv_mma_forward loads the weights of a K-long filter by cp.async (w aligned).
inline bool conv_mma_vector_weights(std::int64_t k) { return k % 8 == 0; }
// Its tile's filters for an M x N GEMM: 128 (each gathered patch feeds twice the tensor-core
// work) where there are that many and the tiles still fill the 132 SMs, else 64.
inline int conv_mma_tile_m(std::int64_t m, std::int64_t n) {
  return m >= 128 && (m + 127) / 128 * ((n + 63) / 64) >= 132 ? 128 : 64;
}

}  // namespace kiln::cuda
