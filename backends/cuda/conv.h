// 2-D convolution on the GPU (NCHW, f32/f64, stride and padding as in
// graph/kernels/conv_cpu.cpp): im2col + cuBLAS GEMM, col2im as a deterministic gather.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "fusion/jit/cuda_runtime.h"
#include "graph/kernels/conv_cpu.h"

namespace kiln::cuda {

enum class ConvPass { forward, grad_input, grad_weight };

// Scratch bytes that `pass` needs to process `images_per_chunk` images per step (0: the
// whole batch in one step, the fastest). Any workspace of at least one image's size works:
// the passes loop over as many images as fit. 0 when the pass needs no scratch (1x1 kernel,
// stride 1, no padding, forward and grad_input).
std::size_t conv_workspace_bytes(const kernels::ConvGeometry& g, DType dtype, ConvPass pass,
                                 std::int64_t images_per_chunk = 0);

// Device scratch from the caller (e.g. the memory plan), 256-byte aligned.
struct ConvWorkspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// x: [B, Cin, H, W], w: [Cout, Cin, KH, KW] -> y: [B, Cout, OH, OW].
void conv2d_forward(DType dtype, const kernels::ConvGeometry& g, const void* x, const void* w, void* y,
                    ConvWorkspace workspace, jit::Stream stream);
// dy: [B, Cout, OH, OW], w -> dx: [B, Cin, H, W].
void conv2d_grad_input(DType dtype, const kernels::ConvGeometry& g, const void* dy, const void* w, void* dx,
                       ConvWorkspace workspace, jit::Stream stream);
// x, dy -> dw: [Cout, Cin, KH, KW], summed over the batch.
void conv2d_grad_weight(DType dtype, const kernels::ConvGeometry& g, const void* x, const void* dy, void* dw,
                        ConvWorkspace workspace, jit::Stream stream);

}  // namespace kiln::cuda
