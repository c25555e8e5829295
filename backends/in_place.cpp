// Which optimizer updates write straight into their variable: the value's readers, its
// ancestors and descendants in node order.
#include "backends/in_place.h"

#include <map>

#include "backends/plan.h"
#include "fusion/fused_group.h"
#include "graph/op.h"

namespace kiln {
namespace {

// Nodes reachable from `from` by following inputs (forward = false) or consumers (true).
std::vector<char> reachable(const Graph& g, std::int32_t from, bool forward) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::vector<char> seen(static_cast<std::size_t>(count), 0);
  if (!forward) {
    std::vector<std::int32_t> stack = {from};
    while (!stack.empty()) {
      const std::int32_t n = stack.back();
      stack.pop_back();
      for (const ValueRef& in : g.node(n).inputs)
        if (!seen[static_cast<std::size_t>(in.node)]) {
          seen[static_cast<std::size_t>(in.node)] = 1;
          stack.push_back(in.node);
        }
    }
    return seen;
  }
  seen[static_cast<std::size_t>(from)] = 1;  // nodes are in topological order: one sweep
  for (std::int32_t id = from + 1; id < count; ++id)
    for (const ValueRef& in : g.node(id).inputs)
      if (seen[static_cast<std::size_t>(in.node)]) seen[static_cast<std::size_t>(id)] = 1;
  seen[static_cast<std::size_t>(from)] = 0;
  return seen;
}

InPlaceUpdate in_place_update(const Graph& g, const VariablePtr& var, ValueRef ref,
                              std::map<ValueRef, int>& readers) {
  InPlaceUpdate u;
  const Node& producer = g.node(ref.node);
  // Not a reduction or a staged group's row output, which a row's elements all read before.
  const auto* group = producer.body != nullptr && producer.op->kind == OpKind::fused
                          ? dynamic_cast<const FusedGroup*>(producer.body.get())
                          : nullptr;
  const bool full_output = group != nullptr &&
                           static_cast<std::size_t>(ref.index) < group->outputs.size() &&
                           group->shape == var->value.shape() &&
                           !group->output_channels_last(static_cast<std::size_t>(ref.index));
  if (!full_output || readers[ref] != 0) return u;
  for (const auto& [name, out] : g.outputs())
    if (g.node(alias_root(g, out).node).variable == var) return u;
  const std::vector<char> ancestor = reachable(g, ref.node, false),
                          descendant = reachable(g, ref.node, true);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    if (id == ref.node || ancestor[static_cast<std::size_t>(id)]) continue;
    bool reads = false;
    for (const ValueRef& in : g.node(id).inputs)
      reads = reads || g.node(alias_root(g, in).node).variable == var;
    if (!reads || g.node(id).op->alias) continue;  // a view is read by its own readers
    if (id > ref.node || descendant[static_cast<std::size_t>(id)]) return u;
    u.after.push_back(id);
  }
  u.in_place = true;
  return u;
}

}  // namespace

std::vector<InPlaceUpdate> in_place_updates(const Graph& g) {
  std::map<ValueRef, int> readers;  // of each root value
  for (const Node& n : g.nodes())
    for (const ValueRef& in : n.inputs) ++readers[alias_root(g, in)];
  for (const auto& [name, ref] : g.outputs()) ++readers[alias_root(g, ref)];
  std::vector<InPlaceUpdate> result;
  for (const auto& [var, ref] : g.assignments())
    result.push_back(in_place_update(g, var, ref, readers));
  return result;
}

}  // namespace kiln
