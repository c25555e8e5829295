// Embedding and the recurrent layers: an LSTM direction is one lstm_sequence op, an RNN is
// unrolled.
#include "graph/nn/recurrent.h"

#include <cmath>

#include "graph/nn/functional.h"
#include "graph/ops.h"

namespace kiln::nn {

Embedding::Embedding(std::int64_t vocabulary, std::int64_t width, Philox& rng)
    : vocabulary_(vocabulary), width_(width) {
  KILN_CHECK(vocabulary > 0 && width > 0, "Embedding: vocabulary {} and width {} must be positive",
             vocabulary, width);
  Tensor w = Tensor::empty({vocabulary, width}, DType::f32);
  rng.fill_normal(w, 0.0, 1.0);
  weight_ = register_parameter("weight", w);
}

Value Embedding::forward(Value tokens) {
  KILN_CHECK(!is_floating(tokens.dtype()), "Embedding: tokens must be integers but are {}",
             tokens.type().str());
  std::vector<std::int64_t> dims = tokens.shape().dims();
  const Value rows = one_hot(reshape(tokens, {tokens.shape().numel()}), vocabulary_);  // [N, V]
  dims.push_back(width_);
  return reshape(matmul(rows, tokens.graph().variable(weight_)), dims);
}

CellKind cell_kind_from_name(const std::string& name) {
  if (name == "lstm") return CellKind::lstm;
  if (name == "rnn") return CellKind::rnn;
  throw Error(fmt::format("unknown recurrent cell '{}' (lstm or rnn)", name));
}

Recurrent::Recurrent(const RecurrentOptions& options, Philox& rng) : options_(options) {
  const std::int64_t h = options.hidden_size, gh = gates() * h;
  KILN_CHECK(options.input_size > 0 && h > 0 && options.layers > 0,
             "Recurrent: input size {}, hidden size {} and layers {} must be positive",
             options.input_size, h, options.layers);
  const double bound = 1.0 / std::sqrt(static_cast<double>(h));
  auto uniform = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::f32);
    rng.fill_uniform(t, -bound, bound);
    return t;
  };
  for (std::int64_t layer = 0; layer < options.layers; ++layer) {
    const std::int64_t in = layer == 0 ? options.input_size : h * directions();
    for (std::int64_t d = 0; d < directions(); ++d) {
      const std::string prefix = "l" + std::to_string(layer) + (d == 1 ? "_reverse." : ".");
      Tensor bias = Tensor::zeros({gh}, DType::f32);
      if (options.cell == CellKind::lstm)
        for (std::int64_t i = h; i < 2 * h; ++i)
          bias.data<float>()[i] = 1.0f;  // forget gate: remember at first
      Weights w;
      w.input = register_parameter(prefix + "weight_ih", uniform({in, gh}));
      w.recurrent = register_parameter(prefix + "weight_hh", uniform({h, gh}));
      w.bias = register_parameter(prefix + "bias", bias);
      weights_.push_back(w);
    }
  }
}

// One direction of one layer over x_rows [T*B, F] (time-major rows). The projection of all
// steps plus the bias is one GEMM and one elementwise pass. An LSTM's recurrence is then one
// op, lstm_sequence (its gradient: one lstm_sequence_grad and one GEMM for U); the RNN is
// unrolled: per step the recurrent GEMM and the cell, which adds its rows of the projection.
Recurrent::Pass Recurrent::run_direction(const Weights& w, Value x_rows, std::int64_t steps,
                                         bool reverse, Value h, Value c) {
  Graph& g = x_rows.graph();
  const std::int64_t batch = x_rows.shape()[0] / steps, hidden = options_.hidden_size;
  const Value projected = matmul(x_rows, g.variable(w.input)) + g.variable(w.bias);  // [T*B, G*H]
  const Value u = g.variable(w.recurrent);
  if (!h.valid()) h = g.fill(0.0, {batch, hidden}, x_rows.dtype());
  if (options_.cell == CellKind::lstm) {
    if (!c.valid()) c = g.fill(0.0, {batch, hidden}, x_rows.dtype());
    const LstmSequence s = lstm_sequence(projected, u, h, c, steps, reverse);
    const std::int64_t last = (reverse ? 0 : steps - 1) * batch;  // rows of the last processed time
    return {s.hs, slice(s.hs, 0, last, batch), slice(s.cs, 0, last, batch)};
  }
  // A zero initial state is still multiplied: then every step uses the same ops, the
  // recurrent weight's gradient terms line up with the rows of the projection's gradient,
  // and the joined gradient GEMM reads that concat instead of a copy (grad_sum.h).
  std::vector<Value> outputs(static_cast<std::size_t>(steps));
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t t = reverse ? steps - 1 - s : s;
    h = tanh(slice(projected, 0, t * batch, batch) + matmul(h, u));  // [B, H]
    outputs[static_cast<std::size_t>(t)] = h;
  }
  return {concat(outputs, 0), h, c};
}

RecurrentOutput Recurrent::forward_time_major(Value x, const RecurrentState& initial) {
  const Shape& shape = x.shape();
  KILN_CHECK(shape.rank() == 3 && shape[2] == options_.input_size,
             "Recurrent: input is {} but [T, B, {}] (time-major) was expected", x.type().str(),
             options_.input_size);
  const std::size_t states = static_cast<std::size_t>(options_.layers * directions());
  KILN_CHECK(initial.h.empty() || initial.h.size() == states,
             "Recurrent: {} initial states for {} layers x {} directions", initial.h.size(),
             options_.layers, directions());
  KILN_CHECK(options_.cell == CellKind::rnn || initial.c.size() == initial.h.size(),
             "Recurrent: an LSTM needs as many initial cell states as hidden states ({} and {})",
             initial.c.size(), initial.h.size());
  const std::int64_t steps = shape[0], batch = shape[1];
  Value rows = reshape(x, {steps * batch, shape[2]});
  RecurrentOutput result;
  for (std::int64_t layer = 0; layer < options_.layers; ++layer) {
    std::vector<Value> directions_out;
    for (std::int64_t d = 0; d < directions(); ++d) {
      const std::size_t k = static_cast<std::size_t>(layer * directions() + d);
      const Value h0 = initial.h.empty() ? Value() : initial.h[k];
      const Value c0 = initial.c.empty() ? Value() : initial.c[k];
      const Pass pass = run_direction(weights_[k], rows, steps, d == 1, h0, c0);
      directions_out.push_back(pass.outputs);
      result.final_state.h.push_back(pass.h);
      if (pass.c.valid()) result.final_state.c.push_back(pass.c);
    }
    rows = concat(directions_out, 1);  // [T*B, H * directions]
  }
  result.outputs = reshape(rows, {steps, batch, rows.shape()[1]});
  return result;
}

RecurrentOutput Recurrent::forward(Value x, const RecurrentState& initial) {
  KILN_CHECK(x.shape().rank() == 3, "Recurrent: input is {} but [B, T, F] was expected",
             x.type().str());
  RecurrentOutput r = forward_time_major(transpose(x, {1, 0, 2}), initial);
  r.outputs = transpose(r.outputs, {1, 0, 2});
  return r;
}

}  // namespace kiln::nn
