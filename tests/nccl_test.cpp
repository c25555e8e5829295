// The NCCL collective inside a compiled GPU step: a data-parallel training step over a
// one-rank NCCL communicator (real ncclAllReduce calls, captured in the CUDA graph) trains
// as the CPU step does. Two ranks are run by tests/trainer_parallel_test.sh's GPU twin on
// a two-GPU machine (bench/README.md).
#include <doctest/doctest.h>

#include "distributed/collectives.h"
#include "graph/collective.h"
#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "graph/op.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct SmallNet : nn::Module {
  Philox rng{3};
  nn::Linear fc1{10, 32, rng}, fc2{32, 5, rng};
  SmallNet() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
};

struct SmallStep {
  SmallNet net;
  Adam adam{{.lr = 0.01}};
  std::unique_ptr<Program> step;
  SmallStep(Device device, int group) {
    Graph g;
    const Value loss = cross_entropy(net.fc2(relu(net.fc1(g.input("x", {24, 10})))),
                                     g.input("y", {24}, DType::i64));
    step = compile_training(loss, net.parameters(), adam, {.device = device},
                            {.data_parallel_group = group, .bucket_bytes = 512});
  }
};

}  // namespace

TEST_CASE("GPU: a data-parallel step through a one-rank NCCL communicator trains as the CPU step") {
  if (!test::have_gpu()) return;
  REQUIRE(dist::have_nccl());
  auto group = dist::ProcessGroup::join({.rank = 0, .world_size = 1});
  const int id = register_collective(dist::make_nccl_collective(*group));
  SmallStep gpu(Device::cuda(), id), cpu(Device::cpu(), -1);
  for (int s = 0; s < 5; ++s) {  // the first run is direct, the later ones replay a CUDA graph
    const Tensor x = test::random_tensor({24, 10}, DType::f32, 40 + static_cast<std::uint64_t>(s));
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < 24; ++i) labels.push_back((i + s) % 5);
    const Tensor y = Tensor::from_vector<std::int64_t>({24}, labels);
    const double on_gpu = gpu.step->run({{"x", x}, {"y", y}}).at("loss").item();
    const double on_cpu = cpu.step->run({{"x", x}, {"y", y}}).at("loss").item();
    CAPTURE(s);
    CHECK(on_gpu == doctest::Approx(on_cpu).epsilon(1e-5));
  }
  int reduces = 0;
  for (const Node& n : gpu.step->graph().nodes()) reduces += n.op->id == OpId::all_reduce_mean;
  CHECK(reduces >= 2);
  gpu.step.reset();
  unregister_collective(id);
  group->finish();
}

}  // namespace kiln
