// The stage pass: repeatedly finds a group that reads a reduction group's rows and merges
// the two (fusion/stages.h), re-emitting the graph in a topological order each time.
#include "fusion/stages.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <queue>

#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "graph/op_table.h"

namespace kiln {
namespace {

bool reduced_axis(const std::vector<std::int64_t>& axes, std::size_t d) {
  return std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) != axes.end();
}

// The kept axes of `shape` that are not 1, in order.
std::vector<std::size_t> kept_axes(const Shape& shape, const std::vector<std::int64_t>& axes) {
  std::vector<std::size_t> kept;
  for (std::size_t d = 0; d < shape.rank(); ++d)
    if (shape[d] > 1 && !reduced_axis(axes, d)) kept.push_back(d);
  return kept;
}

bool same_strides(const Shape& shape, const std::vector<std::int64_t>& a,
                  const std::vector<std::int64_t>& b) {
  for (std::size_t d = 0; d < shape.rank(); ++d)
    if (shape[d] > 1 && a[d] != b[d]) return false;
  return true;
}

// The reduced axes shared by every reduction of `g`, where at most one run of adjacent
// non-1 axes is kept (a row is then one index of that run).
std::optional<std::vector<std::int64_t>> row_axes(const FusedGroup& g) {
  const std::vector<const FusedReduction*> reds = g.reductions();
  if (reds.empty()) return std::nullopt;
  for (const FusedReduction* r : reds)
    if (r->axes != reds[0]->axes) return std::nullopt;
  int runs = 0;
  bool previous_kept = false;
  for (std::size_t d = 0; d < g.shape.rank(); ++d) {
    if (g.shape[d] == 1) continue;
    const bool kept = !reduced_axis(reds[0]->axes, d);
    if (kept && !previous_kept) ++runs;
    previous_kept = kept;
  }
  if (runs > 1) return std::nullopt;
  return reds[0]->axes;
}

std::vector<std::int64_t> squeezed(const Shape& shape) {
  std::vector<std::int64_t> dims;
  for (std::size_t d = 0; d < shape.rank(); ++d)
    if (shape[d] > 1) dims.push_back(shape[d]);
  return dims;
}

// Whether node `from` depends on node `target` (node ids are a topological order).
bool depends_on(const Graph& g, int from, int target) {
  std::vector<char> seen(g.nodes().size(), 0);
  std::vector<int> stack = {from};
  while (!stack.empty()) {
    const int q = stack.back();
    stack.pop_back();
    if (q == target) return true;
    if (q < target || seen[static_cast<std::size_t>(q)]) continue;
    seen[static_cast<std::size_t>(q)] = 1;
    for (const ValueRef& in : g.node(q).inputs) stack.push_back(in.node);
  }
  return false;
}

struct Merge {
  std::shared_ptr<FusedGroup> body;
  std::vector<ValueRef> inputs;  // old-graph values, in the body's input order
  std::map<ValueRef, int> slot;  // old outputs of the two nodes -> merged output index
};

// The stage after every reduction an operand of `g` depends on (0: none).
int level(const FusedGroup& g, const std::vector<int>& instr_level, const Operand& op) {
  switch (op.kind) {
    case Operand::Kind::instr:
      return instr_level[static_cast<std::size_t>(op.index)];
    case Operand::Kind::reduced:
      return g.reductions()[static_cast<std::size_t>(op.index)]->stage + 1;
    case Operand::Kind::input:
    case Operand::Kind::constant:
      break;
  }
  return 0;
}

class Merger {
 public:
  Merger(const Graph& g, int p, int c, const StageOptions& options)
      : g_(g),
        p_(p),
        c_(c),
        options_(options),
        pn_(g.node(p)),
        cn_(g.node(c)),
        P_(*fused_group_of(pn_)),
        C_(*fused_group_of(cn_)) {}

  // The merged node, or nothing where the two do not merge.
  std::optional<Merge> run() {
    const std::optional<std::vector<std::int64_t>> axes = row_axes(P_);
    if (!axes || C_.compute != P_.compute || C_.staged()) return std::nullopt;
    axes_ = *axes;
    const bool same_shape = C_.shape == P_.shape;
    if (same_shape) {
      if (C_.reduction && row_axes(C_) != axes) return std::nullopt;
    } else {
      std::vector<std::int64_t> kept;
      for (std::size_t d : kept_axes(P_.shape, axes_)) kept.push_back(P_.shape[d]);
      if (C_.reduction || squeezed(C_.shape) != kept || !feeds_rows()) return std::nullopt;
    }
    m_.body = std::make_shared<FusedGroup>(P_);
    FusedGroup& m = *m_.body;
    m_.inputs = pn_.inputs;
    m.outputs.clear();
    const std::size_t p_outputs = P_.outputs.size(), p_reductions = P_.reductions().size();
    // P's elementwise outputs that something besides C reads stay outputs.
    for (std::size_t o = 0; o < p_outputs; ++o)
      if (read_elsewhere({p_, static_cast<std::int32_t>(o)})) {
        m_.slot[{p_, static_cast<std::int32_t>(o)}] = static_cast<int>(m.outputs.size());
        m.outputs.push_back(P_.outputs[o]);
      }
    std::vector<Operand> input_map;
    bool reads_p = false;
    for (std::size_t k = 0; k < C_.inputs.size(); ++k) {
      const ValueRef outer = cn_.inputs[k];
      const ValueRef source = alias_root(g_, outer);
      const FusedInput& in = C_.inputs[k];
      if (source.node != p_) {
        if (depends_on(g_, outer.node, p_)) return std::nullopt;  // merging would be a cycle
        if (!waited_for(outer)) return std::nullopt;
        input_map.push_back(outer_input(outer, same_shape ? in : lifted(in)));
        continue;
      }
      reads_p = true;
      const auto slot = static_cast<std::size_t>(source.index);
      if (slot < p_outputs) {  // an elementwise output: read at the same element
        if (!same_shape || in.offset != 0 || !in.contiguous(C_.shape)) return std::nullopt;
        input_map.push_back(P_.outputs[slot]);
        continue;
      }
      const bool at_row = same_shape
                              ? same_strides(C_.shape, in.strides, row_strides(P_.shape, axes_))
                              : in.contiguous(C_.shape);
      if (in.offset != 0 || !at_row) return std::nullopt;
      input_map.push_back(slot < p_outputs + p_reductions
                              ? Operand::reduced(static_cast<int>(slot - p_outputs))
                              : P_.row_outputs[slot - p_outputs - p_reductions].value);
    }
    if (!reads_p) return std::nullopt;
    // C's instructions, its operands renamed; then the levels they are at.
    const int instr_base = static_cast<int>(m.instrs.size());
    auto rename = [&](const Operand& op) {
      if (op.kind == Operand::Kind::input) return input_map[static_cast<std::size_t>(op.index)];
      if (op.kind == Operand::Kind::instr) return Operand::instr(instr_base + op.index);
      return op;
    };
    for (const FusedInstr& instr : C_.instrs) {
      FusedInstr copy = instr;
      for (Operand& a : copy.args) a = rename(a);
      m.instrs.push_back(std::move(copy));
    }
    std::vector<int> instr_level;
    for (const FusedInstr& instr : m.instrs) {
      int l = 0;
      for (const Operand& a : instr.args) l = std::max(l, level(m, instr_level, a));
      instr_level.push_back(l);
    }
    const std::size_t c_outputs = C_.outputs.size();
    if (same_shape) {
      for (std::size_t o = 0; o < c_outputs; ++o) {
        m_.slot[{c_, static_cast<std::int32_t>(o)}] = static_cast<int>(m.outputs.size());
        m.outputs.push_back(rename(C_.outputs[o]));
      }
      for (const FusedReduction* r : C_.reductions()) {
        FusedReduction copy = *r;
        copy.value = rename(r->value);
        copy.stage = level(m, instr_level, copy.value);
        m.more_reductions.push_back(std::move(copy));
      }
    } else {
      for (std::size_t o = 0; o < c_outputs; ++o)
        m.row_outputs.push_back(
            {rename(C_.outputs[o]), {C_.shape, C_.operand_dtype(C_.outputs[o])}});
    }
    const std::size_t outputs = m.outputs.size(), reductions = m.reductions().size();
    for (std::size_t r = 0; r < p_reductions; ++r)
      m_.slot[{p_, static_cast<std::int32_t>(p_outputs + r)}] = static_cast<int>(outputs + r);
    for (std::size_t w = 0; w < P_.row_outputs.size(); ++w)
      m_.slot[{p_, static_cast<std::int32_t>(p_outputs + p_reductions + w)}] =
          static_cast<int>(outputs + reductions + w);
    if (same_shape)
      for (std::size_t r = 0; r < C_.reductions().size(); ++r)
        m_.slot[{c_, static_cast<std::int32_t>(c_outputs + r)}] =
            static_cast<int>(outputs + p_reductions + r);
    else
      for (std::size_t o = 0; o < c_outputs; ++o)
        m_.slot[{c_, static_cast<std::int32_t>(o)}] =
            static_cast<int>(outputs + reductions + P_.row_outputs.size() + o);
    if (!allowed(m)) return std::nullopt;
    return std::move(m_);
  }

 private:
  bool read_elsewhere(ValueRef ref) const {
    for (const auto& [name, out] : g_.outputs())
      if (out == ref) return true;
    for (const auto& [var, out] : g_.assignments())
      if (out == ref) return true;
    for (int id = p_ + 1; id < static_cast<int>(g_.nodes().size()); ++id)
      if (id != c_)
        for (const ValueRef& in : g_.node(id).inputs)
          if (in == ref) return true;
    return false;
  }

  // Whether P already waits for `outer` (a graph input, a variable, or what P depends on):
  // merging never makes P wait for more. (A loss gradient's sum of the one-hot labels merged
  // with the division by the forward's sum of exponentials moved onto the critical path.)
  bool waited_for(ValueRef outer) const {
    const int node = alias_root(g_, outer).node;  // a view costs nothing: its value counts
    return g_.node(node).op->kind == OpKind::source || depends_on(g_, p_, node);
  }

  // Whether C may merge: a group over P's shape reads C's values (x - mean after mean = sum /
  // n), so that it can merge next, or C updates no variable (batch norm's weight gradient,
  // sum(dy * (x - k)) / sqrt(var + eps): one kernel fewer a layer). A row group that updates a
  // variable (an optimizer's update of a bias from its gradient's sum) stays apart: on the
  // H200 the merged updates left the horizontal launch and cost vgg 0.505 -> 0.518 ms, alexnet
  // 0.464 -> 0.484.
  bool feeds_rows() const {
    for (int id = c_ + 1; id < static_cast<int>(g_.nodes().size()); ++id) {
      const FusedGroup* reader = fused_group_of(g_.node(id));
      if (reader == nullptr || reader->shape != P_.shape) continue;
      for (const ValueRef& in : g_.node(id).inputs)
        if (alias_root(g_, in).node == c_) return true;
    }
    for (const auto& [var, out] : g_.assignments())
      if (alias_root(g_, out).node == c_) return false;
    return true;
  }

  // C's input over C's (row) shape, read over P's shape: the same element at every row index.
  FusedInput lifted(const FusedInput& in) const {
    FusedInput out = in;
    out.strides.assign(P_.shape.rank(), 0);
    const std::vector<std::size_t> kept = kept_axes(P_.shape, axes_);
    std::size_t next = 0;
    for (std::size_t d = 0; d < C_.shape.rank(); ++d)
      if (C_.shape[d] > 1) out.strides[kept[next++]] = in.strides[d];
    return out;
  }

  Operand outer_input(ValueRef outer, const FusedInput& in) {
    FusedGroup& m = *m_.body;
    for (std::size_t k = 0; k < m_.inputs.size(); ++k)
      if (m_.inputs[k] == outer && m.inputs[k].strides == in.strides &&
          m.inputs[k].offset == in.offset)
        return Operand::input(static_cast<int>(k));
    m_.inputs.push_back(outer);
    m.inputs.push_back(in);
    return Operand::input(static_cast<int>(m.inputs.size() - 1));
  }

  bool allowed(const FusedGroup& m) const {
    const std::int64_t rows = m.reduction->type.shape.numel();
    const std::int64_t elements = m.shape.numel();
    if (elements / std::max<std::int64_t>(1, rows) > options_.max_row_elements)
      return options_.finish_row_outputs && m.rows_finish_only();
    return rows >= options_.min_rows || elements <= options_.small_elements;
  }

  const Graph& g_;
  int p_, c_;
  const StageOptions& options_;
  const Node &pn_, &cn_;
  const FusedGroup &P_, &C_;
  std::vector<std::int64_t> axes_;
  Merge m_;
};

// The graph with nodes p and c replaced by the merged node, in a topological order that keeps
// the old order where it can.
Graph rebuild(const Graph& g, int p, int c, const Merge& merge, std::vector<int>& new_id) {
  new_id.assign(g.nodes().size(), -1);
  const int count = static_cast<int>(g.nodes().size());
  auto unit = [&](int id) { return id == c ? p : id; };
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(count));
  std::vector<int> pending(static_cast<std::size_t>(count), 0);
  for (int id = 0; id < count; ++id) {
    if (id == c) continue;
    for (const ValueRef& in : id == p ? merge.inputs : g.node(id).inputs) {
      readers[static_cast<std::size_t>(unit(in.node))].push_back(id);
      ++pending[static_cast<std::size_t>(id)];
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (int id = 0; id < count; ++id)
    if (id != c && pending[static_cast<std::size_t>(id)] == 0) ready.push(id);
  Graph out;
  std::map<ValueRef, ValueRef> remap;
  int emitted = 0;
  while (!ready.empty()) {
    const int id = ready.top();
    ready.pop();
    ++emitted;
    if (id == p) {
      Node n{.op = &op_def("fused")};
      std::vector<TensorType> types;
      for (const ValueRef& in : merge.inputs) {
        n.inputs.push_back(remap.at(in));
        types.push_back(g.type(in));
      }
      n.outputs = merge.body->infer(types);
      n.body = merge.body;
      const int made = out.add_node(std::move(n)).node;
      new_id[static_cast<std::size_t>(p)] = new_id[static_cast<std::size_t>(c)] = made;
      for (const auto& [old, slot] : merge.slot) remap[old] = {made, slot};
    } else {
      Node n = g.node(id);
      for (ValueRef& in : n.inputs) in = remap.at(in);
      const int made = out.add_node(std::move(n)).node;
      new_id[static_cast<std::size_t>(id)] = made;
      for (int i = 0; i < static_cast<int>(g.node(id).outputs.size()); ++i)
        remap[{id, i}] = {made, i};
    }
    for (int r : readers[static_cast<std::size_t>(id)])
      if (--pending[static_cast<std::size_t>(r)] == 0) ready.push(r);
  }
  KILN_ASSERT(emitted == count - 1, "stage_reductions: a cycle ({} of {} nodes emitted)", emitted,
              count - 1);
  for (const auto& [name, ref] : g.outputs()) out.output(name, out.value(remap.at(ref)));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, out.value(remap.at(ref)));
  return out;
}

// The report's groups after a merge of node p's and c's groups (new_id: old node -> new).
void update_report(FusionReport& report, int p, int c, const std::vector<int>& new_id) {
  std::vector<FusionReport::Group> groups;
  std::size_t merged = report.groups.size();  // the index in `groups` of the merged entry
  for (FusionReport::Group& entry : report.groups) {
    const int old = entry.fused_node;
    if (old == p || old == c) {
      if (merged < groups.size()) {
        auto& members = groups[merged].members;
        members.insert(members.end(), entry.members.begin(), entry.members.end());
        continue;
      }
      merged = groups.size();
      groups.push_back(std::move(entry));
    } else {
      groups.push_back(std::move(entry));
    }
    groups.back().fused_node = new_id[static_cast<std::size_t>(old)];
  }
  report.groups = std::move(groups);
}

// The first merge in node order, applied; nothing when none is left.
std::optional<Graph> merge_once(const Graph& g, const StageOptions& options, FusionReport* report) {
  for (int c = 0; c < static_cast<int>(g.nodes().size()); ++c) {
    if (!fused_group_of(g.node(c))) continue;
    std::vector<int> tried;
    for (const ValueRef& in : g.node(c).inputs) {
      const int p = alias_root(g, in).node;
      if (p == c || !fused_group_of(g.node(p)) ||
          std::find(tried.begin(), tried.end(), p) != tried.end())
        continue;
      tried.push_back(p);
      if (std::optional<Merge> m = Merger(g, p, c, options).run()) {
        std::vector<int> new_id;
        Graph merged = rebuild(g, p, c, *m, new_id);
        if (report) update_report(*report, p, c, new_id);
        return merged;
      }
    }
  }
  return std::nullopt;
}

bool turned_off() {
  const char* v = std::getenv("KILN_STAGES");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

// Rows past 1024 elements were slower on the CPU: resnet b64 at 2 threads 100-104 ms with
// rows to 1024 against 128-130 with every row length (a pass recomputes what the passes
// before it computed); the same bound on the GPU, where a block takes a row.
StageOptions cpu_stage_options() {
  return {.max_row_elements = 1024, .min_rows = 8, .small_elements = 1 << 16};
}

// The GPU's batch norm over long rows (resnet18's channels: 2048 to 131072 elements at b128)
// computes its per-channel values (the mean, the scale, the running statistics) in the
// statistics' finisher, one launch fewer each way a layer.
StageOptions cuda_stage_options() { return {.max_row_elements = 1024, .finish_row_outputs = true}; }

Graph stage_reductions(const Graph& fused, const StageOptions& options, FusionReport* report) {
  Graph g = fused;
  if (turned_off()) return g;
  while (std::optional<Graph> next = merge_once(g, options, report)) g = std::move(*next);
  return g;
}

}  // namespace kiln
