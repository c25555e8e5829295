// The CUDA C sources of every hand-written kernel (implicit-GEMM convolution, im2col,
// col2im, pooling, transpose, one_hot, fill, random, LSTM steps), one function per family;
// pure strings, so they compile without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gpu/kernel_source.h"

namespace kiln::cuda {

// "float", "double", "int", "long long", "unsigned char".
const char* cuda_type_name(DType dtype);
// The grid-stride loop over [0, n) with 64-bit indices that every kernel uses.
inline constexpr const char* kGridStrideLoop =
    "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long "
    "long)gridDim.x * blockDim.x)";

// conv_kernels.cpp; x: [B, C, H, W] and col laid out as ConvShape (kernel_params.h) says.
gpu::KernelSource im2col_source(DType dtype);
gpu::KernelSource col2im_source(DType dtype);

// The implicit-GEMM convolution kernels (conv_kernels.cpp; ConvGemmShape in kernel_params.h):
// a BM x BN tile of C per block, KG groups of threads each summing KS rows of every K step
// (of KS * KG rows), 4x4 per thread.
enum class IgemmMode { forward = 0, grad_input = 1, grad_weight = 2 };
struct IgemmTile {
  int bm = 64, bn = 64, kg = 1, ks = 16;
  int tm = 4, tn = 4;  // each thread's sub-tile: 4 or 8 rows by 4 or 8 columns
  bool operator==(const IgemmTile&) const = default;
};
// Whether a kernel exists for `tile` (shape rules, 64 to 1024 threads, 48 KiB of shared memory).
bool igemm_tile_valid(IgemmTile tile, DType dtype);
int igemm_threads(IgemmTile tile);  // threads per block
std::size_t igemm_static_shared_bytes(IgemmTile tile, DType dtype);
std::string conv_igemm_name(IgemmMode mode, IgemmTile tile, DType dtype);
gpu::KernelSource conv_igemm_source(IgemmMode mode, IgemmTile tile, DType dtype);
// The tile for a pass whose GEMM is C[m, n] = A[m, k] B[k, n], and every tile that choice
// can return for `mode` (the ones all_kernel_sources lists).
IgemmTile igemm_choose_tile(IgemmMode mode, DType dtype, std::int64_t m, std::int64_t n);
std::vector<IgemmTile> igemm_tiles(IgemmMode mode, DType dtype);
// out[i] = the ordered sum over z of part[z * mn + i] (split-K partials of grad_weight).
gpu::KernelSource conv_splitk_sum_source(DType dtype);

// pool_kernels.cpp
enum class PoolKernel { forward, grad, select };
gpu::KernelSource max_pool_source(PoolKernel which, DType dtype);  // 64-bit indices, any size
// 32-bit-index kernels (PoolShape32, planes * H * W < 2^30): forward and select with the
// window size fixed at 2 (k2) or any; the gradient as one thread per cell of windows that
// do not overlap (stride >= kernel; cells2: exact 2x2 cells, kernel = stride = 2, even H, W)
// or as a gather per input element (overlap: stride < kernel).
enum class PoolFast {
  forward_k2,
  forward_any,
  select_k2,
  select_any,
  grad_cells2,
  grad_cells,
  grad_overlap
};
std::string max_pool_fast_name(PoolFast which, DType dtype);
gpu::KernelSource max_pool_fast_source(PoolFast which, DType dtype);
// Average pooling (64-bit indices): forward per window, gradient (dy -> dx) per input element.
std::string avg_pool_name(bool grad, DType dtype);
gpu::KernelSource avg_pool_source(bool grad, DType dtype);

// layout_kernels.cpp
gpu::KernelSource transpose_source(std::size_t element_bytes);  // 1, 2, 4 or 8
gpu::KernelSource concat_source(std::size_t element_bytes);     // ConcatPieces (kernel_params.h)
gpu::KernelSource one_hot_source(DType label, DType out);
gpu::KernelSource one_hot_finish_source(DType label);
gpu::KernelSource fill_source(DType dtype);

// random.cpp: Philox uniform values (f32, f64) for random_uniform.
gpu::KernelSource random_uniform_source(DType dtype);

// lstm_kernels.cpp: one time step of lstm_sequence (forward) or lstm_sequence_grad
// (backward), the recurrent GEMM fused with the cell (backends/cuda/lstm.h).
std::string lstm_step_name(bool backward, DType dtype);
gpu::KernelSource lstm_step_source(bool backward, DType dtype);  // f32 or f64
std::string lstm_persistent_name(DType dtype);
gpu::KernelSource lstm_persistent_source(DType dtype);  // the forward, all steps in one launch

// Every kernel the library can launch, for compile-only tests and preloading.
std::vector<gpu::KernelSource> all_kernel_sources();

}  // namespace kiln::cuda
