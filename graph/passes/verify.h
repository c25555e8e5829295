// verify: checks a graph's invariants.
// Pre: none. Post: the graph is unchanged. Throws kiln::InternalError naming the node when
// an op's recorded types disagree with its type rule, an input refers to a later node
// (a cycle or a broken order), an output or assignment refers to nothing, a variable is
// assigned twice or assigned a value of another type, or a node has a missing attribute.
#pragma once

#include "graph/graph.h"

namespace kiln {

void verify(const Graph& g);

}  // namespace kiln
