// Two walks: the outputs to make again (their instructions, leaves and readers, by the bytes
// they save), then the graph copied with each reader's body given the instructions at its front
// and the producers' bodies without those outputs.
#include "fusion/rematerialize.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/dtype.h"
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

// The most instructions a reader makes again for one output (their work is the reader's);
// KILN_REMATERIALIZE_INSTRS=N sets it (1: one instruction, as the pass first did; for measuring).
std::size_t most_instrs() {
  static const auto most = static_cast<std::size_t>(env_integer(
      "KILN_REMATERIALIZE_INSTRS", 32, 1, 1024, "a count of instructions from 1 to 1024"));
  return most;
}

// A value an output's instructions load: an input of its group, or another output it stores.
struct Leaf {
  ValueRef ref;
  FusedInput read;  // over the group's shape
};

bool reads_alike(const FusedInput& a, const FusedInput& b) {
  return a.strides == b.strides && a.offset == b.offset;
}

// How a reader over the group's shape loads the group's stored output `stored`: element i at i.
FusedInput stored_read(const FusedGroup& g, int stored) {
  return {{g.shape, g.operand_dtype(g.outputs[static_cast<std::size_t>(stored)])},
          g.shape.strides(),
          0};
}

// What makes output o of group node `id` again: its instruction and those under it (ascending;
// the output's last) down to the group's inputs, constants and other stored outputs (which it
// loads: `leaves`), or nothing where one reads a reduction or there are too many; `saved`: the
// bytes the step saves by making it again (Remaker::remakeable).
struct Cone {
  std::vector<int> instrs;
  std::vector<Leaf> leaves;
  std::int64_t saved = 0;
};
std::optional<Cone> cone_of(const Node& n, std::int32_t id, const FusedGroup& g, std::size_t o) {
  std::set<int> taken;
  std::vector<int> stack{g.outputs[o].index};
  while (!stack.empty()) {
    const int i = stack.back();
    stack.pop_back();
    if (!taken.insert(i).second) continue;
    if (taken.size() > most_instrs()) return std::nullopt;
    for (const Operand& a : g.instrs[static_cast<std::size_t>(i)].args) {
      if (a.kind == Operand::Kind::reduced) return std::nullopt;
      if (a.kind == Operand::Kind::instr && output_of_instr(g, a.index, o) < 0)
        stack.push_back(a.index);
    }
  }
  Cone cone{{taken.begin(), taken.end()}, {}};
  auto add = [&](const ValueRef& ref, const FusedInput& read) {
    for (const Leaf& l : cone.leaves)
      if (l.ref == ref && reads_alike(l.read, read)) return;
    cone.leaves.push_back({ref, read});
  };
  for (int i : cone.instrs)
    for (const Operand& a : g.instrs[static_cast<std::size_t>(i)].args) {
      const auto j = static_cast<std::size_t>(a.index);
      if (a.kind == Operand::Kind::input) {
        add(n.inputs[j], g.inputs[j]);
      } else if (a.kind == Operand::Kind::instr && !taken.count(a.index)) {
        const int stored = output_of_instr(g, a.index, o);
        add({id, stored}, stored_read(g, stored));
      }
    }
  return cone;
}

// The bytes group output o takes stored.
std::int64_t stored_bytes(const FusedGroup& g, std::size_t o) {
  return g.shape.numel() * static_cast<std::int64_t>(dtype_size(g.operand_dtype(g.outputs[o])));
}

std::int64_t bytes_of(const FusedInput& read, const Shape& shape) {
  return read.elements_read(shape) * static_cast<std::int64_t>(dtype_size(read.type.dtype));
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
    // The candidates, those that save the most bytes first; one is taken where it loads no
    // value taken before it and none taken before it loads it (its readers would have nothing
    // stored to make it from).
    std::vector<std::pair<ValueRef, Cone>> candidates;
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id)
      if (const FusedGroup* group = fused_group_of(g.node(id)))
        for (std::size_t o = 0; o < group->outputs.size(); ++o)
          if (std::optional<Cone> cone = remakeable(id, *group, o))
            candidates.emplace_back(ValueRef{id, static_cast<std::int32_t>(o)}, std::move(*cone));
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) { return a.second.saved > b.second.saved; });
    std::set<ValueRef> loaded;  // what the taken ones load
    for (auto& [ref, cone] : candidates) {
      bool free = !loaded.count(ref);
      for (const Leaf& l : cone.leaves) free = free && !chosen(l.ref);
      if (!free) continue;
      for (const Leaf& l : cone.leaves) loaded.insert(l.ref);
      chosen_.emplace(ref, std::move(cone));
    }
    // Then the outputs that stay stored: a reader that loads their cone's leaves anyway makes
    // one itself instead of loading it (KILN_REMATERIALIZE_LOCAL=0: every reader loads it).
    if (env_switch_on("KILN_REMATERIALIZE_LOCAL"))
      for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id)
        if (const FusedGroup* group = fused_group_of(g.node(id)))
          for (std::size_t o = 0; o < group->outputs.size(); ++o) take_local(id, *group, o);
  }

  bool any() const { return !chosen_.empty() || !local_.empty(); }
  bool chosen(const ValueRef& ref) const { return chosen_.count(ref) != 0; }

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
      const Cone* found = cone_for(id, k, n.inputs[k]);
      if (found == nullptr) continue;
      any = true;
      dropped[k] = 1;
      const Node& producer = g_.node(n.inputs[k].node);
      const FusedGroup& from = *fused_group_of(producer);
      const auto o = static_cast<std::size_t>(n.inputs[k].index);
      const std::vector<int>& cone = found->instrs;
      std::map<int, int> at;  // the producer's instruction -> its place at the body's front
      for (std::size_t i = 0; i < cone.size(); ++i) at[cone[i]] = static_cast<int>(i);
      std::vector<FusedInstr> made;
      for (int index : cone) {
        FusedInstr instr = from.instrs[static_cast<std::size_t>(index)];
        for (Operand& a : instr.args) {
          if (a.kind == Operand::Kind::input) {
            const auto j = static_cast<std::size_t>(a.index);
            a = input_for(*body, inputs, dropped, producer.inputs[j], from.inputs[j]);
          } else if (a.kind == Operand::Kind::instr && at.count(a.index)) {
            a = Operand::instr(at.at(a.index));
          } else if (a.kind == Operand::Kind::instr) {
            const int stored = output_of_instr(from, a.index, o);
            a = input_for(*body, inputs, dropped, {n.inputs[k].node, stored},
                          stored_read(from, stored));
          }
        }
        made.push_back(std::move(instr));
      }
      const int shift = static_cast<int>(made.size());
      for_each_operand(*body, [&](Operand& a) {
        if (a.kind == Operand::Kind::instr) a.index += shift;
        if (same(a, Operand::input(static_cast<int>(k)))) a = Operand::instr(shift - 1);
      });
      body->instrs.insert(body->instrs.begin(), std::make_move_iterator(made.begin()),
                          std::make_move_iterator(made.end()));
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
  // What input k of node `id` (value `ref`) is made from where it is made again there.
  const Cone* cone_for(std::int32_t id, std::size_t k, const ValueRef& ref) const {
    if (const auto it = chosen_.find(ref); it != chosen_.end()) return &it->second;
    if (const auto it = local_.find({id, k}); it != local_.end()) return &it->second;
    return nullptr;
  }

  // Whether group node `reader` can make input k (output o of group node `id`) itself: a group
  // over the same shape and compute type that loads it element i at i.
  bool can_make(std::int32_t reader, std::size_t k, std::int32_t id,
                const FusedGroup& group) const {
    const FusedGroup* other = fused_group_of(g_.node(reader));
    if (other == nullptr || reader == id || other->shape != group.shape ||
        other->compute != group.compute)
      return false;
    const FusedInput& in = other->inputs[k];
    return in.offset == 0 && in.contiguous(other->shape);
  }

  // The bytes of the cone's leaves that `reader` does not load already.
  std::int64_t unloaded_leaf_bytes(std::int32_t reader, const Cone& cone,
                                   const Shape& shape) const {
    const Node& reader_node = g_.node(reader);
    const FusedGroup& other = *fused_group_of(reader_node);
    std::int64_t bytes = 0;
    for (const Leaf& l : cone.leaves) {
      bool loaded = false;
      for (std::size_t j = 0; j < reader_node.inputs.size(); ++j)
        loaded = loaded || (reader_node.inputs[j] == l.ref && reads_alike(other.inputs[j], l.read));
      if (!loaded) bytes += bytes_of(l.read, shape);
    }
    return bytes;
  }

  // Output o of group node `id` stays stored; each reader that can make it and loads its
  // cone's leaves but fewer bytes' worth than it makes it instead (a downsampling block's
  // backward sums load the block's output and the two convolutions' outputs it is made from).
  void take_local(std::int32_t id, const FusedGroup& group, std::size_t o) {
    const ValueRef ref{id, static_cast<std::int32_t>(o)};
    if (chosen(ref) || group.output_channels_last(o) ||
        group.outputs[o].kind != Operand::Kind::instr)
      return;
    const auto it = readers_by_value_.find(ref);
    if (it == readers_by_value_.end()) return;
    const std::optional<Cone> cone = cone_of(g_.node(id), id, group, o);
    if (!cone) return;
    for (const Leaf& l : cone->leaves)
      if (chosen(l.ref)) return;  // no longer stored
    const std::int64_t stored = stored_bytes(group, o);
    for (const auto& [reader, k] : it->second)
      if (can_make(reader, k, id, group) && !remakes_from(reader, ref) &&
          unloaded_leaf_bytes(reader, *cone, group.shape) < stored)
        local_.emplace(std::pair{reader, k}, *cone);
  }

  // Whether `reader` makes a chosen output again from `ref` (so that it loads it anyway).
  bool remakes_from(std::int32_t reader, const ValueRef& ref) const {
    for (const ValueRef& in : g_.node(reader).inputs)
      if (const auto it = chosen_.find(in); it != chosen_.end())
        for (const Leaf& l : it->second.leaves)
          if (l.ref == ref) return true;
    return false;
  }

  // Output o of group node `id`'s cone, where each of its readers can make it again and the
  // step moves fewer bytes so (Cone::saved: the producer stops writing it and each reader stops
  // loading it, and each reader loads the cone's leaves that it does not load already).
  std::optional<Cone> remakeable(std::int32_t id, const FusedGroup& group, std::size_t o) const {
    const ValueRef ref{id, static_cast<std::int32_t>(o)};
    if (group.output_channels_last(o) || group.outputs[o].kind != Operand::Kind::instr ||
        roots_.count(ref))
      return std::nullopt;
    const auto it = readers_by_value_.find(ref);
    if (it == readers_by_value_.end()) return std::nullopt;
    std::optional<Cone> cone = cone_of(g_.node(id), id, group, o);
    if (!cone) return std::nullopt;
    const std::int64_t stored = stored_bytes(group, o);
    std::int64_t& saved = cone->saved;
    saved = stored;
    for (const auto& [reader, k] : it->second) {
      if (!can_make(reader, k, id, group)) return std::nullopt;
      saved += stored - unloaded_leaf_bytes(reader, *cone, group.shape);
    }
    if (saved <= 0) return std::nullopt;
    return cone;
  }

  // The body's input for outer value `ref` read as `want` reads it: an existing one (not one
  // being dropped), or a new one appended to the body and to `inputs`.
  static Operand input_for(FusedGroup& body, std::vector<ValueRef>& inputs,
                           std::vector<char>& dropped, const ValueRef& ref,
                           const FusedInput& want) {
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k] == ref && !(k < dropped.size() && dropped[k]) &&
          reads_alike(body.inputs[k], want))
        return Operand::input(static_cast<int>(k));
    body.inputs.push_back(want);
    inputs.push_back(ref);
    return Operand::input(static_cast<int>(body.inputs.size() - 1));
  }

  const Graph& g_;
  std::map<ValueRef, std::vector<std::pair<std::int32_t, std::size_t>>> readers_by_value_;
  std::set<ValueRef> roots_;
  std::map<ValueRef, Cone> chosen_;
  std::map<std::pair<std::int32_t, std::size_t>, Cone> local_;  // (reader, input) -> its cone
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
