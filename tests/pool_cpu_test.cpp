// Max pooling's fixed-window paths (unpadded 2x2 windows at stride 2, each row of windows a
// vectorized loop; unpadded 3x3 windows at stride 2; padded 3x3 windows at stride 1 and 2, by
// rows then columns, clipped at the plane's edges) against the definition, on inputs full of
// ties and NaNs: the first maximum in row-major window order wins (a NaN always does), for the
// forward, the gradient and the select, at 1 and 3 threads. The gradient with ReLU's mask
// (relu=1) against the mask applied to dy first, on every path, f32 and f64.
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "graph/kernels/pool_cpu.h"
#include "tests/support.h"

namespace kiln {
namespace {

// Values in {0, 1, 2} (many ties) with every 17th a NaN.
Tensor tied_input(const Shape& shape) {
  Tensor x = test::random_tensor(shape, DType::f32, 7, 0.0, 3.0);
  float* p = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    p[i] = i % 17 == 5 ? std::numeric_limits<float>::quiet_NaN() : std::floor(p[i]);
  return x;
}

// The offset of window (plane, oh, ow)'s first maximum, by the definition: the window's cells
// clipped to the plane (Note [padded pooling]) in row-major order.
std::int64_t first_max(const float* x, const kernels::PoolGeometry& g, std::int64_t plane,
                       std::int64_t oh, std::int64_t ow) {
  const std::int64_t top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
  std::int64_t best = -1;
  for (std::int64_t h = std::max<std::int64_t>(top, 0); h < std::min(top + g.kernel, g.height); ++h)
    for (std::int64_t w = std::max<std::int64_t>(left, 0); w < std::min(left + g.kernel, g.width);
         ++w) {
      const std::int64_t at = (plane * g.height + h) * g.width + w;
      if (best < 0 || x[at] > x[best] || std::isnan(x[at])) best = at;
    }
  return best;
}

bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

struct Window {
  std::int64_t kernel, stride, padding;
};

}  // namespace

TEST_CASE(
    "max pooling's fixed-window paths: the first maximum wins (ties, NaN) in all three kernels") {
  const int before = omp_get_max_threads();
  // Odd and even planes: at stride 2 the last window is clipped (9 rows, 11 columns) or whole
  // (10 rows, 28 columns); 2 columns: every window clipped on both sides. 2x2 rows of 35 and
  // 33 windows run the vectorized loops' whole vectors as well as their remainders (the
  // first on 64 planes, enough for the threads to share them). The padded 3x3 pools take
  // planes in batches (whole ones, a partial last one; the last two shapes: many planes,
  // shared by the threads).
  for (const auto& [window, xs] : {std::pair{Window{2, 2, 0}, Shape{3, 5, 9, 11}},
                                   {Window{2, 2, 0}, Shape{4, 16, 10, 70}},
                                   {Window{2, 2, 0}, Shape{2, 3, 7, 67}},
                                   {Window{3, 2, 0}, Shape{3, 5, 9, 11}},
                                   {Window{3, 1, 1}, Shape{3, 5, 9, 11}},
                                   {Window{3, 2, 1}, Shape{3, 5, 9, 11}},
                                   {Window{3, 1, 1}, Shape{2, 3, 10, 28}},
                                   {Window{3, 2, 1}, Shape{2, 3, 10, 28}},
                                   {Window{3, 1, 1}, Shape{1, 2, 5, 2}},
                                   {Window{3, 1, 1}, Shape{4, 67, 7, 7}},
                                   {Window{3, 2, 1}, Shape{3, 45, 14, 14}}}) {
    const std::int64_t kernel = window.kernel;
    CAPTURE(window.stride);
    CAPTURE(window.padding);
    CAPTURE(xs.str());
    const kernels::PoolGeometry g =
        kernels::pool_geometry(xs, kernel, window.stride, window.padding);
    const Tensor x = tied_input(xs);
    const Shape ys{xs[0], xs[1], g.out_h, g.out_w};
    const Tensor dy = test::random_tensor(ys, DType::f32, 8);
    const Tensor other = test::random_tensor(xs, DType::f32, 9);
    for (const int threads : {1, 3}) {
      omp_set_num_threads(threads);
      CAPTURE(kernel);
      CAPTURE(threads);
      Tensor y = Tensor::zeros(ys, DType::f32), selected = Tensor::zeros(ys, DType::f32);
      Tensor dx = Tensor::full(xs, 5.0, DType::f32);  // the gradient must clear it first
      kernels::max_pool2d_forward(x, y, g);
      kernels::max_pool2d_backward(x, dy, dx, g);
      kernels::max_pool2d_select(x, other, selected, g);
      Tensor dx_ref = Tensor::zeros(xs, DType::f32);
      int mismatches = 0;
      for (std::int64_t plane = 0; plane < g.planes; ++plane)
        for (std::int64_t oh = 0; oh < g.out_h; ++oh)
          for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
            const std::int64_t i = (plane * g.out_h + oh) * g.out_w + ow;
            const std::int64_t best = first_max(x.data<float>(), g, plane, oh, ow);
            mismatches += !same(y.data<float>()[i], x.data<float>()[best]);
            mismatches += selected.data<float>()[i] != other.data<float>()[best];
            dx_ref.data<float>()[best] += dy.data<float>()[i];
          }
      for (std::int64_t e = 0; e < x.numel(); ++e)
        mismatches += dx.data<float>()[e] != dx_ref.data<float>()[e];
      CHECK(mismatches == 0);
    }
  }
  omp_set_num_threads(before);
}

namespace {

// x in {-1, 0, 1} with signed zeros and NaNs (every window's maximum positive, zero, negative or
// NaN), of `dtype`.
Tensor signed_ties(const Shape& shape, DType dtype, std::uint64_t seed) {
  Tensor x = test::random_tensor(shape, DType::f64, seed, -1.0, 2.0);
  double* p = x.data<double>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    p[i] = std::floor(p[i]);
    if (p[i] == 0 && i % 3 == 0) p[i] = -0.0;
    if (i % 23 == 7) p[i] = std::numeric_limits<double>::quiet_NaN();
  }
  return dtype == DType::f64 ? x : x.to(dtype);
}

}  // namespace

TEST_CASE(
    "max_pool2d_grad relu=1: the bits of dy * (max_pool2d(x) > 0) routed, on every path, f32 "
    "and f64") {
  const int before = omp_get_max_threads();
  std::uint64_t seed = 70;
  for (const DType dtype : {DType::f32, DType::f64})
    for (const auto& [window, xs] : {std::pair{Window{2, 2, 0}, Shape{3, 5, 8, 10}},
                                     {Window{2, 2, 0}, Shape{2, 40, 9, 11}},
                                     {Window{3, 2, 0}, Shape{3, 5, 9, 11}},
                                     {Window{3, 1, 1}, Shape{2, 45, 7, 7}},
                                     {Window{3, 2, 1}, Shape{3, 5, 10, 28}},
                                     {Window{2, 1, 0}, Shape{2, 3, 7, 6}},
                                     {Window{5, 2, 2}, Shape{2, 3, 9, 8}},
                                     {Window{4, 3, 2}, Shape{2, 3, 7, 10}}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(xs.str());
      CAPTURE(window.kernel);
      CAPTURE(window.stride);
      CAPTURE(window.padding);
      const kernels::PoolGeometry g =
          kernels::pool_geometry(xs, window.kernel, window.stride, window.padding);
      const Shape ys{xs[0], xs[1], g.out_h, g.out_w};
      const Tensor x = signed_ties(xs, dtype, seed++);
      Tensor dy = test::random_tensor(ys, DType::f64, seed++, -1.0, 1.0);
      dy.data<double>()[1] = std::numeric_limits<double>::infinity();  // inf * 0 is a NaN
      dy.data<double>()[4] = std::numeric_limits<double>::quiet_NaN();
      if (dtype != DType::f64) dy = dy.to(dtype);
      Tensor y = Tensor::zeros(ys, dtype), masked = dy.clone();
      kernels::max_pool2d_forward(x, y, g);
      for (std::int64_t i = 0; i < y.numel(); ++i)  // dy * greater(y, 0), as the ops compute it
        if (dtype == DType::f32)
          masked.data<float>()[i] *= y.data<float>()[i] > 0.0f ? 1.0f : 0.0f;
        else
          masked.data<double>()[i] *= y.data<double>()[i] > 0.0 ? 1.0 : 0.0;
      Tensor want = Tensor::full(xs, 5.0, dtype);
      kernels::max_pool2d_backward(x, masked, want, g);
      for (const int threads : {1, 3}) {
        CAPTURE(threads);
        omp_set_num_threads(threads);
        Tensor got = Tensor::full(xs, 5.0, dtype);
        kernels::max_pool2d_backward(x, dy, got, g, /*relu=*/true);
        CHECK(std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0);
      }
    }
  omp_set_num_threads(before);
}

}  // namespace kiln
