// Divergence detection for the one training loop: a step's loss or values that are not
// finite, a loss far beyond the run's first, an evaluation that is not finite, and
// parameters or optimizer state holding a NaN or Inf (checked before every checkpoint, so
// that no checkpoint with a non-finite value is ever written).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "train/task.h"

namespace kiln {

// A loss this many times the run's first (or 1, if the first is smaller) has exploded.
inline constexpr double kExplodedLossFactor = 1e4;

class DivergenceCheck {
 public:
  // kiln::Error "training diverged: ..." naming the epoch and the step (1-based in the
  // epoch) unless the step's loss and values are finite and the loss has not exploded.
  void check_step(const StepValues& v, std::int64_t epoch, std::int64_t step);
  // kiln::Error unless every value of the evaluation after `epoch` is finite.
  static void check_evaluation(const Values& values, std::int64_t epoch);
  // kiln::Error naming the first variable of `state` with a NaN or Inf and `when` (e.g.
  // "after epoch 2 step 14 (step 30 of the run)"); `consequence` ends the message.
  static void check_state(const TaskState& state, const std::string& when,
                          const std::string& consequence);

 private:
  std::optional<double> first_loss_;  // of this process's run (after a resume: its first step)
};

}  // namespace kiln
