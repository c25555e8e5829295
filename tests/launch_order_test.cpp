// The launch list as a happens-before graph (stream order, the events, the join before the
// update copies): every two launches that touch the same memory (an arena slot, a variable),
// one of them writing it, are ordered, with and without horizontal launches.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "backends/lowering.h"
#include "fusion/fuse.h"
#include "graph/op.h"
#include "graph/passes/dead_code.h"
#include "train/step_graph.h"

namespace kiln {
namespace {

void no_dump(const char*, const Graph&, const Lowering&) {}

// The memory a value lives in: its variable (read, or written in place), its arena slot, or
// none (an input or a constant, never written).
std::string memory_of(const Graph& g, const Lowering& l, ValueRef ref) {
  ref = alias_root(g, ref);
  const Node& n = g.node(ref.node);
  if (n.op->id == OpId::variable) return "var:" + n.variable->name;
  if (n.op->kind == OpKind::source) return "";
  for (std::size_t k = 0; k < l.in_place.size(); ++k)
    if (l.in_place[k].in_place && g.assignments()[k].second == ref)
      return "var:" + g.assignments()[k].first->name;
  return "slot:" + std::to_string(l.plan.slot[ref.node][ref.index]);
}

int unordered_conflicts(const Graph& g, const Lowering& l, const char* label) {
  const auto& steps = l.launches.steps;
  const std::size_t n = steps.size();
  std::vector<std::set<std::string>> reads(n), writes(n);
  for (std::size_t k = 0; k < n; ++k) {
    const LaunchStep& s = steps[k];
    std::vector<std::int32_t> nodes =
        s.merged.empty() ? std::vector<std::int32_t>{s.node} : s.merged;
    if (s.node < 0) {
      const auto& [var, ref] = g.assignments()[s.assignment];
      reads[k].insert(memory_of(g, l, ref));
      writes[k].insert("var:" + var->name);
      continue;
    }
    for (std::int32_t id : nodes) {
      for (const ValueRef& in : g.node(id).inputs) {
        const std::string memory = memory_of(g, l, in);
        if (!memory.empty()) reads[k].insert(memory);
      }
      for (std::size_t i = 0; i < g.node(id).outputs.size(); ++i)
        writes[k].insert(memory_of(g, l, {id, static_cast<std::int32_t>(i)}));
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
  int races = 0;
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = a + 1; b < n; ++b) {
      std::string what;
      for (auto& x : writes[a])
        if (reads[b].count(x) || writes[b].count(x)) what = x;
      for (auto& x : reads[a])
        if (writes[b].count(x)) what = x;
      if (!what.empty() && !ordered[a][b]) {
        ++races;
        std::printf("%s: race on %s between #%zu %s (stream %d) and #%zu %s (stream %d)\n", label,
                    what.c_str(), a, steps[a].label.c_str(), steps[a].stream, b,
                    steps[b].label.c_str(), steps[b].stream);
      }
    }
  return races;
}

}  // namespace

TEST_CASE(
    "launch lists order every two launches that touch the same memory, one writing it (LeNet, "
    "ResNet, VGG, Inception, SGD and Adam, fp32 and bf16, with and without horizontal launches)") {
  int races = 0;
  for (const char* model : {"lenet", "resnet", "vgg", "inception"})
    for (const char* opt : {"sgd", "adam"})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        ModelGraph m = build_model_graph(model, Stage::train, 64, {.name = opt, .lr = 0.01}, 3);
        Graph g = apply_precision(eliminate_dead_code(*m.graph), p);
        g = eliminate_dead_code(fuse(simplify_for_fusion(g)));
        for (bool h : {false, true}) {
          std::string label = std::string(model) + " " + opt + " " + precision_name(p) +
                              (h ? " merged" : " unmerged");
          races += unordered_conflicts(g, lower_for_device(g, 2, no_dump, h), label.c_str());
        }
      }
  CHECK(races == 0);
}

}  // namespace kiln
