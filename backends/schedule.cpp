// Longest path by kernel count, traced back from its deepest node; everything else is a
// side branch.
#include "backends/schedule.h"

#include <algorithm>

#include "graph/op.h"

namespace kiln {
namespace {

bool is_kernel(const Node& n) { return n.op->kind != OpKind::source && !n.op->alias; }

}  // namespace

std::vector<int> assign_streams(const Graph& g, int streams) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::vector<int> stream(static_cast<std::size_t>(count), 0);
  if (streams <= 1 || count == 0) return stream;
  std::vector<int> depth(static_cast<std::size_t>(count), 0);
  std::int32_t deepest = 0;
  for (std::int32_t id = 0; id < count; ++id) {
    int d = 0;
    for (const ValueRef& in : g.node(id).inputs)
      d = std::max(d, depth[static_cast<std::size_t>(in.node)]);
    depth[static_cast<std::size_t>(id)] = d + (is_kernel(g.node(id)) ? 1 : 0);
    if (depth[static_cast<std::size_t>(id)] > depth[static_cast<std::size_t>(deepest)])
      deepest = id;
  }
  std::vector<char> critical(static_cast<std::size_t>(count), 0);
  for (std::int32_t at = deepest; at >= 0;) {
    critical[static_cast<std::size_t>(at)] = 1;
    std::int32_t next = -1;
    for (const ValueRef& in : g.node(at).inputs)
      if (next < 0 ||
          depth[static_cast<std::size_t>(in.node)] > depth[static_cast<std::size_t>(next)])
        next = in.node;
    at = next;
  }
  for (std::int32_t id = 0; id < count; ++id) {
    if (g.node(id).op->id == OpId::all_reduce_mean)
      stream[static_cast<std::size_t>(id)] = streams;  // the communication stream
    else if (is_kernel(g.node(id)) && !critical[static_cast<std::size_t>(id)])
      stream[static_cast<std::size_t>(id)] = 1;
  }
  return stream;
}

}  // namespace kiln
