// The direct forward of images with few channels (backends/cuda/conv_direct.cpp): where it is
// chosen and which form (no GPU needed), and on a GPU against the CPU's convolution on fresh
// random inputs: resnet18's stem, odd sides, filters that do not fill a block, planes that are
// no multiple of 8 pixels, LeNet's 5x5, an ImageNet stem's 7x7 at stride 2 (K 147: the CUDA
// cores' form in every dtype), stride 3 and a rectangular filter, rows too wide for one tile of
// the whole image, more than 64 filters; f32 (the CUDA cores), bf16 and f16 (the tensor cores
// where K <= 64).
#include <doctest/doctest.h>

#include <string>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_passes.h"
#include "graph/kernels/conv_cpu.h"
#include "tests/cuda_kernels_support.h"

namespace kiln {
using namespace cuda_test;  // NOLINT: the shared test helpers

TEST_CASE("conv2d: the direct forward takes images of at most 4 channels (no GPU needed)") {
  using cuda::conv_detail::conv_direct_plan;
  const auto stem = kernels::conv_geometry({512, 3, 32, 32}, {64, 3, 3, 3}, 1, 1);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    const auto plan = conv_direct_plan(stem, dtype);
    REQUIRE(plan);
    if (dtype == DType::f32) {  // the CUDA cores: the whole image, 8 groups of 4 columns x 32 rows
      CHECK(plan->th == 32);
      CHECK(plan->tiles == 1);
      CHECK(plan->rows == 34);
      CHECK(plan->cols == 36);  // 7 groups x 4 columns + a run of 8
      CHECK(plan->shared_bytes == 27 * 16 * 4 + 3 * 34 * 36 * 4);
    } else {  // the tensor cores: 16 rows (512 pixels), W [64][40], 8 staging tiles [64][40]
      CHECK(plan->th == 16);
      CHECK(plan->tiles == 2);
      CHECK(plan->rows == 18);
      CHECK(plan->cols == 40);  // 34 columns, a multiple of 8
      CHECK(plan->shared_bytes == (64 * 40 + 8 * 64 * 40 + 3 * 18 * 40) * 2);
    }
    CHECK(cuda::conv_workspace_bytes(stem, dtype, cuda::ConvPass::forward) == 0);
    const auto sources = cuda::conv_kernel_sources(stem, dtype, cuda::ConvPass::forward);
    REQUIRE(sources.size() == 1);
    CHECK(sources[0].name ==
          std::string(dtype == DType::f32 ? "kiln_conv_direct_" : "kiln_conv_direct_mma_") +
              std::string(dtype_name(dtype)) + "_c3_3x3_s1");
    CHECK(!cuda::conv_reads_channels_last(stem, dtype, cuda::ConvPass::forward));
    CHECK(!cuda::conv_forward_writes_moments(stem, dtype));
  }
  // The dispatch takes stride 1 only (the kernel takes up to 4: below), and not the gradients;
  // 8 channels, f64, a 9x9 filter, rows too wide: elsewhere.
  const auto strided = kernels::conv_geometry({64, 1, 28, 28}, {64, 1, 4, 4}, 2, 1);
  CHECK(conv_direct_plan(strided, DType::bf16));
  for (const gpu::KernelSource& k :
       cuda::conv_kernel_sources(strided, DType::bf16, cuda::ConvPass::forward))
    CHECK(k.name.find("direct") == std::string::npos);
  CHECK(cuda::conv_workspace_bytes(stem, DType::bf16, cuda::ConvPass::grad_weight) > 0);
  CHECK(
      !conv_direct_plan(kernels::conv_geometry({8, 8, 32, 32}, {64, 8, 3, 3}, 1, 1), DType::bf16));
  CHECK(!conv_direct_plan(stem, DType::f64));
  CHECK(!conv_direct_plan(kernels::conv_geometry({8, 3, 32, 32}, {64, 3, 9, 9}, 1, 4), DType::f32));
  CHECK(!conv_direct_plan(kernels::conv_geometry({1, 4, 2, 1030}, {4, 4, 1, 1}, 1, 0), DType::f32));
  // A 300-wide image: 76 groups a row, so 3 rows a tile on the CUDA cores, 1 on the tensor cores.
  const auto wide = kernels::conv_geometry({1, 2, 300, 301}, {8, 2, 3, 3}, 1, 1);
  REQUIRE(conv_direct_plan(wide, DType::f32));
  CHECK(conv_direct_plan(wide, DType::f32)->th == 3);
  CHECK(conv_direct_plan(wide, DType::f32)->tiles == 100);
  REQUIRE(conv_direct_plan(wide, DType::bf16));
  CHECK(conv_direct_plan(wide, DType::bf16)->th == 1);
  CHECK(conv_direct_plan(wide, DType::bf16)->cols == 304);
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
          Case{{2, 3, 12, 20}, {70, 3, 3, 3}, 1, 1}, Case{{1, 1, 1, 1}, {1, 1, 1, 1}, 1, 0}}) {
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
      // (The kernel itself: the dispatch takes it at stride 1 only.)
      cuda::conv_detail::conv_direct_forward(dtype, g,
                                             *cuda::conv_detail::conv_direct_plan(g, dtype),
                                             dx.get(), dw.get(), dy.get(), nullptr);
      // Each output rounded once from f32 sums: bf16 keeps 8 bits, f16 11.
      const double rtol = dtype == DType::f32 ? 1e-5 : dtype == DType::bf16 ? 8e-3 : 1e-3;
      CHECK(gemm_closeness(dy.download(ys, dtype), y_ref, rtol) <= 1.0);
    }
}

}  // namespace kiln
