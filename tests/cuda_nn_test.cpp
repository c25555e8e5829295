// The normalisation and regularisation blocks on the GPU against the CPU backend:
// random_uniform and Dropout bitwise (the same Philox integers and float conversion),
// BatchNorm (training and eval) and ConvTranspose2d within float tolerance. Skips without a GPU.
#include <doctest/doctest.h>

#include <cstring>

#include "backends/compile.h"
#include "backends/host_copy.h"
#include "gpu/cuda_runtime.h"
#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/dropout.h"
#include "graph/nn/functional.h"
#include "tests/support.h"

namespace kiln {
namespace {

using test::have_gpu;

void check_identical(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  CHECK(std::memcmp(to_host(gpu).raw(), to_host(cpu).raw(), cpu.nbytes()) == 0);
}

// The same graph built twice (separate variables), so that each backend owns its state.
struct Twin {
  std::unique_ptr<Program> cpu, gpu;
};
Twin compile_twin(const Graph& for_cpu, const Graph& for_gpu) {
  return {compile(for_cpu), compile(for_gpu, {.device = Device::cuda()})};
}

}  // namespace

TEST_CASE("GPU: random_uniform is bitwise the CPU's (f32, f64, partial blocks, steps past 2^32)") {
  if (!have_gpu()) return;
  for (DType dtype : {DType::f32, DType::f64})
    for (std::int64_t n : {1, 7, 4096, 1000003}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(n);
      Graph g;
      const RandomUniform r =
          random_uniform(g.input("step", {}, DType::i64), {n}, 0xfedcba9876543210ULL, dtype);
      g.output("u", r.values);
      g.output("next", r.next_step);
      auto cpu = compile(g);
      auto gpu = compile(g, {.device = Device::cuda()});
      for (std::int64_t step : {std::int64_t{0}, std::int64_t{1}, (std::int64_t{1} << 32) + 5}) {
        const std::vector<Feed> feeds = {{"step", Tensor::from_vector<std::int64_t>({}, {step})}};
        const Outputs c = cpu->run(feeds), d = gpu->run(feeds);
        check_identical(d.at("u"), c.at("u"));
        CHECK(d.at("next").item() == static_cast<double>(step + 1));
      }
    }
}

TEST_CASE("GPU: Dropout training steps draw the CPU's masks bitwise, through CUDA-graph replays") {
  if (!have_gpu()) return;
  Philox rng_cpu(21), rng_gpu(21);
  nn::Dropout cpu_drop(0.25, rng_cpu), gpu_drop(0.25, rng_gpu);
  Graph gc, gg;
  for (auto [g, drop] : {std::pair{&gc, &cpu_drop}, std::pair{&gg, &gpu_drop}}) {
    const Value x = g->input("x", {64, 300});
    const Value y = (*drop)((*drop)(x));  // twice: the step advances by two per run
    g->output("y", y);
    g->output("dx", grad(sum_all(y * y), {x})[0]);
  }
  Twin t = compile_twin(gc, gg);
  for (int run = 0; run < 4; ++run) {  // the first run, the capture, replays
    CAPTURE(run);
    const std::vector<Feed> feeds = {
        {"x", test::random_tensor({64, 300}, DType::f32, 50 + static_cast<std::uint64_t>(run))}};
    const Outputs c = t.cpu->run(feeds), d = t.gpu->run(feeds);
    check_identical(d.at("y"), c.at("y"));
    CHECK(test::closeness(d.at("dx"), c.at("dx"), 1e-6, 1e-6) <= 1.0);
    CHECK(to_host(gpu_drop.step()->value).item() == cpu_drop.step()->value.item());
  }
  CHECK(cpu_drop.step()->value.item() == 8.0);
}

TEST_CASE(
    "GPU: BatchNorm2d training (output, gradients, running statistics) and eval match the CPU") {
  if (!have_gpu()) return;
  nn::BatchNorm2d cpu_bn(6), gpu_bn(6);
  Graph gc, gg;
  for (auto [g, bn] : {std::pair{&gc, &cpu_bn}, std::pair{&gg, &gpu_bn}}) {
    const Value x = g->input("x", {16, 6, 9, 7});
    const Value y = (*bn)(x);
    const Value loss = sum_all(y * g->constant(test::random_tensor({16, 6, 9, 7}, DType::f32, 3)));
    const auto grads = grad(loss, {x, g->variable(bn->weight()), g->variable(bn->bias())});
    g->output("y", y);
    for (std::size_t i = 0; i < grads.size(); ++i) g->output("grad" + std::to_string(i), grads[i]);
  }
  Twin t = compile_twin(gc, gg);
  for (int run = 0; run < 3; ++run) {
    CAPTURE(run);
    const std::vector<Feed> feeds = {
        {"x", test::random_tensor({16, 6, 9, 7}, DType::f32, 60 + static_cast<std::uint64_t>(run),
                                  -1, 3)}};
    const Outputs c = t.cpu->run(feeds), d = t.gpu->run(feeds);
    for (const auto& [name, tensor] : c) {
      CAPTURE(name);
      CHECK(test::closeness(d.at(name), tensor, 2e-4, 2e-4) <= 1.0);
    }
    CHECK(test::closeness(to_host(gpu_bn.running_mean()->value), cpu_bn.running_mean()->value, 1e-5,
                          1e-5) <= 1.0);
    CHECK(test::closeness(to_host(gpu_bn.running_var()->value), cpu_bn.running_var()->value, 1e-5,
                          1e-5) <= 1.0);
  }
  cpu_bn.set_training(false);
  gpu_bn.set_training(false);
  Graph ec, eg;
  ec.output("y", cpu_bn(ec.input("x", {2, 6, 4, 4})));
  eg.output("y", gpu_bn(eg.input("x", {2, 6, 4, 4})));
  const std::vector<Feed> feeds = {{"x", test::random_tensor({2, 6, 4, 4}, DType::f32, 70)}};
  CHECK(test::closeness(compile(eg, {.device = Device::cuda()})->run(feeds).at("y"),
                        compile(ec)->run(feeds).at("y"), 1e-5, 1e-5) <= 1.0);
}

TEST_CASE("GPU: ConvTranspose2d forward and gradients match the CPU") {
  if (!have_gpu()) return;
  Graph g;
  const Value x = g.input("x", {4, 8, 7, 7}), w = g.input("w", {8, 5, 4, 4});
  const Value y = conv_transpose2d(x, w, 2, 1);  // [4, 5, 14, 14]
  const auto grads =
      grad(sum_all(y * g.constant(test::random_tensor({4, 5, 14, 14}, DType::f32, 8))), {x, w});
  g.output("y", y);
  g.output("dx", grads[0]);
  g.output("dw", grads[1]);
  const std::vector<Feed> feeds = {{"x", test::random_tensor({4, 8, 7, 7}, DType::f32, 80)},
                                   {"w", test::random_tensor({8, 5, 4, 4}, DType::f32, 81)}};
  const Outputs c = compile(g)->run(feeds);
  const Outputs d = compile(g, {.device = Device::cuda()})->run(feeds);
  for (const auto& [name, tensor] : c) {
    CAPTURE(name);
    CHECK(test::closeness(d.at(name), tensor, 1e-4, 1e-4) <= 1.0);
  }
}

}  // namespace kiln
