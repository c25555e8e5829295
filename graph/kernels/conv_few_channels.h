// Convolutions over one to three input channels (a network's first layer), forward and weight
// gradient, computed directly rather than through oneDNN or im2col + GEMM (conv_cpu.cpp
// chooses them for one channel at stride 1, where they were measured faster). Any kernel size,
// stride and padding; f32 and f64; the same bits for any thread count.
#pragma once

#include "core/tensor.h"
#include "graph/kernels/conv_cpu.h"

namespace kiln::kernels {

bool few_channels_fits(const ConvGeometry& g);  // 1 to 3 input channels: these compute it
void few_channels_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                          const ConvEpilogue& epilogue = {});
void few_channels_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw,
                                  const ConvGeometry& g);

}  // namespace kiln::kernels
