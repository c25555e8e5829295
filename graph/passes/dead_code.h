// eliminate_dead_code: removes nodes that no output or assignment depends on.
// Pre: verify(g) holds. Post: verify holds; every node reaches an output or assignment,
// except inputs, which stay so that callers may always feed them; node order is kept.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph eliminate_dead_code(const Graph& g);

// Which nodes an output or assignment depends on (and the inputs): what the pass keeps.
std::vector<bool> live_nodes(const Graph& g);

}  // namespace kiln
