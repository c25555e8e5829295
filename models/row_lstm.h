// row-lstm: an image classifier that reads a [1, 28, 28] image as 28 steps (rows) of 28
// features with a bidirectional LSTM and classifies from the last state of each direction.
#pragma once

#include "graph/nn/recurrent.h"

namespace kiln {

class RowLstm : public nn::Layer {
 public:
  // Always bidirectional (the rows are all there at once, so the reverse pass is free
  // information), one layer of `hidden` units per direction.
  explicit RowLstm(Philox& rng, std::int64_t hidden = 128);
  Value forward(Value x) override;  // x: [B, 1, H, W] -> logits [B, 10]; H steps of W features

 private:
  nn::Recurrent recurrent_;
  nn::Linear head_;
};

}  // namespace kiln
