// The CUDA C sources of every hand-written kernel (im2col, col2im, pooling, transpose,
// one_hot, fill), one function per family; pure strings, so they compile without a GPU.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "fusion/jit/kernel_source.h"

namespace kiln::cuda {

// "float", "double", "int", "long long", "unsigned char".
const char* cuda_type_name(DType dtype);
// The grid-stride loop over [0, n) with 64-bit indices that every kernel uses.
inline constexpr const char* kGridStrideLoop =
    "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)";

// conv_kernels.cpp; x: [B, C, H, W] and col laid out as ConvShape (kernel_params.h) says.
jit::KernelSource im2col_source(DType dtype);
jit::KernelSource col2im_source(DType dtype);

// pool_kernels.cpp
enum class PoolKernel { forward, grad, select };
jit::KernelSource max_pool_source(PoolKernel which, DType dtype);

// layout_kernels.cpp
jit::KernelSource transpose_source(std::size_t element_bytes);  // 1, 2, 4 or 8
jit::KernelSource one_hot_source(DType label, DType out);
jit::KernelSource one_hot_finish_source(DType label);
jit::KernelSource fill_source(DType dtype);

// Every kernel the library can launch, for compile-only tests and preloading.
std::vector<jit::KernelSource> all_kernel_sources();

}  // namespace kiln::cuda
