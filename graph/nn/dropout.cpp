// Dropout: a Philox uniform per element, mask = (u >= p) / (1 - p).
#include "graph/nn/dropout.h"

#include <limits>

#include "graph/ops.h"

namespace kiln::nn {

Dropout::Dropout(double p, Philox& rng)
    : p_(p), seed_(rng.next_below(std::numeric_limits<std::uint64_t>::max())) {
  KILN_CHECK(p >= 0 && p < 1, "Dropout: p is {} but must be in [0, 1)", p);
  step_ = register_buffer("step", Tensor::zeros({}, DType::i64));
}

Value Dropout::forward(Value x) {
  if (!training() || p_ == 0) return x;
  Graph& g = x.graph();
  const RandomUniform r = random_uniform(g.latest(step_), x.shape(), seed_, x.dtype());
  g.assign_latest(step_, r.next_step);
  const Value keep = 1.0 - greater(scalar_like(x, p_), r.values);  // 1 where u >= p
  return x * (keep * (1.0 / (1.0 - p_)));
}

}  // namespace kiln::nn
