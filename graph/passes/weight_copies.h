// weight_copies: after autocast, the low-precision copy of each weight that the step updates
// is written by the step itself, with the update (one pass over the weight in the optimizer's
// fused kernel), instead of a cast kernel at the start of every step. Each variable v that
// the graph assigns and that a cast to bf16/f16 reads directly gets a copy variable
// "v@bf16" (Variable::copy_of = v): the casts' readers read the copy, and the graph assigns the
// copy the cast of v's new value. The copy is private to the compiled program: the programs
// round v into it on their first run and again whenever v was written from outside (a loaded
// checkpoint: v's storage changed), so it always equals cast(v) at the start of a step, and
// the step computes the same bits as with the casts.
//
// Pre: verify(g) holds (autocast ran). Post: verify holds; outputs and the original
// assignments are unchanged; no cast of an assigned variable remains; each copy is assigned
// once, its dtype the casts'.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph add_weight_copies(const Graph& g);

}  // namespace kiln
