// MetricsWriter: nlohmann::json lines, flushed after each.
#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kiln {

MetricsWriter::MetricsWriter(const std::string& path)
    : path_(path), file_(std::fopen(path.c_str(), "a")) {
  KILN_CHECK(file_ != nullptr, "--metrics {}: cannot open for writing: {}", path,
             std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(const std::string& kind, const std::map<std::string, Field>& fields) {
  if (file_ == nullptr) return;
  nlohmann::json line = {{"kind", kind}};
  for (const auto& [key, value] : fields) {
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, double>) {
            line[key] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
          } else {
            line[key] = v;
          }
        },
        value);
  }
  const std::string text = line.dump() + "\n";
  KILN_CHECK(
      std::fwrite(text.data(), 1, text.size(), file_) == text.size() && std::fflush(file_) == 0,
      "--metrics {}: write failed: {}", path_, std::strerror(errno));
}

}  // namespace kiln
