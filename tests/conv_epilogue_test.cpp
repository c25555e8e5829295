// conv2d_bias, the convolution with its bias and ReLU epilogue (fusion/gemm_epilogues.h with
// convolutions): the pass's matches, and on the CPU the same bits as the convolution, the bias
// add and the ReLU run apart, for each of its kernels (kiln's direct and im2col kernels,
// oneDNN's direct and Winograd kernels with their post-ops or kiln's epilogue after them, in
// NCHW and blocked layouts), NaN included; on the GPU against the CPU and the GPU's own unfused
// ops (the f32 passes on the CUDA cores apply the epilogue as they store, the others run a
// kernel after the pass), and which of the GPU's passes apply it.
#include <doctest/doctest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "backends/compile.h"
#include "core/half.h"
#include "fusion/fuse.h"
#include "fusion/gemm_epilogues.h"
#include "graph/kernels/conv_dnnl.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/op_entry.h"
#include "gpu/cuda_runtime.h"
#endif

namespace kiln {
namespace {

struct Layer {
  std::int64_t batch, in, height, width, out, kernel, stride, padding;
};

// y = [relu](conv2d(x, w) + bias), the bias reshaped to [1, Cout, 1, 1] as nn::Conv2d does;
// with `pooled`, y's 2x2 max pooling instead (which reads oneDNN's blocked output in place).
Graph conv_layer(const Layer& l, bool relu_too, DType dtype = DType::f32, bool pooled = false) {
  Graph g;
  const Value x = g.input("x", {l.batch, l.in, l.height, l.width}, dtype);
  const Value w = g.input("w", {l.out, l.in, l.kernel, l.kernel}, dtype);
  const Value bias = reshape(g.input("bias", {l.out}, dtype), {1, l.out, 1, 1});
  Value y = conv2d(x, w, l.stride, l.padding) + bias;
  if (relu_too) y = relu(y);
  g.output("y", pooled ? max_pool2d(y, 2) : y);
  return g;
}

Graph with_epilogues(const Graph& g) {
  const Graph fused = eliminate_dead_code(fuse_gemm_epilogues(fuse(eliminate_dead_code(g)), nullptr,
                                                              {.convolutions = every_convolution}));
  verify(fused);
  return fused;
}

int count(const Graph& g, OpId id) {
  int c = 0;
  for (const Node& n : g.nodes()) c += n.op->id == id;
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Random feeds with a NaN planted in x (it reaches every output whose window covers it).
std::vector<Feed> feeds_with_nan(const Graph& g, std::uint64_t seed) {
  std::vector<Feed> feeds = test::random_feeds(g, seed);
  for (Feed& f : feeds)
    if (f.name == "x") {
      Tensor& x = f.tensor;
      const std::int64_t at = x.numel() / 3;
      const float nan = std::numeric_limits<float>::quiet_NaN();
      if (x.dtype() == DType::f32) x.data<float>()[at] = nan;
      if (x.dtype() == DType::f64) x.data<double>()[at] = nan;
      if (x.dtype() == DType::bf16) x.data<bf16>()[at] = bf16(nan);
      if (x.dtype() == DType::f16) x.data<f16>()[at] = f16(nan);
    }
  return feeds;
}

// Layers that reach each of the CPU's forward kernels (graph/kernels/conv_cpu.cpp).
const Layer kLayers[] = {
    {3, 1, 11, 13, 6, 3, 1, 1},    // one channel at stride 1: kiln's direct kernel
    {2, 1, 28, 28, 20, 3, 1, 1},   // LeNet's stem, 20 filters (the GPU's 4-column stores)
    {4, 1, 28, 28, 32, 5, 2, 2},   // alexnet's first layer: oneDNN's, 1 channel
    {4, 32, 14, 14, 48, 3, 1, 1},  // oneDNN's direct kernel, blocked layouts
    {8, 64, 8, 8, 64, 3, 1, 1},    // oneDNN's Winograd kernel where the processor has it
    {8, 48, 7, 7, 96, 3, 1, 1},    // Winograd over tiles past the image's edge
    {2, 256, 6, 6, 20, 3, 1, 1},   // many input channels, 20 filters (a partial block)
    {2, 3, 9, 7, 5, 1, 1, 0},      // a 1x1 over three channels
};

}  // namespace

TEST_CASE("a convolution and its bias (and ReLU) group become one conv2d_bias with the same bits") {
  std::uint64_t seed = 40;
  for (const Layer& l : kLayers)
    for (bool relu_too : {false, true})
      for (bool pooled : {false, true})
        for (int path : {0, 1, 2}) {  // oneDNN, oneDNN without post-ops, kiln's im2col
          const bool deterministic = path == 2;
          std::optional<kernels::DnnlWithoutPostOps> kiln_epilogue;
          if (path == 1) kiln_epilogue.emplace();
          CAPTURE(l.in);
          CAPTURE(l.out);
          CAPTURE(l.kernel);
          CAPTURE(relu_too);
          CAPTURE(pooled);
          CAPTURE(path);
          const Graph g = conv_layer(l, relu_too, DType::f32, pooled);
          const Graph fused = with_epilogues(g);
          CHECK(count(fused, OpId::conv2d_bias) == 1);
          CHECK(count(fused, OpId::conv2d) == 0);
          CHECK(count(fused, OpId::fused) == 0);
          const std::vector<Feed> feeds = feeds_with_nan(g, seed++);
          const Outputs want =
              compile(g, {.fuse = false, .deterministic = deterministic})->run(feeds);
          // Through compile(): the pass as the CPU runs it, blocked values where oneDNN's are,
          // at 1 and 3 threads.
          Outputs got;
          for (int threads : {1, 3}) {
            const int before = omp_get_max_threads();
            omp_set_num_threads(threads);
            got = compile(g, {.deterministic = deterministic})->run(feeds);
            omp_set_num_threads(before);
            CAPTURE(threads);
            CHECK(same_bits(got.at("y"), want.at("y")));
          }
          const Tensor& y = got.at("y");
          std::int64_t nans = 0;
          for (std::int64_t i = 0; i < y.numel(); ++i) nans += std::isnan(y.at(i));
          if (relu_too) CHECK(nans == 0);  // ReLU turns NaN into 0, as the relu op
          if (!relu_too) CHECK(nans > 0);
        }
}

TEST_CASE("the bias first (bias + conv), one filter: conv2d_bias with the same bits") {
  std::uint64_t seed = 70;
  for (std::int64_t filters : {1, 16})
    for (bool relu_too : {false, true}) {
      CAPTURE(filters);
      CAPTURE(relu_too);
      Graph g;
      const Value c = conv2d(g.input("x", {4, 16, 9, 9}), g.input("w", {filters, 16, 3, 3}), 1, 1);
      const Value y = reshape(g.input("bias", {filters}), {1, filters, 1, 1}) + c;
      g.output("y", relu_too ? relu(y) : y);
      CHECK(count(with_epilogues(g), OpId::conv2d_bias) == 1);
      const std::vector<Feed> feeds = feeds_with_nan(g, seed++);
      CHECK(same_bits(compile(g)->run(feeds).at("y"),
                      compile(g, {.fuse = false})->run(feeds).at("y")));
    }
}

TEST_CASE("conv2d_bias in float64, bf16 and f16 equals the three ops in that dtype") {
  // The pass takes f32 only (the group stays); the op itself, built as the pass builds it,
  // runs kiln's im2col kernel in f64, and in bf16/f16 rounds the convolution first.
  std::uint64_t seed = 3;
  for (DType dtype : {DType::f64, DType::bf16, DType::f16})
    for (const Layer& l : {Layer{2, 3, 10, 9, 7, 3, 2, 1}, Layer{2, 64, 6, 6, 20, 3, 1, 1}})
      for (bool relu_too : {false, true}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(l.in);
        CAPTURE(relu_too);
        const Graph g = conv_layer(l, relu_too, dtype);
        CHECK(count(with_epilogues(g), OpId::conv2d_bias) == 0);
        Graph direct;
        const Value x = direct.input("x", {l.batch, l.in, l.height, l.width}, dtype);
        const Value w = direct.input("w", {l.out, l.in, l.kernel, l.kernel}, dtype);
        const Value b = direct.input("bias", {l.out}, dtype);
        Attrs attrs{{"stride", l.stride}, {"padding", l.padding}, {"relu", std::int64_t{relu_too}}};
        direct.output("y", direct.apply1(OpId::conv2d_bias, {x, w, b}, std::move(attrs)));
        const std::vector<Feed> feeds = feeds_with_nan(g, seed++);
        CHECK(same_bits(compile(direct)->run(feeds).at("y"),
                        compile(g, {.fuse = false})->run(feeds).at("y")));
      }
}

TEST_CASE("convolutions the epilogue pass leaves alone") {
  const Layer l{2, 4, 6, 6, 8, 3, 1, 1};
  SUBCASE("the output is read elsewhere too") {
    Graph g;
    const Value c = conv2d(g.input("x", {2, 4, 6, 6}), g.input("w", {8, 4, 3, 3}), 1, 1);
    g.output("y", relu(c + reshape(g.input("bias", {8}), {1, 8, 1, 1})));
    g.output("c", c);
    CHECK(count(with_epilogues(g), OpId::conv2d_bias) == 0);
  }
  SUBCASE("eight values along another axis (the batch, the rows, the columns) than the 8 filters") {
    const Shape along[] = {{8, 1, 1, 1}, {1, 1, 8, 1}, {1, 1, 1, 8}, {8}};
    for (const Shape& shape : along) {
      CAPTURE(shape.str());
      Graph g;
      const Value c = conv2d(g.input("x", {8, 4, 8, 8}), g.input("w", {8, 4, 3, 3}), 1, 1);
      g.output("y", relu(c + reshape(g.input("bias", {8}), shape.dims())));
      CHECK(count(with_epilogues(g), OpId::conv2d_bias) == 0);
    }
  }
  SUBCASE("more than bias and ReLU in the group") {
    Graph g;
    const Value c = conv2d(g.input("x", {2, 4, 6, 6}), g.input("w", {8, 4, 3, 3}), 1, 1);
    g.output("y", relu(c + reshape(g.input("bias", {8}), {1, 8, 1, 1})) * 2.0);
    CHECK(count(with_epilogues(g), OpId::conv2d_bias) == 0);
  }
  SUBCASE("the GPU's policy (no convolutions)") {
    const Graph g = conv_layer(l, true);
    CHECK(count(eliminate_dead_code(fuse_gemm_epilogues(fuse(eliminate_dead_code(g)))),
                OpId::conv2d_bias) == 0);
  }
}

TEST_CASE("conv2d_bias with a bias of the wrong size is a clear error") {
  Graph g;
  const Value x = g.input("x", {2, 4, 6, 6});
  const Value w = g.input("w", {8, 4, 3, 3});
  const Value b = g.input("bias", {7});
  Attrs attrs{{"stride", std::int64_t{1}}, {"padding", std::int64_t{1}}, {"relu", std::int64_t{0}}};
  CHECK_THROWS_WITH_AS(g.apply1(OpId::conv2d_bias, {x, w, b}, std::move(attrs)),
                       doctest::Contains("conv2d_bias: the bias is"), Error);
}

#ifdef KILN_HAVE_CUDA
// The GPU's policy (gemm_epilogue_policy): an f32 convolution whose pass runs on the CUDA cores
// (the direct stem kernel, the implicit GEMM) becomes conv2d_bias, and that pass applies the
// bias and ReLU as it stores y: no epilogue kernel among the node's sources. Under TF32 a layer
// on the tensor cores keeps its group (the stem stays on the direct kernel); bf16 keeps its groups.
TEST_CASE("the GPU's policy: f32 passes on the CUDA cores apply conv2d_bias (no GPU needed)") {
  // Planned without a GPU as `dump` plans, for an sm_90 of 132 SMs.
  if (gpu::cuda_device_count() == 0) gpu::assume_plan_target(90, 132);
  const bool tf32_before = cuda::allow_tf32();
  const Layer stem{64, 1, 28, 28, 32, 3, 1, 1}, second{64, 32, 14, 14, 64, 3, 1, 1};
  auto conv2d_bias_nodes = [](const Layer& l, DType dtype, bool tf32) {
    const Graph g = conv_layer(l, true, dtype);
    const Graph fused = eliminate_dead_code(fuse_gemm_epilogues(
        fuse(eliminate_dead_code(g)), nullptr, gemm_epilogue_policy(false, tf32)));
    std::vector<std::string> kernels;  // each conv2d_bias node's kernels, "|" after each
    for (const Node& n : fused.nodes()) {
      if (n.op->id != OpId::conv2d_bias) continue;
      std::vector<TensorType> types;
      for (const ValueRef& r : n.inputs) types.push_back(fused.type(r));
      std::string names;
      for (const gpu::KernelSource& source : cuda::cuda_op(n.op->id)->sources(n, types))
        names += source.name + "|";
      kernels.push_back(names);
    }
    return kernels;
  };
  for (const Layer& l : {stem, second}) {
    CAPTURE(l.in);
    const std::vector<std::string> f32 = conv2d_bias_nodes(l, DType::f32, false);
    REQUIRE(f32.size() == 1);
    CHECK(f32[0].find(l.in == 1 ? "kiln_conv_direct_f32" : "kiln_conv_igemm_fwd") !=
          std::string::npos);
    CHECK(f32[0].find("kiln_conv_bias") == std::string::npos);
    CHECK(conv2d_bias_nodes(l, DType::bf16, false).empty());
  }
  CHECK(conv2d_bias_nodes(stem, DType::f32, true).size() == 1);
  CHECK(conv2d_bias_nodes(second, DType::f32, true).empty());  // TF32's channels-last pass
  cuda::set_allow_tf32(tf32_before);
}
#endif

TEST_CASE(
    "GPU: conv2d_bias (the pass's epilogue or a kernel after it) matches the CPU in f32, bf16 and "
    "f16") {
  if (!test::have_gpu()) return;
  std::uint64_t seed = 900;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const Layer& l : kLayers)
      for (bool relu_too : {false, true}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(l.in);
        CAPTURE(relu_too);
        Graph g;
        const Value x = g.input("x", {l.batch, l.in, l.height, l.width}, dtype);
        const Value w = g.input("w", {l.out, l.in, l.kernel, l.kernel}, dtype);
        const Value b = reshape(g.input("bias", {l.out}, dtype), {1, l.out, 1, 1});
        Attrs attrs{{"stride", l.stride}, {"padding", l.padding}, {"relu", std::int64_t{relu_too}}};
        g.output("y", g.apply1(OpId::conv2d_bias, {x, w, b}, std::move(attrs)));
        // Weights scaled by the fan-in, so that the convolution is about as large as its bias:
        // a 16-bit rounding the GPU's sums flip is then small against the result too.
        const double scale = 1.0 / std::sqrt(static_cast<double>(l.in * l.kernel * l.kernel));
        const std::vector<Feed> feeds = {
            {"x", test::random_tensor(x.shape(), dtype, seed++)},
            {"w", test::random_tensor(w.shape(), dtype, seed++, -scale, scale)},
            {"bias", test::random_tensor({l.out}, dtype, seed++)}};
        test::check_gpu_matches_cpu(g, feeds,
                                    dtype == DType::f32 ? 2e-4 : 2 * test::dtype_tolerance(dtype));
        // And the same bits as the GPU's own convolution, add and ReLU, a NaN planted in x.
        Graph unfused;
        const Value c = conv2d(unfused.input("x", x.shape(), dtype),
                               unfused.input("w", w.shape(), dtype), l.stride, l.padding);
        const Value sum = c + reshape(unfused.input("bias", {l.out}, dtype), {1, l.out, 1, 1});
        unfused.output("y", relu_too ? relu(sum) : sum);
        const std::vector<Feed> with_nan = feeds_with_nan(unfused, seed++);
        const Outputs fused_gpu = compile(g, {.device = Device::cuda()})->run(with_nan);
        const Outputs unfused_gpu =
            compile(unfused, {.device = Device::cuda(), .fuse = false})->run(with_nan);
        CHECK(same_bits(fused_gpu.at("y"), unfused_gpu.at("y")));
      }
}

}  // namespace kiln
