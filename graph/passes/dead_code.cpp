// Mark live nodes backwards from the roots, then copy them in order with renumbered refs.
#include "graph/passes/dead_code.h"

#include "graph/op.h"

namespace kiln {

std::vector<bool> live_nodes(const Graph& g) {
  const std::size_t count = g.nodes().size();
  std::vector<bool> live(count, false);
  for (const auto& [name, ref] : g.outputs()) live[static_cast<std::size_t>(ref.node)] = true;
  for (const auto& [var, ref] : g.assignments()) live[static_cast<std::size_t>(ref.node)] = true;
  for (std::size_t id = count; id-- > 0;) {
    const Node& n = g.nodes()[id];
    if (n.op->id == OpId::input) live[id] = true;
    if (!live[id]) continue;
    for (const ValueRef& in : n.inputs) live[static_cast<std::size_t>(in.node)] = true;
  }
  return live;
}

Graph eliminate_dead_code(const Graph& g) {
  const std::size_t count = g.nodes().size();
  const std::vector<bool> live = live_nodes(g);
  Graph out;
  std::vector<std::int32_t> new_id(count, -1);
  for (std::size_t id = 0; id < count; ++id) {
    if (!live[id]) continue;
    Node n = g.nodes()[id];
    for (ValueRef& in : n.inputs) in.node = new_id[static_cast<std::size_t>(in.node)];
    new_id[id] = out.add_node(std::move(n)).node;
  }
  copy_outputs_and_assignments(g, new_id, out);
  return out;
}

}  // namespace kiln
