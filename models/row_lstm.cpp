// row-lstm's forward pass: rows as time steps, both directions' last states to a linear head.
#include "models/row_lstm.h"

#include "graph/ops.h"

namespace kiln {

RowLstm::RowLstm(Philox& rng, std::int64_t hidden)
    : recurrent_({.input_size = 28, .hidden_size = hidden, .layers = 1, .bidirectional = true},
                 rng),
      head_(2 * hidden, 10, rng, true, nn::Init::xavier_uniform) {
  register_module("rnn", recurrent_);
  register_module("head", head_);
}

Value RowLstm::forward(Value x) {
  const Shape& s = x.shape();
  KILN_CHECK(s.rank() == 4 && s[1] == 1 && s[3] == 28,
             "row-lstm: input is {} but [B, 1, H, 28] was expected", x.type().str());
  const Value rows =
      transpose(reshape(x, {s[0], s[2], s[3]}), {1, 0, 2});  // [H, B, 28]: time-major
  const nn::RecurrentOutput out = recurrent_.forward_time_major(rows);
  return head_(concat(out.final_state.h,
                      1));  // [B, 2 * hidden]: forward at the last row, reverse at the first
}

}  // namespace kiln
