// The direct forward of images with few channels (backends/cuda/conv_direct.cpp): where it is
// chosen (no GPU needed), and on a GPU against the CPU's convolution on fresh random inputs:
// resnet18's stem, odd sides, filters that do not fill a block's 16, widths that are no
// multiple of 4, LeNet's 5x5, an ImageNet stem's 7x7 at stride 2, stride 3 and a rectangular
// filter, rows too wide for one tile of the whole image; f32, bf16 and f16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_passes.h"
#include "graph/kernels/conv_cpu.h"
#include "tests/cuda_kernels_support.h"

namespace kiln {
using namespace cuda_test;  // NOLINT: the shared test helpers

namespace {

// conv2d_moments' runs of y [B, C, OH, OW] as stored: per run of 64 pixels in (image, pixel)
// order and channel, the count, mean and squared deviations from it (in double, to 1e-5).
void check_run_moments(const Tensor& y, const Tensor& moments) {
  const std::int64_t channels = y.shape()[1], plane = y.shape()[2] * y.shape()[3];
  const std::int64_t runs = moments.shape()[1];
  double worst = 0;
  for (std::int64_t t = 0; t < runs; ++t)
    for (std::int64_t c = 0; c < channels; ++c) {
      double values[64], sum = 0, squares = 0;
      for (int j = 0; j < 64; ++j) {
        const std::int64_t p = t * 64 + j, b = p / plane;
        values[j] = y.at((b * channels + c) * plane + p % plane);
        sum += values[j];
      }
      for (double v : values) squares += (v - sum / 64) * (v - sum / 64);
      const std::int64_t at = t * channels + c, third = runs * channels;
      CHECK(moments.at(at) == 64.0);
      worst = std::max(worst,
                       std::abs(moments.at(third + at) - sum / 64) / (1e-5 + std::abs(sum / 64)));
      worst = std::max(worst, std::abs(moments.at(2 * third + at) - squares) / (1e-5 + squares));
    }
  CHECK(worst < 1e-4);
}

}  // namespace

TEST_CASE("conv2d: the direct forward takes images of at most 4 channels (no GPU needed)") {
  const auto stem = kernels::conv_geometry({512, 3, 32, 32}, {64, 3, 3, 3}, 1, 1);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    const auto plan = cuda::conv_detail::conv_direct_plan(stem, dtype);
    REQUIRE(plan);
    CHECK(plan->th == 32);  // the whole image a block: 8 groups of 4 columns x 32 rows
    CHECK(plan->tiles == 1);
    CHECK(plan->rows == 34);
    CHECK(plan->cols == 36);  // 7 groups x 4 columns + a run of 8
    CHECK(plan->shared_bytes == 27 * 16 * 4 + 3 * 34 * 36 * 4);
    CHECK(cuda::conv_workspace_bytes(stem, dtype, cuda::ConvPass::forward) == 0);
    const auto sources = cuda::conv_kernel_sources(stem, dtype, cuda::ConvPass::forward);
    REQUIRE(sources.size() == 1);
    CHECK(sources[0].name == "kiln_conv_direct_" + std::string(dtype_name(dtype)) + "_c3_3x3_s1");
    CHECK(!cuda::conv_reads_channels_last(stem, dtype, cuda::ConvPass::forward));
    // Its epilogue writes conv2d_moments' runs of 64 pixels (two rows of 32) in 16-bit dtypes.
    CHECK(cuda::conv_forward_writes_moments(stem, dtype) == (dtype != DType::f32));
  }
  // Rows of 13 columns: no whole runs.
  CHECK(!cuda::conv_forward_writes_moments(
      kernels::conv_geometry({2, 3, 17, 13}, {20, 3, 3, 3}, 1, 1), DType::bf16));
  // The gradients stay on their passes; 8 channels, f64, a 9x9 filter, rows too wide: elsewhere.
  CHECK(cuda::conv_workspace_bytes(stem, DType::bf16, cuda::ConvPass::grad_weight) > 0);
  using cuda::conv_detail::conv_direct_plan;
  CHECK(
      !conv_direct_plan(kernels::conv_geometry({8, 8, 32, 32}, {64, 8, 3, 3}, 1, 1), DType::bf16));
  CHECK(!conv_direct_plan(stem, DType::f64));
  CHECK(!conv_direct_plan(kernels::conv_geometry({8, 3, 32, 32}, {64, 3, 9, 9}, 1, 4), DType::f32));
  CHECK(!conv_direct_plan(kernels::conv_geometry({1, 4, 2, 1030}, {4, 4, 1, 1}, 1, 0), DType::f32));
  // A 300-wide image: 76 groups a row, so 3 rows a tile.
  const auto wide =
      conv_direct_plan(kernels::conv_geometry({1, 2, 300, 301}, {8, 2, 3, 3}, 1, 1), DType::bf16);
  REQUIRE(wide);
  CHECK(wide->th == 3);
  CHECK(wide->tiles == 100);
}

TEST_CASE("GPU: the direct forward matches the CPU's convolution") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 4000;
  struct Case {
    Shape x, w;
    std::int64_t stride, padding;
  };
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const Case& c :
         {Case{{5, 3, 32, 32}, {64, 3, 3, 3}, 1, 1}, Case{{2, 3, 17, 13}, {20, 3, 3, 3}, 1, 1},
          Case{{3, 1, 28, 28}, {6, 1, 5, 5}, 1, 0}, Case{{2, 3, 40, 38}, {33, 3, 7, 7}, 2, 3},
          Case{{3, 4, 9, 10}, {16, 4, 3, 2}, 3, 2}, Case{{1, 2, 300, 301}, {8, 2, 3, 3}, 1, 1},
          Case{{1, 1, 1, 1}, {1, 1, 1, 1}, 1, 0}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(c.x.str());
      CAPTURE(c.w.str());
      const auto g = kernels::conv_geometry(c.x, c.w, c.stride, c.padding);
      REQUIRE(cuda::conv_detail::conv_direct_plan(g, dtype));
      const Tensor x = random_tensor(c.x, dtype, seed += 2),
                   w = random_tensor(c.w, dtype, seed + 1);
      const DType ref = is_low_precision(dtype) ? DType::f32 : dtype;
      const Shape ys{g.batch, g.out_channels, g.out_h, g.out_w};
      Tensor y_ref = Tensor::empty(ys, ref);
      kernels::conv2d_forward(x.to(ref), w.to(ref), y_ref, g);
      DeviceBuffer dx(x), dw(w), dy(y_ref.numel() * dtype_size(dtype));
      const bool moments = cuda::conv_forward_writes_moments(g, dtype);
      const std::int64_t runs = g.batch * g.out_h * g.out_w / 64;
      DeviceBuffer runs_out(moments ? 3 * runs * g.out_channels * 4 : 1);
      cuda::conv2d_forward(dtype, g, dx.get(), dw.get(), dy.get(), {nullptr, 0}, nullptr, false,
                           moments ? static_cast<float*>(runs_out.get()) : nullptr);
      // Each output rounded once from f32 sums: bf16 keeps 8 bits, f16 11.
      const double rtol = dtype == DType::f32 ? 1e-5 : dtype == DType::bf16 ? 8e-3 : 1e-3;
      const Tensor y = dy.download(ys, dtype);
      CHECK(gemm_closeness(y, y_ref, rtol) <= 1.0);
      if (moments) check_run_moments(y, runs_out.download({3, runs, g.out_channels}, DType::f32));
    }
}

}  // namespace kiln
