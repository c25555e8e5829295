// Embedding and recurrent layers (LSTM, tanh RNN; stacked, optionally bidirectional): per
// layer and direction, the input projection of all time steps is one GEMM; an LSTM's
// recurrence is then one lstm_sequence op (graph/ops.h), an RNN's is unrolled in the graph
// (per step one recurrent GEMM and a cell that the fusion pass fuses).
#pragma once

#include <vector>

#include "graph/nn/module.h"

namespace kiln::nn {

// Integer tokens of any shape [...] -> [..., width]: one_hot(tokens) x weight, which at
// vocabularies of ~100 costs little and needs no gather op (the weight's gradient is
// one_hot^T x dY, one GEMM).
class Embedding : public Module {
 public:
  Embedding(std::int64_t vocabulary, std::int64_t width, Philox& rng);
  Value forward(Value tokens);
  Value operator()(Value tokens) { return forward(tokens); }

 private:
  std::int64_t vocabulary_, width_;
  VariablePtr weight_;  // [vocabulary, width], N(0, 1) as in PyTorch
};

enum class CellKind { lstm, rnn };                      // rnn: h = tanh(x W + h U + b)
CellKind cell_kind_from_name(const std::string& name);  // "lstm" or "rnn"; kiln::Error otherwise

struct RecurrentOptions {
  std::int64_t input_size = 1;
  std::int64_t hidden_size = 1;
  std::int64_t layers = 1;
  bool bidirectional = false;
  CellKind cell = CellKind::lstm;
};

// The state of every layer and direction, in order (layer 0 forward, layer 0 reverse, ...),
// each [B, H]; `c` is empty for an RNN. An empty state means zeros.
struct RecurrentState {
  std::vector<Value> h, c;
};

struct RecurrentOutput {
  Value outputs;               // the last layer's h at every step: [B, T, H * directions]
  RecurrentState final_state;  // after the last step of each direction (the reverse one: t = 0)
};

// Parameters per layer and direction, named "l0.weight_ih" [F, G*H], "l0.weight_hh"
// [H, G*H], "l0.bias" [G*H] ("l0_reverse.*" for the reverse direction), G = 4 gates
// (input, forget, cell, output, PyTorch's order) for an LSTM, 1 for an RNN. Weights are
// U(-1/sqrt(H), 1/sqrt(H)) as in PyTorch; biases 0, the LSTM's forget gate 1.
class Recurrent : public Module {
 public:
  Recurrent(const RecurrentOptions& options, Philox& rng);

  // x: [B, T, F], batch first (transposed to time-major and back around the recurrence).
  RecurrentOutput forward(Value x, const RecurrentState& initial = {});
  // x: [T, B, F] -> outputs [T, B, H * directions], without transposes.
  RecurrentOutput forward_time_major(Value x, const RecurrentState& initial = {});

  const RecurrentOptions& options() const { return options_; }
  std::int64_t directions() const { return options_.bidirectional ? 2 : 1; }
  std::int64_t gates() const { return options_.cell == CellKind::lstm ? 4 : 1; }

 private:
  struct Weights {
    VariablePtr input, recurrent, bias;
  };
  struct Pass {
    Value outputs;  // [T*B, H], rows in time order
    Value h, c;
  };
  Pass run_direction(const Weights& w, Value x_rows, std::int64_t steps, bool reverse, Value h,
                     Value c);

  RecurrentOptions options_;
  std::vector<Weights> weights_;  // layer-major, forward before reverse
};

}  // namespace kiln::nn
