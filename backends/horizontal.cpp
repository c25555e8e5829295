// Horizontal launches: fused groups keyed by their kind and stream, filtered by what a later
// position in node order and a shared launch allow.
#include "backends/horizontal.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "fusion/fused_group.h"
#include "graph/op.h"

namespace kiln {
namespace {

std::string operand_key(const Operand& o) {
  switch (o.kind) {
    case Operand::Kind::input:
      return fmt::format("x{}", o.index);
    case Operand::Kind::instr:
      return fmt::format("r{}", o.index);
    case Operand::Kind::constant:
      return fmt::format("c{:.17g}", o.constant);
    case Operand::Kind::reduced:  // never: a group with reductions runs on its own
      return fmt::format("q{}", o.index);
  }
  return "?";
}

// Nodes whose outputs no node reads (an update's values go to assignments and outputs only).
std::vector<char> unread_by_nodes(const Graph& g) {
  std::vector<char> unread(g.nodes().size(), 1);
  for (const Node& n : g.nodes())
    for (const ValueRef& in : n.inputs) unread[static_cast<std::size_t>(in.node)] = 0;
  return unread;
}

bool turned_off() {
  const char* v = std::getenv("KILN_HORIZONTAL");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

std::optional<std::string> horizontal_kind(const FusedGroup& group) {
  if (group.reduction || group.any_channels_last()) return std::nullopt;
  std::string key = fmt::format("{}|", dtype_name(group.compute));
  for (const FusedInput& in : group.inputs) {
    // The access plan_input (codegen.h) would choose: contiguous first, then one element.
    const char* access = in.contiguous(group.shape) ? "c" : in.scalar() ? "s" : nullptr;
    if (access == nullptr) return std::nullopt;
    key += fmt::format("{}{},", dtype_name(in.type.dtype), access);
  }
  key += "|";
  for (const FusedInstr& i : group.instrs) {
    key += fmt::format("{}:{}(", i.op->name, dtype_name(i.dtype));
    for (const Operand& a : i.args) key += operand_key(a) + ",";
    key += ");";
  }
  key += "|";
  for (const Operand& o : group.outputs)
    key += fmt::format("{}:{},", operand_key(o), dtype_name(group.operand_dtype(o)));
  return key;
}

std::vector<HorizontalLaunch> merge_horizontal(const Graph& g, const std::vector<int>& stream_of,
                                               const std::vector<InPlaceUpdate>& in_place) {
  if (turned_off()) return {};
  std::set<std::int32_t> must_precede;  // readers that in-place updates wait for
  for (const InPlaceUpdate& u : in_place) must_precede.insert(u.after.begin(), u.after.end());
  const std::vector<char> unread = unread_by_nodes(g);
  std::map<std::pair<std::string, int>, std::vector<std::int32_t>> by_kind;  // in node order
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    const FusedGroup* group = fused_group_of(g.node(id));
    if (group == nullptr || !unread[static_cast<std::size_t>(id)] || must_precede.count(id))
      continue;
    if (std::optional<std::string> kind = horizontal_kind(*group))
      by_kind[{*kind, stream_of[static_cast<std::size_t>(id)]}].push_back(id);
  }
  std::vector<HorizontalLaunch> launches;
  for (auto& [kind, nodes] : by_kind)
    if (nodes.size() >= 2) launches.push_back({std::move(nodes)});
  std::sort(launches.begin(), launches.end(),
            [](const HorizontalLaunch& a, const HorizontalLaunch& b) {
              return a.nodes.back() < b.nodes.back();
            });
  return launches;
}

std::vector<std::int32_t> launch_positions(const Graph& g,
                                           const std::vector<HorizontalLaunch>& launches) {
  std::vector<std::int32_t> at(g.nodes().size());
  for (std::size_t id = 0; id < at.size(); ++id) at[id] = static_cast<std::int32_t>(id);
  for (const HorizontalLaunch& l : launches)
    for (std::int32_t member : l.nodes) at[static_cast<std::size_t>(member)] = l.nodes.back();
  return at;
}

}  // namespace kiln
