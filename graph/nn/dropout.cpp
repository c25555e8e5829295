// Dropout: a Philox uniform per element, mask = (u >= p) / (1 - p).
#include "graph/nn/dropout.h"

#include <limits>

#include "graph/collective.h"
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
  const Collective* ranks = group_ >= 0 ? &collective(group_) : nullptr;
  std::vector<std::int64_t> drawn = x.shape().dims();  // the global batch's shape
  if (ranks != nullptr) {
    KILN_CHECK(!drawn.empty(), "Dropout: a data-parallel input must have a batch axis, not {}",
               x.type().str());
    drawn[0] *= ranks->world_size();
  }
  const RandomUniform r = random_uniform(g.latest(step_), Shape(drawn), seed_, x.dtype());
  g.assign_latest(step_, r.next_step);
  Value u = r.values;
  if (ranks != nullptr && ranks->world_size() > 1) {
    const std::int64_t rows = x.shape()[0];
    u = slice(u, 0, ranks->rank() * rows, rows);
  }
  const Value keep = 1.0 - greater(scalar_like(x, p_), u);  // 1 where u >= p
  return x * (keep * (1.0 / (1.0 - p_)));
}

void shard_dropout(Module& root, int group) {
  if (group >= 0) collective(group);  // an unknown group is an error here
  root.apply([group](Module& m) {
    if (auto* d = dynamic_cast<Dropout*>(&m)) d->set_data_parallel_group(group);
  });
}

}  // namespace kiln::nn
