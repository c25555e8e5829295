// The environment's on/off switches (KILN_CONV_TMA=0, KILN_AUTOTUNE=0, ...): a switch is on
// unless it is set to "0".
#pragma once

#include <cstdlib>
#include <cstring>

namespace kiln {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace kiln
