// Data parallelism in the graph: replicas of a training step in threads, averaging through
// an in-memory collective, train exactly as one process on the global batch does (the
// loss of every step, the parameters, batch norm's running statistics), and the
// all_reduce_mean op's buckets, schedule and errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "backends/compile.h"
#include "backends/schedule.h"
#include "graph/autograd.h"
#include "graph/collective.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/dropout.h"
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
      REQUIRE((t.dtype() == DType::f32 || t.dtype() == DType::f64));
      for (std::int64_t i = 0; i < t.numel(); ++i, ++at)
        if (t.dtype() == DType::f64)
          t.data<double>()[i] = mean[at];
        else
          t.data<float>()[i] = static_cast<float>(mean[at]);
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

// A small classifier with batch norm. fc1 has no bias, as layers before batch norm have none:
// batch norm takes away what it would add, so its gradient would be rounding noise, which Adam
// scales up to whole steps.
struct Net : nn::Module {
  Philox rng{11};
  nn::Linear fc1{6, 12, rng, false};
  nn::BatchNorm1d bn{12};
  nn::Linear fc2{12, 3, rng};
  Net() {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
};

// The net trained by Adam: one replica (or the reference), with or without batch norm, its
// statistics synchronised over the replicas' group or not.
struct Replica {
  Net net;
  Adam adam{{.lr = 0.02}};
  std::unique_ptr<Program> step;

  Replica(std::int64_t batch, bool batch_norm, const TrainStepOptions& options) {
    if (options.sync_batch_norm) nn::sync_batch_norm(net, options.data_parallel_group);
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
  explicit SideBySide(bool batch_norm, bool sync_batch_norm = false)
      : ids_{register_collective(ranks_[0]), register_collective(ranks_[1])},
        reference(kGlobal, batch_norm, {}),
        replicas{Replica(kGlobal / 2, batch_norm,
                         {.data_parallel_group = ids_[0],
                          .bucket_bytes = 150,
                          .sync_batch_norm = sync_batch_norm}),
                 Replica(kGlobal / 2, batch_norm,
                         {.data_parallel_group = ids_[1],
                          .bucket_bytes = 150,
                          .sync_batch_norm = sync_batch_norm})} {}
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

// Synchronised batch norm: the statistics of both replicas' rows together, so each step is the
// global batch's, as the reference computes it (up to the order of the sums); unsynchronised
// replicas (each normalising by its own 8 rows) miss the same tolerance, so the comparison
// tells them apart.
TEST_CASE(
    "data parallel: synchronised batch norm trains exactly as one process on the whole batch") {
  constexpr std::int64_t kSteps = 6;
  for (const bool sync : {true, false}) {
    CAPTURE(sync);
    SideBySide run(true, sync);
    double worst = 0;  // the largest relative loss difference to the reference
    for (std::int64_t s = 0; s < kSteps; ++s) {
      const std::array<double, 3> loss = run.step(s);
      CHECK(loss[1] == loss[2]);
      worst = std::max(worst, std::abs(loss[1] - loss[0]) / std::abs(loss[0]));
    }
    const std::vector<VariablePtr> ref = run.reference.state(), a = run.replicas[0].state(),
                                   b = run.replicas[1].state();
    double worst_state = 0;  // parameters and running statistics, relative to max(1, |ref|)
    for (std::size_t v = 0; v < ref.size(); ++v) {
      CAPTURE(ref[v]->name);
      for (std::int64_t i = 0; i < ref[v]->value.numel(); ++i)
        if (std::abs(a[v]->value.at(i) - ref[v]->value.at(i)) > 1e-4)
          MESSAGE(ref[v]->name, " ", i, " ", a[v]->value.at(i), " ", ref[v]->value.at(i));
      for (std::int64_t i = 0; i < ref[v]->value.numel(); ++i) {
        REQUIRE(a[v]->value.at(i) == b[v]->value.at(i));  // replicas stay identical either way
        worst_state = std::max(worst_state, std::abs(a[v]->value.at(i) - ref[v]->value.at(i)) /
                                                std::max(1.0, std::abs(ref[v]->value.at(i))));
      }
    }
    if (sync) {
      CHECK(worst < 1e-5);
      CHECK(worst_state < 1e-4);
      // Per batch norm: the table of both ranks' statistics, [2, 2C], in the forward, its
      // gradient in the backward; the gradients and the running statistics as before.
      int statistics_reduces = 0;
      for (const Node& node : run.replicas[0].step->graph().nodes())
        statistics_reduces +=
            node.op->id == OpId::all_reduce_mean &&
            std::all_of(node.outputs.begin(), node.outputs.end(), [](const TensorType& t) {
              return t.shape == Shape{2, 24};
            });
      CHECK(statistics_reduces == 2);
    } else {
      CHECK(worst > 1e-3);
    }
  }
}

// Two ranks' halves of a batch through synchronised batch norm give the whole batch's outputs
// and, times the two ranks (each rank's loss is its half's mean), its input gradient: in f64
// to 1e-10, so nothing but the order of the sums differs.
TEST_CASE(
    "synchronised batch norm: two ranks' halves give the whole batch's values and gradients") {
  const Tensor x = test::random_tensor({8, 3, 2, 2}, DType::f64, 51, -2, 3);
  const Tensor w = test::random_tensor({8, 3, 2, 2}, DType::f64, 52, -1, 1);
  const Tensor gamma = test::random_tensor({3}, DType::f64, 53, 0.5, 1.5);
  const Tensor beta = test::random_tensor({3}, DType::f64, 54, -1, 1);
  auto record = [&](Graph& g, std::int64_t rows, int group) {
    const Value xv = g.input("x", {rows, 3, 2, 2}, DType::f64);
    const BatchNormResult r =
        batch_norm_training(xv, g.constant(gamma), g.constant(beta), 1e-5, group);
    const Value loss =
        sum_all(r.y * g.input("w", {rows, 3, 2, 2}, DType::f64) * r.y) * (1.0 / rows);
    g.output("y", r.y);
    g.output("dx", grad(loss, {xv})[0]);
  };
  Graph whole;
  record(whole, 8, -1);
  const Outputs want = test::run_once(whole, {{"x", x}, {"w", w}});
  SharedRanks shared(2);
  auto r0 = std::make_shared<ThreadRank>(shared, 0), r1 = std::make_shared<ThreadRank>(shared, 1);
  const int ids[2] = {register_collective(r0), register_collective(r1)};
  Outputs got[2];
  auto run_rank = [&](int rank) {
    Graph g;
    record(g, 4, ids[rank]);
    got[rank] = test::run_once(g, {{"x", rows(x, 4 * rank, 4)}, {"w", rows(w, 4 * rank, 4)}});
  };
  std::thread other(run_rank, 1);
  run_rank(0);
  other.join();
  for (int id : ids) unregister_collective(id);
  for (int rank = 0; rank < 2; ++rank)
    for (std::int64_t i = 0; i < 48; ++i) {
      CAPTURE(rank);
      CAPTURE(i);
      CHECK(got[rank].at("y").at(i) ==
            doctest::Approx(want.at("y").at(48 * rank + i)).epsilon(1e-10));
      CHECK(got[rank].at("dx").at(i) ==
            doctest::Approx(2 * want.at("dx").at(48 * rank + i)).epsilon(1e-10));
    }
}

TEST_CASE(
    "synchronised batch norm: the gradient through the all-reduces matches finite differences") {
  // Group 0 is this process alone: the all-reduces are identities, but the gradient flows
  // through their backward (the all-reduce of the sums' gradients) like a real group's.
  Graph g;
  const Tensor x0 = test::random_tensor({5, 3, 2, 2}, DType::f64, 41, -2, 3);
  const Tensor gamma0 = test::random_tensor({3}, DType::f64, 42, 0.5, 1.5);
  const Tensor beta0 = test::random_tensor({3}, DType::f64, 43, -1, 1);
  const Tensor w0 = test::random_tensor({5, 3, 2, 2}, DType::f64, 44, -1, 1);
  auto loss_of = [&](Graph& graph, const Value& x, int group) {
    const BatchNormResult r =
        batch_norm_training(x, graph.constant(gamma0), graph.constant(beta0), 1e-5, group);
    return sum_all(r.y * graph.constant(w0) * r.y) + sum_all(r.var) + sum_all(r.mean);
  };
  const Value x = g.input("x", x0.shape(), DType::f64);
  const Value loss = loss_of(g, x, 0);
  g.output("loss", loss);
  g.output("dx", grad(loss, {x})[0]);
  int reduces = 0;
  for (const Node& node : g.nodes()) reduces += node.op->id == OpId::all_reduce_mean;
  CHECK(reduces == 2);  // the table of statistics, its gradient
  const Outputs out = test::run_once(g, {{"x", x0}});
  Graph plain;
  const Value px = plain.input("x", x0.shape(), DType::f64);
  plain.output("loss", loss_of(plain, px, -1));
  auto loss_at = [&](const Tensor& xt) {
    return test::run_once(plain, {{"x", xt}}).at("loss").item();
  };
  CHECK(out.at("loss").item() == doctest::Approx(loss_at(x0)).epsilon(1e-12));
  for (std::int64_t i = 0; i < x0.numel(); i += 3) {
    CAPTURE(i);
    Tensor up = x0.clone(), down = x0.clone();
    const double h = 1e-5;
    up.data<double>()[i] += h;
    down.data<double>()[i] -= h;
    const double numeric = (loss_at(up) - loss_at(down)) / (2 * h);
    CHECK(out.at("dx").at(i) == doctest::Approx(numeric).epsilon(1e-6).scale(1));
  }
}

// Dropout on two ranks drops what one process drops on the whole batch: each rank keeps its rows
// of the global batch's mask, step after step.
TEST_CASE("data parallel: sharded dropout draws each rank's rows of the global batch's mask") {
  SharedRanks shared(2);
  auto r0 = std::make_shared<ThreadRank>(shared, 0), r1 = std::make_shared<ThreadRank>(shared, 1);
  const int ids[2] = {register_collective(r0), register_collective(r1)};
  auto masks = [&](std::int64_t rows, int group) {  // two steps of one Dropout over ones
    Philox rng(5);
    nn::Dropout dropout(0.5, rng);
    if (group >= 0) nn::shard_dropout(dropout, group);
    Graph g;
    const Value ones = g.fill(1.0, {rows, 7});
    g.output("first", dropout(ones));
    g.output("second", dropout(ones));
    return test::run_once(g);
  };
  const Outputs whole = masks(6, -1);
  const Outputs half[2] = {masks(3, ids[0]), masks(3, ids[1])};
  for (int id : ids) unregister_collective(id);
  for (const char* name : {"first", "second"}) {
    CAPTURE(name);
    int dropped = 0;
    for (int rank = 0; rank < 2; ++rank)
      for (std::int64_t i = 0; i < 21; ++i) {
        CHECK(half[rank].at(name).at(i) == whole.at(name).at(21 * rank + i));
        dropped += half[rank].at(name).at(i) == 0;
      }
    CHECK(dropped > 5);  // the masks are masks: some dropped, some kept
    CHECK(dropped < 37);
  }
  const Outputs plain = masks(3, -1);  // without sharding rank 1 would repeat rank 0's rows
  bool differs = false;
  for (std::int64_t i = 0; i < 21; ++i)
    differs = differs || plain.at("first").at(i) != whole.at("first").at(21 + i);
  CHECK(differs);
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
