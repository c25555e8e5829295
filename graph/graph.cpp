// Graph construction: sources, op application with type inference, outputs and updates.
#include "graph/graph.h"

#include <fmt/format.h>

#include <set>
#include <utility>

#include "graph/op_table.h"

namespace kiln {

std::string TensorType::str() const { return fmt::format("{}{}", dtype_name(dtype), shape.str()); }

VariablePtr make_variable(std::string name, Tensor value, bool trainable) {
  return std::make_shared<Variable>(Variable{std::move(name), std::move(value), trainable});
}

Graph& Value::graph() const {
  KILN_CHECK(graph_ != nullptr, "use of an empty Value (not produced by any graph)");
  return *graph_;
}

const TensorType& Value::type() const { return graph().type(ref_); }

std::string Value::str() const {
  const Node& n = graph().node(ref_.node);
  return fmt::format("%{}{} {} {}", ref_.node, ref_.index ? fmt::format(".{}", ref_.index) : "",
                     n.op->name, type().str());
}

Graph& Graph::operator=(const Graph& other) {
  nodes_ = other.nodes_;
  outputs_ = other.outputs_;
  assignments_ = other.assignments_;
  variable_nodes_ = other.variable_nodes_;
  return *this;
}

Value Graph::input(const std::string& name, const Shape& shape, DType dtype) {
  for (const Node& n : nodes_)
    KILN_CHECK(n.op->id != OpId::input || n.name != name, "graph already has an input named '{}'",
               name);
  Node n{.op = &op_def(OpId::input), .outputs = {{shape, dtype}}, .name = name};
  return value(add_node(std::move(n)));
}

Value Graph::variable(const VariablePtr& var) {
  KILN_CHECK(var && var->value.defined(), "variable is empty");
  auto it = variable_nodes_.find(var.get());
  if (it != variable_nodes_.end()) return value({it->second, 0});
  Node n{.op = &op_def(OpId::variable),
         .outputs = {{var->value.shape(), var->value.dtype()}},
         .name = var->name};
  n.variable = var;
  return value(add_node(std::move(n)));
}

Value Graph::fill(double fill_value, const Shape& shape, DType dtype) {
  Node n{.op = &op_def(OpId::fill), .outputs = {{shape, dtype}}};
  n.attrs.set("value", fill_value);
  return value(add_node(std::move(n)));
}

Value Graph::constant(const Tensor& tensor) {
  KILN_CHECK(tensor.defined(), "constant: tensor is empty");
  Node n{.op = &op_def(OpId::tensor_constant), .outputs = {{tensor.shape(), tensor.dtype()}}};
  n.constant = tensor.clone();
  return value(add_node(std::move(n)));
}

std::vector<Value> Graph::apply(OpId id, const std::vector<Value>& inputs, Attrs attrs) {
  const OpDef& op = op_def(id);
  KILN_CHECK(op.arity < 0 || static_cast<std::size_t>(op.arity) == inputs.size(),
             "{}: takes {} inputs, got {}", op.name, op.arity, inputs.size());
  Node n{.op = &op, .attrs = std::move(attrs)};
  std::vector<TensorType> in_types;
  for (const Value& v : inputs) {
    KILN_CHECK(&v.graph() == this, "{}: an input belongs to another graph", op.name);
    n.inputs.push_back(v.ref());
    in_types.push_back(v.type());
  }
  for (const std::string& attr : op.attrs)
    KILN_ASSERT(n.attrs.has(attr), "{}: attribute '{}' not set", op.name, attr);
  n.outputs = op.infer(in_types, n.attrs);
  const ValueRef first = add_node(std::move(n));
  std::vector<Value> out;
  for (std::size_t i = 0; i < nodes_.back().outputs.size(); ++i)
    out.push_back(value({first.node, static_cast<std::int32_t>(i)}));
  return out;
}

Value Graph::apply1(OpId id, const std::vector<Value>& inputs, Attrs attrs) {
  std::vector<Value> out = apply(id, inputs, std::move(attrs));
  KILN_ASSERT(out.size() == 1, "{} has {} outputs", op_id_name(id), out.size());
  return out[0];
}

ValueRef Graph::add_node(Node node) {
  KILN_ASSERT(node.op != nullptr, "node without op");
  for (const ValueRef& in : node.inputs)
    KILN_ASSERT(in.node >= 0 && static_cast<std::size_t>(in.node) < nodes_.size(),
                "input %{} does not exist yet", in.node);
  const auto id = static_cast<std::int32_t>(nodes_.size());
  if (node.variable) variable_nodes_[node.variable.get()] = id;
  nodes_.push_back(std::move(node));
  return {id, 0};
}

void Graph::output(const std::string& name, Value v) {
  KILN_CHECK(&v.graph() == this, "output '{}' belongs to another graph", name);
  for (const auto& [existing, ref] : outputs_)
    KILN_CHECK(existing != name, "output '{}' is set twice", name);
  outputs_.emplace_back(name, v.ref());
}

void Graph::assign(const VariablePtr& var, Value new_value) {
  KILN_CHECK(&new_value.graph() == this, "update of '{}' belongs to another graph", var->name);
  KILN_CHECK(new_value.shape() == var->value.shape() && new_value.dtype() == var->value.dtype(),
             "update of '{}': new value is {} but the variable is {}{}", var->name,
             new_value.type().str(), dtype_name(var->value.dtype()), var->value.shape().str());
  for (const auto& [existing, ref] : assignments_)
    KILN_CHECK(existing != var, "variable '{}' is updated twice in one step", var->name);
  assignments_.emplace_back(var, new_value.ref());
}

Value Graph::latest(const VariablePtr& var) {
  for (const auto& [existing, ref] : assignments_)
    if (existing == var) return value(ref);
  return variable(var);
}

void Graph::assign_latest(const VariablePtr& var, Value new_value) {
  for (auto& [existing, ref] : assignments_) {
    if (existing != var) continue;
    KILN_CHECK(&new_value.graph() == this, "update of '{}' belongs to another graph", var->name);
    KILN_CHECK(new_value.type() == type(ref),
               "update of '{}': new value is {} but the variable is {}", var->name,
               new_value.type().str(), type(ref).str());
    ref = new_value.ref();
    return;
  }
  assign(var, new_value);
}

const TensorType& Graph::type(ValueRef ref) const {
  const Node& n = node(ref.node);
  KILN_ASSERT(ref.index >= 0 && static_cast<std::size_t>(ref.index) < n.outputs.size(),
              "%{} has no output {}", ref.node, ref.index);
  return n.outputs[static_cast<std::size_t>(ref.index)];
}

double Graph::node_flops(std::int32_t id) const {
  const Node& n = node(id);
  if (!n.op || !n.op->flops) return 0.0;
  std::vector<TensorType> in;
  for (const ValueRef& r : n.inputs) in.push_back(type(r));
  return n.op->flops(n, in);
}

double Graph::node_bytes(std::int32_t id) const {
  const Node& n = node(id);
  if (!n.op || n.op->kind == OpKind::source || n.op->alias) return 0.0;
  double bytes = 0;
  std::set<std::pair<std::int32_t, std::int32_t>> read;
  for (const ValueRef& r : n.inputs)
    if (read.insert({r.node, r.index}).second)
      bytes += static_cast<double>(type(r).shape.numel()) * dtype_size(type(r).dtype);
  for (const TensorType& t : n.outputs)
    bytes += static_cast<double>(t.shape.numel()) * dtype_size(t.dtype);
  return bytes;
}

ValueRef Graph::output_ref(const std::string& name) const {
  for (const auto& [existing, ref] : outputs_)
    if (existing == name) return ref;
  throw Error(fmt::format("graph has no output named '{}'", name));
}

ValueRef alias_root(const Graph& g, ValueRef ref) {
  while (g.node(ref.node).op->alias) ref = g.node(ref.node).inputs[0];
  return ref;
}

void copy_outputs_and_assignments(const Graph& from, const std::vector<std::int32_t>& new_id,
                                  Graph& to) {
  auto remap = [&](ValueRef ref) {
    return to.value({new_id[static_cast<std::size_t>(ref.node)], ref.index});
  };
  for (const auto& [name, ref] : from.outputs()) to.output(name, remap(ref));
  for (const auto& [var, ref] : from.assignments()) to.assign(var, remap(ref));
}

}  // namespace kiln
