// One walk over the nodes: a picked convolution's image is replaced by its channels-last copy,
// made at the first picked reader and shared by the later ones.
#include "graph/passes/channels_last.h"

#include <map>
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

Node transpose_node(ValueRef in, const TensorType& type) {
  Node n{.op = &op_def(OpId::transpose), .inputs = {in}};
  n.attrs = Attrs{{"perm", kChannelsLast}};
  const TensorType in_types[] = {type};
  n.outputs = n.op->infer(in_types, n.attrs);
  return n;
}

}  // namespace

Graph channels_last_images(const Graph& g, const ChannelsLastWanted& wants) {
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
    std::vector<TensorType> in_types;
    for (const ValueRef& in : n.inputs) in_types.push_back(g.type(in));
    if (reads_an_image(n, in_types) && wants(n, in_types)) {
      const ValueRef image = copy.inputs[0];
      auto it = copies.find({image.node, image.index});
      if (it == copies.end())
        it = copies
                 .emplace(std::pair{image.node, image.index},
                          out.add_node(transpose_node(image, in_types[0])))
                 .first;
      copy.inputs[0] = it->second;
      mark_conv_image_channels_last(copy.attrs);
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
