// plan_memory: a static memory plan from liveness. Every value a kernel writes gets a
// buffer slot; a slot is reused once every value in it is dead. Views (alias ops such as
// reshape) share their input's slot and extend its life; sources (inputs, variables,
// constants) are not planned. Outputs and assigned values stay live to the end.
//
// Pre: verify(g) holds; stream_of_node is empty or assign_streams(g, ...); launch_position is
// empty or launch_positions(g, merge_horizontal(...)) (a node that runs later, merged into a
// horizontal launch, keeps what it reads alive until there). Post: a slot per
// output of every node that is neither a source nor a view (-1 for those), slots that hold
// values alive at the same time distinct, and every slot at a kArenaAlign-aligned offset of
// one arena of arena_bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace kiln {

inline constexpr std::size_t kArenaAlign = 256;

struct MemoryPlan {
  // slot[node][output]: the buffer of that value, or -1 (a source, or a view of another value).
  std::vector<std::vector<std::int32_t>> slot;
  std::vector<std::size_t> slot_bytes;
  std::vector<std::size_t> slot_offset;  // in the arena
  std::size_t arena_bytes = 0;
  std::size_t total_bytes() const;  // the slots' bytes, unaligned
};

// The value whose buffer `ref` lives in (itself unless produced by an alias op).
ValueRef alias_root(const Graph& g, ValueRef ref);

// `stream_of_node` (optional) is the stream schedule: a value written or read on a stream
// other than 0 keeps its slot for the whole step, since stream order no longer follows
// node order there and a reused slot could be overwritten while still being read.
MemoryPlan plan_memory(const Graph& g, const std::vector<int>& stream_of_node = {},
                       const std::vector<std::int32_t>& launch_position = {});

}  // namespace kiln
