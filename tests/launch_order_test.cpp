// The launch list as a happens-before graph (stream order, the events, the join before the
// update copies): every two launches that touch the same memory (an arena slot, a variable),
// one of them writing it, are ordered, with and without horizontal launches.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "backends/lowering.h"
#include "fusion/fuse.h"
#include "graph/op.h"
#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/hoist_collectives.h"
#include "graph/passes/verify.h"
#include "graph/train_step.h"
#include "tests/support.h"
#include "train/step_graph.h"

namespace kiln {
namespace {

void no_dump(const char*, const Graph&, const Lowering&) {}

// The memory a launch touches: a variable (read, or written in place) or a byte range of the
// arena (a value's slot, or a launch's scratch).
struct Memory {
  std::string variable;
  std::size_t begin = 0, end = 0;
  ValueRef value{-1, -1};  // the arena value, if one
  bool conflicts(const Memory& o) const {
    if (!variable.empty() || !o.variable.empty()) return variable == o.variable;
    return begin < o.end && o.begin < end;
  }
  std::string str() const {
    return variable.empty() ? "arena [" + std::to_string(begin) + ", " + std::to_string(end) + ")"
                            : "var:" + variable;
  }
};

Memory arena_slot(const MemoryPlan& plan, std::int32_t slot, ValueRef value) {
  const std::size_t at = plan.slot_offset[static_cast<std::size_t>(slot)];
  return {"", at, at + plan.slot_bytes[static_cast<std::size_t>(slot)], value};
}

// The memory a value lives in, or none (an input or a constant, never written).
std::optional<Memory> memory_of(const Graph& g, const Lowering& l, ValueRef ref) {
  ref = alias_root(g, ref);
  const Node& n = g.node(ref.node);
  if (n.op->id == OpId::variable) return Memory{n.variable->name};
  if (n.op->kind == OpKind::source) return std::nullopt;
  for (std::size_t k = 0; k < l.in_place.size(); ++k)
    if (l.in_place[k].in_place && g.assignments()[k].second == ref)
      return Memory{g.assignments()[k].first->name};
  return arena_slot(l.plan, l.plan.slot[ref.node][ref.index], ref);
}

// Races (two launches touching the same memory, one writing it, unordered) and clobbers (a
// launch writing a value's bytes after the value's writer and before one of its readers).
int unordered_conflicts(const Graph& g, const Lowering& l, const char* label) {
  const auto& steps = l.launches.steps;
  const std::size_t n = steps.size();
  std::vector<std::vector<Memory>> reads(n), writes(n);
  std::map<ValueRef, std::size_t> written_by;  // arena value -> its launch
  for (std::size_t k = 0; k < n; ++k) {
    const LaunchStep& s = steps[k];
    std::vector<std::int32_t> nodes =
        s.merged.empty() ? std::vector<std::int32_t>{s.node} : s.merged;
    if (s.node < 0) {
      const auto& [var, ref] = g.assignments()[s.assignment];
      if (auto m = memory_of(g, l, ref)) reads[k].push_back(*m);
      writes[k].push_back({var->name});
      continue;
    }
    for (std::int32_t id : nodes) {
      for (const ValueRef& in : g.node(id).inputs)
        if (auto m = memory_of(g, l, in)) reads[k].push_back(*m);
      for (std::size_t i = 0; i < g.node(id).outputs.size(); ++i) {
        const Memory m = *memory_of(g, l, {id, static_cast<std::int32_t>(i)});
        writes[k].push_back(m);
        if (m.variable.empty()) written_by[m.value] = k;
      }
      if (const std::int32_t scratch = l.plan.scratch[static_cast<std::size_t>(id)]; scratch >= 0) {
        reads[k].push_back(arena_slot(l.plan, scratch, {-1, -1}));
        writes[k].push_back(arena_slot(l.plan, scratch, {-1, -1}));
      }
    }
  }
  // Happens-before: stream order, event waits, the join before the update copies.
  std::vector<std::vector<std::size_t>> succ(n);
  std::map<int, std::size_t> last_on;
  std::map<int, std::size_t> recorder;
  for (std::size_t k = 0; k < n; ++k) {
    const LaunchStep& s = steps[k];
    if (k == l.launches.first_update) {  // join: every stream's last before k
      for (auto [st, j] : last_on)
        if (st != 0) succ[j].push_back(k);
    }
    if (last_on.count(s.stream)) succ[last_on[s.stream]].push_back(k);
    for (int e : s.waits) succ[recorder.at(e)].push_back(k);
    if (s.record >= 0) recorder[s.record] = k;
    last_on[s.stream] = k;
  }
  std::vector<std::vector<char>> ordered(n, std::vector<char>(n, 0));
  for (std::size_t k = n; k-- > 0;) {
    for (std::size_t j : succ[k]) {
      ordered[k][j] = 1;
      for (std::size_t m = 0; m < n; ++m)
        if (ordered[j][m]) ordered[k][m] = 1;
    }
  }
  auto any_conflict = [](const std::vector<Memory>& x, const std::vector<Memory>& y) {
    for (const Memory& a : x)
      for (const Memory& b : y)
        if (a.conflicts(b)) return a.str();
    return std::string();
  };
  int races = 0;
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = a + 1; b < n; ++b) {
      std::string what = any_conflict(writes[a], reads[b]);
      if (what.empty()) what = any_conflict(writes[a], writes[b]);
      if (what.empty()) what = any_conflict(reads[a], writes[b]);
      if (!what.empty() && !ordered[a][b]) {
        ++races;
        std::printf("%s: race on %s between #%zu %s (stream %d) and #%zu %s (stream %d)\n", label,
                    what.c_str(), a, steps[a].label.c_str(), steps[a].stream, b,
                    steps[b].label.c_str(), steps[b].stream);
      }
    }
  for (std::size_t r = 0; r < n; ++r)
    for (const Memory& m : reads[r]) {
      if (!m.variable.empty() || m.value.node < 0) continue;
      const auto found = written_by.find(m.value);
      REQUIRE_MESSAGE(found != written_by.end(), label, ": no launch writes %", m.value.node, ".",
                      m.value.index);
      const std::size_t w = found->second;
      for (std::size_t x = 0; x < n; ++x) {
        if (x == w) continue;
        const bool between = x == r || (ordered[w][x] && ordered[x][r]);
        for (const Memory& o : writes[x])
          if (between && o.conflicts(m) && o.value != m.value) {
            ++races;
            std::printf("%s: #%zu %s overwrites %s between its writer #%zu and reader #%zu\n",
                        label, x, steps[x].label.c_str(), m.str().c_str(), w, r);
          }
      }
    }
  return races;
}

// Scratch for every launch that is not a fused group (convolutions, GEMMs, pools): as many
// bytes as its first input, as a convolution's channels-last copy would take.
std::vector<std::size_t> some_scratch(const Graph& g) {
  std::vector<std::size_t> bytes(g.nodes().size(), 0);
  for (std::size_t id = 0; id < bytes.size(); ++id) {
    const Node& n = g.nodes()[id];
    if (n.body || n.op->kind == OpKind::source || n.op->alias || n.inputs.empty()) continue;
    const TensorType t = g.type(n.inputs[0]);
    bytes[id] = static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype);
  }
  return bytes;
}

}  // namespace

TEST_CASE(
    "launch lists order every two launches that touch the same memory, one writing it, and no "
    "launch overwrites a value before its last reader (LeNet, ResNet, VGG, Inception, SGD and "
    "Adam, fp32 and bf16, 2 and 4 streams, with and without horizontal launches, scratch, and "
    "reuse across streams at once)") {
  int races = 0;
  for (const char* model : {"lenet", "resnet", "vgg", "inception"})
    for (const char* opt : {"sgd", "adam"})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        ModelGraph m = build_model_graph(model, Stage::train, 64, {.name = opt, .lr = 0.01}, 3);
        Graph g = apply_precision(eliminate_dead_code(*m.graph), p);
        g = eliminate_dead_code(fuse(simplify_for_fusion(g)));
        for (int streams : {2, 4})
          for (bool h : {false, true})
            for (const char* lag : {"", "0"}) {
              const std::string label = std::string(model) + " " + opt + " " + precision_name(p) +
                                        (h ? " merged" : " unmerged") + " lag '" + lag +
                                        "' streams " + std::to_string(streams);
              setenv("KILN_SIDE_REUSE_LAG", lag, 1);
              races +=
                  unordered_conflicts(g, lower_for_device(g, streams, no_dump, h), label.c_str());
              races +=
                  unordered_conflicts(g, lower_for_device(g, streams, no_dump, h, some_scratch(g)),
                                      (label + " scratch").c_str());
              unsetenv("KILN_SIDE_REUSE_LAG");
            }
      }
  CHECK(races == 0);
}

TEST_CASE(
    "the memory plan shares bytes across streams: a value a side stream reads is not kept "
    "to the end, and the launch that reuses its bytes waits for that reader") {
  ModelGraph m = build_model_graph("vgg", Stage::train, 64, {.name = "sgd", .lr = 0.01}, 3);
  const Graph g = eliminate_dead_code(fuse(simplify_for_fusion(eliminate_dead_code(*m.graph))));
  setenv("KILN_SIDE_REUSE_LAG", "1000000", 1);  // side-stream values live to the end
  const Lowering kept = lower_for_device(g, 2, no_dump);
  unsetenv("KILN_SIDE_REUSE_LAG");
  const Lowering shared = lower_for_device(g, 2, no_dump);
  CHECK(shared.plan.arena_bytes < kept.plan.arena_bytes);
  // Some launch of stream 0 waits for a side stream because of reuse alone.
  int reuse_waits = 0;
  for (std::size_t id = 0; id < g.nodes().size(); ++id)
    for (std::int32_t user : shared.plan.reuse_waits[id]) {
      CHECK(shared.stream_of[static_cast<std::size_t>(user)] != shared.stream_of[id]);
      reuse_waits += 1;
    }
  CHECK(reuse_waits > 0);
  // No reuse wait is for a launch the writer depends on anyway (that order is implied), and
  // none is for a launch queued after it.
  for (std::size_t id = 0; id < g.nodes().size(); ++id)
    for (std::int32_t user : shared.plan.reuse_waits[id]) {
      CHECK(static_cast<std::size_t>(user) < id);
      std::vector<std::int32_t> stack{static_cast<std::int32_t>(id)};
      std::vector<char> seen(g.nodes().size(), 0);
      bool ancestor = false;
      while (!stack.empty() && !ancestor) {
        const std::int32_t at = stack.back();
        stack.pop_back();
        for (const ValueRef& in : g.node(at).inputs) {
          ancestor = ancestor || in.node == user;
          if (!seen[static_cast<std::size_t>(in.node)]) {
            seen[static_cast<std::size_t>(in.node)] = 1;
            stack.push_back(in.node);
          }
        }
      }
      CHECK_FALSE(ancestor);
    }
}

}  // namespace kiln

namespace kiln {
namespace {

// A data-parallel step (collective group 0, this process: the graph has every all-reduce a
// job of N ranks has) with synchronised batch norm and small gradient buckets.
Graph data_parallel_step(const char* model) {
  ModelGraph m = build_model_graph(
      model, Stage::train, 16, {.name = "sgd", .lr = 0.01}, 3,
      {.data_parallel_group = 0, .bucket_bytes = std::size_t{64} << 10, .sync_batch_norm = true});
  return eliminate_dead_code(fuse(simplify_for_fusion(eliminate_dead_code(*m.graph))));
}

bool is_collective(const Node& n) { return n.op->id == OpId::all_reduce_mean; }

// A gradient bucket: a collective of some parameter's gradient (an input of a variable's shape)
// that is not the running statistics' (assigned to their buffers); batch norm's table of the
// ranks' statistics, [W, 2C], has no parameter's shape.
bool is_gradient_bucket(const Graph& g, std::int32_t id) {
  const Node& n = g.node(id);
  if (!is_collective(n)) return false;
  for (const auto& [var, ref] : g.assignments())
    if (ref.node == id) return false;
  for (const ValueRef& in : n.inputs)
    for (const Node& v : g.nodes())
      if (v.op->id == OpId::variable && v.outputs[0].shape == g.type(in).shape) return true;
  return false;
}

int convolution_gradients_after_first_bucket(const Graph& g) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::int32_t first = count;
  for (std::int32_t id = 0; id < count && first == count; ++id)
    if (is_gradient_bucket(g, id)) first = id;
  int after = 0;
  for (std::int32_t id = first + 1; id < count; ++id) {
    const OpId op = g.node(id).op->id;
    after += op == OpId::conv2d_grad_input || op == OpId::conv2d_grad_weight;
  }
  return after;
}

}  // namespace

TEST_CASE(
    "hoist_collectives: each all_reduce_mean follows its last input at once, the other nodes keep "
    "their order, and the launch lists stay free of races") {
  for (const char* model : {"resnet", "vgg"}) {
    CAPTURE(model);
    const Graph g = data_parallel_step(model);
    const Graph h = hoist_collectives(g);
    verify(h);
    REQUIRE(h.nodes().size() == g.nodes().size());
    std::vector<std::string> before, after;  // the non-collective nodes' labels, in order
    for (const Node& n : g.nodes())
      if (!is_collective(n)) before.push_back(n.body ? n.body->summary() : n.op->name);
    int collectives = 0, moved = 0;
    for (std::size_t id = 0; id < h.nodes().size(); ++id) {
      const Node& n = h.nodes()[id];
      if (!is_collective(n)) {
        after.push_back(n.body ? n.body->summary() : n.op->name);
        continue;
      }
      ++collectives;
      std::int32_t last = -1;
      for (const ValueRef& in : n.inputs) last = std::max(last, in.node);
      // Only collectives stand between it and its last input.
      for (auto k = static_cast<std::size_t>(last) + 1; k < id; ++k)
        CHECK(is_collective(h.nodes()[k]));
      moved += id != static_cast<std::size_t>(last) + 1;
    }
    CHECK(before == after);
    CHECK(collectives > 10);  // batch norms' statistics and gradients, buckets, running statistics
    CHECK(moved < collectives);
    CHECK(h.outputs().size() == g.outputs().size());
    CHECK(h.assignments().size() == g.assignments().size());
    // The first gradient bucket came after every convolution gradient; hoisted, it runs while
    // the backward's convolutions still come.
    CHECK(convolution_gradients_after_first_bucket(g) == 0);
    CHECK(convolution_gradients_after_first_bucket(h) > 0);
    int races = 0;
    for (int streams : {2, 4})
      for (bool merged : {false, true}) {
        const std::string label = std::string(model) + " hoisted, streams " +
                                  std::to_string(streams) + (merged ? " merged" : "");
        races +=
            unordered_conflicts(h, lower_for_device(h, streams, no_dump, merged), label.c_str());
        races +=
            unordered_conflicts(h, lower_for_device(h, streams, no_dump, merged, some_scratch(h)),
                                (label + " scratch").c_str());
      }
    CHECK(races == 0);
  }
}

TEST_CASE("hoist_collectives: the hoisted step computes the same bits") {
  // Group 0's all-reduces are identities, so both orders must give every output bit for bit.
  Graph g;
  Philox rng(9);
  nn::Linear fc1(6, 8, rng, false), fc2(8, 3, rng);
  nn::BatchNorm1d bn(8);
  nn::sync_batch_norm(bn, 0);
  const Value x = g.input("x", {5, 6});
  const Value loss = cross_entropy(fc2(tanh(bn(fc1(x)))), g.input("y", {5}, DType::i64));
  std::vector<Value> wrt;
  for (const VariablePtr& p : {fc1.weight(), fc2.weight(), bn.weight(), bn.bias()})
    wrt.push_back(g.variable(p));
  const std::vector<Value> grads = average_over_ranks(grad(loss, wrt), 0, 64);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output("g" + std::to_string(i), grads[i]);
  g.output("loss", loss);
  const std::vector<Feed> feeds = {{"x", test::random_tensor({5, 6}, DType::f32, 4, -2, 2)},
                                   {"y", Tensor::from_vector<std::int64_t>({5}, {0, 2, 1, 1, 0})}};
  const Outputs plain = test::run_once(g, feeds),
                hoisted = test::run_once(hoist_collectives(g), feeds);
  for (const auto& [name, t] : plain) {
    CAPTURE(name);
    for (std::int64_t i = 0; i < t.numel(); ++i) CHECK(hoisted.at(name).at(i) == t.at(i));
  }
}

}  // namespace kiln
