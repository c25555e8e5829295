#include "tools/openmp_defaults.h"

#include <unistd.h>

#include <cstdlib>

namespace kiln::tools {

void use_openmp_defaults(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "10000", 0) != 0) return;
  execv("/proc/self/exe", argv);
  // Only on failure (no /proc): keep libgomp's default, and do not pass the variable on to
  // processes this one starts as if it had been honoured here.
  unsetenv("GOMP_SPINCOUNT");
}

}  // namespace kiln::tools
