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
  KILN_CHECK(x.shape().rank() == 4, "global_avg_pool: input must be [B, C, H, W] but is {}", x.type().str());
  return mean(x, {2, 3});
}

Value log_softmax(Value x, std::int64_t axis) {
  // The shift by the maximum only keeps exp in range; its gradient cancels, so it is detached.
  const Value shifted = x - detach(max(x, {axis}, true));
  return shifted - log(sum(exp(shifted), {axis}, true));
}

Value softmax(Value x, std::int64_t axis) { return exp(log_softmax(x, axis)); }

Value cross_entropy(Value logits, Value labels) {
  KILN_CHECK(logits.shape().rank() == 2, "cross_entropy: logits must be [N, C] but are {}", logits.type().str());
  KILN_CHECK(labels.shape().rank() == 1 && labels.shape()[0] == logits.shape()[0],
             "cross_entropy: labels are {} but logits are {} (labels must be [N])", labels.type().str(),
             logits.type().str());
  const Value targets = one_hot(labels, logits.shape()[1], logits.dtype());
  return -mean_all(sum(targets * log_softmax(logits, 1), {1}));
}

}  // namespace kiln
