// One walk over the nodes: a picked convolution's image (or dy) is replaced by its channels-last
// copy, made at the first picked reader and shared by the later ones. A first walk finds the dy
// values that an input gradient wants channels-last: only those get a copy.
#include "graph/passes/channels_last.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "graph/op.h"
#include "graph/op_table.h"
#include "graph/ops.h"

namespace kiln {
namespace {

bool reads_an_image(const Node& n, std::span<const TensorType> inputs) {
  return (n.op->id == OpId::conv2d || n.op->id == OpId::conv2d_grad_weight) &&
         !conv_image_channels_last(n.attrs) && inputs[0].shape.rank() == 4;
}

// The operand of a gradient pass that is its dy, or -1: conv2d_grad_input's first,
// conv2d_grad_weight's second, where it is 4-D and not channels-last already.
int dy_operand(const Node& n, std::span<const TensorType> inputs) {
  if (conv_y_channels_last(n.attrs)) return -1;
  const int k = n.op->id == OpId::conv2d_grad_input    ? 0
                : n.op->id == OpId::conv2d_grad_weight ? 1
                                                       : -1;
  return k >= 0 && inputs[static_cast<std::size_t>(k)].shape.rank() == 4 ? k : -1;
}

Node transpose_node(ValueRef in, const TensorType& type) {
  Node n{.op = &op_def(OpId::transpose), .inputs = {in}};
  n.attrs = Attrs{{"perm", kChannelsLast}};
  const TensorType in_types[] = {type};
  n.outputs = n.op->infer(in_types, n.attrs);
  return n;
}

}  // namespace

Graph channels_last_images(const Graph& g, const ChannelsLastWanted& wants,
                           const ChannelsLastWanted& wants_dy) {
  auto types_of = [&](const Node& n) {
    std::vector<TensorType> in_types;
    for (const ValueRef& in : n.inputs) in_types.push_back(g.type(in));
    return in_types;
  };
  std::set<ValueRef> dy_copied;  // dy values (of g) an input gradient reads channels-last
  for (const Node& n : g.nodes()) {
    if (!wants_dy || n.op->id != OpId::conv2d_grad_input) continue;
    const std::vector<TensorType> in_types = types_of(n);
    if (dy_operand(n, in_types) == 0 && wants_dy(n, in_types)) dy_copied.insert(n.inputs[0]);
  }
  Graph out;
  std::vector<std::vector<ValueRef>> refs(g.nodes().size());
  std::map<std::pair<std::int32_t, std::int32_t>, ValueRef> copies;  // image (new graph) -> copy
  auto mapped = [&](ValueRef r) {
    return refs[static_cast<std::size_t>(r.node)][static_cast<std::size_t>(r.index)];
  };
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    const Node& n = g.node(id);
    Node copy = n;
    for (ValueRef& in : copy.inputs) in = mapped(in);
    const std::vector<TensorType> in_types = types_of(n);
    auto channels_last_copy = [&](std::size_t k) {
      const ValueRef value = copy.inputs[k];
      auto it = copies.find({value.node, value.index});
      if (it == copies.end())
        it = copies
                 .emplace(std::pair{value.node, value.index},
                          out.add_node(transpose_node(value, in_types[k])))
                 .first;
      copy.inputs[k] = it->second;
    };
    if (reads_an_image(n, in_types) && wants(n, in_types)) {
      channels_last_copy(0);
      mark_conv_image_channels_last(copy.attrs);
    }
    if (const int k = dy_operand(n, in_types);
        k >= 0 && dy_copied.count(n.inputs[static_cast<std::size_t>(k)]) && wants_dy(n, in_types)) {
      channels_last_copy(static_cast<std::size_t>(k));
      mark_conv_y_channels_last(copy.attrs);
    }
    const ValueRef first = out.add_node(std::move(copy));
    for (std::int32_t k = 0; k < static_cast<std::int32_t>(n.outputs.size()); ++k)
      refs[static_cast<std::size_t>(id)].push_back({first.node, k});
  }
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(mapped(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(mapped(ref)));
  return out;
}

}  // namespace kiln
