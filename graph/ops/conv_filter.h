// Internal to the ops files: a laid-out convolution filter (graph/ops.h, conv_filter_layout) as
// the CPU's kernels take it, and the layout op's table entry.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "graph/op.h"

namespace kiln::ops {

// The filter a convolution node reads, as [Cout, Cin, KH, KW]: `stored` itself, or (the node's
// attributes name a layout) a copy put back in that order.
Tensor conv_filter_nchw(const Tensor& stored, const Attrs& conv_attrs);

void register_conv_filter_op(std::vector<OpDef>& table);

}  // namespace kiln::ops
