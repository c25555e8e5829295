// Dropout (Srivastava et al. 2014): in training mode each element is kept with probability
// 1 - p and scaled by 1 / (1 - p), else zeroed; the identity in eval mode.
#pragma once

#include "graph/nn/module.h"

namespace kiln::nn {

// The random stream of a Dropout layer is (seed, step): the seed is drawn from `rng` at
// construction, the step is a buffer ("step", an i64 scalar) that every application in a
// training graph advances by one, so a resumed run continues the same stream and the CPU
// and the GPU draw the same mask (graph/ops/random_ops.cpp).
class Dropout : public Layer {
 public:
  Dropout(double p, Philox& rng);
  Value forward(Value x) override;
  double p() const { return p_; }
  std::uint64_t seed() const { return seed_; }
  const VariablePtr& step() const { return step_; }

 private:
  double p_;
  std::uint64_t seed_;
  VariablePtr step_;
};

}  // namespace kiln::nn
