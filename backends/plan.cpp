// Liveness over the node order, then each slot placed in one arena, greedy by size.
#include "backends/plan.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>

#include "graph/op.h"

namespace kiln {
bool MemoryPlan::share_bytes(std::int32_t a, std::int32_t b) const {
  const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
  if (slot_bytes[ua] == 0 || slot_bytes[ub] == 0) return false;
  return slot_offset[ua] < slot_offset[ub] + slot_bytes[ub] &&
         slot_offset[ub] < slot_offset[ua] + slot_bytes[ua];
}

namespace {

std::size_t aligned(std::size_t bytes) {
  return (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

// The launching nodes that read each root value (views resolved to the value they alias).
std::map<ValueRef, std::vector<std::int32_t>> readers_of(const Graph& g) {
  std::map<ValueRef, std::vector<std::int32_t>> readers;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id)
    if (!g.node(id).op->alias)
      for (const ValueRef& in : g.node(id).inputs) readers[alias_root(g, in)].push_back(id);
  return readers;
}

int side_reuse_lag() {
  const char* v = std::getenv("KILN_SIDE_REUSE_LAG");
  return v == nullptr || *v == 0 ? kSideReuseLag : std::max(0, std::atoi(v));
}

std::int32_t add_slot(MemoryPlan& plan, std::size_t bytes, std::int32_t first, std::int32_t last) {
  plan.slot_bytes.push_back(bytes);
  plan.slot_first.push_back(first);
  plan.slot_last.push_back(last);
  return static_cast<std::int32_t>(plan.slot_bytes.size() - 1);
}

// Greedy by size: the largest slot first, each in the smallest gap that holds it between the
// placed slots it may not share bytes with (else above them all).
template <typename Apart>
void place_slots(MemoryPlan& plan, Apart apart) {
  const std::size_t count = plan.slot_bytes.size();
  std::vector<std::int32_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return plan.slot_bytes[static_cast<std::size_t>(a)] >
           plan.slot_bytes[static_cast<std::size_t>(b)];
  });
  plan.slot_offset.assign(count, 0);
  plan.arena_bytes = 0;
  std::vector<std::int32_t> placed;  // by offset
  for (const std::int32_t s : order) {
    const auto us = static_cast<std::size_t>(s);
    const std::size_t need = aligned(plan.slot_bytes[us]);
    std::size_t at = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
    for (const std::int32_t p : placed) {
      const auto up = static_cast<std::size_t>(p);
      if (apart(us, up)) continue;  // may share bytes
      const std::size_t gap = plan.slot_offset[up] > at ? plan.slot_offset[up] - at : 0;
      if (gap >= need && gap < best_gap) {
        best = at;
        best_gap = gap;
      }
      at = std::max(at, plan.slot_offset[up] + aligned(plan.slot_bytes[up]));
    }
    plan.slot_offset[us] = best != SIZE_MAX ? best : at;
    plan.arena_bytes = std::max(plan.arena_bytes, plan.slot_offset[us] + need);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), s,
                                   [&](std::int32_t a, std::int32_t b) {
                                     return plan.slot_offset[static_cast<std::size_t>(a)] <
                                            plan.slot_offset[static_cast<std::size_t>(b)];
                                   }),
                  s);
  }
}

}  // namespace

MemoryPlan plan_memory(const Graph& g, const std::vector<int>& stream_of_node,
                       const std::vector<std::int32_t>& launch_position,
                       const std::vector<std::size_t>& scratch_bytes) {
  MemoryPlan plan;
  const auto end = static_cast<std::int32_t>(g.nodes().size());
  auto stream = [&](std::int32_t id) {
    return stream_of_node.empty() ? 0 : stream_of_node[static_cast<std::size_t>(id)];
  };
  auto position = [&](std::int32_t id) {
    return launch_position.empty() ? id : launch_position[static_cast<std::size_t>(id)];
  };
  auto launches = [&](std::int32_t id) {
    return g.node(id).op->kind != OpKind::source && !g.node(id).op->alias;
  };
  // The positions of stream 0's launches, to count kSideReuseLag of them.
  std::vector<std::int32_t> main_positions;
  for (std::int32_t id = 0; id < end; ++id)
    if (launches(id) && stream(id) == 0) main_positions.push_back(position(id));
  std::sort(main_positions.begin(), main_positions.end());
  const int lag = side_reuse_lag();
  // Where bytes touched at `accessor` may pass to a slot written on `stream`: at once on the
  // same stream, else kSideReuseLag launches of stream 0 later (a wait on a launch just
  // queued would tie the streams together: the reverse LSTM of row-lstm waited for the
  // forward one when bytes passed at once from stream 0).
  auto release = [&](std::int32_t accessor, int writer_stream) {
    const std::int32_t at = position(accessor);
    if (stream(accessor) == writer_stream || lag == 0) return at;
    const auto next = std::upper_bound(main_positions.begin(), main_positions.end(), at);
    const auto index = static_cast<std::size_t>(next - main_positions.begin()) + lag - 1;
    return index < main_positions.size() ? main_positions[index] : end;
  };
  int streams = 1;
  for (std::int32_t id = 0; id < end; ++id) streams = std::max(streams, stream(id) + 1);
  std::set<ValueRef> kept;  // outputs and assigned values: live to the end
  for (const auto& [name, ref] : g.outputs()) kept.insert(alias_root(g, ref));
  for (const auto& [var, ref] : g.assignments()) kept.insert(alias_root(g, ref));
  const std::map<ValueRef, std::vector<std::int32_t>> readers = readers_of(g);
  std::vector<std::vector<std::int32_t>> accessors;  // per slot
  std::vector<std::int32_t> writer;                  // per slot
  std::vector<std::vector<std::int32_t>> released;   // per slot: per writer stream
  auto add = [&](std::size_t bytes, std::int32_t node, std::vector<std::int32_t> touched,
                 bool to_end) {
    std::int32_t last = to_end ? end : position(node);
    std::vector<std::int32_t> after(static_cast<std::size_t>(streams), last);
    for (std::int32_t a : touched) {
      last = std::max(last, position(a));
      for (int st = 0; st < streams; ++st)
        after[static_cast<std::size_t>(st)] =
            std::max(after[static_cast<std::size_t>(st)], release(a, st));
    }
    accessors.push_back(std::move(touched));
    writer.push_back(node);
    released.push_back(std::move(after));
    return add_slot(plan, bytes, node, last);
  };
  plan.slot.resize(g.nodes().size());
  plan.scratch.assign(g.nodes().size(), -1);
  for (std::int32_t id = 0; id < end; ++id) {
    const Node& n = g.node(id);
    auto& slots = plan.slot[static_cast<std::size_t>(id)];
    slots.assign(n.outputs.size(), -1);
    if (!launches(id)) continue;
    for (std::size_t i = 0; i < n.outputs.size(); ++i) {
      const TensorType& t = n.outputs[i];
      const ValueRef ref{id, static_cast<std::int32_t>(i)};
      std::vector<std::int32_t> touched{id};
      if (auto r = readers.find(ref); r != readers.end())
        touched.insert(touched.end(), r->second.begin(), r->second.end());
      slots[i] = add(static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype), id,
                     std::move(touched), kept.count(ref) > 0);
    }
    const std::size_t scratch =
        scratch_bytes.empty() ? 0 : scratch_bytes[static_cast<std::size_t>(id)];
    if (scratch > 0) plan.scratch[static_cast<std::size_t>(id)] = add(scratch, id, {id}, false);
  }
  // Which nodes each node depends on: a wait for one of them is implied.
  const std::size_t words = (static_cast<std::size_t>(end) + 63) / 64;
  std::vector<std::uint64_t> ancestors(streams > 1 ? static_cast<std::size_t>(end) * words : 0,
                                       0);  // one stream: nothing crosses
  auto depends = [&](std::int32_t node, std::int32_t on) {
    return (ancestors[static_cast<std::size_t>(node) * words + static_cast<std::size_t>(on) / 64] >>
            (on % 64)) &
           1;
  };
  for (std::int32_t id = 0; id < end && streams > 1; ++id) {
    std::uint64_t* mine = &ancestors[static_cast<std::size_t>(id) * words];
    for (const ValueRef& in : g.node(id).inputs) {
      const std::uint64_t* theirs = &ancestors[static_cast<std::size_t>(in.node) * words];
      for (std::size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
      mine[static_cast<std::size_t>(in.node) / 64] |= std::uint64_t{1} << (in.node % 64);
    }
  }
  // Whether slot v's bytes may pass to slot u (u written after v is done with them): each
  // launch that touched v is on u's stream, or one u depends on, or long enough ago.
  auto before = [&](std::size_t v, std::size_t u) {
    const std::int32_t w = writer[u];
    if (released[v][static_cast<std::size_t>(stream(w))] < plan.slot_first[u]) return true;
    if (plan.slot_last[v] >= plan.slot_first[u]) return false;
    for (std::int32_t a : accessors[v])
      if (stream(a) != stream(w) && !depends(w, a)) return false;
    return true;
  };
  place_slots(plan, [&](std::size_t u, std::size_t v) { return before(u, v) || before(v, u); });
  // The waits that make reuse across streams safe: per slot, the latest launch on each other
  // stream that touched an earlier slot sharing its bytes.
  plan.reuse_waits.assign(g.nodes().size(), {});
  std::vector<std::map<int, std::int32_t>> latest(g.nodes().size());  // node -> stream -> node
  const std::size_t count = plan.slot_bytes.size();
  for (std::size_t u = 0; u < count && streams > 1; ++u) {
    const std::int32_t w = writer[u];
    for (std::size_t v = 0; v < count; ++v) {
      if (!plan.share_bytes(static_cast<std::int32_t>(u), static_cast<std::int32_t>(v)) ||
          !before(v, u))
        continue;
      for (std::int32_t a : accessors[v]) {
        if (stream(a) == stream(w) || depends(w, a)) continue;  // ordered already
        auto [it, fresh] = latest[static_cast<std::size_t>(w)].try_emplace(stream(a), a);
        if (!fresh && position(a) > position(it->second)) it->second = a;
      }
    }
  }
  for (std::size_t id = 0; id < latest.size(); ++id)
    for (const auto& [st, a] : latest[id]) plan.reuse_waits[id].push_back(a);
  return plan;
}

}  // namespace kiln
