// float32 convolutions through oneDNN (the library PyTorch's CPU convolutions use), on the
// same NCHW/OIHW buffers and geometry as conv_cpu.h's own kernels.
#pragma once

#include "graph/kernels/conv_cpu.h"

namespace kiln::kernels {

// The oneDNN implementation that pass runs for this geometry, e.g. "jit:avx512_core", or
// "jit_wino_4x3:avx512_core" where it takes Winograd's F(4x4, 3x3).
std::string dnnl_conv2d_implementation(const ConvGeometry& g, ConvPass pass);

void dnnl_conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g);
void dnnl_conv2d_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx,
                                const ConvGeometry& g);
void dnnl_conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw,
                                 const ConvGeometry& g);

}  // namespace kiln::kernels
