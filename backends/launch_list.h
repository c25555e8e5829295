// build_launch_list: the launches of a device step in order, each with its stream and the
// cross-stream events it waits for and records, then the variable updates that are copies.
//
// Pre: stream_of = assign_streams(g, ...), in_place = in_place_updates(g), horizontal =
// merge_horizontal(g, ...). Post: one launch per node that runs a kernel (neither a source nor
// a view) and per horizontal launch (at its last member, standing for all its members: it
// waits for what each of them would wait for), in node order, on its node's stream;
// it waits for the event of every value it reads (views resolved to the value they alias)
// that a launch on another stream wrote, and, for an update done in place, of every other
// reader of the old value (in_place[k].after) on another stream, and for each of its nodes
// the launches of reuse_waits[node] (plan_memory: bytes it writes that another stream used
// before); a launch records an event
// only if a later launch waits for it, each event recorded once. Then, from first_update on,
// one copy per assignment not done in place, on stream 0 after the side streams joined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/horizontal.h"
#include "backends/in_place.h"
#include "graph/graph.h"

namespace kiln {

struct LaunchStep {
  std::int32_t node = -1;        // -1: a variable update
  std::int32_t assignment = -1;  // the update's index in g.assignments()
  int stream = 0;
  std::vector<int> waits;  // events
  int record = -1;         // event recorded after the launch, or -1
  std::string label;       // the op's name, a fused group's summary, "update <variable>"
  // A horizontal launch: every member group in node order (`node` is the last), else empty.
  std::vector<std::int32_t> merged;
};

struct LaunchList {
  std::vector<LaunchStep> steps;
  std::size_t first_update = 0;  // steps from here on are variable updates
  int events = 0;
};

LaunchList build_launch_list(const Graph& g, const std::vector<int>& stream_of,
                             const std::vector<InPlaceUpdate>& in_place,
                             const std::vector<HorizontalLaunch>& horizontal = {},
                             const std::vector<std::vector<std::int32_t>>& reuse_waits = {});

}  // namespace kiln
