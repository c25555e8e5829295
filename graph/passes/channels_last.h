// channels_last_images: the layout pass. Each image (input 0) of a conv2d or conv2d_grad_weight
// that `wants` picks is read channels-last: the value is transposed to [B, H, W, C] once, at its
// first such reader, every reader that `wants` picks reads that copy and is marked
// "channels_last" (graph/ops.h). A convolution pass that would reorder its image to NHWC itself
// (the GPU's tensor-core passes) then reads the shared copy instead: a forward convolution and
// the weight gradient of the same layer, or two convolutions of one value, share one transpose,
// and `dump` shows it as a node. The CPU kernels read such a node's image through a transposed
// copy, so the pass never changes a result.
//
// The gradients' dy likewise, where `wants_dy` is given: a dy that some conv2d_grad_input picked
// by it reads is transposed to [B, OH, OW, Cout] once, and each conv2d_grad_input and
// conv2d_grad_weight of that dy that `wants_dy` picks reads the copy, marked "y_channels_last".
// A pass that would copy dy to NHWC itself (the GPU's tensor-core input gradients) then reads a
// node that the fusion pass can fold into dy's producer (fusion/channels_last_outputs.h).
//
// Pre: verify(g) holds. Post: verify holds; outputs and assignments are unchanged; each
// rewritten reader has the attribute and a [B, H, W, C] input (its image, or its dy); no value
// is transposed twice.
#pragma once

#include <functional>
#include <span>

#include "graph/graph.h"

namespace kiln {

// Whether `conv` (conv2d or conv2d_grad_weight, with its [B, C, H, W] image's types `inputs`)
// should read its image channels-last.
using ChannelsLastWanted =
    std::function<bool(const Node& conv, std::span<const TensorType> inputs)>;

// `wants_dy`: whether conv2d_grad_input or conv2d_grad_weight `conv` should read its dy
// channels-last (empty: none).
Graph channels_last_images(const Graph& g, const ChannelsLastWanted& wants,
                           const ChannelsLastWanted& wants_dy = {});

}  // namespace kiln
