// assign_streams: the stream schedule of a compiled step. The critical path (the longest
// chain of kernels) runs on stream 0; kernels off it (weight gradients, bias reductions,
// the optimizer updates they feed, the side branches of an inception block) run on the
// streams 1..streams-1, overlapping the critical path, joined by events where a value crosses
// streams: each where it would start first in a simulation of the step by estimated costs
// (3 us a launch plus its bytes at 2 TB/s). Collectives (all_reduce_mean: gradient buckets
// of data-parallel training) run on a stream of their own, index `streams`, so that a
// bucket's communication overlaps the rest of the backward.
//
// Pre: verify(g) holds. Post: one stream index per node (sources and views: that of their
// first reader, which they do not launch on anyway); with streams == 1, all zeros.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace kiln {

std::vector<int> assign_streams(const Graph& g, int streams);

}  // namespace kiln
