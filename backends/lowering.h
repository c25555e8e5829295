// The lowering of a fused graph for a device executor, as named steps that compile() calls
// one by one (each in its own file, with its pre- and postconditions): assign_streams
// (schedule.h), in_place_updates (in_place.h), merge_horizontal (horizontal.h), plan_memory
// (plan.h), build_launch_list (launch_list.h). KILN_DUMP=<step> prints a step's result;
// `dump --format json` shows it.
#pragma once

#include <string>
#include <vector>

#include "backends/horizontal.h"
#include "backends/in_place.h"
#include "backends/launch_list.h"
#include "backends/plan.h"
#include "graph/graph.h"

namespace kiln {

struct Lowering {
  std::vector<int> stream_of;                // assign_streams: each node's stream
  std::vector<InPlaceUpdate> in_place;       // in_place_updates: per assignment
  std::vector<HorizontalLaunch> horizontal;  // merge_horizontal: groups merged into one launch
  MemoryPlan plan;      // plan_memory: each value's slot and offset in the arena
  LaunchList launches;  // build_launch_list
};

// The five steps in order, for `streams` streams (1: everything on stream 0), merge_horizontal
// only with `horizontal` (off for --check-numerics, which checks launch by launch); after
// each, `after_step(name, lowering so far)` (compile() prints it for KILN_DUMP).
// `scratch_bytes` (empty, or one entry per node): the scratch each launch needs, planned in
// the arena (the device backend's: cuda_scratch_bytes).
Lowering lower_for_device(const Graph& g, int streams,
                          void (*after_step)(const char* step, const Graph&, const Lowering&),
                          bool horizontal = true,
                          const std::vector<std::size_t>& scratch_bytes = {});

// A step's result as text: one line per kernel (assign_streams), per assignment
// (in_place_updates), per horizontal launch (merge_horizontal), per slot and planned value
// (plan_memory) or per launch (launch_list).
std::string lowering_text(const char* step, const Graph& g, const Lowering& lowering);

}  // namespace kiln
