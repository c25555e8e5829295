// The "step" lines of --metrics: every `every` steps and after the run's last step, with
// the means of the loss and of the task's values over the steps since the previous line,
// and the throughput over them.
#pragma once

#include <chrono>

#include "train/metrics.h"
#include "train/task.h"

namespace kiln {

class StepLines {
 public:
  StepLines(MetricsWriter& writer, std::int64_t examples_per_step, std::int64_t every);
  // Evaluation between epochs does not count as training time.
  void restart_clock();
  // After step `step` (1-based, counted over the whole run) of epoch `epoch`.
  void record(std::int64_t step, std::int64_t epoch, const StepValues& values, double lr,
              bool last);

 private:
  MetricsWriter& writer_;
  std::int64_t examples_per_step_, every_;
  double loss_sum_ = 0;
  Values extra_sums_;
  std::int64_t steps_ = 0;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

}  // namespace kiln
