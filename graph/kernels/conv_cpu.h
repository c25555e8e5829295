// CPU convolution (im2col + Eigen GEMM, threads over the batch) and max pooling.
#pragma once

#include "core/tensor.h"

namespace kiln::kernels {

struct ConvGeometry {
  std::int64_t batch, in_channels, height, width;
  std::int64_t out_channels, kernel_h, kernel_w;
  std::int64_t stride, padding;
  std::int64_t out_h, out_w;
};
// x: [B, Cin, H, W], w: [Cout, Cin, KH, KW]
ConvGeometry conv_geometry(const Shape& x, const Shape& w, std::int64_t stride, std::int64_t padding);

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g);
void conv2d_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g);
void conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g);

struct PoolGeometry {
  std::int64_t planes, height, width, kernel, stride, out_h, out_w;
};
PoolGeometry pool_geometry(const Shape& x, std::int64_t kernel, std::int64_t stride);

// y[window] = max of x over the window.
void max_pool2d_forward(const Tensor& x, Tensor& y, const PoolGeometry& g);
// dx = dy routed to each window's first maximum of x (zero elsewhere).
void max_pool2d_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const PoolGeometry& g);
// out[window] = g at each window's first maximum of x.
void max_pool2d_select(const Tensor& x, const Tensor& g_in, Tensor& out, const PoolGeometry& g);

}  // namespace kiln::kernels
