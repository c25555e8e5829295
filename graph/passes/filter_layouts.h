// lay_out_filters: each convolution pass that reorders its filter before it multiplies (the
// GPU's channels-last tensor-core forward and input gradient copy w [Cout, Cin, KH, KW] into
// the order their GEMM reads, every step) reads it from a conv_filter_layout node instead
// (graph/ops.h): a weight's (a source's) at the front of the graph with the weight, in the
// order of their first readers, any other filter's right after the node that makes it. The copy
// becomes a launch of its own that depends on nothing but the weight, so the stream schedule
// (backends/schedule.h) runs it off the critical path, and first in its stream's queue, where
// the pass had run it between the previous layer and its own multiply. Readers of one filter in
// one layout and order share one node.
//
// `wants` gives, for a conv2d or conv2d_grad_input node and its input types, the layout its pass
// reads and the order of the taps, or nullopt to leave the node as it is (a pass that reads the
// filter as stored, or that the backend keeps copying itself).
//
// Pre: verify(g) holds; after autograd (the marked nodes take no gradient). Post: verify holds;
// outputs and assignments unchanged; the same math (the layouts only move elements).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "graph/graph.h"
#include "graph/ops.h"

namespace kiln {

struct FilterOrder {
  FilterLayout layout = FilterLayout::nchw;
  std::vector<std::int64_t> taps;  // KH*KW taps in the order the pass reads them
};
using FilterOrderWanted =
    std::function<std::optional<FilterOrder>(const Node& conv, std::span<const TensorType> inputs)>;

Graph lay_out_filters(const Graph& g, const FilterOrderWanted& wants);

}  // namespace kiln
