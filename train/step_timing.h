// How bench times a step: warm-up runs, then the median and the 10th/90th percentiles of
// the wall time of many, and the median device time where the backend measures it. Here,
// below the tools, so that a task (train/tasks.h) whose step is several programs can time
// itself the same way.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "backends/program.h"
#include "core/error.h"

namespace kiln {

struct StepTimes {
  double median_ms, p10_ms, p90_ms;
  double device_median_ms = -1;  // CUDA events around the step (GPU only)
};

// What a task that times its own steps reports: the times, the compile time, and its own
// figures (a GAN's process CPU time per step, "cpu_ms_per_step").
struct TimedSteps {
  StepTimes times;
  double compile_ms = 0;
  std::vector<std::pair<std::string, double>> extras;
};

inline double quantile(std::vector<double> ms, double q) {
  KILN_ASSERT(!ms.empty(), "a quantile of no times");
  std::sort(ms.begin(), ms.end());
  return ms[static_cast<std::size_t>(q * static_cast<double>(ms.size() - 1))];
}

inline double run_ms(Program& p, const std::vector<Feed>& feeds) {
  const auto start = std::chrono::steady_clock::now();
  p.run(feeds);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

inline StepTimes time_runs(Program& p, const std::vector<Feed>& feeds, int warmup, int steps) {
  std::vector<double> ms, device_ms;
  for (int i = 0; i < warmup + steps; ++i) {
    const double elapsed = run_ms(p, feeds);
    if (i < warmup) continue;
    ms.push_back(elapsed);
    if (p.last_step_device_ms() >= 0) device_ms.push_back(p.last_step_device_ms());
  }
  StepTimes t{quantile(ms, 0.5), quantile(ms, 0.1), quantile(ms, 0.9)};
  if (!device_ms.empty()) t.device_median_ms = quantile(device_ms, 0.5);
  return t;
}

}  // namespace kiln
