// Evaluator: batched forward programs; accuracy and cross-entropy computed on the host.
#include "train/evaluate.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "train/step_graph.h"

namespace kiln {

Evaluator::Evaluator(nn::Layer& model, const Shape& input_shape, std::int64_t batch,
                     const CompileOptions& options)
    : model_(model), input_shape_(input_shape), options_(options), batch_(batch) {
  KILN_CHECK(batch >= 1, "evaluation batch size must be at least 1 (got {})", batch);
}

Program& Evaluator::program_for(std::int64_t count) {
  // One program for the full batch and one for the last, smaller one (recompiled only if
  // a later call has a tail of another size).
  const bool full = count == batch_;
  std::unique_ptr<Program>& slot = full ? full_ : tail_;
  std::int64_t& compiled_for = full ? full_count_ : tail_count_;
  if (!slot || compiled_for != count) {
    Graph g;
    const bool was_training = model_.training();
    model_.set_training(false);  // batch norm on running statistics, no dropout
    g.output("logits", model_(g.input("x", batch_shape(count, input_shape_))));
    model_.set_training(was_training);
    slot = compile(g, options_);
    compiled_for = count;
  }
  return *slot;
}

Tensor Evaluator::logits(const Tensor& images) {
  KILN_CHECK(images.dtype() == DType::f32 && images.shape().rank() == input_shape_.rank() + 1,
             "evaluate: images are {}{} but f32 [N, {}] was expected", dtype_name(images.dtype()),
             images.shape().str(), input_shape_.str());
  const std::int64_t n = images.shape()[0];
  Tensor out;
  for (std::int64_t begin = 0; begin < n; begin += batch_) {
    const std::int64_t count = std::min(batch_, n - begin);
    const Tensor batch_logits =
        program_for(count).run({{"x", images.narrow_rows(begin, count)}}).at("logits");
    if (!out.defined()) out = Tensor::empty({n, batch_logits.shape()[1]}, DType::f32);
    out.narrow_rows(begin, count).copy_from(batch_logits);
  }
  return out;
}

EvalResult Evaluator::evaluate(const Dataset& data) {
  KILN_CHECK(data.size() >= 1, "evaluate: the dataset is empty");
  const Tensor l = logits(data.images);
  const std::int64_t n = l.shape()[0], classes = l.shape()[1];
  const float* values = l.data<float>();
  const std::int64_t* labels = data.labels.data<std::int64_t>();
  EvalResult r{.examples = n};
  double loss_sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = values + i * classes;
    const float* best = std::max_element(row, row + classes);
    double sum_exp = 0;
    for (std::int64_t c = 0; c < classes; ++c)
      sum_exp += std::exp(static_cast<double>(row[c]) - *best);
    loss_sum += std::log(sum_exp) + *best - row[labels[i]];  // -log softmax(row)[label]
    r.correct += (best - row) == labels[i] ? 1 : 0;
  }
  r.accuracy = static_cast<double>(r.correct) / static_cast<double>(n);
  r.loss = loss_sum / static_cast<double>(n);
  return r;
}

Tensor predicted_classes(const Tensor& logits) {
  KILN_CHECK(logits.dtype() == DType::f32 && logits.shape().rank() == 2,
             "predicted_classes: logits are {}{}, not f32 [N, C]", dtype_name(logits.dtype()),
             logits.shape().str());
  const std::int64_t n = logits.shape()[0], classes = logits.shape()[1];
  Tensor out = Tensor::empty({n}, DType::i64);
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + i * classes;
    out.data<std::int64_t>()[i] = std::max_element(row, row + classes) - row;
  }
  return out;
}

}  // namespace kiln
