// Checks of the feeds of a run, shared by every backend: each feed names an input of the
// program, and each input is fed with its exact shape and dtype.
#pragma once

#include <vector>

#include "backends/program.h"

namespace kiln {

// Throws kiln::Error for a feed that names no input of `g`, or an empty tensor.
void check_feed_names(const Graph& g, const std::vector<Feed>& feeds);
// The tensor fed to input node `n`; kiln::Error if missing or of the wrong type.
const Tensor& feed_for(const Node& n, const std::vector<Feed>& feeds);

}  // namespace kiln
