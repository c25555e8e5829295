// Liveness over the node order, then best-fit reuse of freed slots, then the slots laid
// out in one arena.
#include "backends/plan.h"

#include <algorithm>
#include <numeric>

#include "graph/op.h"

namespace kiln {
ValueRef alias_root(const Graph& g, ValueRef ref) {
  while (g.node(ref.node).op->alias) ref = g.node(ref.node).inputs[0];
  return ref;
}

namespace {

// Index of the last node that reads each root value (node count for values live to the end);
// a read by a node that runs later (`position`) counts there.
std::map<ValueRef, std::int32_t> last_uses(const Graph& g,
                                           const std::vector<std::int32_t>& position) {
  std::map<ValueRef, std::int32_t> last;
  const auto end = static_cast<std::int32_t>(g.nodes().size());
  for (std::int32_t id = 0; id < end; ++id) {
    const std::int32_t at = position.empty() ? id : position[static_cast<std::size_t>(id)];
    for (const ValueRef& in : g.node(id).inputs) {
      std::int32_t& l = last[alias_root(g, in)];
      l = std::max(l, at);
    }
  }
  for (const auto& [name, ref] : g.outputs()) last[alias_root(g, ref)] = end;
  for (const auto& [var, ref] : g.assignments()) last[alias_root(g, ref)] = end;
  return last;
}

std::int32_t take_slot(MemoryPlan& plan, std::vector<std::int32_t>& free_slots, std::size_t bytes) {
  std::int32_t best = -1;
  for (std::int32_t s : free_slots) {
    const std::size_t size = plan.slot_bytes[static_cast<std::size_t>(s)];
    const std::size_t best_size = best < 0 ? 0 : plan.slot_bytes[static_cast<std::size_t>(best)];
    const bool fits = size >= bytes;
    const bool best_fits = best >= 0 && best_size >= bytes;
    // Prefer the smallest slot that fits; otherwise the largest one, grown.
    if (best < 0 || (fits && (!best_fits || size < best_size)) ||
        (!fits && !best_fits && size > best_size))
      best = s;
  }
  if (best < 0) {
    plan.slot_bytes.push_back(bytes);
    return static_cast<std::int32_t>(plan.slot_bytes.size() - 1);
  }
  std::erase(free_slots, best);
  auto& size = plan.slot_bytes[static_cast<std::size_t>(best)];
  size = std::max(size, bytes);
  return best;
}

// Each slot's offset in one arena, in slot order, aligned to kArenaAlign.
void place_slots(MemoryPlan& plan) {
  plan.slot_offset.assign(plan.slot_bytes.size(), 0);
  plan.arena_bytes = 0;
  for (std::size_t s = 0; s < plan.slot_bytes.size(); ++s) {
    plan.slot_offset[s] = plan.arena_bytes;
    plan.arena_bytes += (plan.slot_bytes[s] + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  }
}

}  // namespace

std::size_t MemoryPlan::total_bytes() const {
  return std::accumulate(slot_bytes.begin(), slot_bytes.end(), std::size_t{0});
}

MemoryPlan plan_memory(const Graph& g, const std::vector<int>& stream_of_node,
                       const std::vector<std::int32_t>& launch_position) {
  MemoryPlan plan;
  std::map<ValueRef, std::int32_t> last = last_uses(g, launch_position);
  if (!stream_of_node.empty()) {  // values that touch a side stream live to the end
    const auto end = static_cast<std::int32_t>(g.nodes().size());
    for (std::int32_t id = 0; id < end; ++id) {
      const bool side = stream_of_node[static_cast<std::size_t>(id)] != 0;
      for (std::size_t i = 0; side && i < g.node(id).outputs.size(); ++i)
        last[{id, static_cast<std::int32_t>(i)}] = end;
      for (const ValueRef& in : g.node(id).inputs)
        if (side) last[alias_root(g, in)] = end;
    }
  }
  std::map<std::int32_t, std::vector<std::int32_t>>
      release_after;  // node -> slots freed after it runs
  std::vector<std::int32_t> free_slots;
  plan.slot.resize(g.nodes().size());
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    const Node& n = g.node(id);
    auto& slots = plan.slot[static_cast<std::size_t>(id)];
    slots.assign(n.outputs.size(), -1);
    if (n.op->kind != OpKind::source && !n.op->alias) {
      for (std::size_t i = 0; i < n.outputs.size(); ++i) {
        const TensorType& t = n.outputs[i];
        const std::size_t bytes = static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype);
        // A value written on a side stream gets a fresh slot: its writer is not ordered after
        // the earlier readers of a reused one.
        const bool side =
            !stream_of_node.empty() && stream_of_node[static_cast<std::size_t>(id)] != 0;
        std::vector<std::int32_t> none;
        slots[i] = take_slot(plan, side ? none : free_slots, bytes);
        auto it = last.find({id, static_cast<std::int32_t>(i)});
        const std::int32_t written_at =  // a merged launch writes where it runs
            launch_position.empty() ? id : launch_position[static_cast<std::size_t>(id)];
        release_after[it == last.end() ? written_at : std::max(it->second, written_at)].push_back(
            slots[i]);
      }
    }
    auto done = release_after.find(id);
    if (done == release_after.end()) continue;
    free_slots.insert(free_slots.end(), done->second.begin(), done->second.end());
    release_after.erase(done);
  }
  place_slots(plan);
  return plan;
}

}  // namespace kiln
