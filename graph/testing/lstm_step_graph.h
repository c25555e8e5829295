// Two LSTM cell steps as raw ops, for compiler tests of slices read in place: the input
// projection of both steps is one [2B, F] x [F, 4H] GEMM, each step slices its rows
// (axis 0), and the four gates are slices (axis 1) of that and of the recurrent GEMM.
#pragma once

#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/ops.h"

namespace kiln::testing {

// Inputs "x" [2B, F], "w" [F, 4H], "u" [H, 4H], "b" [4H]; outputs "h" [B, H], and with
// `with_grads` the gradients "dx", "dw", "du", "db" of sum(h * h).
inline void lstm_step_graph(Graph& g, std::int64_t batch, std::int64_t features,
                            std::int64_t hidden, bool with_grads, DType dtype = DType::f32) {
  const Value x = g.input("x", {2 * batch, features}, dtype);
  const Value w = g.input("w", {features, 4 * hidden}, dtype);
  const Value u = g.input("u", {hidden, 4 * hidden}, dtype);
  const Value b = g.input("b", {4 * hidden}, dtype);
  const Value projected = matmul(x, w) + b;  // [2B, 4H]
  Value h, c;
  for (std::int64_t t = 0; t < 2; ++t) {
    const Value rows = slice(projected, 0, t * batch, batch);
    const Value recurrent = t == 0 ? Value() : matmul(h, u);
    auto gate = [&](std::int64_t k) {
      const Value pre = slice(rows, 1, k * hidden, hidden);
      return recurrent.valid() ? pre + slice(recurrent, 1, k * hidden, hidden) : pre;
    };
    const Value i = sigmoid(gate(0)), f = sigmoid(gate(1)), cand = tanh(gate(2)),
                o = sigmoid(gate(3));
    c = t == 0 ? i * cand : f * c + i * cand;
    h = o * tanh(c);
  }
  g.output("h", h);
  if (!with_grads) return;
  const std::vector<Value> grads = grad(sum_all(h * h), {x, w, u, b});
  g.output("dx", grads[0]);
  g.output("dw", grads[1]);
  g.output("du", grads[2]);
  g.output("db", grads[3]);
}

}  // namespace kiln::testing
