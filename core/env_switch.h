// The environment's on/off switches. Most are on unless set to "0" (KILN_CONV_TMA=0,
// KILN_AUTOTUNE=0, ...: env_switch_on); a few, for work not yet on by default, are off unless set
// to "1" (KILN_CONV_MOMENTS=1, ...: env_switch_set).
#pragma once

#include <cstdlib>
#include <cstring>

namespace kiln {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

inline bool env_switch_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace kiln
