// Creates the shared logger once, on stderr, at the level named by KILN_LOG.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace kiln {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("kiln");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    const char* level = std::getenv("KILN_LOG");
    l->set_level(level ? spdlog::level::from_str(level) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace kiln
