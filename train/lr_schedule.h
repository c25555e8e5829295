// Learning-rate schedules: a base rate shaped over the run (constant, step decay, cosine
// decay to 0), optionally after a linear warm-up. Shared by every training loop.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

struct LrSchedule {
  std::string kind = "cosine";  // constant, step, cosine
  double base_lr = 1e-3;
  std::int64_t warmup_steps = 0;  // linear from base_lr / warmup_steps up to base_lr
  std::int64_t step_size =
      0;  // step: multiply by gamma every step_size steps (0: once per epoch, see train loops)
  double gamma = 0.1;  // step: the factor

  // kiln::Error for an unknown kind or a bad value; called before any work.
  void validate() const;
  // The rate for step `step` (0-based) of a run of `total_steps`.
  double at(std::int64_t step, std::int64_t total_steps) const;
};

}  // namespace kiln
