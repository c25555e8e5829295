// kiln's matmul op on the GPU (graph/ops/matmul_ops.cpp): [batch, M, K] x [batch, K, N]
// -> [batch, M, N], row-major and contiguous, either operand optionally transposed.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// a is stored [batch, M, K] ([batch, K, M] when trans_a), b [batch, K, N] ([batch, N, K]
// when trans_b), c [batch, M, N]; c = alpha * op(a) op(b) + beta * c (beta = 1 accumulates).
struct MatmulArgs {
  DType dtype = DType::f32;
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  double alpha = 1.0, beta = 0.0;
};

// One cuBLAS strided-batched GEMM on `stream` (asynchronous). f32, f64, bf16 or f16 (on the
// tensor cores, accumulating in f32); f32 uses TF32 only when set_allow_tf32(true).
// K == 0 gives c = beta * c.
void matmul(const MatmulArgs& args, gpu::Stream stream);

}  // namespace kiln::cuda
