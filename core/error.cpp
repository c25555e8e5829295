// Formatting of internal-invariant failures.
#include "core/error.h"

namespace kiln {

void throw_internal(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(
      fmt::format("kiln internal error at {}:{}: {} ({})", file, line, message, condition));
}

}  // namespace kiln
