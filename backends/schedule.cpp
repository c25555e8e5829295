// Longest path by kernel count, traced back from its deepest node, on stream 0; the kernels
// off it list-scheduled over the side streams by an estimated cost.
#include "backends/schedule.h"

#include <algorithm>

#include "graph/op.h"

namespace kiln {
namespace {

bool is_kernel(const Node& n) { return n.op->kind != OpKind::source && !n.op->alias; }

// A launch's estimated time in microseconds: a fixed cost, then its bytes at about 2 TB/s.
double estimated_cost(const Graph& g, const Node& n) {
  if (!is_kernel(n)) return 0;
  double bytes = 0;
  for (const ValueRef& in : n.inputs) {
    const TensorType t = g.type(in);
    bytes += static_cast<double>(t.shape.numel()) * static_cast<double>(dtype_size(t.dtype));
  }
  for (const TensorType& t : n.outputs)
    bytes += static_cast<double>(t.shape.numel()) * static_cast<double>(dtype_size(t.dtype));
  return 3.0 + bytes / 2e6;
}

std::vector<char> critical_path(const Graph& g) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
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
  for (std::int32_t at = deepest; at >= 0 && count > 0;) {
    critical[static_cast<std::size_t>(at)] = 1;
    std::int32_t next = -1;
    for (const ValueRef& in : g.node(at).inputs)
      if (next < 0 ||
          depth[static_cast<std::size_t>(in.node)] > depth[static_cast<std::size_t>(next)])
        next = in.node;
    at = next;
  }
  return critical;
}

}  // namespace

std::vector<int> assign_streams(const Graph& g, int streams) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::vector<int> stream(static_cast<std::size_t>(count), 0);
  if (streams <= 1 || count == 0) return stream;
  const std::vector<char> critical = critical_path(g);
  // In node order, each kernel starts when its inputs are done and its stream is free; off
  // the critical path it takes the side stream where it starts first (ties: the stream of
  // the input it waits for last, which saves an event, else the lowest).
  std::vector<double> finish(static_cast<std::size_t>(count), 0),
      free_at(static_cast<std::size_t>(streams), 0);
  for (std::int32_t id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    double ready = 0;
    int last_stream = -1;
    for (const ValueRef& in : n.inputs) {
      const double f = finish[static_cast<std::size_t>(in.node)];
      if (f >= ready) {
        ready = f;
        last_stream = stream[static_cast<std::size_t>(in.node)];
      }
    }
    if (n.op->id == OpId::all_reduce_mean) {
      stream[static_cast<std::size_t>(id)] = streams;  // the communication stream
      finish[static_cast<std::size_t>(id)] = ready + estimated_cost(g, n);
      continue;
    }
    if (!is_kernel(n)) {
      finish[static_cast<std::size_t>(id)] = ready;
      continue;
    }
    int best = 0;
    if (!critical[static_cast<std::size_t>(id)]) {
      best = 1;
      for (int s = 2; s < streams; ++s) {
        const double start = std::max(ready, free_at[static_cast<std::size_t>(s)]);
        const double best_start = std::max(ready, free_at[static_cast<std::size_t>(best)]);
        if (start < best_start || (start == best_start && s == last_stream)) best = s;
      }
    }
    const double start = std::max(ready, free_at[static_cast<std::size_t>(best)]);
    finish[static_cast<std::size_t>(id)] = start + estimated_cost(g, n);
    free_at[static_cast<std::size_t>(best)] = finish[static_cast<std::size_t>(id)];
    stream[static_cast<std::size_t>(id)] = best;
  }
  return stream;
}

}  // namespace kiln
