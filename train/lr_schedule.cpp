// LrSchedule::at: warm-up first, then the schedule over the remaining steps.
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kiln {

void LrSchedule::validate() const {
  KILN_CHECK(kind == "constant" || kind == "step" || kind == "cosine",
             "unknown learning-rate schedule '{}' (constant, step, cosine)", kind);
  KILN_CHECK(std::isfinite(base_lr) && base_lr > 0, "learning rate must be positive (got {})",
             base_lr);
  KILN_CHECK(warmup_steps >= 0, "warm-up steps must not be negative (got {})", warmup_steps);
  KILN_CHECK(kind != "step" || step_size >= 1,
             "the step schedule needs a step size of at least 1 (got {})", step_size);
  KILN_CHECK(std::isfinite(gamma) && gamma > 0 && gamma <= 1,
             "the step schedule's gamma must be in (0, 1] (got {})", gamma);
}

double LrSchedule::at(std::int64_t step, std::int64_t total_steps) const {
  if (step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const std::int64_t t = step - warmup_steps;
  const std::int64_t span = std::max<std::int64_t>(1, total_steps - warmup_steps);
  if (kind == "step") return base_lr * std::pow(gamma, static_cast<double>(t / step_size));
  if (kind == "cosine")
    return base_lr * 0.5 *
           (1.0 +
            std::cos(M_PI * static_cast<double>(std::min(t, span)) / static_cast<double>(span)));
  return base_lr;
}

}  // namespace kiln
