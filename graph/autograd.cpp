// The backward walk: visit nodes from the loss down to the first node that any requested
// value depends on; each node's gradient function adds its input gradients.
#include "graph/autograd.h"

#include <map>

#include "graph/grad_sum.h"
#include "graph/op.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// Marks every node that depends on one of `wrt` (forward reachability).
std::vector<bool> depends_on(const Graph& g, const std::vector<Value>& wrt, std::int32_t last) {
  std::vector<bool> marked(static_cast<std::size_t>(last) + 1, false);
  for (const Value& v : wrt)
    if (v.ref().node <= last) marked[static_cast<std::size_t>(v.ref().node)] = true;
  for (std::int32_t id = 0; id <= last; ++id) {
    if (marked[static_cast<std::size_t>(id)]) continue;
    for (const ValueRef& in : g.node(id).inputs)
      if (marked[static_cast<std::size_t>(in.node)]) marked[static_cast<std::size_t>(id)] = true;
  }
  return marked;
}

// The gradient terms of each value, summed when the value's gradient is first read.
using Terms = std::map<ValueRef, std::vector<Value>>;

// The summed gradient of `ref` (invalid if it has none); the sum replaces the terms.
Value gradient_of(Terms& grads, ValueRef ref) {
  auto it = grads.find(ref);
  if (it == grads.end()) return Value();
  std::vector<Value>& terms = it->second;
  if (terms.size() > 1) terms = {sum_gradient_terms(terms)};
  return terms[0];
}

}  // namespace

Value sum_to_shape(Value g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const Shape& from = g.shape();
  KILN_ASSERT(from.rank() >= shape.rank(), "gradient {} cannot be summed to {}", from.str(),
              shape.str());
  const std::size_t lead = from.rank() - shape.rank();
  std::vector<std::int64_t> axes;
  for (std::size_t d = 0; d < from.rank(); ++d)
    if (d < lead || (shape[d - lead] == 1 && from[d] != 1))
      axes.push_back(static_cast<std::int64_t>(d));
  return reshape(sum(g, axes), shape.dims());
}

std::vector<Value> grad(Value loss, const std::vector<Value>& wrt) {
  Graph& g = loss.graph();
  KILN_CHECK(loss.shape().numel() == 1, "grad: loss must have one element but is {}",
             loss.type().str());
  KILN_CHECK(is_floating(loss.dtype()), "grad: loss must be floating point but is {}",
             loss.type().str());
  for (const Value& v : wrt)
    KILN_CHECK(&v.graph() == &g, "grad: a value belongs to another graph than the loss");

  const std::int32_t last = loss.ref().node;
  const std::vector<bool> needed = depends_on(g, wrt, last);
  Terms grads;
  grads[loss.ref()].push_back(g.fill(1.0, loss.shape(), loss.dtype()));

  for (std::int32_t id = last; id >= 0; --id) {
    if (!needed[static_cast<std::size_t>(id)]) continue;
    const Node node = g.node(id);  // copy: the gradient ops below grow the node vector
    if (!node.op->grad) continue;
    GradContext ctx{g, node, {}, {}, {}, {}};
    bool any = false;
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      const ValueRef ref{id, static_cast<std::int32_t>(i)};
      ctx.outputs.push_back(g.value(ref));
      ctx.output_grads.push_back(gradient_of(grads, ref));
      any = any || ctx.output_grads.back().valid();
    }
    if (!any) continue;
    for (const ValueRef& in : node.inputs) {
      ctx.inputs.push_back(g.value(in));
      ctx.needs_grad.push_back(needed[static_cast<std::size_t>(in.node)] &&
                               is_floating(g.type(in).dtype));
    }
    const std::vector<Value> input_grads = node.op->grad(ctx);
    KILN_ASSERT(input_grads.size() == node.inputs.size(),
                "{}: gradient gave {} values for {} inputs", node.op->name, input_grads.size(),
                node.inputs.size());
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      if (!ctx.needs_grad[i] || !input_grads[i].valid()) continue;
      grads[node.inputs[i]].push_back(sum_to_shape(input_grads[i], g.type(node.inputs[i]).shape));
    }
  }

  std::vector<Value> result;
  for (const Value& v : wrt) {
    const Value total = gradient_of(grads, v.ref());
    result.push_back(total.valid() ? total : g.fill(0.0, v.shape(), v.dtype()));
  }
  return result;
}

}  // namespace kiln
