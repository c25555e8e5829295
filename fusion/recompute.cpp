// One walk over the nodes in order, copying each; before a node that reads a recomputed value
// from another group, a copy of that value's chain of nodes.
#include "fusion/recompute.h"

#include <map>
#include <optional>
#include <set>

#include "fusion/fuse.h"
#include "graph/op.h"

namespace kiln {
namespace {

constexpr int kMaxChain = 4;  // nodes recomputed for one value at most

class Planner {
 public:
  explicit Planner(const Graph& g) : g_(g), group_of_(fusion_groups(g)) {
    const std::size_t count = g.nodes().size();
    stored_.assign(count, 0);
    for (std::size_t id = 0; id < count; ++id) {
      if (group_of_[id] >= 0) continue;
      stored_[id] = 1;  // made outside the groups, and what it reads
      for (const ValueRef& in : g.node(static_cast<std::int32_t>(id)).inputs)
        stored_[static_cast<std::size_t>(in.node)] = 1;
    }
    for (const auto& [name, ref] : g.outputs()) stored_[static_cast<std::size_t>(ref.node)] = 1;
    for (const auto& [var, ref] : g.assignments()) stored_[static_cast<std::size_t>(ref.node)] = 1;
    // What each group reads, through the copies of the rule above too (batch norm's backward
    // reads the convolution's output through its copy of x - k).
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(count); ++id)
      if (group(id) >= 0)
        for (const ValueRef& in : g.node(id).inputs)
          read_by_group_.insert({group(id), recomputed_for(id, in) ? base(in.node) : in.node});
  }

  // Whether `reader` reads `ref` through a copy of its chain instead of the value itself: the
  // copy must be able to join the reader's group, so the reader iterates over ref's shape (an
  // elementwise node of that shape, or a reduction of ref).
  bool recomputed_for(std::int32_t reader, const ValueRef& ref) const {
    const std::int32_t from = group_of_[static_cast<std::size_t>(ref.node)],
                       to = group_of_[static_cast<std::size_t>(reader)];
    const Node& r = g_.node(reader);
    const bool joins = r.op->kind == OpKind::reduction ? r.inputs[0] == ref
                                                       : r.outputs[0].shape == g_.type(ref).shape;
    return from >= 0 && to >= 0 && from != to && joins && !stored(ref.node) &&
           cheap(ref.node, kMaxChain);
  }

  // The input of the relu whose output `ref` is, where `reader` is relu's mask in another group,
  // greater(ref, 0), and that input can be made again there: the mask reads the input's copy
  // (x > 0 exactly where relu(x) > 0), so the output need not live until the backward.
  std::optional<ValueRef> relu_input_for_mask(std::int32_t reader, const ValueRef& ref) const {
    const Node& r = g_.node(reader);
    const Node& relu = g_.node(ref.node);
    if (r.op->id != OpId::greater || !(r.inputs[0] == ref) || relu.op->id != OpId::relu ||
        !is_zero(r.inputs[1].node))
      return std::nullopt;
    const ValueRef input = relu.inputs[0];
    const std::int32_t from = group(ref.node), to = group(reader);
    if (from < 0 || to < 0 || from == to || group(input.node) != from ||
        g_.type(input).shape != r.outputs[0].shape || stored(input.node) ||
        !cheap(input.node, kMaxChain) || !base_read_by(input.node, to))
      return std::nullopt;
    return input;
  }

  std::int32_t group(std::int32_t id) const { return group_of_[static_cast<std::size_t>(id)]; }

  // Whether a copy of node `id` recomputes its input `in` too: its one value of the node's size
  // that is not stored, and any smaller value its group makes from values outside the groups
  // (a weight's cast to bf16), which a second reading group would otherwise make a kernel of
  // its own.
  bool chained(std::int32_t id, const ValueRef& in) const {
    if (is_fill(in.node) || stored(in.node)) return false;
    return size(in) == size({id, 0}) || made_from_ungrouped(in.node);
  }

 private:
  bool stored(std::int32_t id) const { return stored_[static_cast<std::size_t>(id)] != 0; }
  bool is_fill(std::int32_t id) const { return g_.node(id).op->id == OpId::fill; }
  bool is_zero(std::int32_t id) const {
    return is_fill(id) && g_.node(id).attrs.real("value") == 0.0;
  }
  std::int64_t size(const ValueRef& ref) const { return g_.type(ref).shape.numel(); }

  // Whether group `reader` reads the stored value at the bottom of node `id`'s chain already
  // (batch norm's backward reads the convolution's output): then the copy keeps nothing alive
  // longer, where a convolution's or GEMM's output read only by its bias-and-ReLU group would
  // live into the backward (and a GEMM lose its bias/ReLU epilogue, fusion/gemm_epilogues.h).
  bool base_read_by(std::int32_t id, std::int32_t reader) const {
    return read_by_group_.count({reader, base(id)}) != 0;
  }

  // The stored value of its size that the chain of a cheap node `id` starts from (-1: none).
  std::int32_t base(std::int32_t id) const {
    for (const ValueRef& in : g_.node(id).inputs) {
      if (is_fill(in.node) || size(in) < size({id, 0})) continue;
      return stored(in.node) ? in.node : base(in.node);
    }
    return -1;
  }

  bool made_from_ungrouped(std::int32_t id) const {
    const Node& n = g_.node(id);
    if (group(id) < 0 || n.op->kind != OpKind::elementwise || n.outputs.size() != 1) return false;
    for (const ValueRef& in : n.inputs)
      if (!is_fill(in.node) && group(in.node) >= 0) return false;
    return true;
  }

  // Whether node `id`'s value can be made again from stored values in at most `budget` nodes.
  bool cheap(std::int32_t id, int budget) const {
    const Node& n = g_.node(id);
    if (budget == 0 || group_of_[static_cast<std::size_t>(id)] < 0 ||
        n.op->kind != OpKind::elementwise || n.outputs.size() != 1)
      return false;
    int full = 0;
    for (const ValueRef& in : n.inputs) {
      if (is_fill(in.node) || size(in) < size({id, 0})) continue;  // a constant, broadcast
      if (++full > 1) return false;
      if (!stored(in.node) && !cheap(in.node, budget - 1)) return false;
    }
    return true;
  }

  const Graph& g_;
  std::vector<std::int32_t> group_of_;
  std::vector<char> stored_;  // made or read outside the groups, or a graph root
  std::set<std::pair<std::int32_t, std::int32_t>> read_by_group_;  // (group, node it reads)
};

}  // namespace

Graph recompute_in_readers(const Graph& g) {
  const Planner plan(g);
  Graph out;
  std::vector<std::int32_t> new_id(g.nodes().size(), -1);
  auto moved = [&](const ValueRef& ref) {
    return ValueRef{new_id[static_cast<std::size_t>(ref.node)], ref.index};
  };
  // A copy of node `id` (and of its chained input) in `out`, made once per reading group: the
  // first reader's copy precedes the group's later readers too.
  std::map<std::pair<std::int32_t, std::int32_t>, ValueRef> copies;  // (group, node) -> copy
  auto copy = [&](auto& self, std::int32_t group, std::int32_t id) -> ValueRef {
    if (auto it = copies.find({group, id}); it != copies.end()) return it->second;
    Node n = g.node(id);
    for (ValueRef& in : n.inputs)
      in = plan.chained(id, in) ? self(self, group, in.node) : moved(in);
    const ValueRef made = out.add_node(std::move(n));
    copies.emplace(std::pair{group, id}, made);
    return made;
  };
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    Node n = g.node(id);
    for (ValueRef& in : n.inputs) {
      if (const std::optional<ValueRef> input = plan.relu_input_for_mask(id, in))
        in = copy(copy, plan.group(id), input->node);
      else
        in = plan.recomputed_for(id, in) ? copy(copy, plan.group(id), in.node) : moved(in);
    }
    new_id[static_cast<std::size_t>(id)] = out.add_node(std::move(n)).node;
  }
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(moved(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(moved(ref)));
  return out;
}

}  // namespace kiln
