// Composite ops built from primitives.
#include "graph/nn/functional.h"

namespace kiln {

Value mean(Value x, const std::vector<std::int64_t>& axes, bool keepdims) {
  double count = 1;
  for (std::int64_t a : axes) count *= static_cast<double>(x.shape().dim(a));
  return sum(x, axes, keepdims) * (1.0 / count);
}

Value mean_all(Value x) { return sum_all(x) * (1.0 / static_cast<double>(x.shape().numel())); }

Value sigmoid(Value x) { return 1.0 / (1.0 + exp(-x)); }

Value leaky_relu(Value x, double slope) { return maximum(x, x * slope); }

Value flatten(Value x) {
  KILN_CHECK(x.shape().rank() >= 1, "flatten: input is a scalar");
  return reshape(x, {x.shape()[0], -1});
}

Value global_avg_pool(Value x) {
  KILN_CHECK(x.shape().rank() == 4, "global_avg_pool: input must be [B, C, H, W] but is {}",
             x.type().str());
  return mean(x, {2, 3});
}

Value log_softmax(Value x, std::int64_t axis) {
  // The shift by the maximum only keeps exp in range; its gradient cancels, so it is detached.
  const Value shifted = x - detach(max(x, {axis}, true));
  return shifted - log(sum(exp(shifted), {axis}, true));
}

Value softmax(Value x, std::int64_t axis) { return exp(log_softmax(x, axis)); }

Value cross_entropy(Value logits, Value labels, double label_smoothing) {
  KILN_CHECK(logits.shape().rank() == 2, "cross_entropy: logits must be [N, C] but are {}",
             logits.type().str());
  KILN_CHECK(labels.shape().rank() == 1 && labels.shape()[0] == logits.shape()[0],
             "cross_entropy: labels are {} but logits are {} (labels must be [N])",
             labels.type().str(), logits.type().str());
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
             "cross_entropy: label smoothing {} is not in [0, 1]", label_smoothing);
  const std::int64_t classes = logits.shape()[1];
  Value targets = one_hot(labels, classes, logits.dtype());
  if (label_smoothing > 0)
    targets = targets * (1.0 - label_smoothing) + label_smoothing / static_cast<double>(classes);
  // Each row's loss is -sum(t * log_softmax(x)) = log(sum(exp(x - m))) + m - sum(t * x), as the
  // targets of a row sum to one (with smoothing too). Written so, the log-softmax is never formed
  // over the whole [N, C]: three row reductions and one row-wise combine instead of a reduction,
  // a [N, C] subtraction and another reduction, three kernels fewer on the critical path.
  const Value m = detach(max(logits, {1}, true));
  const Value log_norm = log(sum(exp(logits - m), {1}, true)) + m;
  return mean_all(log_norm - sum(targets * logits, {1}, true));
}

Value bce_with_logits(Value logits, Value targets) {
  KILN_CHECK(targets.dtype() == logits.dtype(),
             "bce_with_logits: targets are {} but logits are {} (same dtype expected)",
             targets.type().str(), logits.type().str());
  // Targets may broadcast to the logits' shape, never the other way ([N, 1] logits with [N]
  // targets would silently become an [N, N] loss).
  const Shape& ls = logits.shape();
  const Shape& ts = targets.shape();
  bool fits = ts.rank() <= ls.rank();
  for (std::size_t i = 1; fits && i <= ts.rank(); ++i)
    fits = ts[ts.rank() - i] == 1 || ts[ts.rank() - i] == ls[ls.rank() - i];
  KILN_CHECK(fits, "bce_with_logits: targets {} do not broadcast to logits {}",
             targets.type().str(), logits.type().str());
  // |x| as max(x, -x); exp(-|x|) <= 1, so nothing overflows for any logit.
  const Value softplus_of_minus_abs = log(1.0 + exp(-maximum(logits, -logits)));
  return mean_all(relu(logits) - logits * targets + softplus_of_minus_abs);
}

Value bce_with_logits(Value logits, double target) {
  KILN_CHECK(target >= 0 && target <= 1, "bce_with_logits: target {} is not in [0, 1]", target);
  return bce_with_logits(logits, scalar_like(logits, target));
}

Value conv_transpose2d(Value x, Value w, std::int64_t stride, std::int64_t padding,
                       std::int64_t output_padding) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  KILN_CHECK(xs.rank() == 4, "conv_transpose2d: input must be [B, C, H, W] but is {}",
             x.type().str());
  KILN_CHECK(ws.rank() == 4, "conv_transpose2d: weight must be [Cin, Cout, KH, KW] but is {}",
             w.type().str());
  KILN_CHECK(xs[1] == ws[0], "conv_transpose2d: input has {} channels but weight {} expects {}",
             xs[1], ws.str(), ws[0]);
  KILN_CHECK(stride >= 1 && padding >= 0 && output_padding >= 0 && output_padding < stride,
             "conv_transpose2d: stride {}, padding {}, output_padding {} (stride >= 1, padding >= "
             "0, 0 <= output_padding < stride)",
             stride, padding, output_padding);
  const std::int64_t oh = (xs[2] - 1) * stride - 2 * padding + ws[2] + output_padding;
  const std::int64_t ow = (xs[3] - 1) * stride - 2 * padding + ws[3] + output_padding;
  KILN_CHECK(oh >= 1 && ow >= 1,
             "conv_transpose2d: input {} with kernel {}x{}, stride {}, padding {} gives an empty "
             "output {}x{}",
             xs.str(), ws[2], ws[3], stride, padding, oh, ow);
  return conv2d_grad_input(x, w, {xs[0], ws[1], oh, ow}, stride, padding);
}

}  // namespace kiln
