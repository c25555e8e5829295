// The input gradient's classes of taps (backends/cuda/conv.h, conv_input_gradient_classes;
// kernels/conv_params.h, ConvClasses), no GPU needed: dx computed the way the TMA kernel reads
// the table (each class a stride-1 convolution of dy over its grid, its taps from
// class_source_tap's rule, its pixels scattered into dx) equals the input gradient's definition,
// every pixel of dx is written once and every tap of the filter is used once.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cuda/conv.h"
#include "graph/kernels/conv_cpu.h"

namespace kiln {
namespace {

struct Case {
  std::int64_t h, w, kh, kw, stride, pad;
  bool by_residue;
};

// dx[b][ci][ih][iw] from its definition: the sum over the outputs whose windows hold (ih, iw).
std::vector<double> defined_dx(const kernels::ConvGeometry& g, const std::vector<double>& dy,
                               const std::vector<double>& w) {
  std::vector<double> dx(static_cast<std::size_t>(g.batch * g.in_channels * g.height * g.width));
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t co = 0; co < g.out_channels; ++co)
      for (std::int64_t oh = 0; oh < g.out_h; ++oh)
        for (std::int64_t ow = 0; ow < g.out_w; ++ow)
          for (std::int64_t ci = 0; ci < g.in_channels; ++ci)
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t ih = oh * g.stride + kh - g.padding,
                                   iw = ow * g.stride + kw - g.padding;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                dx[static_cast<std::size_t>(((b * g.in_channels + ci) * g.height + ih) * g.width +
                                            iw)] +=
                    dy[static_cast<std::size_t>(
                        ((b * g.out_channels + co) * g.out_h + oh) * g.out_w + ow)] *
                    w[static_cast<std::size_t>(
                        ((co * g.in_channels + ci) * g.kernel_h + kh) * g.kernel_w + kw)];
              }
  return dx;
}

}  // namespace

TEST_CASE("conv2d_grad_input's classes of taps give the input gradient (no GPU needed)") {
  std::mt19937_64 rng(31);
  std::normal_distribution<double> normal;
  for (const Case c :
       {Case{8, 8, 3, 3, 2, 1, true}, Case{8, 8, 1, 1, 2, 0, true}, Case{8, 8, 3, 3, 2, 0, true},
        Case{8, 8, 5, 5, 2, 2, true}, Case{8, 8, 2, 2, 2, 0, true}, Case{8, 6, 3, 3, 2, 1, true},
        Case{8, 8, 4, 4, 2, 1, true}, Case{6, 6, 3, 3, 2, 2, true}, Case{6, 6, 1, 1, 2, 1, true},
        Case{6, 8, 3, 2, 2, 1, true}, Case{6, 6, 3, 3, 1, 1, false}, Case{5, 7, 3, 5, 1, 2, false},
        Case{6, 6, 3, 3, 2, 1, false}}) {
    CAPTURE(c.h);
    CAPTURE(c.w);
    CAPTURE(c.kh);
    CAPTURE(c.kw);
    CAPTURE(c.stride);
    CAPTURE(c.pad);
    CAPTURE(c.by_residue);
    const kernels::ConvGeometry g =
        kernels::conv_geometry(Shape{2, 3, c.h, c.w}, Shape{2, 3, c.kh, c.kw}, c.stride, c.pad);
    std::vector<double> dy(static_cast<std::size_t>(g.batch * g.out_channels * g.out_h * g.out_w));
    std::vector<double> w(static_cast<std::size_t>(g.out_channels * g.in_channels * c.kh * c.kw));
    for (double& v : dy) v = normal(rng);
    for (double& v : w) v = normal(rng);
    if (!c.by_residue && c.stride > 1) {  // one class reads dy as it is: stride 1 only
      const cuda::ConvClasses cl = cuda::conv_input_gradient_classes(g, false);
      CHECK(cl.count == 1);
      continue;
    }
    const cuda::ConvClasses cl = cuda::conv_input_gradient_classes(g, c.by_residue);
    const int s = cl.stride;
    REQUIRE(cl.count == s * s);
    CHECK(cl.plane == g.height * g.width);
    // Each class: a grid of H / s x W / s pixels (H x W for one class).
    const std::int64_t grid_h = g.height / s, grid_w = g.width / s;
    std::vector<double> dx(static_cast<std::size_t>(g.batch * g.in_channels * cl.plane), NAN);
    std::vector<int> written(dx.size(), 0), used(static_cast<std::size_t>(c.kh * c.kw), 0);
    for (int k = 0; k < cl.count; ++k) {
      for (int jh = 0; jh < cl.taps_h[k]; ++jh)
        for (int jw = 0; jw < cl.taps_w[k]; ++jw) {
          const int kh = cl.first_kh[k] + s * (cl.taps_h[k] - 1 - jh),
                    kw = cl.first_kw[k] + s * (cl.taps_w[k] - 1 - jw);
          REQUIRE((kh >= 0 && kh < c.kh && kw >= 0 && kw < c.kw));
          ++used[static_cast<std::size_t>(kh * c.kw + kw)];
        }
      for (std::int64_t b = 0; b < g.batch; ++b)
        for (std::int64_t ci = 0; ci < g.in_channels; ++ci)
          for (std::int64_t a = 0; a < grid_h; ++a)
            for (std::int64_t e = 0; e < grid_w; ++e) {
              double sum = 0.0;
              for (int jh = 0; jh < cl.taps_h[k]; ++jh)
                for (int jw = 0; jw < cl.taps_w[k]; ++jw) {
                  const std::int64_t oh = a + jh - cl.pad_h[k], ow = e + jw - cl.pad_w[k];
                  if (oh < 0 || oh >= g.out_h || ow < 0 || ow >= g.out_w) continue;
                  const int kh = cl.first_kh[k] + s * (cl.taps_h[k] - 1 - jh),
                            kw = cl.first_kw[k] + s * (cl.taps_w[k] - 1 - jw);
                  for (std::int64_t co = 0; co < g.out_channels; ++co)
                    sum += dy[static_cast<std::size_t>(
                               ((b * g.out_channels + co) * g.out_h + oh) * g.out_w + ow)] *
                           w[static_cast<std::size_t>(
                               ((co * g.in_channels + ci) * c.kh + kh) * c.kw + kw)];
                }
              const std::int64_t at =
                  (b * g.in_channels + ci) * cl.plane + cl.out_offset[k] + a * cl.row_pitch + e * s;
              REQUIRE((at >= 0 && at < static_cast<std::int64_t>(dx.size())));
              dx[static_cast<std::size_t>(at)] = sum;
              ++written[static_cast<std::size_t>(at)];
            }
    }
    for (int u : used) CHECK(u == 1);
    for (int n : written) CHECK(n == 1);
    const std::vector<double> want = defined_dx(g, dy, w);
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK(dx[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

}  // namespace kiln
