// One walk over the nodes in order, copying each into a new graph or its rewrite.
#include "graph/passes/pool_grad_masks.h"

#include <algorithm>
#include <map>

#include "core/env_switch.h"
#include "graph/op.h"
#include "graph/ops.h"

namespace kiln {
namespace {

bool same_window(const Node& a, const Node& b) {
  for (const char* attr : {"kernel", "stride", "padding"})
    if (a.attrs.integer(attr) != b.attrs.integer(attr)) return false;
  return true;
}

// How many times each node's values are read (by nodes, outputs and assignments).
std::vector<int> reads_of(const Graph& g) {
  std::vector<int> reads(g.nodes().size(), 0);
  for (const Node& n : g.nodes())
    for (const ValueRef& in : n.inputs) ++reads[static_cast<std::size_t>(in.node)];
  for (const auto& [name, ref] : g.outputs()) ++reads[static_cast<std::size_t>(ref.node)];
  for (const auto& [var, ref] : g.assignments()) ++reads[static_cast<std::size_t>(ref.node)];
  return reads;
}

// The node of max_pool2d(y) with `grad`'s window, or -1.
std::int32_t pooled_forward(const Graph& g, const Node& grad, std::int32_t before) {
  for (std::int32_t id = 0; id < before; ++id) {
    const Node& n = g.node(id);
    if (n.op->id == OpId::max_pool2d && n.inputs[0] == grad.inputs[0] && same_window(n, grad))
      return id;
  }
  return -1;
}

struct MaskedPoolGrad {
  std::int32_t grad = -1, mask = -1, pooled = -1;
};

// Rewrite 1's pattern at `id`: mul of a pool gradient (read only here) and greater(y, fill).
MaskedPoolGrad match_masked(const Graph& g, std::int32_t id, const std::vector<int>& reads) {
  const Node& n = g.node(id);
  if (n.op->id != OpId::mul || n.inputs.size() != 2) return {};
  for (int k = 0; k < 2; ++k) {
    const ValueRef gref = n.inputs[static_cast<std::size_t>(k)],
                   mref = n.inputs[static_cast<std::size_t>(1 - k)];
    const Node& grad = g.node(gref.node);
    const Node& mask = g.node(mref.node);
    if (grad.op->id != OpId::max_pool2d_grad || reads[static_cast<std::size_t>(gref.node)] != 1)
      continue;
    if (mask.op->id != OpId::greater || mask.inputs[0] != grad.inputs[0]) continue;
    if (g.node(mask.inputs[1].node).op->id != OpId::fill ||
        g.type(mask.inputs[1]).shape.numel() != 1)
      continue;
    if (g.type(mref) != g.type(gref) || n.outputs[0] != g.type(gref)) continue;
    const std::int32_t pooled = pooled_forward(g, grad, id);
    if (pooled >= 0) return {gref.node, mref.node, pooled};
  }
  return {};
}

// The mask of rewrite 1 on the pooled values: greater(pooled, threshold).
struct PooledMask {
  Value pooled, threshold;
};

// dy * greater(pooled, threshold), in the new graph.
Value masked(Value dy, const PooledMask& m) {
  Graph& out = dy.graph();
  return out.apply1(OpId::mul, {dy, out.apply1(OpId::greater, {m.pooled, m.threshold})});
}

// Rewrite 2's pattern: a sum over both spatial axes of a 4-d pool gradient.
bool sums_pool_grad(const Graph& out, const Node& n) {
  if (n.op->id != OpId::reduce_sum) return false;
  const Node& producer = out.node(n.inputs[0].node);
  if (producer.op->id != OpId::max_pool2d_grad || out.type(n.inputs[0]).shape.rank() != 4)
    return false;
  const std::vector<std::int64_t>& axes = n.attrs.integers("axes");
  auto has = [&](std::int64_t a) {
    return std::find(axes.begin(), axes.end(), a) != axes.end() ||
           std::find(axes.begin(), axes.end(), a - 4) != axes.end();
  };
  return has(2) && has(3);
}

}  // namespace

Graph apply_masks_before_pool_grads(const Graph& g) {
  const std::vector<int> reads = reads_of(g);
  Graph out;
  std::map<std::int32_t, PooledMask> relu_masks;  // relu=1 pool gradients made, by node
  const bool relu_form = env_switch_on("KILN_POOL_GRAD_RELU");
  std::vector<std::int32_t> new_id(g.nodes().size(), -1);
  auto moved = [&](ValueRef ref) {
    return out.value({new_id[static_cast<std::size_t>(ref.node)], ref.index});
  };
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    Node n = g.node(id);
    for (ValueRef& in : n.inputs) in.node = new_id[static_cast<std::size_t>(in.node)];
    if (const MaskedPoolGrad m = match_masked(g, id, reads); m.grad >= 0) {
      const Node& grad = g.node(m.grad);
      const Node& mask = g.node(m.mask);
      const PooledMask pooled{moved({m.pooled, 0}), moved(mask.inputs[1])};
      Value routed;
      if (relu_form && g.node(mask.inputs[1].node).attrs.real("value") == 0.0) {  // relu=1
        Attrs attrs = grad.attrs;
        attrs.set("relu", std::int64_t{1});
        routed = out.apply1(OpId::max_pool2d_grad, {moved(grad.inputs[0]), moved(grad.inputs[1])},
                            std::move(attrs));
        relu_masks.emplace(routed.ref().node, pooled);
      } else {
        routed =
            out.apply1(OpId::max_pool2d_grad,
                       {moved(grad.inputs[0]), masked(moved(grad.inputs[1]), pooled)}, grad.attrs);
      }
      new_id[static_cast<std::size_t>(id)] = routed.ref().node;
      continue;
    }
    if (sums_pool_grad(out, n)) {
      const std::int32_t producer = n.inputs[0].node;
      Value pooled_grad = out.value(out.node(producer).inputs[1]);
      if (max_pool_grad_relu(out.node(producer).attrs)) {  // the mask as the gradient saw it
        const auto mask = relu_masks.find(producer);
        if (mask == relu_masks.end()) {  // (a relu=1 gradient the pass did not make)
          new_id[static_cast<std::size_t>(id)] = out.add_node(std::move(n)).node;
          continue;
        }
        pooled_grad = masked(pooled_grad, mask->second);
      }
      new_id[static_cast<std::size_t>(id)] =
          out.apply1(OpId::reduce_sum, {pooled_grad}, n.attrs).ref().node;
      continue;
    }
    new_id[static_cast<std::size_t>(id)] = out.add_node(std::move(n)).node;
  }
  for (const auto& [name, ref] : g.outputs()) out.output(name, moved(ref));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, moved(ref));
  return out;
}

}  // namespace kiln
