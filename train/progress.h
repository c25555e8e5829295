// Training progress on stderr: a redrawn bar with loss and throughput on a terminal,
// plain periodic lines otherwise (logs, CI).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kiln {

class Progress {
 public:
  Progress(std::string label, std::int64_t total, bool terminal);
  void update(std::int64_t done, double loss, double images_per_second);
  void finish();

 private:
  std::string label_;
  std::int64_t total_;
  bool terminal_;
  std::chrono::steady_clock::time_point last_draw_;
  std::int64_t last_line_ = -1;
};

bool stderr_is_terminal();

}  // namespace kiln
