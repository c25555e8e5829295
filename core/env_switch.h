// The environment's on/off switches. Most are on unless set to "0" (KILN_CONV_TMA=0,
// KILN_AUTOTUNE=0, ...: env_switch_on); a few, for work not yet on by default, are off unless set
// to "1" (KILN_CONV_MOMENTS=1, ...: env_switch_set). A few set a count (env_integer).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace kiln {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

inline bool env_switch_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// The integer `name` holds, `fallback` where it is unset or empty; a kiln::Error
// ("NAME='v': expected <what>") where it is not an integer from lo to hi.
inline std::int64_t env_integer(const char* name, std::int64_t fallback, std::int64_t lo,
                                std::int64_t hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  KILN_CHECK(*end == 0 && n >= lo && n <= hi, "{}='{}': expected {}", name, v, what);
  return static_cast<std::int64_t>(n);
}

}  // namespace kiln
