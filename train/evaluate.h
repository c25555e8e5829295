// Inference with a trained image classifier: logits in batches, test accuracy and loss,
// predicted classes. Shared by the training loop and `trainer eval` / `trainer predict`.
#pragma once

#include <memory>

#include "backends/compile.h"
#include "graph/nn/module.h"
#include "data/dataset.h"

namespace kiln {

struct EvalResult {
  double accuracy = 0;       // fraction in [0, 1]
  double loss = 0;           // mean cross-entropy
  std::int64_t correct = 0;  // examples whose largest logit is at the label
  std::int64_t examples = 0;
};

// Runs `model` forward in batches of at most `batch` (one program for full batches, one
// for a smaller tail), compiled on first use and recorded in evaluation mode (batch norm on
// its running statistics, no dropout). The model must outlive the evaluator.
class Evaluator {
 public:
  Evaluator(nn::Layer& model, const Shape& input_shape, std::int64_t batch,
            const CompileOptions& options);

  // images: f32 [N, input_shape...] -> logits f32 [N, classes] (host)
  Tensor logits(const Tensor& images);
  // Accuracy and mean cross-entropy over a labelled dataset.
  EvalResult evaluate(const Dataset& data);

 private:
  Program& program_for(std::int64_t count);

  nn::Layer& model_;
  Shape input_shape_;
  CompileOptions options_;
  std::int64_t batch_;
  std::int64_t full_count_ = 0;  // batch size of full_
  std::unique_ptr<Program> full_, tail_;
  std::int64_t tail_count_ = 0;
};

// Index of the largest entry of each row of logits [N, C] -> i64 [N].
Tensor predicted_classes(const Tensor& logits);

}  // namespace kiln
