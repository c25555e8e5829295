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

MemoryPlan plan_memory(const Graph& g);

}  // namespace kiln
