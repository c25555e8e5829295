// char-lstm's layers and forward pass.
#include "models/char_lstm.h"

#include "graph/ops.h"

namespace kiln {

CharLstm::CharLstm(const CharLstmOptions& options, Philox& rng)
    : options_(options),
      embedding_(kCharLstmVocabulary, options.embedding, rng),
      recurrent_({.input_size = options.embedding,
                  .hidden_size = options.hidden,
                  .layers = options.layers,
                  .cell = options.cell},
                 rng),
      head_(options.hidden, kCharLstmVocabulary, rng, true, nn::Init::xavier_uniform) {
  register_module("embedding", embedding_);
  register_module("rnn", recurrent_);
  register_module("head", head_);
}

CharLstm::Result CharLstm::forward(Value tokens, const nn::RecurrentState& initial) {
  KILN_CHECK(tokens.shape().rank() == 2, "char-lstm: tokens are {} but [T, B] was expected",
             tokens.type().str());
  const nn::RecurrentOutput out =
      recurrent_.forward_time_major(embedding_(tokens), initial);  // [T, B, H]
  const Value rows = reshape(out.outputs, {tokens.shape().numel(), options_.hidden});
  return {head_(rows), out.final_state};
}

}  // namespace kiln
