// hoist_collectives: each all_reduce_mean moved up the node order to just after its last
// input. The gradient buckets of data parallelism are recorded after the whole backward, so
// in node order (which the GPU's launch list, memory plan and stream order follow) they came
// after every collective of the step; where the step has collectives of its own in the
// backward (synchronised batch norm's), the one communication stream then ran the buckets
// only once the backward had ended. Hoisted, the stream takes each collective as its inputs
// are ready. Pre: verify(g) holds. Post: verify holds; only all_reduce_mean nodes move, the
// other nodes keep their relative order, and outputs and assignments are the same values.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph hoist_collectives(const Graph& g);

}  // namespace kiln
