// Two walks: the orders each convolution wants of its filter, then the graph copied with one
// layout node after each filter's producer and the convolutions reading it.
#include "graph/passes/filter_layouts.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "graph/op.h"
#include "graph/op_table.h"

namespace kiln {
namespace {

using LayoutKey = std::tuple<ValueRef, FilterLayout, std::vector<std::int64_t>>;

bool reads_filter(const Node& n) {
  return (n.op->id == OpId::conv2d || n.op->id == OpId::conv2d_grad_input) &&
         conv_filter_layout_of(n.attrs) == FilterLayout::nchw;
}

}  // namespace

Graph lay_out_filters(const Graph& g, const FilterOrderWanted& wants) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::vector<std::optional<FilterOrder>> wanted(static_cast<std::size_t>(count));
  std::map<std::int32_t, std::vector<LayoutKey>> after;  // producer -> its filters' layouts
  for (std::int32_t id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    if (!reads_filter(n)) continue;
    std::vector<TensorType> inputs;
    for (const ValueRef& in : n.inputs) inputs.push_back(g.type(in));
    std::optional<FilterOrder> order = wants(n, inputs);
    if (!order || order->layout == FilterLayout::nchw) continue;
    const LayoutKey key{n.inputs[1], order->layout, order->taps};
    std::vector<LayoutKey>& keys = after[n.inputs[1].node];
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    wanted[static_cast<std::size_t>(id)] = std::move(order);
  }
  if (after.empty()) return g;

  Graph out;
  std::vector<std::vector<ValueRef>> refs(static_cast<std::size_t>(count));
  auto mapped = [&](ValueRef r) {
    return refs[static_cast<std::size_t>(r.node)][static_cast<std::size_t>(r.index)];
  };
  std::map<LayoutKey, ValueRef> laid;  // (filter, layout, taps) -> the layout node's value
  for (std::int32_t id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    Node copy = n;
    for (ValueRef& in : copy.inputs) in = mapped(in);
    if (const std::optional<FilterOrder>& order = wanted[static_cast<std::size_t>(id)]) {
      copy.inputs[1] = laid.at({n.inputs[1], order->layout, order->taps});
      mark_conv_filter_layout(copy.attrs, order->layout, order->taps);
    }
    const ValueRef made = out.add_node(std::move(copy));
    for (std::int32_t k = 0; k < static_cast<std::int32_t>(n.outputs.size()); ++k)
      refs[static_cast<std::size_t>(id)].push_back({made.node, k});
    const auto it = after.find(id);
    if (it == after.end()) continue;
    for (const LayoutKey& key : it->second) {
      const auto& [filter, layout, taps] = key;
      laid[key] = conv_filter_layout({out.value(mapped(filter))}, layout, taps)[0].ref();
    }
  }
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(mapped(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(mapped(ref)));
  return out;
}

}  // namespace kiln
