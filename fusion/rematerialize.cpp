// Two walks: the outputs to make again (their instruction's operands, their readers), then the
// graph copied with each reader's body given the instruction and the producers' bodies without
// those outputs.
#include "fusion/rematerialize.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "core/env_switch.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"

namespace kiln {
namespace {

// Applies `f` to every operand of the group's instructions, outputs, reductions and row outputs.
template <class F>
void for_each_operand(FusedGroup& g, F&& f) {
  for (FusedInstr& i : g.instrs)
    for (Operand& a : i.args) f(a);
  for (Operand& o : g.outputs) f(o);
  if (g.reduction) f(g.reduction->value);
  for (FusedReduction& r : g.more_reductions) f(r.value);
  for (RowOutput& w : g.row_outputs) f(w.value);
}

bool same(const Operand& a, const Operand& b) { return a.kind == b.kind && a.index == b.index; }

// The output of `g` (not channels-last) that is instruction `index`, other than `except`; -1.
int output_of_instr(const FusedGroup& g, int index, std::size_t except) {
  for (std::size_t o = 0; o < g.outputs.size(); ++o)
    if (o != except && !g.output_channels_last(o) && same(g.outputs[o], Operand::instr(index)))
      return static_cast<int>(o);
  return -1;
}

class Remaker {
 public:
  explicit Remaker(const Graph& g) : g_(g) {
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
      const Node& n = g.node(id);
      for (std::size_t k = 0; k < n.inputs.size(); ++k)
        readers_by_value_[n.inputs[k]].push_back({id, k});
    }
    for (const auto& [name, ref] : g.outputs()) roots_.insert(ref);
    for (const auto& [var, ref] : g.assignments()) roots_.insert(ref);
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id)
      if (const FusedGroup* group = fused_group_of(g.node(id)))
        for (std::size_t o = 0; o < group->outputs.size(); ++o)
          if (remakeable(id, *group, o)) chosen_.insert({id, static_cast<std::int32_t>(o)});
    // An output whose instruction reads a chosen value (another output of its group, or an
    // input that another group stops storing) stays stored: its readers would have nothing
    // stored to make it from. Until none is left.
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = chosen_.begin(); it != chosen_.end();) {
        const Node& producer = g.node(it->node);
        const FusedGroup& group = *fused_group_of(producer);
        const auto o = static_cast<std::size_t>(it->index);
        bool reads_chosen = false;
        for (const Operand& a : instr_of(group, o).args)
          reads_chosen = reads_chosen ||
                         (a.kind == Operand::Kind::instr &&
                          chosen_.count({it->node, output_of_instr(group, a.index, o)})) ||
                         (a.kind == Operand::Kind::input &&
                          chosen_.count(producer.inputs[static_cast<std::size_t>(a.index)]));
        changed = changed || reads_chosen;
        it = reads_chosen ? chosen_.erase(it) : std::next(it);
      }
    }
  }

  bool any() const { return !chosen_.empty(); }
  bool chosen(const ValueRef& ref) const { return chosen_.count(ref) != 0; }

  static const FusedInstr& instr_of(const FusedGroup& g, std::size_t o) {
    return g.instrs[static_cast<std::size_t>(g.outputs[o].index)];
  }

  // Node `id`'s body with each chosen input made in it instead (its input list `inputs`, old
  // refs, updated alike), or nullptr where it reads none.
  std::shared_ptr<FusedGroup> remade_in(std::int32_t id, std::vector<ValueRef>& inputs) const {
    const Node& n = g_.node(id);
    const FusedGroup* group = fused_group_of(n);
    if (group == nullptr) return nullptr;
    auto body = std::make_shared<FusedGroup>(*group);
    std::vector<char> dropped(n.inputs.size(), 0);
    bool any = false;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (!chosen(n.inputs[k])) continue;
      any = true;
      dropped[k] = 1;
      const Node& producer = g_.node(n.inputs[k].node);
      const FusedGroup& from = *fused_group_of(producer);
      const auto o = static_cast<std::size_t>(n.inputs[k].index);
      FusedInstr made = instr_of(from, o);
      for (Operand& a : made.args) {
        if (a.kind == Operand::Kind::input) {
          const auto j = static_cast<std::size_t>(a.index);
          a = input_for(*body, inputs, dropped, producer.inputs[j], from.inputs[j]);
        } else if (a.kind == Operand::Kind::instr) {
          const int stored = output_of_instr(from, a.index, o);
          const TensorType t{from.shape,
                             from.operand_dtype(from.outputs[static_cast<std::size_t>(stored)])};
          a = input_for(*body, inputs, dropped, {n.inputs[k].node, stored},
                        {t, from.shape.strides(), 0});
        }
      }
      for_each_operand(*body, [&](Operand& a) {
        if (a.kind == Operand::Kind::instr) ++a.index;
        if (same(a, Operand::input(static_cast<int>(k)))) a = Operand::instr(0);
      });
      body->instrs.insert(body->instrs.begin(), std::move(made));
    }
    if (!any) return nullptr;
    std::vector<int> renumber(inputs.size(), -1);
    std::vector<FusedInput> kept_inputs;
    std::vector<ValueRef> kept_refs;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (k < dropped.size() && dropped[k]) continue;
      renumber[k] = static_cast<int>(kept_inputs.size());
      kept_inputs.push_back(body->inputs[k]);
      kept_refs.push_back(inputs[k]);
    }
    for_each_operand(*body, [&](Operand& a) {
      if (a.kind == Operand::Kind::input) a.index = renumber[static_cast<std::size_t>(a.index)];
    });
    body->inputs = std::move(kept_inputs);
    inputs = std::move(kept_refs);
    return body;
  }

 private:
  // Whether output o of group node `id` can be made again in each of its readers.
  bool remakeable(std::int32_t id, const FusedGroup& group, std::size_t o) const {
    const ValueRef ref{id, static_cast<std::int32_t>(o)};
    if (group.output_channels_last(o) || group.outputs[o].kind != Operand::Kind::instr ||
        roots_.count(ref))
      return false;
    for (const Operand& a : instr_of(group, o).args)
      if (a.kind == Operand::Kind::reduced ||
          (a.kind == Operand::Kind::instr && output_of_instr(group, a.index, o) < 0))
        return false;
    const auto it = readers_by_value_.find(ref);
    if (it == readers_by_value_.end()) return false;
    for (const auto& [reader, k] : it->second) {
      const FusedGroup* other = fused_group_of(g_.node(reader));
      if (other == nullptr || reader == id || other->shape != group.shape) return false;
      const FusedInput& in = other->inputs[k];
      if (in.offset != 0 || !in.contiguous(other->shape)) return false;
    }
    return true;
  }

  // The body's input for outer value `ref` read as `want` reads it: an existing one (not one
  // being dropped), or a new one appended to the body and to `inputs`.
  static Operand input_for(FusedGroup& body, std::vector<ValueRef>& inputs,
                           std::vector<char>& dropped, const ValueRef& ref,
                           const FusedInput& want) {
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k] == ref && !(k < dropped.size() && dropped[k]) &&
          body.inputs[k].strides == want.strides && body.inputs[k].offset == want.offset)
        return Operand::input(static_cast<int>(k));
    body.inputs.push_back(want);
    inputs.push_back(ref);
    return Operand::input(static_cast<int>(body.inputs.size() - 1));
  }

  const Graph& g_;
  std::map<ValueRef, std::vector<std::pair<std::int32_t, std::size_t>>> readers_by_value_;
  std::set<ValueRef> roots_;
  std::set<ValueRef> chosen_;
};

}  // namespace

Graph rematerialize_outputs(const Graph& fused, FusionReport* report) {
  if (!env_switch_on("KILN_REMATERIALIZE")) return fused;
  const Remaker remaker(fused);
  if (!remaker.any()) return fused;
  const int count = static_cast<int>(fused.nodes().size());
  Graph out;
  std::map<ValueRef, ValueRef> remap;
  std::vector<int> new_id(static_cast<std::size_t>(count), -1);
  for (int id = 0; id < count; ++id) {
    const Node& n = fused.node(id);
    Node copy = n;
    std::vector<ValueRef> inputs = n.inputs;
    std::shared_ptr<FusedGroup> body = remaker.remade_in(id, inputs);
    // The producer's side: its chosen outputs dropped, the later outputs renumbered.
    std::vector<int> slot(n.outputs.size());
    int next = 0;
    const FusedGroup* group = fused_group_of(n);
    for (std::size_t o = 0; o < n.outputs.size(); ++o)
      slot[o] = remaker.chosen({id, static_cast<std::int32_t>(o)}) ? -1 : next++;
    if (group != nullptr && next < static_cast<int>(n.outputs.size())) {
      if (!body) body = std::make_shared<FusedGroup>(*group);
      for (std::size_t o = body->outputs.size(); o-- > 0;) {
        if (slot[o] >= 0) continue;
        body->outputs.erase(body->outputs.begin() + static_cast<std::ptrdiff_t>(o));
        if (o < body->channels_last.size())
          body->channels_last.erase(body->channels_last.begin() + static_cast<std::ptrdiff_t>(o));
      }
    }
    copy.inputs.clear();
    std::vector<TensorType> in_types;
    for (const ValueRef& in : inputs) {
      copy.inputs.push_back(remap.at(in));
      in_types.push_back(fused.type(in));
    }
    if (body) {
      copy.outputs = body->infer(in_types);
      copy.body = std::move(body);
    }
    const ValueRef made = out.add_node(std::move(copy));
    new_id[static_cast<std::size_t>(id)] = made.node;
    for (std::size_t o = 0; o < n.outputs.size(); ++o)
      if (slot[o] >= 0) remap[{id, static_cast<std::int32_t>(o)}] = {made.node, slot[o]};
  }
  finish_copy(fused, out, remap, new_id, report);
  return out;
}

}  // namespace kiln
