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
  // Data parallelism (>= 0: a collective group): the mask is drawn for the global batch (the
  // ranks' equal batches one after another, in rank order) and this rank keeps its rows, so
  // N ranks drop what one process on the global batch drops. -1: this batch alone.
  void set_data_parallel_group(int group) { group_ = group; }

 private:
  double p_;
  std::uint64_t seed_;
  VariablePtr step_;
  int group_ = -1;
};

// Every Dropout in `root` and its children draws its rank's rows of the global batch's mask
// (Dropout::set_data_parallel_group). The price: each rank draws the whole batch's numbers.
void shard_dropout(Module& root, int group);

}  // namespace kiln::nn
