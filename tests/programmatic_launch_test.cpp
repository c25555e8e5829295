// Programmatic dependent launch (gpu/kernel_source.h): a step whose kernels start while the
// kernel ahead of them still runs gives the bits of the step launched plainly.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "gpu/cuda_runtime.h"
#include "graph/passes/dead_code.h"
#include "models/lenet.h"
#include "models/resnet.h"
#include "tests/support.h"

namespace kiln {
namespace {

// `steps` runs of g on the GPU (each a captured graph replay after the first), launched
// programmatically or not; every output of every run, named "<output> @<step>". The variables
// the steps assign (parameters and optimizer state) are put back after.
std::map<std::string, Tensor> gpu_steps(const Graph& g, const std::vector<Feed>& feeds, int steps,
                                        bool programmatic) {
  const bool was = gpu::programmatic_launches();
  gpu::set_programmatic_launches(programmatic);
  std::map<VariablePtr, Tensor> before;
  for (const auto& [var, ref] : g.assignments()) before[var] = var->value.clone();
  std::map<std::string, Tensor> results;
  {
    const auto program = compile(g, {.device = Device::cuda()});
    for (int s = 0; s < steps; ++s)
      for (auto& [name, value] : program->run(feeds))
        results[name + " @" + std::to_string(s)] = value.clone();
  }
  for (auto& [var, value] : before) var->value = value;
  gpu::set_programmatic_launches(was);
  return results;
}

void check_same_steps(const Graph& g, const std::vector<Feed>& feeds, int steps) {
  const auto plain = gpu_steps(g, feeds, steps, false);
  const auto early = gpu_steps(g, feeds, steps, true);
  REQUIRE(plain.size() == early.size());
  for (const auto& [name, value] : plain) {
    CAPTURE(name);
    test::check_same_bits(early.at(name), value);
  }
}

}  // namespace

TEST_CASE("GPU: LeNet's Adam steps give the same bits launched programmatically or plainly") {
  if (!test::have_gpu()) return;
  Philox rng(3);
  LeNet model(rng);
  Adam adam({.lr = 0.01});
  Graph g;
  test::add_classifier_step(g, model, {64, 1, 28, 28}, &adam);
  // Three steps: the second and third read the parameters and moments the updates wrote.
  check_same_steps(g, test::random_feeds(g, 11), 3);
}

TEST_CASE(
    "GPU: ResNet-18's bf16 SGD steps give the same bits launched programmatically or plainly") {
  if (!test::have_gpu()) return;
  Philox rng(5);
  ResNet18 model(rng);
  Sgd sgd({.lr = 0.01, .momentum = 0.9});
  Graph g;
  test::add_classifier_step(g, model, {64, 3, 32, 32}, &sgd);
  const Graph step = eliminate_dead_code(apply_precision(g, Precision::bf16));
  check_same_steps(step, test::random_feeds(step, 13), 2);
}

}  // namespace kiln
