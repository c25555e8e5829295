// The direct convolutions over one to three input channels (graph/kernels/conv_few_channels.h),
// forward and weight gradient, against the definition summed in double: odd sizes, kernels of
// 1 to 5, strides 1 to 3, padding 0 to 2, batch 1 and more than 8 images (the weight
// gradient's chunks), f32 and f64; and the same bits for 1, 2 and 3 threads.
#include <doctest/doctest.h>

#include <omp.h>

#include <cstring>
#include <vector>

#include "graph/kernels/conv_few_channels.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct Case {
  std::int64_t batch, in_channels, height, width, out_channels, kernel, stride, padding;
};

const Case kCases[] = {
    {4, 1, 28, 28, 16, 3, 1, 1},  // LeNet's and VGG's first layer
    {3, 1, 28, 28, 8, 4, 2, 1},   // DCGAN's discriminator
    {9, 3, 11, 7, 5, 3, 1, 1},    // 9 images: two images in the first chunk
    {1, 2, 9, 13, 3, 5, 2, 2},    // batch 1, strided, the last window short of the edge
    {2, 3, 10, 10, 4, 1, 3, 0},   // 1x1 at stride 3
    {2, 1, 5, 6, 2, 2, 1, 0},     // even kernel, unpadded
    {3, 2, 8, 8, 6, 3, 3, 2},     // stride 3 with padding 2
};

struct Tensors {
  Tensor x, w, dy;
  kernels::ConvGeometry g;
};

Tensors make(const Case& c, DType dtype) {
  const Shape xs{c.batch, c.in_channels, c.height, c.width};
  const Shape ws{c.out_channels, c.in_channels, c.kernel, c.kernel};
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, c.stride, c.padding);
  return {test::random_tensor(xs, dtype, 11), test::random_tensor(ws, dtype, 12),
          test::random_tensor({c.batch, c.out_channels, g.out_h, g.out_w}, dtype, 13), g};
}

template <class T>
double at(const Tensor& t, std::int64_t i) {
  return static_cast<double>(t.data<T>()[i]);
}

// y and dw by the definition, in double.
template <class T>
void reference(const Tensors& t, std::vector<double>& y, std::vector<double>& dw) {
  const kernels::ConvGeometry& g = t.g;
  y.assign(static_cast<std::size_t>(g.batch * g.out_channels * g.out_h * g.out_w), 0.0);
  dw.assign(static_cast<std::size_t>(g.out_channels * g.in_channels * g.kernel_h * g.kernel_w),
            0.0);
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t o = 0; o < g.out_channels; ++o)
      for (std::int64_t oh = 0; oh < g.out_h; ++oh)
        for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
          const std::int64_t yi = ((b * g.out_channels + o) * g.out_h + oh) * g.out_w + ow;
          for (std::int64_t c = 0; c < g.in_channels; ++c)
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t ih = oh * g.stride - g.padding + kh,
                                   iw = ow * g.stride - g.padding + kw;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const std::int64_t xi = ((b * g.in_channels + c) * g.height + ih) * g.width + iw;
                const std::int64_t wi =
                    ((o * g.in_channels + c) * g.kernel_h + kh) * g.kernel_w + kw;
                y[yi] += at<T>(t.w, wi) * at<T>(t.x, xi);
                dw[wi] += at<T>(t.dy, yi) * at<T>(t.x, xi);
              }
        }
}

// The largest |got - want| / (1 + |want|).
template <class T>
double worst(const Tensor& got, const std::vector<double>& want) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    w = std::max(w, std::abs(at<T>(got, static_cast<std::int64_t>(i)) - want[i]) /
                        (1.0 + std::abs(want[i])));
  return w;
}

template <class T>
void check_case(const Case& c, DType dtype, double tolerance) {
  const Tensors t = make(c, dtype);
  Tensor y = Tensor::full(t.dy.shape(), 7.0, dtype), dw = Tensor::full(t.w.shape(), 7.0, dtype);
  kernels::few_channels_forward(t.x, t.w, y, t.g);
  kernels::few_channels_backward_weight(t.x, t.dy, dw, t.g);
  std::vector<double> y_ref, dw_ref;
  reference<T>(t, y_ref, dw_ref);
  CHECK(worst<T>(y, y_ref) <= tolerance);
  CHECK(worst<T>(dw, dw_ref) <= tolerance);
}

}  // namespace

TEST_CASE("direct convolutions over 1 to 3 channels match the definition (f32, f64)") {
  for (const Case& c : kCases) {
    CAPTURE(c.in_channels);
    CAPTURE(c.kernel);
    CAPTURE(c.stride);
    CAPTURE(c.padding);
    CAPTURE(c.batch);
    REQUIRE(kernels::few_channels_fits(make(c, DType::f32).g));
    // f32: sums of up to 75 (forward) and about 3000 (weight gradient) terms in [-1, 1].
    check_case<float>(c, DType::f32, 2e-5);
    check_case<double>(c, DType::f64, 1e-12);
  }
  CHECK_FALSE(kernels::few_channels_fits(
      kernels::conv_geometry({2, 4, 8, 8}, {8, 4, 3, 3}, 1, 1)));  // 4 channels: oneDNN's
}

TEST_CASE("direct convolutions over few channels give the same bits for 1, 2 and 3 threads") {
  const int before = omp_get_max_threads();
  for (const Case& c : kCases) {
    const Tensors t = make(c, DType::f32);
    std::vector<Tensor> ys, dws;
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      ys.push_back(Tensor::zeros(t.dy.shape(), DType::f32));
      dws.push_back(Tensor::zeros(t.w.shape(), DType::f32));
      kernels::few_channels_forward(t.x, t.w, ys.back(), t.g);
      kernels::few_channels_backward_weight(t.x, t.dy, dws.back(), t.g);
    }
    for (std::size_t i = 1; i < ys.size(); ++i) {
      CHECK(std::memcmp(ys[i].raw(), ys[0].raw(), ys[0].nbytes()) == 0);
      CHECK(std::memcmp(dws[i].raw(), dws[0].raw(), dws[0].nbytes()) == 0);
    }
  }
  omp_set_num_threads(before);
}

}  // namespace kiln
