// Copy the nodes in order; after each, every pending collective whose inputs are all copied.
#include "graph/passes/hoist_collectives.h"

#include "graph/op.h"

namespace kiln {

Graph hoist_collectives(const Graph& g) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::vector<std::int32_t> new_id(static_cast<std::size_t>(count), -1);
  // Each collective waits on its last input (the latest node it reads).
  std::vector<std::vector<std::int32_t>> after(static_cast<std::size_t>(count));
  std::vector<bool> is_collective(static_cast<std::size_t>(count), false);
  for (std::int32_t id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    if (n.op->id != OpId::all_reduce_mean || n.inputs.empty()) continue;
    std::int32_t last = 0;
    for (const ValueRef& in : n.inputs) last = std::max(last, in.node);
    after[static_cast<std::size_t>(last)].push_back(id);
    is_collective[static_cast<std::size_t>(id)] = true;
  }
  Graph out;
  auto copy = [&](std::int32_t id, auto& self) -> void {
    Node n = g.node(id);
    for (ValueRef& in : n.inputs) in.node = new_id[static_cast<std::size_t>(in.node)];
    new_id[static_cast<std::size_t>(id)] = out.add_node(std::move(n)).node;
    for (std::int32_t waiting : after[static_cast<std::size_t>(id)]) self(waiting, self);
  };
  for (std::int32_t id = 0; id < count; ++id)
    if (!is_collective[static_cast<std::size_t>(id)]) copy(id, copy);
  copy_outputs_and_assignments(g, new_id, out);
  return out;
}

}  // namespace kiln
