// lower_for_device: the lowering steps in order, and their results as text.
#include "backends/lowering.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string_view>

#include "backends/schedule.h"
#include "graph/op.h"

namespace kiln {
namespace {

std::string label_of(const Node& n) { return n.body ? n.body->summary() : n.op->name; }

bool launches(const Node& n) { return n.op->kind != OpKind::source && !n.op->alias; }

std::string streams_text(const Graph& g, const Lowering& l) {
  std::string out;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id)
    if (launches(g.node(id)))
      out += fmt::format("%{} {} -> stream {}\n", id, label_of(g.node(id)),
                         l.stream_of[static_cast<std::size_t>(id)]);
  return out;
}

std::string plan_text(const Graph& g, const Lowering& l) {
  const MemoryPlan& p = l.plan;
  std::string out = fmt::format("arena {} bytes, {} slots\n", p.arena_bytes, p.slot_bytes.size());
  for (std::size_t s = 0; s < p.slot_bytes.size(); ++s)
    out += fmt::format("slot {}: {} bytes at offset {}, live at nodes {}..{}\n", s, p.slot_bytes[s],
                       p.slot_offset[s], p.slot_first[s], p.slot_last[s]);
  for (std::size_t id = 0; id < p.slot.size(); ++id) {
    for (std::size_t i = 0; i < p.slot[id].size(); ++i)
      if (const std::int32_t s = p.slot[id][i]; s >= 0)
        out += fmt::format("%{}.{} {} -> slot {} (offset {})\n", id, i, label_of(g.nodes()[id]), s,
                           p.slot_offset[static_cast<std::size_t>(s)]);
    if (const std::int32_t s = p.scratch[id]; s >= 0)
      out += fmt::format("%{} {} scratch -> slot {} (offset {})\n", id, label_of(g.nodes()[id]), s,
                         p.slot_offset[static_cast<std::size_t>(s)]);
  }
  return out;
}

std::string in_place_text(const Graph& g, const Lowering& l) {
  std::string out;
  for (std::size_t k = 0; k < l.in_place.size(); ++k) {
    const auto& [var, ref] = g.assignments()[k];
    const InPlaceUpdate& u = l.in_place[k];
    out += fmt::format("{} <- %{}.{}: {}", var->name, ref.node, ref.index,
                       u.in_place ? "in place" : "copied at the end");
    if (!u.after.empty()) out += fmt::format(", after %{}", fmt::join(u.after, " %"));
    out += "\n";
  }
  return out;
}

std::string horizontal_text(const Graph& g, const Lowering& l) {
  std::string out;
  for (const HorizontalLaunch& h : l.horizontal) {
    std::vector<std::string> members;
    for (std::int32_t m : h.nodes)
      members.push_back(fmt::format("%{} {}", m, g.node(m).outputs[0].shape.str()));
    out += fmt::format("one launch of {} groups ({}) on stream {}: {}\n", h.nodes.size(),
                       label_of(g.node(h.nodes.back())),
                       l.stream_of[static_cast<std::size_t>(h.nodes.back())],
                       fmt::join(members, ", "));
  }
  return out;
}

std::string launches_text(const Lowering& l) {
  std::string out;
  for (std::size_t k = 0; k < l.launches.steps.size(); ++k) {
    const LaunchStep& s = l.launches.steps[k];
    const std::string nodes = !s.merged.empty() ? fmt::format("%{} ", fmt::join(s.merged, " %"))
                              : s.node >= 0     ? fmt::format("%{} ", s.node)
                                                : std::string();
    out += fmt::format("#{} ", k) + nodes + fmt::format("{} on stream {}", s.label, s.stream);
    if (!s.waits.empty()) out += fmt::format(", waits for event {}", fmt::join(s.waits, ", "));
    if (s.record >= 0) out += fmt::format(", records event {}", s.record);
    out += "\n";
  }
  return out;
}

}  // namespace

Lowering lower_for_device(const Graph& g, int streams,
                          void (*after_step)(const char*, const Graph&, const Lowering&),
                          bool horizontal, const std::vector<std::size_t>& scratch_bytes) {
  Lowering l;
  l.stream_of = assign_streams(g, std::max(1, streams));
  after_step("assign_streams", g, l);
  l.in_place = in_place_updates(g);
  after_step("in_place_updates", g, l);
  if (horizontal) l.horizontal = merge_horizontal(g, l.stream_of, l.in_place);
  after_step("merge_horizontal", g, l);
  l.plan = plan_memory(g, l.stream_of, launch_positions(g, l.horizontal), scratch_bytes);
  after_step("plan_memory", g, l);
  l.launches = build_launch_list(g, l.stream_of, l.in_place, l.horizontal, l.plan.reuse_waits);
  after_step("launch_list", g, l);
  return l;
}

std::string lowering_text(const char* step, const Graph& g, const Lowering& l) {
  const std::string_view s = step;
  if (s == "assign_streams") return streams_text(g, l);
  if (s == "plan_memory") return plan_text(g, l);
  if (s == "in_place_updates") return in_place_text(g, l);
  if (s == "merge_horizontal") return horizontal_text(g, l);
  return launches_text(l);
}

}  // namespace kiln
