// The CPU's two convolution paths: oneDNN's (float32 by default) against kiln's own im2col
// kernels, which --deterministic runs and which give the same bits for any thread count.
#include <doctest/doctest.h>

#include <omp.h>

#include <cstring>

#include "graph/kernels/conv_cpu.h"
#include "graph/kernels/conv_dnnl.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct Case {
  std::int64_t batch, in_channels, size, out_channels, kernel, stride, padding;
};

// LeNet's, ResNet's and VGG's layers, the first-layer shapes (one input channel) and odd
// ones where the last window stops short of the padded edge (oneDNN's end padding < 0).
const Case kCases[] = {{8, 1, 28, 6, 5, 1, 0},   {8, 6, 12, 16, 5, 1, 0},  {4, 1, 28, 16, 3, 1, 1},
                       {4, 16, 28, 16, 3, 1, 1}, {4, 16, 28, 32, 3, 2, 1}, {4, 16, 28, 32, 1, 2, 0},
                       {3, 64, 7, 64, 3, 1, 1},  {5, 8, 9, 12, 2, 2, 0},   {2, 5, 10, 7, 3, 3, 2}};

struct Results {
  Tensor y, dx, dw;
};

Results run_all(const Case& c, bool reproducible) {
  const Shape xs{c.batch, c.in_channels, c.size, c.size};
  const Shape ws{c.out_channels, c.in_channels, c.kernel, c.kernel};
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, c.stride, c.padding);
  const Shape ys{c.batch, c.out_channels, g.out_h, g.out_w};
  const Tensor x = test::random_tensor(xs, DType::f32, 1);
  const Tensor w = test::random_tensor(ws, DType::f32, 2);
  const Tensor dy = test::random_tensor(ys, DType::f32, 3);
  Results r{Tensor::zeros(ys, DType::f32), Tensor::zeros(xs, DType::f32),
            Tensor::zeros(ws, DType::f32)};
  const kernels::ReproducibleConvolutions scope(reproducible);
  kernels::conv2d_forward(x, w, r.y, g);
  kernels::conv2d_backward_input(dy, w, r.dx, g);
  kernels::conv2d_backward_weight(x, dy, r.dw, g);
  return r;
}

// Whether the case's forward pass runs oneDNN's Winograd kernel.
bool uses_winograd(const Case& c) {
  const kernels::ConvGeometry g = kernels::conv_geometry(
      {c.batch, c.in_channels, c.size, c.size}, {c.out_channels, c.in_channels, c.kernel, c.kernel},
      c.stride, c.padding);
  return kernels::dnnl_conv2d_implementation(g, kernels::ConvPass::forward).find("wino") !=
         std::string::npos;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("oneDNN's convolutions match kiln's im2col kernels (forward and both gradients)") {
  for (const Case& c : kCases) {
    CAPTURE(c.in_channels);
    CAPTURE(c.size);
    CAPTURE(c.kernel);
    CAPTURE(c.stride);
    CAPTURE(c.padding);
    const Results library = run_all(c, false);
    const Results own = run_all(c, true);
    // Both sum in float32 in different orders; the sums here have up to 576 terms in [-1, 1].
    // Winograd's transforms (weights up to 8 and 1/24) add about 4x a direct sum's rounding.
    const double tolerance = uses_winograd(c) ? 1e-4 : 1e-5;
    CHECK(test::closeness(library.y, own.y, tolerance, tolerance) <= 1);
    CHECK(test::closeness(library.dx, own.dx, tolerance, tolerance) <= 1);
    CHECK(test::closeness(library.dw, own.dw, 1e-4, tolerance) <= 1);
  }
}

TEST_CASE(
    "3x3 stride-1 layers of 64 and more channels run Winograd's F(4x4, 3x3), 16 channels do not") {
  // resnet18's stage 2 and 4, a layer whose images do not divide into 4x4 tiles, and unequal
  // channel counts; each against kiln's own kernels (a direct sum).
  const Case winograd[] = {{8, 64, 8, 64, 3, 1, 1},
                           {32, 128, 4, 128, 3, 1, 1},
                           {8, 48, 7, 96, 3, 1, 1},
                           {8, 96, 9, 64, 3, 1, 0}};
  if (!uses_winograd(winograd[0])) {
    MESSAGE("oneDNN has no Winograd convolution for this processor (it needs AVX-512)");
    return;
  }
  for (const Case& c : winograd) {
    CAPTURE(c.in_channels);
    CAPTURE(c.out_channels);
    CAPTURE(c.size);
    CHECK(uses_winograd(c));
    const Results library = run_all(c, false);
    const Results own = run_all(c, true);
    CHECK(test::closeness(library.y, own.y, 1e-4, 1e-4) <= 1);
    CHECK(test::closeness(library.dx, own.dx, 1e-4, 1e-4) <= 1);
    CHECK(test::closeness(library.dw, own.dw, 1e-4, 1e-4) <= 1);
  }
  CHECK_FALSE(uses_winograd({4, 16, 28, 16, 3, 1, 1}));  // slower there (conv_dnnl.cpp)
  CHECK_FALSE(uses_winograd({2, 64, 8, 64, 3, 1, 1}));   // 8 output tiles: too few
  CHECK(uses_winograd({2, 64, 16, 64, 3, 1, 1}));        // 32
  CHECK_FALSE(uses_winograd({4, 64, 16, 64, 3, 2, 1}));  // stride 2
  CHECK_FALSE(uses_winograd({4, 64, 16, 64, 1, 1, 0}));  // 1x1
}

TEST_CASE("conv2d_kernel_name names the kernel each pass runs (KILN_PROFILE=groups)") {
  using kernels::ConvPass;
  const kernels::ConvGeometry wide = kernels::conv_geometry({8, 64, 8, 8}, {64, 64, 3, 3}, 1, 1);
  const kernels::ConvGeometry first = kernels::conv_geometry({8, 1, 8, 8}, {16, 1, 3, 3}, 1, 1);
  const std::string forward = kernels::conv2d_kernel_name(ConvPass::forward, DType::f32, wide);
  CHECK(forward.rfind("oneDNN ", 0) == 0);
  CHECK((forward.find("wino") != std::string::npos) == uses_winograd({8, 64, 8, 64, 3, 1, 1}));
  CHECK(kernels::conv2d_kernel_name(ConvPass::forward, DType::bf16, wide) == forward);  // widened
  CHECK(kernels::conv2d_kernel_name(ConvPass::forward, DType::f64, wide) == "kiln im2col");
  // A first layer over one channel: the forward and the weight gradient direct
  // (conv_few_channels.cpp).
  CHECK(kernels::conv2d_kernel_name(ConvPass::grad_weight, DType::f32, first) == "kiln direct");
  CHECK(kernels::conv2d_kernel_name(ConvPass::forward, DType::f32, first) == "kiln direct");
  CHECK(kernels::conv2d_kernel_name(ConvPass::grad_input, DType::f32, first) == "kiln im2col");
  // Where the direct kernels were slower: three channels, and stride 2 (conv_cpu.cpp).
  for (const auto& other : {kernels::conv_geometry({8, 3, 8, 8}, {16, 3, 3, 3}, 1, 1),
                            kernels::conv_geometry({8, 1, 8, 8}, {16, 1, 4, 4}, 2, 1)}) {
    CHECK(kernels::conv2d_kernel_name(ConvPass::forward, DType::f32, other).rfind("oneDNN ", 0) ==
          0);
    CHECK(kernels::conv2d_kernel_name(ConvPass::grad_weight, DType::f32, other) == "kiln im2col");
  }
  const kernels::ReproducibleConvolutions scope(true);
  CHECK(kernels::conv2d_kernel_name(ConvPass::forward, DType::f32, wide) == "kiln im2col");
}

TEST_CASE("kiln's own convolutions give the same bits for 1, 2 and 3 threads") {
  const int before = omp_get_max_threads();
  for (const Case& c : kCases) {
    omp_set_num_threads(1);
    const Results one = run_all(c, true);
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      const Results many = run_all(c, true);
      CAPTURE(threads);
      CHECK(same_bits(one.y, many.y));
      CHECK(same_bits(one.dx, many.dx));
      CHECK(same_bits(one.dw, many.dw));
    }
  }
  omp_set_num_threads(before);
}

// The CPU program's order: each kernel after kernels::begin_cpu_kernel(). A layer's dy,
// reordered to oneDNN's layout by grad_input, is reused by the grad_weight right after it:
// the same bits as reordered anew; after a kernel in between (which may have written that
// memory) it is not reused.
TEST_CASE("a layer's dy reordered once for both gradient passes, and only back to back") {
  const Case c{4, 16, 10, 16, 3, 1, 1};  // dy and x have the same shape and layout here
  const Shape xs{c.batch, c.in_channels, c.size, c.size};
  const Shape ws{c.out_channels, c.in_channels, c.kernel, c.kernel};
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, c.stride, c.padding);
  const Tensor x = test::random_tensor(xs, DType::f32, 11);
  const Tensor w = test::random_tensor(ws, DType::f32, 12);
  Tensor dy = test::random_tensor(xs, DType::f32, 13);
  auto gradients = [&](bool back_to_back, const Tensor* new_dy) {
    Results r{Tensor(), Tensor::zeros(xs, DType::f32), Tensor::zeros(ws, DType::f32)};
    kernels::begin_cpu_kernel();
    kernels::conv2d_backward_input(dy, w, r.dx, g);
    if (new_dy) std::memcpy(dy.raw(), new_dy->raw(), dy.nbytes());  // a kernel writing dy
    if (!back_to_back || new_dy) kernels::begin_cpu_kernel();
    kernels::begin_cpu_kernel();
    kernels::conv2d_backward_weight(x, dy, r.dw, g);
    return r;
  };
  const Tensor original = dy.clone();
  const Results reused = gradients(true, nullptr);
  const Results apart = gradients(false, nullptr);
  CHECK(same_bits(reused.dx, apart.dx));
  CHECK(same_bits(reused.dw, apart.dw));
  const Tensor changed = test::random_tensor(xs, DType::f32, 14);
  const Results overwritten = gradients(true, &changed);
  Tensor fresh = Tensor::zeros(ws, DType::f32);
  kernels::begin_cpu_kernel();
  kernels::conv2d_backward_weight(x, changed, fresh, g);
  CHECK(same_bits(overwritten.dw, fresh));
  CHECK_FALSE(same_bits(overwritten.dw, apart.dw));
  std::memcpy(dy.raw(), original.raw(), dy.nbytes());
}

TEST_CASE("a deterministic CPU program runs kiln's own convolutions, the default oneDNN's") {
  const Case c{4, 16, 12, 8, 3, 1, 1};
  Graph g;
  const Value x = g.input("x", Shape{c.batch, c.in_channels, c.size, c.size});
  const Value w = g.input("w", Shape{c.out_channels, c.in_channels, c.kernel, c.kernel});
  g.output("y", conv2d(x, w, c.stride, c.padding));
  const std::vector<Feed> feeds{
      {"x", test::random_tensor({c.batch, c.in_channels, c.size, c.size}, DType::f32, 1)},
      {"w",
       test::random_tensor({c.out_channels, c.in_channels, c.kernel, c.kernel}, DType::f32, 2)}};
  const Tensor deterministic = compile(g, {.deterministic = true})->run(feeds).at("y");
  const Tensor fast = compile(g)->run(feeds).at("y");
  CHECK(same_bits(deterministic, run_all(c, true).y));
  CHECK(same_bits(fast, run_all(c, false).y));
  CHECK_FALSE(same_bits(fast, deterministic));  // the two paths really differ
}

}  // namespace kiln
