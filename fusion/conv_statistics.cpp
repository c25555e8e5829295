// The conv-statistics pass (conv_statistics.h): finds batch norm's two sums over a convolution's
// output and re-emits the graph with a conv2d_moments node and the sums over its run moments.
#include "fusion/conv_statistics.h"

#include <map>
#include <optional>
#include <vector>

#include "graph/op_table.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// One convolution whose statistics the pass takes: the nodes of k and of the two sums.
struct Match {
  ValueRef shift;   // k: [1, C, 1, 1]
  int first = -1;   // reduce_sum of d
  int second = -1;  // reduce_sum of d * d
};

using Readers = std::vector<std::vector<int>>;  // the nodes that read each node's output 0

bool is_channel_sum(const Node& n) {
  if (n.op->id != OpId::reduce_sum || n.outputs[0].dtype != DType::f32 ||
      n.attrs.integer("keepdims") == 0)
    return false;
  const std::vector<std::int64_t>& axes = n.attrs.integers("axes");
  return axes == std::vector<std::int64_t>{0, 2, 3};
}

// The reduce_sum over the channels' axes of `v` itself or of its cast to f32, if any.
std::optional<int> channel_sum_of(const Graph& g, const Readers& readers, int v) {
  for (const int r : readers[static_cast<std::size_t>(v)]) {
    const Node& n = g.node(r);
    if (is_channel_sum(n)) return r;
    if (n.op->id == OpId::cast && n.outputs[0].dtype == DType::f32)
      for (const int s : readers[static_cast<std::size_t>(r)])
        if (is_channel_sum(g.node(s))) return s;
  }
  return std::nullopt;
}

std::optional<Match> match(const Graph& g, const Readers& readers, int conv,
                           const ConvMomentsWanted& takes, std::int64_t min_pixels) {
  const Node& c = g.node(conv);
  if (c.op->id != OpId::conv2d || conv_y_channels_last(c.attrs)) return std::nullopt;  // y NCHW
  const Shape& y = c.outputs[0].shape;
  if (y[0] * y[2] * y[3] <= min_pixels) return std::nullopt;
  std::vector<TensorType> in;
  for (const ValueRef& r : c.inputs) in.push_back(g.type(r));
  if (!takes(c, in)) return std::nullopt;
  const Shape per_channel{1, y[1], 1, 1};
  for (const int d : readers[static_cast<std::size_t>(conv)]) {
    const Node& sub = g.node(d);
    if (sub.op->id != OpId::sub || sub.inputs[0] != ValueRef{conv, 0} ||
        g.type(sub.inputs[1]).shape != per_channel || sub.outputs[0].shape != y)
      continue;
    const std::optional<int> first = channel_sum_of(g, readers, d);
    std::optional<int> second;
    for (const int q : readers[static_cast<std::size_t>(d)]) {
      const Node& mul = g.node(q);
      if (mul.op->id == OpId::mul && mul.inputs[0] == ValueRef{d, 0} &&
          mul.inputs[1] == ValueRef{d, 0})
        second = channel_sum_of(g, readers, q);
      if (second) break;
    }
    if (first && second) return Match{sub.inputs[1], *first, *second};
  }
  return std::nullopt;
}

}  // namespace

Graph fuse_conv_statistics(const Graph& g, const ConvMomentsWanted& takes,
                           std::int64_t min_pixels) {
  const int count = static_cast<int>(g.nodes().size());
  Readers readers(static_cast<std::size_t>(count));
  for (int id = 0; id < count; ++id)
    for (const ValueRef& in : g.node(id).inputs)
      if (in.index == 0) readers[static_cast<std::size_t>(in.node)].push_back(id);
  std::map<int, Match> matches;  // by convolution
  std::map<int, int> sums;       // each matched sum: its convolution
  for (int id = 0; id < count; ++id)
    if (const std::optional<Match> m = match(g, readers, id, takes, min_pixels)) {
      matches[id] = *m;
      sums[m->first] = id;
      sums[m->second] = id;
    }
  if (matches.empty()) return g;

  Graph out;
  std::map<ValueRef, ValueRef> remap;
  std::map<int, Value> moments;  // each matched convolution's [3, T, C] run moments
  for (int id = 0; id < count; ++id) {
    if (remap.count({id, 0}) != 0) continue;  // the second sum, made with the first
    Node n = g.node(id);
    for (ValueRef& in : n.inputs) in = remap.at(in);
    if (matches.count(id) != 0) {
      const auto [y, runs] =
          conv2d_moments(out.value(n.inputs[0]), out.value(n.inputs[1]), n.attrs.integer("stride"),
                         n.attrs.integer("padding"), conv_image_channels_last(n.attrs));
      remap[{id, 0}] = y.ref();
      moments.emplace(id, runs);
      continue;
    }
    if (const auto it = sums.find(id); it != sums.end()) {  // both sums, from one difference
      const Match& m = matches.at(it->second);
      const Value& runs = moments.at(it->second);  // [3, T, C]
      const std::int64_t t = runs.shape()[1];
      // As [3T, C, 1, 1]: k, [1, C, 1, 1], broadcasts against each row's [T, C, 1, 1] as it is
      // (a reshape of k's slices of y would make them copies), and the sums over axis 0 have
      // the shape of those they replace.
      const Value rows = reshape(runs, {3 * t, runs.shape()[2], 1, 1});
      Value k = out.value(remap.at(m.shift));
      if (k.dtype() != DType::f32) k = cast(k, DType::f32);
      const Value apart = slice(rows, 0, t, t) - k;
      const Value weighted = slice(rows, 0, 0, t) * apart;
      remap[{m.first, 0}] = sum(weighted, {0}, true).ref();
      remap[{m.second, 0}] = sum(slice(rows, 0, 2 * t, t) + weighted * apart, {0}, true).ref();
      continue;
    }
    const ValueRef made = out.add_node(std::move(n));
    for (int i = 0; i < static_cast<int>(g.node(id).outputs.size()); ++i)
      remap[{id, i}] = {made.node, i};
  }
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(remap.at(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(remap.at(ref)));
  return out;
}

}  // namespace kiln
