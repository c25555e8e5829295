// char-lstm: a character-level language model. Tokens (time-major [T, B]) -> Embedding
// -> stacked LSTM (or tanh RNN) -> Linear -> logits over the 96 characters at every step.
#pragma once

#include "graph/nn/recurrent.h"

namespace kiln {

// Tokens the model reads and predicts: data/text_dataset.h's vocabulary (96 characters;
// train/ checks that the two agree).
inline constexpr std::int64_t kCharLstmVocabulary = 96;

struct CharLstmOptions {
  std::int64_t embedding = 64;
  std::int64_t hidden = 256;
  std::int64_t layers = 1;
  nn::CellKind cell = nn::CellKind::lstm;
};

class CharLstm : public nn::Module {
 public:
  CharLstm(const CharLstmOptions& options, Philox& rng);

  struct Result {
    Value logits;              // [T*B, 96], rows time-major (row t*B + b)
    nn::RecurrentState state;  // after the last step
  };
  // tokens: integer [T, B]; `initial` empty: zero state.
  Result forward(Value tokens, const nn::RecurrentState& initial = {});
  const CharLstmOptions& options() const { return options_; }

 private:
  CharLstmOptions options_;
  nn::Embedding embedding_;
  nn::Recurrent recurrent_;
  nn::Linear head_;
};

}  // namespace kiln
