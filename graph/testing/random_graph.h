// A generator of random elementwise DAGs for differential tests of the compiler: random
// broadcastable shapes, random ops with bounded magnitudes, shared values, reductions
// inside (keepdims) and at the end, several outputs.
#pragma once

#include <string>
#include <vector>

#include "core/philox.h"
#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/ops.h"

namespace kiln::testing {

struct RandomGraph {
  std::vector<Value> inputs;
  std::vector<Value> outputs;
  std::vector<std::string> input_names;
};

class RandomGraphBuilder {
 public:
  explicit RandomGraphBuilder(std::uint64_t seed) : rng_(seed) {}

  // Builds into `g`: 2-4 inputs of shapes broadcastable to a base shape (`base`, else a random
  // one), `ops` ops.
  RandomGraph build(Graph& g, int ops, DType dtype = DType::f32, const Shape* base = nullptr) {
    RandomGraph r;
    base_ = base != nullptr ? *base : random_base();
    const int n_inputs = 2 + static_cast<int>(pick(3));
    for (int i = 0; i < n_inputs; ++i) {
      r.input_names.push_back("in" + std::to_string(i));
      r.inputs.push_back(g.input(r.input_names.back(), i == 0 ? base_ : broadcastable(), dtype));
    }
    std::vector<Value> pool = r.inputs;
    for (int k = 0; k < ops; ++k) pool.push_back(random_op(pool));
    r.outputs.push_back(pool.back());
    for (int extra = static_cast<int>(pick(3)); extra > 0; --extra)
      r.outputs.push_back(pool[pick(pool.size())]);
    const Value last = pool.back();
    if (pick(2) == 0 && last.shape().rank() > 0)
      r.outputs.push_back(sum(last, {static_cast<std::int64_t>(pick(last.shape().rank()))}, false));
    return r;
  }

 private:
  std::uint64_t pick(std::uint64_t n) { return rng_.next_below(n); }

  Shape random_base() {
    std::vector<std::int64_t> dims(1 + pick(4));
    for (auto& d : dims) d = 1 + static_cast<std::int64_t>(pick(7));
    if (pick(3) == 0) dims.back() = 4 * (1 + static_cast<std::int64_t>(pick(4)));  // float4 paths
    return Shape(dims);
  }

  // The base shape with some axes set to 1 and possibly leading axes dropped.
  Shape broadcastable() {
    std::vector<std::int64_t> dims = base_.dims();
    for (auto& d : dims)
      if (pick(3) == 0) d = 1;
    const std::size_t drop = pick(dims.size() + 1) / 2;
    return Shape(
        std::vector<std::int64_t>(dims.begin() + static_cast<std::ptrdiff_t>(drop), dims.end()));
  }

  // Recent values are picked more often (chains), any value sometimes (sharing).
  Value operand(const std::vector<Value>& pool) {
    const std::size_t n = pool.size();
    return pick(3) == 0 ? pool[pick(n)] : pool[n - 1 - pick(std::min<std::size_t>(n, 3))];
  }

  Value random_op(const std::vector<Value>& pool) {
    const Value a = operand(pool);
    const Value b = operand(pool);
    switch (pick(15)) {
      case 0:
        return a + b;
      case 1:
        return a - b;
      case 2:
        return a * b;
      case 3:
        return a / (b * b + 1.0);
      case 4:
        return maximum(a, b);
      case 5:
        return greater(a, b) * a;
      case 6:
        return -a;
      case 7:
        return tanh(a);
      case 8:
        return relu(a);
      case 9:
        return exp(tanh(a));
      case 10:
        return log(a * a + 1.0);
      case 11:
        return sqrt(a * a + 0.5);
      case 12:
        return sigmoid(a) * 2.0 - b;
      case 13: {  // a reduction inside the DAG, kept broadcastable
        const auto axis =
            static_cast<std::int64_t>(pick(a.shape().rank() == 0 ? 1 : a.shape().rank()));
        return a.shape().rank() == 0
                   ? a
                   : (pick(2) ? sum(a, {axis}, true) * 0.25 : max(a, {axis}, true));
      }
      default:
        return broadcast_to(a, broadcast_shapes(a.shape(), base_, "test")) + 0.5;
    }
  }

  Philox rng_;
  Shape base_;
};

// A random graph as the differential tests use it: its values as outputs "out<i>", and the
// gradients of a weighted sum of them with respect to every input as "grad<i>".
inline RandomGraph build_with_gradients(Graph& g, std::uint64_t seed, int ops,
                                        DType dtype = DType::f32, const Shape* base = nullptr) {
  RandomGraphBuilder builder(seed);
  RandomGraph r = builder.build(g, ops, dtype, base);
  Value loss = sum_all(r.outputs[0]);
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    g.output("out" + std::to_string(i), r.outputs[i]);
    if (i) loss = loss + sum_all(r.outputs[i]) * 0.5;
  }
  const std::vector<Value> grads = grad(loss, r.inputs);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output("grad" + std::to_string(i), grads[i]);
  return r;
}

}  // namespace kiln::testing
