// The CPU backend: runs a compiled graph node by node with the reference kernels of the
// op table, writing into the buffers of a static memory plan that persist across runs.
#pragma once

#include <memory>

#include "backends/program.h"

namespace kiln {

// check_numerics: scan every op's outputs for NaN and Inf (backends/numerics.h).
// deterministic: the same bits for any thread count (kiln's own convolutions, not oneDNN's).
std::unique_ptr<Program> make_cpu_program(const Graph& compiled, bool check_numerics = false,
                                          bool deterministic = false);

}  // namespace kiln
