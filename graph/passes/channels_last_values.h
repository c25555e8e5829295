// channels_last_values: the layout pass's second half. channels_last_images (channels_last.h)
// gives each picked convolution a channels-last copy of its image; this pass lets the
// convolutions also *write* channels-last and carries that layout through the batch norm,
// ReLU and residual work between them, so that the copies are needed only at the edges (the
// first layer's input, a pooling layer, a graph output).
//
// Each 4-D value gets one stored layout, [B, C, H, W] or [B, H, W, C]:
// - a convolution writes its output channels-last where `takes` lets it (conv2d's y,
//   conv2d_grad_input's dx; attributes y_channels_last and channels_last, graph/ops.h), and
//   reads dy channels-last (conv2d_grad_input, conv2d_grad_weight) where `takes` lets it and
//   dy is channels-last already or free to make so;
// - an elementwise op, a reduction that keeps its dims, a slice or a broadcast_to runs over the
//   permuted axes (its axis attributes mapped, every 4-D input in the new layout) when one of its
//   4-D inputs is stored channels-last: the same math over [B, H, W, C], whose per-channel values
//   are [1, 1, 1, C], the same bytes as [1, C, 1, 1];
// - an op of a 4-D value whose two layouts hold the elements in the same order (one channel, or
//   one pixel: a per-channel value, a pooled [B, C, 1, 1]) reads either through a reshape, and a
//   broadcast of such a value (a pooling layer's gradient) is made in whichever layout its
//   readers take, with the elementwise ops over it;
// - every other reader of a channels-last value, and every graph output and assignment, reads
//   it through a transpose back to [B, C, H, W] (one a value, shared), and a channels-last
//   reader of a [B, C, H, W] value through a transpose to [B, H, W, C];
// - channels_last_images' transpose of an image that is channels-last already is dropped.
// If the rewritten graph would transpose more bytes than `g` does (its transposes, and the dy
// copies of the passes that make them), `g` is returned unchanged.
//
// Pre: verify(g) holds (channels_last_images has run, or not). Post: verify holds; every output
// and assignment has its value and type; the same math on every value, so the results agree with
// `g`'s to the rounding of sums taken in another order (the elementwise values exactly).
#pragma once

#include <functional>
#include <span>

#include "graph/graph.h"

namespace kiln {

// Which of a convolution node's activations (graph/ops.h) its kernels can store channels-last:
// the output side (conv2d's y written; the gradients' dy read) and, for conv2d_grad_input, the
// image side (dx written); and whether its pass copies a [B, C, H, W] dy to channels-last itself
// (the GPU's tensor-core input gradients), a copy the comparison of transposed bytes counts.
struct ChannelsLastSides {
  bool y = false;
  bool image = false;
  bool copies_nchw_dy = false;
};
using ChannelsLastTaken =
    std::function<ChannelsLastSides(const Node& conv, std::span<const TensorType> inputs)>;

Graph channels_last_values(const Graph& g, const ChannelsLastTaken& takes);

// KILN_CHANNELS_LAST_VALUES (off by default, not yet run on a GPU): 0 or unset, off; 1, the GPU
// runs the pass with what its kernels take; all, every tensor-core pass takes every side, for
// `dump`'s projection (backends/cuda/conv.h). Anything else is an error.
enum class ChannelsLastValues { off, kernels, projected };
ChannelsLastValues channels_last_values_mode();

}  // namespace kiln
