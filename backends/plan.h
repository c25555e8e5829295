// plan_memory: a static memory plan from liveness. Every value a kernel writes, and the
// scratch a launch asks for (a convolution's workspace), gets a slot: a byte range of one
// arena, live over a range of nodes. Slots whose lives overlap get disjoint ranges; slots
// whose lives do not may share bytes. Views (alias ops such as reshape) share their input's
// slot and extend its life; sources (inputs, variables, constants) are not planned. Outputs
// and assigned values stay live to the end.
//
// Placement is greedy by size: the largest slot first, each at the lowest offset that fits
// between the slots already placed whose lives overlap it (the arena ends up close to the
// largest sum of bytes live at one node).
//
// On several streams, bytes pass between values of different streams too: the launch that
// writes them first waits for the launches of other streams that used them before
// (reuse_waits, which build_launch_list turns into event waits). Bytes pass to a slot of the
// same stream at once, but to one of another stream only after kSideReuseLag more launches
// of stream 0 (KILN_SIDE_REUSE_LAG overrides it), so that the wait is for work long done.
//
// Pre: verify(g) holds; stream_of_node is empty or assign_streams(g, ...); launch_position is
// empty or launch_positions(g, merge_horizontal(...)) (a node that runs later, merged into a
// horizontal launch, keeps what it reads alive until there); scratch_bytes is empty or one
// entry per node. Post: a slot per output of every node that is neither a source nor a view
// (-1 for those) and per node with scratch (scratch[node], else -1), slots live at the same
// node in disjoint ranges of the arena, every slot at a kArenaAlign-aligned offset, and for
// each node the launches of other streams it must wait for before writing reused bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace kiln {

inline constexpr std::size_t kArenaAlign = 256;
inline constexpr int kSideReuseLag = 8;

struct MemoryPlan {
  // slot[node][output]: the slot of that value, or -1 (a source, or a view of another value).
  std::vector<std::vector<std::int32_t>> slot;
  // scratch[node]: the slot of the scratch its launch uses, or -1 (none asked for).
  std::vector<std::int32_t> scratch;
  // reuse_waits[node]: launches on other streams (at most one per stream, the latest) that
  // touched bytes this node's launch writes (its outputs, its scratch) before it.
  std::vector<std::vector<std::int32_t>> reuse_waits;
  // Per slot: its bytes, its offset in the arena, and the first and last node that touch it
  // (inclusive; in launch order where merge_horizontal moved a launch; the step's end for
  // outputs and assigned values).
  std::vector<std::size_t> slot_bytes;
  std::vector<std::size_t> slot_offset;
  std::vector<std::int32_t> slot_first, slot_last;
  std::size_t arena_bytes = 0;

  // Whether two slots share a byte of the arena.
  bool share_bytes(std::int32_t a, std::int32_t b) const;
};

// `stream_of_node` (optional) is the stream schedule; `scratch_bytes[node]` (optional) the
// scratch that node's launch needs, 0 for none.
MemoryPlan plan_memory(const Graph& g, const std::vector<int>& stream_of_node = {},
                       const std::vector<std::int32_t>& launch_position = {},
                       const std::vector<std::size_t>& scratch_bytes = {});

}  // namespace kiln
