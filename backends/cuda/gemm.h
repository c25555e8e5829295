// Row-major strided-batched GEMM on cuBLAS (column-major) through the usual swap:
// C = op(A) op(B) row-major is C^T = op(B)^T op(A)^T column-major. Shared by matmul and conv.
#pragma once

#include <cstdint>

#include <cublas_api.h>
#include <library_types.h>

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// For each of `batch` items: C[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C, every
// matrix row-major with its row length (ld_*) and item stride (stride_*, may be 0) in
// elements; op(X) is X^T when trans_x, where A is stored [k, m] (ld >= m) and so on.
struct RowMajorGemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  std::int64_t ld_a = 0, stride_a = 0;
  const void* b = nullptr;
  std::int64_t ld_b = 0, stride_b = 0;
  void* c = nullptr;
  std::int64_t ld_c = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
};

// f32 (TF32 tensor cores only when allow_tf32()), f64, or bf16/f16 on the tensor cores with
// f32 accumulation and alpha, beta (each element of C rounded once, where it is stored);
// asynchronous on `stream`. Throws kiln::Error for another dtype or a size beyond cuBLAS's
// 32-bit int arguments.
void gemm(DType dtype, const RowMajorGemm& g, gpu::Stream stream);
// The same with A and B of `ab` and C of `c`: c == ab, or bf16/f16 operands into an f32 C
// (the convolutions' f32 scratch where partial results are summed further).
void gemm(DType ab, DType c, const RowMajorGemm& g, gpu::Stream stream);

// cuBLAS's name of a dtype (f32, f64, bf16, f16; kiln::Error for another), and the compute
// type of GEMMs of `ab` operands: f64 in f64, f32 in f32 or TF32, bf16/f16 accumulating in f32.
cudaDataType_t cuda_data_type(DType dtype);
cublasComputeType_t compute_type(DType ab);

}  // namespace kiln::cuda
