// in_place_updates: which optimizer updates can write straight into their variables.
//
// Pre: g is fused (updates are outputs of fused groups). Post: one entry per assignment of
// g, in order; an entry in place only under the conditions below, its `after` the readers
// the executor must order before the update.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace kiln {

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
