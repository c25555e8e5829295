// The computation graph: nodes in the order they were recorded (this order is the
// autograd tape and always a topological order), values as (node, output) pairs,
// persistent variables, named outputs and the variable updates of a training step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/attrs.h"
#include "graph/op_id.h"

namespace kiln {

struct OpDef;
class Graph;
class NodeBody;

struct TensorType {
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[64, 10]"
};

// Persistent state (a parameter or optimizer state). Shared by every graph and program
// that uses it, so a GAN's two programs, or a train and an eval program, see one copy.
struct Variable {
  std::string name;
  Tensor value;
  bool trainable = true;
  // A low-precision copy that a compiled step writes with each update (passes/weight_copies.h):
  // the variable it rounds. Programs refresh the copy when `copy_of` was written from outside.
  std::shared_ptr<Variable> copy_of;
};
using VariablePtr = std::shared_ptr<Variable>;
VariablePtr make_variable(std::string name, Tensor value, bool trainable = true);

// A value inside one graph: output `index` of node `node`.
struct ValueRef {
  std::int32_t node = -1;
  std::int32_t index = 0;
  bool operator==(const ValueRef&) const = default;
  auto operator<=>(const ValueRef&) const = default;
};

// A handle used by the builder API: a value and the graph it belongs to.
class Value {
 public:
  Value() = default;
  Value(Graph* graph, ValueRef ref) : graph_(graph), ref_(ref) {}

  bool valid() const { return graph_ != nullptr; }
  Graph& graph() const;
  ValueRef ref() const { return ref_; }
  const TensorType& type() const;
  const Shape& shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  std::string str() const;  // "%12 conv2d f32[64, 32, 28, 28]"

 private:
  Graph* graph_ = nullptr;
  ValueRef ref_;
};

struct Node {
  const OpDef* op = nullptr;
  std::vector<ValueRef> inputs;
  Attrs attrs;
  std::vector<TensorType> outputs;
  std::string name;                      // set for inputs and variables, optional otherwise
  VariablePtr variable;                  // op "variable"
  Tensor constant;                       // op "tensor_constant"
  std::shared_ptr<const NodeBody> body;  // op "fused": the group's code
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph& other) { *this = other; }
  Graph& operator=(const Graph& other);
  // No move operations: Values hold a Graph*, so a "moved" graph is copied and the
  // original stays valid for the Values that point to it.

  // Sources.
  Value input(const std::string& name, const Shape& shape, DType dtype = DType::f32);
  Value variable(const VariablePtr& var);  // one node per variable per graph
  Value fill(double value, const Shape& shape = {}, DType dtype = DType::f32);
  Value constant(const Tensor& tensor);

  // Records op `op` on `inputs`; infers and checks output types (kiln::Error on misuse).
  std::vector<Value> apply(OpId op, const std::vector<Value>& inputs, Attrs attrs = {});
  Value apply1(OpId op, const std::vector<Value>& inputs, Attrs attrs = {});
  // Appends a ready node (passes use this); its types must already be set.
  ValueRef add_node(Node node);

  // Step results: named outputs, and variables overwritten with new values after the step.
  void output(const std::string& name, Value value);
  void assign(const VariablePtr& var, Value new_value);
  // State a layer updates each time it is applied (batch norm's running statistics, a
  // dropout step counter), for a layer applied more than once in one step (a GAN's
  // discriminator on real and fake batches): latest() is the value `var` holds after the
  // updates recorded so far (its pending assignment, else the variable), and
  // assign_latest() sets or replaces that pending assignment.
  Value latest(const VariablePtr& var);
  void assign_latest(const VariablePtr& var, Value new_value);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(std::int32_t id) const { return nodes_.at(static_cast<std::size_t>(id)); }
  const TensorType& type(ValueRef ref) const;
  // The floating-point operations of one run of node `id` (OpDef::flops; 0 where the op does
  // not count them, or for a fused group).
  double node_flops(std::int32_t id) const;
  // The bytes of node `id`'s distinct inputs and of its outputs: what one run must read and
  // write at the least (a fused group's values outside it), against which a trace shows a
  // launch's bandwidth; 0 for sources and views (aliases).
  double node_bytes(std::int32_t id) const;
  Value value(ValueRef ref) { return Value(this, ref); }
  const std::vector<std::pair<std::string, ValueRef>>& outputs() const { return outputs_; }
  const std::vector<std::pair<VariablePtr, ValueRef>>& assignments() const { return assignments_; }
  ValueRef output_ref(const std::string& name) const;
  std::string str() const;

 private:
  std::vector<Node> nodes_;
  std::vector<std::pair<std::string, ValueRef>> outputs_;
  std::vector<std::pair<VariablePtr, ValueRef>> assignments_;
  std::map<const Variable*, std::int32_t> variable_nodes_;
};

// The value whose buffer `ref` lives in: itself unless made by an alias op (reshape, detach),
// whose output is its input's elements in the same order.
ValueRef alias_root(const Graph& g, ValueRef ref);

// A pass that copies `from`'s nodes into `to` (node i of `from` became node new_id[i]) ends
// with this: `from`'s outputs and assignments, renumbered, in their order.
void copy_outputs_and_assignments(const Graph& from, const std::vector<std::int32_t>& new_id,
                                  Graph& to);

}  // namespace kiln
