// --check-numerics: after every op, its outputs are scanned for NaN and Inf; the first op
// that produced one stops the run with its name, the bad value, its inputs' ranges and the
// run number. Backends call this with host copies of the node's inputs and outputs.
#pragma once

#include <span>

#include "graph/graph.h"

namespace kiln {

// Throws kiln::Error when an output of node `id` holds a NaN or an Inf.
void check_numerics(const Graph& g, std::int32_t id, std::span<const Tensor> inputs,
                    std::span<const Tensor> outputs, std::int64_t run);

// Whether KILN_CHECK_NUMERICS=1 is set.
bool check_numerics_from_environment();

}  // namespace kiln
