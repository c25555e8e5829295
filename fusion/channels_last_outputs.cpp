// One walk over the nodes: a group with transposes to fold is re-made with its channels-last
// outputs after the [B, C, H, W] ones that are still read, and the transposes' readers read those.
#include "fusion/channels_last_outputs.h"

#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "core/env_switch.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// The group whose output `ref` is, where a channels-last copy of it can join that group.
const FusedGroup* foldable(const Graph& g, ValueRef ref, bool any_shape) {
  const FusedGroup* group = fused_group_of(g.node(ref.node));
  if (group == nullptr || group->reduction || !group->row_outputs.empty() ||
      group->shape.rank() != 4 || static_cast<std::size_t>(ref.index) >= group->outputs.size() ||
      group->output_channels_last(static_cast<std::size_t>(ref.index)))
    return nullptr;
  const Shape& s = group->shape;
  const bool vectors = is_low_precision(g.type(ref).dtype) && s[1] % 8 == 0 && s[2] * s[3] % 8 == 0;
  return any_shape || vectors ? group : nullptr;
}

bool folds(const Graph& g, const Node& n, bool any_shape) {
  return n.op->id == OpId::transpose && n.attrs.integers("perm") == kChannelsLast &&
         foldable(g, n.inputs[0], any_shape) != nullptr;
}

// Whether transpose `id` is a dy copy of the layout pass: to channels-last, read only by input or
// weight gradients as their dy (`readers`: its readers, once each), not a graph root.
bool dy_copy(const Graph& g, int id, const std::vector<int>& readers, bool root) {
  const Node& n = g.node(id);
  if (n.op->id != OpId::transpose || n.attrs.integers("perm") != kChannelsLast || root ||
      readers.empty())
    return false;
  for (int r : readers) {
    const Node& reader = g.node(r);
    const std::size_t dy = reader.op->id == OpId::conv2d_grad_input    ? 0
                           : reader.op->id == OpId::conv2d_grad_weight ? 1
                                                                       : 2;
    if (dy == 2 || !conv_y_channels_last(reader.attrs)) return false;
    for (std::size_t k = 0; k < reader.inputs.size(); ++k)
      if (reader.inputs[k].node == id && k != dy) return false;
  }
  return true;
}

}  // namespace

Graph fold_channels_last_outputs(const Graph& fused, FusionReport* report, bool any_shape) {
  if (!env_switch_on("KILN_CHANNELS_LAST_OUTPUTS")) return fused;
  const int count = static_cast<int>(fused.nodes().size());
  // Per value: its reading nodes (once each) and whether it is a graph root; the transposes
  // that fold into its group; how many readers it keeps besides them.
  std::map<ValueRef, std::vector<int>> readers;
  std::set<ValueRef> roots;
  for (int id = 0; id < count; ++id)
    for (const ValueRef& in : fused.node(id).inputs) {
      auto& r = readers[in];
      if (r.empty() || r.back() != id) r.push_back(id);
    }
  for (const auto& [name, ref] : fused.outputs()) roots.insert(ref);
  for (const auto& [var, ref] : fused.assignments()) roots.insert(ref);
  std::map<ValueRef, std::vector<int>> copies;
  std::map<ValueRef, int> other_readers;
  for (const auto& [value, nodes] : readers)
    for (int r : nodes)
      if (folds(fused, fused.node(r), any_shape))
        copies[value].push_back(r);
      else
        ++other_readers[value];
  for (const ValueRef& ref : roots) ++other_readers[ref];
  // A dy copy that does not fold is undone: its gradients read the [B, C, H, W] dy again, and the
  // input gradient's pass copies it itself (faster than the node: resnet18 bf16 b512 7.12
  // against 6.92 ms on an H100, session 32).
  std::vector<char> undone(static_cast<std::size_t>(count), 0);
  bool any_undone = false;
  for (int id = 0; id < count; ++id) {
    const ValueRef copy{id, 0};
    const auto it = readers.find(copy);
    if (!folds(fused, fused.node(id), any_shape) &&
        dy_copy(fused, id, it == readers.end() ? std::vector<int>{} : it->second,
                roots.count(copy) != 0))
      any_undone = (undone[static_cast<std::size_t>(id)] = 1) != 0;
  }
  if (copies.empty() && !any_undone) return fused;

  Graph out;
  std::map<ValueRef, ValueRef> remap;
  std::vector<int> new_id(static_cast<std::size_t>(count), -1);
  for (int id = 0; id < count; ++id) {
    const Node& n = fused.node(id);
    if (folds(fused, n, any_shape))
      continue;  // its readers read the group's new output (remapped below)
    if (undone[static_cast<std::size_t>(id)]) {
      remap[{id, 0}] = remap.at(n.inputs[0]);
      continue;
    }
    Node copy = n;
    for (std::size_t k = 0; k < copy.inputs.size(); ++k) {
      if (undone[static_cast<std::size_t>(n.inputs[k].node)])
        unmark_conv_y_channels_last(copy.attrs);
      copy.inputs[k] = remap.at(n.inputs[k]);
    }
    const FusedGroup* group = fused_group_of(n);
    std::vector<std::pair<ValueRef, int>> slots;  // (old value, new output index)
    if (group != nullptr) {
      bool any = false;
      for (std::size_t o = 0; o < group->outputs.size(); ++o)
        any = any || copies.count({id, static_cast<std::int32_t>(o)});
      if (any) {
        auto body = std::make_shared<FusedGroup>(*group);
        body->outputs.clear();
        body->channels_last.clear();
        for (std::size_t o = 0; o < group->outputs.size(); ++o) {
          const ValueRef value{id, static_cast<std::int32_t>(o)};
          if (!copies.count(value) || other_readers[value] > 0) {
            slots.emplace_back(value, static_cast<int>(body->outputs.size()));
            body->outputs.push_back(group->outputs[o]);
            body->channels_last.push_back(0);
          }
        }
        for (std::size_t o = 0; o < group->outputs.size(); ++o) {
          const auto it = copies.find({id, static_cast<std::int32_t>(o)});
          if (it == copies.end()) continue;
          for (int transpose : it->second)
            slots.emplace_back(ValueRef{transpose, 0}, static_cast<int>(body->outputs.size()));
          body->outputs.push_back(group->outputs[o]);
          body->channels_last.push_back(1);
        }
        std::vector<TensorType> in_types;
        for (const ValueRef& in : n.inputs) in_types.push_back(fused.type(in));
        copy.outputs = body->infer(in_types);
        copy.body = std::move(body);
      }
    }
    const ValueRef made = out.add_node(std::move(copy));
    new_id[static_cast<std::size_t>(id)] = made.node;
    if (!slots.empty()) {
      for (const auto& [value, slot] : slots) remap[value] = {made.node, slot};
      continue;
    }
    for (int i = 0; i < static_cast<int>(n.outputs.size()); ++i) remap[{id, i}] = {made.node, i};
  }
  finish_copy(fused, out, remap, new_id, report);
  return out;
}

}  // namespace kiln
