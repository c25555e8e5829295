// Composite ops: graph expressions over primitives, so they get gradients (and later
// fusion) for free (DESIGN.md convention 2).
#pragma once

#include "graph/ops.h"

namespace kiln {

Value mean(Value x, const std::vector<std::int64_t>& axes, bool keepdims = false);
Value mean_all(Value x);
Value sigmoid(Value x);
Value leaky_relu(Value x, double slope);
Value flatten(Value x);  // [B, ...] -> [B, prod(...)]
// Numerically stable: x - max(x) - log(sum(exp(x - max(x)))) along `axis`.
Value log_softmax(Value x, std::int64_t axis = -1);
Value softmax(Value x, std::int64_t axis = -1);
// Mean over the batch of -log p(label); logits: [N, C], labels: integer [N].
Value cross_entropy(Value logits, Value labels);
// Transposed convolution, the input gradient of conv2d: x: [B, Cin, H, W], w: [Cin, Cout, KH, KW]
// (PyTorch's layout) -> [B, Cout, (H - 1) * stride - 2 * padding + KH + output_padding, ...],
// output_padding < stride.
Value conv_transpose2d(Value x, Value w, std::int64_t stride = 1, std::int64_t padding = 0, std::int64_t output_padding = 0);

}  // namespace kiln
