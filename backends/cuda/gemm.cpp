// The one place that calls cublasGemmStridedBatchedEx: data and compute types (bf16/f16 on
// the tensor cores with f32 accumulation), the row-major swap, argument range checks, and
// k == 0 (C = beta * C, done as a fill/scale).
#include "backends/cuda/gemm.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "backends/cuda/cublas_handle.h"
#include "core/error.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {
namespace {

int to_int(std::int64_t v, const char* what) {
  KILN_CHECK(v >= 0 && v <= INT_MAX, "gemm: {} = {} does not fit cuBLAS's 32-bit int arguments",
             what, v);
  return static_cast<int>(v);
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      break;
  }
  throw Error(fmt::format("gemm: dtype {} is not supported (f32, f64, bf16 or f16 expected)",
                          dtype_name(dtype)));
}

// f64 in f64; f32 in f32 or TF32; bf16 and f16 on the tensor cores, accumulating in f32.
cublasComputeType_t compute_type(DType ab) {
  if (ab == DType::f64) return CUBLAS_COMPUTE_64F;
  if (ab == DType::f32 && allow_tf32()) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

void gemm(DType dtype, const RowMajorGemm& g, gpu::Stream stream) { gemm(dtype, dtype, g, stream); }

void gemm(DType ab, DType c, const RowMajorGemm& g, gpu::Stream stream) {
  const cudaDataType_t type = cuda_data_type(ab), c_type = cuda_data_type(c);
  KILN_CHECK(c == ab || (is_low_precision(ab) && c == DType::f32),
             "gemm: {} operands into a {} result are not supported", dtype_name(ab), dtype_name(c));
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0 && g.beta == 0.0 && g.ld_c == g.n &&
      g.stride_c == g.m * g.n) {  // an empty sum: C = 0
    KILN_CUDA_CHECK(cudaMemsetAsync(
        g.c, 0, static_cast<std::size_t>(g.batch * g.m * g.n) * dtype_size(c), stream));
    return;
  }
  // cuBLAS needs ld >= rows of the column-major view, i.e. >= the stored row length, and >= 1.
  const int ld_a = to_int(std::max<std::int64_t>(g.ld_a, 1), "lda");
  const int ld_b = to_int(std::max<std::int64_t>(g.ld_b, 1), "ldb");
  const int ld_c = to_int(std::max<std::int64_t>(g.ld_c, 1), "ldc");
  const int m = to_int(g.m, "m"), n = to_int(g.n, "n"), k = to_int(g.k, "k");
  const int batch = to_int(g.batch, "batch");
  // alpha and beta are of the compute type: double for f64, float for the others.
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const void* alpha = ab != DType::f64 ? static_cast<const void*>(&alpha_f) : &g.alpha;
  const void* beta = ab != DType::f64 ? static_cast<const void*>(&beta_f) : &g.beta;
  // Column-major: C^T[n, m] = op(B)^T[n, k] op(A)^T[k, m]; a row-major X is X^T column-major.
  KILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle_for(stream), op(g.trans_b), op(g.trans_a), n, m, k, alpha, g.b, type, ld_b, g.stride_b,
      g.a, type, ld_a, g.stride_a, beta, g.c, c_type, ld_c, g.stride_c, batch, compute_type(ab),
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace kiln::cuda
