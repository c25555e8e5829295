// The host side of the per-step LSTM kernels (kernels/lstm_step.cuh; notes in lstm.h): their
// names, the GEMM tiling of each direction and element type, and the defines that pick them.
#include <fmt/format.h>

#include <string>

#include "backends/cuda/kernel_sources.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

// K tiles (GEMM_KT) and K splits (GEMM_S): shared memory stays under 48 KiB (32 KiB for f64,
// the reduction's 4096 elements) and each thread prefetches 24 (f64: 12) elements a tile.
struct GemmTiling {
  int kt, s;
};
GemmTiling tiling(bool backward, DType dtype) {
  const bool f64 = dtype == DType::f64;
  if (backward) return {f64 ? 128 : 256, 32};
  return {f64 ? 64 : 128, 8};
}

void check_dtype(DType dtype) {
  KILN_ASSERT(is_floating(dtype), "lstm kernels: dtype {}", dtype_name(dtype));
}

}  // namespace

std::string lstm_step_name(bool backward, DType dtype) {
  return fmt::format("kiln_lstm_{}_step_{}", backward ? "backward" : "forward", dtype_name(dtype));
}

gpu::KernelSource lstm_step_source(bool backward, DType dtype) {
  check_dtype(dtype);
  const GemmTiling tile = tiling(backward, dtype);
  return embedded_kernel(lstm_step_name(backward, dtype), kernel_files::lstm_step_cuh,
                         backward ? "KILN_LSTM_BACKWARD_STEP" : "KILN_LSTM_FORWARD_STEP",
                         {{"KILN_T", cuda_type_name(dtype)},
                          {"KILN_GEMM_KT", std::to_string(tile.kt)},
                          {"KILN_GEMM_S", std::to_string(tile.s)}});
}

}  // namespace kiln::cuda
