// Graph invariants: topological order (hence acyclic), one producer per value (a value is
// (node, index) and each node is stored once), types that match each op's rule.
#include "graph/passes/verify.h"

#include <set>

#include "graph/op.h"

namespace kiln {
namespace {

void verify_ref(const Graph& g, ValueRef ref, std::int32_t before, const std::string& where) {
  KILN_ASSERT(ref.node >= 0 && ref.node < before, "{}: refers to %{} which is not an earlier node",
              where, ref.node);
  const Node& n = g.node(ref.node);
  KILN_ASSERT(ref.index >= 0 && static_cast<std::size_t>(ref.index) < n.outputs.size(),
              "{}: %{} has no output {}", where, ref.node, ref.index);
}

void verify_node(const Graph& g, std::int32_t id) {
  const Node& n = g.node(id);
  const std::string where = fmt::format("verify: %{} ({})", id, n.op ? n.op->name : "no op");
  KILN_ASSERT(n.op != nullptr, "{}: node has no op", where);
  KILN_ASSERT(!n.outputs.empty(), "{}: node has no outputs", where);
  if (n.op->kind == OpKind::source) {
    KILN_ASSERT(n.inputs.empty(), "{}: a source has inputs", where);
    if (n.op->id == OpId::variable)
      KILN_ASSERT(n.variable != nullptr, "{}: variable node without a variable", where);
    return;
  }
  KILN_ASSERT(n.op->arity < 0 || static_cast<std::size_t>(n.op->arity) == n.inputs.size(),
              "{}: {} inputs, arity {}", where, n.inputs.size(), n.op->arity);
  for (const std::string& attr : n.op->attrs)
    KILN_ASSERT(n.attrs.has(attr), "{}: attribute '{}' missing", where, attr);
  std::vector<TensorType> in_types;
  for (const ValueRef& in : n.inputs) {
    verify_ref(g, in, id, where);
    in_types.push_back(g.type(in));
  }
  KILN_ASSERT((n.op->kind == OpKind::fused) == (n.body != nullptr),
              "{}: a fused op needs a body, others none", where);
  const std::vector<TensorType> expected =
      n.body ? n.body->infer(in_types) : n.op->infer(in_types, n.attrs);
  KILN_ASSERT(expected == n.outputs, "{}: recorded output type {} but the type rule gives {}",
              where, n.outputs[0].str(), expected.empty() ? "nothing" : expected[0].str());
}

}  // namespace

void verify(const Graph& g) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  for (std::int32_t id = 0; id < count; ++id) verify_node(g, id);
  for (const auto& [name, ref] : g.outputs()) verify_ref(g, ref, count, "verify: output " + name);
  std::set<const Variable*> assigned;
  for (const auto& [var, ref] : g.assignments()) {
    verify_ref(g, ref, count, "verify: assignment of " + var->name);
    KILN_ASSERT(assigned.insert(var.get()).second, "verify: variable {} is assigned twice",
                var->name);
    const TensorType& t = g.type(ref);
    KILN_ASSERT(t.shape == var->value.shape() && t.dtype == var->value.dtype(),
                "verify: variable {} is {}{} but is assigned {}", var->name,
                dtype_name(var->value.dtype()), var->value.shape().str(), t.str());
  }
}

}  // namespace kiln
