// The end of every tool's main: standard output flushed and checked, so that output lost to a
// full disk or a closed descriptor is an error (exit 1, one line naming it), never a silent
// success. Header-only: the tools share no library of their own.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <string>
#include <system_error>

namespace kiln::tools {

// `code` unless standard output could not be written; then 1 (or `code`, if it already failed)
// after "<tool>: error: standard output: <reason>" on stderr.
inline int finish_output(const char* tool, int code) {
  std::cout.flush();
  errno = 0;
  const bool lost = !std::cout.good() || std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  if (!lost) return code;
  const int err = errno;
  const std::string reason =
      err != 0 ? std::error_code(err, std::generic_category()).message() : "a write failed";
  fmt::print(stderr, "{}: error: standard output: {} (what was printed is incomplete)\n", tool,
             reason);
  return code == 0 ? 1 : code;
}

}  // namespace kiln::tools
