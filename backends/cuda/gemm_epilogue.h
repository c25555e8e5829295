// A row-major GEMM with cuBLASLt's bias epilogue (and ReLU): C[m, n] = op(A) op(B) + bias[n],
// then max(., 0) when relu; the matmul_bias op on the GPU. The row-major swap of gemm.h: the
// column-major C^T has the bias along its rows, which is cuBLASLt's bias vector.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

struct BiasGemm {
  DType dtype = DType::f32;       // A, B and C: f32 (TF32 when allowed), bf16 or f16
  DType bias_dtype = DType::f32;  // the bias: the same, or f32
  bool trans_a = false, trans_b = false, relu = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // stored [m, k] ([k, m] when trans_a)
  const void* b = nullptr;  // stored [k, n] ([n, k] when trans_b)
  const void* bias = nullptr;
  void* c = nullptr;  // [m, n]
};

// The descriptors, the heuristic's algorithm and its workspace (the plan's own: its launches
// may run on any stream at once), made once; launch() only calls cublasLtMatmul on the stream.
class BiasGemmPlan {
 public:
  explicit BiasGemmPlan(const BiasGemm& g);
  ~BiasGemmPlan();
  BiasGemmPlan(const BiasGemmPlan&) = delete;
  BiasGemmPlan& operator=(const BiasGemmPlan&) = delete;
  void launch(gpu::Stream stream) const;

 private:
  struct Descriptors;
  BiasGemm g_;
  std::unique_ptr<Descriptors> d_;
};

}  // namespace kiln::cuda
