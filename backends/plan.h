// plan_memory: a static memory plan from liveness. Every value a kernel writes gets a
// buffer slot; a slot is reused once every value in it is dead. Views (alias ops such as
// reshape) share their input's slot and extend its life; sources (inputs, variables,
// constants) are not planned. Outputs and assigned values stay live to the end.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace kiln {

struct MemoryPlan {
  // slot[node][output]: the buffer of that value, or -1 (a source, or a view of another value).
  std::vector<std::vector<std::int32_t>> slot;
  std::vector<std::size_t> slot_bytes;
  std::size_t total_bytes() const;
};

// `stream_of_node` (optional) is the stream schedule: a value written or read on a stream
// other than 0 keeps its slot for the whole step, since stream order no longer follows
// node order there and a reused slot could be overwritten while still being read.
MemoryPlan plan_memory(const Graph& g, const std::vector<int>& stream_of_node = {});

// For each assignment of g, whether its new value can be written straight into the
// variable's storage (no copy at the end of the step): the value is a full-shape output of a
// fused group and nothing else reads it, so each element of the old value is read by the
// group itself, at the same index, right before it is overwritten. Every other reader of the
// variable must have run before the group: an ancestor of it does anyway; any other reader
// (an input-gradient GEMM reading a weight, say) must come earlier in node order and not
// depend on the group, and is listed in `after`: the executor orders the group after it
// (an event wait when they run on different streams).
struct InPlaceUpdate {
  bool in_place = false;
  std::vector<std::int32_t> after;  // readers of the old value that are not ancestors
};
std::vector<InPlaceUpdate> in_place_updates(const Graph& g);

}  // namespace kiln
