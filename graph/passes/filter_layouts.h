// lay_out_filters: each convolution pass that reorders its filter before it multiplies (the
// GPU's channels-last tensor-core forward and input gradient copy w [Cout, Cin, KH, KW] into
// the order their GEMM reads, every step) reads it from a conv_filter_layout node instead
// (graph/ops.h), placed right after the node that makes the filter (a weight's copy: where the
// layer first reads it). The copy becomes a launch of its own that depends on nothing but the
// weight, so the stream schedule (backends/schedule.h) runs it off the critical path, beside
// the layer before, where the pass had run it between that layer and its own multiply. Readers
// of one filter in one layout and order share one node. (The weights' layouts all at the front
// of the step, one launch for the filters of each size and order, measured slower on an H100:
// resnet18 bf16 b128 2.26-2.28 against 2.20-2.22 device ms; bench/README.md.)
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
