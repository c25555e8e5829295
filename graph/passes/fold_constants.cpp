// Walk the nodes in order, evaluating all-constant small ops on the CPU as they come.
#include "graph/passes/fold_constants.h"

#include "graph/kernels/elementwise_cpu.h"
#include "graph/op.h"

namespace kiln {
namespace {

bool is_constant(const Node& n) {
  return n.op->id == OpId::fill || n.op->id == OpId::tensor_constant;
}

Tensor constant_value(const Node& n) {
  if (n.op->id == OpId::fill)
    return Tensor::full(n.outputs[0].shape, n.attrs.real("value"), n.outputs[0].dtype);
  return n.constant;
}

// The op evaluated on constant inputs, or an undefined tensor when it is not foldable.
Tensor evaluate(const Node& n, const std::vector<Tensor>& inputs) {
  if (n.outputs.size() != 1 || n.outputs[0].shape.numel() > kMaxFoldedElements ||
      !is_floating(n.outputs[0].dtype))
    return {};
  const TensorType& type = n.outputs[0];
  if (n.op->alias) return inputs[0].clone().reshape(type.shape);  // reshape, detach
  if (n.op->kind != OpKind::elementwise && n.op->kind != OpKind::layout &&
      n.op->kind != OpKind::reduction)
    return {};
  Tensor out = Tensor::empty(type.shape, type.dtype);
  // The loops compute in the output's dtype: a node whose floating inputs have another one (a
  // cast) runs its CPU kernel, which converts. Other 16-bit nodes are left unfolded (the CPU
  // kernels compute in f32 or f64).
  bool converts = false;
  for (const Tensor& t : inputs)
    converts = converts || (is_floating(t.dtype()) && t.dtype() != type.dtype);
  if (!converts && is_low_precision(type.dtype)) return {};
  if (!converts && (n.op->loops.f32 != nullptr || n.op->loops.f64 != nullptr)) {
    kernels::run_elementwise(n.op->loops, inputs, out);
    return out;
  }
  if (!n.op->cpu) return {};
  std::vector<Tensor> outputs = {out};
  n.op->cpu(KernelCall{n, inputs, outputs});
  return outputs[0];
}

bool all_equal(const Tensor& t) {
  for (std::int64_t i = 1; i < t.numel(); ++i)
    if (t.at(i) != t.at(0)) return false;  // -0.0 == 0.0 is fine: a fill keeps the first
  return true;
}

}  // namespace

Graph fold_constants(const Graph& g) {
  Graph out;
  std::vector<std::int32_t> new_id(g.nodes().size(), -1);
  for (std::size_t id = 0; id < g.nodes().size(); ++id) {
    Node n = g.nodes()[id];
    for (ValueRef& in : n.inputs) in.node = new_id[static_cast<std::size_t>(in.node)];
    bool foldable = !n.inputs.empty() && n.op->kind != OpKind::source && !n.body;
    std::vector<Tensor> inputs;
    for (const ValueRef& in : n.inputs) {
      const Node& producer = out.node(in.node);
      foldable = foldable && is_constant(producer);
      if (foldable) inputs.push_back(constant_value(producer));
    }
    const Tensor folded = foldable ? evaluate(n, inputs) : Tensor();
    if (!folded.defined()) {
      new_id[id] = out.add_node(std::move(n)).node;
    } else if (all_equal(folded) && folded.numel() > 0) {
      new_id[id] = out.fill(folded.at(0), folded.shape(), folded.dtype()).ref().node;
    } else {
      new_id[id] = out.constant(folded).ref().node;
    }
  }
  copy_outputs_and_assignments(g, new_id, out);
  return out;
}

}  // namespace kiln
