// Max pooling where the pass's [B, C, H, W] tensors (C a multiple of 16) may be stored in
// oneDNN's 16-channel blocked layout (backends/cpu/blocked_layout.h): a block (16 channels of
// an image, [H][W][16]) at a time, the 16 channels of each window side by side in vectors.
// Each channel's windows are visited in pool_cpu.cpp's order and by its rule (the first
// maximum, a NaN wins; gradients summed in window order), so the results are its bits.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "graph/kernels/pool_cpu.h"

namespace kiln::kernels {

// `blocked`: the pass's KernelCall::blocked (input i is bit i, the output bit 16). f32 only.
void max_pool2d_forward_blocked(const Tensor& x, Tensor& y, const PoolGeometry& g,
                                std::uint32_t blocked);
// (relu: max_pool2d_backward's ReLU mask.)
void max_pool2d_backward_blocked(const Tensor& x, const Tensor& dy, Tensor& dx,
                                 const PoolGeometry& g, std::uint32_t blocked, bool relu = false);
void max_pool2d_select_blocked(const Tensor& x, const Tensor& g_in, Tensor& out,
                               const PoolGeometry& g, std::uint32_t blocked);

}  // namespace kiln::kernels
