// Data parallelism in the graph: replicas of a training step in threads, averaging through
// an in-memory collective, train exactly as one process on the global batch does (the
// loss of every step, the parameters, batch norm's running statistics), and the
// all_reduce_mean op's buckets, schedule and errors.
#include <doctest/doctest.h>

#include <array>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "backends/compile.h"
#include "backends/schedule.h"
#include "graph/collective.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "graph/op.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

// N ranks in threads of one process: each deposits its values; the last to arrive sums
// them in rank order and divides, as a real group does.
class SharedRanks {
 public:
  explicit SharedRanks(int n) : deposits_(static_cast<std::size_t>(n)) {}
  int size() const { return static_cast<int>(deposits_.size()); }

  std::vector<double> mean(int rank, std::vector<double> mine) {
    std::unique_lock lock(mutex_);
    const int generation = generation_;
    deposits_[static_cast<std::size_t>(rank)] = std::move(mine);
    if (++arrived_ == size()) {
      result_.assign(deposits_[0].size(), 0.0);
      for (const std::vector<double>& d : deposits_)
        for (std::size_t i = 0; i < d.size(); ++i) result_[i] += d[i];
      for (double& v : result_) v /= size();
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return generation_ != generation; });
    }
    return result_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<double>> deposits_;
  std::vector<double> result_;
  int arrived_ = 0, generation_ = 0;
};

class ThreadRank final : public Collective {
 public:
  ThreadRank(SharedRanks& ranks, int rank) : ranks_(ranks), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return ranks_.size(); }
  void all_reduce_mean_host(std::span<Tensor> tensors) override {
    ++calls;
    std::vector<double> packed;
    for (const Tensor& t : tensors) {
      const std::vector<double> values = t.to_doubles();
      packed.insert(packed.end(), values.begin(), values.end());
    }
    const std::vector<double> mean = ranks_.mean(rank_, packed);
    std::size_t at = 0;
    for (Tensor& t : tensors) {
      REQUIRE(t.dtype() == DType::f32);
      for (std::int64_t i = 0; i < t.numel(); ++i)
        t.data<float>()[i] = static_cast<float>(mean[at++]);
    }
  }
  void all_reduce_mean_device(std::span<const DeviceBuffer>, void*) override {
    FAIL("no device path in this test");
  }
  int calls = 0;

 private:
  SharedRanks& ranks_;
  int rank_;
};

// A small classifier with batch norm.
struct Net : nn::Module {
  Philox rng{11};
  nn::Linear fc1{6, 12, rng};
  nn::BatchNorm1d bn{12};
  nn::Linear fc2{12, 3, rng};
  Net() {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
};

// The net trained by Adam: one replica (or the reference), with or without batch norm.
struct Replica {
  Net net;
  Adam adam{{.lr = 0.02}};
  std::unique_ptr<Program> step;

  Replica(std::int64_t batch, bool batch_norm, const TrainStepOptions& options) {
    Graph g;
    Value h = net.fc1(g.input("x", {batch, 6}));
    if (batch_norm) h = net.bn(h);
    const Value loss = cross_entropy(net.fc2(tanh(h)), g.input("y", {batch}, DType::i64));
    std::vector<VariablePtr> params = net.fc1.parameters();
    for (const auto& more :
         {batch_norm ? net.bn.parameters() : std::vector<VariablePtr>{}, net.fc2.parameters()})
      params.insert(params.end(), more.begin(), more.end());
    step = compile_training(loss, params, adam, {}, options);
  }
  std::vector<VariablePtr> state() const {
    std::vector<VariablePtr> s = net.parameters();
    const std::vector<VariablePtr> b = net.buffers();
    s.insert(s.end(), b.begin(), b.end());
    return s;
  }
};

Tensor rows(const Tensor& t, std::int64_t first, std::int64_t count) {
  return t.narrow_rows(first, count).clone();
}

// One process on the global batch of 16 beside two replicas in threads on 8 examples each.
class SideBySide {
 public:
  static constexpr std::int64_t kGlobal = 16;
  explicit SideBySide(bool batch_norm)
      : ids_{register_collective(ranks_[0]), register_collective(ranks_[1])},
        reference(kGlobal, batch_norm, {}),
        replicas{
            Replica(kGlobal / 2, batch_norm, {.data_parallel_group = ids_[0], .bucket_bytes = 200}),
            Replica(kGlobal / 2, batch_norm,
                    {.data_parallel_group = ids_[1], .bucket_bytes = 200})} {}
  ~SideBySide() {
    for (int id : ids_) unregister_collective(id);
  }
  // Step `s` on fresh data: the reference's loss, then each replica's.
  std::array<double, 3> step(std::int64_t s) {
    const Tensor x =
        test::random_tensor({kGlobal, 6}, DType::f32, 100 + static_cast<std::uint64_t>(s), -2, 2);
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < kGlobal; ++i) labels.push_back((i * 7 + s) % 3);
    const Tensor y = Tensor::from_vector<std::int64_t>({kGlobal}, labels);
    std::array<double, 3> loss{};
    loss[0] = reference.step->run({{"x", x}, {"y", y}}).at("loss").item();
    std::thread other([&] {
      loss[2] =
          replicas[1].step->run({{"x", rows(x, 8, 8)}, {"y", rows(y, 8, 8)}}).at("loss").item();
    });
    loss[1] = replicas[0].step->run({{"x", rows(x, 0, 8)}, {"y", rows(y, 0, 8)}}).at("loss").item();
    other.join();
    return loss;
  }
  int reduces() const {
    int n = 0;
    for (const Node& node : replicas[0].step->graph().nodes())
      n += node.op->id == OpId::all_reduce_mean;
    return n;
  }

 private:
  SharedRanks shared_{2};
  std::shared_ptr<ThreadRank> ranks_[2] = {std::make_shared<ThreadRank>(shared_, 0),
                                           std::make_shared<ThreadRank>(shared_, 1)};
  int ids_[2];

 public:
  Replica reference;
  Replica replicas[2];
  int calls() const { return ranks_[0]->calls; }
};

}  // namespace

TEST_CASE(
    "data parallel: two replicas on half batches train exactly as one process on the whole batch") {
  constexpr std::int64_t kSteps = 6;
  SideBySide run(false);
  CHECK(run.reduces() >= 2);  // several gradient buckets
  for (std::int64_t s = 0; s < kSteps; ++s) {
    const std::array<double, 3> loss = run.step(s);
    CAPTURE(s);
    CHECK(loss[1] == loss[2]);  // the loss output is the global batch's mean on every rank
    CHECK(loss[1] == doctest::Approx(loss[0]).epsilon(1e-5));
  }
  CHECK(run.calls() == run.reduces() * kSteps);
  const std::vector<VariablePtr> ref = run.reference.state(), a = run.replicas[0].state(),
                                 b = run.replicas[1].state();
  for (std::size_t v = 0; v < ref.size(); ++v) {
    CAPTURE(ref[v]->name);
    for (std::int64_t i = 0; i < ref[v]->value.numel(); ++i) {
      REQUIRE(a[v]->value.at(i) == b[v]->value.at(i));  // replicas stay bitwise identical
      CHECK(a[v]->value.at(i) == doctest::Approx(ref[v]->value.at(i)).epsilon(1e-4).scale(1));
    }
  }
}

// Batch norm normalises by each rank's own batch (as PyTorch's DistributedDataParallel
// without SyncBatchNorm does), so the losses differ slightly; the running statistics are
// averaged over the ranks, so the replicas stay identical, and after the first step the
// running mean is exactly the global batch's (the mean of equal shards' means).
TEST_CASE(
    "data parallel: batch norm's running statistics are averaged, so replicas stay identical") {
  SideBySide run(true);
  run.step(0);
  const VariablePtr ref_mean = run.reference.net.bn.buffers()[0],
                    mean = run.replicas[0].net.bn.buffers()[0];
  REQUIRE(mean->name.find("running_mean") != std::string::npos);
  for (std::int64_t i = 0; i < mean->value.numel(); ++i)
    CHECK(mean->value.at(i) == doctest::Approx(ref_mean->value.at(i)).epsilon(1e-5));
  for (std::int64_t s = 1; s < 4; ++s) run.step(s);
  const std::vector<VariablePtr> a = run.replicas[0].state(), b = run.replicas[1].state();
  for (std::size_t v = 0; v < a.size(); ++v) {
    CAPTURE(a[v]->name);
    for (std::int64_t i = 0; i < a[v]->value.numel(); ++i)
      REQUIRE(a[v]->value.at(i) == b[v]->value.at(i));
  }
}

TEST_CASE(
    "data parallel: buckets are taken from the last parameter back, and run on the communication "
    "stream") {
  Graph g;
  std::vector<VariablePtr> params;
  Value h = g.input("x", {4, 8});
  for (int i = 0; i < 3; ++i) {
    params.push_back(
        make_variable("w" + std::to_string(i),
                      test::random_tensor({8, 8}, DType::f32, 5 + static_cast<std::uint64_t>(i))));
    h = tanh(matmul(h, g.variable(params.back())));
  }
  std::vector<Value> grads;
  for (const VariablePtr& p : params) grads.push_back(g.variable(p) * 2.0);
  const std::vector<Value> averaged =
      average_over_ranks(grads, 0, 8 * 8 * 4 * 2);  // two 256-byte gradients a bucket
  REQUIRE(averaged.size() == 3);
  // w2 and w1 share the first bucket (ready first in the backward), w0 is alone in the last.
  CHECK(averaged[2].ref().node == averaged[1].ref().node);
  CHECK(averaged[0].ref().node != averaged[1].ref().node);
  CHECK(averaged[0].ref().node > averaged[1].ref().node);
  for (std::size_t i = 0; i < 3; ++i) g.output("g" + std::to_string(i), averaged[i]);
  const std::vector<int> streams = assign_streams(g, 2);
  for (const Node& n : g.nodes())
    if (n.op->id == OpId::all_reduce_mean)
      CHECK(streams[static_cast<std::size_t>(&n - g.nodes().data())] == 2);
  const Outputs out = test::run_once(g, {{"x", test::random_tensor({4, 8}, DType::f32, 1)}});
  for (std::int64_t i = 0; i < 64; ++i)
    CHECK(out.at("g1").at(i) == 2.0f * params[1]->value.at(i));  // one process: the identity
}

TEST_CASE("all_reduce_mean: an unregistered group and integer values are clear errors") {
  Graph g;
  const Value x = g.input("x", {3});
  CHECK_THROWS_WITH_AS(all_reduce_mean({x}, 9999), doctest::Contains("no collective group 9999"),
                       Error);
  CHECK_THROWS_WITH_AS(all_reduce_mean({g.input("n", {3}, DType::i64)}, 0),
                       doctest::Contains("not floating"), Error);
}

}  // namespace kiln
