// The launch list: node order, with an event wherever a value crosses streams; a horizontal
// launch where its last member is.
#include "backends/launch_list.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "backends/plan.h"
#include "core/error.h"
#include "graph/op.h"

namespace kiln {
namespace {

constexpr std::size_t kNone = SIZE_MAX;

struct Builder {
  const Graph& g;
  const std::vector<int>& stream_of;
  LaunchList list;
  std::vector<std::size_t> step_of;                             // node -> its launch
  std::map<std::int32_t, std::vector<std::int32_t>> run_after;  // in-place update -> readers
  const std::vector<std::vector<std::int32_t>>& reuse_waits;    // plan_memory's

  // `step` waits for `producer`'s launch when that ran on another stream.
  void wait_for(LaunchStep& step, std::int32_t producer) {
    const auto p = static_cast<std::size_t>(producer);
    if (g.node(producer).op->kind == OpKind::source || stream_of[p] == step.stream) return;
    KILN_CHECK(step_of[p] != kNone, "build_launch_list: %{} waits for %{}, which launches later",
               step.node, producer);
    int& event = list.steps[step_of[p]].record;  // one per launch, for all its members
    if (event < 0) event = list.events++;
    if (std::find(step.waits.begin(), step.waits.end(), event) == step.waits.end())
      step.waits.push_back(event);
  }

  // The waits of `node`'s launch added to `step`.
  void add_waits(LaunchStep& step, std::int32_t node) {
    for (const ValueRef& in : g.node(node).inputs) wait_for(step, alias_root(g, in).node);
    if (auto after = run_after.find(node); after != run_after.end())
      for (std::int32_t reader : after->second) wait_for(step, reader);  // old value read first
    if (!reuse_waits.empty())  // reused bytes: their earlier users on other streams first
      for (std::int32_t user : reuse_waits[static_cast<std::size_t>(node)]) wait_for(step, user);
  }

  void add(std::int32_t node) {
    const Node& n = g.node(node);
    LaunchStep step{.node = node,
                    .stream = stream_of[static_cast<std::size_t>(node)],
                    .label = n.body ? n.body->summary() : n.op->name};
    add_waits(step, node);
    step_of[static_cast<std::size_t>(node)] = list.steps.size();
    list.steps.push_back(std::move(step));
  }

  void add_horizontal(const HorizontalLaunch& h) {
    LaunchStep step{.node = h.nodes.back(),
                    .stream = stream_of[static_cast<std::size_t>(h.nodes.back())],
                    .label = fmt::format("horizontal x{}: {}", h.nodes.size(),
                                         g.node(h.nodes.back()).body->summary()),
                    .merged = h.nodes};
    for (std::int32_t member : h.nodes) {
      add_waits(step, member);
      step_of[static_cast<std::size_t>(member)] = list.steps.size();
    }
    list.steps.push_back(std::move(step));
  }
};

}  // namespace

LaunchList build_launch_list(const Graph& g, const std::vector<int>& stream_of,
                             const std::vector<InPlaceUpdate>& in_place,
                             const std::vector<HorizontalLaunch>& horizontal,
                             const std::vector<std::vector<std::int32_t>>& reuse_waits) {
  Builder b{g, stream_of, {}, std::vector<std::size_t>(g.nodes().size(), kNone), {}, reuse_waits};
  for (std::size_t k = 0; k < in_place.size(); ++k) {
    if (!in_place[k].in_place) continue;
    auto& after = b.run_after[g.assignments()[k].second.node];
    after.insert(after.end(), in_place[k].after.begin(), in_place[k].after.end());
  }
  std::map<std::int32_t, const HorizontalLaunch*> merged;  // member -> its launch
  for (const HorizontalLaunch& h : horizontal)
    for (std::int32_t member : h.nodes) merged[member] = &h;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    if (g.node(id).op->kind == OpKind::source || g.node(id).op->alias) continue;
    const auto h = merged.find(id);
    if (h == merged.end())
      b.add(id);
    else if (h->second->nodes.back() == id)  // the launch runs where its last member is
      b.add_horizontal(*h->second);
  }
  b.list.first_update = b.list.steps.size();
  for (std::size_t k = 0; k < g.assignments().size(); ++k)
    if (k >= in_place.size() || !in_place[k].in_place)
      b.list.steps.push_back({.assignment = static_cast<std::int32_t>(k),
                              .label = "update " + g.assignments()[k].first->name});
  return b.list;
}

}  // namespace kiln
