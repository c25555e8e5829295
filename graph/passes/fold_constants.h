// fold_constants: evaluates, at compile time, the small ops whose inputs are all constants
// (the gradient seed -1/B of a mean loss, its broadcast, ...) so they cost no kernel.
// Pre: verify(g) holds. Post: verify holds; the graph computes the same values (the op's
// own CPU loop or kernel computes the constant); an op whose every input is a fill or
// tensor constant and whose output has at most kMaxFoldedElements elements becomes a fill
// when all its elements are equal (fusion then pastes it as a literal) or else a tensor
// constant; larger results stay ops (a constant that big would cost more to read than to
// recompute). Node order is kept; dead constants are left to eliminate_dead_code.
#pragma once

#include "graph/graph.h"

namespace kiln {

inline constexpr std::int64_t kMaxFoldedElements = 4096;

Graph fold_constants(const Graph& g);

}  // namespace kiln
