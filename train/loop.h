// The one training loop behind `trainer`, for every task (train/tasks.h): the learning-rate
// schedule and warm-up, the progress bar, metrics lines, evaluation after each epoch,
// checkpoints and resuming at the saved data position, --max-steps, divergence checks,
// --trace, prefetch of the next batch, and data parallelism over the ranks of a job.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "train/config.h"
#include "train/task.h"

namespace kiln {

struct EpochReport {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;  // steps trained in this epoch by this run
  std::int64_t step = 0;   // steps done in the whole run after it
  double loss = 0;         // mean training loss of the epoch's steps
  double lr = 0;           // learning rate of the epoch's last step
  double seconds = 0;      // training time of the epoch (evaluation excluded)
  double examples_per_second = 0;
  // The means of the task's step values, then (rank 0) its evaluation's: "test_accuracy",
  // "fid", "validation_bits_per_char", ...
  Values values;
  std::vector<std::pair<std::string, std::string>> files;  // e.g. {"samples", PATH}
  double value(const std::string& name) const;             // kiln::Error if it has none
  bool has(const std::string& name) const;
};

// Trains config.model and returns one report per epoch; `on_epoch` is called after each,
// `on_finish` with the trained state.
std::vector<EpochReport> train(const TrainConfig& config,
                               const std::function<void(const EpochReport&)>& on_epoch = {},
                               const std::function<void(const TaskState&)>& on_finish = {});

}  // namespace kiln
