// Progress drawing: at most 10 redraws a second on a terminal, one line per 10% otherwise.
#include "train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace kiln {

bool stderr_is_terminal() { return isatty(fileno(stderr)) != 0; }

Progress::Progress(std::string label, std::int64_t total, bool terminal)
    : label_(std::move(label)), total_(total > 0 ? total : 1), terminal_(terminal) {}

void Progress::update(std::int64_t done, double loss, double images_per_second) {
  const auto now = std::chrono::steady_clock::now();
  const std::string stats = fmt::format("loss {:.4f}  {:.0f} img/s", loss, images_per_second);
  if (terminal_) {
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total_);
    fmt::print(stderr, "\r{} [{}{}] {}/{}  {}  ", label_,
               std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(kWidth - filled), '.'), done, total_, stats);
    std::fflush(stderr);
    return;
  }
  const std::int64_t tenth = done * 10 / total_;
  if (tenth == last_line_) return;
  last_line_ = tenth;
  fmt::print(stderr, "{} {}/{} ({}%)  {}\n", label_, done, total_, done * 100 / total_, stats);
}

void Progress::finish() {
  if (terminal_) fmt::print(stderr, "\n");
}

}  // namespace kiln
