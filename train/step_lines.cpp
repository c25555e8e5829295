// StepLines: running sums, written and reset every `every` steps.
#include "train/step_lines.h"

namespace kiln {

StepLines::StepLines(MetricsWriter& writer, std::int64_t examples_per_step, std::int64_t every)
    : writer_(writer), examples_per_step_(examples_per_step), every_(every) {}

void StepLines::restart_clock() {
  since_ = std::chrono::steady_clock::now();
  steps_ = 0;
  loss_sum_ = 0;
  extra_sums_.clear();
}

void StepLines::record(std::int64_t step, std::int64_t epoch, const StepValues& values, double lr,
                       bool last) {
  loss_sum_ += values.loss;
  if (extra_sums_.empty())
    extra_sums_.assign(values.extras.begin(), values.extras.end());
  else
    for (std::size_t i = 0; i < values.extras.size(); ++i)
      extra_sums_[i].second += values.extras[i].second;
  ++steps_;
  if (!writer_.enabled() || (step % every_ != 0 && !last)) return;
  const double n = static_cast<double>(steps_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
  std::map<std::string, MetricsWriter::Field> fields = {
      {"step", step},
      {"epoch", epoch},
      {"loss", loss_sum_ / n},
      {"lr", lr},
      {"examples_per_second", n * static_cast<double>(examples_per_step_) / seconds}};
  for (const auto& [name, sum] : extra_sums_) fields[name] = sum / n;
  writer_.write("step", fields);
  restart_clock();
}

}  // namespace kiln
