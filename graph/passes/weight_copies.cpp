// One walk over the nodes: casts of assigned variables become reads of their copies; then each
// copy is assigned the cast of its variable's new value.
#include "graph/passes/weight_copies.h"

#include <map>
#include <string>
#include <utility>

#include "graph/op.h"
#include "graph/op_table.h"

namespace kiln {
namespace {

// A cast to bf16/f16 of a variable the graph assigns: the variable's new value, else null.
const Node* assigned_variable_cast(const Graph& g, const Node& n,
                                   const std::map<const Variable*, ValueRef>& assigned) {
  if (n.op->id != OpId::cast || !is_low_precision(n.outputs[0].dtype)) return nullptr;
  const Node& source = g.node(n.inputs[0].node);
  if (source.op->id != OpId::variable || !assigned.count(source.variable.get())) return nullptr;
  return &source;
}

Node cast_node(ValueRef in, const TensorType& to) {
  Node n{.op = &op_def(OpId::cast), .inputs = {in}};
  n.attrs = Attrs{{"dtype", std::string(dtype_name(to.dtype))}};
  n.outputs = {to};
  return n;
}

}  // namespace

Graph add_weight_copies(const Graph& g) {
  std::map<const Variable*, ValueRef> assigned;  // variable -> its new value (old graph)
  for (const auto& [var, ref] : g.assignments()) assigned[var.get()] = ref;
  Graph out;
  std::vector<std::vector<ValueRef>> refs(g.nodes().size());
  std::map<const Variable*, std::pair<VariablePtr, TensorType>> copies;  // in order of first use
  std::vector<const Variable*> order;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    const Node& n = g.node(id);
    if (const Node* var = assigned_variable_cast(g, n, assigned)) {
      auto it = copies.find(var->variable.get());
      if (it == copies.end()) {
        const TensorType& t = n.outputs[0];
        VariablePtr copy =
            make_variable(var->variable->name + "@" + std::string(dtype_name(t.dtype)),
                          Tensor::zeros(t.shape, t.dtype), false);
        copy->copy_of = var->variable;
        it = copies.emplace(var->variable.get(), std::make_pair(copy, t)).first;
        order.push_back(var->variable.get());
      }
      refs[static_cast<std::size_t>(id)] = {out.variable(it->second.first).ref()};
      continue;
    }
    Node copy = n;
    for (ValueRef& in : copy.inputs)
      in = refs[static_cast<std::size_t>(in.node)][static_cast<std::size_t>(in.index)];
    const ValueRef first = out.add_node(std::move(copy));
    for (std::int32_t k = 0; k < static_cast<std::int32_t>(n.outputs.size()); ++k)
      refs[static_cast<std::size_t>(id)].push_back({first.node, k});
  }
  auto mapped = [&](ValueRef r) {
    return refs[static_cast<std::size_t>(r.node)][static_cast<std::size_t>(r.index)];
  };
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(mapped(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(mapped(ref)));
  for (const Variable* source : order) {
    const auto& [copy, type] = copies.at(source);
    out.assign(copy, out.value(out.add_node(cast_node(mapped(assigned.at(source)), type))));
  }
  return out;
}

}  // namespace kiln
