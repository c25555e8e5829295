// merge_horizontal: independent fused groups of one kind become one launch (the optimizer
// updates of all parameters: the same chain of instructions over different sizes), which
// walks a table of segments, one per group (fusion/codegen.h, generate_cuda_horizontal).
//
// Pre: g is fused; stream_of = assign_streams(g, ...); in_place = in_place_updates(g).
// Post: each HorizontalLaunch lists at least two nodes in increasing order, each in at most one
// launch, all of one horizontal_kind and one stream, such that: no node reads an output of a
// member (only assignments and graph outputs do), and no member is a reader that an in-place
// update must precede (in_place[k].after), so no member reads what another member or a
// later update overwrites. The launch runs where its last member is in node order:
// plan_memory keeps every member's inputs alive until there (launch_positions) and
// build_launch_list puts the one launch there, waiting for every member's events. Groups of
// one kind on different streams stay apart: merged, the side stream's updates would wait for
// the last gradient of the critical path (on the H200, LeNet's SGD step took 0.188 ms of
// device time so, against 0.175 unmerged).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/in_place.h"
#include "graph/graph.h"

namespace kiln {

class FusedGroup;

struct HorizontalLaunch {
  std::vector<std::int32_t> nodes;  // the member groups, in node order; runs at the last
};

// What two groups must share to run as segments of one kernel: the compute dtype, the
// instructions, the outputs, each input's dtype and access (read contiguously, or one element
// for all); nothing for a reduction or an input read at other strides.
std::optional<std::string> horizontal_kind(const FusedGroup& group);

// KILN_HORIZONTAL=0 turns the step off (no launch merged), to measure without it.
std::vector<HorizontalLaunch> merge_horizontal(const Graph& g, const std::vector<int>& stream_of,
                                               const std::vector<InPlaceUpdate>& in_place);

// Where each node runs in node order: itself, or the last member of its horizontal launch.
std::vector<std::int32_t> launch_positions(const Graph& g,
                                           const std::vector<HorizontalLaunch>& launches);

}  // namespace kiln
