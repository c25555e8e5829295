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
// x: [B, C, H, W] -> [B, C], the mean over H and W (a reduction, fused where it can be).
Value global_avg_pool(Value x);
// Numerically stable: x - max(x) - log(sum(exp(x - max(x)))) along `axis`.
Value log_softmax(Value x, std::int64_t axis = -1);
Value softmax(Value x, std::int64_t axis = -1);
// Mean over the batch of -log p(label); logits: [N, C], labels: integer [N]. With
// label_smoothing e in [0, 1]: the cross entropy against (1 - e) one_hot(label) + e / C (as
// PyTorch's CrossEntropyLoss(label_smoothing=e)); 0 records the plain loss's ops.
Value cross_entropy(Value logits, Value labels, double label_smoothing = 0.0);
// Binary cross-entropy of sigmoid(logits) against targets in [0, 1], averaged over all
// elements, written stably from the logits: max(x, 0) - x * t + log(1 + exp(-|x|)).
// `targets` has logits' shape (or broadcasts to it); the double overload is a constant target.
Value bce_with_logits(Value logits, Value targets);
Value bce_with_logits(Value logits, double target);
// Transposed convolution, the input gradient of conv2d: x: [B, Cin, H, W], w: [Cin, Cout, KH, KW]
// (PyTorch's layout) -> [B, Cout, (H - 1) * stride - 2 * padding + KH + output_padding, ...],
// output_padding < stride.
Value conv_transpose2d(Value x, Value w, std::int64_t stride = 1, std::int64_t padding = 0,
                       std::int64_t output_padding = 0);

}  // namespace kiln
