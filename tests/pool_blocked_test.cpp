// Max pooling over tensors stored in oneDNN's 16-channel blocked layout (pool_blocked.h):
// forward, gradient and select give pool_cpu.cpp's NCHW kernels' bits (ties, NaNs, windows
// clipped by padding, overlapping windows whose gradients sum; the gradient with ReLU's mask
// too), whichever of the pass's tensors are blocked, at 1 and 3 threads.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "graph/kernels/pool_blocked.h"
#include "graph/op.h"
#include "tests/support.h"

namespace kiln {
namespace {

// The NCHW tensor t in the blocked layout [B][C / 16][H][W][16], or back.
Tensor reorder(const Tensor& t, bool to_blocked) {
  const Shape& s = t.shape();
  const std::int64_t cells = s[2] * s[3];
  Tensor out = Tensor::zeros(s, DType::f32);
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t p = 0; p < cells; ++p) {
        const std::int64_t nchw = (b * s[1] + c) * cells + p;
        const std::int64_t blocked = ((b * (s[1] / 16) + c / 16) * cells + p) * 16 + c % 16;
        out.data<float>()[to_blocked ? blocked : nchw] =
            t.data<float>()[to_blocked ? nchw : blocked];
      }
  return out;
}

// Values in {0, 1, 2} (many ties) with every 13th a NaN.
Tensor tied(const Shape& shape) {
  Tensor x = test::random_tensor(shape, DType::f32, 11, 0.0, 3.0);
  float* p = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    p[i] = i % 13 == 4 ? std::numeric_limits<float>::quiet_NaN() : std::floor(p[i]);
  return x;
}

// x - 1: values in {-1, 0, 1} and the NaNs.
Tensor shifted(const Tensor& x) {
  Tensor out = x.clone();
  for (std::int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] -= 1.0f;
  return out;
}

// Bitwise equal (the same NaN bits too: the kernels copy them).
bool same_bits(const Tensor& a, const Tensor& b) {
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("blocked max pooling: the NCHW kernels' bits, whichever tensors are blocked") {
  const int before = omp_get_max_threads();
  struct Case {
    std::int64_t kernel, stride, padding;
    Shape x;
  };
  for (const Case& c : {Case{2, 2, 0, Shape{3, 32, 9, 11}}, Case{3, 2, 1, Shape{2, 16, 10, 28}},
                        Case{3, 1, 1, Shape{2, 48, 7, 7}}, Case{3, 2, 0, Shape{2, 16, 9, 11}}}) {
    CAPTURE(c.x.str());
    CAPTURE(c.kernel);
    CAPTURE(c.stride);
    const kernels::PoolGeometry g = kernels::pool_geometry(c.x, c.kernel, c.stride, c.padding);
    const Shape ys{c.x[0], c.x[1], g.out_h, g.out_w};
    const Tensor x = tied(c.x);
    const Tensor dy = test::random_tensor(ys, DType::f32, 12);
    const Tensor other = test::random_tensor(c.x, DType::f32, 13);
    Tensor y = Tensor::zeros(ys, DType::f32), selected = Tensor::zeros(ys, DType::f32);
    Tensor dx = Tensor::zeros(c.x, DType::f32), dx_relu = Tensor::zeros(c.x, DType::f32);
    const Tensor x_signed = shifted(x);  // (relu=1: maxima positive, zero, negative and NaN)
    kernels::max_pool2d_forward(x, y, g);
    kernels::max_pool2d_backward(x, dy, dx, g);
    kernels::max_pool2d_backward(x_signed, dy, dx_relu, g, /*relu=*/true);
    kernels::max_pool2d_select(x, other, selected, g);
    // Each input blocked or not, and the output: the seven combinations with something
    // blocked (the forward reads bit 0 only).
    for (std::uint32_t combo = 1; combo < 8; ++combo) {
      const bool b0 = (combo & 1u) != 0, b1 = (combo & 2u) != 0, bo = (combo & 4u) != 0;
      const std::uint32_t bits =
          (b0 ? 1u : 0u) | (b1 ? 2u : 0u) | (bo ? 1u << kBlockedOutputs : 0u);
      for (const int threads : {1, 3}) {
        omp_set_num_threads(threads);
        CAPTURE(bits);
        CAPTURE(threads);
        const Tensor xb = b0 ? reorder(x, true) : x.clone();
        Tensor yb = Tensor::zeros(ys, DType::f32), sb = Tensor::zeros(ys, DType::f32);
        Tensor dxb = Tensor::full(c.x, 5.0, DType::f32);  // cleared by the gradient
        kernels::max_pool2d_forward_blocked(xb, yb, g, bits);
        kernels::max_pool2d_backward_blocked(xb, b1 ? reorder(dy, true) : dy.clone(), dxb, g, bits);
        kernels::max_pool2d_select_blocked(xb, b1 ? reorder(other, true) : other.clone(), sb, g,
                                           bits);
        CHECK(same_bits(bo ? reorder(yb, false) : yb, y));
        CHECK(same_bits(bo ? reorder(dxb, false) : dxb, dx));
        CHECK(same_bits(bo ? reorder(sb, false) : sb, selected));
        Tensor relu_b = Tensor::full(c.x, 5.0, DType::f32);
        kernels::max_pool2d_backward_blocked(b0 ? reorder(x_signed, true) : x_signed.clone(),
                                             b1 ? reorder(dy, true) : dy.clone(), relu_b, g, bits,
                                             /*relu=*/true);
        CHECK(same_bits(bo ? reorder(relu_b, false) : relu_b, dx_relu));
      }
    }
  }
  omp_set_num_threads(before);
}

}  // namespace kiln
