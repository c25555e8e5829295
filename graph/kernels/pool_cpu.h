// CPU pooling over square windows of NCHW planes: max pooling (first maximum, a NaN wins)
// and average pooling; padded cells never take part (see the note in pool_cpu.cpp).
#pragma once

#include "core/tensor.h"

namespace kiln::kernels {

// x: [B, C, H, W] seen as `planes` = B*C planes of H x W; window (oh, ow) covers rows
// [oh*stride - padding, oh*stride - padding + kernel) and the same for columns.
struct PoolGeometry {
  std::int64_t planes, height, width, kernel, stride, padding, out_h, out_w;
};
// The cells [lo, hi) along one axis (of `size` cells) of window o, clipped to the plane.
struct PoolSpan {
  std::int64_t lo, hi;
  std::int64_t cells() const { return hi - lo; }
};
inline PoolSpan pool_span(std::int64_t o, std::int64_t size, const PoolGeometry& g) {
  const std::int64_t start = o * g.stride - g.padding;
  return {start > 0 ? start : 0, start + g.kernel < size ? start + g.kernel : size};
}

// OH = (H + 2*padding - kernel) / stride + 1, and the same for OW.
PoolGeometry pool_geometry(const Shape& x, std::int64_t kernel, std::int64_t stride,
                           std::int64_t padding = 0);

// y[window] = max of x over the window's cells inside the plane.
void max_pool2d_forward(const Tensor& x, Tensor& y, const PoolGeometry& g);
// dx = dy routed to each window's first maximum of x (zero elsewhere); with `relu`, dy times
// ReLU's mask of the window's maximum (max_rule::relu_routed): dy * (max_pool2d(x) > 0) routed.
void max_pool2d_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const PoolGeometry& g,
                         bool relu = false);
// out[window] = g at each window's first maximum of x.
void max_pool2d_select(const Tensor& x, const Tensor& g_in, Tensor& out, const PoolGeometry& g);

// y[window] = mean of x over the window's cells inside the plane (count_include_pad=false).
void avg_pool2d_forward(const Tensor& x, Tensor& y, const PoolGeometry& g);
// dx[e] = sum over the windows w that contain e of dy[w] / cells(w): the adjoint of the forward.
void avg_pool2d_backward(const Tensor& dy, Tensor& dx, const PoolGeometry& g);

}  // namespace kiln::kernels
