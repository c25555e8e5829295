// The fuse pass: (1) elementwise nodes join a producer's group of the same shape in node
// order, unless that would make the contracted graph cyclic; (2) a reduction of a group
// value becomes that group's tail; (3) each group becomes a FusedGroup node, and the
// graph is re-emitted in a topological order of groups and remaining nodes.
#include "fusion/fuse.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <queue>

#include "fusion/fused_group.h"
#include "graph/op_table.h"

namespace kiln {
namespace {

// The register dtype a node computes in: f64 for f64 values; f32 for f32, bf16 and f16 (loads
// widen, stores round). A node mixing f64 with the others (a cast between them) has none and
// runs on its own.
std::optional<DType> compute_dtype(const Graph& g, const Node& n) {
  bool wide = false, narrow = false;
  auto see = [&](DType d) {
    if (!is_floating(d)) return;
    (d == DType::f64 ? wide : narrow) = true;
  };
  for (const ValueRef& in : n.inputs) see(g.type(in).dtype);
  for (const TensorType& t : n.outputs) see(t.dtype);
  if (wide && narrow) return std::nullopt;
  return wide ? DType::f64 : DType::f32;
}

bool fusible(const Graph& g, const Node& n) {
  return n.op->kind == OpKind::elementwise && !n.op->alias && is_floating(n.outputs[0].dtype) &&
         compute_dtype(g, n).has_value();
}
bool is_fill(const Node& n) { return n.op->id == OpId::fill; }
bool is_reduction(const Node& n) { return n.op->kind == OpKind::reduction; }

struct Grouping {
  std::vector<int> group_of;                 // node -> group, or -1
  std::vector<std::vector<int>> members;     // group -> elementwise members in node order
  std::vector<int> tail;                     // group -> reduction node, or -1
  std::vector<std::vector<int>> more_tails;  // group -> reductions after it (same axes)
  std::vector<Shape> shape;                  // group -> iteration shape
  std::vector<DType> compute;                // group -> register dtype (compute_dtype)
};

// Whether `start` depends on group `target` once every group is contracted to one node.
bool reaches_group(const Graph& g, const Grouping& gr, int start, int target) {
  std::vector<char> seen(g.nodes().size(), 0), seen_group(gr.members.size(), 0);
  std::vector<int> stack = {start};
  KILN_ASSERT(!gr.members[static_cast<std::size_t>(target)].empty(),
              "reaches_group: group {} was absorbed", target);
  auto push_inputs = [&](int node) {
    for (const ValueRef& in : g.node(node).inputs) stack.push_back(in.node);
  };
  while (!stack.empty()) {
    const int q = stack.back();
    stack.pop_back();
    if (seen[static_cast<std::size_t>(q)]) continue;
    seen[static_cast<std::size_t>(q)] = 1;
    const int h = gr.group_of[static_cast<std::size_t>(q)];
    if (h == target) return true;
    if (h < 0) {
      // No pruning by node index: an early node can read a group that also holds later
      // nodes, which may in turn depend on the target (found by fuzz_compiler, seed 1004934).
      push_inputs(q);
      continue;
    }
    if (seen_group[static_cast<std::size_t>(h)]) continue;
    seen_group[static_cast<std::size_t>(h)] = 1;
    for (int m : gr.members[static_cast<std::size_t>(h)]) push_inputs(m);
  }
  return false;
}

// Whether any input of `node` from outside the groups in `joined` (fills aside) depends
// on one of them: then putting `node` with them would make the contracted graph cyclic.
bool inputs_reach(const Graph& g, const Grouping& gr, int node, const std::vector<int>& joined) {
  for (const ValueRef& in : g.node(node).inputs) {
    const int h = gr.group_of[static_cast<std::size_t>(in.node)];
    if (std::find(joined.begin(), joined.end(), h) != joined.end() || is_fill(g.node(in.node)))
      continue;
    for (int target : joined)
      if (reaches_group(g, gr, in.node, target)) return true;
  }
  return false;
}

// Whether groups `joined` plus `node` can become one group without a cycle: no outside
// input of any of them may depend on any of them.
bool can_merge(const Graph& g, const Grouping& gr, int node, const std::vector<int>& joined) {
  if (inputs_reach(g, gr, node, joined)) return false;
  if (joined.size() == 1) return true;  // a group never reaches itself through outside nodes
  for (int h : joined)
    for (int m : gr.members[static_cast<std::size_t>(h)])
      if (inputs_reach(g, gr, m, joined)) return false;
  return true;
}

void absorb(Grouping& gr, int into, int from) {
  auto& target = gr.members[static_cast<std::size_t>(into)];
  for (int m : gr.members[static_cast<std::size_t>(from)]) {
    gr.group_of[static_cast<std::size_t>(m)] = into;
    target.push_back(m);
  }
  std::sort(target.begin(), target.end());
  gr.members[static_cast<std::size_t>(from)].clear();
}

// Whether a value of shape `part` broadcasts to `whole` (numpy rules, `whole` unchanged).
bool broadcasts_to(const Shape& part, const Shape& whole) {
  if (part.rank() > whole.rank()) return false;
  const std::size_t lead = whole.rank() - part.rank();
  for (std::size_t i = 0; i < part.rank(); ++i)
    if (part[i] != 1 && part[i] != whole[lead + i]) return false;
  return true;
}

// Nodes computed where they are read instead of stored where their input is made: an
// elementwise node whose one input (fills aside) is stored anyway (made outside any group,
// read by a node that is neither elementwise nor a reduction, or a graph output), and whose
// only reader is an elementwise node in another group of its shape or of a shape it broadcasts
// to (a per-channel scale's cast to bf16: recomputed per element instead of a kernel of its own).
// In its producer's group it is one more output to store and load again (relu's mask greater(y, 0),
// made in the forward for the backward); in its reader's group it costs only reading its input. The
// move keeps the contracted graph acyclic: the reader's group already depended on that input.
void move_to_readers(const Graph& g, Grouping& gr) {
  const int count = static_cast<int>(g.nodes().size());
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(count));
  for (int id = 0; id < count; ++id)
    for (const ValueRef& in : g.node(id).inputs) {
      auto& r = readers[static_cast<std::size_t>(in.node)];
      if (r.empty() || r.back() != id) r.push_back(id);
    }
  std::vector<char> stored(static_cast<std::size_t>(count), 0);
  for (const auto& [name, ref] : g.outputs()) stored[static_cast<std::size_t>(ref.node)] = 1;
  for (const auto& [var, ref] : g.assignments()) stored[static_cast<std::size_t>(ref.node)] = 1;
  for (int id = 0; id < count; ++id) {
    if (!fusible(g, g.node(id)) && !is_fill(g.node(id))) stored[static_cast<std::size_t>(id)] = 1;
    for (int r : readers[static_cast<std::size_t>(id)])
      if (!fusible(g, g.node(r)) && !is_reduction(g.node(r)))
        stored[static_cast<std::size_t>(id)] = 1;
  }
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    const auto& mine = readers[static_cast<std::size_t>(id)];
    if (!fusible(g, n) || stored[static_cast<std::size_t>(id)] || mine.size() != 1) continue;
    const int from = gr.group_of[static_cast<std::size_t>(id)],
              to = gr.group_of[static_cast<std::size_t>(mine[0])];
    if (to < 0 || to == from ||
        !broadcasts_to(n.outputs[0].shape, gr.shape[static_cast<std::size_t>(to)]) ||
        gr.compute[static_cast<std::size_t>(to)] != *compute_dtype(g, n))
      continue;
    int inputs = 0;
    bool inputs_stored = true;
    for (const ValueRef& in : n.inputs) {
      if (is_fill(g.node(in.node))) continue;
      ++inputs;
      inputs_stored = inputs_stored && g.node(in.node).outputs.size() == 1 &&
                      stored[static_cast<std::size_t>(in.node)];
    }
    if (inputs != 1 || !inputs_stored) continue;
    auto& old_members = gr.members[static_cast<std::size_t>(from)];
    old_members.erase(std::find(old_members.begin(), old_members.end(), id));
    auto& new_members = gr.members[static_cast<std::size_t>(to)];
    new_members.insert(std::upper_bound(new_members.begin(), new_members.end(), id), id);
    gr.group_of[static_cast<std::size_t>(id)] = to;
  }
}

// Whether reduction `n` of a value of group h may join h after its tail: h has a tail over
// the same axes of the same shape to as many outputs, with the same keepdims. Both then run in
// one pass, and a value only they read is never stored.
bool sibling_reduction(const Graph& g, const Grouping& gr, int h, const Node& n) {
  const int t = gr.tail[static_cast<std::size_t>(h)];
  if (t < 0 || is_reduction(g.node(n.inputs[0].node))) return false;  // not a reduced value
  const Node& first = g.node(t);
  return g.type(first.inputs[0]).shape == g.type(n.inputs[0]).shape &&
         first.attrs.integers("axes") == n.attrs.integers("axes") &&
         first.attrs.integer("keepdims") == n.attrs.integer("keepdims");
}

Grouping group_nodes(const Graph& g, const FuseOptions& options) {
  Grouping gr;
  const int count = static_cast<int>(g.nodes().size());
  gr.group_of.assign(static_cast<std::size_t>(count), -1);
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    if (!fusible(g, n)) continue;
    const DType compute = *compute_dtype(g, n);
    // Producer groups of this shape; the node joins (and merges) as many as stay acyclic.
    std::vector<int> joined;
    for (const ValueRef& in : options.single_ops ? std::vector<ValueRef>{} : n.inputs) {
      const int h = gr.group_of[static_cast<std::size_t>(in.node)];
      if (h < 0 || gr.shape[static_cast<std::size_t>(h)] != n.outputs[0].shape ||
          gr.compute[static_cast<std::size_t>(h)] != compute)
        continue;
      if (std::find(joined.begin(), joined.end(), h) != joined.end()) continue;
      std::vector<int> trial = joined;
      trial.push_back(h);
      if (can_merge(g, gr, id, trial)) joined = trial;
    }
    if (joined.empty()) {
      joined.push_back(static_cast<int>(gr.members.size()));
      gr.members.emplace_back();
      gr.tail.push_back(-1);
      gr.more_tails.emplace_back();
      gr.shape.push_back(n.outputs[0].shape);
      gr.compute.push_back(compute);
    }
    for (std::size_t k = 1; k < joined.size(); ++k) absorb(gr, joined[0], joined[k]);
    gr.group_of[static_cast<std::size_t>(id)] = joined[0];
    gr.members[static_cast<std::size_t>(joined[0])].push_back(id);
  }
  if (!options.single_ops) move_to_readers(g, gr);
  // Reduction tails: a reduction depends only on its input's group, so joining cannot cycle.
  // A reduction with no group to join becomes a group of its own (no instructions), so
  // that every reduction runs through the same generated code.
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    if (!is_reduction(n) || !is_floating(n.outputs[0].dtype)) continue;
    const std::optional<DType> compute = compute_dtype(g, n);
    KILN_CHECK(compute.has_value(), "fuse: a reduction of {} into {} (cast first)",
               g.type(n.inputs[0]).str(), n.outputs[0].str());
    int h = options.single_ops ? -1 : gr.group_of[static_cast<std::size_t>(n.inputs[0].node)];
    if (h >= 0 && gr.compute[static_cast<std::size_t>(h)] == *compute &&
        sibling_reduction(g, gr, h, n)) {  // a second sum over the same axes: the same pass
      gr.more_tails[static_cast<std::size_t>(h)].push_back(id);
      gr.group_of[static_cast<std::size_t>(id)] = h;
      continue;
    }
    if (h < 0 || gr.tail[static_cast<std::size_t>(h)] >= 0 ||
        gr.compute[static_cast<std::size_t>(h)] != *compute) {
      h = static_cast<int>(gr.members.size());
      gr.members.emplace_back();
      gr.tail.push_back(-1);
      gr.more_tails.emplace_back();
      gr.shape.push_back(g.type(n.inputs[0]).shape);
      gr.compute.push_back(*compute);
    }
    gr.tail[static_cast<std::size_t>(h)] = id;
    gr.group_of[static_cast<std::size_t>(id)] = h;
  }
  return gr;
}

// For each value, whether something outside its group reads it (a node or a graph root).
std::map<ValueRef, bool> used_outside(const Graph& g, const Grouping& gr) {
  std::map<ValueRef, bool> outside;
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id)
    for (const ValueRef& in : g.node(id).inputs)
      if (gr.group_of[static_cast<std::size_t>(id)] < 0 ||
          gr.group_of[static_cast<std::size_t>(id)] !=
              gr.group_of[static_cast<std::size_t>(in.node)])
        outside[in] = true;
  for (const auto& [name, ref] : g.outputs()) outside[ref] = true;
  for (const auto& [var, ref] : g.assignments()) outside[ref] = true;
  return outside;
}

// A value read through slices: the sliced value it lives in, and where. A slice keeps its
// source's strides on every axis and only moves the start, so a chain of slices reads the
// base at the base's dense strides, from the sum of each start times the base's stride
// on that slice's axis.
struct SliceView {
  ValueRef base;
  std::int64_t offset = 0;
};

SliceView slice_view(const Graph& g, ValueRef ref) {
  SliceView v{ref, 0};
  std::vector<std::pair<std::size_t, std::int64_t>> starts;  // (axis, start) of each slice
  while (g.node(v.base.node).op->id == OpId::slice) {
    const Node& s = g.node(v.base.node);
    starts.emplace_back(static_cast<std::size_t>(s.attrs.integer("axis")),
                        s.attrs.integer("start"));
    v.base = s.inputs[0];
  }
  const std::vector<std::int64_t> strides = g.type(v.base).shape.strides();
  for (const auto& [axis, start] : starts) v.offset += start * strides[axis];
  return v;
}

// Strides over `group` of a value of shape `shape` that lives in `base` (same rank).
std::vector<std::int64_t> view_strides(const Shape& shape, const Shape& base, const Shape& group) {
  std::vector<std::int64_t> strides(group.rank(), 0);
  const std::vector<std::int64_t> dense = base.strides();
  const std::size_t lead = group.rank() - shape.rank();
  for (std::size_t i = 0; i < shape.rank(); ++i) strides[lead + i] = shape[i] == 1 ? 0 : dense[i];
  return strides;
}

struct BuiltGroup {
  std::shared_ptr<FusedGroup> body;
  std::vector<ValueRef> inputs;         // outer values, in the body's input order
  std::map<ValueRef, int> output_slot;  // member value -> node output index
};

BuiltGroup build_group(const Graph& g, const Grouping& gr, int group,
                       const std::map<ValueRef, bool>& outside) {
  BuiltGroup b;
  if (gr.members[static_cast<std::size_t>(group)].empty() &&
      gr.tail[static_cast<std::size_t>(group)] < 0)
    return b;  // absorbed
  b.body = std::make_shared<FusedGroup>();
  FusedGroup& body = *b.body;
  body.shape = gr.shape[static_cast<std::size_t>(group)];
  body.compute = gr.compute[static_cast<std::size_t>(group)];
  std::map<ValueRef, Operand> local;
  std::map<ValueRef, int> input_index;
  auto operand_for = [&](const ValueRef& ref) {
    auto it = local.find(ref);
    if (it != local.end()) return it->second;
    const Node& producer = g.node(ref.node);
    if (is_fill(producer)) return Operand::literal(producer.attrs.real("value"));
    const SliceView view = slice_view(g, ref);  // a group never holds a slice's base (see fuse.h)
    auto [pos, inserted] = input_index.emplace(ref, static_cast<int>(body.inputs.size()));
    if (inserted) {
      const TensorType& t = g.type(ref);
      const TensorType& base = g.type(view.base);
      body.inputs.push_back({base, view_strides(t.shape, base.shape, body.shape), view.offset});
      b.inputs.push_back(view.base);
    }
    return Operand::input(pos->second);
  };
  for (int m : gr.members[static_cast<std::size_t>(group)]) {
    const Node& n = g.node(m);
    FusedInstr instr{n.op, {}, n.outputs[0].dtype};
    for (const ValueRef& in : n.inputs) instr.args.push_back(operand_for(in));
    local[{m, 0}] = Operand::instr(static_cast<int>(body.instrs.size()));
    body.instrs.push_back(std::move(instr));
  }
  for (int m : gr.members[static_cast<std::size_t>(group)]) {
    if (!outside.count({m, 0})) continue;
    b.output_slot[{m, 0}] = static_cast<int>(body.outputs.size());
    body.outputs.push_back(local.at({m, 0}));
  }
  if (const int t = gr.tail[static_cast<std::size_t>(group)]; t >= 0) {
    const Node& r = g.node(t);
    body.reduction = FusedReduction{r.op, operand_for(r.inputs[0]), r.attrs.integers("axes"),
                                    r.attrs.integer("keepdims") != 0, r.outputs[0]};
    b.output_slot[{t, 0}] = static_cast<int>(body.outputs.size());
    for (int more : gr.more_tails[static_cast<std::size_t>(group)]) {
      const Node& r2 = g.node(more);
      body.more_reductions.push_back(
          FusedReduction{r2.op, operand_for(r2.inputs[0]), r2.attrs.integers("axes"),
                         r2.attrs.integer("keepdims") != 0, r2.outputs[0]});
      b.output_slot[{more, 0}] =
          static_cast<int>(body.outputs.size() + body.more_reductions.size());
    }
  }
  return b;
}

}  // namespace

void finish_copy(const Graph& from, Graph& out, const std::map<ValueRef, ValueRef>& remap,
                 const std::vector<int>& new_id, FusionReport* report) {
  for (const auto& [name, ref] : from.outputs()) out.output(name, out.value(remap.at(ref)));
  for (const auto& [var, ref] : from.assignments()) out.assign(var, out.value(remap.at(ref)));
  if (report)
    for (FusionReport::Group& entry : report->groups)
      entry.fused_node = new_id[static_cast<std::size_t>(entry.fused_node)];
}

std::vector<std::int32_t> fusion_groups(const Graph& g) {
  const Grouping gr = group_nodes(g, {});
  return {gr.group_of.begin(), gr.group_of.end()};
}

Graph fuse(const Graph& g, FusionReport* report, const FuseOptions& options) {
  const Grouping gr = group_nodes(g, options);
  const std::map<ValueRef, bool> outside = used_outside(g, gr);
  std::vector<BuiltGroup> built;
  for (int h = 0; h < static_cast<int>(gr.members.size()); ++h)
    built.push_back(build_group(g, gr, h, outside));

  // Units to emit: groups (ids 0..G-1) and the other nodes (G + node id).
  const int groups = static_cast<int>(gr.members.size());
  const int count = static_cast<int>(g.nodes().size());
  auto unit_of = [&](int node) {
    const int h = gr.group_of[static_cast<std::size_t>(node)];
    return h >= 0 ? h : groups + node;
  };
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(groups + count));
  std::vector<int> pending(static_cast<std::size_t>(groups + count), 0),
      first_node(static_cast<std::size_t>(groups + count), count);
  std::vector<char> exists(static_cast<std::size_t>(groups + count), 0);
  for (int id = 0; id < count; ++id) {
    const int u = unit_of(id);
    exists[static_cast<std::size_t>(u)] = 1;
    first_node[static_cast<std::size_t>(u)] = std::min(first_node[static_cast<std::size_t>(u)], id);
    if (u < groups) continue;  // a group's dependencies are its body's inputs (below)
    for (const ValueRef& in : g.node(id).inputs) {
      readers[static_cast<std::size_t>(unit_of(in.node))].push_back(u);
      ++pending[static_cast<std::size_t>(u)];
    }
  }
  for (int h = 0; h < groups; ++h)
    for (const ValueRef& in : built[static_cast<std::size_t>(h)].inputs) {
      readers[static_cast<std::size_t>(unit_of(in.node))].push_back(h);
      ++pending[static_cast<std::size_t>(h)];
    }

  Graph out;
  std::map<ValueRef, ValueRef> remap;
  auto new_ref = [&](const ValueRef& ref) { return remap.at(ref); };
  using Item = std::pair<int, int>;  // (first node, unit): emit in original order where possible
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  for (int u = 0; u < groups + count; ++u)
    if (exists[static_cast<std::size_t>(u)] && pending[static_cast<std::size_t>(u)] == 0)
      ready.emplace(first_node[static_cast<std::size_t>(u)], u);
  int emitted = 0;
  while (!ready.empty()) {
    const int u = ready.top().second;
    ready.pop();
    ++emitted;
    if (u < groups) {
      const BuiltGroup& b = built[static_cast<std::size_t>(u)];
      Node n{.op = &op_def("fused")};
      std::vector<TensorType> in_types;
      for (const ValueRef& in : b.inputs) {
        n.inputs.push_back(new_ref(in));
        in_types.push_back(g.type(in));
      }
      n.outputs = b.body->infer(in_types);
      n.body = b.body;
      const int id = out.add_node(std::move(n)).node;
      if (report) {
        FusionReport::Group entry{gr.members[static_cast<std::size_t>(u)], id};
        if (gr.tail[static_cast<std::size_t>(u)] >= 0)
          entry.members.push_back(gr.tail[static_cast<std::size_t>(u)]);
        for (int more : gr.more_tails[static_cast<std::size_t>(u)]) entry.members.push_back(more);
        report->groups.push_back(std::move(entry));
      }
      for (const auto& [ref, slot] : b.output_slot) remap[ref] = {id, slot};
    } else {
      Node n = g.node(u - groups);
      for (ValueRef& in : n.inputs) in = new_ref(in);
      const int id = out.add_node(std::move(n)).node;
      for (int i = 0; i < static_cast<int>(g.node(u - groups).outputs.size()); ++i)
        remap[{u - groups, i}] = {id, i};
    }
    for (int r : readers[static_cast<std::size_t>(u)])
      if (--pending[static_cast<std::size_t>(r)] == 0)
        ready.emplace(first_node[static_cast<std::size_t>(r)], r);
  }
  const int units = static_cast<int>(std::count(exists.begin(), exists.end(), 1));
  KILN_ASSERT(emitted == units, "fuse: groups form a cycle ({} of {} units emitted)", emitted,
              units);
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(new_ref(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(new_ref(ref)));
  return out;
}

}  // namespace kiln
