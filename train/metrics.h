// `--metrics FILE`: one JSON object per line (step, epoch, loss, accuracy or bits per
// character, throughput, learning rate, ...), flushed as written so a crash loses nothing
// already reported. Appends to an existing file (a resumed run continues its log).
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <variant>

namespace kiln {

class MetricsWriter {
 public:
  using Field = std::variant<std::int64_t, double, std::string>;

  MetricsWriter() = default;                        // writes nothing
  explicit MetricsWriter(const std::string& path);  // kiln::Error if the file cannot be opened
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  bool enabled() const { return file_ != nullptr; }
  // Writes {"kind": kind, fields...} as one line. Non-finite doubles are written as null.
  void write(const std::string& kind, const std::map<std::string, Field>& fields);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace kiln
