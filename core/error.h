// Two kinds of error (DESIGN.md convention 4): kiln::Error for a user's mistake,
// with concrete values in the message; KILN_ASSERT for a broken internal invariant.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

// A mistake the user can fix: a wrong shape, a bad file, a bad flag.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A broken invariant inside kiln: a bug, reported with file and line.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

[[noreturn]] void throw_internal(const char* file, int line, const char* condition,
                                 const std::string& message);

}  // namespace kiln

// Throws kiln::Error with a fmt-formatted message when `cond` is false.
#define KILN_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::kiln::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

// Internal invariant; always on (the cost is a predictable branch).
#define KILN_ASSERT(cond, ...)                                                                \
  do {                                                                                        \
    if (!(cond)) ::kiln::throw_internal(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
